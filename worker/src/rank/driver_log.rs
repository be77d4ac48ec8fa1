//! The rank's `70_driver_log_<rank>`: a header, then every byte the process writes to fd 1 and
//! fd 2 (ours, libtorch's, Gloo's, NCCL's, a panic's), with `tracing` events timestamped.
//! The original stdout/stderr stay reachable as the rank's console: its user lines when
//! `--console` selects the rank, its `tracing` warnings and errors always.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};
use tchrun::driver_log::{FailureKind, FailureRecord};

/// Rank and host of this process once its driver log is open (fd 2 is the log from then on).
static IDENTITY: OnceLock<(usize, String)> = OnceLock::new();

/// The driver log's path and the rank's console stderr, for `LogWriter`'s one report.
static LOG_PATH: OnceLock<PathBuf> = OnceLock::new();
static CONSOLE_ERR: OnceLock<(Mutex<File>, String)> = OnceLock::new();
/// The first failed write to the driver log ("PATH: ERROR"), set once.
static LOG_WRITE_FAILURE: OnceLock<String> = OnceLock::new();

/// The first failure to write the driver log (a full or failing log disk), as
/// "the driver log PATH could not be written (ERROR); ...", if there was one. Training goes on
/// without the log; a failure recorded later carries this note (the log may lack the record).
pub fn log_write_failure() -> Option<&'static str> {
    LOG_WRITE_FAILURE.get().map(String::as_str)
}

/// Notes a failed write to the driver log: the first one is said once on the rank's console
/// (the log itself cannot say it), later ones are dropped.
fn log_write_failed(e: &std::io::Error) {
    let path = LOG_PATH
        .get()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "the driver log".into());
    let note = format!(
        "the driver log {path} could not be written ({e}); training goes on without it, its \
         lines from here on are lost (free space in --log-dir)"
    );
    if LOG_WRITE_FAILURE.set(note.clone()).is_ok() {
        console_err(&format!("warning: {note}"));
    }
}

/// Writes `text` on the rank's console stderr, each line behind the rank's prefix; nothing
/// before the driver log is open (fd 2 is then the console itself).
fn console_err(text: &str) {
    if let Some((err, prefix)) = CONSOLE_ERR.get() {
        if let Ok(mut f) = err.lock() {
            for line in text.lines() {
                let _ = writeln!(f, "{prefix}{line}");
            }
            let _ = f.flush();
        }
    }
}

/// The `tracing` target of the warnings and errors that stay in the driver log: those the
/// console already shows in other words (a fatal error's `tchrun-worker: error:` line, the
/// launcher's own warnings, a panic's backtrace).
pub const LOG_ONLY: &str = "tchrun_worker::log_only";

/// Every rank's `tracing` warnings and errors on its console stderr as well
/// (`<host>:<rank> warning: ...`), whatever `--console` selects: the launcher shows them from
/// every rank. Events with the target [`LOG_ONLY`] stay in the driver log.
struct ConsoleEvents;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for ConsoleEvents {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        let meta = event.metadata();
        let word = match *meta.level() {
            tracing::Level::ERROR => "error",
            tracing::Level::WARN => "warning",
            _ => return,
        };
        if meta.target() == LOG_ONLY {
            return;
        }
        let mut text = EventText::default();
        event.record(&mut text);
        console_err(&format!("{word}: {}{}", text.message, text.fields));
    }
}

/// An event's message, then its other fields as ` key=value`.
#[derive(Default)]
struct EventText {
    message: String,
    fields: String,
}

impl tracing::field::Visit for EventText {
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        if field.name() == "message" {
            self.message = value.to_string();
        } else {
            self.fields.push_str(&format!(" {}={value}", field.name()));
        }
    }
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.message = format!("{value:?}");
        } else {
            self.fields
                .push_str(&format!(" {}={value:?}", field.name()));
        }
    }
}

/// Writes to fd 2 (the driver log once it is open) and never fails: a failed write (a full
/// log disk) is reported once on the console (`log_write_failed`) and dropped. This is the
/// `tracing` writer and what the panic hook and failure records write through, so no log
/// write can panic (a panic inside the panic hook aborts the rank: SIGABRT, exit 134).
pub struct LogWriter;

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if let Err(e) = std::io::stderr().lock().write_all(buf) {
            log_write_failed(&e);
            // The launcher's hang watchdog (--hang-timeout) reads progress from the log's
            // mtime: a full disk still takes a timestamp, so a healthy rank is not "hung".
            use nix::sys::stat::futimens;
            use nix::sys::time::TimeSpec;
            let _ = futimens(2, &TimeSpec::UTIME_NOW, &TimeSpec::UTIME_NOW);
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes a failure record (`tchrun::driver_log::FailureRecord`) into the driver log with one
/// write straight to fd 2, not through `tracing`. Does nothing before the log is open (fd 2 is
/// then the terminal, and the error is printed there).
pub fn record_failure(
    kind: FailureKind,
    message: &str,
    location: Option<String>,
    exit_code: Option<i32>,
) {
    let Some((rank, host)) = IDENTITY.get() else {
        return;
    };
    // A log that could not be written loses lines; the record (and failure.json) says so.
    let message = match log_write_failure() {
        Some(note) => format!("{message} (note: {note})"),
        None => message.to_string(),
    };
    let record = FailureRecord {
        rank: *rank,
        host: host.clone(),
        pid: std::process::id(),
        time: tchrun::files::timestamp_now(),
        kind,
        message,
        location,
        exit_code,
    };
    let mut line = record.write();
    line.push('\n');
    let _ = LogWriter.write(line.as_bytes());
}

/// The kind of a failure whose message is libtorch's (a tch error, a c10d error, a panic in tch):
/// its own words for memory and for CUDA/cuDNN/NCCL, else `default`. Read here, where the text is
/// known to be libtorch's, so the launcher never has to guess from a log.
pub fn torch_failure_kind(message: &str, default: FailureKind) -> FailureKind {
    let m = message.to_ascii_lowercase();
    if m.contains("out of memory") || m.contains("can't allocate memory") {
        FailureKind::OutOfMemory
    } else if m.contains("cuda error") || m.contains("cudnn") || m.contains("nccl") {
        FailureKind::Cuda
    } else {
        default
    }
}

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
    /// Whether `--console` selects this rank: its lines for the user are printed.
    selected: bool,
}

