//! The error of an export step that failed (exit 4 with the step's words), shared by the
//! command (`mod.rs`) and its ONNX step (`onnx.rs`).
use crate::error::JobError;
use tchrun::exit::ErrorKind;

/// A failed export step: `message` says what it said.
pub(super) fn failed(message: String) -> JobError {
    JobError::RankFailed {
        kind: ErrorKind::RankFailed,
        report: message,
    }
}
