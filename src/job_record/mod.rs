//! The records a job leaves in its log directory for the user, `tchrun logs` and the next
//! attempt: `failure.json` ([`failure::FailureSummary`]), `ranks.json` ([`ranks::RankRow`])
//! and `restarts.json` ([`restarts::Attempt`]). Each is one typed struct with its one reader
//! and one writer here, so that every binary that reads a record reads what was written.
//! Owns the JSON shapes (field names and order are documented); knows nothing of how a job is
//! launched or supervised.
use std::path::{Path, PathBuf};

pub mod failure;
pub mod ranks;
pub mod restarts;

pub use failure::FailureSummary;
pub use ranks::RankRow;
pub use restarts::{Attempt, DroppedHost};

/// A record that exists but cannot be read or parsed.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("{}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: not a tchrun record: {source}", path.display())]
    Parse {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
}

/// Reads the record at `path`: `None` when there is none.
fn read<T: serde::de::DeserializeOwned>(path: &Path) -> Result<Option<T>, RecordError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => {
            return Err(RecordError::Read {
                path: path.to_path_buf(),
                source,
            })
        }
    };
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|source| RecordError::Parse {
            path: path.to_path_buf(),
            source,
        })
}

/// Writes the record at `path` (pretty JSON, atomically, mode 0640).
fn write<T: serde::Serialize + ?Sized>(
    path: &Path,
    record: &T,
) -> Result<(), crate::files::AtomicWriteError> {
    let text =
        serde_json::to_string_pretty(record).map_err(|e| crate::files::AtomicWriteError {
            path: path.to_path_buf(),
            source: std::io::Error::other(e),
        })?;
    crate::files::write_atomic(path, text.as_bytes())
}
