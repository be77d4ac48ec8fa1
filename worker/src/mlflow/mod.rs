//! MLflow tracking: `--mlflow-tracking-uri` and `--mlflow-experiment` (with MLflow's own
//! `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` as fallbacks), the parameters and
//! metrics a run logs, and `Tracker`: rank 0's background thread that talks to the server
//! through `rest`, fed by a bounded queue. Training never waits on it: a full queue drops the
//! event, a server that is down or slow is warned about once, and the end waits a bounded time.
//! Knows no tensors and no ranks.
pub mod rest;

pub use tchrun::mlflow::{
    MlflowFlags, TrackingUri, DRAIN, MAX_DRAIN, MLFLOW_EXPERIMENT_NAME, MLFLOW_TRACKING_URI,
};

use rest::{Client, RestError, RunInfo};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// The experiment of a run when none is named (MLflow's own default experiment).
pub const DEFAULT_EXPERIMENT: &str = "Default";
/// Events waiting for the tracking server; more are dropped (and counted), never waited for.
pub const QUEUE: usize = 256;
/// After a failed call, the calls of the next this many seconds are dropped without trying
/// (so a server that is down costs one connection attempt per this time, not one per event).
pub const RETRY_AFTER: Duration = Duration::from_secs(30);
/// An epoch's metrics as MLflow metrics: every number of its `metrics.jsonl` row, under the
/// same name (`epoch` is the step, `schema` is not a metric; nested records are left out).
pub fn epoch_metrics(m: &tchrun::metrics::EpochMetrics) -> (u64, Vec<(String, f64)>) {
    let mut out = Vec::new();
    if let Ok(serde_json::Value::Object(map)) = serde_json::to_value(m) {
        for (k, v) in map {
            if k == "epoch" || k == "schema" {
                continue;
            }
            if let Some(x) = v.as_f64() {
                out.push((k, x));
            }
        }
    }
    (u64::from(m.epoch), out)
}

/// How a run ended, as MLflow's `RunStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunStatus {
    Finished,
    Failed,
    Killed,
}

impl RunStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Finished => "FINISHED",
            RunStatus::Failed => "FAILED",
            RunStatus::Killed => "KILLED",
        }
    }
}

/// What the tracker says: a warning (the first failure, a full queue) or a line for the log.
#[derive(Debug, Clone, PartialEq)]
pub enum Note {
    Warning(String),
    Info(String),
}

/// Where the notes go (the worker's driver log and console).
pub type Notes = Arc<dyn Fn(Note) + Send + Sync>;

enum Event {
    Params(Vec<(String, String)>),
    Metrics {
        step: u64,
        values: Vec<(String, f64)>,
        at_ms: i64,
    },
    /// Files uploaded as the run's artifacts under `prefix/<file name>`.
    Artifacts {
        files: Vec<PathBuf>,
        prefix: String,
    },
    End(RunStatus, i64),
}

/// What the thread and the training side share: the run once made.
struct Shared {
    run: OnceLock<RunInfo>,
    said: AtomicBool,
}

/// Rank 0's MLflow run, written from a thread of its own.
pub struct Tracker {
    uri: TrackingUri,
    tx: Option<SyncSender<Event>>,
    /// Disconnected when the thread has ended.
    done: Receiver<()>,
    shared: Arc<Shared>,
    dropped: AtomicU64,
    notes: Notes,
}

/// What the thread works with.
struct Worker {
    client: Client,
    uri: TrackingUri,
    experiment: String,
    tags: Vec<(String, String)>,
    shared: Arc<Shared>,
    notes: Notes,
    failed_at: Option<Instant>,
    warned: bool,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

impl Tracker {
    /// Starts the thread: it makes the experiment (when missing) and the run at once, tagged
    /// with `tags`; `auth` is the `Authorization` header (`rest::auth_from`).
    pub fn start(
        uri: TrackingUri,
        experiment: Option<String>,
        tags: Vec<(String, String)>,
        auth: Option<String>,
        notes: Notes,
    ) -> std::io::Result<Tracker> {
        let (tx, rx) = sync_channel(QUEUE);
        let (done_tx, done) = sync_channel::<()>(0);
        let shared = Arc::new(Shared {
            run: OnceLock::new(),
            said: AtomicBool::new(false),
        });
        let mut w = Worker {
            client: Client::new(&uri, auth),
            uri: uri.clone(),
            experiment: experiment.unwrap_or_else(|| DEFAULT_EXPERIMENT.to_string()),
            tags,
            shared: shared.clone(),
            notes: notes.clone(),
            failed_at: None,
            warned: false,
        };
        std::thread::Builder::new()
            .name("tchrun-mlflow".into())
            .spawn(move || {
                let _done = done_tx;
                w.run(rx);
            })?;
        Ok(Tracker {
            uri,
            tx: Some(tx),
            done,
            shared,
            dropped: AtomicU64::new(0),
            notes,
        })
    }

    fn send(&self, ev: Event) {
        let Some(tx) = &self.tx else { return };
        match tx.try_send(ev) {
            Ok(()) => {}
            Err(TrySendError::Full(_)) => {
                if self.dropped.fetch_add(1, Ordering::Relaxed) == 0 {
                    (self.notes)(Note::Warning(format!(
                        "MLflow: the tracking server {} is slower than training: events that \
                         do not fit in the queue of {QUEUE} are dropped; training goes on",
                        self.uri
                    )));
                }
            }
            Err(TrySendError::Disconnected(_)) => {}
        }
    }

    pub fn params(&self, params: Vec<(String, String)>) {
        self.send(Event::Params(params));
    }

