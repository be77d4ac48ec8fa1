//! `model init --memory-efficient` (torchvision's DenseNet `memory_efficient=True`): refused for
//! the ResNets, recorded in `model.json`, and a memory-efficient densenet121 trains, scores and
//! loads strictly in torchvision. That its logits, gradients and running statistics equal the
//! plain model's is the worker's unit test
//! `densenet::tests::memory_efficient_densenet_equals_the_plain_one`; the memory it saves is in
//! BENCHMARKS.md (`scripts/bench-densenet-memory.sh`).
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
/// Flags that suit 32×32 digits (as tests/trainer.rs).
const DIGITS: &[&str] = &[
    "--min-crop-scale",
    "0.5",
    "--no-hflip",
    "--print-freq",
    "20",
];

fn model_json(dir: &Path) -> serde_json::Value {
    serde_json::from_str(&read(&dir.join("model.json"))).expect("model.json is JSON")
}

fn init(dir: &Path, arch: &str, extra: &[&str]) -> Run {
    run(
        tchrun()
            .args(["model", "init", "--arch", arch, "--input-size", "32"])
            .args(extra)
            .arg("--output")
            .arg(dir),
        LIMIT,
    )
}

#[test]
fn memory_efficient_is_refused_for_resnets() {
    let t = tempdir();
    for arch in ["resnet18", "resnext50_32x4d"] {
        let dir = t.path().join(arch);
        let r = init(&dir, arch, &["--memory-efficient"]);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr.contains("--memory-efficient") && r.stderr.contains("DenseNet only"),
            "{}",
            r.explain()
        );
        assert!(
            !dir.exists(),
            "{} written despite the refusal",
            dir.display()
        );
    }
}

/// densenet121 at 32 px with `--memory-efficient`: `model.json` records it (a plain model's
/// does not mention it), one epoch on a tiny digits set trains, the trained model keeps the
/// flag, `score` builds it, and torchvision loads its weights strictly and agrees with every
/// prediction (the same parameter names as the plain model).
#[test]
fn memory_efficient_densenet121_trains_scores_and_loads_in_torchvision() {
    let t = tempdir();
    let plain = t.path().join("plain");
    let r = init(&plain, "densenet121", &[]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        model_json(&plain).get("memory_efficient").is_none(),
        "a plain model.json mentions memory_efficient"
    );
    let model = t.path().join("me");
    let r = init(&model, "densenet121", &["--memory-efficient"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_eq!(model_json(&model)["memory_efficient"], true);

    // 10 training and 3 validation images per class: a few steps, enough to move every weight.
    let d = small_digits();
    let train = subset(&d.join("train"), &t.path().join("train"), 10, 0);
    let valid = subset(&d.join("valid"), &t.path().join("valid"), 3, 0);
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &train, &valid, &out)
            .args(DIGITS)
            .args(["--epochs", "1", "--batch-size", "20", "--lr", "0.01"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let trained = model_json(&out);
    assert_eq!(trained["memory_efficient"], true, "{trained}");
    assert!(trained["metrics"]["train_loss"].is_number(), "{trained}");
    assert!(all_weights_finite(&out.join("model.safetensors")).is_ok());

    let csv = t.path().join("scores.csv");
    let s = run(
        tchrun()
            .arg("score")
            .arg("--model")
            .arg(&out)
            .arg("--images")
            .arg(&valid)
            .arg("--output")
            .arg(&csv),
        LIMIT,
    );
    assert_eq!(s.code, Some(0), "{}", s.explain());
    assert_eq!(read(&csv).lines().count(), 1 + 30, "one row per image");
    let py = run(
        python()
            .arg(repo().join("tests/python/interop.py"))
            .arg(&out)
            .arg(&valid)
            .arg(&csv),
        LIMIT,
    );
    assert_eq!(py.code, Some(0), "{}", py.explain());
    assert!(
        py.stdout.contains("strict load ok; top-1 agreement 30/30"),
        "{}",
        py.explain()
    );
}
