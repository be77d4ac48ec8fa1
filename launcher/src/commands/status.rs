//! `tchrun status PATH`: where a training job is, from the `status.json` its log directory
//! holds (rank 0 rewrites it while the ranks run, the launcher before and after them), from any
//! machine that sees the directory: no server, no port. A header (state, epoch and step, speed,
//! ETA, the last checkpoint, how old the file is), one line per host whose ranks agree (else
//! per rank), the stragglers; after a failure, `failure.json`'s summary as `tchrun logs` prints
//! it. `--watch` follows the job to its end. The rendering is pure (the reader's clock is an
//! argument); this module reads files and prints, and knows nothing of how a job is run.
use crate::error::JobError;
use crate::report;
use std::io::{IsTerminal as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};
use tchrun::files;
use tchrun::job_record::heartbeat::Phase;
use tchrun::job_record::stacks::rank_list;
use tchrun::job_record::status::{JobState, JobStatus, RankStatus, Straggler, FORMAT_VERSION};
use tchrun::job_record::{FailureSummary, Record, RecordError};

/// A running job's `status.json` not rewritten for this long is stale (rank 0 rewrites it about
/// once a second).
pub const STALE_AFTER_S: f64 = 30.0;
/// The ranks of a host share one line when each of their time shares is within this of the
/// others'.
const FOLD_SHARE_SPREAD: f64 = 0.05;

#[derive(clap::Args, Debug)]
pub struct StatusArgs {
    /// The job's log directory, or a training --output (then its logs/), seen from this machine.
    pub path: PathBuf,
    /// Follow the job until it ends: on a terminal the table is redrawn every --interval; else
    /// one line per change, and the table at the end.
    #[arg(long)]
    pub watch: bool,
    /// One line per rank (by default the ranks of a host that agree share one line).
    #[arg(long)]
    pub ranks: bool,
    /// Print status.json as read (pretty JSON).
    #[arg(long, conflicts_with_all = ["watch", "ranks"])]
    pub json: bool,
    /// Seconds between two reads of --watch.
    #[arg(long, default_value_t = 2.0, value_parser = interval)]
    pub interval: f64,
}

fn interval(v: &str) -> Result<f64, String> {
    match v.parse::<f64>() {
        Ok(s) if (0.1..=3600.0).contains(&s) => Ok(s),
        _ => Err(format!("{v}: give seconds from 0.1 to 3600")),
    }
}

/// `tchrun status`: 0 once `status.json` could be read, whatever the job's state.
pub fn run(args: &StatusArgs) -> Result<i32, JobError> {
    let dir = locate(&args.path)?;
    let status = read(&dir)
        .and_then(|s| s.ok_or_else(|| missing(&dir)))
        .map_err(JobError::invalid)?;
    if args.json {
        let text = serde_json::to_string_pretty(&status)
            .map_err(|e| JobError::invalid(format!("{}: {e}", JobStatus::path(&dir).display())))?;
        outln!("{text}");
        return Ok(0);
    }
    if args.watch {
        watch(&dir, status, args);
        return Ok(0);
    }
    print(&table(&status, &dir, SystemTime::now(), args.ranks));
    Ok(0)
}

/// The log directory meant by `path`: itself, or a training `--output`'s `logs/`.
fn locate(path: &Path) -> Result<PathBuf, JobError> {
    if !path.is_dir() {
        return Err(JobError::invalid(format!(
            "{}: not a directory; give a training job's --output or its log directory \
             (--log-dir)",
            path.display()
        )));
    }
    let holds = |d: &Path| JobStatus::path(d).exists();
    Ok(report::logs::log_dir_of(path, holds).unwrap_or_else(|| path.to_path_buf()))
}

fn missing(dir: &Path) -> String {
    format!(
        "no {} in {}: not a tchrun train log directory, or the job has not started yet (give \
         a training job's --output or its --log-dir; `tchrun logs {}` reads the logs of any \
         job)",
        files::STATUS_JSON,
        dir.display(),
        dir.display()
    )
}

