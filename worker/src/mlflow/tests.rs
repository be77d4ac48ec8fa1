use super::*;
use std::sync::Mutex;

#[test]
fn only_http_tracking_servers_are_taken() {
    for good in [
        "http://127.0.0.1:5000",
        "http://mlflow.example.com/",
        "https://host:443/prefix/",
        " http://h:1 ",
        "http://user:pw@h:65535",
        "http://[::1]:5000/x",
        "http://[::1]/x",
    ] {
        let u = TrackingUri::parse(good).expect(good);
        assert!(!u.as_str().ends_with('/'), "{u}");
    }
    for bad in [
        "databricks",
        "file:///tmp/mlruns",
        "./mlruns",
        "azureml://eastus.api.azureml.ms/mlflow/v1.0",
        "http://",
        "http://:5000",
        "ftp://h",
        "http://h:1/?x=1",
        "",
        // Issue 52 item 6: a port that is no TCP port is refused here, not at the first call.
        "http://127.0.0.1:99999",
        "http://h:0",
        "http://h:nope/x",
    ] {
        let e = TrackingUri::parse(bad).expect_err(bad);
        assert!(e.contains("http://"), "{bad}: {e}");
    }
}

#[test]
fn mlflows_variables_fill_what_the_flags_leave_out() {
    let env = |vars: &'static [(&'static str, &'static str)]| {
        move |k: &str| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    };
    let mut f = MlflowFlags::default();
    assert_eq!(f.resolve(env(&[(MLFLOW_EXPERIMENT_NAME, "e")])), None);
    assert_eq!(f, MlflowFlags::default(), "no server: no experiment either");
    let mut f = MlflowFlags::default();
    let vars = &[
        (MLFLOW_TRACKING_URI, "http://h:5000/"),
        (MLFLOW_EXPERIMENT_NAME, "digits"),
    ];
    assert_eq!(f.resolve(env(vars)), None);
    assert_eq!(
        f.mlflow_tracking_uri.as_ref().map(|u| u.as_str()),
        Some("http://h:5000")
    );
    assert_eq!(f.mlflow_experiment.as_deref(), Some("digits"));
    // The flags win over the variables.
    let mut g = MlflowFlags {
        mlflow_tracking_uri: TrackingUri::parse("http://flag:1").ok(),
        mlflow_experiment: Some("flag".into()),
    };
    let before = g.clone();
    assert_eq!(g.resolve(env(vars)), None);
    assert_eq!(g, before);
    // A variable meant for other tools is named and not used.
    let mut f = MlflowFlags::default();
    let w = f
        .resolve(env(&[(MLFLOW_TRACKING_URI, "databricks")]))
        .expect("a warning");
    assert!(w.contains("MLFLOW_TRACKING_URI=databricks") && w.contains("--mlflow-tracking-uri"));
    assert_eq!(f, MlflowFlags::default());
    // An experiment without a server is named.
    let mut f = MlflowFlags {
        mlflow_experiment: Some("e".into()),
        ..MlflowFlags::default()
    };
    let w = f.resolve(env(&[])).expect("a warning");
    assert!(
        w.contains("--mlflow-experiment e without a tracking server"),
        "{w}"
    );
    // What the launcher passes on parses back.
    assert_eq!(
        before.to_args().expect("argv"),
        [
            "--mlflow-tracking-uri=http://flag:1",
            "--mlflow-experiment=flag"
        ]
    );
}

/// The parameters are the job's flags, typed (`TrainJob::params`): the names and values of
/// the flags a rank gets, a switch `true`, MLflow's own left out.
#[test]
fn the_parameters_are_the_training_flags() {
    use clap::{Args, FromArgMatches};
    let line = [
        "train",
        "--model=/m",
        "--train=/t",
        "--valid=/v",
        "--output=/o",
        "--epochs",
        "2",
        "--seed=-3",
        "--no-hflip",
        "--lr",
        "1e-3",
        "--mlflow-tracking-uri=http://h:1",
        "--resume",
    ];
    let cmd = tchrun::flags::TrainJob::augment_args(clap::Command::new("train"))
        .mut_args(|a| a.env(None::<&str>));
    let m = cmd.try_get_matches_from(line).expect("flags");
    let job = tchrun::flags::TrainJob::from_arg_matches(&m).expect("a job");
    let p = job.params().expect("params");
    let get = |k: &str| -> Vec<&str> {
        p.iter()
            .filter(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
            .collect()
    };
    for (k, v) in [
        ("model", "/m"),
        ("epochs", "2"),
        ("seed", "-3"),
        ("no-hflip", "true"),
        ("lr", "1e-3"),
        ("resume", "true"),
    ] {
        assert_eq!(get(k), [v], "{k}: {p:?}");
    }
    assert!(p.iter().all(|(k, _)| !k.starts_with("mlflow-")), "{p:?}");
    // The same pairs as the rank's argv holds, flag by flag.
    let args = job.to_args().expect("argv");
    let as_args: Vec<String> = p
        .iter()
        .map(|(k, v)| match args.contains(&format!("--{k}")) {
            true => format!("--{k}"),
            false => format!("--{k}={v}"),
        })
        .collect();
    let tracked: Vec<String> = args
        .into_iter()
        .filter(|a| !a.starts_with("--mlflow-"))
        .collect();
    assert_eq!(as_args, tracked);
}

#[test]
fn an_epochs_metrics_are_its_metrics_jsonl_numbers() {
    let line = r#"{"schema":1,"epoch":2,"train_loss":0.5,"train_images_per_sec":100.0,"val_loss":0.25,"top1":0.75,"top5":1.0,"lr":0.002,"epoch_time_s":3.5,"time":"2026-01-01T00:00:00Z","skipped_images":0}"#;
    let m: tchrun::metrics::EpochMetrics = serde_json::from_str(line).expect("a row");
    let (step, values) = epoch_metrics(&m);
    assert_eq!(step, 2);
    let get = |k: &str| values.iter().find(|(n, _)| n == k).map(|(_, v)| *v);
    assert_eq!(get("train_loss"), Some(0.5));
    assert_eq!(get("top1"), Some(0.75));
    assert_eq!(get("lr"), Some(0.002));
    assert_eq!(get("skipped_images"), Some(0.0));
    assert_eq!(get("epoch"), None);
    assert_eq!(get("schema"), None);
    assert_eq!(get("time"), None);
}

/// A loopback port with nothing listening.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

#[test]
fn a_server_that_is_not_there_is_warned_about_once_and_waited_for_briefly() {
    let notes: Arc<Mutex<Vec<Note>>> = Arc::default();
    let sink = notes.clone();
    let uri = TrackingUri::parse(&format!("http://127.0.0.1:{}", closed_port())).expect("uri");
    let t = Tracker::start(
        uri,
        None,
        Vec::new(),
        None,
        Arc::new(move |n| sink.lock().expect("notes").push(n)),
    )
    .expect("thread");
    let started = Instant::now();
    for epoch in 1..=QUEUE as u64 * 2 {
        t.metrics(epoch, vec![("loss".into(), 1.0)]);
    }
    t.params(vec![("epochs".into(), "2".into())]);
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "never waited on"
    );
    assert!(t.finish(RunStatus::Finished, Vec::new(), "model"));
    assert!(started.elapsed() < DRAIN + Duration::from_secs(2));
    let notes = notes.lock().expect("notes");
    let warnings: Vec<&Note> = notes
        .iter()
        .filter(|n| matches!(n, Note::Warning(w) if w.contains("failed")))
        .collect();
    assert_eq!(warnings.len(), 1, "{notes:?}");
}
