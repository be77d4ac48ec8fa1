//! The hang watch: reads the ranks' heartbeats (`heartbeat-<rank>.json`) once a second and
//! finds a job hung when a rank stopped beating while others wait in a collective, or when no
//! rank's step or collective advanced for the allowed silence (by default derived from the
//! measured step times; `--hang-timeout` fixes it; 0 turns the watch off). Ranks that do not
//! beat (`exec`'s programs) are watched by their driver logs' writes, with `--hang-timeout`
//! only. Before it says so, it takes every rank's stacks (`capture.rs`) into the verdict. A
//! launch that never starts a rank (no driver log: mpirun's or srun's daemons wedged) is
//! ended too, after `--hang-timeout` or, unset, [`START_ALLOWED`].
//! Must not know how the job is stopped or how the verdict is reported.
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};
use tchrun::job_record::hang::{HangKind, HangRank, HangVerdict};
use tchrun::job_record::heartbeat::{Heartbeat, Phase};

/// A rank whose beat did not change for this long has stopped beating (its beats come every
/// second from a thread of their own).
pub const STALE_AFTER: Duration = Duration::from_secs(10);
/// The least silence allowed once steps are measured.
pub const MIN_SILENCE: Duration = Duration::from_secs(60);
/// The silence allowed is this many times the slowest step seen.
pub const STEP_FACTOR: u32 = 10;
/// The silence allowed while a rank validates, writes a checkpoint or the model, or starts.
pub const LONG_PHASE_SILENCE: Duration = Duration::from_secs(30 * 60);
/// Once every rank finished its work: how long the ranks may take to leave the process group
/// and MPI (a second, normally) before tchrun ends those still there.
pub const LEAVE_ALLOWED: Duration = Duration::from_secs(30);
/// The same while some rank sends its last MLflow calls (bounded by the client itself).
pub const DRAIN_ALLOWED: Duration =
    Duration::from_secs(tchrun::mlflow::MAX_DRAIN.as_secs() + LEAVE_ALLOWED.as_secs());

/// Unset `--hang-timeout`: how long mpirun or srun may take to start the first rank (until a
/// driver log exists); the ranks' own bootstrap bound (`--timeout`'s default).
pub const START_ALLOWED: Duration = Duration::from_secs(tchrun::flags::DEFAULT_TIMEOUT_S);

/// The least time a launch is given to start a rank, whatever `--hang-timeout` says (a short
/// silence allowed for steps says nothing of how long mpirun or srun take to start ranks).
pub const START_FLOOR: Duration = Duration::from_secs(30);

/// What `--hang-timeout` asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `--hang-timeout 0`.
    Off,
    /// `--hang-timeout SECONDS`: that silence, whatever the steps take.
    Fixed(Duration),
    /// No `--hang-timeout`: the silence allowed follows the measured step times.
    Auto,
}

impl Policy {
    pub fn from_flag(seconds: Option<u64>) -> Policy {
        match seconds {
            Some(0) => Policy::Off,
            Some(s) => Policy::Fixed(Duration::from_secs(s)),
            None => Policy::Auto,
        }
    }
}

/// What the watch found.
#[derive(Debug, Clone, PartialEq)]
pub enum Hang {
    /// From the heartbeats: who is at fault and who waits.
    Found(HangVerdict),
    /// Ranks that do not beat wrote nothing for `--hang-timeout`.
    SilentLogs,
    /// No rank started (no driver log, no heartbeat) within `allowed` of the launch.
    NeverStarted { allowed: Duration },
}

/// What the watch saw of one rank.
#[derive(Debug)]
struct Seen {
    beat: u64,
    /// When (our clock) its beat last changed.
    changed: Instant,
    step: u64,
    seq: u64,
    progress: u64,
}

/// The watch's memory between polls.
#[derive(Debug)]
pub struct State {
    policy: Policy,
    seen: BTreeMap<usize, Seen>,
    started: Instant,
    /// When some rank's step or collective last advanced (or, `Fixed`, a driver log grew).
    progress_at: Instant,
    max_step: u64,
    step_at: Option<Instant>,
    slowest_step: Duration,
    /// When every rank was first seen to have finished its work (leaving, draining or done).
    finished_at: Option<Instant>,
}

