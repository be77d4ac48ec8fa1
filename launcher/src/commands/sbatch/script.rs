//! The batch script of `tchrun sbatch` as a pure function of a validated `BatchJob`: the
//! `#SBATCH` directives (each value checked so that nothing can add a line to the script), the
//! ranks started with srun, USR1 → stop and requeue, and `--max-restarts` within the
//! allocation. Unit-tested here; `bash -n` checks the syntax.
use crate::error::JobError;
use crate::plan::launch;
use crate::plan::slurm_flags::SbatchDirectives;
use std::path::PathBuf;
use tchrun::files;

/// Seconds before the time limit at which Slurm sends USR1 to the batch shell.
pub const SIGNAL_LEAD_SECS: u32 = 120;

/// Slurm's own options of the job, each one `#SBATCH` line when set.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Directives {
    pub partition: Option<String>,
    pub time: Option<String>,
    pub account: Option<String>,
    pub qos: Option<String>,
    pub constraint: Option<String>,
    pub mem: Option<String>,
    /// 0: none asked (the cluster's default).
    pub cpus_per_task: u32,
    /// `--sbatch-arg` lines, checked by `check_extra`, written last.
    pub extra: Vec<String>,
}

/// What the batch script needs, validated.
#[derive(Debug, Clone)]
pub struct BatchJob {
    pub job_name: String,
    pub nodes: u32,
    pub procs_per_node: u32,
    pub gpus_per_node: u32,
    pub directives: Directives,
    pub log_dir: PathBuf,
    /// `--output` (its `checkpoints/last.json` tells whether a failed attempt made progress).
    pub output: PathBuf,
    /// The command that starts the ranks (srun).
    pub launch: launch::CommandSpec,
    /// `--overwrite` on the first run (a requeued run passes `--resume` instead).
    pub overwrite: bool,
    /// Restarts within the allocation after a failure that made progress.
    pub max_restarts: u32,
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
pub fn check_directive(flag: &str, v: &str) -> Result<(), JobError> {
    if v.is_empty() || v.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(JobError::invalid(format!(
            "{flag} {v:?}: must be one word without spaces"
        )));
    }
    Ok(())
}

/// The sbatch options the script sets itself, with the `tchrun sbatch` flag that sets them
/// (None: the script needs them as they are).
const OWN_OPTIONS: &[(&str, Option<&str>)] = &[
    ("--job-name", Some("--job-name")),
    ("-J", Some("--job-name")),
    ("--nodes", Some("--nodes")),
    ("-N", Some("--nodes")),
    ("--ntasks-per-node", Some("--procs-per-node")),
    ("--ntasks", Some("--nodes and --procs-per-node")),
    ("-n", Some("--nodes and --procs-per-node")),
    ("--gpus-per-node", Some("--gpus-per-node")),
    ("--partition", Some("--partition")),
    ("-p", Some("--partition")),
    ("--time", Some("--time")),
    ("-t", Some("--time")),
    ("--account", Some("--account")),
    ("-A", Some("--account")),
    ("--qos", Some("--qos")),
    ("-q", Some("--qos")),
    ("--constraint", Some("--constraint")),
    ("-C", Some("--constraint")),
    ("--mem", Some("--mem")),
    ("--cpus-per-task", Some("--cpus-per-task")),
    ("-c", Some("--cpus-per-task")),
    ("--output", None),
    ("-o", None),
    ("--error", None),
    ("-e", None),
    ("--open-mode", None),
    ("--signal", None),
    ("--requeue", None),
    ("--no-requeue", None),
];

