//! Resuming from `--output`'s checkpoint: rank 0 reads it and announces it through the store
//! (the momentum buffers it holds, so the others make exactly those); the tensors reach the
//! other ranks by broadcast.
use super::{RankCtx, TrainError};
use crate::checkpoint;
use crate::optim::Sgd;
use std::collections::BTreeMap;
use tch::Tensor;
use tchrun::flags::TrainJob;
use tchrun::metrics::EpochMetrics;
use tchrun::schedule::EarlyStopping;

/// Training state restored from a checkpoint (or fresh).
pub(super) struct Resume {
    pub(super) epoch: u32,
    pub(super) batches_done: u64,
    pub(super) step: u64,
    pub(super) stopping: EarlyStopping,
    pub(super) history: Vec<EpochMetrics>,
    pub(super) partial: (f64, f64, f64),
    pub(super) loss_scale: Option<f64>,
}

pub(super) fn fresh(patience: u32) -> Resume {
    Resume {
        epoch: 0,
        batches_done: 0,
        step: 0,
        stopping: EarlyStopping::new(patience),
        history: Vec::new(),
        partial: (0.0, 0.0, 0.0),
        loss_scale: None,
    }
}

/// Rank 0 reads the checkpoint and shares its description through the store; the tensors
/// reach the other ranks by broadcast (no shared file system needed).
pub(super) fn load_resume(
    job: &TrainJob,
    ctx: &RankCtx,
    named: &[(String, Tensor)],
    opt: &mut Sgd,
    best: &mut Option<BTreeMap<String, Tensor>>,
) -> Result<Option<checkpoint::Meta>, TrainError> {
    const KEY: &str = "tchrun/resume";
    // The names of the momentum buffers rank 0 holds (a checkpoint may hold none: --momentum 0,
    // or fp16 stopped before its first applied step): the other ranks make exactly these, so
    // that everyone enters the same broadcast.
    const MOMENTUM_KEY: &str = "tchrun/resume-momentum";
    let pg = ctx.pg;
    if pg.rank() == 0 {
        let loaded = if job.options.resume {
            checkpoint::load(&job.output).map_err(TrainError::Checkpoint)?
        } else {
            None
        };
        let text = match &loaded {
            Some(l) => {
                serde_json::to_string(&l.meta).map_err(|e| TrainError::Checkpoint(e.to_string()))?
            }
            None => String::new(),
        };
        let momentum_names: Vec<&String> = loaded
            .as_ref()
            .map(|l| l.momentum.keys().collect())
            .unwrap_or_default();
        let names = serde_json::to_string(&momentum_names)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        ctx.store.set(MOMENTUM_KEY, names.as_bytes())?;
        ctx.store.set(KEY, text.as_bytes())?;
        let Some(l) = loaded else { return Ok(None) };
        tch::no_grad(|| -> Result<(), TrainError> {
            for (name, t) in named {
                let src = l
                    .model
                    .get(name)
                    .ok_or_else(|| TrainError::Checkpoint(format!("checkpoint lacks '{name}'")))?;
                t.detach().copy_(&src.to_kind(t.kind()));
            }
            Ok(())
        })?;
        opt.load_state(l.momentum);
        *best = l.best;
        Ok(Some(l.meta))
    } else {
        let text = ctx.store.get(KEY)?;
        if text.is_empty() {
            return Ok(None);
        }
        let meta: checkpoint::Meta =
            serde_json::from_slice(&text).map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        let names: Vec<String> = serde_json::from_slice(&ctx.store.get(MOMENTUM_KEY)?)
            .map_err(|e| TrainError::Checkpoint(e.to_string()))?;
        // Placeholders the broadcast from rank 0 fills: exactly the buffers rank 0 has.
        let mut zeros = BTreeMap::new();
        for name in names {
            let Some((_, p)) = opt.params().iter().find(|(n, _)| *n == name) else {
                return Err(TrainError::Checkpoint(format!(
                    "the checkpoint's momentum buffer '{name}' is not a parameter of this model"
                )));
            };
            zeros.insert(name, p.detach().zeros_like());
        }
        opt.load_state(zeros);
        Ok(Some(meta))
    }
}
