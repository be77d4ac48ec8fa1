//! `--prometheus-textfile DIR` (issue 50): a two-rank job's `.prom` file read by a real
//! `prometheus-node-exporter` (Debian's package, its textfile collector only) and scraped every
//! second by a real `prometheus` server (Debian's package), both started here on loopback ports
//! and killed when the test ends. While the job trains the server's HTTP API returns its step
//! and images/s and both ranks' steps; `tchrun_seconds_since_last_step` grows while rank 1 is
//! stopped (`kill -STOP`); the last file says finished and parses with `prometheus_client`'s
//! parser (PyPI). A failed job's file says failed with its cause; a DIR that is not there is
//! refused before anything starts. On two network-namespace nodes (`common::netns`), each
//! with a textfile directory of its own, each host's file has exactly its own ranks, each read
//! by a node_exporter of its own, and both say the job ended.
mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tchrun::job_record::Heartbeat;
use tchrun_prometheus::Textfile;

const LIMIT: Duration = Duration::from_secs(300);
/// Time for a daemon to answer, and for a value to show in the server's API (1 s scrapes of a
/// file rewritten every 2 s).
const UP: Duration = Duration::from_secs(60);

/// A daemon in its own process group, its output in `<dir>/<name>.log`; killed when dropped.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn start(dir: &Path, name: &str, program: &str, args: &[String]) -> Daemon {
        use std::os::unix::process::CommandExt;
        let path = Path::new("/usr/bin").join(program);
        assert!(
            path.is_file(),
            "{} is missing: run scripts/setup.sh (its APT_PKGS has prometheus and \
             prometheus-node-exporter)",
            path.display()
        );
        let log = dir.join(format!("{name}.log"));
        let out = std::fs::File::create(&log).expect("daemon log");
        let child = Command::new(&path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("log"))
            .stderr(out)
            .process_group(0)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", path.display()));
        Daemon { child, log }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let pg = Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::killpg(pg, Signal::SIGTERM);
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(5) {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = nix::sys::signal::killpg(pg, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// `GET path` on a loopback port (HTTP/1.0: the server closes; bounded): status and body.
fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.set_write_timeout(Some(Duration::from_secs(5))).ok()?;
    let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
    s.write_all(req.as_bytes()).ok()?;
    let mut answer = String::new();
    s.read_to_string(&mut answer).ok()?;
    let (head, body) = answer.split_once("\r\n\r\n")?;
    let code = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((code, body.to_string()))
}

/// node_exporter with its textfile collector alone, reading `textfiles`.
fn node_exporter(dir: &Path, textfiles: &Path) -> (Daemon, u16) {
    let port = free_port();
    let d = Daemon::start(
        dir,
        "node-exporter",
        "prometheus-node-exporter",
        &[
            "--collector.disable-defaults".into(),
            "--collector.textfile".into(),
            format!("--collector.textfile.directory={}", textfiles.display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
    );
    let up = wait_for(UP, || get(port, "/metrics").is_some_and(|(c, _)| c == 200));
    assert!(up, "node_exporter did not answer:\n{}", d.output());
    (d, port)
}

/// A Prometheus server scraping `target` every second, its data in a temp dir.
fn prometheus(dir: &Path, target: u16) -> (Daemon, u16) {
    let port = free_port();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  - \
             job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{target}']\n"
        ),
    )
    .expect("prometheus.yml");
    let d = Daemon::start(
        dir,
        "prometheus",
        "prometheus",
        &[
            format!("--config.file={}", config.display()),
            format!("--storage.tsdb.path={}", dir.join("tsdb").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
    );
    let up = wait_for(UP, || get(port, "/-/ready").is_some_and(|(c, _)| c == 200));
    assert!(up, "prometheus did not get ready:\n{}", d.output());
    (d, port)
}

/// An instant query: each series' labels and value.
fn query(port: u16, expr: &str) -> Vec<(serde_json::Value, f64)> {
    let encoded: String = expr
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let Some((200, body)) = get(port, &format!("/api/v1/query?query={encoded}")) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
    v["data"]["result"]
        .as_array()
        .map(|rows| {
            rows.iter()
                .filter_map(|r| {
                    let value = r["value"][1].as_str()?.parse().ok()?;
                    Some((r["metric"].clone(), value))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The value of a query that returns one series.
fn one(port: u16, expr: &str) -> Option<f64> {
    match query(port, expr).as_slice() {
        [(_, v)] => Some(*v),
        _ => None,
    }
}

/// The file through `prometheus_client`'s parser: family name → type, help, samples.
fn parsed(file: &Path) -> serde_json::Value {
    let r = run(
        python()
            .arg(repo().join("tests/python/prometheus_parse.py"))
            .arg(file),
        Duration::from_secs(60),
    );
    assert_eq!(
        r.code,
        Some(0),
        "prometheus_client refused the file:\n{}\n{}",
        read(file),
        r.explain()
    );
    serde_json::from_str(&r.stdout).expect("the parser's families as JSON")
}

/// The value of `family`'s sample whose labels include `labels`.
fn sample(families: &serde_json::Value, family: &str, labels: &[(&str, &str)]) -> Option<f64> {
    families[family]["samples"]
        .as_array()?
        .iter()
        .find(|s| labels.iter().all(|(k, v)| s["labels"][*k] == *v))
        .and_then(|s| s["value"].as_f64())
}

/// Two ranks on the small digits (10 steps an epoch), rank 1 sleeping `slow` s a step.
fn train(t: &Path, out: &Path, textfiles: &Path, epochs: &str) -> Command {
    let model = model_dir(t, "resnet18", 32);
    let d = small_digits();
    let mut c = tchrun_train(&model, &d.join("train"), &d.join("valid"), out);
    c.args(["--procs-per-node", "2", "--threads", "1"])
        .args([
            "--batch-size",
            "20",
            "--print-freq",
            "2",
            "--epochs",
            epochs,
        ])
        .args(["--lr", "0.05", "--min-crop-scale", "0.5", "--no-hflip"])
        .arg("--prometheus-textfile")
        .arg(textfiles)
        .env_remove("TCHRUN_TEST_KILL_AT_STEP")
        .env_remove("TCHRUN_TEST_SLOW_STEP");
    c
}

/// A stopped rank is continued when the test ends, whatever happened.
struct Stopped(Pid);

impl Drop for Stopped {
    fn drop(&mut self) {
        let _ = kill(self.0, Signal::SIGCONT);
    }
}

#[test]
fn prometheus_sees_a_training_job_its_stopped_rank_and_its_end() {
    let t = tempdir();
    let textfiles = t.path().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    let (exporter, exporter_port) = node_exporter(t.path(), &textfiles);
    let (server, port) = prometheus(t.path(), exporter_port);
    let out = t.path().join("out");
    let tf = Textfile::new(&textfiles, &out);
    // Rank 1 sleeps 0.3 s a step: the job trains long enough to be watched; no hang watch
    // while rank 1 is stopped.
    let mut c = train(t.path(), &out, &textfiles, "3");
    c.args(["--hang-timeout", "0"])
        .env("TCHRUN_TEST_SLOW_STEP", "1:0.3");
    let mut job = Job::start(&mut c, t.path());
    let id = format!("job_id=\"{}\"", tf.job);
    let diagnose = |what: &str, job: &Job| {
        format!(
            "{what}\n--- file\n{}\n--- node_exporter\n{}\n--- prometheus\n{}\n{}",
            std::fs::read_to_string(tf.path()).unwrap_or_default(),
            exporter.output(),
            server.output(),
            job.output()
        )
    };

    // While it trains: the job's step and images/s, and both ranks' steps.
    let seen = wait_for(LIMIT, || {
        let ranks = query(port, &format!("tchrun_rank_step{{{id}}} >= 1"));
        one(port, &format!("tchrun_step{{{id}}} >= 1")).is_some()
            && one(port, &format!("tchrun_images_per_second{{{id}}} > 0")).is_some()
            && ranks.len() == 2
            && ["0", "1"].iter().all(|r| {
                ranks
                    .iter()
                    .any(|(m, _)| m["rank"] == *r && m["host"] != "")
            })
    });
    assert!(
        seen,
        "{}",
        diagnose("no step and images/s for both ranks", &job)
    );
    let running = one(port, &format!("tchrun_state{{{id},state=\"running\"}}"));
    assert_eq!(running, Some(1.0), "{}", diagnose("not running", &job));
    for metric in ["tchrun_loss", "tchrun_learning_rate", "tchrun_eta_seconds"] {
        assert!(
            one(port, &format!("{metric}{{{id}}}")).is_some(),
            "{}",
            diagnose(metric, &job)
        );
    }

    // Rank 1 stopped: the job's step stands still and the seconds since it grow.
    let logs = out.join("logs");
    let pid = Heartbeat::read_all(&logs)
        .into_iter()
        .find(|b| b.rank == 1)
        .map(|b| Pid::from_raw(b.pid as i32))
        .expect("rank 1's heartbeat names its pid");
    kill(pid, Signal::SIGSTOP).expect("SIGSTOP to rank 1");
    let stopped = Stopped(pid);
    let since = format!("tchrun_seconds_since_last_step{{{id}}}");
    let mut values = Vec::new();
    let grew = wait_for(UP, || {
        // Counted from the first value after the last step (one scraped before it may come
        // first).
        match (one(port, &since), values.last().copied()) {
            (Some(v), Some(last)) if v < last => values = vec![v],
            (Some(v), last) if last != Some(v) => values.push(v),
            _ => {}
        }
        values.len() >= 3 && values[values.len() - 1] >= 5.0
    });
    assert!(
        grew,
        "{}",
        diagnose(&format!("{since} did not grow: {values:?}"), &job)
    );
    eprintln!("{since} while rank 1 was stopped: {values:?}");
    drop(stopped);

    // The end: finished, in the file and in the server; the file as prometheus_client reads it.
    let code = job.wait(LIMIT);
    assert_eq!(
        code,
        Some(0),
        "{}",
        diagnose("the job did not finish", &job)
    );
    let finished = format!("tchrun_state{{{id},state=\"finished\"}} == 1");
    assert!(
        wait_for(UP, || one(port, &finished).is_some()),
        "{}",
        diagnose("prometheus never saw the end", &job)
    );
    let f = parsed(&tf.path());
    assert_eq!(f["tchrun_state"]["type"], "gauge", "{f}");
    let state = |s: &str| sample(&f, "tchrun_state", &[("state", s)]);
    assert_eq!(
        (state("finished"), state("running")),
        (Some(1.0), Some(0.0)),
        "{f}"
    );
    assert!(f.get("tchrun_seconds_since_last_step").is_none(), "{f}");
    assert_eq!(sample(&f, "tchrun_step", &[]), Some(30.0), "{f}");
    for r in ["0", "1"] {
        assert_eq!(
            sample(&f, "tchrun_rank_phase", &[("rank", r), ("phase", "done")]),
            Some(1.0),
            "{f}"
        );
    }
    let names: Vec<&String> = f.as_object().expect("families").keys().collect();
    assert!(names.iter().all(|n| n.starts_with("tchrun_")), "{names:?}");
    // One file, no temporary file left.
    let files: Vec<_> = std::fs::read_dir(&textfiles)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
}

#[test]
fn a_failed_job_leaves_a_file_that_says_failed_and_why() {
    let t = tempdir();
    let textfiles = t.path().join("textfile");
    std::fs::create_dir(&textfiles).unwrap();
    let out = t.path().join("out");
    let r = run(
        train(t.path(), &out, &textfiles, "1").env("TCHRUN_TEST_KILL_AT_STEP", "1:3"),
        LIMIT,
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let f = parsed(&Textfile::new(&textfiles, &out).path());
    let state = |s: &str| sample(&f, "tchrun_state", &[("state", s)]);
    assert_eq!(
        (state("failed"), state("running")),
        (Some(1.0), Some(0.0)),
        "{f}"
    );
    let info = &f["tchrun_failure_info"]["samples"][0]["labels"];
    assert_eq!(info["exit_code"], "4", "{f}");
    assert!(info["cause"].as_str().is_some_and(|c| !c.is_empty()), "{f}");
    assert!(f.get("tchrun_seconds_since_last_step").is_none(), "{f}");
}

#[test]
fn a_textfile_directory_that_is_not_there_is_refused_before_anything_starts() {
    let t = tempdir();
    let out = t.path().join("out");
    let missing = t.path().join("no-such-dir");
    let r = run(&mut train(t.path(), &out, &missing, "1"), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&format!(
            "--prometheus-textfile {}: No such file or directory",
            missing.display()
        )) && r.stderr.contains("create it"),
        "{}",
        r.explain()
    );
    assert!(!out.join("logs").exists(), "{}", r.explain());
}

/// Every `rank` label's value in the families' samples, with its `host`s.
fn ranks_in(families: &serde_json::Value) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut seen: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for family in families.as_object().expect("families").values() {
        for s in family["samples"].as_array().into_iter().flatten() {
            if let Some(rank) = s["labels"]["rank"].as_str() {
                let host = s["labels"]["host"].as_str().unwrap_or_default().to_string();
                let hosts = seen.entry(rank.to_string()).or_default();
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
            }
        }
    }
    seen
}

/// Two nodes (network namespaces), two ranks each: rank 0's host writes the job and ranks 0
/// and 1 into `tchrun_<job>.prom`, node 2's local rank 0 ranks 2 and 3 into
/// `tchrun_<job>_tchrun-node2.prom` in node 2's own directory (the rsh agent bind-mounts it
/// over the flag's path there); a node_exporter a node sees each rank once, and both files say
/// finished after the job.
#[test]
fn netns_each_host_publishes_its_own_ranks_once_and_its_end() {
    use std::os::unix::fs::PermissionsExt;
    let Some(_nodes) = common::netns::Nodes::up(2) else {
        return;
    };
    let t = tempdir();
    let [ompi, node1, node2] = ["ompi", "textfile", "textfile-node2"].map(|d| {
        let p = t.path().join(d);
        std::fs::create_dir_all(&p).expect("mkdir");
        p
    });
    let agent = t.path().join("agent.sh");
    std::fs::write(
        &agent,
        format!(
            "#!/usr/bin/env bash\nout=(); done=0\nfor a in \"$@\"; do out+=(\"$a\"); \
             if [ $done = 0 ] && {{ [ \"$a\" = tchrun-node2 ] || [ \"$a\" = 10.250.0.12 ]; }}; then \
             out+=(\"mount --bind {} {} &&\"); done=1; fi; done\nexec {} \"${{out[@]}}\"\n",
            node2.display(),
            node1.display(),
            common::netns::script("netns-rsh.sh").display()
        ),
    )
    .expect("agent");
    std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let model = model_dir(t.path(), "resnet18", 32);
    let d = small_digits();
    let out = t.path().join("out");
    let mpirun_args = common::netns::Nodes::mpirun_args_with(&agent, &ompi);
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .env("TMPDIR", &ompi)
            .args(["--nodes", "2", "--procs-per-node", "2", "--hostfile"])
            .arg(common::netns::Nodes::hostfile(t.path(), 2, 2))
            .arg(format!("--mpirun-args={mpirun_args}"))
            .args(["--epochs", "1", "--batch-size", "20", "--threads", "1"])
            .args(["--print-freq", "1", "--lr", "0.05"])
            .arg("--prometheus-textfile")
            .arg(&node1)
            .env_remove("TCHRUN_THREADS")
            .env_remove("TCHRUN_ATTEMPT")
            .env_remove("TCHRUN_MIN_NODES")
            .env_remove("TCHRUN_TEST_KILL_ON_HOST")
            .env_remove("TCHRUN_TEST_KILL_AT_STEP")
            .env_remove("TCHRUN_TEST_SLOW_STEP"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let tf = Textfile::new(&node1, &out);
    let host_file = node2.join(
        tf.for_host("tchrun-node2")
            .path()
            .file_name()
            .expect("a file name"),
    );
    for (dir, file) in [(&node1, tf.path()), (&node2, host_file.clone())] {
        let files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| dir.join(e.unwrap().file_name()))
            .collect();
        assert_eq!(files, vec![file], "{}", r.explain());
    }
    let (first, second) = (parsed(&tf.path()), parsed(&host_file));
    let on = |host: &str, ranks: [&str; 2]| -> std::collections::BTreeMap<String, Vec<String>> {
        ranks
            .iter()
            .map(|r| (r.to_string(), vec![host.to_string()]))
            .collect()
    };
    assert_eq!(ranks_in(&first), on("tchrun-node1", ["0", "1"]), "{first}");
    assert_eq!(
        ranks_in(&second),
        on("tchrun-node2", ["2", "3"]),
        "{second}"
    );
    for (f, labels) in [
        (&first, vec![("state", "finished")]),
        (
            &second,
            vec![("state", "finished"), ("host", "tchrun-node2")],
        ),
    ] {
        assert_eq!(sample(f, "tchrun_state", &labels), Some(1.0), "{f}");
        assert_eq!(
            sample(f, "tchrun_state", &[("state", "running")]),
            Some(0.0),
            "{f}"
        );
        assert!(f.get("tchrun_rank_seconds_since_progress").is_none(), "{f}");
    }
    // The job's own series in rank 0's file only; node 2's ranks' windows in node 2's.
    assert!(
        sample(&first, "tchrun_step", &[]).is_some_and(|v| v >= 1.0),
        "{first}"
    );
    assert!(second.get("tchrun_step").is_none(), "{second}");
    for r in ["2", "3"] {
        let labels = [("rank", r), ("part", "compute")];
        let compute = sample(&second, "tchrun_rank_time_ratio", &labels);
        assert!(compute.is_some_and(|v| v > 0.0), "{second}");
    }
    // A node_exporter a node: the two scrapes have each rank once.
    let mut scraped = Vec::new();
    for (name, dir) in [("exporter1", &node1), ("exporter2", &node2)] {
        let home = t.path().join(name);
        std::fs::create_dir_all(&home).expect("mkdir");
        let (exporter, port) = node_exporter(&home, dir);
        let (code, body) = get(port, "/metrics").expect("node_exporter answers");
        assert_eq!(code, 200, "{}", exporter.output());
        assert!(
            body.lines().any(|l| l == "node_textfile_scrape_error 0"),
            "{body}\n{}",
            exporter.output()
        );
        scraped.extend(
            body.lines()
                .filter(|l| l.starts_with("tchrun_rank_step{"))
                .map(|l| {
                    let rank = l.split("rank=\"").nth(1).unwrap_or_default();
                    rank.split('"').next().unwrap_or_default().to_string()
                }),
        );
    }
    scraped.sort();
    assert_eq!(scraped, ["0", "1", "2", "3"]);
}
