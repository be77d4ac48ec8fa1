//! `tchrun train --max-restarts N` (issue 15 item 1): a rank killed with SIGKILL mid-run (the
//! worker's `TCHRUN_TEST_KILL_AT_STEP` hook, first attempt only) is recovered by a restart of
//! every rank with `--resume`, under local ranks and mpirun, and the model is bit-identical to
//! an uninterrupted run's; without restarts the job fails as before; a job that fails before
//! writing any checkpoint is not restarted. `--model-ema` (issue 32): the EMA model of a run
//! restarted mid-epoch from its checkpoint equals the uninterrupted run's, bit for bit.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);
/// 400 training images, 2 ranks × 20 per batch: 10 steps per epoch.
const STEPS_PER_EPOCH: u64 = 10;

fn train(model: &Path, out: &Path, launcher: &str, extra: &[&str], kill: Option<&str>) -> Run {
    run(&mut train_command(model, out, launcher, extra, kill), LIMIT)
}

/// The command `train` runs.
fn train_command(
    model: &Path,
    out: &Path,
    launcher: &str,
    extra: &[&str],
    kill: Option<&str>,
) -> std::process::Command {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    c.args([
        "--epochs",
        "3",
        "--batch-size",
        "20",
        "--procs-per-node",
        "2",
        "--launcher",
        launcher,
        "--print-freq",
        "5",
    ])
    .args(extra)
    .env_remove("TCHRUN_ATTEMPT");
    if !extra.contains(&"--lr") {
        c.args(["--lr", "0.05"]);
    }
    if launcher == "mpirun" {
        c.arg("--oversubscribe");
    }
    match kill {
        Some(k) => c.env("TCHRUN_TEST_KILL_AT_STEP", k),
        None => c.env_remove("TCHRUN_TEST_KILL_AT_STEP"),
    };
    c.env_remove("TCHRUN_TEST_KILL_ON_HOST")
        .env_remove("TCHRUN_TEST_CHECKPOINT_DELAY_S");
    c
}

fn weights(out: &Path) -> Vec<u8> {
    std::fs::read(out.join("model.safetensors")).expect("model.safetensors")
}

/// The uninterrupted run's weights, trained once per test binary (both recovery tests compare
/// with the same run).
fn reference_weights() -> Vec<u8> {
    static W: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    W.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tchrun-restart-ref-{}", std::process::id()));
        let model = model_dir(&dir, "resnet18", 32);
        let reference = dir.join("reference");
        let r = train(&model, &reference, "local", &[], None);
        assert_eq!(r.code, Some(0), "{}", r.explain());
        let w = weights(&reference);
        let _ = std::fs::remove_dir_all(&dir);
        w
    })
    .clone()
}

#[test]
fn a_killed_rank_is_restarted_from_the_checkpoint_and_the_model_is_bit_identical() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let reference = reference_weights();
    // Rank 1 dies in the middle of epoch 2: the epoch-1 checkpoint is the progress.
    let kill = format!("1:{}", STEPS_PER_EPOCH + STEPS_PER_EPOCH / 2);
    for launcher in ["local", "mpirun"] {
        let out = t.path().join(format!("killed-{launcher}"));
        let r = train(
            &model,
            &out,
            launcher,
            &["--max-restarts", "1"],
            Some(&kill),
        );
        assert_eq!(r.code, Some(0), "{launcher}: {}", r.explain());
        let text = format!("{}{}", r.stdout, r.stderr);
        assert!(
            text.contains("restarting all ranks in 1 s from the checkpoint at step 10")
                && text.contains("tchrun: recovered after 1 restart(s) (attempt 1: rank 1 (")
                && text.contains("resuming from"),
            "{launcher}: {}",
            r.explain()
        );
        assert!(
            weights(&out) == reference,
            "{launcher}: the recovered model differs from the uninterrupted one"
        );
        // The first attempt's logs are kept apart; the current ones are where they always are.
        let logs = out.join("logs");
        let first = read(&logs.join("attempt-1/70_driver_log_1"));
        assert!(
            first.contains("TCHRUN_TEST_KILL_AT_STEP: SIGKILL at step 15"),
            "{first}"
        );
        assert!(logs.join("attempt-1/failure.json").is_file());
        assert!(read(&logs.join("70_driver_log_1")).contains("rank exiting with code 0"));
        let history: serde_json::Value =
            serde_json::from_str(&read(&logs.join("restarts.json"))).expect("restarts.json");
        assert_eq!(history[0]["attempt"], 1, "{history}");
        assert_eq!(history[0]["rank"], 1, "{history}");
        assert_eq!(history[0]["resumed_from_step"], 10, "{history}");
        let ranks: serde_json::Value =
            serde_json::from_str(&read(&logs.join("ranks.json"))).expect("ranks.json");
        assert_eq!(ranks[1]["attempt"], 2, "{ranks}");
        assert!(!logs.join("failure.json").exists(), "the job succeeded");
        // status.json stays at the top (not with the attempt's logs) and ends as the job did.
        let status: serde_json::Value =
            serde_json::from_str(&read(&logs.join("status.json"))).expect("status.json");
        assert_eq!(
            (&status["state"], &status["attempt"], &status["end"]["code"]),
            (&"finished".into(), &2.into(), &0.into()),
            "{status}"
        );
        assert!(!logs.join("attempt-1/status.json").exists());
    }
}

