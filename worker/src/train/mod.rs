//! `tchrun-worker train`: data-parallel training of an image classifier ("Train PyTorch
//! Model"): inputs checked, model replicated from rank 0, sharded epochs through the threaded
//! loader, bucketed gradient all-reduce, warmup + polynomial LR, validation reduced exactly,
//! early stopping on validation loss, NaN stops every rank together, rank 0 writes the model.
mod board;
pub mod checkpoint;
mod clip;
pub mod command;
mod ctx;
mod ema;
mod error;
mod finish;
mod fused;
mod live;
mod mix;
pub mod optim;
pub mod outputs;
mod resume;
pub(crate) mod scaler;
mod setup;
mod state;
pub(crate) mod step;
pub mod tracking;
mod trainer;
mod validate;
pub(crate) mod window;

use ctx::{layout, loader_threads, time_split, to_input};
use tchrun::flags::TrainJob;
use trainer::Trainer;

pub use ctx::RankCtx;
pub use error::TrainError;

pub use tchrun_data::preflight::Inputs;

/// Model directory, image directories, output: before any step. `indexes`: the launcher's
/// copies of the train and valid dataset indexes, used (instead of listing the folders) when
/// they describe this rank's copy of the data. Also returns lines for the driver log saying
/// where the file lists came from and what happens to the image headers.
/// `on_decode`: the launcher left the headers to be checked on decode (a large set).
pub fn check_inputs(
    job: &TrainJob,
    indexes: [Option<&std::path::Path>; 2],
    on_decode: bool,
) -> Result<(Inputs, Vec<String>), TrainError> {
    use tchrun_data::preflight::{check_train_job_with, Verification};
    let [train, valid] = indexes;
    let v = Verification::Rank {
        train,
        valid,
        on_decode,
    };
    let checked = check_train_job_with(job, v)?;
    Ok((checked.inputs, checked.notes))
}

/// Trains and (rank 0) writes the model directory: a `Trainer` set up, then run.
pub fn train(job: &TrainJob, inputs: Inputs, ctx: &RankCtx) -> Result<(), TrainError> {
    match Trainer::setup(job, inputs, ctx)? {
        Some(trainer) => trainer.run(),
        None => Ok(()),
    }
}

/// `tests/python/recipe_reference.py MODE`'s JSON: torch's own values for the recipe's unit
/// tests (the venv's Python, made by scripts/setup.sh).
#[cfg(test)]
pub(crate) fn recipe_reference(mode: &str) -> serde_json::Value {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new(root.join(".venv/bin/python"))
        .arg(root.join("tests/python/recipe_reference.py"))
        .arg(mode)
        .output()
        .expect("the venv's python (scripts/setup.sh)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}
