//! SIGINT/SIGTERM during work that must clean up on the way out (an archive's extraction):
//! [`Guard::install`] turns the two signals into a flag the work polls ([`received`]) and, when
//! dropped, puts the process's earlier handling back (a signal the process ignored stays
//! ignored, and is not caught here). Neither binary handles these signals before its ranks
//! start otherwise: outside a guard they end the process as usual.
use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, Signal};
use std::sync::atomic::{AtomicI32, Ordering};

static RECEIVED: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_signal(sig: nix::libc::c_int) {
    // Async-signal-safe: one atomic operation.
    let _ = RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst);
}

/// The first SIGINT/SIGTERM received while a guard was installed (its number), if any.
pub fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        s => Some(s),
    }
}

/// Catches SIGINT and SIGTERM while it lives.
pub struct Guard {
    previous: Vec<(Signal, SigAction)>,
}

impl Guard {
    /// Installs the handler (and forgets an earlier guard's signal).
    pub fn install() -> Guard {
        RECEIVED.store(0, Ordering::SeqCst);
        let mut previous = Vec::new();
        let ours = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for sig in [Signal::SIGINT, Signal::SIGTERM] {
            // SAFETY: the handler only stores an atomic.
            if let Ok(old) = unsafe { sigaction(sig, &ours) } {
                if old.handler() == SigHandler::SigIgn {
                    // Ignored (nohup, a background job): leave it so.
                    // SAFETY: restoring the action we replaced.
                    let _ = unsafe { sigaction(sig, &old) };
                } else {
                    previous.push((sig, old));
                }
            }
        }
        Guard { previous }
    }
}

impl Drop for Guard {
    fn drop(&mut self) {
        for (sig, old) in self.previous.drain(..) {
            // SAFETY: restoring the action we replaced.
            let _ = unsafe { sigaction(sig, &old) };
        }
    }
}

/// The exit code of an interruption by `signal` (130 for SIGINT, 143 for SIGTERM).
pub fn exit_code(signal: i32) -> i32 {
    if signal == Signal::SIGINT as i32 {
        crate::exit::ErrorKind::InterruptedInt.exit_code()
    } else {
        crate::exit::ErrorKind::InterruptedTerm.exit_code()
    }
}

/// The signal's name (`SIGINT`, `SIGTERM`, ...).
pub fn signal_name(signal: i32) -> String {
    Signal::try_from(signal).map_or_else(|_| format!("signal {signal}"), |s| s.as_str().to_string())
}
