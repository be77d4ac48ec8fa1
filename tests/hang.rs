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
use tchrun::job_record::hang::HangKind;
use tchrun::job_record::heartbeat::{Heartbeat, Phase};
use tchrun::job_record::{FailureSummary, Record};

/// Time for the job to reach its first training step (a loaded 2-core machine).
const START_LIMIT: Duration = Duration::from_secs(300);
/// Time tchrun gets to find the hang and end the job after the SIGSTOP.
const DETECT_LIMIT: Duration = Duration::from_secs(90);
/// The stated bound of a capture (docs/observing.md): 20 s for the answers, 8 s for the
/// launcher's own look at a rank that did not answer.
const CAPTURE_BOUND: Duration = Duration::from_secs(28);

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
        err.contains("rank 1 (")
            && err.contains("is stopped (state T: SIGSTOP or a debugger); at its last beat at"),
        "rank 1 named as stopped, outside the collective rank 0 waits in: {}",
        job.output()
    );
    // Its stacks, taken by rank 0 (it could not answer), shown as the culprit's.
    assert!(
        culprit_stack_shown(&err, 1),
        "the culprit's stack: {}",
        job.output()
    );
    let theirs: tchrun::job_record::stacks::RankStacks =
        serde_json::from_str(&read(&tchrun::job_record::stacks::path(&logs, 1)))
            .expect("stacks-1.json");
    assert_eq!(
        (theirs.captured_by.as_str(), theirs.state.as_str()),
        ("rank 0", "T")
    );
    // Named functions, unwound or (from JIT-compiled code, which has no unwind information)
    // scanned from its stack.
    let main = theirs.main_thread().expect("its main thread");
    let named = main
        .frames
        .iter()
        .filter(|f| !f.starts_with("0x") && !f.starts_with("--"))
        .count();
    assert!(theirs.threads.len() > 3 && named >= 3, "{theirs:?}");
    // `tchrun logs` shows the same verdict.
    let r = run(tchrun().arg("logs").arg(&logs), Duration::from_secs(30));
    assert!(
        r.stdout.contains("the job hung and was stopped")
            && r.stdout.contains("is stopped (state T"),
        "{}",
        r.explain()
    );
    assert!(!common::processes_with("eu-stack")
        .iter()
        .any(|p| p.contains(&pid.to_string())));
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
    assert!(v.seq.is_some_and(|s| s >= v.culprits[0].seq), "{v:?}");
    // Rank 0's own trace names the bucket it waits in; the capture was within its bound.
    let waits = v.waiting[0]
        .waits_in
        .as_ref()
        .expect("rank 0's trace: the bucket it waits in");
    assert!(waits.completed.is_none() && waits.bytes > 0, "{waits:?}");
    assert_eq!(v.culprits[0].state.as_deref(), Some("T"));
    let capture = v.capture.as_ref().expect("the capture's summary");
    assert_eq!(capture.taken, [0, 1], "{capture:?}");
    assert!(
        capture.took_ms < CAPTURE_BOUND.as_millis() as u64,
        "{capture:?}"
    );
    assert!(v.stacks.iter().any(|g| g.ranks.contains(&1)), "{v:?}");
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
    // Its stack shows the loop it is in (the test hook's busy loop inside the step).
    let culprit = v
        .stacks
        .iter()
        .find(|g| g.ranks == [1])
        .expect("rank 1's stack");
    assert!(
        culprit
            .frames
            .iter()
            .any(|f| f.contains("tchrun_faults::spin_for")),
        "{culprit:?}"
    );
    assert!(
        culprit
            .frames
            .iter()
            .any(|f| f.contains("tchrun_worker::train::trainer")),
        "{culprit:?}"
    );
    assert!(
        r.stderr.contains("tchrun_faults::spin_for"),
        "{}",
        r.explain()
    );
}

#[test]
fn a_rank_stuck_in_its_loader_is_named_in_the_data_wait_with_the_file() {
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
    .env("TCHRUN_TEST_STALL_DECODE", "1:60:100");
    let r = run(&mut c, START_LIMIT);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let line = r.stderr.lines().find(|l| l.contains("hang:")).unwrap_or("");
    eprintln!("{line}");
    assert!(
        line.contains("rank 1 (")
            && line.contains("never entered it: it is in the data wait of step"),
        "{}",
        r.explain()
    );
    assert!(
        line.contains("loader thread data-loader-"),
        "{}",
        r.explain()
    );
    let v = FailureSummary::read(&out.join("logs"))
        .expect("failure.json reads")
        .and_then(|s| s.hang)
        .expect("the typed verdict");
    let c = &v.culprits[0];
    assert_eq!((c.rank, c.phase), (1, Phase::Loading), "{v:?}");
    let work = c.loaders.first().expect("the loader's file");
    assert!(work.file.starts_with(data.join("train")), "{work:?}");
    assert!(line.contains(&work.file.display().to_string()), "{line}");
    // The loader thread's own stack shows it inside the decode.
    let theirs: tchrun::job_record::stacks::RankStacks = serde_json::from_str(&read(
        &tchrun::job_record::stacks::path(&out.join("logs"), 1),
    ))
    .expect("stacks-1.json");
    let loader = theirs
        .threads
        .iter()
        .find(|t| t.name == work.thread)
        .expect("the loader thread");
    assert!(
        loader
            .frames
            .iter()
            .any(|f| f.contains("tchrun_data::loader")),
        "{loader:?}"
    );
}

