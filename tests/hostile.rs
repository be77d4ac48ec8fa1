//! Issue 52 item 6, what a hostile tester found: files others can create (a FIFO, an endless
//! file) in the log directory, as `--class-weights` or as a dataset archive are refused by name
//! or ignored, never waited on and never read without bound; a count whose product would
//! allocate without bound (`--global-batch-size 4294967280` on a few images) is refused before
//! any rank starts. Real processes, each run bounded in time.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A tiny labeled folder: `classes` class folders of `per_class` 32 × 32 PNGs.
fn tiny_set(dir: &Path, classes: usize, per_class: usize) -> PathBuf {
    for c in 0..classes {
        let d = dir.join(format!("c{c}"));
        std::fs::create_dir_all(&d).expect("mkdir");
        for i in 0..per_class {
            let v = (c * 97 + i * 13) as u8;
            image::RgbImage::from_fn(32, 32, |x, y| {
                image::Rgb([v, (x * 8) as u8 ^ v, (y * 8) as u8])
            })
            .save(d.join(format!("{i}.png")))
            .expect("png");
        }
    }
    dir.to_path_buf()
}

fn mkfifo(p: &Path) {
    nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
}

/// `tchrun train` on the tiny set with `extra`, one local rank; a dry run unless told.
fn train(t: &Path, train: &Path, extra: &[&str]) -> Run {
    let model = match t.join("resnet18-32") {
        m if m.is_dir() => m,
        _ => model_dir(t, "resnet18", 32),
    };
    let valid = t.join("valid");
    if !valid.exists() {
        tiny_set(&valid, 2, 2);
    }
    let mut c = tchrun_train(&model, train, &valid, &t.join("out"));
    c.args([
        "--launcher",
        "local",
        "--procs-per-node",
        "1",
        "--epochs",
        "1",
    ])
    .args(extra);
    run(&mut c, Duration::from_secs(90))
}

/// A FIFO as `--class-weights` is refused at once naming it; a terabyte (sparse) file is
/// refused by its size, never read: both exit 2 before any rank starts.
#[test]
fn a_fifo_or_an_endless_file_as_class_weights_is_refused_at_once() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 6);
    let fifo = t.path().join("weights.csv");
    mkfifo(&fifo);
    let r = train(
        t.path(),
        &data,
        &[
            "--class-weights",
            fifo.to_str().expect("utf-8"),
            "--dry-run",
        ],
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--class-weights") && r.stderr.contains("is a FIFO"),
        "{}",
        r.explain()
    );
    let big = t.path().join("big.csv");
    std::fs::File::create(&big)
        .and_then(|f| f.set_len(1 << 40))
        .expect("sparse file");
    let r = train(
        t.path(),
        &data,
        &["--class-weights", big.to_str().expect("utf-8"), "--dry-run"],
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("big.csv") && r.stderr.contains("is larger than"),
        "{}",
        r.explain()
    );
}

/// A FIFO named like a dataset archive (`--train data.tar`) is refused naming it; before, the
/// pre-flight opened it to extract and waited for a writer for ever.
#[test]
fn a_fifo_as_a_dataset_archive_is_refused_at_once() {
    let t = tempdir();
    let fifo = t.path().join("data.tar");
    mkfifo(&fifo);
    let r = train(t.path(), &fifo, &["--dry-run"]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("data.tar") && r.stderr.contains("is a FIFO"),
        "{}",
        r.explain()
    );
}

/// Item 2: `--global-batch-size 4294967280` on 12 images was "one partial step" and each rank
/// listed four billion positions (10.8 GB and growing); refused before any rank starts, naming
/// the flag and the largest value that fits.
#[test]
fn a_global_batch_far_above_the_training_set_is_refused_before_any_rank_starts() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 6);
    let r = train(
        t.path(),
        &data,
        &["--global-batch-size", "4294967280", "--batch-size", "8"],
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--global-batch-size 4294967280 is more than twice the 12 training")
            && r.stderr.contains("lower --global-batch-size to 12 or less"),
        "{}",
        r.explain()
    );
    assert!(
        !t.path().join("out/logs/70_driver_log_0").exists(),
        "no rank started: {}",
        r.explain()
    );
}

