//! `--console` (issue 29, part 4): whose lines reach tchrun's terminal, on real 2-rank jobs.
//! By default rank 0's lines and every rank's warnings and errors; `--console all` every rank's,
//! the lines they print alike folded into one (`[ranks 0-1] ...`); `--console 1` rank 1's;
//! `--console host:NAME` those of the ranks on that host. The driver logs and `70_mpi_log` keep
//! every line whatever the console shows. Rank 1 warns once in every job
//! (`two_rank_console_job`).
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
    // A host no rank runs on: no rank's lines, but the warnings still.
    let r = job(
        &model,
        &t.path().join("nohost"),
        "local",
        Some("host:no-such-host"),
    );
    assert!(rank_lines(&r.stdout).is_empty(), "{}", r.explain());
    assert!(
        rank_lines(&r.stderr).contains(&warning(&host).as_str()),
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
