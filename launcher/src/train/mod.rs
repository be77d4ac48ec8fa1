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
use crate::report::FailureSummary;
use crate::run::RankEnv;
use restart::{Attempts, Ended, Failure, RestartArgs};
use std::path::Path;
use tchrun::files;
use tchrun::flags::{RankFlags, TrainHandoff, TrainJob};
use tchrun::job_record::status::{JobEnd, JobState};
use tchrun::job_record::{Attempt, Classification, JobStatus, Record};
use tchrun::recipe_preset::Given;

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
    given: &Given,
    launch: &LaunchArgs,
    rank: &RankFlags,
    restarts: &RestartArgs,
) -> Result<i32, JobError> {
    restarts.check(launch)?;
    restart::check_straggler_action(job, launch, restarts)?;
    let spares = hosts::read_spares(launch, restarts.spare_hosts.as_deref())?;
    let Some(ready) = prepare(job, given, launch, rank)? else {
        return Ok(0);
    };
    let Ready {
        mut job,
        mut plan,
        rank,
        handoff,
        locks,
    } = ready;
    // `--spare-hosts`: the job's hostfile with the spares after its hosts.
    let with_spares = match &spares {
        Some(all) => Some(hosts::with_spares(launch, all, &mut plan)?),
        None => None,
    };
    let launch = with_spares.as_ref().unwrap_or(launch);
    let log_dir = plan.log_dir.clone();
    let worker_args = |job: &TrainJob| {
        let mut args = vec!["train".to_string()];
        args.extend(job.to_args()?);
        args.extend(rank.to_args()?);
        args.extend(handoff.to_args()?);
        Ok(args)
    };
    let attempts = Attempts {
        launch,
        restarts,
        env: RankEnv::holding(&locks),
        worker_args: &worker_args,
        health: restart::Health {
            rank: rank.clone(),
            checks: tchrun::doctor::DoctorChecks::for_job(
                vec![job.train.clone(), job.valid.clone()],
                job.output.clone(),
            ),
        },
    };
    let (result, summary) = match attempts.run(&mut plan, &mut job) {
        Ok(Ended::Ran { code, restarted }) => {
            (Ok(say_end(&job, launch, &log_dir, code, &restarted)), None)
        }
        Ok(Ended::StoppedBeforeRestart(code)) => (Ok(code), None),
        Err(Failure { error, summary }) => (Err(error), summary),
    };
    if !launch.dry_run {
        let status = end_status(&log_dir, &job.output, &result, summary.as_deref());
        crate::run::write_status(&log_dir, &status);
    }
    result
}

/// `status.json` once the job has ended: the last one written (rank 0's, or the attempt's
/// `starting`) with the end state and one line saying how it ended.
fn end_status(
    log_dir: &Path,
    output: &Path,
    result: &Result<i32, JobError>,
    summary: Option<&FailureSummary>,
) -> JobStatus {
    use tchrun::exit::ErrorKind;
    let code = match result {
        Ok(code) => *code,
        Err(e) => e.kind().exit_code(),
    };
    let stopped = [
        ErrorKind::InterruptedInt.exit_code(),
        ErrorKind::InterruptedTerm.exit_code(),
    ];
    let (state, line) = match result {
        Ok(0) => (
            JobState::Finished,
            format!("model written to {}", output.display()),
        ),
        _ if stopped.contains(&code) => (
            JobState::Stopped,
            format!(
                "stopped by {}; {}",
                if code == stopped[0] {
                    "SIGINT"
                } else {
                    "SIGTERM"
                },
                match restart::checkpoint_step(output) {
                    Some(step) => format!(
                        "the last complete checkpoint is step {step}: continue with --resume"
                    ),
                    None => "no checkpoint was written".to_string(),
                }
            ),
        ),
        Ok(code) => (JobState::Failed, format!("ended with code {code}")),
        Err(e) => (
            JobState::Failed,
            match summary {
                Some(s) => crate::report::one_line(s),
                None => {
                    let text = e.to_string();
                    let first = text.lines().next().unwrap_or_default();
                    first.strip_prefix("tchrun: ").unwrap_or(first).to_string()
                }
            },
        ),
    };
    let last = JobStatus::read(log_dir).ok().flatten();
    JobStatus::ended(
        last,
        state,
        JobEnd {
            code,
            summary: line,
            cause: summary.and_then(cause_class),
        },
    )
}

/// A failure summary's cause in one word: its `Cause`'s class as `failure.json` keeps it
/// (`oom_killer`), `hang` for a hang; `None` when it names none (the exit code's kind then).
fn cause_class(summary: &FailureSummary) -> Option<String> {
    if let Some(cause) = &summary.cause {
        let v = serde_json::to_value(cause).ok()?;
        return v.get("class")?.as_str().map(str::to_string);
    }
    (summary.hang.is_some() || summary.classification == Classification::Hang)
        .then(|| "hang".to_string())
}

