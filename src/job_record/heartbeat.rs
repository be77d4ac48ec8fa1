//! `heartbeat-<rank>.json`: what a rank is doing, rewritten about once a second by a thread of
//! its own (`tchrun-worker`'s `heartbeat.rs` is the one writer), read by the launcher's hang
//! watch (the one reader); and `HangVerdict`, the watch's finding kept in `failure.json`.
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
    Done,
}

impl Phase {
    const ALL: [Phase; 14] = [
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

/// A heartbeat file's size: every record padded to it, so that each is written over the last.
const RECORD_BYTES: usize = 1024;

/// `<log_dir>/heartbeat-<rank>.json`.
pub fn path(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("heartbeat-{rank}.json"))
}

/// The rank of a heartbeat file's name.
pub fn rank_of(file_name: &str) -> Option<usize> {
    file_name
        .strip_prefix("heartbeat-")?
        .strip_suffix(".json")?
        .parse()
        .ok()
}

/// `HH:MM:SS` of an RFC 3339 time (the whole text if it is not one).
pub fn clock(time: &str) -> &str {
    time.get(11..19).unwrap_or(time)
}

impl Heartbeat {
    /// Rewrites the rank's file in place: the record padded with spaces to `RECORD_BYTES`,
    /// written at offset 0 and the file closed (what NFS needs to show it to another host).
    /// In place, a full disk does not stop the beats (no new block is needed), and a slow one
    /// is not waited for (no fsync: a beat lost to a crash of the host is worth nothing).
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        use std::os::unix::fs::{FileExt, OpenOptionsExt};
        let mut text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        if text.len() < RECORD_BYTES {
            text.resize(RECORD_BYTES, b' ');
        }
        let f = std::fs::OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(false)
            .mode(0o640)
            .open(path(log_dir, self.rank))?;
        f.write_all_at(&text, 0)?;
        if f.metadata()?.len() > text.len() as u64 {
            f.set_len(text.len() as u64)?;
        }
        Ok(())
    }

    /// Every rank's heartbeat in `log_dir`, by rank; unreadable files are left out.
    pub fn read_all(log_dir: &Path) -> Vec<Heartbeat> {
        let Ok(rd) = std::fs::read_dir(log_dir) else {
            return Vec::new();
        };
        let mut beats: Vec<Heartbeat> = rd
            .flatten()
            .filter(|e| rank_of(&e.file_name().to_string_lossy()).is_some())
            .filter_map(|e| std::fs::read(e.path()).ok())
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
            Phase::StartUp | Phase::Done => self.phase.label().to_string(),
            p => format!("{} of step {}", p.label(), self.step),
        }
    }
}

/// How the watch found the job hung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangKind {
    /// A rank stopped beating while others wait in a collective.
    StoppedBeating,
    /// No rank's step or collective advanced for the allowed time.
    NoProgress,
}

/// One rank as the watch last saw it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HangRank {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    pub phase: Phase,
    pub step: u64,
    pub seq: u64,
    pub since: String,
    /// Its last beat (the rank's clock).
    pub last_beat: String,
    /// Whether it still beat when the job was stopped.
    pub beating: bool,
}

impl HangRank {
    pub fn of(b: &Heartbeat, beating: bool) -> HangRank {
        HangRank {
            rank: b.rank,
            host: b.host.clone(),
            pid: b.pid,
            phase: b.phase,
            step: b.step,
            seq: b.seq,
            since: b.since.clone(),
            last_beat: b.time.clone(),
            beating,
        }
    }
}

/// The hang watch's finding: the ranks at fault and those that wait for them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HangVerdict {
    pub kind: HangKind,
    /// The ranks at fault: stopped beating, or busy outside a collective the others wait in.
    pub culprits: Vec<HangRank>,
    /// The ranks waiting in a collective.
    pub waiting: Vec<HangRank>,
    /// The collective the waiting ranks are in (the newest sequence number among them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq: Option<u64>,
    /// The silence allowed (seconds) and how long it lasted.
    pub allowed_s: u64,
    pub silent_s: u64,
}

impl HangVerdict {
    /// The one line: "hang: rank 0 (vm) waits in ... since 14:02:11; rank 1 (vm) stopped
    /// beating at 14:02:09 (stopped or frozen), last in forward of step 301".
    pub fn line(&self, beats: &[Heartbeat]) -> String {
        let doing = |r: &HangRank| {
            beats
                .iter()
                .find(|b| b.rank == r.rank)
                .map(Heartbeat::doing)
                .unwrap_or_else(|| r.phase.label().to_string())
        };
        let mut parts = Vec::new();
        for r in &self.waiting {
            parts.push(format!(
                "rank {} ({}) waits in {} since {}",
                r.rank,
                r.host,
                doing(r),
                clock(&r.since)
            ));
        }
        for r in &self.culprits {
            parts.push(if r.beating {
                format!(
                    "rank {} ({}) is in {} since {} (still beating: its main thread is stuck)",
                    r.rank,
                    r.host,
                    doing(r),
                    clock(&r.since)
                )
            } else {
                format!(
                    "rank {} ({}, pid {}) stopped beating at {} (stopped or frozen), last in {}",
                    r.rank,
                    r.host,
                    r.pid,
                    clock(&r.last_beat),
                    doing(r)
                )
            });
        }
        let why = match self.kind {
            HangKind::StoppedBeating => String::new(),
            HangKind::NoProgress => format!(
                " (no rank advanced for {} s; allowed {} s)",
                self.silent_s, self.allowed_s
            ),
        };
        format!("hang: {}{why}", parts.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(rank: usize, phase: Phase) -> Heartbeat {
        Heartbeat {
            rank,
            host: "vm".into(),
            pid: 42,
            phase,
            step: 300,
            seq: 1204,
            buckets: Some(3),
            since: "2026-11-25T14:02:11.000Z".into(),
            time: "2026-11-25T14:02:09.500Z".into(),
            beat: 7,
        }
    }

    #[test]
    fn heartbeats_read_back_and_the_verdict_names_the_culprit() {
        let t = tempfile::tempdir().unwrap();
        for p in Phase::ALL {
            assert_eq!(Phase::from_code(p.code()), p);
        }
        let (b0, b1) = (beat(0, Phase::GradientAllReduce), beat(1, Phase::Forward));
        b1.write(t.path()).unwrap();
        b0.write(t.path()).unwrap();
        std::fs::write(t.path().join("heartbeat-2.json"), "{").unwrap();
        // Written over in place: a shorter record leaves nothing of the longer one.
        let mut long = b1.clone();
        long.host = "h".repeat(2000);
        long.write(t.path()).unwrap();
        b1.write(t.path()).unwrap();
        let beats = Heartbeat::read_all(t.path());
        assert_eq!(beats, vec![b0.clone(), b1.clone()]);
        let v = HangVerdict {
            kind: HangKind::StoppedBeating,
            culprits: vec![HangRank::of(&b1, false)],
            waiting: vec![HangRank::of(&b0, true)],
            seq: Some(1204),
            allowed_s: 10,
            silent_s: 11,
        };
        assert_eq!(
            v.line(&beats),
            "hang: rank 0 (vm) waits in gradient all-reduce #1204 (3 bucket(s) of step 300) \
             since 14:02:11; rank 1 (vm, pid 42) stopped beating at 14:02:09 (stopped or \
             frozen), last in forward of step 300"
        );
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<HangVerdict>(&text).unwrap(), v);
    }
}
