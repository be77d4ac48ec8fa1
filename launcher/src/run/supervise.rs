//! Supervision: spawns the launch commands (mpirun/srun: one; local: one per rank), each in its
//! own process group and ended if tchrun dies (PDEATHSIG); tees their output to the terminal
//! (`console.rs`) and `70_mpi_log`; forwards SIGINT/SIGTERM; stops the rest when one fails
//! (local ranks).
//! Every wait is bounded: a grace period, then SIGKILL.
use super::console::Console;
use crate::plan::launch::CommandSpec;
use nix::sys::signal::{killpg, Signal};
use nix::unistd::Pid;
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

/// How one supervised process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    Code(i32),
    Signal(i32),
}

impl Ended {
    pub fn ok(self) -> bool {
        self == Ended::Code(0)
    }
    /// The shell's convention: a signal becomes 128 + its number.
    pub fn as_code(self) -> i32 {
        match self {
            Ended::Code(c) => c,
            Ended::Signal(s) => 128 + s,
        }
    }
}

/// One process's end, with when it happened.
#[derive(Debug, Clone)]
pub struct Exit {
    pub index: usize,
    pub ended: Ended,
    pub at: SystemTime,
    /// Whether the supervisor had already asked it to stop.
    pub stopped_by_us: bool,
}

/// How a supervised run ended. One variant per ending, so that a run cannot be both
/// interrupted and hung, or report a failure it does not hold.
#[derive(Debug, Clone)]
pub enum Ending {
    /// Every process exited 0.
    Succeeded,
    /// A process failed on its own (not stopped by us); the first one.
    Failed(Exit),
    /// tchrun received SIGINT or SIGTERM (the first one's number) and stopped the job.
    Interrupted(i32),
    /// The hang watch stopped the job.
    Hung,
}

/// The end of a supervised run.
#[derive(Debug)]
pub struct Outcome {
    pub ending: Ending,
    /// The last lines the processes printed (for classifying a launch failure).
    pub tail: Vec<String>,
}

impl Outcome {
    pub fn succeeded(&self) -> bool {
        matches!(self.ending, Ending::Succeeded)
    }
}

const TAIL_LINES: usize = 200;

/// The tee shared by the reader threads: every line to `70_mpi_log`, the last ones kept for
/// the outcome, and the line to the console.
struct Tee {
    log: Mutex<File>,
    tail: Mutex<std::collections::VecDeque<String>>,
    console: Console,
    /// Set when the user asked the job to stop: from then on mpirun's own messages and the
    /// ranks' "stopped by signal" errors go to `70_mpi_log` only (a clean stop is not a crash).
    quiet: std::sync::atomic::AtomicBool,
}

/// What a stop makes every launcher and rank print: not for the console once the user asked
/// for it (rank 0 says where its checkpoint is; tchrun says how the job ended).
fn is_stop_noise(line: &str) -> bool {
    // The ranks' own stop errors, also when mpirun interleaves two ranks' writes on one line
    // ("vm:0 vm:1 tchrun-worker: error: stopped by signal 10 ..."), and their warnings that
    // the signal came ("vm:1 warning: received SIGUSR1 from ...").
    line.contains("tchrun-worker: error: stopped by signal")
        || line.contains(" warning: received SIG")
        // mpirun's and orted's own words ("Forwarding signal 10 to job", "Primary job
        // terminated normally, but 1 process returned a non-zero exit code", rules of dashes).
        || tchrun::driver_log::split_console_line(line).is_none()
}

impl Tee {
    fn line(&self, line: &str, to_stderr: bool) {
        if let Ok(mut f) = self.log.lock() {
            let _ = writeln!(f, "{line}");
        }
        if !(self.quiet.load(Ordering::SeqCst) && is_stop_noise(line)) {
            self.console.line(line, to_stderr);
        }
        if let Ok(mut t) = self.tail.lock() {
            if t.len() == TAIL_LINES {
                t.pop_front();
            }
            t.push_back(line.to_string());
        }
    }
}

