//! Azure ML's data components (issue 16, item 4): image formats besides JPEG/PNG decoded as
//! Pillow decodes them, `.zip`/`.tar`/`.tar.gz` archives of an image folder as `--train`,
//! `--valid` and `--images` (extracted once into a cache, reused, never trusted half-written),
//! bad archives refused before anything starts, and `tchrun data split`.
//!
//! Inputs are made by `tests/python/data_archives.py` (Pillow, zipfile, tarfile).
mod common;

use common::*;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A refusal or a dry run takes well under a second; training 1 epoch on 50 images at 32 px
/// takes 10-30 s on a busy 2-core machine.
const QUICK: Duration = Duration::from_secs(60);
const LIMIT: Duration = Duration::from_secs(240);

fn craft(args: &[&std::ffi::OsStr]) {
    let r = run(
        python()
            .arg(repo().join("tests/python/data_archives.py"))
            .args(args),
        QUICK,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

/// `dir` as an archive `out` (kind zip, tar or targz), under the folder `top` if given.
fn archive(kind: &str, dir: &Path, out: &Path, top: Option<&str>) {
    let mut a = vec![
        "archive".as_ref(),
        kind.as_ref(),
        dir.as_os_str(),
        out.as_os_str(),
    ];
    if let Some(t) = top {
        a.push(t.as_ref());
    }
    craft(&a);
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).expect("hex"))
        .collect()
}

