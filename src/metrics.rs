//! `metrics.jsonl`: one JSON object per epoch (schema versioned).
use crate::job_record::status::Straggler;
use serde::{Deserialize, Serialize};

pub const SCHEMA_VERSION: u32 = 1;

/// One epoch of training, as written to `metrics.jsonl` and shown in the plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub schema: u32,
    /// 1-based epoch.
    pub epoch: u32,
    /// Mean training loss over the epoch (all ranks).
    pub train_loss: f64,
    /// Training images per second over all ranks.
    pub train_images_per_sec: f64,
    pub val_loss: f64,
    /// Validation top-1 / top-5 accuracy in [0, 1].
    pub top1: f64,
    pub top5: f64,
    /// LR of the epoch's last step (effective, i.e. scaled by the world size).
    pub lr: f64,
    pub epoch_time_s: f64,
    /// Wall-clock time at the end of the epoch (RFC 3339).
    pub time: String,
    /// Images left out of this epoch under `--skip-bad-images`: those the pre-flight refused
    /// plus those that failed to decode during the epoch (training and validation, all ranks).
    /// Absent in rows written before it existed.
    #[serde(default)]
    pub skipped_images: u64,
    /// Where the training steps' time went (seconds, this epoch; after a mid-epoch resume only
    /// the resumed part). `step_time_s`: the training loop's wall time (mean over ranks); it
    /// splits into waiting for the next batch from the loader (`data_wait_s`), compute
    /// (forward, backward, optimizer; `compute_s`) and the communication backward did not hide
    /// (`comm_s`, which also holds waiting for a slower rank). Mean over ranks; `*_max_s`: the
    /// largest value among the ranks. All absent (0) in rows written before they existed.
    #[serde(default)]
    pub step_time_s: f64,
    #[serde(default)]
    pub data_wait_s: f64,
    #[serde(default)]
    pub compute_s: f64,
    #[serde(default)]
    pub comm_s: f64,
    #[serde(default)]
    pub data_wait_max_s: f64,
    #[serde(default)]
    pub compute_max_s: f64,
    #[serde(default)]
    pub comm_max_s: f64,
    /// The ranks named slower than the others in this epoch (`tchrun_worker::straggler`), each with
    /// its last finding. Absent when none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stragglers: Vec<Straggler>,
    /// The rank whose data wait plus compute was the largest over the epoch's windows, and its
    /// host: where a slow node shows first. Absent with one rank and in older rows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub slowest: Option<Slowest>,
    /// Rank 0's node when its ranks × intra-op threads or other processes' use at the start
    /// exceeded its cores (`CpuUse::oversubscribed`). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_oversubscribed: Option<CpuUse>,
    /// The job's ranks (0 in rows written before it was recorded). With one rank there is no
    /// gradient all-reduce: what `comm_s` holds is the step's bookkeeping, said as "other".
    #[serde(default)]
    pub ranks: u32,
    /// `--model-ema`: the EMA model's validation loss, top-1 and top-5, validated on the same
    /// images beside the model's (`val_loss`, `top1`, `top5`). Absent without it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_val_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_top1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_top5: Option<f64>,
}

/// A node's CPU cores against what a job asks of them: its ranks × intra-op threads
/// (`--threads`), and the cores other processes keep busy as the job's ranks start. More of
/// either than cores makes the ranks' threads wait for one another: one CPU rank ran 13× slower
/// with the default threads than with `--threads 1` on a loaded node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuUse {
    pub cores: usize,
    /// Ranks on the node and intra-op threads of each.
    pub ranks: usize,
    pub threads: usize,
    /// The cores other processes kept busy just before the start (`env::busy_cores`; absent
    /// where it was not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub busy_cores: Option<f64>,
    /// Older records: the 1-minute load average at the start (no longer measured: it still
    /// held a build that had finished).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_average: Option<f64>,
}

/// How long `CpuUse::of_this_host` watches the other processes.
pub const BUSY_WINDOW: std::time::Duration = std::time::Duration::from_millis(250);

