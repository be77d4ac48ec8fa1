//! `tchrun export`'s contract: its flags, the formats and their Triton names, the
//! preprocessing that travels with a model (`preprocess.json`, the ONNX `metadata_props`), the
//! worker's check record and the export report (`export.json`). The launcher runs the export;
//! the worker traces the model with libtorch and checks it; the environment's torch writes the
//! ONNX graph. Knows no libtorch.

use crate::model::ModelConfig;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// ONNX opset written when `--opset` is not given: ONNX Runtime 1.17+ and Triton 23.04+ run it,
/// and it has `LayerNormalization` (ConvNeXt, ViT, Swin) as one operator.
pub const DEFAULT_OPSET: u32 = 17;
/// The opsets torch's TorchScript-based ONNX exporter writes and current ONNX Runtime runs.
pub const OPSETS: std::ops::RangeInclusive<u32> = 13..=20;
/// Largest difference of a probability allowed between the exported graph and tchrun's own
/// forward, in float32.
pub const TOLERANCE_FP32: f64 = 1e-4;
/// The same with `--fp16` (the graph computes in half precision).
pub const TOLERANCE_FP16: f64 = 1e-2;
/// Triton's `max_batch_size` of a graph with a dynamic batch axis.
pub const TRITON_MAX_BATCH: u32 = 64;
/// Most images of `--check-images` the check runs (the first, in sorted order).
pub const CHECK_IMAGES: usize = 16;
/// Images of the synthetic check batch when no `--check-images` is given.
pub const SYNTHETIC_IMAGES: usize = 8;
/// The files the worker leaves in the staging folder.
pub const TORCHSCRIPT_FILE: &str = "model.pt";
pub const ONNX_FILE: &str = "model.onnx";
pub const CHECK_NPZ: &str = "check.npz";
pub const CHECK_JSON: &str = "check.json";
/// Files written beside the model in each exported model folder.
pub const PREPROCESS_JSON: &str = "preprocess.json";
pub const REPORT_JSON: &str = "export.json";
pub const LABELS_TXT: &str = "labels.txt";
pub const CONFIG_PBTXT: &str = "config.pbtxt";

/// `--format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Onnx,
    Torchscript,
    /// Both, as two Triton models: `<name>_onnx` and `<name>_torchscript`.
    Both,
}

/// One exported graph's kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    Onnx,
    Torchscript,
}

impl Format {
    pub fn targets(self) -> Vec<Target> {
        match self {
            Format::Onnx => vec![Target::Onnx],
            Format::Torchscript => vec![Target::Torchscript],
            Format::Both => vec![Target::Onnx, Target::Torchscript],
        }
    }
}

impl Target {
    pub fn name(self) -> &'static str {
        match self {
            Target::Onnx => "onnx",
            Target::Torchscript => "torchscript",
        }
    }
    /// The model file in the version folder `1/`.
    pub fn file(self) -> &'static str {
        match self {
            Target::Onnx => ONNX_FILE,
            Target::Torchscript => TORCHSCRIPT_FILE,
        }
    }
    /// Triton's `platform`.
    pub fn platform(self) -> &'static str {
        match self {
            Target::Onnx => "onnxruntime_onnx",
            Target::Torchscript => "pytorch_libtorch",
        }
    }
    /// The graph's (input, output) names: ONNX's are named in the graph; Triton's PyTorch
    /// backend addresses a TorchScript module's by position, `INPUT__0` and `OUTPUT__0`.
    pub fn io_names(self) -> (&'static str, &'static str) {
        match self {
            Target::Onnx => ("input", "probabilities"),
            Target::Torchscript => ("INPUT__0", "OUTPUT__0"),
        }
    }
}

/// `--batch`: a dynamic batch axis, or a fixed batch size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    Dynamic,
    Fixed(u32),
}

impl std::str::FromStr for Batch {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s == "dynamic" {
            return Ok(Batch::Dynamic);
        }
        match s.parse::<u32>() {
            Ok(n) if (1..=4096).contains(&n) => Ok(Batch::Fixed(n)),
            _ => Err(format!(
                "'{s}' is neither 'dynamic' nor a batch size in 1..=4096; e.g. --batch dynamic or --batch 8"
            )),
        }
    }
}

/// As its flag's value (`dynamic`, `8`).
impl Serialize for Batch {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::fmt::Display for Batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Batch::Dynamic => write!(f, "dynamic"),
            Batch::Fixed(n) => write!(f, "{n}"),
        }
    }
}

