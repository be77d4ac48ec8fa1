//! `tchrun train --max-restarts N`: a job that recovers without a human. When a rank fails
//! after the job made progress in this attempt (a newer checkpoint than the one it started
//! from), the attempt's logs move to `<log-dir>/attempt-<n>/`, and after a short bounded
//! back-off every rank starts again with `--resume`. A failure before any progress is not
//! retried (no loop of failing starts); the budget counts restarts of the whole job. Each
//! attempt's outcome comes back as a value (`run::AttemptOutcome`): its failure summary and
//! its ranks' logs decide the restart, and `failure.json` is written from it.
//!
//! With `--exclude-failed-hosts` the hosts of the failures are counted and a failing one left
//! out (`hosts.rs`).
use super::hosts::{self, HostDecision, HostFailures};
use crate::error::JobError;
use crate::plan::launch::{LaunchArgs, MaxRestarts, Plan};
use crate::report::{self, FailureSummary};
use crate::run::{self, AttemptOutcome, RankEnv};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tchrun::files;
use tchrun::flags::TrainJob;
use tchrun::job_record::{Attempt, JobStatus, Record};

/// Restart policy flags of `tchrun train`.
#[derive(clap::Args, Debug, Clone)]
pub struct RestartArgs {
    #[command(flatten)]
    pub max: MaxRestarts,
    /// Leave out a host whose ranks failed in two attempts: the next attempt runs on the
    /// remaining hosts of --hostfile with fewer ranks, resuming from the checkpoint (needs
    /// --hostfile and --max-restarts).
    #[arg(
        help_heading = "Fault tolerance",
        long,
        env = "TCHRUN_EXCLUDE_FAILED_HOSTS"
    )]
    pub exclude_failed_hosts: bool,
    /// With --exclude-failed-hosts or --preflight doctor: the fewest nodes the job goes on
    /// with (default 1); when leaving out a failing host would leave fewer, the job stops
    /// (exit 4).
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_MIN_NODES", value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub min_nodes: Option<u32>,
    /// `doctor`: run `tchrun doctor`'s checks on the job's hosts before the first attempt
    /// (and its per-node checks before every restart) and leave out the hosts that fail
    /// (with --hostfile; spares take their places), refusing below --min-nodes (exit 4).
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_PREFLIGHT", value_enum, default_value_t = Preflight::None)]
    pub preflight: Preflight,
    /// A hostfile of spare hosts (with --hostfile): they wait until a host of the job is left
    /// out (--exclude-failed-hosts, --straggler-action exclude, --preflight doctor) and take
    /// its place after passing the per-node checks. The hosts of --hostfile beyond --nodes are
    /// spares too.
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_SPARE_HOSTS")]
    pub spare_hosts: Option<PathBuf>,
}

/// `--preflight`: what runs before the job's first attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preflight {
    /// Nothing beyond tchrun's input checks.
    None,
    /// `tchrun doctor` on the job's hosts; the per-node checks again before every restart.
    Doctor,
}

impl RestartArgs {
    /// `--min-nodes`, or 1.
    pub fn min_nodes(&self) -> u32 {
        self.min_nodes.unwrap_or(1)
    }

    /// Pre-flight of the restart flags against the launch flags.
    pub fn check(&self, launch: &LaunchArgs) -> Result<(), JobError> {
        let doctor = self.preflight == Preflight::Doctor;
        if self.min_nodes.is_some() && !self.exclude_failed_hosts && !doctor {
            return Err(JobError::invalid(
                "--min-nodes needs --exclude-failed-hosts or --preflight doctor: it is the fewest nodes left after a host is left out, and without them none is",
            ));
        }
        if self.min_nodes() > launch.nodes {
            return Err(JobError::invalid(format!(
                "--min-nodes {} is more than --nodes {}: the job could not go on without any host; lower --min-nodes",
                self.min_nodes(),
                launch.nodes
            )));
        }
        if !self.exclude_failed_hosts {
            return Ok(());
        }
        if launch.hostfile.is_none() {
            return Err(JobError::invalid(
                "--exclude-failed-hosts needs --hostfile FILE: the hosts a failing one is left out of",
            ));
        }
        if self.max.max_restarts == 0 {
            return Err(JobError::invalid(
                "--exclude-failed-hosts needs --max-restarts N (N > 0): a failing host is left out of the next attempt, and without restarts there is none",
            ));
        }
        Ok(())
    }
}

