//! Issue 25: strict loading (weights that are not `model.json`'s, a truncated or unfinished
//! model), counts out of range, the one CSV writer, jobs that cannot learn, and a full log
//! disk. Real processes; refusals before any rank starts where the pre-flight can know.
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;
use tchrun::model::Arch;

const LIMIT: Duration = Duration::from_secs(240);

/// The issue's flags of a cheap job (one epoch, local ranks).
const FLAGS: [&str; 8] = [
    "--min-crop-scale",
    "0.5",
    "--no-hflip",
    "--batch-size",
    "8",
    "--lr=0.05",
    "--launcher=local",
    "--epochs=1",
];

/// A "trained" resnet18 model directory for the 10 digits whose weights are `arch`'s.
fn trained_dir(parent: &Path, name: &str, weights_arch: Arch) -> PathBuf {
    let init = model_dir(parent, "resnet18", 32);
    let dir = parent.join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&read(&init.join("model.json"))).expect("model.json");
    cfg["class_names"] = serde_json::json!((0..10).map(|c| c.to_string()).collect::<Vec<_>>());
    std::fs::write(dir.join("model.json"), cfg.to_string()).expect("model.json");
    sparse_weights(&dir.join("model.safetensors"), weights_arch, 10);
    dir
}

fn infer(cmd: &str, model: &Path, images: &Path, out: &Path) -> Command {
    let mut c = tchrun();
    c.arg(cmd)
        .arg("--model")
        .arg(model)
        .arg("--images")
        .arg(images)
        .arg("--output")
        .arg(out)
        .args(["--launcher", "local"]);
    c
}

/// The worker's own `score` (no launcher): the rank checks the model too.
fn worker_score(model: &Path, images: &Path, out: &Path, logs: &Path) -> Run {
    run(
        worker()
            .arg("score")
            .arg("--model")
            .arg(model)
            .arg("--images")
            .arg(images)
            .arg("--output")
            .arg(out)
            .arg("--log-dir")
            .arg(logs),
        LIMIT,
    )
}

/// No rank started: no driver log in `logs`.
fn no_rank_started(logs: &Path) -> bool {
    !logs.join("70_driver_log_0").exists()
}

#[test]
fn weights_of_another_architecture_are_refused_at_score_evaluate_and_train() {
    let t = tempdir();
    let d = small_digits();
    let m = trained_dir(t.path(), "r18-with-r34-weights", Arch::Resnet34);
    let logs = t.path().join("logs");
    let check = |r: &Run| {
        assert_eq!(r.code, Some(2), "{}", r.explain());
        let text = format!("{}{}", r.stdout, r.stderr);
        assert!(
            text.contains("model.safetensors")
                && text.contains("weights do not match model.json")
                && text.contains("the file is a resnet34 state_dict, model.json says resnet18"),
            "{}",
            r.explain()
        );
    };
    for cmd in ["score", "evaluate"] {
        let out = t.path().join(format!("{cmd}-out"));
        let r = run(
            infer(cmd, &m, &d.join("valid"), &out.join("s.csv"))
                .arg("--log-dir")
                .arg(&logs),
            LIMIT,
        );
        check(&r);
        assert!(no_rank_started(&logs), "refused before any rank starts");
    }
    // Fine-tuning from it is refused the same way.
    let r = run(
        tchrun_train(&m, &d.join("train"), &d.join("valid"), &t.path().join("o"))
            .args(FLAGS)
            .arg("--log-dir")
            .arg(&logs),
        LIMIT,
    );
    check(&r);
    assert!(no_rank_started(&logs));
    // The rank refuses it too (a rank started without the launcher).
    let r = worker_score(&m, &d.join("valid"), &t.path().join("w.csv"), &logs);
    check(&r);
    // A classifier of another class count under the same architecture.
    let m = t.path().join("r18-5-classes");
    std::fs::create_dir_all(&m).expect("mkdir");
    std::fs::copy(
        t.path().join("r18-with-r34-weights/model.json"),
        m.join("model.json"),
    )
    .expect("copy");
    sparse_weights(&m.join("model.safetensors"), Arch::Resnet18, 5);
    let r = run(
        &mut infer("score", &m, &d.join("valid"), &t.path().join("c.csv")),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("its classifier has 5 output(s) but model.json names 10 class(es)"),
        "{}",
        r.explain()
    );
}

