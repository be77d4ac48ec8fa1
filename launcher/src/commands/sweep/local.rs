//! The local (or in-allocation) form of a sweep: its runs in turn, each a `tchrun train` of
//! its own (this binary, so the run is exactly what `tchrun train` with those flags does: its
//! `--launcher`, pre-flight, restarts and reports). A run in its own process group: a Ctrl-C
//! or SIGTERM reaches the sweep, which passes it on once, waits for the run to stop with its
//! checkpoint and ends the sweep there; no run is left behind.
use crate::error::JobError;
use std::process::Command;
use std::time::Duration;

/// How one run ended.
pub enum Ended {
    /// Its exit code.
    Code(i32),
    /// A signal stopped the sweep (the run passed on the signal and ended with `code`).
    Stopped { code: i32 },
}

/// Runs `tchrun <args>` (args start with `train`) to its end.
pub fn run_one(args: &[String]) -> Result<Ended, JobError> {
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe()
        .map_err(|e| JobError::launch(format!("cannot find the tchrun binary itself: {e}")))?;
    let guard = tchrun::interrupt::Guard::install();
    let mut child = Command::new(&exe)
        .args(args)
        .process_group(0)
        .spawn()
        .map_err(|e| JobError::launch(format!("cannot start {}: {e}", exe.display())))?;
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    let mut passed_on = None;
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) => {}
            Err(e) => {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                let _ = child.wait();
                return Err(JobError::launch(format!("waiting for the run: {e}")));
            }
        }
        if let (Some(sig), None) = (tchrun::interrupt::received(), passed_on) {
            if let Ok(s) = nix::sys::signal::Signal::try_from(sig) {
                let _ = nix::sys::signal::kill(pid, s);
            }
            passed_on = Some(sig);
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    drop(guard);
    use std::os::unix::process::ExitStatusExt;
    let code = status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1);
    Ok(match passed_on {
        Some(sig) => Ended::Stopped {
            code: if code == 0 { 128 + sig } else { code },
        },
        None => Ended::Code(code),
    })
}
