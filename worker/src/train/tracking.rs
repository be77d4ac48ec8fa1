//! Rank 0's MLflow run (`--mlflow-tracking-uri`, see `crate::mlflow`): made in the
//! background before training with the job's flags as parameters, fed each epoch's metrics
//! (those of `metrics.jsonl`), ended with the model directory as artifacts and the run's
//! status. Other ranks, and jobs without a tracking server, hold `Tracking::off()`: every call
//! does nothing. Nothing here can fail or stall training.
use super::TrainError;
use crate::mlflow::{self, Note, RunStatus, Tracker};
use std::path::Path;
use std::sync::Arc;
use tchrun::files::{METRICS_JSONL, METRICS_PLOT, MODEL_JSON, MODEL_WEIGHTS};
use tchrun::flags::TrainJob;
use tchrun::metrics::EpochMetrics;

/// The artifact folder of the model directory's files in the run.
pub const ARTIFACT_DIR: &str = "model";

pub struct Tracking {
    tracker: Option<Tracker>,
}

impl Tracking {
    pub fn off() -> Tracking {
        Tracking { tracker: None }
    }

    /// Whether a tracking server takes this rank's run (its last calls drain at the end).
    pub fn is_tracking(&self) -> bool {
        self.tracker.is_some()
    }

    /// Rank 0 (`rank0`) with a tracking server (the flags, else MLflow's variables): the run
    /// made in the background, the job's flags and world size logged as its parameters.
    pub fn start(job: &TrainJob, rank0: bool, world: usize, host: &str) -> Tracking {
        if !rank0 {
            return Tracking::off();
        }
        let mut flags = job.options.mlflow.clone();
        if let Some(w) = flags.resolve(|k| std::env::var(k).ok()) {
            // `tchrun train` (which sets TCHRUN_ATTEMPT) said it already.
            if std::env::var_os(tchrun::env::TCHRUN_ATTEMPT).is_some() {
                tracing::info!("{w}");
            } else {
                tracing::warn!("{w}");
            }
        }
        let Some(uri) = flags.mlflow_tracking_uri else {
            return Tracking::off();
        };
        let notes: mlflow::Notes = Arc::new(|n| match n {
            Note::Warning(w) => tracing::warn!("{w}"),
            Note::Info(i) => tracing::info!("{i}"),
        });
        let mut tags = vec![
            ("mlflow.source.name".to_string(), "tchrun".to_string()),
            ("mlflow.source.type".to_string(), "JOB".to_string()),
            ("tchrun.host".to_string(), host.to_string()),
            (
                "tchrun.output".to_string(),
                job.output.display().to_string(),
            ),
        ];
        if let Ok(user) = std::env::var("USER") {
            tags.push(("mlflow.user".to_string(), user));
        }
        let auth = mlflow::rest::auth_from(|k| std::env::var(k).ok());
        match Tracker::start(uri, flags.mlflow_experiment, tags, auth, notes) {
            Ok(t) => {
                let mut params = job.params().unwrap_or_else(|e| {
                    tracing::warn!("MLflow parameters left out: {e}");
                    Vec::new()
                });
                params.push(("world_size".into(), world.to_string()));
                t.params(params);
                Tracking { tracker: Some(t) }
            }
            Err(e) => {
                tracing::warn!("MLflow: no thread for the tracking client ({e}); not logging");
                Tracking::off()
            }
        }
    }

    /// An epoch's `metrics.jsonl` row, at step = epoch; the run's page said once it exists.
    pub fn epoch(&self, m: &EpochMetrics, say: &dyn Fn(&str)) {
        let Some(t) = &self.tracker else { return };
        let (step, values) = mlflow::epoch_metrics(m);
        t.metrics(step, values);
        self.say_url(say);
    }

    fn say_url(&self, say: &dyn Fn(&str)) {
        if let Some(url) = self.tracker.as_ref().and_then(Tracker::url_to_say) {
            say(&format!("MLflow run: {url}"));
        }
    }

    /// The run's id, once the server has made it (recorded in `model.json`).
    pub fn run_id(&self) -> Option<String> {
        self.tracker.as_ref().and_then(Tracker::run_id)
    }

    /// The end of the job on rank 0: after a success the model directory's files uploaded as
    /// artifacts under `model/`; the run marked FINISHED, KILLED (stopped) or FAILED. Waits a
    /// bounded time (`tchrun::mlflow::DRAIN` plus the upload's).
    pub fn finish(self, result: &Result<(), TrainError>, output: &Path, say: &dyn Fn(&str)) {
        self.say_url(say);
        let Some(t) = self.tracker else { return };
        let status = match result {
            Ok(()) => RunStatus::Finished,
            Err(TrainError::Stopped(_) | TrainError::Straggler(_)) => RunStatus::Killed,
            Err(_) => RunStatus::Failed,
        };
        let files = if result.is_ok() {
            // model.json last: the artifacts are whole once it is there.
            [MODEL_WEIGHTS, METRICS_JSONL, METRICS_PLOT, MODEL_JSON]
                .iter()
                .map(|f| output.join(f))
                .filter(|p| p.is_file())
                .collect()
        } else {
            Vec::new()
        };
        t.finish(status, files, ARTIFACT_DIR);
    }
}