/// Every format of "Convert to Image Directory" decodes to exactly Pillow's
/// `.convert("RGB")` pixels: grayscale BMP/TIFF/PGM as three equal channels, alpha dropped,
/// TIFF uncompressed/LZW/deflate, WebP lossless and lossy (image-webp does libwebp's YUV 4:2:0
/// to RGB conversion, fancy upsampling included, to the bit; checked on an odd-sized image at
/// quality 30 too). 16-bit PGM is not compared: Pillow opens it as 32-bit integers and
/// `.convert("RGB")` clips them at 255 instead of scaling, which no decoder should copy (ours
/// scales by 1/257, as for 16-bit PNG).
#[test]
fn formats_decode_like_pillow() {
    let t = tempdir();
    craft(&["formats".as_ref(), t.path().as_os_str()]);
    let refs: serde_json::Value =
        serde_json::from_str(&read(&t.path().join("ref.json"))).expect("ref.json");
    let refs = refs.as_object().expect("object");
    assert_eq!(refs.len(), 14);
    for (name, r) in refs {
        let path = t.path().join("fmt").join(name);
        let (w, h, rgb) = tchrun_data::decode_rgb8(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(
            (w as u64, h as u64),
            (r["w"].as_u64().unwrap(), r["h"].as_u64().unwrap())
        );
        let want = unhex(r["rgb"].as_str().expect("rgb"));
        assert_eq!(rgb.len(), want.len(), "{name}");
        assert!(rgb == want, "{name}: pixels differ from Pillow's");
    }
    // The scan takes every extension, and every header verifies.
    let mut f = tchrun_data::ImageFolder::scan(t.path()).expect("scan");
    assert_eq!(f.classes, vec!["fmt"]);
    assert_eq!(f.samples.len(), 14);
    assert!(f.verify(false, 1_000_000).expect("verify").is_empty());
}

/// Small digits (5 train, 2 valid per class) and an untrained model.
struct Data {
    dir: tempfile::TempDir,
    train: PathBuf,
    valid: PathBuf,
    model: PathBuf,
}

fn data() -> Data {
    let dir = tempdir();
    let d = digits();
    let train = subset(&d.join("train"), &dir.path().join("train"), 5, 0);
    let valid = subset(&d.join("valid"), &dir.path().join("valid"), 2, 0);
    let model = model_dir(dir.path(), "resnet18", 32);
    Data {
        dir,
        train,
        valid,
        model,
    }
}

/// The end-to-end proof: train from a zip (class folders under one top folder, as zipping a
/// folder gives) and a tar.gz (class folders at the top), then score a tar archive.
#[test]
fn train_and_score_from_archives() {
    let d = data();
    let t = d.dir.path();
    let (zip, tgz, tar) = (
        t.join("train.zip"),
        t.join("valid.tar.gz"),
        t.join("valid.tar"),
    );
    archive("zip", &d.train, &zip, Some("digits-train"));
    archive("targz", &d.valid, &tgz, None);
    archive("tar", &d.valid, &tar, None);
    let out = t.join("out");
    // The default data cache (issue 31 item 12): `$XDG_CACHE_HOME/tchrun/archives`, never the
    // output, so copying the model does not copy the dataset.
    let xdg = t.join("xdg");
    let r = run(
        tchrun_train(&d.model, &zip, &tgz, &out)
            .env_remove("TCHRUN_DATA_CACHE")
            .env("XDG_CACHE_HOME", &xdg)
            .args([
                "--epochs",
                "1",
                "--batch-size",
                "8",
                "--min-crop-scale",
                "0.5",
            ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let cache = xdg.join("tchrun/archives");
    assert!(
        !out.join(".tchrun-data").exists() && !out.join("archives").exists(),
        "nothing of the dataset in the output"
    );
    for (archive, files) in [("train.zip", 50), ("valid.tar.gz", 20)] {
        assert!(
            r.stdout
                .contains(&format!("{archive}: extracted {files} files")),
            "{}",
            r.explain()
        );
    }
    // One folder per archive in the cache, complete (its marker), the images under the top folder.
    let entries: Vec<String> = std::fs::read_dir(&cache)
        .expect("cache")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(entries.len(), 2, "{entries:?}");
    let train_dir = entries
        .iter()
        .find(|e| e.starts_with("train-"))
        .expect("train");
    let root = cache.join(train_dir).join("digits-train");
    assert!(
        root.join("7").is_dir()
            && cache
                .join(train_dir)
                .join(".tchrun-extracted.json")
                .is_file()
    );
    assert!(
        r.stdout.contains(&root.display().to_string()),
        "{}",
        r.explain()
    );
    let model: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
    let text = model.to_string();
    assert!(text.contains("\"9\""), "{text}");

    // score --images valid.tar: 20 rows.
    let csv = t.join("scores").join("scores.csv");
    std::fs::create_dir_all(csv.parent().unwrap()).unwrap();
    let r = run(
        tchrun()
            .args(["score", "--model"])
            .arg(&out)
            .arg("--images")
            .arg(&tar)
            .arg("--output")
            .arg(&csv),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("valid.tar: extracted 20 files"),
        "{}",
        r.explain()
    );
    assert_eq!(read(&csv).lines().count(), 21, "{}", read(&csv));
}

/// An extraction is reused while the archive is unchanged, done again when the archive
/// changes, and never trusted without its marker (an interrupted extraction).
#[test]
fn archive_cache_reuse_and_rewrite() {
    let d = data();
    let t = d.dir.path();
    let zip = t.join("train.zip");
    archive("zip", &d.train, &zip, None);
    let cache = t.join("cache");
    let dry = || {
        let r = run(
            tchrun_train(&d.model, &zip, &d.valid, &t.join("out"))
                .env("TCHRUN_DATA_CACHE", &cache)
                .arg("--dry-run"),
            QUICK,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r
    };
    // The extracted folders, in the cache's `archives/` (its `index/` keeps the dataset indexes).
    let dirs = || -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(cache.join("archives"))
            .expect("cache")
            .flatten()
            .map(|e| e.path())
            .filter(|p| !p.ends_with("index"))
            .collect();
        v.sort();
        v
    };
    let r = dry();
    assert!(
        r.stdout.contains("train.zip: extracted 50 files"),
        "{}",
        r.explain()
    );
    let first = dirs();
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(
        r.stdout
            .contains(&format!("--train={}", first[0].display())),
        "{}",
        r.explain()
    );
    let r = dry();
    assert!(
        r.stdout.contains("using the folder extracted earlier"),
        "{}",
        r.explain()
    );
    // Without its marker the folder is not trusted: extracted again.
    std::fs::remove_file(first[0].join(".tchrun-extracted.json")).unwrap();
    let r = dry();
    assert!(
        r.stdout.contains("train.zip: extracted 50 files"),
        "{}",
        r.explain()
    );
    assert_eq!(dirs(), first);
    // A rewritten archive (another size) gets its own folder.
    archive("zip", &d.train, &zip, Some("top"));
    let r = dry();
    assert!(
        r.stdout.contains("train.zip: extracted 50 files"),
        "{}",
        r.explain()
    );
    let now = dirs();
    assert_eq!(now.len(), 2, "{now:?}");
    assert!(r.stdout.contains("/top "), "{}", r.explain());
}

/// Every bad archive is refused before any rank starts: exit 2, the archive and the member
/// named with the fix, and nothing left in the cache (no folder a later job could trust).
#[test]
fn bad_archives_are_refused() {
    let d = data();
    let t = d.dir.path();
    let limit_env = "TCHRUN_DATA_MAX_UNPACKED_BYTES";
    let cases: [(&str, &str, bool, &[&str]); 13] = [
        (
            "zip_dotdot",
            "zip",
            false,
            &["'../evil.png'", "escapes the folder", "rebuild the archive"],
        ),
        (
            "zip_absolute",
            "zip",
            false,
            &["'/tmp/evil.png'", "absolute path"],
        ),
        (
            "zip_symlink",
            "zip",
            false,
            &["'0/link.png'", "symbolic link"],
        ),
        (
            "tar_dotdot",
            "tar",
            false,
            &["'0/../../evil.png'", "escapes the folder"],
        ),
        (
            "tar_absolute",
            "tar",
            false,
            &["'/tmp/evil.png'", "absolute path"],
        ),
        (
            "tar_symlink",
            "tar",
            false,
            &["'0/link.png'", "symbolic link"],
        ),
        ("tar_hardlink", "tar", false, &["'0/hard.png'", "hard link"]),
        (
            "zip_declares_huge",
            "zip",
            false,
            &[
                "'0/zeros.png'",
                "declares 4294967040 bytes unpacked",
                "zip bomb",
            ],
        ),
        (
            "zip_declares_small",
            "zip",
            false,
            &[
                "'0/zeros.png'",
                "holds more than 10 bytes but declares 10",
                "zip bomb",
            ],
        ),
        (
            "zip_big",
            "zip",
            true,
            &["above the limit of 1000000 bytes", limit_env],
        ),
        (
            "targz_big",
            "tar.gz",
            true,
            &["above the limit of 1000000 bytes", limit_env],
        ),
        (
            "zip_flat",
            "zip",
            false,
            &[
                "NotLabeledDatasetError",
                "no class sub-folders",
                "inside the archive",
            ],
        ),
        (
            "not_zip",
            "zip",
            false,
            &["BadArchiveError", "not a readable zip archive"],
        ),
    ];
    for (case, ext, limited, expect) in cases {
        let file = t.join(format!("{case}.{ext}"));
        craft(&[
            "bad".as_ref(),
            case.as_ref(),
            d.train.as_os_str(),
            file.as_os_str(),
        ]);
        let cache = t.join(format!("cache-{case}"));
        let out = t.join(format!("out-{case}"));
        let mut c = tchrun_train(&d.model, &file, &d.valid, &out);
        c.env("TCHRUN_DATA_CACHE", &cache).arg("--dry-run");
        if limited {
            c.env(limit_env, "1000000");
        }
        let r = run(&mut c, QUICK);
        assert_eq!(r.code, Some(2), "{case}: {}", r.explain());
        assert!(
            r.stderr.contains("tchrun: error: --train ")
                && r.stderr.contains(&file.display().to_string()),
            "{case}: {}",
            r.explain()
        );
        for e in expect {
            assert!(r.stderr.contains(e), "{case}: no {e:?} in {}", r.explain());
        }
        let left: Vec<_> = std::fs::read_dir(cache.join("archives"))
            .map(|rd| rd.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "{case}: left behind {left:?}");
        assert!(!out.exists(), "{case}: --output written");
    }
}

fn files_of(dir: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for class in std::fs::read_dir(dir).expect("dir").flatten() {
        for f in std::fs::read_dir(class.path()).expect("class").flatten() {
            out.insert(format!(
                "{}/{}",
                class.file_name().to_string_lossy(),
                f.file_name().to_string_lossy()
            ));
        }
    }
    out
}

fn split(src: &Path, out: &Path, fraction: &str, seed: &str) -> Run {
    let xdg = out.parent().unwrap_or(out).join("xdg");
    run(
        tchrun()
            .env_remove("TCHRUN_DATA_CACHE")
            .env("XDG_CACHE_HOME", xdg)
            .args(["data", "split"])
            .arg(src)
            .args(["--fraction", fraction, "--seed", seed, "--output"])
            .arg(out),
        QUICK,
    )
}

/// A folder of 3 classes: a (40 files), b (5), c (1), plus files a scan ignores.
fn split_source(root: &Path) {
    for (class, n) in [("a", 40), ("b", 5), ("c", 1)] {
        let dir = root.join(class);
        std::fs::create_dir_all(&dir).unwrap();
        for i in 0..n {
            std::fs::write(dir.join(format!("{i:02}.png")), format!("{class}{i}")).unwrap();
        }
    }
    std::fs::write(root.join("a/.hidden.png"), "h").unwrap();
    std::fs::write(root.join("a/notes.txt"), "n").unwrap();
}

/// `tchrun data split`: stratified per class (rounding and the 1-image class as documented),
/// hard links, reproducible from the seed, another seed another split, an existing output and
/// a fraction out of range refused, no temporary folder left.
#[test]
fn data_split_is_stratified_and_reproducible() {
    let t = tempdir();
    let src = t.path().join("src");
    split_source(&src);
    let out = t.path().join("split");
    let r = split(&src, &out, "0.8", "7");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let (train, valid) = (files_of(&out.join("train")), files_of(&out.join("valid")));
    let count = |s: &BTreeSet<String>, c: &str| s.iter().filter(|f| f.starts_with(c)).count();
    // a: round(32) = 32; b: round(4) = 4; c: 1 image -> train only.
    assert_eq!(
        [
            count(&train, "a/"),
            count(&valid, "a/"),
            count(&train, "b/"),
            count(&valid, "b/")
        ],
        [32, 8, 4, 1]
    );
    assert_eq!((count(&train, "c/"), count(&valid, "c/")), (1, 0));
    assert!(!out.join("valid/c").exists());
    assert!(train.is_disjoint(&valid));
    let all: BTreeSet<String> = train.union(&valid).cloned().collect();
    assert_eq!(all.len(), 46);
    assert!(!all
        .iter()
        .any(|f| f.contains("hidden") || f.ends_with(".txt")));
    assert!(
        r.stdout.contains("1 class has 1 image (c)")
            && r.stdout
                .contains("files are hard links to the originals (46 files)"),
        "{}",
        r.explain()
    );
    for f in &train {
        let a = std::fs::metadata(out.join("train").join(f)).unwrap();
        let b = std::fs::metadata(src.join(f)).unwrap();
        assert_eq!(
            (a.dev(), a.ino()),
            (b.dev(), b.ino()),
            "{f} is not a hard link"
        );
    }
    // Same seed, same split; another seed, another split of a.
    let again = t.path().join("again");
    assert_eq!(split(&src, &again, "0.8", "7").code, Some(0));
    assert_eq!(files_of(&again.join("valid")), valid);
    let other = t.path().join("other");
    assert_eq!(split(&src, &other, "0.8", "8").code, Some(0));
    assert_ne!(files_of(&other.join("valid")), valid);
    // An existing non-empty output and a bad fraction are refused, nothing written.
    let r = split(&src, &out, "0.8", "7");
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("not empty"), "{}", r.explain());
    assert_eq!(files_of(&out.join("train")), train);
    let r = split(&src, &t.path().join("bad"), "1", "7");
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("strictly between 0 and 1"),
        "{}",
        r.explain()
    );
    assert!(!t.path().join("bad").exists());
    // An empty output folder is fine; no temporary folder is left next to the outputs.
    let empty = t.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert_eq!(split(&src, &empty, "0.5", "7").code, Some(0));
    assert_eq!(
        files_of(&empty.join("train")).len() + files_of(&empty.join("valid")).len(),
        46
    );
    let names: Vec<String> = std::fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.starts_with('.')), "{names:?}");
}

