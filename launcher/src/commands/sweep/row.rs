//! One run's row of `tchrun sweep results` (`Row`): built by `results.rs`, kept in
//! `sweep.json` by `record.rs`.
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// One run's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Row {
    pub index: usize,
    /// The run's folder name.
    pub point: String,
    /// Its flags (the point's part).
    pub flags: Vec<String>,
    pub best_epoch: Option<u32>,
    pub top1: Option<f64>,
    pub top5: Option<f64>,
    pub val_loss: Option<f64>,
    /// Mean training images per second over its epochs.
    pub images_per_sec: Option<f64>,
    pub state: String,
    /// The trained model directory (finished runs).
    pub model: Option<PathBuf>,
    /// An unfinished run's cause (`failure.json`) or where it stopped.
    pub cause: String,
}