impl State {
    pub fn new(policy: Policy, now: Instant) -> State {
        State {
            policy,
            seen: BTreeMap::new(),
            started: now,
            progress_at: now,
            max_step: 0,
            step_at: None,
            slowest_step: Duration::ZERO,
            finished_at: None,
        }
    }

    /// Whether `b`'s rank has not beaten for `STALE_AFTER` (a rank never seen is not stale).
    fn stale(&self, b: &Heartbeat, now: Instant) -> bool {
        self.seen
            .get(&b.rank)
            .is_some_and(|s| now.duration_since(s.changed) >= STALE_AFTER)
    }

    /// How long the launch may take to start a rank (`Off`: forever).
    fn start_allowance(&self) -> Option<Duration> {
        match self.policy {
            Policy::Off => None,
            Policy::Fixed(d) => Some(d.max(START_FLOOR)),
            Policy::Auto => Some(START_ALLOWED),
        }
    }

    /// The silence allowed now, if any (`Auto`: only once a step was measured).
    fn allowance(&self, beats: &[Heartbeat]) -> Option<Duration> {
        match self.policy {
            Policy::Off => None,
            Policy::Fixed(d) => Some(d),
            Policy::Auto => {
                self.step_at?;
                let base = MIN_SILENCE.max(self.slowest_step * STEP_FACTOR);
                let long = beats.iter().any(|b| b.phase.is_long());
                Some(if long {
                    base.max(LONG_PHASE_SILENCE)
                } else {
                    base
                })
            }
        }
    }

    /// Remembers `beats` (seen at `now`); the newest driver-log write was `log_age` ago.
    fn remember(&mut self, now: Instant, beats: &[Heartbeat], log_age: Option<Duration>) {
        for b in beats {
            let s = self.seen.entry(b.rank).or_insert(Seen {
                beat: b.beat,
                changed: now,
                step: b.step,
                seq: b.seq,
                progress: b.progress,
            });
            if s.beat != b.beat {
                s.beat = b.beat;
                s.changed = now;
            }
            if (s.step, s.seq, s.progress) != (b.step, b.seq, b.progress) {
                (s.step, s.seq, s.progress) = (b.step, b.seq, b.progress);
                self.progress_at = now;
            }
        }
        let top = beats.iter().map(|b| b.step).max().unwrap_or(0);
        if top > self.max_step {
            if let (Some(t), true) = (self.step_at, self.max_step > 0) {
                let per = now.duration_since(t) / (top - self.max_step).min(u32::MAX as u64) as u32;
                self.slowest_step = self.slowest_step.max(per);
            }
            self.step_at = Some(now);
            self.max_step = top;
        }
        if let (Policy::Fixed(_), Some(age)) = (self.policy, log_age) {
            if let Some(at) = now.checked_sub(age) {
                self.progress_at = self.progress_at.max(at.max(self.started));
            }
        }
    }