/// `--straggler-action exclude` needs a restart to leave a host out of, and a hostfile to
/// leave it out of.
pub fn check_straggler_action(
    job: &TrainJob,
    launch: &LaunchArgs,
    restarts: &RestartArgs,
) -> Result<(), JobError> {
    if job.options.straggler_action != tchrun::flags::StragglerAction::Exclude {
        return Ok(());
    }
    if restarts.max.max_restarts == 0 {
        return Err(JobError::invalid(
            "--straggler-action exclude needs --max-restarts N (N > 0): a slow host is left out at the next attempt, and without restarts there is none; or use --straggler-action warn",
        ));
    }
    if launch.hostfile.is_none() {
        return Err(JobError::invalid(
            "--straggler-action exclude needs --hostfile FILE: the hosts a slow one is left out of; or use --straggler-action warn",
        ));
    }
    Ok(())
}

/// How a job's attempts ended, short of a failure.
#[derive(Debug)]
pub enum Ended {
    /// The last attempt ended with `code` (0, or 130/143 after a stop); `restarted`: the
    /// attempts before it, oldest first.
    Ran { code: i32, restarted: Vec<Attempt> },
    /// tchrun was stopped while it waited to restart: nothing runs; its exit code.
    StoppedBeforeRestart(i32),
}

/// The job failed: the error `main` prints, and the failure summary written for it to
/// `failure.json` (none when the attempt failed without one: refused input, nothing started).
#[derive(Debug)]
pub struct Failure {
    pub error: JobError,
    pub summary: Option<Box<FailureSummary>>,
}

impl From<JobError> for Failure {
    fn from(error: JobError) -> Failure {
        Failure {
            error,
            summary: None,
        }
    }
}

/// What the attempts of one job share.
pub struct Attempts<'a> {
    pub launch: &'a LaunchArgs,
    pub restarts: &'a RestartArgs,
    /// The environment of every attempt (the locks tchrun holds); each adds its number.
    pub env: RankEnv,
    /// The worker's arguments for the job as it stands (`--resume` after the first attempt).
    pub worker_args: &'a dyn Fn(&TrainJob) -> Result<Vec<String>, JobError>,
    /// The per-node checks' flags (`--preflight doctor`, spares).
    pub health: Health,
}

