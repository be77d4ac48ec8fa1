//! Bad data (issue 7, item 5): every kind of bad image file is either refused before any rank
//! starts (exit 2, the file named, no `--output` written) or, under `--skip-bad-images`, skipped
//! and listed in the driver log; never a panic, never a hang (every run is bounded).
//!
//! A truncated JPEG is refused by its missing end-of-image marker. A file that fails only
//! while decoding in training (truncated PNG, a JPEG whose scan is cut by a stray marker) ends
//! the job with exit 4 naming the file, or under `--skip-bad-images` is dropped alone (its batch
//! goes on with the others), named once in the driver log and counted in `metrics.jsonl` and the
//! run report, and the model stays sound (every weight finite) at 1 and 2 ranks, also when a
//! whole step has no image left.
//!
//! Each case builds a small dataset (10 classes, 5 train and 2 valid digits PNGs per class, so
//! one epoch takes seconds) plus one bad file in `train/3/`.
mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Bound of one `tchrun train` run (a 1-epoch run on 70 images takes 10-30 s on a busy
/// 2-core machine; a refusal takes well under a second).
const LIMIT: Duration = Duration::from_secs(240);
/// Train images per class in the small dataset.
const TRAIN_PER_CLASS: usize = 5;
const VALID_PER_CLASS: usize = 2;

/// A small dataset and an untrained model in a temp dir.
struct Case {
    dir: tempfile::TempDir,
    model: PathBuf,
    train: PathBuf,
    valid: PathBuf,
}

impl Case {
    fn new() -> Case {
        let dir = tempdir();
        let d = digits();
        let train = subset(
            &d.join("train"),
            &dir.path().join("train"),
            TRAIN_PER_CLASS,
            0,
        );
        let valid = subset(
            &d.join("valid"),
            &dir.path().join("valid"),
            VALID_PER_CLASS,
            0,
        );
        let model = model_dir(dir.path(), "resnet18", 32);
        Case {
            dir,
            model,
            train,
            valid,
        }
    }

    fn root(&self) -> &Path {
        self.dir.path()
    }

    /// A good PNG of class `c` of the training set (to derive bad files from).
    fn good_png(&self, c: usize) -> PathBuf {
        let mut files: Vec<PathBuf> = std::fs::read_dir(self.train.join(c.to_string()))
            .expect("class dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        files.into_iter().next().expect("a good image")
    }

    fn train_cmd(&self, out: &Path, skip: bool) -> std::process::Command {
        let mut c = tchrun_train(&self.model, &self.train, &self.valid, out);
        c.args([
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--min-crop-scale",
            "0.5",
            "--no-hflip",
        ]);
        if skip {
            c.arg("--skip-bad-images");
        }
        c
    }

    fn train(&self, out: &Path, skip: bool) -> Run {
        let r = run(&mut self.train_cmd(out, skip), LIMIT);
        no_panic(&r, out);
        r
    }

    /// Without `--skip-bad-images`: exit 2, the file named, nothing written to `--output`.
    fn expect_refused(&self, bad: &Path, reasons: &[&str]) -> Run {
        let out = self.root().join("out-strict");
        let r = self.train(&out, false);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        let shown = bad.display().to_string();
        assert!(
            r.stderr.contains(&shown),
            "stderr must name {shown}:\n{}",
            r.explain()
        );
        assert!(
            reasons.iter().any(|w| r.stderr.contains(w)),
            "stderr must say one of {reasons:?}:\n{}",
            r.explain()
        );
        assert!(
            r.stderr.contains("--skip-bad-images") || r.stderr.contains("skip bad images"),
            "the error should point at --skip-bad-images:\n{}",
            r.explain()
        );
        assert!(
            !out.exists(),
            "nothing may be written to --output when the input is refused ({})",
            out.display()
        );
        r
    }

    /// With `--skip-bad-images`: exit 0, a trained model, the file listed as skipped in the
    /// driver log and the others trained on.
    fn expect_skipped(&self, bad: &Path) -> Run {
        let out = self.root().join("out-skip");
        let r = self.train(&out, true);
        assert_eq!(r.code, Some(0), "{}", r.explain());
        assert!(out.join("model.json").is_file(), "{}", r.explain());
        let log = driver_logs(&out.join("logs"), 1).remove(0);
        let line = format!("skipped bad image: {}", bad.display());
        assert!(log.contains(&line), "driver log must list '{line}':\n{log}");
        assert_sound(&out, 1, &r);
        let total = 10 * TRAIN_PER_CLASS;
        assert!(
            r.stdout.contains(&format!("on {total} train / ")),
            "the {total} good train images (and not the bad one) are trained on:\n{}",
            r.explain()
        );
        assert!(
            r.stdout.contains("skipped 1 bad image(s)")
                || r.stderr.contains("skipped 1 bad image(s)"),
            "the count of skipped images is reported:\n{}",
            r.explain()
        );
        r
    }
}

/// No output of the run nor any log it wrote mentions a panic.
fn no_panic(r: &Run, out: &Path) {
    let mut texts = vec![r.stdout.clone(), r.stderr.clone()];
    if let Ok(rd) = std::fs::read_dir(out.join("logs")) {
        for e in rd.flatten() {
            texts.push(std::fs::read_to_string(e.path()).unwrap_or_default());
        }
    }
    for t in texts {
        assert!(!t.contains("panicked"), "a panic:\n{t}\n{}", r.explain());
    }
}

/// A 256x256 RGB JPEG with detail (so the entropy-coded scan is most of the file).
fn detailed_jpeg(path: &Path) -> Vec<u8> {
    let img = image::RgbImage::from_fn(256, 256, |x, y| {
        let v = x
            .wrapping_mul(2654435761)
            .wrapping_add(y.wrapping_mul(40503))
            >> 7;
        image::Rgb([
            (v & 255) as u8,
            ((x * 255) / 256) as u8,
            ((y * 255) / 256) as u8,
        ])
    });
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgb8(img)
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Jpeg,
        )
        .expect("encode jpeg");
    std::fs::write(path, &bytes).expect("write jpeg");
    bytes
}

/// Position of the JPEG start-of-scan marker (FF DA).
fn sos_position(jpeg: &[u8]) -> usize {
    jpeg.windows(2)
        .position(|w| w == [0xFF, 0xDA])
        .expect("a JPEG has a start-of-scan marker")
}

fn is_root() -> bool {
    extern "C" {
        fn geteuid() -> u32;
    }
    unsafe { geteuid() == 0 }
}

// ---------------------------------------------------------------------------------------------
// Cases
// ---------------------------------------------------------------------------------------------

/// A valid JPEG cut in half inside its entropy-coded scan: the header (dimensions) is intact,
/// so the header check passes.
fn truncated_jpeg_case() -> (Case, PathBuf) {
    let c = Case::new();
    let bad = c.train.join("3/truncated.jpg");
    let full = detailed_jpeg(&bad);
    let cut = full.len() / 2;
    assert!(
        cut > sos_position(&full) + 20,
        "the cut must fall inside the scan data"
    );
    std::fs::write(&bad, &full[..cut]).expect("write");
    (c, bad)
}

/// What happens today: the JPEG decoder (zune-jpeg via `image`) decodes a truncated scan
/// without an error (the missing part is filled in), so the file is trained on and nothing
/// is said. Bounded, no panic; exit 0, 2 (refused) or 4 (failed naming the file).
#[test]
fn truncated_jpeg_no_panic_no_hang() {
    let (c, bad) = truncated_jpeg_case();
    let out = c.root().join("out-strict");
    let r = c.train(&out, false);
    eprintln!("truncated JPEG without --skip-bad-images: {}", r.explain());
    match r.code {
        Some(0) => assert!(out.join("model.json").is_file(), "{}", r.explain()),
        Some(2) | Some(4) => {
            assert!(
                r.stderr.contains(&bad.display().to_string()),
                "{}",
                r.explain()
            );
            assert!(!out.join("model.json").exists(), "{}", r.explain());
        }
        other => panic!("unexpected exit {other:?}:\n{}", r.explain()),
    }
}

/// The contract: a truncated JPEG is refused naming the file, or skipped and listed.
#[test]
fn truncated_jpeg_is_refused_or_skipped() {
    let (c, bad) = truncated_jpeg_case();
    c.expect_refused(&bad, &["truncat", "end of file", "EOI"]);
    c.expect_skipped(&bad);
}

/// A valid PNG cut in half inside its IDAT: the header check passes, decoding fails during
/// training.
fn truncated_png(path: &Path) {
    let img = image::RgbImage::from_fn(128, 128, |x, y| {
        let v = x
            .wrapping_mul(2654435761)
            .wrapping_add(y.wrapping_mul(40503))
            >> 9;
        image::Rgb([(v & 255) as u8, (x * 2) as u8, (y * 2) as u8])
    });
    let mut bytes = Vec::new();
    image::DynamicImage::ImageRgb8(img)
        .write_to(
            &mut std::io::Cursor::new(&mut bytes),
            image::ImageFormat::Png,
        )
        .expect("encode png");
    std::fs::write(path, &bytes[..bytes.len() / 2]).expect("write");
}

/// A valid JPEG whose entropy-coded scan is cut short by a stray marker (a DHT marker 40 bytes
/// into the scan); its header and its end-of-image marker are intact, so the header check
/// passes and decoding fails during training ("Invalid DHT index").
fn cut_scan_jpeg(path: &Path) {
    let full = detailed_jpeg(path);
    let sos = sos_position(&full);
    let mut bytes = full[..sos + 40].to_vec();
    bytes.extend_from_slice(&[0xFF, 0xC4]);
    bytes.extend_from_slice(&full[sos + 42..]);
    std::fs::write(path, bytes).expect("write");
}

/// After a `--skip-bad-images` run: exit 0, finite losses in every `metrics.jsonl` row,
/// `skipped` images counted there, every weight of the model finite.
fn assert_sound(out: &Path, skipped: u64, r: &Run) {
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let rows = metrics_rows(out);
    assert!(!rows.is_empty(), "{}", r.explain());
    for row in &rows {
        for key in ["train_loss", "val_loss"] {
            let v = row[key].as_f64().unwrap_or(f64::NAN);
            assert!(v.is_finite(), "{key} is {v} in {row}\n{}", r.explain());
        }
    }
    let counted: u64 = rows
        .iter()
        .map(|row| row["skipped_images"].as_u64().unwrap_or(0))
        .sum();
    assert_eq!(
        counted, skipped,
        "skipped_images in metrics.jsonl: {rows:?}"
    );
    let tensors = all_weights_finite(&out.join("model.safetensors"))
        .unwrap_or_else(|e| panic!("the model is poisoned: {e}\n{}", r.explain()));
    assert!(
        tensors > 50,
        "a resnet18 state dict has more tensors than {tensors}"
    );
    assert!(
        r.stdout
            .contains(&format!("{skipped} bad image(s) skipped"))
            || r.stderr
                .contains(&format!("{skipped} bad image(s) skipped")),
        "the run report counts the skipped image(s):\n{}",
        r.explain()
    );
}

/// The file is named exactly once in all the driver logs together (one epoch: only the rank
/// whose shard holds it meets it), with the contract's prefix.
fn named_once(out: &Path, ranks: u32, bad: &Path) {
    let line = format!("skipped bad image: {}", bad.display());
    let logs = driver_logs(&out.join("logs"), ranks as usize);
    let times: usize = logs.iter().map(|l| l.matches(&line).count()).sum();
    assert_eq!(
        times, 1,
        "'{line}' must appear once in the driver logs:\n{logs:#?}"
    );
    assert!(
        logs.iter().all(|l| !l.contains("skipped a batch")),
        "a bad image is dropped alone, not with its batch:\n{logs:#?}"
    );
}

/// Without `--skip-bad-images` a file that fails only while decoding ends the job (exit 4, the
/// data error of a rank) naming the file, in bounded time, with no model left behind.
#[test]
fn truncated_png_fails_in_training_naming_the_file() {
    let c = Case::new();
    let bad = c.train.join("3/truncated.png");
    truncated_png(&bad);
    let out = c.root().join("out-strict");
    let r = c.train(&out, false);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let shown = bad.display().to_string();
    assert!(
        r.stderr.contains(&shown) || r.stdout.contains(&shown),
        "the failure must name the file:\n{}",
        r.explain()
    );
    assert!(!out.join("model.json").exists(), "{}", r.explain());
    assert!(r.elapsed < Duration::from_secs(180), "{}", r.explain());
    // Issue 28: classified as an input file that could not be read, the file and the fix.
    use tchrun::job_record::{Cause, FailureSummary, Record};
    let s = FailureSummary::read(&out.join("logs"))
        .expect("failure.json reads")
        .expect("failure.json is there");
    assert_eq!(
        s.cause,
        Some(Cause::InputFile {
            path: Some(shown.clone())
        }),
        "{}",
        r.explain()
    );
    assert!(
        r.stderr
            .contains("why: an input file could not be read: file ")
            && r.stderr.contains("fix: check that the file exists"),
        "{}",
        r.explain()
    );
}

/// Issue 12: a truncated PNG and a JPEG with a cut scan, found while decoding in training, are
/// dropped alone at 1 and at 2 ranks: exit 0, finite losses, a finite model, the file named
/// once, a skipped count of exactly 1 in `metrics.jsonl` and the run report.
#[test]
fn bad_images_found_in_training_are_dropped_alone_at_1_and_2_ranks() {
    for (ranks, png) in [(1u32, true), (2, false), (2, true), (1, false)] {
        let c = Case::new();
        let bad = if png {
            c.train.join("3/zz_truncated.png")
        } else {
            c.train.join("3/zz_cut_scan.jpg")
        };
        if png {
            truncated_png(&bad)
        } else {
            cut_scan_jpeg(&bad)
        }
        let out = c.root().join(format!("out-{ranks}"));
        let mut cmd = c.train_cmd(&out, true);
        cmd.args(["--procs-per-node", &ranks.to_string()]);
        let r = run(&mut cmd, LIMIT);
        no_panic(&r, &out);
        eprintln!("{} at {ranks} rank(s): {}", bad.display(), r.explain());
        assert_sound(&out, 1, &r);
        named_once(&out, ranks, &bad);
        assert!(
            r.stdout
                .contains("1 image(s) failed to decode and were skipped"),
            "{}",
            r.explain()
        );
    }
}

/// Issue 12, item 2: with `--batch-size 1` the bad image's step has no sample on its rank
/// (at 1 rank: none in the whole job). That step changes nothing, and the job ends sound.
/// Input size 64: one image still gives batch norm 2x2 values per channel.
#[test]
fn a_step_made_only_of_bad_images_changes_nothing() {
    for ranks in [1u32, 2] {
        let c = Case::new();
        let model = model_dir(c.root(), "resnet18", 64);
        let bad = c.train.join("3/zz_truncated.png");
        truncated_png(&bad);
        let out = c.root().join(format!("out-{ranks}"));
        let mut cmd = tchrun_train(&model, &c.train, &c.valid, &out);
        cmd.args([
            "--epochs",
            "1",
            "--batch-size",
            "1",
            "--lr",
            "0.0005",
            "--no-hflip",
            "--print-freq",
            "100",
            "--skip-bad-images",
            "--procs-per-node",
            &ranks.to_string(),
        ]);
        let r = run(&mut cmd, LIMIT);
        no_panic(&r, &out);
        eprintln!("batch size 1 at {ranks} rank(s): {}", r.explain());
        assert_sound(&out, 1, &r);
        named_once(&out, ranks, &bad);
        if ranks == 1 {
            let log = driver_logs(&out.join("logs"), 1).remove(0);
            assert!(
                log.contains("no images on any rank (all skipped as bad); weights unchanged"),
                "{log}"
            );
        }
    }
}

/// `--batch-size 1` where one image gives batch norm a single value per channel (resnet18 at
/// 32 px ends in a 1x1 map, and so does a 64 px model trained at `--train-crop-size 32`) is
/// refused before any rank starts: it would make the running variance NaN.
#[test]
fn batch_size_1_at_a_1x1_feature_map_is_refused() {
    let c = Case::new();
    let out = c.root().join("out");
    let r = run(
        tchrun_train(&c.model, &c.train, &c.valid, &out).args(["--batch-size", "1"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--batch-size 1") && r.stderr.contains("--input-size 33"),
        "{}",
        r.explain()
    );
    assert!(!out.exists(), "{}", r.explain());
    // A 64 px model trained on 32 px crops ends in the same 1x1 map: the training crop counts.
    let model64 = model_dir(c.root(), "resnet18", 64);
    let r = run(
        tchrun_train(&model64, &c.train, &c.valid, &out).args([
            "--batch-size",
            "1",
            "--train-crop-size",
            "32",
        ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("training crop size 32 (--train-crop-size)")
            && r.stderr.contains("--train-crop-size 33"),
        "{}",
        r.explain()
    );
    assert!(!out.exists(), "{}", r.explain());
}

/// Random bytes behind a `.jpg` name.
#[test]
fn corrupt_jpeg_random_bytes() {
    let c = Case::new();
    let bad = c.train.join("3/corrupt.jpg");
    // xorshift: deterministic junk
    let mut s = 0x9E37_79B9_7F4A_7C15u64;
    let junk: Vec<u8> = (0..4096)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 24) as u8
        })
        .collect();
    std::fs::write(&bad, &junk).expect("write");
    c.expect_refused(&bad, &["corrupt or unsupported image header"]);
    c.expect_skipped(&bad);
}

/// A JPEG start-of-image marker followed by garbage (gets past format sniffing).
#[test]
fn corrupt_jpeg_after_magic() {
    let c = Case::new();
    let bad = c.train.join("3/magic.jpg");
    let mut bytes = vec![0xFF, 0xD8, 0xFF, 0xE0];
    bytes.extend((0..2000u32).map(|i| (i.wrapping_mul(7919) >> 3) as u8));
    std::fs::write(&bad, &bytes).expect("write");
    c.expect_refused(&bad, &["corrupt or unsupported image header"]);
    c.expect_skipped(&bad);
}

#[test]
fn zero_byte_file() {
    let c = Case::new();
    let bad = c.train.join("3/empty.png");
    std::fs::write(&bad, b"").expect("write");
    c.expect_refused(&bad, &["unexpected end of file", "corrupt", "empty"]);
    c.expect_skipped(&bad);
}

/// A text file with an image extension.
#[test]
fn text_file_named_png() {
    let c = Case::new();
    let bad = c.train.join("3/x.png");
    std::fs::write(&bad, "this is not an image\n".repeat(20)).expect("write");
    c.expect_refused(&bad, &["not a JPEG, PNG", "Invalid PNG signature"]);
    c.expect_skipped(&bad);
}

/// A valid PNG whose header declares 100000 x 100000 pixels (CRC recomputed): refused from
/// its header, never decoded.
#[test]
fn decompression_bomb_png() {
    let c = Case::new();
    let bad = c.train.join("3/bomb.png");
    let mut png = std::fs::read(c.good_png(3)).expect("read");
    assert_eq!(&png[12..16], b"IHDR");
    png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32fast::hash(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(&bad, &png).expect("write");
    let r = c.expect_refused(&bad, &["decompression bomb"]);
    assert!(r.stderr.contains("100000x100000"), "{}", r.explain());
    let r = c.expect_skipped(&bad);
    assert!(r.elapsed < Duration::from_secs(120), "{}", r.explain());
}

/// A file that opens but cannot be read (EIO), which root cannot bypass: a link named
/// `eio.png` to `/proc/self/mem` (reading a process's memory at offset 0 fails with EIO),
/// the same error a bad disk sector or a lost network volume gives.
#[test]
fn unreadable_file_io_error() {
    if std::fs::read("/proc/self/mem").is_ok() {
        skip_or_fail("/proc/self/mem is readable here (no EIO to provoke)");
        return;
    }
    let c = Case::new();
    let bad = c.train.join("3/eio.png");
    std::os::unix::fs::symlink("/proc/self/mem", &bad).expect("symlink");
    c.expect_refused(&bad, &["Input/output error", "cannot read"]);
    c.expect_skipped(&bad);
}

/// `chmod 000`: root reads such a file anyway, so as root the job runs as `nobody`
/// (setpriv), where the permission check applies. Skipped with a message when that cannot be
/// arranged.
#[test]
fn unreadable_file_permission_denied() {
    let c = Case::new();
    let bad = c.train.join("3/secret.png");
    std::fs::copy(c.good_png(3), &bad).expect("copy");
    set_mode(&bad, 0o000);
    let as_nobody = is_root();
    if as_nobody {
        // nobody must reach the temp dir, write the output and run the binaries.
        for p in [c.root()]
            .into_iter()
            .chain(walk_dirs(c.root()).iter().map(|p| p.as_path()))
        {
            set_mode(p, 0o777);
        }
        let probe = run(
            std::process::Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
                .arg(worker_path())
                .arg("--help"),
            Duration::from_secs(30),
        );
        if probe.code != Some(0) {
            skip_or_fail(&format!(
                "running as root and cannot run the worker as nobody: {}",
                probe.explain()
            ));
            return;
        }
    }
    let wrap = |cmd: std::process::Command| -> std::process::Command {
        if !as_nobody {
            return cmd;
        }
        let mut w = std::process::Command::new("setpriv");
        w.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(cmd.get_program())
            .args(cmd.get_args())
            .env("HOME", c.root())
            .env("RUST_BACKTRACE", "0");
        w
    };
    let out = c.root().join("out-strict");
    let r = run(&mut wrap(c.train_cmd(&out, false)), LIMIT);
    no_panic(&r, &out);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&bad.display().to_string()),
        "{}",
        r.explain()
    );
    assert!(r.stderr.contains("ermission denied"), "{}", r.explain());
    assert!(!out.exists(), "{}", r.explain());

    let out = c.root().join("out-skip");
    let r = run(&mut wrap(c.train_cmd(&out, true)), LIMIT);
    no_panic(&r, &out);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let log = driver_logs(&out.join("logs"), 1).remove(0);
    assert!(
        log.contains(&format!("skipped bad image: {}", bad.display())),
        "driver log must list the skipped file:\n{log}"
    );
}

/// A directory entry that cannot be opened at all: a dangling symlink with an image name.
/// (torchvision lists it and fails when loading it.) It must be refused or skipped and counted,
/// not silently dropped.
#[test]
fn dangling_symlink_named_png() {
    let c = Case::new();
    let bad = c.train.join("3/y.png");
    std::os::unix::fs::symlink(c.root().join("does-not-exist.png"), &bad).expect("symlink");
    c.expect_refused(&bad, &["y.png"]);
    c.expect_skipped(&bad);
}

/// A FIFO with an image name (someone else's `mkfifo` in a shared dataset): refused naming it
/// as a FIFO, or skipped and counted, at once; never left out silently (before: dropped from the
/// listing without a word) and never a blocking open.
#[test]
fn fifo_named_png_is_refused_or_skipped_not_dropped() {
    let c = Case::new();
    let bad = c.train.join("3/pipe.png");
    nix::unistd::mkfifo(&bad, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
    c.expect_refused(&bad, &["FIFO"]);
    c.expect_skipped(&bad);
}

/// A valid JPEG with an upper-case extension is an image like any other.
#[test]
fn upper_case_jpg_extension_is_accepted() {
    let c = Case::new();
    let good = c.train.join("3/UPPER.JPG");
    detailed_jpeg(&good);
    let out = c.root().join("out");
    let r = c.train(&out, false);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(out.join("model.json").is_file(), "{}", r.explain());
    let log = driver_logs(&out.join("logs"), 1).remove(0);
    let total = 10 * TRAIN_PER_CLASS + 1;
    assert!(
        r.stdout.contains(&format!("on {total} train / ")),
        "UPPER.JPG must be trained on ({total} train images):\n{}",
        r.explain()
    );
    assert!(!log.contains("skipped"), "{log}");
}

/// All the bad files at once under `--skip-bad-images`: each listed, the count right, the job
/// done.
#[test]
fn all_bad_files_at_once_are_skipped_and_counted() {
    let c = Case::new();
    let mut bad = Vec::new();
    let p = c.train.join("1/empty.png");
    std::fs::write(&p, b"").expect("write");
    bad.push(p);
    let p = c.train.join("2/x.png");
    std::fs::write(&p, "text").expect("write");
    bad.push(p);
    let p = c.valid.join("4/junk.jpg");
    std::fs::write(&p, [0xFFu8, 0xD8, 0xFF, 0x00, 0x13, 0x37]).expect("write");
    bad.push(p);
    let p = c.train.join("5/bomb.png");
    let mut png = std::fs::read(c.good_png(5)).expect("read");
    png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
    png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
    let crc = crc32fast::hash(&png[12..29]);
    png[29..33].copy_from_slice(&crc.to_be_bytes());
    std::fs::write(&p, &png).expect("write");
    bad.push(p);
    let out = c.root().join("out-skip");
    let r = c.train(&out, true);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let log = driver_logs(&out.join("logs"), 1).remove(0);
    for b in &bad {
        assert!(
            log.contains(&format!("skipped bad image: {}", b.display())),
            "{} not listed:\n{log}",
            b.display()
        );
    }
    assert!(
        r.stdout
            .contains(&format!("skipped {} bad image(s)", bad.len()))
            || r.stderr
                .contains(&format!("skipped {} bad image(s)", bad.len())),
        "the number of skipped images ({}) is reported:\n{log}\n{}",
        bad.len(),
        r.explain()
    );
}

fn set_mode(p: &Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

fn walk_dirs(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            let p = e.path();
            if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                out.push(p.clone());
                stack.push(p);
            } else if e.file_type().map(|t| t.is_file()).unwrap_or(false)
                && !p.ends_with("secret.png")
            {
                set_mode(&p, 0o666);
            }
        }
    }
    out
}
