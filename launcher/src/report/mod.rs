//! A failure is data: reads the driver logs of a log directory, decides which rank failed
//! first and why, and renders the summary (terminal and `failure.json`); also the per-rank
//! overview of `tchrun logs DIR` and the end-of-run reports. Must not know how the ranks were
//! planned, started or supervised, nor the restart policy. `cause.rs`: the typed cause of the
//! first failing rank, from its record or the evidence of its death; `logs.rs`: `tchrun logs`
//! and which log directory a user means; `tensorboard.rs`: a TensorBoard command that runs
//! here.
pub mod cause;
pub mod logs;
pub mod reserve;
mod tensorboard;

use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use tchrun::driver_log::{self, FailureKind, FailureRecord, RankExit};
use tchrun::files;
pub use tchrun::job_record::FailureSummary;
use tchrun::job_record::{Classification, Record};

/// What a driver log says about its rank (read with `tchrun::driver_log`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RankLog {
    pub rank: usize,
    pub path: PathBuf,
    pub host: String,
    pub local_rank: Option<usize>,
    pub pid: Option<u32>,
    pub device: Option<String>,
    /// The code the rank recorded that it exits with (failure record or last line), if it got
    /// that far.
    pub exit_code: Option<i32>,
    /// `(images, compute s, communication s)` from the rank's summary line.
    pub summary: Option<(f64, f64, f64)>,
    /// Timestamp and text of the first ERROR event, if any.
    pub first_error: Option<(String, String)>,
    /// The rank's own account of its failure (the first failure record: the root cause).
    #[serde(default)]
    pub failure: Option<FailureRecord>,
    /// `(effective LR, --lr, their ratio as written)` from the training's first line.
    #[serde(default)]
    pub lr: Option<(f64, f64, String)>,
    /// How rank 0's address was chosen (the rank's `bootstrap: ...` line).
    #[serde(default)]
    pub bootstrap: Option<String>,
    /// The last meaningful lines before the failure record (all lines without one), stack
    /// frames left out.
    pub tail: Vec<String>,
}

const TAIL: usize = 15;

/// libtorch's C++ stack frames, Rust backtrace frames and blank lines: not shown in a tail.
fn is_noise(line: &str) -> bool {
    let t = line.trim_start();
    let rust_frame = t
        .split_once(": ")
        .is_some_and(|(n, _)| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        && line.starts_with(' ');
    t.starts_with("frame #")
        || t.starts_with("Exception raised from")
        || (t.starts_with("at ") && line.starts_with("  "))
        || rust_frame
        || t.is_empty()
}

/// Reads one driver log.
pub fn read_driver_log(path: &Path, rank: usize) -> Option<RankLog> {
    let bytes = files::read_bounded(path, files::caps::LOG).ok()?;
    let text = String::from_utf8_lossy(&bytes);
    let parsed = driver_log::parse(&text);
    let header = parsed.header.as_ref();
    let body: Vec<&String> = parsed
        .before_failure
        .iter()
        .filter(|l| !is_noise(l))
        .collect();
    let tail = body[body.len().saturating_sub(TAIL)..]
        .iter()
        .map(|l| l.to_string())
        .collect();
    Some(RankLog {
        rank,
        path: path.to_path_buf(),
        host: header.map(|h| h.host.clone()).unwrap_or_else(|| "?".into()),
        local_rank: header.map(|h| h.local_rank),
        pid: header.map(|h| h.pid),
        device: header.map(|h| h.device.clone()),
        exit_code: parsed.exit_code(),
        summary: parsed
            .summary
            .as_ref()
            .map(|s| (s.images, s.compute_s, s.communication_s)),
        first_error: parsed.first_error.clone(),
        failure: parsed.failure().cloned(),
        lr: parsed
            .training_start
            .as_ref()
            .map(|t| (t.effective_lr, t.lr, t.lr_factor.clone())),
        bootstrap: parsed.bootstrap.clone(),
        tail,
    })
}

/// All driver logs of a directory, by rank.
pub fn read_driver_logs(dir: &Path) -> Vec<RankLog> {
    let mut logs: Vec<RankLog> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .filter_map(|e| {
                    let name = e.file_name().to_string_lossy().to_string();
                    files::driver_log_rank(&name).and_then(|r| read_driver_log(&e.path(), r))
                })
                .collect()
        })
        .unwrap_or_default();
    logs.sort_by_key(|l| l.rank);
    logs
}

