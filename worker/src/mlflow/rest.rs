//! MLflow's REST API 2.0, the calls tchrun makes (experiments/get-by-name and create,
//! runs/create, log-batch and update, the `mlflow-artifacts` proxy's PUT), each with a time
//! limit; every failure is a typed `RestError` that names the call. No threads, no retries:
//! `Tracker` decides what a failure means.
use super::TrackingUri;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Duration;

/// Connecting to the tracking server: a server that is not there is known this fast.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// One JSON call, connection to the last byte of the answer.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(5);
/// An artifact's upload is allowed `CALL_TIMEOUT` plus one second per this many bytes.
pub const UPLOAD_BYTES_PER_S: u64 = 20 << 20;
/// MLflow's limits of one `runs/log-batch` call.
pub const MAX_BATCH_PARAMS: usize = 100;
pub const MAX_BATCH_METRICS: usize = 1000;
/// MLflow's limit of a parameter's value (characters); longer values are cut.
pub const MAX_PARAM_VALUE: usize = 6000;

/// A call to the tracking server that did not do what it should.
#[derive(Debug, thiserror::Error)]
pub enum RestError {
    #[error("{call}: {source}")]
    Http {
        call: String,
        #[source]
        source: ureq::Error,
    },
    #[error("{call}: HTTP {status}: {body}")]
    Status {
        call: String,
        status: u16,
        /// MLflow's `error_code` and `message`, or the start of the body.
        body: String,
    },
    #[error("{call}: unexpected answer: {what}")]
    Answer { call: String, what: String },
    #[error("{path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl RestError {
    /// MLflow's `error_code` of a refused call (`RESOURCE_DOES_NOT_EXIST`, ...).
    fn code(&self) -> Option<&str> {
        match self {
            RestError::Status { body, .. } => body.split(':').next(),
            _ => None,
        }
    }
}

/// The run MLflow made for this job.
#[derive(Debug, Clone, PartialEq)]
pub struct RunInfo {
    pub run_id: String,
    pub experiment_id: String,
    /// `mlflow-artifacts:/<experiment>/<run>/artifacts` when the server proxies artifacts.
    pub artifact_uri: String,
}

/// A tracking server's REST client: the base URI, the credentials MLflow's own client reads
/// (`MLFLOW_TRACKING_TOKEN`, `MLFLOW_TRACKING_USERNAME`/`_PASSWORD`), the time limits.
pub struct Client {
    base: String,
    auth: Option<String>,
    agent: ureq::Agent,
}

impl Client {
    pub fn new(uri: &TrackingUri, auth: Option<String>) -> Client {
        let agent = ureq::Agent::config_builder()
            .timeout_connect(Some(CONNECT_TIMEOUT))
            .timeout_global(Some(CALL_TIMEOUT))
            .http_status_as_error(false)
            .max_redirects(3)
            .user_agent(concat!("tchrun/", env!("CARGO_PKG_VERSION")))
            .build()
            .into();
        Client {
            base: uri.as_str().to_string(),
            auth,
            agent,
        }
    }

    fn url(&self, endpoint: &str) -> String {
        format!("{}/api/2.0/{endpoint}", self.base)
    }

