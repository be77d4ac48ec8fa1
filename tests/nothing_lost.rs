//! Issue 25: nothing of a user's work is lost. A 2-rank `--resume` whose best epoch came before
//! the stop finishes; a stop after the last training step finishes the model; `--resume` with
//! another model, dataset or recipe, with nothing to resume, or from a damaged checkpoint is
//! refused before any rank starts (exit 2), naming both values or the damage and the fix; an
//! interrupted run's checkpoint is never replaced without `--resume` or `--overwrite`.
//! One stopped run (SIGTERM in epoch 2 of 3, 2 ranks under mpirun) is shared by the tests: each
//! works on its own copy.
mod common;
use common::*;
use nix::sys::signal::{kill, Signal};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// The set-up: 12 train and 4 valid images per class, the validation classes rotated
/// (`valid/k` holds digit k+1) so that validation loss rises as the model learns: the best
/// epoch comes first.
struct Fixture {
    dir: PathBuf,
    data: PathBuf,
    model: PathBuf,
    /// A run stopped by SIGTERM in epoch 2 of 3 (exit 143, a mid-epoch checkpoint).
    stopped: PathBuf,
}

/// `tchrun train` with the flags; `extra` adds flags or replaces a default's value
/// (`--epochs 1`).
fn train_cmd(model: &Path, data: &Path, out: &Path, extra: &[&str]) -> Command {
    let mut c = tchrun_train(model, &data.join("train"), &data.join("valid"), out);
    let defaults = [
        ("--procs-per-node", "2"),
        ("--launcher", "mpirun"),
        ("--epochs", "3"),
        ("--lr", "0.002"),
        ("--batch-size", "8"),
        ("--min-crop-scale", "0.5"),
        ("--print-freq", "1"),
    ];
    for (flag, value) in defaults {
        if !extra.contains(&flag) {
            c.args([flag, value]);
        }
    }
    c.arg("--no-hflip").args(extra);
    c
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tchrun-nothing-lost-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("mkdir");
        let src = digits();
        let data = dir.join("base");
        subset(&src.join("train"), &data.join("train"), 12, 0);
        subset(&src.join("valid"), &data.join("valid"), 4, 1);
        let model = model_dir(&dir, "resnet18", 32);
        let stopped = dir.join("stopped");
        let mut job = Job::start(&mut train_cmd(&model, &data, &stopped, &[]), &dir);
        let log0 = stopped.join("logs/70_driver_log_0");
        assert!(
            wait_for(LIMIT, || read_or_empty(&log0).contains("epoch 2/3 iter 3/")),
            "{}",
            job.output()
        );
        kill(job.pid(), Signal::SIGTERM).expect("SIGTERM to tchrun");
        assert_eq!(
            job.wait(Duration::from_secs(60)),
            Some(143),
            "{}",
            job.output()
        );
        assert!(
            read(&job.err).contains("the last complete checkpoint is step"),
            "the stop names what it left: {}",
            job.output()
        );
        Fixture {
            dir,
            data,
            model,
            stopped,
        }
    })
}

