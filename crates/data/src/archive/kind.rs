//! [`ArchiveKind`]: which archive a path is, by its name's suffix.
use std::path::Path;

/// Archive suffixes recognised (case-insensitive), longest first.
pub const ARCHIVE_SUFFIXES: [&str; 4] = [".tar.gz", ".tgz", ".tar", ".zip"];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchiveKind {
    Zip,
    Tar,
    TarGz,
}

impl ArchiveKind {
    /// The kind of `path` by its name, `None` for anything else (a folder, an image).
    pub fn of(path: &Path) -> Option<(ArchiveKind, String)> {
        let name = path.file_name()?.to_string_lossy().into_owned();
        let lower = name.to_ascii_lowercase();
        for suffix in ARCHIVE_SUFFIXES {
            if lower.ends_with(suffix) && lower.len() > suffix.len() {
                let kind = match suffix {
                    ".zip" => ArchiveKind::Zip,
                    ".tar" => ArchiveKind::Tar,
                    _ => ArchiveKind::TarGz,
                };
                return Some((kind, name[..name.len() - suffix.len()].to_string()));
            }
        }
        None
    }
}
