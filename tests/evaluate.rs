//! `tchrun evaluate` ("Evaluate Model") and `tchrun score` on many ranks: the figures equal
//! scikit-learn's recomputed from `scores.csv`, 3 ranks write the same bytes as 1 on a set
//! whose size is not divisible by 3, and a labeled folder with a class the model does not
//! know is refused before any rank starts. Two models compared (`--model A --model B`): each
//! model's figures equal scikit-learn's, McNemar's test equals statsmodels'; three models, and
//! two with different class lists, are refused.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(240);
const OUTPUTS: [&str; 4] = [
    "scores.csv",
    "metrics.json",
    "confusion_matrix.csv",
    "confusion_matrix.png",
];

/// A resnet18 trained one epoch on the small digits set (good enough to be wrong sometimes),
/// trained once per test binary (the tests share it; none writes into it).
fn trained() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let t = std::env::temp_dir().join(format!("tchrun-eval-trained-{}", std::process::id()));
        std::fs::create_dir_all(&t).expect("mkdir");
        let d = small_digits();
        let model = model_dir(&t, "resnet18", 32);
        let out = t.join("trained");
        let r = run(
            tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
                .args([
                    "--epochs",
                    "1",
                    "--batch-size",
                    "20",
                    "--lr",
                    "0.05",
                    "--launcher",
                    "local",
                    "--log-dir",
                ])
                .arg(t.join("logs")),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        out
    })
    .clone()
}

/// `tchrun CMD --model M --images I --output O --batch-size 16` on `ranks` ranks: one local
/// rank, or several through mpirun (oversubscribed on this 2-core machine).
fn infer(cmd: &str, model: &Path, images: &Path, out: &Path, ranks: u32) -> Run {
    infer_with(cmd, &[model], images, out, ranks)
}

/// `infer` with a `--model` for each of `models`.
fn infer_with(cmd: &str, models: &[&Path], images: &Path, out: &Path, ranks: u32) -> Run {
    let mut c = tchrun();
    c.arg(cmd);
    for m in models {
        c.arg("--model").arg(m);
    }
    c.arg("--images")
        .arg(images)
        .arg("--output")
        .arg(out)
        .args(["--batch-size", "16", "--procs-per-node", &ranks.to_string()]);
    if ranks == 1 {
        c.args(["--launcher", "local"]);
    } else {
        c.args(["--launcher", "mpirun", "--oversubscribe"]);
    }
    let r = run(&mut c, LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    r
}

#[test]
fn evaluate_equals_scikit_learn_and_three_ranks_write_what_one_writes() {
    let t = tempdir();
    let model = trained();
    // 100 images: 7 batches of 16 (the last one 4), neither divisible by 3 ranks.
    let images = subset(&small_digits().join("valid"), &t.path().join("eval"), 10, 0);
    let one = t.path().join("eval-1");
    let three = t.path().join("eval-3");
    let r1 = infer("evaluate", &model, &images, &one, 1);
    let r3 = infer("evaluate", &model, &images, &three, 3);
    assert!(
        r1.stdout
            .contains("evaluated 100 image(s) on 1 rank: top-1 ")
            && r3
                .stdout
                .contains("evaluated 100 image(s) on 3 ranks: top-1 "),
        "{}\n{}",
        r1.explain(),
        r3.explain()
    );
    for f in OUTPUTS {
        let (a, b) = (
            std::fs::read(one.join(f)).expect(f),
            std::fs::read(three.join(f)).expect(f),
        );
        assert!(a == b, "{f} differs between 1 and 3 ranks");
    }
    let scores = read(&one.join("scores.csv"));
    assert!(
        scores.starts_with(
            "file,true_class,predicted_class,probability,true_class_probability,top5_classes,top5_probabilities\n0/"
        ),
        "{scores}"
    );
    assert_eq!(scores.lines().count(), 101, "one row per image");
    // Each rank of the 3-rank job logged its share: whole batches, 100 images in all.
    let logs = driver_logs(&three.join("logs"), 3);
    let shares: Vec<usize> = logs
        .iter()
        .map(|l| {
            let line = l
                .lines()
                .find(|x| x.contains("evaluating"))
                .expect("share line");
            line.split("this_rank=")
                .nth(1)
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse().ok())
                .expect("this_rank=N")
        })
        .collect();
    assert_eq!(
        shares,
        vec![36, 32, 32],
        "batches 0,3,6 / 1,4 / 2,5 of 16 (the last one 4)"
    );
    // Every figure, recomputed from scores.csv by scikit-learn.
    let classes: Vec<String> = (0..10).map(|c| c.to_string()).collect();
    let py = run(
        python()
            .arg(repo().join("tests/python/evaluate_check.py"))
            .arg(&one)
            .args(&classes),
        LIMIT,
    );
    assert_eq!(py.code, Some(0), "{}", py.explain());
    assert!(
        py.stdout.contains("all figures equal scikit-learn's"),
        "{}",
        py.explain()
    );
    let png = std::fs::read(one.join("confusion_matrix.png")).expect("png");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG file");

    // `score` on 1 and 3 ranks: the same bytes, the same predictions as `evaluate`, and the
    // driver logs beside the CSV.
    let csv1 = t.path().join("s1").join("scores.csv");
    let csv3 = t.path().join("s3").join("scores.csv");
    std::fs::create_dir_all(csv1.parent().unwrap()).unwrap();
    std::fs::create_dir_all(csv3.parent().unwrap()).unwrap();
    infer("score", &model, &images, &csv1, 1);
    infer("score", &model, &images, &csv3, 3);
    let (a, b) = (read(&csv1), read(&csv3));
    assert!(
        a == b,
        "score differs between 1 and 3 ranks:\n{a}\n---\n{b}"
    );
    // Each score job has a log folder of its own in tchrun-logs beside the CSV.
    let jobs: Vec<_> = std::fs::read_dir(t.path().join("s3/tchrun-logs"))
        .expect("tchrun-logs beside the CSV")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        jobs.len() == 1
            && jobs[0]
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("score-"))
            && jobs[0].join("70_driver_log_2").is_file(),
        "{jobs:?}"
    );
    let predicted = |text: &str, col: usize| -> Vec<String> {
        text.lines()
            .skip(1)
            .map(|l| l.split(',').nth(col).unwrap_or_default().to_string())
            .collect()
    };
    assert_eq!(
        predicted(&a, 1),
        predicted(&scores, 2),
        "score and evaluate agree"
    );
}

