//! The job lock: one job at a time writes an output or log directory. A job takes an
//! exclusive `flock` on `<dir>/.tchrun.lock` ([`crate::files::LOCK_FILE`]) for its whole life
//! (every restart attempt) and writes who holds it ([`LockInfo`], JSON) into the file; a second
//! job is refused, naming the first one's host, pid, command and start time. The file is
//! removed when the holder ends (while still locked: a job waiting on the old file sees it gone
//! and locks the new one). A file left by a holder that died (its content there, its flock
//! free) is a stale lock: taken over, and the caller says so.
//!
//! The launcher (`tchrun train|score|evaluate`) takes the locks and tells its ranks through
//! [`crate::env::TCHRUN_LOCK_HELD`]; rank 0 of ranks started without it (`mpirun tchrun-worker
//! train ...` by hand, `sbatch`) takes them itself. `--dry-run` takes none.
use nix::fcntl::{Flock, FlockArg};
use serde::{Deserialize, Serialize};
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// Who holds a lock: the content of the lock file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LockInfo {
    pub host: String,
    pub pid: u32,
    /// RFC 3339 UTC (`files::timestamp_now`).
    pub started: String,
    /// The holder's command line.
    pub command: String,
}

impl LockInfo {
    /// This process, now, running `command`.
    pub fn here(command: &str) -> LockInfo {
        LockInfo {
            host: nix::unistd::gethostname()
                .map(|h| h.to_string_lossy().into_owned())
                .unwrap_or_else(|_| "?".into()),
            pid: std::process::id(),
            started: crate::files::timestamp_now(),
            command: command.to_string(),
        }
    }

    /// This process's command line.
    pub fn command_line() -> String {
        std::env::args().collect::<Vec<_>>().join(" ")
    }

