//! `tchrun sbatch`: a training job as a Slurm batch script (nodes, tasks per node, CPUs, GPUs,
//! memory, account, log paths, graceful preemption, requeue, restarts) whose body runs
//! `srun --mpi=pmix tchrun-worker train`, and with `--submit` its submission. Its flags are
//! those that mean something in a batch script: Slurm picks the nodes and srun starts the
//! ranks, so `tchrun train`'s --hostfile, --hosts, --launcher, --oversubscribe and
//! --mpirun-args are not offered. The script text is `script.rs`, a pure function.
pub mod script;

use crate::error::JobError;
use crate::plan::launch::{self, LaunchArgs, LauncherKind};
use crate::plan::preflight::{absolute, batch_plan};
use clap::Args;
use script::{check_directive, check_extra, script, BatchJob, Directives};
use std::path::{Path, PathBuf};
use tchrun::files;
use tchrun::flags::{Device, RankFlags, TrainJob};

/// The launch flags of a batch job: its shape and the worker; Slurm does the rest.
#[derive(Args, Debug, Clone)]
pub struct BatchLaunch {
    /// Nodes to run on (`#SBATCH --nodes`).
    #[arg(help_heading = "Launch", visible_alias = "nnodes", long, env = "TCHRUN_NODES", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub nodes: u32,
    /// Ranks per node (`#SBATCH --ntasks-per-node`; at most --gpus-per-node on CUDA).
    #[arg(help_heading = "Launch", visible_alias = "nproc-per-node", long, env = "TCHRUN_PROCS_PER_NODE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub procs_per_node: u32,
    /// Print the batch script, write and submit nothing.
    #[arg(help_heading = "Launch", long, env = "TCHRUN_DRY_RUN")]
    pub dry_run: bool,
    /// The tchrun-worker binary (default: the one beside tchrun, which must exist at the same
    /// path on every node).
    #[arg(help_heading = "Launch", long, env = "TCHRUN_WORKER")]
    pub worker: Option<PathBuf>,
}

impl BatchLaunch {
    /// As `tchrun train`'s launch flags: srun, the nodes Slurm gives.
    fn to_launch(&self) -> LaunchArgs {
        LaunchArgs {
            nodes: self.nodes,
            procs_per_node: self.procs_per_node,
            launcher: LauncherKind::Srun,
            hostfile: None,
            hosts: Vec::new(),
            oversubscribe: false,
            dry_run: self.dry_run,
            worker: self.worker.clone(),
            grace_period: 30,
            hang_timeout: None,
            mpirun_args: None,
        }
    }
}

/// Threads a rank is counted for in the default `--cpus-per-task`, for each of `--threads`
/// and `--loader-threads` not given.
pub const ASSUMED_THREADS: u32 = 4;

/// `--cpus-per-task` when not given: the rank's intra-op threads plus its loader's decode
/// threads, so that a cluster's one CPU per task does not leave the loader one core.
pub fn default_cpus_per_task(threads: Option<u32>, loader_threads: Option<u32>) -> u32 {
    threads
        .unwrap_or(ASSUMED_THREADS)
        .saturating_add(loader_threads.unwrap_or(ASSUMED_THREADS))
}

/// `tchrun sbatch` flags: the training job, the launch shape and Slurm's own options.
#[derive(Args, Debug)]
#[command(mut_arg("max_restarts", |a| a.help(crate::plan::launch::MaxRestarts::SBATCH_HELP)))]
pub struct SbatchArgs {
    #[command(flatten)]
    pub job: TrainJob,
    #[command(flatten)]
    pub launch: BatchLaunch,
    #[command(flatten)]
    pub rank: RankFlags,
    /// Slurm partition (`#SBATCH --partition`; default: the cluster's default partition).
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_PARTITION")]
    pub partition: Option<String>,
    /// Time limit (`#SBATCH --time`, Slurm's format: MINUTES, HH:MM:SS, D-HH:MM).
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_TIME")]
    pub time: Option<String>,
    /// GPUs per node (`#SBATCH --gpus-per-node`; 0: none requested).
    #[arg(
        help_heading = "Slurm",
        long,
        env = "TCHRUN_GPUS_PER_NODE",
        default_value_t = 0
    )]
    pub gpus_per_node: u32,
    /// CPUs per rank (`#SBATCH --cpus-per-task`; 0: the cluster's default, often one). Default:
    /// --threads + --loader-threads, each counted as 4 when not given.
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_CPUS_PER_TASK", value_parser = clap::value_parser!(u32).range(0..=1024))]
    pub cpus_per_task: Option<u32>,
    /// Memory per node (`#SBATCH --mem`, Slurm's format: 64G, 500M; 0: all of the node's).
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_MEM")]
    pub mem: Option<String>,
    /// Account to charge (`#SBATCH --account`).
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_ACCOUNT")]
    pub account: Option<String>,
    /// Quality of service (`#SBATCH --qos`).
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_QOS")]
    pub qos: Option<String>,
    /// Node features the nodes must have (`#SBATCH --constraint`, e.g. a100 or "a100&ib").
    #[arg(help_heading = "Slurm", long, env = "TCHRUN_CONSTRAINT")]
    pub constraint: Option<String>,
    /// Any other sbatch option, written as one `#SBATCH` line (repeatable), e.g.
    /// --sbatch-arg=--mail-type=END or --sbatch-arg=--exclusive.
    #[arg(
        help_heading = "Slurm",
        long = "sbatch-arg",
        value_name = "OPTION",
        allow_hyphen_values = true
    )]
    pub sbatch_args: Vec<String>,
    /// Job name (`#SBATCH --job-name`).
    #[arg(
        help_heading = "Slurm",
        long,
        env = "TCHRUN_JOB_NAME",
        default_value = "tchrun-train"
    )]
    pub job_name: String,
    /// `--max-restarts` (its help: `MaxRestarts::SBATCH_HELP`).
    #[command(flatten)]
    pub restarts: crate::plan::launch::MaxRestarts,
    /// Where to write the batch script (default: <log-dir>/tchrun-job.sbatch).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Submit the script with `sbatch` and print the job id.
    #[arg(long)]
    pub submit: bool,
}

