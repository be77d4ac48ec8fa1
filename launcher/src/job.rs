//! One job from flags to exit code: pre-flight → plan → (dry run | supervise) → outcome.
use crate::gpus::{self, GpuUse};
use crate::launch::{self, CommandSpec, LaunchArgs, LauncherKind, Plan};
use crate::report::{self, FailureSummary};
use crate::supervise::{self, Ended, Settings};
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tchrun::exit::ErrorKind;
use tchrun::files;

/// A job that could not run, with the kind that decides the exit code.
#[derive(Debug)]
pub struct JobError {
    pub kind: ErrorKind,
    pub message: String,
}

impl JobError {
    pub fn invalid(message: impl Into<String>) -> JobError {
        JobError {
            kind: ErrorKind::InvalidInput,
            message: message.into(),
        }
    }
    pub fn launch(message: impl Into<String>) -> JobError {
        JobError {
            kind: ErrorKind::LaunchFailed,
            message: message.into(),
        }
    }
}

/// `p` made absolute against the current directory (ranks may run elsewhere).
pub fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

fn on_path(program: &str) -> bool {
    std::env::var_os(tchrun::env::PATH)
        .map(|paths| std::env::split_paths(&paths).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

fn default_worker() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let w = exe.parent()?.join("tchrun-worker");
    w.is_file().then_some(w)
}

fn cores() -> u32 {
    std::thread::available_parallelism()
        .map(|n| n.get() as u32)
        .unwrap_or(1)
}

/// Pre-flight of the launch flags: everything checkable before a rank starts.
pub fn plan(args: &LaunchArgs, log_dir: PathBuf) -> Result<Plan, JobError> {
    let worker = match &args.worker {
        Some(w) => absolute(w.clone()),
        None => default_worker().ok_or_else(|| {
            JobError::invalid("tchrun-worker not found beside tchrun; pass --worker PATH (the same path on every node)")
        })?,
    };
    if !worker.is_file() {
        return Err(JobError::invalid(format!(
            "--worker {}: no such file; build it with `cargo build --release` or pass the right path",
            worker.display()
        )));
    }
    let in_slurm = std::env::var_os(tchrun::env::SLURM_JOB_ID).is_some();
    let kind = match args.launcher {
        LauncherKind::Auto if in_slurm && args.hostfile.is_none() && args.hosts.is_empty() => LauncherKind::Srun,
        LauncherKind::Auto if on_path("mpirun") => LauncherKind::Mpirun,
        LauncherKind::Auto if args.nodes == 1 && args.hostfile.is_none() && args.hosts.is_empty() => LauncherKind::Local,
        LauncherKind::Auto => {
            return Err(JobError::invalid(
                "a multi-node job needs mpirun (install OpenMPI: scripts/setup.sh) or a Slurm allocation",
            ))
        }
        k => k,
    };
    match kind {
        LauncherKind::Mpirun if !on_path("mpirun") => {
            return Err(JobError::invalid("--launcher mpirun: mpirun is not on PATH; install OpenMPI (scripts/setup.sh) or use --launcher local"))
        }
        LauncherKind::Srun if !on_path("srun") => {
            return Err(JobError::invalid("--launcher srun: srun is not on PATH; run inside a Slurm allocation or use --launcher mpirun"))
        }
        LauncherKind::Srun if !in_slurm => {
            return Err(JobError::invalid("--launcher srun: not inside a Slurm allocation (SLURM_JOB_ID unset); use `tchrun sbatch` or salloc"))
        }
        LauncherKind::Local if args.nodes > 1 || args.hostfile.is_some() || !args.hosts.is_empty() => {
            return Err(JobError::invalid(format!(
                "--launcher local runs on this host only; --nodes {} needs --launcher mpirun or srun",
                args.nodes
            )))
        }
        _ => {}
    }
    let mut hosts = Vec::new();
    if let Some(f) = &args.hostfile {
        let text = std::fs::read_to_string(f)
            .map_err(|e| JobError::invalid(format!("--hostfile {}: {e}", f.display())))?;
        hosts = launch::parse_hostfile(f, &text)
            .map_err(|e| JobError::invalid(format!("--hostfile {e}")))?;
        if hosts.is_empty() {
            return Err(JobError::invalid(format!(
                "--hostfile {}: no hosts in it",
                f.display()
            )));
        }
    } else if !args.hosts.is_empty() {
        hosts = args
            .hosts
            .iter()
            .map(|h| launch::Host {
                name: h.clone(),
                slots: None,
            })
            .collect();
    }
    if !hosts.is_empty() && (args.nodes as usize) > hosts.len() {
        return Err(JobError::invalid(format!(
            "--nodes {} is more than the {} host(s) given ({}); lower --nodes or add hosts",
            args.nodes,
            hosts.len(),
            hosts
                .iter()
                .map(|h| h.name.as_str())
                .collect::<Vec<_>>()
                .join(",")
        )));
    }
    if hosts.is_empty() && kind != LauncherKind::Srun {
        if args.nodes > 1 {
            return Err(JobError::invalid(format!(
                "--nodes {} needs the hosts: pass --hostfile FILE or --hosts a,b (or run inside a Slurm allocation)",
                args.nodes
            )));
        }
        let c = cores();
        if args.procs_per_node > c && !args.oversubscribe {
            return Err(JobError::invalid(format!(
                "--procs-per-node {} exceeds the {c} CPU cores of this host; lower --procs-per-node to {c} or pass --oversubscribe",
                args.procs_per_node
            )));
        }
    }
    let mpirun_args = match &args.mpirun_args {
        Some(s) => {
            shell_words::split(s).map_err(|e| JobError::invalid(format!("--mpirun-args: {e}")))?
        }
        None => Vec::new(),
    };
    Ok(Plan {
        kind,
        node_names: hosts.iter().map(|h| h.name.clone()).collect(),
        nodes: args.nodes,
        procs_per_node: args.procs_per_node,
        hosts: if args.hostfile.is_some() {
            Vec::new()
        } else {
            hosts
        },
        hostfile: args.hostfile.clone().map(absolute),
        oversubscribe: args.oversubscribe,
        worker,
        log_dir,
        mpirun_args,
        as_root: nix::unistd::geteuid().is_root(),
    })
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// The commands for a plan.
fn commands(plan: &Plan, worker_args: &[String]) -> Result<Vec<CommandSpec>, JobError> {
    let forward = launch::forwarded_vars(std::env::vars().map(|(k, _)| k));
    Ok(match plan.kind {
        LauncherKind::Mpirun | LauncherKind::Auto => {
            vec![launch::mpirun_command(plan, worker_args, &forward)]
        }
        LauncherKind::Srun => vec![launch::srun_command(plan, worker_args)],
        LauncherKind::Local => {
            let port =
                free_port().map_err(|e| JobError::launch(format!("no free local port: {e}")))?;
            launch::local_commands(plan, worker_args, port)
        }
    })
}

fn print_dry_run(plan: &Plan, specs: &[CommandSpec]) {
    outln!(
        "# launcher: {:?}, {} rank(s): {} node(s) x {} per node",
        plan.kind,
        plan.world_size(),
        plan.nodes,
        plan.procs_per_node
    );
    outln!("# log directory: {}", plan.log_dir.display());
    let forward = launch::forwarded_vars(std::env::vars().map(|(k, _)| k));
    if !forward.is_empty() {
        outln!("# environment forwarded to the ranks:");
        for k in &forward {
            let v = std::env::var(k).unwrap_or_default();
            let shown = if launch::is_secret(k) {
                "<redacted>".to_string()
            } else {
                v
            };
            outln!("#   {k}={shown}");
        }
    }
    for s in specs {
        let env: Vec<String> = s
            .env
            .iter()
            .map(|(k, v)| {
                format!(
                    "{k}={}",
                    if launch::is_secret(k) {
                        "<redacted>"
                    } else {
                        v
                    }
                )
            })
            .collect();
        if env.is_empty() {
            outln!("{}", s.display());
        } else {
            outln!("{} {}", env.join(" "), s.display());
        }
    }
}

/// Removes driver logs and summaries of an earlier job in the same directory, so that what is
/// there after the run belongs to this run.
fn clear_stale(log_dir: &Path) {
    if let Ok(rd) = std::fs::read_dir(log_dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if files::driver_log_rank(&name).is_some() || name == files::FAILURE_JSON {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// mpirun's "Process name: [[job,1],R] ... Exit code: C" of the first failing rank.
fn mpirun_first_failure(tail: &[String]) -> (Option<usize>, Option<i32>) {
    let mut rank = None;
    let mut code = None;
    for l in tail {
        let t = l.trim();
        if let Some(rest) = t.strip_prefix("Process name:") {
            rank = rest
                .trim()
                .trim_end_matches(']')
                .rsplit(',')
                .next()
                .and_then(|r| r.trim().parse().ok());
        } else if let Some(rest) = t.strip_prefix("Exit code:") {
            code = rest.trim().parse().ok();
        } else if let Some(rest) = t.strip_prefix("mpirun noticed that process rank ") {
            // "... rank 1 with PID 0 on node vm exited on signal 9 (Killed)."
            if rank.is_none() {
                rank = rest.split_whitespace().next().and_then(|r| r.parse().ok());
                code = rest
                    .split("on signal ")
                    .nth(1)
                    .and_then(|x| x.split_whitespace().next())
                    .and_then(|n| n.parse::<i32>().ok())
                    .map(|sig| 128 + sig);
            }
        }
    }
    (rank, code)
}

fn launch_failure_message(plan: &Plan, tail: &[String]) -> String {
    let text = tail.join("\n");
    if text.contains("not enough slots") {
        format!(
            "mpirun refused {} rank(s): not enough slots. Lower --procs-per-node ({}) or --nodes ({}), \
             raise slots= in the --hostfile, or pass --oversubscribe",
            plan.world_size(),
            plan.procs_per_node,
            plan.nodes
        )
    } else if text.contains("unable to reliably start")
        || text.contains("ORTE does not know how to route")
    {
        "mpirun could not start its daemons on the hosts (ssh failed or a host is unreachable); check --hostfile/--hosts and passwordless ssh".into()
    } else if text.contains("was unable to find the specified executable")
        || text.contains("No such file")
    {
        format!("the worker {} was not found on every node; install it at the same path or pass --worker", plan.worker.display())
    } else {
        "the ranks could not be started".into()
    }
}

/// Runs a job end to end (pre-flight, GPU check, launch); returns the exit code.
pub fn run_job(
    args: &LaunchArgs,
    log_dir: PathBuf,
    worker_args: Vec<String>,
    usage: GpuUse,
) -> Result<i32, JobError> {
    let plan = plan(args, log_dir)?;
    gpus::check(&plan, usage)?;
    run_planned(args, &plan, worker_args)
}

/// Runs a job whose plan passed its pre-flight; returns the exit code.
fn run_planned(args: &LaunchArgs, plan: &Plan, worker_args: Vec<String>) -> Result<i32, JobError> {
    let specs = commands(plan, &worker_args)?;
    if args.dry_run {
        print_dry_run(plan, &specs);
        return Ok(0);
    }
    std::fs::create_dir_all(&plan.log_dir).map_err(|e| {
        JobError::invalid(format!(
            "--log-dir {}: cannot create it: {e}",
            plan.log_dir.display()
        ))
    })?;
    clear_stale(&plan.log_dir);
    let mpi_log_path = files::mpi_log(&plan.log_dir);
    let mut mpi_log = std::fs::File::create(&mpi_log_path)
        .map_err(|e| JobError::invalid(format!("cannot write {}: {e}", mpi_log_path.display())))?;
    {
        use std::io::Write;
        for s in &specs {
            let _ = writeln!(mpi_log, "# {}", s.display());
        }
    }
    let log_dir_probe = plan.log_dir.clone();
    let settings = Settings {
        fail_fast: plan.kind == LauncherKind::Local,
        grace: Duration::from_secs(args.grace_period),
        graceful: if plan.kind == LauncherKind::Local {
            Signal::SIGTERM
        } else {
            Signal::SIGUSR1
        },
        hang_timeout: (args.hang_timeout > 0).then(|| Duration::from_secs(args.hang_timeout)),
        progress: Some(Box::new({
            let d = log_dir_probe.clone();
            move || report::last_progress(&d)
        })),
        rank_failed: Some(Box::new(move || report::any_rank_failed(&log_dir_probe))),
    };
    crate::ranks::write_table(plan);
    let outcome = supervise::run(&specs, mpi_log, &settings)
        .map_err(|e| JobError::launch(format!("{e} (see {})", mpi_log_path.display())))?;
    crate::ranks::finish(plan, &report::read_driver_logs(&plan.log_dir), &outcome);
    if outcome.hung {
        let logs = report::read_driver_logs(&plan.log_dir);
        let mut msg = format!(
            "no rank made progress for {} s (--hang-timeout); the job was stopped. Last line of each rank:",
            args.hang_timeout
        );
        for l in &logs {
            msg.push_str(&format!(
                "\n  rank {} ({}): {}",
                l.rank,
                l.host,
                l.tail.last().map(String::as_str).unwrap_or("")
            ));
        }
        let summary = FailureSummary::hang(msg.clone());
        report::write_summary(&plan.log_dir, &summary);
        return Err(JobError {
            kind: ErrorKind::RankFailed,
            message: msg,
        });
    }
    if let Some(sig) = outcome.interrupted {
        let kind = if sig == signal_hook::consts::SIGINT {
            ErrorKind::InterruptedInt
        } else {
            ErrorKind::InterruptedTerm
        };
        errln!(
            "tchrun: interrupted; all ranks stopped (logs in {})",
            plan.log_dir.display()
        );
        return Ok(kind.exit_code());
    }
    let Some(first) = outcome.first_failure.clone() else {
        report::run_report(&plan.log_dir);
        return Ok(0);
    };
    let logs = report::read_driver_logs(&plan.log_dir);
    let (hint_rank, hint_code) = match plan.kind {
        LauncherKind::Local => (Some(first.index), Some(first.ended.as_code())),
        _ => mpirun_first_failure(&outcome.tail),
    };
    let code = hint_code.unwrap_or(first.ended.as_code());
    // A rank that refused its input exits 2 before it opens a driver log: its message is
    // already on the terminal; that is invalid input, not a failed launch.
    if logs.is_empty() && code == ErrorKind::InvalidInput.exit_code() {
        return Err(JobError::invalid(format!(
            "the ranks refused the input (see their message above and {})",
            mpi_log_path.display()
        )));
    }
    if logs.is_empty() {
        let message = launch_failure_message(plan, &outcome.tail);
        let summary =
            FailureSummary::launch_failure(message.clone(), first.ended.as_code(), &outcome.tail);
        report::write_summary(&plan.log_dir, &summary);
        return Err(JobError::launch(format!(
            "{message}\n  launcher output: {}",
            mpi_log_path.display()
        )));
    }
    // Which rank: local ranks are one process each; mpirun names the first one.
    let kind = ErrorKind::from_worker_exit(code).unwrap_or(ErrorKind::RankFailed);
    let culprit = report::first_failing(&logs, hint_rank);
    let signal = match first.ended {
        Ended::Signal(s) => Some(s),
        Ended::Code(_) => None,
    };
    let summary = FailureSummary::rank_failure(culprit, code, signal, first.at, kind.exit_code());
    report::write_summary(&plan.log_dir, &summary);
    {
        use std::io::Write as _;
        let _ = write!(
            std::io::stderr(),
            "{}",
            report::render(&summary, &plan.log_dir)
        );
    }
    Ok(kind.exit_code())
}

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
        tchrun::preflight::check_train_job_with(&job, tchrun::preflight::Verification::Full)
            .map_err(|e| JobError::invalid(e.to_string()))?;
    let mut rank = rank.clone();
    let log_dir = absolute(
        rank.log_dir
            .clone()
            .unwrap_or_else(|| job.output.join(files::DEFAULT_LOG_SUBDIR)),
    );
    let plan = plan(launch, log_dir.clone())?;
    gpus::check(&plan, GpuUse::Ranks(rank.device))?;
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
        report::training_report(&job.output)
            .iter()
            .for_each(|l| outln!("{l}"));
    }
    Ok(code)
}

/// `tchrun score`: runs `tchrun-worker score` as a local child (the launcher has no libtorch).
pub fn run_score(worker: Option<&Path>, job: &tchrun::flags::ScoreJob) -> Result<i32, JobError> {
    // One process on this host.
    gpus::check_here(1, GpuUse::Ranks(job.device))?;
    tchrun::model::load(&job.model, true).map_err(|e| JobError::invalid(format!("--model {e}")))?;
    let worker = match worker {
        Some(w) => w.to_path_buf(),
        None => default_worker().ok_or_else(|| {
            JobError::invalid("tchrun-worker not found beside tchrun; pass --worker PATH")
        })?,
    };
    let status = std::process::Command::new(&worker)
        .arg("score")
        .args(job.to_args())
        .status()
        .map_err(|e| JobError::launch(format!("cannot start {}: {e}", worker.display())))?;
    Ok(status.code().unwrap_or(ErrorKind::RankFailed.exit_code()))
}

/// `--output` must be writable (a read-only mount is refused before any rank starts).
fn check_writable(output: &Path) -> Result<(), JobError> {
    let fail = |e: std::io::Error| {
        JobError::invalid(format!(
            "--output {}: not writable ({e}); choose a writable directory",
            output.display()
        ))
    };
    std::fs::create_dir_all(output).map_err(fail)?;
    let probe = output.join(format!(".tchrun-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(fail)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &str) -> Vec<String> {
        text.lines().map(str::to_string).collect()
    }

    /// mpirun's own words (OpenMPI 4.1, as printed here) name the first failing rank.
    #[test]
    fn mpirun_output_names_the_first_failing_rank() {
        let exited = lines(
            "--------------------------------------------------------------------------\n\
             mpirun detected that one or more processes exited with non-zero status, thus causing\n\
             the job to be terminated. The first process to do so was:\n\
             \n\
             \x20 Process name: [[27021,1],1]\n\
             \x20 Exit code:    3\n\
             --------------------------------------------------------------------------",
        );
        assert_eq!(mpirun_first_failure(&exited), (Some(1), Some(3)));
        let killed = lines(
            "mpirun noticed that process rank 2 with PID 0 on node vm exited on signal 9 (Killed).",
        );
        assert_eq!(mpirun_first_failure(&killed), (Some(2), Some(128 + 9)));
        assert_eq!(
            mpirun_first_failure(&lines("hello\nExit code: not a number")),
            (None, None)
        );
        assert_eq!(mpirun_first_failure(&[]), (None, None));
    }

    #[test]
    fn launch_failures_say_what_to_change() {
        let plan = Plan {
            kind: LauncherKind::Mpirun,
            node_names: Vec::new(),
            nodes: 2,
            procs_per_node: 3,
            hosts: Vec::new(),
            hostfile: None,
            oversubscribe: false,
            worker: PathBuf::from("/opt/tchrun-worker"),
            log_dir: PathBuf::from("/tmp/logs"),
            mpirun_args: Vec::new(),
            as_root: false,
        };
        let slots = launch_failure_message(
            &plan,
            &lines("There are not enough slots available in the system to satisfy the 6"),
        );
        assert!(
            slots.contains("6 rank(s)")
                && slots.contains("--procs-per-node (3)")
                && slots.contains("--oversubscribe"),
            "{slots}"
        );
        let daemons = launch_failure_message(
            &plan,
            &lines("ORTE was unable to reliably start one or more daemons."),
        );
        assert!(daemons.contains("passwordless ssh"), "{daemons}");
        let missing = launch_failure_message(
            &plan,
            &lines("mpirun was unable to find the specified executable file"),
        );
        assert!(
            missing.contains("/opt/tchrun-worker") && missing.contains("--worker"),
            "{missing}"
        );
        assert_eq!(
            launch_failure_message(&plan, &lines("something else")),
            "the ranks could not be started"
        );
    }
}