impl CpuUse {
    /// This host: its cores and the cores other processes use now (`measure_others`: over
    /// `BUSY_WINDOW`), with `ranks` ranks of `threads` threads.
    pub fn of_this_host(ranks: usize, threads: usize, measure_others: bool) -> CpuUse {
        CpuUse {
            cores: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            ranks,
            threads,
            busy_cores: if measure_others {
                crate::env::busy_cores(BUSY_WINDOW)
            } else {
                None
            },
            load_average: None,
        }
    }

    /// Ranks × threads exceed the cores, or other processes leave them too few.
    pub fn oversubscribed(&self) -> bool {
        !self.reasons().is_empty()
    }

    fn reasons(&self) -> Vec<String> {
        let mut why = Vec::new();
        let asked = self.ranks * self.threads;
        if asked > self.cores {
            why.push(format!(
                "{} rank(s) × {} intra-op thread(s) = {asked} > {} cores",
                self.ranks, self.threads, self.cores
            ));
        }
        // A whole core or more taken by others, and not enough left for the ranks' threads.
        if let Some(b) = self
            .busy_cores
            .filter(|b| *b >= 1.0 && *b + asked.min(self.cores) as f64 > self.cores as f64)
        {
            why.push(format!(
                "other processes kept {b:.1} of the {} cores busy as the ranks started",
                self.cores
            ));
        }
        why
    }

    /// The warning (without a `tchrun: warning: ` prefix), when oversubscribed.
    pub fn warning(&self) -> Option<String> {
        let why = self.reasons();
        (!why.is_empty()).then(|| {
            format!(
                "CPU oversubscribed: {}; the ranks' threads wait for one another's cores: use \
                 --threads 1 or fewer --procs-per-node",
                why.join(" and ")
            )
        })
    }
}

/// The slowest rank of an epoch: its rank, host, and shares of its wall time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Slowest {
    pub rank: usize,
    pub host: String,
    pub data_wait_share: f64,
    pub compute_share: f64,
}

impl EpochMetrics {
    /// Share of the step time the ranks waited for data (mean over ranks), in [0, 1].
    pub fn data_wait_share(&self) -> f64 {
        if self.step_time_s > 0.0 {
            self.data_wait_s / self.step_time_s
        } else {
            0.0
        }
    }
}

/// What limited the training steps' speed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    Input,
    Compute,
    Communication,
}

/// A job is input-bound when its slowest rank waited for data at least this share of the step
/// time: the loader then stalls every rank (the collectives wait for the slowest), and a
/// quarter of the time is a gain worth a flag change.
pub const INPUT_BOUND_SHARE: f64 = 0.25;

/// The run's verdict over all epochs with a time split (see [`verdict`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Verdict {
    pub bound: Bound,
    /// Shares of the step time: the slowest rank's data wait (which decides), and the means
    /// over ranks of data wait, compute and communication (these three add up to about 1).
    pub data_wait: f64,
    pub data_wait_mean: f64,
    pub compute: f64,
    pub comm: f64,
    /// The rank (and host) that was the slowest in the most epochs (the latest on a tie), with
    /// its shares in the last of them.
    pub slowest: Option<Slowest>,
    /// The CPU was oversubscribed (the last epoch that said so): the verdict says that first.
    pub cpu_oversubscribed: Option<CpuUse>,
    /// Every row is of a 1-rank job: no communication to speak of (`comm` is then "other").
    pub one_rank: bool,
}