/// The Slurm options, each checked so that no value can add a line to the script.
fn directives(a: &SbatchArgs) -> Result<Directives, JobError> {
    let named = [
        ("--partition", &a.partition),
        ("--time", &a.time),
        ("--account", &a.account),
        ("--qos", &a.qos),
        ("--constraint", &a.constraint),
        ("--mem", &a.mem),
    ];
    for (flag, value) in named {
        if let Some(v) = value {
            check_directive(flag, v)?;
        }
    }
    for line in &a.sbatch_args {
        check_extra(line)?;
    }
    Ok(Directives {
        partition: a.partition.clone(),
        time: a.time.clone(),
        account: a.account.clone(),
        qos: a.qos.clone(),
        constraint: a.constraint.clone(),
        mem: a.mem.clone(),
        cpus_per_task: a
            .cpus_per_task
            .unwrap_or_else(|| default_cpus_per_task(a.rank.threads, a.job.options.loader_threads)),
        extra: a.sbatch_args.clone(),
    })
}

/// Pre-flight and the batch job: the trainer's input checks (as `tchrun train`), the launch
/// shape, GPUs against `--gpus-per-node`.
pub fn batch_job(a: &SbatchArgs) -> Result<BatchJob, JobError> {
    let mut tj = a.job.clone();
    tj.model = absolute(tj.model);
    tj.train = absolute(tj.train);
    tj.valid = absolute(tj.valid);
    tj.output = absolute(tj.output);
    let log_dir = absolute(
        a.rank
            .log_dir
            .clone()
            .unwrap_or_else(|| tj.output.join(files::DEFAULT_LOG_SUBDIR)),
    );
    let (mut outputs, inputs) = tchrun::overlap::train_job(&tj, &log_dir);
    if let Some(s) = &a.script {
        outputs.push(tchrun::overlap::Named::new(
            "--script",
            "the batch script",
            absolute(s.clone()),
        ));
    }
    let launch_args = a.launch.to_launch();
    crate::plan::preflight::check_disjoint(&outputs, inputs, Some(&launch_args))?;
    let inputs = tchrun_data::preflight::check_train_job(&tj, false)?;
    let world = tchrun::counts::world_size(a.launch.nodes, a.launch.procs_per_node)
        .map_err(|e| JobError::invalid(e.0))?;
    for w in tchrun_data::preflight::check_job(&inputs, &tj, world as usize)? {
        errln!("tchrun: {w}");
    }
    match a.rank.device {
        Device::Cuda if a.gpus_per_node == 0 => {
            return Err(JobError::invalid(
                "--device cuda: the job requests no GPUs; pass --gpus-per-node G",
            ))
        }
        Device::Cuda | Device::Auto
            if a.gpus_per_node > 0 && a.launch.procs_per_node > a.gpus_per_node =>
        {
            return Err(JobError::invalid(format!(
                "--procs-per-node {} exceeds --gpus-per-node {}: one rank per GPU; lower --procs-per-node or raise --gpus-per-node (or use --device cpu)",
                a.launch.procs_per_node, a.gpus_per_node
            )))
        }
        _ => {}
    }
    check_directive("--job-name", &a.job_name)?;
    let directives = directives(a)?;
    let mut rank = a.rank.clone();
    rank.log_dir = Some(log_dir.clone());
    let mut worker_args = vec!["train".to_string()];
    // --overwrite belongs to the first run only: a requeued run resumes what it started.
    let mut first_run = tj.clone();
    first_run.options.overwrite = false;
    worker_args.extend(first_run.to_args()?);
    worker_args.extend(rank.to_args()?);
    let plan = batch_plan(&launch_args, log_dir.clone())?;
    let launch = launch::srun_command(&plan, &worker_args);
    Ok(BatchJob {
        job_name: a.job_name.clone(),
        nodes: a.launch.nodes,
        procs_per_node: a.launch.procs_per_node,
        gpus_per_node: a.gpus_per_node,
        directives,
        log_dir,
        output: tj.output.clone(),
        launch,
        overwrite: tj.options.overwrite,
        max_restarts: a.restarts.max_restarts,
    })
}

