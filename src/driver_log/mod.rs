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
//!
//! Files: `header.rs` the header, `records.rs` the body's lines and typed messages, `failure.rs`
//! the failure record; here the whole log read back ([`parse`]) and the console prefix.
mod failure;
mod header;
mod records;
#[cfg(test)]
mod tests;

pub use failure::{panic_message, FailureKind, FailureRecord, FAILURE_RECORD_PREFIX};
pub use header::{DriverLogError, Header, HEADER_END, MAGIC};
pub use records::{parse_event, Event, Level, Progress, RankExit, RankSummary, TrainingStart};

/// The line a rank logs when it knows how rank 0's address was chosen (issue 33).
pub const BOOTSTRAP_PREFIX: &str = "bootstrap: ";

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
    /// How rank 0's address was chosen: the rank's `bootstrap: ...` line, without the prefix.
    pub bootstrap: Option<String>,
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
        bootstrap: None,
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
        } else if let Some(b) = ev.message.strip_prefix(BOOTSTRAP_PREFIX) {
            p.bootstrap = Some(b.trim().to_string());
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
