//! The training job's input checks (the seed's errors), shared by the launcher's pre-flight
//! (before any rank starts) and every rank (which also decodes every image header).
use crate::data::{DatasetError, ImageFolder};
use crate::flags::TrainJob;
use crate::model::{self, ModelConfig};
use std::path::{Path, PathBuf};

/// A training input that cannot be used; the message names the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    // The inner errors are shown, not chained (their text already holds everything).
    #[error("--model {0}")]
    Model(model::InvalidModelDirectory),
    #[error("{flag} {error}")]
    Dataset {
        flag: &'static str,
        error: DatasetError,
    },
    #[error("{0}")]
    Output(String),
}

/// The checked inputs of a training job.
pub struct Inputs {
    pub cfg: ModelConfig,
    pub train: ImageFolder,
    pub valid: ImageFolder,
    /// Images skipped under `--skip-bad-images` (verified inputs only).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Refuses an `--output` that holds a trained model (unless resuming) or is not a directory.
pub fn check_output(output: &Path, resume: bool) -> Result<(), PreflightError> {
    let model_json = output.join(crate::files::MODEL_JSON);
    if output.exists() && !output.is_dir() {
        return Err(PreflightError::Output(format!(
            "--output {}: exists and is not a directory",
            output.display()
        )));
    }
    if model_json.exists() && !resume {
        return Err(PreflightError::Output(format!(
            "--output {}: already holds a trained model ({}); choose another --output or remove it",
            output.display(),
            model_json.display()
        )));
    }
    Ok(())
}

/// Model directory, image directories (layout, class sets) and output; with `verify`, also
/// every image's header (corrupt files, decompression bombs).
pub fn check_train_job(job: &TrainJob, verify: bool) -> Result<Inputs, PreflightError> {
    let cfg = model::load(&job.model, false).map_err(PreflightError::Model)?;
    check_output(&job.output, job.options.resume)?;
    let ds = |flag: &'static str| move |error| PreflightError::Dataset { flag, error };
    let mut train = ImageFolder::scan(&job.train).map_err(ds("--train"))?;
    let mut valid = ImageFolder::scan(&job.valid).map_err(ds("--valid"))?;
    ImageFolder::check_same_classes(&train, &valid).map_err(ds("--train/--valid"))?;
    let mut skipped = Vec::new();
    if verify {
        let (skip, max) = (job.options.skip_bad_images, job.options.max_image_pixels);
        skipped.extend(train.verify(skip, max).map_err(ds("--train"))?);
        skipped.extend(valid.verify(skip, max).map_err(ds("--valid"))?);
    }
    Ok(Inputs {
        cfg,
        train,
        valid,
        skipped,
    })
}
