//! Resuming from `--output`'s checkpoint: rank 0 reads it and announces it through the store
//! (the optimizer state it holds, so the others make exactly those); the tensors reach the
//! other ranks by broadcast.
use super::{RankCtx, TrainError};
use crate::comm::ddp::Replicator;
use crate::comm::pg::ProcessGroup;
use crate::train::checkpoint;
use crate::train::optim::Optimizer;
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
    /// The fp16 loss scaler's state in the checkpoint, when its run scaled the loss.
    pub(super) loss_scaler: Option<tchrun::checkpoint::LossScalerState>,
}

/// This rank's record of the run (`last.json`'s `run`): the job's, with the intra-op threads
/// it runs.
pub(super) fn run_record(
    job: &TrainJob,
    cfg: &tchrun::model::ModelConfig,
    classes: &[String],
) -> tchrun::checkpoint::RunRecord {
    let mut r = tchrun::checkpoint::RunRecord::of(job, cfg, classes);
    r.intra_op_threads = u32::try_from(tch::get_num_threads()).ok();
    r
}

pub(super) fn fresh(patience: u32) -> Resume {
    Resume {
        epoch: 0,
        batches_done: 0,
        step: 0,
        stopping: EarlyStopping::new(patience),
        history: Vec::new(),
        partial: (0.0, 0.0, 0.0),
        loss_scaler: None,
    }
}

/// What rank 0 decided about `--output`'s checkpoint, as every rank learns it.
pub(super) enum Start {
    /// A new run (no checkpoint, `--overwrite`, or `--resume` with nothing to resume).
    Fresh,
    /// A `--resume` of a finished run with `--epochs` not larger: nothing to do.
    Complete,
    /// Resume from this state.
    Resume(Box<checkpoint::Meta>),
}

/// Rank 0's announcement through the store.
#[derive(serde::Serialize, serde::Deserialize)]
enum Announce {
    Fresh,
    Complete,
    Resume(Box<checkpoint::Meta>),
    /// The check refused the checkpoint (or this job against it): every rank exits with it.
    Refused(String),
}

