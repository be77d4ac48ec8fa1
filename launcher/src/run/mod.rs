//! Running one attempt of a job, from a validated plan to what it came to: the commands, the
//! dry run, the log directory, supervision (`supervise.rs`), the rank table (`ranks.rs`) and
//! the outcome (`outcome.rs`). Must not know the restart policy, a command's inputs, or how a
//! failure summary is worded (that is `report`'s).
pub mod capture;
pub mod console;
pub mod hang;
pub mod outcome;
pub mod ranks;
pub mod supervise;

use crate::error::JobError;
use crate::plan::gpus::GpuUse;
use crate::plan::launch::{self, CommandSpec, LaunchArgs, LauncherKind, Plan};
use crate::report;
use nix::sys::signal::Signal;
pub use outcome::AttemptOutcome;
use std::path::{Path, PathBuf};
use std::time::Duration;
use supervise::Settings;
use tchrun::files;
use tchrun::job_record::{JobStatus, Record};

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind(("127.0.0.1", 0))?
        .local_addr()?
        .port())
}

/// What tchrun tells the processes of one attempt through their environment: set on each
/// command it spawns (mpirun `-x` and srun `--export=ALL` pass it on to the ranks), never on
/// tchrun's own environment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RankEnv {
    /// `TCHRUN_ATTEMPT`: which attempt of a `tchrun train` job this is (1, 2, ...); also the
    /// `attempt` of the rows of `ranks.json` (1 when unset).
    pub attempt: Option<u32>,
    /// `TCHRUN_LOCK_HELD`: the job locks tchrun holds for the ranks (`tchrun::lock`).
    pub locks_held: Option<String>,
}

impl RankEnv {
    /// The environment of a job that holds `locks` (none for a dry run: nothing is said).
    pub fn holding(locks: &[tchrun::lock::JobLock]) -> RankEnv {
        RankEnv {
            attempt: None,
            locks_held: (!locks.is_empty()).then(|| tchrun::lock::held_value(locks)),
        }
    }

    /// The variables, set on every command of the attempt.
    pub fn vars(&self) -> Vec<(String, String)> {
        let mut v = Vec::new();
        if let Some(a) = self.attempt {
            v.push((tchrun::env::TCHRUN_ATTEMPT.to_string(), a.to_string()));
        }
        if let Some(h) = &self.locks_held {
            v.push((tchrun::env::TCHRUN_LOCK_HELD.to_string(), h.clone()));
        }
        v
    }
}

/// The variables forwarded to remote ranks: those of tchrun's environment that are forwarded
/// and the attempt's own (`env`).
fn forwarded(env: &[(String, String)]) -> Vec<String> {
    launch::forwarded_vars(
        std::env::vars()
            .map(|(k, _)| k)
            .chain(env.iter().map(|(k, _)| k.clone())),
    )
}