/// The newest write to any driver log (the ranks' progress, for the hang watchdog).
pub fn last_progress(dir: &Path) -> Option<std::time::SystemTime> {
    std::fs::read_dir(dir)
        .ok()?
        .flatten()
        .filter(|e| files::driver_log_rank(&e.file_name().to_string_lossy()).is_some())
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .max()
}

/// Whether a rank recorded that it exits with a non-zero code (its exit line or a failure
/// record with a code; read from the logs' tails only, so it is cheap enough to poll).
pub fn any_rank_failed(dir: &Path) -> bool {
    use std::io::{Read, Seek, SeekFrom};
    const TAIL_BYTES: u64 = 8192;
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten()
        .filter(|e| files::driver_log_rank(&e.file_name().to_string_lossy()).is_some())
        .any(|e| {
            let Ok((mut f, len)) = files::open_regular(&e.path(), u64::MAX) else {
                return false;
            };
            let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
            let mut bytes = Vec::new();
            let _ = f.take(TAIL_BYTES).read_to_end(&mut bytes);
            String::from_utf8_lossy(&bytes).lines().any(|l| {
                let exit = driver_log::parse_event(l)
                    .and_then(|ev| RankExit::parse(ev.message))
                    .map(|x| x.code);
                let recorded = FailureRecord::parse(l).and_then(|r| r.exit_code);
                exit.or(recorded).is_some_and(|c| c != 0)
            })
        })
}

/// Why a rank failed: `(time, classification, message)`. From its failure record when it wrote
/// one (the kind it knew, the message it had: a panic's own first line); otherwise from its
/// first ERROR line, classified by `guess`.
pub fn classify(log: &RankLog) -> Option<(String, String, String)> {
    if let Some(r) = &log.failure {
        return Some((
            r.time.clone(),
            r.kind.classification().to_string(),
            r.message.clone(),
        ));
    }
    let (time, msg) = log.first_error.clone()?;
    let class = guess(&msg).to_string();
    Some((time, class, msg))
}

/// A classification guessed from a log's words. Only for a log without a failure record: a rank
/// killed by SIGKILL (or the OOM killer) or cut off by a dead node writes nothing, and a log
/// written by an older tchrun-worker has none.
pub fn guess(text: &str) -> &'static str {
    let t = text.to_ascii_lowercase();
    if t.contains("out of memory") || t.contains("cannot allocate memory") {
        "out of memory"
    } else if t.contains("nan") && t.contains("loss") || t.contains("diverged") {
        "training diverged (NaN/inf loss)"
    } else if t.contains("nccl") || t.contains("cuda error") || t.contains("cudnn") {
        "CUDA/NCCL error"
    } else if t.contains("dataseterror")
        || t.contains("badimage")
        || t.contains("image") && t.contains("decode")
    {
        "data error"
    } else if t.contains("no space left on device")
        || t.contains("read-only file system")
        || t.contains("disk quota exceeded")
    {
        "I/O error"
    } else if t.contains("invalidmodeldirectoryerror") || t.contains("invalid") {
        "invalid input"
    } else if t.contains("connection")
        || t.contains("timed out")
        || t.contains("gloo")
        || t.contains("c10d")
    {
        "communication error (a peer failed or the network is unreachable)"
    } else {
        "error"
    }
}

/// A rank's own error line on the console (`tchrun-worker: error: ...`, the first one that is
/// not a stop the launcher caused): the cause of a rank whose log holds none, because it could
/// not write it (a full disk, a log directory it cannot write) and said so only there.
pub fn console_error(tail: &[String]) -> Option<String> {
    const PREFIX: &str = "tchrun-worker: error: ";
    tail.iter()
        .filter(|l| !l.contains("tchrun-worker: error: stopped by signal"))
        .find_map(|l| l.split_once(PREFIX).map(|(_, m)| m.trim().to_string()))
        .filter(|m| !m.is_empty())
}