/// Rank 0 decides what to do with `--output`'s checkpoint (`tchrun::checkpoint::check`, the
/// launcher's pre-flight decision, repeated for jobs started without the launcher), reads it
/// and shares the decision through the store; the tensors reach the other ranks by broadcast
/// (no shared file system needed). A refusal ends every rank with the same message (exit 2).
#[allow(clippy::too_many_arguments)]
pub(super) fn load_resume(
    job: &TrainJob,
    ctx: &RankCtx,
    cfg: &tchrun::model::ModelConfig,
    classes: &[String],
    named: &[(String, Tensor)],
    opt: &mut Optimizer,
    best: &mut Option<BTreeMap<String, Tensor>>,
    ema: &mut Option<BTreeMap<String, Tensor>>,
) -> Result<Start, TrainError> {
    const KEY: &str = "tchrun/resume";
    // The names of the optimizer state rank 0 holds (a checkpoint may hold none: --momentum 0,
    // or fp16 stopped before its first applied step): the other ranks make exactly these, so
    // that everyone enters the same broadcast.
    const MOMENTUM_KEY: &str = "tchrun/resume-momentum";
    let pg = ctx.pg;
    let json = |e: serde_json::Error| TrainError::Checkpoint(e.to_string());
    if pg.rank() == 0 {
        let announce = |a: &Announce, momentum: &[&String]| -> Result<(), TrainError> {
            ctx.store.set(
                MOMENTUM_KEY,
                serde_json::to_string(momentum).map_err(json)?.as_bytes(),
            )?;
            ctx.store
                .set(KEY, serde_json::to_string(a).map_err(json)?.as_bytes())?;
            Ok(())
        };
        use tchrun::checkpoint::Decision;
        let decision = match tchrun::checkpoint::check(job, cfg, classes) {
            Ok(d) => d,
            Err(e) => {
                let msg = e.to_string();
                announce(&Announce::Refused(msg.clone()), &[])?;
                return Err(TrainError::Invalid(msg));
            }
        };
        match decision {
            Decision::Fresh | Decision::Overwrite { .. } | Decision::NothingToResume => {
                if decision == Decision::NothingToResume {
                    (ctx.say)(&format!(
                        "--resume: no checkpoint in {}; training starts from the beginning",
                        job.output.display()
                    ));
                }
                if let Decision::Overwrite { previous } = &decision {
                    (ctx.say)(&format!(
                        "--overwrite: replacing the run in {}{}",
                        job.output.display(),
                        previous
                            .as_ref()
                            .map(|p| format!(" (its checkpoint of step {})", p.step))
                            .unwrap_or_default()
                    ));
                }
                // Nothing of an earlier run in --output is continued: its metrics, model and
                // checkpoint go before this run writes its own.
                crate::train::outputs::clear_previous_run(&job.output)
                    .map_err(TrainError::Output)?;
                announce(&Announce::Fresh, &[])?;
                return Ok(Start::Fresh);
            }
            Decision::Complete { .. } => {
                announce(&Announce::Complete, &[])?;
                return Ok(Start::Complete);
            }
            Decision::Resume { notes, last } => {
                // The launcher printed them before the ranks started; the driver log keeps them.
                for n in notes {
                    tracing::info!("--resume: {n}");
                }
                let threads = u32::try_from(tch::get_num_threads()).unwrap_or(0);
                if let Some(n) = last.run.as_ref().and_then(|r| r.threads_note(threads)) {
                    (ctx.say)(&format!("--resume: note: {n}"));
                }
            }
        }
        let l = match checkpoint::load(&job.output) {
            Ok(Some(l)) => l,
            Ok(None) => {
                let msg = format!(
                    "--resume: the checkpoint in {} disappeared while the job started",
                    checkpoint::dir(&job.output).display()
                );
                announce(&Announce::Refused(msg.clone()), &[])?;
                return Err(TrainError::Checkpoint(msg));
            }
            Err(e) => {
                announce(&Announce::Refused(e.clone()), &[])?;
                return Err(TrainError::Checkpoint(e));
            }
        };
        // Every tensor of the model, of its shape (a checkpoint from before the run record is
        // not compared with the model in the pre-flight).
        let misfit = named.iter().find_map(|(n, t)| match l.model.get(n) {
            None => Some(format!("it lacks '{n}'")),
            Some(c) if c.size() != t.size() => Some(format!(
                "its '{n}' has shape {:?}, the model's {:?}",
                c.size(),
                t.size()
            )),
            Some(_) => None,
        });
        if let Some(why) = misfit {
            let msg = format!(
                "--resume: the checkpoint in {} is not of this model ({}, input size {}): {why}; \
                 resume with the --model it was trained from, or start over with --overwrite",
                checkpoint::dir(&job.output).display(),
                cfg.arch.name(),
                cfg.input_size
            );
            announce(&Announce::Refused(msg.clone()), &[])?;
            return Err(TrainError::Invalid(msg));
        }
        let state_names: Vec<String> = l.optimizer.keys().cloned().collect();
        if let Err(e) = opt.load_state(l.optimizer) {
            let msg = format!(
                "--resume: the checkpoint in {}: {e}; resume with the flags it was trained with, \
                 or start over with --overwrite",
                checkpoint::dir(&job.output).display()
            );
            announce(&Announce::Refused(msg.clone()), &[])?;
            return Err(TrainError::Checkpoint(msg));
        }
        let state_names: Vec<&String> = state_names.iter().collect();
        announce(&Announce::Resume(Box::new(l.meta.clone())), &state_names)?;
        tch::no_grad(|| -> Result<(), TrainError> {
            for (name, t) in named {
                if let Some(src) = l.model.get(name) {
                    t.detach().copy_(&src.to_kind(t.kind()));
                }
            }
            Ok(())
        })?;
        // Only rank 0 writes the model, so only it keeps the best weights.
        *best = l.best;
        *ema = Some(l.ema);
        Ok(Start::Resume(Box::new(l.meta)))
    } else {
        receive(ctx, opt, KEY, MOMENTUM_KEY)
    }
}

/// A rank other than 0: rank 0's decision from the store (`key`), and for a resume the
/// placeholders of the optimizer state it announced (`state_key`), which its broadcast fills.
fn receive(
    ctx: &RankCtx,
    opt: &mut Optimizer,
    key: &str,
    state_key: &str,
) -> Result<Start, TrainError> {
    let json = |e: serde_json::Error| TrainError::Checkpoint(e.to_string());
    let text = ctx.store.get(key)?;
    let meta = match serde_json::from_slice::<Announce>(&text).map_err(json)? {
        Announce::Fresh => return Ok(Start::Fresh),
        Announce::Complete => return Ok(Start::Complete),
        Announce::Refused(msg) => return Err(TrainError::Invalid(msg)),
        Announce::Resume(meta) => meta,
    };
    let names: Vec<String> = serde_json::from_slice(&ctx.store.get(state_key)?).map_err(json)?;
    // Placeholders the broadcast from rank 0 fills: exactly the state rank 0 has (which it
    // checked against this model before announcing it).
    let mut zeros = BTreeMap::new();
    for name in names {
        let t = opt.placeholder(&name).map_err(TrainError::Checkpoint)?;
        zeros.insert(name, t);
    }
    opt.load_state(zeros).map_err(TrainError::Checkpoint)?;
    Ok(Start::Resume(meta))
}

/// Rank 0's optimizer state (a resumed checkpoint's; none on a fresh start) to every rank, so
/// the replicas step alike; the step counts too (`Optimizer::state` makes tensors of them,
/// read back after the broadcast).
pub(super) fn broadcast_optimizer_state(
    pg: &ProcessGroup,
    opt: &mut Optimizer,
) -> Result<(), TrainError> {
    let state = opt.state();
    if pg.size() == 1 || state.is_empty() {
        return Ok(());
    }
    let tensors: Vec<Tensor> = state.values().map(|t| t.shallow_clone()).collect();
    Replicator::broadcast_tensors(pg, &tensors)?;
    opt.load_state(state).map_err(TrainError::Checkpoint)
}