    /// One poll: the beats read now and the age of the newest driver-log write.
    pub fn observe(
        &mut self,
        now: Instant,
        beats: &[Heartbeat],
        log_age: Option<Duration>,
    ) -> Option<Hang> {
        if self.policy == Policy::Off {
            return None;
        }
        if beats.is_empty() && log_age.is_none() {
            let allowed = self.start_allowance()?;
            return (now.duration_since(self.started) > allowed)
                .then_some(Hang::NeverStarted { allowed });
        }
        self.remember(now, beats, log_age);
        if !beats.is_empty() && beats.iter().all(|b| b.phase.finished_work()) {
            return self.lingering(now, beats);
        }
        self.finished_at = None;
        let stale = |b: &Heartbeat| self.stale(b, now);
        // A rank that finished its work is neither a culprit nor waiting: only the ranks still
        // at work are judged.
        let (dead, live): (Vec<&Heartbeat>, Vec<&Heartbeat>) = beats
            .iter()
            .filter(|b| !b.phase.finished_work())
            .partition(|b| stale(b));
        let waiting: Vec<&Heartbeat> = live
            .iter()
            .copied()
            .filter(|b| b.phase.is_collective())
            .collect();
        let silent = now.duration_since(self.progress_at);
        let allowed = self.allowance(beats);
        if !dead.is_empty() && !waiting.is_empty() {
            return Some(Hang::Found(verdict(
                HangKind::StoppedBeating,
                &dead,
                &live,
                STALE_AFTER,
                silent,
            )));
        }
        let limit = allowed?;
        if silent <= limit {
            return None;
        }
        if beats.is_empty() {
            // Ranks that do not beat are judged by their driver logs once one exists: a slow
            // launch (a loaded node) is not a silent rank; `--timeout` bounds the bootstrap.
            return (matches!(self.policy, Policy::Fixed(_)) && log_age.is_some())
                .then_some(Hang::SilentLogs);
        }
        Some(Hang::Found(verdict(
            HangKind::NoProgress,
            &dead,
            &live,
            limit,
            silent,
        )))
    }

    /// Every rank finished its work: those that are still leaving (or say they are done but
    /// whose process still lives on this host) after `LEAVE_ALLOWED` (`DRAIN_ALLOWED` while
    /// one drains MLflow) are named, to be ended; the job succeeded.
    fn lingering(&mut self, now: Instant, beats: &[Heartbeat]) -> Option<Hang> {
        let since = *self.finished_at.get_or_insert(now);
        let draining = beats.iter().any(|b| b.phase == Phase::Draining);
        let allowed = if draining {
            DRAIN_ALLOWED
        } else {
            LEAVE_ALLOWED
        };
        let waited = now.duration_since(since);
        if waited <= allowed {
            return None;
        }
        let mut still: Vec<&Heartbeat> = beats.iter().filter(|b| b.phase != Phase::Done).collect();
        if still.is_empty() {
            // Every rank said done, yet the job's processes run: those whose process lives
            // here, else (other hosts) all of them.
            still = beats.iter().filter(|b| alive_here(b)).collect();
            if still.is_empty() {
                still = beats.iter().collect();
            }
        }
        let beating = |b: &Heartbeat| b.phase != Phase::Done && !self.stale(b, now);
        let culprits = still.iter().map(|b| HangRank::of(b, beating(b))).collect();
        Some(Hang::Found(HangVerdict {
            kind: HangKind::Lingered,
            culprits,
            waiting: Vec::new(),
            seq: None,
            allowed_s: allowed.as_secs(),
            silent_s: waited.as_secs_f64().ceil() as u64,
            stacks: Vec::new(),
            capture: None,
        }))
    }
}

/// Whether the rank's process still lives and this host is its host.
fn alive_here(b: &Heartbeat) -> bool {
    let here = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_default();
    b.host == here && std::path::Path::new(&format!("/proc/{}", b.pid)).exists()
}

/// The culprits: the ranks that stopped beating, else the live ones outside a collective,
/// else those behind in the collective sequence. The rest of the live ranks wait.
fn verdict(
    kind: HangKind,
    dead: &[&Heartbeat],
    live: &[&Heartbeat],
    allowed: Duration,
    silent: Duration,
) -> HangVerdict {
    let outside: Vec<&Heartbeat> = live
        .iter()
        .copied()
        .filter(|b| !b.phase.is_collective())
        .collect();
    let min_seq = live.iter().map(|b| b.seq).min().unwrap_or(0);
    let max_seq = live.iter().map(|b| b.seq).max().unwrap_or(0);
    let culprit = |b: &Heartbeat| {
        if !dead.is_empty() {
            false
        } else if !outside.is_empty() {
            !b.phase.is_collective()
        } else {
            min_seq < max_seq && b.seq == min_seq
        }
    };
    let mut culprits: Vec<HangRank> = dead.iter().map(|b| HangRank::of(b, false)).collect();
    let mut waiting = Vec::new();
    for b in live {
        if culprit(b) {
            culprits.push(HangRank::of(b, true));
        } else {
            waiting.push(HangRank::of(b, true));
        }
    }
    if culprits.is_empty() {
        // No rank stands out (all wait in the same collective): every one is named, never
        // an empty verdict.
        culprits = std::mem::take(&mut waiting);
    }
    culprits.sort_by_key(|r| r.rank);
    let seq = waiting
        .iter()
        .filter(|r| r.phase.is_collective())
        .map(|r| r.seq)
        .max();
    HangVerdict {
        kind,
        culprits,
        waiting,
        seq,
        allowed_s: allowed.as_secs(),
        silent_s: silent.as_secs_f64().ceil() as u64,
        stacks: Vec::new(),
        capture: None,
    }
}

