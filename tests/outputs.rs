//! Issue 25: outputs and logs never overwrite inputs (refused before anything is written), one
//! job at a time on an output (the job lock, also for ranks started by hand, a stale lock taken
//! over), Ctrl-C/SIGTERM during an archive's extraction (the partial folder removed, exit
//! 130/143), and the mode of the files the launcher writes (0640). Real binaries throughout.
mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const QUICK: Duration = Duration::from_secs(60);
const LIMIT: Duration = Duration::from_secs(300);
/// The digits job of the issue: small and fast.
const FLAGS: [&str; 7] = [
    "--epochs",
    "1",
    "--batch-size",
    "8",
    "--min-crop-scale",
    "0.5",
    "--no-hflip",
];

/// Every path under `dir`, sorted (what a refused command must not have changed).
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p.clone());
            }
            out.push(p);
        }
    }
    out.sort();
    out
}

fn refused(r: &Run, parts: &[&str]) {
    assert_eq!(r.code, Some(2), "{}", r.explain());
    for p in parts.iter().chain(&["nothing was written", "Choose"]) {
        assert!(r.stderr.contains(p), "missing {p:?}\n{}", r.explain());
    }
}

#[test]
fn outputs_that_are_contain_or_lie_inside_an_input_are_refused_before_anything_is_written() {
    let t = tempdir();
    let root = t.path().canonicalize().expect("canonical");
    let small = small_digits();
    let train = subset(&small.join("train"), &root.join("data/train"), 2, 0);
    let valid = subset(&small.join("valid"), &root.join("data/valid"), 2, 0);
    let model = model_dir(&root, "resnet18", 32);
    let model_json = read(&model.join("model.json"));
    let weights = root.join("w/resnet18.safetensors");
    std::fs::create_dir_all(weights.parent().expect("parent")).expect("mkdir");
    std::fs::write(&weights, b"not read: refused first").expect("write");
    let link = root.join("link");
    std::os::unix::fs::symlink(&train, &link).expect("symlink");
    let before = tree(&root);
    let s = |p: &Path| p.display().to_string();

    // score --output MODEL/model.json would replace the model with the CSV.
    let r = run(
        tchrun()
            .args(["score", "--model"])
            .arg(&model)
            .arg("--images")
            .arg(&valid)
            .arg("--output")
            .arg(model.join("model.json")),
        QUICK,
    );
    refused(
        &r,
        &[
            "--output",
            &s(&model.join("model.json")),
            "lies inside",
            "--model",
            &s(&model),
            "model directory",
        ],
    );
    // evaluate --output MODEL would replace its logs/.
    let r = run(
        tchrun()
            .args(["evaluate", "--model"])
            .arg(&model)
            .arg("--images")
            .arg(&valid)
            .arg("--output")
            .arg(&model),
        QUICK,
    );
    refused(&r, &["--output", " is --model", &s(&model)]);
    // train --output inside --train (also through a symbolic link), --log-dir inside --valid,
    // --output containing the data, --model as --output (with --resume: it would overwrite the
    // weights it starts from), and all of them in a dry run too.
    let train_with = |out: &Path, extra: &[&str]| {
        let mut c = tchrun_train(&model, &train, &valid, out);
        c.args(FLAGS).args(extra);
        run(&mut c, QUICK)
    };
    let r = train_with(&train.join("out"), &[]);
    refused(
        &r,
        &[
            "--output",
            &s(&train.join("out")),
            "lies inside",
            "--train",
            &s(&train),
            "training data",
        ],
    );
    let r = train_with(&link.join("out"), &["--dry-run"]);
    refused(
        &r,
        &[&format!("(that is {})", s(&train.join("out"))), "--train"],
    );
    let logs = valid.join("logs");
    let r = train_with(&root.join("out"), &["--log-dir", &s(&logs)]);
    refused(
        &r,
        &[
            "--log-dir",
            &s(&logs),
            "lies inside",
            "--valid",
            "validation data",
        ],
    );
    let r = train_with(&root.join("data"), &[]);
    refused(&r, &["--output", "contains", "--train"]);
    let r = train_with(&model, &["--resume"]);
    refused(&r, &["--output", " is --model", "with its weights"]);
    // The ranks refuse it too when started without the launcher.
    let r = run(
        worker()
            .arg("train")
            .arg("--model")
            .arg(&model)
            .arg("--train")
            .arg(&train)
            .arg("--valid")
            .arg(&valid)
            .arg("--output")
            .arg(train.join("out"))
            .args(FLAGS),
        QUICK,
    );
    refused(&r, &["--output", "lies inside", "--train"]);
    let r = run(
        worker()
            .args(["evaluate", "--model"])
            .arg(&model)
            .arg("--images")
            .arg(&valid)
            .arg("--output")
            .arg(&model),
        QUICK,
    );
    refused(&r, &["--output", " is --model"]);
    // sbatch, model init --weights, data split, data pack, data index.
    let r = run(
        tchrun()
            .args(["sbatch", "--model"])
            .arg(&model)
            .arg("--train")
            .arg(&train)
            .arg("--valid")
            .arg(&valid)
            .arg("--output")
            .arg(&valid),
        QUICK,
    );
    refused(&r, &["--output", " is --valid"]);
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                "resnet18",
                "--input-size",
                "32",
                "--weights",
            ])
            .arg(&weights)
            .arg("--output")
            .arg(weights.parent().expect("parent")),
        QUICK,
    );
    refused(
        &r,
        &["--output", "contains", "--weights", "initial weights file"],
    );
    for cmd in ["split", "pack"] {
        let mut c = tchrun();
        c.args(["data", cmd])
            .arg(&train)
            .arg("--output")
            .arg(train.join("new"));
        if cmd == "split" {
            c.args(["--fraction", "0.5"]);
        }
        let r = run(&mut c, QUICK);
        refused(
            &r,
            &[
                "--output",
                "lies inside",
                "SRC",
                &s(&train),
                "source dataset",
            ],
        );
    }
    let r = run(
        tchrun()
            .args(["data", "index"])
            .arg(&train)
            .env("TCHRUN_DATA_CACHE", train.join("cache")),
        QUICK,
    );
    refused(
        &r,
        &["$TCHRUN_DATA_CACHE", "lies inside", "DIR", &s(&train)],
    );

    // Nothing was created, moved or changed by any of them.
    assert_eq!(tree(&root), before);
    assert_eq!(read(&model.join("model.json")), model_json);
}

