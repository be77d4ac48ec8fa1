//! The per-rank files of the log directory (`heartbeat-<rank>.json`, `memory-<rank>.json`,
//! `stacks-<rank>.json`): rewritten in place, read with bounds, and the rank in their name.
use std::path::Path;

/// The size of a per-rank record rewritten in place (`heartbeat-<rank>.json`,
/// `memory-<rank>.json`): every record padded to it, so that each is written over the last.
const IN_PLACE_BYTES: usize = 1024;

/// Rewrites a per-rank record in place: the JSON padded with spaces to `IN_PLACE_BYTES`,
/// written at offset 0 and the file closed (what NFS needs to show it to another host). In
/// place, a full disk does not stop it (no new block is needed), and a slow one is not waited
/// for (no fsync: a record lost to a crash of the host is worth nothing).
pub(super) fn write_in_place(path: &Path, record: &impl serde::Serialize) -> std::io::Result<()> {
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
pub(super) fn read_small(path: &Path) -> Option<Vec<u8>> {
    crate::files::read_bounded(path, crate::files::caps::RECORD).ok()
}

/// The rank of a per-rank file's name `<prefix><rank>.json` (`heartbeat-`, `memory-`, `stacks-`).
pub(super) fn rank_of_file(file_name: &str, prefix: &str) -> Option<usize> {
    file_name
        .strip_prefix(prefix)?
        .strip_suffix(".json")?
        .parse()
        .ok()
}
