//! `tchrun stacks LOGDIR`: every rank's stacks of a running job, without stopping it: the same
//! capture the hang watch runs before it stops a hung job (`run::capture`), from any machine
//! that sees the log directory (SIGUSR2 to a running tchrun prints the same). Each rank's line
//! says what it is doing (its heartbeat, the collective it waits in, its loader threads'
//! files); the main threads' stacks follow, identical ones once; every thread is in
//! `stacks-<rank>.json`.
use crate::error::JobError;
use crate::run::capture;
use std::path::Path;
use tchrun::job_record::heartbeat::{Heartbeat, Phase};

/// `dir`: the log directory given, if any (`report::logs::find_log_dir` picks the one meant).
pub fn run(dir: Option<&Path>) -> Result<i32, JobError> {
    let (dir, note) = crate::report::logs::find_log_dir(dir);
    let dir = dir.as_path();
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
    let out = format!("{note}{}", capture::render(dir, &stacks, &summary));
    {
        use std::io::Write as _;
        let _ = write!(std::io::stdout(), "{out}");
    }
    Ok(0)
}
