//! The rank's heartbeat: its phase, step and collective sequence number in atomics (cheap to
//! set at every phase change: no file write, no collective), and a thread that rewrites
//! `<log_dir>/heartbeat-<rank>.json` (`tchrun::job_record::heartbeat`) about once a second.
//! The thread is its own: a rank whose main thread is stuck keeps beating with an old `since`;
//! a stopped or dead one stops. The same thread answers a capture request (`capture.rs`: the
//! rank's stacks, its collective trace `trace.rs`). A leaf: imports nothing of this crate
//! (comm, rank and train set phases here).
pub mod capture;
pub mod trace;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tchrun::job_record::heartbeat::{Heartbeat, Phase};

static PHASE: AtomicU64 = AtomicU64::new(0);
static SINCE_MS: AtomicU64 = AtomicU64::new(0);
static STEP: AtomicU64 = AtomicU64::new(0);
static PROGRESS: AtomicU64 = AtomicU64::new(0);
static BUCKETS: AtomicU64 = AtomicU64::new(0);
static STARTED: AtomicBool = AtomicBool::new(false);

/// How often the thread beats.
const EVERY: Duration = Duration::from_secs(1);

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

pub(crate) fn rfc3339(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
}

/// The rank is now in `p` (its `since` starts now unless it already was).
pub fn phase(p: Phase) {
    let code = p.code() as u64;
    if PHASE.swap(code, Ordering::Relaxed) != code {
        SINCE_MS.store(now_ms(), Ordering::Relaxed);
    }
}

/// Optimizer steps done.
pub fn step(done: u64) {
    STEP.store(done, Ordering::Relaxed);
}

/// Work done that is not a step (a validation batch): the hang watch counts it as progress.
pub fn progressed() {
    PROGRESS.fetch_add(1, Ordering::Relaxed);
}

/// The phase the rank is in now.
pub fn current_phase() -> Phase {
    Phase::from_code(PHASE.load(Ordering::Relaxed) as u8)
}

pub(crate) fn current_step() -> u64 {
    STEP.load(Ordering::Relaxed)
}

/// The last gradient reduction had this many buckets.
pub fn buckets(n: usize) {
    BUCKETS.store(n as u64, Ordering::Relaxed);
}

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

/// The identity a beat carries.
pub(crate) struct Identity {
    pub log_dir: PathBuf,
    pub rank: usize,
    pub host: String,
}

pub(crate) fn record(id: &Identity, beat: u64) -> Heartbeat {
    let buckets = BUCKETS.load(Ordering::Relaxed);
    Heartbeat {
        rank: id.rank,
        host: id.host.clone(),
        pid: std::process::id(),
        phase: Phase::from_code(PHASE.load(Ordering::Relaxed) as u8),
        step: STEP.load(Ordering::Relaxed),
        seq: trace::seq(),
        progress: PROGRESS.load(Ordering::Relaxed),
        buckets: (buckets > 0).then_some(buckets),
        since: rfc3339(SINCE_MS.load(Ordering::Relaxed)),
        time: rfc3339(now_ms()),
        beat,
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
    allow_stack_capture();
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

/// Lets any process of this user ptrace this one, where Yama restricts ptrace to ancestors
/// (`kernel.yama.ptrace_scope=1`): the stacks are taken by a child of this process, of a peer
/// rank or of the launcher (`capture.rs`). Where Yama is absent the call fails harmlessly.
fn allow_stack_capture() {
    // SAFETY: prctl with integer arguments only; it changes no memory of this process.
    let rc = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    if rc != 0 {
        tracing::debug!(
            "PR_SET_PTRACER: {} (no Yama: nothing to allow)",
            std::io::Error::last_os_error()
        );
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
