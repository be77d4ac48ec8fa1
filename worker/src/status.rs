//! Rank 0's `status.json` (`tchrun::job_record::status`): the trainer publishes what it knows
//! (`publish`: state, epoch and step, speed, ETA, checkpoint, the ranks' last window, the
//! stragglers), and a thread of its own adds what the ranks' heartbeats say (phase, step, the
//! time since each last advanced, by this rank's clock) and replaces the file about once a
//! second. A thread, so that the file still moves while the main thread waits in a
//! collective for a rank that hangs, and a slow shared file system never delays a step. With
//! `--prometheus-textfile` the same thread writes the job's `.prom` file every
//! `tchrun_prometheus::EVERY` and at each new state (`tchrun_prometheus`). On each other host
//! of a multi-node job its local rank 0 runs the same thread for that host's `.prom` file only
//! ([`start_host`]: the ranks on it, from the heartbeats in its log directory and the windows
//! every rank gathers; no `status.json`), and writes its end itself ([`end_host`]: no launcher
//! runs there under mpirun or srun). A leaf: imports nothing of this
//! crate.
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};
use tchrun::job_record::status::{CheckpointMark, JobState, JobStatus};
use tchrun::job_record::{Heartbeat, Record};
use tchrun_prometheus::Textfile;

/// How often the thread rewrites the file.
const EVERY: Duration = Duration::from_secs(1);

struct Shared {
    log_dir: PathBuf,
    /// `--output`: its `checkpoints/last.json` names the newest complete checkpoint.
    output: PathBuf,
    /// `--prometheus-textfile`'s file, if any.
    textfile: Option<Textfile>,
    /// Rank 0: `status.json` too (and the checkpoint mark); `false` on another host's local
    /// rank 0, which writes its host's `.prom` file only.
    job_file: bool,
    status: Mutex<JobStatus>,
    /// Held while the file is written; `true` once an end state was written, after which the
    /// thread never writes again (a copy it took before the end must not replace the end).
    file: Mutex<bool>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

/// Starts rank 0's writer with the job's first status (once a process; later calls do
/// nothing). Other ranks do not call it; `publish` is then a no-op.
pub fn start(log_dir: PathBuf, output: PathBuf, first: JobStatus, textfile: Option<Textfile>) {
    run(Shared {
        log_dir,
        output,
        textfile,
        job_file: true,
        status: Mutex::new(first),
        file: Mutex::new(false),
    });
}

/// Starts the writer of a host's `.prom` file (`textfile` names the host), on the local rank
/// 0 of a host other than rank 0's: `first` lists every rank; the file has this host's.
pub fn start_host(log_dir: PathBuf, first: JobStatus, textfile: Textfile) {
    run(Shared {
        log_dir,
        output: PathBuf::new(),
        textfile: Some(textfile),
        job_file: false,
        status: Mutex::new(first),
        file: Mutex::new(false),
    });
}

/// A host's file's end, `state` (an end: after training returned; nothing where
/// [`start_host`] did not run).
pub fn end_host(state: JobState) {
    if SHARED.get().is_none_or(|s| s.job_file) || !state.is_end() {
        return;
    }
    publish_now(|st| st.state = state);
}

fn run(shared: Shared) {
    if SHARED.set(shared).is_err() {
        return;
    }
    let spawned = std::thread::Builder::new().name("status".into()).spawn(|| {
        let Some(shared) = SHARED.get() else { return };
        let mut seen = Seen::default();
        let mut warned = false;
        let mut textfile_at: Option<Instant> = None;
        loop {
            // The files are read before the lock is taken (the trainer never waits on a
            // file system); what they say is kept in the shared status (a final write has
            // it too).
            let beats = Heartbeat::read_all(&shared.log_dir);
            let checkpoint = if shared.job_file {
                seen.checkpoint(&shared.output)
            } else {
                None
            };
            let mut s = {
                let mut s = shared.status.lock().unwrap_or_else(|e| e.into_inner());
                if s.state.is_end() {
                    return;
                }
                seen.merge(&mut s, &beats);
                seen.step(&mut s);
                if checkpoint.is_some() {
                    s.last_checkpoint = checkpoint;
                }
                s.clone()
            };
            {
                let ended = shared.file.lock().unwrap_or_else(|e| e.into_inner());
                if *ended {
                    return;
                }
                if shared.job_file {
                    write(&shared.log_dir, &mut s, &mut warned);
                }
                if textfile_at.is_none_or(|t| t.elapsed() >= tchrun_prometheus::EVERY) {
                    write_textfile(shared, &s);
                    textfile_at = Some(Instant::now());
                }
            }
            std::thread::sleep(EVERY);
        }
    });
    if let Err(e) = spawned {
        tracing::warn!("cannot start the status thread: {e} (no status.json for this job)");
    }
}

/// Whether this process started a writer ([`start`] or [`start_host`]).
pub fn running() -> bool {
    SHARED.get().is_some()
}

/// Changes the published status (rank 0; elsewhere nothing happens).
pub fn publish(f: impl FnOnce(&mut JobStatus)) {
    if let Some(shared) = SHARED.get() {
        let mut s = shared.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
    }
}

/// Changes the status and writes it now (a new state the user should see at once: the end).
/// An end state carries the newest complete checkpoint read from disk now, not the one the
/// thread last saw (the final checkpoint is written just before the end).
pub fn publish_now(f: impl FnOnce(&mut JobStatus)) {
    if let Some(shared) = SHARED.get() {
        let mut s = shared.status.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut s);
        let end = s.state.is_end();
        let mut copy = s.clone();
        drop(s);
        if end && shared.job_file {
            if let Some(newest) = Seen::default().checkpoint(&shared.output) {
                copy.last_checkpoint = Some(newest);
            }
        }
        let mut ended = shared.file.lock().unwrap_or_else(|e| e.into_inner());
        if *ended {
            return;
        }
        if shared.job_file {
            write(&shared.log_dir, &mut copy, &mut false);
        }
        write_textfile(shared, &copy);
        *ended = end;
    }
}