/// Starts `cmd` in the background, its output into files under `dir` (read with `output`).
fn spawn(cmd: &mut Command, dir: &Path, name: &str) -> Child {
    use std::os::unix::process::CommandExt;
    let out = std::fs::File::create(dir.join(format!("{name}.out"))).expect("stdout file");
    let err = std::fs::File::create(dir.join(format!("{name}.err"))).expect("stderr file");
    cmd.stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0)
        .env("RUST_BACKTRACE", "0");
    // SIGINT and SIGTERM as in a terminal: a test run started in the background of a
    // non-interactive shell inherits SIGINT ignored, which tchrun rightly leaves ignored.
    // SAFETY: only async-signal-safe calls between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            use nix::sys::signal::{signal, SigHandler, Signal};
            for sig in [Signal::SIGINT, Signal::SIGTERM] {
                signal(sig, SigHandler::SigDfl).map_err(std::io::Error::from)?;
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn")
}

fn output(dir: &Path, name: &str) -> String {
    format!(
        "--- stdout\n{}\n--- stderr\n{}",
        read(&dir.join(format!("{name}.out"))),
        read(&dir.join(format!("{name}.err")))
    )
}

/// Waits at most `limit` for `child`; its exit code (or the signal's 128 + n).
fn wait_child(child: &mut Child, limit: Duration) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    let start = std::time::Instant::now();
    loop {
        if let Some(s) = child.try_wait().expect("wait") {
            return s.code().or_else(|| s.signal().map(|n| 128 + n));
        }
        if start.elapsed() > limit {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The mode bits of every regular file under `dir` that are wider than 0640.
fn wider_than_0640(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    tree(dir)
        .into_iter()
        .filter(|p| p.is_file())
        .filter_map(|p| {
            let mode = std::fs::metadata(&p).expect("stat").permissions().mode() & 0o777;
            (mode & !0o640 != 0).then(|| format!("{} {mode:o}", p.display()))
        })
        .collect()
}

#[test]
fn a_second_job_on_the_same_output_is_refused_and_a_stale_lock_is_taken_over() {
    let t = tempdir();
    let root = t.path().canonicalize().expect("canonical");
    let small = small_digits();
    let model = model_dir(&root, "resnet18", 32);
    let out = root.join("out");
    // A lock left by a job that died: its file, no flock.
    let lock = out.join(".tchrun.lock");
    std::fs::create_dir_all(out.join("logs")).expect("mkdir");
    let dead = tchrun::lock::LockInfo {
        host: "gone-host".into(),
        pid: 999_999_999,
        started: "2026-01-01T00:00:00.000Z".into(),
        command: "tchrun train (killed)".into(),
    };
    std::fs::write(&lock, serde_json::to_string(&dead).expect("json")).expect("stale lock");
    // A 70_mpi_log of an older version, 0644: narrowed to 0640.
    {
        use std::os::unix::fs::PermissionsExt;
        let old = out.join("logs/70_mpi_log");
        std::fs::write(&old, b"old").expect("write");
        std::fs::set_permissions(&old, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    }

    let train = |out: &Path| {
        let mut c = tchrun_train(&model, &small.join("train"), &small.join("valid"), out);
        c.args(FLAGS);
        c
    };
    let mut first = spawn(&mut train(&out), &root, "first");
    let pid = first.id();
    // The first job holds the lock once its pre-flight is done.
    let holds = wait_for(LIMIT, || {
        std::fs::read_to_string(&lock).is_ok_and(|s| s.contains(&format!("\"pid\":{pid}")))
    });
    assert!(
        holds,
        "the first job never took the lock\n{}",
        output(&root, "first")
    );

    // A second launcher on the same --output: refused, naming the first job.
    let r = run(&mut train(&out), QUICK);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let host = nix::unistd::gethostname().expect("hostname");
    for part in [
        "--output",
        &out.display().to_string(),
        "in use by another job",
        &format!("pid {pid}"),
        &format!("host {}", host.to_string_lossy()),
        "started 20",
        "tchrun train --model",
        ".tchrun.lock",
    ] {
        assert!(r.stderr.contains(part), "missing {part:?}\n{}", r.explain());
    }
    // A rank started by hand (no launcher) on it: rank 0 takes the lock itself, so it is
    // refused too, before it writes a driver log.
    let r = run(
        worker()
            .arg("train")
            .arg("--model")
            .arg(&model)
            .arg("--train")
            .arg(small.join("train"))
            .arg("--valid")
            .arg(small.join("valid"))
            .arg("--output")
            .arg(&out)
            .args(FLAGS),
        QUICK,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("in use by another job") && r.stderr.contains(&format!("pid {pid}")),
        "{}",
        r.explain()
    );

    // The first job is undisturbed: its ranks (told by TCHRUN_LOCK_HELD) did not refuse.
    let code = wait_child(&mut first, LIMIT);
    let text = output(&root, "first");
    assert_eq!(code, Some(0), "{text}");
    assert!(
        text.contains("took over the stale job lock")
            && text.contains("pid 999999999 on host gone-host"),
        "{text}"
    );
    assert!(!lock.exists(), "the lock is removed when the job ends");
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 1, "one job's metrics only: {rows:?}");
    // Every file of the job is 0640 at most (70_mpi_log included, also the older one).
    assert_eq!(wider_than_0640(&out), Vec::<String>::new());

    // evaluate takes the lock of its output directory too.
    let eval = root.join("eval");
    let evaluate = || {
        let mut c = tchrun();
        c.args(["evaluate", "--model"])
            .arg(&out)
            .arg("--images")
            .arg(small.join("valid"))
            .arg("--output")
            .arg(&eval);
        c
    };
    let info = tchrun::lock::LockInfo::here("a test holding the lock");
    let held = tchrun::lock::acquire("--output", &eval, &info).expect("lock");
    let r = run(&mut evaluate(), QUICK);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("in use by another job")
            && r.stderr.contains("a test holding the lock")
            && r.stderr.contains(&format!("pid {}", std::process::id())),
        "{}",
        r.explain()
    );
    drop(held);
    // Released: evaluate and score run, their ranks finding the launcher's locks in
    // TCHRUN_LOCK_HELD, and leave no lock behind.
    let r = run(&mut evaluate(), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(eval.join("metrics.json").is_file() && !eval.join(".tchrun.lock").exists());
    let csv = root.join("scores/scores.csv");
    let r = run(
        tchrun()
            .args(["score", "--model"])
            .arg(&out)
            .arg("--images")
            .arg(small.join("valid/3"))
            .arg("--output")
            .arg(&csv),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(csv.is_file());
    assert_eq!(
        tree(&root.join("scores"))
            .iter()
            .filter(|p| p.ends_with(".tchrun.lock"))
            .count(),
        0
    );
    assert_eq!(wider_than_0640(&eval), Vec::<String>::new());
    assert_eq!(wider_than_0640(&root.join("scores")), Vec::<String>::new());
    // A dry run takes no lock and writes nothing.
    let r = run(train(&root.join("dry")).arg("--dry-run"), QUICK);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!root.join("dry").exists(), "{}", r.explain());
}

#[test]
fn the_files_of_a_failed_job_are_0640() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .args(["exec", "--launcher", "local", "--log-dir"])
            .arg(&logs)
            .args(["--", "false"]),
        QUICK,
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    for f in [
        "70_mpi_log",
        "ranks.json",
        "failure.json",
        "70_driver_log_0",
    ] {
        assert!(logs.join(f).is_file(), "{f} missing\n{}", r.explain());
    }
    assert_eq!(wider_than_0640(&logs), Vec::<String>::new());
}

/// Starts `cmd` (an extraction slowed by the test hook), waits until its partial folder in
/// `cache` holds files, sends `signal`; the exit code and the output.
fn interrupt_extraction(
    cmd: &mut Command,
    cache: &Path,
    dir: &Path,
    name: &str,
    signal: nix::sys::signal::Signal,
) -> (Option<i32>, String) {
    cmd.env("TCHRUN_TEST_EXTRACT_DELAY_MS", "20");
    let mut child = spawn(cmd, dir, name);
    let started = wait_for(QUICK, || {
        std::fs::read_dir(cache)
            .into_iter()
            .flatten()
            .flatten()
            .any(|e| {
                e.file_name().to_string_lossy().contains(".partial-")
                    && tree(&e.path()).iter().filter(|p| p.is_file()).count() >= 5
            })
    });
    assert!(
        started,
        "no partial extraction in {}\n{}",
        cache.display(),
        output(dir, name)
    );
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), signal).expect("kill");
    let code = wait_child(&mut child, QUICK);
    (code, output(dir, name))
}