    /// The answer of a sent request: its JSON on success, else the status and MLflow's error.
    fn answer(
        call: &str,
        sent: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, RestError> {
        let mut resp = sent.map_err(|source| RestError::Http {
            call: call.into(),
            source,
        })?;
        let status = resp.status().as_u16();
        let text = resp
            .body_mut()
            .read_to_string()
            .map_err(|source| RestError::Http {
                call: call.into(),
                source,
            })?;
        let json: Option<Value> = serde_json::from_str(&text).ok();
        if !(200..300).contains(&status) {
            let body = match &json {
                Some(v) if v.get("error_code").is_some() => format!(
                    "{}: {}",
                    v["error_code"].as_str().unwrap_or("?"),
                    v["message"].as_str().unwrap_or("")
                ),
                _ => text.chars().take(200).collect(),
            };
            return Err(RestError::Status {
                call: call.into(),
                status,
                body,
            });
        }
        Ok(json.unwrap_or(Value::Null))
    }

    fn post(&self, endpoint: &str, body: &Value) -> Result<Value, RestError> {
        let mut req = self
            .agent
            .post(&self.url(endpoint))
            .header("Content-Type", "application/json");
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        Self::answer(endpoint, req.send(body.to_string()))
    }

    /// The id of experiment `name`, made when it does not exist (another client making it
    /// at the same time is no error).
    pub fn experiment_id(&self, name: &str) -> Result<String, RestError> {
        match self.get_experiment(name) {
            Err(e) if e.code() == Some("RESOURCE_DOES_NOT_EXIST") => {}
            other => return other,
        }
        match self.post("mlflow/experiments/create", &json!({ "name": name })) {
            Ok(v) => id_in(&v, "experiment_id", "mlflow/experiments/create"),
            Err(e) if e.code() == Some("RESOURCE_ALREADY_EXISTS") => self.get_experiment(name),
            Err(e) => Err(e),
        }
    }

    fn get_experiment(&self, name: &str) -> Result<String, RestError> {
        let call = "mlflow/experiments/get-by-name";
        let mut req = self
            .agent
            .get(&self.url(call))
            .query("experiment_name", name);
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let v = Self::answer(call, req.call())?;
        id_in(&v["experiment"], "experiment_id", call)
    }

    /// A new run in `experiment_id`, started now, with `tags`.
    pub fn create_run(
        &self,
        experiment_id: &str,
        start_ms: i64,
        tags: &[(String, String)],
    ) -> Result<RunInfo, RestError> {
        let call = "mlflow/runs/create";
        let tags: Vec<Value> = tags
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": v }))
            .collect();
        let v = self.post(
            call,
            &json!({ "experiment_id": experiment_id, "start_time": start_ms, "tags": tags }),
        )?;
        let info = &v["run"]["info"];
        Ok(RunInfo {
            run_id: id_in(info, "run_id", call)?,
            experiment_id: id_in(info, "experiment_id", call)?,
            artifact_uri: info["artifact_uri"].as_str().unwrap_or("").to_string(),
        })
    }

    /// Parameters (at most `MAX_BATCH_PARAMS`) and metrics (`(key, value, step)`, at most
    /// `MAX_BATCH_METRICS`) of one call; non-finite metric values are left out (JSON has none).
    pub fn log_batch(
        &self,
        run_id: &str,
        params: &[(String, String)],
        metrics: &[(String, f64, u64)],
        timestamp_ms: i64,
    ) -> Result<(), RestError> {
        let params: Vec<Value> = params
            .iter()
            .map(|(k, v)| json!({ "key": k, "value": cut(v, MAX_PARAM_VALUE) }))
            .collect();
        let metrics: Vec<Value> = metrics
            .iter()
            .filter(|(_, v, _)| v.is_finite())
            .map(|(k, v, step)| {
                json!({ "key": k, "value": v, "timestamp": timestamp_ms, "step": step })
            })
            .collect();
        self.post(
            "mlflow/runs/log-batch",
            &json!({ "run_id": run_id, "params": params, "metrics": metrics }),
        )
        .map(drop)
    }

    /// The run's end: `FINISHED`, `FAILED` or `KILLED`.
    pub fn end_run(&self, run_id: &str, status: &str, end_ms: i64) -> Result<(), RestError> {
        self.post(
            "mlflow/runs/update",
            &json!({ "run_id": run_id, "status": status, "end_time": end_ms }),
        )
        .map(drop)
    }

    /// Where the server takes the run's artifact `path` through its `mlflow-artifacts` proxy
    /// (`mlflow server --serve-artifacts`, the default); None for an artifact store the server
    /// does not proxy (`s3://`, ... with `--no-serve-artifacts`).
    pub fn artifact_url(&self, run: &RunInfo, path: &str) -> Option<String> {
        let rest = run.artifact_uri.strip_prefix("mlflow-artifacts:")?;
        // `mlflow-artifacts:/0/<run>/artifacts`, or with a host: `mlflow-artifacts://h:p/0/...`.
        let (host, rest) = match rest.strip_prefix("//") {
            Some(r) => {
                let (h, p) = r.split_once('/').unwrap_or((r, ""));
                (Some(h), p)
            }
            None => (None, rest),
        };
        let base = match host {
            Some(h) if !h.is_empty() => {
                let scheme = self.base.split("://").next().unwrap_or("http");
                format!("{scheme}://{h}")
            }
            _ => self.base.clone(),
        };
        let run_path = rest.trim_matches('/');
        Some(format!(
            "{base}/api/2.0/mlflow-artifacts/artifacts/{run_path}/{}",
            path.trim_start_matches('/')
        ))
    }

    /// Uploads `file` as the run's artifact `path` (PUT to the `mlflow-artifacts` proxy), with
    /// a time limit that grows with the file.
    pub fn put_artifact(&self, url: &str, file: &Path) -> Result<(), RestError> {
        let io = |source| RestError::File {
            path: file.display().to_string(),
            source,
        };
        let mut f = std::fs::File::open(file).map_err(io)?;
        let len = f.metadata().map_err(io)?.len();
        let limit = CALL_TIMEOUT + Duration::from_secs(len / UPLOAD_BYTES_PER_S);
        let mut req = self
            .agent
            .put(url)
            .header("Content-Type", "application/octet-stream")
            .header("Content-Length", len.to_string());
        if let Some(a) = &self.auth {
            req = req.header("Authorization", a);
        }
        let req = req.config().timeout_global(Some(limit)).build();
        let call = format!("mlflow-artifacts PUT {}", file.display());
        Self::answer(&call, req.send(ureq::SendBody::from_reader(&mut f))).map(drop)
    }
}

/// The string (or number) `key` of `v`, or an `Answer` error naming the call.
fn id_in(v: &Value, key: &str, call: &str) -> Result<String, RestError> {
    match &v[key] {
        Value::String(s) if !s.is_empty() => Ok(s.clone()),
        Value::Number(n) => Ok(n.to_string()),
        _ => Err(RestError::Answer {
            call: call.into(),
            what: format!("no {key} in {}", cut(&v.to_string(), 200)),
        }),
    }
}

/// `s` cut to at most `n` characters.
fn cut(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// The `Authorization` header MLflow's client sends for these variables: a bearer token, else
/// HTTP basic with a user name and password.
pub fn auth_from(get: impl Fn(&str) -> Option<String>) -> Option<String> {
    if let Some(t) = get("MLFLOW_TRACKING_TOKEN").filter(|t| !t.is_empty()) {
        return Some(format!("Bearer {t}"));
    }
    let user = get("MLFLOW_TRACKING_USERNAME").filter(|u| !u.is_empty())?;
    let password = get("MLFLOW_TRACKING_PASSWORD").unwrap_or_default();
    Some(format!(
        "Basic {}",
        base64(format!("{user}:{password}").as_bytes())
    ))
}

/// Standard base64 with padding (RFC 4648), for HTTP basic authentication.
fn base64(bytes: &[u8]) -> String {
    const ABC: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ABC[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth_is_rfc_4648_base64() {
        assert_eq!(base64(b""), "");
        assert_eq!(base64(b"f"), "Zg==");
        assert_eq!(base64(b"fo"), "Zm8=");
        assert_eq!(base64(b"foo"), "Zm9v");
        assert_eq!(base64(b"user:pass"), "dXNlcjpwYXNz");
        let env = |vars: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                vars.iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(auth_from(env(&[])), None);
        assert_eq!(
            auth_from(env(&[("MLFLOW_TRACKING_TOKEN", "t0k")])),
            Some("Bearer t0k".into())
        );
        assert_eq!(
            auth_from(env(&[
                ("MLFLOW_TRACKING_USERNAME", "user"),
                ("MLFLOW_TRACKING_PASSWORD", "pass")
            ])),
            Some("Basic dXNlcjpwYXNz".into())
        );
    }

    #[test]
    fn artifacts_go_through_the_servers_proxy() {
        let uri = TrackingUri::parse("http://127.0.0.1:5000/prefix/").expect("uri");
        let c = Client::new(&uri, None);
        let run = |a: &str| RunInfo {
            run_id: "r".into(),
            experiment_id: "1".into(),
            artifact_uri: a.into(),
        };
        assert_eq!(
            c.artifact_url(&run("mlflow-artifacts:/1/r/artifacts"), "model/model.json"),
            Some(
                "http://127.0.0.1:5000/prefix/api/2.0/mlflow-artifacts/artifacts/1/r/artifacts/model/model.json"
                    .into()
            )
        );
        assert_eq!(
            c.artifact_url(&run("mlflow-artifacts://h:9/1/r/artifacts"), "m.json"),
            Some("http://h:9/api/2.0/mlflow-artifacts/artifacts/1/r/artifacts/m.json".into())
        );
        assert_eq!(c.artifact_url(&run("s3://bucket/1/r/artifacts"), "m"), None);
    }
}
