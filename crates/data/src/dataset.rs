//! What a scan gives, from a folder or a pack: [`ImageFolder`] and its [`Sample`]s, a
//! sample's image bytes ([`sample_bytes`]) and a folder's name ([`name_of`]).
use crate::error::DatasetError;
use crate::pack::Member;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    /// The image file; for a packed sample, where it was in the packed folder (the pack's
    /// root joined with its original relative path), for messages and listings.
    pub path: PathBuf,
    pub label: usize,
    /// A packed sample (`tchrun data pack`): its bytes are this member of a shard.
    pub member: Option<Member>,
}

#[derive(Debug, Clone)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
}

/// The bytes of one sample's image: its file, or its member of a shard.
pub fn sample_bytes(smp: &Sample, buf: &mut Vec<u8>) -> Result<(), DatasetError> {
    match &smp.member {
        Some(m) => m.read_into(buf),
        None => tchrun::files::read_bounded_into(&smp.path, tchrun::files::caps::IMAGE, buf)
            .map_err(|e| crate::error::bounded_err(&smp.path, e)),
    }
}

pub(crate) fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}