impl Console {
    /// A line for the user on the original stdout, when `--console` selects this rank.
    pub fn out(&self, line: &str) {
        if self.selected {
            self.write(&self.out, line);
        }
    }
    /// A line for the user on the original stderr, whatever `--console` selects (an error).
    pub fn err(&self, line: &str) {
        self.write(&self.err, line);
    }
    /// Whether `--console` selects this rank.
    pub fn selected(&self) -> bool {
        self.selected
    }
    /// The console's stdout and stderr descriptors (`exec`'s reader keeps them, and only them).
    pub fn fds(&self) -> [i32; 2] {
        let fd = |m: &Mutex<File>| m.lock().map(|f| f.as_raw_fd()).unwrap_or(-1);
        [fd(&self.out), fd(&self.err)]
    }
    /// The prefixed line in one write: a pipe keeps it whole beside other ranks' lines.
    fn write(&self, file: &Mutex<File>, line: &str) {
        if let Ok(mut f) = file.lock() {
            let _ = f.write_all(format!("{}{line}\n", self.prefix).as_bytes());
        }
    }
}

fn dup_file(fd: i32) -> std::io::Result<File> {
    let new = nix::unistd::dup(fd).map_err(std::io::Error::from)?;
    // SAFETY: `new` is a fresh descriptor that we own.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(new) }))
}

/// Opens `<log_dir>/70_driver_log_<rank>`, writes the header, moves fds 1 and 2 into it, installs
/// the tracing subscriber and a panic hook (the caller installs the signal handlers next:
/// `signals::install`). Returns the console for user-facing lines, which
/// prints them when `selection` selects this rank.
pub fn open(
    log_dir: &Path,
    header: &Header,
    selection: &tchrun::console::Selection,
) -> std::io::Result<(PathBuf, Console)> {
    std::fs::create_dir_all(log_dir)?;
    let path = tchrun::files::driver_log(log_dir, header.rank);
    let mut file = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o640)
        // Never through a link planted in a shared log directory (ELOOP instead).
        .custom_flags(libc::O_NOFOLLOW)
        .open(&path)?;
    let text = tchrun::driver_log::Header {
        host: header.host.to_string(),
        rank: header.rank,
        local_rank: header.local_rank,
        world_size: header.world_size,
        pid: std::process::id(),
        device: header.device.to_string(),
        backend: header.backend.to_string(),
        started_by: header.started_by.to_string(),
        tchrun: tchrun::VERSION.to_string(),
        torch: env!("TCHRUN_TORCH_VERSION").to_string(),
        command: header.command.to_string(),
        started: tchrun::files::timestamp_now(),
    }
    .write();
    file.write_all(text.as_bytes())?;
    file.flush()?;
    let console = Console {
        out: Mutex::new(dup_file(1)?),
        err: Mutex::new(dup_file(2)?),
        prefix: tchrun::driver_log::console_prefix(header.host, header.rank),
        selected: selection.selects(header.host, header.rank),
    };
    let _ = LOG_PATH.set(path.clone());
    let _ = CONSOLE_ERR.set((Mutex::new(dup_file(2)?), console.prefix.clone()));
    nix::unistd::dup2(file.as_raw_fd(), 1).map_err(std::io::Error::from)?;
    nix::unistd::dup2(file.as_raw_fd(), 2).map_err(std::io::Error::from)?;
    drop(file);

    let filter = tracing_subscriber::EnvFilter::try_from_env(tchrun::env::TCHRUN_LOG)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let log = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(|| LogWriter)
        .with_target(false)
        // On a failed write tracing-subscriber would `eprintln!` (a panic on a full disk).
        .log_internal_errors(false);
    let _ = tracing_subscriber::registry()
        .with(filter)
        .with(log)
        .with(ConsoleEvents)
        .try_init();
    let rank = header.rank;
    let _ = IDENTITY.set((rank, header.host.to_string()));
    std::panic::set_hook(Box::new(move |info| {
        // The record first: the lines before it are what the rank did before the panic (the
        // launcher's tail), and it is out even if the logging below fails.
        let payload = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("(a panic without a message)");
        let message = tchrun::driver_log::panic_message(payload);
        record_failure(
            torch_failure_kind(&message, FailureKind::Panic),
            &message,
            info.location().map(|l| l.to_string()),
            None,
        );
        let bt = std::backtrace::Backtrace::force_capture();
        // The console gets the error the panic becomes (main's `tchrun-worker: error:`).
        tracing::error!(target: LOG_ONLY, "rank {rank} panicked: {info}\n{bt}");
    }));
    Ok((path, console))
}
