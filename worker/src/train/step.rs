//! One training step, the same for training, `gradcheck` and `bench-step`: forward →
//! `begin_step` → backward → `end_step` → optimizer (fp16 loss scaling), and the divergence
//! guard run after it. With `--global-batch-size`, the micro-batches before a step's last
//! (`accumulate_micro_batch`: forward, backward, no communication).
use crate::comm::ddp::{Accumulation, Replicator, StepStats};
use crate::comm::pg::{C10dError, ProcessGroup};
use crate::train::optim::Optimizer;
use crate::train::scaler::LossScaler;
use std::time::Instant;
use tch::{nn::ModuleT, Device, Kind, Tensor};
use tchrun::job_record::heartbeat::Phase;

/// The model a step runs and how.
pub(crate) struct StepModel<'a> {
    pub(crate) net: &'a dyn ModuleT,
    /// `forward_t`'s train flag (batch norm in training mode).
    pub(crate) train: bool,
    /// Autocast (CUDA; its dtype set beforehand).
    pub(crate) amp: bool,
    pub(crate) device: Device,
    /// `--label-smoothing` of the cross entropy (0: plain cross entropy, as before).
    pub(crate) label_smoothing: f64,
    /// `--class-weights`: the cross entropy's per-class `weight` (float, on the device).
    pub(crate) class_weights: Option<&'a Tensor>,
}

/// The optimizer part of a step.
pub(crate) struct Update<'a> {
    pub(crate) opt: &'a mut Optimizer,
    pub(crate) scaler: &'a mut LossScaler,
    pub(crate) lr: f64,
    /// `--clip-grad-norm`: the reduced, unscaled gradients' total norm clipped to this.
    pub(crate) clip: Option<f64>,
}

/// What a step did.
pub(crate) struct StepResult {
    /// The reduced loss, samples and stop vote, on the device; `None` without a group.
    pub(crate) stats: Option<StepStats>,
    /// When backward ended (this rank's compute), and when the reduction had ended.
    pub(crate) backward_done: Instant,
    pub(crate) reduced: Instant,
    /// The optimizer step was issued (false: no sample on any rank, or no update). With the
    /// fp16 scaler the device may still skip it: `scaler_checked`.
    pub(crate) updated: bool,
    /// The loss scaler checked this step's gradients: its flags (`LossScaler::flags`) are this
    /// step's overflow and the scale after it.
    pub(crate) scaler_checked: bool,
}

/// One step on `batch` (inputs, labels; `None`: this rank sits the step out with no sample):
/// forward and loss (cross entropy of the float logits, under autocast), with a group the
/// replicator's `begin_step`, backward (the loss scaled by the fp16 scaler's scale when there
/// is an update) while buckets are all-reduced, `end_step`, then the optimizer step: skipped
/// when no rank had a sample, or on the device when the fp16 gradients overflowed (the
/// scaler's flag). Nothing is read back from the device (the caller's `StepWindow` reads the
/// stats and the scaler's flag at its own pace). Gradients are not zeroed here (the caller
/// does, before).
/// `acc`: the step's earlier micro-batches (`--global-batch-size`; needs `dp`): this batch is
/// the step's last, and the reduction covers them all.
pub(crate) fn train_step(
    model: &StepModel,
    batch: Option<(&Tensor, &Tensor)>,
    stop_vote: bool,
    dp: Option<(&ProcessGroup, &Replicator)>,
    update: Option<Update>,
    acc: Option<Accumulation>,
) -> Result<StepResult, C10dError> {
    let n_local = batch.map(|(x, _)| x.size()[0] as usize).unwrap_or(0);
    crate::heartbeat::phase(Phase::Forward);
    let loss = forward_loss(model, batch);
    // begin_step arms the gradient hooks: buckets are all-reduced while backward runs.
    if let Some((pg, replicas)) = dp {
        match acc {
            Some(mut acc) => {
                replicas.absorb_forward(&mut acc);
                replicas.begin_accumulated_step(pg, &loss, n_local, stop_vote, acc)?;
            }
            None => replicas.begin_step(pg, &loss, n_local, stop_vote)?,
        }
    }
    crate::heartbeat::phase(Phase::Backward);
    if n_local > 0 {
        match &update {
            Some(u) => u.scaler.scaled(&loss).backward(),
            None => loss.backward(),
        }
    }
    let backward_done = Instant::now();
    let stats = match dp {
        Some((pg, replicas)) => Some(replicas.end_step(pg)?),
        None => None,
    };
    let reduced_at = Instant::now();
    let any_sample = stats.as_ref().map_or(n_local > 0, |s| s.any_sample);
    let (mut updated, mut scaler_checked) = (false, false);
    crate::heartbeat::phase(Phase::Optimizer);
    if let Some(u) = update.filter(|_| any_sample) {
        // torch's order under a GradScaler: unscale, clip the unscaled gradients, step (skipped
        // on an overflow), update the scale.
        let found_inf = u.scaler.unscale(u.opt.params())?;
        if let Some(max) = u.clip {
            super::clip::clip_grad_norm(u.opt.params(), max);
        }
        u.opt.step(u.lr, found_inf.as_ref())?;
        u.scaler.update();
        updated = true;
        scaler_checked = found_inf.is_some();
    }
    Ok(StepResult {
        stats,
        backward_done,
        reduced: reduced_at,
        updated,
        scaler_checked,
    })
}

