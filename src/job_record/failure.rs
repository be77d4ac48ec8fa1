//! `failure.json`: the failure summary of a job (the first failing rank, its host, the cause,
//! the tail of its log; with `--max-restarts`, the earlier attempts), written by the launcher
//! when a job fails and read back by `tchrun logs`.
use super::cause::Cause;
use super::classification::Classification;
use super::hang::HangVerdict;
use super::restarts::Attempt;
use crate::exit::ErrorKind;
use crate::files;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Lines of the launcher's output a launch failure keeps.
const LAUNCH_TAIL: usize = 15;

/// The failure summary of a job.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailureSummary {
    pub rank: Option<usize>,
    pub host: Option<String>,
    pub local_rank: Option<usize>,
    pub exit_code: Option<i32>,
    pub signal: Option<i32>,
    pub time: Option<String>,
    pub classification: Classification,
    pub message: String,
    pub log: Option<PathBuf>,
    pub tail: Vec<String>,
    pub exit_status: i32,
    /// Earlier attempts of a job that restarted (`--max-restarts`), oldest first; the fields
    /// above describe the last attempt.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub earlier_attempts: Vec<Attempt>,
    /// Why tchrun did not restart after this attempt although `--max-restarts` had restarts
    /// left (no progress, or `--min-nodes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_restarted: Option<String>,
    /// A hang the launcher's watch found: the ranks at fault, those waiting, the collective.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hang: Option<HangVerdict>,
    /// Why the rank failed, when tchrun could tell (`Cause`: its class, what was found, the
    /// advice).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<Cause>,
}

impl FailureSummary {
    /// The job hung (the heartbeat watch's `verdict`, or no rank wrote its log for
    /// `--hang-timeout`): the job was stopped (exit 4).
    pub fn hang(message: String, verdict: Option<HangVerdict>) -> FailureSummary {
        FailureSummary {
            rank: None,
            host: None,
            local_rank: None,
            exit_code: None,
            signal: None,
            time: Some(files::timestamp_now()),
            classification: Classification::Hang,
            message,
            log: None,
            tail: Vec::new(),
            exit_status: ErrorKind::RankFailed.exit_code(),
            earlier_attempts: Vec::new(),
            not_restarted: None,
            hang: verdict,
            cause: None,
        }
    }

    /// The ranks never started (no driver log): mpirun/srun's exit code and the last lines of
    /// its output (exit 3).
    pub fn launch_failure(
        message: String,
        launcher_code: i32,
        output: &[String],
    ) -> FailureSummary {
        FailureSummary {
            rank: None,
            host: None,
            local_rank: None,
            exit_code: Some(launcher_code),
            signal: None,
            time: None,
            classification: Classification::LaunchError,
            message,
            log: None,
            tail: output
                .iter()
                .rev()
                .take(LAUNCH_TAIL)
                .rev()
                .cloned()
                .collect(),
            exit_status: ErrorKind::LaunchFailed.exit_code(),
            earlier_attempts: Vec::new(),
            not_restarted: None,
            hang: None,
            cause: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job_record::{Record, RecordError};

    #[test]
    fn the_summary_keeps_its_documented_shape_and_reads_back() {
        let t = tempfile::tempdir().unwrap();
        assert!(FailureSummary::read(t.path()).unwrap().is_none());
        let output: Vec<String> = (0..20).map(|i| format!("line {i}")).collect();
        let s = FailureSummary::launch_failure("the ranks could not be started".into(), 1, &output);
        assert_eq!(s.tail.first().map(String::as_str), Some("line 5"));
        s.write(t.path()).unwrap();
        let text = std::fs::read_to_string(t.path().join("failure.json")).unwrap();
        // Field names in the order written (design.md, README's `failure.json`).
        let keys: Vec<&str> = text
            .lines()
            .filter_map(|l| l.strip_prefix("  \"")?.split('"').next())
            .collect();
        assert_eq!(
            keys,
            [
                "rank",
                "host",
                "local_rank",
                "exit_code",
                "signal",
                "time",
                "classification",
                "message",
                "log",
                "tail",
                "exit_status"
            ],
            "no earlier_attempts or not_restarted unless there are"
        );
        assert!(text.contains("\"exit_status\": 3"), "{text}");
        assert_eq!(FailureSummary::read(t.path()).unwrap(), Some(s));
        std::fs::write(t.path().join("failure.json"), "{").unwrap();
        assert!(matches!(
            FailureSummary::read(t.path()),
            Err(RecordError::Parse { .. })
        ));
    }
}
