//! One beat: who the rank is and what the state atomics and the collective trace say now, as
//! `heartbeat-<rank>.json`'s record.
use super::state::{now_ms, rfc3339, BUCKETS, PHASE, PROGRESS, SINCE_MS, STEP};
use super::trace;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use tchrun::job_record::heartbeat::{Heartbeat, Phase};

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
