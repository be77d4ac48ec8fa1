//! Room for the failure summary on a full disk. A job whose log directory fills up (its own
//! logs, an output on the same file system, another user's files) would end with no
//! `failure.json` at all, just when it is needed. So each attempt holds a small file of real
//! blocks in the log directory (`.failure-reserve`) and gives it up just before the summary is
//! written; a file system too full to hold it at the start is refused before any rank starts.
use std::io::Write as _;
use std::path::{Path, PathBuf};

/// The reserve's name in the log directory (hidden: it is the launcher's, not the user's).
pub const NAME: &str = ".failure-reserve";

/// Its size: a failure summary takes a few KiB, one with a hang verdict's stacks tens; small
/// enough for a log directory on a small file system of its own (a 1 MiB tmpfs in
/// `strict.rs::a_full_log_disk_does_not_stop_training`).
pub const SIZE: usize = 128 << 10;

fn path(log_dir: &Path) -> PathBuf {
    log_dir.join(NAME)
}

/// Writes the reserve (real blocks, flushed to the file system: a sparse file or one still in
/// the page cache would free nothing when removed). An error means the file system cannot
/// hold it now.
pub fn hold(log_dir: &Path) -> std::io::Result<()> {
    let p = path(log_dir);
    let written = (|| {
        // As every log file: 0640, never through a link planted in a shared log directory.
        let mut f = tchrun::files::create_log(&p)?;
        f.write_all(&vec![0u8; SIZE])?;
        f.sync_all()
    })();
    if written.is_err() {
        // A partial reserve would hold what the logs need.
        let _ = std::fs::remove_file(&p);
    }
    written
}

/// Gives the reserve back (nothing to do when there is none).
pub fn release(log_dir: &Path) {
    let _ = std::fs::remove_file(path(log_dir));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reserve_holds_its_size_in_real_blocks_and_is_given_back() {
        use std::os::unix::fs::MetadataExt;
        let t = tempfile::tempdir().unwrap();
        hold(t.path()).unwrap();
        let m = std::fs::metadata(path(t.path())).unwrap();
        assert_eq!(m.len(), SIZE as u64);
        // Allocated, not sparse: st_blocks counts 512-byte units.
        assert!(m.blocks() * 512 >= SIZE as u64, "{} blocks", m.blocks());
        hold(t.path()).unwrap();
        release(t.path());
        assert!(!path(t.path()).exists());
        release(t.path());
    }
}
