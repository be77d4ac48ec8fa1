//! The dataset index (issue 16, items 1 and 2): the file list is made once per dataset, a
//! second job on unchanged data lists no folder and reads no image header before training (the
//! system calls counted with `strace`), a changed folder is noticed, and a set too large to
//! verify up front gets every check when each image is first decoded.
mod common;

use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

const LIMIT: Duration = Duration::from_secs(300);

/// A small digits copy (20 train, 5 valid images a class) whose folders' mtimes are a minute
/// old, so that no folder is "racy" (re-listed because it changed right before indexing).
fn data(parent: &Path) -> PathBuf {
    let src = digits();
    let dst = parent.join("digits");
    subset(&src.join("train"), &dst.join("train"), 20, 0);
    subset(&src.join("valid"), &dst.join("valid"), 5, 0);
    age(&dst);
    dst
}

/// Sets the mtime of `dir` and of every folder in it a minute back.
fn age(dir: &Path) {
    let old = SystemTime::now() - Duration::from_secs(60);
    for split in ["train", "valid"] {
        let root = dir.join(split);
        let mut dirs = vec![root.clone()];
        for e in std::fs::read_dir(&root).expect("list").flatten() {
            if e.path().is_dir() {
                dirs.push(e.path());
            }
        }
        for d in dirs {
            std::fs::File::open(&d)
                .and_then(|f| f.set_modified(old))
                .expect("set the folder's mtime");
        }
    }
}

fn train(data: &Path, model: &Path, out: &Path, cache: &Path) -> std::process::Command {
    let mut c = tchrun_train(model, &data.join("train"), &data.join("valid"), out);
    c.args([
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--launcher",
        "local",
        "--procs-per-node",
        "2",
    ])
    .env("TCHRUN_DATA_CACHE", cache);
    c
}

/// What one process of a traced job did under the data folder.
#[derive(Default, Debug)]
struct Calls {
    /// `getdents64` on the data folder or a class folder: a listing.
    listings: usize,
    /// `openat` of an image file.
    image_opens: usize,
}

/// `strace -f -y` output to the calls of each program (`tchrun`, `tchrun-worker`), following
/// forks and threads to the program that made them.
fn calls_by_program(trace: &str, data: &Path) -> HashMap<String, Calls> {
    let data = data.display().to_string();
    let mut program: HashMap<u32, String> = HashMap::new();
    let mut exec_pending: HashMap<u32, String> = HashMap::new();
    let mut clone_pending: HashMap<u32, ()> = HashMap::new();
    let mut out: HashMap<String, Calls> = HashMap::new();
    let mut unnamed: HashMap<u32, Calls> = HashMap::new();
    for line in trace.lines() {
        let Some((pid, rest)) = line.split_once(' ') else {
            continue;
        };
        let Ok(pid) = pid.trim().parse::<u32>() else {
            continue;
        };
        let rest = rest.trim_start();
        // `...) = 0`, or `<... execve resumed>)     = 0` (strace pads resumed lines).
        let result = rest
            .rsplit_once(" = ")
            .and_then(|(_, r)| r.split_whitespace().next())
            .and_then(|r| r.parse::<i64>().ok());
        // Processes and threads inherit their creator's program.
        let is_clone = ["clone(", "clone3(", "fork(", "vfork("]
            .iter()
            .any(|c| rest.starts_with(c))
            || rest.starts_with("<... clone")
            || rest.starts_with("<... fork")
            || rest.starts_with("<... vfork");
        if is_clone {
            if rest.contains("<unfinished") {
                clone_pending.insert(pid, ());
            } else if let Some(child) = result.filter(|&r| r > 0) {
                clone_pending.remove(&pid);
                // A vfork child may exec (and be named) before its parent's clone returns.
                if let Some(p) = program.get(&pid).cloned() {
                    let child = child as u32;
                    program.entry(child).or_insert_with(|| p.clone());
                    // A new thread may run (and open files) before its creator's clone
                    // returns: what it did so far belongs to its creator's program too.
                    if let Some(early) = unnamed.remove(&child) {
                        let name = program.get(&child).cloned().unwrap_or(p);
                        let c = out.entry(name).or_default();
                        c.listings += early.listings;
                        c.image_opens += early.image_opens;
                    }
                }
            }
            continue;
        }
        if let Some(args) = rest.strip_prefix("execve(\"") {
            let path = args.split('"').next().unwrap_or_default();
            let name = Path::new(path)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if result == Some(0) {
                program.insert(pid, name);
            } else if rest.contains("<unfinished") {
                exec_pending.insert(pid, name);
            }
            continue;
        }
        if rest.starts_with("<... execve resumed") {
            if let (Some(name), Some(0)) = (exec_pending.remove(&pid), result) {
                program.insert(pid, name);
            }
            continue;
        }
        let c = match program.get(&pid) {
            Some(who) => out.entry(who.clone()).or_default(),
            // Not named yet (its creator's clone has not returned): kept aside until it is.
            None => unnamed.entry(pid).or_default(),
        };
        if rest.starts_with("getdents64(") && rest.contains(&format!("<{data}/")) {
            c.listings += 1;
        }
        if rest.starts_with("openat(") && rest.contains(&format!("\"{data}/")) {
            let name = rest.split('"').nth(1).unwrap_or_default();
            if name.ends_with(".png") || name.ends_with(".jpg") {
                c.image_opens += 1;
            }
        }
    }
    // Whatever was never named.
    for (_, early) in unnamed {
        let c = out.entry("?".into()).or_default();
        c.listings += early.listings;
        c.image_opens += early.image_opens;
    }
    out
}

