//! Slow ranks named while training (`worker/src/straggler.rs`, `worker/src/train/live.rs`) and rank
//! 0's `status.json` while the job runs: real 2- and 4-rank CPU jobs where a test hook slows
//! one rank's step or its loader, and one where the ranks are equal and nobody may be named.
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;
use tchrun::job_record::status::{JobState, JobStatus, SlowKind};
use tchrun::job_record::Record;

const LIMIT: Duration = Duration::from_secs(300);

/// The equal-ranks test runs alone (write); the others may share the machine with each other
/// (read). Run beside the 4-rank test on a 2-core machine, "equal" ranks are not equal: the
/// scheduler starves one of them for seconds, and naming it would be right (CI saw rank 1 at
/// 1.8x for 8 steps so).
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

/// 400 training images; `ranks` ranks × batches of `batch`; each window is `--print-freq 2`.
fn train(
    out: &Path,
    model: &Path,
    ranks: u32,
    batch: u32,
    extra: &[&str],
) -> std::process::Command {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    c.args(["--procs-per-node", &ranks.to_string()])
        .args(["--batch-size", &batch.to_string()])
        .args(["--lr", "0.05", "--min-crop-scale", "0.5", "--no-hflip"])
        .args(["--print-freq", "2"])
        .args(extra);
    if ranks > 2 {
        c.arg("--oversubscribe");
    }
    c
}