fn opset(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if OPSETS.contains(&n) => Ok(n),
        _ => Err(format!(
            "'{s}' is not an ONNX opset tchrun exports; use one of {}..={} (default {DEFAULT_OPSET})",
            OPSETS.start(),
            OPSETS.end()
        )),
    }
}

/// `tchrun export`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub struct ExportJob {
    /// The model directory to export (`model.json` and `model.safetensors` of a trained model,
    /// a fine-tuned one or an EMA directory).
    #[arg(long)]
    pub model: PathBuf,
    /// The graph to write: ONNX (ONNX Runtime, Triton's onnxruntime backend), TorchScript
    /// (`torch.jit.load`, Triton's pytorch backend) or both (two Triton models).
    #[arg(long, value_enum, default_value = "onnx")]
    pub format: Format,
    /// The Triton model repository to write into: `OUTPUT/NAME/config.pbtxt`,
    /// `OUTPUT/NAME/1/model.onnx|model.pt`, labels, preprocess.json, export.json. Created if
    /// missing; an existing `OUTPUT/NAME` is refused.
    #[arg(long)]
    pub output: PathBuf,
    /// The batch axis: dynamic (any batch size; Triton batches up to 64) or a fixed size N.
    #[arg(long, default_value = "dynamic")]
    pub batch: Batch,
    /// ONNX opset.
    #[arg(long, default_value_t = DEFAULT_OPSET, value_parser = opset)]
    pub opset: u32,
    /// Compute in half precision (inputs and outputs stay float32; checked within 1e-2).
    #[arg(long)]
    pub fp16: bool,
    /// The Triton model's name (letters, digits, '_', '-', '.') [default: the model
    /// directory's name].
    #[arg(long)]
    pub name: Option<String>,
    /// The graph takes uint8 images (N, H, W, 3, RGB, already resized and center-cropped as
    /// preprocess.json says) and normalises them itself: a client sends pixels.
    #[arg(long)]
    pub with_preprocess: bool,
    /// Images the export checks the graph on (the first 16, sorted; e.g. the validation
    /// folder) [default: a synthetic batch].
    #[arg(long, value_name = "DIR")]
    pub check_images: Option<PathBuf>,
    /// The Python whose torch writes the ONNX graph and whose onnxruntime checks it [default:
    /// the environment's beside tchrun, else python3 on PATH].
    #[arg(long, env = "TCHRUN_PYTHON", value_name = "PATH")]
    pub python: Option<PathBuf>,
}

/// A Triton model name: what a directory may be called and Triton accepts.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && !name.starts_with('.')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "--name '{name}': a model name is 1 to 128 letters, digits, '_', '-' or '.', not \
             starting with '.'; e.g. --name digits_resnet18"
        ))
    }
}

/// The default name: the model directory's, its other characters made '_'.
pub fn default_name(model: &std::path::Path) -> String {
    let base = model
        .file_name()
        .map(|n| n.to_string_lossy().to_string())
        .unwrap_or_default();
    let clean: String = base
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') {
                c
            } else {
                '_'
            }
        })
        .collect();
    let clean = clean.trim_start_matches('.').to_string();
    if clean.is_empty() {
        "model".into()
    } else {
        clean
    }
}

/// The preprocessing a client applies before the graph (`preprocess.json`; the ONNX
/// `metadata_props` carry each field as JSON under `tchrun.<field>`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Preprocess {
    pub arch: String,
    /// Resize the shorter side to this many pixels ...
    pub resize: u32,
    /// ... then center-crop a square of this side: the graph's input size.
    pub crop: u32,
    /// The resize's resampling (torchvision's `InterpolationMode` name).
    pub interpolation: String,
    /// RGB values scaled to [0, 1], then `(x - mean) / std` per channel.
    pub mean: [f32; 3],
    pub std: [f32; 3],
    /// What the graph takes: `float32 NCHW normalized` or `uint8 NHWC RGB`.
    pub input: String,
    /// What it returns: `probabilities` (softmax over the classes, in `class_names` order).
    pub output: String,
    pub class_names: Vec<String>,
}

