//! Why an export failed, and the exit code that says so.
use crate::models;

#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error(transparent)]
    Model(#[from] tchrun::model::InvalidModelDirectory),
    #[error(transparent)]
    Weights(#[from] models::WeightsError),
    #[error("--check-images {path}: {why}")]
    Images {
        path: std::path::PathBuf,
        why: String,
    },
    #[error("{0}")]
    Mismatch(String),
    #[error("tracing the model: {0}")]
    Torch(#[from] tch::TchError),
    #[error("{path}: {why}")]
    Write {
        path: std::path::PathBuf,
        why: String,
    },
}

impl ExportError {
    /// Exit 2 for what the user gave, 4 for a graph that does not agree or cannot be made.
    pub fn kind(&self) -> tchrun::exit::ErrorKind {
        match self {
            ExportError::Model(_) | ExportError::Weights(_) | ExportError::Images { .. } => {
                tchrun::exit::ErrorKind::InvalidInput
            }
            _ => tchrun::exit::ErrorKind::RankFailed,
        }
    }
}
