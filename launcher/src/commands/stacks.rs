//! `tchrun stacks LOGDIR`: every rank's stacks of a running job, without stopping it: the same
//! capture the hang watch runs before it stops a hung job (`run::capture`), from any machine
//! that sees the log directory. Each rank's line says what it is doing (its heartbeat, the
//! collective it waits in, its loader threads' files); the main threads' stacks follow,
//! identical ones once; every thread is in `stacks-<rank>.json`.
use crate::error::JobError;
use crate::run::capture;
use std::path::Path;
use tchrun::job_record::heartbeat::{clock, Heartbeat, Phase};
use tchrun::job_record::stacks::{group_main_threads, groups_text, RankStacks};

/// Frames of each main-thread stack shown.
const FRAMES: usize = 30;

pub fn run(dir: &Path) -> Result<i32, JobError> {
    let beats = Heartbeat::read_all(dir);
    if beats.is_empty() {
        return Err(JobError::invalid(format!(
            "{}: no heartbeat-<rank>.json here: not the log directory of a tchrun job (give a \
             training --output's logs/ or the job's --log-dir)",
            dir.display()
        )));
    }
    if beats.iter().all(|b| b.phase == Phase::Done) {
        return Err(JobError::invalid(format!(
            "{}: every rank's heartbeat says it is done: the job has ended (see `tchrun logs {}`)",
            dir.display(),
            dir.display()
        )));
    }
    let (stacks, summary) = capture::capture(dir, &beats, "tchrun stacks", capture::ANSWER_LIMIT);
    let mut out = format!(
        "stacks of {} rank(s) taken in {:.1} s (every thread in {}/stacks-<rank>.json):\n",
        summary.taken.len(),
        summary.took_ms as f64 / 1000.0,
        dir.display()
    );
    for s in &stacks {
        out.push_str(&rank_line(s));
    }
    out.push_str(&groups_text(&group_main_threads(&stacks), &[], FRAMES));
    for (rank, why) in &summary.missing {
        out.push_str(&format!("  rank {rank}: no stacks ({why})\n"));
    }
    {
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), "{out}");
    }
    Ok(0)
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
