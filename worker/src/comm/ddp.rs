//! Data parallelism over a `ProcessGroup`: parameters and buffers replicated from rank 0,
//! gradients all-reduced in flat buckets overlapped with backward (DDP's caps: 1 MiB for the
//! first bucket, 25 MiB after; `pg::Reducer` does the hooks and the asynchronous all-reduces),
//! batch-norm running statistics averaged over the ranks in the same reduction (DDP broadcasts
//! rank 0's instead, in a collective of its own), and the replica check.
//!
//! Each rank contributes `n_local × grad` plus `[n_local × loss, n_local, stop]` in the first
//! bucket; SUM all-reduces then give the exact gradient and loss of the combined batch, also
//! when ranks hold different numbers of samples (a skipped bad image), and a NaN on any rank
//! reaches every rank in the same step.
//!
//! Gradient accumulation (`--global-batch-size`, `Accumulation`): a step of A micro-batches per
//! rank. After each micro-batch's forward its batch-norm statistics join the step's sum (× 1/(A ×
//! world)); after each backward but the last, the running statistics go back to the step's
//! start, `n × grad` joins the step's sum and the gradients are dropped; the last backward adds the
//! sum in the hooks (`Reducer::prepare_accumulated`) and the all-reduce runs once, overlapped
//! with it. The result is exactly the combined batch's: `Σ n × grad / Σ n` over every micro-batch
//! of every rank, the statistics the mean over them all, the same arithmetic as one micro-batch
//! per rank on A × world ranks (bit for bit where the summation order is the same).
use crate::comm::pg::{C10dError, ProcessGroup, ReduceOp, ReducedStep, Reducer};
use std::cell::{Cell, OnceCell, RefCell};
use tch::{Kind, Tensor};

/// Statistics of one reduced step, left on the device: the trainer reads many steps' at once
/// (`train/window.rs`), so a CUDA step never waits for the device to hand them to the host.
#[derive(Debug)]
pub struct StepStats {
    /// `[mean loss over every sample of every rank, samples of the combined batch, stop vote]`,
    /// a float64 tensor of 3 on the step's device. The vote is > 0 when some rank asked to stop
    /// (a signal): every rank sees it in the same step.
    pub tail: Tensor,
    /// Some rank had a sample (the optimizer steps). Known without a read when this rank had
    /// one; read from the device only in the rare step this rank sits out.
    pub any_sample: bool,
}

impl StepStats {
    /// One rank alone: `loss` (a 0-d tensor, this rank's mean) over `samples`.
    fn alone(loss: &Tensor, samples: usize, stop: bool) -> StepStats {
        let mean = if samples == 0 {
            Tensor::zeros([1], (Kind::Double, loss.device()))
        } else {
            loss.detach().to_kind(Kind::Double).reshape([1])
        };
        StepStats::new(mean, samples as f64, stop)
    }

    /// `mean` (a float64 tensor of 1) with the host's samples and vote, filled on the device
    /// (a copy from pageable host memory would synchronize the CUDA stream).
    fn new(mean: Tensor, samples: f64, stop: bool) -> StepStats {
        let opts = (Kind::Double, mean.device());
        let vote = if stop { 1.0 } else { 0.0 };
        StepStats {
            tail: Tensor::cat(
                &[
                    mean,
                    Tensor::full([1], samples, opts),
                    Tensor::full([1], vote, opts),
                ],
                0,
            ),
            any_sample: samples > 0.0,
        }
    }

    /// The values on the host (a read: it waits for the device). `(loss, samples, stop)`.
    pub fn read(&self) -> (f64, f64, bool) {
        let v = Vec::<f64>::try_from(self.tail.to_device(tch::Device::Cpu)).unwrap_or_default();
        let at = |i: usize| v.get(i).copied().unwrap_or(f64::NAN);
        (at(0), at(1), at(2) > 0.0)
    }
}

pub struct Replicator {
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
    /// Tensors that never change (`--freeze-backbone`): broadcast at start and checked at the
    /// end, never reduced.
    fixed: Vec<Tensor>,
    /// Names of `params`, then of `buffers`, then of `fixed` (for the replica check's message).
    names: Vec<String>,
    first_bucket_bytes: usize,
    bucket_bytes: usize,
    /// Created on the first multi-rank step (it needs the group).
    reducer: OnceCell<Reducer>,
    pending: RefCell<Option<Pending>>,
    last: Cell<Option<ReducedStep>>,
}

