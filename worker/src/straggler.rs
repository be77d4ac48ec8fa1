//! Slow ranks named while training. Every window of steps each rank's time split (data wait,
//! compute, communication; `metrics.rs`'s) is gathered on every rank, and each rank is compared
//! with the median of the *other* ranks: a rank whose compute per step is [`COMPUTE_FACTOR`]×
//! theirs, or whose data-wait share is [`WAIT_MARGIN`] above theirs (and at least twice it), in
//! [`WINDOWS`] windows in a row holding [`MIN_STEPS`] steps or more, is a straggler until a window finds it level again. The
//! others' median, not everyone's: with two ranks the median of both would halve the margin.
//! Communication is not compared (it holds the time the others wait for the slow one).
//!
//! Every rank runs the same `Detector` on the same gathered numbers, so each comes to the same
//! findings in the same step (a decision taken from them, `--straggler-action exclude`, is
//! taken by all ranks together). Pure: no rank, no clock.
use tchrun::job_record::status::SlowKind;

/// Compute per step over the others' median that counts as slow.
pub const COMPUTE_FACTOR: f64 = 1.3;
/// And at least this much slower per step (seconds): a factor on a few microseconds is noise.
pub const COMPUTE_MIN_EXCESS_S: f64 = 0.001;
/// Data-wait share above the others' median share that counts as slow (and it must be at least
/// twice theirs).
pub const WAIT_MARGIN: f64 = 0.10;
/// Windows in a row a rank must be slow in before it is named, and the steps they must hold
/// at least (a window can be one step: an epoch's first, `--print-freq 1`).
pub const WINDOWS: u32 = 3;
pub const MIN_STEPS: u64 = 8;

/// One rank's window: seconds waiting for the loader, computing and communicating, the
/// window's wall time and its optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Sample {
    pub wait_s: f64,
    pub compute_s: f64,
    pub comm_s: f64,
    pub wall_s: f64,
    pub steps: u64,
}

impl Sample {
    /// The values gathered from each rank, in this order (`from_values` reads them back).
    pub fn values(&self) -> [f64; 5] {
        [
            self.wait_s,
            self.compute_s,
            self.comm_s,
            self.wall_s,
            self.steps as f64,
        ]
    }

    pub fn from_values(v: &[f64]) -> Sample {
        let at = |i: usize| v.get(i).copied().unwrap_or(0.0);
        Sample {
            wait_s: at(0),
            compute_s: at(1),
            comm_s: at(2),
            wall_s: at(3),
            steps: at(4).max(0.0) as u64,
        }
    }

    /// Shares of the wall time: (data wait, compute, communication).
    pub fn shares(&self) -> (f64, f64, f64) {
        let w = self.wall_s.max(1e-9);
        (self.wait_s / w, self.compute_s / w, self.comm_s / w)
    }

    fn compute_per_step(&self) -> f64 {
        self.compute_s / (self.steps.max(1) as f64)
    }
}

/// A rank found slow (named once it was slow for [`WINDOWS`] windows in a row).
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    pub rank: usize,
    pub kind: SlowKind,
    /// Compute: per step over the others' median. Data wait: its share over theirs.
    pub factor: f64,
    /// Compute: seconds per step, its own and the others' median. Data wait: shares.
    pub value: f64,
    pub median: f64,
    /// Steps of the windows in a row it was slow in, and the step the first began at.
    pub steps: u64,
    pub since_step: u64,
    /// Named in this window for the first time (in this run of windows).
    pub new: bool,
}

#[derive(Debug, Clone, Copy, Default)]
struct Run {
    windows: u32,
    steps: u64,
    since_step: u64,
    /// Named already in this run of windows.
    named: bool,
}

