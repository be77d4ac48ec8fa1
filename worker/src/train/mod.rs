//! `tchrun-worker train`: data-parallel training of an image classifier ("Train PyTorch
//! Model"): inputs checked, model replicated from rank 0, sharded epochs through the threaded
//! loader, bucketed gradient all-reduce, warmup + polynomial LR, validation reduced exactly,
//! early stopping on validation loss, NaN stops every rank together, rank 0 writes the model.
mod board;
pub mod checkpoint;
mod clip;
pub mod command;
mod ema;
mod finish;
mod fused;
mod live;
mod mix;
pub mod optim;
pub mod outputs;
mod resume;
pub(crate) mod scaler;
mod setup;
pub(crate) mod step;
pub mod tracking;
mod trainer;
mod validate;
pub(crate) mod window;

use crate::comm::pg::{C10dError, ProcessGroup};
use crate::models;
use tch::{Device, Kind, Tensor};
use tchrun::driver_log::FailureKind;
use tchrun::exit::ErrorKind;
use tchrun::flags::TrainJob;
use tchrun_data::{self as data, DatasetError};
use trainer::Trainer;

/// Why training stopped early.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Preflight(#[from] tchrun_data::preflight::PreflightError),
    #[error("data error during training: {0}")]
    Data(DatasetError),
    #[error(
        "training diverged: {what} became {value} at epoch {epoch}, step {step}. Lower --lr: the \
         effective LR was {effective_lr:e} (--lr {lr:e} × {scaled_by})"
    )]
    Diverged {
        /// What went non-finite: "the loss", "the gradient of fc.weight", ...
        what: String,
        value: f64,
        epoch: u32,
        step: u64,
        effective_lr: f64,
        lr: f64,
        /// What scaled --lr: "world size 2", or the factor and its reason.
        scaled_by: String,
    },
    #[error(transparent)]
    Comm(#[from] C10dError),
    #[error(
        "parameters differ across ranks after training (replicas out of sync): '{0}' is the first \
         tensor that differs"
    )]
    Replicas(String),
    #[error("checkpoint: {0}")]
    Checkpoint(String),
    #[error(
        "stopped by signal {0}{from}; a checkpoint was written: continue with --resume",
        from = crate::rank::signals::sender_note()
    )]
    Stopped(i32),
    /// `--straggler-action exclude`: every rank stops after the epoch's checkpoint so that the
    /// next attempt runs without the slow host(s).
    #[error("{0}")]
    Straggler(String),
    #[error("writing the outputs: {0}")]
    Output(String),
    #[error("tensor error: {0}")]
    Torch(#[from] tch::TchError),
}

impl TrainError {
    /// The failure record's kind of this error (the launcher classifies by it); libtorch's own
    /// messages say more (memory, CUDA) than their types. `by_exit`: the kind of the exit code.
    pub fn failure_kind(&self, by_exit: FailureKind) -> FailureKind {
        use crate::rank::driver_log::torch_failure_kind;
        match self {
            TrainError::Invalid(_) | TrainError::Preflight(_) => FailureKind::InvalidInput,
            TrainError::Data(_) => FailureKind::Data,
            TrainError::Diverged { .. } => FailureKind::Diverged,
            TrainError::Comm(c) => torch_failure_kind(&c.to_string(), FailureKind::Communication),
            TrainError::Replicas(_) => FailureKind::Internal,
            TrainError::Checkpoint(_) | TrainError::Output(_) => FailureKind::Io,
            TrainError::Stopped(_) => FailureKind::Interrupted,
            TrainError::Straggler(_) => FailureKind::Straggler,
            TrainError::Torch(t) => torch_failure_kind(&t.to_string(), by_exit),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            // A hand-started rank's archive extraction interrupted (the partial folder removed).
            TrainError::Preflight(tchrun_data::preflight::PreflightError::Dataset {
                error: DatasetError::Interrupted { signal, .. },
                ..
            }) => {
                if tchrun::interrupt::exit_code(*signal) == tchrun::exit::code::INTERRUPTED_INT {
                    ErrorKind::InterruptedInt
                } else {
                    ErrorKind::InterruptedTerm
                }
            }
            TrainError::Invalid(_) | TrainError::Preflight(_) => ErrorKind::InvalidInput,
            TrainError::Diverged { .. } => ErrorKind::Diverged,
            TrainError::Stopped(sig) if *sig == signal_hook::consts::SIGINT => {
                ErrorKind::InterruptedInt
            }
            TrainError::Stopped(_) => ErrorKind::InterruptedTerm,
            TrainError::Data(_)
            | TrainError::Comm(_)
            | TrainError::Replicas(_)
            | TrainError::Checkpoint(_)
            | TrainError::Output(_)
            | TrainError::Straggler(_)
            | TrainError::Torch(_) => ErrorKind::RankFailed,
        }
    }
}

