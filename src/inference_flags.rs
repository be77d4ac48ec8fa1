//! The flags of scoring and evaluation (`tchrun score|evaluate`, `tchrun-worker
//! score|evaluate`): one definition for both binaries, as `flags.rs` is for training.
use crate::flags::DEFAULT_LOG_DIR;
use clap::Args;
use serde::Serialize;
use std::path::{Path, PathBuf};

/// Which inference command a job is: `score` ("Score Image Model") or `evaluate` ("Evaluate
/// Model"). Their flags are the same (`InferenceJob`); the help of `--images` and `--output`
/// and the default log directory differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inference {
    Score,
    Evaluate,
}

impl Inference {
    /// `--images`' help (each command sets it with `mut_arg`).
    pub const fn images_help(self) -> &'static str {
        match self {
            Inference::Score => {
                "Directory of images to score (searched recursively), or a .zip/.tar/.tar.gz \
                 archive of one"
            }
            Inference::Evaluate => {
                "Labeled images: one sub-folder per class (ImageFolder layout), each a class of \
                 the model; or a .zip/.tar/.tar.gz archive of such a folder"
            }
        }
    }

    /// `--model`'s help.
    pub const fn model_help(self) -> &'static str {
        match self {
            Inference::Score => "Trained model directory (model.json + model.safetensors)",
            Inference::Evaluate => {
                "Trained model directory (model.json + model.safetensors); give it twice \
                 (--model A --model B) to compare two models on the same images: both side by \
                 side and McNemar's exact test of the difference in top-1"
            }
        }
    }

    /// `--output`'s help.
    pub const fn output_help(self) -> &'static str {
        match self {
            Inference::Score => "CSV file to write",
            Inference::Evaluate => {
                "Evaluation directory to write: scores.csv, metrics.json, confusion_matrix.csv \
                 and .png; with two models, those of each in a/ and b/, comparison.json and \
                 disagreements.csv"
            }
        }
    }
}

/// The inputs and outputs of scoring and evaluation: `tchrun score|evaluate` and
/// `tchrun-worker score|evaluate` take the same flags, defined here once (each command sets the
/// help of `--images` and `--output` from its `Inference`). The device and the other rank
/// settings are [`RankFlags`].
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct InferenceJob {
    /// Trained model directory (model.json + model.safetensors). Given more than once (the
    /// help: `Inference::model_help`) only by `evaluate`, to compare two models; `models`
    /// checks the count.
    #[arg(long, env = "TCHRUN_MODEL", action = clap::ArgAction::Append, required = true)]
    pub model: Vec<PathBuf>,
    /// The images (help: `Inference::images_help`).
    #[arg(long)]
    pub images: PathBuf,
    /// What to write (help: `Inference::output_help`).
    #[arg(long)]
    pub output: PathBuf,
    /// Images per forward pass (per rank).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u32).range(1..))]
    pub batch_size: u32,
}

impl InferenceJob {
    /// The model directories, checked against what `kind` takes: `score` one, `evaluate` one
    /// or two (the second compared with the first). The error names the count and the fix.
    pub fn models(&self, kind: Inference) -> Result<&[PathBuf], String> {
        let n = self.model.len();
        match kind {
            Inference::Score if n == 1 => Ok(&self.model),
            Inference::Evaluate if n == 1 || n == 2 => Ok(&self.model),
            Inference::Score => Err(format!(
                "--model given {n} times; score takes one model directory (to compare two \
                 models on labeled images: tchrun evaluate --model A --model B)"
            )),
            Inference::Evaluate => Err(format!(
                "--model given {n} times; evaluate takes one model directory, or two to compare \
                 them (--model A --model B): compare more models two at a time"
            )),
        }
    }

    /// The first model directory (the only one of `score` and of a one-model `evaluate`).
    pub fn first_model(&self) -> &Path {
        self.model.first().map_or(Path::new(""), PathBuf::as_path)
    }

    /// The job as arguments for `tchrun-worker score|evaluate` (`argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }

    /// Driver logs without `--log-dir`: for `score`, `tchrun-logs` beside the CSV (a job's
    /// logs stay with its output, not in the current directory); for `evaluate`,
    /// `<output>/logs`.
    pub fn default_log_dir(&self, kind: Inference) -> PathBuf {
        match kind {
            Inference::Score => self
                .output
                .parent()
                .map(|p| p.join(DEFAULT_LOG_DIR))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_DIR)),
            Inference::Evaluate => self.output.join(crate::files::DEFAULT_LOG_SUBDIR),
        }
    }
}
