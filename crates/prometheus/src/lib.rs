//! `--prometheus-textfile DIR`: a job's `status.json` ([`JobStatus`]) as a `.prom` file in
//! Prometheus' text exposition format (version 0.0.4), for node_exporter's textfile collector
//! (`--collector.textfile.directory DIR`). Rank 0's status thread rewrites it while the job
//! runs and the launcher writes the end; both through [`Textfile::write`] (temp file in DIR,
//! then rename: node_exporter reads only `*.prom`, never half a file). Owns the metric names,
//! their types, help and labels, and the job id; [`render`] is pure (the clock passed in).
//!
//! Every metric carries `job_id` (not `job`, which Prometheus sets to the scrape job's name:
//! a `job` label of the file would be renamed `exported_job`); per-rank metrics add `rank`
//! and `host`. All are gauges: they say where the job is, and a restart from a checkpoint
//! moves the step back.
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::SystemTime;
use tchrun::job_record::status::{JobState, JobStatus};

/// The flag, as messages name it.
pub const FLAG: &str = "--prometheus-textfile";

/// How often rank 0 rewrites the file while the job runs (besides each change of state).
pub const EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// The mode of the file: node_exporter runs as a user of its own and must read it (it holds
/// what the scrape publishes anyway).
pub const FILE_MODE: u32 = 0o644;

/// Where one job's metrics go: `DIR/tchrun_<job>.prom` (rank 0's host: the job and its host's
/// ranks), or `DIR/tchrun_<job>_<host>.prom` (each other host: its own ranks, written by its
/// local rank 0). Every rank's series is in exactly one host's file.
#[derive(Debug, Clone, PartialEq)]
pub struct Textfile {
    pub dir: PathBuf,
    pub job: String,
    /// `Some`: the file of this host's ranks (a host other than rank 0's).
    pub host: Option<String>,
}

impl Textfile {
    /// The file of the job whose `--output` is `output` (made absolute here, as the launcher
    /// passes it to the ranks: the launcher and rank 0 name the same file).
    pub fn new(dir: &Path, output: &Path) -> Textfile {
        let output = std::path::absolute(output).unwrap_or_else(|_| output.to_path_buf());
        Textfile {
            dir: dir.to_path_buf(),
            job: job_id(&output),
            host: None,
        }
    }

    /// The same job's file of `host`'s ranks (a host other than rank 0's).
    pub fn for_host(&self, host: &str) -> Textfile {
        Textfile {
            host: Some(host.to_string()),
            ..self.clone()
        }
    }

    /// `DIR/tchrun_<job>.prom`, or `DIR/tchrun_<job>_<host>.prom` for a host's file.
    pub fn path(&self) -> PathBuf {
        match &self.host {
            None => self.dir.join(format!("tchrun_{}.prom", self.job)),
            Some(h) => self
                .dir
                .join(format!("tchrun_{}_{}.prom", self.job, file_safe(h, 64))),
        }
    }

    /// Replaces the file with `status` as of `now` (atomically: temp file, fsync, rename).
    /// Rank 0's file has the job and the ranks on rank 0's host; a host's file the ranks on
    /// that host ([`render_host`]).
    pub fn write(
        &self,
        status: &JobStatus,
        now: SystemTime,
    ) -> Result<(), tchrun::files::AtomicWriteError> {
        let text = match &self.host {
            None => {
                let first = status.ranks.iter().find(|r| r.rank == 0);
                render_in(status, &self.job, now, first.map(|r| r.host.as_str()))
            }
            Some(h) => render_host(status, &self.job, h, now),
        };
        tchrun::files::write_atomic_mode(&self.path(), text.as_bytes(), FILE_MODE)
    }
}

/// `s` with letters, digits, `-` and `_` kept, anything else `_`, at most `max` characters.
fn file_safe(s: &str, max: usize) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .take(max)
        .collect()
}

/// A job's id: `--output`'s folder name (letters, digits, `-` and `_` kept, anything else
/// `_`, at most 48 characters) and 8 hex digits of the SHA-256 of its absolute path, as
/// `resnet-lr0.1-3f2a9c1b`: readable, safe in a file name and a label, the same for every
/// attempt, resume and requeue of the job (they share `--output`), and two jobs whose
/// outputs have the same name in different places do not share a file.
pub fn job_id(output: &Path) -> String {
    use sha2::Digest;
    let name = file_safe(
        &output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        48,
    );
    let hash = sha2::Sha256::digest(output.as_os_str().as_encoded_bytes());
    let hex: String = hash[..4].iter().map(|b| format!("{b:02x}")).collect();
    if name.is_empty() {
        format!("job-{hex}")
    } else {
        format!("{name}-{hex}")
    }
}

