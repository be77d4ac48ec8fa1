//! File names of the log directory and the model directories, written once here.
use std::path::{Path, PathBuf};

/// Launch output of mpirun/srun and the launcher itself.
pub const MPI_LOG: &str = "70_mpi_log";
/// Prefix of the per-rank driver logs.
pub const DRIVER_LOG_PREFIX: &str = "70_driver_log_";
/// Rank table written by the launcher.
pub const RANKS_JSON: &str = "ranks.json";
/// Failure summary written by the launcher.
pub const FAILURE_JSON: &str = "failure.json";
/// The launcher's image-header verification, reused by the ranks (`preflight::VerifiedInputs`).
pub const VERIFIED_INPUTS: &str = "verified_inputs.json";
/// Model description inside a model directory.
pub const MODEL_JSON: &str = "model.json";
/// Weights inside a trained model directory.
pub const MODEL_WEIGHTS: &str = "model.safetensors";
/// Per-epoch metrics, one JSON object a line.
pub const METRICS_JSONL: &str = "metrics.jsonl";
/// Plot of the metrics.
pub const METRICS_PLOT: &str = "metrics.png";
/// Log directory inside `--output` when `--log-dir` is not given.
pub const DEFAULT_LOG_SUBDIR: &str = "logs";
/// Driver-log prefix of a line naming an image dropped under `--skip-bad-images` (once per
/// file per rank); the launcher counts the distinct files for its run report.
pub const SKIPPED_IMAGE: &str = "skipped bad image: ";

/// `<log_dir>/70_driver_log_<rank>`.
pub fn driver_log(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("{DRIVER_LOG_PREFIX}{rank}"))
}

/// The rank a driver log file name belongs to, if it is one.
pub fn driver_log_rank(file_name: &str) -> Option<usize> {
    file_name.strip_prefix(DRIVER_LOG_PREFIX)?.parse().ok()
}

/// `<log_dir>/70_mpi_log`.
pub fn mpi_log(log_dir: &Path) -> PathBuf {
    log_dir.join(MPI_LOG)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_log_round_trip() {
        let p = driver_log(Path::new("/x"), 12);
        assert_eq!(p, Path::new("/x/70_driver_log_12"));
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default();
        assert_eq!(driver_log_rank(name), Some(12));
        assert_eq!(driver_log_rank("70_mpi_log"), None);
    }
}

/// Now as RFC 3339 UTC with milliseconds: the one timestamp format of tchrun's files
/// (driver logs, `failure.json`, `metrics.jsonl`).
pub fn timestamp_now() -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string()
}
