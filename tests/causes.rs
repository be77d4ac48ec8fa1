//! Issue 28: a rank that dies is classified, with the fix. A rank in a memory cgroup that
//! outgrows its limit is killed by the kernel's OOM killer: `failure.json`'s `cause` says so
//! with the rank's memory and the limit, and the summary (the launcher's and `tchrun logs`')
//! gives the advice. A rank killed by someone else's SIGKILL is "a signal sent by another
//! process", not the OOM killer. Real processes, CPU, Gloo.
mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tchrun::job_record::heartbeat::Heartbeat;
use tchrun::job_record::{Cause, FailureSummary, Record};
use tchrun::memory::{Cgroup, CgroupVersion};

/// Time a job gets to start, fail and be concluded (a loaded 2-core machine).
const LIMIT: Duration = Duration::from_secs(300);
/// The memory cgroup's limit: 2 ranks of resnet18 at 32 px train in about 1 GiB together.
const CGROUP_LIMIT_MIB: u64 = 2560;
/// What rank 1 allocates: more than the whole limit, so that it is the one the kernel kills.
const ALLOCATE_MIB: u64 = 4096;

/// A memory cgroup made under the test's own, removed when dropped (its processes killed
/// first).
struct TestCgroup {
    dir: PathBuf,
}

/// A number for each cgroup this process makes.
fn next_id() -> usize {
    static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
}

impl TestCgroup {
    /// A child of this process's memory cgroup with `limit_mib` and no swap; `Err(why)` when it
    /// cannot be made (no privilege, no memory controller).
    fn create(limit_mib: u64) -> Result<TestCgroup, String> {
        let own = Cgroup::of_self().ok_or("no memory cgroup in /proc/self/cgroup")?;
        let dir = own.dir().join(format!(
            "tchrun-causes-{}-{}",
            std::process::id(),
            next_id()
        ));
        std::fs::create_dir(&dir).map_err(|e| format!("mkdir {}: {e}", dir.display()))?;
        let cg = TestCgroup { dir };
        let bytes = (limit_mib << 20).to_string();
        let (limit_file, swap) = match own.version {
            CgroupVersion::V1 => ("memory.limit_in_bytes", ("memory.swappiness", "0")),
            CgroupVersion::V2 => ("memory.max", ("memory.swap.max", "0")),
        };
        std::fs::write(cg.dir.join(limit_file), &bytes)
            .map_err(|e| format!("{}/{limit_file}: {e}", cg.dir.display()))?;
        // No swap to escape to (absent files: a kernel without swap accounting).
        let _ = std::fs::write(cg.dir.join(swap.0), swap.1);
        Ok(cg)
    }

    fn procs(&self) -> PathBuf {
        self.dir.join("cgroup.procs")
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            let pids = std::fs::read_to_string(self.procs()).unwrap_or_default();
            for p in pids
                .split_whitespace()
                .filter_map(|p| p.parse::<i32>().ok())
            {
                let _ = kill(Pid::from_raw(p), Signal::SIGKILL);
            }
            if std::fs::remove_dir(&self.dir).is_ok() || !self.dir.exists() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        eprintln!("could not remove the cgroup {}", self.dir.display());
    }
}