/// A step between `begin_step` and `end_step`.
struct Pending {
    /// Multi-rank: the values summed with the first bucket; one rank: the loss.
    extra: Tensor,
    n_local: usize,
    stop: bool,
    /// An accumulated step (`--global-batch-size`).
    acc: Option<Accumulation>,
}

/// The micro-batches of one optimizer step on this rank, before the last one's backward.
pub struct Accumulation {
    /// Each micro-batch's share of the batch-norm statistics: 1 / (accumulation × world).
    share: f64,
    /// The running statistics at the start of the step (every micro-batch's forward starts here).
    saved: Vec<Tensor>,
    /// Σ share × statistics after each micro-batch's forward (flat float), `None` before the first.
    buffers: Option<Tensor>,
    /// Per parameter: Σ samples × gradient of the backwards so far.
    grads: Vec<Option<Tensor>>,
    /// Σ samples × loss (0-d float) and Σ samples of the backwards so far.
    loss: Option<Tensor>,
    samples: usize,
}

fn numel(t: &Tensor) -> usize {
    t.size().iter().product::<i64>() as usize
}

/// Concatenates flattened tensors (one copy), runs `op` on the flat tensor, copies back.
fn flat_op(
    tensors: &[Tensor],
    op: impl FnOnce(&mut Tensor) -> Result<(), C10dError>,
) -> Result<(), C10dError> {
    if tensors.is_empty() {
        return Ok(());
    }
    let views: Vec<Tensor> = tensors.iter().map(|t| t.detach().reshape([-1])).collect();
    let mut flat = Tensor::cat(&views, 0);
    op(&mut flat)?;
    unflatten_into(&flat, tensors);
    Ok(())
}

fn unflatten_into(flat: &Tensor, tensors: &[Tensor]) {
    let mut offset = 0i64;
    tch::no_grad(|| {
        for t in tensors {
            let n = numel(t) as i64;
            let mut dst = t.detach();
            dst.copy_(&flat.narrow(0, offset, n).view_as(t));
            offset += n;
        }
    });
}

impl Replicator {
    /// `named`: every variable of the model by name (sorted), `is_buffer` tells buffers apart.
    pub fn new(named: &[(String, Tensor)], is_buffer: impl Fn(&str) -> bool) -> Replicator {
        Replicator::with_fixed(named, is_buffer, |_| false)
    }

    /// As `new`, with the variables `is_fixed` accepts (a frozen backbone: parameters and
    /// batch-norm statistics alike) left out of every step's reduction.
    pub fn with_fixed(
        named: &[(String, Tensor)],
        is_buffer: impl Fn(&str) -> bool,
        is_fixed: impl Fn(&str) -> bool,
    ) -> Replicator {
        let (mut params, mut buffers, mut fixed) = (Vec::new(), Vec::new(), Vec::new());
        let (mut param_names, mut buffer_names, mut fixed_names) =
            (Vec::new(), Vec::new(), Vec::new());
        for (name, t) in named {
            if is_fixed(name) {
                fixed.push(t.shallow_clone());
                fixed_names.push(name.clone());
            } else if is_buffer(name) || !t.requires_grad() {
                buffers.push(t.shallow_clone());
                buffer_names.push(name.clone());
            } else {
                params.push(t.shallow_clone());
                param_names.push(name.clone());
            }
        }
        param_names.extend(buffer_names);
        param_names.extend(fixed_names);
        // DDP's caps (1 MiB, then 25 MiB) unless `with_bucket_caps` says otherwise.
        let (first_bucket_bytes, bucket_bytes) =
            tchrun::flags::bucket_caps(tchrun::flags::BUCKET_CAP_MB);
        Replicator {
            params,
            buffers,
            fixed,
            names: param_names,
            first_bucket_bytes,
            bucket_bytes,
            reducer: OnceCell::new(),
            pending: RefCell::new(None),
            last: Cell::new(None),
        }
    }

    /// Bucket caps in bytes (before the first step): the first bucket, and every later one.
    pub fn with_bucket_caps(mut self, first: usize, rest: usize) -> Replicator {
        self.first_bucket_bytes = first.max(1);
        self.bucket_bytes = rest.max(1);
        self
    }

    /// Parameters and buffers from rank 0 to everyone (at start).
    pub fn broadcast_all(&self, pg: &ProcessGroup) -> Result<(), C10dError> {
        flat_op(&self.params, |f| pg.broadcast(&mut [f], 0))?;
        if pg.size() > 1 {
            flat_op(&self.fixed, |f| pg.broadcast(&mut [f], 0))?;
        }
        self.sync_buffers(pg)
    }

