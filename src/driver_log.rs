//! The driver log (`70_driver_log_<rank>`) as a contract: the worker writes it and the launcher
//! reads it back, both through these types; neither side spells a line by hand.
//!
//! A driver log is, in order:
//! - the header ([`Header`]): `tchrun driver log`, then `key: value` lines, then `---`;
//! - the body: every byte the rank wrote (ours, libtorch's, Gloo's, NCCL's). tchrun's own lines
//!   are `tracing` events, `<RFC 3339 time> <LEVEL> <message>` ([`parse_event`]); the messages
//!   the launcher reads back are typed here: [`Progress`], [`TrainingStart`] (the effective LR),
//!   [`RankSummary`], [`RankExit`];
//! - the failure record ([`FailureRecord`]), when the rank fails: one line
//!   `tchrun failure record: {json}` written by the rank's top-level error handler and by its
//!   panic hook, with one `write(2)` straight to the log (not through `tracing`, so a panic
//!   inside the logger cannot stop it). It lives in the driver log rather than in a sidecar
//!   file: one file per rank to collect, nothing to create in a directory that may be full or
//!   gone, and its position tells the launcher which lines came before the failure (the tail it
//!   shows). A rank may write more than one (a thread's panic, then the error it caused in the
//!   main thread): the first is the root cause, the last one with an exit code says how the rank
//!   ended. A rank killed by SIGKILL writes none; the launcher then falls back to the exit
//!   status and the log's words.
//!
//! Every `write` renders the human-readable line people and tests already read; every `parse`
//! accepts exactly what `write` renders (round trips are property-tested).
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// The first line of every driver log.
pub const MAGIC: &str = "tchrun driver log";
/// The line that ends the header.
pub const HEADER_END: &str = "---";
/// What starts a failure record line (the JSON body follows).
pub const FAILURE_RECORD_PREFIX: &str = "tchrun failure record: ";

/// A driver log that does not follow the contract.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DriverLogError {
    #[error("not a tchrun driver log (its first line is not '{MAGIC}')")]
    NotADriverLog,
    #[error("the driver log header ends before '{HEADER_END}'")]
    UnterminatedHeader,
    #[error("the driver log header lacks '{0}'")]
    MissingKey(&'static str),
    #[error("the driver log header has an invalid '{key}': {value:?}")]
    InvalidValue { key: &'static str, value: String },
}

/// The header of a driver log: who the rank is, where it runs, what it runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub host: String,
    pub rank: usize,
    pub local_rank: usize,
    pub world_size: usize,
    pub pid: u32,
    pub device: String,
    pub backend: String,
    pub started_by: String,
    /// tchrun's version.
    pub tchrun: String,
    /// libtorch's version.
    pub torch: String,
    pub command: String,
    /// RFC 3339 time the log was opened.
    pub started: String,
}

/// Header values are one line each: backslashes, newlines and carriage returns are escaped.
fn escape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '\n' => s.push_str("\\n"),
            '\r' => s.push_str("\\r"),
            c => s.push(c),
        }
    }
    s
}

fn unescape(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            s.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => s.push('\n'),
            Some('r') => s.push('\r'),
            Some(other) => s.push(other),
            None => s.push('\\'),
        }
    }
    s
}

impl Header {
    /// The header as written at the top of the log, `---` line included.
    pub fn write(&self) -> String {
        format!(
            "{MAGIC}\nhost: {}\nrank: {}\nlocal_rank: {}\nworld_size: {}\npid: {}\ndevice: {}\n\
             backend: {}\nstarted_by: {}\ntchrun: {}\ntorch: {}\ncommand: {}\nstarted: {}\n{HEADER_END}\n",
            escape(&self.host),
            self.rank,
            self.local_rank,
            self.world_size,
            self.pid,
            escape(&self.device),
            escape(&self.backend),
            escape(&self.started_by),
            escape(&self.tchrun),
            escape(&self.torch),
            escape(&self.command),
            escape(&self.started),
        )
    }