/// `cmd`'s process (and so its ranks) starts inside `cg`: it writes its own pid into
/// `cgroup.procs` between fork and exec (no allocation there: the path is made before).
fn start_inside(cmd: &mut std::process::Command, cg: &TestCgroup) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::process::CommandExt;
    let path = std::ffi::CString::new(cg.procs().as_os_str().as_bytes()).expect("path");
    // SAFETY: the closure only calls async-signal-safe functions (open, getpid, write, close)
    // on memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = nix::libc::open(path.as_ptr(), nix::libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut buf = [0u8; 24];
            let mut n = nix::libc::getpid() as u64;
            let mut i = buf.len();
            loop {
                i -= 1;
                buf[i] = b'0' + (n % 10) as u8;
                n /= 10;
                if n == 0 {
                    break;
                }
            }
            let len = buf.len() - i;
            let written = nix::libc::write(fd, buf[i..].as_ptr().cast(), len);
            nix::libc::close(fd);
            if written != len as isize {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

fn train(data: &Path, model: &Path, out: &Path) -> std::process::Command {
    train_with(data, model, out, "local")
}

fn train_with(data: &Path, model: &Path, out: &Path, launcher: &str) -> std::process::Command {
    let mut c = tchrun_train(model, &data.join("train"), &data.join("valid"), out);
    c.args([
        "--launcher",
        launcher,
        "--procs-per-node",
        "2",
        "--epochs",
        "3",
        "--batch-size",
        "8",
        "--print-freq",
        "1",
        "--timeout",
        "60",
    ]);
    c
}

fn summary_of(logs: &Path, r: &str) -> FailureSummary {
    FailureSummary::read(logs)
        .unwrap_or_else(|e| panic!("failure.json reads: {e}\n{r}"))
        .unwrap_or_else(|| panic!("failure.json is there\n{r}"))
}

fn logs_command(logs: &Path) -> String {
    let r = run(tchrun().arg("logs").arg(logs), Duration::from_secs(30));
    assert_eq!(r.code, Some(0), "{}", r.explain());
    r.stdout
}

#[test]
fn a_rank_over_its_cgroup_memory_limit_is_classified_as_oom_killed_with_its_memory() {
    oom_killed_under("local");
}

/// The same under mpirun (whose own words give the signal, as exit code 137). Ignored: in 2 of
/// 6 runs, while another test suite loaded the machine, mpirun or tchrun itself was SIGKILLed
/// by something else (no OOM kill in the kernel log) before rank 1 was; run it with
/// `--ignored`.
#[test]
#[ignore = "flaky under load (see its note); run with --ignored"]
fn a_rank_over_its_cgroup_memory_limit_under_mpirun_is_classified_as_oom_killed() {
    oom_killed_under("mpirun");
}

fn oom_killed_under(launcher: &str) {
    let cg = match TestCgroup::create(CGROUP_LIMIT_MIB) {
        Ok(cg) => cg,
        Err(why) => return skip_or_fail(&format!("cannot make a memory cgroup: {why}")),
    };
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join(format!("out-{launcher}"));
    oom_killed(&cg, &data, &model, &out, launcher);
}

fn oom_killed(cg: &TestCgroup, data: &Path, model: &Path, out: &Path, launcher: &str) {
    let logs = out.join("logs");
    let mut c = train_with(data, model, out, launcher);
    c.env(
        "TCHRUN_TEST_ALLOCATE_AT_STEP",
        format!("1:2:{ALLOCATE_MIB}"),
    );
    start_inside(&mut c, cg);
    let r = run(&mut c, LIMIT);
    let explain = r.explain();
    assert_eq!(r.code, Some(4), "{launcher}: {explain}");
    let s = summary_of(&logs, &explain);
    eprintln!("{launcher}: failure.json cause: {:?}", s.cause);
    assert_eq!(s.rank, Some(1), "{launcher}: {s:?}\n{explain}");
    assert!(
        s.signal == Some(9) || s.exit_code == Some(128 + 9),
        "{launcher}: {s:?}"
    );
    let Some(Cause::OomKiller {
        rss_mib,
        limit_mib,
        limit_of,
        evidence,
    }) = &s.cause
    else {
        panic!("the cause is the OOM killer: {:?}\n{explain}", s.cause)
    };
    let rss = rss_mib.expect("the rank's memory");
    assert!(
        rss > 1024 && rss <= CGROUP_LIMIT_MIB + 64,
        "rank 1 had more than 1 GiB, within the limit: {rss} MiB"
    );
    assert_eq!(*limit_mib, Some(CGROUP_LIMIT_MIB), "{s:?}");
    let cg_name = cg
        .dir
        .file_name()
        .expect("name")
        .to_string_lossy()
        .to_string();
    assert!(
        limit_of.as_deref().is_some_and(|l| l.contains(&cg_name)),
        "the limit is the test cgroup's: {limit_of:?}"
    );
    // The cgroup's own count says so on either version; the kernel log when it is readable.
    assert!(
        evidence
            .iter()
            .any(|e| e.contains("OOM kill(s) since the rank started")),
        "{evidence:?}"
    );
    if tchrun_launcher::kernel_log::read_after(None).is_ok() {
        assert!(
            evidence
                .iter()
                .any(|e| e.contains("kernel log: ") && e.contains("Killed process")),
            "{evidence:?}"
        );
    }
    for text in [&r.stderr, &logs_command(&logs)] {
        assert!(
            text.contains("why: killed by the kernel's OOM killer: the rank had")
                && text.contains(&format!("of {CGROUP_LIMIT_MIB} MiB"))
                && text.contains("fix: lower --batch-size"),
            "the summary names the class, the memory and the advice:\n{text}"
        );
    }
}

/// Starts the job and sends `sig` to rank 1 once it trained a step; returns the job and its
/// log directory.
fn signal_rank_1(t: &Path, sig: Signal) -> (Job, PathBuf) {
    let data = small_digits();
    let model = model_dir(t, "resnet18", 32);
    let out = t.join("out");
    let logs = out.join("logs");
    let job = Job::start(&mut train(&data, &model, &out), t);
    let mut pid = None;
    let found = wait_for(LIMIT, || {
        let b = Heartbeat::read_all(&logs).into_iter().find(|b| b.rank == 1);
        pid = b.as_ref().map(|b| b.pid);
        b.is_some_and(|b| b.step >= 1)
    });
    assert!(found, "rank 1 never trained: {}", job.output());
    let pid = Pid::from_raw(pid.expect("checked") as i32);
    kill(pid, sig).expect("signal to rank 1");
    (job, logs)
}

#[test]
fn a_rank_killed_by_someone_else_is_a_signal_not_the_oom_killer() {
    let t = tempdir();
    let (mut job, logs) = signal_rank_1(t.path(), Signal::SIGKILL);
    assert_eq!(
        job.wait(Duration::from_secs(60)),
        Some(4),
        "{}",
        job.output()
    );
    let s = summary_of(&logs, &job.output());
    assert_eq!(s.rank, Some(1), "{s:?}");
    assert_eq!(
        s.cause,
        Some(Cause::Signal {
            signal: 9,
            sender: None
        }),
        "{}",
        job.output()
    );
    let err = read(&job.err);
    assert!(
        err.contains("why: a signal sent by another process: signal 9")
            && err.contains("fix: find who ended the rank"),
        "{err}"
    );
    assert!(logs_command(&logs).contains("why: a signal sent by another process"));
}

/// A SIGTERM to one rank (not through tchrun) stops the job gracefully; the rank learned its
/// sender from the kernel (`SA_SIGINFO`): this test's pid.
#[test]
fn a_rank_stopped_by_someone_elses_sigterm_names_the_sender() {
    let t = tempdir();
    let (mut job, logs) = signal_rank_1(t.path(), Signal::SIGTERM);
    assert_eq!(
        job.wait(Duration::from_secs(60)),
        Some(4),
        "{}",
        job.output()
    );
    let s = summary_of(&logs, &job.output());
    assert_eq!(s.rank, Some(1), "{s:?}");
    let me = format!("pid {} (", std::process::id());
    match &s.cause {
        Some(Cause::Signal {
            signal: 15,
            sender: Some(sender),
        }) => assert!(sender.starts_with(&me), "{sender}"),
        other => panic!(
            "a SIGTERM from this test's pid: {other:?}\n{}",
            job.output()
        ),
    }
    let err = read(&job.err);
    assert!(
        err.contains(&format!(
            "why: a signal sent by another process: signal 15 from {me}"
        )),
        "{err}"
    );
}
