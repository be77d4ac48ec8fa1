//! The body's `tracing` lines (`<time> <LEVEL> <message>`) and the messages the launcher reads
//! back from them: progress, the training start (effective LR), the rank's summary and exit.
use std::time::Duration;

/// A `tracing` event's level as the log shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
    Trace,
}

/// One `tracing` line of the body: `<RFC 3339 time> <LEVEL> <message>` (the level padded to
/// five characters, as tracing-subscriber's `fmt` writes it without targets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    pub time: &'a str,
    pub level: Level,
    pub message: &'a str,
}

impl Event<'_> {
    /// The line as the worker's subscriber renders it.
    pub fn write(&self) -> String {
        let level = match self.level {
            Level::Error => "ERROR",
            Level::Warn => "WARN",
            Level::Info => "INFO",
            Level::Debug => "DEBUG",
            Level::Trace => "TRACE",
        };
        format!("{} {level:>5} {}", self.time, self.message)
    }
}

/// Reads a body line as a `tracing` event; `None` for anything else (libtorch's output, a
/// backtrace frame, a continuation line of a multi-line message).
pub fn parse_event(line: &str) -> Option<Event<'_>> {
    let (time, rest) = line.split_once(' ')?;
    if !(time.starts_with(|c: char| c.is_ascii_digit())
        && time.ends_with('Z')
        && time.contains('T'))
    {
        return None;
    }
    let rest = rest.trim_start_matches(' ');
    let (level, message) = rest.split_once(' ').unwrap_or((rest, ""));
    let level = match level {
        "ERROR" => Level::Error,
        "WARN" => Level::Warn,
        "INFO" => Level::Info,
        "DEBUG" => Level::Debug,
        "TRACE" => Level::Trace,
        _ => return None,
    };
    Some(Event {
        time,
        level,
        message,
    })
}

/// Matches `s` against literal pieces with one field between each two: `pieces[0]`, field,
/// `pieces[1]`, field, ..., `pieces[n]`. Each field ends at the first occurrence of the piece
/// after it (the last piece must end `s`).
fn scan<'a>(s: &'a str, pieces: &[&str]) -> Option<Vec<&'a str>> {
    let (first, rest_pieces) = pieces.split_first()?;
    let mut rest = s.strip_prefix(first)?;
    let mut fields = Vec::with_capacity(rest_pieces.len());
    for (i, piece) in rest_pieces.iter().enumerate() {
        let last = i + 1 == rest_pieces.len();
        let at = if last {
            if piece.is_empty() {
                rest.len()
            } else {
                rest.strip_suffix(piece).map(str::len)?
            }
        } else {
            rest.find(piece)?
        };
        fields.push(&rest[..at]);
        rest = &rest[at + piece.len()..];
    }
    rest.is_empty().then_some(fields)
}

fn field<T: std::str::FromStr>(fields: &[&str], i: usize) -> Option<T> {
    fields.get(i)?.parse().ok()
}

/// A training progress line: rank 0 prints it on its console too (`<host>:0 <line>`), where the
/// launcher rewrites it in place on a terminal.
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    /// 1-based.
    pub epoch: u32,
    pub epochs: u32,
    /// 1-based.
    pub iter: u64,
    pub iters: u64,
    pub loss: f64,
    pub lr: f64,
    pub images_per_s: f64,
    /// Time left for the training steps, whole seconds.
    pub eta: Duration,
}

const PROGRESS: &[&str] = &[
    "epoch ",
    "/",
    " iter ",
    "/",
    " loss ",
    " lr ",
    " images/s ",
    " eta ",
    "",
];

impl Progress {
    pub fn write(&self) -> String {
        format!(
            "epoch {}/{} iter {}/{} loss {:.4} lr {:.3e} images/s {:.1} eta {}",
            self.epoch,
            self.epochs,
            self.iter,
            self.iters,
            self.loss,
            self.lr,
            self.images_per_s,
            humantime::format_duration(Duration::from_secs(self.eta.as_secs()))
        )
    }