impl Attempts<'_> {
    /// Runs the job's attempts: the first, and after a failure that made progress a restart
    /// (`--max-restarts`), resuming from the checkpoint on the hosts left. The last attempt's
    /// failure comes back as the error, its `failure.json` written with the earlier attempts.
    /// Each attempt starts with `status.json` saying so (`JobStatus::starting`).
    pub fn run(&self, plan: &mut Plan, job: &mut TrainJob) -> Result<Ended, Failure> {
        let (launch, restarts) = (self.launch, self.restarts);
        let log_dir = plan.log_dir.clone();
        let mut history: Vec<Attempt> = Vec::new();
        let mut host_failures = HostFailures::default();
        self.preflight(&mut host_failures, plan)?;
        loop {
            let attempt = history.len() as u32 + 1;
            let env = RankEnv {
                attempt: Some(attempt),
                ..self.env.clone()
            };
            let started_from = checkpoint_step(&job.output);
            let starting = JobStatus::starting(attempt, plan.world_size() as usize);
            let args = (self.worker_args)(job)?;
            let outcome = run::run_attempt(launch, plan, args, &env, Some(&starting))?;
            if !outcome.restartable() {
                let summary = outcome.summary.clone().map(Box::new);
                return match outcome.finish(&log_dir) {
                    Ok(code) => Ok(Ended::Ran {
                        code,
                        restarted: history,
                    }),
                    Err(error) => Err(Failure { error, summary }),
                };
            }
            let AttemptOutcome {
                result,
                summary,
                logs,
            } = outcome;
            let failure = match result {
                Err(e) => e,
                Ok(code) => {
                    return Ok(Ended::Ran {
                        code,
                        restarted: history,
                    })
                }
            };
            let now = checkpoint_step(&job.output);
            let progressed = now.is_some() && now > started_from;
            if history.len() as u32 >= restarts.max.max_restarts || launch.dry_run || !progressed {
                let mut why = None;
                if restarts.max.max_restarts > 0 && !progressed {
                    let w = format!(
                        "not restarting: attempt {attempt} wrote no checkpoint (it failed before making progress; a restart would fail the same way)"
                    );
                    errln!("tchrun: {w}");
                    why = Some(w);
                }
                return Err(Failure {
                    error: failure,
                    summary: give_up(&log_dir, summary, &history, why).map(Box::new),
                });
            }
            let hardware = summary
                .as_ref()
                .and_then(|s| s.cause.as_ref())
                .filter(|c| c.is_hardware());
            let cause = match hardware {
                Some(c) => format!("{}: {}", c.class(), c.detail()),
                None => summary
                    .as_ref()
                    .map(|s| s.message.lines().next().unwrap_or_default().to_string())
                    .unwrap_or_else(|| failure.to_string()),
            };
            // `--exclude-failed-hosts`: the failure counts against its host(s); one that
            // failed in two attempts is left out of the next. `--straggler-action exclude`:
            // the ranks stopped to leave out the hosts rank 0 named, at once.
            let stragglers = hosts::straggler_hosts(&logs, &log_dir, &plan.node_names);
            let (mut failed_hosts, mut dropped_hosts) = (Vec::new(), Vec::new());
            let counting = restarts.exclude_failed_hosts || !stragglers.is_empty();
            if counting {
                let at_once = hardware.is_some() || !stragglers.is_empty();
                failed_hosts = hosts::counted(stragglers, summary.as_ref(), &logs, plan);
                host_failures.record(attempt, &failed_hosts, &cause, at_once);
            }
            if counting || restarts.preflight == Preflight::Doctor {
                match self.decide_checked(&mut host_failures, plan, attempt + 1, Vec::new())? {
                    HostDecision::Keep => {}
                    HostDecision::Stop(why) => {
                        let why = format!("not restarting: {why}");
                        errln!("tchrun: {why}");
                        return Err(Failure {
                            error: failure,
                            summary: give_up(&log_dir, summary, &history, Some(why)).map(Box::new),
                        });
                    }
                    HostDecision::Drop(d) => dropped_hosts = d,
                }
            }
            // This attempt's failure summary (kept with its logs), then the restart.
            if let Some(s) = &summary {
                report::write_summary(&log_dir, s);
            }
            {
                use std::io::Write as _;
                let _ = write!(std::io::stderr(), "{}", failure.render());
            }
            if !dropped_hosts.is_empty() {
                *plan = hosts::without_hosts(plan, &dropped_hosts)?;
                for d in &dropped_hosts {
                    errln!("tchrun: {}", d.line());
                }
            }
            let record = Attempt {
                attempt,
                rank: summary.as_ref().and_then(|s| s.rank),
                host: summary.as_ref().and_then(|s| s.host.clone()),
                classification: summary
                    .as_ref()
                    .map(|s| s.classification.clone())
                    .unwrap_or(tchrun::driver_log::FailureKind::Internal.into()),
                cause,
                exit_status: failure.kind().exit_code(),
                resumed_from_step: now,
                logs: archive(&log_dir, attempt)?,
                failed_hosts,
                dropped_hosts,
            };
            let wait = backoff(attempt);
            errln!(
                "tchrun: {}; restarting all ranks in {} s from the checkpoint at step {} (restart {attempt} of at most {}; logs of attempt {attempt} in {})",
                record.line(),
                wait.as_secs(),
                now.unwrap_or(0),
                restarts.max.max_restarts,
                record.logs.display()
            );
            history.push(record);
            // `restarts.json` (best effort: each attempt is also said on the console).
            let _ = history.write(&log_dir);
            if let Some(sig) = wait_interruptibly(wait)
                .map_err(|e| JobError::launch(format!("cannot wait for the restart: {e}")))?
            {
                errln!("tchrun: interrupted before the restart; nothing is running");
                return Ok(Ended::StoppedBeforeRestart(
                    if sig == signal_hook::consts::SIGINT {
                        tchrun::exit::ErrorKind::InterruptedInt.exit_code()
                    } else {
                        tchrun::exit::ErrorKind::InterruptedTerm.exit_code()
                    },
                ));
            }
            job.options.resume = true;
        }
    }
}

