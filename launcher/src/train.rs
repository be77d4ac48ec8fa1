//! `tchrun train`: the trainer's input checks (every image header, before anything is
//! written), the launch pre-flight, then the job.
use crate::error::JobError;
use crate::gpus::GpuUse;
use crate::job::run_planned;
use crate::launch::LaunchArgs;
use crate::preflight::{absolute, check_writable, validate};
use tchrun::files;

/// `tchrun train`: the trainer's input checks, then the job.
pub fn run_train(
    job: &tchrun::flags::TrainJob,
    launch: &LaunchArgs,
    rank: &tchrun::flags::RankFlags,
) -> Result<i32, JobError> {
    let mut job = job.clone();
    job.model = absolute(job.model);
    job.train = absolute(job.train);
    job.valid = absolute(job.valid);
    job.output = absolute(job.output);
    // Every image header too: a corrupt file is refused before any rank starts or anything is
    // written to --output. The ranks reuse this verification (verified_inputs.json) when their
    // own scan finds the same files, and verify for themselves otherwise.
    let checked =
        tchrun::preflight::check_train_job_with(&job, tchrun::preflight::Verification::Full)?;
    let mut rank = rank.clone();
    let log_dir = absolute(
        rank.log_dir
            .clone()
            .unwrap_or_else(|| job.output.join(files::DEFAULT_LOG_SUBDIR)),
    );
    let plan = validate(launch, log_dir.clone(), GpuUse::Ranks(rank.device))?;
    if !launch.dry_run {
        check_writable(&job.output)?;
    }
    rank.log_dir = Some(log_dir.clone());
    let mut args = vec!["train".to_string()];
    args.extend(job.to_args());
    args.extend(rank.to_args());
    if !launch.dry_run {
        if let Some(m) = &checked.manifest {
            let path = log_dir.join(files::VERIFIED_INPUTS);
            match std::fs::create_dir_all(&log_dir).and_then(|_| m.write(&path)) {
                Ok(()) => args.push(format!("--verified-inputs={}", path.display())),
                // Only a shortcut: the ranks then verify the headers themselves.
                Err(e) => errln!("tchrun: warning: cannot write {}: {e}", path.display()),
            }
        }
    }
    let code = run_planned(launch, &plan, args)?;
    if code == 0 && !launch.dry_run {
        outln!(
            "tchrun: trained model in {}: {}, {}; metrics {} and {}; logs in {}",
            job.output.display(),
            files::MODEL_JSON,
            files::MODEL_WEIGHTS,
            job.output.join(files::METRICS_JSONL).display(),
            job.output.join(files::METRICS_PLOT).display(),
            log_dir.display()
        );
    }
    Ok(code)
}