/// The rule above, window after window.
#[derive(Debug, Clone, Default)]
pub struct Detector {
    /// Per rank, per kind (compute, data wait): the current run of slow windows.
    runs: Vec<[Run; 2]>,
    /// Per rank: the windows of the current epoch and those it was slow in (either kind).
    epoch_windows: u32,
    epoch_slow: Vec<u32>,
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Each rank's value against the median of the others'.
fn against_others(values: &[f64]) -> Vec<f64> {
    (0..values.len())
        .map(|r| {
            let others: Vec<f64> = values
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != r)
                .map(|(_, v)| *v)
                .collect();
            median(others)
        })
        .collect()
}

impl Detector {
    pub fn new() -> Detector {
        Detector::default()
    }

    /// The window that ended at `end_step`, one sample per rank (by rank): the stragglers now.
    /// Fewer than two ranks (or a window without steps) finds nothing.
    pub fn observe(&mut self, end_step: u64, samples: &[Sample]) -> Vec<Finding> {
        let n = samples.len();
        if self.runs.len() != n {
            self.runs = vec![[Run::default(); 2]; n];
            self.epoch_slow = vec![0; n];
        }
        if n < 2 || samples.iter().any(|s| s.steps == 0) {
            return Vec::new();
        }
        self.epoch_windows += 1;
        let per_step: Vec<f64> = samples.iter().map(Sample::compute_per_step).collect();
        let waits: Vec<f64> = samples.iter().map(|s| s.shares().0).collect();
        let (per_step_others, wait_others) = (against_others(&per_step), against_others(&waits));
        let mut found = Vec::new();
        for r in 0..n {
            let steps = samples[r].steps;
            let (c, mc) = (per_step[r], per_step_others[r]);
            let (w, mw) = (waits[r], wait_others[r]);
            let slow = [
                mc > 0.0 && c >= COMPUTE_FACTOR * mc && c - mc >= COMPUTE_MIN_EXCESS_S,
                w >= mw + WAIT_MARGIN && w >= 2.0 * mw,
            ];
            if slow.iter().any(|s| *s) {
                self.epoch_slow[r] += 1;
            }
            for (k, is_slow) in slow.into_iter().enumerate() {
                let run = &mut self.runs[r][k];
                if !is_slow {
                    *run = Run::default();
                    continue;
                }
                if run.windows == 0 {
                    run.since_step = end_step.saturating_sub(steps);
                }
                run.windows += 1;
                run.steps += steps;
                if run.windows < WINDOWS || run.steps < MIN_STEPS {
                    continue;
                }
                let new = !run.named;
                run.named = true;
                let (kind, value, median) = if k == 0 {
                    (SlowKind::Compute, c, mc)
                } else {
                    (SlowKind::DataWait, w, mw)
                };
                found.push(Finding {
                    rank: r,
                    kind,
                    factor: value / median.max(if k == 0 { 1e-9 } else { 0.01 }),
                    value,
                    median,
                    steps: run.steps,
                    since_step: run.since_step,
                    new,
                });
            }
        }
        found
    }

