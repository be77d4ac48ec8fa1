//! The end of an epoch (the time split, validation, metrics, early stopping, rank 0's
//! checkpoint) and of the run (replicas checked, the model directory written).
use super::ema::{best_snapshot, saved_state};
use super::state::Epoch;
use super::time_split;
use super::trainer::Trainer;
use super::validate::validate;
use super::TrainError;
use crate::models;
use crate::train::checkpoint;
use crate::train::outputs;
use tchrun::flags::StragglerAction;
use tchrun::job_record::heartbeat::Phase;
use tchrun::job_record::status::{JobEnd, JobState};
use tchrun::metrics::{EpochMetrics, SCHEMA_VERSION};
use tchrun::model::{ModelConfig, TrainingRecord};
use tchrun::recipe::EarlyStopOn;
use tchrun::schedule::Decision;

impl Trainer<'_> {
    /// The epoch's end: the time split reduced over the ranks, validation, the metrics line,
    /// early stopping, rank 0's checkpoint and metrics. True when training is done.
    pub(super) fn end_epoch(&mut self, mut e: Epoch) -> Result<bool, TrainError> {
        let job = self.job;
        let p = &job.params;
        let epoch = e.index;
        let loop_s = e.started.elapsed().as_secs_f64();
        self.s.comm_s += e.comm_s;
        self.s.compute_s += e.compute_s;
        let split = time_split(self.ctx.pg, [e.wait_s, e.compute_s, e.comm_s, loop_s])?;
        self.s.skip_batches = 0;
        // Normally read at the epoch's last step already (a progress line); nothing unread is
        // validated or written.
        self.read_window(&mut e)?;
        let train_time = e.prior_s + e.started.elapsed().as_secs_f64();
        crate::heartbeat::phase(Phase::Validation);
        crate::status::publish(|st| st.state = JobState::Validating);
        let v = validate(
            self.net.as_ref(),
            &self.valid,
            &self.cfg,
            self.job,
            self.ctx,
            &mut self.s.bad_images,
            // Images the pre-flight left out count in every epoch (once: rank 0 adds them).
            self.s.epoch_skipped
                + if self.rank == 0 {
                    self.preflight_skipped
                } else {
                    0
                },
        )?;
        let ev = self
            .ema
            .as_ref()
            .map(|e| {
                let bad = &mut self.s.bad_images;
                e.validate(&self.valid, &self.cfg, self.job, self.ctx, bad)
            })
            .transpose()?;
        self.s.epoch_skipped = 0;
        let (stragglers, slowest, whole) = self.live.end_epoch();
        if e.overflowed > 0 {
            (self.ctx.say)(&format!(
                "epoch {}: the fp16 loss scaler skipped {} step(s) whose gradients overflowed \
                 (each named in the driver log); the loss scale is now {}",
                epoch + 1,
                e.overflowed,
                self.scaler.scale()
            ));
        }
        if v.skipped > self.preflight_skipped {
            (self.ctx.say)(&format!(
                "epoch {}: {} image(s) failed to decode and were skipped (--skip-bad-images); named in the driver logs",
                epoch + 1,
                v.skipped - self.preflight_skipped
            ));
        }
        let m = EpochMetrics {
            schema: SCHEMA_VERSION,
            epoch: epoch + 1,
            train_loss: e.loss_sum / e.seen.max(1.0),
            train_images_per_sec: e.seen / train_time.max(1e-9),
            val_loss: v.loss,
            top1: v.top1,
            top5: v.top5,
            lr: self.s.lr,
            epoch_time_s: e.prior_s + e.started.elapsed().as_secs_f64(),
            time: tchrun::files::timestamp_now(),
            skipped_images: v.skipped,
            step_time_s: split.mean[3],
            data_wait_s: split.mean[0],
            compute_s: split.mean[1],
            comm_s: split.mean[2],
            data_wait_max_s: split.max[0],
            compute_max_s: split.max[1],
            comm_max_s: split.max[2],
            stragglers,
            slowest,
            cpu_oversubscribed: crate::rank::start::cpu_oversubscribed(),
            ranks: self.world as u32,
            ema_val_loss: ev.as_ref().map(|x| x.loss),
            ema_top1: ev.as_ref().map(|x| x.top1),
            ema_top5: ev.as_ref().map(|x| x.top5),
        };
        (self.ctx.say)(&epoch_line(&m, p.epochs));
        for r in &whole {
            (self.ctx.say)(&format!(
                "straggler: rank {r} ({}) was slower than the other ranks in every window of \
                 epoch {}",
                self.live.host_of(*r),
                m.epoch
            ));
        }
        let exclude = !whole.is_empty()
            && job.options.straggler_action == StragglerAction::Exclude
            && epoch + 1 < p.epochs;
        self.s.history.push(m.clone());
        // `--early-stop-on`: whose validation loss --patience watches and the best epoch follows.
        let on_ema = job.options.recipe.early_stop_on == EarlyStopOn::Ema;
        let watched = match &ev {
            Some(x) if on_ema => x.loss,
            _ => v.loss,
        };
        let decision = self.s.stopping.update(epoch + 1, watched);
        // Only rank 0 writes the model, so only it keeps the best weights (a resumed run's
        // best epoch may come from before the stop: rank 0 read its weights from the checkpoint).
        if decision == Decision::Improved && self.rank == 0 {
            self.s.best_weights = Some(best_snapshot(&self.named, self.ema.as_ref()));
        }
        if self.rank == 0 {
            let meta = self.meta(epoch + 1, 0, (0.0, 0.0, 0.0), false);
            let best = if decision == Decision::Improved {
                self.s.best_weights.as_ref()
            } else {
                None
            };
            self.writer
                .save(
                    &self.job.output,
                    &meta,
                    &self.named,
                    &saved_state(self.opt.state(), self.ema.as_ref()),
                    best,
                )
                .map_err(TrainError::Checkpoint)?;
            outputs::append_metrics(&self.job.output, &m).map_err(TrainError::Output)?;
            self.board.epoch(self.s.step, &m, self.ctx.say);
            self.ctx.tracking.epoch(&m, self.ctx.say);
        }
        if exclude && decision != Decision::Stop {
            return Err(self.leave_out(&whole, epoch + 1)?);
        }
        crate::status::publish(|st| st.state = JobState::Training);
        if decision == Decision::Stop {
            (self.ctx.say)(&format!(
                "early stopping after epoch {}: {} has not decreased for {} epoch(s) (--patience {}{})",
                epoch + 1,
                if on_ema {
                    "the EMA model's validation loss"
                } else {
                    "validation loss"
                },
                self.s.stopping.since_best,
                p.patience,
                if on_ema { ", --early-stop-on ema" } else { "" }
            ));
        }
        Ok(decision == Decision::Stop || epoch + 1 == p.epochs)
    }

    /// `--straggler-action exclude`, after epoch `epoch` (1-based) whose every window found
    /// the ranks `whole` slow: rank 0 waits for the epoch's checkpoint and names their hosts in
    /// `status.json` (`exclude_hosts`, which the launcher reads), then every rank stops with
    /// the same error (all decided from the same gathered numbers, in the same step).
    fn leave_out(&mut self, whole: &[usize], epoch: u32) -> Result<TrainError, TrainError> {
        crate::status::publish(|st| st.state = JobState::Stopping);
        let mut hosts: Vec<String> = whole
            .iter()
            .map(|r| self.live.host_of(*r).to_string())
            .collect();
        hosts.dedup();
        let ranks: Vec<String> = whole.iter().map(|r| r.to_string()).collect();
        let why = format!(
            "rank(s) {} slower than the other ranks in every window of epoch {epoch} \
             (--straggler-action exclude)",
            ranks.join(", ")
        );
        if self.rank == 0 {
            crate::heartbeat::phase(Phase::Checkpoint);
            self.writer.wait().map_err(TrainError::Checkpoint)?;
            let step = self.s.step;
            crate::status::publish_now(|st| st.exclude_hosts = hosts.clone());
            (self.ctx.say)(&format!(
                "stopping after epoch {epoch} to leave out host(s) {}: {why}; the checkpoint \
                 at step {step} is written, and tchrun train restarts without them",
                hosts.join(", ")
            ));
        }
        self.ctx.pg.barrier()?;
        Ok(TrainError::Straggler(format!(
            "stopped after epoch {epoch} to leave out a straggler: {why}"
        )))
    }

    /// After the last epoch: replicas checked identical, this rank's summary, then (rank 0)
    /// the model directory from the best epoch's weights and the final checkpoint.
    pub(super) fn finish(mut self) -> Result<(), TrainError> {
        let pg = self.ctx.pg;
        if let Some(name) = self.replicas.first_difference(pg)? {
            return Err(TrainError::Replicas(name));
        }
        let (sum, sumsq) = self.replicas.fingerprint();
        tracing::info!(
            "parameters identical across ranks; fingerprint sum={sum:.9e} sumsq={sumsq:.9e}"
        );
        tracing::info!(
            "{}",
            tchrun::driver_log::RankSummary {
                images: self.s.images,
                compute_s: self.s.compute_s,
                communication_s: self.s.comm_s,
            }
            .write()
        );
        if self.s.bad_images.distinct() > 0 {
            tracing::warn!(
                "{} image(s) failed to decode on this rank and were skipped (--skip-bad-images)",
                self.s.bad_images.distinct()
            );
        }
        let Some((_, best_epoch)) = self.s.stopping.best else {
            return Err(TrainError::Invalid(
                "no epoch completed with a finite validation loss".into(),
            ));
        };
        // The last collective: after it rank 0 alone finishes its checkpoint write and the
        // model directory, and no other rank waits on its storage (or times out doing so).
        pg.barrier()?;
        if self.rank == 0 {
            crate::heartbeat::phase(Phase::FinalWrite);
            crate::status::publish(|st| st.state = JobState::Checkpointing);
            self.write_model(best_epoch)?;
            let summary = format!("model written to {}", self.job.output.display());
            let step = self.s.step;
            crate::status::publish_now(|st| {
                st.state = JobState::Finished;
                st.step = step;
                st.eta_epoch_s = None;
                st.eta_job_s = None;
                st.end = Some(JobEnd {
                    code: 0,
                    summary,
                    cause: None,
                });
            });
        }
        let sig = crate::rank::signals::requested();
        if sig != 0 {
            tracing::warn!(
                "the stop request ({}) came after the last training step: the model was finished first",
                crate::rank::signals::name(sig)
            );
        }
        Ok(())
    }

    /// Rank 0: the model directory (the best epoch's weights, `model.json` with its training
    /// record, metrics, plots), then the final checkpoint marked finished.
    fn write_model(&mut self, best_epoch: u32) -> Result<(), TrainError> {
        let job = self.job;
        let p = &job.params;
        self.writer.wait().map_err(TrainError::Checkpoint)?;
        let mut weights = self.s.best_weights.take().ok_or_else(|| {
            TrainError::Checkpoint(format!(
                "the best epoch is {best_epoch} but its weights were not kept (the checkpoint \
                 in {} lacks them)",
                checkpoint::dir(&job.output).display()
            ))
        })?;
        let history = &self.s.history;
        let best_metrics = history.get(best_epoch as usize - 1).cloned();
        let trained = ModelConfig {
            class_names: self.train.classes.clone(),
            training: Some(TrainingRecord {
                epochs: p.epochs,
                epochs_run: history.len(),
                best_epoch,
                batch_size: p.batch_size,
                warmup_epochs: p.warmup_epochs,
                lr: p.lr,
                effective_lr: self.plan.schedule.peak,
                world_size: self.world,
                seed: p.seed,
                patience: p.patience,
                momentum: job.options.momentum,
                weight_decay: job.options.weight_decay,
                lr_power: job.options.lr_power,
                steps: self.s.step,
                train_images: self.train.samples.len(),
                valid_images: self.valid.samples.len(),
                freeze_backbone: self.frozen,
                backbone_lr_scale: job.options.backbone_lr_scale,
                global_batch_size: job.options.global_batch_size,
                lr_scaling: self.plan.scaling,
                lr_reference_batch: Some(self.plan.reference),
                threads: u32::try_from(tch::get_num_threads()).ok(),
                mlflow_run_id: self.ctx.tracking.run_id(),
                recipe: job.options.recipe.record(),
                augment: job.options.augment.record(self.cfg.input_size),
                class_weights: self.run_record.class_weights.clone(),
            }),
            metrics: best_metrics
                .as_ref()
                .map(|m| serde_json::to_value(m).unwrap_or_default()),
            initial_weights: self.initial_weights.clone(),
            // A model trained from an EMA directory is not itself an average.
            ema: None,
            ..self.cfg.clone()
        };
        let ema_best = super::ema::split_best(&mut weights);
        let state_dict = models::state_dict(&weights, self.s.step as i64);
        if let Some(v) = tchrun::metrics::verdict(history) {
            tracing::info!("time split of the training steps: {}", v.line());
        }
        let series = crate::plot::StepSeries {
            loss: &self.board.losses,
            lr: &self.board.lrs,
            per_epoch: self.plan.steps_per_epoch,
        };
        if let Some(ema) = &self.ema {
            // `<output>/ema/` first: once the model's model.json is there, so is the EMA's.
            let (w, n) = ema_best.ok_or_else(|| {
                TrainError::Checkpoint(format!(
                    "--model-ema: the best epoch {best_epoch}'s weights lack the EMA's"
                ))
            })?;
            let dir = job.output.join(tchrun::files::EMA_DIR);
            let cfg = ModelConfig {
                ema: Some(ema.record(n)),
                ..trained.clone()
            };
            let sd = models::state_dict(&w, self.s.step as i64);
            outputs::write_model_dir(&dir, &cfg, &sd, history, &series)
                .map_err(TrainError::Output)?;
        }
        outputs::write_model_dir(&job.output, &trained, &state_dict, history, &series)
            .map_err(TrainError::Output)?;
        let meta = self.meta(history.len() as u32, 0, (0.0, 0.0, 0.0), true);
        checkpoint::save(
            &job.output,
            &meta,
            &self.named,
            &saved_state(self.opt.state(), self.ema.as_ref()),
            None,
        )
        .map_err(TrainError::Checkpoint)?;
        if let Some(m) = best_metrics {
            (self.ctx.say)(&format!(
                "best epoch {best_epoch}: valid top-1 {:.2}%, top-5 {:.2}%, loss {:.4}",
                100.0 * m.top1,
                100.0 * m.top5,
                m.val_loss
            ));
            if let (Some(loss), Some(top1), Some(top5)) = (m.ema_val_loss, m.ema_top1, m.ema_top5) {
                (self.ctx.say)(&format!(
                    "EMA model of epoch {best_epoch} (--model-ema): valid top-1 {:.2}%, top-5 \
                     {:.2}%, loss {loss:.4}; written to {}",
                    100.0 * top1,
                    100.0 * top5,
                    job.output.join(tchrun::files::EMA_DIR).display()
                ));
            }
        }
        Ok(())
    }
}

/// The driver log's and console's line of an epoch; with `--model-ema`, the EMA model's
/// validation after the model's.
fn epoch_line(m: &EpochMetrics, epochs: u32) -> String {
    let mut line = format!(
        "epoch {}/{}: train loss {:.4}, {:.1} images/s; valid loss {:.4}, top-1 {:.2}%, top-5 {:.2}%",
        m.epoch,
        epochs,
        m.train_loss,
        m.train_images_per_sec,
        m.val_loss,
        100.0 * m.top1,
        100.0 * m.top5
    );
    if let (Some(loss), Some(top1), Some(top5)) = (m.ema_val_loss, m.ema_top1, m.ema_top5) {
        line.push_str(&format!(
            "; EMA valid loss {loss:.4}, top-1 {:.2}%, top-5 {:.2}%",
            100.0 * top1,
            100.0 * top5
        ));
    }
    line
}
