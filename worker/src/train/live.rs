//! A run seen while it trains: every window of `--print-freq` steps the ranks' time split is
//! gathered (one all-gather of six numbers a rank), every rank runs the same straggler rule on
//! it (`crate::straggler`), and rank 0 names the stragglers (console, driver log, TensorBoard,
//! `metrics.jsonl`) and publishes the window into `status.json` (`crate::status`). The epoch's
//! slowest rank and host go into its metrics row.
use super::board::Board;
use super::state::Epoch;
use super::{RankCtx, TrainError};
use crate::comm::pg::ProcessGroup;
use crate::straggler::{Detector, Finding, Sample};
use std::time::Instant;
use tch::{Device, Tensor};
use tchrun::job_record::status::{
    JobState, JobStatus, RankStatus, Shares, SlowKind, Straggler, WindowMark,
};
use tchrun::metrics::Slowest;

/// The numbers each rank adds to the gather: a `Sample`'s five, then its resident memory.
const GATHERED: usize = 6;

/// The epoch's counters when the window began.
#[derive(Debug, Clone, Copy)]
struct Mark {
    wait_s: f64,
    compute_s: f64,
    comm_s: f64,
    steps: u64,
    at: Instant,
}

/// What the trainer tells a window besides its counters.
pub(super) struct WindowEnd {
    pub step: u64,
    pub epoch: u32,
    pub epoch_step: u64,
    pub images_per_s: f64,
    /// The window's reduced training loss and the last step's LR.
    pub loss: f64,
    pub lr: f64,
    pub eta_epoch_s: f64,
    pub eta_job_s: f64,
}

/// The live view of the run (see the module documentation).
pub(super) struct Live {
    /// Off (`TCHRUN_LIVE_STATUS=0`, the same on every rank): no window, no status file.
    on: bool,
    rank: usize,
    detector: Detector,
    mark: Mark,
    /// Windows observed in this run and in this epoch (the run's first and each epoch's first
    /// are warm-up, the loader starting: not judged).
    windows: u64,
    epoch_windows: u64,
    /// This rank writes its host's `.prom` file (`crate::status::start_host`).
    host_file: bool,
    /// Every rank's host and device (rank 0 and a host's file writer; others keep their own).
    places: Vec<(String, String)>,
    /// The stragglers named now, and this epoch's (each rank and kind's last finding).
    now: Vec<Straggler>,
    epoch: Vec<Straggler>,
    /// Per rank, this epoch's (data wait, compute, wall) seconds.
    sums: Vec<[f64; 3]>,
}

impl Live {
    /// Learns every rank's place through the store (rank 0) and starts rank 0's status file.
    pub(super) fn start(
        ctx: &RankCtx,
        first: JobStatus,
        output: &std::path::Path,
        textfile: Option<tchrun_prometheus::Textfile>,
    ) -> Live {
        let (rank, world) = (ctx.pg.rank(), ctx.pg.size());
        let on = std::env::var(tchrun::env::TCHRUN_LIVE_STATUS).map_or(true, |v| v.trim() != "0");
        let device = crate::comm::pg::device_name(ctx.device);
        let key = |r: usize| format!("tchrun/live/place/{r}");
        let mut places = vec![(ctx.host.to_string(), device.clone()); world];
        if let Err(e) = ctx
            .store
            .set(&key(rank), format!("{}\t{device}", ctx.host).as_bytes())
        {
            tracing::warn!("cannot publish this rank's place for status.json: {e}");
        }
        // The local rank 0 of a host other than rank 0's writes that host's file.
        let host_writer = rank != 0 && ctx.local_rank == 0 && textfile.is_some();
        if (rank == 0 || host_writer) && on {
            for (r, place) in places.iter_mut().enumerate().filter(|(r, _)| *r != rank) {
                match ctx.store.get(&key(r)) {
                    Ok(v) => {
                        let text = String::from_utf8_lossy(&v).to_string();
                        if let Some((h, d)) = text.split_once('\t') {
                            *place = (h.to_string(), d.to_string());
                        }
                    }
                    Err(e) => tracing::warn!("rank {r}'s place for status.json: {e}"),
                }
            }
            let mut first = first;
            first.ranks = places
                .iter()
                .enumerate()
                .map(|(r, (host, device))| RankStatus {
                    rank: r,
                    host: host.clone(),
                    device: device.clone(),
                    phase: None,
                    step: first.step,
                    idle_s: None,
                    shares: None,
                    rss_bytes: None,
                    gpu_bytes: None,
                })
                .collect();
            let textfile = textfile.filter(|t| match tchrun_prometheus::check_dir(&t.dir) {
                Ok(()) => true,
                Err(e) => {
                    tracing::warn!("{e} (no Prometheus metrics from this job)");
                    (ctx.say)(&format!(
                        "warning: {e} (no Prometheus metrics from this job)"
                    ));
                    false
                }
            });
            match textfile {
                Some(t) if rank != 0 && places[0].0 != ctx.host => crate::status::start_host(
                    ctx.log_dir.to_path_buf(),
                    first,
                    t.for_host(ctx.host),
                ),
                _ if rank != 0 => {}
                t => {
                    crate::status::start(ctx.log_dir.to_path_buf(), output.to_path_buf(), first, t)
                }
            }
        }
        let host_file = rank != 0 && on && crate::status::running();
        Live {
            on,
            rank,
            detector: Detector::new(),
            mark: Mark {
                wait_s: 0.0,
                compute_s: 0.0,
                comm_s: 0.0,
                steps: 0,
                at: Instant::now(),
            },
            windows: 0,
            epoch_windows: 0,
            host_file,
            places,
            now: Vec::new(),
            epoch: Vec::new(),
            sums: vec![[0.0; 3]; world],
        }
    }