/// The job id in sbatch's answer ("Submitted batch job 42[ on cluster c]").
pub fn parse_job_id(out: &str) -> Option<u64> {
    out.lines().find_map(|l| {
        l.trim()
            .strip_prefix("Submitted batch job ")?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    })
}

pub fn write_script(path: &Path, text: &str) -> Result<(), JobError> {
    use std::os::unix::fs::PermissionsExt;
    if let Some(d) = path.parent() {
        std::fs::create_dir_all(d).map_err(|e| {
            JobError::invalid(format!(
                "--script {}: cannot create {}: {e}",
                path.display(),
                d.display()
            ))
        })?;
    }
    std::fs::write(path, text)
        .and_then(|_| std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o750)))
        .map_err(|e| {
            JobError::invalid(format!("--script {}: cannot write it: {e}", path.display()))
        })
}

/// What to change when Slurm refuses the job's shape ("Requested node configuration is not
/// available": the per-node request, in the flags that make it) or its `--constraint`.
fn refusal_hint(stderr: &str, b: &BatchJob) -> String {
    let d = &b.directives;
    if stderr.contains("Invalid feature specification") {
        return format!(
            "; --constraint {}: no node has that feature (`sinfo -o '%N %f'` lists them)",
            d.constraint.as_deref().unwrap_or("")
        );
    }
    if !stderr.contains("node configuration is not available") {
        return String::new();
    }
    format!(
        "; each node must have {} CPUs ({} ranks × --cpus-per-task {}){}{}: lower --cpus-per-task, --procs-per-node{}{}",
        b.procs_per_node.saturating_mul(d.cpus_per_task.max(1)),
        b.procs_per_node,
        d.cpus_per_task,
        if b.gpus_per_node > 0 { format!(", {} GPUs", b.gpus_per_node) } else { String::new() },
        d.mem.as_ref().map(|m| format!(", {m} of memory")).unwrap_or_default(),
        if b.gpus_per_node > 0 { ", --gpus-per-node" } else { "" },
        if d.mem.is_some() { " or --mem" } else { "" },
    )
}

/// `sbatch PATH`: the job id, or what Slurm said with the flags to change (`refusal_hint`).
pub fn submit(path: &Path, b: &BatchJob) -> Result<u64, JobError> {
    let out = std::process::Command::new("sbatch")
        .arg(path)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            JobError::launch(format!(
                "cannot run sbatch: {e}; is Slurm installed here (sbatch on PATH)?"
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        return Err(JobError::launch(format!(
            "sbatch {} failed ({}): {}{}",
            path.display(),
            out.status,
            stderr.trim(),
            refusal_hint(&stderr, b)
        )));
    }
    let Some(id) = parse_job_id(&stdout) else {
        return Err(JobError::launch(format!(
            "sbatch answered without a job id: {}{}",
            stdout.trim(),
            stderr.trim()
        )));
    };
    Ok(id)
}

/// `tchrun sbatch`: pre-flight, write the script (dry run: print it), optionally submit it.
pub fn run(a: &SbatchArgs) -> Result<i32, JobError> {
    let b = batch_job(a)?;
    let text = script(&b);
    if a.launch.dry_run {
        {
            use std::io::Write as _;
            let _ = write!(std::io::stdout(), "{text}");
        }
        return Ok(0);
    }
    let path = absolute(
        a.script
            .clone()
            .unwrap_or_else(|| b.log_dir.join("tchrun-job.sbatch")),
    );
    // Slurm opens --output before the script runs: the log directory must exist.
    std::fs::create_dir_all(&b.log_dir).map_err(|e| {
        JobError::invalid(format!(
            "--log-dir {}: cannot create it: {e}",
            b.log_dir.display()
        ))
    })?;
    write_script(&path, &text)?;
    outln!("tchrun: wrote batch script {}", path.display());
    if !a.submit {
        outln!("tchrun: submit it with: sbatch {}", path.display());
        return Ok(0);
    }
    let id = submit(&path, &b)?;
    outln!("Submitted batch job {id}");
    outln!(
        "tchrun: logs in {}: {} (script and srun output), {}<rank> (each rank); follow with `tail -f {}`, stop with `scancel {id}`",
        b.log_dir.display(),
        files::MPI_LOG,
        files::DRIVER_LOG_PREFIX,
        files::mpi_log(&b.log_dir).display()
    );
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn job_ids() {
        assert_eq!(parse_job_id("Submitted batch job 42\n"), Some(42));
        assert_eq!(
            parse_job_id("Submitted batch job 7 on cluster c\n"),
            Some(7)
        );
        assert_eq!(parse_job_id("sbatch: error: nope"), None);
    }

    #[test]
    fn cpus_per_task_follows_the_ranks_threads() {
        assert_eq!(default_cpus_per_task(None, None), 8);
        assert_eq!(default_cpus_per_task(Some(2), None), 6);
        assert_eq!(default_cpus_per_task(Some(2), Some(10)), 12);
        assert_eq!(default_cpus_per_task(Some(u32::MAX), Some(1)), u32::MAX);
    }
}