/// The launcher's pre-flight: DIR must be an existing directory this user can write (it is
/// node_exporter's textfile directory: never created here, so that a typo is not a job that
/// publishes nowhere). Checked without writing (a dry run writes nothing).
pub fn check_dir(dir: &Path) -> Result<(), String> {
    use nix::unistd::{access, AccessFlags};
    let fix = "create it, or name node_exporter's --collector.textfile.directory";
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("{FLAG} {}: not a directory; {fix}", dir.display())),
        Err(e) => return Err(format!("{FLAG} {}: {e}; {fix}", dir.display())),
    }
    access(dir, AccessFlags::W_OK | AccessFlags::X_OK).map_err(|e| {
        format!(
            "{FLAG} {}: not writable by this user ({e}); make it writable (e.g. group-writable \
             by a group of yours) or choose another directory",
            dir.display()
        )
    })
}

/// The coarse state of the file's `tchrun_state` gauge.
const STATES: [&str; 6] = [
    "starting", "running", "stopping", "finished", "failed", "stopped",
];

fn coarse(state: JobState) -> &'static str {
    match state {
        JobState::Starting => "starting",
        JobState::Training | JobState::Validating | JobState::Checkpointing => "running",
        JobState::Stopping => "stopping",
        JobState::Finished => "finished",
        JobState::Failed => "failed",
        JobState::Stopped => "stopped",
    }
}

/// One metric family being written: its samples follow its HELP and TYPE lines.
struct Exposition {
    text: String,
}

type Labels<'a> = Vec<(&'a str, String)>;

impl Exposition {
    /// A gauge with its samples (nothing at all when it has none).
    fn gauge(&mut self, name: &str, help: &str, samples: &[(Labels, f64)]) {
        if samples.is_empty() {
            return;
        }
        let _ = writeln!(self.text, "# HELP {name} {}", escape_help(help));
        let _ = writeln!(self.text, "# TYPE {name} gauge");
        for (labels, value) in samples {
            let inner: Vec<String> = labels
                .iter()
                .map(|(k, v)| format!("{k}=\"{}\"", escape_label(v)))
                .collect();
            let _ = writeln!(
                self.text,
                "{name}{{{}}} {}",
                inner.join(","),
                number(*value)
            );
        }
    }
}

fn escape_help(s: &str) -> String {
    s.replace('\\', "\\\\").replace('\n', "\\n")
}

fn escape_label(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// A sample value as the format writes it (`NaN`, `+Inf`, `-Inf`; else Rust's shortest
/// round-trip decimal).
fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else if v == f64::INFINITY {
        "+Inf".into()
    } else if v == f64::NEG_INFINITY {
        "-Inf".into()
    } else {
        format!("{v}")
    }
}