fn write(log_dir: &std::path::Path, s: &mut JobStatus, warned: &mut bool) {
    s.updated = tchrun::files::timestamp_now();
    if let Err(e) = s.write(log_dir) {
        if !*warned {
            tracing::warn!("cannot write status.json: {e} (tchrun status will not see this job)");
            *warned = true;
        }
    }
}

/// The `.prom` file (`--prometheus-textfile`), if any; the first failure warned about once.
fn write_textfile(shared: &Shared, s: &JobStatus) {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    let Some(t) = &shared.textfile else { return };
    if let Err(e) = t.write(s, std::time::SystemTime::now()) {
        if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
            tracing::warn!(
                "cannot write {e} ({}): Prometheus does not see this job's metrics; training \
                 goes on",
                tchrun_prometheus::FLAG
            );
        }
    }
}

/// Per rank: its last (step, collective, progress) and when this thread saw it change.
#[derive(Default)]
struct Seen {
    /// The job's step when this thread last saw it change.
    step: Option<u64>,
    last: HashMap<usize, ((u64, u64, u64), Instant)>,
    /// `last.json`'s modification time when it was last read, and the mark it gave.
    checkpoint: Option<(std::time::SystemTime, CheckpointMark)>,
}

impl Seen {
    /// `last_step`: now, when the job's step is not the one last seen (and at the start).
    fn step(&mut self, s: &mut JobStatus) {
        if self.step != Some(s.step) {
            self.step = Some(s.step);
            s.last_step = Some(tchrun::files::timestamp_now());
        }
    }

    /// The heartbeats into the ranks' rows: phase, step, and the seconds since each advanced.
    fn merge(&mut self, s: &mut JobStatus, beats: &[Heartbeat]) {
        let now = Instant::now();
        for b in beats {
            let key = (b.step, b.seq, b.progress);
            let entry = self.last.entry(b.rank).or_insert((key, now));
            if entry.0 != key {
                *entry = (key, now);
            }
            if b.rank == 0 && b.step > s.step {
                // The job's step between two windows: rank 0's (every rank is within one).
                s.step = b.step;
                if s.steps_per_epoch > 0 {
                    let before = u64::from(s.epoch.saturating_sub(1)) * s.steps_per_epoch;
                    s.epoch_step = s.step.saturating_sub(before).min(s.steps_per_epoch);
                }
            }
            if let Some(row) = s.ranks.iter_mut().find(|r| r.rank == b.rank) {
                row.phase = Some(b.phase);
                row.step = b.step;
                row.idle_s = Some(now.duration_since(entry.1).as_secs_f64());
            }
        }
    }

    /// The newest complete checkpoint, from `last.json` (read again only when it changed).
    fn checkpoint(&mut self, output: &std::path::Path) -> Option<CheckpointMark> {
        let path = tchrun::checkpoint::last_json(output);
        let modified = std::fs::metadata(&path).and_then(|m| m.modified()).ok()?;
        if self.checkpoint.as_ref().map(|c| c.0) != Some(modified) {
            if let Ok(Some(last)) = tchrun::checkpoint::read(output) {
                let time = last
                    .written
                    .clone()
                    .unwrap_or_else(|| humantime::format_rfc3339_millis(modified).to_string());
                self.checkpoint = Some((
                    modified,
                    CheckpointMark {
                        step: last.step,
                        time,
                    },
                ));
            }
        }
        self.checkpoint.as_ref().map(|(_, mark)| mark.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun::job_record::heartbeat::Phase;
    use tchrun::job_record::status::RankStatus;

    fn beat(rank: usize, step: u64, phase: Phase) -> Heartbeat {
        Heartbeat {
            rank,
            host: "h".into(),
            pid: 1,
            phase,
            step,
            seq: step * 3,
            progress: 0,
            buckets: None,
            since: "t".into(),
            time: "t".into(),
            beat: 1,
        }
    }

    #[test]
    fn the_heartbeats_give_each_row_its_phase_step_and_idle_time() {
        let mut s = JobStatus::starting(1, 2);
        for rank in 0..2 {
            s.ranks.push(RankStatus {
                rank,
                host: "h".into(),
                device: "cpu".into(),
                phase: None,
                step: 0,
                idle_s: None,
                shares: None,
                rss_bytes: None,
                gpu_bytes: None,
            });
        }
        let mut seen = Seen::default();
        seen.merge(
            &mut s,
            &[beat(0, 4, Phase::Forward), beat(1, 3, Phase::Loading)],
        );
        std::thread::sleep(Duration::from_millis(30));
        seen.merge(
            &mut s,
            &[beat(0, 5, Phase::Backward), beat(1, 3, Phase::Loading)],
        );
        assert_eq!(
            (s.ranks[0].phase, s.ranks[0].step),
            (Some(Phase::Backward), 5)
        );
        assert!(s.ranks[0].idle_s.unwrap() < 0.02, "{:?}", s.ranks[0].idle_s);
        assert!(s.ranks[1].idle_s.unwrap() >= 0.03, "rank 1 did not advance");
    }
}
