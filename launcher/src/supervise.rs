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
    pub exits: Vec<Exit>,
    /// The first process that failed on its own (not stopped by us).
    pub first_failure: Option<Exit>,
    /// A signal tchrun received (SIGINT/SIGTERM), if any.
    pub interrupted: Option<i32>,
    /// The last lines the processes printed (for classifying a launch failure).
    pub tail: Vec<String>,
}

/// Output sink shared by the tee threads.
struct Sink {
    log: Mutex<File>,
    tail: Mutex<std::collections::VecDeque<String>>,
}

const TAIL_LINES: usize = 200;

impl Sink {
    fn line(&self, line: &str, to_stderr: bool, prefix: &str) {
        if let Ok(mut f) = self.log.lock() {
            let _ = writeln!(f, "{prefix}{line}");
        }
        if to_stderr {
            eprintln!("{prefix}{line}");
        } else {
            println!("{prefix}{line}");
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
    /// Time between SIGTERM and SIGKILL when stopping.
    pub grace: Duration,
    /// Prefix of each process's output lines on the terminal (e.g. "host:rank ").
    pub prefixes: Vec<String>,
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
    let sink = Arc::new(Sink {
        log: Mutex::new(mpi_log),
        tail: Mutex::new(Default::default()),
    });
    let mut children: Vec<Option<Child>> = Vec::new();
    let mut readers = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
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
        let prefix = settings.prefixes.get(i).cloned().unwrap_or_default();
        if let Some(out) = child.stdout.take() {
            let (s, p) = (Arc::clone(&sink), prefix.clone());
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    s.line(&line, false, &p);
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let (s, p) = (Arc::clone(&sink), prefix);
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(Result::ok) {
                    s.line(&line, true, &p);
                }
            }));
        }
        children.push(Some(child));
    }

    let mut exits: Vec<Exit> = Vec::new();
    let mut first_failure: Option<Exit> = None;
    let mut stop_deadline: Option<Instant> = None;
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
                        stopped_by_us: stop_deadline.is_some(),
                    };
                    if !e.ended.ok() && !e.stopped_by_us && first_failure.is_none() {
                        first_failure = Some(e.clone());
                    }
                    exits.push(e);
                    *slot = None;
                }
            }
        }
        let running: Vec<&Child> = children.iter().flatten().collect();
        if running.is_empty() {
            break;
        }
        // Signals to tchrun: forward, then escalate; a second one kills at once.
        let sig = signal.swap(0, Ordering::SeqCst);
        if sig != 0 {
            seen_signals += 1;
            interrupted.get_or_insert(sig as i32);
            if seen_signals == 1 {
                for c in &running {
                    signal_group(c, Signal::SIGTERM);
                }
                stop_deadline = Some(Instant::now() + settings.grace);
            } else {
                for c in &running {
                    signal_group(c, Signal::SIGKILL);
                }
            }
        }
        // Fail fast: one failed, stop the others.
        if settings.fail_fast && first_failure.is_some() && stop_deadline.is_none() {
            for c in &running {
                signal_group(c, Signal::SIGTERM);
            }
            stop_deadline = Some(Instant::now() + settings.grace);
        }
        if let Some(d) = stop_deadline {
            if Instant::now() >= d {
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
    let tail = sink
        .tail
        .lock()
        .map(|t| t.iter().cloned().collect())
        .unwrap_or_default();
    if let Ok(mut f) = sink.log.lock() {
        let _ = f.flush();
    }
    Ok(Outcome {
        exits,
        first_failure,
        interrupted,
        tail,
    })
}
