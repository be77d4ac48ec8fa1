//! `tchrun score` ("Score Image Model") and `tchrun evaluate` ("Evaluate Model"): the model
//! directory, the images and the output are checked here (no libtorch needed), then the ranks
//! run `tchrun-worker score|evaluate` like any job (launch flags, GPU pre-flight, driver logs,
//! fail-fast). The ranks split the images by whole batches and rank 0 writes the output.
use crate::error::JobError;
use crate::plan::gpus::GpuUse;
use crate::plan::launch::{LaunchArgs, Plan};
use crate::plan::preflight::{
    absolute, check_disjoint, check_writable, lock_job, own_log_dir, validate,
};
use crate::run::{run_planned, RankEnv};
use std::path::{Path, PathBuf};
use tchrun::files::NewLogDir;
use tchrun::flags::RankFlags;
use tchrun::inference_flags::{Inference, InferenceJob};
use tchrun::overlap::Named;

fn check_model(model: &Path, batch_size: u32) -> Result<tchrun::model::ModelConfig, JobError> {
    let cfg = tchrun::model::load(model, true)?;
    tchrun::counts::batch_bytes("--batch-size", batch_size, cfg.input_size)
        .map_err(|e| JobError::invalid(e.0))?;
    Ok(cfg)
}

/// `--output` (`output_is` says what it is) and the log directory must not be, contain or
/// lie inside a `--model` or `--images`.
fn check_outputs(
    launch: &LaunchArgs,
    plan: &Plan,
    job: &InferenceJob,
    output_is: &'static str,
) -> Result<(), JobError> {
    let mut inputs: Vec<Named> = job
        .model
        .iter()
        .map(|m| Named::new("--model", "the trained model directory", m))
        .collect();
    inputs.push(Named::new("--images", "the images", &job.images));
    check_disjoint(
        &[
            Named::new("--output", output_is, &job.output),
            Named::new("--log-dir", "the job's logs", &plan.log_dir),
        ],
        inputs,
        Some(launch),
    )
}

/// `--images` as a folder: an archive becomes its extracted folder (in the data cache,
/// `tchrun_data::archive::cache_root`).
fn images_folder(images: &Path) -> Result<PathBuf, JobError> {
    let cache = tchrun_data::archive::cache_root();
    match tchrun_data::archive::resolve(images, &cache)
        .map_err(|e| JobError::from_dataset(e, JobError::Images))?
    {
        Some(x) => {
            outln!("tchrun: {}", x.describe());
            Ok(x.root)
        }
        None => Ok(images.to_path_buf()),
    }
}

fn check_images_dir(images: &Path) -> Result<(), JobError> {
    if images.is_dir() {
        Ok(())
    } else {
        Err(JobError::invalid(format!(
            "--images {}: not a directory; pass the folder that holds the images",
            images.display()
        )))
    }
}

/// The rank flags with the log directory made absolute; unset, `evaluate`'s is its output's
/// `logs/`, `score`'s a folder of the job's own in `tchrun-logs` beside the CSV (held while
/// the second value lives).
fn with_log_dir(
    rank: &RankFlags,
    job: &InferenceJob,
    kind: Inference,
    dry_run: bool,
) -> Result<(RankFlags, Option<NewLogDir>), JobError> {
    let mut rank = rank.clone();
    let default = job.default_log_dir(kind);
    let (log_dir, new) = match kind {
        Inference::Score => own_log_dir(rank.log_dir.clone(), default, "score", dry_run)?,
        Inference::Evaluate => (absolute(rank.log_dir.clone().unwrap_or(default)), None),
    };
    rank.log_dir = Some(log_dir);
    Ok((rank, new))
}

/// The count of `--model` checked, the job's paths made absolute, then the launch pre-flight
/// (hosts, launcher, GPUs) before the inputs: a GPU job on a host without GPUs is refused
/// whatever its inputs.
fn launch_preflight(
    job: &InferenceJob,
    kind: Inference,
    launch: &LaunchArgs,
    rank: &RankFlags,
) -> Result<(InferenceJob, RankFlags, Plan, Option<NewLogDir>), JobError> {
    job.models(kind).map_err(JobError::invalid)?;
    let mut job = job.clone();
    job.model = job.model.into_iter().map(absolute).collect();
    job.images = absolute(job.images);
    job.output = absolute(job.output);
    let (rank, new) = with_log_dir(rank, &job, kind, launch.dry_run)?;
    let log_dir = rank.log_dir.clone().unwrap_or_default();
    let plan = validate(launch, log_dir, GpuUse::Ranks(rank.device), &rank.console)?;
    Ok((job, rank, plan, new))
}

