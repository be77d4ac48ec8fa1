//! `DIR/sweep.json` (the sweep's grid, its runs, the arrays submitted, the last results) and
//! the state of one run read from its folder (`checkpoints/last.json`, `logs/failure.json`,
//! `logs/status.json`): what a re-run of the sweep does with it.
use super::grid::{Param, Point};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tchrun::files;
use tchrun::job_record::{FailureSummary, JobStatus, Record};

pub const SWEEP_JSON: &str = "sweep.json";
pub const FORMAT_VERSION: u32 = 1;

/// One run of the sweep as `sweep.json` keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// Its index: the Slurm array task id that runs it.
    pub index: usize,
    #[serde(flatten)]
    pub point: Point,
    /// Its `--output` (`DIR/<name>`).
    pub output: PathBuf,
    /// Times the sweep started it again after it had failed (at most one).
    #[serde(default)]
    pub retries: u32,
}

/// A job array the sweep submitted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ArrayJob {
    pub job_id: u64,
    /// `#SBATCH --array=`'s value: the task ids (run indices) and `%N`.
    pub tasks: String,
    pub submitted: String,
}

/// `sweep.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepRecord {
    pub format_version: u32,
    /// The flags after `--`: every run's.
    pub run_flags: Vec<String>,
    /// The launch flags of the last invocation (may change between invocations).
    pub launch_flags: Vec<String>,
    pub params: Vec<Param>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub param_file: Option<PathBuf>,
    pub runs: Vec<RunRecord>,
    #[serde(default)]
    pub arrays: Vec<ArrayJob>,
    /// The table `tchrun sweep results` printed last (also `results.csv`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<super::row::Row>>,
}

/// `sweep.json` could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum SweepFileError {
    #[error("{path}: cannot read it: {source}")]
    Read {
        path: PathBuf,
        source: tchrun::files::BoundedReadError,
    },
    #[error("{path}: not a sweep record ({source}); was it written by `tchrun sweep`? Choose another --output")]
    Parse {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: cannot write it: {source}")]
    Write {
        path: PathBuf,
        source: tchrun::files::AtomicWriteError,
    },
}

impl SweepRecord {
    pub fn path(dir: &Path) -> PathBuf {
        dir.join(SWEEP_JSON)
    }

    /// The sweep in `dir`, None when there is none yet.
    pub fn read(dir: &Path) -> Result<Option<SweepRecord>, SweepFileError> {
        let path = Self::path(dir);
        let bytes = match files::read_bounded(&path, files::caps::RECORD) {
            Ok(b) => b,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(source) => return Err(SweepFileError::Read { path, source }),
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| SweepFileError::Parse { path, source })
    }

    /// Writes `dir/sweep.json` atomically.
    pub fn write(&self, dir: &Path) -> Result<(), SweepFileError> {
        let path = Self::path(dir);
        let mut text = serde_json::to_vec_pretty(self).unwrap_or_default();
        text.push(b'\n');
        files::write_atomic(&path, &text).map_err(|source| SweepFileError::Write { path, source })
    }
}

/// Where a run is, from its folder.
#[derive(Debug, Clone, PartialEq)]
pub enum RunState {
    /// Nothing of it yet.
    NotStarted,
    /// Its ranks run now (`status.json` not ended and written in the last minute).
    Running,
    /// Stopped before the end with a checkpoint to resume from.
    Interrupted { epoch: u32, step: u64 },
    /// Started, ended without a checkpoint and without a failure record (killed early).
    NoCheckpoint,
    /// `failure.json`: the class and message of its first failing rank's cause.
    Failed { cause: String },
    /// The model is written (`last.json` says finished).
    Finished,
}

impl RunState {
    /// The state's word in the results.
    pub fn word(&self) -> &'static str {
        match self {
            RunState::NotStarted => "not started",
            RunState::Running => "running",
            RunState::Interrupted { .. } => "interrupted",
            RunState::NoCheckpoint => "interrupted",
            RunState::Failed { .. } => "failed",
            RunState::Finished => "finished",
        }
    }

    /// What the results say of an unfinished run (its cause, where it stopped).
    pub fn detail(&self) -> String {
        match self {
            RunState::Interrupted { epoch, step } => {
                format!("stopped at epoch {epoch}, step {step}; re-run the sweep to resume it")
            }
            RunState::NoCheckpoint => "ended before its first checkpoint".into(),
            RunState::Failed { cause } => cause.clone(),
            _ => String::new(),
        }
    }
}

/// One line of a failure record: the cause's class and its message.
fn cause_line(f: &FailureSummary) -> String {
    let msg = f.message.lines().next().unwrap_or("").trim();
    match &f.cause {
        Some(c) => format!("{}: {msg}", c.class()),
        None => format!("{}: {msg}", f.classification),
    }
}

/// Whether a job holds the run's lock now (a running job always does: the launcher, or rank 0
/// of ranks started by srun, takes it before anything is written, and removes it at the end):
/// the holder its lock file names is a live process of this host. None: another host's holder
/// (or a file being written), for the caller to judge by `status.json`.
fn held(output: &Path) -> Option<bool> {
    let text = match files::read_bounded_string(&tchrun::lock::lock_path(output), 1 << 16) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Some(false),
        Err(_) => return None,
    };
    let info: tchrun::lock::LockInfo = serde_json::from_str(text.trim()).ok()?;
    if info.host != tchrun::lock::LockInfo::here("").host {
        return None;
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(info.pid).ok()?);
    Some(!matches!(
        nix::sys::signal::kill(pid, None),
        Err(nix::errno::Errno::ESRCH)
    ))
}

/// The state of the run whose `--output` is `output`.
pub fn run_state(output: &Path) -> RunState {
    let logs = output.join(files::DEFAULT_LOG_SUBDIR);
    let last = tchrun::checkpoint::read(output).ok().flatten();
    if last.as_ref().is_some_and(|l| l.finished) {
        return RunState::Finished;
    }
    let running = held(output).unwrap_or_else(|| {
        // Another host's job (or no lock file): its status.json rewritten lately.
        let now = std::time::SystemTime::now();
        JobStatus::read(&logs)
            .ok()
            .flatten()
            .is_some_and(|s| !s.state.is_end() && !crate::commands::status::is_stale(&s, now))
    });
    if running {
        return RunState::Running;
    }
    if let Ok(Some(f)) = FailureSummary::read(&logs) {
        return RunState::Failed {
            cause: cause_line(&f),
        };
    }
    match last {
        Some(l) => RunState::Interrupted {
            epoch: l.epoch,
            step: l.step,
        },
        None if logs.exists() => RunState::NoCheckpoint,
        None => RunState::NotStarted,
    }
}

/// Whether the run has a checkpoint to resume from.
pub fn has_checkpoint(output: &Path) -> bool {
    tchrun::checkpoint::last_json(output).is_file()
}