/// `tchrun status` with a FIFO as `status.json` and `tchrun logs` with a FIFO or garbage as
/// `failure.json` name the file and say it is unreadable, at once (before: a wait for ever, and
/// "no failure recorded").
#[test]
fn status_and_logs_name_a_fifo_or_garbage_record_at_once() {
    let t = tempdir();
    let logs = t.path().join("logs");
    std::fs::create_dir_all(&logs).expect("mkdir");
    mkfifo(&logs.join("status.json"));
    mkfifo(&logs.join("failure.json"));
    let r = run(tchrun().arg("status").arg(&logs), Duration::from_secs(30));
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        r.code != Some(0) && text.contains("status.json") && text.contains("is a FIFO"),
        "{}",
        r.explain()
    );
    let r = run(tchrun().arg("logs").arg(&logs), Duration::from_secs(30));
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains("failure summary is unreadable") && text.contains("is a FIFO"),
        "{}",
        r.explain()
    );
    std::fs::remove_file(logs.join("failure.json")).expect("rm");
    std::fs::write(logs.join("failure.json"), "\u{0}garbage{").expect("garbage");
    std::fs::write(
        logs.join("70_driver_log_0"),
        "a rank's log without a header\n",
    )
    .expect("log");
    let r = run(tchrun().arg("logs").arg(&logs), Duration::from_secs(30));
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains("failure summary is unreadable")
            && text.contains("failure.json")
            && !text.contains("no failure recorded"),
        "{}",
        r.explain()
    );
}

/// FIFOs planted in the log directory while a job runs (a heartbeat, a memory record, a stacks
/// answer of a rank that does not exist) are read by the launcher's hang watch and the rank's
/// status thread once a second: they are skipped, and the job ends normally. Before, the first
/// read waited for a writer for ever and the launcher never ended.
#[test]
fn fifos_planted_in_the_log_directory_never_block_a_running_job() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 24);
    let model = model_dir(t.path(), "resnet18", 32);
    let valid = tiny_set(&t.path().join("valid"), 2, 2);
    let out = t.path().join("out");
    let logs = out.join("logs");
    let mut c = tchrun_train(&model, &data, &valid, &out);
    c.args([
        "--launcher",
        "local",
        "--procs-per-node",
        "1",
        "--epochs",
        "3",
        "--batch-size",
        "4",
        "--threads",
        "1",
    ]);
    let mut job = Job::start(&mut c, t.path());
    assert!(
        wait_for(Duration::from_secs(120), || logs
            .join("heartbeat-0.json")
            .is_file()),
        "no heartbeat: {}",
        job.output()
    );
    for name in ["heartbeat-9.json", "memory-9.json", "stacks-9.json"] {
        mkfifo(&logs.join(name));
    }
    assert!(
        job.wait(Duration::ZERO).is_none(),
        "the job ended before the FIFOs were planted: {}",
        job.output()
    );
    let code = job.wait(Duration::from_secs(180));
    assert_eq!(
        code,
        Some(0),
        "the job did not end by itself: {}",
        job.output()
    );
    assert!(out.join("model.json").is_file(), "{}", job.output());
}

/// Item 6: initial weights holding a NaN (`tchrun model init --weights`) are refused at init
/// naming the tensor; before, the model directory was made and training ended with "training
/// diverged ... lower --lr".
#[test]
fn initial_weights_holding_a_nan_are_refused_naming_the_tensor() {
    use std::os::unix::fs::FileExt;
    let t = tempdir();
    let w = t.path().join("w.safetensors");
    let arch = tchrun::model::Arch::Resnet18;
    sparse_weights(&w, arch, 10);
    let (last, _) = tchrun::weights::spec(arch, 10).pop().expect("a tensor");
    let len = std::fs::metadata(&w).expect("size").len();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .expect("open");
    f.write_all_at(&f32::NAN.to_le_bytes(), len - 4)
        .expect("a NaN");
    let out = t.path().join("model");
    let r = run(
        &mut init_with_weights("resnet18", &w, &out),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&format!("tensor {last} holds a NaN")),
        "{}",
        r.explain()
    );
    assert!(!out.join("model.json").exists(), "{}", r.explain());
}

/// Item 6: `tchrun doctor --data D --output D` would write its test files into the dataset;
/// refused as every other command refuses an output inside an input (exit 2).
#[test]
fn doctor_refuses_an_output_inside_its_data() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("data"), 2, 1);
    let r = run(
        tchrun()
            .args(["doctor", "--launcher", "local", "--data"])
            .arg(&data)
            .arg("--output")
            .arg(data.join("out"))
            .arg("--log-dir")
            .arg(t.path().join("logs")),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--output") && r.stderr.contains("--data"),
        "{}",
        r.explain()
    );
    assert!(!data.join("out").exists(), "{}", r.explain());
}

/// Item 6: an MLflow URI whose port is no TCP port is refused with the flag's parse (exit 2).
#[test]
fn an_mlflow_uri_with_port_99999_is_refused() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 2);
    let r = train(
        t.path(),
        &data,
        &[
            "--mlflow-tracking-uri",
            "http://127.0.0.1:99999",
            "--dry-run",
        ],
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("port '99999' is not a TCP port"),
        "{}",
        r.explain()
    );
}

