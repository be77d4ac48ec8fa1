//! A pack's on-disk format: the index file ([`PackIndex`], its shards and samples), the
//! names of shards and members, and the order samples are written in.
use std::path::Path;

/// The index file that makes a directory a pack.
pub const PACK_INDEX: &str = "tchrun-pack.json";
/// Default `--shard-size`: 256 MiB.
pub const DEFAULT_SHARD_SIZE: u64 = 256 << 20;
pub(super) const FORMAT: &str = "tchrun-pack";
pub(super) const VERSION: u32 = 1;
pub(super) const BLOCK: u64 = 512;

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct PackIndex {
    pub format: String,
    pub version: u32,
    /// The folder that was packed (for the message that says to pack again).
    pub source: String,
    pub classes: Vec<String>,
    pub shards: Vec<ShardEntry>,
    /// In the source folder's scan order (what training reads); each names its shard.
    pub samples: Vec<SampleEntry>,
    /// The seed of the order in which the samples were written to the shards ([`shard_order`]);
    /// absent in packs written in scan order (before this field existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle_seed: Option<i64>,
}

/// The order in which `n` samples are written to the shards: a permutation of `0..n` (Fisher-Yates,
/// `rand` 0.8's `SliceRandom::shuffle`, by a ChaCha8 generator seeded with `seed`), so that each
/// shard holds a random mix of the classes and the same seed and folder give the same pack.
pub fn shard_order(n: usize, seed: i64) -> Vec<usize> {
    use rand::seq::SliceRandom;
    use rand::SeedableRng;
    let mut order: Vec<usize> = (0..n).collect();
    order.shuffle(&mut rand_chacha::ChaCha8Rng::seed_from_u64(seed as u64));
    order
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ShardEntry {
    pub name: String,
    pub bytes: u64,
    pub samples: usize,
}

/// One sample, as a JSON array (compact for a million samples): `[shard, offset, len, crc32c,
/// label, width, height, original relative path]`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct SampleEntry(
    pub usize,
    pub u64,
    pub u64,
    pub u32,
    pub usize,
    pub u32,
    pub u32,
    pub String,
);

/// `shard-000003.tar`.
pub fn shard_name(i: usize) -> String {
    format!("shard-{i:06}.tar")
}

/// The WebDataset key of sample `i`: 8 digits, no dot.
pub fn sample_key(i: usize) -> String {
    format!("{i:08}")
}

/// `KEY.EXT`: the original extension, lower-cased.
pub fn member_name(i: usize, orig: &str) -> String {
    let ext = Path::new(orig)
        .extension()
        .map(|e| e.to_string_lossy().to_ascii_lowercase())
        .unwrap_or_default();
    format!("{}.{ext}", sample_key(i))
}
