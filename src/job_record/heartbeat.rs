//! `heartbeat-<rank>.json`: what a rank is doing, rewritten about once a second by a thread of
//! its own (`tchrun-worker`'s `heartbeat.rs` is the one writer), read by the launcher's hang
//! watch (the one reader), which judges them in `hang.rs`.
//! A rank whose main thread is stuck keeps beating with an old `since`; a rank that is stopped
//! (SIGSTOP), frozen or dead stops beating.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What a rank is doing. Stored as one byte in the worker's atomics (`code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    StartUp,
    Loading,
    Forward,
    Backward,
    GradientAllReduce,
    Optimizer,
    Validation,
    Checkpoint,
    FinalWrite,
    AllReduce,
    Broadcast,
    AllGather,
    Barrier,
    /// The rank's work is done and it succeeded: it leaves the process group and MPI.
    Leaving,
    /// The rank has left the group and sends its last MLflow calls (bounded by
    /// `mlflow::MAX_DRAIN`).
    Draining,
    /// The process is about to exit 0: nothing is left to do.
    Done,
}

impl Phase {
    pub(super) const ALL: [Phase; 16] = [
        Phase::StartUp,
        Phase::Loading,
        Phase::Forward,
        Phase::Backward,
        Phase::GradientAllReduce,
        Phase::Optimizer,
        Phase::Validation,
        Phase::Checkpoint,
        Phase::FinalWrite,
        Phase::AllReduce,
        Phase::Broadcast,
        Phase::AllGather,
        Phase::Barrier,
        Phase::Leaving,
        Phase::Draining,
        Phase::Done,
    ];

    pub fn code(self) -> u8 {
        Phase::ALL.iter().position(|p| *p == self).unwrap_or(0) as u8
    }

    pub fn from_code(code: u8) -> Phase {
        Phase::ALL
            .get(code as usize)
            .copied()
            .unwrap_or(Phase::StartUp)
    }

    /// In words, for the verdict.
    pub fn label(self) -> &'static str {
        match self {
            Phase::StartUp => "start-up",
            Phase::Loading => "the data wait",
            Phase::Forward => "forward",
            Phase::Backward => "backward",
            Phase::GradientAllReduce => "gradient all-reduce",
            Phase::Optimizer => "the optimizer step",
            Phase::Validation => "validation",
            Phase::Checkpoint => "checkpoint write",
            Phase::FinalWrite => "the final write",
            Phase::AllReduce => "all-reduce",
            Phase::Broadcast => "broadcast",
            Phase::AllGather => "all-gather",
            Phase::Barrier => "barrier",
            Phase::Leaving => "leaving the process group and MPI",
            Phase::Draining => "sending its last MLflow calls",
            Phase::Done => "done",
        }
    }

    /// A collective: the rank waits for the others.
    pub fn is_collective(self) -> bool {
        matches!(
            self,
            Phase::GradientAllReduce
                | Phase::AllReduce
                | Phase::Broadcast
                | Phase::AllGather
                | Phase::Barrier
        )
    }

    /// The rank finished its work successfully (leaving, draining or done): it is no
    /// culprit of a hang, and only the time it takes to leave is watched.
    pub fn finished_work(self) -> bool {
        matches!(self, Phase::Leaving | Phase::Draining | Phase::Done)
    }

    /// A phase that may legitimately last much longer than a step (its own allowance).
    pub fn is_long(self) -> bool {
        matches!(
            self,
            Phase::StartUp | Phase::Validation | Phase::Checkpoint | Phase::FinalWrite
        )
    }
}

/// One rank's heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Heartbeat {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    pub phase: Phase,
    /// Optimizer steps done (this run's count, resumed steps included).
    pub step: u64,
    /// Collectives this rank entered (the gradient all-reduce of a step counts its buckets).
    pub seq: u64,
    /// Work done that is neither a step nor a collective (validation batches): progress too.
    #[serde(default)]
    pub progress: u64,
    /// The gradient buckets of the last reduction (known after the first step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buckets: Option<u64>,
    /// When the phase began (RFC 3339 UTC, the rank's clock).
    pub since: String,
    /// When this beat was written (RFC 3339 UTC, the rank's clock).
    pub time: String,
    /// Counts the beats: the reader notices a stopped rank by this not changing (its own clock,
    /// not the rank's, decides how long).
    pub beat: u64,
}

/// `<log_dir>/heartbeat-<rank>.json`.
pub fn path(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("heartbeat-{rank}.json"))
}

/// The rank of a heartbeat file's name.
pub fn rank_of(file_name: &str) -> Option<usize> {
    super::per_rank::rank_of_file(file_name, "heartbeat-")
}

/// `HH:MM:SS` of an RFC 3339 time (the whole text if it is not one).
pub fn clock(time: &str) -> &str {
    time.get(11..19).unwrap_or(time)
}

impl Heartbeat {
    /// Rewrites the rank's file in place (`super::per_rank::write_in_place`: padded, at offset 0,
    /// closed; a full disk does not stop the beats).
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        super::per_rank::write_in_place(&path(log_dir, self.rank), self)
    }

    /// Every rank's heartbeat in `log_dir`, by rank; unreadable files are left out.
    pub fn read_all(log_dir: &Path) -> Vec<Heartbeat> {
        let Ok(rd) = std::fs::read_dir(log_dir) else {
            return Vec::new();
        };
        let mut beats: Vec<Heartbeat> = rd
            .flatten()
            .filter(|e| rank_of(&e.file_name().to_string_lossy()).is_some())
            .filter_map(|e| super::per_rank::read_small(&e.path()))
            .filter_map(|b| serde_json::from_slice(&b).ok())
            .collect();
        beats.sort_by_key(|b| b.rank);
        beats
    }

    /// "gradient all-reduce #1204 (3 bucket(s) of step 300)", "forward of step 300": the step
    /// in progress, 0-based (the steps done), as the worker's own messages count.
    pub fn doing(&self) -> String {
        match self.phase {
            Phase::GradientAllReduce => format!(
                "gradient all-reduce #{} ({}of step {})",
                self.seq,
                self.buckets
                    .map(|b| format!("{b} bucket(s) "))
                    .unwrap_or_default(),
                self.step
            ),
            p if p.is_collective() => {
                format!("{} #{} (at step {})", p.label(), self.seq, self.step)
            }
            Phase::StartUp | Phase::Leaving | Phase::Draining | Phase::Done => {
                self.phase.label().to_string()
            }
            p => format!("{} of step {}", p.label(), self.step),
        }
    }
}