#[test]
fn without_restarts_a_killed_rank_fails_the_job_and_a_failure_before_progress_is_not_retried() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("no-restarts");
    let r = train(&model, &out, "local", &[], Some("1:12"));
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert!(!out.join("logs/attempt-1").exists());
    // Dies at the first step: no checkpoint, so a restart would fail the same way.
    let out = t.path().join("at-step-0");
    let r = train(&model, &out, "local", &["--max-restarts", "3"], Some("0:0"));
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert!(
        r.stderr
            .contains("not restarting: attempt 1 wrote no checkpoint"),
        "{}",
        r.explain()
    );
    assert!(!out.join("logs/attempt-1").exists(), "one attempt only");
}

/// `--checkpoint-every 3` (issue 15 item 2): rank 1 dies at step 7, in the first epoch, before
/// any epoch-end checkpoint; the restart resumes from a mid-epoch background checkpoint (step 6,
/// or 3 if the kill overtook the newest write) and the model is still bit-identical. Without
/// the cadence the same kill leaves nothing to resume from: no restart, exit 4.
#[test]
fn checkpoints_every_n_steps_let_a_restart_resume_mid_epoch() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let reference = reference_weights();
    let out = t.path().join("every-3");
    let r = train(
        &model,
        &out,
        "local",
        &["--max-restarts", "1", "--checkpoint-every", "3"],
        Some("1:7"),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let history: serde_json::Value =
        serde_json::from_str(&read(&out.join("logs/restarts.json"))).expect("restarts.json");
    let from = history[0]["resumed_from_step"].as_u64().unwrap_or(0);
    assert!(from == 6 || from == 3, "{history}");
    assert!(weights(&out) == reference, "the recovered model differs");
    let out = t.path().join("epoch-ends-only");
    let r = train(&model, &out, "local", &["--max-restarts", "1"], Some("1:7"));
    assert_eq!(r.code, Some(4), "{}", r.explain());
}

/// Rank 0's checkpoint writes run in the background (issue 15 item 2): a write that takes 20 s
/// (`TCHRUN_TEST_CHECKPOINT_DELAY_S`) does not make the other rank time out with `--timeout 5`;
/// the job completes and leaves a valid, finished checkpoint.
#[test]
fn a_slow_checkpoint_write_stalls_no_rank() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let d = small_digits();
    let out = t.path().join("slow");
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .args([
                "--epochs",
                "1",
                "--batch-size",
                "20",
                "--lr",
                "0.05",
                "--procs-per-node",
                "2",
                "--launcher",
                "local",
                "--timeout",
                "5",
            ])
            .env("TCHRUN_TEST_CHECKPOINT_DELAY_S", "20"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let log0 = read(&out.join("logs/70_driver_log_0"));
    assert!(log0.contains("checkpoint written (background)"), "{log0}");
    let last: serde_json::Value =
        serde_json::from_str(&read(&out.join("checkpoints/last.json"))).expect("last.json");
    assert_eq!(last["finished"], true, "{last}");
    assert!(out.join("model.safetensors").is_file());
}

extern "C" {
    #[link_name = "kill"]
    fn kill_pid(pid: i32, sig: i32) -> i32;
}

