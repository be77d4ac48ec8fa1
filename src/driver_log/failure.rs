//! The failure record (`tchrun failure record: {json}`): a rank's own account of its failure,
//! its kind, and a panic's message as the record holds it.
use serde::{Deserialize, Serialize};

/// What starts a failure record line (the JSON body follows).
pub const FAILURE_RECORD_PREFIX: &str = "tchrun failure record: ";

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
    /// `--straggler-action exclude`: the ranks stopped together at an epoch's end so that the
    /// next attempt runs without a host that was slow for the whole epoch.
    Straggler,
    /// A Rust panic; inside tch this is usually a libtorch exception (the message says which).
    Panic,
    /// Anything else.
    Internal,
}

impl FailureKind {
    /// Every kind, in declaration order (reading a classification's words back).
    pub const ALL: [FailureKind; 11] = [
        FailureKind::InvalidInput,
        FailureKind::Data,
        FailureKind::Diverged,
        FailureKind::OutOfMemory,
        FailureKind::Cuda,
        FailureKind::Communication,
        FailureKind::Io,
        FailureKind::Interrupted,
        FailureKind::Straggler,
        FailureKind::Panic,
        FailureKind::Internal,
    ];

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
            FailureKind::Straggler => {
                "stopped to leave out a straggler (--straggler-action exclude)"
            }
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