/// Settings of one supervised run.
pub struct Settings {
    /// Stop everything when one process fails (local ranks); mpirun/srun do it themselves.
    pub fail_fast: bool,
    /// After Ctrl-C/SIGTERM: time the ranks get to stop cleanly (checkpoint) before SIGTERM
    /// to their process groups, then SIGKILL.
    pub grace: Duration,
    /// The signal that asks the ranks to stop cleanly: SIGTERM for local ranks, SIGUSR1 for
    /// mpirun/srun (which forward it; their own SIGTERM handling kills at once).
    pub graceful: Signal,
    /// The hang watch (`hang.rs`): true ends the job as hung.
    pub hung: Option<Box<dyn Fn() -> bool>>,
    /// SIGUSR2 to tchrun: every rank's stacks, printed (`capture.rs`); the job goes on.
    pub stacks: Option<Box<dyn Fn()>>,
    /// Whether some rank reported that it failed. mpirun/srun normally end the job then; if
    /// they have not within `RANK_FAILED_GRACE` (a node they cannot reach), tchrun stops them.
    pub rank_failed: Option<Box<dyn Fn() -> bool>>,
    /// Variables set on every process spawned (the attempt's `RankEnv`), on top of tchrun's
    /// own environment and under each command's own.
    pub env: Vec<(String, String)>,
    /// The ranks whose lines reach the terminal (`--console`) and how many ranks there are:
    /// how many of a line the console waits for before it folds them (`console.rs`).
    pub console: (tchrun::console::Selection, usize),
}

/// How long mpirun/srun get to end the job after a rank reported its failure.
pub const RANK_FAILED_GRACE: Duration = Duration::from_secs(5);

/// Escalation of a stop: SIGTERM to the process groups at `term_at`, SIGKILL at `kill_at`.
#[derive(Debug)]
struct Stop {
    term_at: Instant,
    kill_at: Instant,
    termed: bool,
}

impl Stop {
    /// After a clean-stop request: wait `grace`, then SIGTERM, then SIGKILL 2 s later.
    fn after(grace: Duration) -> Stop {
        let t = Instant::now() + grace;
        Stop {
            term_at: t,
            kill_at: t + Duration::from_secs(2),
            termed: false,
        }
    }
    /// Stop now: SIGTERM, SIGKILL 1 s later.
    fn now() -> Stop {
        let t = Instant::now();
        Stop {
            term_at: t,
            kill_at: t + Duration::from_secs(1),
            termed: false,
        }
    }
}

/// Why the supervisor is stopping the job.
#[derive(Debug)]
enum Reason {
    /// SIGINT/SIGTERM to tchrun (the first one's number).
    Interrupted(i32),
    /// A process failed on its own (fail-fast), or a rank reported its failure and the
    /// launcher child did not end the job within `RANK_FAILED_GRACE`.
    Failed(Exit),
    /// The hang watch found the job hung.
    Hung,
}

/// The supervisor's state: running (perhaps with a failure mpirun/srun are ending the job
/// for), or stopping every process for one reason with a bounded escalation.
#[derive(Debug)]
enum Phase {
    Running {
        /// The first process that failed on its own.
        failed: Option<Exit>,
        /// When a rank's driver log first said it failed.
        reported: Option<Instant>,
    },
    Stopping {
        reason: Reason,
        stop: Stop,
    },
}

impl Phase {
    fn is_running(&self) -> bool {
        matches!(self, Phase::Running { .. })
    }

    fn is_stopping(&self) -> bool {
        !self.is_running()
    }

    /// A process ended: the first failure that was not our doing is kept.
    fn exited(&mut self, e: Exit) {
        if let Phase::Running { failed, .. } = self {
            if !e.ended.ok() && !e.stopped_by_us && failed.is_none() {
                *failed = Some(e);
            }
        }
    }

    /// A signal to tchrun. The first asks the ranks to stop cleanly (true: send them the
    /// graceful signal) and escalates after `grace`; another stops everything now.
    fn signal(&mut self, sig: i32, grace: Duration) -> bool {
        match self {
            Phase::Running { .. } => {
                *self = Phase::Stopping {
                    reason: Reason::Interrupted(sig),
                    stop: Stop::after(grace),
                };
                true
            }
            Phase::Stopping { reason, stop } => {
                if !matches!(reason, Reason::Interrupted(_)) {
                    *reason = Reason::Interrupted(sig);
                }
                *stop = Stop::now();
                false
            }
        }
    }