    /// At the end of an epoch: the ranks that were slow in every window of it (at least
    /// [`WINDOWS`] windows), then a new epoch's count begins.
    pub fn end_epoch(&mut self) -> Vec<usize> {
        let windows = self.epoch_windows;
        let whole: Vec<usize> = self
            .epoch_slow
            .iter()
            .enumerate()
            .filter(|(_, s)| windows >= WINDOWS && **s == windows)
            .map(|(r, _)| r)
            .collect();
        self.epoch_windows = 0;
        self.epoch_slow.iter_mut().for_each(|s| *s = 0);
        whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn even(n: usize) -> Vec<Sample> {
        vec![
            Sample {
                wait_s: 0.02,
                compute_s: 0.8,
                comm_s: 0.18,
                wall_s: 1.0,
                steps: 10,
            };
            n
        ]
    }

    #[test]
    fn a_slow_rank_is_named_after_three_windows_and_forgotten_when_level() {
        let mut d = Detector::new();
        let mut w = even(4);
        w[3].compute_s = 1.6;
        w[3].comm_s = 0.0;
        assert!(d.observe(10, &w).is_empty());
        assert!(d.observe(20, &w).is_empty());
        let f = d.observe(30, &w);
        assert_eq!(f.len(), 1, "{f:?}");
        assert_eq!(
            (f[0].rank, f[0].kind, f[0].new),
            (3, SlowKind::Compute, true)
        );
        assert!((f[0].factor - 2.0).abs() < 1e-9);
        assert_eq!((f[0].steps, f[0].since_step), (30, 0));
        let f = d.observe(40, &w);
        assert_eq!((f[0].steps, f[0].new), (40, false));
        assert!(d.observe(50, &even(4)).is_empty());
        assert!(
            d.end_epoch().is_empty(),
            "slow in 4 of the epoch's 5 windows"
        );
    }

    #[test]
    fn with_two_ranks_the_slow_one_is_compared_with_the_other() {
        let mut d = Detector::new();
        let mut w = even(2);
        w[1].compute_s = 1.1; // 1.375x the other rank
        for step in [10, 20] {
            assert!(d.observe(step, &w).is_empty());
        }
        let f = d.observe(30, &w);
        assert_eq!(f.len(), 1);
        assert_eq!(f[0].rank, 1);
        assert_eq!(d.end_epoch(), vec![1]);
        assert!(d.end_epoch().is_empty(), "a new epoch starts empty");
    }

    #[test]
    fn a_slow_loader_is_data_wait_and_noise_is_nobody() {
        let mut d = Detector::new();
        let mut w = even(3);
        w[0].wait_s = 0.45;
        w[0].compute_s = 0.5;
        for step in [10, 20] {
            assert!(d.observe(step, &w).is_empty());
        }
        let f = d.observe(30, &w);
        assert_eq!((f[0].rank, f[0].kind), (0, SlowKind::DataWait));
        assert!((f[0].value - 0.45).abs() < 1e-9 && (f[0].median - 0.02).abs() < 1e-9);

        // 25% apart, or slow in two windows out of three: never named.
        let mut d = Detector::new();
        for i in 0..30u64 {
            let mut w = even(4);
            w[(i % 4) as usize].compute_s = 1.0;
            if i % 3 != 2 {
                w[1].compute_s = 1.2;
            }
            assert!(d.observe(10 * (i + 1), &w).is_empty(), "window {i}");
        }
        // Microseconds apart: not a straggler, whatever the factor.
        let mut w = even(2);
        w[0].compute_s = 0.0001;
        w[1].compute_s = 0.0005;
        let mut d = Detector::new();
        for i in 0..5 {
            assert!(d.observe(10 * (i + 1), &w).is_empty());
        }
        // One rank alone, or a window without steps: nothing to compare.
        assert!(Detector::new().observe(10, &even(1)).is_empty());
        let mut w = even(2);
        w[0].steps = 0;
        assert!(Detector::new().observe(10, &w).is_empty());
    }

    #[test]
    fn three_tiny_windows_are_not_enough() {
        let mut d = Detector::new();
        let mut w = even(2);
        for s in &mut w {
            s.steps = 1;
        }
        w[0].compute_s = 1.6;
        for step in 1..=7 {
            assert!(d.observe(step, &w).is_empty(), "{step} steps");
        }
        let f = d.observe(8, &w);
        assert_eq!((f.len(), f[0].steps, f[0].new), (1, 8, true));
        assert!(!d.observe(9, &w)[0].new);
    }

    #[test]
    fn samples_round_trip_through_the_gathered_values() {
        let s = Sample {
            wait_s: 0.5,
            compute_s: 2.0,
            comm_s: 0.25,
            wall_s: 3.0,
            steps: 7,
        };
        assert_eq!(Sample::from_values(&s.values()), s);
        assert_eq!(Sample::from_values(&[]), Sample::default());
    }
}