impl Attempts<'_> {
    /// `--preflight doctor` before the first attempt: `tchrun doctor` on the job's hosts
    /// (`<log-dir>/doctor/`); the hosts that fail are left out (spares of the hostfile take
    /// their places), a slow or broken link is said; below `--min-nodes`, or a failed host
    /// the launch names no hostfile to leave it out of, the job stops (exit 4).
    fn preflight(&self, failures: &mut HostFailures, plan: &mut Plan) -> Result<(), JobError> {
        if self.restarts.preflight != Preflight::Doctor {
            return Ok(());
        }
        if self.launch.dry_run {
            outln!("# --preflight doctor: tchrun doctor would run on the job's hosts first");
            return Ok(());
        }
        self.preflight_doctor(failures, plan)
    }

    /// The doctor's run and what it leaves out (`preflight` without a dry run).
    fn preflight_doctor(
        &self,
        failures: &mut HostFailures,
        plan: &mut Plan,
    ) -> Result<(), JobError> {
        use tchrun_launcher::verdict::same_host;
        let dir = plan.log_dir.join("doctor");
        let (rank, checks) = (&self.health.rank, &self.health.checks);
        // A host where mpirun cannot start a rank is found by the doctor itself (each host
        // checked alone) and is one of its failed hosts.
        let Some(d) = crate::commands::doctor::diagnose(self.launch, rank, checks, &dir)? else {
            return Ok(());
        };
        outln!("{}", tchrun_launcher::verdict::table(&d.report).trim_end());
        outln!("tchrun: --preflight doctor: {}", d.report_path.display());
        for l in &d.report.bad_links {
            errln!("tchrun: warning: --preflight doctor: {l}");
        }
        let passed: Vec<String> = plan
            .node_names
            .iter()
            .filter(|h| d.report.healthy_hosts.iter().any(|x| same_host(x, h)))
            .cloned()
            .collect();
        let (failed, see) = (d.report.failed_hosts, d.report_path);
        if failed.is_empty() {
            return Ok(());
        }
        let stop = |why: String| JobError::RankFailed {
            kind: tchrun::exit::ErrorKind::RankFailed,
            report: format!(
                "tchrun: error: --preflight doctor: {why} (see {})\n",
                see.display()
            ),
        };
        if plan.hostfile.is_none() {
            let names: Vec<&str> = failed.iter().map(|f| f.host.as_str()).collect();
            return Err(stop(format!(
                "host(s) {} failed the checks and the launch names no --hostfile to leave them out of; fix them, or pass --hostfile with the healthy hosts ({})",
                names.join(", "),
                dir.join(tchrun::doctor::HEALTHY_HOSTFILE).display()
            )));
        }
        for f in &failed {
            let host = plan.node_names.iter().find(|h| same_host(&f.host, h));
            failures.unfit(1, host.unwrap_or(&f.host), &f.reasons);
        }
        match self.decide_checked(failures, plan, 1, passed)? {
            HostDecision::Keep => Ok(()),
            HostDecision::Stop(why) => Err(stop(why)),
            HostDecision::Drop(dropped) => {
                *plan = hosts::without_hosts(plan, &dropped)?;
                for d in &dropped {
                    errln!("tchrun: {}", d.line());
                }
                Ok(())
            }
        }
    }

    /// `HostFailures::decide` for the attempt `next`, after the per-node checks of the hosts
    /// that would join it (the spares coming in; with `--preflight doctor`, every host of
    /// it): one that fails is left out too and the next spare checked, until every host of
    /// the attempt passed or too few are left. Bounded: each round leaves out a host or ends.
    /// `checked`: hosts that just passed the checks (not run again).
    fn decide_checked(
        &self,
        failures: &mut HostFailures,
        plan: &Plan,
        next: u32,
        mut checked: Vec<String>,
    ) -> Result<HostDecision, JobError> {
        let min = self.restarts.min_nodes();
        if plan.hostfile.is_none() {
            // No hostfile to leave a host out of, and no spare to take its place.
            return Ok(failures.decide(plan, min));
        }
        let everywhere = self.restarts.preflight == Preflight::Doctor && next > 1;
        let active = hosts::active_hosts(plan);
        for round in 0..=plan.node_names.len() {
            let decision = failures.decide(plan, min);
            if matches!(decision, HostDecision::Stop(_)) {
                return Ok(decision);
            }
            let to_check: Vec<String> = failures
                .next_hosts(plan)
                .into_iter()
                .filter(|h| (everywhere || !active.contains(h)) && !checked.contains(h))
                .collect();
            if to_check.is_empty() {
                return Ok(decision);
            }
            errln!(
                "tchrun: per-node checks of host(s) {} before attempt {next}",
                to_check.join(", ")
            );
            let dir = plan
                .log_dir
                .join(format!("doctor-attempt-{next}"))
                .join(format!("round-{}", round + 1));
            let failed = crate::commands::doctor::check_hosts(
                &to_check,
                self.launch,
                &self.health.rank,
                &self.health.checks,
                &dir,
            )?;
            checked.extend(to_check);
            for f in failed {
                failures.unfit(next, &f.host, &f.reasons);
            }
        }
        Ok(failures.decide(plan, min))
    }
}