    /// Reads the header at the start of `text`; returns it and the body after `---`.
    pub fn parse(text: &str) -> Result<(Header, &str), DriverLogError> {
        let mut rest = text;
        let mut next_line = || -> Option<&str> {
            if rest.is_empty() {
                return None;
            }
            let (line, after) = rest.split_once('\n').unwrap_or((rest, ""));
            rest = after;
            Some(line)
        };
        if next_line() != Some(MAGIC) {
            return Err(DriverLogError::NotADriverLog);
        }
        let mut fields = std::collections::BTreeMap::new();
        loop {
            match next_line() {
                None => return Err(DriverLogError::UnterminatedHeader),
                Some(HEADER_END) => break,
                Some(line) => {
                    if let Some((k, v)) = line.split_once(": ") {
                        fields.insert(k.to_string(), unescape(v));
                    } else if let Some(k) = line.strip_suffix(':') {
                        fields.insert(k.to_string(), String::new());
                    }
                }
            }
        }
        let body = rest;
        let text = |key: &'static str| -> Result<String, DriverLogError> {
            fields
                .get(key)
                .cloned()
                .ok_or(DriverLogError::MissingKey(key))
        };
        fn num<T: std::str::FromStr>(key: &'static str, v: String) -> Result<T, DriverLogError> {
            v.trim()
                .parse()
                .map_err(|_| DriverLogError::InvalidValue { key, value: v })
        }
        Ok((
            Header {
                host: text("host")?,
                rank: num("rank", text("rank")?)?,
                local_rank: num("local_rank", text("local_rank")?)?,
                world_size: num("world_size", text("world_size")?)?,
                pid: num("pid", text("pid")?)?,
                device: text("device")?,
                backend: text("backend")?,
                started_by: text("started_by")?,
                tchrun: text("tchrun")?,
                torch: text("torch")?,
                command: text("command")?,
                started: text("started")?,
            },
            body,
        ))
    }
}

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

/// What kind of failure a rank recorded; the launcher's summary names it (`classification`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureKind {
    /// Flags, model directory, images: refused by the rank's own checks (exit 2).
    InvalidInput,
    /// An image or dataset that failed while training.
    Data,
    /// The loss (or a gradient) became NaN/inf (exit 5).
    Diverged,
    /// CPU or GPU memory ran out.
    OutOfMemory,
    /// CUDA, cuDNN or NCCL reported an error.
    Cuda,
    /// The store, a collective or a peer failed (a peer died, the network, a timeout).
    Communication,
    /// Reading or writing files (checkpoints, the model directory, logs).
    Io,
    /// SIGINT/SIGTERM asked the rank to stop.
    Interrupted,
    /// A Rust panic; inside tch this is usually a libtorch exception (the message says which).
    Panic,
    /// Anything else.
    Internal,
}

impl FailureKind {
    /// The summary's words for this kind.
    pub fn classification(self) -> &'static str {
        match self {
            FailureKind::InvalidInput => "invalid input",
            FailureKind::Data => "data error",
            FailureKind::Diverged => "training diverged (NaN/inf loss)",
            FailureKind::OutOfMemory => "out of memory",
            FailureKind::Cuda => "CUDA/NCCL error",
            FailureKind::Communication => {
                "communication error (a peer failed or the network is unreachable)"
            }
            FailureKind::Io => "I/O error",
            FailureKind::Interrupted => "interrupted",
            FailureKind::Panic => "crash (panic)",
            FailureKind::Internal => "error",
        }
    }

    /// The kind of an error that only has an exit code to go by.
    pub fn from_error_kind(kind: crate::exit::ErrorKind) -> FailureKind {
        use crate::exit::ErrorKind as K;
        match kind {
            K::InvalidInput => FailureKind::InvalidInput,
            K::Diverged => FailureKind::Diverged,
            K::InterruptedInt | K::InterruptedTerm => FailureKind::Interrupted,
            K::LaunchFailed | K::RankFailed => FailureKind::Internal,
        }
    }
}

