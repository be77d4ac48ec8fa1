//! `tchrun train`: the trainer's input checks (every image header, before anything is
//! written), the launch pre-flight, then the job's attempts; with `--max-restarts`, the
//! restart policy (`restart.rs`). Owns what one attempt hands the next (the history, the hosts
//! left out); must not know how ranks are spawned or supervised (that is `run`'s).
pub mod hosts;
pub mod restart;

use crate::error::JobError;
use crate::plan::gpus::GpuUse;
use crate::plan::launch::{LaunchArgs, Plan};
use crate::plan::preflight::{absolute, check_disjoint, check_writable, lock_job, validate};
use crate::run::RankEnv;
use restart::{Attempts, Ended, RestartArgs};
use std::path::Path;
use tchrun::files;
use tchrun::flags::{RankFlags, TrainHandoff, TrainJob};
use tchrun::job_record::{Attempt, Record};

/// A training job that passed every check before its first attempt.
struct Ready {
    /// The job as the ranks get it: absolute paths, archives replaced by their folders.
    job: TrainJob,
    plan: Plan,
    rank: RankFlags,
    /// What the pre-flight hands the ranks (the dataset index copies, headers on decode).
    handoff: TrainHandoff,
    /// The job locks of `--output` and `--log-dir`, held until tchrun ends (none for a dry
    /// run).
    locks: Vec<tchrun::lock::JobLock>,
}

/// `tchrun train`: the trainer's input checks, then the job.
pub fn run_train(
    job: &TrainJob,
    launch: &LaunchArgs,
    rank: &RankFlags,
    restarts: &RestartArgs,
) -> Result<i32, JobError> {
    restarts.check(launch)?;
    let Some(ready) = prepare(job, launch, rank)? else {
        return Ok(0);
    };
    let Ready {
        mut job,
        mut plan,
        rank,
        handoff,
        locks,
    } = ready;
    let log_dir = plan.log_dir.clone();
    let worker_args = |job: &TrainJob| {
        let mut args = vec!["train".to_string()];
        args.extend(job.to_args());
        args.extend(rank.to_args());
        args.extend(handoff.to_args());
        args
    };
    let attempts = Attempts {
        launch,
        restarts,
        env: RankEnv::holding(&locks),
        worker_args: &worker_args,
    };
    let (code, restarted) = match attempts.run(&mut plan, &mut job)? {
        Ended::Ran { code, restarted } => (code, restarted),
        Ended::StoppedBeforeRestart(code) => return Ok(code),
    };
    Ok(say_end(&job, launch, &log_dir, code, &restarted))
}

/// The trainer's input checks and the launch pre-flight, before the first attempt: the job
/// ready to run, or `None` when there is nothing to do (its training is complete).
fn prepare(
    job: &TrainJob,
    launch: &LaunchArgs,
    rank: &RankFlags,
) -> Result<Option<Ready>, JobError> {
    let mut job = job.clone();
    job.model = absolute(job.model);
    job.train = absolute(job.train);
    job.valid = absolute(job.valid);
    job.output = absolute(job.output);
    let mut rank = rank.clone();
    let log_dir = absolute(
        rank.log_dir
            .clone()
            .unwrap_or_else(|| job.output.join(files::DEFAULT_LOG_SUBDIR)),
    );
    // Before anything is written (an archive's extraction, the dataset indexes, logs/).
    let (outputs, inputs) = tchrun::overlap::train_job(&job, &log_dir);
    check_disjoint(&outputs, inputs, Some(launch))?;
    // The dataset indexes (reused or built) and the image headers: on a set of up to
    // UPFRONT_VERIFY_LIMIT unverified images a corrupt file is refused before any rank starts
    // or anything is written to --output; on a larger one each image is checked when first
    // decoded. The ranks read copies of the indexes instead of listing the folders.
    let checked = tchrun::preflight::check_train_job_with(
        &job,
        tchrun::preflight::Verification::Launcher {
            upfront_limit: tchrun::data::index::upfront_limit(),
        },
    )?;
    // What the job does with --output's checkpoint: resume, refuse (an interrupted run without
    // --resume, a damaged checkpoint, another model, dataset or recipe), or nothing to do.
    let decision =
        tchrun::checkpoint::check(&job, &checked.inputs.cfg, &checked.inputs.train.classes)
            .map_err(|e| JobError::invalid(e.to_string()))?;
    if say_decision(&job, &decision) {
        return Ok(None);
    }
    // Archives: the ranks get the extracted folders.
    for x in &checked.extracted {
        outln!("tchrun: {}", x.describe());
    }
    for line in &checked.notes {
        outln!("tchrun: {line}");
    }
    (job.train, job.valid) = (
        checked.inputs.train.root.clone(),
        checked.inputs.valid.root.clone(),
    );
    let plan = validate(
        launch,
        log_dir.clone(),
        GpuUse::Ranks(rank.device),
        &rank.console,
    )?;
    if let Some(g) = job.options.global_batch_size {
        // Each rank accumulates a whole number of micro-batches: refused before any rank starts.
        tchrun::schedule::accumulation_steps(g, job.params.batch_size, plan.world_size() as usize)
            .map_err(JobError::invalid)?;
    }
    // One job at a time on --output (and --log-dir), for every attempt; none for a dry run.
    let locks = if launch.dry_run {
        Vec::new()
    } else {
        lock_job(&tchrun::lock::job_dirs(Some(&job.output), &log_dir))?
    };
    // A job that cannot learn (one class, fewer images than one step needs) and counts out of
    // range: refused before any rank starts.
    for w in tchrun::preflight::check_job(&checked.inputs, &job, plan.world_size() as usize)? {
        errln!("tchrun: {w}");
    }
    if !launch.dry_run {
        check_writable(&job.output)?;
    }
    rank.log_dir = Some(log_dir.clone());
    let mut handoff = TrainHandoff {
        verify_on_decode: matches!(checked.headers, tchrun::preflight::Headers::OnDecode { .. }),
        ..TrainHandoff::default()
    };
    if !launch.dry_run {
        hand_over_indexes(&checked.indexes, &log_dir, &mut handoff);
    }
    Ok(Some(Ready {
        job,
        plan,
        rank,
        handoff,
        locks,
    }))
}

