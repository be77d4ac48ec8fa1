//! [`Record`]: a record of the log directory with its file's name and its one reader and
//! writer, and [`RecordError`], what reading one can fail with.
use std::path::{Path, PathBuf};

/// A record that exists but cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// Not readable, or not a regular file, or larger than `files::caps::RECORD`.
    #[error(transparent)]
    Read(#[from] crate::files::BoundedReadError),
    #[error("{}: not a tchrun record: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// A record of the log directory: its file's name, and its one reader and writer.
pub trait Record: serde::Serialize + serde::de::DeserializeOwned {
    /// The file's name in the log directory (`tchrun::files`).
    const FILE: &'static str;

    /// `<log_dir>/FILE`.
    fn path(log_dir: &Path) -> PathBuf {
        log_dir.join(Self::FILE)
    }

    /// The record a job left in `log_dir`: `None` when there is none.
    fn read(log_dir: &Path) -> Result<Option<Self>, RecordError> {
        let path = Self::path(log_dir);
        let text = match crate::files::read_bounded(&path, crate::files::caps::RECORD) {
            Ok(t) => t,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(RecordError::Read(e)),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| RecordError::Parse { path, source })
    }

    /// Writes `<log_dir>/FILE` (pretty JSON, atomically, mode 0640).
    fn write(&self, log_dir: &Path) -> Result<(), crate::files::AtomicWriteError> {
        let path = Self::path(log_dir);
        let text =
            serde_json::to_string_pretty(self).map_err(|e| crate::files::AtomicWriteError {
                path: path.clone(),
                source: std::io::Error::other(e),
            })?;
        crate::files::write_atomic(&path, text.as_bytes())
    }
}
