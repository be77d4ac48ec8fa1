//! `--mlflow-tracking-uri`: a two-rank job logs to a real `mlflow server` (PyPI `mlflow`,
//! started here on loopback), read back with MLflow's own Python client: the flags as
//! parameters, every epoch's `metrics.jsonl` numbers as metrics at step = epoch, the model
//! directory as artifacts (byte for byte), the run FINISHED and its id in `model.json`. A
//! tracking server that is not there, or never answers, costs one warning, and the same model
//! is written.
mod common;
use common::*;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// A `mlflow server` on a loopback port, its store and artifacts in a temp dir; killed (its
/// process group) when dropped.
struct Server {
    child: Child,
    uri: String,
    artifacts: PathBuf,
    log: PathBuf,
}

impl Server {
    fn start(dir: &Path) -> Server {
        use std::os::unix::process::CommandExt;
        let mlflow = repo().join(".venv/bin/mlflow");
        assert!(
            mlflow.is_file(),
            "{} is missing: run scripts/setup.sh (scripts/requirements.txt has mlflow)",
            mlflow.display()
        );
        let port = free_port();
        let artifacts = dir.join("mlflow-artifacts");
        let log = dir.join("mlflow-server.log");
        let child = Command::new(mlflow)
            .args(["server", "--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["--workers", "1", "--backend-store-uri"])
            .arg(format!("sqlite:///{}", dir.join("mlflow.db").display()))
            .arg("--artifacts-destination")
            .arg(&artifacts)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).expect("server log"))
            .stderr(std::fs::File::create(dir.join("mlflow-server.err")).expect("server err"))
            .process_group(0)
            .spawn()
            .expect("start mlflow server");
        let s = Server {
            child,
            uri: format!("http://127.0.0.1:{port}"),
            artifacts,
            log,
        };
        let up = wait_for(Duration::from_secs(60), || health(port));
        assert!(
            up,
            "mlflow server did not answer on port {port}:\n{}",
            s.output(dir)
        );
        s
    }

