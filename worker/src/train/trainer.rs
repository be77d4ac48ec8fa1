//! The `Trainer`: what `setup` built (model, optimizer, replicas, the plan of steps and LR,
//! TensorBoard and checkpoint writers, the fault plan) and the `State` that changes as it
//! trains (step, epoch position, early stopping, history, timers, skipped images). The loop is
//! `run` → `run_epoch` (→ `micro_batch` / `step` / `after_step` per batch) → `end_epoch`, then
//! `finish` writes the model. A new training flag touches `setup` and the one method it
//! changes.
use super::board::Board;
use super::ema::saved_state;
use super::scaler::LossScaler;
use super::state::{Epoch, Plan, State};
use super::step::{accumulate_micro_batch, train_step, Guard, StepModel, Update};
use super::window::{NonFinite, Read};
use super::{to_input, RankCtx, TrainError};
use crate::comm::ddp::Replicator;
use crate::train::checkpoint;
use crate::train::optim::Optimizer;
use std::time::{Duration, Instant};
use tch::{nn, Device, Tensor};
use tchrun::flags::TrainJob;
use tchrun::job_record::heartbeat::Phase;
use tchrun::job_record::status::JobState;
use tchrun::model::ModelConfig;
use tchrun_data::{self as data, Augment, ImageFolder, LoaderConfig, TrainAugment};
use tchrun_faults::FaultPlan;

/// A model that trains, and everything it trains with.
pub(super) struct Trainer<'a> {
    pub(super) job: &'a TrainJob,
    pub(super) ctx: &'a RankCtx<'a>,
    pub(super) cfg: ModelConfig,
    pub(super) train: ImageFolder,
    pub(super) valid: ImageFolder,
    pub(super) rank: usize,
    pub(super) world: usize,
    pub(super) device: Device,
    pub(super) amp: bool,
    /// `--freeze-backbone`: batch norm in inference mode, the head alone trains.
    pub(super) frozen: bool,
    /// The variables `net` and `named` live in.
    pub(super) _vs: nn::VarStore,
    pub(super) net: Box<dyn nn::ModuleT>,
    pub(super) named: Vec<(String, Tensor)>,
    pub(super) replicas: Replicator,
    pub(super) opt: Optimizer,
    pub(super) plan: Plan,
    pub(super) initial_weights: Option<tchrun::model::InitialWeights>,
    pub(super) faults: FaultPlan,
    pub(super) run_record: checkpoint::RunRecord,
    /// `--class-weights`, on the device (the loss's `weight`).
    pub(super) class_weights: Option<Tensor>,
    pub(super) threads: usize,
    /// Images the pre-flight left out (`--skip-bad-images`): they count in every epoch.
    pub(super) preflight_skipped: u64,
    /// One image would give the last batch-norm layer one value per channel.
    pub(super) single_image_poisons_bn: bool,
    /// The input batches in channels-last (`--channels-last`, decided in setup).
    pub(super) channels_last: bool,
    pub(super) writer: checkpoint::Writer,
    pub(super) board: Board,
    pub(super) scaler: LossScaler,
    pub(super) guard: Guard,
    /// The steps' stats and guard totals on the device, read at the print frequency.
    pub(super) window: super::window::StepWindow,
    /// The windows of steps: stragglers and rank 0's `status.json`.
    pub(super) live: super::live::Live,
    /// `--model-ema`'s average (every rank keeps one).
    pub(super) ema: Option<super::ema::Ema>,
    pub(super) s: State,
}

impl<'a> Trainer<'a> {
    /// Trains to the last epoch (or early stopping), then writes the model (rank 0).
    pub(super) fn run(mut self) -> Result<(), TrainError> {
        crate::rank::signals::set_graceful(true);
        crate::heartbeat::step(self.s.step);
        crate::status::publish(|st| st.state = JobState::Training);
        for epoch in self.s.epoch..self.job.params.epochs {
            let e = self.run_epoch(epoch)?;
            if self.end_epoch(e)? {
                break;
            }
        }
        // A stop request from here on waits for the model: the training steps are done, and
        // what is left (the replica check, rank 0's writes) is bounded. Exiting now would lose
        // the run.
        self.finish()
    }