/// A rank failed first: `culprit`'s log when there is one (its cause, time and tail), else
/// what its process's end says. `code` is the rank's exit code, `exit_status` tchrun's.
pub fn rank_failure(
    culprit: Option<&RankLog>,
    code: i32,
    signal: Option<i32>,
    at: std::time::SystemTime,
    exit_status: i32,
) -> FailureSummary {
    let cause = culprit.and_then(classify);
    let (message, classification) = match &cause {
        Some((_, class, msg)) => (msg.clone(), Classification::parse(class)),
        None => match signal {
            Some(s) => (
                format!("killed by signal {s}"),
                Classification::KilledBySignal,
            ),
            None if code > 128 => (
                format!("killed by signal {}", code - 128),
                Classification::KilledBySignal,
            ),
            None => (
                format!("exited with code {code}"),
                Classification::Rank(FailureKind::Internal),
            ),
        },
    };
    FailureSummary {
        rank: culprit.map(|c| c.rank),
        host: culprit.map(|c| c.host.clone()),
        local_rank: culprit.and_then(|c| c.local_rank),
        exit_code: Some(code),
        signal,
        time: cause
            .map(|c| c.0)
            .or_else(|| Some(humantime::format_rfc3339_millis(at).to_string())),
        classification,
        message,
        log: culprit.map(|c| c.path.clone()),
        tail: culprit.map(|c| c.tail.clone()).unwrap_or_default(),
        exit_status,
        earlier_attempts: Vec::new(),
        not_restarted: None,
        hang: None,
        cause: None,
    }
}

/// When a rank failed: its failure record's time, else its first ERROR line's.
fn failed_at(l: &RankLog) -> Option<std::time::SystemTime> {
    let t = l
        .failure
        .as_ref()
        .map(|r| r.time.as_str())
        .or(l.first_error.as_ref().map(|e| e.0.as_str()))?;
    humantime::parse_rfc3339_weak(t).ok()
}

/// Picks the first failing rank: the earliest failure (record or first ERROR) among the logs,
/// else `hint_rank` (what mpirun or the supervisor saw exit first).
pub fn first_failing(logs: &[RankLog], hint_rank: Option<usize>) -> Option<&RankLog> {
    let failed = |l: &RankLog| l.failure.is_some() || l.first_error.is_some();
    // A rank stopped by a signal someone else sent it (its record names the sender) is the
    // root cause over the ranks that stopped with it, whichever recorded first.
    let signalled = |l: &RankLog| {
        l.failure.as_ref().is_some_and(|f| {
            f.kind == tchrun::driver_log::FailureKind::Interrupted
                && f.message.contains(" from pid ")
                && !f.message.contains("its launcher")
        })
    };
    let by_error = logs.iter().filter(|l| failed(l)).min_by_key(|l| {
        (
            !signalled(l),
            failed_at(l).unwrap_or(std::time::SystemTime::UNIX_EPOCH),
        )
    });
    match (hint_rank, by_error) {
        (Some(r), Some(e)) => {
            // A rank that died without an ERROR line (killed) is the root cause over peers
            // that merely lost it afterwards.
            let hinted = logs.iter().find(|l| l.rank == r);
            match hinted {
                Some(h) if !failed(h) => Some(h),
                _ => Some(e),
            }
        }
        (None, Some(e)) => Some(e),
        (Some(r), None) => logs.iter().find(|l| l.rank == r),
        (None, None) => None,
    }
}

/// Renders a summary for the terminal.
pub fn render(s: &FailureSummary, log_dir: &Path) -> String {
    let mut out = String::new();
    if s.hang.is_some() {
        // The verdict, the stacks and each rank's last line are the message.
        out.push_str("tchrun: the job hung and was stopped\n  ");
        out.push_str(&s.message.replace('\n', "\n  "));
        out.push('\n');
        return out;
    }
    match s.rank {
        Some(r) => {
            out.push_str(&format!(
                "tchrun: rank {r} failed first (host {}, local rank {})",
                s.host.as_deref().unwrap_or("?"),
                s.local_rank
                    .map(|l| l.to_string())
                    .unwrap_or_else(|| "?".into())
            ));
            if let Some(c) = s.exit_code {
                out.push_str(&format!(", exit code {c}"));
            }
            if let Some(sig) = s.signal {
                out.push_str(&format!(", killed by signal {sig}"));
            }
            if let Some(t) = &s.time {
                out.push_str(&format!(", at {t}"));
            }
            out.push('\n');
        }
        None => out.push_str("tchrun: the job failed\n"),
    }
    out.push_str(&format!("  cause: {}: {}\n", s.classification, s.message));
    if let Some(c) = &s.cause {
        out.push_str(&format!("  why: {}: {}\n", c.class(), c.detail()));
        out.push_str(&format!("  fix: {}\n", c.advice()));
    }
    match &s.log {
        Some(p) => {
            out.push_str(&format!("  last lines of {}:\n", p.display()));
            for l in &s.tail {
                out.push_str(&format!("    | {l}\n"));
            }
        }
        None => out.push_str(&format!(
            "  no driver log was written; see {} for the launcher's output\n",
            files::mpi_log(log_dir).display()
        )),
    }
    out
}