/// A background `tchrun` (its own process group, output in files); the group is SIGKILLed on
/// drop, so a failing test leaves no rank behind.
struct Background {
    child: std::process::Child,
    output: PathBuf,
}

impl Background {
    fn spawn(cmd: &mut std::process::Command, output: PathBuf) -> Background {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(&output).expect("output file");
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(file.try_clone().expect("output file"))
            .stderr(file)
            .process_group(0)
            .spawn()
            .expect("start tchrun");
        Background { child, output }
    }

    fn output(&self) -> String {
        std::fs::read_to_string(&self.output).unwrap_or_default()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            unsafe { kill_pid(-(self.child.id() as i32), 9) };
            let _ = self.child.wait();
        }
    }
}

/// `checkpoints/last.json` of `out`, if there is a complete one.
fn last_json(out: &Path) -> Option<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(out.join("checkpoints/last.json")).ok()?).ok()
}

/// Issue 15 item 2: rank 0 is SIGKILLed while its background writer is in the middle of a
/// checkpoint (`TCHRUN_TEST_CHECKPOINT_DELAY_S` pauses every write after its tensors file,
/// before `last.json` names it; the driver log says so). The previous checkpoint is intact:
/// `last.json` still names it, its tensors load, and `--resume` from it completes with a model
/// bit-identical to the uninterrupted run's.
#[test]
fn sigkill_during_a_background_checkpoint_write_keeps_the_previous_one() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let reference = reference_weights();
    let out = t.path().join("killed-mid-write");
    let mut job = Background::spawn(
        train_command(&model, &out, "local", &["--checkpoint-every", "3"], None)
            .env("TCHRUN_TEST_CHECKPOINT_DELAY_S", "10"),
        t.path().join("tchrun.out"),
    );
    let log0 = out.join("logs/70_driver_log_0");
    // The write of a later step than the complete checkpoint's is paused mid-way.
    let pausing =
        |step: u64| format!("checkpoint of step {step}: last-{step}.safetensors written, pausing");
    let mut mid_write = None;
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(240)
        && job.child.try_wait().ok().flatten().is_none()
    {
        if let Some(done) = last_json(&out).and_then(|j| j["step"].as_u64()) {
            let log = std::fs::read_to_string(&log0).unwrap_or_default();
            if let Some(next) = (done + 1..done + 10).find(|s| log.contains(&pausing(*s))) {
                mid_write = Some((done, next));
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let Some((done, next)) = mid_write else {
        panic!(
            "never saw a checkpoint write paused after a complete one\n{}\n--- driver log 0\n{}",
            job.output(),
            read(&log0)
        );
    };
    let pid = read(&log0)
        .lines()
        .find_map(|l| l.trim().strip_prefix("pid: ").map(str::to_string))
        .and_then(|p| p.trim().parse::<i32>().ok())
        .expect("rank 0's pid in its driver log header");
    unsafe { kill_pid(pid, 9) };
    let code = {
        let killed = Instant::now();
        loop {
            if let Some(s) = job.child.try_wait().expect("wait") {
                break s.code();
            }
            assert!(
                killed.elapsed() < Duration::from_secs(60),
                "tchrun did not end after rank 0 was killed\n{}",
                job.output()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    assert_eq!(code, Some(4), "{}", job.output());
    // The previous checkpoint is the one named, complete; the interrupted one is not named.
    let last = last_json(&out).expect("last.json is still valid JSON");
    assert_eq!(last["step"].as_u64(), Some(done), "{last}");
    let ckpt = out.join("checkpoints");
    let named = ckpt.join(last["tensors"].as_str().expect("tensors"));
    assert!(named.is_file(), "{} is gone", named.display());
    assert!(
        ckpt.join(format!("last-{next}.safetensors")).is_file(),
        "the kill was not mid-write: step {next}'s tensors are not there"
    );
    let r = train(&model, &out, "local", &["--resume"], None);
    assert_resumed(&r, &out);
    assert!(
        r.stdout.contains(&format!("step {done}")),
        "did not resume from step {done}\n{}",
        r.explain()
    );
    assert!(
        weights(&out) == reference,
        "the model resumed after the kill differs from the uninterrupted one"
    );
}

/// `--exclude-failed-hosts`, `--min-nodes` and `--spare-hosts` are refused before anything
/// runs when they cannot apply: exit 2 and the flag to add or change.
#[test]
fn exclude_failed_hosts_needs_a_hostfile_and_restarts() {
    let t = tempdir();
    let model = t.path().join("no-model");
    let hostfile = t.path().join("hosts");
    std::fs::write(&hostfile, "a slots=1\nb slots=1\n").expect("hostfile");
    let hf = format!("--hostfile={}", hostfile.display());
    let spares = t.path().join("spares");
    std::fs::write(&spares, "b slots=1\n").expect("spares");
    let sp = format!("--spare-hosts={}", spares.display());
    let cases: [(&[&str], &str); 6] = [
        (
            &[&sp, "--nodes", "1"],
            &format!("--spare-hosts {} needs --hostfile FILE", spares.display()),
        ),
        (
            &[&sp, &hf, "--nodes", "2"],
            &format!(
                "--spare-hosts {}: b is also in --hostfile {}; a spare must be another host",
                spares.display(),
                hostfile.display()
            ),
        ),
        (
            &["--exclude-failed-hosts", "--max-restarts", "2"],
            "--exclude-failed-hosts needs --hostfile FILE",
        ),
        (
            &["--exclude-failed-hosts", &hf, "--nodes", "2"],
            "--exclude-failed-hosts needs --max-restarts N",
        ),
        (
            &[
                "--exclude-failed-hosts",
                &hf,
                "--nodes",
                "2",
                "--max-restarts",
                "2",
                "--min-nodes",
                "3",
            ],
            "--min-nodes 3 is more than --nodes 2",
        ),
        (
            &["--min-nodes", "2", &hf, "--max-restarts", "2"],
            "--exclude-failed-hosts",
        ),
    ];
    for (flags, says) in cases {
        let r = run(
            tchrun_train(&model, t.path(), t.path(), &t.path().join("out"))
                .args(flags)
                .env_remove("TCHRUN_MAX_RESTARTS")
                .env_remove("TCHRUN_EXCLUDE_FAILED_HOSTS")
                .env_remove("TCHRUN_MIN_NODES"),
            Duration::from_secs(30),
        );
        assert_eq!(r.code, Some(2), "{flags:?}: {}", r.explain());
        assert!(r.stderr.contains(says), "{flags:?}: {}", r.explain());
        assert!(!t.path().join("out").exists(), "{flags:?}: wrote --output");
    }
}

/// `--opt adamw` (issue 32): rank 1 killed at step 7 is restarted from a mid-epoch checkpoint
/// (step 6, or 3 if the kill overtook the newest write) that holds AdamW's state (`exp_avg`,
/// `exp_avg_sq` and each parameter's step count), and the model is bit-identical to the
/// uninterrupted AdamW run's, with weight-decay groups of their own and MixUp, CutMix and
/// random erasing on (their draws follow each micro-batch's and image's position, so the
/// resumed run draws what the uninterrupted one drew). `model.json` records the optimizer, the
/// groups and the augmentation; a `--resume` with another `--opt` is refused before any rank
/// starts, naming the flag that gives the checkpoint's back.
#[test]
fn adamw_restarted_from_its_checkpoint_equals_the_uninterrupted_run() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let opt = [
        "--opt",
        "adamw",
        "--lr",
        "0.001",
        "--weight-decay",
        "0.05",
        "--norm-weight-decay",
        "0",
        "--bias-weight-decay",
        "0.01",
        "--mixup-alpha",
        "0.2",
        "--cutmix-alpha",
        "1.0",
        "--random-erase",
        "0.5",
    ];
    let reference = t.path().join("reference");
    let r = train(&model, &reference, "local", &opt, None);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let out = t.path().join("restarted");
    let extra: Vec<&str> = opt
        .iter()
        .copied()
        .chain(["--max-restarts", "1", "--checkpoint-every", "3"])
        .collect();
    let r = train(&model, &out, "local", &extra, Some("1:7"));
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let history: serde_json::Value =
        serde_json::from_str(&read(&out.join("logs/restarts.json"))).expect("restarts.json");
    let from = history[0]["resumed_from_step"].as_u64().unwrap_or(0);
    assert!(from == 6 || from == 3, "{history}");
    assert!(
        weights(&out) == weights(&reference),
        "the restarted AdamW model differs from the uninterrupted one"
    );
    let m: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
    let tr = &m["training"];
    assert_eq!(tr["opt"], "adamw", "{m}");
    assert_eq!(tr["norm_weight_decay"], 0.0, "{m}");
    assert_eq!(tr["bias_weight_decay"], 0.01, "{m}");
    assert_eq!(
        (&tr["mixup_alpha"], &tr["cutmix_alpha"], &tr["random_erase"]),
        (&0.2.into(), &1.0.into(), &0.5.into()),
        "{m}"
    );
    // The checkpoint holds AdamW's state of every parameter, under torch's names.
    let last = last_json(&out).expect("last.json");
    let file = out
        .join("checkpoints")
        .join(last["tensors"].as_str().expect("tensors"));
    let bytes = std::fs::read(&file).expect("checkpoint tensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let names: Vec<String> = st.names().into_iter().cloned().collect();
    for n in [
        "exp_avg.fc.weight",
        "exp_avg_sq.bn1.bias",
        "step.conv1.weight",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing: {names:?}");
    }
    assert!(
        !names.iter().any(|x| x.starts_with("momentum.")),
        "{names:?}"
    );
    // Another optimizer on --resume: refused, naming --opt.
    let sgd: Vec<&str> = opt[2..].iter().copied().chain(["--resume"]).collect();
    let r = train(&model, &out, "local", &sgd, None);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains("--opt") && text.contains("--opt adamw"),
        "{text}"
    );
}

/// `--model-ema` (issue 32): rank 1 killed at step 17 (epoch 2, after the warmup epoch whose
/// updates reset the average) is restarted from a mid-epoch checkpoint (step 15, or 10 if the
/// kill overtook the newest write) that holds the average and its count (`ema.<name>`,
/// `ema.n_averaged`); the EMA model (`<output>/ema/`) and the model are bit-identical to the
/// uninterrupted run's. `--early-stop-on ema` picks both directories' epoch by the EMA's
/// validation loss; metrics.jsonl and the console give the EMA's validation beside the model's;
/// `tchrun evaluate` accepts `<output>/ema/`; a `--resume` without `--model-ema` is refused
/// before any rank starts, naming the flag.
#[test]
fn model_ema_restarted_from_its_checkpoint_equals_the_uninterrupted_run() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let ema = [
        "--model-ema",
        "--model-ema-steps",
        "2",
        "--model-ema-decay",
        "0.999",
        "--warmup-epochs",
        "1",
        "--early-stop-on",
        "ema",
    ];
    let reference = t.path().join("reference");
    let r = train(&model, &reference, "local", &ema, None);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let out = t.path().join("restarted");
    let extra: Vec<&str> = ema
        .iter()
        .copied()
        .chain(["--max-restarts", "1", "--checkpoint-every", "5"])
        .collect();
    let r = train(&model, &out, "local", &extra, Some("1:17"));
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let history: serde_json::Value =
        serde_json::from_str(&read(&out.join("logs/restarts.json"))).expect("restarts.json");
    let from = history[0]["resumed_from_step"].as_u64().unwrap_or(0);
    assert!(from == 15 || from == 10, "{history}");
    assert!(
        weights(&out.join("ema")) == weights(&reference.join("ema")),
        "the restarted EMA model differs from the uninterrupted one"
    );
    assert!(weights(&out) == weights(&reference), "the models differ");
    assert!(
        weights(&out.join("ema")) != weights(&out),
        "the EMA model is the model's weights"
    );
    // The EMA's model.json: the decay given, torchvision's adjustment (2 ranks × 20 images ×
    // 2 steps / 3 epochs), the updates since the warmup's last reset at the best epoch.
    let m: serde_json::Value =
        serde_json::from_str(&read(&out.join("ema/model.json"))).expect("ema/model.json");
    assert_eq!(m["ema"]["decay"], 0.999, "{m}");
    assert_eq!(m["ema"]["steps"], 2, "{m}");
    let adjusted = 1.0 - (1.0 - 0.999f64) * (40.0 * 2.0 / 3.0);
    assert_eq!(m["ema"]["adjusted_decay"].as_f64(), Some(adjusted), "{m}");
    let best = m["training"]["best_epoch"].as_u64().expect("best_epoch");
    // The warmup epoch resets the count after each update (as torchvision's train.py); each
    // later epoch adds 5 (its steps 0, 2, 4, 6, 8), the first of them a copy.
    assert_eq!(m["ema"]["n_averaged"].as_u64(), Some(5 * (best - 1)), "{m}");
    let main: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
    assert!(main.get("ema").is_none(), "{main}");
    let tr = &main["training"];
    assert_eq!(
        (
            &tr["model_ema"],
            &tr["model_ema_steps"],
            &tr["model_ema_decay"]
        ),
        (&true.into(), &2.into(), &0.999.into()),
        "{main}"
    );
    assert_eq!(tr["early_stop_on"], "ema", "{main}");
    assert_eq!(tr["best_epoch"].as_u64(), Some(best), "{main}");
    // The best epoch is the EMA's lowest validation loss.
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 3);
    let ema_losses: Vec<f64> = rows
        .iter()
        .map(|r| r["ema_val_loss"].as_f64().expect("ema_val_loss"))
        .collect();
    let lowest =
        ema_losses.iter().enumerate().fold(
            (0, f64::INFINITY),
            |b, (i, &l)| if l < b.1 { (i, l) } else { b },
        );
    assert_eq!(best, lowest.0 as u64 + 1, "{ema_losses:?}");
    assert!(rows
        .iter()
        .all(|r| r["ema_top1"].is_f64() && r["val_loss"].is_f64()));
    let text = read(&out.join("logs/70_driver_log_0"));
    assert!(
        text.contains("; EMA valid loss ")
            && text.contains(&format!(
                "EMA model of epoch {best} (--model-ema): valid top-1 "
            ))
            && text.contains(&format!("; written to {}", out.join("ema").display())),
        "{text}"
    );
    // The checkpoint holds the average and its count.
    let last = last_json(&out).expect("last.json");
    let file = out
        .join("checkpoints")
        .join(last["tensors"].as_str().expect("tensors"));
    let bytes = std::fs::read(&file).expect("checkpoint tensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let names: Vec<String> = st.names().into_iter().cloned().collect();
    for n in ["ema.fc.weight", "ema.bn1.running_var", "ema.n_averaged"] {
        assert!(names.iter().any(|x| x == n), "{n} missing: {names:?}");
    }
    // `tchrun evaluate` accepts the EMA model directory.
    let d = small_digits();
    let eval = t.path().join("eval");
    let r = run(
        tchrun()
            .args(["evaluate", "--launcher", "local", "--model"])
            .arg(out.join("ema"))
            .arg("--images")
            .arg(d.join("valid"))
            .arg("--output")
            .arg(&eval),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(eval.join("metrics.json").is_file(), "{}", r.explain());
    // A --resume without --model-ema: refused, naming the flag that gives the checkpoint's.
    let r = train(&model, &out, "local", &["--resume"], None);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(text.contains("--model-ema"), "{text}");
}

/// A dry run says what `--preflight doctor` would do and runs nothing; with `--spare-hosts`
/// the printed mpirun reads `<log-dir>/hostfile.with-spares` (not written by a dry run), and
/// `--output` stays unwritten.
#[test]
fn a_dry_run_names_the_preflight_and_the_hostfile_with_spares() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let d = small_digits();
    let hostfile = t.path().join("hosts");
    std::fs::write(&hostfile, "a slots=1\nb slots=1\n").expect("hostfile");
    let spares = t.path().join("spares");
    std::fs::write(&spares, "c slots=1\n").expect("spares");
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .env_remove("TCHRUN_MIN_NODES")
            .args(["--dry-run", "--preflight", "doctor", "--nodes", "2"])
            .args([
                "--launcher",
                "mpirun",
                "--exclude-failed-hosts",
                "--max-restarts",
                "2",
            ])
            .arg("--hostfile")
            .arg(&hostfile)
            .arg("--spare-hosts")
            .arg(&spares),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains("# --preflight doctor: tchrun doctor would run on the job's hosts first"),
        "{}",
        r.explain()
    );
    let merged = out.join("logs/hostfile.with-spares");
    assert!(
        r.stdout
            .contains(&format!("--hostfile {}", merged.display())),
        "{}",
        r.explain()
    );
    assert!(!out.exists(), "a dry run wrote {}", out.display());
}
