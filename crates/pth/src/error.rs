//! [`PthError`]: why a `.pth` file cannot be read as a state_dict, each message naming the file
//! and the fix ([`FIX`]).

pub(crate) const FIX: &str = "save the weights with torch.save(model.state_dict(), PATH)";

/// A `.pth` file that cannot be read as a state_dict; the message names the file and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PthError {
    #[error("{path}: cannot read it: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path}: a legacy torch file (the format before torch 1.6, not a zip archive); re-save it \
         with a current torch: torch.save(torch.load(F), F2), and give F2"
    )]
    Legacy { path: String },
    #[error(
        "{path}: not a complete torch.save archive ({detail}): it may be truncated or corrupt; \
         {FIX}"
    )]
    Corrupt { path: String, detail: String },
    #[error(
        "{path}: refused: its pickle calls {global}, which is not part of a state_dict (tchrun \
         reads only tensors, dicts, lists, strings and numbers, and runs nothing from the file); \
         {FIX}"
    )]
    Global { path: String, global: String },
    #[error(
        "{path}: holds a whole pickled model ({class}), not a state_dict; save model.state_dict() \
         instead: torch.save(model.state_dict(), PATH)"
    )]
    WholeModel { path: String, class: String },
    #[error("{path}: not a state_dict (a dict of name -> tensor): {detail}")]
    NotAStateDict { path: String, detail: String },
    #[error(
        "{path}: holds a tensor of type {dtype}, which tchrun cannot convert (it reads float, \
         integer and bool tensors); convert it first, e.g. \
         torch.save({{k: v.float() for k, v in sd.items()}}, PATH)"
    )]
    UnsupportedDtype { path: String, dtype: String },
    #[error("{path}: tensor '{tensor}': {detail}; the file is corrupt: {FIX}")]
    BadTensor {
        path: String,
        tensor: String,
        detail: String,
    },
    #[error("{path}: {what} is over tchrun's limit; the file is corrupt or not a state_dict")]
    Limit { path: String, what: String },
}