fn stragglers_of(row: &serde_json::Value) -> Vec<(u64, String)> {
    row["stragglers"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|s| {
                    (
                        s["rank"].as_u64().expect("rank"),
                        s["kind"].as_str().expect("kind").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Rank 1 of 2 sleeps 0.3 s in every step's compute: it is named (console, driver log,
/// metrics.jsonl, TensorBoard, status.json) as slow in compute within the first epoch, for the
/// whole of the second, and the run report names its host as the slowest; rank 0 never is.
/// While it runs, `status.json` has both ranks with their host, phase and step.
#[test]
fn a_rank_with_a_slow_step_is_named_with_its_host() {
    let _machine = shared();
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let mut job = Job::start(
        train(&out, &model, 2, 20, &["--epochs", "2"]).env("TCHRUN_TEST_SLOW_STEP", "1:0.3"),
        t.path(),
    );
    // While it runs: rank 0's status.json, both ranks with a phase, the job training.
    let status_path = out.join("logs/status.json");
    let mut running: Option<JobStatus> = None;
    let seen = wait_for(Duration::from_secs(200), || {
        running = JobStatus::read(&out.join("logs")).ok().flatten();
        running.as_ref().is_some_and(|s| {
            s.state == JobState::Training
                && s.step > 0
                && s.ranks.len() == 2
                && s.ranks
                    .iter()
                    .all(|r| r.phase.is_some() && r.shares.is_some())
        })
    });
    assert!(
        seen,
        "no training status.json with both ranks in {}: {:?}\n{}",
        status_path.display(),
        running,
        job.output()
    );
    let s = running.expect("status");
    // `tchrun status` on the running job: the same numbers, in words; the step it shows is
    // one rank 0's driver log has reached (its heartbeat's) and no further than the total.
    let st = run(tchrun().arg("status").arg(&out), Duration::from_secs(30));
    assert_eq!(st.code, Some(0), "{}", st.explain());
    let state_line = st
        .stdout
        .lines()
        .find(|l| l.starts_with("state:"))
        .unwrap_or_default();
    assert!(
        (state_line.contains("training") || state_line.contains("validating"))
            && state_line.contains("2 rank(s)"),
        "{}",
        st.explain()
    );
    let shown: u64 = st
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("step:"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no step line: {}", st.explain()));
    assert!(st.stdout.contains(" of 20 ("), "{}", st.explain());
    let log0 = read(&out.join("logs/70_driver_log_0"));
    let started = log0.contains("first optimizer step done");
    assert!(shown >= 1 && shown <= 20 && started, "step {shown}\n{log0}");
    assert_eq!(
        (s.world_size, s.epochs, s.steps_per_epoch, s.total_steps),
        (2, 2, 10, 20),
        "{s:?}"
    );
    assert!(
        s.ranks.iter().all(|r| r.host == s.ranks[0].host
            && r.device == "cpu"
            && r.rss_bytes.unwrap_or(0) > 0),
        "{s:?}"
    );
    assert_eq!(job.wait(LIMIT), Some(0), "{}", job.output());
    let console = job.output();

    // Named on the console, once, by rank and host, with what is slow.
    let host = &s.ranks[1].host;
    let named: Vec<&str> = console
        .lines()
        .filter(|l| l.contains("straggler: rank"))
        .collect();
    assert!(
        named.iter().any(
            |l| l.contains(&format!("straggler: rank 1 ({host}, cpu) compute "))
                && l.contains("x the median of the other ranks for ")
        ),
        "{console}"
    );
    assert!(!console.contains("straggler: rank 0"), "{console}");
    assert!(
        console.contains(&format!(
            "straggler: rank 1 ({host}) was slower than the other ranks in every window of epoch 2"
        )),
        "{console}"
    );
    // In rank 0's driver log, and rank 1's says it was named.
    assert!(read(&out.join("logs/70_driver_log_0")).contains("straggler: rank 1"));
    assert!(read(&out.join("logs/70_driver_log_1")).contains("this rank is named a straggler"));
    // metrics.jsonl: the straggler in its epochs, the slowest rank and its host.
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 2);
    for r in &rows {
        assert_eq!(stragglers_of(r), vec![(1, "compute".to_string())], "{r}");
        assert_eq!(r["slowest"]["rank"], 1, "{r}");
        assert_eq!(r["slowest"]["host"].as_str(), Some(host.as_str()), "{r}");
        let f = r["stragglers"][0]["factor"].as_f64().expect("factor");
        assert!(f > 1.3, "{r}");
    }
    // The run report names the straggler with its epochs, and the slowest host.
    assert!(
        console.lines().any(|l| l
            .starts_with(&format!("tchrun: straggler: rank 1 ({host}, cpu) compute "))
            && l.ends_with("; in epochs 1, 2")),
        "{console}"
    );
    assert!(
        console.contains(&format!("slowest host {host} (rank 1:")),
        "{console}"
    );
    // TensorBoard: the count of stragglers and rank 1's factor.
    let tb = run(
        python().args([
            "-c",
            "import sys,json\nfrom tensorboard.backend.event_processing.event_accumulator import EventAccumulator as E\ne=E(sys.argv[1]);e.Reload()\nprint(json.dumps({t:[x.value for x in e.Scalars(t)] for t in e.Tags()['scalars'] if t.startswith('stragglers/')}))",
        ]).arg(out.join("tensorboard")),
        Duration::from_secs(60),
    );
    assert_eq!(tb.code, Some(0), "{}", tb.explain());
    let v: serde_json::Value = serde_json::from_str(&tb.stdout).expect("json");
    assert!(
        v["stragglers/count"]
            .as_array()
            .expect("count")
            .iter()
            .any(|c| c.as_f64() == Some(1.0)),
        "{v}"
    );
    assert!(
        v["stragglers/rank_1_compute"]
            .as_array()
            .is_some_and(|a| !a.is_empty()),
        "{v}"
    );
    // The final status: finished, with the straggler of the last window.
    let end = JobStatus::read(&out.join("logs"))
        .expect("read")
        .expect("status.json");
    assert_eq!(end.state, JobState::Finished, "{end:?}");
    assert_eq!(end.step, 20);
    assert_eq!(end.stragglers.len(), 1, "{end:?}");
    assert_eq!(
        (end.stragglers[0].rank, end.stragglers[0].kind),
        (1, SlowKind::Compute)
    );
    assert!(
        end.last_checkpoint.as_ref().is_some_and(|c| c.step == 20),
        "{end:?}"
    );
}

/// Rank 2 of 4 has a slow loader (every image decode sleeps): it is named for its data wait,
/// not for compute, and no other rank is named.
#[test]
fn four_ranks_one_with_a_slow_loader_is_named_for_its_data_wait() {
    let _machine = shared();
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = run(
        train(
            &out,
            &model,
            4,
            10,
            &["--epochs", "1", "--loader-threads", "1"],
        )
        .env("TCHRUN_TEST_SLOW_LOADER", "2:0.15"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let rows = metrics_rows(&out);
    assert_eq!(
        stragglers_of(&rows[0]),
        vec![(2, "data_wait".to_string())],
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.lines().any(|l| l.contains("straggler: rank 2 (")
            && l.contains(" data wait ")
            && l.contains(": its loader is slow (disk or CPU on ")),
        "{}",
        r.explain()
    );
    assert_eq!(rows[0]["slowest"]["rank"], 2, "{}", rows[0]);
}

/// Equal ranks: over a whole run nobody is named (no false positive), and the status ends
/// finished with no straggler. At the default `--print-freq 10` (the last one given wins): in
/// windows of 2 steps (0.3 s here) the scheduler's noise alone reached 1.3x for 4 windows in
/// a row on CI's 2 cores, the job running alone.
#[test]
fn equal_ranks_are_never_named() {
    let _machine = alone();
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let extra = ["--epochs", "2", "--print-freq", "10"];
    let r = run(&mut train(&out, &model, 2, 10, &extra), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stdout.contains("straggler"), "{}", r.explain());
    for row in metrics_rows(&out) {
        assert!(stragglers_of(&row).is_empty(), "{row}");
    }
    let end = JobStatus::read(&out.join("logs"))
        .expect("read")
        .expect("status.json");
    assert_eq!(end.state, JobState::Finished, "{end:?}");
    assert!(end.stragglers.is_empty(), "{end:?}");
}