/// The watch of one attempt: polls at most once a second; keeps what it found.
pub struct Watch {
    log_dir: PathBuf,
    state: Mutex<(State, Option<Instant>)>,
    found: Mutex<Option<(Hang, Vec<Heartbeat>)>>,
}

impl Watch {
    pub fn new(log_dir: PathBuf, policy: Policy) -> Watch {
        tchrun::job_record::stacks::CaptureRequest::remove(&log_dir);
        Watch {
            log_dir,
            state: Mutex::new((State::new(policy, Instant::now()), None)),
            found: Mutex::new(None),
        }
    }

    /// Whether the job hangs (polled by the supervisor; reads the files once a second).
    pub fn hung(&self) -> bool {
        let now = Instant::now();
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.0.policy == Policy::Off || st.1.is_some_and(|t| now.duration_since(t) < POLL) {
            return false;
        }
        st.1 = Some(now);
        let beats = Heartbeat::read_all(&self.log_dir);
        let log_age = crate::report::last_progress(&self.log_dir)
            .and_then(|t| SystemTime::now().duration_since(t).ok());
        let Some(mut hang) = st.0.observe(now, &beats, log_age) else {
            return false;
        };
        drop(st);
        // Every rank's stacks, before the job is stopped (bounded: `capture::BOUND`).
        if let Hang::Found(v) = &mut hang {
            let (stacks, summary) = super::capture::capture(
                &self.log_dir,
                &beats,
                "hang",
                super::capture::ANSWER_LIMIT,
            );
            v.add_stacks(&stacks, summary);
        }
        *self.found.lock().unwrap_or_else(|e| e.into_inner()) = Some((hang, beats));
        true
    }