/// `tchrun score`.
pub fn run_score(
    job: &InferenceJob,
    launch: &LaunchArgs,
    rank: &RankFlags,
) -> Result<i32, JobError> {
    let (mut job, rank, plan, _new_log_dir) =
        launch_preflight(job, Inference::Score, launch, rank)?;
    check_outputs(launch, &plan, &job, "the scores CSV")?;
    check_model(job.first_model(), job.batch_size)?;
    job.images = images_folder(&job.images)?;
    check_images_dir(&job.images)?;
    if job.output.is_dir() {
        return Err(JobError::invalid(format!(
            "--output {}: is a directory; name the CSV file to write (e.g. {}/scores.csv)",
            job.output.display(),
            job.output.display()
        )));
    }
    // One job at a time on the log directory (scores written into one folder share it); a
    // CSV's folder may hold other jobs' files, so it is not locked itself.
    let locks = if launch.dry_run {
        Vec::new()
    } else {
        lock_job(&tchrun::lock::job_dirs(None, &plan.log_dir))?
    };
    if !launch.dry_run {
        if let Some(parent) = job.output.parent() {
            check_writable(parent)?;
        }
    }
    let mut args = vec!["score".to_string()];
    args.extend(job.to_args()?);
    args.extend(rank.to_args()?);
    run_planned(launch, &plan, args, &RankEnv::holding(&locks))
}

/// The models of an evaluation: each loaded strictly; a second one must have the first's class
/// list. Returns the first's configuration.
fn check_models(job: &InferenceJob) -> Result<tchrun::model::ModelConfig, JobError> {
    let mut cfgs = Vec::with_capacity(job.model.len());
    for m in &job.model {
        cfgs.push(check_model(m, job.batch_size)?);
    }
    if let [a, b] = &cfgs[..] {
        tchrun_data::comparison::check_same_classes(
            (&job.model[0], &a.class_names),
            (&job.model[1], &b.class_names),
        )
        .map_err(JobError::invalid)?;
    }
    cfgs.into_iter()
        .next()
        .ok_or_else(|| JobError::invalid("--model: give the trained model directory"))
}

/// `tchrun evaluate`: the labeled folder's class folders must all be classes of the model (of
/// both models, whose class lists must be the same, when two are compared).
pub fn run_evaluate(
    job: &InferenceJob,
    launch: &LaunchArgs,
    rank: &RankFlags,
) -> Result<i32, JobError> {
    let (mut job, rank, plan, _) = launch_preflight(job, Inference::Evaluate, launch, rank)?;
    check_outputs(launch, &plan, &job, "the evaluation directory")?;
    let cfg = check_models(&job)?;
    job.images = images_folder(&job.images)?;
    check_images_dir(&job.images)?;
    let folder = tchrun_data::ImageFolder::scan(&job.images).map_err(JobError::Images)?;
    tchrun_data::evaluation::map_classes(&job.images, &folder.classes, &cfg.class_names)
        .map_err(JobError::Images)?;
    if job.output.is_file() {
        return Err(JobError::invalid(format!(
            "--output {}: is a file; evaluate writes a directory (scores.csv, metrics.json, \
             confusion_matrix.csv/.png)",
            job.output.display()
        )));
    }
    let locks = if launch.dry_run {
        Vec::new()
    } else {
        lock_job(&tchrun::lock::job_dirs(Some(&job.output), &plan.log_dir))?
    };
    if !launch.dry_run {
        check_writable(&job.output)?;
    }
    let mut args = vec!["evaluate".to_string()];
    args.extend(job.to_args()?);
    args.extend(rank.to_args()?);
    run_planned(launch, &plan, args, &RankEnv::holding(&locks))
}