    /// A new epoch: its counters start at zero now.
    pub(super) fn begin_epoch(&mut self) {
        self.epoch_windows = 0;
        self.mark = Mark {
            wait_s: 0.0,
            compute_s: 0.0,
            comm_s: 0.0,
            steps: 0,
            at: Instant::now(),
        };
    }

    /// The window that ends now (every rank, at the same step): gathered, judged, published.
    pub(super) fn window(
        &mut self,
        pg: &ProcessGroup,
        e: &Epoch,
        end: WindowEnd,
        board: &mut Board,
        say: &dyn Fn(&str),
    ) -> Result<(), TrainError> {
        if !self.on {
            return Ok(());
        }
        let own = Sample {
            wait_s: e.wait_s - self.mark.wait_s,
            compute_s: e.compute_s - self.mark.compute_s,
            comm_s: e.comm_s - self.mark.comm_s,
            wall_s: self.mark.at.elapsed().as_secs_f64(),
            steps: e.steps - self.mark.steps,
        };
        self.mark = Mark {
            wait_s: e.wait_s,
            compute_s: e.compute_s,
            comm_s: e.comm_s,
            steps: e.steps,
            at: Instant::now(),
        };
        let rss = tchrun::memory::rss_bytes().map(|(rss, _)| rss).unwrap_or(0);
        let gathered = gather(pg, own, rss)?;
        let samples: Vec<Sample> = gathered.iter().map(|(s, _)| *s).collect();
        if tracing::enabled!(tracing::Level::DEBUG) {
            let per_rank: Vec<String> = samples
                .iter()
                .map(|s| {
                    let (w, c, m) = s.shares();
                    format!(
                        "{:.3}s/step {:.0}/{:.0}/{:.0}%",
                        s.compute_s / s.steps.max(1) as f64,
                        100.0 * w,
                        100.0 * c,
                        100.0 * m
                    )
                })
                .collect();
            tracing::debug!(
                "window to step {}: compute per step, data wait/compute/comm shares by rank: {}",
                end.step,
                per_rank.join(", ")
            );
        }
        for (sum, s) in self.sums.iter_mut().zip(&samples) {
            sum[0] += s.wait_s;
            sum[1] += s.compute_s;
            sum[2] += s.wall_s;
        }
        self.windows += 1;
        self.epoch_windows += 1;
        if self.windows > 1 && self.epoch_windows > 1 {
            let findings = self.detector.observe(end.step, &samples);
            self.name(&findings, say);
        }
        if self.rank != 0 {
            if self.host_file {
                self.publish(&gathered, end);
            }
            return Ok(());
        }
        let mut scalars: Vec<(String, f64)> = vec![("stragglers/count".into(), 0.0)];
        for s in &self.now {
            scalars[0].1 += 1.0;
            scalars.push((
                format!("stragglers/rank_{}_{}", s.rank, kind_word(s.kind)),
                s.factor,
            ));
        }
        board.stragglers(end.step, &scalars, say);
        self.publish(&gathered, end);
        Ok(())
    }