/// `status.json` of `dir` (`None` when there is none); an unreadable, unparseable or newer one
/// is refused in words.
fn read(dir: &Path) -> Result<Option<JobStatus>, String> {
    let newer = |path: &Path, v: u64| {
        format!(
            "{}: written by a newer tchrun (format {v}; this one reads format {FORMAT_VERSION}): \
             read it with that tchrun's `tchrun status`",
            path.display()
        )
    };
    match JobStatus::read(dir) {
        Ok(Some(s)) if s.format_version > FORMAT_VERSION => {
            Err(newer(&JobStatus::path(dir), s.format_version.into()))
        }
        Ok(s) => Ok(s),
        Err(RecordError::Parse { path, source }) => {
            let version = tchrun::files::read_bounded(&path, tchrun::files::caps::RECORD)
                .ok()
                .and_then(|t| serde_json::from_slice::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("format_version").and_then(|v| v.as_u64()));
            Err(match version {
                Some(v) if v > u64::from(FORMAT_VERSION) => newer(&path, v),
                _ => format!(
                    "{}: not a status.json this tchrun can read ({source}); `tchrun logs {}` \
                     reads the job's logs",
                    path.display(),
                    dir.display()
                ),
            })
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Writes `text` to stdout; false when stdout is closed (`tchrun status --watch | head`).
fn print(text: &str) -> bool {
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())
        .and_then(|()| out.flush())
        .is_ok()
}

/// The table as printed: the status (`render`) and, after a failure, `failure.json`'s summary
/// as `tchrun logs` prints it.
fn table(s: &JobStatus, dir: &Path, now: SystemTime, all_ranks: bool) -> String {
    let failure = (s.state == JobState::Failed)
        .then(|| FailureSummary::read(dir).ok().flatten())
        .flatten()
        .map(|f| report::render(&f, dir));
    render(s, dir, now, all_ranks, failure.as_deref())
}

/// `--watch`: until the job ends (then its table). On a terminal the table is redrawn in
/// place; else one line per change, and one when the job goes stale.
fn watch(dir: &Path, first: JobStatus, args: &StatusArgs) {
    let tty = std::io::stdout().is_terminal();
    let pause = Duration::from_secs_f64(args.interval);
    let mut status = Ok(Some(first));
    let (mut said, mut stale) = (None, false);
    loop {
        let now = SystemTime::now();
        if let Ok(Some(s)) = &status {
            if s.state.is_end() {
                let lead = if tty {
                    "\x1b[H\x1b[2J".to_string()
                } else {
                    format!("{} {}\n", s.updated, change_line(s))
                };
                print(&format!("{lead}{}", table(s, dir, now, args.ranks)));
                return;
            }
        }
        if tty {
            let text = match &status {
                Ok(Some(s)) => table(s, dir, now, args.ranks),
                other => format!("{}\n", trouble(other, dir)),
            };
            let screen = format!(
                "\x1b[H\x1b[2J{text}\n(every {} s until the job ends; Ctrl-C to stop watching)\n",
                args.interval
            );
            if !print(&screen) {
                return;
            }
        } else if !say_change(&status, dir, now, &mut said, &mut stale) {
            return;
        }
        std::thread::sleep(pause);
        status = read(dir);
    }
}

/// Why `--watch` has no status to show this time (it goes on watching).
fn trouble(status: &Result<Option<JobStatus>, String>, dir: &Path) -> String {
    match status {
        Ok(Some(_)) => String::new(),
        Ok(None) => format!(
            "{} is gone from {} (removed, or a new job is starting there); still watching",
            files::STATUS_JSON,
            dir.display()
        ),
        Err(e) => format!("{e}; still watching"),
    }
}

/// `--watch` without a terminal: a line when what `change_line` says changed (with the
/// status's time), and one when the job goes stale. False when stdout is closed.
fn say_change(
    status: &Result<Option<JobStatus>, String>,
    dir: &Path,
    now: SystemTime,
    said: &mut Option<String>,
    was_stale: &mut bool,
) -> bool {
    let mut out = String::new();
    let (key, text) = match status {
        Ok(Some(s)) => {
            let line = change_line(s);
            (line.clone(), format!("{} {line}", s.updated))
        }
        other => (trouble(other, dir), trouble(other, dir)),
    };
    if said.as_deref() != Some(key.as_str()) {
        out.push_str(&format!("{text}\n"));
        *said = Some(key);
    }
    let stale = match status {
        Ok(Some(s)) => stale_line(s, dir, now),
        _ => None,
    };
    if let (Some(line), false) = (&stale, *was_stale) {
        out.push_str(&format!("{line}\n"));
    }
    *was_stale = stale.is_some();
    out.is_empty() || print(&out)
}

/// Seconds from the RFC 3339 time `stamp` to `now` (the reader's clock); 0 when the writer's
/// clock is ahead, `None` when `stamp` is not a time.
pub fn age_s(stamp: &str, now: SystemTime) -> Option<f64> {
    let t = humantime::parse_rfc3339_weak(stamp).ok()?;
    Some(now.duration_since(t).map_or(0.0, |d| d.as_secs_f64()))
}

/// A job that has not ended whose `status.json` was not rewritten for `STALE_AFTER_S`.
pub fn is_stale(s: &JobStatus, now: SystemTime) -> bool {
    !s.state.is_end() && age_s(&s.updated, now).is_some_and(|a| a > STALE_AFTER_S)
}

fn stale_line(s: &JobStatus, dir: &Path, now: SystemTime) -> Option<String> {
    if !is_stale(s, now) {
        return None;
    }
    let age = age_s(&s.updated, now).unwrap_or_default();
    let starting = if s.state == JobState::Starting {
        " (or its ranks are still starting)"
    } else {
        ""
    };
    Some(format!(
        "stale: not rewritten for {} while the job is {}: it may have died without a word{starting}, \
         or rank 0's host cannot write {}; see `tchrun logs {}`",
        ago(age),
        s.state.label(),
        dir.display(),
        dir.display()
    ))
}

/// `status.json` as a table: the header, one line per host whose ranks agree (else per rank;
/// every rank with `all_ranks`), the stragglers, and after the end `failure` (the failure
/// summary as `tchrun logs` prints it). `now` is the reader's clock.
pub fn render(
    s: &JobStatus,
    dir: &Path,
    now: SystemTime,
    all_ranks: bool,
    failure: Option<&str>,
) -> String {
    let mut out = header(s, dir, now);
    if let Some(stale) = stale_line(s, dir, now) {
        out.push_str(&format!("{stale}\n"));
    }
    if s.ranks.is_empty() {
        if !s.state.is_end() {
            out.push_str("no rank has reported yet\n");
        }
    } else {
        out.push('\n');
        out.push_str(&rank_table(s, all_ranks));
    }
    for st in &s.stragglers {
        out.push_str(&format!("{}\n", st.line()));
    }
    if let Some(f) = failure {
        out.push('\n');
        out.push_str(f);
    }
    out
}

/// The header: state, how it ended, epoch and step, speed, ETA, checkpoint.
fn header(s: &JobStatus, dir: &Path, now: SystemTime) -> String {
    let mut lines = vec![("log dir", dir.display().to_string())];
    let updated = match age_s(&s.updated, now) {
        Some(a) => format!("updated {} ago", ago(a)),
        None => format!("updated {}", s.updated),
    };
    lines.push((
        "state",
        format!(
            "{}, attempt {}, {} rank(s) ({updated})",
            s.state.label(),
            s.attempt,
            s.world_size
        ),
    ));
    if let Some(end) = &s.end {
        // When: the launcher's last write of status.json is the end.
        let when = match age_s(&s.updated, now) {
            Some(a) => format!("ended {} ago", ago(a)),
            None => format!("ended {}", s.updated),
        };
        lines.push((
            "ended",
            format!("exit code {}: {} ({when})", end.code, end.summary),
        ));
    }
    if s.epochs > 0 {
        let mut epoch = format!("{} of {}", s.epoch, s.epochs);
        if s.steps_per_epoch > 0 {
            epoch.push_str(&format!(
                ", step {} of {} in the epoch",
                s.epoch_step, s.steps_per_epoch
            ));
        }
        lines.push(("epoch", epoch));
        lines.push(("step", of_total(s.step, s.total_steps)));
    }
    if let Some(v) = s.images_per_s {
        lines.push(("speed", format!("{v:.1} images/s")));
    }
    let eta: Vec<String> = [("epoch", s.eta_epoch_s), ("job", s.eta_job_s)]
        .iter()
        .filter_map(|(what, v)| v.map(|v| format!("{what} {}", duration(v))))
        .collect();
    if !eta.is_empty() {
        lines.push(("eta", eta.join(", ")));
    }
    match &s.last_checkpoint {
        Some(c) => lines.push((
            "checkpoint",
            match age_s(&c.time, now) {
                Some(a) => format!("step {}, {} ago", c.step, ago(a)),
                None => format!("step {}, at {}", c.step, c.time),
            },
        )),
        None if s.step > 0 => lines.push(("checkpoint", "none yet".into())),
        None => {}
    }
    lines
        .iter()
        .map(|(k, v)| format!("{:<12}{v}\n", format!("{k}:")))
        .collect()
}

fn of_total(n: u64, total: u64) -> String {
    if total == 0 {
        return n.to_string();
    }
    format!("{n} of {total} ({:.1}%)", 100.0 * n as f64 / total as f64)
}

/// The lines of the rank table: per host (in rank order), its ranks together when they agree
/// and `all` is false, else one by one.
pub fn rank_rows(s: &JobStatus, all: bool) -> Vec<Vec<&RankStatus>> {
    let mut ranks: Vec<&RankStatus> = s.ranks.iter().collect();
    ranks.sort_by_key(|r| r.rank);
    let mut hosts: Vec<(&str, Vec<&RankStatus>)> = Vec::new();
    for r in ranks {
        match hosts.iter_mut().find(|(h, _)| *h == r.host) {
            Some((_, v)) => v.push(r),
            None => hosts.push((&r.host, vec![r])),
        }
    }
    let mut rows = Vec::new();
    for (_, group) in hosts {
        if !all && agree(&group, &s.stragglers) {
            rows.push(group);
        } else {
            rows.extend(group.into_iter().map(|r| vec![r]));
        }
    }
    rows
}

/// Ranks that one line can stand for: the same phase and step, none a straggler, time shares
/// within `FOLD_SHARE_SPREAD` of each other's.
pub fn agree(ranks: &[&RankStatus], stragglers: &[Straggler]) -> bool {
    let Some(first) = ranks.first() else {
        return true;
    };
    let same = ranks.iter().all(|r| {
        r.phase == first.phase
            && r.step == first.step
            && r.shares.is_some() == first.shares.is_some()
            && !stragglers.iter().any(|s| s.rank == r.rank)
    });
    let spread = |f: fn(&tchrun::job_record::status::Shares) -> f64| {
        let v: Vec<f64> = ranks
            .iter()
            .filter_map(|r| r.shares.as_ref().map(f))
            .collect();
        let max = v.iter().copied().fold(f64::MIN, f64::max);
        let min = v.iter().copied().fold(f64::MAX, f64::min);
        v.is_empty() || max - min <= FOLD_SHARE_SPREAD + 1e-9
    };
    same && spread(|s| s.data_wait) && spread(|s| s.compute) && spread(|s| s.comm)
}

/// The rank table, its columns aligned.
fn rank_table(s: &JobStatus, all: bool) -> String {
    let gpu = s.ranks.iter().any(|r| r.gpu_bytes.is_some());
    let mut head = vec![
        "host", "ranks", "device", "phase", "step", "idle", "data", "compute", "comm", "memory",
    ];
    if gpu {
        head.push("gpu memory");
    }
    let mut rows: Vec<Vec<String>> = vec![head.iter().map(|h| h.to_string()).collect()];
    for group in rank_rows(s, all) {
        rows.push(row(&group, gpu, s.state.is_end()));
    }
    // Left: host, ranks, device, phase; the numbers right.
    let widths: Vec<usize> = (0..rows[0].len())
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    rows.iter()
        .map(|r| {
            let cells: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(c, v)| {
                    if c < 4 {
                        format!("{v:<w$}", w = widths[c])
                    } else {
                        format!("{v:>w$}", w = widths[c])
                    }
                })
                .collect();
            format!("{}\n", cells.join("  ").trim_end())
        })
        .collect()
}

/// One line of ranks that agree (or one rank): the slowest idle time, the mean shares, the
/// largest memory.
/// Of an ended job, the phase says `ended` and the idle time `-` (the ranks' last report is
/// no longer what they do: before, a finished job showed its last phases and "idle 0.0s").
fn row(group: &[&RankStatus], gpu: bool, ended: bool) -> Vec<String> {
    let first = group[0];
    let ranks: Vec<usize> = group.iter().map(|r| r.rank).collect();
    let idle = group.iter().filter_map(|r| r.idle_s).reduce(f64::max);
    let shares: Vec<_> = group.iter().filter_map(|r| r.shares).collect();
    let mean = |f: fn(&tchrun::job_record::status::Shares) -> f64| {
        if shares.is_empty() {
            "-".to_string()
        } else {
            let m = shares.iter().map(f).sum::<f64>() / shares.len() as f64;
            format!("{:.0}%", 100.0 * m)
        }
    };
    let bytes_of = |f: fn(&RankStatus) -> Option<u64>| {
        group
            .iter()
            .filter_map(|r| f(r))
            .max()
            .map_or("-".to_string(), bytes)
    };
    let mut cells = vec![
        first.host.clone(),
        rank_list(&ranks),
        devices(group),
        match first.phase {
            Some(p) if ended && p != Phase::Done => format!("ended in {}", phase_name(p)),
            p => p.map_or("-".to_string(), phase_name),
        },
        first.step.to_string(),
        idle.filter(|_| !ended).map_or("-".to_string(), idle_time),
        mean(|s| s.data_wait),
        mean(|s| s.compute),
        mean(|s| s.comm),
        bytes_of(|r| r.rss_bytes),
    ];
    if gpu {
        cells.push(bytes_of(|r| r.gpu_bytes));
    }
    cells
}

/// `cpu`, `cuda:0-3`, or the devices as they are.
fn devices(group: &[&RankStatus]) -> String {
    let first = &group[0].device;
    if group.iter().all(|r| &r.device == first) {
        return first.clone();
    }
    let cuda: Option<Vec<usize>> = group
        .iter()
        .map(|r| r.device.strip_prefix("cuda:").and_then(|i| i.parse().ok()))
        .collect();
    match cuda {
        Some(ids) => format!("cuda:{}", rank_list(&ids)),
        None => group
            .iter()
            .map(|r| r.device.as_str())
            .collect::<Vec<_>>()
            .join(","),
    }
}

/// The phase as `status.json` names it (`gradient_all_reduce`).
fn phase_name(p: Phase) -> String {
    serde_json::to_value(p)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_else(|| p.label().to_string())
}

/// One line of `--watch` when stdout is not a terminal: state, epoch, step, speed, ETA,
/// stragglers.
pub fn change_line(s: &JobStatus) -> String {
    let mut parts = vec![format!("{} (attempt {})", s.state.label(), s.attempt)];
    if s.epochs > 0 {
        parts.push(format!("epoch {}/{}", s.epoch, s.epochs));
        parts.push(if s.total_steps > 0 {
            format!("step {}/{}", s.step, s.total_steps)
        } else {
            format!("step {}", s.step)
        });
    }
    if let Some(v) = s.images_per_s {
        parts.push(format!("{v:.1} images/s"));
    }
    if let Some(e) = s.eta_job_s {
        parts.push(format!("eta {}", duration(e)));
    }
    if !s.stragglers.is_empty() {
        parts.push(format!("{} straggler(s)", s.stragglers.len()));
    }
    if let Some(end) = &s.end {
        parts.push(format!("exit code {}: {}", end.code, end.summary));
    }
    parts.join(", ")
}

/// `45s`, `12m 05s`, `3h 07m`.
fn duration(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m {:02}s", s / 60, s % 60),
        _ => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
    }
}