#[test]
fn evaluate_refuses_a_class_the_model_does_not_know_before_any_rank_starts() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    // An untrained model has no classes: refused as such.
    let images = subset(&small_digits().join("valid"), &t.path().join("eval"), 2, 0);
    let out = t.path().join("out");
    let r = run(
        tchrun()
            .arg("evaluate")
            .arg("--model")
            .arg(&model)
            .arg("--images")
            .arg(&images)
            .arg("--output")
            .arg(&out),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("--model"), "{}", r.explain());
    // A model with the ten digit classes (its weights a resnet18 header over zeros: the
    // pre-flight refuses the images before a rank would read them), and images with a folder
    // "seven" instead of "7" and a folder "cat".
    let trained = t.path().join("trained");
    std::fs::create_dir_all(&trained).unwrap();
    sparse_weights(
        &trained.join("model.safetensors"),
        tchrun::model::Arch::Resnet18,
        10,
    );
    let mut cfg: serde_json::Value =
        serde_json::from_str(&read(&model.join("model.json"))).expect("model.json");
    cfg["class_names"] = serde_json::json!(["0", "1", "2", "3", "4", "5", "6", "7", "8", "9"]);
    std::fs::write(trained.join("model.json"), cfg.to_string()).unwrap();
    std::fs::rename(images.join("7"), images.join("seven")).unwrap();
    std::fs::create_dir_all(images.join("cat")).unwrap();
    std::fs::copy(
        images
            .join("seven")
            .read_dir()
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path(),
        images.join("cat/x.png"),
    )
    .unwrap();
    let r = run(
        tchrun()
            .arg("evaluate")
            .arg("--model")
            .arg(&trained)
            .arg("--images")
            .arg(&images)
            .arg("--output")
            .arg(&out)
            .args(["--launcher", "local"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("InvalidDatasetError")
            && r.stderr
                .contains("class folder(s) [cat, seven] are not classes of the model"),
        "{}",
        r.explain()
    );
    assert!(!out.exists(), "nothing written: {}", r.explain());
}

/// Model b: `a`'s model.json (its classes and preprocessing) over an untrained torchvision
/// resnet18's weights (seeded), as torchvision initialises it.
fn untrained_like(a: &Path, dst: &Path) -> PathBuf {
    std::fs::create_dir_all(dst).expect("mkdir");
    std::fs::copy(a.join("model.json"), dst.join("model.json")).expect("model.json");
    let code = format!(
        "import torch, torchvision\n\
         from safetensors.torch import save_file\n\
         torch.manual_seed(0)\n\
         save_file(torchvision.models.resnet18(num_classes=10).state_dict(), '{}')\n",
        dst.join("model.safetensors").display()
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    dst.to_path_buf()
}

#[test]
fn two_models_side_by_side_equal_scikit_learn_and_statsmodels() {
    let t = tempdir();
    let a = trained();
    let b = untrained_like(&a, &t.path().join("b"));
    let images = subset(&small_digits().join("valid"), &t.path().join("eval"), 10, 0);
    let alone = t.path().join("alone");
    infer("evaluate", &a, &images, &alone, 1);
    // On 2 ranks (each model's rows gathered under keys of its own).
    let two = t.path().join("two");
    let r = infer_with("evaluate", &[&a, &b], &images, &two, 2);
    for line in [
        "evaluated 100 image(s) with 2 models on 2 ranks:",
        &format!("a: {}", a.display()),
        &format!("b: {}", b.display()),
        "a          b      b - a",
        "top-1 ",
        "McNemar's exact test: both right ",
        "image(s) where the predictions differ in disagreements.csv",
    ] {
        assert!(r.stdout.contains(line), "no '{line}' in\n{}", r.explain());
    }
    // Model a's outputs in a/ are what evaluating it alone writes.
    for f in OUTPUTS {
        let (x, y) = (
            std::fs::read(alone.join(f)).expect(f),
            std::fs::read(two.join("a").join(f)).expect(f),
        );
        assert!(x == y, "a/{f} differs from a one-model evaluate's");
    }
    let classes: Vec<String> = (0..10).map(|c| c.to_string()).collect();
    for (script, dir) in [
        ("evaluate_check.py", two.join("a")),
        ("evaluate_check.py", two.join("b")),
        ("compare_check.py", two.clone()),
    ] {
        let py = run(
            python()
                .arg(repo().join("tests/python").join(script))
                .arg(&dir)
                .args(&classes),
            LIMIT,
        );
        assert_eq!(py.code, Some(0), "{}", py.explain());
        assert!(py.stdout.contains("equal"), "{}", py.explain());
        eprintln!("{}", py.stdout);
    }
    let c: serde_json::Value =
        serde_json::from_str(&read(&two.join("comparison.json"))).expect("comparison.json");
    assert!(
        c["disagreements"].as_u64() > Some(0),
        "the trained and the untrained model disagree somewhere: {c}"
    );
    assert!(
        r.stdout.contains(c["verdict"].as_str().unwrap()),
        "{}",
        r.explain()
    );
}

#[test]
fn evaluate_refuses_three_models_and_two_with_different_classes() {
    let t = tempdir();
    let images = subset(&small_digits().join("valid"), &t.path().join("eval"), 1, 0);
    let out = t.path().join("out");
    let untrained = model_dir(t.path(), "resnet18", 32);
    // Two model directories with the digits' classes (a resnet18 header over zeros: refused
    // before any rank would read the weights), the second's last class named "nine".
    let model = |name: &str, last: &str| -> PathBuf {
        let dir = t.path().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        sparse_weights(
            &dir.join("model.safetensors"),
            tchrun::model::Arch::Resnet18,
            10,
        );
        let mut cfg: serde_json::Value =
            serde_json::from_str(&read(&untrained.join("model.json"))).expect("model.json");
        let mut classes: Vec<String> = (0..9).map(|c| c.to_string()).collect();
        classes.push(last.to_string());
        cfg["class_names"] = serde_json::json!(classes);
        std::fs::write(dir.join("model.json"), cfg.to_string()).unwrap();
        dir
    };
    let (a, b) = (model("a", "9"), model("b", "nine"));
    let refused = |cmd: &str, models: &[&Path], output: &Path| -> Run {
        let mut c = tchrun();
        c.arg(cmd);
        for m in models {
            c.arg("--model").arg(m);
        }
        c.arg("--images")
            .arg(&images)
            .arg("--output")
            .arg(output)
            .args(["--launcher", "local"]);
        let r = run(&mut c, LIMIT);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(!out.exists(), "nothing written: {}", r.explain());
        r
    };
    let r = refused("evaluate", &[&a, &a, &a], &out);
    assert!(
        r.stderr
            .contains("--model given 3 times; evaluate takes one model directory, or two"),
        "{}",
        r.explain()
    );
    let r = refused("score", &[&a, &a], &out.join("scores.csv"));
    assert!(
        r.stderr.contains("--model given 2 times; score takes one"),
        "{}",
        r.explain()
    );
    let r = refused("evaluate", &[&a, &b], &out);
    assert!(
        r.stderr.contains(&format!(
            "--model {} and --model {} have different class lists",
            a.display(),
            b.display()
        )) && r
            .stderr
            .contains("only in the first: [9], only in the second: [nine]"),
        "{}",
        r.explain()
    );
}