fn unix_seconds(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// An RFC 3339 time of the status as Unix seconds.
fn parse_time(t: &str) -> Option<SystemTime> {
    humantime::parse_rfc3339(t)
        .or_else(|_| humantime::parse_rfc3339_weak(t))
        .ok()
}

/// `status` as the text exposition format, as of `now` (the writer's clock): the job and
/// every rank in it.
pub fn render(status: &JobStatus, job: &str, now: SystemTime) -> String {
    render_in(status, job, now, None)
}

/// A host's file (`Textfile::for_host`): the state of its ranks' writer (labels `job_id` and
/// `host`: running while they train, their end once they ended), when it was written, and the
/// per-rank series of the ranks on `host` (the same names as in rank 0's file, which leaves
/// them out). The job's own series (step, images/s, ...) are in rank 0's file only.
pub fn render_host(status: &JobStatus, job: &str, host: &str, now: SystemTime) -> String {
    let mut out = Exposition {
        text: String::new(),
    };
    let labels =
        || -> Labels<'static> { vec![("job_id", job.to_string()), ("host", host.to_string())] };
    out.gauge(
        "tchrun_state",
        STATE_HELP,
        &state_samples(status.state, &labels),
    );
    out.gauge(
        "tchrun_updated_timestamp_seconds",
        UPDATED_HELP,
        &[(labels(), unix_seconds(now))],
    );
    ranks(&mut out, status, job, Some(host));
    out.text
}

const STATE_HELP: &str = "The job's state: 1 for the current one (running: training, \
                          validating or checkpointing; with a host label: that host's ranks').";

const UPDATED_HELP: &str = "When this file was written (Unix time): a running job's file that \
                            stops moving lost its writer.";

/// `tchrun_state`'s samples: 1 for `state`'s coarse state, 0 for the others.
fn state_samples(
    state: JobState,
    labels: &dyn Fn() -> Labels<'static>,
) -> Vec<(Labels<'static>, f64)> {
    let state = coarse(state);
    STATES
        .iter()
        .map(|s| {
            let mut l = labels();
            l.push(("state", s.to_string()));
            (l, if *s == state { 1.0 } else { 0.0 })
        })
        .collect()
}

/// [`render`] with the per-rank series of the ranks on `ranks_on` only (all when `None`).
fn render_in(status: &JobStatus, job: &str, now: SystemTime, ranks_on: Option<&str>) -> String {
    let mut out = Exposition {
        text: String::new(),
    };
    let job_labels = || -> Labels<'static> { vec![("job_id", job.to_string())] };
    let one = |v: f64| vec![(job_labels(), v)];
    let some = |v: Option<f64>| v.map(one).unwrap_or_default();
    let ended = status.state.is_end();
    out.gauge(
        "tchrun_state",
        STATE_HELP,
        &state_samples(status.state, &job_labels),
    );
    let failure = status
        .end
        .as_ref()
        .filter(|_| matches!(status.state, JobState::Failed | JobState::Stopped))
        .and_then(|e| e.cause_class().map(|c| (c, e.code)));
    if let Some((cause, code)) = failure {
        let mut l = job_labels();
        l.push(("cause", cause));
        l.push(("exit_code", code.to_string()));
        out.gauge(
            "tchrun_failure_info",
            "Why the job ended without its model: the cause's class (failure.json) and tchrun's \
             exit code.",
            &[(l, 1.0)],
        );
    }
    out.gauge(
        "tchrun_exit_code",
        "The exit code tchrun ended with (0: the model is written).",
        &some(status.end.as_ref().map(|e| f64::from(e.code))),
    );
    out.gauge(
        "tchrun_attempt",
        "The attempt of a --max-restarts job (1 for the first).",
        &one(f64::from(status.attempt)),
    );
    out.gauge(
        "tchrun_world_size",
        "Ranks of the job.",
        &one(status.world_size as f64),
    );
    out.gauge(
        "tchrun_epoch",
        "The epoch in progress (1-based; 0 before the first).",
        &one(f64::from(status.epoch)),
    );
    out.gauge(
        "tchrun_epochs",
        "Epochs the run trains (--epochs).",
        &one(f64::from(status.epochs)),
    );
    out.gauge(
        "tchrun_step",
        "Optimizer steps done (a resumed run counts the steps before the resume).",
        &one(status.step as f64),
    );
    out.gauge(
        "tchrun_steps",
        "Optimizer steps the run makes in all.",
        &one(status.total_steps as f64),
    );
    out.gauge(
        "tchrun_images_per_second",
        "Training images per second over all ranks, over the last window of steps.",
        &some(status.images_per_s),
    );
    out.gauge(
        "tchrun_loss",
        "Training loss, averaged over the ranks and the last window of steps.",
        &some(status.loss),
    );
    out.gauge(
        "tchrun_learning_rate",
        "The learning rate of the last step.",
        &some(status.lr),
    );
    out.gauge(
        "tchrun_eta_seconds",
        "Seconds left to the job's last training step at this attempt's pace (validation not \
         included).",
        &some(status.eta_job_s.filter(|_| !ended)),
    );
    out.gauge(
        "tchrun_epoch_eta_seconds",
        "Seconds left to the epoch's last training step.",
        &some(status.eta_epoch_s.filter(|_| !ended)),
    );
    times(&mut out, status, now, &job_labels);
    ranks(&mut out, status, job, ranks_on);
    out.text
}

/// The job's times: its start, its last step, its last checkpoint, this file.
fn times(
    out: &mut Exposition,
    status: &JobStatus,
    now: SystemTime,
    job_labels: &dyn Fn() -> Labels<'static>,
) {
    let one = |v: f64| vec![(job_labels(), v)];
    let at = |t: Option<&String>| t.and_then(|t| parse_time(t));
    let ago = |t: SystemTime| now.duration_since(t).map_or(0.0, |d| d.as_secs_f64());
    let ended = status.state.is_end();
    let started = at(status.started.as_ref());
    let last_step = at(status.last_step.as_ref());
    let checkpoint = status.last_checkpoint.as_ref();
    let checkpoint_at = at(checkpoint.map(|c| &c.time));
    let samples = [
        (
            "tchrun_start_timestamp_seconds",
            "When the attempt's ranks started training (Unix time).",
            started.map(unix_seconds),
        ),
        (
            "tchrun_last_step_timestamp_seconds",
            "When the job's step last advanced (Unix time, rank 0's clock).",
            last_step.map(unix_seconds),
        ),
        (
            "tchrun_seconds_since_last_step",
            "Seconds since the job's step last advanced, when this file was written (absent \
             once the job ended).",
            last_step.filter(|_| !ended).map(ago),
        ),
        (
            "tchrun_last_checkpoint_step",
            "The step the newest complete checkpoint holds.",
            checkpoint.map(|c| c.step as f64),
        ),
        (
            "tchrun_last_checkpoint_timestamp_seconds",
            "When the newest complete checkpoint was written (Unix time).",
            checkpoint_at.map(unix_seconds),
        ),
        (
            "tchrun_last_checkpoint_age_seconds",
            "Seconds since the newest complete checkpoint was written, when this file was \
             written.",
            checkpoint_at.map(ago),
        ),
        (
            "tchrun_updated_timestamp_seconds",
            UPDATED_HELP,
            Some(unix_seconds(now)),
        ),
        (
            "tchrun_stragglers",
            "Ranks slower than the others now (tchrun_rank_straggler names them).",
            Some(status.stragglers.len() as f64),
        ),
    ];
    for (name, help, value) in samples {
        out.gauge(name, help, &value.map(one).unwrap_or_default());
    }
}

/// One series a rank (labels `job_id`, `rank`, `host`); only the ranks on `on` when given.
fn ranks(out: &mut Exposition, status: &JobStatus, job: &str, on: Option<&str>) {
    let kept = |host: &str| on.is_none_or(|h| h == host);
    let mut status = status.clone();
    status.ranks.retain(|r| kept(&r.host));
    status.stragglers.retain(|s| kept(&s.host));
    let status = &status;
    let ended = status.state.is_end();
    let labels = |rank: usize, host: &str| -> Labels<'static> {
        vec![
            ("job_id", job.to_string()),
            ("rank", rank.to_string()),
            ("host", host.to_string()),
        ]
    };
    let per_rank = |f: &dyn Fn(&tchrun::job_record::status::RankStatus) -> Option<f64>| {
        status
            .ranks
            .iter()
            .filter_map(|r| f(r).map(|v| (labels(r.rank, &r.host), v)))
            .collect::<Vec<_>>()
    };
    out.gauge(
        "tchrun_rank_step",
        "The rank's optimizer step (its heartbeat).",
        &per_rank(&|r| Some(r.step as f64)),
    );
    let phases: Vec<(Labels, f64)> = status
        .ranks
        .iter()
        .filter_map(|r| {
            let phase = serde_json::to_value(r.phase?).ok()?.as_str()?.to_string();
            let mut l = labels(r.rank, &r.host);
            l.push(("phase", phase));
            Some((l, 1.0))
        })
        .collect();
    out.gauge(
        "tchrun_rank_phase",
        "What the rank is doing (its heartbeat's phase, as heartbeat-<rank>.json names it): 1.",
        &phases,
    );
    out.gauge(
        "tchrun_rank_seconds_since_progress",
        "Seconds since the rank's step, collective or validation batch last advanced (rank 0's \
         clock; absent once the job ended).",
        &per_rank(&|r| r.idle_s.filter(|_| !ended)),
    );
    let mut shares = Vec::new();
    for r in &status.ranks {
        let Some(s) = r.shares else { continue };
        for (part, v) in [
            ("data_wait", s.data_wait),
            ("compute", s.compute),
            ("comm", s.comm),
        ] {
            let mut l = labels(r.rank, &r.host);
            l.push(("part", part.to_string()));
            shares.push((l, v));
        }
    }
    out.gauge(
        "tchrun_rank_time_ratio",
        "Share of the last window's wall time the rank spent waiting for its loader \
         (data_wait), computing (compute) and in the communication backward did not hide \
         (comm), 0 to 1.",
        &shares,
    );
    out.gauge(
        "tchrun_rank_resident_memory_bytes",
        "The rank's resident memory.",
        &per_rank(&|r| r.rss_bytes.map(|b| b as f64)),
    );
    out.gauge(
        "tchrun_rank_gpu_memory_bytes",
        "Device memory the rank's tensors hold (CUDA).",
        &per_rank(&|r| r.gpu_bytes.map(|b| b as f64)),
    );
    let stragglers: Vec<(Labels, f64)> = status
        .stragglers
        .iter()
        .map(|s| {
            let mut l = labels(s.rank, &s.host);
            let kind = serde_json::to_value(s.kind)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
                .unwrap_or_default();
            l.push(("kind", kind));
            (l, 1.0)
        })
        .collect();
    out.gauge(
        "tchrun_rank_straggler",
        "1 for a rank slower than the others now: kind compute (its compute time per step) or \
         data_wait (its loader).",
        &stragglers,
    );
}

#[cfg(test)]
mod tests;