/// The trainer's input checks and the launch pre-flight, before the first attempt: the job
/// ready to run, or `None` when there is nothing to do (its training is complete).
fn prepare(
    job: &TrainJob,
    given: &Given,
    launch: &LaunchArgs,
    rank: &RankFlags,
) -> Result<Option<Ready>, JobError> {
    let mut job = job.clone();
    job.model = absolute(job.model);
    job.train = absolute(job.train);
    job.valid = absolute(job.valid);
    job.output = absolute(job.output);
    if let Some(dir) = &mut job.options.prometheus_textfile {
        *dir = absolute(dir.clone());
        tchrun_prometheus::check_dir(dir).map_err(JobError::invalid)?;
        crate::run::set_textfile(tchrun_prometheus::Textfile::new(dir, &job.output));
    }
    // MLflow's own variables where the flags are silent, passed to the ranks as flags.
    if let Some(w) = job.options.mlflow.resolve(|k| std::env::var(k).ok()) {
        errln!("tchrun: warning: {w}");
    }
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
    let checked = tchrun_data::preflight::check_train_job_with(
        &job,
        tchrun_data::preflight::Verification::Launcher {
            upfront_limit: tchrun_data::index::upfront_limit(),
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
    // A family torchvision trains with its own recipe: said once, on a new run whose flags
    // chose nothing of it (a resume keeps the run's recipe).
    let cfg = &checked.inputs.cfg;
    let resuming = matches!(decision, tchrun::checkpoint::Decision::Resume { .. });
    if let Some(s) = tchrun::recipe_preset::suggestion(cfg.arch) {
        if !resuming && !s.chosen(|id| given.contains(id)) {
            outln!("tchrun: {}", s.note(cfg.arch, cfg.input_size));
        }
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
    // A job that cannot learn (one class, fewer images than one step needs), counts out of
    // range, flags the data refuses: refused before any rank starts, and before the lock makes
    // --output.
    for w in tchrun_data::preflight::check_job(&checked.inputs, &job, plan.world_size() as usize)? {
        errln!("tchrun: {w}");
    }
    // One job at a time on --output (and --log-dir), for every attempt; none for a dry run.
    let locks = if launch.dry_run {
        Vec::new()
    } else {
        lock_job(&tchrun::lock::job_dirs(Some(&job.output), &log_dir))?
    };
    if let Some(w) = plan.cpu_warning(&rank) {
        errln!("tchrun: warning: {w}");
    }
    if !launch.dry_run {
        check_writable(&job.output)?;
    }
    rank.log_dir = Some(log_dir.clone());
    let mut handoff = TrainHandoff {
        verify_on_decode: matches!(
            checked.headers,
            tchrun_data::preflight::Headers::OnDecode { .. }
        ),
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
    indexes: &[Option<tchrun_data::index::DatasetIndex>; 2],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_status_says_how_the_job_ended_over_the_last_status() {
        let t = tempfile::tempdir().unwrap();
        let (logs, out) = (t.path().join("logs"), t.path().join("out"));
        std::fs::create_dir_all(&logs).unwrap();
        let mut last = JobStatus::starting(2, 4);
        (last.state, last.step) = (JobState::Training, 42);
        last.write(&logs).unwrap();
        let s = end_status(&logs, &out, &Ok(0), None);
        assert_eq!((s.state, s.attempt, s.step), (JobState::Finished, 2, 42));
        assert_eq!(
            s.end,
            Some(JobEnd {
                code: 0,
                summary: format!("model written to {}", out.display()),
                cause: None,
            })
        );
        let s = end_status(&logs, &out, &Ok(130), None);
        assert_eq!(s.state, JobState::Stopped);
        assert_eq!(
            s.end.map(|e| (e.code, e.summary)),
            Some((130, "stopped by SIGINT; no checkpoint was written".into()))
        );
        let summary =
            crate::report::rank_failure(None, 137, Some(9), std::time::SystemTime::now(), 4);
        let failed = Err(JobError::RankFailed {
            kind: tchrun::exit::ErrorKind::RankFailed,
            report: "tchrun: the job failed\n  more\n".into(),
        });
        let s = end_status(&logs, &out, &failed, Some(&summary));
        assert_eq!(s.state, JobState::Failed);
        assert_eq!(
            s.end.map(|e| (e.code, e.summary)),
            Some((4, "the job failed: killed by signal 9".into()))
        );
        // Without a summary: the error's first line; without a last status: a new one.
        std::fs::remove_file(JobStatus::path(&logs)).unwrap();
        let s = end_status(&logs, &out, &failed, None);
        assert_eq!(s.end.map(|e| e.summary), Some("the job failed".to_string()));
        assert_eq!((s.attempt, s.state), (1, JobState::Failed));
    }
}