/// Forward and the mean cross entropy of `batch` (0 without one), with the model's label
/// smoothing (torch's `F.cross_entropy(label_smoothing=...)`).
fn forward_loss(model: &StepModel, batch: Option<(&Tensor, &Tensor)>) -> Tensor {
    match batch {
        Some((x, y)) => tch::autocast(model.amp, || {
            let logits = model.net.forward_t(x, model.train).to_kind(Kind::Float);
            cross_entropy(&logits, y, model.label_smoothing, model.class_weights)
        }),
        None => Tensor::zeros([], (Kind::Float, model.device)),
    }
}

/// The mean cross entropy of float `logits` against `labels` with label smoothing `eps` and
/// per-class `weight` (torch's `F.cross_entropy`: with class labels the mean is weighted, over
/// Σ weight of the labels; with probabilities it is over the images); no smoothing and no
/// weight: the plain cross entropy, computed as before. Float labels (N x classes, MixUp's and
/// CutMix's) are probabilities, smoothed as torch smooths them.
pub(crate) fn cross_entropy(
    logits: &Tensor,
    labels: &Tensor,
    eps: f64,
    weight: Option<&Tensor>,
) -> Tensor {
    if eps == 0.0 && weight.is_none() && labels.kind() == Kind::Int64 {
        return logits.cross_entropy_for_logits(labels);
    }
    logits.cross_entropy_loss(labels, weight, tch::Reduction::Mean, -100, eps)
}

/// A micro-batch that is not its step's last (`--global-batch-size`): forward (its batch-norm
/// statistics into `acc`), backward of the loss × the scaler's scale, its gradients into `acc`.
/// No communication and no update: the step's last micro-batch (`train_step`) does both.
pub(crate) fn accumulate_micro_batch(
    model: &StepModel,
    batch: Option<(&Tensor, &Tensor)>,
    replicas: &Replicator,
    acc: &mut Accumulation,
    scaler: &LossScaler,
) -> Result<(), C10dError> {
    let n_local = batch.map(|(x, _)| x.size()[0] as usize).unwrap_or(0);
    crate::heartbeat::phase(Phase::Forward);
    let loss = forward_loss(model, batch);
    crate::heartbeat::phase(Phase::Backward);
    replicas.absorb_forward(acc);
    if n_local > 0 {
        scaler.scaled(&loss).backward();
    }
    replicas.absorb_backward(acc, &loss, n_local)
}

/// The first tensor (by name) holding a NaN or an infinity, and that value.
fn first_non_finite(tensors: &[(String, Tensor)]) -> Option<(String, f64)> {
    tensors.iter().find_map(|(name, t)| {
        if !t.defined() {
            return None;
        }
        let bad = t.isfinite().logical_not();
        if bad.any().int64_value(&[]) == 0 {
            return None;
        }
        let value = t.masked_select(&bad).get(0).double_value(&[]);
        Some((name.clone(), value))
    })
}

/// The non-finite guard run after every optimizer step: one fused value (the sum of every
/// tensor's L1 norm, `pg::l1_total`: finite exactly when every value is) over the weights and the
/// batch-norm statistics, left on the device in the step's row of the `StepWindow` (read with
/// the loss, never per step). A non-finite gradient reaches the weights through the update (also
/// at LR 0: NaN × 0 is NaN). Cost on CPU: ~2 ms per ResNet-18 step (one pass over the weights).
pub(crate) struct Guard {
    /// Weights and buffers by name.
    pub(crate) watched: Vec<(String, Tensor)>,
}

impl Guard {
    /// A guard over the float weights and buffers of `named`.
    pub(crate) fn watching(named: &[(String, Tensor)]) -> Guard {
        Guard {
            watched: named
                .iter()
                .filter(|(_, t)| t.kind() == Kind::Float)
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
        }
    }

    /// The step's total (a 0-d tensor on the device, not read); `None` without float weights.
    pub(crate) fn total(&self, step: u64) -> Option<Tensor> {
        if self.watched.is_empty() {
            return None;
        }
        let tensors: Vec<Tensor> = self.watched.iter().map(|(_, t)| t.detach()).collect();
        match crate::comm::pg::l1_total(&tensors) {
            Ok(total) => Some(total),
            // Cannot happen for a model's float weights; never a reason to stop training.
            Err(e) => {
                tracing::warn!("non-finite check skipped at step {step}: {e}");
                None
            }
        }
    }

    /// What went non-finite, once a total was: the first such gradient of `grads` (the failing
    /// step's, when still held), else the first such weight or batch-norm statistic, and its
    /// value.
    pub(crate) fn culprit(&self, grads: Option<&[(String, Tensor)]>) -> (String, f64) {
        let named_grads: Vec<(String, Tensor)> = grads
            .unwrap_or_default()
            .iter()
            .map(|(n, p)| (format!("the gradient of {n}"), p.grad()))
            .collect();
        let what = first_non_finite(&named_grads).or_else(|| {
            let labelled: Vec<(String, Tensor)> = self
                .watched
                .iter()
                .map(|(n, t)| {
                    let kind = if crate::models::is_buffer(n) {
                        "the batch-norm statistic"
                    } else {
                        "the weight"
                    };
                    (format!("{kind} {n}"), t.shallow_clone())
                })
                .collect();
            first_non_finite(&labelled)
        });
        what.unwrap_or_else(|| ("a weight".into(), f64::NAN))
    }
}
