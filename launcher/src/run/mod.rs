//! Running one attempt of a job, from a validated plan to what it came to: the commands, the
//! dry run, the log directory, supervision (`supervise.rs`), the rank table (`ranks.rs`) and
//! the outcome (`outcome.rs`). Must not know the restart policy, a command's inputs, or how a
//! failure summary is worded (that is `report`'s).
pub mod outcome;
pub mod ranks;
pub mod supervise;

use crate::error::JobError;
use crate::plan::gpus::GpuUse;
use crate::plan::launch::{self, CommandSpec, LaunchArgs, LauncherKind, Plan};
use crate::report;
use nix::sys::signal::Signal;
use std::path::{Path, PathBuf};
use std::time::Duration;
use supervise::Settings;
use tchrun::files;

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

/// A log file, empty, with the mode of every log file (0640, as the driver logs and the
/// atomic writes): created so, or narrowed if an older one was wider.
fn create_log(path: &Path) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let f = std::fs::OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .mode(0o640)
        .open(path)?;
    let mode = f.metadata()?.permissions().mode() & 0o7777;
    if mode & !0o640 != 0 {
        f.set_permissions(std::fs::Permissions::from_mode(mode & 0o640))?;
    }
    Ok(f)
}

/// Runs a job end to end (pre-flight, GPU check, launch); returns the exit code.
pub fn run_job(
    args: &LaunchArgs,
    log_dir: PathBuf,
    worker_args: Vec<String>,
    usage: GpuUse,
) -> Result<i32, JobError> {
    let plan = crate::plan::preflight::validate(args, log_dir, usage)?;
    run_planned(args, &plan, worker_args)
}

/// Runs a job whose plan passed its pre-flight; returns the exit code.
pub fn run_planned(
    args: &LaunchArgs,
    plan: &Plan,
    worker_args: Vec<String>,
) -> Result<i32, JobError> {
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
    let mut mpi_log = create_log(&mpi_log_path)
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
    crate::run::ranks::write_table(plan);
    let outcome = supervise::run(&specs, mpi_log, &settings)
        .map_err(|e| JobError::launch(format!("{e} (see {})", mpi_log_path.display())))?;
    crate::run::ranks::finish(plan, &report::read_driver_logs(&plan.log_dir), &outcome);
    crate::run::outcome::conclude(args, plan, &outcome, &mpi_log_path)
}
