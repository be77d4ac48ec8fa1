//! `heartbeat-<rank>.json`: what a rank is doing, rewritten about once a second by a thread of
//! its own (`tchrun-worker`'s `heartbeat.rs` is the one writer), read by the launcher's hang
//! watch (the one reader); and `HangVerdict`, the watch's finding kept in `failure.json`.
//! A rank whose main thread is stuck keeps beating with an old `since`; a rank that is stopped
//! (SIGSTOP), frozen or dead stops beating.
use super::stacks::{CaptureSummary, LoaderWork, StackGroup, TraceEntry};
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
    const ALL: [Phase; 16] = [
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
    super::rank_of_file(file_name, "heartbeat-")
}

/// `HH:MM:SS` of an RFC 3339 time (the whole text if it is not one).
pub fn clock(time: &str) -> &str {
    time.get(11..19).unwrap_or(time)
}

impl Heartbeat {
    /// Rewrites the rank's file in place (`super::write_in_place`: padded, at offset 0,
    /// closed; a full disk does not stop the beats).
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        super::write_in_place(&path(log_dir, self.rank), self)
    }

    /// Every rank's heartbeat in `log_dir`, by rank; unreadable files are left out.
    pub fn read_all(log_dir: &Path) -> Vec<Heartbeat> {
        let Ok(rd) = std::fs::read_dir(log_dir) else {
            return Vec::new();
        };
        let mut beats: Vec<Heartbeat> = rd
            .flatten()
            .filter(|e| rank_of(&e.file_name().to_string_lossy()).is_some())
            .filter_map(|e| super::read_small(&e.path()))
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

/// How the watch found the job hung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HangKind {
    /// A rank stopped beating while others wait in a collective.
    StoppedBeating,
    /// No rank's step or collective advanced for the allowed time.
    NoProgress,
    /// Every rank finished its work, but some did not leave within the time allowed: the
    /// job succeeded; those ranks were ended (the culprits).
    Lingered,
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
    /// Its process state when its stacks were taken (R, S, D, T), if they were.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// The collective it waits in, from its trace (bucket, bytes, since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waits_in: Option<TraceEntry>,
    /// Its loader threads' files in progress (a rank in the data wait).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub loaders: Vec<LoaderWork>,
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
            state: None,
            waits_in: None,
            loaders: Vec::new(),
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
    /// The ranks' main-thread stacks taken before the job was stopped, identical ones once
    /// (the culprits' first); every thread's are in `stacks-<rank>.json`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stacks: Vec<StackGroup>,
    /// How the capture went (which ranks answered, how long it took).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capture: Option<CaptureSummary>,
}

