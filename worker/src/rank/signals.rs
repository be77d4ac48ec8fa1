//! Stop requests (SIGTERM from the launcher or `scancel`, SIGINT, SIGUSR1 from Slurm's
//! `--signal`): logged in the driver log; from the first training step to the rank's end, the
//! loop agrees with the other ranks to stop at the next step (and checkpoints), or, after the
//! last step, finishes the model first; before training the rank exits at once. A second
//! signal always exits at once (`_exit`: no destructor runs beside the main thread). The kernel
//! names each signal's sender (`SA_SIGINFO`); the rank logs it, and a stop that its own launcher
//! did not send carries it into the failure record (`sender_note`).
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};

static REQUESTED: AtomicI32 = AtomicI32::new(0);
/// Who sent the first signal (`SA_SIGINFO`'s `si_pid`, `si_uid`), when the kernel said.
static SENDER: std::sync::OnceLock<String> = std::sync::OnceLock::new();
static GRACEFUL: AtomicBool = AtomicBool::new(false);
/// The program `exec` runs as this rank's child (0: none): signals are passed on to it.
static FORWARD: AtomicI32 = AtomicI32::new(0);

/// The signal asked for a stop (0: none).
pub fn requested() -> i32 {
    REQUESTED.load(Ordering::SeqCst)
}

/// While true, a first signal only sets `requested()` (the training loop stops gracefully).
pub fn set_graceful(on: bool) {
    GRACEFUL.store(on, Ordering::SeqCst);
}

/// From now on every stop signal is passed on to `pid` (`exec`'s program), which decides
/// what it does; the rank waits for it.
pub fn forward_to(pid: u32) {
    FORWARD.store(pid as i32, Ordering::SeqCst);
}

/// The exit code for a stop caused by `sig` (130 for SIGINT, 143 otherwise).
pub fn exit_code(sig: i32) -> i32 {
    if sig == signal_hook::consts::SIGINT {
        tchrun::exit::code::INTERRUPTED_INT
    } else {
        tchrun::exit::code::INTERRUPTED_TERM
    }
}

pub fn name(sig: i32) -> &'static str {
    match sig {
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGUSR1 => "SIGUSR1",
        _ => "signal",
    }
}

/// " from pid 4242 (bash, uid 0)" for the rank that received the first signal, when the kernel
/// named its sender (", the rank's parent: its launcher" added when it was the parent); ""
/// otherwise. The failure record's message carries it (`tchrun::job_record::Cause::Signal`).
pub fn sender_note() -> String {
    SENDER
        .get()
        .map(|s| format!(" from {s}"))
        .unwrap_or_default()
}

/// "pid 4242 (bash, uid 0)", from the sender's pid and uid.
fn describe_sender(pid: i32, uid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| "gone".into());
    let parent = nix::unistd::getppid().as_raw() == pid;
    format!(
        "pid {pid} ({comm}, uid {uid}{})",
        if parent {
            ", the rank's parent: its launcher"
        } else {
            ""
        }
    )
}

/// Starts the watcher thread (call once the driver log is open).
pub fn install() -> std::io::Result<()> {
    use signal_hook::consts::{SIGINT, SIGTERM, SIGUSR1};
    use signal_hook::iterator::exfiltrator::WithOrigin;
    let mut signals =
        signal_hook::iterator::SignalsInfo::<WithOrigin>::new([SIGTERM, SIGINT, SIGUSR1])?;
    std::thread::Builder::new().name("signals".into()).spawn(move || {
        for origin in signals.forever() {
            let sig = origin.signal;
            let sender = origin.process.map(|p| describe_sender(p.pid, p.uid));
            let from = sender.as_ref().map(|s| format!(" from {s}")).unwrap_or_default();
            let first = REQUESTED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_ok();
            if let (true, Some(s)) = (first, sender) {
                let _ = SENDER.set(s);
            }
            let program = FORWARD.load(Ordering::SeqCst);
            if program > 0 {
                // Not in the driver log: its last lines stay the program's (the hang report and
                // the failure tail show them), and a stop stays one line on the console.
                tracing::debug!("received {}{from}: passed on to the program (pid {program})", name(sig));
                // SAFETY: `kill` sends a signal to the rank's own child's process group (it
                // leads one: `output::run`), what it started in the background included.
                unsafe { libc::kill(-program, sig) };
                continue;
            }
            if crate::heartbeat::current_phase().finished_work() {
                // The work is done and succeeded (the rank was leaving): nothing to stop
                // cleanly, and no stop to announce; the rank ends as it would have.
                tracing::info!(
                    target: crate::rank::driver_log::LOG_ONLY,
                    "received {}{from} while {}: the rank's work is done; exiting now",
                    name(sig),
                    crate::heartbeat::current_phase().label()
                );
                tracing::info!("{}", tchrun::driver_log::RankExit { code: 0 }.write());
                // SAFETY: as below: `_exit` ends the process at once.
                unsafe { libc::_exit(0) }
            }
            if first && GRACEFUL.load(Ordering::SeqCst) {
                tracing::warn!(
                    "received {}{from} (launcher stop, scancel or preemption): stopping all ranks at the next step",
                    name(sig)
                );
                continue;
            }
            tracing::warn!("received {}{from}: stopping this rank now", name(sig));
            let code = exit_code(if first { sig } else { requested() });
            tracing::info!("{}", tchrun::driver_log::RankExit { code }.write());
            // `_exit`, not `exit`: running libtorch's static destructors while the main thread
            // still runs its operators panics inside libtorch ("Could not find schema ...").
            // The driver log is written unbuffered; nothing else needs flushing.
            // SAFETY: `_exit` ends the process at once; it touches no Rust state.
            unsafe { libc::_exit(code) }
        }
    })?;
    Ok(())
}
