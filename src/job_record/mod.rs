//! The records a job leaves in its log directory for the user, `tchrun logs` and the next
//! attempt: `failure.json` ([`failure::FailureSummary`]), `ranks.json` ([`ranks::RankRow`])
//! and `restarts.json` ([`restarts::Attempt`]). Each is one typed struct whose one reader and
//! one writer are [`Record`]'s, so that every binary that reads a record reads what was
//! written.
//! Owns the JSON shapes (field names and order are documented); knows nothing of how a job is
//! launched or supervised.
use std::path::{Path, PathBuf};

pub mod cause;
pub mod classification;
pub mod failure;
pub mod hang;
pub mod heartbeat;
pub mod memory;
pub mod ranks;
pub mod restarts;
pub mod stacks;
pub mod status;

pub use cause::Cause;
pub use classification::Classification;
pub use failure::FailureSummary;
pub use hang::HangVerdict;
pub use heartbeat::Heartbeat;
pub use ranks::RankRow;
pub use restarts::{Attempt, DroppedHost};
pub use status::JobStatus;

/// The size of a per-rank record rewritten in place (`heartbeat-<rank>.json`,
/// `memory-<rank>.json`): every record padded to it, so that each is written over the last.
const IN_PLACE_BYTES: usize = 1024;

/// Rewrites a per-rank record in place: the JSON padded with spaces to `IN_PLACE_BYTES`,
/// written at offset 0 and the file closed (what NFS needs to show it to another host). In
/// place, a full disk does not stop it (no new block is needed), and a slow one is not waited
/// for (no fsync: a record lost to a crash of the host is worth nothing).
fn write_in_place(path: &Path, record: &impl serde::Serialize) -> std::io::Result<()> {
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    let mut text = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    if text.len() < IN_PLACE_BYTES {
        text.resize(IN_PLACE_BYTES, b' ');
    }
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(false)
        .mode(0o640)
        // A link planted in a shared log directory is not followed: the write fails (ELOOP).
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    f.write_all_at(&text, 0)?;
    if f.metadata()?.len() > text.len() as u64 {
        f.set_len(text.len() as u64)?;
    }
    Ok(())
}

/// A per-rank record or capture file of the log directory, read with bounds
/// (`files::read_bounded`, `caps::RECORD`); `None` when it is missing, not a regular file, too
/// large or unreadable (a FIFO planted there never blocks its reader).
fn read_small(path: &Path) -> Option<Vec<u8>> {
    crate::files::read_bounded(path, crate::files::caps::RECORD).ok()
}

/// The rank of a per-rank file's name `<prefix><rank>.json` (`heartbeat-`, `memory-`, `stacks-`).
fn rank_of_file(file_name: &str, prefix: &str) -> Option<usize> {
    file_name
        .strip_prefix(prefix)?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

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

impl Record for FailureSummary {
    const FILE: &'static str = crate::files::FAILURE_JSON;
}

/// The rank table, one row a rank.
impl Record for Vec<RankRow> {
    const FILE: &'static str = crate::files::RANKS_JSON;
}

/// The attempts that were restarted, oldest first.
impl Record for Vec<Attempt> {
    const FILE: &'static str = crate::files::RESTARTS_JSON;
}