    /// What the watch found (and the beats it read then), once it found the job hung.
    pub fn found(&self) -> Option<(Hang, Vec<Heartbeat>)> {
        self.found.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

const POLL: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(rank: usize, phase: Phase, step: u64, seq: u64, beat: u64) -> Heartbeat {
        Heartbeat {
            rank,
            host: "vm".into(),
            pid: 100 + rank as u32,
            phase,
            step,
            seq,
            progress: 0,
            buckets: None,
            since: "2026-11-25T14:02:11.000Z".into(),
            time: "2026-11-25T14:02:12.000Z".into(),
            beat,
        }
    }

    #[test]
    fn a_rank_that_stops_beating_while_another_waits_is_named() {
        let t0 = Instant::now();
        let mut s = State::new(Policy::Auto, t0);
        let s1 = Duration::from_secs(1);
        for i in 0..5u64 {
            let beats = [
                beat(0, Phase::Forward, i, i * 3, i),
                beat(1, Phase::Forward, i, i * 3, i),
            ];
            assert_eq!(s.observe(t0 + s1 * i as u32, &beats, None), None);
        }
        // Rank 1 stops at beat 4; rank 0 goes on beating inside the all-reduce.
        let mut found = None;
        for i in 5..30u64 {
            let beats = [
                beat(0, Phase::GradientAllReduce, 4, 15, i),
                beat(1, Phase::Forward, 4, 12, 4),
            ];
            found = s.observe(t0 + s1 * i as u32, &beats, None);
            if found.is_some() {
                assert_eq!(i, 4 + STALE_AFTER.as_secs());
                break;
            }
        }
        let Some(Hang::Found(v)) = found else {
            panic!("{found:?}")
        };
        assert_eq!(v.kind, HangKind::StoppedBeating);
        assert_eq!(v.culprits.iter().map(|r| r.rank).collect::<Vec<_>>(), [1]);
        assert!(!v.culprits[0].beating);
        assert_eq!(v.waiting.iter().map(|r| r.rank).collect::<Vec<_>>(), [0]);
        assert_eq!(v.seq, Some(15));
    }

    #[test]
    fn no_progress_is_judged_from_the_measured_steps_and_fixed_or_off_by_the_flag() {
        let t0 = Instant::now();
        let s1 = Duration::from_secs(1);
        let mut s = State::new(Policy::Auto, t0);
        // Start-up without a measured step: no judgement of silence.
        let start = [beat(0, Phase::StartUp, 0, 0, 1)];
        assert_eq!(s.observe(t0 + s1 * 500, &start, None), None);
        for i in 1..=3u64 {
            let b = [beat(0, Phase::Forward, i, i, 1 + i)];
            assert_eq!(s.observe(t0 + s1 * (500 + 2 * i as u32), &b, None), None);
        }
        // Steps of 2 s: 60 s allowed; the rank is stuck in forward (still beating).
        let mut hang = None;
        for i in 0..100u32 {
            let b = [beat(0, Phase::Forward, 3, 3, 100 + i as u64)];
            hang = s.observe(t0 + s1 * (506 + i), &b, None);
            if hang.is_some() {
                assert_eq!(i, 61);
                break;
            }
        }
        let Some(Hang::Found(v)) = hang else {
            panic!("{hang:?}")
        };
        assert_eq!((v.kind, v.allowed_s), (HangKind::NoProgress, 60));
        assert!(v.culprits[0].beating);
        // Off never finds anything; Fixed without beats goes by the logs.
        let mut off = State::new(Policy::Off, t0);
        assert_eq!(off.observe(t0 + s1 * 10_000, &[], None), None);
        let mut fixed = State::new(Policy::Fixed(s1 * 3), t0);
        // No driver log yet: a launch is judged by the same bound, at least START_FLOOR.
        assert_eq!(fixed.observe(t0 + START_FLOOR, &[], None), None);
        assert_eq!(
            fixed.observe(t0 + START_FLOOR + s1, &[], None),
            Some(Hang::NeverStarted {
                allowed: START_FLOOR
            })
        );
        let mut fixed = State::new(Policy::Fixed(s1 * 3), t0);
        assert_eq!(fixed.observe(t0 + s1 * 3, &[], Some(s1 * 2)), None);
        assert_eq!(
            fixed.observe(t0 + s1 * 5, &[], Some(s1 * 4)),
            Some(Hang::SilentLogs)
        );
        assert_eq!(Policy::from_flag(None), Policy::Auto);
        assert_eq!(Policy::from_flag(Some(0)), Policy::Off);
    }

    #[test]
    fn ranks_that_finished_their_work_are_given_time_to_leave_then_named_never_a_hang() {
        let t0 = Instant::now();
        let s1 = Duration::from_secs(1);
        let mut s = State::new(Policy::Fixed(s1 * 5), t0);
        let working = [
            beat(0, Phase::Forward, 3, 3, 1),
            beat(1, Phase::Forward, 3, 3, 1),
        ];
        assert_eq!(s.observe(t0, &working, None), None);
        // Rank 0 is done and gone; rank 1 beats on, leaving: far beyond --hang-timeout 5,
        // nothing is found until LEAVE_ALLOWED.
        let mut found = None;
        for i in 1..100u32 {
            let b = [
                beat(0, Phase::Done, 4, 4, u64::MAX),
                beat(1, Phase::Leaving, 4, 4, 1 + i as u64),
            ];
            found = s.observe(t0 + s1 * i, &b, None);
            if found.is_some() {
                assert_eq!(i as u64, LEAVE_ALLOWED.as_secs() + 2, "{found:?}");
                break;
            }
        }
        let Some(Hang::Found(v)) = found else {
            panic!("{found:?}")
        };
        assert_eq!(v.kind, HangKind::Lingered);
        let named: Vec<(usize, bool, Phase)> = v
            .culprits
            .iter()
            .map(|r| (r.rank, r.beating, r.phase))
            .collect();
        assert_eq!(named, [(1, true, Phase::Leaving)]);
        assert!(v.waiting.is_empty());
        let line = v.line(&[]);
        assert!(
            line.contains("every rank finished its work")
                && line.contains("rank 1 (vm, pid 101) was leaving the process group and MPI"),
            "{line}"
        );
        // A rank draining MLflow has the drain's allowance.
        let mut s = State::new(Policy::Auto, t0);
        let b = [
            beat(0, Phase::Draining, 4, 4, 1),
            beat(1, Phase::Done, 4, 4, u64::MAX),
        ];
        assert_eq!(s.observe(t0, &b, None), None);
        assert_eq!(s.observe(t0 + LEAVE_ALLOWED * 2, &b, None), None);
        let late = s.observe(t0 + DRAIN_ALLOWED + s1, &b, None);
        assert!(
            matches!(&late, Some(Hang::Found(v)) if v.kind == HangKind::Lingered
                && v.culprits.len() == 1 && v.culprits[0].rank == 0),
            "{late:?}"
        );
    }

    #[test]
    fn a_launch_that_starts_no_rank_is_ended_after_the_allowance() {
        let t0 = Instant::now();
        let mut auto = State::new(Policy::Auto, t0);
        assert_eq!(auto.observe(t0 + START_ALLOWED, &[], None), None);
        assert_eq!(
            auto.observe(t0 + START_ALLOWED + Duration::from_secs(1), &[], None),
            Some(Hang::NeverStarted {
                allowed: START_ALLOWED
            })
        );
        let fixed = Duration::from_secs(40);
        let mut st = State::new(Policy::Fixed(fixed), t0);
        assert_eq!(st.observe(t0 + Duration::from_secs(39), &[], None), None);
        assert_eq!(
            st.observe(t0 + Duration::from_secs(41), &[], None),
            Some(Hang::NeverStarted { allowed: fixed })
        );
        // A driver log exists: a rank started (a slow bootstrap is `--timeout`'s to bound).
        let mut started = State::new(Policy::Auto, t0);
        let late = t0 + START_ALLOWED * 2;
        assert_eq!(
            started.observe(late, &[], Some(Duration::from_secs(1))),
            None
        );
        let mut off = State::new(Policy::Off, t0);
        assert_eq!(off.observe(late, &[], None), None);
    }

    #[test]
    fn ranks_all_waiting_in_the_same_collective_are_all_named() {
        let t0 = Instant::now();
        let s1 = Duration::from_secs(1);
        let mut s = State::new(Policy::Fixed(s1 * 5), t0);
        let b = [
            beat(0, Phase::AllReduce, 3, 7, 1),
            beat(1, Phase::AllReduce, 3, 7, 1),
        ];
        assert_eq!(s.observe(t0, &b, None), None);
        let mut found = None;
        for i in 1..20u32 {
            let b = [
                beat(0, Phase::AllReduce, 3, 7, 1 + i as u64),
                beat(1, Phase::AllReduce, 3, 7, 1 + i as u64),
            ];
            found = s.observe(t0 + s1 * i, &b, None);
            if found.is_some() {
                break;
            }
        }
        let Some(Hang::Found(v)) = found else {
            panic!("{found:?}")
        };
        assert_eq!(v.kind, HangKind::NoProgress);
        assert_eq!(
            v.culprits.iter().map(|r| r.rank).collect::<Vec<_>>(),
            [0, 1],
            "{v:?}"
        );
    }
}
