//! `--console` (issue 29, part 4): whose lines reach tchrun's terminal, on real 2-rank jobs.
//! By default rank 0's lines and every rank's warnings and errors; `--console all` every rank's,
//! the lines they print alike folded into one (`[ranks 0-1] ...`); `--console 1` rank 1's;
//! `--console host:NAME` those of the ranks on that host. The driver logs and `70_mpi_log` keep
//! every line whatever the console shows. Rank 1 warns once in every job
//! (`two_rank_console_job`). `tchrun exec` streams its program's lines by the same rules, its
//! stderr warnings and errors (a Python traceback) counting as the rank's warnings.
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

/// The job with `--console SELECTION` run to its end (exit 0).
fn job(model: &Path, out: &Path, launcher: &str, selection: Option<&str>) -> Run {
    let r = run(
        &mut two_rank_console_job(model, out, launcher, selection),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    r
}

/// Rank 1's warning, as its console shows it.
fn warning(host: &str) -> String {
    format!("{host}:1 warning: TCHRUN_TEST_STALL_AT_STEP: spinning for 200ms before step 3")
}

#[test]
fn the_default_is_rank_0_with_every_ranks_warnings_and_a_selection_picks_ranks_or_hosts() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);

    // Default: rank 0's lines, and rank 1's warning.
    let out = t.path().join("default");
    let r = job(&model, &out, "local", None);
    let host = console_host(&r.stdout);
    let lines = rank_lines(&r.stdout);
    assert!(
        lines.len() >= 4 && lines.iter().all(|l| l.starts_with(&format!("{host}:0 "))),
        "rank 0's lines only:\n{}",
        r.explain()
    );
    assert!(
        rank_lines(&r.stderr).contains(&warning(&host).as_str()),
        "rank 1's warning reaches the console:\n{}",
        r.explain()
    );
    let log1 = read(&out.join("logs/70_driver_log_1"));
    assert!(
        log1.contains("training resnet18 on 400 train") && log1.contains("epoch 1/1: train loss"),
        "rank 1's driver log keeps its lines: {log1}"
    );

    // `--console 1`: rank 1's lines (and its warning), none of rank 0's.
    let r = job(&model, &t.path().join("one"), "local", Some("1"));
    let lines = rank_lines(&r.stdout);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with(&format!("{host}:1 training resnet18")))
            && lines
                .iter()
                .any(|l| l.starts_with(&format!("{host}:1 epoch 1/1: train loss")))
            && lines.iter().all(|l| l.starts_with(&format!("{host}:1 "))),
        "rank 1's lines only:\n{}",
        r.explain()
    );
    assert!(
        rank_lines(&r.stderr).contains(&warning(&host).as_str()),
        "{}",
        r.explain()
    );

    // `--console host:HOST`: both ranks run there, so both print; the same line once.
    let r = job(
        &model,
        &t.path().join("host"),
        "local",
        Some(&format!("host:{host}")),
    );
    let lines = rank_lines(&r.stdout);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[ranks 0-1] training resnet18 on 400 train"))
            && lines
                .iter()
                .any(|l| l.starts_with(&format!("{host}:1 epoch 1/1 iter ")))
            && lines
                .iter()
                .any(|l| l.starts_with(&format!("{host}:0 epoch 1/1 iter "))),
        "every rank of {host}:\n{}",
        r.explain()
    );
    // A host no rank of this local job runs on (issue 52: it printed nothing and said
    // nothing): refused before any rank starts, naming the host the job runs on.
    let r = run(
        &mut two_rank_console_job(
            &model,
            &t.path().join("nohost"),
            "local",
            Some("host:no-such-host"),
        ),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&format!(
            "the job runs on {host} only; name it (host:{host})"
        )),
        "{}",
        r.explain()
    );
}

#[test]
fn console_all_folds_the_lines_every_rank_prints_alike() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("all");
    // Through mpirun: both ranks' lines come through its one pipe.
    let r = job(&model, &out, "mpirun", Some("all"));
    let lines = rank_lines(&r.stdout);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("[ranks 0-1] training resnet18 on 400 train")),
        "the training line, once for both ranks:\n{}",
        r.explain()
    );
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(":0 training ") || l.contains(":1 training ")),
        "not also rank by rank:\n{}",
        r.explain()
    );
    // Rank 1's progress is on the console (folded with rank 0's or on its own).
    assert!(
        lines
            .iter()
            .any(|l| l.contains(":1 epoch 1/1 iter ")
                || (l.starts_with("[ranks 0-1] epoch 1/1 iter "))),
        "{}",
        r.explain()
    );
    // 70_mpi_log keeps each rank's raw line.
    let mpi_log = read(&out.join("logs/70_mpi_log"));
    for rank in 0..2 {
        assert!(
            mpi_log
                .lines()
                .any(|l| l.contains(&format!(":{rank} training resnet18 on 400 train"))),
            "rank {rank}'s line in 70_mpi_log:\n{mpi_log}"
        );
    }
}

