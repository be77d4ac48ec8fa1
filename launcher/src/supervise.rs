//! Supervision: spawns the launch commands (mpirun/srun: one; local: one per rank), each in its
//! own process group and ended if tchrun dies (PDEATHSIG); tees their output to the terminal
//! and `70_mpi_log`; forwards SIGINT/SIGTERM; stops the rest when one fails (local ranks).
//! Every wait is bounded: a grace period, then SIGKILL.
use crate::launch::CommandSpec;
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

/// The end of a supervised run.
#[derive(Debug)]
pub struct Outcome {
    /// The first process that failed on its own (not stopped by us).
    pub first_failure: Option<Exit>,
    /// A signal tchrun received (SIGINT/SIGTERM), if any.
    pub interrupted: Option<i32>,
    /// The last lines the processes printed (for classifying a launch failure).
    pub tail: Vec<String>,
    /// The hang watchdog ended the job.
    pub hung: bool,
}

/// Output sink shared by the tee threads.
struct Sink {
    log: Mutex<File>,
    tail: Mutex<std::collections::VecDeque<String>>,
    /// The terminal shows rank 0's progress as one line rewritten in place (stdout is a TTY);
    /// true while that line is on screen.
    status: Option<Mutex<bool>>,
}

/// Rank 0's progress line ("<host>:0 epoch E/N iter I/M ... eta T").
fn is_progress(line: &str) -> bool {
    use tchrun::driver_log::{split_console_line, Progress};
    split_console_line(line)
        .is_some_and(|(_, rank, rest)| rank == 0 && Progress::parse(rest).is_some())
}

const TAIL_LINES: usize = 200;

impl Sink {
    fn line(&self, line: &str, to_stderr: bool) {
        if let Ok(mut f) = self.log.lock() {
            let _ = writeln!(f, "{line}");
        }
        match (&self.status, to_stderr) {
            (Some(shown), _) => {
                // TTY: progress replaces itself; other lines go above it.
                let mut shown = shown.lock().unwrap_or_else(|e| e.into_inner());
                let mut out = std::io::stdout().lock();
                if !to_stderr && is_progress(line) {
                    let _ = write!(out, "\r\x1b[2K{line}");
                    *shown = true;
                } else {
                    if *shown {
                        let _ = write!(out, "\r\x1b[2K");
                        *shown = false;
                    }
                    let _ = out.flush();
                    if to_stderr {
                        errln!("{line}");
                    } else {
                        let _ = writeln!(out, "{line}");
                    }
                }
                let _ = out.flush();
            }
            (None, true) => errln!("{line}"),
            (None, false) => outln!("{line}"),
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
    /// Ends the job when no rank made progress (see `progress`) for this long.
    pub hang_timeout: Option<Duration>,
    /// When the ranks last showed progress (e.g. newest driver-log write).
    pub progress: Option<Box<dyn Fn() -> Option<SystemTime>>>,
    /// Whether some rank reported that it failed. mpirun/srun normally end the job then; if
    /// they have not within `RANK_FAILED_GRACE` (a node they cannot reach), tchrun stops them.
    pub rank_failed: Option<Box<dyn Fn() -> bool>>,
}

/// How long mpirun/srun get to end the job after a rank reported its failure.
pub const RANK_FAILED_GRACE: Duration = Duration::from_secs(5);

/// Escalation of a stop: SIGTERM to the process groups at `term_at`, SIGKILL at `kill_at`.
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

fn spawn(spec: &CommandSpec) -> std::io::Result<Child> {
    let mut cmd = Command::new(&spec.program);
    cmd.args(&spec.args)
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

/// Runs `specs` to the end. `mpi_log` receives everything they print.
pub fn run(specs: &[CommandSpec], mpi_log: File, settings: &Settings) -> std::io::Result<Outcome> {
    let signal = Arc::new(AtomicUsize::new(0));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register_usize(sig, Arc::clone(&signal), sig as usize)?;
    }
    use std::io::IsTerminal;
    let sink = Arc::new(Sink {
        status: std::io::stdout().is_terminal().then(|| Mutex::new(false)),
        log: Mutex::new(mpi_log),
        tail: Mutex::new(Default::default()),
    });
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut pids: Vec<u32> = Vec::new();
    let mut readers = Vec::new();
    for spec in specs {
        let mut child = match spawn(spec) {
            Ok(c) => c,
            Err(e) => {
                for c in children.iter_mut().flatten() {
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
            let s = Arc::clone(&sink);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    s.line(&line, false);
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let s = Arc::clone(&sink);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    s.line(&line, true);
                }
            }));
        }
        pids.push(child.id());
        children.push(Some(child));
    }

