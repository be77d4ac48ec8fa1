//! File names of the log directory and the model directories, written once here.
use std::path::{Path, PathBuf};

pub use crate::bounded_read::{
    caps, open_regular, read_bounded, read_bounded_into, read_bounded_string, BoundedReadError,
};

/// Launch output of mpirun/srun and the launcher itself.
pub const MPI_LOG: &str = "70_mpi_log";
/// Prefix of the per-rank driver logs.
pub const DRIVER_LOG_PREFIX: &str = "70_driver_log_";
/// Rank table written by the launcher.
pub const RANKS_JSON: &str = "ranks.json";
/// Failure summary written by the launcher.
pub const FAILURE_JSON: &str = "failure.json";
/// Where a running job is (`job_record::status`): rank 0 rewrites it while the job runs, the
/// launcher before and after; `tchrun status` reads it.
pub const STATUS_JSON: &str = "status.json";
/// The attempts of a job that restarted (`--max-restarts`), written by the launcher.
pub const RESTARTS_JSON: &str = "restarts.json";
/// The job lock (`lock.rs`) in an output or log directory: present while a job runs there
/// (its holder's host, pid, start time and command, JSON), removed when the job ends.
pub const LOCK_FILE: &str = ".tchrun.lock";
/// Checkpoints inside `--output`, and the file that names the last complete one.
pub const CHECKPOINT_DIR: &str = "checkpoints";
pub const CHECKPOINT_LAST: &str = "last.json";
/// The launcher's copies of the train and valid dataset indexes (`data::index`) in the log
/// directory, which the ranks read instead of listing the folders.
pub const DATASET_INDEX_COPIES: [&str; 2] = ["dataset-index-train.v1", "dataset-index-valid.v1"];
/// Model description inside a model directory.
pub const MODEL_JSON: &str = "model.json";
/// `--model-ema`'s model directory inside `--output`.
pub const EMA_DIR: &str = "ema";
/// Weights inside a trained model directory.
pub const MODEL_WEIGHTS: &str = "model.safetensors";
/// Per-epoch metrics, one JSON object a line.
pub const METRICS_JSONL: &str = "metrics.jsonl";
/// Plot of the metrics.
pub const METRICS_PLOT: &str = "metrics.png";
/// Log directory inside `--output` when `--log-dir` is not given.
pub const DEFAULT_LOG_SUBDIR: &str = "logs";
/// Driver-log prefix of a line naming an image dropped under `--skip-bad-images` (once per
/// file per rank); the launcher counts the distinct files for its run report.
pub const SKIPPED_IMAGE: &str = "skipped bad image: ";

/// `<log_dir>/attempt-<n>`: the logs of an earlier attempt of a restarted job.
pub fn attempt_dir(log_dir: &Path, attempt: u32) -> PathBuf {
    log_dir.join(format!("attempt-{attempt}"))
}

/// `<log_dir>/70_driver_log_<rank>`.
pub fn driver_log(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("{DRIVER_LOG_PREFIX}{rank}"))
}

/// The rank a driver log file name belongs to, if it is one.
pub fn driver_log_rank(file_name: &str) -> Option<usize> {
    file_name.strip_prefix(DRIVER_LOG_PREFIX)?.parse().ok()
}

/// `<log_dir>/70_mpi_log`.
pub fn mpi_log(log_dir: &Path) -> PathBuf {
    log_dir.join(MPI_LOG)
}

/// A failed step of an atomic write: the file it concerns (the temporary file while writing
/// and syncing, the target for the rename) and the I/O error. Displays as `<file>: <error>`.
#[derive(Debug)]
pub struct AtomicWriteError {
    pub path: PathBuf,
    pub source: std::io::Error,
}

impl std::fmt::Display for AtomicWriteError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.path.display(), self.source)
    }
}

impl std::error::Error for AtomicWriteError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.source)
    }
}

/// Whether `p` is a regular file with an execute bit (a program `PATH` lookups may run).
pub fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The temporary file beside `path` that an atomic write fills: `.<name>.<pid>.<n>.<random>.tmp`
/// (the random part: nobody who can write the directory can plant a link there first).
fn atomic_tmp(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    // Unique per write, not only per process: two threads of a rank writing the same file (the
    // status thread and the main thread's last word) must not rename each other's temp file.
    static WRITES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = WRITES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let random: u64 = rand::random();
    path.with_file_name(format!(
        ".{name}.{}.{n}.{random:016x}.tmp",
        std::process::id()
    ))
}

