//! `tchrun sbatch`: a training job as a Slurm batch script (nodes, tasks per node, GPUs, log
//! paths, graceful preemption, requeue) whose body runs `srun --mpi=pmix tchrun-worker train`,
//! and with `--submit` its submission. The script text is a pure function, unit-tested.
use crate::error::JobError;
use crate::plan::launch::{self, LaunchArgs, LauncherKind};
use crate::plan::preflight::{absolute, batch_plan};
use clap::Args;
use std::path::{Path, PathBuf};
use tchrun::files;
use tchrun::flags::{Device, RankFlags, TrainJob};

/// Seconds before the time limit at which Slurm sends USR1 to the batch shell.
pub const SIGNAL_LEAD_SECS: u32 = 120;

/// `tchrun sbatch` flags: the training job, the launch shape and Slurm's own options.
#[derive(Args, Debug)]
pub struct SbatchArgs {
    #[command(flatten)]
    pub job: TrainJob,
    #[command(flatten)]
    pub launch: LaunchArgs,
    #[command(flatten)]
    pub rank: RankFlags,
    /// Slurm partition (`#SBATCH --partition`; default: the cluster's default partition).
    #[arg(long, env = "TCHRUN_PARTITION")]
    pub partition: Option<String>,
    /// Time limit (`#SBATCH --time`, Slurm's format: MINUTES, HH:MM:SS, D-HH:MM).
    #[arg(long, env = "TCHRUN_TIME")]
    pub time: Option<String>,
    /// GPUs per node (`#SBATCH --gpus-per-node`; 0: none requested).
    #[arg(long, env = "TCHRUN_GPUS_PER_NODE", default_value_t = 0)]
    pub gpus_per_node: u32,
    /// Job name (`#SBATCH --job-name`).
    #[arg(long, env = "TCHRUN_JOB_NAME", default_value = "tchrun-train")]
    pub job_name: String,
    /// Where to write the batch script (default: <log-dir>/tchrun-job.sbatch).
    #[arg(long)]
    pub script: Option<PathBuf>,
    /// Submit the script with `sbatch` and print the job id.
    #[arg(long)]
    pub submit: bool,
}

/// What the batch script needs, validated.
#[derive(Debug, Clone)]
pub struct BatchJob {
    pub job_name: String,
    pub nodes: u32,
    pub procs_per_node: u32,
    pub gpus_per_node: u32,
    pub partition: Option<String>,
    pub time: Option<String>,
    pub log_dir: PathBuf,
    /// The command that starts the ranks (srun, or mpirun which finds the allocation itself).
    pub launch: launch::CommandSpec,
    /// `--overwrite` on the first run (a requeued run passes `--resume` instead).
    pub overwrite: bool,
}

fn quote(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c));
    if plain {
        w.to_string()
    } else {
        shell_words::quote(w).into_owned()
    }
}

/// `#SBATCH` values cannot be quoted: refuse what would break the line.
fn check_directive(flag: &str, v: &str) -> Result<(), JobError> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(JobError::invalid(format!(
            "{flag} {v:?}: must be one word without spaces"
        )));
    }
    Ok(())
}

