//! The rank's `70_driver_log_<rank>`: a header, then every byte the process writes to fd 1 and
//! fd 2 (ours, libtorch's, Gloo's, NCCL's, a panic's), with `tracing` events timestamped.
//! The original stdout/stderr stay reachable as the rank's console for user-facing lines.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// Header fields of a driver log.
pub struct Header<'a> {
    pub host: &'a str,
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub device: &'a str,
    pub backend: &'a str,
    pub command: &'a str,
    pub started_by: &'a str,
}

/// The console (the stdout/stderr this rank was started with) after fds 1 and 2 moved to the log.
pub struct Console {
    out: Mutex<File>,
    err: Mutex<File>,
    /// `host:rank ` before every line, so interleaved ranks stay readable.
    prefix: String,
}

impl Console {
    /// A line for the user on the original stdout.
    pub fn out(&self, line: &str) {
        if let Ok(mut f) = self.out.lock() {
            let _ = writeln!(f, "{}{line}", self.prefix);
            let _ = f.flush();
        }
    }
    /// A line for the user on the original stderr.
    pub fn err(&self, line: &str) {
        if let Ok(mut f) = self.err.lock() {
            let _ = writeln!(f, "{}{line}", self.prefix);
            let _ = f.flush();
        }
    }
}

fn dup_file(fd: i32) -> std::io::Result<File> {
    let new = nix::unistd::dup(fd).map_err(std::io::Error::from)?;
    // SAFETY: `new` is a fresh descriptor that we own.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(new) }))
}

/// Opens `<log_dir>/70_driver_log_<rank>`, writes the header, moves fds 1 and 2 into it, installs
/// the tracing subscriber and a panic hook. Returns the console for user-facing lines.
pub fn open(log_dir: &Path, header: &Header) -> std::io::Result<(PathBuf, Console)> {
    std::fs::create_dir_all(log_dir)?;
    let path = tchrun::files::driver_log(log_dir, header.rank);
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o640)
        .open(&path)?;
    writeln!(
        file,
        "tchrun driver log\nhost: {}\nrank: {}\nlocal_rank: {}\nworld_size: {}\npid: {}\ndevice: {}\nbackend: {}\n\
         started_by: {}\ntchrun: {}\ntorch: {}\ncommand: {}\nstarted: {}\n---",
        header.host,
        header.rank,
        header.local_rank,
        header.world_size,
        std::process::id(),
        header.device,
        header.backend,
        header.started_by,
        tchrun::VERSION,
        env!("TCHRUN_TORCH_VERSION"),
        header.command,
        tchrun::files::timestamp_now(),
    )?;
    file.flush()?;
    let console = Console {
        out: Mutex::new(dup_file(1)?),
        err: Mutex::new(dup_file(2)?),
        prefix: format!("{}:{} ", header.host, header.rank),
    };
    nix::unistd::dup2(file.as_raw_fd(), 1).map_err(std::io::Error::from)?;
    nix::unistd::dup2(file.as_raw_fd(), 2).map_err(std::io::Error::from)?;
    drop(file);

    let filter = tracing_subscriber::EnvFilter::try_from_env("TCHRUN_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(false)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    let rank = header.rank;
    std::panic::set_hook(Box::new(move |info| {
        let bt = std::backtrace::Backtrace::force_capture();
        tracing::error!("rank {rank} panicked: {info}\n{bt}");
    }));
    crate::signals::install()?;
    Ok((path, console))
}
