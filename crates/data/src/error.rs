//! [`DatasetError`]: what a dataset, an archive or an image can be refused with, and the
//! builders the readers share (`io_err`, `bad`, `bounded_err`).
use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The folder is not laid out as `ROOT/<class>/<image>`.
    #[error("NotLabeledDatasetError: {}: {detail}", path.display())]
    NotLabeled { path: PathBuf, detail: String },
    /// Train and valid disagree (class sets), or an argument is inconsistent.
    #[error("InvalidDatasetError: {detail}")]
    InvalidDataset { detail: String },
    /// Empty dataset or an empty class folder.
    #[error("EmptyDatasetError: {}: {detail}", path.display())]
    Empty { path: PathBuf, detail: String },
    /// An archive (`.zip`, `.tar`, `.tar.gz`) that cannot be used safely.
    #[error("BadArchiveError: {}: {detail}", path.display())]
    BadArchive { path: PathBuf, detail: String },
    /// Corrupt, unreadable, unsupported or too large image.
    #[error("BadImageError: {}: {detail}", path.display())]
    BadImage { path: PathBuf, detail: String },
    /// SIGINT/SIGTERM (`signal`) arrived while an archive was being extracted; the partial
    /// extraction was removed.
    #[error(
        "interrupted ({}) while extracting {}; the partial extraction was removed",
        tchrun::interrupt::signal_name(*signal),
        path.display()
    )]
    Interrupted { path: PathBuf, signal: i32 },
    #[error(
        "IoError: {}: {source} (check that the path exists, is readable and is on a mounted volume)",
        path.display()
    )]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub(crate) fn io_err(path: &Path, source: std::io::Error) -> DatasetError {
    DatasetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// A refused or failed bounded read of an image (`files::read_bounded`): not a regular file or
/// too large is a bad image (skipped under `--skip-bad-images`); an I/O error stays one.
pub(crate) fn bounded_err(path: &Path, e: tchrun::files::BoundedReadError) -> DatasetError {
    match e {
        tchrun::files::BoundedReadError::Io { source, .. } => io_err(path, source),
        e => bad(path, e.to_string()),
    }
}

pub(crate) fn bad(path: &Path, detail: impl Into<String>) -> DatasetError {
    DatasetError::BadImage {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}
