//! `last.json` itself: [`Last`], where it lies, how it is read and parsed, the best weights it
//! names and the check of the tensor files without libtorch.
use super::run_record::RunRecord;
use crate::metrics::EpochMetrics;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const FORMAT_VERSION: u32 = 1;

/// The checkpoint directory of a training output.
pub fn dir(output: &Path) -> PathBuf {
    output.join(crate::files::CHECKPOINT_DIR)
}

/// `checkpoints/last.json` of a training output.
pub fn last_json(output: &Path) -> PathBuf {
    dir(output).join(crate::files::CHECKPOINT_LAST)
}

/// What `last.json` records. Fields added after format 1 are optional, so older checkpoints
/// are still read.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Last {
    pub format_version: u32,
    /// Epochs fully done (0-based index of the epoch to run next when `batches_done == 0`).
    pub epoch: u32,
    /// Optimizer steps of `epoch` already done (a mid-epoch stop), with the sharding of
    /// `world_size` ranks (or of `global_batch_size`).
    pub batches_done: u64,
    /// Optimizer steps taken in all.
    pub step: u64,
    pub world_size: usize,
    pub seed: i64,
    pub best_loss: Option<f64>,
    pub best_epoch: Option<u32>,
    pub since_best: u32,
    pub history: Vec<EpochMetrics>,
    /// Partial sums of the interrupted epoch: (loss sum, samples, seconds).
    pub partial: (f64, f64, f64),
    /// The fp16 loss scale (1 when the run did not scale its loss).
    pub loss_scale: f64,
    /// The fp16 loss scaler's state when it ran (torch's `GradScaler.state_dict()`: the scale
    /// and its growth count); absent when it did not, and in checkpoints written before it was
    /// recorded (their `loss_scale` holds the scale).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub loss_scaler: Option<LossScalerState>,
    /// The run ended (early stop or last epoch) and wrote its model.
    pub finished: bool,
    /// `--global-batch-size` of the run (its steps do not depend on the world size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch_size: Option<u32>,
    /// The tensors file (model and momentum), in the checkpoint directory.
    #[serde(default)]
    pub tensors: String,
    /// The best epoch's weights, in the checkpoint directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_tensors: Option<String>,
    /// What defines the run (absent in checkpoints written before it was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<RunRecord>,
    /// When rank 0 wrote it (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub written: Option<String>,
}

/// The fp16 loss scaler between two runs.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq)]
pub struct LossScalerState {
    pub scale: f64,
    /// Finite steps in a row since the scale last changed (torch's `_growth_tracker`).
    pub growth_tracker: u32,
}

/// A checkpoint that cannot be used, or a job that does not fit the checkpoint it finds.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a checkpoint description ({reason})")]
    Garbage { path: PathBuf, reason: String },
    #[error("{path}: checkpoint format {version} is not supported (this tchrun reads format {FORMAT_VERSION})")]
    Format { path: PathBuf, version: u32 },
    #[error("{path}: {reason}")]
    Damaged { path: PathBuf, reason: String },
}

impl CheckpointError {
    pub fn path(&self) -> &Path {
        match self {
            CheckpointError::Unreadable { path, .. }
            | CheckpointError::Garbage { path, .. }
            | CheckpointError::Format { path, .. }
            | CheckpointError::Damaged { path, .. } => path,
        }
    }
}

/// Reads `last.json`; `Ok(None)` when there is none.
pub fn read(output: &Path) -> Result<Option<Last>, CheckpointError> {
    let path = last_json(output);
    let text = match crate::files::read_bounded(&path, crate::files::caps::RECORD) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => {
            return Err(CheckpointError::Unreadable {
                path,
                source: e.into_io(),
            })
        }
    };
    parse(&path, &text).map(Some)
}

