//! `status.json`: where a running job is, for `tchrun status` on any machine that sees the log
//! directory. Rank 0 rewrites it (atomically, about once a second, from a thread of its own)
//! with what its trainer publishes (state, epoch and step, speed, ETA, the last checkpoint, the
//! ranks' time split and memory of the last window, the stragglers) and what the ranks'
//! heartbeats say (phase, step, time since their last progress). The launcher writes it before
//! the ranks start (`starting`) and after they ended (`finished`, `failed`, `stopped`, with
//! [`JobEnd`]). One writer at a time: the launcher only while no rank runs.
use super::heartbeat::Phase;
use serde::{Deserialize, Serialize};

/// The version of this format (a reader refuses a newer one in words).
pub const FORMAT_VERSION: u32 = 1;

/// What the job as a whole is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Launched; the ranks are starting (joining, loading the model, the first batch).
    Starting,
    Training,
    Validating,
    Checkpointing,
    /// A stop was asked for (a signal, early stopping, a straggler's exclusion): the ranks end.
    Stopping,
    /// Every rank ended and the model is written.
    Finished,
    /// The job ended in a failure (`failure.json` says which rank and why).
    Failed,
    /// The job was stopped on request, with a checkpoint to resume from.
    Stopped,
}

impl JobState {
    /// The job will not change any more.
    pub fn is_end(self) -> bool {
        matches!(
            self,
            JobState::Finished | JobState::Failed | JobState::Stopped
        )
    }

    pub fn label(self) -> &'static str {
        match self {
            JobState::Starting => "starting",
            JobState::Training => "training",
            JobState::Validating => "validating",
            JobState::Checkpointing => "checkpointing",
            JobState::Stopping => "stopping",
            JobState::Finished => "finished",
            JobState::Failed => "failed",
            JobState::Stopped => "stopped",
        }
    }
}

/// The job's `status.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobStatus {
    pub format_version: u32,
    pub state: JobState,
    /// The attempt of a `tchrun train --max-restarts` job (1 for the first).
    pub attempt: u32,
    /// When this was written (RFC 3339 UTC, the writer's clock).
    pub updated: String,
    /// When the attempt's ranks started training (RFC 3339 UTC).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    pub world_size: usize,
    /// The epoch in progress (1-based; 0 before the first) and the run's epochs.
    pub epoch: u32,
    pub epochs: u32,
    /// Optimizer steps done (a resumed run counts the steps before the resume), of
    /// `total_steps`; `epoch_step` of `steps_per_epoch` in the epoch in progress.
    pub step: u64,
    pub total_steps: u64,
    pub epoch_step: u64,
    pub steps_per_epoch: u64,
    /// Training images per second over all ranks, over the last window of steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images_per_s: Option<f64>,
    /// Seconds left to the end of the epoch and of the job (training steps at the pace of this
    /// attempt; validation not included).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_epoch_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eta_job_s: Option<f64>,
    /// The training loss (reduced over the ranks, averaged over the last window) and the LR of
    /// the last step (the scheduled LR, as the progress line shows it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// When rank 0's status thread last saw `step` advance (RFC 3339 UTC, rank 0's clock; at
    /// the start of the attempt before its first step).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_step: Option<String>,
    /// The newest complete checkpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_checkpoint: Option<CheckpointMark>,
    /// The window of steps the ranks' shares cover.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowMark>,
    /// One row a rank, by rank.
    #[serde(default)]
    pub ranks: Vec<RankStatus>,
    /// The ranks slower than the others now (see `tchrun_worker::straggler`).
    #[serde(default)]
    pub stragglers: Vec<Straggler>,
    /// `--straggler-action exclude`: the hosts whose ranks were stragglers for a whole epoch,
    /// set by rank 0 as the ranks stop; the launcher leaves them out of the next attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exclude_hosts: Vec<String>,
    /// How the job ended (set by the launcher, or by rank 0 for a job started without it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<JobEnd>,
}

