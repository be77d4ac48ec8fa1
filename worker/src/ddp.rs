//! Data parallelism over a `ProcessGroup`: parameters and buffers replicated from rank 0,
//! gradients all-reduced in flat buckets (DDP's 25 MiB default), batch-norm running statistics
//! averaged over the ranks in the same reduction (DDP broadcasts rank 0's instead, in a
//! collective of its own), and the replica check.
//!
//! Each rank contributes `n_local × grad` plus `[n_local × loss, n_local]` in the last bucket;
//! one SUM all-reduce then gives the exact gradient and loss of the combined batch, also when
//! ranks hold different numbers of samples (a skipped bad image), and a NaN on any rank
//! reaches every rank in the same step.
use crate::pg::{C10dError, ProcessGroup, ReduceOp};
use std::ops::Range;
use tch::{Kind, Tensor};

/// Bucket size cap in bytes (PyTorch DDP's default bucket_cap_mb = 25).
pub const BUCKET_BYTES: usize = 25 * 1024 * 1024;

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
    buckets: Vec<Range<usize>>,
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
        let mut buckets = Vec::new();
        let mut start = 0;
        let mut bytes = 0;
        for (i, p) in params.iter().enumerate() {
            bytes += numel(p) * 4;
            if bytes >= BUCKET_BYTES {
                buckets.push(start..i + 1);
                start = i + 1;
                bytes = 0;
            }
        }
        if start < params.len() || buckets.is_empty() {
            buckets.push(start..params.len());
        }
        Replicator {
            params,
            buffers,
            buckets,
        }
    }

    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
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

    /// Replaces every parameter's gradient with the gradient of the combined batch.
    /// `loss` is this rank's mean loss over its `n_local` samples (a 0-d tensor); `stop` is this
    /// rank's vote to stop (a signal arrived).
    /// Buckets go last to first (as DDP's do); the first one reduced carries the loss and the
    /// sample count, so every bucket can be scaled as soon as it arrives.
    pub fn reduce_gradients(
        &self,
        pg: &ProcessGroup,
        loss: &Tensor,
        n_local: usize,
        stop: bool,
    ) -> Result<StepStats, C10dError> {
        let n = n_local as f64;
        if pg.size() == 1 {
            // Nothing to combine: the gradients already are the batch's; no copies.
            let loss = if n_local == 0 {
                0.0
            } else {
                loss.double_value(&[])
            };
            return Ok(StepStats {
                loss,
                samples: n,
                stop,
            });
        }
        let mut stats = StepStats {
            loss: f64::NAN,
            samples: 0.0,
            stop: false,
        };
        for (k, range) in self.buckets.iter().rev().enumerate() {
            let grads: Vec<Tensor> = self.params[range.clone()]
                .iter()
                .map(|p| {
                    let g = p.grad();
                    if g.defined() {
                        g
                    } else {
                        p.zeros_like()
                    }
                })
                .collect();
            // Views; `cat` makes the one copy, scaling happens in place on it.
            let mut parts: Vec<Tensor> = grads
                .iter()
                .map(|g| g.reshape([-1]).to_kind(Kind::Float))
                .collect();
            let carries_stats = k == 0;
            let grad_len: i64 = grads.iter().map(|g| numel(g) as i64).sum();
            let mut buffer_len = 0i64;
            if carries_stats {
                let device = loss.device();
                // Batch-norm running statistics ride along, averaged: identical on every rank
                // after every step without a collective of their own.
                if pg.size() > 1 {
                    let inv = 1.0 / pg.size() as f64;
                    for b in &self.buffers {
                        buffer_len += numel(b) as i64;
                        parts.push(b.detach().reshape([-1]).to_kind(Kind::Float) * inv);
                    }
                }
                parts.push(loss.detach().to_kind(Kind::Float).reshape([1]) * n);
                parts.push(Tensor::from_slice(&[n as f32, stop as i32 as f32]).to_device(device));
            }
            let mut flat = Tensor::cat(&parts, 0);
            let _ = flat.narrow(0, 0, grad_len).g_mul_scalar_(n);
            pg.all_reduce(&mut [&mut flat], ReduceOp::Sum)?;
            if buffer_len > 0 {
                unflatten_into(&flat.narrow(0, grad_len, buffer_len), &self.buffers);
            }
            if carries_stats {
                let len = flat.size()[0];
                let tail =
                    Vec::<f32>::try_from(flat.narrow(0, len - 3, 3).to_device(tch::Device::Cpu))
                        .unwrap_or_default();
                let loss_sum = tail.first().copied().unwrap_or(f32::NAN) as f64;
                let samples = tail.get(1).copied().unwrap_or(0.0) as f64;
                let stop = tail.get(2).copied().unwrap_or(0.0) > 0.0;
                stats = StepStats {
                    loss: loss_sum / samples.max(1.0),
                    samples,
                    stop,
                };
            }
            let _ = flat
                .narrow(0, 0, grad_len)
                .g_mul_scalar_(1.0 / stats.samples.max(1.0));
            unflatten_into(&flat, &grads);
        }
        Ok(stats)
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