/// `last.json`'s bytes to a `Last` (`path` for the errors).
pub fn parse(path: &Path, text: &[u8]) -> Result<Last, CheckpointError> {
    // The version first: a newer format may not parse as this one.
    let value: serde_json::Value =
        serde_json::from_slice(text).map_err(|e| CheckpointError::Garbage {
            path: path.to_path_buf(),
            reason: e.to_string(),
        })?;
    match value.get("format_version").and_then(|v| v.as_u64()) {
        Some(v) if v == FORMAT_VERSION as u64 => {}
        Some(v) => {
            return Err(CheckpointError::Format {
                path: path.to_path_buf(),
                version: u32::try_from(v).unwrap_or(u32::MAX),
            })
        }
        None => {
            return Err(CheckpointError::Garbage {
                path: path.to_path_buf(),
                reason: "no format_version".into(),
            })
        }
    }
    let last: Last = serde_json::from_value(value).map_err(|e| CheckpointError::Garbage {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    if !valid_name(&last.tensors) {
        return Err(CheckpointError::Garbage {
            path: path.to_path_buf(),
            reason: format!("invalid tensors file name {:?}", last.tensors),
        });
    }
    if let Some(b) = &last.best_tensors {
        if !valid_name(b) {
            return Err(CheckpointError::Garbage {
                path: path.to_path_buf(),
                reason: format!("invalid best tensors file name {b:?}"),
            });
        }
    }
    Ok(last)
}

/// A tensors file name from `last.json`: a plain file name in the checkpoint directory.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.contains("..") && name != "."
}

/// The best weights' file of checkpoints written before it was tied to a step.
pub const LEGACY_BEST: &str = "best.safetensors";

/// The best weights' file the checkpoint names (an older checkpoint: `best.safetensors` when
/// it is there).
pub fn best_file(output: &Path, last: &Last) -> Option<PathBuf> {
    let d = dir(output);
    match &last.best_tensors {
        Some(f) => Some(d.join(f)),
        None => Some(d.join(LEGACY_BEST)).filter(|p| p.is_file()),
    }
}

/// Checks a safetensors file without reading its data: the header parses and the file is as
/// long as the header says. Returns the tensor names.
pub fn verify_tensors(path: &Path) -> Result<Vec<String>, CheckpointError> {
    use std::io::Read;
    let damaged = |reason: String| CheckpointError::Damaged {
        path: path.to_path_buf(),
        reason,
    };
    let mut f = std::fs::File::open(path).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            damaged("missing (last.json names it)".into())
        } else {
            CheckpointError::Unreadable {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    let len = f
        .metadata()
        .map_err(|source| CheckpointError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?
        .len();
    let truncated = || damaged("truncated or not a safetensors file".into());
    let mut n = [0u8; 8];
    f.read_exact(&mut n).map_err(|_| truncated())?;
    let n = u64::from_le_bytes(n);
    if n > 100 << 20 || n.saturating_add(8) > len {
        return Err(truncated());
    }
    let mut header = vec![0u8; n as usize];
    f.read_exact(&mut header).map_err(|_| truncated())?;
    let header: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(&header).map_err(|_| truncated())?;
    let mut end = 0u64;
    let mut names = Vec::new();
    for (name, v) in &header {
        if name == "__metadata__" {
            continue;
        }
        let offsets = v
            .get("data_offsets")
            .and_then(|o| o.as_array())
            .and_then(|a| Some((a.first()?.as_u64()?, a.get(1)?.as_u64()?)))
            .ok_or_else(truncated)?;
        end = end.max(offsets.1);
        names.push(name.clone());
    }
    let want = 8 + n + end;
    if len != want {
        return Err(damaged(format!(
            "truncated: {len} bytes, its header describes {want}"
        )));
    }
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_safetensors(path: &Path, truncate_by: usize) {
        let data = vec![0u8; 16];
        let views = vec![(
            "w",
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![4], &data)
                .expect("view"),
        )];
        let bytes = safetensors::serialize(views, &None).expect("serialize");
        std::fs::write(path, &bytes[..bytes.len() - truncate_by]).expect("write");
    }

    #[test]
    fn verify_finds_truncated_and_garbage_tensor_files() {
        let t = tempfile::tempdir().expect("tempdir");
        let p = t.path().join("x.safetensors");
        write_safetensors(&p, 0);
        assert_eq!(verify_tensors(&p).expect("intact"), vec!["w".to_string()]);
        write_safetensors(&p, 3);
        let e = verify_tensors(&p).expect_err("truncated").to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&p, b"hello").expect("write");
        let e = verify_tensors(&p).expect_err("garbage").to_string();
        assert!(e.contains("truncated or not a safetensors file"), "{e}");
        let e = verify_tensors(&t.path().join("none"))
            .expect_err("missing")
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }

    #[test]
    fn last_json_parse_refuses_garbage_and_other_formats() {
        let p = Path::new("/o/checkpoints/last.json");
        assert!(matches!(
            parse(p, b"{not json"),
            Err(CheckpointError::Garbage { .. })
        ));
        assert!(matches!(
            parse(p, br#"{"format_version": 9}"#),
            Err(CheckpointError::Format { version: 9, .. })
        ));
        assert!(matches!(
            parse(p, br#"{"format_version": 1, "epoch": 1}"#),
            Err(CheckpointError::Garbage { .. })
        ));
    }
}