    /// The state for a checkpoint at `epoch` (0-based, the next to run) after `batches_done`.
    pub(super) fn meta(
        &self,
        epoch: u32,
        batches_done: u64,
        partial: (f64, f64, f64),
        finished: bool,
    ) -> checkpoint::Meta {
        let s = &self.s;
        // One read of the scaler on the host.
        let loss_scaler = self.scaler.state();
        checkpoint::Meta {
            format_version: checkpoint::FORMAT_VERSION,
            epoch,
            batches_done,
            step: s.step,
            world_size: self.world,
            seed: self.job.params.seed,
            best_loss: s.stopping.best.map(|b| b.0),
            best_epoch: s.stopping.best.map(|b| b.1),
            since_best: s.stopping.since_best,
            history: s.history.clone(),
            partial,
            loss_scale: loss_scaler.map_or(1.0, |l| l.scale),
            loss_scaler,
            finished,
            global_batch_size: self.job.options.global_batch_size,
            tensors: String::new(),
            best_tensors: None,
            run: Some(self.run_record.clone()),
            written: None,
        }
    }

    /// One epoch's batches through the loader; returns the epoch's counts for `end_epoch`.
    fn run_epoch(&mut self, epoch: u32) -> Result<Epoch, TrainError> {
        let job = self.job;
        let p = &job.params;
        let cut = self.plan.cut;
        let order = data::Sampling::of(&job.options.recipe).order(
            self.train.samples.len(),
            p.seed,
            epoch as u64,
        );
        let mut indices = match cut {
            Some(c) => c.indices_of(&order),
            None => data::shard_order(&order, self.rank, self.world),
        };
        let first_position =
            (self.s.skip_batches as usize * self.plan.micro_batches * p.batch_size as usize)
                .min(indices.len());
        indices.drain(..first_position);
        let started = Instant::now();
        let mut loader = data::load_batches(
            &self.train,
            indices,
            LoaderConfig {
                size: job.options.augment.crops(self.cfg.input_size).train as usize,
                batch_size: p.batch_size as usize,
                threads: self.threads,
                prefetch: 4,
                augment: Augment::Train(TrainAugment {
                    min_scale: job.options.min_crop_scale,
                    hflip: !job.options.no_hflip,
                    interpolation: job.options.augment.interpolation,
                    random_erase: job.options.augment.random_erase,
                    auto_augment: data::auto_augment::Policy::from_flags(&job.options.augment),
                    transforms: job.options.augment.transforms,
                }),
                norm: self.cfg.normalization,
                seed: p.seed,
                epoch: epoch as u64,
                rank: self.rank,
                first_position,
                skip_bad: job.options.skip_bad_images,
                max_pixels: job.options.max_image_pixels,
                global: cut,
            },
        );
        self.live.begin_epoch();
        let (loss_sum, seen, prior_s) = self.s.partial;
        self.s.partial = (0.0, 0.0, 0.0);
        let mut e = Epoch {
            index: epoch,
            started,
            wait_s: 0.0,
            compute_s: 0.0,
            comm_s: 0.0,
            loss_sum,
            seen,
            prior_s,
            t_print: Instant::now(),
            seen_print: 0.0,
            steps: 0,
            micro: 0,
            acc: None,
            micro_compute: 0.0,
            overflowed: 0,
        };
        loop {
            // The time until the next batch is there: the loader's share of the step.
            let t_wait = Instant::now();
            crate::heartbeat::phase(Phase::Loading);
            let next = loader.next();
            e.wait_s += t_wait.elapsed().as_secs_f64();
            let Some(batch) = next else {
                if e.micro != 0 {
                    return Err(TrainError::Invalid(format!(
                        "epoch {} ended after micro-batch {} of {} of a step",
                        epoch + 1,
                        e.micro,
                        self.plan.micro_batches
                    )));
                }
                return Ok(e);
            };
            // With --skip-bad-images an image that fails only while decoding is dropped alone:
            // the batch goes on with the others (the reduction is exact for uneven batches).
            let batch = batch.map_err(TrainError::Data)?;
            self.s.epoch_skipped += self.s.bad_images.note(&batch.skipped);
            self.batch(&mut e, &batch)?;
        }
    }

