//! `TrainError`: how training fails, with the failure kind the driver log records and the
//! error kind the exit code comes from. A leaf of `train`: every part of it returns this.
use crate::comm::pg::C10dError;
use tchrun::driver_log::FailureKind;
use tchrun::exit::ErrorKind;
use tchrun_data::DatasetError;

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