/// A rank's own account of its failure (see the module documentation).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureRecord {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    /// RFC 3339.
    pub time: String,
    pub kind: FailureKind,
    /// One line: the error, or a panic's message (its payload's first line).
    pub message: String,
    /// Where a panic happened (`file:line:column`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The code the rank exits with, when it knows (a panic hook does not: the panic may be
    /// caught).
    #[serde(default)]
    pub exit_code: Option<i32>,
}

impl FailureRecord {
    /// The record as one log line (no trailing newline).
    pub fn write(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_else(|e| {
            // Not reachable for this type; still a parseable record.
            format!(
                r#"{{"rank":{},"host":"?","pid":{},"time":"?","kind":"internal","message":"record not serializable: {}"}}"#,
                self.rank,
                self.pid,
                e.to_string().replace(['"', '\\'], "'")
            )
        });
        format!("{FAILURE_RECORD_PREFIX}{json}")
    }

    /// Reads a record from a log line; it may follow other output on the same line (a write
    /// without a newline before it).
    pub fn parse(line: &str) -> Option<FailureRecord> {
        let at = line.find(FAILURE_RECORD_PREFIX)?;
        serde_json::from_str(&line[at + FAILURE_RECORD_PREFIX.len()..]).ok()
    }
}

/// The message of a panic for its record: the first line of the payload, with tch's
/// `called \`Result::unwrap()\` on an \`Err\` value: Torch("...")` wrapper taken off, so that
/// what remains is libtorch's own first line ("Output size is too small", ...).
pub fn panic_message(payload: &str) -> String {
    const UNWRAP: &str = "called `Result::unwrap()` on an `Err` value: ";
    let p = payload.trim_start();
    let p = p.strip_prefix(UNWRAP).unwrap_or(p);
    // tch's error, Debug-formatted: Torch("<message with \n escaped>") or Shape/Kind(...).
    if let Some(inner) = p
        .strip_prefix("Torch(\"")
        .or_else(|| p.strip_prefix("Torch { msg: \""))
    {
        let mut out = String::new();
        let mut chars = inner.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') | None => break,
                    Some('t') => out.push('\t'),
                    Some(other) => out.push(other),
                },
                c => out.push(c),
            }
        }
        return out.trim().to_string();
    }
    p.lines().next().unwrap_or("").trim().to_string()
}

/// The prefix a rank puts before each line on its console (`<host>:<rank> `).
pub fn console_prefix(host: &str, rank: usize) -> String {
    format!("{host}:{rank} ")
}

/// Splits a console line into host, rank and the line (the inverse of `console_prefix`).
pub fn split_console_line(line: &str) -> Option<(&str, usize, &str)> {
    let (who, rest) = line.split_once(' ')?;
    let (host, rank) = who.rsplit_once(':')?;
    Some((host, rank.parse().ok()?, rest))
}

/// What a rank's driver log says, read with the types above.
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    /// `None` when the header is missing or incomplete (a rank that died while opening it).
    pub header: Option<Header>,
    /// The last `RankExit` line.
    pub exit: Option<RankExit>,
    pub summary: Option<RankSummary>,
    pub training_start: Option<TrainingStart>,
    /// Time and message of the first ERROR event.
    pub first_error: Option<(String, String)>,
    /// Every failure record, in order.
    pub failures: Vec<FailureRecord>,
    /// Body lines before the first failure record (all of them without one); failure records
    /// left out.
    pub before_failure: Vec<String>,
}

impl Parsed {
    /// The root cause: the first record.
    pub fn failure(&self) -> Option<&FailureRecord> {
        self.failures.first()
    }

    /// The exit code the rank recorded: the last record's with one, else the `RankExit` line.
    pub fn exit_code(&self) -> Option<i32> {
        self.failures
            .iter()
            .rev()
            .find_map(|f| f.exit_code)
            .or(self.exit.map(|e| e.code))
    }
}