/// The batch script. The ranks' command runs in the background so that the shell can take
/// USR1 (sent `SIGNAL_LEAD_SECS` before the time limit, or by `scancel --signal=USR1 --batch`):
/// it asks every rank to stop (SIGTERM to the job steps, not to srun, which would SIGKILL them),
/// waits for them, then requeues the job; the next run (`SLURM_RESTART_COUNT` > 0) passes
/// `--resume`. Output is appended to `70_mpi_log`, so a requeued run keeps the first one's.
pub fn script(b: &BatchJob) -> String {
    let log_dir = b.log_dir.display().to_string();
    let mpi_log = files::mpi_log(&b.log_dir).display().to_string();
    let mut s = String::new();
    s.push_str("#!/bin/bash\n");
    s.push_str(&format!("#SBATCH --job-name={}\n", b.job_name));
    s.push_str(&format!("#SBATCH --nodes={}\n", b.nodes));
    s.push_str(&format!("#SBATCH --ntasks-per-node={}\n", b.procs_per_node));
    if b.gpus_per_node > 0 {
        s.push_str(&format!("#SBATCH --gpus-per-node={}\n", b.gpus_per_node));
    }
    if let Some(p) = &b.partition {
        s.push_str(&format!("#SBATCH --partition={p}\n"));
    }
    if let Some(t) = &b.time {
        s.push_str(&format!("#SBATCH --time={t}\n"));
    }
    s.push_str(&format!("#SBATCH --output={mpi_log}\n"));
    s.push_str(&format!("#SBATCH --error={mpi_log}\n"));
    s.push_str("#SBATCH --open-mode=append\n");
    s.push_str(&format!("#SBATCH --signal=B:USR1@{SIGNAL_LEAD_SECS}\n"));
    s.push_str("#SBATCH --requeue\n");
    s.push_str(&format!(
        "# Written by tchrun {} (`tchrun sbatch`); submit it with sbatch.\n",
        env!("CARGO_PKG_VERSION")
    ));
    s.push_str(&format!(
        "# Logs: {log_dir} (70_mpi_log: this script and srun; 70_driver_log_<rank>: each rank)\n"
    ));
    s.push_str("set -u\n");
    s.push_str(&format!("LOG_DIR={}\n", quote(&log_dir)));
    s.push_str("RESTART=\"${SLURM_RESTART_COUNT:-0}\"\n");
    s.push_str("RESUME=()\n");
    s.push_str("if [ \"$RESTART\" -gt 0 ]; then RESUME=(--resume); else\n");
    s.push_str("  # A fresh run: what is in the log directory belongs to this job.\n");
    s.push_str("  rm -f \"$LOG_DIR\"/70_driver_log_* \"$LOG_DIR\"/failure.json\n");
    if b.overwrite {
        s.push_str("  RESUME=(--overwrite)\n");
    }
    s.push_str("fi\n");
    s.push_str("echo \"tchrun: job $SLURM_JOB_ID (restart $RESTART) on $SLURM_JOB_NODELIST: logs in $LOG_DIR\"\n");
    s.push_str("PREEMPTED=0\n");
    s.push_str("on_usr1() {\n");
    s.push_str("  PREEMPTED=1\n");
    s.push_str("  echo \"tchrun: USR1 (time limit near or preemption): stopping the ranks (SIGTERM), then requeueing\"\n");
    s.push_str("  scancel --signal=TERM \"$SLURM_JOB_ID\"\n");
    s.push_str("}\n");
    s.push_str("trap on_usr1 USR1\n");
    s.push_str(&format!("{} \"${{RESUME[@]}}\" &\n", b.launch.display()));
    s.push_str("PID=$!\n");
    s.push_str("# wait returns early when a trapped signal arrives: wait again until the ranks are gone.\n");
    s.push_str("while kill -0 \"$PID\" 2>/dev/null; do wait \"$PID\"; done\n");
    s.push_str("wait \"$PID\"; CODE=$?\n");
    s.push_str("if [ \"$PREEMPTED\" = 1 ]; then\n");
    s.push_str("  echo \"tchrun: ranks stopped (exit $CODE); requeueing job $SLURM_JOB_ID\"\n");
    s.push_str("  scontrol requeue \"$SLURM_JOB_ID\"\n");
    s.push_str("fi\n");
    s.push_str("echo \"tchrun: ranks ended with exit code $CODE\"\n");
    s.push_str("exit \"$CODE\"\n");
    s
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
    crate::plan::preflight::check_disjoint(&outputs, inputs, Some(&a.launch))?;
    let inputs = tchrun::preflight::check_train_job(&tj, false)?;
    let world = tchrun::counts::world_size(a.launch.nodes, a.launch.procs_per_node)
        .map_err(|e| JobError::invalid(e.0))?;
    for w in tchrun::preflight::check_job(&inputs, &tj, world as usize)? {
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
    if let Some(p) = &a.partition {
        check_directive("--partition", p)?;
    }
    if let Some(t) = &a.time {
        check_directive("--time", t)?;
    }
    let mut rank = a.rank.clone();
    rank.log_dir = Some(log_dir.clone());
    let mut worker_args = vec!["train".to_string()];
    // --overwrite belongs to the first run only: a requeued run resumes what it started.
    let mut first_run = tj.clone();
    first_run.options.overwrite = false;
    worker_args.extend(first_run.to_args());
    worker_args.extend(rank.to_args());
    let plan = batch_plan(&a.launch, log_dir.clone())?;
    let launch = match plan.kind {
        // Inside the allocation mpirun finds the nodes itself; the job's environment reaches
        // the ranks through Slurm.
        LauncherKind::Mpirun => launch::mpirun_command(&plan, &worker_args, &[]),
        _ => launch::srun_command(&plan, &worker_args),
    };
    Ok(BatchJob {
        job_name: a.job_name.clone(),
        nodes: a.launch.nodes,
        procs_per_node: a.launch.procs_per_node,
        gpus_per_node: a.gpus_per_node,
        partition: a.partition.clone(),
        time: a.time.clone(),
        log_dir,
        launch,
        overwrite: tj.options.overwrite,
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

fn write_script(path: &Path, text: &str) -> Result<(), JobError> {
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
    let out = std::process::Command::new("sbatch")
        .arg(&path)
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
            "sbatch {} failed ({}): {}",
            path.display(),
            out.status,
            stderr.trim()
        )));
    }
    let Some(id) = parse_job_id(&stdout) else {
        return Err(JobError::launch(format!(
            "sbatch answered without a job id: {}{}",
            stdout.trim(),
            stderr.trim()
        )));
    };
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

    fn batch(gpus: u32) -> BatchJob {
        BatchJob {
            job_name: "digits".into(),
            nodes: 2,
            procs_per_node: 4,
            gpus_per_node: gpus,
            partition: Some("gpu".into()),
            time: Some("01:00:00".into()),
            log_dir: PathBuf::from("/runs/out/logs"),
            launch: launch::CommandSpec {
                program: "srun".into(),
                args: vec![
                    "--nodes=2".into(),
                    "--mpi=pmix".into(),
                    "/opt/tchrun-worker".into(),
                    "train".into(),
                    "--model=/m dir".into(),
                ],
                env: vec![],
            },
            overwrite: false,
        }
    }

    #[test]
    fn script_directives() {
        let s = script(&batch(4));
        let directives: Vec<&str> = s.lines().filter(|l| l.starts_with("#SBATCH")).collect();
        assert_eq!(
            directives,
            vec![
                "#SBATCH --job-name=digits",
                "#SBATCH --nodes=2",
                "#SBATCH --ntasks-per-node=4",
                "#SBATCH --gpus-per-node=4",
                "#SBATCH --partition=gpu",
                "#SBATCH --time=01:00:00",
                "#SBATCH --output=/runs/out/logs/70_mpi_log",
                "#SBATCH --error=/runs/out/logs/70_mpi_log",
                "#SBATCH --open-mode=append",
                "#SBATCH --signal=B:USR1@120",
                "#SBATCH --requeue",
            ]
        );
        assert!(s.starts_with("#!/bin/bash\n#SBATCH"), "{s}");
        // sbatch stops reading directives at the first command.
        let first_cmd = s.lines().position(|l| !l.starts_with('#')).expect("a body");
        assert!(s.lines().skip(first_cmd).all(|l| !l.starts_with("#SBATCH")));
    }

    #[test]
    fn script_without_gpus_or_partition() {
        let mut b = batch(0);
        b.partition = None;
        b.time = None;
        let s = script(&b);
        assert!(!s.contains("--gpus-per-node"), "{s}");
        assert!(!s.contains("--partition"), "{s}");
        assert!(!s.contains("--time"), "{s}");
    }

    #[test]
    fn script_body_runs_the_ranks_and_requeues_on_usr1() {
        let s = script(&batch(0));
        assert!(
            s.contains(
                "srun --nodes=2 --mpi=pmix /opt/tchrun-worker train '--model=/m dir' \"${RESUME[@]}\" &\n"
            ),
            "{s}"
        );
        assert!(s.contains("trap on_usr1 USR1"), "{s}");
        assert!(s.contains("scancel --signal=TERM \"$SLURM_JOB_ID\""), "{s}");
        assert!(s.contains("scontrol requeue \"$SLURM_JOB_ID\""), "{s}");
        assert!(s.contains("RESUME=(--resume)"), "{s}");
        assert!(s.contains("LOG_DIR=/runs/out/logs\n"), "{s}");
        assert!(s.trim_end().ends_with("exit \"$CODE\""), "{s}");
    }

    #[test]
    fn script_is_valid_bash() {
        let dir = std::env::temp_dir().join(format!("tchrun-sbatch-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let p = dir.join("job.sbatch");
        std::fs::write(&p, script(&batch(2))).expect("write");
        let st = std::process::Command::new("bash")
            .arg("-n")
            .arg(&p)
            .status()
            .expect("bash");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(st.success());
    }

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
    fn directive_values_are_one_word() {
        assert!(check_directive("--time", "1:00:00").is_ok());
        assert!(check_directive("--partition", "a b").is_err());
        assert!(check_directive("--job-name", "x\ny").is_err());
        assert!(check_directive("--job-name", "").is_err());
    }
}