    /// Parses a message as `write` renders it (numbers as printed, so rounded).
    pub fn parse(message: &str) -> Option<Progress> {
        let f = scan(message, PROGRESS)?;
        Some(Progress {
            epoch: field(&f, 0)?,
            epochs: field(&f, 1)?,
            iter: field(&f, 2)?,
            iters: field(&f, 3)?,
            loss: field(&f, 4)?,
            lr: field(&f, 5)?,
            images_per_s: field(&f, 6)?,
            eta: humantime::parse_duration(f.get(7)?).ok()?,
        })
    }
}

/// The line a training run starts with (on rank 0's console too); the run report takes the
/// effective LR from it.
#[derive(Debug, Clone, PartialEq)]
pub struct TrainingStart {
    pub arch: String,
    pub train_images: usize,
    pub valid_images: usize,
    pub classes: usize,
    pub world_size: usize,
    /// "cpu" or "cuda".
    pub device: String,
    pub steps_per_epoch: u64,
    pub effective_lr: f64,
    pub lr: f64,
    /// effective LR / --lr as written: the world size ("2", `--lr-scaling linear`), "√8"
    /// (sqrt), "1" (none); with `--global-batch-size` the factor follows G / --batch-size.
    pub lr_factor: String,
    pub bucket_cap_mb: f64,
}

const TRAINING_START: &[&str] = &[
    "training ",
    " on ",
    " train / ",
    " valid images, ",
    " classes, ",
    " rank(s) on ",
    ": ",
    " steps/epoch, effective LR ",
    " (--lr ",
    " × ",
    "), gradient buckets of ",
    " MiB overlapped with backward",
];

impl TrainingStart {
    pub fn write(&self) -> String {
        format!(
            "training {} on {} train / {} valid images, {} classes, {} rank(s) on {}: {} steps/epoch, \
             effective LR {:e} (--lr {:e} × {}), gradient buckets of {} MiB overlapped with backward",
            self.arch,
            self.train_images,
            self.valid_images,
            self.classes,
            self.world_size,
            self.device,
            self.steps_per_epoch,
            self.effective_lr,
            self.lr,
            self.lr_factor,
            self.bucket_cap_mb
        )
    }

    pub fn parse(message: &str) -> Option<TrainingStart> {
        let f = scan(message, TRAINING_START)?;
        let world_size: usize = field(&f, 4)?;
        Some(TrainingStart {
            arch: f.first()?.to_string(),
            train_images: field(&f, 1)?,
            valid_images: field(&f, 2)?,
            classes: field(&f, 3)?,
            world_size,
            device: f.get(5)?.to_string(),
            steps_per_epoch: field(&f, 6)?,
            effective_lr: field(&f, 7)?,
            lr: field(&f, 8)?,
            lr_factor: f.get(9)?.to_string(),
            bucket_cap_mb: field(&f, 10)?,
        })
    }
}

/// A rank's totals at the end of training (the run report's throughput and slowest rank).
#[derive(Debug, Clone, PartialEq)]
pub struct RankSummary {
    pub images: f64,
    pub compute_s: f64,
    pub communication_s: f64,
}

const RANK_SUMMARY: &[&str] = &[
    "rank summary: images ",
    ", compute ",
    "s, communication ",
    "s, images/s ",
    "",
];

impl RankSummary {
    pub fn write(&self) -> String {
        format!(
            "rank summary: images {:.0}, compute {:.2}s, communication {:.2}s, images/s {:.1}",
            self.images,
            self.compute_s,
            self.communication_s,
            self.images / (self.compute_s + self.communication_s).max(1e-9)
        )
    }

    pub fn parse(message: &str) -> Option<RankSummary> {
        let f = scan(message, RANK_SUMMARY)?;
        field::<f64>(&f, 3)?;
        Some(RankSummary {
            images: field(&f, 0)?,
            compute_s: field(&f, 1)?,
            communication_s: field(&f, 2)?,
        })
    }
}

/// The code a rank says it exits with (its last line, after success as after a failure).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RankExit {
    pub code: i32,
}

impl RankExit {
    pub fn write(&self) -> String {
        format!("rank exiting with code {}", self.code)
    }

    pub fn parse(message: &str) -> Option<RankExit> {
        let code = message.strip_prefix("rank exiting with code ")?;
        Some(RankExit {
            code: code.trim().parse().ok()?,
        })
    }
}