/// Input-bound when the slowest rank's data wait reaches [`INPUT_BOUND_SHARE`] of the step
/// time; otherwise compute- or communication-bound, whichever of the two (means over ranks)
/// takes more of it. `None` when no row has a time split (rows from before it existed).
pub fn verdict(rows: &[EpochMetrics]) -> Option<Verdict> {
    let rows: Vec<&EpochMetrics> = rows.iter().filter(|m| m.step_time_s > 0.0).collect();
    let total: f64 = rows.iter().map(|m| m.step_time_s).sum();
    if rows.is_empty() || total <= 0.0 {
        return None;
    }
    let share = |f: fn(&EpochMetrics) -> f64| rows.iter().map(|m| f(m)).sum::<f64>() / total;
    let (data_wait, data_wait_mean, compute, comm) = (
        share(|m| m.data_wait_max_s),
        share(|m| m.data_wait_s),
        share(|m| m.compute_s),
        share(|m| m.comm_s),
    );
    let mut counts: std::collections::BTreeMap<usize, (usize, usize)> = Default::default();
    for (i, m) in rows.iter().enumerate() {
        if let Some(sl) = &m.slowest {
            let c = counts.entry(sl.rank).or_default();
            *c = (c.0 + 1, i);
        }
    }
    let slowest = counts
        .values()
        .max()
        .and_then(|(_, i)| rows[*i].slowest.clone());
    let one_rank = rows.iter().all(|m| m.ranks == 1);
    let bound = if data_wait >= INPUT_BOUND_SHARE {
        Bound::Input
    } else if comm > compute && !one_rank {
        Bound::Communication
    } else {
        Bound::Compute
    };
    Some(Verdict {
        bound,
        data_wait,
        data_wait_mean,
        compute,
        comm,
        slowest,
        cpu_oversubscribed: rows.iter().rev().find_map(|m| m.cpu_oversubscribed.clone()),
        one_rank,
    })
}

/// The run's stragglers for the end-of-run report: one line per rank and kind, its last
/// finding and the epochs it was named in (`... in epochs 1, 2, 3`).
pub fn straggler_lines(rows: &[EpochMetrics]) -> Vec<String> {
    let mut found: Vec<(Straggler, Vec<u32>)> = Vec::new();
    for m in rows {
        for s in &m.stragglers {
            match found
                .iter_mut()
                .find(|(f, _)| (f.rank, f.kind) == (s.rank, s.kind))
            {
                Some((f, epochs)) => {
                    *f = s.clone();
                    epochs.push(m.epoch);
                }
                None => found.push((s.clone(), vec![m.epoch])),
            }
        }
    }
    found
        .into_iter()
        .map(|(s, epochs)| {
            let e: Vec<String> = epochs.iter().map(u32::to_string).collect();
            let word = if e.len() == 1 { "epoch" } else { "epochs" };
            format!("{}; in {word} {}", s.line(), e.join(", "))
        })
        .collect()
}

