//! Disk full and read-only output (small tmpfs mounts; root only): the failing write leaves
//! the previous checkpoint intact and no partial model, with a clear error.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

fn train(model: &Path, out: &Path, logs: &Path, epochs: &str, extra: &[&str]) -> Run {
    let d = small_digits();
    run(
        tchrun_train(model, &d.join("train"), &d.join("valid"), out)
            .arg("--log-dir")
            .arg(logs)
            .args([
                "--epochs",
                epochs,
                "--batch-size",
                "20",
                "--lr",
                "0.05",
                "--min-crop-scale",
                "0.5",
                "--no-hflip",
            ])
            .args(extra),
        LIMIT,
    )
}

fn leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if e.path().is_dir() {
                if n.starts_with(".staging") {
                    found.push(e.path().display().to_string());
                }
                stack.push(e.path());
            } else if n.ends_with(".tmp") {
                found.push(e.path().display().to_string());
            }
        }
    }
    found
}

#[test]
fn disk_full_keeps_the_previous_checkpoint_and_no_partial_model() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    // resnet18 weights are ~45 MB: epoch 1's best + last checkpoint (~135 MB) fit, the next
    // checkpoint (a new 90 MB file before the old one goes) does not.
    let Some(_m) = Mount::new(&out, "size=170m") else {
        return;
    };
    let logs = t.path().join("logs");
    let r = train(&model, &out, &logs, "2", &[]);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert!(
        r.stderr.contains("No space left on device")
            && r.stderr.contains(&format!(
                "no space left on the file system of {}",
                out.display()
            )),
        "{}",
        r.explain()
    );
    assert!(
        !out.join("model.json").exists(),
        "no model directory from a failed run"
    );
    assert!(
        leftovers(&out).is_empty(),
        "partial files left: {:?}",
        leftovers(&out)
    );
    let last: serde_json::Value =
        serde_json::from_str(&read(&out.join("checkpoints/last.json"))).expect("last.json intact");
    assert!(last["epoch"].as_u64().unwrap_or(0) >= 1, "{last}");
    // The surviving checkpoint resumes on a disk with room.
    let moved = t.path().join("moved");
    let cp = Command::new("cp")
        .arg("-a")
        .arg(&out)
        .arg(&moved)
        .status()
        .expect("cp");
    assert!(cp.success());
    let r = train(&model, &moved, &logs, "2", &["--resume"]);
    assert_resumed(&r, &moved);
}

/// Issue 25 item 6: a full output disk at the first checkpoint was reported only when the next
/// one was due, an epoch later, in Debug text (`IoError(Os { code: 28, kind: StorageFull ..`).
/// Now the job ends at the first step after the failed write, in words: the path, the space the
/// checkpoint needs and the space left.
#[test]
fn a_full_output_disk_at_the_first_checkpoint_is_reported_when_it_happens() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    // Less than one copy of resnet18's weights (~45 MB): the first checkpoint cannot fit.
    let Some(_m) = Mount::new(&out, "size=20m") else {
        return;
    };
    let logs = t.path().join("logs");
    let r = train(&model, &out, &logs, "2", &["--print-freq", "1"]);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains(&format!(
            "no space left on the file system of {}",
            out.display()
        )) && text.contains("MB are free"),
        "{}",
        r.explain()
    );
    assert!(
        !text.contains("StorageFull"),
        "no Debug text: {}",
        r.explain()
    );
    let log0 = read(&logs.join("70_driver_log_0"));
    assert!(
        !log0.contains("epoch 2/2 iter 20/20"),
        "the failure ends the job in epoch 2, not when the next checkpoint is due: {log0}"
    );
    assert!(
        leftovers(&out).is_empty(),
        "partial files left: {:?}",
        leftovers(&out)
    );
}

#[test]
fn read_only_output_is_refused_before_any_rank_starts() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("ro");
    let Some(_m) = Mount::new(&out, "ro,size=1m") else {
        return;
    };
    let r = train(&model, &out, &t.path().join("logs"), "1", &[]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("not writable") && r.stderr.contains("--output"),
        "{}",
        r.explain()
    );
    assert!(!t.path().join("logs").exists(), "no rank started");
}

/// Fills the file system of `dir` (a tmpfs of the test's) until `leave` bytes are free.
fn fill_leaving(dir: &Path, leave: u64) {
    let s = nix::sys::statvfs::statvfs(dir).expect("statvfs");
    let free = s.blocks_available() as u64 * s.fragment_size() as u64;
    assert!(free > leave, "{free} bytes free, want {leave}");
    let status = Command::new("fallocate")
        .args(["-l", &(free - leave).to_string()])
        .arg(dir.join("filler"))
        .status()
        .expect("fallocate");
    assert!(status.success());
}

/// Issue 52 item 6: a file system that the logs and the output fill together. Before: the rank
/// could not write its driver log, tchrun said "cause: error: exited with code 4" (host ?) and
/// left no `failure.json`. Now the attempt holds a reserve in the log directory, given up for
/// the summary: `failure.json` is written, with the rank's own words as the cause (from its
/// log, or from the console where its log holds none: `report::tests::
/// a_ranks_console_error_is_the_cause_when_its_log_has_none`). A file system too full for the
/// reserve is refused before any rank starts.
#[test]
fn a_disk_full_of_logs_and_output_still_gets_its_failure_summary() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let disk = t.path().join("disk");
    let Some(_m) = Mount::new(&disk, "size=4m") else {
        return;
    };
    let (out, logs) = (disk.join("out"), disk.join("logs"));
    // The reserve (128 KiB) fits after what the launcher writes first (the dataset indexes'
    // copies, ~25 KiB, and its records); the logs and the output fill the rest.
    fill_leaving(&disk, (128 << 10) + (64 << 10));
    let r = train(&model, &out, &logs, "1", &[]);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert!(
        r.stderr.contains("cause: I/O error")
            && r.stderr.contains("No space left on device")
            && !r.stderr.contains("exited with code 4"),
        "{}",
        r.explain()
    );
    let summary: serde_json::Value =
        serde_json::from_str(&read(&logs.join("failure.json"))).expect("failure.json");
    assert_eq!(summary["classification"], "I/O error", "{summary}");
    assert!(
        summary["message"]
            .as_str()
            .is_some_and(|m| m.contains("No space left on device")),
        "{summary}"
    );
    assert!(
        !logs.join(".failure-reserve").exists(),
        "the reserve is given back"
    );
    assert!(!out.join("model.json").exists());

    // Too full to hold the reserve: refused before any rank starts, naming the directory.
    std::fs::remove_dir_all(&logs).expect("rm logs");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::remove_file(disk.join("filler")).expect("rm filler");
    fill_leaving(&disk, 64 << 10);
    let r = train(&model, &out, &logs, "1", &[]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&format!(
            "--log-dir {}: cannot keep 128 KiB",
            logs.display()
        )) && r.stderr.contains("KiB are free on its file system"),
        "{}",
        r.explain()
    );
    assert!(!logs.join("70_driver_log_0").exists(), "{}", r.explain());
}