/// A checkpoint: the step it holds and when it was written.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMark {
    pub step: u64,
    /// RFC 3339 UTC.
    pub time: String,
}

/// The steps a window of statistics covers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WindowMark {
    /// The step the window ended at, its steps and its wall time.
    pub end_step: u64,
    pub steps: u64,
    pub seconds: f64,
}

/// One rank.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankStatus {
    pub rank: usize,
    pub host: String,
    /// `cpu`, `cuda:1`.
    pub device: String,
    /// From its heartbeat (`None` when it has not beaten yet or the file is not visible from
    /// rank 0's host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    pub step: u64,
    /// Seconds since its step, collective or validation batch last advanced (rank 0's clock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_s: Option<f64>,
    /// Shares of the last window's wall time: waiting for the loader, compute, the
    /// communication backward did not hide (which holds waiting for a slower rank).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shares: Option<Shares>,
    /// Resident memory of the process (bytes), and on CUDA the device memory its tensors hold.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rss_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_bytes: Option<u64>,
}

/// Shares of a window's wall time, each in [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Shares {
    pub data_wait: f64,
    pub compute: f64,
    pub comm: f64,
}

/// What is slow on a straggler.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SlowKind {
    /// Its forward/backward/optimizer take longer than the others'.
    Compute,
    /// It waits for its loader while the others do not.
    DataWait,
}

/// A rank slower than the others by a clear margin, window after window.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Straggler {
    pub rank: usize,
    pub host: String,
    pub device: String,
    pub kind: SlowKind,
    /// Compute: its compute time per step over the median of the others'. Data wait: its
    /// share of the wall time (`value`) against the others' median share (`median`).
    pub factor: f64,
    pub value: f64,
    pub median: f64,
    /// The steps it has been slow for (whole windows), and the step it started at.
    pub steps: u64,
    pub since_step: u64,
}

impl Straggler {
    /// `straggler: rank 5 (node3, cuda:1) compute 1.6x the median for 400 steps`, or
    /// `straggler: rank 5 (node3, cpu) data wait 45% vs 3%: its loader is slow (disk or CPU on
    /// node3) for 400 steps`.
    pub fn line(&self) -> String {
        let who = format!("rank {} ({}, {})", self.rank, self.host, self.device);
        match self.kind {
            SlowKind::Compute => format!(
                "straggler: {who} compute {:.1}x the median of the other ranks for {} steps \
                 (since step {})",
                self.factor, self.steps, self.since_step
            ),
            SlowKind::DataWait => format!(
                "straggler: {who} data wait {:.0}% vs {:.0}% for {} steps (since step {}): its \
                 loader is slow (disk or CPU on {})",
                100.0 * self.value,
                100.0 * self.median,
                self.steps,
                self.since_step,
                self.host
            ),
        }
    }
}

/// How the job ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobEnd {
    /// The exit code `tchrun` ended with (documented in `tchrun::exit`).
    pub code: i32,
    /// One line: what happened (the failure summary's first line, "model written to ...").
    pub summary: String,
    /// A failure's class, one word (`Cause`'s `class` in `failure.json`, as `oom_killer`;
    /// `hang`; else the exit code's kind, as `rank_failed`): see [`JobEnd::cause_class`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
}

impl JobEnd {
    /// The end's cause in one word: the one recorded, else the exit code's kind
    /// (`invalid_input`, `launch_failed`, `rank_failed`, `diverged`, `interrupted`); `None`
    /// for a job that succeeded.
    pub fn cause_class(&self) -> Option<String> {
        use crate::exit::code;
        if let Some(c) = &self.cause {
            return Some(c.clone());
        }
        let kind = match self.code {
            code::OK => return None,
            code::INVALID_INPUT => "invalid_input",
            code::INTERNAL => "internal",
            code::LAUNCH_FAILED => "launch_failed",
            code::DIVERGED => "diverged",
            code::INTERRUPTED_INT | code::INTERRUPTED_TERM => "interrupted",
            _ => "rank_failed",
        };
        Some(kind.to_string())
    }
}

