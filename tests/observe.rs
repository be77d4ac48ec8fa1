//! What a training job shows about itself: rank 0's TensorBoard events (read back by
//! TensorBoard's own `EventAccumulator`, equal to `metrics.jsonl`, one file, a resume's step
//! axis without duplicates), the per-epoch time split (data wait, compute, communication) and
//! the end-of-run verdict (input-, compute- or communication-bound).
mod common;
use common::*;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);

/// Reads a TensorBoard log directory with TensorBoard's own reader: the event files' names and
/// every scalar series as `[step, value]` pairs.
const READ_EVENTS: &str = r#"
import json, os, sys
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
d = sys.argv[1]
ea = EventAccumulator(d, size_guidance={"scalars": 0})
ea.Reload()
print(json.dumps({
    "files": sorted(f for f in os.listdir(d) if "tfevents" in f),
    "scalars": {t: [[e.step, e.value] for e in ea.Scalars(t)] for t in ea.Tags()["scalars"]},
}))
"#;

struct Events {
    files: Vec<String>,
    scalars: BTreeMap<String, Vec<(u64, f64)>>,
}

fn events(out: &Path) -> Events {
    let r = run(
        python()
            .args(["-c", READ_EVENTS])
            .arg(out.join("tensorboard")),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("reader output is JSON");
    let files = v["files"]
        .as_array()
        .expect("files")
        .iter()
        .filter_map(|f| f.as_str().map(String::from))
        .collect();
    let scalars = v["scalars"]
        .as_object()
        .expect("scalars")
        .iter()
        .map(|(tag, pts)| {
            let pts = pts
                .as_array()
                .expect("points")
                .iter()
                .map(|p| (p[0].as_u64().expect("step"), p[1].as_f64().expect("value")))
                .collect();
            (tag.clone(), pts)
        })
        .collect();
    Events { files, scalars }
}

fn train_small(out: &Path, model: &Path, extra: &[&str]) -> std::process::Command {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    // 400 training images, 2 ranks × batches of 20: 10 steps per epoch.
    c.args([
        "--procs-per-node",
        "2",
        "--batch-size",
        "20",
        "--lr",
        "0.05",
        "--min-crop-scale",
        "0.5",
        "--no-hflip",
    ])
    .args(extra);
    c
}

/// The per-epoch scalars equal `metrics.jsonl`'s rows (as the f32 TensorBoard stores), at the
/// step each epoch ended; top-1 and top-5 in percent, as the console shows them.
fn check_epochs_equal_metrics(ev: &Events, out: &Path, steps_per_epoch: u64) {
    let rows = metrics_rows(out);
    for (tag, key, scale) in [
        ("epoch/train_loss", "train_loss", 1.0),
        ("epoch/valid_loss", "val_loss", 1.0),
        ("epoch/top1", "top1", 100.0),
        ("epoch/top5", "top5", 100.0),
        ("epoch/images_per_sec", "train_images_per_sec", 1.0),
        ("epoch/lr", "lr", 1.0),
    ] {
        let want: Vec<(u64, f64)> = rows
            .iter()
            .map(|r| {
                let e = r["epoch"].as_u64().expect("epoch");
                let v = scale * r[key].as_f64().expect(key);
                (e * steps_per_epoch, v as f32 as f64)
            })
            .collect();
        assert_eq!(
            ev.scalars.get(tag),
            Some(&want),
            "{tag} vs metrics.jsonl {key}"
        );
    }
    let share: Vec<(u64, f64)> = rows
        .iter()
        .map(|r| {
            let e = r["epoch"].as_u64().expect("epoch");
            let s = r["data_wait_s"].as_f64().expect("data_wait_s")
                / r["step_time_s"].as_f64().expect("step_time_s");
            (e * steps_per_epoch, s as f32 as f64)
        })
        .collect();
    assert_eq!(ev.scalars.get("epoch/data_wait_share"), Some(&share));
}

/// The three parts of every epoch add up to its step time within 5 %; the slowest rank's
/// value of each part is at least the mean.
fn check_time_split(out: &Path) {
    for r in metrics_rows(out) {
        let f = |k: &str| r[k].as_f64().unwrap_or_else(|| panic!("{k} in {r}"));
        let (step, parts) = (
            f("step_time_s"),
            f("data_wait_s") + f("compute_s") + f("comm_s"),
        );
        assert!(step > 0.0, "{r}");
        assert!(
            (parts - step).abs() <= 0.05 * step,
            "data wait + compute + communication = {parts:.3}s, step time {step:.3}s: {r}"
        );
        for k in ["data_wait", "compute", "comm"] {
            assert!(
                f(&format!("{k}_max_s")) >= f(&format!("{k}_s")) - 1e-9,
                "{k}: {r}"
            );
        }
    }
}

/// A normal 2-rank run: one events file, per-step scalars at every `--print-freq` and each
/// epoch's end (equal to the progress lines), per-epoch scalars equal to `metrics.jsonl`; a
/// small model on small images with enough loader threads is compute-bound.
#[test]
fn events_match_metrics_and_a_small_run_is_compute_bound() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = run(
        &mut train_small(&out, &model, &["--epochs", "2", "--print-freq", "3"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let ev = events(&out);
    assert_eq!(
        ev.files.len(),
        1,
        "one events file for 2 ranks: {:?}",
        ev.files
    );
    let steps: Vec<u64> = ev.scalars["train/loss"].iter().map(|p| p.0).collect();
    assert_eq!(steps, vec![1, 3, 6, 9, 10, 11, 13, 16, 19, 20]);
    for tag in ["train/lr", "train/images_per_sec"] {
        let s: Vec<u64> = ev.scalars[tag].iter().map(|p| p.0).collect();
        assert_eq!(s, steps, "{tag}");
    }
    // The same losses and LRs as rank 0's progress lines (printed with 4 digits).
    let log = read(&out.join("logs/70_driver_log_0"));
    let printed: Vec<(f64, f64)> = log
        .lines()
        .filter(|l| l.contains(" iter ") && l.contains(" loss "))
        .map(|l| {
            let after = |k: &str| -> f64 {
                l.split(k)
                    .nth(1)
                    .and_then(|s| s.split_whitespace().next())
                    .and_then(|v| v.parse().ok())
                    .unwrap_or_else(|| panic!("no {k} in {l}"))
            };
            (after(" loss "), after(" lr "))
        })
        .collect();
    assert_eq!(printed.len(), steps.len(), "{log}");
    for ((p_loss, p_lr), ((_, loss), (_, lr))) in printed
        .iter()
        .zip(ev.scalars["train/loss"].iter().zip(&ev.scalars["train/lr"]))
    {
        assert!(
            (p_loss - loss).abs() <= 5e-5 + 1e-6 * loss.abs(),
            "{p_loss} vs {loss}"
        );
        assert!((p_lr - lr).abs() <= 1e-3 * lr.abs(), "{p_lr} vs {lr}");
    }
    check_epochs_equal_metrics(&ev, &out, 10);
    check_time_split(&out);
    let verdict = r
        .stdout
        .lines()
        .find(|l| l.contains("-bound: "))
        .unwrap_or_else(|| panic!("no verdict line\n{}", r.explain()));
    eprintln!("{verdict}");
    assert!(
        verdict.starts_with("tchrun: compute-bound: "),
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.contains(&format!(
            "tensorboard --logdir {}",
            out.join("tensorboard").display()
        )),
        "{}",
        r.explain()
    );
}

fn driver_pid(out: &Path, rank: usize) -> Option<i32> {
    std::fs::read_to_string(out.join(format!("logs/70_driver_log_{rank}")))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("pid: "))
        .and_then(|p| p.trim().parse().ok())
}

/// Rank 0 killed (SIGKILL) in epoch 2, after it logged steps past its last checkpoint (the end
/// of epoch 1): `--resume` leaves one events file whose steps run 1..=30 once each (the
/// crashed run's steps after the checkpoint are gone, the resumed run's are there), and the
/// per-epoch scalars still equal `metrics.jsonl`. The plot gets every step's loss.
#[test]
fn resume_after_a_crash_continues_the_step_axis_without_duplicates() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let killer = {
        let out: PathBuf = out.clone();
        std::thread::spawn(move || {
            let log = out.join("logs/70_driver_log_0");
            let reached = wait_for(LIMIT, || {
                std::fs::read_to_string(&log).is_ok_and(|t| t.contains("epoch 2/3 iter 4/10"))
            });
            let pid = driver_pid(&out, 0).filter(|_| reached);
            if let Some(pid) = pid {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            pid.is_some()
        })
    };
    let flags = ["--epochs", "3", "--print-freq", "1"];
    let r = run(&mut train_small(&out, &model, &flags), LIMIT);
    assert!(
        killer.join().unwrap_or(false),
        "never reached epoch 2 iter 4\n{}",
        r.explain()
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let crashed = events(&out);
    let logged: Vec<u64> = crashed.scalars["train/loss"].iter().map(|p| p.0).collect();
    assert!(
        logged.iter().any(|s| *s > 10),
        "the crashed run logged steps after its checkpoint (step 10): {logged:?}"
    );
    let resumed = run(
        &mut train_small(&out, &model, &[&flags[..], &["--resume"]].concat()),
        LIMIT,
    );
    assert_resumed(&resumed, &out);
    let ev = events(&out);
    assert_eq!(ev.files.len(), 1, "{:?}", ev.files);
    for tag in ["train/loss", "train/lr", "train/images_per_sec"] {
        let steps: Vec<u64> = ev.scalars[tag].iter().map(|p| p.0).collect();
        assert_eq!(steps, (1..=30).collect::<Vec<u64>>(), "{tag}");
    }
    // Steps 1..=10 are the first run's, kept as they were.
    assert_eq!(
        ev.scalars["train/loss"][..10],
        crashed.scalars["train/loss"][..10]
    );
    check_epochs_equal_metrics(&ev, &out, 10);
    check_time_split(&out);
    assert!(out.join("metrics.png").is_file());
}

/// Big JPEGs (3000×3000 px of noise: slow to decode), one loader thread, a small model
/// at 32 px: the ranks wait for data most of the time, and the report says input-bound with
/// the flag to change.
#[test]
fn a_slow_loader_is_reported_input_bound() {
    let t = tempdir();
    let data = t.path().join("big");
    let r = run(
        python()
            .args([
                "-c",
                r#"
import sys, os, numpy as np
from PIL import Image
rng = np.random.default_rng(0)
for split, n in (("train", 12), ("valid", 1)):
    for c in ("a", "b"):
        d = os.path.join(sys.argv[1], split, c)
        os.makedirs(d)
        for i in range(n):
            px = rng.integers(0, 256, (3000, 3000, 3), dtype=np.uint8)
            Image.fromarray(px).save(os.path.join(d, f"{i}.jpg"), quality=95)
"#,
            ])
            .arg(&data),
        Duration::from_secs(120),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &data.join("train"), &data.join("valid"), &out).args([
            "--procs-per-node",
            "2",
            "--batch-size",
            "4",
            "--epochs",
            "2",
            "--loader-threads",
            "1",
            "--print-freq",
            "2",
        ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    check_time_split(&out);
    let verdict = r
        .stdout
        .lines()
        .find(|l| l.contains("-bound: "))
        .unwrap_or_else(|| panic!("no verdict line\n{}", r.explain()));
    eprintln!("{verdict}");
    assert!(
        verdict.starts_with("tchrun: input-bound: "),
        "{}",
        r.explain()
    );
    assert!(verdict.contains("--loader-threads"), "{verdict}");
    // 24 images, 2 ranks × 4: 3 steps per epoch.
    check_epochs_equal_metrics(&events(&out), &out, 3);
}

/// Our `SessionLog.START` as TensorBoard's reader understands it: events logged after a
/// checkpoint by a run that then crashed (steps 11..=14 here) are discarded once a restart at
/// step 11 is marked, even in the same file; the restarted run's values stand. (`--resume`
/// also rewrites the file without them: see the test above.)
#[test]
fn tensorboard_discards_steps_logged_after_a_marked_restart() {
    use tchrun_tensorboard::{Event, EventWriter, SessionLog, What, SESSION_START};
    let t = tempdir();
    let out = t.path();
    let mut w = EventWriter::create(&out.join("tensorboard"), "host").expect("create");
    for s in 1..=14u64 {
        w.scalars(s, &[("train/loss", 1.0)]).expect("write");
    }
    w.write(&Event {
        wall_time: 0.0,
        step: 11,
        what: Some(What::SessionLog(SessionLog {
            status: SESSION_START,
            ..Default::default()
        })),
    })
    .expect("write");
    for s in 11..=20u64 {
        w.scalars(s, &[("train/loss", 2.0)]).expect("write");
    }
    let ev = events(out);
    let want: Vec<(u64, f64)> = (1..=20)
        .map(|s| (s, if s <= 10 { 1.0 } else { 2.0 }))
        .collect();
    assert_eq!(ev.scalars["train/loss"], want);
}

/// Events are cosmetic: when they cannot be written (here `<output>/tensorboard` is a file),
/// the run says so once, on the console and in the driver log, and trains to the end.
#[test]
fn a_tensorboard_failure_warns_once_and_training_goes_on() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    std::fs::write(out.join("tensorboard"), "not a directory").expect("write");
    let d = small_digits();
    let train = subset(&d.join("train"), &t.path().join("train"), 8, 0);
    let valid = subset(&d.join("valid"), &t.path().join("valid"), 2, 0);
    let r = run(
        tchrun_train(&model, &train, &valid, &out).args([
            "--epochs",
            "1",
            "--batch-size",
            "20",
            "--print-freq",
            "2",
        ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let warning = "warning: TensorBoard events not written from here on";
    assert_eq!(r.stdout.matches(warning).count(), 1, "{}", r.explain());
    assert!(read(&out.join("logs/70_driver_log_0")).contains(warning));
    assert!(out.join("model.json").is_file() && out.join("metrics.png").is_file());
    assert!(
        !r.stdout.contains("tensorboard --logdir"),
        "{}",
        r.explain()
    );
}