/// The failure in one line (`status.json`'s end): who failed first, and why.
pub fn one_line(s: &FailureSummary) -> String {
    let message = s.message.lines().next().unwrap_or_default();
    if s.hang.is_some() {
        return format!("the job hung: {message}");
    }
    let mut what = if message.starts_with(s.classification.as_str()) {
        message.to_string()
    } else {
        format!("{}: {message}", s.classification)
    };
    if let Some(c) = &s.cause {
        what.push_str(&format!(" ({})", c.class()));
    }
    match s.rank {
        Some(r) => format!(
            "rank {r} failed first (host {}): {what}",
            s.host.as_deref().unwrap_or("?")
        ),
        None => format!("the job failed: {what}"),
    }
}

/// Writes `failure.json` (best effort: the summary is also printed).
pub fn write_summary(log_dir: &Path, s: &FailureSummary) {
    // The space held for it since the attempt started: a full disk still gets its summary.
    reserve::release(log_dir);
    if let Err(e) = s.write(log_dir) {
        errln!(
            "tchrun: warning: cannot write {}: {e}; the summary printed here is the only one",
            log_dir.join(files::FAILURE_JSON).display()
        );
    }
}

/// Distinct image files the ranks dropped under `--skip-bad-images` (each rank names each file
/// once, with the `files::SKIPPED_IMAGE` prefix; several ranks may meet the same file).
pub fn skipped_images(logs: &[RankLog]) -> usize {
    let mut named = std::collections::BTreeSet::new();
    for l in logs {
        let Ok(text) = files::read_bounded_string(&l.path, files::caps::LOG) else {
            continue;
        };
        for line in text.lines() {
            if let Some(rest) = line.split(files::SKIPPED_IMAGE).nth(1) {
                let file = rest.split(" (--skip-bad-images)").next().unwrap_or(rest);
                named.insert(file.to_string());
            }
        }
    }
    named.len()
}

/// The end-of-run report from the ranks' summaries: throughput, slowest rank, LR used.
pub fn run_report(logs: &[RankLog]) {
    if let Some(line) = run_report_line(logs) {
        outln!("{line}");
    }
}

/// The end-of-run report's line; `None` when no rank left its summary. One rank's report has
/// its compute time only (its communication is with itself).
pub fn run_report_line(logs: &[RankLog]) -> Option<String> {
    let with: Vec<&RankLog> = logs.iter().filter(|l| l.summary.is_some()).collect();
    if with.is_empty() {
        return None;
    }
    let images: f64 = with.iter().filter_map(|l| l.summary.map(|s| s.0)).sum();
    let wall = with
        .iter()
        .filter_map(|l| l.summary.map(|s| s.1 + s.2))
        .fold(0.0f64, f64::max);
    let slowest = with
        .iter()
        .max_by(|a, b| {
            let (x, y) = (
                a.summary.map(|s| s.1).unwrap_or(0.0),
                b.summary.map(|s| s.1).unwrap_or(0.0),
            );
            x.partial_cmp(&y).unwrap_or(std::cmp::Ordering::Equal)
        })
        .copied();
    let lr = logs
        .iter()
        .find(|l| l.rank == 0)
        .and_then(|l| l.lr.as_ref())
        .map(|(eff, lr, factor)| format!("{eff:e} (--lr {lr:e} × {factor})"));
    let mut line = format!(
        "tchrun: run report: {}, {:.1} images/s in training steps",
        tchrun::counts::ranks(with.len()),
        images / wall.max(1e-9)
    );
    if let Some(s) = slowest {
        let (_, c, m) = s.summary.unwrap_or_default();
        line.push_str(&if with.len() == 1 {
            format!("; rank {} ({}): compute {:.1}s", s.rank, s.host, c)
        } else {
            format!(
                "; slowest rank {} ({}): compute {:.1}s, communication {:.1}s",
                s.rank, s.host, c, m
            )
        });
    }
    if let Some(lr) = lr {
        line.push_str(&format!("; effective LR {lr}"));
    }
    let skipped = skipped_images(logs);
    if skipped > 0 {
        line.push_str(&format!(
            "; {skipped} bad image(s) skipped (--skip-bad-images), named in the driver logs"
        ));
    }
    Some(line)
}

