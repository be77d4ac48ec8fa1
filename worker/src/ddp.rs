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
use crate::pg::{C10dError, ProcessGroup, ReduceOp, ReducedStep, Reducer};
use std::cell::{Cell, OnceCell, RefCell};
use tch::{Kind, Tensor};

/// Bucket size cap in bytes (PyTorch DDP's default bucket_cap_mb = 25).
pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;
/// The first bucket's cap (DDP's `_DEFAULT_FIRST_BUCKET_BYTES`): small, so the first
/// all-reduce starts early in backward.
pub const FIRST_BUCKET_BYTES: usize = 1024 * 1024;

/// Statistics of one reduced step.
#[derive(Debug, Clone, Copy)]
pub struct StepStats {
    /// Mean loss over every sample of every rank.
    pub loss: f64,
    /// Samples of the combined batch.
    pub samples: f64,
    /// Some rank asked to stop (a signal): every rank sees it in the same step.
    pub stop: bool,
}

pub struct Replicator {
    params: Vec<Tensor>,
    buffers: Vec<Tensor>,
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
        let mut params = Vec::new();
        let mut buffers = Vec::new();
        for (name, t) in named {
            if is_buffer(name) || !t.requires_grad() {
                buffers.push(t.shallow_clone());
            } else {
                params.push(t.shallow_clone());
            }
        }
        Replicator {
            params,
            buffers,
            first_bucket_bytes: FIRST_BUCKET_BYTES,
            bucket_bytes: BUCKET_BYTES,
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
            });
            return Ok(());
        }
        if self.reducer.get().is_none() {
            let r = Reducer::new(pg, &self.params, self.first_bucket_bytes, self.bucket_bytes)?;
            let _ = self.reducer.set(r);
        }
        let device = loss.device();
        let inv = 1.0 / pg.size() as f64;
        let mut parts: Vec<Tensor> = self
            .buffers
            .iter()
            .map(|b| b.detach().reshape([-1]).to_kind(Kind::Float) * inv)
            .collect();
        parts.push(loss.detach().to_kind(Kind::Float).reshape([1]) * n);
        parts.push(Tensor::from_slice(&[n as f32, stop as i32 as f32]).to_device(device));
        let extra = Tensor::cat(&parts, 0);
        if let Some(r) = self.reducer.get() {
            r.prepare(&extra, n)?;
        }
        *self.pending.borrow_mut() = Some(Pending {
            extra,
            n_local,
            stop,
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
            let loss = if p.n_local == 0 {
                0.0
            } else {
                p.extra.double_value(&[])
            };
            return Ok(StepStats {
                loss,
                samples: p.n_local as f64,
                stop: p.stop,
            });
        }
        let Some(r) = self.reducer.get() else {
            return Err(C10dError {
                op: "gradient reduce",
                message: "no reducer (begin_step failed)".into(),
            });
        };
        let len = p.extra.size()[0];
        let reduced = r.finish((len - 2) as usize)?;
        self.last.set(Some(reduced));
        let buffer_len = len - 3;
        if buffer_len > 0 {
            unflatten_into(&p.extra.narrow(0, 0, buffer_len), &self.buffers);
        }
        let tail = Vec::<f32>::try_from(p.extra.narrow(0, len - 3, 3).to_device(tch::Device::Cpu))
            .unwrap_or_default();
        let loss_sum = tail.first().copied().unwrap_or(f32::NAN) as f64;
        let samples = tail.get(1).copied().unwrap_or(0.0) as f64;
        let stop = tail.get(2).copied().unwrap_or(0.0) > 0.0;
        Ok(StepStats {
            loss: loss_sum / samples.max(1.0),
            samples,
            stop,
        })
    }

    /// Buckets of the last reduced step, and how many of them started during backward.
    pub fn last_reduction(&self) -> Option<ReducedStep> {
        self.last.get()
    }

    /// Whether every parameter and buffer is bit-identical on all ranks.
    pub fn identical_across_ranks(&self, pg: &ProcessGroup) -> Result<bool, C10dError> {
        let all: Vec<Tensor> = self
            .params
            .iter()
            .chain(self.buffers.iter())
            .map(|t| t.detach().reshape([-1]))
            .collect();
        let mine = Tensor::cat(&all, 0);
        let mut max = mine.copy();
        let mut min = mine.copy();
        pg.all_reduce(&mut [&mut max], ReduceOp::Max)?;
        pg.all_reduce(&mut [&mut min], ReduceOp::Min)?;
        Ok(max.equal(&mine) && min.equal(&mine))
    }

    /// A fingerprint of the replica (sum and sum of squares of every value), for the logs.
    pub fn fingerprint(&self) -> (f64, f64) {
        let all: Vec<Tensor> = self
            .params
            .iter()
            .chain(self.buffers.iter())
            .map(|t| t.detach().reshape([-1]).to_kind(Kind::Double))
            .collect();
        let v = Tensor::cat(&all, 0);
        (
            v.sum(Kind::Double).double_value(&[]),
            (&v * &v).sum(Kind::Double).double_value(&[]),
        )
    }
}
