//! `tchrun train`: the trainer's input checks (every image header, before anything is
//! written), the launch pre-flight, then the job's attempts; with `--max-restarts`, the
//! restart policy (`restart.rs`). Owns what one attempt hands the next (the history, the hosts
//! left out); must not know how ranks are spawned or supervised (that is `run`'s).
pub mod restart;

use crate::error::JobError;
use crate::plan::gpus::GpuUse;
use crate::plan::launch::LaunchArgs;
use crate::plan::preflight::{absolute, check_disjoint, check_writable, lock_job, validate};
use crate::run::run_planned;
use restart::{Attempt, RestartArgs};
use tchrun::files;

/// `tchrun train`: the trainer's input checks, then the job.
pub fn run_train(
    job: &tchrun::flags::TrainJob,
    launch: &LaunchArgs,
    rank: &tchrun::flags::RankFlags,
    restarts: &RestartArgs,
) -> Result<i32, JobError> {
    restarts.check(launch)?;
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
        return Ok(0);
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
    let mut plan = validate(launch, log_dir.clone(), GpuUse::Ranks(rank.device))?;
    if let Some(g) = job.options.global_batch_size {
        // Each rank accumulates a whole number of micro-batches: refused before any rank starts.
        tchrun::schedule::accumulation_steps(g, job.params.batch_size, plan.world_size() as usize)
            .map_err(JobError::invalid)?;
    }
    // One job at a time on --output (and --log-dir), for every attempt; none for a dry run.
    let _locks = if launch.dry_run {
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
    let mut verified = Vec::new();
    if let tchrun::preflight::Headers::OnDecode { .. } = checked.headers {
        verified.push("--verify-on-decode".to_string());
    }
    if !launch.dry_run {
        for ((index, name), flag) in checked
            .indexes
            .iter()
            .zip(files::DATASET_INDEX_COPIES)
            .zip(["--train-index", "--valid-index"])
        {
            let Some(index) = index else { continue };
            let path = log_dir.join(name);
            match std::fs::create_dir_all(&log_dir).and_then(|_| index.write(&path)) {
                Ok(()) => verified.push(format!("{flag}={}", path.display())),
                // Only a shortcut: the ranks then list the folder themselves.
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
    let mut host_failures = restart::HostFailures::default();
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
            let mut why = None;
            if restarts.max_restarts > 0 && !progressed {
                let w = format!(
                    "not restarting: attempt {attempt} wrote no checkpoint (it failed before making progress; a restart would fail the same way)"
                );
                errln!("tchrun: {w}");
                why = Some(w);
            }
            restart::add_history_to_summary(&log_dir, &history, why);
            return Err(failure);
        }
        let summary = restart::read_summary(&log_dir);
        let cause = summary
            .as_ref()
            .map(|s| s.message.lines().next().unwrap_or_default().to_string())
            .unwrap_or_else(|| failure.to_string());
        // `--exclude-failed-hosts`: the failure counts against its host(s); one that failed
        // in two attempts is left out of the next.
        let (mut failed_hosts, mut dropped_hosts) = (Vec::new(), Vec::new());
        if restarts.exclude_failed_hosts {
            let logs = crate::report::read_driver_logs(&log_dir);
            failed_hosts = restart::failed_hosts(
                summary.as_ref(),
                &logs,
                &plan.node_names,
                plan.procs_per_node,
            );
            host_failures.record(attempt, &failed_hosts, &cause);
            match host_failures.decide(&plan, restarts.min_nodes) {
                restart::HostDecision::Keep => {}
                restart::HostDecision::Stop(why) => {
                    errln!("tchrun: {why}");
                    restart::add_history_to_summary(&log_dir, &history, Some(why));
                    return Err(failure);
                }
                restart::HostDecision::Drop(d) => dropped_hosts = d,
            }
        }
        // This attempt's failure summary, then the restart.
        {
            use std::io::Write as _;
            let _ = write!(std::io::stderr(), "{}", failure.render());
        }
        if !dropped_hosts.is_empty() {
            plan = restart::without_hosts(&plan, &dropped_hosts)?;
            for d in &dropped_hosts {
                errln!("tchrun: {}", d.line());
            }
        }
        let logs = restart::archive(&log_dir, attempt)?;
        let record = Attempt {
            attempt,
            rank: summary.as_ref().and_then(|s| s.rank),
            host: summary.as_ref().and_then(|s| s.host.clone()),
            classification: summary
                .as_ref()
                .map(|s| s.classification.clone())
                .unwrap_or_else(|| "error".into()),
            cause,
            exit_status: failure.kind().exit_code(),
            resumed_from_step: now,
            logs,
            failed_hosts,
            dropped_hosts,
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
    let interrupted = [
        tchrun::exit::ErrorKind::InterruptedInt.exit_code(),
        tchrun::exit::ErrorKind::InterruptedTerm.exit_code(),
    ];
    if interrupted.contains(&code) && !launch.dry_run && stop_left_a_model(&job.output) {
        return Ok(0);
    }
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

/// Says on the console what the job does with `--output`'s checkpoint; true when there is
/// nothing to do (a finished run resumed with the same `--epochs`).
fn say_decision(job: &tchrun::flags::TrainJob, decision: &tchrun::checkpoint::Decision) -> bool {
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
fn stop_left_a_model(output: &std::path::Path) -> bool {
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