#[test]
fn tchrun_stacks_shows_every_rank_of_a_running_job_and_the_job_goes_on() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let logs = out.join("logs");
    let mut c = train(&data, &model, &out, "50");
    c.args(["--launcher", "local"]);
    let mut job = Job::start(&mut c, t.path());
    assert!(
        wait_for(START_LIMIT, || [0, 1]
            .iter()
            .all(|r| beat_of(&logs, *r).is_some_and(|b| b.step >= 2))),
        "training never started: {}",
        job.output()
    );
    let r = run(tchrun().arg("stacks").arg(&logs), Duration::from_secs(60));
    assert_eq!(r.code, Some(0), "{}", r.explain());
    eprintln!("{}", r.stdout);
    assert!(
        r.stdout.contains("stacks of 2 rank(s) taken in"),
        "{}",
        r.explain()
    );
    for rank in [0, 1] {
        assert!(
            r.stdout.contains(&format!("rank {rank} (")) && r.stdout.contains("taken by self"),
            "{}",
            r.explain()
        );
        let s: tchrun::job_record::stacks::RankStacks =
            serde_json::from_str(&read(&tchrun::job_record::stacks::path(&logs, rank)))
                .expect("stacks-<rank>.json");
        assert!(s.threads.iter().any(|t| t.name == "heartbeat"), "{s:?}");
        assert!(!s.trace.is_empty(), "{s:?}");
    }
    assert!(r.stdout.contains("tchrun-worker thread"), "{}", r.explain());
    assert!(!logs.join("capture-request.json").exists());
    // The job goes on: steps advance after the capture, and it is still running.
    let step = beat_of(&logs, 0).map_or(0, |b| b.step);
    assert!(
        wait_for(Duration::from_secs(60), || beat_of(&logs, 0)
            .is_some_and(|b| b.step > step + 2)),
        "{}",
        job.output()
    );
    assert_eq!(
        job.wait(Duration::from_millis(10)),
        None,
        "{}",
        job.output()
    );
    // SIGUSR2 to tchrun prints the same on its terminal; the job goes on.
    kill(job.pid(), Signal::SIGUSR2).expect("SIGUSR2 to tchrun");
    assert!(
        wait_for(Duration::from_secs(60), || read(&job.err)
            .contains("stacks of 2 rank(s) taken in")),
        "{}",
        job.output()
    );
    let err = read(&job.err);
    assert!(
        err.contains("rank 1 (") && err.contains("taken by self"),
        "{err}"
    );
    let step = beat_of(&logs, 0).map_or(0, |b| b.step);
    assert!(
        wait_for(Duration::from_secs(60), || beat_of(&logs, 0)
            .is_some_and(|b| b.step > step + 2)),
        "{}",
        job.output()
    );
    assert_eq!(
        job.wait(Duration::from_millis(10)),
        None,
        "{}",
        job.output()
    );
    // A directory without a job is refused with the fix.
    let r = run(
        tchrun().arg("stacks").arg(t.path()),
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("not the log directory of a tchrun job"),
        "{}",
        r.explain()
    );
}

#[test]
fn a_slow_but_progressing_validation_is_not_a_hang() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    // Validation of 7 batches a rank, 1.5 s each (~10 s: dozens of training steps, more than
    // twice --hang-timeout), with no step and no collective until its end.
    let mut c = train(&data, &model, &out, "1");
    c.args(["--launcher", "local", "--hang-timeout", "4"])
        .env("TCHRUN_TEST_SLOW_VALIDATION", "1.5");
    let r = run(&mut c, START_LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stderr.contains("hang"), "{}", r.explain());
    let beats = Heartbeat::read_all(&out.join("logs"));
    assert!(beats.iter().all(|b| b.progress >= 6), "{beats:?}");
}

/// Issue 52: a rank that finished its work and is stuck leaving (the test hook blocks rank 1
/// where it leaves the process group, as one stuck in MPI_Finalize) is not a hang: with
/// `--hang-timeout 5` (which would have called the silence a hang with no culprit) the job
/// exits 0 with its model, after tchrun waited `LEAVE_ALLOWED` (30 s), took the rank's stack
/// and ended it, naming the rank, its host and what it was doing.
#[test]
fn a_rank_stuck_while_leaving_is_ended_and_the_finished_job_exits_0() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let mut c = train(&data, &model, &out, "1");
    c.args(["--launcher", "local", "--hang-timeout", "5"])
        .env("TCHRUN_TEST_STALL_LEAVING", "1");
    let r = run(&mut c, START_LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(out.join("model.json").is_file(), "{}", r.explain());
    assert!(!r.stderr.contains("hang:"), "{}", r.explain());
    let warning = r
        .stderr
        .lines()
        .find(|l| l.contains("every rank finished its work"))
        .unwrap_or_else(|| panic!("no warning:\n{}", r.explain()));
    assert!(
        warning.contains("rank 1 (")
            && warning.contains("was leaving the process group and MPI")
            && warning.contains("allowed 30 s")
            && !warning.contains("rank 0 ("),
        "{warning}"
    );
    // Its stack, taken before it was ended, shows where it was.
    assert!(
        r.stderr.contains("tchrun_worker::rank::start::leave"),
        "{}",
        r.explain()
    );
    // A rank whose work is done is not "stopped at the next step".
    assert!(!r.stderr.contains("stopping all ranks"), "{}", r.explain());
    let summary = FailureSummary::read(&out.join("logs")).expect("failure.json reads");
    assert!(summary.is_none(), "{summary:?}");
    let beats = Heartbeat::read_all(&out.join("logs"));
    let phases: Vec<Phase> = beats.iter().map(|b| b.phase).collect();
    assert_eq!(phases, [Phase::Done, Phase::Leaving], "{beats:?}");
}