/// What the per-node checks of `--preflight doctor` and of spare hosts run with.
pub struct Health {
    /// The ranks' flags (device, log directory set per check).
    pub rank: tchrun::flags::RankFlags,
    /// The job's data and output, the default thresholds.
    pub checks: tchrun::doctor::DoctorChecks,
}

/// The last attempt failed too and is not restarted: its `failure.json` gets the earlier
/// attempts and why tchrun did not restart it (when it could have). Returns it as written.
fn give_up(
    log_dir: &Path,
    summary: Option<FailureSummary>,
    history: &[Attempt],
    not_restarted: Option<String>,
) -> Option<FailureSummary> {
    let mut s = summary?;
    s.earlier_attempts = history.to_vec();
    s.not_restarted = not_restarted;
    report::write_summary(log_dir, &s);
    Some(s)
}

/// The optimizer step of the last complete checkpoint in `output`, if any.
pub fn checkpoint_step(output: &Path) -> Option<u64> {
    tchrun::checkpoint::read(output)
        .ok()
        .flatten()
        .map(|l| l.step)
}

/// Moves the attempt's driver logs, heartbeats, launch log, rank table and failure summary from `log_dir`
/// into `<log_dir>/attempt-<n>/`; returns that directory.
pub fn archive(log_dir: &Path, attempt: u32) -> Result<PathBuf, JobError> {
    let dir = files::attempt_dir(log_dir, attempt);
    std::fs::create_dir_all(&dir)
        .map_err(|e| JobError::input_io(format!("--log-dir {}", dir.display()), e))?;
    let rd = std::fs::read_dir(log_dir)
        .map_err(|e| JobError::input_io(format!("--log-dir {}", log_dir.display()), e))?;
    for e in rd.flatten() {
        let name = e.file_name().to_string_lossy().to_string();
        let ours = files::driver_log_rank(&name).is_some()
            || tchrun::job_record::heartbeat::rank_of(&name).is_some()
            || tchrun::job_record::stacks::is_capture_file(&name)
            || tchrun::job_record::memory::rank_of(&name).is_some()
            || [files::MPI_LOG, files::RANKS_JSON, files::FAILURE_JSON].contains(&name.as_str());
        if ours {
            std::fs::rename(e.path(), dir.join(&name)).map_err(|err| {
                JobError::input_io(format!("moving {} to {}", name, dir.display()), err)
            })?;
        }
    }
    Ok(dir)
}