impl HangVerdict {
    /// The one line: "hang: rank 0 (vm) waits in gradient all-reduce #1204 (bucket 3, 25.0
    /// MiB, step 300) since 14:02:11; rank 1 (vm, pid 42) never entered it: stopped (state T),
    /// last in forward of step 300 at 14:02:09".
    pub fn line(&self, beats: &[Heartbeat]) -> String {
        let doing = |r: &HangRank| {
            if let Some(e) = &r.waits_in {
                return e.describe();
            }
            beats
                .iter()
                .find(|b| b.rank == r.rank)
                .map(Heartbeat::doing)
                .unwrap_or_else(|| r.phase.label().to_string())
        };
        let mut parts = Vec::new();
        // Waiting ranks in the same collective: once, with their list, since the first of them
        // entered it (they enter it within moments of each other, often across a second's edge).
        let mut groups: Vec<(String, String, Vec<&HangRank>)> = Vec::new();
        for r in &self.waiting {
            let what = doing(r);
            match groups.iter_mut().find(|g| g.0 == what) {
                Some(g) => g.2.push(r),
                None => groups.push((what, String::new(), vec![r])),
            }
        }
        for g in &mut groups {
            if let Some(first) = g.2.iter().map(|r| r.since.as_str()).min() {
                g.1 = clock(first).to_string();
            }
        }
        for (what, since, ranks) in &groups {
            let hosts = unique(ranks.iter().map(|r| r.host.as_str()));
            parts.push(if ranks.len() == 1 {
                format!(
                    "rank {} ({hosts}) waits in {what} since {since}",
                    ranks[0].rank
                )
            } else {
                let list: Vec<usize> = ranks.iter().map(|r| r.rank).collect();
                format!(
                    "ranks {} ({hosts}) wait in {what} since {since}",
                    super::stacks::rank_list(&list)
                )
            });
        }
        for r in &self.culprits {
            parts.push(self.culprit_words(r, &doing(r)));
        }
        let why = match self.kind {
            HangKind::StoppedBeating => String::new(),
            HangKind::NoProgress => format!(
                " (no rank advanced for {} s; allowed {} s)",
                self.silent_s, self.allowed_s
            ),
            HangKind::Lingered => {
                let who: Vec<String> = self
                    .culprits
                    .iter()
                    .map(|r| {
                        format!(
                            "rank {} ({}, pid {}) was {} since {}",
                            r.rank,
                            r.host,
                            r.pid,
                            doing(r),
                            clock(&r.since)
                        )
                    })
                    .collect();
                return format!(
                    "every rank finished its work, but not every rank left within {} s \
                     (allowed {} s): {}; tchrun ended it and the job succeeded",
                    self.silent_s,
                    self.allowed_s,
                    who.join("; ")
                );
            }
        };
        format!("hang: {}{why}", parts.join("; "))
    }

    /// "rank 1 (vm, pid 42) never entered it: it is in the data wait since 14:02:11; loader
    /// thread data-loader-0 decoding /data/x.png since 14:02:10".
    fn culprit_words(&self, r: &HangRank, doing: &str) -> String {
        let who = format!("rank {} ({}, pid {})", r.rank, r.host, r.pid);
        let behind = self.seq.is_some_and(|seq| r.seq < seq);
        let mut s = if r.beating {
            // A rank that still beats is where its beat says (at most a second old).
            let entered = if behind { " never entered it: it" } else { "" };
            format!("{who}{entered} is in {doing} since {}", clock(&r.since))
        } else {
            let how = match r.state.as_deref() {
                Some("T") | Some("t") => "is stopped (state T: SIGSTOP or a debugger)".to_string(),
                Some("D") => "is stuck in the kernel (state D)".to_string(),
                Some("gone") => "is gone".to_string(),
                Some(st) => format!("stopped beating (state {st})"),
                None => "stopped beating (stopped or frozen)".to_string(),
            };
            // Its last beat may be up to a second older than where it stopped.
            let entered = if behind {
                "it had not entered it: it was in"
            } else {
                "it was in"
            };
            let mut s = format!(
                "{who} {how}; at its last beat at {} {entered} {doing}",
                clock(&r.last_beat)
            );
            s.push_str(&self.since_last_beat(r));
            s
        };
        if r.beating && !r.beating_main_thread_ok() {
            s.push_str(" (still beating: its main thread is stuck)");
        }
        for l in &r.loaders {
            s.push_str(&format!(
                "; loader thread {} decoding {} since {}",
                l.thread,
                l.file.display(),
                clock(&l.since)
            ));
        }
        s
    }
}

impl HangVerdict {
    /// Where a rank that stopped beating must be since its last beat, from the collective the
    /// others wait in: every collective before it needed this rank too, so a last beat several
    /// collectives (steps) back is only late (a rank beats at most about once a second).
    /// Empty when the beat is not behind that.
    fn since_last_beat(&self, r: &HangRank) -> String {
        let Some(seq) = self.seq.filter(|&s| r.seq + 1 < s) else {
            return String::new();
        };
        let step = self
            .waiting
            .iter()
            .filter(|w| w.seq == seq)
            .map(|w| w.step)
            .max();
        let step = step.map(|s| format!(" (step {s})")).unwrap_or_default();
        format!(
            "; since then it joined every collective up to #{}, so it stopped between #{} and \
             #{seq}{step}",
            seq - 1,
            seq - 1
        )
    }
}