/// The commands for a plan.
fn commands(
    plan: &Plan,
    worker_args: &[String],
    env: &[(String, String)],
) -> Result<Vec<CommandSpec>, JobError> {
    let forward = forwarded(env);
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

fn print_dry_run(plan: &Plan, specs: &[CommandSpec], env: &[(String, String)]) {
    outln!(
        "# launcher: {:?}, {} rank(s): {} node(s) x {} per node",
        plan.kind,
        plan.world_size(),
        plan.nodes,
        plan.procs_per_node
    );
    outln!("# log directory: {}", plan.log_dir.display());
    let forward = forwarded(env);
    if !forward.is_empty() {
        outln!("# environment forwarded to the ranks:");
        for k in &forward {
            let v = env
                .iter()
                .find(|(name, _)| name == k)
                .map(|(_, v)| v.clone())
                .or_else(|| std::env::var(k).ok())
                .unwrap_or_default();
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
            if files::driver_log_rank(&name).is_some()
                || name == files::FAILURE_JSON
                || tchrun::job_record::heartbeat::rank_of(&name).is_some()
                || tchrun::job_record::stacks::is_capture_file(&name)
                || tchrun::job_record::memory::rank_of(&name).is_some()
                || name == files::STATUS_JSON
                || name == report::reserve::NAME
            {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// The job's `--prometheus-textfile` file (`tchrun train`), set once before its first status.
static TEXTFILE: std::sync::OnceLock<tchrun_prometheus::Textfile> = std::sync::OnceLock::new();

/// `--prometheus-textfile`: [`write_status`] also writes the job's `.prom` file.
pub fn set_textfile(textfile: tchrun_prometheus::Textfile) {
    let _ = TEXTFILE.set(textfile);
}

/// Writes `status.json`, and with `--prometheus-textfile` the job's `.prom` file (best effort:
/// a job whose status cannot be written still runs, and ends with the same code); the first
/// failure of each is said once, as a warning.
pub fn write_status(log_dir: &Path, status: &JobStatus) {
    use std::sync::atomic::{AtomicBool, Ordering};
    static WARNED: AtomicBool = AtomicBool::new(false);
    static WARNED_PROM: AtomicBool = AtomicBool::new(false);
    if let Err(e) = status.write(log_dir) {
        if !WARNED.swap(true, Ordering::SeqCst) {
            errln!("tchrun: warning: cannot write {e}: `tchrun status` cannot show this job");
        }
    }
    if let Some(t) = TEXTFILE.get() {
        if let Err(e) = t.write(status, std::time::SystemTime::now()) {
            if !WARNED_PROM.swap(true, Ordering::SeqCst) {
                errln!(
                    "tchrun: warning: cannot write {e}: Prometheus does not see this job's \
                     metrics ({})",
                    tchrun_prometheus::FLAG
                );
            }
        }
    }
}

/// Creates the log directory (0755 whatever the umask: a `umask 000` does not make it
/// writable by everyone) and warns, naming owner and mode, when other users can write it:
/// they could plant links there (tchrun opens its files there without following links).
fn create_log_dir(dir: &Path) -> Result<(), JobError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(|e| {
            JobError::invalid(format!(
                "--log-dir {}: cannot create it: {e}",
                dir.display()
            ))
        })?;
    if let Ok(m) = std::fs::metadata(dir) {
        let mode = m.mode() & 0o7777;
        if mode & 0o022 != 0 {
            errln!(
                "tchrun: warning: the log directory {} is writable by other users (owner uid {}, \
                 mode {mode:04o}): they can replace its files; tchrun writes there without \
                 following links, but use a directory only you can write",
                dir.display(),
                m.uid()
            );
        }
    }
    Ok(())
}

/// Runs a job end to end (pre-flight, GPU check, launch); returns the exit code.
pub fn run_job(
    args: &LaunchArgs,
    log_dir: PathBuf,
    worker_args: Vec<String>,
    usage: GpuUse,
    console: &tchrun::console::Selection,
) -> Result<i32, JobError> {
    let plan = crate::plan::preflight::validate(args, log_dir, usage, console)?;
    run_planned(args, &plan, worker_args, &RankEnv::default())
}

/// Runs a job whose plan passed its pre-flight in one attempt (its failure summary written);
/// returns the exit code.
pub fn run_planned(
    args: &LaunchArgs,
    plan: &Plan,
    worker_args: Vec<String>,
    env: &RankEnv,
) -> Result<i32, JobError> {
    run_attempt(args, plan, worker_args, env, None)?.finish(&plan.log_dir)
}

/// Runs one attempt of a job whose plan passed its pre-flight: its commands, supervised to
/// the end, then what it came to. An error here means nothing ran (or could not be watched);
/// everything after the start is in the outcome, whose failure summary is not written yet.
/// `status`: the `status.json` written once the log directory is cleared, before the commands
/// are made and the ranks start (a training job's `starting`; none for the other jobs).
pub fn run_attempt(
    args: &LaunchArgs,
    plan: &Plan,
    worker_args: Vec<String>,
    env: &RankEnv,
    status: Option<&JobStatus>,
) -> Result<AttemptOutcome, JobError> {
    let mut vars = env.vars();
    if args.dry_run {
        let specs = commands(plan, &worker_args, &vars)?;
        print_dry_run(plan, &specs, &vars);
        return Ok(AttemptOutcome::ended(0));
    }
    // The attempt's secret: in the environment of the commands only (mpirun forwards it by
    // name with `-x`, srun with `--export=ALL`), never in an argument, a log or a file.
    vars.push((
        tchrun::env::TCHRUN_JOB_SECRET.to_string(),
        tchrun::secret::JobSecret::generate().to_hex(),
    ));
    create_log_dir(&plan.log_dir)?;
    clear_stale(&plan.log_dir);
    report::reserve::hold(&plan.log_dir).map_err(|e| {
        JobError::invalid(format!(
            "--log-dir {}: cannot keep {} KiB for the failure summary there ({e}){}; free some \
             space there or choose another --log-dir",
            plan.log_dir.display(),
            report::reserve::SIZE >> 10,
            files::free_bytes(&plan.log_dir)
                .map(|b| format!(", {} KiB are free on its file system", b >> 10))
                .unwrap_or_default()
        ))
    })?;
    let held = launch_holding_the_reserve(args, plan, worker_args, env, status, vars);
    if held.is_err() {
        // Nothing ran, so no summary will give it up.
        report::reserve::release(&plan.log_dir);
    }
    held
}

/// `run_attempt` once the log directory is ready and its reserve held.
fn launch_holding_the_reserve(
    args: &LaunchArgs,
    plan: &Plan,
    worker_args: Vec<String>,
    env: &RankEnv,
    status: Option<&JobStatus>,
    vars: Vec<(String, String)>,
) -> Result<AttemptOutcome, JobError> {
    if let Some(s) = status {
        write_status(&plan.log_dir, s);
    }
    let specs = commands(plan, &worker_args, &vars)?;
    let mpi_log_path = files::mpi_log(&plan.log_dir);
    let mut mpi_log = files::create_log(&mpi_log_path)
        .map_err(|e| JobError::invalid(format!("cannot write {}: {e}", mpi_log_path.display())))?;
    {
        use std::io::Write;
        for s in &specs {
            let _ = writeln!(mpi_log, "# {}", s.display());
        }
    }
    let watch = std::sync::Arc::new(hang::Watch::new(
        plan.log_dir.clone(),
        hang::Policy::from_flag(args.hang_timeout),
    ));
    let settings = settings(args, plan, vars, std::sync::Arc::clone(&watch));
    let attempt = env.attempt.unwrap_or(1);
    ranks::write_table(plan, attempt);
    // The kernel log's newest record now: after a rank dies, only what follows is its.
    let kernel_mark = tchrun_launcher::kernel_log::mark();
    let supervised = supervise::run(&specs, mpi_log, &settings)
        .map_err(|e| JobError::launch(format!("{e} (see {})", mpi_log_path.display())))?;
    let logs = report::read_driver_logs(&plan.log_dir);
    ranks::finish(plan, attempt, &logs, &supervised);
    Ok(outcome::conclude(
        args,
        plan,
        &supervised,
        logs,
        &mpi_log_path,
        watch.found(),
        kernel_mark,
    ))
}

/// How the attempt's processes are supervised.
fn settings(
    args: &LaunchArgs,
    plan: &Plan,
    env: Vec<(String, String)>,
    watch: std::sync::Arc<hang::Watch>,
) -> Settings {
    let log_dir_probe = plan.log_dir.clone();
    let log_dir_stacks = plan.log_dir.clone();
    Settings {
        fail_fast: plan.kind == LauncherKind::Local,
        grace: Duration::from_secs(args.grace_period),
        graceful: if plan.kind == LauncherKind::Local {
            Signal::SIGTERM
        } else {
            Signal::SIGUSR1
        },
        hung: Some(Box::new(move || watch.hung())),
        stacks: Some(Box::new(move || {
            let beats = tchrun::job_record::heartbeat::Heartbeat::read_all(&log_dir_stacks);
            let (stacks, summary) =
                capture::capture(&log_dir_stacks, &beats, "SIGUSR2", capture::ANSWER_LIMIT);
            errln!(
                "{}",
                capture::render(&log_dir_stacks, &stacks, &summary).trim_end()
            );
        })),
        rank_failed: Some(Box::new(move || report::any_rank_failed(&log_dir_probe))),
        env,
        console: (plan.console.clone(), plan.world_size() as usize),
    }
}