#[test]
fn a_truncated_or_unfinished_model_is_named_once() {
    let t = tempdir();
    let d = small_digits();
    let m = trained_dir(t.path(), "truncated", Arch::Resnet18);
    let w = m.join("model.safetensors");
    let len = std::fs::metadata(&w).expect("stat").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&w)
        .expect("open")
        .set_len(len / 2)
        .expect("truncate");
    let r = run(
        &mut infer("score", &m, &d.join("valid"), &t.path().join("s.csv")),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert_eq!(
        text.matches("truncated or not a safetensors file").count(),
        1,
        "{}",
        r.explain()
    );
    assert!(
        text.contains(&w.display().to_string()) && text.contains("copy it again"),
        "{}",
        r.explain()
    );
    assert!(
        !text.contains("MetadataIncompleteBuffer"),
        "{}",
        r.explain()
    );
    // A training output that is still running or was interrupted: a checkpoint, no model.
    let out = t.path().join("interrupted");
    std::fs::create_dir_all(out.join("checkpoints")).expect("mkdir");
    std::fs::write(
        out.join("checkpoints/last.json"),
        r#"{"epoch": 1, "finished": false}"#,
    )
    .expect("last.json");
    for cmd in ["score", "evaluate"] {
        let r = run(
            &mut infer(
                cmd,
                &out,
                &d.join("valid"),
                &t.path().join(format!("{cmd}.out")),
            ),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr
                .contains(&format!("training has not finished in {}", out.display()))
                && r.stderr.contains("--resume")
                && !r.stderr.contains("made by `tchrun model init`"),
            "{}",
            r.explain()
        );
    }
}

#[test]
fn counts_out_of_range_are_refused_naming_the_flags() {
    let t = tempdir();
    let d = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let logs = t.path().join("logs");
    let train = |extra: &[&str]| {
        run(
            tchrun_train(
                &model,
                &d.join("train"),
                &d.join("valid"),
                &t.path().join("o"),
            )
            .args(
                FLAGS
                    .iter()
                    .filter(|f| !f.starts_with("--batch-size") && **f != "8"),
            )
            .arg("--log-dir")
            .arg(&logs)
            .args(extra),
            LIMIT,
        )
    };
    // nodes × procs-per-node: 2^32 × 2^32 would wrap a u32 to 0.
    let r = train(&[
        "--nodes",
        "65536",
        "--procs-per-node",
        "65536",
        "--batch-size=8",
    ]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--nodes 65536 × --procs-per-node 65536 = 4294967296 ranks"),
        "{}",
        r.explain()
    );
    // A batch no host can allocate (the allocation failure would abort the rank).
    let r = train(&["--batch-size", "4000000000"]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--batch-size 4000000000 at input size 32"),
        "{}",
        r.explain()
    );
    assert!(no_rank_started(&logs));
}