fn traced(cmd: &mut std::process::Command, trace: &Path) -> Run {
    let mut s = std::process::Command::new("strace");
    s.args([
        "-f",
        "-y",
        "-qq",
        "-e",
        "trace=getdents64,openat,execve,clone,clone3,fork,vfork",
    ])
    .arg("-o")
    .arg(trace)
    .arg(cmd.get_program())
    .args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => s.env(k, v),
            None => s.env_remove(k),
        };
    }
    run(&mut s, LIMIT)
}

/// Job 1 builds the index: its launcher lists every class folder and reads every header (the
/// counter sees it). Job 2 on the same data: the launcher lists no folder and opens no image,
/// and no rank lists a folder (the ranks read the index); the ranks open images only to train.
#[test]
fn a_second_job_lists_no_folder_and_reads_no_header_before_training() {
    let t = tempdir();
    let d = data(t.path());
    let model = model_dir(t.path(), "resnet18", 32);
    let cache = t.path().join("cache");

    let trace1 = t.path().join("trace1");
    let r = traced(
        &mut train(&d, &model, &t.path().join("o1"), &cache),
        &trace1,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(r.stdout.contains("dataset index built"), "{}", r.explain());
    assert!(r.stdout.contains("250 verified now"), "{}", r.explain());
    let first = calls_by_program(&read(&trace1), &d);
    let launcher = first.get("tchrun").expect("the launcher was traced");
    // 2 roots + 20 class folders, each listed at least once; every header read.
    assert!(launcher.listings >= 22, "{first:?}");
    assert!(launcher.image_opens >= 250, "{first:?}");

    let trace2 = t.path().join("trace2");
    let out2 = t.path().join("o2");
    let r = traced(&mut train(&d, &model, &out2, &cache), &trace2);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(r.stdout.contains("reused (200 images"), "{}", r.explain());
    assert!(
        r.stdout.contains("0 verified now, 250 already verified"),
        "{}",
        r.explain()
    );
    let second = calls_by_program(&read(&trace2), &d);
    let launcher = second.get("tchrun").expect("the launcher was traced");
    assert_eq!(launcher.listings, 0, "{second:?}");
    assert_eq!(launcher.image_opens, 0, "{second:?}");
    let ranks = second.get("tchrun-worker").expect("the ranks were traced");
    assert_eq!(ranks.listings, 0, "{second:?}");
    // The ranks did train: each image of the epoch and of validation opened once.
    assert!(ranks.image_opens >= 250, "{second:?}");
    for l in driver_logs(&out2.join("logs"), 2) {
        assert!(l.contains("--train: dataset index "), "{l}");
        assert!(l.contains("not listed here"), "{l}");
    }

    // A file added: the next job notices and lists again; the new file is trained on.
    let some = d.join("train/3").read_dir().expect("list").flatten().next();
    let some = some.expect("a file").path();
    std::fs::copy(some, d.join("train/3/zz_added.png")).expect("copy");
    let r = run(&mut train(&d, &model, &t.path().join("o3"), &cache), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("dataset index rebuilt") && r.stdout.contains("class folder '3'"),
        "{}",
        r.explain()
    );
    assert!(r.stdout.contains("201 images"), "{}", r.explain());
}

/// A set with more never-verified headers than `TCHRUN_VERIFY_UPFRONT_MAX` starts without
/// reading them; a corrupt image is then found when it is decoded: the job fails naming it
/// (nothing but checkpoints in --output), or, under --skip-bad-images, trains on without it.
#[test]
fn above_the_limit_headers_are_checked_on_decode() {
    let t = tempdir();
    let d = data(t.path());
    // A file that is no image, named like one, in a class folder.
    std::fs::write(d.join("train/5/junk.png"), b"not an image at all").expect("write");
    let model = model_dir(t.path(), "resnet18", 32);
    let cache = t.path().join("cache");

    let out = t.path().join("strict");
    let r = run(
        train(&d, &model, &out, &cache).env("TCHRUN_VERIFY_UPFRONT_MAX", "100"),
        LIMIT,
    );
    assert!(r.stdout.contains("251 not verified yet"), "{}", r.explain());
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let all = format!("{}{}", r.stdout, r.stderr);
    assert!(all.contains("junk.png"), "{}", r.explain());
    assert!(!out.join("model.json").exists());

    let out = t.path().join("skip");
    let r = run(
        train(&d, &model, &out, &cache)
            .env("TCHRUN_VERIFY_UPFRONT_MAX", "100")
            .arg("--skip-bad-images"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(out.join("model.json").is_file());
    let logs = driver_logs(&out.join("logs"), 2).join("\n");
    assert!(
        logs.contains(tchrun::files::SKIPPED_IMAGE) && logs.contains("junk.png"),
        "{logs}"
    );

    // The same file with the default limit: refused before any rank starts (exit 2).
    let out = t.path().join("upfront");
    let r = run(&mut train(&d, &model, &out, &cache), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("junk.png"), "{}", r.explain());
    assert!(!out.join("logs").exists(), "{}", r.explain());
}

/// A packed directory has its own index: `tchrun data index` refuses it (exit 2) and says why,
/// and indexing the folder it came from works.
#[test]
fn data_index_refuses_a_pack_and_indexes_a_folder() {
    let t = tempdir();
    let d = data(t.path());
    let cache = t.path().join("cache");
    let packed = t.path().join("packed");
    let r = run(
        tchrun()
            .args(["data", "pack"])
            .arg(d.join("valid"))
            .arg("--output")
            .arg(&packed),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = run(
        tchrun()
            .args(["data", "index"])
            .arg(&packed)
            .env("TCHRUN_DATA_CACHE", &cache),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("a packed directory"), "{}", r.explain());
    let r = run(
        tchrun()
            .args(["data", "index"])
            .arg(d.join("train"))
            .arg(d.join("valid"))
            .env("TCHRUN_DATA_CACHE", &cache),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("200 image headers verified")
            && r.stdout.contains("50 image headers verified"),
        "{}",
        r.explain()
    );
}