fn read_or_empty(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// A copy of the stopped run's output for one test.
fn copy_of_stopped(name: &str) -> PathBuf {
    let f = fixture();
    let to = f.dir.join(name);
    let _ = std::fs::remove_dir_all(&to);
    let ok = Command::new("cp")
        .arg("-a")
        .arg(&f.stopped)
        .arg(&to)
        .status()
        .expect("cp");
    assert!(ok.success());
    to
}

fn last_json(out: &Path) -> serde_json::Value {
    serde_json::from_str(&read(&out.join("checkpoints/last.json"))).expect("last.json")
}

/// Item 1: before, rank 1 had no best weights after a resume in which no epoch beat the best
/// from before the stop: training completed, then it failed with "no epoch completed with a
/// finite validation loss", exit 2, no model, and every later --resume the same. Also: a
/// finished run resumed is "already complete" (no rank starts, its logs stay), and a larger
/// --epochs extends it.
#[test]
fn a_two_rank_resume_whose_best_epoch_came_before_the_stop_finishes() {
    let f = fixture();
    let out = copy_of_stopped("resume");
    let best_before = last_json(&out)["best_epoch"]
        .as_u64()
        .expect("a best epoch");
    let r = run(
        &mut train_cmd(&f.model, &f.data, &out, &["--resume"]),
        LIMIT,
    );
    assert_resumed(&r, &out);
    let model: serde_json::Value = serde_json::from_str(&read(&out.join("model.json"))).unwrap();
    let best = model["training"]["best_epoch"]
        .as_u64()
        .expect("best epoch");
    assert!(
        best <= best_before,
        "the scenario needs the best epoch before the stop (rotated validation labels): best {best}, before the stop {best_before}"
    );
    assert_eq!(metrics_rows(&out).len(), 3);

    // Resumed again: nothing to do, said before any rank starts; the run's logs are kept.
    let log0 = out.join("logs/70_driver_log_0");
    let before = read(&log0);
    let r = run(
        &mut train_cmd(&f.model, &f.data, &out, &["--resume"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("training already complete") && r.stdout.contains("larger --epochs"),
        "{}",
        r.explain()
    );
    assert_eq!(
        read(&log0),
        before,
        "the finished run's driver log is untouched"
    );

    // A larger --epochs continues the finished run (the schedule's end moves; said so).
    let r = run(
        &mut train_cmd(&f.model, &f.data, &out, &["--resume", "--epochs", "4"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(
            "the LR schedule now ends after epoch 4; the finished run continues from epoch 4"
        ),
        "{}",
        r.explain()
    );
    assert_eq!(metrics_rows(&out).len(), 4, "{}", r.explain());
    assert_eq!(last_json(&out)["finished"], true);
}

/// A refusal before any rank starts: exit 2, the words, and neither the checkpoint nor the
/// driver logs touched.
fn refused(out: &Path, cmd: &mut Command, words: &[&str]) -> Run {
    let last = read(&out.join("checkpoints/last.json"));
    let log0 = read(&out.join("logs/70_driver_log_0"));
    let r = run(cmd, LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    for w in words {
        assert!(r.stderr.contains(w), "missing {w:?}: {}", r.explain());
    }
    assert_eq!(
        read(&out.join("checkpoints/last.json")),
        last,
        "checkpoint untouched"
    );
    assert_eq!(
        read(&out.join("logs/70_driver_log_0")),
        log0,
        "no rank started"
    );
    r
}

/// A copy of the base set with other class folders.
fn dataset_with_classes(dir: &Path, names: &[String]) -> PathBuf {
    let f = fixture();
    for split in ["train", "valid"] {
        for (k, name) in names.iter().enumerate() {
            let from = f.data.join(split).join(k.to_string());
            let to = dir.join(split).join(name);
            std::fs::create_dir_all(&to).expect("mkdir");
            for e in std::fs::read_dir(&from).expect("class").flatten() {
                std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
            }
        }
    }
    dir.to_path_buf()
}

/// Items 8, 9, 3 and item 1's --batch-size: another input size, architecture, class list or
/// recipe flag continued silently (or failed after launch); `--resume` with a typo in
/// `--output` trained from scratch; `train` without `--resume` replaced an interrupted run's
/// checkpoint. Now each is refused before any rank starts, naming both values and the fix.
#[test]
fn resume_refuses_another_model_dataset_or_recipe_before_any_rank_starts() {
    let f = fixture();
    let out = copy_of_stopped("mismatch");
    let t = tempdir();
    let resume = |model: &Path, data: &Path, extra: &[&str]| {
        let mut flags = vec!["--resume"];
        flags.extend_from_slice(extra);
        train_cmd(model, data, &out, &flags)
    };
    refused(
        &out,
        &mut resume(&f.model, &f.data, &["--batch-size", "16"]),
        &[
            "--batch-size: checkpoint 8, this job 16",
            "pass --batch-size 8",
            "--overwrite",
        ],
    );
    refused(
        &out,
        &mut resume(&f.model, &f.data, &["--lr", "0.01", "--seed", "7"]),
        &[
            "--lr: checkpoint 0.002, this job 0.01",
            "--seed: checkpoint 1, this job 7",
        ],
    );
    let m64 = model_dir(t.path(), "resnet18", 64);
    refused(
        &out,
        &mut resume(&m64, &f.data, &[]),
        &["input size: checkpoint 32, this job 64"],
    );
    let m34 = model_dir(t.path(), "resnet34", 32);
    refused(
        &out,
        &mut resume(&m34, &f.data, &[]),
        &["architecture: checkpoint resnet18, this job resnet34"],
    );
    // The same count of classes under other names: the labels would follow other folders.
    let names: Vec<String> = [
        "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let renamed = dataset_with_classes(&t.path().join("renamed"), &names);
    refused(
        &out,
        &mut resume(&f.model, &renamed, &[]),
        &["classes: checkpoint 10 classes, class 0 is \"0\", this job 10 classes, class 0 is \"eight\""],
    );
    let five: Vec<String> = (0..5).map(|k| k.to_string()).collect();
    let fewer = dataset_with_classes(&t.path().join("five"), &five);
    refused(
        &out,
        &mut resume(&f.model, &fewer, &[]),
        &["classes: checkpoint 10 classes", "this job 5 classes"],
    );
    // Item 3: without --resume, the interrupted run's checkpoint is not replaced.
    refused(
        &out,
        &mut train_cmd(&f.model, &f.data, &out, &[]),
        &[
            "holds the checkpoint of an interrupted run",
            "--resume",
            "--overwrite",
        ],
    );
    // Item 9: --resume into an --output that does not exist.
    let typo = t.path().join("no-such-output");
    let r = run(
        &mut train_cmd(&f.model, &f.data, &typo, &["--resume"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("does not exist, so there is nothing to resume"),
        "{}",
        r.explain()
    );
    assert!(!typo.exists(), "nothing written for a refused job");
    // ... and into an existing one without a checkpoint: said on the console.
    let empty = t.path().join("empty");
    std::fs::create_dir_all(&empty).expect("mkdir");
    let r = run(
        &mut train_cmd(&f.model, &f.data, &empty, &["--resume", "--dry-run"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("--resume: no checkpoint in")
            && r.stdout.contains("training starts from the beginning"),
        "{}",
        r.explain()
    );
}

/// Item 11: a truncated tensors file, a missing one and a garbage `last.json` were exit 4 after
/// launch, in Debug text. Now exit 2 before launch, naming the file, what is wrong, the intact
/// best weights and how to start over; `--overwrite` starts over and leaves nothing of the old
/// run's metrics.
#[test]
fn damaged_checkpoints_are_named_before_launch_with_what_is_left() {
    let f = fixture();
    let out = copy_of_stopped("damaged");
    let last = last_json(&out);
    let tensors = out
        .join("checkpoints")
        .join(last["tensors"].as_str().expect("tensors file"));
    let best = last["best_tensors"]
        .as_str()
        .expect("best file")
        .to_string();
    let bytes = std::fs::read(&tensors).expect("tensors");
    std::fs::write(&tensors, &bytes[..bytes.len() / 2]).expect("truncate");
    refused(
        &out,
        &mut train_cmd(&f.model, &f.data, &out, &["--resume"]),
        &[
            "the checkpoint cannot be used",
            "truncated",
            &tensors.display().to_string(),
            "--overwrite",
            &format!(
                "tchrun model init --arch resnet18 --input-size 32 --weights {}",
                out.join("checkpoints").join(&best).display()
            ),
        ],
    );
    std::fs::remove_file(&tensors).expect("rm");
    refused(
        &out,
        &mut train_cmd(&f.model, &f.data, &out, &["--resume"]),
        &["missing (last.json names it)"],
    );
    let json = out.join("checkpoints/last.json");
    std::fs::write(&json, b"{\"format_version\": 1, \"epo").expect("garbage");
    refused(
        &out,
        &mut train_cmd(&f.model, &f.data, &out, &["--resume"]),
        &["not a checkpoint description", &json.display().to_string()],
    );
    // The offered best weights really start a new model.
    let t = tempdir();
    let r = run(
        &mut init_with_weights(
            "resnet18",
            &out.join("checkpoints").join(&best),
            &t.path().join("from-best"),
        ),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // --overwrite starts over: one epoch, the old run's metrics gone.
    let r = run(
        &mut train_cmd(&f.model, &f.data, &out, &["--overwrite", "--epochs", "1"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_eq!(metrics_rows(&out).len(), 1, "{}", r.explain());
    assert_eq!(last_json(&out)["finished"], true);
}

/// Item 2: SIGTERM to tchrun after the last training step (here while rank 0's last epoch
/// checkpoint is still being written, held by the test hook). Before: rank 1 exited at once and
/// panicked inside libtorch on its way out, mpirun killed rank 0 in the middle of its write, and
/// the run was lost. Now the ranks finish the model first: exit 0, said so, the model and a
/// finished checkpoint, no panic, no temporary file.
#[test]
fn a_stop_after_the_last_training_step_finishes_the_model() {
    let f = fixture();
    let t = tempdir();
    let out = t.path().join("out");
    let mut c = train_cmd(&f.model, &f.data, &out, &["--epochs", "1"]);
    c.env("TCHRUN_TEST_CHECKPOINT_DELAY_S", "4");
    let mut job = Job::start(&mut c, t.path());
    let log0 = out.join("logs/70_driver_log_0");
    assert!(
        wait_for(LIMIT, || read_or_empty(&log0)
            .contains("before last.json names it")),
        "{}",
        job.output()
    );
    kill(job.pid(), Signal::SIGTERM).expect("SIGTERM to tchrun");
    let code = job.wait(Duration::from_secs(90));
    assert_eq!(code, Some(0), "{}", job.output());
    assert!(
        read(&job.out).contains("the stop came after the last training step"),
        "{}",
        job.output()
    );
    assert!(out.join("model.json").is_file() && out.join("model.safetensors").is_file());
    assert_eq!(last_json(&out)["finished"], true);
    for rank in 0..2 {
        let log = read(&out.join(format!("logs/70_driver_log_{rank}")));
        assert!(log.contains("received SIGUSR1"), "rank {rank}: {log}");
        assert!(!log.contains("panicked"), "rank {rank}: {log}");
    }
    let leftovers: Vec<String> = std::fs::read_dir(out.join("checkpoints"))
        .expect("checkpoints")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// Issue 31 item 5: `tchrun logs` on a training `--output` (the obvious guess) said "no driver
/// logs in DIR; see DIR/70_mpi_log" (a file that did not exist) and exited 0. Now it reads the
/// output's `logs/`, and a folder without logs is exit 2 naming where logs are.
#[test]
fn logs_reads_a_training_outputs_log_directory_and_refuses_a_folder_without_logs() {
    let f = fixture();
    let r = run(tchrun().arg("logs").arg(&f.stopped), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(&format!(
            "(the log directory of the training output {})",
            f.stopped.display()
        )) && r.stdout.contains("2 ranks logged in"),
        "{}",
        r.explain()
    );
    let t = tempdir();
    let r = run(tchrun().arg("logs").arg(t.path()), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("no driver logs and no failure summary in")
            && r.stderr.contains("<output>/logs for a training job")
            && !r.stderr.contains("70_mpi_log"),
        "{}",
        r.explain()
    );
    // Without an argument: ./tchrun-logs, the default log directory of the other commands.
    let r = run(tchrun().arg("logs").current_dir(t.path()), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("tchrun-logs: not a directory"),
        "{}",
        r.explain()
    );
}

/// `--early-stop-on ema` (issue 32): `--patience` watches the EMA model's validation loss. On
/// the rotated validation classes the loss rises as the model learns; with a decay that
/// torchvision's adjustment clamps to 0 (the average is the weights of each epoch's last
/// update) the EMA's rises too: training stops after epoch 2 with `--patience 1`, saying whose
/// loss it watched, and both model directories hold epoch 1.
#[test]
fn early_stopping_on_the_ema_model_says_so_and_keeps_its_best_epoch() {
    let f = fixture();
    let out = f.dir.join("ema-patience");
    let r = run(
        &mut train_cmd(
            &f.model,
            &f.data,
            &out,
            &[
                "--model-ema",
                "--model-ema-steps",
                "1",
                "--model-ema-decay",
                "0.5",
                "--early-stop-on",
                "ema",
                "--patience",
                "1",
            ],
        ),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(
            "early stopping after epoch 2: the EMA model's validation loss has not decreased \
             for 1 epoch(s) (--patience 1, --early-stop-on ema)"
        ),
        "{}",
        r.explain()
    );
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(rows[1]["ema_val_loss"].as_f64() >= rows[0]["ema_val_loss"].as_f64());
    for dir in [out.clone(), out.join("ema")] {
        let m: serde_json::Value =
            serde_json::from_str(&read(&dir.join("model.json"))).expect("model.json");
        assert_eq!(m["training"]["best_epoch"], 1, "{m}");
    }
    let e: serde_json::Value =
        serde_json::from_str(&read(&out.join("ema/model.json"))).expect("ema/model.json");
    assert_eq!(e["ema"]["adjusted_decay"], 0.0, "{e}");
}