/// One `--sbatch-arg` line: an sbatch option (`--mail-type=END`, `--exclusive`) on one line,
/// not one the script sets itself.
pub fn check_extra(line: &str) -> Result<(), JobError> {
    let bad = |why: &str| Err(JobError::invalid(format!("--sbatch-arg {line:?}: {why}")));
    if line.chars().any(|c| c.is_control()) {
        return bad("must be one line (no newline or control character)");
    }
    let word = line.split_whitespace().next().unwrap_or("");
    if !word.starts_with('-') {
        return bad("must be an sbatch option such as '--mail-type=END' or '--exclusive'");
    }
    let name = word.split('=').next().unwrap_or(word);
    // `-N2` is `-N 2`: a short option is its first two characters.
    let short = name.get(..2).filter(|_| !name.starts_with("--"));
    let own = OWN_OPTIONS
        .iter()
        .find(|(o, _)| *o == name || Some(*o) == short);
    match own {
        Some((o, Some(flag))) => bad(&format!(
            "the script sets {o} itself; use `tchrun sbatch {flag}`"
        )),
        Some((o, None)) => bad(&format!(
            "the script needs its own {o} (logs, graceful stop and requeue); leave it out"
        )),
        None => Ok(()),
    }
}

/// The `#SBATCH` lines, in order: the job's output to `log` (a job array's: per task), and
/// a job array's `--array=` value.
fn directives(b: &BatchJob, log: &str, array: Option<&str>) -> Vec<String> {
    let d = &b.directives;
    let own = SbatchDirectives {
        job_name: b.job_name.clone(),
        array: array.map(str::to_string),
        nodes: b.nodes,
        ntasks_per_node: b.procs_per_node,
        cpus_per_task: Some(d.cpus_per_task).filter(|&c| c > 0),
        gpus_per_node: Some(b.gpus_per_node).filter(|&g| g > 0),
        partition: d.partition.clone(),
        time: d.time.clone(),
        account: d.account.clone(),
        qos: d.qos.clone(),
        constraint: d.constraint.clone(),
        mem: d.mem.clone(),
        output: log.to_string(),
        error: log.to_string(),
        open_mode: "append".into(),
        signal: format!("B:USR1@{SIGNAL_LEAD_SECS}"),
        requeue: true,
    };
    let mut v = tchrun::argv::argv(&own)
        .expect("the #SBATCH options are numbers and words (sbatch_directives_round_trip)");
    v.extend(d.extra.iter().cloned());
    v
}

/// The batch script. The ranks' command runs in the background so that the shell can take
/// USR1 (sent `SIGNAL_LEAD_SECS` before the time limit, or by `scancel --signal=USR1 --batch`):
/// it asks every rank to stop (SIGTERM to the job steps, not to srun, which would SIGKILL them),
/// waits for them, then requeues the job; the next run (`SLURM_RESTART_COUNT` > 0) passes
/// `--resume`. Output is appended to `70_mpi_log`, so a requeued run keeps the first one's.
/// With `--max-restarts N`, a failed attempt that wrote a newer checkpoint (`last.json`
/// changed) is restarted with `--resume` in the same allocation, at most N times, after a
/// back-off of 1, 2, 4, ... 16 s (as `tchrun train`), its rank logs moved to `attempt-<n>/`.
pub fn script(b: &BatchJob) -> String {
    let log_dir = b.log_dir.display().to_string();
    let last = tchrun::checkpoint::last_json(&b.output)
        .display()
        .to_string();
    let mpi_log = files::mpi_log(&b.log_dir).display().to_string();
    let mut s = header(b, &mpi_log, None, "tchrun sbatch");
    s.push_str(&format!(
        "# Logs: {log_dir} (70_mpi_log: this script and srun; 70_driver_log_<rank>: each rank)\n"
    ));
    s.push_str("set -u\n");
    s.push_str(&format!("LOG_DIR={}\n", quote(&log_dir)));
    s.push_str(&format!("LAST={}\n", quote(&last)));
    s.push_str(&body(b, &b.launch.display()));
    s
}

/// `#!/bin/bash`, the `#SBATCH` lines and who wrote the script.
fn header(b: &BatchJob, log: &str, array: Option<&str>, by: &str) -> String {
    let mut s = String::from("#!/bin/bash\n");
    for d in directives(b, log, array) {
        s.push_str(&format!("#SBATCH {d}\n"));
    }
    s.push_str(&format!(
        "# Written by tchrun {} (`{by}`); submit it with sbatch.\n",
        env!("CARGO_PKG_VERSION")
    ));
    s
}