impl Preprocess {
    /// The validation preprocessing of `cfg` (as `tchrun score` applies it).
    pub fn of(cfg: &ModelConfig, with_preprocess: bool) -> Preprocess {
        let (resize, crop, interpolation) = match &cfg.training {
            Some(t) => {
                let c = t.augment.crops(cfg.input_size);
                (c.val_resize, c.val_crop, t.augment.interpolation.clone())
            }
            None => (
                crate::augment_flags::default_val_resize(cfg.input_size),
                cfg.input_size,
                "bilinear".to_string(),
            ),
        };
        Preprocess {
            arch: cfg.arch.name().to_string(),
            resize,
            crop,
            interpolation,
            mean: cfg.normalization.mean,
            std: cfg.normalization.std,
            input: if with_preprocess {
                "uint8 NHWC RGB (resized and center-cropped; the graph scales and normalizes)"
            } else {
                "float32 NCHW normalized"
            }
            .into(),
            output: "probabilities".into(),
            class_names: cfg.class_names.clone(),
        }
    }

    /// The ONNX `metadata_props` (key, value) pairs.
    pub fn metadata(&self) -> Vec<(String, String)> {
        let v = serde_json::to_value(self).unwrap_or_default();
        let mut out = Vec::new();
        if let Some(map) = v.as_object() {
            for (k, v) in map {
                let text = match v {
                    serde_json::Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                out.push((format!("tchrun.{k}"), text));
            }
        }
        out
    }
}

/// The hidden `tchrun-worker export` command's flags: trace the model into `--staging`
/// (`model.pt`), check it and leave the check batch (`check.npz`) and its record
/// (`check.json`).
#[derive(clap::Args, Debug, Clone, PartialEq, Serialize)]
pub struct TraceArgs {
    #[arg(long)]
    pub model: PathBuf,
    #[arg(long)]
    pub staging: PathBuf,
    #[arg(long, default_value = "dynamic")]
    pub batch: Batch,
    #[arg(long)]
    pub fp16: bool,
    #[arg(long)]
    pub with_preprocess: bool,
    #[arg(long)]
    pub check_images: Option<PathBuf>,
}

impl TraceArgs {
    /// The flags as command-line arguments for `tchrun-worker export` (derived, `crate::argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }
}

/// The largest difference of one check: where it is and how large.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Difference {
    /// Batch size the graph ran at.
    pub batch: usize,
    pub max_abs_diff: f64,
    /// The image (index into the check batch) and class of the largest difference.
    pub image: usize,
    pub class: usize,
    /// Images whose top-1 class differs.
    pub top1_disagree: usize,
}

/// One graph's check (`check.json` for TorchScript, the ONNX step's output for ONNX).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub target: Target,
    /// `--check-images`' folder, or `synthetic`.
    pub images: String,
    pub count: usize,
    pub tolerance: f64,
    pub runs: Vec<Difference>,
}

impl Check {
    /// The largest difference over the runs.
    pub fn worst(&self) -> Option<&Difference> {
        self.runs
            .iter()
            .max_by(|a, b| a.max_abs_diff.total_cmp(&b.max_abs_diff))
    }

    /// `Err` naming the largest difference when it is above the tolerance (or NaN) or a
    /// top-1 class differs.
    pub fn verdict(&self) -> Result<(), String> {
        let Some(w) = self.worst() else {
            return Err(format!("the {} check ran no batch", self.target.name()));
        };
        let disagree: usize = self.runs.iter().map(|r| r.top1_disagree).sum();
        if w.max_abs_diff.is_nan() || w.max_abs_diff > self.tolerance || disagree > 0 {
            return Err(format!(
                "the exported {} graph differs from tchrun's own forward: largest probability \
                 difference {:.3e} (image {} class {}, batch {}), tolerance {:.0e}; {disagree} \
                 top-1 class(es) differ; nothing was written",
                self.target.name(),
                w.max_abs_diff,
                w.image,
                w.class,
                w.batch,
                self.tolerance
            ));
        }
        Ok(())
    }
}

/// `export.json`: what was exported, from what, and how it was checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Report {
    pub name: String,
    pub target: Target,
    pub model: String,
    pub arch: String,
    pub file: String,
    pub bytes: u64,
    pub batch: String,
    /// The ONNX opset (ONNX only).
    pub opset: Option<u32>,
    pub fp16: bool,
    pub with_preprocess: bool,
    pub check: Check,
    /// Seconds from the start of the export to this model's files.
    pub seconds: f64,
    pub tchrun_version: String,
}

#[cfg(test)]
mod tests;