    /// Local ranks: one failed, so the job is lost; stop the others now.
    fn fail_fast(&mut self) {
        if let Phase::Running {
            failed: Some(e), ..
        } = self
        {
            let e = e.clone();
            *self = Phase::Stopping {
                reason: Reason::Failed(e),
                stop: Stop::now(),
            };
        }
    }

    fn rank_reported(&mut self) {
        if let Phase::Running { reported, .. } = self {
            reported.get_or_insert_with(Instant::now);
        }
    }

    /// A rank reported its failure `RANK_FAILED_GRACE` ago and the launcher child still runs:
    /// stop it. The failure is the ranks', not that of the child we now stop.
    fn reported_timeout(&mut self) {
        if let Phase::Running {
            failed,
            reported: Some(t),
        } = self
        {
            if t.elapsed() >= RANK_FAILED_GRACE {
                let e = failed.clone().unwrap_or(Exit {
                    index: 0,
                    ended: Ended::Code(tchrun::exit::code::RANK_FAILED),
                    at: SystemTime::now(),
                    stopped_by_us: false,
                });
                *self = Phase::Stopping {
                    reason: Reason::Failed(e),
                    stop: Stop::now(),
                };
            }
        }
    }

    fn hang(&mut self) {
        if self.is_running() {
            *self = Phase::Stopping {
                reason: Reason::Hung,
                stop: Stop::now(),
            };
        }
    }

    /// What the run came to once every process is gone.
    fn ending(self) -> Ending {
        match self {
            Phase::Running { failed: None, .. } => Ending::Succeeded,
            Phase::Running {
                failed: Some(e), ..
            }
            | Phase::Stopping {
                reason: Reason::Failed(e),
                ..
            } => Ending::Failed(e),
            Phase::Stopping {
                reason: Reason::Interrupted(sig),
                ..
            } => Ending::Interrupted(sig),
            Phase::Stopping {
                reason: Reason::Hung,
                ..
            } => Ending::Hung,
        }
    }
}

fn spawn(spec: &CommandSpec, env: &[(String, String)]) -> std::io::Result<Child> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
        .envs(env.iter().cloned())
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.process_group(0);
    // SAFETY: only async-signal-safe calls (prctl) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(Signal::SIGTERM).map_err(std::io::Error::from)?;
            Ok(())
        });
    }
    cmd.spawn()
}

fn ended(status: std::process::ExitStatus) -> Ended {
    match (status.code(), status.signal()) {
        (Some(c), _) => Ended::Code(c),
        (None, Some(s)) => Ended::Signal(s),
        (None, None) => Ended::Code(1),
    }
}

fn signal_group(child: &Child, sig: Signal) {
    let _ = killpg(Pid::from_raw(child.id() as i32), sig);
}

/// The processes of a run, their pipes' reader threads, and the tee they write to.
struct Spawned {
    children: Vec<Option<Child>>,
    /// Every process group started (each child leads its own).
    pids: Vec<u32>,
    readers: Vec<std::thread::JoinHandle<()>>,
}

/// Starts every command, each pipe read by a thread into `sink`. If one cannot start, those
/// already started are killed.
fn spawn_all(
    specs: &[CommandSpec],
    env: &[(String, String)],
    sink: &Arc<Tee>,
) -> std::io::Result<Spawned> {
    let mut spawned = Spawned {
        children: Vec::new(),
        pids: Vec::new(),
        readers: Vec::new(),
    };
    for spec in specs {
        let mut child = match spawn(spec, env) {
            Ok(c) => c,
            Err(e) => {
                for c in spawned.children.iter_mut().flatten() {
                    signal_group(c, Signal::SIGKILL);
                    let _ = c.wait();
                }
                return Err(std::io::Error::new(
                    e.kind(),
                    format!("cannot start {}: {e}", spec.program),
                ));
            }
        };
        if let Some(out) = child.stdout.take() {
            let s = Arc::clone(sink);
            spawned.readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    s.line(&line, false);
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let s = Arc::clone(sink);
            spawned.readers.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    s.line(&line, true);
                }
            }));
        }
        spawned.pids.push(child.id());
        spawned.children.push(Some(child));
    }
    Ok(spawned)
}