/// Across file systems (a tmpfs source) the split copies, and says so.
#[test]
fn data_split_copies_across_file_systems() {
    let shm = Path::new("/dev/shm");
    let t = tempdir();
    let same = std::fs::metadata(shm)
        .map(|m| m.dev() == std::fs::metadata(t.path()).unwrap().dev())
        .unwrap_or(true);
    if same {
        skip_or_fail("/dev/shm is not a separate file system here");
        return;
    }
    let src = tempfile::Builder::new()
        .prefix("tchrun-test-")
        .tempdir_in(shm)
        .expect("tmpfs dir");
    split_source(src.path());
    let out = t.path().join("split");
    let r = split(src.path(), &out, "0.5", "3");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("files are copies (46 files)"),
        "{}",
        r.explain()
    );
    let train = files_of(&out.join("train"));
    for f in &train {
        assert_eq!(
            std::fs::read(out.join("train").join(f)).unwrap(),
            std::fs::read(src.path().join(f)).unwrap()
        );
    }
}

/// `data split` also takes an archive: extracted into the data cache, then split
/// like the folder itself (the same seed gives the same split as from the folder).
#[test]
fn data_split_from_an_archive() {
    let t = tempdir();
    let src = t.path().join("src");
    split_source(&src);
    let zip = t.path().join("images.zip");
    archive("zip", &src, &zip, Some("images"));
    let (from_zip, from_dir) = (t.path().join("from-zip"), t.path().join("from-dir"));
    let r = split(&zip, &from_zip, "0.8", "7");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        // 46 images plus the hidden file and the text file, which the scan then ignores.
        r.stdout.contains("images.zip: extracted 48 files"),
        "{}",
        r.explain()
    );
    assert!(t.path().join("xdg/tchrun/archives").is_dir());
    assert_eq!(split(&src, &from_dir, "0.8", "7").code, Some(0));
    for side in ["train", "valid"] {
        assert_eq!(
            files_of(&from_zip.join(side)),
            files_of(&from_dir.join(side))
        );
    }
}
