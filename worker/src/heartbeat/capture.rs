//! Answers a capture request (`capture-request.json`, from the launcher's hang watch or
//! `tchrun stacks`): the heartbeat thread notices it within a beat and a thread of its own
//! writes `stacks-<rank>.json` (every thread's native stack, taken by `eu-stack`/`gdb` run on
//! this process within `STACK_LIMIT`, the collective trace, the loader threads' files, the
//! heartbeat). A rank that cannot answer (stopped) is answered for by the lowest-numbered rank
//! on its host that can. The beats go on meanwhile.
use super::beat::{record, Identity};
use super::state::{now_ms, rfc3339};
use super::trace;
use std::path::Path;
use std::time::{Duration, Instant, UNIX_EPOCH};
use tchrun::job_record::heartbeat::{Heartbeat, Phase};
use tchrun::job_record::stacks::{CaptureRequest, LoaderWork, RankStacks};
use tchrun_stacks as stacks;

/// The time one process's stacks may take (a thread in the kernel can hold the tool up).
pub const STACK_LIMIT: Duration = Duration::from_secs(8);

/// The requests this rank answered.
pub(crate) struct Answered {
    last: Option<u64>,
}

impl Answered {
    pub fn new(_log_dir: &Path) -> Answered {
        Answered { last: None }
    }

    /// Looks for a new request; answers it from a thread of its own.
    pub fn poll(&mut self, id: &'static Identity) {
        let Some(req) = CaptureRequest::read(&id.log_dir) else {
            return;
        };
        if self.last == Some(req.id) {
            return;
        }
        self.last = Some(req.id);
        let spawned = std::thread::Builder::new()
            .name("stacks".into())
            .spawn(move || answer(id, &req));
        if let Err(e) = spawned {
            tracing::warn!("cannot start the thread that takes this rank's stacks: {e}");
        }
    }
}

/// This rank's stacks, then those of stopped peers on its host.
fn answer(id: &Identity, req: &CaptureRequest) {
    let t0 = Instant::now();
    let pid = std::process::id();
    tracing::debug!(
        "taking this rank's stacks ({}, request {})",
        req.reason,
        req.id
    );
    // What the rank does, as the stacks are taken (the tool stops every thread first).
    let (beat, trace, loaders, time) = (record(id, 0), trace::snapshot(), loaders(), now_ms());
    let (threads, tool, err) = stacks::capture(pid, STACK_LIMIT);
    let mine = RankStacks {
        id: req.id,
        rank: id.rank,
        host: id.host.clone(),
        pid,
        captured_by: "self".into(),
        state: "R".into(),
        tool: tool.map(String::from),
        error: err.map(|e| e.to_string()),
        heartbeat: Some(beat),
        trace,
        loaders,
        threads,
        time: rfc3339(time),
        took_ms: t0.elapsed().as_millis() as u64,
    };
    if let Err(e) = mine.write(&id.log_dir) {
        tracing::warn!(
            "cannot write this rank's stacks in {}: {e}",
            id.log_dir.display()
        );
    }
    peers(id, req);
}

/// The loader threads' files in progress.
fn loaders() -> Vec<LoaderWork> {
    tchrun_data::in_progress()
        .into_iter()
        .map(|(thread, file, since)| LoaderWork {
            thread,
            file,
            since: rfc3339(
                since
                    .duration_since(UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as u64),
            ),
        })
        .collect()
}

/// The stacks of the ranks on this host that are stopped (they cannot answer), taken by the
/// lowest-numbered rank here that is not.
fn peers(id: &Identity, req: &CaptureRequest) {
    let beats = Heartbeat::read_all(&id.log_dir);
    let here: Vec<&Heartbeat> = beats
        .iter()
        .filter(|b| b.host == id.host && b.phase != Phase::Done && stacks::is_worker(b.pid))
        .collect();
    let stopped = |b: &Heartbeat| matches!(stacks::process_state(b.pid), Some('T' | 't'));
    let answerer = here.iter().filter(|b| !stopped(b)).map(|b| b.rank).min();
    if answerer != Some(id.rank) {
        return;
    }
    for b in here.into_iter().filter(|b| b.rank != id.rank && stopped(b)) {
        if RankStacks::read(&id.log_dir, b.rank, req.id).is_some() {
            continue;
        }
        let theirs = stacks::of_other_rank(b, req.id, format!("rank {}", id.rank), STACK_LIMIT);
        if let Err(e) = theirs.write(&id.log_dir) {
            tracing::warn!("cannot write rank {}'s stacks: {e}", b.rank);
        }
    }
}