    /// Any tensors from rank 0 to everyone, in one flat broadcast.
    pub fn broadcast_tensors(pg: &ProcessGroup, tensors: &[Tensor]) -> Result<(), C10dError> {
        flat_op(tensors, |f| pg.broadcast(&mut [f], 0))
    }

    /// Batch-norm running statistics from rank 0 to everyone (after each step).
    pub fn sync_buffers(&self, pg: &ProcessGroup) -> Result<(), C10dError> {
        if pg.size() == 1 {
            return Ok(());
        }
        flat_op(&self.buffers, |f| pg.broadcast(&mut [f], 0))
    }

    /// Starts an accumulated step (`--global-batch-size`): `micro_batches` per rank.
    pub fn start_accumulation(&self, micro_batches: usize, world: usize) -> Accumulation {
        Accumulation {
            share: 1.0 / (micro_batches.max(1) * world.max(1)) as f64,
            saved: tch::no_grad(|| self.buffers.iter().map(|b| b.detach().copy()).collect()),
            buffers: None,
            grads: self.params.iter().map(|_| None).collect(),
            loss: None,
            samples: 0,
        }
    }

    /// After a micro-batch's forward (train mode): its running statistics join the step's sum.
    /// (They go back to the step's start after its backward, in `absorb_backward`: autograd
    /// holds them until then.)
    pub fn absorb_forward(&self, acc: &mut Accumulation) {
        if self.buffers.is_empty() {
            return;
        }
        let parts: Vec<Tensor> = self
            .buffers
            .iter()
            .map(|b| b.detach().reshape([-1]).to_kind(Kind::Float) * acc.share)
            .collect();
        let now = Tensor::cat(&parts, 0);
        acc.buffers = Some(match acc.buffers.take() {
            None => now,
            Some(sum) => sum + now,
        });
    }

