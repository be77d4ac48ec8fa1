//! Pre-flight of the launch flags: the worker binary, the launcher (mpirun, srun, local), the
//! hosts, ranks against cores and GPUs, writable outputs. Every command that starts ranks gets
//! its `Plan` here (`validate`; `batch_plan` for `tchrun sbatch`), so the same checks apply to
//! all of them.
use crate::error::JobError;
use crate::plan::gpus::{self, GpuUse};
use crate::plan::launch::{self, LaunchArgs, LauncherKind, Plan};
use std::path::{Path, PathBuf};
use tchrun::console::Selection;

/// `p` made absolute against the current directory (ranks may run elsewhere).
pub fn absolute(p: PathBuf) -> PathBuf {
    if p.is_absolute() {
        p
    } else {
        std::env::current_dir().map(|d| d.join(&p)).unwrap_or(p)
    }
}

/// The log directory of a job: `--log-dir` as given (made absolute), else a folder of the job's
/// own in `base` (`tchrun::files::job_log_dir`: `<base>/<command>-<time>`), created unless
/// `dry_run` and held (removed if the job leaves it empty) as long as the second value lives.
pub fn own_log_dir(
    given: Option<PathBuf>,
    base: PathBuf,
    command: &str,
    dry_run: bool,
) -> Result<(PathBuf, Option<tchrun::files::NewLogDir>), JobError> {
    if let Some(dir) = given {
        return Ok((absolute(dir), None));
    }
    let base = absolute(base);
    let new = tchrun::files::job_log_dir(&base, command, !dry_run).map_err(|e| {
        JobError::invalid(format!(
            "cannot create the job's log directory in {}: {e}; give a writable --log-dir",
            base.display()
        ))
    })?;
    Ok((new.dir.clone(), Some(new)))
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

/// The worker binary: `--worker`, or the one beside `tchrun`.
fn worker(args: &LaunchArgs) -> Result<PathBuf, JobError> {
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
    // Installed into an environment (the wheel): the worker loads that environment's torch.
    tchrun_launcher::install::check(&worker).map_err(|e| JobError::invalid(e.to_string()))?;
    Ok(worker)
}

/// `--launcher mpirun` needs Open MPI on this node: `mpirun` and the `libmpi.so.40` the ranks
/// load (`tchrun::openmpi`).
fn openmpi_missing() -> Option<String> {
    tchrun::openmpi::missing(&|k: &str| std::env::var_os(k))
}

fn mpirun_args(args: &LaunchArgs) -> Result<Vec<String>, JobError> {
    match &args.mpirun_args {
        Some(s) => {
            shell_words::split(s).map_err(|e| JobError::invalid(format!("--mpirun-args: {e}")))
        }
        None => Ok(Vec::new()),
    }
}

/// Pre-flight of the launch flags, `--console` and the GPUs: one validated plan, for every
/// command that starts ranks here (`train`, `selftest`, `exec`, `score`, `evaluate`).
pub fn validate(
    args: &LaunchArgs,
    log_dir: PathBuf,
    usage: GpuUse,
    console: &Selection,
) -> Result<Plan, JobError> {
    let mut plan = plan(args, log_dir)?;
    console
        .check(plan.world_size() as usize)
        .map_err(|e| JobError::invalid(e.to_string()))?;
    // The local launcher's ranks all run on this host: a host selection must name it.
    if plan.kind == LauncherKind::Local {
        let here = hostname::get()
            .map(|h| vec![h.to_string_lossy().into_owned()])
            .unwrap_or_default();
        console
            .check_hosts(&here)
            .map_err(|e| JobError::invalid(e.to_string()))?;
    }
    plan.console = console.clone();
    gpus::check(&plan, usage)?;
    Ok(plan)
}

/// The plan of a batch script (`tchrun sbatch`): Slurm picks the nodes (no hosts), the ranks
/// start with srun (default) or mpirun inside the allocation, on machines this one is not.
pub fn batch_plan(args: &LaunchArgs, log_dir: PathBuf) -> Result<Plan, JobError> {
    tchrun::counts::world_size(args.nodes, args.procs_per_node)
        .map_err(|e| JobError::invalid(e.0))?;
    if args.hostfile.is_some() || !args.hosts.is_empty() {
        return Err(JobError::invalid(
            "--hostfile/--hosts: in a batch job Slurm picks the nodes; drop them (choose nodes with --partition or #SBATCH lines)",
        ));
    }
    let kind = match args.launcher {
        LauncherKind::Auto | LauncherKind::Srun => LauncherKind::Srun,
        LauncherKind::Mpirun => LauncherKind::Mpirun,
        LauncherKind::Local => {
            return Err(JobError::invalid(
                "--launcher local: a batch job starts its ranks with srun (default) or mpirun",
            ))
        }
    };
    Ok(Plan {
        node_names: Vec::new(),
        kind,
        nodes: args.nodes,
        procs_per_node: args.procs_per_node,
        hosts: Vec::new(),
        hostfile: None,
        oversubscribe: args.oversubscribe,
        worker: worker(args)?,
        log_dir,
        mpirun_args: mpirun_args(args)?,
        as_root: nix::unistd::geteuid().is_root(),
        console: Default::default(),
    })
}

/// Pre-flight of the launch flags: everything checkable before a rank starts on this machine.
pub fn plan(args: &LaunchArgs, log_dir: PathBuf) -> Result<Plan, JobError> {
    // Range-checked first: `Plan::world_size` multiplies them.
    tchrun::counts::world_size(args.nodes, args.procs_per_node)
        .map_err(|e| JobError::invalid(e.0))?;
    let worker = worker(args)?;
    let in_slurm = std::env::var_os(tchrun::env::SLURM_JOB_ID).is_some();
    let kind = match args.launcher {
        LauncherKind::Auto if in_slurm && args.hostfile.is_none() && args.hosts.is_empty() => LauncherKind::Srun,
        LauncherKind::Auto if openmpi_missing().is_none() => LauncherKind::Mpirun,
        LauncherKind::Auto if args.nodes == 1 && args.hostfile.is_none() && args.hosts.is_empty() => LauncherKind::Local,
        LauncherKind::Auto => {
            return Err(JobError::invalid(
                "a multi-node job needs mpirun (install OpenMPI: scripts/setup.sh) or a Slurm allocation",
            ))
        }
        k => k,
    };
    match kind {
        LauncherKind::Mpirun => {
            if let Some(what) = openmpi_missing() {
                return Err(JobError::invalid(format!(
                    "--launcher mpirun: {what}; fix: `module load openmpi` (or install Open MPI), \
                     or start the ranks without MPI: --launcher local (this node) or srun (Slurm)"
                )));
            }
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
        let text = tchrun::files::read_bounded_string(f, tchrun::files::caps::TEXT)
            .map_err(|e| JobError::input_io(format!("--hostfile {}", f.display()), e.into_io()))?;
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
    let mpirun_args = mpirun_args(args)?;
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
        console: Default::default(),
    })
}

/// `--output` must be writable (a read-only mount is refused before any rank starts).
pub fn check_writable(output: &Path) -> Result<(), JobError> {
    check_writable_dir("--output", output)
}

/// The directory `flag` names must be writable (created if missing).
fn check_writable_dir(flag: &str, output: &Path) -> Result<(), JobError> {
    let fail = |e: std::io::Error| {
        JobError::invalid(format!(
            "{flag} {}: not writable ({e}); choose a writable directory",
            output.display()
        ))
    };
    std::fs::create_dir_all(output).map_err(fail)?;
    let probe = output.join(format!(".tchrun-write-test-{}", std::process::id()));
    std::fs::write(&probe, b"").map_err(fail)?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

/// Refuses outputs (`--output`, `--log-dir`, ...) that are, contain or lie inside an input,
/// before anything is written (`tchrun::overlap`); `--hostfile` counts as an input too.
pub fn check_disjoint(
    outputs: &[tchrun::overlap::Named],
    mut inputs: Vec<tchrun::overlap::Named>,
    launch: Option<&LaunchArgs>,
) -> Result<(), JobError> {
    if let Some(h) = launch.and_then(|l| l.hostfile.as_ref()) {
        inputs.push(tchrun::overlap::Named::new(
            "--hostfile",
            "the hostfile",
            absolute(h.clone()),
        ));
    }
    Ok(tchrun::overlap::check_disjoint(outputs, &inputs)?)
}

/// Takes the job locks of `dirs` (`tchrun::lock`) for this process's whole life: a directory
/// another job holds is refused; a stale lock is taken over with a note. The ranks learn
/// through `TCHRUN_LOCK_HELD` that they need not take them (`run::RankEnv::holding`).
pub fn lock_job(dirs: &[(&str, PathBuf)]) -> Result<Vec<tchrun::lock::JobLock>, JobError> {
    let info = tchrun::lock::LockInfo::here(&tchrun::lock::LockInfo::command_line());
    let mut locks = Vec::new();
    for (flag, dir) in dirs {
        // A read-only directory is said as such, not as a lock that cannot be taken.
        check_writable_dir(flag, dir)?;
        let taken = tchrun::lock::acquire(flag, dir, &info)?;
        if let Some(note) = taken.note() {
            errln!("tchrun: {note}");
        }
        locks.push(taken.lock);
    }
    Ok(locks)
}