/// The wait before restart `n` (1-based): 1 s, 2 s, 4 s, ... at most 16 s.
pub fn backoff(n: u32) -> Duration {
    Duration::from_secs(1u64 << n.saturating_sub(1).min(4))
}

/// Waits `d`, or less when tchrun receives SIGINT/SIGTERM: then that signal's number.
pub fn wait_interruptibly(d: Duration) -> std::io::Result<Option<i32>> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let flag = Arc::new(AtomicUsize::new(0));
    let mut ids = Vec::new();
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        ids.push(signal_hook::flag::register_usize(
            sig,
            Arc::clone(&flag),
            sig as usize,
        )?);
    }
    let end = Instant::now() + d;
    let mut got = None;
    while Instant::now() < end {
        let s = flag.load(Ordering::SeqCst);
        if s != 0 {
            got = Some(s as i32);
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for id in ids {
        signal_hook::low_level::unregister(id);
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_is_short_and_bounded() {
        let secs: Vec<u64> = (1..=8).map(|n| backoff(n).as_secs()).collect();
        assert_eq!(secs, vec![1, 2, 4, 8, 16, 16, 16, 16]);
    }

    #[test]
    fn the_checkpoint_step_comes_from_last_json() {
        let t = tempfile::tempdir().unwrap();
        assert_eq!(checkpoint_step(t.path()), None);
        let d = t.path().join(files::CHECKPOINT_DIR);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(
            d.join(files::CHECKPOINT_LAST),
            r#"{"format_version": 1, "epoch": 1, "batches_done": 0, "step": 42, "world_size": 2,
                "seed": 1, "best_loss": null, "best_epoch": null, "since_best": 0, "history": [],
                "partial": [0, 0, 0], "loss_scale": 1, "finished": false,
                "tensors": "last-42.safetensors"}"#,
        )
        .unwrap();
        assert_eq!(checkpoint_step(t.path()), Some(42));
    }

    #[test]
    fn archive_moves_only_the_attempts_files() {
        let t = tempfile::tempdir().unwrap();
        let l = t.path();
        for f in [
            "70_driver_log_0",
            "70_driver_log_1",
            "70_mpi_log",
            "ranks.json",
            "failure.json",
            "heartbeat-1.json",
        ] {
            std::fs::write(l.join(f), f).unwrap();
        }
        std::fs::write(l.join("verified_inputs.json"), "{}").unwrap();
        let d = archive(l, 1).unwrap();
        assert_eq!(d, l.join("attempt-1"));
        assert_eq!(
            std::fs::read_to_string(d.join("70_driver_log_1")).unwrap(),
            "70_driver_log_1"
        );
        assert!(!l.join("70_driver_log_0").exists() && !l.join("failure.json").exists());
        assert!(d.join("heartbeat-1.json").is_file());
        assert!(
            l.join("verified_inputs.json").exists(),
            "the job's own files stay"
        );
    }
}