    /// `pid P on host H, started T: COMMAND`.
    pub fn describe(&self) -> String {
        format!(
            "pid {} on host {}, started {}: `{}`",
            self.pid, self.host, self.started, self.command
        )
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another job holds the lock.
    #[error(
        "{flag} {}: in use by another job ({}; lock file {}); wait for that job to end, stop it, \
         or choose another {flag}",
        dir.display(),
        holder.as_ref().map_or_else(|| "its details are not written yet".to_string(), |h| h.describe()),
        path.display()
    )]
    Held {
        flag: String,
        dir: PathBuf,
        path: PathBuf,
        holder: Option<Box<LockInfo>>,
    },
    #[error("{flag} {}: cannot take the job lock ({source}); choose a writable directory", path.display())]
    Io {
        flag: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// A held lock; released (its file removed, then unlocked) when dropped.
#[derive(Debug)]
pub struct JobLock {
    path: PathBuf,
    _file: Flock<File>,
}

impl JobLock {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for JobLock {
    fn drop(&mut self) {
        // Still locked here: whoever opened the old file re-checks and locks a new one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// A lock taken, and the stale holder it replaced, if any.
#[derive(Debug)]
pub struct Taken {
    pub lock: JobLock,
    pub stale: Option<LockInfo>,
}

impl Taken {
    /// The console note for a stale lock taken over.
    pub fn note(&self) -> Option<String> {
        self.stale.as_ref().map(|s| {
            format!(
                "note: took over the stale job lock {} (its job, {}, is gone)",
                self.lock.path.display(),
                s.describe()
            )
        })
    }
}

/// The lock file of `dir` (resolved: the name the launcher and the ranks agree on).
pub fn lock_path(dir: &Path) -> PathBuf {
    crate::overlap::resolve(dir).join(crate::files::LOCK_FILE)
}

/// The directories a job locks: its output directory (none for `score`, whose output is a
/// file) and its log directory unless that lies inside the output.
/// Each with the flag that names it (`--output`, `--log-dir`).
pub fn job_dirs(output: Option<&Path>, log_dir: &Path) -> Vec<(&'static str, PathBuf)> {
    let mut dirs: Vec<(&'static str, PathBuf)> = output
        .map(|o| ("--output", crate::overlap::resolve(o)))
        .into_iter()
        .collect();
    let log = crate::overlap::resolve(log_dir);
    if !dirs.iter().any(|(_, d)| log.starts_with(d)) {
        dirs.push(("--log-dir", log));
    }
    dirs
}

fn read_holder(f: &mut File) -> Option<LockInfo> {
    let mut text = String::new();
    f.rewind().ok()?;
    f.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.trim()).ok()
}

/// Takes the lock of `dir` (created if missing) for `info`'s job; `flag` names the directory
/// in messages. Never waits: a held lock is [`LockError::Held`].
pub fn acquire(flag: &str, dir: &Path, info: &LockInfo) -> Result<Taken, LockError> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = lock_path(dir);
    let io = |source: std::io::Error| LockError::Io {
        flag: flag.to_string(),
        path: path.clone(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(io)?;
    loop {
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o640)
            .open(&path)
            .map_err(io)?;
        let mut locked = match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
            Ok(l) => l,
            Err((mut f, nix::errno::Errno::EWOULDBLOCK)) => {
                return Err(LockError::Held {
                    flag: flag.to_string(),
                    dir: dir.to_path_buf(),
                    path: path.clone(),
                    holder: read_holder(&mut f).map(Box::new),
                })
            }
            Err((_, e)) => return Err(io(std::io::Error::from(e))),
        };
        // The holder may have removed the file between our open and our lock: lock the one
        // that is there now.
        let same = match (std::fs::metadata(&path), locked.metadata()) {
            (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
            _ => false,
        };
        if !same {
            continue;
        }
        let stale = read_holder(&mut locked);
        let text = serde_json::to_string(info).map_err(|e| io(std::io::Error::other(e)))?;
        locked.set_len(0).map_err(io)?;
        locked.rewind().map_err(io)?;
        locked
            .write_all(format!("{text}\n").as_bytes())
            .and_then(|()| locked.sync_all())
            .map_err(io)?;
        return Ok(Taken {
            lock: JobLock {
                path,
                _file: locked,
            },
            stale,
        });
    }
}

/// The value of [`crate::env::TCHRUN_LOCK_HELD`] for these locks.
pub fn held_value(locks: &[JobLock]) -> String {
    std::env::join_paths(locks.iter().map(|l| l.path.clone()))
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Whether the launcher said (in `held`, the variable's value) that it holds `dir`'s lock.
pub fn held_by_launcher(held: Option<&str>, dir: &Path) -> bool {
    let Some(held) = held else { return false };
    let want = lock_path(dir);
    std::env::split_paths(held).any(|p| p == want)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_a_stale_lock_taken_over_and_release_removes_the_file() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = t.path().join("out");
        let a = LockInfo::here("tchrun train a");
        let first = acquire("--output", &dir, &a).expect("first");
        assert!(first.stale.is_none());
        let path = first.lock.path().to_path_buf();
        let e = acquire("--output", &dir, &LockInfo::here("b")).expect_err("held");
        let msg = e.to_string();
        assert!(
            msg.contains("in use by another job")
                && msg.contains(&format!("pid {}", a.pid))
                && msg.contains("tchrun train a")
                && msg.contains(&a.started),
            "{msg}"
        );
        match e {
            LockError::Held { holder, .. } => assert_eq!(holder.as_deref(), Some(&a)),
            e => panic!("{e}"),
        }
        drop(first);
        assert!(!path.exists(), "released: file removed");
        // A holder that died: its file stays, its flock is gone.
        let dead = LockInfo {
            pid: 999_999_999,
            ..a.clone()
        };
        std::fs::write(&path, serde_json::to_string(&dead).expect("json")).expect("write");
        let taken = acquire("--output", &dir, &LockInfo::here("c")).expect("stale");
        assert_eq!(taken.stale, Some(dead));
        assert!(taken.note().expect("note").contains("stale"));
        let value = held_value(std::slice::from_ref(&taken.lock));
        assert!(held_by_launcher(Some(&value), &dir));
        assert!(!held_by_launcher(Some(&value), t.path()));
        assert!(!held_by_launcher(None, &dir));
    }

    #[test]
    fn a_log_dir_inside_the_output_shares_its_lock() {
        let t = tempfile::tempdir().expect("tempdir");
        let o = t.path().join("o");
        assert_eq!(job_dirs(Some(&o), &o.join("logs")).len(), 1);
        assert_eq!(job_dirs(Some(&o), &t.path().join("logs")).len(), 2);
        assert_eq!(job_dirs(None, &t.path().join("logs")).len(), 1);
    }
}
