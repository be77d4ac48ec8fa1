//! `tchrun train`: the trainer's input checks (every image header, before anything is
//! written), the launch pre-flight, then the job.
use crate::error::JobError;
use crate::gpus::GpuUse;
use crate::job::run_planned;
use crate::launch::LaunchArgs;
use crate::preflight::{absolute, check_writable, validate};
use crate::restart::{self, Attempt, RestartArgs};
use tchrun::files;

/// `tchrun train`: the trainer's input checks, then the job.
pub fn run_train(
    job: &tchrun::flags::TrainJob,
    launch: &LaunchArgs,
    rank: &tchrun::flags::RankFlags,
    restarts: &RestartArgs,
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
    // Archives: the ranks get the extracted folders.
    for x in &checked.extracted {
        outln!("tchrun: {}", x.describe());
    }
    (job.train, job.valid) = (
        checked.inputs.train.root.clone(),
        checked.inputs.valid.root.clone(),
    );
    let mut rank = rank.clone();
    let log_dir = absolute(
        rank.log_dir
            .clone()
            .unwrap_or_else(|| job.output.join(files::DEFAULT_LOG_SUBDIR)),
    );
    let plan = validate(launch, log_dir.clone(), GpuUse::Ranks(rank.device))?;
    if let Some(g) = job.options.global_batch_size {
        // Each rank accumulates a whole number of micro-batches: refused before any rank starts.
        tchrun::schedule::accumulation_steps(g, job.params.batch_size, plan.world_size() as usize)
            .map_err(JobError::invalid)?;
    }
    if !launch.dry_run {
        check_writable(&job.output)?;
    }
    rank.log_dir = Some(log_dir.clone());
    let mut verified = None;
    if !launch.dry_run {
        if let Some(m) = &checked.manifest {
            let path = log_dir.join(files::VERIFIED_INPUTS);
            match std::fs::create_dir_all(&log_dir).and_then(|_| m.write(&path)) {
                Ok(()) => verified = Some(format!("--verified-inputs={}", path.display())),
                // Only a shortcut: the ranks then verify the headers themselves.
                Err(e) => errln!("tchrun: warning: cannot write {}: {e}", path.display()),
            }
        }
    }
    let worker_args = |job: &tchrun::flags::TrainJob| {
        let mut args = vec!["train".to_string()];
        args.extend(job.to_args());
        args.extend(rank.to_args());
        args.extend(verified.clone());
        args
    };
    let mut history: Vec<Attempt> = Vec::new();
    let code = loop {
        let attempt = history.len() as u32 + 1;
        // The ranks of this attempt (and ranks.json) see its number.
        std::env::set_var(tchrun::env::TCHRUN_ATTEMPT, attempt.to_string());
        let started_from = restart::checkpoint_step(&job.output);
        let failure = match run_planned(launch, &plan, worker_args(&job)) {
            Ok(code) => break code,
            Err(e @ (JobError::RankFailed { .. } | JobError::Hung(_))) => e,
            Err(e) => return Err(e),
        };
        let now = restart::checkpoint_step(&job.output);
        let progressed = now.is_some() && now > started_from;
        if history.len() as u32 >= restarts.max_restarts || launch.dry_run || !progressed {
            if restarts.max_restarts > 0 && !progressed {
                errln!(
                    "tchrun: not restarting: attempt {attempt} wrote no checkpoint (it failed before making progress; a restart would fail the same way)"
                );
            }
            restart::add_history_to_summary(&log_dir, &history);
            return Err(failure);
        }
        // This attempt's failure summary, then the restart.
        {
            use std::io::Write as _;
            let _ = write!(std::io::stderr(), "{}", failure.render());
        }
        let summary = restart::read_summary(&log_dir);
        let logs = restart::archive(&log_dir, attempt)?;
        let record = Attempt {
            attempt,
            rank: summary.as_ref().and_then(|s| s.rank),
            host: summary.as_ref().and_then(|s| s.host.clone()),
            classification: summary
                .as_ref()
                .map(|s| s.classification.clone())
                .unwrap_or_else(|| "error".into()),
            cause: summary
                .as_ref()
                .map(|s| s.message.lines().next().unwrap_or_default().to_string())
                .unwrap_or_else(|| failure.to_string()),
            exit_status: failure.kind().exit_code(),
            resumed_from_step: now,
            logs,
        };
        let wait = restart::backoff(attempt);
        errln!(
            "tchrun: {}; restarting all ranks in {} s from the checkpoint at step {} (restart {attempt} of at most {}; logs of attempt {attempt} in {})",
            record.line(),
            wait.as_secs(),
            now.unwrap_or(0),
            restarts.max_restarts,
            record.logs.display()
        );
        history.push(record);
        restart::write_history(&log_dir, &history);
        if let Some(sig) = restart::wait_interruptibly(wait)
            .map_err(|e| JobError::launch(format!("cannot wait for the restart: {e}")))?
        {
            errln!("tchrun: interrupted before the restart; nothing is running");
            return Ok(if sig == signal_hook::consts::SIGINT {
                tchrun::exit::ErrorKind::InterruptedInt.exit_code()
            } else {
                tchrun::exit::ErrorKind::InterruptedTerm.exit_code()
            });
        }
        job.options.resume = true;
    };
    if code == 0 && !history.is_empty() {
        outln!(
            "tchrun: recovered after {} restart(s) ({}); history in {}",
            history.len(),
            history
                .iter()
                .map(Attempt::line)
                .collect::<Vec<_>>()
                .join("; "),
            log_dir.join(files::RESTARTS_JSON).display()
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
    Ok(code)
}