    /// The findings named (rank 0: console and driver log, once a straggler; and when it is
    /// level again) and kept for the epoch's row.
    fn name(&mut self, findings: &[Finding], say: &dyn Fn(&str)) {
        let before = std::mem::take(&mut self.now);
        for f in findings {
            let (host, device) = self.places.get(f.rank).cloned().unwrap_or_default();
            let s = Straggler {
                rank: f.rank,
                host,
                device,
                kind: f.kind,
                factor: f.factor,
                value: f.value,
                median: f.median,
                steps: f.steps,
                since_step: f.since_step,
            };
            if f.new {
                if self.rank == 0 {
                    say(&s.line());
                } else if f.rank == self.rank {
                    tracing::info!("this rank is named a straggler: {}", s.line());
                }
            }
            self.epoch.retain(|x| (x.rank, x.kind) != (s.rank, s.kind));
            self.epoch.push(s.clone());
            self.now.push(s);
        }
        for old in before {
            let still = self
                .now
                .iter()
                .any(|s| (s.rank, s.kind) == (old.rank, old.kind));
            if !still && self.rank == 0 {
                say(&format!(
                    "straggler no more: rank {} ({}) is level with the other ranks again ({} \
                     after {} steps)",
                    old.rank,
                    old.host,
                    kind_word(old.kind).replace('_', " "),
                    old.steps
                ));
            }
        }
    }

    /// Rank 0 (and a host's file writer): the window into `status.json`.
    fn publish(&self, gathered: &[(Sample, u64)], end: WindowEnd) {
        let stragglers = self.now.clone();
        crate::status::publish(|st| {
            st.state = JobState::Training;
            st.epoch = end.epoch;
            st.step = end.step;
            st.epoch_step = end.epoch_step;
            st.images_per_s = Some(end.images_per_s);
            st.loss = Some(end.loss);
            st.lr = Some(end.lr);
            st.eta_epoch_s = Some(end.eta_epoch_s);
            st.eta_job_s = Some(end.eta_job_s);
            st.window = gathered.first().map(|(s, _)| WindowMark {
                end_step: end.step,
                steps: s.steps,
                seconds: s.wall_s,
            });
            for (row, (s, rss)) in st.ranks.iter_mut().zip(gathered) {
                let (data_wait, compute, comm) = s.shares();
                row.shares = Some(Shares {
                    data_wait,
                    compute,
                    comm,
                });
                row.rss_bytes = (*rss > 0).then_some(*rss);
            }
            st.stragglers = stragglers;
        });
    }

    /// The epoch's end: its stragglers and slowest rank for the metrics row, and the ranks that
    /// were slow in every window of it; a new epoch's count begins.
    pub(super) fn end_epoch(&mut self) -> (Vec<Straggler>, Option<Slowest>, Vec<usize>) {
        let slowest = (self.sums.len() > 1)
            .then(|| {
                self.sums
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s[2] > 0.0)
                    .max_by(|a, b| (a.1[0] + a.1[1]).total_cmp(&(b.1[0] + b.1[1])))
                    .map(|(r, s)| Slowest {
                        rank: r,
                        host: self.places.get(r).map(|p| p.0.clone()).unwrap_or_default(),
                        data_wait_share: s[0] / s[2],
                        compute_share: s[1] / s[2],
                    })
            })
            .flatten();
        self.sums.iter_mut().for_each(|s| *s = [0.0; 3]);
        let whole = self.detector.end_epoch();
        (std::mem::take(&mut self.epoch), slowest, whole)
    }

    /// Every rank's host (rank 0 knows them all; others only their own).
    pub(super) fn host_of(&self, rank: usize) -> &str {
        self.places.get(rank).map(|p| p.0.as_str()).unwrap_or("?")
    }
}

fn kind_word(k: SlowKind) -> &'static str {
    match k {
        SlowKind::Compute => "compute",
        SlowKind::DataWait => "data_wait",
    }
}

/// Every rank's window and resident memory, in rank order (one all-gather).
fn gather(pg: &ProcessGroup, own: Sample, rss: u64) -> Result<Vec<(Sample, u64)>, TrainError> {
    let mut values = own.values().to_vec();
    values.push(rss as f64);
    if pg.size() == 1 {
        return Ok(vec![(own, rss)]);
    }
    let t = Tensor::from_slice(&values).to_device(pg.device());
    let all = pg.all_gather(&t)?;
    all.iter()
        .map(|t| {
            let v = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
            let rss = v.get(GATHERED - 1).copied().unwrap_or(0.0).max(0.0) as u64;
            Ok((Sample::from_values(&v), rss))
        })
        .collect()
}