/// After a successful training job: the verdict on what limited the training steps
/// (input-, compute- or communication-bound, with the flag to change), from `metrics.jsonl`'s
/// time split, and where the TensorBoard events are. Rows that do not parse are skipped.
pub fn training_report(output: &Path) -> Vec<String> {
    let rows: Vec<tchrun::metrics::EpochMetrics> =
        files::read_bounded_string(&output.join(files::METRICS_JSONL), files::caps::LOG)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
    let mut lines = Vec::new();
    if let Some(v) = tchrun::metrics::verdict(&rows) {
        lines.push(format!("tchrun: {}", v.line()));
    }
    for s in tchrun::metrics::straggler_lines(&rows) {
        lines.push(format!("tchrun: {s}"));
    }
    let tb = output.join(tchrun::files::TENSORBOARD_DIR);
    if tb.is_dir() {
        lines.push(format!(
            "tchrun: TensorBoard: {}",
            tensorboard::command(&tb)
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun::driver_log::{
        Event, FailureKind, Header, Level, Progress, RankExit, RankSummary, TrainingStart,
    };

    fn event(level: Level, message: &str) -> String {
        Event {
            time: "2026-11-24T00:00:01.000001Z",
            level,
            message,
        }
        .write()
    }

    /// A rank that could not write its log said why on the console only: that line is the
    /// cause (the ranks the launcher stopped after it are not), and a full disk is an I/O error.
    #[test]
    fn a_ranks_console_error_is_the_cause_when_its_log_has_none() {
        let tail: Vec<String> = [
            "tchrun: rank   0 -> vm (local rank 0, cpu), log /d/70_driver_log_0",
            "vm:1 tchrun-worker: error: stopped by signal 15 (SIGTERM)",
            "tchrun-worker: error: cannot write the driver log in /d (check --log-dir): No \
             space left on device (os error 28)",
            "Primary job  terminated normally, but 1 process returned",
        ]
        .map(String::from)
        .to_vec();
        let m = console_error(&tail).expect("the rank's own words");
        assert!(m.starts_with("cannot write the driver log in /d"), "{m}");
        assert_eq!(guess(&m), "I/O error");
        assert_eq!(console_error(&tail[..2]), None);
    }

    fn write_log(dir: &Path, rank: usize, body: &[String]) -> PathBuf {
        let header = Header {
            host: format!("node-{rank}"),
            rank,
            local_rank: rank,
            world_size: 2,
            pid: 100 + rank as u32,
            device: "cpu".into(),
            backend: "gloo".into(),
            started_by: "Local".into(),
            tchrun: "0".into(),
            torch: "0".into(),
            command: "tchrun-worker train".into(),
            started: "2026-11-24T00:00:00.000Z".into(),
        };
        let mut text = header.write();
        for l in body {
            text.push_str(l);
            text.push('\n');
        }
        let path = files::driver_log(dir, rank);
        std::fs::write(&path, text).expect("write log");
        path
    }

    #[test]
    fn a_log_is_read_by_the_contract_and_classified_by_its_record() {
        let dir = std::env::temp_dir().join(format!(
            "tchrun-report-test-{}-{:?}",
            std::process::id(),
            std::time::SystemTime::now()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let start = TrainingStart {
            arch: "resnet18".into(),
            train_images: 10,
            valid_images: 2,
            classes: 2,
            world_size: 2,
            device: "cpu".into(),
            steps_per_epoch: 1,
            effective_lr: 0.05,
            lr: 0.025,
            lr_factor: "2".into(),
            bucket_cap_mb: 25.0,
        };
        let progress = Progress {
            epoch: 1,
            epochs: 1,
            iter: 1,
            iters: 1,
            loss: 1.0,
            lr: 0.05,
            images_per_s: 10.0,
            eta: std::time::Duration::from_secs(0),
        };
        let record = FailureRecord {
            rank: 0,
            host: "node-0".into(),
            pid: 100,
            time: "2026-11-24T00:00:02.000Z".into(),
            kind: FailureKind::Panic,
            message: "Output size is too small".into(),
            location: Some("tensor_generated.rs:1:1".into()),
            exit_code: None,
        };
        let mut last = record.clone();
        last.exit_code = Some(4);
        write_log(
            &dir,
            0,
            &[
                event(Level::Info, &start.write()),
                event(Level::Info, &progress.write()),
                record.write(),
                event(Level::Error, "rank 0 panicked: panicked at x.rs:1:1:"),
                "   0: std::backtrace::Backtrace::force_capture".into(),
                "             at /rustc/library/std/src/backtrace.rs:1:1".into(),
                last.write(),
                event(Level::Info, &RankExit { code: 4 }.write()),
            ],
        );
        let summary = RankSummary {
            images: 10.0,
            compute_s: 1.0,
            communication_s: 0.5,
        };
        write_log(
            &dir,
            1,
            &[
                event(Level::Error, "c10d broadcast: Connection closed by peer"),
                event(Level::Info, &summary.write()),
                event(Level::Info, &RankExit { code: 4 }.write()),
            ],
        );
        let logs = read_driver_logs(&dir);
        assert_eq!(logs.len(), 2);
        let l0 = &logs[0];
        assert_eq!(
            (l0.host.as_str(), l0.pid, l0.exit_code),
            ("node-0", Some(100), Some(4))
        );
        assert_eq!(l0.lr, Some((0.05, 0.025, "2".to_string())));
        assert_eq!(l0.tail.len(), 2, "{:?}", l0.tail);
        assert!(l0.tail[1].contains("epoch 1/1 iter 1/1"), "{:?}", l0.tail);
        let (time, class, msg) = classify(l0).expect("a cause");
        assert_eq!(
            (time.as_str(), class.as_str(), msg.as_str()),
            (
                "2026-11-24T00:00:02.000Z",
                "crash (panic)",
                "Output size is too small"
            )
        );
        // No record: the old guess from the first ERROR line.
        let l1 = &logs[1];
        assert_eq!(l1.summary, Some((10.0, 1.0, 0.5)));
        let (_, class, _) = classify(l1).expect("a cause");
        assert!(class.starts_with("communication error"), "{class}");
        // Without a hint the earliest failure (record or ERROR line) is the first.
        assert_eq!(first_failing(&logs, None).map(|l| l.rank), Some(1));
        assert!(any_rank_failed(&dir));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_training_report_gives_the_verdict_from_metrics_jsonl() {
        let dir = std::env::temp_dir().join(format!("tchrun-verdict-{}", std::process::id()));
        std::fs::create_dir_all(dir.join(tchrun::files::TENSORBOARD_DIR)).expect("mkdir");
        assert_eq!(
            training_report(&dir).len(),
            1,
            "no metrics.jsonl: no verdict"
        );
        let row = |wait: f64, compute: f64| {
            format!(
                r#"{{"schema":1,"epoch":1,"train_loss":1,"train_images_per_sec":1,"val_loss":1,"top1":0,"top5":0,"lr":0.1,"epoch_time_s":1,"time":"t","step_time_s":10,"data_wait_s":{wait},"compute_s":{compute},"comm_s":1,"data_wait_max_s":{wait},"compute_max_s":{compute},"comm_max_s":1}}"#
            )
        };
        let jsonl = dir.join(files::METRICS_JSONL);
        std::fs::write(
            &jsonl,
            format!("{}\nnot json\n{}\n", row(6.0, 3.0), row(5.0, 4.0)),
        )
        .expect("write");
        let lines = training_report(&dir);
        assert!(
            lines[0].starts_with("tchrun: input-bound: data wait 55% (slowest rank 55%)"),
            "{lines:?}"
        );
        assert!(lines[1].contains("tensorboard --logdir"), "{lines:?}");
        std::fs::write(&jsonl, row(1.0, 8.0)).expect("write");
        assert!(training_report(&dir)[0].starts_with("tchrun: compute-bound: "));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