/// A job array of runs that share the Slurm options of `tasks[0]` (the caller checked that they
/// do): `#SBATCH --array=ARRAY`, each task's output first to `task_log` (Slurm's `%A_%a`), then,
/// once the task has found its run by `SLURM_ARRAY_TASK_ID`, appended to its run's own
/// `70_mpi_log`; then the same body as `script` (USR1 → stop and requeue with `--resume`,
/// `--max-restarts` within the allocation) with the task's own command.
pub fn array_script(tasks: &[(usize, BatchJob)], array: &str, task_log: &str) -> String {
    let Some((_, first)) = tasks.first() else {
        return String::new();
    };
    let mut s = header(first, task_log, Some(array), "tchrun sweep --sbatch");
    s.push_str(
        "# One run of the sweep per array task (SLURM_ARRAY_TASK_ID = its index in sweep.json).\n",
    );
    s.push_str("set -u\n");
    s.push_str("case \"${SLURM_ARRAY_TASK_ID:-}\" in\n");
    for (index, b) in tasks {
        let last = tchrun::checkpoint::last_json(&b.output);
        s.push_str(&format!("  {index})\n"));
        s.push_str(&format!(
            "    LOG_DIR={}\n",
            quote(&b.log_dir.display().to_string())
        ));
        s.push_str(&format!(
            "    LAST={}\n",
            quote(&last.display().to_string())
        ));
        s.push_str(&format!("    RUN=({})\n", b.launch.display()));
        s.push_str("    ;;\n");
    }
    s.push_str("  *)\n");
    s.push_str("    echo \"tchrun: SLURM_ARRAY_TASK_ID=${SLURM_ARRAY_TASK_ID:-unset} is not a run of this sweep; submit this script as it is (its #SBATCH --array names the runs)\" >&2\n");
    s.push_str("    exit 2 ;;\n");
    s.push_str("esac\n");
    s.push_str("mkdir -p \"$LOG_DIR\"\n");
    s.push_str(&format!("exec >>\"$LOG_DIR/{}\" 2>&1\n", files::MPI_LOG));
    s.push_str(&body(first, "\"${RUN[@]}\""));
    s
}