impl HangRank {
    /// A rank in the data wait is not stuck itself (its loader is); any other that beats is.
    fn beating_main_thread_ok(&self) -> bool {
        self.phase == Phase::Loading
    }
}

fn unique<'a>(items: impl Iterator<Item = &'a str>) -> String {
    let mut v: Vec<&str> = Vec::new();
    for i in items {
        if !v.contains(&i) {
            v.push(i);
        }
    }
    v.join(", ")
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
            progress: 0,
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
            stacks: Vec::new(),
            capture: None,
        };
        assert_eq!(
            v.line(&beats),
            "hang: rank 0 (vm) waits in gradient all-reduce #1204 (3 bucket(s) of step 300) \
             since 14:02:11; rank 1 (vm, pid 42) stopped beating (stopped or frozen); at its \
             last beat at 14:02:09 it was in forward of step 300"
        );
        let text = serde_json::to_string(&v).unwrap();
        assert_eq!(serde_json::from_str::<HangVerdict>(&text).unwrap(), v);
    }

    /// A rank stopped (SIGSTOP) whose last beat is 3 steps behind the collective the others
    /// wait in is placed by that collective, not only by its late beat (before: "it was in
    /// forward of step 297", nothing more).
    #[test]
    fn a_stopped_ranks_late_beat_is_corrected_by_the_collective_the_others_wait_in() {
        let waiting = beat(0, Phase::GradientAllReduce);
        let mut stopped = beat(1, Phase::Forward);
        (stopped.step, stopped.seq) = (297, 1192);
        let mut v = HangVerdict {
            kind: HangKind::StoppedBeating,
            culprits: vec![HangRank::of(&stopped, false)],
            waiting: vec![HangRank::of(&waiting, true)],
            seq: Some(1204),
            allowed_s: 10,
            silent_s: 11,
            stacks: Vec::new(),
            capture: None,
        };
        v.culprits[0].state = Some("T".into());
        let line = v.line(&[waiting.clone(), stopped.clone()]);
        assert!(
            line.ends_with(
                "rank 1 (vm, pid 42) is stopped (state T: SIGSTOP or a debugger); at its last \
                 beat at 14:02:09 it had not entered it: it was in forward of step 297; since \
                 then it joined every collective up to #1203, so it stopped between #1203 and \
                 #1204 (step 300)"
            ),
            "{line}"
        );
        // A beat at the collective just before: nothing to correct.
        stopped.seq = 1203;
        v.culprits = vec![HangRank::of(&stopped, false)];
        let line = v.line(&[waiting, stopped]);
        assert!(!line.contains("since then"), "{line}");
    }

    /// Ranks that entered the same collective on either side of a second's edge are one group,
    /// dated by the first of them (CI saw "ranks 0,2 ... since 09:28:49; rank 1 ... since
    /// 09:28:48" for one all-reduce).
    #[test]
    fn ranks_waiting_in_one_collective_are_one_group_across_a_second() {
        let mut late = beat(2, Phase::GradientAllReduce);
        late.since = "2026-11-25T14:02:12.100Z".into();
        let early = beat(0, Phase::GradientAllReduce);
        let mut other = beat(1, Phase::GradientAllReduce);
        other.since = "2026-11-25T14:02:12.000Z".into();
        let stopped = beat(3, Phase::Backward);
        let v = HangVerdict {
            kind: HangKind::StoppedBeating,
            culprits: vec![HangRank::of(&stopped, false)],
            waiting: vec![
                HangRank::of(&early, true),
                HangRank::of(&other, true),
                HangRank::of(&late, true),
            ],
            seq: Some(1204),
            allowed_s: 10,
            silent_s: 11,
            stacks: Vec::new(),
            capture: None,
        };
        let line = v.line(&[early.clone(), other.clone(), late.clone(), stopped.clone()]);
        assert!(
            line.starts_with(
                "hang: ranks 0-2 (vm) wait in gradient all-reduce #1204 (3 bucket(s) of step \
                 300) since 14:02:11; rank 3 (vm, pid 42)"
            ),
            "{line}"
        );
    }
}
