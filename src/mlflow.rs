//! MLflow's contract: `--mlflow-tracking-uri` and `--mlflow-experiment` (`MlflowFlags`, with
//! MLflow's own `MLFLOW_TRACKING_URI` and `MLFLOW_EXPERIMENT_NAME` as fallbacks), the tracking
//! server's URI, and how long the end of training may wait for it (the launcher allows for
//! it). Rank 0's client that talks to the server is the worker's (`worker/src/mlflow/`).
use clap::Args;
use std::time::Duration;

/// MLflow's own variables, read when the flags are not given.
pub const MLFLOW_TRACKING_URI: &str = "MLFLOW_TRACKING_URI";
pub const MLFLOW_EXPERIMENT_NAME: &str = "MLFLOW_EXPERIMENT_NAME";
/// The longest the end of training waits for the queue to drain, besides the artifacts' time.
pub const DRAIN: Duration = Duration::from_secs(10);
/// The longest the end waits in all, however large the artifacts.
pub const MAX_DRAIN: Duration = Duration::from_secs(120);

/// A tracking server's URI: `http://` or `https://`, with a host; kept without a trailing `/`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TrackingUri(String);

impl TrackingUri {
    /// Accepts `http(s)://host[:port][/path]`; anything else (a `file:` store, `databricks`,
    /// `azureml://`) says what tchrun needs instead.
    pub fn parse(s: &str) -> Result<TrackingUri, String> {
        let t = s.trim();
        let rest = t
            .strip_prefix("http://")
            .or_else(|| t.strip_prefix("https://"))
            .ok_or_else(|| {
                format!(
                    "'{s}' is not an http:// or https:// URI: tchrun logs to an MLflow tracking \
                     server through its REST API (start one with `mlflow server --host 0.0.0.0 \
                     --port 5000` and pass --mlflow-tracking-uri http://HOST:5000)"
                )
            })?;
        let host = rest.split(['/', '?', '#']).next().unwrap_or("");
        if host.is_empty() || host.starts_with(':') || rest.contains(char::is_whitespace) {
            return Err(format!(
                "'{s}' names no host: give the tracking server as http://HOST:PORT"
            ));
        }
        // The port, if given, is a TCP port (1..=65535): `:99999` was accepted, and failed only
        // when the first call went out.
        let host_port = host.rsplit('@').next().unwrap_or(host);
        let after_v6 = host_port.rsplit(']').next().unwrap_or(host_port);
        if let Some((_, port)) = after_v6.rsplit_once(':') {
            if !matches!(port.parse::<u16>(), Ok(p) if p > 0) {
                return Err(format!(
                    "'{s}': port '{port}' is not a TCP port (1 to 65535); give the tracking \
                     server as http://HOST:PORT"
                ));
            }
        }
        if rest.contains(['?', '#']) {
            return Err(format!(
                "'{s}' has a query or fragment: give the tracking server's base URI, \
                 http://HOST:PORT[/PATH]"
            ));
        }
        Ok(TrackingUri(t.trim_end_matches('/').to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The MLflow UI's page of a run.
    pub fn run_url(&self, experiment_id: &str, run_id: &str) -> String {
        format!("{}/#/experiments/{experiment_id}/runs/{run_id}", self.0)
    }
}

impl std::fmt::Display for TrackingUri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// `tchrun train`'s MLflow flags (passed to the ranks; rank 0 logs).
#[derive(Args, Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct MlflowFlags {
    /// MLflow tracking server (http:// or https://) that rank 0 logs the run to: the training
    /// flags as parameters, each epoch's metrics (those of metrics.jsonl) and the model
    /// directory as artifacts. Default: MLFLOW_TRACKING_URI when it is http(s). A server that
    /// is down or slow never fails or stalls training: it is warned about once.
    #[arg(help_heading = "Observability", long, env = "TCHRUN_MLFLOW_TRACKING_URI", value_name = "URI", value_parser = TrackingUri::parse)]
    pub mlflow_tracking_uri: Option<TrackingUri>,
    /// MLflow experiment of the run, made when missing. Default: MLFLOW_EXPERIMENT_NAME, else
    /// "Default".
    #[arg(help_heading = "Observability", long, env = "TCHRUN_MLFLOW_EXPERIMENT", value_name = "NAME", value_parser = clap::builder::NonEmptyStringValueParser::new())]
    pub mlflow_experiment: Option<String>,
}

impl MlflowFlags {
    /// The flags for a rank (`argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }

    /// Fills what the flags left out from MLflow's own variables (`get` reads one). A
    /// `MLFLOW_TRACKING_URI` that is no http(s) URI (`databricks`, a `file:` store, meant for
    /// other tools) is not used: the warning returned says so.
    pub fn resolve(&mut self, get: impl Fn(&str) -> Option<String>) -> Option<String> {
        let mut warning = None;
        if self.mlflow_tracking_uri.is_none() {
            if let Some(v) = get(MLFLOW_TRACKING_URI).filter(|v| !v.trim().is_empty()) {
                match TrackingUri::parse(&v) {
                    Ok(u) => self.mlflow_tracking_uri = Some(u),
                    Err(_) => {
                        warning = Some(format!(
                            "{MLFLOW_TRACKING_URI}={v} is not an http(s) URI: this job does not \
                             log to MLflow (pass --mlflow-tracking-uri http://HOST:PORT to log \
                             to a tracking server)"
                        ))
                    }
                }
            }
        }
        if self.mlflow_experiment.is_none() && self.mlflow_tracking_uri.is_some() {
            self.mlflow_experiment = get(MLFLOW_EXPERIMENT_NAME).filter(|v| !v.is_empty());
        }
        if let (Some(e), None, None) =
            (&self.mlflow_experiment, &self.mlflow_tracking_uri, &warning)
        {
            warning = Some(format!(
                "--mlflow-experiment {e} without a tracking server: this job does not log to \
                 MLflow (add --mlflow-tracking-uri http://HOST:PORT)"
            ));
        }
        warning
    }
}