/// From the restart count to the exit: the ranks started with `launch` (a command line, or
/// a job array's `"${RUN[@]}"`), restarts, the USR1 trap and the requeue.
fn body(b: &BatchJob, launch: &str) -> String {
    let mut s = String::new();
    s.push_str(&format!("MAX_RESTARTS={}\n", b.max_restarts));
    s.push_str("RESTART=\"${SLURM_RESTART_COUNT:-0}\"\n");
    s.push_str("RESUME=()\n");
    s.push_str("if [ \"$RESTART\" -gt 0 ]; then RESUME=(--resume); else\n");
    s.push_str("  # A fresh run: what is in the log directory belongs to this job.\n");
    s.push_str(&format!(
        "  rm -f \"$LOG_DIR\"/{}* \"$LOG_DIR\"/{}\n",
        files::DRIVER_LOG_PREFIX,
        files::FAILURE_JSON
    ));
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
    s.push_str("ATTEMPT=1\n");
    s.push_str("while :; do\n");
    s.push_str("  BEFORE=\"$(cat \"$LAST\" 2>/dev/null)\"\n");
    s.push_str(&format!(
        "  export {}=\"$ATTEMPT\"\n",
        tchrun::env::TCHRUN_ATTEMPT
    ));
    s.push_str(&format!("  {launch} \"${{RESUME[@]}}\" &\n"));
    s.push_str("  PID=$!\n");
    s.push_str("  # wait returns early when a trapped signal arrives: wait again until the ranks are gone.\n");
    s.push_str("  while kill -0 \"$PID\" 2>/dev/null; do wait \"$PID\"; done\n");
    s.push_str("  wait \"$PID\"; CODE=$?\n");
    s.push_str("  if [ \"$CODE\" = 0 ] || [ \"$PREEMPTED\" = 1 ] || [ \"$ATTEMPT\" -gt \"$MAX_RESTARTS\" ]; then break; fi\n");
    s.push_str("  if [ \"$(cat \"$LAST\" 2>/dev/null)\" = \"$BEFORE\" ]; then\n");
    s.push_str("    echo \"tchrun: not restarting: attempt $ATTEMPT wrote no checkpoint (it failed before making progress; a restart would fail the same way)\"\n");
    s.push_str("    break\n");
    s.push_str("  fi\n");
    s.push_str("  N=1; while [ -e \"$LOG_DIR/attempt-$N\" ]; do N=$((N + 1)); done\n");
    s.push_str("  mkdir -p \"$LOG_DIR/attempt-$N\"\n");
    s.push_str(&format!(
        "  mv -f \"$LOG_DIR\"/{}* \"$LOG_DIR\"/heartbeat-*.json \"$LOG_DIR\"/memory-*.json \"$LOG_DIR\"/stacks-*.json \"$LOG_DIR\"/{} \"$LOG_DIR\"/{} \"$LOG_DIR/attempt-$N/\" 2>/dev/null\n",
        files::DRIVER_LOG_PREFIX,
        files::RANKS_JSON,
        files::FAILURE_JSON
    ));
    s.push_str("  WAIT=$((1 << (ATTEMPT - 1 < 4 ? ATTEMPT - 1 : 4)))\n");
    s.push_str("  echo \"tchrun: attempt $ATTEMPT failed (exit $CODE) after writing a checkpoint; restarting all ranks in $WAIT s with --resume (restart $ATTEMPT of at most $MAX_RESTARTS; its rank logs in $LOG_DIR/attempt-$N)\"\n");
    s.push_str("  sleep \"$WAIT\" & wait $!\n");
    s.push_str("  if [ \"$PREEMPTED\" = 1 ]; then break; fi\n");
    s.push_str("  ATTEMPT=$((ATTEMPT + 1)); RESUME=(--resume)\n");
    s.push_str("done\n");
    s.push_str("if [ \"$PREEMPTED\" = 1 ]; then\n");
    s.push_str("  echo \"tchrun: ranks stopped (exit $CODE); requeueing job $SLURM_JOB_ID\"\n");
    s.push_str("  scontrol requeue \"$SLURM_JOB_ID\"\n");
    s.push_str("fi\n");
    s.push_str("echo \"tchrun: ranks ended with exit code $CODE\"\n");
    s.push_str("exit \"$CODE\"\n");
    s
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
            directives: Directives {
                partition: Some("gpu".into()),
                time: Some("01:00:00".into()),
                cpus_per_task: 8,
                ..Directives::default()
            },
            log_dir: PathBuf::from("/runs/out/logs"),
            output: PathBuf::from("/runs/out"),
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
            max_restarts: 0,
        }
    }

    fn sbatch_lines(s: &str) -> Vec<&str> {
        s.lines().filter(|l| l.starts_with("#SBATCH")).collect()
    }

    #[test]
    fn script_directives() {
        let s = script(&batch(4));
        assert_eq!(
            sbatch_lines(&s),
            vec![
                "#SBATCH --job-name=digits",
                "#SBATCH --nodes=2",
                "#SBATCH --ntasks-per-node=4",
                "#SBATCH --cpus-per-task=8",
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
    fn slurm_options_and_extra_lines_become_directives() {
        let mut b = batch(0);
        b.directives = Directives {
            account: Some("proj42".into()),
            qos: Some("high".into()),
            constraint: Some("a100&ib".into()),
            mem: Some("64G".into()),
            cpus_per_task: 12,
            extra: vec!["--mail-type=END,FAIL".into(), "--exclusive".into()],
            ..Directives::default()
        };
        let s = script(&b);
        let lines = sbatch_lines(&s);
        for want in [
            "#SBATCH --cpus-per-task=12",
            "#SBATCH --account=proj42",
            "#SBATCH --qos=high",
            "#SBATCH --constraint=a100&ib",
            "#SBATCH --mem=64G",
        ] {
            assert!(lines.contains(&want), "{want} missing:\n{s}");
        }
        // The user's own lines come last, after every directive tchrun writes.
        assert_eq!(
            lines[lines.len() - 2..],
            ["#SBATCH --mail-type=END,FAIL", "#SBATCH --exclusive"]
        );
        // None of them without a value; no cpus line at 0 (the cluster's default).
        b.directives = Directives::default();
        let s = script(&b);
        for absent in [
            "--gpus-per-node",
            "--partition",
            "--time",
            "--account",
            "--qos",
            "--constraint",
            "--mem",
            "--cpus-per-task",
        ] {
            assert!(!s.contains(absent), "{absent}:\n{s}");
        }
    }

    #[test]
    fn script_body_runs_the_ranks_and_requeues_on_usr1() {
        let s = script(&batch(0));
        assert!(
            s.contains(
                "  srun --nodes=2 --mpi=pmix /opt/tchrun-worker train '--model=/m dir' \"${RESUME[@]}\" &\n"
            ),
            "{s}"
        );
        assert!(s.contains("trap on_usr1 USR1"), "{s}");
        assert!(s.contains("scancel --signal=TERM \"$SLURM_JOB_ID\""), "{s}");
        assert!(s.contains("scontrol requeue \"$SLURM_JOB_ID\""), "{s}");
        assert!(s.contains("RESUME=(--resume)"), "{s}");
        assert!(s.contains("LOG_DIR=/runs/out/logs\n"), "{s}");
        assert!(s.contains("LAST=/runs/out/checkpoints/last.json\n"), "{s}");
        assert!(s.contains("MAX_RESTARTS=0\n"), "{s}");
        assert!(s.trim_end().ends_with("exit \"$CODE\""), "{s}");
    }

    #[test]
    fn script_is_valid_bash() {
        let dir = tempfile::tempdir().expect("tmp");
        let p = dir.path().join("job.sbatch");
        let mut b = batch(2);
        b.max_restarts = 3;
        b.directives.extra = vec!["--comment=a b".into()];
        std::fs::write(&p, script(&b)).expect("write");
        let st = std::process::Command::new("bash")
            .arg("-n")
            .arg(&p)
            .status()
            .expect("bash");
        assert!(st.success());
    }

    /// Runs the script with bash, its ranks a fake `srun` that records each start
    /// (`TCHRUN_ATTEMPT` and arguments) and, in `mode` "progress", writes a checkpoint and
    /// fails in attempt 1 only; "never" always fails without a checkpoint. Returns (exit code,
    /// the starts, the script's output, the log directory).
    fn run_with_fake_ranks(
        max_restarts: u32,
        mode: &str,
    ) -> (Option<i32>, Vec<String>, String, tempfile::TempDir) {
        let dir = tempfile::tempdir().expect("tmp");
        let out = dir.path().join("out");
        let logs = out.join("logs");
        std::fs::create_dir_all(out.join("checkpoints")).expect("dirs");
        std::fs::create_dir_all(&logs).expect("dirs");
        let fake = dir.path().join("fake-srun");
        let calls = dir.path().join("calls");
        std::fs::write(
            &fake,
            format!(
                "#!/bin/bash\necho \"$TCHRUN_ATTEMPT $*\" >> {calls}\n\
                 echo rank-log > {logs}/70_driver_log_0\n\
                 if [ {mode} = progress ] && [ \"$TCHRUN_ATTEMPT\" = 1 ]; then\n\
                 echo \"{{\\\"step\\\": $RANDOM}}\" > {last}; exit 4; fi\n\
                 [ {mode} = progress ] && exit 0; exit 4\n",
                calls = calls.display(),
                logs = logs.display(),
                last = tchrun::checkpoint::last_json(&out).display(),
            ),
        )
        .expect("fake");
        let mut b = batch(0);
        b.log_dir = logs;
        b.output = out;
        b.max_restarts = max_restarts;
        b.overwrite = true;
        b.launch = launch::CommandSpec {
            program: "bash".into(),
            args: vec![fake.display().to_string(), "train".into()],
            env: vec![],
        };
        let p = dir.path().join("job.sbatch");
        std::fs::write(&p, script(&b)).expect("write");
        let r = std::process::Command::new("bash")
            .arg(&p)
            .env("SLURM_JOB_ID", "7")
            .env("SLURM_JOB_NODELIST", "n1")
            .env_remove("SLURM_RESTART_COUNT")
            .output()
            .expect("bash");
        let starts = std::fs::read_to_string(&calls)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let text =
            String::from_utf8_lossy(&r.stdout).to_string() + &String::from_utf8_lossy(&r.stderr);
        (r.status.code(), starts, text, dir)
    }

    #[test]
    fn max_restarts_restarts_a_failure_that_wrote_a_checkpoint() {
        let (code, starts, text, dir) = run_with_fake_ranks(2, "progress");
        assert_eq!(code, Some(0), "{text}");
        assert_eq!(
            starts,
            ["1 train --overwrite", "2 train --resume"],
            "{text}"
        );
        assert!(
            text.contains("attempt 1 failed (exit 4) after writing a checkpoint; restarting all ranks in 1 s with --resume (restart 1 of at most 2"),
            "{text}"
        );
        let kept = dir.path().join("out/logs/attempt-1/70_driver_log_0");
        assert!(kept.is_file(), "attempt 1's rank log not kept\n{text}");
        assert!(text.contains("ranks ended with exit code 0"), "{text}");
    }

    #[test]
    fn no_restart_without_progress_or_budget() {
        // A failure before any checkpoint: once, with the reason.
        let (code, starts, text, _dir) = run_with_fake_ranks(2, "never");
        assert_eq!(code, Some(4), "{text}");
        assert_eq!(starts.len(), 1, "{starts:?}\n{text}");
        assert!(
            text.contains("not restarting: attempt 1 wrote no checkpoint"),
            "{text}"
        );
        // --max-restarts 0 (the default): the first failure ends the job.
        let (code, starts, text, _dir) = run_with_fake_ranks(0, "progress");
        assert_eq!(code, Some(4), "{text}");
        assert_eq!(starts.len(), 1, "{starts:?}\n{text}");
        assert!(!text.contains("restarting"), "{text}");
    }

    #[test]
    fn directive_values_are_one_word() {
        assert!(check_directive("--time", "1:00:00").is_ok());
        assert!(check_directive("--partition", "a b").is_err());
        assert!(check_directive("--job-name", "x\ny").is_err());
        assert!(check_directive("--job-name", "").is_err());
        assert!(check_directive("--mem", "64G\nrm -rf /").is_err());
    }

    #[test]
    fn extra_lines_are_one_sbatch_option_not_one_of_the_scripts() {
        for ok in [
            "--exclusive",
            "--mail-type=END",
            "--comment=a b",
            "--gres=gpu:a100:4",
        ] {
            assert!(check_extra(ok).is_ok(), "{ok}");
        }
        let err = |l: &str| check_extra(l).expect_err(l).to_string();
        assert!(err("--exclusive\necho pwned").contains("one line"));
        assert!(err("--x\r").contains("one line"));
        assert!(err("echo hi").contains("must be an sbatch option"));
        assert!(err("").contains("must be an sbatch option"));
        assert!(err("--nodes=3").contains("use `tchrun sbatch --nodes`"));
        assert!(err("-N3").contains("use `tchrun sbatch --nodes`"));
        assert!(err("--cpus-per-task=4").contains("--cpus-per-task"));
        assert!(err("--output=/tmp/x").contains("the script needs its own --output"));
        assert!(err("--requeue").contains("leave it out"));
    }
}