#[test]
fn a_bad_selection_is_refused_naming_the_flag_and_the_fix() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    for (value, says) in [
        ("0,x", "'x' is not a rank"),
        ("host:", "host:NAME"),
        ("2", "--console 2: the job has 2 rank(s) (0-1)"),
    ] {
        let r = run(
            two_rank_console_job(&model, &out, "local", Some(value)).arg("--dry-run"),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr.contains("--console") && r.stderr.contains(says),
            "{value}: {}",
            r.explain()
        );
    }
    assert!(!out.join("logs").exists(), "refused before any rank starts");
}

/// The two ranks of an exec job wait for each other (a file each in `dir`), so that the lines
/// they print alike arrive together and fold.
const MEET: &str =
    "touch ready-$RANK; while [ ! -e ready-0 ] || [ ! -e ready-1 ]; do sleep 0.05; done";

/// `tchrun exec --procs-per-node 2` in `dir` (its working directory and log directory).
fn exec_job(
    dir: &Path,
    launcher: &str,
    console: Option<&str>,
    program: &[&str],
) -> std::process::Command {
    let mut c = tchrun();
    c.current_dir(dir)
        .args([
            "exec",
            "--procs-per-node",
            "2",
            "--launcher",
            launcher,
            "--log-dir",
        ])
        .arg(dir.join("logs"))
        .env_remove("TCHRUN_CONSOLE")
        .env_remove("PYTHONUNBUFFERED");
    if let Some(s) = console {
        c.args(["--console", s]);
    }
    c.arg("--").args(program);
    c
}

/// Issue 31 item 2: `tchrun exec` showed nothing of the program until the end. Now each line
/// reaches tchrun's console as the program prints it (rank 0's line is read from tchrun's
/// stdout while the program still waits), with its `host:rank` prefix: rank 0's stdout and
/// stderr by default, every rank's warnings (the same line of both ranks once), and the driver
/// logs keep every line of every rank.
#[test]
fn exec_streams_the_programs_lines_as_it_prints_them() {
    for launcher in ["local", "mpirun"] {
        let t = tempdir();
        let script = format!(
            "{MEET}; echo started $RANK; echo 'warning: disk almost full' >&2; \
             echo stderr note from $RANK >&2; while [ ! -e stop ]; do sleep 0.05; done; \
             echo done $RANK"
        );
        let mut job = Job::start(
            &mut exec_job(t.path(), launcher, None, &["sh", "-c", &script]),
            t.path(),
        );
        let seen = wait_for(Duration::from_secs(60), || {
            read(&job.out).contains(":0 started 0")
        });
        assert!(
            seen,
            "{launcher}: rank 0's first line while it runs:\n{}",
            job.output()
        );
        assert!(
            job.child
                .as_mut()
                .is_some_and(|c| matches!(c.try_wait(), Ok(None))),
            "{launcher}: still running"
        );
        assert!(!read(&job.out).contains("done 0"), "{}", job.output());
        std::fs::write(t.path().join("stop"), "").expect("stop file");
        assert_eq!(
            job.wait(Duration::from_secs(60)),
            Some(0),
            "{launcher}: {}",
            job.output()
        );
        let (out, err) = (read(&job.out), read(&job.err));
        let host = out
            .lines()
            .find_map(|l| l.strip_suffix(":0 started 0"))
            .unwrap_or_else(|| panic!("{out}"))
            .to_string();
        assert_eq!(
            rank_lines(&out),
            [format!("{host}:0 started 0"), format!("{host}:0 done 0")],
            "{launcher}: rank 0's stdout only:\n{}",
            job.output()
        );
        assert_eq!(
            rank_lines(&err),
            [
                "[ranks 0-1] warning: disk almost full".to_string(),
                format!("{host}:0 stderr note from 0")
            ],
            "{launcher}: every rank's warning, rank 0's other stderr line:\n{}",
            job.output()
        );
        let log1 = read(&t.path().join("logs/70_driver_log_1"));
        assert!(
            [
                "started 1\n",
                "warning: disk almost full\n",
                "stderr note from 1\n",
                "done 1\n"
            ]
            .iter()
            .all(|l| log1.contains(l)),
            "{launcher}: rank 1's driver log keeps its lines:\n{log1}"
        );
    }
}