    /// One step's metrics (an epoch's: step = epoch).
    pub fn metrics(&self, step: u64, values: Vec<(String, f64)>) {
        self.send(Event::Metrics {
            step,
            values,
            at_ms: now_ms(),
        });
    }

    /// The run's id, once the server has made it.
    pub fn run_id(&self) -> Option<String> {
        self.shared.run.get().map(|r| r.run_id.clone())
    }

    /// The run's page, the first time it is asked for once the run exists (said once).
    pub fn url_to_say(&self) -> Option<String> {
        let run = self.shared.run.get()?;
        if self.shared.said.swap(true, Ordering::Relaxed) {
            return None;
        }
        Some(self.uri.run_url(&run.experiment_id, &run.run_id))
    }

    /// The end: `files` uploaded under `prefix`, the run marked `status`, and a wait for the
    /// thread of at most `DRAIN` plus the artifacts' upload time (`MAX_DRAIN` in all). Returns
    /// false when the wait ran out (the run may stay RUNNING on the server).
    pub fn finish(mut self, status: RunStatus, files: Vec<PathBuf>, prefix: &str) -> bool {
        let bytes: u64 = files
            .iter()
            .filter_map(|f| std::fs::metadata(f).ok())
            .map(|m| m.len())
            .sum();
        if !files.is_empty() {
            self.send(Event::Artifacts {
                files,
                prefix: prefix.to_string(),
            });
        }
        self.send(Event::End(status, now_ms()));
        drop(self.tx.take());
        let wait = (DRAIN + Duration::from_secs(bytes / rest::UPLOAD_BYTES_PER_S)).min(MAX_DRAIN);
        match self.done.recv_timeout(wait) {
            Err(RecvTimeoutError::Timeout) => {
                (self.notes)(Note::Warning(format!(
                    "MLflow: the tracking server {} did not take the run's last calls within \
                     {} s; the run may show as unfinished",
                    self.uri,
                    wait.as_secs()
                )));
                false
            }
            _ => true,
        }
    }
}

impl Worker {
    fn run(&mut self, rx: Receiver<Event>) {
        // The run is made at once, so that its page can be shown early.
        let _ = self.ensure_run();
        for ev in rx {
            self.handle(ev);
        }
    }

    /// Whether calls are skipped now (a failure less than `RETRY_AFTER` ago).
    fn resting(&self) -> bool {
        self.failed_at.is_some_and(|t| t.elapsed() < RETRY_AFTER)
    }

    fn ensure_run(&mut self) -> Option<RunInfo> {
        if let Some(r) = self.shared.run.get() {
            return Some(r.clone());
        }
        if self.resting() {
            return None;
        }
        let made = self
            .client
            .experiment_id(&self.experiment)
            .and_then(|id| self.client.create_run(&id, now_ms(), &self.tags));
        match made {
            Ok(run) => {
                (self.notes)(Note::Info(format!(
                    "MLflow run {} in experiment '{}' ({}): {}",
                    run.run_id,
                    self.experiment,
                    run.experiment_id,
                    self.uri.run_url(&run.experiment_id, &run.run_id)
                )));
                let _ = self.shared.run.set(run.clone());
                self.failed_at = None;
                Some(run)
            }
            Err(e) => {
                self.fail(&e);
                None
            }
        }
    }

    fn fail(&mut self, e: &RestError) {
        self.failed_at = Some(Instant::now());
        if self.warned {
            (self.notes)(Note::Info(format!("MLflow call failed again: {e}")));
            return;
        }
        self.warned = true;
        (self.notes)(Note::Warning(format!(
            "MLflow: the tracking server {} failed ({e}); training goes on, and what it could \
             not take is not logged (calls are tried again every {} s)",
            self.uri,
            RETRY_AFTER.as_secs()
        )));
    }

    fn handle(&mut self, ev: Event) {
        // The run's end is tried even while resting: it is the last call.
        if self.resting() && !matches!(ev, Event::End(..)) {
            return;
        }
        let Some(run) = self.ensure_run() else {
            return;
        };
        let r = match ev {
            Event::Params(p) => p
                .chunks(rest::MAX_BATCH_PARAMS)
                .try_for_each(|c| self.client.log_batch(&run.run_id, c, &[], now_ms())),
            Event::Metrics {
                step,
                values,
                at_ms,
            } => {
                let m: Vec<(String, f64, u64)> =
                    values.into_iter().map(|(k, v)| (k, v, step)).collect();
                m.chunks(rest::MAX_BATCH_METRICS)
                    .try_for_each(|c| self.client.log_batch(&run.run_id, &[], c, at_ms))
            }
            Event::Artifacts { files, prefix } => self.upload(&run, &files, &prefix),
            Event::End(status, at) => self.client.end_run(&run.run_id, status.as_str(), at),
        };
        if let Err(e) = r {
            self.fail(&e);
        }
    }

    fn upload(&mut self, run: &RunInfo, files: &[PathBuf], prefix: &str) -> Result<(), RestError> {
        for f in files {
            let name = f.file_name().map(|n| n.to_string_lossy().into_owned());
            let Some(name) = name else { continue };
            let path = format!("{prefix}/{name}");
            let Some(url) = self.client.artifact_url(run, &path) else {
                (self.notes)(Note::Warning(format!(
                    "MLflow: the run's artifact store ({}) is not served by the tracking \
                     server (start it with --serve-artifacts): the model is not uploaded",
                    run.artifact_uri
                )));
                return Ok(());
            };
            self.client.put_artifact(&url, f)?;
        }
        (self.notes)(Note::Info(format!(
            "MLflow: {} file(s) uploaded as the run's artifacts under {prefix}/",
            files.len()
        )));
        Ok(())
    }
}

#[cfg(test)]
mod tests;
