//! The rank's heartbeat: its phase, step and collective sequence number in atomics (`state.rs`;
//! cheap to set at every phase change: no file write, no collective), and a thread that rewrites
//! `<log_dir>/heartbeat-<rank>.json` (`beat.rs`, `tchrun::job_record::heartbeat`) about once a
//! second.
//! The thread is its own: a rank whose main thread is stuck keeps beating with an old `since`;
//! a stopped or dead one stops. The same thread answers a capture request (`capture.rs`: the
//! rank's stacks, its collective trace `trace.rs`). A leaf: imports nothing of this crate
//! (comm, rank and train set phases here).
mod beat;
pub mod capture;
mod state;
pub mod trace;

use beat::{record, Identity};
pub use state::{buckets, current_phase, phase, progressed, step};
use state::{now_ms, PHASE, SINCE_MS, STARTED};

use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;
use tchrun::job_record::heartbeat::Phase;

/// How often the thread beats.
const EVERY: Duration = Duration::from_secs(1);

/// Inside a collective (`p`) until dropped; then back to the phase before.
#[must_use]
pub struct Collective {
    before: u64,
    since: u64,
    /// Its entry in the collective trace (none: the gradient buckets, traced by the shim).
    seq: Option<u64>,
}

/// Enters a collective of `bytes`: the next sequence number, an entry in the trace.
pub fn collective(p: Phase, bytes: u64) -> Collective {
    let seq = trace::enter(p, None, bytes);
    in_phase(p, Some(seq))
}

/// Waits in the gradient all-reduce (its buckets were entered one by one as backward made them).
pub fn gradient_wait() -> Collective {
    in_phase(Phase::GradientAllReduce, None)
}

fn in_phase(p: Phase, seq: Option<u64>) -> Collective {
    let before = PHASE.load(Ordering::Relaxed);
    let since = SINCE_MS.load(Ordering::Relaxed);
    PHASE.store(p.code() as u64, Ordering::Relaxed);
    SINCE_MS.store(now_ms(), Ordering::Relaxed);
    Collective { before, since, seq }
}

impl Drop for Collective {
    fn drop(&mut self) {
        if let Some(seq) = self.seq {
            trace::complete(seq);
        }
        PHASE.store(self.before, Ordering::Relaxed);
        SINCE_MS.store(self.since, Ordering::Relaxed);
    }
}

static IDENTITY: std::sync::OnceLock<Identity> = std::sync::OnceLock::new();

/// Starts the beating thread (once a process; later calls do nothing). A beat that cannot be
/// written is said once in the driver log; the rank goes on.
pub fn start(log_dir: PathBuf, rank: usize, host: &str) {
    if STARTED.swap(true, Ordering::SeqCst) {
        return;
    }
    phase(Phase::StartUp);
    let id = IDENTITY.get_or_init(|| Identity {
        log_dir,
        rank,
        host: host.to_string(),
    });
    let spawned = std::thread::Builder::new()
        .name("heartbeat".into())
        .spawn(move || {
            let mut warned = false;
            let mut answered = capture::Answered::new(&id.log_dir);
            for beat in 1u64.. {
                answered.poll(id);
                if let Err(e) = record(id, beat).write(&id.log_dir) {
                    if !warned {
                        tracing::warn!(
                            "cannot write the heartbeat in {}: {e} (the launcher cannot tell a \
                             hang from this rank's beats)",
                            id.log_dir.display()
                        );
                        warned = true;
                    }
                }
                std::thread::sleep(EVERY);
            }
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the heartbeat thread: {e}");
    }
}

/// The rank is about to exit 0, with nothing left to do (`main`, after its command
/// succeeded): say so now (the launcher does not wait for a rank that ended).
pub fn done() {
    phase(Phase::Done);
    if let Some(id) = IDENTITY.get() {
        let _ = record(id, u64::MAX).write(&id.log_dir);
    }
}