impl JobStatus {
    /// A job just launched: nothing known but its attempt and size.
    pub fn starting(attempt: u32, world_size: usize) -> JobStatus {
        JobStatus {
            format_version: FORMAT_VERSION,
            state: JobState::Starting,
            attempt,
            updated: crate::files::timestamp_now(),
            started: None,
            world_size,
            epoch: 0,
            epochs: 0,
            step: 0,
            total_steps: 0,
            epoch_step: 0,
            steps_per_epoch: 0,
            images_per_s: None,
            eta_epoch_s: None,
            eta_job_s: None,
            loss: None,
            lr: None,
            last_step: None,
            last_checkpoint: None,
            window: None,
            ranks: Vec::new(),
            stragglers: Vec::new(),
            exclude_hosts: Vec::new(),
            end: None,
        }
    }

    /// The status after the job ended: the last one (or a new one), its state and end.
    pub fn ended(last: Option<JobStatus>, state: JobState, end: JobEnd) -> JobStatus {
        let mut s = last.unwrap_or_else(|| JobStatus::starting(1, 0));
        s.state = state;
        s.end = Some(end);
        s.updated = crate::files::timestamp_now();
        s.eta_epoch_s = None;
        s.eta_job_s = None;
        for r in &mut s.ranks {
            // Nothing runs any more: no time since progress; a finished job's ranks are done.
            r.idle_s = None;
            if state == JobState::Finished {
                r.phase = Some(Phase::Done);
            }
        }
        s
    }
}

impl super::Record for JobStatus {
    const FILE: &'static str = crate::files::STATUS_JSON;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_record::Record;

    #[test]
    fn a_status_reads_back_as_written_and_an_old_minimal_one_parses() {
        let t = tempfile::tempdir().unwrap();
        let mut s = JobStatus::starting(2, 4);
        s.ranks.push(RankStatus {
            rank: 0,
            host: "node1".into(),
            device: "cpu".into(),
            phase: Some(Phase::Forward),
            step: 10,
            idle_s: Some(0.2),
            shares: Some(Shares {
                data_wait: 0.1,
                compute: 0.8,
                comm: 0.1,
            }),
            rss_bytes: Some(1 << 30),
            gpu_bytes: None,
        });
        s.write(t.path()).unwrap();
        assert_eq!(JobStatus::read(t.path()).unwrap(), Some(s));
        let minimal = r#"{"format_version":1,"state":"training","attempt":1,"updated":"t",
            "world_size":2,"epoch":1,"epochs":2,"step":3,"total_steps":10,"epoch_step":3,
            "steps_per_epoch":5}"#;
        let s: JobStatus = serde_json::from_str(minimal).unwrap();
        assert_eq!(
            (s.state, s.ranks.len(), s.end),
            (JobState::Training, 0, None)
        );
    }

    #[test]
    fn straggler_lines_say_what_is_slow_and_where() {
        let mut s = Straggler {
            rank: 5,
            host: "node3".into(),
            device: "cuda:1".into(),
            kind: SlowKind::Compute,
            factor: 1.62,
            value: 0.2,
            median: 0.12,
            steps: 400,
            since_step: 120,
        };
        assert_eq!(
            s.line(),
            "straggler: rank 5 (node3, cuda:1) compute 1.6x the median of the other ranks for \
             400 steps (since step 120)"
        );
        s.kind = SlowKind::DataWait;
        s.value = 0.45;
        s.median = 0.03;
        assert_eq!(
            s.line(),
            "straggler: rank 5 (node3, cuda:1) data wait 45% vs 3% for 400 steps (since step \
             120): its loader is slow (disk or CPU on node3)"
        );
    }
}