/// Runs `specs` to the end. `mpi_log` receives everything they print.
pub fn run(specs: &[CommandSpec], mpi_log: File, settings: &Settings) -> std::io::Result<Outcome> {
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)?;
    }
    let usr2 = Arc::new(std::sync::atomic::AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGUSR2, Arc::clone(&usr2))?;
    let (selection, world_size) = &settings.console;
    let console = Console::new(selection, *world_size);
    let sink = Arc::new(Tee {
        log: Mutex::new(mpi_log),
        tail: Mutex::new(Default::default()),
        console,
        quiet: std::sync::atomic::AtomicBool::new(false),
    });
    let mut spawned = spawn_all(specs, &settings.env, &sink)?;
    let phase = watch(&mut spawned.children, (&signal, &usr2), settings, &sink);
    // Reader threads end when the pipes close; anything a grandchild kept open is abandoned
    // after a bound rather than waited for.
    let deadline = Instant::now() + Duration::from_secs(2);
    for r in spawned.readers {
        while !r.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if r.is_finished() {
            let _ = r.join();
        }
    }
    sink.console.finish();
    let tail = sink
        .tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    if let Ok(mut f) = sink.log.lock() {
        let _ = f.flush();
    }
    // Nothing of the job outlives it: whatever a rank left in its process group goes too.
    for pid in &spawned.pids {
        let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    Ok(Outcome {
        ending: phase.ending(),
        tail,
    })
}