/// A Python program (stdout unbuffered by tchrun): with `--console 1`, rank 1's lines, rank
/// 0's `UserWarning` (a warning of every rank is shown) and rank 1's traceback to its last
/// line; rank 0's prints stay in its driver log. A `--console` the job does not have is refused.
#[test]
fn exec_console_selects_a_ranks_lines_and_shows_every_ranks_warnings_and_tracebacks() {
    let t = tempdir();
    let py = repo().join(".venv/bin/python");
    let script = t.path().join("prog.py");
    std::fs::write(
        &script,
        "import os, time, warnings\n\
         r = int(os.environ['RANK'])\n\
         print(f'hello from {r}')\n\
         if r == 0:\n    warnings.warn('careful')\n    open('warned', 'w').close()\n    time.sleep(30)\n\
         while not os.path.exists('warned'): time.sleep(0.05)\n\
         time.sleep(0.5)\n\
         raise ValueError('bad value on rank 1')\n",
    )
    .expect("script");
    let prog = [py.to_str().expect("utf-8"), script.to_str().expect("utf-8")];
    let r = run(&mut exec_job(t.path(), "mpirun", Some("1"), &prog), LIMIT);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let host = r
        .stdout
        .lines()
        .find_map(|l| l.strip_suffix(":1 hello from 1"))
        .unwrap_or_else(|| panic!("rank 1's print:\n{}", r.explain()))
        .to_string();
    assert_eq!(
        rank_lines(&r.stdout),
        [format!("{host}:1 hello from 1")],
        "{}",
        r.explain()
    );
    let err = rank_lines(&r.stderr);
    let at = |line: &str| err.iter().position(|l| *l == line);
    let warned = format!("{host}:0 {}:5: UserWarning: careful", script.display());
    let traceback = [
        "Traceback (most recent call last):".to_string(),
        format!("  File \"{}\", line 10, in <module>", script.display()),
        "    raise ValueError('bad value on rank 1')".to_string(),
        "ValueError: bad value on rank 1".to_string(),
    ]
    .map(|l| format!("{host}:1 {l}"));
    assert!(at(&warned).is_some(), "rank 0's warning:\n{}", r.explain());
    let first = at(&traceback[0]).unwrap_or_else(|| panic!("rank 1's traceback:\n{}", r.explain()));
    assert_eq!(&err[first..first + 4], &traceback, "{}", r.explain());
    assert!(!r.stdout.contains("hello from 0") && !r.stderr.contains("hello from 0"));
    assert!(read(&t.path().join("logs/70_driver_log_0")).contains("hello from 0\n"));

    let r = run(
        &mut exec_job(t.path(), "local", Some("2"), &["true"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--console 2: the job has 2 rank(s) (0-1)"),
        "{}",
        r.explain()
    );
}

/// Issue 31 item 12: `exec` and `selftest` without `--log-dir` write a folder of their own in
/// `./tchrun-logs` (`<command>-<UTC time>`), so a second job never overwrites the first's logs;
/// `tchrun logs` without an argument reads the newest job and says which it read. A refused
/// job leaves no empty folder behind.
#[test]
fn each_exec_and_selftest_job_logs_into_a_folder_of_its_own_and_logs_reads_the_newest() {
    let t = tempdir();
    let job = |args: &[&str]| {
        let mut cmd = tchrun();
        cmd.args(args).current_dir(t.path());
        run(&mut cmd, LIMIT)
    };
    let r = job(&[
        "exec",
        "--launcher",
        "local",
        "--procs-per-node",
        "2",
        "--",
        "sh",
        "-c",
        "echo first $RANK",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = job(&[
        "selftest",
        "--launcher",
        "local",
        "--procs-per-node",
        "2",
        "--sizes",
        "1024",
        "--iters",
        "2",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = job(&[
        "exec",
        "--launcher",
        "local",
        "--procs-per-node",
        "3",
        "--console",
        "5",
        "--",
        "true",
    ]);
    assert_eq!(r.code, Some(2), "a refused job: {}", r.explain());
    let base = t.path().join("tchrun-logs");
    let mut jobs: Vec<String> = std::fs::read_dir(&base)
        .expect("./tchrun-logs")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    jobs.sort();
    assert_eq!(jobs.len(), 2, "one folder per job that ran: {jobs:?}");
    let exec = jobs
        .iter()
        .find(|j| j.starts_with("exec-"))
        .expect("exec's folder");
    let selftest = jobs
        .iter()
        .find(|j| j.starts_with("selftest-"))
        .expect("selftest's");
    assert!(read(&base.join(exec).join("70_driver_log_1")).contains("first 1\n"));
    assert!(base.join(selftest).join("70_driver_log_1").is_file());
    let r = job(&["logs"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.starts_with("(the newest job in tchrun-logs: ")
            && r.stdout.contains(selftest.as_str())
            && r.stdout.contains("2 ranks logged in"),
        "{}",
        r.explain()
    );
}
