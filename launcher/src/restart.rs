//! `tchrun train --max-restarts N`: a job that recovers without a human. When a rank fails
//! after the job made progress in this attempt (a newer checkpoint than the one it started
//! from), the attempt's logs move to `<log-dir>/attempt-<n>/`, and after a short bounded
//! back-off every rank starts again with `--resume`. A failure before any progress is not
//! retried (no loop of failing starts); the budget counts restarts of the whole job.
use crate::error::JobError;
use crate::report::FailureSummary;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tchrun::files;

/// Restart policy flags of `tchrun train`.
#[derive(clap::Args, Debug, Clone)]
pub struct RestartArgs {
    /// Restarts of the whole job after a rank failure, each resuming from the last complete
    /// checkpoint (only when the failed attempt wrote a newer one: a job that fails before
    /// making progress is not retried). 0: fail as soon as a rank fails.
    #[arg(long, env = "TCHRUN_MAX_RESTARTS", default_value_t = 0)]
    pub max_restarts: u32,
}

/// One attempt that failed and was restarted, as `restarts.json` and `failure.json` record it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Attempt {
    /// 1 for the first attempt.
    pub attempt: u32,
    /// The first failing rank, its host, and why it failed.
    pub rank: Option<usize>,
    pub host: Option<String>,
    pub classification: String,
    pub cause: String,
    /// tchrun's exit status had it not restarted.
    pub exit_status: i32,
    /// The optimizer step of the checkpoint the next attempt resumed from.
    pub resumed_from_step: Option<u64>,
    /// Where this attempt's logs were moved.
    pub logs: PathBuf,
}

impl Attempt {
    /// One line for the console and the run report.
    pub fn line(&self) -> String {
        let who = match (self.rank, &self.host) {
            (Some(r), Some(h)) => format!("rank {r} ({h})"),
            (Some(r), None) => format!("rank {r}"),
            _ => "the job".to_string(),
        };
        format!(
            "attempt {}: {who} failed: {} ({})",
            self.attempt, self.cause, self.classification
        )
    }
}

/// The optimizer step of the last complete checkpoint in `output`, if any.
pub fn checkpoint_step(output: &Path) -> Option<u64> {
    let path = output
        .join(files::CHECKPOINT_DIR)
        .join(files::CHECKPOINT_LAST);
    let text = std::fs::read_to_string(path).ok()?;
    serde_json::from_str::<serde_json::Value>(&text)
        .ok()?
        .get("step")?
        .as_u64()
}

/// The failure summary the attempt left in `log_dir`.
pub fn read_summary(log_dir: &Path) -> Option<FailureSummary> {
    let text = std::fs::read_to_string(log_dir.join(files::FAILURE_JSON)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Moves the attempt's driver logs, launch log, rank table and failure summary from `log_dir`
/// into `<log_dir>/attempt-<n>/`; returns that directory.
pub fn archive(log_dir: &Path, attempt: u32) -> Result<PathBuf, JobError> {
    let dir = files::attempt_dir(log_dir, attempt);
    std::fs::create_dir_all(&dir)
        .map_err(|e| JobError::input_io(format!("--log-dir {}", dir.display()), e))?;
    let rd = std::fs::read_dir(log_dir)
        .map_err(|e| JobError::input_io(format!("--log-dir {}", log_dir.display()), e))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let ours = files::driver_log_rank(&name).is_some()
            || [files::MPI_LOG, files::RANKS_JSON, files::FAILURE_JSON].contains(&name.as_str());
        if ours {
            std::fs::rename(e.path(), dir.join(&name)).map_err(|err| {
                JobError::input_io(format!("moving {} to {}", name, dir.display()), err)
            })?;
        }
    }
    Ok(dir)
}

/// The wait before restart `n` (1-based): 1 s, 2 s, 4 s, ... at most 16 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(4))
}

/// Waits `d`, or less when tchrun receives SIGINT/SIGTERM: then that signal's number.
pub fn wait_interruptibly(d: Duration) -> std::io::Result<Option<i32>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let flag = Arc::new(AtomicUsize::new(0));
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        ids.push(signal_hook::flag::register_usize(
            sig,
            Arc::clone(&flag),
            sig as usize,
        )?);
    }
    let end = Instant::now() + d;
    let mut got = None;
    while Instant::now() < end {
        let s = flag.load(Ordering::SeqCst);
        if s != 0 {
            got = Some(s as i32);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    Ok(got)
}

/// Writes `restarts.json` (every attempt that was restarted, oldest first).
pub fn write_history(log_dir: &Path, history: &[Attempt]) {
    if let Ok(text) = serde_json::to_string_pretty(history) {
        let _ = files::write_atomic(&log_dir.join(files::RESTARTS_JSON), text.as_bytes());
    }
}

/// The last attempt failed too: its `failure.json` gets the earlier attempts.
pub fn add_history_to_summary(log_dir: &Path, history: &[Attempt]) {
    if history.is_empty() {
        return;
    }
    if let Some(mut s) = read_summary(log_dir) {
        s.earlier_attempts = history.to_vec();
        crate::report::write_summary(log_dir, &s);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_short_and_bounded() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 16, 16, 16]);
    }

    #[test]
    fn the_checkpoint_step_comes_from_last_json() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(checkpoint_step(t.path()), None);
        let d = t.path().join(files::CHECKPOINT_DIR);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(files::CHECKPOINT_LAST),
            r#"{"epoch": 1, "step": 42}"#,
        )
        .unwrap();
        assert_eq!(checkpoint_step(t.path()), Some(42));
    }

    #[test]
    fn archive_moves_only_the_attempts_files() {
        let t = tempfile::tempdir().unwrap();
        let l = t.path();
        for f in [
            "70_driver_log_0",
            "70_driver_log_1",
            "70_mpi_log",
            "ranks.json",
            "failure.json",
        ] {
            std::fs::write(l.join(f), f).unwrap();
        }
        std::fs::write(l.join("verified_inputs.json"), "{}").unwrap();
        let d = archive(l, 1).unwrap();
        assert_eq!(d, l.join("attempt-1"));
        assert_eq!(
            std::fs::read_to_string(d.join("70_driver_log_1")).unwrap(),
            "70_driver_log_1"
        );
        assert!(!l.join("70_driver_log_0").exists() && !l.join("failure.json").exists());
        assert!(
            l.join("verified_inputs.json").exists(),
            "the job's own files stay"
        );
    }

    #[test]
    fn an_attempt_reads_as_one_line() {
        let a = Attempt {
            attempt: 1,
            rank: Some(1),
            host: Some("vm".into()),
            classification: "killed by signal".into(),
            cause: "killed by signal 9".into(),
            exit_status: 4,
            resumed_from_step: Some(12),
            logs: PathBuf::from("/o/logs/attempt-1"),
        };
        assert_eq!(
            a.line(),
            "attempt 1: rank 1 (vm) failed: killed by signal 9 (killed by signal)"
        );
    }
}