/// Item 6: the stop line of an interrupted `--launcher local` job names the logs but no
/// `70_mpi_log` (the local launcher has no mpirun messages).
#[test]
fn the_local_launchers_stop_line_names_no_mpi_log() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 24);
    let model = model_dir(t.path(), "resnet18", 32);
    let valid = tiny_set(&t.path().join("valid"), 2, 2);
    let out = t.path().join("out");
    let mut c = tchrun_train(&model, &data, &valid, &out);
    c.args([
        "--launcher",
        "local",
        "--procs-per-node",
        "1",
        "--epochs",
        "50",
    ])
    .args(["--batch-size", "4", "--threads", "1"]);
    let mut job = Job::start(&mut c, t.path());
    assert!(
        wait_for(Duration::from_secs(120), || out
            .join("logs/heartbeat-0.json")
            .is_file()),
        "no heartbeat: {}",
        job.output()
    );
    nix::sys::signal::kill(job.pid(), nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    let code = job.wait(Duration::from_secs(90));
    let text = job.output();
    assert!(code.is_some(), "did not stop: {text}");
    assert!(
        text.contains("tchrun: interrupted (SIGINT); all ranks stopped (logs in")
            && !text.contains("70_mpi_log"),
        "{text}"
    );
}

/// Item 6: `--console host:nope` on a local job (before: nothing shown, nothing said) is
/// refused before any rank starts, naming the host the job runs on.
#[test]
fn a_console_host_the_job_does_not_run_on_is_refused() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 2);
    let r = train(t.path(), &data, &["--console", "host:nope", "--dry-run"]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--console host:nope: the job runs on"),
        "{}",
        r.explain()
    );
}

/// Item 6: two `tchrun stacks` at once shared one request slot, so the second's request made
/// the first wait for answers to another id and blame a healthy rank. Each capture now takes
/// its turn (a lock in the log directory): both take the rank's stacks "taken by self".
#[test]
fn two_tchrun_stacks_at_once_both_get_every_ranks_answer() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 24);
    let model = model_dir(t.path(), "resnet18", 32);
    let valid = tiny_set(&t.path().join("valid"), 2, 2);
    let out = t.path().join("out");
    let logs = out.join("logs");
    let mut c = tchrun_train(&model, &data, &valid, &out);
    c.args([
        "--launcher",
        "local",
        "--procs-per-node",
        "1",
        "--epochs",
        "200",
    ])
    .args(["--batch-size", "4", "--threads", "1"]);
    let mut job = Job::start(&mut c, t.path());
    assert!(
        wait_for(Duration::from_secs(120), || logs
            .join("heartbeat-0.json")
            .is_file()),
        "no heartbeat: {}",
        job.output()
    );
    let (a, b) = std::thread::scope(|s| {
        let one = s.spawn(|| run(tchrun().arg("stacks").arg(&logs), Duration::from_secs(90)));
        let two = s.spawn(|| run(tchrun().arg("stacks").arg(&logs), Duration::from_secs(90)));
        (one.join().expect("first"), two.join().expect("second"))
    });
    for r in [&a, &b] {
        assert_eq!(r.code, Some(0), "{}", r.explain());
        assert!(
            r.stdout.contains("taken by self") && !r.stdout.contains("no answer within"),
            "{}",
            r.explain()
        );
    }
    nix::sys::signal::kill(job.pid(), nix::sys::signal::Signal::SIGINT).expect("SIGINT");
    assert!(
        job.wait(Duration::from_secs(90)).is_some(),
        "{}",
        job.output()
    );
}

/// `--recipe torchvision-v2` turns on `--ra-sampler`; on a set too small for torchvision's
/// RASampler the refusal says how to turn it off (`--ra-sampler=false`, before: "leave
/// --ra-sampler out", which the user never gave, and `--ra-sampler=false` was refused), and
/// with `--ra-sampler=false` the same recipe passes the pre-flight.
#[test]
fn a_recipes_ra_sampler_on_a_small_set_is_turned_off_with_equals_false() {
    let t = tempdir();
    let data = tiny_set(&t.path().join("train"), 2, 6);
    let r = train(
        t.path(),
        &data,
        &["--recipe", "torchvision-v2", "--dry-run"],
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--ra-sampler: --train")
            && r.stderr.contains("turn it off with --ra-sampler=false")
            && !r.stderr.contains("leave --ra-sampler out"),
        "{}",
        r.explain()
    );
    let r = train(
        t.path(),
        &data,
        &[
            "--recipe",
            "torchvision-v2",
            "--ra-sampler=false",
            "--dry-run",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        !t.path().join("out/logs/70_driver_log_0").exists(),
        "a dry run starts no rank: {}",
        r.explain()
    );
}
