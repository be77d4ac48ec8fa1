//! The launcher's error: why a job did not run or did not succeed, with the kind that decides
//! the exit code and, where one exists, the underlying error as its `source()`. `main` prints
//! every one of them from one place.
use tchrun::exit::ErrorKind;

#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// A flag, file or input the user can fix (exit 2).
    #[error("{0}")]
    Invalid(String),
    /// The ranks could not be started (exit 3).
    #[error("{0}")]
    Launch(String),
    /// An operation on a file or socket failed; `context` names it.
    #[error("{context}: {source}")]
    Io {
        context: String,
        kind: ErrorKind,
        #[source]
        source: std::io::Error,
    },
    /// The training job's input checks (shared with the ranks).
    #[error(transparent)]
    Preflight(tchrun_data::preflight::PreflightError),
    /// An output or log directory that is, contains or lies inside an input (exit 2).
    #[error(transparent)]
    Overlap(#[from] Box<tchrun::overlap::OverlapError>),
    /// The output or log directory is another job's (its lock is held), or cannot be locked.
    #[error(transparent)]
    Lock(#[from] tchrun::lock::LockError),
    /// SIGINT/SIGTERM (`signal`) before the ranks started (an archive's extraction): the
    /// message says what was interrupted and what was cleaned up (exit 130/143).
    #[error("{message}")]
    Interrupted { signal: i32, message: String },
    /// `--model`: not a usable model directory.
    #[error("--model {0}")]
    Model(#[from] tchrun::model::InvalidModelDirectory),
    /// `--images`: not a usable image folder.
    #[error("--images {0}")]
    Images(#[source] tchrun_data::DatasetError),
    /// No rank made progress for `--hang-timeout`; the job was stopped (exit 4).
    #[error("{0}")]
    Hung(String),
    /// A rank failed: `report` is the failure summary as printed (first failing rank, host,
    /// cause, the tail of its log); `kind` decides the exit code.
    #[error("{report}")]
    RankFailed { kind: ErrorKind, report: String },
}

/// A flag group that could not become a rank's argv (a path that is not UTF-8): the user's to
/// fix (exit 2).
impl From<tchrun::argv::ArgvError> for JobError {
    fn from(e: tchrun::argv::ArgvError) -> Self {
        JobError::Invalid(e.to_string())
    }
}

impl From<tchrun_data::preflight::PreflightError> for JobError {
    fn from(e: tchrun_data::preflight::PreflightError) -> JobError {
        use tchrun_data::preflight::PreflightError;
        match e {
            PreflightError::Dataset { flag, error } => JobError::from_dataset(error, |error| {
                JobError::Preflight(PreflightError::Dataset { flag, error })
            }),
            e => JobError::Preflight(e),
        }
    }
}

impl JobError {
    /// A dataset error: an interrupted extraction becomes [`JobError::Interrupted`], anything
    /// else goes through `other`.
    pub fn from_dataset(
        e: tchrun_data::DatasetError,
        other: impl FnOnce(tchrun_data::DatasetError) -> JobError,
    ) -> JobError {
        match e {
            e @ tchrun_data::DatasetError::Interrupted { signal, .. } => JobError::Interrupted {
                signal,
                message: e.to_string(),
            },
            e => other(e),
        }
    }

    pub fn invalid(message: impl Into<String>) -> JobError {
        JobError::Invalid(message.into())
    }

    pub fn launch(message: impl Into<String>) -> JobError {
        JobError::Launch(message.into())
    }

    /// An I/O failure on something the user named (exit 2).
    pub fn input_io(context: impl Into<String>, source: std::io::Error) -> JobError {
        JobError::Io {
            context: context.into(),
            kind: ErrorKind::InvalidInput,
            source,
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            JobError::Interrupted { signal, .. } => {
                if tchrun::interrupt::exit_code(*signal) == tchrun::exit::code::INTERRUPTED_INT {
                    ErrorKind::InterruptedInt
                } else {
                    ErrorKind::InterruptedTerm
                }
            }
            JobError::Invalid(_)
            | JobError::Preflight(_)
            | JobError::Overlap(_)
            | JobError::Lock(_)
            | JobError::Model(_)
            | JobError::Images(_) => ErrorKind::InvalidInput,
            JobError::Launch(_) => ErrorKind::LaunchFailed,
            JobError::Io { kind, .. } | JobError::RankFailed { kind, .. } => *kind,
            JobError::Hung(_) => ErrorKind::RankFailed,
        }
    }

    /// The text `main` prints on stderr: a failure summary as it is, anything else as
    /// `tchrun: error: ...`.
    pub fn render(&self) -> String {
        match self {
            JobError::RankFailed { report, .. } => report.clone(),
            JobError::Interrupted { message, .. } => format!("tchrun: {message}\n"),
            e => format!("tchrun: error: {e}\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::error::Error as _;

    #[test]
    fn kinds_decide_exit_codes_and_sources_chain() {
        let e = JobError::input_io(
            "--hostfile /x",
            std::io::Error::new(std::io::ErrorKind::NotFound, "No such file or directory"),
        );
        assert_eq!(e.to_string(), "--hostfile /x: No such file or directory");
        assert_eq!(e.kind().exit_code(), 2);
        assert!(e.source().is_some(), "the io::Error is the source");
        assert_eq!(JobError::launch("x").kind().exit_code(), 3);
        assert_eq!(JobError::Hung("x".into()).kind().exit_code(), 4);
        let r = JobError::RankFailed {
            kind: ErrorKind::Diverged,
            report: "tchrun: rank 1 failed first\n".into(),
        };
        assert_eq!(r.render(), "tchrun: rank 1 failed first\n");
        assert_eq!(r.kind(), ErrorKind::Diverged);
        assert_eq!(JobError::invalid("bad").render(), "tchrun: error: bad\n");
    }
}