#[test]
fn an_interrupted_extraction_is_removed_and_said_with_exit_130_or_143() {
    use nix::sys::signal::Signal;
    let t = tempdir();
    let root = t.path().canonicalize().expect("canonical");
    let small = small_digits();
    let model = model_dir(&root, "resnet18", 32);
    let archive = root.join("data.tar.gz");
    let r = run(
        Command::new("tar")
            .arg("czf")
            .arg(&archive)
            .arg("-C")
            .arg(&small)
            .arg("train"),
        QUICK,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());

    // Ctrl-C during `tchrun train --train data.tar.gz`.
    let out = root.join("out");
    let cache = root.join("xdg/tchrun/archives");
    let mut c = tchrun_train(&model, &archive, &small.join("valid"), &out);
    c.args(FLAGS)
        .env_remove("TCHRUN_DATA_CACHE")
        .env("XDG_CACHE_HOME", root.join("xdg"));
    let (code, text) = interrupt_extraction(&mut c, &cache, &root, "train", Signal::SIGINT);
    assert_eq!(code, Some(130), "{text}");
    assert!(
        text.contains(&format!(
            "tchrun: interrupted (SIGINT) while extracting {}; the partial extraction was removed",
            archive.display()
        )),
        "{text}"
    );
    assert_eq!(tree(&cache), Vec::<PathBuf>::new(), "{text}");

    // SIGTERM during `tchrun data split data.tar.gz` (the data cache).
    let split = root.join("split");
    let mut c = tchrun();
    c.env_remove("TCHRUN_DATA_CACHE")
        .env("XDG_CACHE_HOME", root.join("xdg"))
        .args(["data", "split"])
        .arg(&archive)
        .args(["--fraction", "0.5", "--output"])
        .arg(&split);
    let (code, text) = interrupt_extraction(&mut c, &cache, &root, "split", Signal::SIGTERM);
    assert_eq!(code, Some(143), "{text}");
    assert!(
        text.contains("interrupted (SIGTERM) while extracting"),
        "{text}"
    );
    assert_eq!(tree(&cache), Vec::<PathBuf>::new(), "{text}");
    assert!(!split.exists(), "{text}");
}