    /// One batch: the start of an optimizer step (faults due, gradients zeroed), then either a
    /// micro-batch of `--global-batch-size` or the step's last batch (`step`).
    fn batch(&mut self, e: &mut Epoch, batch: &data::Batch) -> Result<(), TrainError> {
        if e.micro == 0 {
            if let Some(kill) = self.faults.kill_before(self.s.step, self.s.run_first_step) {
                tracing::warn!("{}", kill.line());
                let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGKILL);
            }
            if let Some(d) = self.faults.stall_before(self.s.step) {
                crate::heartbeat::phase(Phase::Forward);
                tracing::warn!(
                    "TCHRUN_TEST_STALL_AT_STEP: spinning for {d:?} before step {}",
                    self.s.step
                );
                tchrun_faults::spin_for(d);
            }
            if let Some(mib) = self.faults.allocate_before(self.s.step) {
                tracing::warn!(
                    "TCHRUN_TEST_ALLOCATE_AT_STEP: allocating {mib} MiB before step {}",
                    self.s.step
                );
                touch_memory(mib);
            }
            let t = Instant::now();
            if let Some(d) = self.faults.slow_step {
                // TCHRUN_TEST_SLOW_STEP: a slow device, inside the step's compute.
                std::thread::sleep(d);
            }
            self.opt.zero_grad()?;
            e.micro_compute = t.elapsed().as_secs_f64();
            e.acc = self.plan.cut.map(|_| {
                self.replicas
                    .start_accumulation(self.plan.micro_batches, self.world)
            });
        }
        let mut n_local = batch.len;
        if n_local == 1 && self.single_image_poisons_bn {
            // One image would give the last batch-norm layer one value per channel: its
            // running variance becomes NaN (torch raises in Python; libtorch does not).
            // The image sits out this step (the others' samples still train).
            if !self.s.warned_single {
                tracing::warn!(
                    "a batch of 1 image on this rank ({} at input size {} ends in a 1x1 feature \
                     map): left out of its step, as batch norm needs more than one value per \
                     channel; said once",
                    self.cfg.arch.name(),
                    self.cfg.input_size
                );
                self.s.warned_single = true;
            }
            n_local = 0;
        }
        let mut input = (n_local > 0).then(|| to_input(batch, self.device, self.channels_last));
        if self.faults.nan_at_step == Some(self.s.step) {
            // TCHRUN_TEST_NAN_AT_STEP: this step's input is NaN (its loss and update too).
            input = input.map(|(x, y)| (x * f64::NAN, y));
        }
        // --mixup-alpha/--cutmix-alpha: the micro-batch mixed with itself rolled by one, drawn
        // by its global position (the same micro-batch at any world size, and on a resume).
        let micro_batch =
            (self.s.skip_batches + e.steps) as usize * self.plan.micro_batches + e.micro;
        let input = input.map(|(x, y)| self.mix(e.index, micro_batch, x, y));
        // Dropout and stochastic depth draw by the micro-batch's global position too.
        self.seed_random_layers(e.index, micro_batch);
        let input = input.as_ref().map(|(x, y)| (x, y));
        if e.micro + 1 < self.plan.micro_batches {
            // Not the step's last micro-batch: forward and backward, no communication.
            let t = Instant::now();
            if let Some(a) = e.acc.as_mut() {
                let model = StepModel {
                    net: self.net.as_ref(),
                    train: !self.frozen,
                    amp: self.amp,
                    device: self.device,
                    label_smoothing: self.job.options.recipe.label_smoothing,
                    class_weights: self.class_weights.as_ref(),
                };
                accumulate_micro_batch(&model, input, &self.replicas, a, &self.scaler)?;
            }
            e.micro_compute += t.elapsed().as_secs_f64();
            self.s.images += n_local as f64;
            e.micro += 1;
            return Ok(());
        }
        e.micro = 0;
        let it = self.s.skip_batches + e.steps;
        e.steps += 1;
        let t0 = Instant::now();
        let (backward_done, reduced) = self.step(e, input)?;
        let t3 = Instant::now();
        // Communication: the all-reduce time backward did not hide.
        e.comm_s += (reduced - backward_done).as_secs_f64();
        e.compute_s +=
            e.micro_compute + (backward_done - t0).as_secs_f64() + (t3 - reduced).as_secs_f64();
        self.s.images += n_local as f64;
        self.s.step += 1;
        crate::heartbeat::step(self.s.step);
        if let Some(ema) = self.ema.as_mut() {
            ema.after_step(e.index, it, &self.named);
        }
        self.after_step(e, it)
    }

    /// The optimizer step on the step's last batch: forward, backward with the bucketed
    /// all-reduce (and the stop vote), the update, and the step's row in the window (its stats
    /// and the divergence guard's total, on the device). Returns when backward ended and when
    /// the reduction had.
    fn step(
        &mut self,
        e: &mut Epoch,
        input: Option<(&Tensor, &Tensor)>,
    ) -> Result<(Instant, Instant), TrainError> {
        let job = self.job;
        let (epoch, step) = (e.index, self.s.step);
        let stop_vote = crate::rank::signals::requested() != 0;
        // The LR of this step's update; a non-finite loss names the previous one.
        let next_lr = self.plan.schedule.lr(step);
        let model = StepModel {
            net: self.net.as_ref(),
            train: !self.frozen,
            amp: self.amp,
            device: self.device,
            label_smoothing: job.options.recipe.label_smoothing,
            class_weights: self.class_weights.as_ref(),
        };
        let done = train_step(
            &model,
            input,
            stop_vote,
            Some((self.ctx.pg, &self.replicas)),
            Some(Update {
                opt: &mut self.opt,
                scaler: &mut self.scaler,
                lr: next_lr,
                clip: job.options.recipe.clip_grad_norm,
            }),
            e.acc.take(),
        )?;
        let stats = done
            .stats
            .ok_or_else(|| TrainError::Invalid("a step without its reduction".into()))?;
        let row = super::window::RowInfo {
            step,
            epoch: epoch + 1,
            lr_before: self.s.lr,
            lr_after: next_lr,
        };
        self.s.lr = next_lr;
        let total = if done.updated {
            if step == 0 {
                tracing::info!("first optimizer step done");
            }
            self.guard.total(step)
        } else {
            None
        };
        let flags = self.scaler.flags().filter(|_| done.scaler_checked);
        self.window.push(&stats, total.as_ref(), flags, row);
        Ok((done.backward_done, done.reduced))
    }

    /// After a step: progress line and TensorBoard (every `--print-freq`), a failed background
    /// checkpoint, `--checkpoint-every`, and a stop every rank voted for.
    fn after_step(&mut self, e: &mut Epoch, it: u64) -> Result<(), TrainError> {
        let job = self.job;
        let p = &job.params;
        let steps_per_epoch = self.plan.steps_per_epoch;
        let step = self.s.step;
        if self.rank == 0 {
            // A background checkpoint write that failed ends the job now, in words (a full
            // disk), not when the next checkpoint is due.
            self.writer.poll().map_err(TrainError::Checkpoint)?;
        }
        // The epoch's first step too (as torchvision prints iteration 0): the first line comes
        // when training has started, not `--print-freq` steps later.
        let print =
            e.steps == 1 || (it + 1) % p.print_freq as u64 == 0 || it + 1 == steps_per_epoch;
        let every = self.job.options.checkpoint_every;
        let checkpoint_due = every > 0 && step % every == 0 && it + 1 < steps_per_epoch;
        // The same steps on every rank: each reads the same rows, sees a stop vote in the same
        // step, and nothing is written before its values were read.
        if !(print || checkpoint_due || self.window.is_full()) {
            return Ok(());
        }
        let t = Instant::now();
        let read = self.read_window(e)?;
        // On CUDA the read is where the host waits for the device's compute.
        e.compute_s += t.elapsed().as_secs_f64();
        if print {
            // The window's all-gather (and rank 0's writes, which the others wait for in it):
            // communication, so that the time split adds up to the loop's time.
            let t = Instant::now();
            self.progress(e, it, read.last_loss)?;
            e.comm_s += t.elapsed().as_secs_f64();
        }
        // The state after this step, mid-epoch (a stop's checkpoint, or `--checkpoint-every`'s).
        let partial = (
            e.loss_sum,
            e.seen,
            e.prior_s + e.started.elapsed().as_secs_f64(),
        );
        if self.rank == 0 && checkpoint_due && !read.stop {
            // `--checkpoint-every`: in the background, resumable exactly like a stop's.
            let meta = self.meta(e.index, it + 1, partial, false);
            self.writer
                .save(
                    &self.job.output,
                    &meta,
                    &self.named,
                    &saved_state(self.opt.state(), self.ema.as_ref()),
                    None,
                )
                .map_err(TrainError::Checkpoint)?;
        }
        if !read.stop {
            return Ok(());
        }
        // Every rank read the vote in the same rows at this step: stop together.
        let sig = crate::rank::signals::requested();
        crate::status::publish(|st| st.state = JobState::Stopping);
        if self.rank == 0 {
            let meta = self.meta(e.index, it + 1, partial, false);
            // The stop checkpoint is written now (the ranks wait at the barrier): after the one
            // in flight, so the newest state lands last.
            crate::heartbeat::phase(Phase::Checkpoint);
            self.writer.wait().map_err(TrainError::Checkpoint)?;
            checkpoint::save(
                &self.job.output,
                &meta,
                &self.named,
                &saved_state(self.opt.state(), self.ema.as_ref()),
                None,
            )
            .map_err(TrainError::Checkpoint)?;
            (self.ctx.say)(&format!(
                "stopped at epoch {} batch {} (step {step}); checkpoint written to {}; continue with --resume",
                e.index + 1,
                it + 1,
                checkpoint::dir(&self.job.output).display()
            ));
        }
        self.ctx.pg.barrier()?;
        Err(TrainError::Stopped(if sig != 0 {
            sig
        } else {
            signal_hook::consts::SIGTERM
        }))
    }

    /// The progress line (images/s since the last one, ETA of the steps left at this run's
    /// pace; validation not included), rank 0's TensorBoard scalars, and the window's end
    /// (`live.rs`: stragglers, `status.json`; a collective every rank reaches here).
    fn progress(&mut self, e: &mut Epoch, it: u64, loss: f64) -> Result<(), TrainError> {
        let job = self.job;
        let p = &job.params;
        let step = self.s.step;
        let ips = e.seen_print / e.t_print.elapsed().as_secs_f64().max(1e-9);
        let done_here = (step - self.s.run_first_step).max(1) as f64;
        let left = self.plan.schedule.total_steps.saturating_sub(step) as f64;
        let per_step = self.s.run_start.elapsed().as_secs_f64() / done_here;
        let eta = Duration::from_secs((per_step * left) as u64);
        let line = tchrun::driver_log::Progress {
            epoch: e.index + 1,
            epochs: p.epochs,
            iter: it + 1,
            iters: self.plan.steps_per_epoch,
            loss,
            lr: self.s.lr,
            images_per_s: ips,
            eta,
        }
        .write();
        (self.ctx.say)(&line);
        self.board
            .step(self.rank == 0, step, loss, self.s.lr, ips, self.ctx.say);
        e.t_print = Instant::now();
        e.seen_print = 0.0;
        let end = super::live::WindowEnd {
            step,
            epoch: e.index + 1,
            epoch_step: it + 1,
            images_per_s: ips,
            loss,
            lr: self.s.lr,
            eta_epoch_s: per_step * self.plan.steps_per_epoch.saturating_sub(it + 1) as f64,
            eta_job_s: per_step * left,
        };
        self.live
            .window(self.ctx.pg, e, end, &mut self.board, self.ctx.say)
    }

    /// Reads the window into the epoch's sums. A non-finite row ends training with the step
    /// named (every rank reads the same rows, so every rank ends in the same step).
    pub(super) fn read_window(&mut self, e: &mut Epoch) -> Result<Read, TrainError> {
        let (bad, at, rows) = match self.window.read_into(e) {
            Ok(r) => return Ok(r),
            Err(bad) => bad,
        };
        let (what, value, effective_lr) = match bad {
            NonFinite::Loss { value, .. } => ("the loss".to_string(), value, at.lr_before),
            NonFinite::Weights { row } => {
                // The failing step's gradients are still held when it was the last row (and
                // they are unscaled: no fp16 scaling).
                let grads = (row + 1 == rows && !self.scaler.enabled()).then(|| self.opt.params());
                let (what, value) = self.guard.culprit(grads);
                (what, value, at.lr_after)
            }
        };
        let (epoch, step, lr) = (at.epoch, at.step, self.job.params.lr);
        let scaled_by = self.plan.lr_why.clone();
        Err(TrainError::Diverged {
            what,
            value,
            epoch,
            step,
            effective_lr,
            lr,
            scaled_by,
        })
    }
}

/// `TCHRUN_TEST_ALLOCATE_AT_STEP`: allocates and writes `mib` MiB, 16 MiB every 20 ms (slowly
/// enough for the memory record to see it grow), and keeps it.
fn touch_memory(mib: u64) {
    const CHUNK: u64 = 16;
    let mut held: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib.div_ceil(CHUNK) {
        held.push(vec![1u8; (CHUNK * 1024 * 1024) as usize]);
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::mem::forget(held);
}