    /// After a micro-batch's backward that is not the step's last: the running statistics go
    /// back to the step's start (for the next micro-batch's forward), `n × gradient` joins the
    /// step's sum and the gradients are dropped (the next backward starts from none); `loss`
    /// is the micro-batch's mean loss over its `n` samples.
    pub fn absorb_backward(
        &self,
        acc: &mut Accumulation,
        loss: &Tensor,
        n: usize,
    ) -> Result<(), C10dError> {
        tch::no_grad(|| {
            for (b, s) in self.buffers.iter().zip(&acc.saved) {
                b.detach().copy_(s);
            }
        });
        if n == 0 {
            return Ok(());
        }
        let nf = n as f64;
        for (p, sum) in self.params.iter().zip(acc.grads.iter_mut()) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            // The same rounding as the reducer's hook: round(n × g), then round(sum + that).
            let scaled = &g * nf;
            *sum = Some(match sum.take() {
                None => scaled,
                Some(s) => s + scaled,
            });
        }
        crate::comm::pg::set_grads_to_none(self.params.iter())?;
        let l = loss.detach().to_kind(Kind::Float) * nf;
        acc.loss = Some(match acc.loss.take() {
            None => l,
            Some(s) => s + l,
        });
        acc.samples += n;
        Ok(())
    }

    /// `begin_step` for the last micro-batch of an accumulated step (after its forward and
    /// `absorb_forward`): the step's loss, samples and statistics are `acc`'s plus this one's,
    /// and the hooks add `acc`'s gradient sums.
    pub fn begin_accumulated_step(
        &self,
        pg: &ProcessGroup,
        loss: &Tensor,
        n_local: usize,
        stop: bool,
        acc: Accumulation,
    ) -> Result<(), C10dError> {
        self.begin(pg, loss, n_local, stop, Some(acc))
    }

    /// Starts a step's reduction: call after forward, before backward. `loss` is this rank's
    /// mean loss over its `n_local` samples (a 0-d tensor); `stop` is this rank's vote to stop
    /// (a signal arrived). From here on, backward's gradient hooks fill the buckets and launch
    /// their all-reduces (see `pg::Reducer`); batch-norm running statistics (already updated by
    /// forward), `n_local × loss`, `n_local` and the vote ride in the first bucket.
    pub fn begin_step(
        &self,
        pg: &ProcessGroup,
        loss: &Tensor,
        n_local: usize,
        stop: bool,
    ) -> Result<(), C10dError> {
        self.begin(pg, loss, n_local, stop, None)
    }

    fn begin(
        &self,
        pg: &ProcessGroup,
        loss: &Tensor,
        n_local: usize,
        stop: bool,
        acc: Option<Accumulation>,
    ) -> Result<(), C10dError> {
        let n = n_local as f64;
        if self.pending.borrow().is_some() {
            return Err(C10dError {
                op: "gradient reduce",
                message: "a step was begun twice without end_step".into(),
            });
        }
        if pg.size() == 1 {
            // Nothing to combine: the gradients already are the batch's; no copies.
            *self.pending.borrow_mut() = Some(Pending {
                extra: loss.shallow_clone(),
                n_local,
                stop,
                acc,
            });
            return Ok(());
        }
        if self.reducer.get().is_none() {
            let r = Reducer::new(pg, &self.params, self.first_bucket_bytes, self.bucket_bytes)?;
            let _ = self.reducer.set(r);
        }
        let device = loss.device();
        let inv = 1.0 / pg.size() as f64;
        let mut parts: Vec<Tensor> = match acc.as_ref().and_then(|a| a.buffers.as_ref()) {
            // Accumulated: the step's statistics, already scaled by 1 / (A × world).
            Some(sum) => vec![sum.shallow_clone()],
            None => self
                .buffers
                .iter()
                .map(|b| b.detach().reshape([-1]).to_kind(Kind::Float) * inv)
                .collect(),
        };
        let mut loss_sum = loss.detach().to_kind(Kind::Float).reshape([1]) * n;
        let mut samples = n;
        if let Some(a) = &acc {
            if let Some(l) = &a.loss {
                loss_sum = l.reshape([1]) + loss_sum;
            }
            samples += a.samples as f64;
        }
        parts.push(loss_sum);
        // Fills on the device, not a copy from pageable host memory (which would synchronize
        // the CUDA stream between forward and backward).
        let opts = (Kind::Float, device);
        parts.push(Tensor::full([1], samples, opts));
        parts.push(Tensor::full([1], if stop { 1.0 } else { 0.0 }, opts));
        let extra = Tensor::cat(&parts, 0);
        if let Some(r) = self.reducer.get() {
            match &acc {
                Some(a) => r.prepare_accumulated(&extra, n, &a.grads)?,
                None => r.prepare(&extra, n)?,
            }
        }
        *self.pending.borrow_mut() = Some(Pending {
            extra,
            n_local,
            stop,
            acc,
        });
        Ok(())
    }

    /// Ends the step begun by `begin_step` (call after backward): every parameter's gradient
    /// becomes the gradient of the combined batch, the batch-norm statistics the ranks' mean.
    pub fn end_step(&self, pg: &ProcessGroup) -> Result<StepStats, C10dError> {
        let Some(p) = self.pending.borrow_mut().take() else {
            return Err(C10dError {
                op: "gradient reduce",
                message: "end_step without begin_step".into(),
            });
        };
        if pg.size() == 1 {
            if let Some(acc) = p.acc {
                return self.end_accumulated_alone(&p.extra, p.n_local, p.stop, acc);
            }
            return Ok(StepStats::alone(&p.extra, p.n_local, p.stop));
        }
        let Some(r) = self.reducer.get() else {
            return Err(C10dError {
                op: "gradient reduce",
                message: "no reducer (begin_step failed)".into(),
            });
        };
        let len = p.extra.size()[0];
        // Waiting for the buckets (Gloo: their arrival; NCCL: the stream's order after them).
        let _in = crate::heartbeat::gradient_wait();
        let reduced = r.finish((len - 2) as usize)?;
        crate::heartbeat::buckets(reduced.buckets);
        self.last.set(Some(reduced));
        let buffer_len = len - 3;
        // [loss sum, samples, stop] → [mean loss, samples, stop], on the device in float64:
        // the same division the host made when it read them every step.
        let sums = p.extra.narrow(0, len - 3, 3).to_kind(Kind::Double);
        let mean = sums.narrow(0, 0, 1) / sums.narrow(0, 1, 1).clamp_min(1.0);
        let tail = Tensor::cat(&[mean, sums.narrow(0, 1, 2)], 0);
        let local = p.n_local + p.acc.as_ref().map_or(0, |a| a.samples);
        let any_sample = local > 0 || sums.double_value(&[1]) > 0.0;
        // A step without samples on any rank changed no statistics: keep them bit for bit
        // (the mean of n equal values times 1/n need not round back to the value).
        if buffer_len > 0 && any_sample {
            unflatten_into(&p.extra.narrow(0, 0, buffer_len), &self.buffers);
            if let Some(acc) = &p.acc {
                self.count_one_update(acc);
            }
        }
        Ok(StepStats { tail, any_sample })
    }

    /// One rank's accumulated step: what the reducer does, here: each gradient becomes
    /// `(n × grad + Σ earlier) / Σ n` (the same operations in the same order as the hooks and
    /// `finish`), the statistics the micro-batches' mean.
    fn end_accumulated_alone(
        &self,
        loss: &Tensor,
        n_last: usize,
        stop: bool,
        acc: Accumulation,
    ) -> Result<StepStats, C10dError> {
        let samples = (acc.samples + n_last) as f64;
        let inv = 1.0 / samples.max(1.0);
        for (p, sum) in self.params.iter().zip(&acc.grads) {
            let had = p.grad().defined();
            if !had {
                if sum.is_none() {
                    continue;
                }
                // No gradient from the last micro-batch: the sum alone, written into a zero
                // gradient (as the reducer writes it into the bucket's slot).
                (p.sum(Kind::Float) * 0.0).backward();
            }
            tch::no_grad(|| {
                let mut g = p.grad();
                match (had, sum) {
                    (false, Some(sum)) => g.copy_(sum),
                    _ => {
                        let _ = g.g_mul_scalar_(n_last as f64);
                        if let Some(sum) = sum {
                            let _ = g.g_add_(sum);
                        }
                    }
                }
                let _ = g.g_mul_scalar_(inv);
            });
        }
        let mut loss_sum = if n_last > 0 {
            loss.detach().to_kind(Kind::Float) * n_last as f64
        } else {
            Tensor::zeros([], (Kind::Float, loss.device()))
        };
        if let Some(l) = &acc.loss {
            loss_sum = l + loss_sum;
        }
        if samples > 0.0 {
            if let Some(b) = &acc.buffers {
                unflatten_into(b, &self.buffers);
            }
            self.count_one_update(&acc);
        }
        let mean = loss_sum.to_kind(Kind::Double).reshape([1]) / samples.max(1.0);
        Ok(StepStats::new(mean, samples, stop))
    }

    /// `num_batches_tracked` (the integer statistics) counts one update per optimizer step, as
    /// for one batch: the step's start + 1 (their mean over micro-batches may round below).
    fn count_one_update(&self, acc: &Accumulation) {
        tch::no_grad(|| {
            for (b, s) in self.buffers.iter().zip(&acc.saved) {
                if b.kind() == Kind::Int64 {
                    b.detach().copy_(&(s + 1i64));
                }
            }
        });
    }

    /// Buckets of the last reduced step, and how many of them started during backward.
    pub fn last_reduction(&self) -> Option<ReducedStep> {
        self.last.get()
    }

    /// The first parameter or buffer (by name) that is not bit-identical on all ranks; `None`
    /// when every one is (always at world size 1). NaN counts as equal to NaN here: a value
    /// that went non-finite is the divergence guard's to report, not a replica difference.
    pub fn first_difference(&self, pg: &ProcessGroup) -> Result<Option<String>, C10dError> {
        if pg.size() == 1 {
            return Ok(None);
        }
        let all: Vec<Tensor> = self
            .params
            .iter()
            .chain(self.buffers.iter())
            .chain(self.fixed.iter())
            .map(|t| t.detach().reshape([-1]).to_kind(Kind::Double))
            .collect();
        let mine = Tensor::cat(&all, 0).nan_to_num(0.0, None, None);
        let mut max = mine.copy();
        let mut min = mine.copy();
        pg.all_reduce(&mut [&mut max], ReduceOp::Max)?;
        pg.all_reduce(&mut [&mut min], ReduceOp::Min)?;
        if max.equal(&mine) && min.equal(&mine) {
            return Ok(None);
        }
        let differs = max.ne_tensor(&min);
        let mut offset = 0i64;
        for (name, t) in self.names.iter().zip(all.iter()) {
            let n = numel(t) as i64;
            if differs.narrow(0, offset, n).any().int64_value(&[]) != 0 {
                return Ok(Some(name.clone()));
            }
            offset += n;
        }
        Ok(Some("(unknown)".into()))
    }

    /// A fingerprint of the replica (sum and sum of squares of every value), for the logs.
    pub fn fingerprint(&self) -> (f64, f64) {
        let all: Vec<Tensor> = self
            .params
            .iter()
            .chain(self.buffers.iter())
            .chain(self.fixed.iter())
            .map(|t| t.detach().reshape([-1]).to_kind(Kind::Double))
            .collect();
        let v = Tensor::cat(&all, 0);
        (
            v.sum(Kind::Double).double_value(&[]),
            (&v * &v).sum(Kind::Double).double_value(&[]),
        )
    }
}
