//! The heartbeat's state: the rank's phase, since when, its step, progress and buckets, in
//! atomics any thread sets or reads (a leaf of `heartbeat/`).
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tchrun::job_record::heartbeat::Phase;

pub(super) static PHASE: AtomicU64 = AtomicU64::new(0);
pub(super) static SINCE_MS: AtomicU64 = AtomicU64::new(0);
pub(super) static STEP: AtomicU64 = AtomicU64::new(0);
pub(super) static PROGRESS: AtomicU64 = AtomicU64::new(0);
pub(super) static BUCKETS: AtomicU64 = AtomicU64::new(0);
pub(super) static STARTED: AtomicBool = AtomicBool::new(false);

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