/// Writes `path` atomically: `fill` writes a temporary file beside it (the path it is given),
/// which is then fsynced and renamed over `path`; a reader sees the old file or the new one,
/// never a part. On any failure the temporary file is removed. `fill`'s own errors come back
/// as they are; those of the sync and the rename through `io_err`. The one implementation of
/// "temp, fsync, rename" (ARCHITECTURE.md's invariant of training).
pub fn write_atomic_with<E>(
    path: &Path,
    fill: impl FnOnce(&Path) -> Result<(), E>,
    io_err: impl Fn(AtomicWriteError) -> E,
) -> Result<(), E> {
    replace_atomically(path, fill, io_err, narrow_mode)
}

/// [`write_atomic_with`]'s body, the temporary file's mode settled by `settle` before the
/// sync (narrowed to [`FILE_MODE`], or set to another mode by [`write_atomic_mode`]).
fn replace_atomically<E>(
    path: &Path,
    fill: impl FnOnce(&Path) -> Result<(), E>,
    io_err: impl Fn(AtomicWriteError) -> E,
    settle: impl FnOnce(&Path) -> std::io::Result<()>,
) -> Result<(), E> {
    let tmp = atomic_tmp(path);
    let result = fill(&tmp).and_then(|()| {
        settle(&tmp)
            .and_then(|()| std::fs::File::open(&tmp))
            .and_then(|f| f.sync_all())
            .map_err(|source| {
                io_err(AtomicWriteError {
                    path: tmp.clone(),
                    source,
                })
            })?;
        std::fs::rename(&tmp, path).map_err(|source| {
            io_err(AtomicWriteError {
                path: path.to_path_buf(),
                source,
            })
        })
    });
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp); // never leave a partial file behind
    }
    result
}

/// The mode of every file tchrun writes (logs, metrics, models, checkpoints): owner read and
/// write, group read.
pub const FILE_MODE: u32 = 0o640;

/// Narrows `path`'s mode to [`FILE_MODE`] when a writer that takes no mode (libtorch's
/// safetensors, the PNG encoder, an older file) left it wider; a narrower one is kept.
pub fn narrow_mode(path: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(path)?.permissions().mode() & 0o7777;
    if mode & !FILE_MODE != 0 {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode & FILE_MODE))?;
    }
    Ok(())
}

/// A log file, empty, with the mode of every log file ([`FILE_MODE`], as the driver logs and
/// the atomic writes): created so, or narrowed if an older one was wider. Never opened through
/// a link planted in a shared log directory (ELOOP instead).
pub fn create_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(FILE_MODE)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(path)?;
    let mode = f.metadata()?.permissions().mode() & 0o7777;
    if mode & !FILE_MODE != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(mode & FILE_MODE))?;
    }
    Ok(f)
}

/// Bytes an unprivileged writer may still use on the file system of `dir`.
pub fn free_bytes(dir: &Path) -> Option<u64> {
    let s = nix::sys::statvfs::statvfs(dir).ok()?;
    (s.blocks_available() as u64).checked_mul(s.fragment_size() as u64)
}

/// [`write_atomic_with`] for bytes: the file is created with mode 0640.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), AtomicWriteError> {
    write_atomic_with(path, |tmp| create_new_with(tmp, bytes, FILE_MODE), |e| e)
}

/// [`write_atomic`] with another mode than [`FILE_MODE`] (set on the temporary file before
/// the rename, whatever the umask): a file another user's daemon reads, as the
/// `--prometheus-textfile` file node_exporter reads.
pub fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    use std::os::unix::fs::PermissionsExt;
    replace_atomically(
        path,
        |tmp| create_new_with(tmp, bytes, mode),
        |e| e,
        |tmp| std::fs::set_permissions(tmp, std::fs::Permissions::from_mode(mode)),
    )
}

/// A new file holding `bytes`, created with `mode`; never through a link (a name planted
/// first fails the write).
fn create_new_with(tmp: &Path, bytes: &[u8], mode: u32) -> Result<(), AtomicWriteError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .create_new(true)
        .write(true)
        .mode(mode)
        .custom_flags(nix::fcntl::OFlag::O_NOFOLLOW.bits())
        .open(tmp)
        .and_then(|mut f| f.write_all(bytes))
        .map_err(|source| AtomicWriteError {
            path: tmp.to_path_buf(),
            source,
        })
}

