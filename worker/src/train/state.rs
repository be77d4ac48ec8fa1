//! The trainer's plain data: the `Plan` of steps and LR fixed at setup, the run's `State` that
//! changes step by step, and the `Epoch` in progress (its sums and timers). A leaf: it knows no
//! model and no `Trainer`, so the step window, the live view and the EMA take an `&mut Epoch`
//! rather than the trainer.
use super::validate::BadImages;
use crate::comm::ddp::Accumulation;
use std::collections::BTreeMap;
use std::time::Instant;
use tch::Tensor;
use tchrun::flags::LrScaling;
use tchrun::metrics::EpochMetrics;
use tchrun::schedule::{EarlyStopping, LrSchedule};
use tchrun_data::GlobalCut;

/// The steps and the LR of the run: the global-batch cut, steps per epoch, the schedule.
pub(super) struct Plan {
    /// `--global-batch-size`: each rank's micro-batches per optimizer step, and the epoch's cut.
    pub(super) cut: Option<GlobalCut>,
    pub(super) micro_batches: usize,
    pub(super) steps_per_epoch: u64,
    pub(super) schedule: LrSchedule,
    pub(super) scaling: LrScaling,
    /// What scaled `--lr`, in words ("world size 2", ...), for the divergence error.
    pub(super) lr_why: String,
    pub(super) factor_text: String,
    /// The batch `--lr` is given for (`schedule::lr_reference_batch`).
    pub(super) reference: u32,
}

/// The training state that changes step by step (what a checkpoint records, and this run's
/// counters).
pub(super) struct State {
    /// The epoch the loop starts at (0-based), and the batches of it already done (a resume).
    pub(super) epoch: u32,
    pub(super) skip_batches: u64,
    /// A resumed epoch's loss sum, samples and seconds before the stop.
    pub(super) partial: (f64, f64, f64),
    pub(super) step: u64,
    pub(super) stopping: EarlyStopping,
    pub(super) history: Vec<EpochMetrics>,
    /// Rank 0 only: the best epoch's weights (on the CPU).
    pub(super) best_weights: Option<BTreeMap<String, Tensor>>,
    /// The LR of the last update.
    pub(super) lr: f64,
    pub(super) run_start: Instant,
    pub(super) run_first_step: u64,
    pub(super) compute_s: f64,
    pub(super) comm_s: f64,
    pub(super) images: f64,
    pub(super) bad_images: BadImages,
    pub(super) warned_single: bool,
    /// Images skipped while decoding in this epoch.
    pub(super) epoch_skipped: u64,
}

/// One epoch in progress on this rank.
pub(super) struct Epoch {
    pub(super) index: u32,
    pub(super) started: Instant,
    /// This epoch's time split: waiting for the loader, compute, communication.
    pub(super) wait_s: f64,
    pub(super) compute_s: f64,
    pub(super) comm_s: f64,
    pub(super) loss_sum: f64,
    pub(super) seen: f64,
    /// Seconds of this epoch before a resume.
    pub(super) prior_s: f64,
    pub(super) t_print: Instant,
    pub(super) seen_print: f64,
    /// Optimizer steps done in this run of the epoch.
    pub(super) steps: u64,
    /// `--global-batch-size`: the micro-batch of the step, the step's earlier micro-batches,
    /// and their compute time.
    pub(super) micro: usize,
    pub(super) acc: Option<Accumulation>,
    pub(super) micro_compute: f64,
    /// Steps the fp16 loss scaler skipped (gradients overflowed), as the window's reads saw.
    pub(super) overflowed: usize,
}