    fn output(&self, dir: &Path) -> String {
        format!(
            "{}{}",
            std::fs::read_to_string(&self.log).unwrap_or_default(),
            std::fs::read_to_string(dir.join("mlflow-server.err")).unwrap_or_default()
        )
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let pg = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = nix::sys::signal::killpg(pg, nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// Whether the server on `port` answers `GET /health` with 200.
fn health(port: u16) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
    let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    let mut answer = String::new();
    s.write_all(req.as_bytes()).is_ok()
        && s.read_to_string(&mut answer).is_ok()
        && answer.starts_with("HTTP/1.")
        && answer.contains(" 200 ")
}

/// Two ranks, small digits, `epochs` epochs (10 steps each), one thread per rank (the same
/// weights from run to run).
fn train(model: &Path, out: &Path, epochs: &str, extra: &[&str]) -> Run {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    c.args([
        "--procs-per-node",
        "2",
        "--threads",
        "1",
        "--batch-size",
        "20",
    ])
    .args(["--lr", "0.05", "--min-crop-scale", "0.5", "--no-hflip"])
    .args(["--epochs", epochs])
    .args(extra)
    .env_remove("MLFLOW_TRACKING_URI")
    .env_remove("MLFLOW_EXPERIMENT_NAME");
    run(&mut c, LIMIT)
}

/// The experiment's runs as MLflow's Python client reads them (tests/python/mlflow_run.py).
fn read_back(uri: &str, experiment: &str) -> serde_json::Value {
    let r = run(
        python()
            .arg(repo().join("tests/python/mlflow_run.py"))
            .args([uri, experiment]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("{e}: {}", r.stdout))
}

#[test]
fn a_tracking_server_gets_the_flags_every_epochs_metrics_and_the_model() {
    let t = tempdir();
    let server = Server::start(t.path());
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = train(
        &model,
        &out,
        "2",
        &[
            "--mlflow-tracking-uri",
            &server.uri,
            "--mlflow-experiment",
            "digits",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stderr.contains("MLflow"), "{}", r.explain());
    let url_lines: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("MLflow run: "))
        .collect();
    assert_eq!(
        url_lines.len(),
        1,
        "the run's page said once:\n{}",
        r.explain()
    );
    let v = read_back(&server.uri, "digits");
    let runs = v["runs"].as_array().expect("runs");
    assert_eq!(runs.len(), 1, "{v}");
    let run = &runs[0];
    let id = run["run_id"].as_str().expect("run id");
    let exp = v["experiment_id"].as_str().expect("experiment id");
    assert!(
        url_lines[0].ends_with(&format!("{}/#/experiments/{exp}/runs/{id}", server.uri)),
        "{}",
        url_lines[0]
    );
    assert_eq!(run["status"], "FINISHED", "{run}");
    assert_eq!(run["tags"]["mlflow.source.name"], "tchrun", "{run}");
    // The parameters: the training flags as given, and the world size.
    let p = &run["params"];
    for (k, want) in [
        ("epochs", "2"),
        ("batch-size", "20"),
        ("no-hflip", "true"),
        ("world_size", "2"),
        ("seed", "1"),
    ] {
        assert_eq!(p[k], want, "param {k}: {p}");
    }
    assert_eq!(
        p["lr"].as_str().map(|s| s.parse::<f64>().ok()),
        Some(Some(0.05))
    );
    assert_eq!(p["output"].as_str(), Some(out.to_str().expect("utf-8")));
    assert!(p.get("mlflow-tracking-uri").is_none(), "{p}");
    // Every number of every metrics.jsonl row, at step = epoch, exactly.
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 2);
    let metrics = run["metrics"].as_object().expect("metrics");
    for key in [
        "train_loss",
        "val_loss",
        "top1",
        "top5",
        "lr",
        "train_images_per_sec",
    ] {
        assert!(metrics.contains_key(key), "{key} missing: {metrics:?}");
    }
    for (key, history) in metrics {
        let want: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| serde_json::json!([r["epoch"], r[key].as_f64().expect(key)]))
            .collect();
        assert_eq!(history.as_array(), Some(&want), "metric {key}");
    }
    for r in &rows {
        let numbers = r.as_object().expect("row").iter();
        for (k, _) in numbers.filter(|(k, v)| v.is_number() && *k != "epoch" && *k != "schema") {
            assert!(metrics.contains_key(k), "{k} of metrics.jsonl not logged");
        }
    }
    // The model directory as artifacts, byte for byte; the run's id in model.json.
    let artifacts: Vec<&str> = run["artifacts"]
        .as_array()
        .expect("artifacts")
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    for f in [
        "model.json",
        "model.safetensors",
        "metrics.jsonl",
        "metrics.png",
    ] {
        let name = format!("model/{f}");
        assert!(artifacts.contains(&name.as_str()), "{name}: {artifacts:?}");
        let stored = server
            .artifacts
            .join(exp)
            .join(id)
            .join("artifacts")
            .join(&name);
        let (a, b) = (std::fs::read(&stored), std::fs::read(out.join(f)));
        assert!(
            a.is_ok() && a.ok() == b.ok(),
            "{} differs",
            stored.display()
        );
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("json");
    assert_eq!(cfg["training"]["mlflow_run_id"], id, "{cfg}");
}

#[test]
fn a_tracking_server_that_is_not_there_costs_one_warning_and_nothing_else() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let (plain, down) = (t.path().join("plain"), t.path().join("down"));
    let r = train(&model, &plain, "1", &[]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // A loopback port nobody listens on.
    let uri = format!("http://127.0.0.1:{}", free_port());
    let r = train(&model, &down, "1", &["--mlflow-tracking-uri", &uri]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let warnings: Vec<&str> = r.stderr.lines().filter(|l| l.contains("MLflow")).collect();
    assert_eq!(warnings.len(), 1, "one warning:\n{}", r.explain());
    assert!(
        warnings[0].contains("warning: MLflow: the tracking server")
            && warnings[0].contains(&uri)
            && warnings[0].contains("training goes on"),
        "{}",
        warnings[0]
    );
    assert!(r.elapsed < LIMIT);
    let log = read(&down.join("logs/70_driver_log_0"));
    assert!(log.contains("MLflow: the tracking server"), "{log}");
    // The same model as without MLflow, and no run id.
    for f in ["model.safetensors", "metrics.jsonl"] {
        let rows = |d: &Path| {
            let text = std::fs::read(d.join(f)).expect("model file");
            if f == "metrics.jsonl" {
                metrics_rows(d)
                    .iter()
                    .map(|r| (r["train_loss"].clone(), r["val_loss"].clone()))
                    .map(|(a, b)| format!("{a} {b}").into_bytes())
                    .collect::<Vec<_>>()
                    .concat()
            } else {
                text
            }
        };
        assert!(rows(&plain) == rows(&down), "{f} differs");
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&read(&down.join("model.json"))).expect("json");
    assert!(cfg["training"].get("mlflow_run_id").is_none(), "{cfg}");
}

/// A loopback "server" that takes connections and never answers (until dropped).
struct Silent {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Silent {
    fn start() -> Silent {
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let (start, mut held) = (Instant::now(), Vec::new());
            while !s.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < LIMIT {
                if let Ok((c, _)) = l.accept() {
                    held.push(c);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Silent { port, stop }
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn a_tracking_server_that_never_answers_does_not_stall_training() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let silent = Silent::start();
    let uri = format!("http://127.0.0.1:{}", silent.port);
    let out = t.path().join("out");
    let r = train(&model, &out, "1", &["--mlflow-tracking-uri", &uri]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let warnings = r.stderr.lines().filter(|l| l.contains("MLflow")).count();
    assert_eq!(warnings, 1, "one warning:\n{}", r.explain());
    assert!(
        r.stderr.contains("timed out") || r.stderr.contains("imeout"),
        "{}",
        r.explain()
    );
    assert!(out.join("model.json").is_file() && out.join("model.safetensors").is_file());
}

#[test]
fn a_tracking_uri_that_is_not_http_is_refused_before_any_rank_starts() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    for bad in ["databricks", "file:///tmp/mlruns", "http://:5000"] {
        let r = train(&model, &out, "1", &["--mlflow-tracking-uri", bad]);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr.contains("--mlflow-tracking-uri") && r.stderr.contains("http://"),
            "{}",
            r.explain()
        );
        assert!(!out.join("logs").exists(), "no rank started for {bad}");
    }
    // MLflow's own variable, meant for other tools: named, and the job trains without MLflow.
    let d = small_digits();
    let mut c = tchrun_train(&model, &d.join("train"), &d.join("valid"), &out);
    c.args(["--dry-run", "--procs-per-node", "2"])
        .env("MLFLOW_TRACKING_URI", "databricks");
    let r = run(&mut c, LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stderr
            .contains("MLFLOW_TRACKING_URI=databricks is not an http(s) URI"),
        "{}",
        r.explain()
    );
    assert!(
        !r.stdout.contains("--mlflow-tracking-uri"),
        "{}",
        r.explain()
    );
    // An http(s) one is passed to the ranks as the flag.
    let mut c = tchrun_train(&model, &d.join("train"), &d.join("valid"), &out);
    c.args(["--dry-run", "--procs-per-node", "2"])
        .env("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000/")
        .env("MLFLOW_EXPERIMENT_NAME", "exp");
    let r = run(&mut c, LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains("--mlflow-tracking-uri=http://127.0.0.1:5000")
            && r.stdout.contains("--mlflow-experiment=exp"),
        "{}",
        r.explain()
    );
}

/// A loopback proxy to `upstream` that holds every request `DELAY` before passing it on (a
/// slow tracking server: each call takes longer, none times out); stops when dropped.
struct Slow {
    port: u16,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Slow {
    const DELAY: Duration = Duration::from_millis(2500);

    fn start(upstream: &str) -> Slow {
        let up: std::net::SocketAddr = upstream
            .trim_start_matches("http://")
            .parse()
            .expect("upstream address");
        let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        l.set_nonblocking(true).expect("nonblocking");
        let port = l.local_addr().expect("addr").port();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        std::thread::spawn(move || {
            let start = Instant::now();
            while !s.load(std::sync::atomic::Ordering::Relaxed) && start.elapsed() < LIMIT * 2 {
                if let Ok((client, _)) = l.accept() {
                    if let Ok(server) = std::net::TcpStream::connect(up) {
                        Slow::pipe(client, server);
                    }
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Slow { port, stop }
    }

    /// Client to server with the delay before each request (the first bytes after the
    /// server answered the previous one), server to client as it comes; each direction ends
    /// with its source.
    fn pipe(client: std::net::TcpStream, server: std::net::TcpStream) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let _ = client.set_nonblocking(false);
        let (mut c_in, mut s_out) = (
            client.try_clone().expect("clone"),
            server.try_clone().expect("clone"),
        );
        let (mut s_in, mut c_out) = (server, client);
        let answered = std::sync::Arc::new(AtomicBool::new(true));
        let answered_too = answered.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            let _ = c_in.set_read_timeout(Some(LIMIT * 2));
            while let Ok(n) = c_in.read(&mut buf) {
                if n == 0 {
                    break;
                }
                if answered.swap(false, Ordering::SeqCst) {
                    std::thread::sleep(Slow::DELAY);
                }
                if s_out.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            let _ = s_out.shutdown(std::net::Shutdown::Write);
        });
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            let _ = s_in.set_read_timeout(Some(LIMIT * 2));
            while let Ok(n) = s_in.read(&mut buf) {
                if n == 0 || c_out.write_all(&buf[..n]).is_err() {
                    break;
                }
                answered_too.store(true, Ordering::SeqCst);
            }
            let _ = c_out.shutdown(std::net::Shutdown::Write);
        });
    }
}

impl Drop for Slow {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Issue 52: rank 0 sends its last MLflow calls (the model's artifacts, the run's end) after
/// it left the process group; to a slow server (each call held 2.5 s) that takes longer than
/// `--hang-timeout 5`. The rank says so in its heartbeat (draining) and the finished job
/// exits 0 with its model, every rank done, not as a hang with no culprit.
#[test]
fn a_slow_tracking_server_draining_the_last_calls_is_not_a_hang() {
    let t = tempdir();
    let server = Server::start(t.path());
    let slow = Slow::start(&server.uri);
    let uri = format!("http://127.0.0.1:{}", slow.port);
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = train(
        &model,
        &out,
        "1",
        &[
            "--mlflow-tracking-uri",
            &uri,
            "--mlflow-experiment",
            "slow",
            "--hang-timeout",
            "5",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stderr.contains("hang"), "{}", r.explain());
    assert!(out.join("model.json").is_file());
    // The drain did outlast --hang-timeout: rank 0's last line came more than 5 s after the
    // model was written.
    let log = read(&out.join("logs/70_driver_log_0"));
    let at = |needle: &str| {
        log.lines()
            .find(|l| l.contains(needle))
            .and_then(|l| l.split_whitespace().next())
            .and_then(|t| humantime::parse_rfc3339_weak(t.trim_end_matches('Z')).ok())
            .unwrap_or_else(|| panic!("no {needle:?} in\n{log}"))
    };
    let drained = at("rank exiting with code 0")
        .duration_since(at("best epoch"))
        .unwrap_or_default();
    assert!(drained > Duration::from_secs(6), "{drained:?}:\n{log}");
    let beats = tchrun::job_record::Heartbeat::read_all(&out.join("logs"));
    assert!(
        beats.len() == 2
            && beats
                .iter()
                .all(|b| b.phase == tchrun::job_record::heartbeat::Phase::Done),
        "{beats:?}"
    );
}