/// A job's own log directory in `base`, the default log directory of the commands that have no
/// output folder (`exec`, `selftest`; `score` beside its CSV): `<base>/<command>-<UTC time>`,
/// as `exec-20261124-153000`, with `-2`, `-3`... when a job of the same second has it. So jobs
/// do not overwrite each other's logs, and `tchrun logs` finds the newest ([`job_dirs_in`]).
/// With `reserve` the folder is created (at once and atomically: two jobs started together get
/// two folders) and removed again if the job leaves it empty ([`NewLogDir`]); a dry run only
/// names it.
pub fn job_log_dir(base: &Path, command: &str, reserve: bool) -> std::io::Result<NewLogDir> {
    let stamp: String = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
        .to_string()
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    let name = format!("{command}-{}-{}", &stamp[..8], &stamp[8..]);
    let base_created = reserve && !base.exists();
    if reserve {
        std::fs::create_dir_all(base)?;
    }
    for n in 1u32.. {
        let dir = match n {
            1 => base.join(&name),
            n => base.join(format!("{name}-{n}")),
        };
        let taken = if reserve {
            match std::fs::create_dir(&dir) {
                Ok(()) => false,
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => true,
                Err(e) => return Err(e),
            }
        } else {
            dir.exists()
        };
        if !taken {
            return Ok(NewLogDir {
                dir,
                created: reserve,
                base_created,
            });
        }
    }
    unreachable!("a free name among 2^32")
}

/// A job's own log directory ([`job_log_dir`]); removed when dropped if the job wrote nothing
/// there (it stopped before its ranks started, e.g. on a refused flag), and so is the folder
/// of job folders if it made it and it is empty.
#[derive(Debug)]
pub struct NewLogDir {
    pub dir: PathBuf,
    created: bool,
    base_created: bool,
}

impl Drop for NewLogDir {
    fn drop(&mut self) {
        // `remove_dir` fails, as wanted, on a folder that holds anything.
        if self.created && std::fs::remove_dir(&self.dir).is_ok() && self.base_created {
            if let Some(base) = self.dir.parent() {
                let _ = std::fs::remove_dir(base);
            }
        }
    }
}

/// The folders in `base` named as [`job_log_dir`] names them, oldest first.
pub fn job_dirs_in(base: &Path) -> Vec<PathBuf> {
    let mut dirs: Vec<(String, u32, PathBuf)> = std::fs::read_dir(base)
        .map(|rd| rd.flatten().map(|e| e.path()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p.is_dir())
        .filter_map(|p| {
            let name = p.file_name()?.to_str()?.to_string();
            let (stamp, n) = job_dir_stamp(&name)?;
            Some((stamp, n, p))
        })
        .collect();
    dirs.sort();
    dirs.into_iter().map(|(_, _, p)| p).collect()
}

/// `exec-20261124-153000-2` → ("20261124-153000", 2): the time and the number of a job folder's
/// name.
fn job_dir_stamp(name: &str) -> Option<(String, u32)> {
    let parts: Vec<&str> = name.split('-').collect();
    let digits = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_digit());
    let at = parts
        .windows(2)
        .position(|w| digits(w[0], 8) && digits(w[1], 6))?;
    let n = match &parts[at + 2..] {
        [] => 1,
        [n] => n.parse().ok()?,
        _ => return None,
    };
    (at > 0).then(|| (format!("{}-{}", parts[at], parts[at + 1]), n))
}

/// Environment variable naming the cache root for extracted archives.
pub const DATA_CACHE_ENV: &str = "TCHRUN_DATA_CACHE";
/// The data cache's folder of extracted archives.
pub const CACHE_SUBDIR: &str = "archives";

