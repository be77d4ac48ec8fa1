//! The collective trace: every collective this rank enters (the broadcasts at start, each
//! gradient bucket's all-reduce, validation's reductions, barriers) gets the next sequence
//! number, and its operation, bucket, bytes, step and the times it was entered and completed go
//! into a ring of the last `CAPACITY`, read only when stacks are captured. Recording is one
//! uncontended lock and a few stores (`TCHRUN_COLLECTIVE_TRACE=0` turns the ring off for the
//! benchmark that shows its cost; the sequence numbers count on). The gradient buckets are
//! entered and completed from the C++ shim (`tchrun_trace_bucket_*`: launched in autograd's
//! hooks, waited for in `finish`).
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use tchrun::job_record::heartbeat::Phase;
use tchrun::job_record::stacks::TraceEntry;

/// Collectives kept.
pub const CAPACITY: usize = 512;

/// Collectives entered so far (the heartbeat's `seq`).
static SEQ: AtomicU64 = AtomicU64::new(0);

#[derive(Clone, Copy, Default)]
struct Slot {
    seq: u64,
    op: u8,
    bucket: u32,
    bytes: u64,
    step: u64,
    entered_ms: u64,
    completed_ms: u64,
}

const NO_BUCKET: u32 = u32::MAX;

static RING: Mutex<Vec<Slot>> = Mutex::new(Vec::new());

fn on() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var("TCHRUN_COLLECTIVE_TRACE").map_or(true, |v| v.trim() != "0"))
}

/// Whether the ring records (the benchmark's switch).
pub fn recording() -> bool {
    on()
}

/// Collectives entered so far.
pub fn seq() -> u64 {
    SEQ.load(Ordering::Relaxed)
}

/// Enters a collective: its sequence number.
pub fn enter(op: Phase, bucket: Option<u32>, bytes: u64) -> u64 {
    let seq = SEQ.fetch_add(1, Ordering::Relaxed) + 1;
    if on() {
        let slot = Slot {
            seq,
            op: op.code(),
            bucket: bucket.unwrap_or(NO_BUCKET),
            bytes,
            step: super::state::current_step(),
            entered_ms: super::state::now_ms(),
            completed_ms: 0,
        };
        let mut ring = RING.lock().unwrap_or_else(|e| e.into_inner());
        if ring.is_empty() {
            ring.resize(CAPACITY, Slot::default());
        }
        ring[index(seq)] = slot;
    }
    seq
}

/// Sequence number `seq`'s slot (numbers start at 1; an empty slot has 0).
fn index(seq: u64) -> usize {
    (seq.wrapping_sub(1) % CAPACITY as u64) as usize
}

/// The collective `seq` completed.
pub fn complete(seq: u64) {
    if !on() {
        return;
    }
    let now = super::state::now_ms();
    let mut ring = RING.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = ring.get_mut(index(seq)).filter(|s| s.seq == seq) {
        s.completed_ms = now;
    }
}

/// The ring, oldest first.
pub fn snapshot() -> Vec<TraceEntry> {
    let mut slots: Vec<Slot> = RING.lock().unwrap_or_else(|e| e.into_inner()).clone();
    slots.retain(|s| s.seq != 0);
    slots.sort_by_key(|s| s.seq);
    slots
        .into_iter()
        .map(|s| TraceEntry {
            seq: s.seq,
            op: Phase::from_code(s.op),
            bucket: (s.bucket != NO_BUCKET).then_some(s.bucket),
            bytes: s.bytes,
            step: s.step,
            entered: super::state::rfc3339(s.entered_ms),
            completed: (s.completed_ms != 0).then(|| super::state::rfc3339(s.completed_ms)),
        })
        .collect()
}

/// Called by the C++ shim when it launches gradient bucket `bucket` (`bytes` long): its
/// sequence number, which it hands back to `tchrun_trace_bucket_done`.
#[no_mangle]
pub extern "C" fn tchrun_trace_bucket_enter(bucket: u32, bytes: u64) -> u64 {
    enter(Phase::GradientAllReduce, Some(bucket), bytes)
}

/// Called by the C++ shim when the bucket's all-reduce returned (on NCCL: was enqueued
/// and waited for on the stream).
#[no_mangle]
pub extern "C" fn tchrun_trace_bucket_done(seq: u64) {
    complete(seq)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ring_keeps_the_last_collectives_with_their_completion() {
        let first = enter(Phase::Broadcast, None, 4096);
        complete(first);
        let b = tchrun_trace_bucket_enter(3, 1 << 20);
        let t = snapshot();
        let last = t.last().unwrap();
        assert_eq!(
            (last.seq, last.op, last.bucket),
            (b, Phase::GradientAllReduce, Some(3))
        );
        assert!(last.completed.is_none());
        assert!(t.iter().any(|e| e.seq == first && e.completed.is_some()));
        tchrun_trace_bucket_done(b);
        for _ in 0..CAPACITY + 10 {
            let s = enter(Phase::AllReduce, None, 8);
            complete(s);
        }
        let t = snapshot();
        assert_eq!(t.len(), CAPACITY);
        assert!(t.windows(2).all(|w| w[1].seq == w[0].seq + 1));
        assert_eq!(t.last().unwrap().seq, seq());
        assert!(t.iter().all(|e| e.completed.is_some()));
    }
}