pub use tchrun_data::preflight::Inputs;

/// Model directory, image directories, output: before any step. `indexes`: the launcher's
/// copies of the train and valid dataset indexes, used (instead of listing the folders) when
/// they describe this rank's copy of the data. Also returns lines for the driver log saying
/// where the file lists came from and what happens to the image headers.
/// `on_decode`: the launcher left the headers to be checked on decode (a large set).
pub fn check_inputs(
    job: &TrainJob,
    indexes: [Option<&std::path::Path>; 2],
    on_decode: bool,
) -> Result<(Inputs, Vec<String>), TrainError> {
    use tchrun_data::preflight::{check_train_job_with, Verification};
    let [train, valid] = indexes;
    let v = Verification::Rank {
        train,
        valid,
        on_decode,
    };
    let checked = check_train_job_with(job, v)?;
    Ok((checked.inputs, checked.notes))
}

/// What the training loop needs from the rank.
pub struct RankCtx<'a> {
    pub pg: &'a ProcessGroup,
    pub store: &'a crate::comm::pg::Store,
    pub device: Device,
    pub local_size: usize,
    /// This rank's host and the job's log directory (`status.json`).
    pub host: &'a str,
    pub log_dir: &'a std::path::Path,
    pub say: &'a dyn Fn(&str),
    /// Rank 0's MLflow run (`--mlflow-tracking-uri`); off elsewhere.
    pub tracking: &'a tracking::Tracking,
}

/// The memory format this rank's model and batches use (`--channels-last`; every rank alike).
fn layout(
    job: &TrainJob,
    device: Device,
    cfg: &tchrun::model::ModelConfig,
) -> crate::layout::Layout {
    crate::layout::choose(
        job.options.layout_setting(),
        device.is_cuda(),
        cfg.arch,
        cfg.input_size as i64,
    )
}

fn to_input(batch: &data::Batch, device: Device, channels_last: bool) -> (Tensor, Tensor) {
    let s = batch.size as i64;
    let x = Tensor::from_slice(&batch.images).view([batch.len as i64, 3, s, s]);
    let y = Tensor::from_slice(&batch.labels);
    let (x, y) = if device.is_cuda() {
        (
            x.pin_memory(device)
                .to_device_(device, Kind::Float, true, false),
            y.to_device_(device, Kind::Int64, true, false),
        )
    } else {
        (x, y)
    };
    if channels_last {
        (models::channels_last(&x), y)
    } else {
        (x, y)
    }
}

fn loader_threads(job: &TrainJob, local_size: usize) -> usize {
    job.options
        .loader_threads
        .map(|t| t as usize)
        .unwrap_or_else(|| tchrun::env::threads_per_rank(local_size))
}

/// A per-rank time split reduced over the group: mean and largest of each value.
struct Split {
    mean: [f64; 4],
    max: [f64; 4],
}

/// One sum and one max all-reduce of four numbers (data wait, compute, communication, loop
/// time) at the end of an epoch; every rank calls it at the same point.
fn time_split(pg: &ProcessGroup, values: [f64; 4]) -> Result<Split, TrainError> {
    let mut sum = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut sum], crate::comm::pg::ReduceOp::Sum)?;
    let mut max = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut max], crate::comm::pg::ReduceOp::Max)?;
    let read = |t: &Tensor| -> Result<[f64; 4], TrainError> {
        let v = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
        let mut out = [0.0; 4];
        for (o, x) in out.iter_mut().zip(v) {
            *o = x;
        }
        Ok(out)
    };
    let n = pg.size().max(1) as f64;
    Ok(Split {
        mean: read(&sum)?.map(|x| x / n),
        max: read(&max)?,
    })
}

/// Trains and (rank 0) writes the model directory: a `Trainer` set up, then run.
pub fn train(job: &TrainJob, inputs: Inputs, ctx: &RankCtx) -> Result<(), TrainError> {
    match Trainer::setup(job, inputs, ctx)? {
        Some(trainer) => trainer.run(),
        None => Ok(()),
    }
}

/// `tests/python/recipe_reference.py MODE`'s JSON: torch's own values for the recipe's unit
/// tests (the venv's Python, made by scripts/setup.sh).
#[cfg(test)]
pub(crate) fn recipe_reference(mode: &str) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tests/python/recipe_reference.py"))
        .arg(mode)
        .output()
        .expect("the venv's python (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}
