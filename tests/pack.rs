//! `tchrun data pack` (issue 16, item 3): tar shards in the WebDataset layout that Python's
//! `webdataset` reads byte for byte, a packed directory as `--train`/`--valid` giving
//! bit-identical weights to its folder, and a damaged pack named (shard and member) instead of
//! trusted.
//!
//! Inputs are made by `tests/python/pack_check.py`, which also reads the shards with
//! `webdataset`.
mod common;

use common::*;
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};
use std::time::Duration;

const QUICK: Duration = Duration::from_secs(60);
/// Training 1 epoch on 36 images at 32 px with 2 ranks takes well under a minute.
const LIMIT: Duration = Duration::from_secs(240);

fn py(args: &[&std::ffi::OsStr]) {
    let r = run(
        python()
            .arg(repo().join("tests/python/pack_check.py"))
            .args(args),
        QUICK,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

/// The tiny image folder of pack_check.py under `dir/name`.
fn folder(dir: &Path, name: &str) -> PathBuf {
    let src = dir.join(name);
    py(&["make".as_ref(), src.as_os_str()]);
    src
}

fn pack(src: &Path, out: &Path, extra: &[&str]) -> Run {
    run(
        tchrun()
            .args(["data", "pack"])
            .arg(src)
            .arg("--output")
            .arg(out)
            .args(extra),
        QUICK,
    )
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Every entry of `dir` whose name starts with `prefix` (temp folders left behind).
fn leftovers(dir: &Path, prefix: &str) -> Vec<String> {
    std::fs::read_dir(dir)
        .expect("dir")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(prefix))
        .collect()
}

/// The pack read by `webdataset`: every sample's image bytes equal the original file's, `cls`
/// equals the label, the keys number the folder's scan order, keys hold no dot although the
/// original names do, the extension is the original lower-cased; small shards give several,
/// and the samples are spread over them in a seeded random order (the first shard holds more
/// than one class; the seed is in the index; the same seed packs the same bytes).
/// The packed directory opens as the same sample list. An existing output is refused.
#[test]
fn webdataset_reads_the_pack_byte_for_byte() {
    let t = tempdir();
    let src = folder(t.path(), "src");
    let out = t.path().join("packed");
    let r = pack(&src, &out, &["--shard-size", "16K"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("36 samples in") && r.stdout.contains("3 classes"),
        "{}",
        r.explain()
    );
    assert!(leftovers(t.path(), ".packed").is_empty());

    let json = t.path().join("wds.json");
    py(&["read".as_ref(), out.as_os_str(), json.as_os_str()]);
    let mut rows: Vec<serde_json::Value> = serde_json::from_str(&read(&json)).expect("json");
    let f = tchrun_data::ImageFolder::scan(&src).expect("scan");
    assert_eq!(rows.len(), f.samples.len());
    let first_shard: std::collections::BTreeSet<String> = rows
        .iter()
        .filter(|r| {
            r["shard"]
                .as_str()
                .is_some_and(|s| s.ends_with("shard-000000.tar"))
        })
        .map(|r| r["cls"].to_string())
        .collect();
    assert!(
        first_shard.len() >= 2,
        "shard 0 mixes the classes: {first_shard:?}"
    );
    let in_order: Vec<String> = rows.iter().map(|r| r["key"].to_string()).collect();
    let mut sorted = in_order.clone();
    sorted.sort();
    assert_ne!(
        in_order, sorted,
        "the shards hold the samples in a shuffled order"
    );
    rows.sort_by_key(|r| r["key"].to_string());
    let index: serde_json::Value =
        serde_json::from_str(&read(&out.join("tchrun-pack.json"))).expect("index");
    assert_eq!(index["shuffle_seed"], 1, "the default seed, recorded");
    let shards: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r["shard"].as_str().unwrap()).collect();
    assert!(shards.len() >= 3, "{shards:?}");
    for (i, (row, s)) in rows.iter().zip(&f.samples).enumerate() {
        let bytes = std::fs::read(&s.path).expect("image");
        let ext = s.path.extension().unwrap().to_string_lossy().to_lowercase();
        assert_eq!(row["key"], format!("{i:08}"), "{row}");
        assert_eq!(row["ext"], ext.as_str(), "{row}");
        assert_eq!(row["exts"], serde_json::json!(["cls", ext.as_str()]));
        assert_eq!(row["sha256"], hex(&Sha256::digest(&bytes)), "{row}");
        assert_eq!(row["cls"], s.label, "{row}");
    }

    // The packed directory as a dataset: the folder's samples, read from the shards.
    let p = tchrun_data::ImageFolder::scan(&out).expect("open pack");
    assert_eq!(p.classes, f.classes);
    assert_eq!(p.samples.len(), f.samples.len());
    for (a, b) in p.samples.iter().zip(&f.samples) {
        assert_eq!(a.label, b.label);
        assert_eq!(
            a.path.strip_prefix(&out).unwrap(),
            b.path.strip_prefix(&src).unwrap()
        );
    }

    // The same seed packs the same bytes; another seed another order.
    let again = t.path().join("again");
    assert_eq!(pack(&src, &again, &["--shard-size", "16K"]).code, Some(0));
    let shard = |d: &std::path::Path| std::fs::read(d.join("shard-000000.tar")).expect("shard");
    assert_eq!(shard(&out), shard(&again));
    let other = t.path().join("other");
    assert_eq!(
        pack(&src, &other, &["--shard-size", "16K", "--seed", "7"]).code,
        Some(0)
    );
    assert_ne!(shard(&out), shard(&other));

    // An existing, non-empty output is refused before anything is written.
    let r = pack(&src, &out, &[]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("not empty"), "{}", r.explain());
    let r = pack(&src, &t.path().join("x"), &["--shard-size", "12Q"]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("--shard-size"), "{}", r.explain());
}

/// A corrupt image refuses the pack, naming the file, and leaves nothing; under
/// `--skip-bad-images` it is left out and listed.
#[test]
fn a_bad_image_refuses_the_pack_or_is_left_out() {
    let t = tempdir();
    let src = folder(t.path(), "src");
    let bad = src.join("dog/img_3.v1.jpg");
    let mut b = std::fs::read(&bad).expect("jpg");
    b.truncate(b.len() / 2);
    std::fs::write(&bad, &b).expect("write");
    let out = t.path().join("packed");
    let r = pack(&src, &out, &[]);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("img_3.v1.jpg") && r.stderr.contains("truncated JPEG"),
        "{}",
        r.explain()
    );
    assert!(!out.exists());
    assert!(leftovers(t.path(), ".packed").is_empty());

    let r = pack(&src, &out, &["--skip-bad-images"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("35 samples") && r.stdout.contains("skipped bad image"),
        "{}",
        r.explain()
    );
    let p = tchrun_data::ImageFolder::scan(&out).expect("open pack");
    assert_eq!(p.samples.len(), 35);
    assert!(p
        .samples
        .iter()
        .all(|s| !s.path.ends_with("dog/img_3.v1.jpg")));
}

fn train(model: &Path, train: &Path, valid: &Path, out: &Path) -> Run {
    run(
        tchrun_train(model, train, valid, out).args([
            "--epochs",
            "1",
            "--batch-size",
            "6",
            "--seed",
            "11",
            "--min-crop-scale",
            "0.5",
            "--procs-per-node",
            "2",
            "--launcher",
            "local",
        ]),
        LIMIT,
    )
}

fn weights(out: &Path) -> Vec<u8> {
    std::fs::read(out.join("model.safetensors")).expect("model.safetensors")
}

/// One epoch on 2 ranks from a folder and from its packed copy, same seed: the same samples
/// in the same order on every rank, so the weights are bit-identical. `score` and `evaluate`
/// of the pack write the folder's CSV.
#[test]
fn one_epoch_from_a_pack_equals_one_from_its_folder() {
    let t = tempdir();
    let src = folder(t.path(), "src");
    let packed = t.path().join("packed");
    let r = pack(&src, &packed, &["--shard-size", "20K"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let model = model_dir(t.path(), "resnet18", 32);

    let from_folder = t.path().join("from-folder");
    let r = train(&model, &src, &src, &from_folder);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let from_pack = t.path().join("from-pack");
    let r = train(&model, &packed, &packed, &from_pack);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        weights(&from_folder) == weights(&from_pack),
        "weights differ"
    );

    // score and evaluate take the pack too, and write what they write for the folder.
    for cmd in ["score", "evaluate"] {
        let outs: Vec<String> = [&src, &packed]
            .iter()
            .enumerate()
            .map(|(i, images)| {
                let dir = t.path().join(format!("{cmd}-{i}"));
                std::fs::create_dir_all(&dir).expect("mkdir");
                let (out, csv) = match cmd {
                    "score" => (dir.join("scores.csv"), dir.join("scores.csv")),
                    _ => (dir.join("eval"), dir.join("eval/scores.csv")),
                };
                let r = run(
                    tchrun()
                        .arg(cmd)
                        .arg("--model")
                        .arg(&from_pack)
                        .arg("--images")
                        .arg(images)
                        .arg("--output")
                        .arg(&out),
                    LIMIT,
                );
                assert_eq!(r.code, Some(0), "{}", r.explain());
                read(&csv)
            })
            .collect();
        assert_eq!(outs[0].lines().count(), 37, "{}", outs[0]);
        assert_eq!(outs[0], outs[1], "{cmd}");
    }
}

/// A changed member fails training, naming the shard and the member; a truncated shard is
/// refused at pre-flight (exit 2) naming the shard, before anything is written to --output.
#[test]
fn a_damaged_pack_is_named_not_trusted() {
    let t = tempdir();
    let src = folder(t.path(), "src");
    let packed = t.path().join("packed");
    let r = pack(&src, &packed, &["--shard-size", "20K"]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let model = model_dir(t.path(), "resnet18", 32);
    let index: serde_json::Value =
        serde_json::from_str(&read(&packed.join("tchrun-pack.json"))).expect("index");
    // A JPEG sample (not the first): zero its start-of-image marker inside the shard, size
    // unchanged.
    let samples = index["samples"].as_array().expect("samples");
    let i = (1..samples.len())
        .find(|&i| samples[i][7].as_str().unwrap().ends_with(".jpg"))
        .expect("a .jpg sample");
    let s = &samples[i];
    let (shard, offset) = (s[0].as_u64().unwrap(), s[1].as_u64().unwrap());
    let orig = s[7].as_str().unwrap().to_string();
    assert!(orig.ends_with(".jpg"), "{orig}");
    let shard_path = packed.join(format!("shard-{shard:06}.tar"));
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(&shard_path)
            .expect("shard");
        f.write_all_at(&[0, 0], offset).expect("write");
    }
    let out = t.path().join("out-corrupt");
    let r = train(&model, &packed, &packed, &out);
    assert_ne!(r.code, Some(0), "{}", r.explain());
    let named = format!("shard-{shard:06}.tar: member {i:08}.jpg (orig {orig})");
    assert!(
        r.stdout.contains(&named) || r.stderr.contains(&named),
        "{named} not in:\n{}",
        r.explain()
    );

    // A truncated shard: refused before any rank starts.
    let last = packed.join(format!(
        "shard-{:06}.tar",
        index["shards"].as_array().unwrap().len() - 1
    ));
    let len = std::fs::metadata(&last).expect("shard").len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&last)
        .and_then(|f| f.set_len(len - 700))
        .expect("truncate");
    let out = t.path().join("out-truncated");
    let r = train(&model, &packed, &packed, &out);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&last.display().to_string())
            && r.stderr.contains("tchrun data pack")
            && r.stderr.contains("truncated"),
        "{}",
        r.explain()
    );
    assert!(!out.join("model.json").exists());
    assert!(
        !out.exists() || std::fs::read_dir(&out).expect("out").next().is_none(),
        "{:?}",
        std::fs::read_dir(&out).map(|d| d.flatten().map(|e| e.path()).collect::<Vec<_>>())
    );
}
