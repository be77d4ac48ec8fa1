//! `tchrun logs [DIR]` and which log directory a user means by a path or by none: the
//! directory itself, a training output's `logs/`, or the newest job folder of `./tchrun-logs`
//! (`tchrun::files::job_log_dir`: each `exec`, `selftest` and `score` job has its own).
use super::{read_driver_logs, render, FailureSummary};
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tchrun::files;
use tchrun::job_record::Record;

/// The log directory a user meant by `dir` when it is a training `--output` (the obvious
/// guess): its `logs/`, when `dir` itself holds no log (`holds`) and `logs/` does; `None`:
/// `dir` is meant as it is.
pub fn log_dir_of(dir: &Path, holds: impl Fn(&Path) -> bool) -> Option<PathBuf> {
    let sub = dir.join(files::DEFAULT_LOG_SUBDIR);
    (!holds(dir) && holds(&sub)).then_some(sub)
}

/// Whether `dir` holds a job's logs: a failure summary or driver logs.
fn has_logs(dir: &Path) -> bool {
    dir.join(files::FAILURE_JSON).is_file() || !read_driver_logs(dir).is_empty()
}

/// When the newest file directly in `dir` was written.
fn last_written(dir: &Path) -> Option<SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

/// The log directory `tchrun logs` and `tchrun stacks` read, and a note (a line, or "") when it
/// is not the one given. `dir` given: itself when it holds logs, else a training output's
/// `logs/`, else the newest job folder in it. None: the newest job of `./tchrun-logs`, its
/// job folders' and its own logs (from `--log-dir tchrun-logs`) compared by their last write.
/// A path that holds none of these is returned as it is (the caller says what is missing).
pub fn find_log_dir(dir: Option<&Path>) -> (PathBuf, String) {
    let base = dir.unwrap_or(Path::new(tchrun::flags::DEFAULT_LOG_DIR));
    if dir.is_some() {
        if has_logs(base) {
            return (base.to_path_buf(), String::new());
        }
        if let Some(sub) = log_dir_of(base, has_logs) {
            let note = format!(
                "(the log directory of the training output {})\n",
                base.display()
            );
            return (sub, note);
        }
    }
    let jobs = files::job_dirs_in(base)
        .into_iter()
        .filter(|d| has_logs(d) || files::mpi_log(d).is_file());
    let mut candidates: Vec<PathBuf> = jobs.collect();
    if dir.is_none() && has_logs(base) {
        candidates.push(base.to_path_buf());
    }
    // Job folders are oldest first: on equal times the later one wins.
    let newest = candidates
        .into_iter()
        .enumerate()
        .max_by_key(|(i, d)| (last_written(d), *i))
        .map(|(_, d)| d);
    match newest {
        Some(d) if d != base => {
            let note = format!("(the newest job in {}: {})\n", base.display(), d.display());
            (d, note)
        }
        _ => (base.to_path_buf(), String::new()),
    }
}

/// `tchrun logs [DIR]`: the stored failure summary, or a per-rank overview (`find_log_dir`
/// picks the directory).
pub fn logs_command(dir: Option<&Path>) -> Result<String, String> {
    let given = dir.unwrap_or(Path::new(tchrun::flags::DEFAULT_LOG_DIR));
    if !given.is_dir() {
        return Err(format!(
            "{}: not a directory; give a job's log directory (<output>/logs for train and \
             evaluate; exec and selftest: a folder per job in ./{dir}, score: in {dir} beside \
             the CSV, unless --log-dir)",
            given.display(),
            dir = tchrun::flags::DEFAULT_LOG_DIR
        ));
    }
    let (dir, note) = find_log_dir(dir);
    let dir = dir.as_path();
    // A failure summary that exists but cannot be read (garbage, a FIFO, too large) is said so:
    // "no failure recorded" would be a wrong diagnosis.
    let unreadable = match FailureSummary::read(dir) {
        Ok(Some(s)) => return Ok(format!("{note}{}", render(&s, dir))),
        Ok(None) => None,
        Err(e) => Some(format!(
            "the failure summary is unreadable ({e}); the ranks' logs follow"
        )),
    };
    let logs = read_driver_logs(dir);
    if logs.is_empty() {
        if let Some(u) = &unreadable {
            return Err(format!("{}: {u}, but there are none", dir.display()));
        }
        let mpi_log = files::mpi_log(dir);
        return Err(format!(
            "no driver logs and no failure summary in {}{}; give the job's log directory \
             (<output>/logs for a training job, a folder in ./{} by default for the others)",
            dir.display(),
            if mpi_log.is_file() {
                format!(" (the launcher's output is in {})", mpi_log.display())
            } else {
                String::new()
            },
            tchrun::flags::DEFAULT_LOG_DIR
        ));
    }
    let mut out = format!(
        "{note}{} logged in {}; {}\n",
        tchrun::counts::ranks(logs.len()),
        dir.display(),
        unreadable.as_deref().unwrap_or("no failure recorded")
    );
    for l in &logs {
        let last = l.tail.last().map(String::as_str).unwrap_or("");
        out.push_str(&format!("  rank {:>3} {:<16} {}\n", l.rank, l.host, last));
    }
    Ok(out)
}