#[test]
fn jobs_that_cannot_learn_are_refused_before_any_rank_starts() {
    let t = tempdir();
    let src = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let logs = t.path().join("logs");
    // One class: train/0 and valid/0 only.
    let one = t.path().join("one");
    for split in ["train", "valid"] {
        let to = one.join(split).join("0");
        std::fs::create_dir_all(&to).expect("mkdir");
        for e in std::fs::read_dir(src.join(split).join("0"))
            .expect("ls")
            .flatten()
            .take(8)
        {
            std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
        }
    }
    let train = |data: &Path, extra: &[&str]| {
        run(
            tchrun_train(
                &model,
                &data.join("train"),
                &data.join("valid"),
                &t.path().join("o"),
            )
            .args(FLAGS)
            .arg("--log-dir")
            .arg(&logs)
            .args(extra),
            LIMIT,
        )
    };
    let r = train(&one, &[]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("a single class (0)") && r.stderr.contains("learns nothing"),
        "{}",
        r.explain()
    );
    // The rank refuses it too (started by hand, srun or sbatch).
    let r = run(
        worker()
            .arg("train")
            .arg("--model")
            .arg(&model)
            .arg("--train")
            .arg(one.join("train"))
            .arg("--valid")
            .arg(one.join("valid"))
            .arg("--output")
            .arg(t.path().join("wo"))
            .arg("--log-dir")
            .arg(t.path().join("wlogs"))
            .args(["--epochs", "1", "--batch-size", "8"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("a single class (0)"), "{}", r.explain());
    // Two images for three ranks; 20 images for a global batch of 32.
    let tiny = t.path().join("tiny");
    subset(&src.join("train"), &tiny.join("train"), 2, 0);
    subset(&src.join("valid"), &tiny.join("valid"), 1, 0);
    let few = t.path().join("few");
    for (split, n) in [("train", 2), ("valid", 1)] {
        for c in ["0", "1"] {
            let to = few.join(split).join(c);
            std::fs::create_dir_all(&to).expect("mkdir");
            for e in std::fs::read_dir(tiny.join(split).join(c))
                .expect("ls")
                .flatten()
                .take(n)
            {
                std::fs::copy(e.path(), to.join(e.file_name())).expect("copy");
            }
        }
    }
    let r = train(&few, &["--procs-per-node", "5", "--oversubscribe"]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("4 image(s) for 5 ranks"),
        "{}",
        r.explain()
    );
    // Fewer images than one global batch: one partial step per epoch, said (a dry run).
    let r = train(&tiny, &["--global-batch-size", "32", "--dry-run"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stderr.contains("warning: --global-batch-size 32")
            && r.stderr
                .contains("has 20 image(s), fewer than one optimizer step takes"),
        "{}",
        r.explain()
    );
    assert!(no_rank_started(&logs), "refused before any rank starts");
    // Issue 31 item 7: ranks × --threads above this node's cores is said once, before any
    // rank starts, with the fix (here 2 ranks × as many threads as cores).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.to_string();
    let r = train(
        &tiny,
        &[
            "--procs-per-node",
            "2",
            "--oversubscribe",
            "--threads",
            &threads,
            "--dry-run",
        ],
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let warned: Vec<&str> = r
        .stderr
        .lines()
        .filter(|l| l.contains("CPU oversubscribed"))
        .collect();
    let head = format!(
        "tchrun: warning: CPU oversubscribed: 2 rank(s) × {cores} intra-op thread(s) = {} > \
         {cores} cores",
        2 * cores
    );
    let tail = "; the ranks' threads wait for one another's cores: use --threads 1 or fewer \
                --procs-per-node";
    // A busy machine (other tests' ranks) may add its own reason between the two.
    assert!(
        warned.len() == 1
            && (warned[0] == format!("{head}{tail}")
                || (warned[0].starts_with(&format!("{head} and other processes kept "))
                    && warned[0].ends_with(tail))),
        "{}",
        r.explain()
    );
}

#[test]
fn a_full_log_disk_does_not_stop_training() {
    let t = tempdir();
    let src = small_digits();
    let d = t.path().join("data");
    subset(&src.join("train"), &d.join("train"), 12, 0);
    subset(&src.join("valid"), &d.join("valid"), 4, 0);
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let logs = t.path().join("logs");
    let Some(_m) = Mount::new(&logs, "size=1m") else {
        return;
    };
    // Once the rank has written its first training line, fill the log disk.
    let log = logs.join("70_driver_log_0");
    let filler = logs.join("filler");
    let fill = std::thread::spawn(move || {
        let started = wait_for(Duration::from_secs(120), || {
            std::fs::read_to_string(&log)
                .map(|s| s.contains("epoch 1/2 iter"))
                .unwrap_or(false)
        });
        let _ = Command::new("dd")
            .args(["if=/dev/zero", "bs=64k"])
            .arg(format!("of={}", filler.display()))
            .stderr(std::process::Stdio::null())
            .status();
        started
    });
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .args(&FLAGS[..6])
            .args(["--launcher=local", "--epochs=2", "--print-freq=1"])
            .arg("--log-dir")
            .arg(&logs),
        LIMIT,
    );
    assert!(
        fill.join().expect("filler"),
        "the rank never logged training"
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        out.join("model.json").is_file() && out.join("model.safetensors").is_file(),
        "{}",
        r.explain()
    );
    let all = format!("{}{}", r.stdout, r.stderr);
    let said: Vec<&str> = all
        .lines()
        .filter(|l| l.contains("could not be written"))
        .collect();
    assert_eq!(said.len(), 1, "one console line: {said:?}\n{}", r.explain());
    assert!(
        said[0].contains("70_driver_log_0") && said[0].contains("No space left on device"),
        "{}",
        r.explain()
    );
}

#[test]
fn every_csv_escapes_user_names_the_same_way() {
    let t = tempdir();
    let src = small_digits();
    // Class folders and file names a spreadsheet or a naive CSV writer would mangle.
    let classes = [
        "a,b",
        "say \"hi\"",
        "line\nbreak",
        "=cmd|' -C calc'!A0",
        "+plus",
        "-minus",
        "@at",
        "é😀 ünï",
    ];
    let files = [
        "x,1.png", "q\"2.png", "n\nl.png", "=3.png", "@4.png", "ü5.png",
    ];
    let data = t.path().join("weird");
    for split in ["train", "valid"] {
        for (i, c) in classes.iter().enumerate() {
            let to = data.join(split).join(c);
            std::fs::create_dir_all(&to).expect("mkdir");
            let mut imgs: Vec<PathBuf> = std::fs::read_dir(src.join(split).join(i.to_string()))
                .expect("ls")
                .flatten()
                .map(|e| e.path())
                .collect();
            imgs.sort();
            for (img, name) in imgs.iter().zip(files) {
                std::fs::copy(img, to.join(name)).expect("copy");
            }
        }
    }
    // A name that is not UTF-8: written lossily, visibly (U+FFFD).
    {
        use std::os::unix::ffi::OsStrExt;
        let c = data.join("valid").join(classes[0]);
        let any = c.join("x,1.png");
        std::fs::copy(
            &any,
            c.join(std::ffi::OsStr::from_bytes(b"bad\xffname.png")),
        )
        .expect("copy");
    }
    let model = model_dir(t.path(), "resnet18", 32);
    let trained = t.path().join("trained");
    let r = run(
        tchrun_train(&model, &data.join("train"), &data.join("valid"), &trained).args(FLAGS),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let scores = t.path().join("scores.csv");
    let r = run(
        &mut infer("score", &trained, &data.join("valid"), &scores),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let eval = t.path().join("eval");
    let r = run(
        &mut infer("evaluate", &trained, &data.join("valid"), &eval),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // Python's csv module reads every CSV back to the cells tchrun meant.
    let r = run(
        python().arg("-c").arg(
            "import csv, json, sys\n\
             print(json.dumps([list(csv.reader(open(p, newline='', encoding='utf-8'))) for p in sys.argv[1:]]))",
        )
        .arg(&scores)
        .arg(eval.join("scores.csv"))
        .arg(eval.join("confusion_matrix.csv")),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let tables: Vec<Vec<Vec<String>>> = serde_json::from_str(&r.stdout).expect("json");
    let safe = |s: &str| {
        if s.starts_with(['=', '+', '-', '@']) {
            format!("'{s}")
        } else {
            s.to_string()
        }
    };
    let want_classes: Vec<String> = {
        let mut c: Vec<String> = classes.iter().map(|c| c.to_string()).collect();
        c.sort();
        c.iter().map(|c| safe(c)).collect()
    };
    // confusion_matrix.csv: the header and first column are the classes, in the model's order.
    let cm = &tables[2];
    assert_eq!(cm[0][1..].to_vec(), want_classes, "{cm:?}");
    let firsts: Vec<String> = cm[1..].iter().map(|r| r[0].clone()).collect();
    assert_eq!(firsts, want_classes);
    // scores.csv (score and evaluate): every file once, named relative to --images, safe.
    let mut want_files: Vec<String> = Vec::new();
    for c in classes {
        for f in files {
            want_files.push(safe(&format!("{c}/{f}")));
        }
    }
    want_files.push(safe(&format!("{}/bad\u{FFFD}name.png", classes[0])));
    want_files.sort();
    for table in &tables[..2] {
        let mut got: Vec<String> = table[1..].iter().map(|r| r[0].clone()).collect();
        got.sort();
        assert_eq!(got, want_files, "{table:?}");
        for row in &table[1..] {
            assert!(
                !row.iter()
                    .any(|cell| cell.starts_with(['=', '+', '-', '@'])),
                "a cell a spreadsheet would run: {row:?}"
            );
        }
    }
    // evaluate's true_class column: the class names, made safe the same way.
    for row in &tables[1][1..] {
        assert!(want_classes.contains(&row[1]), "{row:?}");
    }
    // evaluate on a labeled folder of one class of a many-class model is fine.
    let single = t.path().join("single");
    let to = single.join(classes[1]);
    std::fs::create_dir_all(&to).expect("mkdir");
    for f in files {
        std::fs::copy(data.join("valid").join(classes[1]).join(f), to.join(f)).expect("copy");
    }
    let r = run(
        &mut infer("evaluate", &trained, &single, &t.path().join("eval1")),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}