/// An age, coarse: `4 s`, `12 min`, `5 h`, `3 days`.
fn ago(secs: f64) -> String {
    let s = secs.max(0.0) as u64;
    match s {
        0..=89 => format!("{s} s"),
        90..=5399 => format!("{} min", s / 60),
        5400..=172_799 => format!("{} h", s / 3600),
        _ => format!("{} days", s / 86_400),
    }
}

/// `0.4s` under ten seconds, else as `duration`.
fn idle_time(secs: f64) -> String {
    if secs < 10.0 {
        format!("{:.1}s", secs.max(0.0))
    } else {
        duration(secs)
    }
}

/// `512 MiB`, `1.2 GiB`.
fn bytes(b: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    let mib = b as f64 / MIB;
    if mib < 1024.0 {
        format!("{mib:.0} MiB")
    } else {
        format!("{:.1} GiB", mib / 1024.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun::job_record::status::{CheckpointMark, JobEnd, Shares, SlowKind};

    fn at(s: &str) -> SystemTime {
        humantime::parse_rfc3339(s).unwrap()
    }

    fn rank(rank: usize, host: &str, step: u64, compute: f64) -> RankStatus {
        RankStatus {
            rank,
            host: host.into(),
            device: format!("cuda:{}", rank % 2),
            phase: Some(Phase::Backward),
            step,
            idle_s: Some(0.1 * rank as f64),
            shares: Some(Shares {
                data_wait: 0.05,
                compute,
                comm: 0.95 - compute,
            }),
            rss_bytes: Some((1000 + rank as u64) << 20),
            gpu_bytes: Some(3 << 30),
        }
    }

    fn running() -> JobStatus {
        let mut s = JobStatus::starting(1, 4);
        s.state = JobState::Training;
        s.updated = "2030-01-01T00:00:00.000Z".into();
        (s.epoch, s.epochs, s.step, s.total_steps) = (2, 5, 120, 500);
        (s.epoch_step, s.steps_per_epoch) = (20, 100);
        s.images_per_s = Some(812.44);
        (s.eta_epoch_s, s.eta_job_s) = (Some(75.0), Some(4000.0));
        s.last_checkpoint = Some(CheckpointMark {
            step: 100,
            time: "2029-12-31T23:50:00.000Z".into(),
        });
        s.ranks = vec![
            rank(0, "node1", 120, 0.70),
            rank(1, "node1", 120, 0.72),
            rank(2, "node2", 120, 0.70),
            rank(3, "node2", 120, 0.71),
        ];
        s
    }

    fn straggler(rank: usize) -> Straggler {
        Straggler {
            rank,
            host: "node2".into(),
            device: "cuda:1".into(),
            kind: SlowKind::Compute,
            factor: 1.5,
            value: 0.9,
            median: 0.6,
            steps: 100,
            since_step: 20,
        }
    }

    fn ranks_of(rows: &[Vec<&RankStatus>]) -> Vec<Vec<usize>> {
        rows.iter()
            .map(|g| g.iter().map(|r| r.rank).collect())
            .collect()
    }

    #[test]
    fn the_ranks_of_a_host_that_agree_share_a_line() {
        let mut s = running();
        assert_eq!(
            ranks_of(&rank_rows(&s, false)),
            vec![vec![0, 1], vec![2, 3]]
        );
        assert_eq!(
            ranks_of(&rank_rows(&s, true)),
            vec![vec![0], vec![1], vec![2], vec![3]]
        );
        // A straggler, another step, another phase or shares apart: one line per rank.
        s.stragglers.push(straggler(3));
        assert_eq!(
            ranks_of(&rank_rows(&s, false)),
            vec![vec![0, 1], vec![2], vec![3]]
        );
        s.stragglers.clear();
        s.ranks[1].step = 119;
        assert_eq!(
            ranks_of(&rank_rows(&s, false)),
            vec![vec![0], vec![1], vec![2, 3]]
        );
        s.ranks[1].step = 120;
        s.ranks[2].phase = Some(Phase::GradientAllReduce);
        assert_eq!(
            ranks_of(&rank_rows(&s, false)),
            vec![vec![0, 1], vec![2], vec![3]]
        );
        s.ranks[2].phase = Some(Phase::Backward);
        s.ranks[3].shares = Some(Shares {
            data_wait: 0.05,
            compute: 0.80,
            comm: 0.15,
        });
        assert_eq!(
            ranks_of(&rank_rows(&s, false)),
            vec![vec![0, 1], vec![2], vec![3]]
        );
        // Hosts in the order of their first rank, whatever the order of the rows.
        s.ranks.reverse();
        assert_eq!(rank_rows(&s, false)[0][0].host, "node1");
    }

    #[test]
    fn a_folded_line_names_its_ranks_and_devices_as_ranges() {
        let text = render(
            &running(),
            Path::new("/logs"),
            at("2030-01-01T00:00:02Z"),
            false,
            None,
        );
        let line = text
            .lines()
            .find(|l| l.starts_with("node1"))
            .unwrap_or_default();
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "node1", "0-1", "cuda:0-1", "backward", "120", "0.1s", "5%", "71%", "24%", "1001",
                "MiB", "3.0", "GiB"
            ],
            "{text}"
        );
        assert!(text.contains("gpu memory"), "{text}");
    }

    #[test]
    fn the_header_says_where_the_job_is_and_how_old_the_file_is() {
        let text = render(
            &running(),
            Path::new("/logs"),
            at("2030-01-01T00:00:02Z"),
            false,
            None,
        );
        for want in [
            "state:      training, attempt 1, 4 rank(s) (updated 2 s ago)",
            "epoch:      2 of 5, step 20 of 100 in the epoch",
            "step:       120 of 500 (24.0%)",
            "speed:      812.4 images/s",
            "eta:        epoch 1m 15s, job 1h 06m",
            "checkpoint: step 100, 10 min ago",
        ] {
            assert!(text.contains(want), "{want:?} not in\n{text}");
        }
        assert!(!text.contains("stale"), "{text}");
    }

    #[test]
    fn a_running_job_whose_file_is_old_is_stale_and_an_ended_one_never() {
        let mut s = running();
        assert!(!is_stale(&s, at("2030-01-01T00:00:30Z")));
        assert!(is_stale(&s, at("2030-01-01T00:00:31Z")));
        let text = render(
            &s,
            Path::new("/logs"),
            at("2030-01-01T00:02:00Z"),
            false,
            None,
        );
        assert!(
            text.contains(
                "stale: not rewritten for 2 min while the job is training: it may have died \
                 without a word, or rank 0's host cannot write /logs; see `tchrun logs /logs`"
            ),
            "{text}"
        );
        // The writer's clock ahead of the reader's: not stale, updated 0 s ago.
        assert_eq!(age_s(&s.updated, at("2029-12-31T23:59:00Z")), Some(0.0));
        // A time that cannot be read says nothing of staleness.
        s.updated = "yesterday".into();
        assert!(!is_stale(&s, at("2031-01-01T00:00:00Z")));
        let s = JobStatus::ended(
            Some(running()),
            JobState::Finished,
            JobEnd {
                code: 0,
                summary: "model written to /out".into(),
                cause: None,
            },
        );
        assert!(!is_stale(&s, at("2040-01-01T00:00:00Z")));
    }

    #[test]
    fn an_ended_job_says_how_and_shows_the_failure() {
        let mut s = running();
        s.state = JobState::Failed;
        s.end = Some(JobEnd {
            code: 4,
            summary: "rank 3 failed first (host node2): killed by signal 9".into(),
            cause: None,
        });
        let text = render(
            &s,
            Path::new("/logs"),
            at("2030-01-01T00:00:02Z"),
            false,
            Some("tchrun: rank 3 failed first\n"),
        );
        assert!(
            text.contains(
                "ended:      exit code 4: rank 3 failed first (host node2): killed by signal 9 \
                 (ended 2 s ago)"
            ),
            "{text}"
        );
        // Issue 52 item 6: a stopped job's ranks show where they ended, not a live phase and
        // "idle 0.0s".
        assert!(
            text.contains("ended in backward") && !text.contains("0.1s") && !text.contains("0.3s"),
            "{text}"
        );
        assert!(text.ends_with("\ntchrun: rank 3 failed first\n"), "{text}");
        assert_eq!(
            change_line(&s),
            "failed (attempt 1), epoch 2/5, step 120/500, 812.4 images/s, eta 1h 06m, exit \
             code 4: rank 3 failed first (host node2): killed by signal 9"
        );
    }

    #[test]
    fn a_job_that_is_starting_has_no_rank_yet() {
        let mut s = JobStatus::starting(2, 8);
        s.updated = "2030-01-01T00:00:00Z".into();
        let text = render(&s, Path::new("/l"), at("2030-01-01T00:00:01Z"), false, None);
        assert_eq!(
            text,
            "log dir:    /l\nstate:      starting, attempt 2, 8 rank(s) (updated 1 s ago)\nno \
             rank has reported yet\n"
        );
        assert_eq!(change_line(&s), "starting (attempt 2)");
    }

    #[test]
    fn durations_ages_and_sizes_are_short() {
        assert_eq!(
            [5.4, 75.0, 3725.0].map(duration),
            ["5s", "1m 15s", "1h 02m"]
        );
        assert_eq!(
            [4.9, 120.0, 7200.0, 300_000.0].map(ago),
            ["4 s", "2 min", "2 h", "3 days"]
        );
        assert_eq!([0.44, 12.0].map(idle_time), ["0.4s", "12s"]);
        assert_eq!([512 << 20, 3 << 29].map(bytes), ["512 MiB", "1.5 GiB"]);
        assert!(interval("0.05").is_err());
        assert_eq!(interval("2"), Ok(2.0));
    }

    #[test]
    fn a_newer_or_broken_file_is_refused_in_words_and_an_output_leads_to_its_logs() {
        let t = tempfile::tempdir().unwrap();
        let logs = t.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        assert_eq!(read(&logs), Ok(None));
        assert_eq!(locate(t.path()).unwrap(), t.path());
        let mut s = running();
        s.write(&logs).unwrap();
        assert_eq!(locate(t.path()).unwrap(), logs);
        assert_eq!(read(&logs), Ok(Some(s.clone())));
        s.format_version = FORMAT_VERSION + 1;
        s.write(&logs).unwrap();
        let e = read(&logs).unwrap_err();
        assert!(e.contains("written by a newer tchrun (format 2"), "{e}");
        std::fs::write(
            JobStatus::path(&logs),
            r#"{"format_version": 9, "state": "new"}"#,
        )
        .unwrap();
        let e = read(&logs).unwrap_err();
        assert!(e.contains("newer tchrun (format 9"), "{e}");
        std::fs::write(JobStatus::path(&logs), "{").unwrap();
        let e = read(&logs).unwrap_err();
        assert!(e.contains("not a status.json this tchrun can read"), "{e}");
    }
}