/// tchrun's data cache (extracted archives, dataset indexes): `$TCHRUN_DATA_CACHE`, else
/// `$XDG_CACHE_HOME/tchrun`, else `~/.cache/tchrun`, else the temporary folder's `tchrun-cache`.
pub fn data_cache() -> PathBuf {
    let set = |name: &str| {
        std::env::var_os(name)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    set(DATA_CACHE_ENV)
        .or_else(|| set("XDG_CACHE_HOME").map(|d| d.join("tchrun")))
        .or_else(|| set("HOME").map(|d| d.join(".cache/tchrun")))
        .unwrap_or_else(|| std::env::temp_dir().join("tchrun-cache"))
}

/// Where archives are extracted: the data cache's `archives/` ([`data_cache`]).
pub fn cache_root() -> PathBuf {
    data_cache().join(CACHE_SUBDIR)
}

/// The model directory's folder of TensorBoard event files (`tchrun-tensorboard` writes them).
pub const TENSORBOARD_DIR: &str = "tensorboard";

/// A failed write of `what` (`needed` bytes) to `path`, in words: a full file system (or
/// quota) says so with the space needed and the space left, since the error itself may only
/// say "os error 28" (or a library's Debug text of it); anything else keeps its error.
pub fn describe_write_error(what: &str, path: &Path, error: &str, needed: u64) -> String {
    let folder = path.parent().unwrap_or(path);
    let fs = nix::sys::statvfs::statvfs(folder).ok().map(|s| {
        let block = s.fragment_size();
        (s.blocks_available() * block, s.blocks() * block)
    });
    let full = [
        "StorageFull",
        "No space left",
        "os error 28",
        "QuotaExceeded",
        "os error 122",
    ]
    .iter()
    .any(|w| error.contains(w))
        || fs.is_some_and(|(free, _)| free < needed);
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    if full {
        format!(
            "no space left on the file system of {} (No space left on device): {what} needs \
             {:.1} MB ({}) and {}; free some space or use a larger file system, then run the job \
             again (with --resume when a checkpoint was kept)",
            folder.display(),
            mb(needed),
            path.display(),
            fs.map(|(free, total)| format!(
                "{:.1} MB are free of the file system's {:.1} MB",
                mb(free),
                mb(total)
            ))
            .unwrap_or_else(|| "the free space is unknown".into())
        )
    } else {
        format!("cannot write {}: {error}", path.display())
    }
}

/// Now as RFC 3339 UTC with milliseconds: the one timestamp format of tchrun's files
/// (driver logs, `failure.json`, `metrics.jsonl`).
pub fn timestamp_now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_threads_writing_one_file_atomically_never_fail() {
        let d = std::env::temp_dir().join(format!("tchrun-atomic-threads-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        let path = d.join("status.json");
        std::thread::scope(|s| {
            for t in 0..2u8 {
                let path = &path;
                s.spawn(move || {
                    for i in 0..300u32 {
                        write_atomic(path, format!("{t}:{i}").as_bytes())
                            .unwrap_or_else(|e| panic!("thread {t}, write {i}: {e}"));
                    }
                });
            }
        });
        let left: Vec<_> = std::fs::read_dir(&d)
            .expect("dir")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            left,
            [std::ffi::OsString::from("status.json")],
            "no temp file left"
        );
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn driver_log_round_trip() {
        let p = driver_log(Path::new("/x"), 12);
        assert_eq!(p, Path::new("/x/70_driver_log_12"));
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(driver_log_rank(name), Some(12));
        assert_eq!(driver_log_rank("70_mpi_log"), None);
    }

    #[test]
    fn atomic_write_replaces_and_leaves_no_temporary_file() {
        let d = std::env::temp_dir().join(format!("tchrun-atomic-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        let p = d.join("a.json");
        write_atomic(&p, b"one").expect("first write");
        write_atomic(&p, b"two").expect("second write");
        assert_eq!(std::fs::read(&p).expect("read"), b"two");
        let failed: Result<(), String> =
            write_atomic_with(&p, |_| Err("no".to_string()), |e| e.to_string());
        assert_eq!(failed, Err("no".to_string()));
        assert_eq!(std::fs::read(&p).expect("read"), b"two");
        let names: Vec<_> = std::fs::read_dir(&d)
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
        let _ = std::fs::remove_dir_all(&d);
    }

    #[test]
    fn each_job_gets_its_own_log_folder_and_the_newest_sorts_last() {
        let base = std::env::temp_dir().join(format!("tchrun-jobdirs-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let named = job_log_dir(&base, "exec", false).expect("named");
        assert!(!base.exists(), "a dry run creates nothing");
        let a = job_log_dir(&base, "exec", true).expect("first");
        let b = job_log_dir(&base, "exec", true).expect("second");
        assert_ne!(a.dir, b.dir);
        let name = a
            .dir
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        assert!(
            name.starts_with("exec-") && name.len() == "exec-20261124-153000".len(),
            "{name}"
        );
        assert!(named.dir.file_name() <= a.dir.file_name());
        std::fs::write(b.dir.join(MPI_LOG), "x").expect("write");
        std::fs::create_dir(base.join("selftest-20000101-000000")).expect("mkdir");
        std::fs::create_dir(base.join("notes")).expect("mkdir");
        let dirs = job_dirs_in(&base);
        assert_eq!(dirs.len(), 3, "{dirs:?}");
        assert_eq!(dirs[0], base.join("selftest-20000101-000000"));
        assert_eq!(dirs[2], b.dir);
        drop((a, b));
        assert_eq!(
            job_dirs_in(&base).len(),
            2,
            "the empty one is removed, the other kept"
        );
        let other = base.join("new-base");
        drop(job_log_dir(&other, "score", true).expect("reserved"));
        assert!(
            !other.exists(),
            "an unused folder of job folders is removed too"
        );
        assert_eq!(
            job_dir_stamp("score-20261124-153000-12"),
            Some(("20261124-153000".into(), 12))
        );
        assert_eq!(job_dir_stamp("20261124-153000"), None);
        let _ = std::fs::remove_dir_all(&base);
    }
}