/// Watches the processes until every one has ended: reaps them, forwards tchrun's signals,
/// fails fast, stops a job whose rank reported a failure or that hangs, escalates a stop.
fn watch(
    children: &mut [Option<Child>],
    (signal, usr2): (&AtomicUsize, &std::sync::atomic::AtomicBool),
    settings: &Settings,
    sink: &Tee,
) -> Phase {
    let mut phase = Phase::Running {
        failed: None,
        reported: None,
    };
    let mut last_probe = Instant::now();
    loop {
        // Reap.
        for (i, slot) in children.iter_mut().enumerate() {
            if let Some(child) = slot {
                if let Ok(Some(status)) = child.try_wait() {
                    phase.exited(Exit {
                        index: i,
                        ended: ended(status),
                        at: SystemTime::now(),
                        stopped_by_us: phase.is_stopping(),
                    });
                    *slot = None;
                }
            }
        }
        let running: Vec<&Child> = children.iter().flatten().collect();
        if running.is_empty() {
            return phase;
        }
        // Signals to tchrun: ask the ranks to stop cleanly, then escalate; a second one kills.
        let sig = signal.swap(0, Ordering::SeqCst);
        if sig != 0 && phase.signal(sig as i32, settings.grace) {
            sink.quiet.store(true, Ordering::SeqCst);
            for c in &running {
                if settings.graceful == Signal::SIGTERM {
                    signal_group(c, Signal::SIGTERM);
                } else {
                    let _ = nix::sys::signal::kill(Pid::from_raw(c.id() as i32), settings.graceful);
                }
            }
        }
        // SIGUSR2: the ranks' stacks, while the job goes on.
        let asked = usr2.swap(false, Ordering::SeqCst) && phase.is_running();
        if let Some(stacks) = settings.stacks.as_ref().filter(|_| asked) {
            stacks();
        }
        // Fail fast: one failed, stop the others now (no clean stop: the job is lost).
        if settings.fail_fast {
            phase.fail_fast();
        }
        // A rank reported failure but the launcher child keeps running: stop it.
        if let Some(probe) = &settings.rank_failed {
            if phase.is_running() && last_probe.elapsed() >= Duration::from_secs(1) {
                last_probe = Instant::now();
                if probe() {
                    phase.rank_reported();
                }
            }
            phase.reported_timeout();
        }
        // The hang watch.
        if let (Some(hung), true) = (&settings.hung, phase.is_running()) {
            if hung() {
                phase.hang();
            }
        }
        if let Phase::Stopping { stop, .. } = &mut phase {
            let now = Instant::now();
            if now >= stop.term_at && !stop.termed {
                stop.termed = true;
                for c in &running {
                    signal_group(c, Signal::SIGTERM);
                }
            }
            if now >= stop.kill_at {
                for c in &running {
                    signal_group(c, Signal::SIGKILL);
                }
            }
        }
        // Lines that waited long enough for their like from other ranks.
        sink.console.tick();
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(index: usize, code: i32) -> Exit {
        Exit {
            index,
            ended: Ended::Code(code),
            at: SystemTime::now(),
            stopped_by_us: false,
        }
    }

    fn running() -> Phase {
        Phase::Running {
            failed: None,
            reported: None,
        }
    }

    #[test]
    fn clean_exits_succeed_and_the_first_failure_is_kept() {
        let mut p = running();
        p.exited(exit(0, 0));
        assert!(p.is_running());
        p.exited(exit(2, 4));
        p.exited(exit(1, 3));
        match p.ending() {
            Ending::Failed(e) => assert_eq!((e.index, e.ended), (2, Ended::Code(4))),
            e => panic!("{e:?}"),
        }
        let mut p = running();
        p.exited(exit(0, 0));
        assert!(matches!(p.ending(), Ending::Succeeded));
    }

    #[test]
    fn fail_fast_stops_and_later_exits_are_ours() {
        let mut p = running();
        p.fail_fast();
        assert!(p.is_running(), "nothing failed yet");
        p.exited(exit(1, 4));
        p.fail_fast();
        assert!(p.is_stopping());
        let mut stopped = exit(0, 143);
        stopped.stopped_by_us = p.is_stopping();
        p.exited(stopped);
        match p.ending() {
            Ending::Failed(e) => assert_eq!(e.index, 1),
            e => panic!("{e:?}"),
        }
    }

    #[test]
    fn a_stop_keeps_mpiruns_words_and_the_ranks_stop_errors_off_the_console() {
        assert!(is_stop_noise("mpirun: Forwarding signal 10 to job"));
        assert!(is_stop_noise(
            "Primary job  terminated normally, but 1 process returned"
        ));
        assert!(is_stop_noise(
            "vm:1 tchrun-worker: error: stopped by signal 10; a checkpoint was written: continue with --resume"
        ));
        assert!(!is_stop_noise(
            "vm:0 stopped at epoch 2 batch 3 (step 11); checkpoint written to /o/checkpoints; continue with --resume"
        ));
        assert!(!is_stop_noise("vm:0 epoch 2/2 iter 3/10 loss 1.2"));
        assert!(is_stop_noise(
            "vm:1 warning: received SIGUSR1 from pid 7 (mpirun) (launcher stop, scancel or preemption): stopping all ranks at the next step"
        ));
        assert!(!is_stop_noise(
            "vm:1 warning: step 3: no images on any rank"
        ));
        assert!(is_stop_noise(
            "vm:0 vm:1 tchrun-worker: error: stopped by signal 10; a checkpoint was written"
        ));
    }

    #[test]
    fn a_signal_stops_gracefully_and_a_second_one_at_once() {
        let grace = Duration::from_secs(30);
        let mut p = running();
        assert!(
            p.signal(2, grace),
            "the first signal asks the ranks to stop"
        );
        match &p {
            Phase::Stopping { stop, .. } => assert!(stop.term_at > Instant::now()),
            p => panic!("{p:?}"),
        }
        assert!(!p.signal(15, grace), "the second one does not ask again");
        match &p {
            Phase::Stopping { stop, reason } => {
                assert!(stop.term_at <= Instant::now());
                assert!(
                    matches!(reason, Reason::Interrupted(2)),
                    "the first signal counts"
                );
            }
            p => panic!("{p:?}"),
        }
        p.hang();
        assert!(matches!(p.ending(), Ending::Interrupted(2)));
    }

    #[test]
    fn hang_and_reported_failures_stop_a_running_job_only() {
        let mut p = running();
        p.hang();
        assert!(matches!(p.ending(), Ending::Hung));
        let mut p = running();
        p.rank_reported();
        p.reported_timeout();
        assert!(
            p.is_running(),
            "mpirun gets RANK_FAILED_GRACE to end the job itself"
        );
        if let Phase::Running { reported, .. } = &mut p {
            *reported = Some(Instant::now() - RANK_FAILED_GRACE);
        }
        p.reported_timeout();
        match p.ending() {
            Ending::Failed(e) => {
                assert_eq!(e.ended, Ended::Code(tchrun::exit::code::RANK_FAILED))
            }
            e => panic!("{e:?}"),
        }
    }
}