/// Reads a whole driver log.
pub fn parse(text: &str) -> Parsed {
    let (header, body) = match Header::parse(text) {
        Ok((h, body)) => (Some(h), body),
        Err(_) => {
            // Lenient: skip whatever header there is.
            let body = text
                .split_once(&format!("\n{HEADER_END}\n"))
                .map(|(_, b)| b)
                .unwrap_or(if text.starts_with(MAGIC) { "" } else { text });
            (None, body)
        }
    };
    let mut p = Parsed {
        header,
        exit: None,
        summary: None,
        training_start: None,
        first_error: None,
        failures: Vec::new(),
        before_failure: Vec::new(),
    };
    for line in body.lines() {
        if let Some(r) = FailureRecord::parse(line) {
            p.failures.push(r);
            continue;
        }
        if p.failures.is_empty() {
            p.before_failure.push(line.to_string());
        }
        let Some(ev) = parse_event(line) else {
            continue;
        };
        if let Some(e) = RankExit::parse(ev.message) {
            p.exit = Some(e);
        } else if let Some(s) = RankSummary::parse(ev.message) {
            p.summary = Some(s);
        } else if p.training_start.is_none() {
            p.training_start = TrainingStart::parse(ev.message);
        }
        if ev.level == Level::Error && p.first_error.is_none() {
            p.first_error = Some((ev.time.to_string(), ev.message.trim().to_string()));
        }
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            host: "node-1".into(),
            rank: 3,
            local_rank: 1,
            world_size: 4,
            pid: 4242,
            device: "cuda:1".into(),
            backend: "nccl".into(),
            started_by: "Mpi".into(),
            tchrun: "0.1.0".into(),
            torch: "2.11.0".into(),
            command: "tchrun-worker train --lr 1e-3".into(),
            started: "2026-11-24T00:00:00.000Z".into(),
        }
    }

    #[test]
    fn header_is_the_documented_text_and_round_trips() {
        let h = header();
        let text = h.write();
        assert!(text.starts_with("tchrun driver log\nhost: node-1\nrank: 3\n"));
        assert!(text.contains("\npid: 4242\n"));
        assert!(text.ends_with("started: 2026-11-24T00:00:00.000Z\n---\n"));
        let full = format!("{text}hello\n");
        let (back, body) = Header::parse(&full).expect("parses");
        assert_eq!(back, h);
        assert_eq!(body, "hello\n");
        assert_eq!(
            Header::parse("tchrun driver log\nhost: a\n"),
            Err(DriverLogError::UnterminatedHeader)
        );
        assert_eq!(Header::parse("hello\n"), Err(DriverLogError::NotADriverLog));
    }

    #[test]
    fn lines_are_the_ones_people_read() {
        let p = Progress {
            epoch: 2,
            epochs: 3,
            iter: 5,
            iters: 9,
            loss: 1.23456,
            lr: 0.05,
            images_per_s: 812.34,
            eta: Duration::from_secs(75),
        };
        assert_eq!(
            p.write(),
            "epoch 2/3 iter 5/9 loss 1.2346 lr 5.000e-2 images/s 812.3 eta 1m 15s"
        );
        let back = Progress::parse(&p.write()).expect("parses");
        assert_eq!((back.epoch, back.iter, back.eta), (2, 5, p.eta));
        let s = TrainingStart {
            arch: "resnet18".into(),
            train_images: 100,
            valid_images: 20,
            classes: 10,
            world_size: 2,
            device: "cpu".into(),
            steps_per_epoch: 3,
            effective_lr: 0.05,
            lr: 0.025,
            lr_factor: "2".into(),
            bucket_cap_mb: 25.0,
        };
        assert!(s.write().contains("effective LR 5e-2 (--lr 2.5e-2 × 2)"));
        let sqrt = TrainingStart {
            lr_factor: "√2".into(),
            effective_lr: 0.025 * 2f64.sqrt(),
            ..s.clone()
        };
        assert!(sqrt.write().contains("(--lr 2.5e-2 × √2)"));
        assert_eq!(TrainingStart::parse(&sqrt.write()), Some(sqrt));
        assert_eq!(TrainingStart::parse(&s.write()), Some(s));
        assert_eq!(
            RankExit::parse("rank exiting with code 5"),
            Some(RankExit { code: 5 })
        );
        let r = RankSummary {
            images: 120.0,
            compute_s: 1.5,
            communication_s: 0.5,
        };
        assert_eq!(
            r.write(),
            "rank summary: images 120, compute 1.50s, communication 0.50s, images/s 60.0"
        );
        assert_eq!(RankSummary::parse(&r.write()), Some(r));
    }

    #[test]
    fn panic_messages_lose_tchs_wrapper_and_libtorchs_backtrace() {
        let payload = r#"called `Result::unwrap()` on an `Err` value: Torch("Given input size: (1024x1x1). Calculated output size: (1024x0x0). Output size is too small\nException raised from ... (most recent call first):\nframe #0: c10::Error")"#;
        assert_eq!(
            panic_message(payload),
            "Given input size: (1024x1x1). Calculated output size: (1024x0x0). Output size is too small"
        );
        assert_eq!(
            panic_message("index out of bounds\nmore"),
            "index out of bounds"
        );
        assert_eq!(
            panic_message(r#"called `Result::unwrap()` on an `Err` value: Torch("say \"hi\"")"#),
            "say \"hi\""
        );
    }

    #[test]
    fn a_log_is_read_with_its_failure_record() {
        let mut text = header().write();
        text.push_str("2026-11-24T00:00:01.000001Z  INFO epoch 1/1 iter 1/3 loss 2.3000 lr 1.000e-3 images/s 10.0 eta 2s\n");
        let rec = FailureRecord {
            rank: 3,
            host: "node-1".into(),
            pid: 4242,
            time: "2026-11-24T00:00:02.000Z".into(),
            kind: FailureKind::Panic,
            message: "Output size is too small".into(),
            location: Some("tensor_generated.rs:6297:10".into()),
            exit_code: None,
        };
        text.push_str(&format!("libtorch without newline{}\n", rec.write()));
        text.push_str("2026-11-24T00:00:02.000002Z ERROR rank 3 panicked: panicked at x.rs:1:1:\n");
        text.push_str("   0: std::backtrace\n");
        let mut last = rec.clone();
        last.kind = FailureKind::Internal;
        last.exit_code = Some(4);
        text.push_str(&format!("{}\n", last.write()));
        text.push_str("2026-11-24T00:00:03.000002Z  INFO rank exiting with code 4\n");
        let p = parse(&text);
        assert_eq!(p.header, Some(header()));
        assert_eq!(p.failure(), Some(&rec));
        assert_eq!(p.exit_code(), Some(4));
        assert_eq!(p.before_failure.len(), 1, "{:?}", p.before_failure);
        assert!(p.before_failure[0].contains("epoch 1/1 iter 1/3"));
        assert_eq!(
            p.first_error.as_ref().map(|e| e.0.as_str()),
            Some("2026-11-24T00:00:02.000002Z")
        );
    }

    #[test]
    fn console_lines_split() {
        assert_eq!(
            split_console_line("node-1:0 epoch 1/2"),
            Some(("node-1", 0, "epoch 1/2"))
        );
        assert_eq!(split_console_line("plain line"), None);
        assert_eq!(console_prefix("h", 2), "h:2 ");
    }

    mod props {
        use super::super::*;
        use proptest::prelude::*;

        fn text() -> impl Strategy<Value = String> {
            // Anything on one value, newlines and backslashes included.
            ".{0,40}"
        }

        fn header() -> impl Strategy<Value = Header> {
            (
                (
                    "[a-z0-9.-]{1,20}",
                    0usize..100_000,
                    0usize..64,
                    1usize..100_000,
                    any::<u32>(),
                ),
                (text(), text(), text(), text(), text(), text(), text()),
            )
                .prop_map(
                    |((host, rank, local_rank, world_size, pid), (d, b, s, t, v, c, st))| Header {
                        host,
                        rank,
                        local_rank,
                        world_size,
                        pid,
                        device: d,
                        backend: b,
                        started_by: s,
                        tchrun: t,
                        torch: v,
                        command: c,
                        started: st,
                    },
                )
        }

        fn kind() -> impl Strategy<Value = FailureKind> {
            prop::sample::select(vec![
                FailureKind::InvalidInput,
                FailureKind::Data,
                FailureKind::Diverged,
                FailureKind::OutOfMemory,
                FailureKind::Cuda,
                FailureKind::Communication,
                FailureKind::Io,
                FailureKind::Interrupted,
                FailureKind::Panic,
                FailureKind::Internal,
            ])
        }

        proptest! {
            #![proptest_config(ProptestConfig { failure_persistence: None, ..ProptestConfig::default() })]

            #[test]
            fn header_round_trips(h in header(), body in text()) {
                let text = format!("{}{body}", h.write());
                let (back, rest) = Header::parse(&text).expect("parses");
                prop_assert_eq!(back, h);
                prop_assert_eq!(rest, body.as_str());
            }

            #[test]
            fn progress_round_trips(
                epoch in 1u32..1000, epochs in 1u32..1000, iter in 1u64..1_000_000,
                iters in 1u64..1_000_000, loss in 0f64..1e6, lr in 1e-12f64..10.0,
                ips in 0f64..1e7, eta in 0u64..10_000_000,
            ) {
                let p = Progress { epoch, epochs, iter, iters, loss, lr, images_per_s: ips,
                                   eta: Duration::from_secs(eta) };
                let line = p.write();
                let back = Progress::parse(&line).expect("parses");
                prop_assert_eq!((back.epoch, back.epochs, back.iter, back.iters, back.eta),
                                (epoch, epochs, iter, iters, p.eta));
                prop_assert_eq!(back.write(), line.clone());
                // On a console, behind its prefix.
                let console = format!("{}{line}", console_prefix("node-7", 0));
                let (host, rank, rest) = split_console_line(&console).expect("splits");
                prop_assert_eq!((host, rank), ("node-7", 0));
                prop_assert!(Progress::parse(rest).is_some());
            }

            #[test]
            fn training_start_round_trips(
                arch in "[a-z0-9_]{1,20}", train in 0usize..10_000_000, valid in 0usize..10_000_000,
                classes in 1usize..100_000, world in 1usize..100_000, cuda in any::<bool>(),
                steps in 0u64..1_000_000_000, lr in 1e-12f64..1e12, mb in 0.001f64..1e4,
            ) {
                let s = TrainingStart { arch, train_images: train, valid_images: valid, classes,
                    world_size: world, device: if cuda { "cuda" } else { "cpu" }.into(),
                    steps_per_epoch: steps, effective_lr: lr * world as f64, lr,
                    lr_factor: world.to_string(), bucket_cap_mb: mb };
                prop_assert_eq!(TrainingStart::parse(&s.write()), Some(s));
            }

            #[test]
            fn rank_summary_and_exit_round_trip(
                images in 0u64..1_000_000_000, c in 0f64..1e7, m in 0f64..1e7, code in any::<i32>(),
            ) {
                let r = RankSummary { images: images as f64, compute_s: c, communication_s: m };
                let back = RankSummary::parse(&r.write()).expect("parses");
                prop_assert_eq!(back.images, images as f64);
                prop_assert_eq!(back.write(), r.write());
                prop_assert_eq!(RankExit::parse(&RankExit { code }.write()), Some(RankExit { code }));
            }

            #[test]
            fn failure_record_round_trips_on_one_line(
                rank in 0usize..100_000, host in text(), pid in any::<u32>(), time in text(),
                kind in kind(), message in ".{0,200}", location in proptest::option::of(text()),
                exit_code in proptest::option::of(any::<i32>()), before in "[^\n]{0,20}",
            ) {
                let r = FailureRecord { rank, host, pid, time, kind, message, location, exit_code };
                let line = format!("{before}{}", r.write());
                prop_assert!(!line.contains('\n'));
                prop_assert_eq!(FailureRecord::parse(&line), Some(r));
            }

            #[test]
            fn any_text_parses_without_panicking(text in "(?s).{0,400}") {
                let p = parse(&text);
                let _ = p.exit_code();
                let _ = panic_message(&text);
                let _ = split_console_line(&text);
            }
        }
    }
}