    let mut first_failure: Option<Exit> = None;
    let mut stopping: Option<Stop> = None;
    let mut hung = false;
    let mut last_probe = Instant::now();
    let mut failure_seen: Option<Instant> = None;
    let started = SystemTime::now();
    let mut interrupted: Option<i32> = None;
    let mut seen_signals = 0usize;
    loop {
        // Reap.
        for (i, slot) in children.iter_mut().enumerate() {
            if let Some(child) = slot {
                if let Ok(Some(status)) = child.try_wait() {
                    let e = Exit {
                        index: i,
                        ended: ended(status),
                        at: SystemTime::now(),
                        stopped_by_us: stopping.is_some(),
                    };
                    if !e.ended.ok() && !e.stopped_by_us && first_failure.is_none() {
                        first_failure = Some(e);
                    }
                    *slot = None;
                }
            }
        }
        let running: Vec<&Child> = children.iter().flatten().collect();
        if running.is_empty() {
            break;
        }
        // Signals to tchrun: ask the ranks to stop cleanly, then escalate; a second one kills.
        let sig = signal.swap(0, Ordering::SeqCst);
        if sig != 0 {
            seen_signals += 1;
            interrupted.get_or_insert(sig as i32);
            if seen_signals == 1 {
                for c in &running {
                    if settings.graceful == Signal::SIGTERM {
                        signal_group(c, Signal::SIGTERM);
                    } else {
                        let _ =
                            nix::sys::signal::kill(Pid::from_raw(c.id() as i32), settings.graceful);
                    }
                }
                stopping = Some(Stop::after(settings.grace));
            } else {
                stopping = Some(Stop::now());
            }
        }
        // Fail fast: one failed, stop the others now (no clean stop: the job is lost).
        if settings.fail_fast && first_failure.is_some() && stopping.is_none() {
            stopping = Some(Stop::now());
        }
        // A rank reported failure but the launcher child keeps running: stop it.
        if let (Some(probe), None) = (&settings.rank_failed, &stopping) {
            if last_probe.elapsed() >= Duration::from_secs(1) {
                last_probe = Instant::now();
                if failure_seen.is_none() && probe() {
                    failure_seen = Some(Instant::now());
                }
            }
            if failure_seen.is_some_and(|t| t.elapsed() >= RANK_FAILED_GRACE) {
                // The failure is the ranks', not the launcher child's that we now stop.
                if first_failure.is_none() {
                    first_failure = Some(Exit {
                        index: 0,
                        ended: Ended::Code(tchrun::exit::code::RANK_FAILED),
                        at: SystemTime::now(),
                        stopped_by_us: false,
                    });
                }
                stopping = Some(Stop::now());
            }
        }
        // Hang watchdog.
        if let (Some(limit), Some(probe), None) =
            (settings.hang_timeout, &settings.progress, &stopping)
        {
            let last = probe().unwrap_or(started).max(started);
            if SystemTime::now().duration_since(last).unwrap_or_default() > limit {
                hung = true;
                stopping = Some(Stop::now());
            }
        }
        if let Some(st) = &mut stopping {
            let now = Instant::now();
            if now >= st.term_at && !st.termed {
                st.termed = true;
                for c in &running {
                    signal_group(c, Signal::SIGTERM);
                }
            }
            if now >= st.kill_at {
                for c in &running {
                    signal_group(c, Signal::SIGKILL);
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Reader threads end when the pipes close; anything a grandchild kept open is abandoned
    // after a bound rather than waited for.
    let deadline = Instant::now() + Duration::from_secs(2);
    for r in readers {
        while !r.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if r.is_finished() {
            let _ = r.join();
        }
    }
    if let Some(shown) = &sink.status {
        if shown.lock().map(|s| *s).unwrap_or(false) {
            outln!(); // keep the last progress line, end it
        }
    }
    let tail = sink
        .tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    if let Ok(mut f) = sink.log.lock() {
        let _ = f.flush();
    }
    // Nothing of the job outlives it: whatever a rank left in its process group goes too.
    for pid in &pids {
        let _ = killpg(Pid::from_raw(*pid as i32), Signal::SIGKILL);
    }
    Ok(Outcome {
        first_failure,
        interrupted,
        tail,
        hung,
    })
}
