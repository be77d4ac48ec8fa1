//! The bounds on what a pickle and its archive may make tchrun build: a corrupt or hostile file
//! hits one of these and is refused, never a huge allocation.

/// Largest `data.pkl` read (a state_dict's index of tensors, not their data: a few hundred KiB
/// for the largest torchvision models).
pub(crate) const MAX_PICKLE_BYTES: u64 = 64 << 20;
/// Values a pickle may push in all (bounds stack, memo and containers together).
pub(crate) const MAX_VALUES: usize = 8 << 20;
/// Distinct memo entries.
pub(crate) const MAX_MEMO: usize = 1 << 20;
/// Open MARKs at once (torch.save nests three deep).
pub(crate) const MAX_MARKS: usize = 256;
/// Dimensions of one tensor.
pub(crate) const MAX_DIMS: usize = 64;
/// Converted tensors may hold at most this many times the file's size (views that share a
/// storage are copied once each; broadcast views are refused outright).
pub(crate) const MAX_OUTPUT_FACTOR: usize = 4;
