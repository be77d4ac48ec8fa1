//! Takes every rank's stacks, before a hung job is stopped and for `tchrun stacks`: writes
//! `capture-request.json` into the log directory, which each rank's heartbeat thread reads
//! within a second on every host (whatever started the ranks: mpirun, srun or the local
//! launcher), waits for their `stacks-<rank>.json` within the bound, and takes itself the
//! stacks of ranks on this host that did not answer. A stopped rank is answered for by a live
//! rank on its host. Must not know how the job is stopped or how the stacks are judged.
use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tchrun::job_record::heartbeat::{clock, Heartbeat, Phase};
use tchrun::job_record::stacks::{
    group_main_threads, groups_text, CaptureRequest, CaptureSummary, RankStacks,
};
use tchrun_stacks as stacks;

/// The ranks' answers are waited for this long at most.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(20);
/// The launcher's own look at a local rank that did not answer (the looks run side by side:
/// a capture takes at most ANSWER_LIMIT + LOCAL_LIMIT, 28 s).
pub const LOCAL_LIMIT: Duration = Duration::from_secs(8);

/// The file whose exclusive `flock` a capture holds in the log directory.
pub const CAPTURE_LOCK: &str = ".capture.lock";

/// Takes the log directory's capture lock, waiting at most `limit` for another capture to end.
fn capture_turn(
    log_dir: &Path,
    limit: Duration,
) -> Result<nix::fcntl::Flock<std::fs::File>, String> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = log_dir.join(CAPTURE_LOCK);
    let t0 = Instant::now();
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o640)
        .custom_flags(nix::libc::O_NOFOLLOW | nix::libc::O_NONBLOCK)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    loop {
        match nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusiveNonblock) {
            Ok(l) => return Ok(l),
            Err((f, nix::errno::Errno::EWOULDBLOCK)) if t0.elapsed() < limit => {
                file = f;
                std::thread::sleep(Duration::from_millis(100));
            }
            Err((_, e)) => {
                return Err(format!(
                    "another capture of {} held {} for {} s ({e}); try again",
                    log_dir.display(),
                    path.display(),
                    limit.as_secs()
                ))
            }
        }
    }
}

/// Every rank's stacks (the ranks of `beats`; those that ended are left out) and how it went.
pub fn capture(
    log_dir: &Path,
    beats: &[Heartbeat],
    reason: &str,
    limit: Duration,
) -> (Vec<RankStacks>, CaptureSummary) {
    // One capture at a time per log directory: the request file is one slot, and a second
    // capture overwriting it made the first wait for answers to another id and blame healthy
    // ranks. The second waits (bounded: longer than one capture takes) for the first to
    // finish; past that, or where no lock can be taken, it captures anyway.
    let turn = capture_turn(log_dir, limit + LOCAL_LIMIT + Duration::from_secs(5));
    if let Err(why) = &turn {
        errln!("tchrun: warning: {why}");
    }
    let t0 = Instant::now();
    let id = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let ranks: Vec<&Heartbeat> = beats.iter().filter(|b| b.phase != Phase::Done).collect();
    let req = CaptureRequest {
        id,
        reason: reason.to_string(),
        time: tchrun::files::timestamp_now(),
    };
    let mut missing: Vec<(usize, String)> = Vec::new();
    if let Err(e) = req.write(log_dir) {
        missing.push((
            usize::MAX,
            format!("cannot write the request in {}: {e}", log_dir.display()),
        ));
    }
    let mut got: Vec<Option<RankStacks>> = vec![None; ranks.len()];
    while t0.elapsed() < limit {
        for (slot, b) in got.iter_mut().zip(&ranks) {
            if slot.is_none() {
                *slot = RankStacks::read(log_dir, b.rank, id);
            }
        }
        if got.iter().all(Option::is_some) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    CaptureRequest::remove(log_dir);
    let local = local_host();
    let late: Vec<RankStacks> = std::thread::scope(|s| {
        let looks: Vec<_> = got
            .iter()
            .zip(&ranks)
            .filter(|(g, b)| g.is_none() && Some(b.host.as_str()) == local.as_deref())
            .filter(|(_, b)| stacks::is_worker(b.pid))
            .map(|(_, b)| {
                s.spawn(move || stacks::of_other_rank(b, id, "launcher".into(), LOCAL_LIMIT))
            })
            .collect();
        looks.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    let mut all: Vec<RankStacks> = got.into_iter().flatten().chain(late).collect();
    all.sort_by_key(|s| s.rank);
    missing.retain(|(r, _)| *r != usize::MAX);
    for b in &ranks {
        if let Some(s) = all.iter().find(|s| s.rank == b.rank) {
            if s.threads.iter().all(|t| t.frames.is_empty()) {
                let why = s.error.clone().unwrap_or_else(|| "no frames".into());
                missing.push((b.rank, why));
            }
        } else {
            missing.push((
                b.rank,
                format!(
                    "no answer within {} s from {} (its heartbeat thread is stopped too, and \
                     no rank on its host could answer for it)",
                    limit.as_secs(),
                    b.host
                ),
            ));
        }
    }
    let summary = CaptureSummary {
        id,
        took_ms: t0.elapsed().as_millis() as u64,
        taken: all.iter().map(|s| s.rank).collect(),
        missing,
    };
    (all, summary)
}

fn local_host() -> Option<String> {
    hostname::get()
        .ok()
        .map(|h| h.to_string_lossy().into_owned())
}

/// Frames of each main-thread stack shown.
const FRAMES: usize = 30;

/// The capture for the terminal (`tchrun stacks`, SIGUSR2 to tchrun): a line per rank, then
/// the main threads' stacks grouped, then the ranks without stacks and why.
pub fn render(dir: &Path, stacks: &[RankStacks], summary: &CaptureSummary) -> String {
    let mut out = format!(
        "stacks of {} rank(s) taken in {:.1} s (every thread in {}/stacks-<rank>.json):\n",
        summary.taken.len(),
        summary.took_ms as f64 / 1000.0,
        dir.display()
    );
    for s in stacks {
        out.push_str(&rank_line(s));
    }
    out.push_str(&groups_text(&group_main_threads(stacks), &[], FRAMES));
    for (rank, why) in &summary.missing {
        out.push_str(&format!("  rank {rank}: no stacks ({why})\n"));
    }
    out
}

/// "rank 1 (vm, pid 42, state S, taken by self): forward of step 12 since 14:02:11".
fn rank_line(s: &RankStacks) -> String {
    let doing = match (s.waiting_in(), &s.heartbeat) {
        (Some(e), Some(b)) if b.phase.is_collective() => {
            format!("waits in {} since {}", e.describe(), clock(&e.entered))
        }
        (_, Some(b)) => format!("{} since {}", b.doing(), clock(&b.since)),
        _ => "no heartbeat".to_string(),
    };
    let mut line = format!(
        "rank {} ({}, pid {}, state {}, taken by {}): {doing}",
        s.rank, s.host, s.pid, s.state, s.captured_by
    );
    for l in &s.loaders {
        line.push_str(&format!(
            "; {} decoding {} since {}",
            l.thread,
            l.file.display(),
            clock(&l.since)
        ));
    }
    line.push('\n');
    line
}
