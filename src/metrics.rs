//! `metrics.jsonl`: one JSON object per epoch (schema versioned).
use serde::{Deserialize, Serialize};

pub const SCHEMA_VERSION: u32 = 1;

/// One epoch of training, as written to `metrics.jsonl` and shown in the plot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpochMetrics {
    pub schema: u32,
    /// 1-based epoch.
    pub epoch: u32,
    /// Mean training loss over the epoch (all ranks).
    pub train_loss: f64,
    /// Training images per second over all ranks.
    pub train_images_per_sec: f64,
    pub val_loss: f64,
    /// Validation top-1 / top-5 accuracy in [0, 1].
    pub top1: f64,
    pub top5: f64,
    /// LR of the epoch's last step (effective, i.e. scaled by the world size).
    pub lr: f64,
    pub epoch_time_s: f64,
    /// Wall-clock time at the end of the epoch (RFC 3339).
    pub time: String,
    /// Images left out of this epoch under `--skip-bad-images`: those the pre-flight refused
    /// plus those that failed to decode during the epoch (training and validation, all ranks).
    /// Absent in rows written before it existed.
    #[serde(default)]
    pub skipped_images: u64,
}
