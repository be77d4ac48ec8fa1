//! Issue 28: a job that hangs is found by default and the rank at fault named. Each rank beats
//! `heartbeat-<rank>.json` from a thread of its own; a rank stopped with SIGSTOP stops beating
//! while the other waits in the gradient all-reduce, and tchrun ends the job (exit 4) long
//! before `--timeout`, naming both in one verdict and in `failure.json`. A healthy job with the
//! default watch ends with every rank's beat saying it is done.
mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::Path;
use std::time::{Duration, Instant};
use tchrun::job_record::heartbeat::{HangKind, Heartbeat, Phase};
use tchrun::job_record::{FailureSummary, Record};

/// Time for the job to reach its first training step (a loaded 2-core machine).
const START_LIMIT: Duration = Duration::from_secs(300);
/// Time tchrun gets to find the hang and end the job after the SIGSTOP.
const DETECT_LIMIT: Duration = Duration::from_secs(90);

/// A stopped rank: killed (and continued) when the test ends, whatever happened.
struct Stopped(Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        if is_worker(self.0) {
            let _ = kill(self.0, Signal::SIGKILL);
            let _ = kill(self.0, Signal::SIGCONT);
        }
    }
}

/// Whether `pid` is (still) a tchrun-worker, not a process that reused its number.
fn is_worker(pid: Pid) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).contains("tchrun-worker"))
        .unwrap_or(false)
}

/// Whether `pid` is gone (or a zombie waiting to be reaped).
fn gone(pid: Pid) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

fn beat_of(logs: &Path, rank: usize) -> Option<Heartbeat> {
    Heartbeat::read_all(logs)
        .into_iter()
        .find(|b| b.rank == rank)
}

fn train(data: &Path, model: &Path, out: &Path, epochs: &str) -> std::process::Command {
    let mut c = tchrun_train(model, &data.join("train"), &data.join("valid"), out);
    c.args([
        "--procs-per-node",
        "2",
        "--epochs",
        epochs,
        "--batch-size",
        "8",
        "--print-freq",
        "1",
        "--min-crop-scale",
        "0.5",
    ]);
    c
}

#[test]
fn a_stopped_rank_is_named_and_the_job_ends_long_before_the_timeout() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let logs = out.join("logs");
    let mut c = train(&data, &model, &out, "50");
    c.args(["--timeout", "120"]);
    let mut job = Job::start(&mut c, t.path());
    let log0 = logs.join("70_driver_log_0");
    assert!(
        wait_for(START_LIMIT, || std::fs::read_to_string(&log0)
            .is_ok_and(|l| l.contains(" iter "))),
        "training never started: {}",
        job.output()
    );
    // Stopped once its own beat says it trains (a beat comes once a second).
    let mut pid = None;
    assert!(
        wait_for(Duration::from_secs(60), || {
            let b = beat_of(&logs, 1);
            pid = b.as_ref().map(|b| Pid::from_raw(b.pid as i32));
            b.is_some_and(|b| b.step >= 2 && b.phase != Phase::StartUp)
                && pid.is_some_and(is_worker)
        }),
        "rank 1's heartbeat names its pid and its step: {:?} {}",
        beat_of(&logs, 1),
        job.output()
    );
    let pid = pid.expect("checked above");
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP to rank 1");
    let stopped = Stopped(pid);
    let at = Instant::now();
    let code = job.wait(DETECT_LIMIT);
    let took = at.elapsed();
    eprintln!(
        "hang found and the job ended {:.1} s after the SIGSTOP",
        took.as_secs_f64()
    );
    assert_eq!(
        code,
        Some(4),
        "exit 4 within {DETECT_LIMIT:?}: {}",
        job.output()
    );
    let err = read(&job.err);
    eprintln!(
        "{}",
        err.lines().find(|l| l.contains("hang:")).unwrap_or("")
    );
    assert!(
        err.contains("hang: rank 0 (") && err.contains("waits in"),
        "rank 0 waits in a collective: {}",
        job.output()
    );
    assert!(
        err.contains("rank 1 (") && err.contains("stopped beating at"),
        "rank 1 named as not beating: {}",
        job.output()
    );
    let summary = FailureSummary::read(&logs)
        .expect("failure.json reads")
        .expect("failure.json is there");
    assert_eq!(summary.classification, "hang");
    assert_eq!(summary.exit_status, 4);
    let v = summary.hang.expect("the typed verdict");
    assert_eq!(v.kind, HangKind::StoppedBeating);
    let culprits: Vec<(usize, bool, u32)> = v
        .culprits
        .iter()
        .map(|r| (r.rank, r.beating, r.pid))
        .collect();
    assert_eq!(culprits, [(1, false, pid.as_raw() as u32)], "{v:?}");
    assert_ne!(v.culprits[0].phase, Phase::StartUp, "{v:?}");
    assert!(v.culprits[0].step >= 2, "{v:?}");
    assert_eq!(v.waiting.len(), 1, "{v:?}");
    assert_eq!(v.waiting[0].rank, 0);
    assert!(v.waiting[0].phase.is_collective(), "{v:?}");
    assert!(v.seq.is_some_and(|s| s > 0), "{v:?}");
    // Nothing of the job outlives tchrun, the stopped rank included.
    let left = wait_for(Duration::from_secs(15), || gone(pid));
    drop(stopped);
    assert!(left, "the stopped rank outlived tchrun");
}

#[test]
fn a_healthy_job_with_the_default_watch_ends_with_every_rank_done() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = run(&mut train(&data, &model, &out, "2"), START_LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stderr.contains("hang"), "{}", r.explain());
    let beats = Heartbeat::read_all(&out.join("logs"));
    assert_eq!(beats.len(), 2, "{beats:?}");
    for b in &beats {
        assert_eq!(b.phase, Phase::Done, "{b:?}");
        assert!(b.step > 0 && b.seq > 0, "{b:?}");
    }
}

#[test]
fn a_stuck_rank_that_still_beats_is_named_when_nothing_advances_for_the_hang_timeout() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let mut c = train(&data, &model, &out, "50");
    c.args([
        "--launcher",
        "local",
        "--timeout",
        "120",
        "--hang-timeout",
        "5",
    ])
    .env("TCHRUN_TEST_STALL_AT_STEP", "1:3:100");
    let r = run(&mut c, START_LIMIT);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    eprintln!(
        "{}",
        r.stderr.lines().find(|l| l.contains("hang:")).unwrap_or("")
    );
    assert!(
        r.stderr.contains("still beating: its main thread is stuck")
            && r.stderr.contains("no rank advanced for"),
        "{}",
        r.explain()
    );
    let v = FailureSummary::read(&out.join("logs"))
        .expect("failure.json reads")
        .and_then(|s| s.hang)
        .expect("the typed verdict");
    assert_eq!(v.kind, HangKind::NoProgress);
    let culprits: Vec<(usize, bool, Phase, u64)> = v
        .culprits
        .iter()
        .map(|r| (r.rank, r.beating, r.phase, r.step))
        .collect();
    assert_eq!(culprits, [(1, true, Phase::Forward, 3)], "{v:?}");
    assert_eq!(
        v.waiting.iter().map(|r| r.rank).collect::<Vec<_>>(),
        [0],
        "{v:?}"
    );
    assert!(v.waiting[0].phase.is_collective(), "{v:?}");
    assert_eq!(v.allowed_s, 5);
}