impl Verdict {
    /// One line for the end-of-run report: the verdict, the split, and the flag to change.
    pub fn line(&self) -> String {
        let split = if self.one_rank {
            // One rank: no all-reduce, no slower rank to wait for; the rest is bookkeeping.
            format!(
                "data wait {:.0}%, compute {:.0}%, other {:.0}% of the step time",
                100.0 * self.data_wait_mean,
                100.0 * self.compute,
                100.0 * self.comm
            )
        } else {
            format!(
                "data wait {:.0}% (slowest rank {:.0}%), compute {:.0}%, communication {:.0}% of \
                 the step time",
                100.0 * self.data_wait_mean,
                100.0 * self.data_wait,
                100.0 * self.compute,
                100.0 * self.comm
            )
        };
        let split = match &self.slowest {
            Some(sl) => format!(
                "{split}; slowest host {} (rank {}: data wait {:.0}%, compute {:.0}%)",
                sl.host,
                sl.rank,
                100.0 * sl.data_wait_share,
                100.0 * sl.compute_share
            ),
            None => split,
        };
        // An oversubscribed CPU is said with its fix; compute-bound is then no longer "as it
        // should be".
        if let Some(w) = self.cpu_oversubscribed.as_ref().and_then(CpuUse::warning) {
            if self.bound == Bound::Compute {
                return format!("compute-bound: {split}; {w}");
            }
            let line = Verdict {
                cpu_oversubscribed: None,
                ..self.clone()
            }
            .line();
            return format!("{line}; {w}");
        }
        match self.bound {
            Bound::Input => format!(
                "input-bound: {split}; the loader is the limit: raise --loader-threads, or store \
                 the images closer to --input-size (smaller files decode faster)"
            ),
            Bound::Communication => format!(
                "communication-bound: {split}; the gradient all-reduce is the limit: try a larger \
                 --bucket-cap-mb, a larger --batch-size (fewer reductions per image), or fewer \
                 nodes"
            ),
            Bound::Compute => format!(
                "compute-bound: {split}; the device is the limit (as it should be): --amp on \
                 GPU or a smaller --input-size go faster; more --loader-threads would not"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(step: f64, wait: f64, wait_max: f64, compute: f64, comm: f64) -> EpochMetrics {
        let mut m: EpochMetrics = serde_json::from_str(
            r#"{"schema":1,"epoch":1,"train_loss":1,"train_images_per_sec":1,"val_loss":1,
                "top1":0,"top5":0,"lr":0.1,"epoch_time_s":1,"time":"t"}"#,
        )
        .expect("an old row (without the time split) still parses");
        assert_eq!(
            (m.step_time_s, m.data_wait_s, m.skipped_images),
            (0.0, 0.0, 0)
        );
        m.step_time_s = step;
        m.data_wait_s = wait;
        m.data_wait_max_s = wait_max;
        m.compute_s = compute;
        m.comm_s = comm;
        m
    }

    #[test]
    fn a_one_rank_job_has_no_communication_in_its_verdict() {
        let mut m = row(10.0, 1.0, 1.0, 4.0, 5.0);
        m.ranks = 1;
        let v = verdict(&[m.clone()]).expect("a verdict");
        assert_eq!(v.bound, Bound::Compute);
        assert!(
            v.line().starts_with(
                "compute-bound: data wait 10%, compute 40%, other 50% of the step time;"
            ),
            "{}",
            v.line()
        );
        m.ranks = 2;
        let v = verdict(&[m]).expect("a verdict");
        assert_eq!(v.bound, Bound::Communication);
        assert!(
            v.line().contains("communication 50% of the step time"),
            "{}",
            v.line()
        );
    }

    #[test]
    fn stragglers_are_reported_once_per_rank_and_kind_with_their_epochs() {
        use crate::job_record::status::SlowKind;
        let s = |steps: u64| Straggler {
            rank: 1,
            host: "node2".into(),
            device: "cpu".into(),
            kind: SlowKind::Compute,
            factor: 2.0,
            value: 0.2,
            median: 0.1,
            steps,
            since_step: 10,
        };
        let mut rows = vec![row(1.0, 0.0, 0.0, 1.0, 0.0), row(1.0, 0.0, 0.0, 1.0, 0.0)];
        rows[1].epoch = 2;
        assert!(straggler_lines(&rows).is_empty());
        rows[0].stragglers = vec![s(30)];
        rows[1].stragglers = vec![s(80)];
        assert_eq!(
            straggler_lines(&rows),
            vec![
                "straggler: rank 1 (node2, cpu) compute 2.0x the median of the other ranks for \
                 80 steps (since step 10); in epochs 1, 2"
                    .to_string()
            ]
        );
    }

    #[test]
    fn verdict_names_what_limited_the_steps() {
        assert_eq!(verdict(&[row(0.0, 0.0, 0.0, 0.0, 0.0)]), None);
        let v = verdict(&[row(10.0, 5.0, 6.0, 3.0, 2.0)]).expect("verdict");
        assert_eq!(v.bound, Bound::Input);
        assert!((v.data_wait - 0.6).abs() < 1e-12);
        assert!(
            v.line()
                .starts_with("input-bound: data wait 50% (slowest rank 60%), compute 30%"),
            "{}",
            v.line()
        );
        assert!(v.line().contains("--loader-threads"));
        // One slow rank is enough: the others wait for it in the all-reduce.
        let v = verdict(&[row(10.0, 1.5, 3.0, 4.0, 4.5)]).expect("verdict");
        assert_eq!(v.bound, Bound::Input);
        let v = verdict(&[row(10.0, 0.5, 1.0, 7.0, 2.5)]).expect("verdict");
        assert_eq!(v.bound, Bound::Compute);
        assert!(v.line().starts_with("compute-bound"), "{}", v.line());
        // Summed over epochs, weighted by their time.
        let v = verdict(&[row(10.0, 0.5, 1.0, 3.0, 6.0), row(0.0, 0.0, 0.0, 0.0, 0.0)])
            .expect("verdict");
        assert_eq!(v.bound, Bound::Communication);
        assert!(v.line().contains("--bucket-cap-mb"));
        assert_eq!(v.slowest, None);
        // The host that was slowest in the most epochs is named.
        let slow = |rank: usize, host: &str| {
            let mut m = row(10.0, 0.5, 1.0, 7.0, 2.5);
            m.slowest = Some(Slowest {
                rank,
                host: host.into(),
                data_wait_share: 0.05,
                compute_share: 0.9,
            });
            m
        };
        let v = verdict(&[slow(3, "node2"), slow(1, "node1"), slow(3, "node2")]).expect("verdict");
        assert!(
            v.line()
                .contains("; slowest host node2 (rank 3: data wait 5%, compute 90%); the device"),
            "{}",
            v.line()
        );
    }

    #[test]
    fn an_oversubscribed_cpu_is_the_verdict_with_its_fix() {
        let cpu = |ranks, threads, busy| CpuUse {
            cores: 2,
            ranks,
            threads,
            busy_cores: busy,
            load_average: None,
        };
        assert_eq!(cpu(2, 1, Some(0.4)).warning(), None);
        assert_eq!(cpu(1, 1, Some(1.0)).warning(), None);
        assert_eq!(
            cpu(2, 1, Some(1.2)).warning().as_deref(),
            Some(
                "CPU oversubscribed: other processes kept 1.2 of the 2 cores busy as the ranks \
                 started; the ranks' threads wait for one another's cores: use --threads 1 or \
                 fewer --procs-per-node"
            )
        );
        assert_eq!(
            cpu(2, 4, None).warning().as_deref(),
            Some(
                "CPU oversubscribed: 2 rank(s) × 4 intra-op thread(s) = 8 > 2 cores; the ranks' \
                 threads wait for one another's cores: use --threads 1 or fewer --procs-per-node"
            )
        );
        let busy = cpu(1, 2, Some(5.3));
        assert!(busy.oversubscribed());
        let mut rows = vec![row(10.0, 0.5, 0.5, 9.0, 0.5), row(10.0, 0.5, 0.5, 9.0, 0.5)];
        assert!(verdict(&rows)
            .expect("verdict")
            .line()
            .starts_with("compute-bound"));
        rows[1].cpu_oversubscribed = Some(busy);
        let back: EpochMetrics =
            serde_json::from_str(&serde_json::to_string(&rows[1]).expect("json")).expect("row");
        assert_eq!(back, rows[1]);
        assert_eq!(
            verdict(&rows).expect("verdict").line(),
            "compute-bound: data wait 5% (slowest rank 5%), compute 90%, communication 5% of \
             the step time; CPU oversubscribed: other processes kept 5.3 of the 2 cores busy \
             as the ranks started; the ranks' threads wait for one another's cores: use \
             --threads 1 or fewer --procs-per-node"
        );
        let mut slow = vec![row(10.0, 5.0, 6.0, 3.0, 2.0)];
        slow[0].cpu_oversubscribed = Some(cpu(2, 4, None));
        let line = verdict(&slow).expect("verdict").line();
        assert!(
            line.starts_with("input-bound: ")
                && line.contains("--loader-threads")
                && line.ends_with("use --threads 1 or fewer --procs-per-node"),
            "{line}"
        );
    }
}
