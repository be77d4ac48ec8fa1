//! `HangVerdict`: the launcher's hang watch's finding, kept in `failure.json`: how the job hung
//! (`HangKind`), the ranks at fault and those that wait for them (`HangRank`, from their
//! heartbeats), the collective they wait in, and the ranks' stacks when they were taken.
//! Reads `heartbeat` and `stacks` records; neither of them knows it.
use super::heartbeat::{clock, Heartbeat, Phase};
use super::stacks::{
    group_main_threads, groups_text, CaptureSummary, LoaderWork, RankStacks, StackGroup, TraceEntry,
};
use serde::{Deserialize, Serialize};

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

impl HangVerdict {
    /// The verdict with the ranks' stacks: each rank's state, the collective it waits in (its
    /// trace), its loader threads' files; the main-thread stacks grouped, the culprits' first.
    pub fn add_stacks(&mut self, stacks: &[RankStacks], summary: CaptureSummary) {
        for r in self.culprits.iter_mut().chain(self.waiting.iter_mut()) {
            let Some(s) = stacks.iter().find(|s| s.rank == r.rank) else {
                continue;
            };
            r.state = Some(s.state.clone());
            r.waits_in = s.waiting_in().filter(|_| r.phase.is_collective()).cloned();
            if r.phase == Phase::Loading {
                r.loaders = s.loaders.clone();
            }
        }
        if let Some(seq) = self
            .waiting
            .iter()
            .filter_map(|r| r.waits_in.as_ref())
            .map(|e| e.seq)
            .max()
        {
            self.seq = Some(seq);
        }
        let mut groups = group_main_threads(stacks);
        let culprit = |g: &StackGroup| {
            g.ranks
                .iter()
                .any(|r| self.culprits.iter().any(|c| c.rank == *r))
        };
        groups.sort_by_key(|g| !culprit(g));
        self.stacks = groups;
        self.capture = Some(summary);
    }

    /// The stacks for the terminal: the culprits' groups whole (up to `frames` frames), the
    /// others' innermost few.
    pub fn stacks_text(&self, frames: usize) -> String {
        let culprits: Vec<usize> = self.culprits.iter().map(|c| c.rank).collect();
        let mut out = groups_text(&self.stacks, &culprits, frames);
        if let Some(c) = &self.capture {
            for (rank, why) in &c.missing {
                out.push_str(&format!("  rank {rank}: no stacks ({why})\n"));
            }
        }
        out
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