/// The dataset indexes, copied into the log directory for the ranks (only a shortcut: where a
/// copy cannot be written, the ranks list the folder themselves).
fn hand_over_indexes(
    indexes: &[Option<tchrun::data::index::DatasetIndex>; 2],
    log_dir: &Path,
    handoff: &mut TrainHandoff,
) {
    for ((index, name), slot) in indexes
        .iter()
        .zip(files::DATASET_INDEX_COPIES)
        .zip(handoff.indexes_mut())
    {
        let Some(index) = index else { continue };
        let path = log_dir.join(name);
        match std::fs::create_dir_all(log_dir).and_then(|_| index.write(&path)) {
            Ok(()) => *slot = Some(path),
            Err(e) => errln!("tchrun: warning: cannot write {}: {e}", path.display()),
        }
    }
}

/// The end of a job whose last attempt ran: after a stop, what it left; after a success, the
/// restarts it took, the model and the training report. Returns tchrun's exit code.
fn say_end(
    job: &TrainJob,
    launch: &LaunchArgs,
    log_dir: &Path,
    code: i32,
    restarted: &[Attempt],
) -> i32 {
    let interrupted = [
        tchrun::exit::ErrorKind::InterruptedInt.exit_code(),
        tchrun::exit::ErrorKind::InterruptedTerm.exit_code(),
    ];
    if interrupted.contains(&code) && !launch.dry_run && stop_left_a_model(&job.output) {
        return 0;
    }
    if code == 0 && !restarted.is_empty() {
        outln!(
            "tchrun: recovered after {} restart(s) ({}); history in {}",
            restarted.len(),
            restarted
                .iter()
                .map(Attempt::line)
                .collect::<Vec<_>>()
                .join("; "),
            Vec::<Attempt>::path(log_dir).display()
        );
    }
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
        crate::report::training_report(&job.output)
            .iter()
            .for_each(|l| outln!("{l}"));
    }
    code
}

/// Says on the console what the job does with `--output`'s checkpoint; true when there is
/// nothing to do (a finished run resumed with the same `--epochs`).
fn say_decision(job: &TrainJob, decision: &tchrun::checkpoint::Decision) -> bool {
    use tchrun::checkpoint::Decision;
    match decision {
        Decision::Complete { last } => {
            outln!(
                "tchrun: training already complete in {} (nothing to resume): its {} epoch(s) are \
                 done and its model is {}; to train longer, pass a larger --epochs with --resume",
                job.output.display(),
                last.history.len(),
                job.output.join(files::MODEL_JSON).display()
            );
            return true;
        }
        Decision::NothingToResume => outln!(
            "tchrun: --resume: no checkpoint in {}; training starts from the beginning",
            job.output.display()
        ),
        Decision::Resume { last, notes } => {
            outln!(
                "tchrun: --resume: the checkpoint of step {} (epoch {}, batch {}) in {}",
                last.step,
                last.epoch + 1,
                last.batches_done,
                tchrun::checkpoint::dir(&job.output).display()
            );
            for n in notes {
                outln!("tchrun: --resume: {n}");
            }
        }
        Decision::Overwrite { previous: Some(p) } => outln!(
            "tchrun: --overwrite: the run in {} (its checkpoint of step {}) is replaced",
            job.output.display(),
            p.step
        ),
        Decision::Overwrite { previous: None } | Decision::Fresh => {}
    }
    false
}

/// After a stop: what it left, said on the console. True when the stop came after the last
/// training step and the model is complete (the job then ends with 0).
fn stop_left_a_model(output: &Path) -> bool {
    match tchrun::checkpoint::read(output) {
        Ok(Some(last)) if last.finished && output.join(files::MODEL_JSON).is_file() => {
            outln!(
                "tchrun: the stop came after the last training step: the model was finished \
                 first ({})",
                output.join(files::MODEL_JSON).display()
            );
            return true;
        }
        Ok(Some(last)) => errln!(
            "tchrun: the last complete checkpoint is step {} (epoch {}, batch {}) in {}; \
             continue with --resume",
            last.step,
            last.epoch + 1,
            last.batches_done,
            tchrun::checkpoint::dir(output).display()
        ),
        Ok(None) => errln!(
            "tchrun: no checkpoint was written before the stop: a new run starts from the \
             beginning"
        ),
        Err(e) => errln!("tchrun: the checkpoint cannot be read: {e}"),
    }
    false
}
