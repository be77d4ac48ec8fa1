//! Image-folder datasets, distributed sharding and a multi-threaded batch loader.
//!
//! * [`ImageFolder`] scans a torchvision `ImageFolder` layout (`ROOT/<class>/<image>`).
//! * [`shard`] / [`shard_real_count`] reproduce `torch.utils.data.DistributedSampler`
//!   (`drop_last=False`).
//! * [`load_batches`] decodes + augments images on background threads and yields
//!   normalized `f32` batches (`N x 3 x size x size`, CHW, RGB) in order.
//!
//! No torch dependency: batches are plain buffers.

use std::collections::BTreeSet;
use std::fs;
use std::io::Cursor;
use std::path::{Path, PathBuf};

use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

pub use tchrun::flags::DEFAULT_MAX_IMAGE_PIXELS;

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

pub use tchrun::model::Normalization;

pub mod archive;
mod augment;
pub mod auto_augment;
pub mod comparison;
mod dataset;
mod error;
pub mod evaluation;
mod folder;
mod images;
pub mod index;
mod loader;
pub mod mcnemar;
pub mod pack;
pub mod preflight;
mod shard;
pub mod split;
pub mod transform_folder;
pub mod transforms;
mod verify;

pub use augment::*;
use dataset::name_of;
pub use dataset::{ImageFolder, Sample};
use error::io_err;
pub use error::DatasetError;
pub use folder::*;
pub use images::{IMAGE_EXTENSIONS, IMAGE_FORMATS, MAX_DECODED_BYTES};
pub use loader::*;
pub use pack::Member;
pub use shard::*;

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Luma, Rgb, RgbImage, Rgba};
    use std::time::{Duration, Instant};

    fn rgb_image(w: u32, h: u32, seed: u32) -> RgbImage {
        ImageBuffer::from_fn(w, h, |x, y| {
            let v = x
                .wrapping_mul(7)
                .wrapping_add(y.wrapping_mul(13))
                .wrapping_add(seed * 31);
            Rgb([
                (v % 256) as u8,
                ((x * 255) / w.max(1)) as u8,
                ((y * 255) / h.max(1)) as u8,
            ])
        })
    }

    fn write_jpeg(path: &Path, w: u32, h: u32, seed: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        rgb_image(w, h, seed)
            .save_with_format(path, image::ImageFormat::Jpeg)
            .unwrap();
    }

    fn write_png(path: &Path, w: u32, h: u32, seed: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        rgb_image(w, h, seed)
            .save_with_format(path, image::ImageFormat::Png)
            .unwrap();
    }

    fn cfg(size: usize, bs: usize, threads: usize, augment: Augment) -> LoaderConfig {
        LoaderConfig {
            size,
            batch_size: bs,
            threads,
            prefetch: 2,
            augment,
            norm: Normalization::default(),
            seed: 42,
            epoch: 3,
            rank: 1,
            first_position: 0,
            skip_bad: false,
            max_pixels: DEFAULT_MAX_IMAGE_PIXELS,
            global: None,
        }
    }

    /// Dataset with `classes` classes x `per` JPEGs of varied sizes.
    fn make_dataset(root: &Path, classes: usize, per: usize) {
        for c in 0..classes {
            for i in 0..per {
                let (w, h) = (
                    40 + ((i * 17 + c * 5) % 60) as u32,
                    30 + ((i * 11) % 70) as u32,
                );
                write_jpeg(
                    &root.join(format!("class{c}")).join(format!("{i:03}.jpg")),
                    w,
                    h,
                    (c * 100 + i) as u32,
                );
            }
        }
    }

    #[test]
    fn scan_ordering_hidden_uppercase() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write_jpeg(&r.join("b/2.JPG"), 8, 8, 0);
        write_jpeg(&r.join("b/1.jpeg"), 8, 8, 0);
        write_png(&r.join("b/10.PNG"), 8, 8, 0);
        write_jpeg(&r.join("b/.hidden.jpg"), 8, 8, 0);
        fs::write(r.join("b/notes.txt"), "x").unwrap();
        write_jpeg(&r.join("a/z.jpg"), 8, 8, 0);
        write_jpeg(&r.join("B/x.jpg"), 8, 8, 0);
        write_jpeg(&r.join(".git/x.jpg"), 8, 8, 0);
        let f = ImageFolder::scan(r).unwrap();
        assert_eq!(f.classes, vec!["B", "a", "b"]);
        let names: Vec<(String, usize)> = f
            .samples
            .iter()
            .map(|s| (name_of(&s.path), s.label))
            .collect();
        assert_eq!(
            names,
            vec![
                ("x.jpg".into(), 0),
                ("z.jpg".into(), 1),
                ("1.jpeg".into(), 2),
                ("10.PNG".into(), 2),
                ("2.JPG".into(), 2)
            ]
        );
    }

    #[test]
    fn scan_errors() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        // missing root
        let e = ImageFolder::scan(&r.join("nope")).unwrap_err();
        assert!(matches!(e, DatasetError::Io { .. }), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
        // flat folder of images
        let flat = r.join("flat");
        write_jpeg(&flat.join("a.jpg"), 8, 8, 0);
        let e = ImageFolder::scan(&flat).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }));
        let m = e.to_string();
        assert!(m.starts_with("NotLabeledDatasetError: "), "{m}");
        assert!(
            m.contains("flat") && m.contains("ROOT/<class>/<image>"),
            "{m}"
        );
        // root is a file
        let e = ImageFolder::scan(&flat.join("a.jpg")).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }), "{e}");
        // nested layout: ROOT/data/<class>/<image>
        let nested = r.join("nested");
        write_jpeg(&nested.join("data/cat/1.jpg"), 8, 8, 0);
        write_jpeg(&nested.join("data/dog/1.jpg"), 8, 8, 0);
        let e = ImageFolder::scan(&nested).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }), "{e}");
        assert!(e.to_string().contains("data"), "{e}");
        // empty class folder
        let ec = r.join("emptyclass");
        write_jpeg(&ec.join("a/1.jpg"), 8, 8, 0);
        fs::create_dir_all(ec.join("b")).unwrap();
        fs::write(ec.join("b/readme.txt"), "x").unwrap();
        let e = ImageFolder::scan(&ec).unwrap_err();
        match &e {
            DatasetError::Empty { path, .. } => assert!(path.ends_with("b")),
            _ => panic!("{e}"),
        }
        // totally empty
        let em = r.join("empty");
        fs::create_dir_all(&em).unwrap();
        assert!(matches!(
            ImageFolder::scan(&em).unwrap_err(),
            DatasetError::Empty { .. }
        ));
    }

    #[test]
    fn class_mismatch() {
        let d = tempfile::tempdir().unwrap();
        let (t, v) = (d.path().join("train"), d.path().join("valid"));
        for c in ["cat", "dog", "emu"] {
            write_jpeg(&t.join(c).join("1.jpg"), 8, 8, 0);
        }
        for c in ["cat", "dog", "fox"] {
            write_jpeg(&v.join(c).join("1.jpg"), 8, 8, 0);
        }
        let (tf, vf) = (
            ImageFolder::scan(&t).unwrap(),
            ImageFolder::scan(&v).unwrap(),
        );
        assert!(ImageFolder::check_same_classes(&tf, &tf).is_ok());
        let m = ImageFolder::check_same_classes(&tf, &vf)
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("InvalidDatasetError: "), "{m}");
        assert!(
            m.contains("only in train: [emu]") && m.contains("only in valid: [fox]"),
            "{m}"
        );
    }

    #[test]
    fn verify_corrupt_and_bomb() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write_jpeg(&r.join("a/good.jpg"), 16, 16, 0);
        write_png(&r.join("a/good2.png"), 16, 16, 0);
        // corrupt: random bytes
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let junk: Vec<u8> = (0..1000).map(|_| rng.r#gen::<u8>()).collect();
        fs::create_dir_all(r.join("b")).unwrap();
        fs::write(r.join("b/x.jpg"), &junk).unwrap();
        // bomb: valid tiny PNG with IHDR patched to 100000 x 100000 (CRC recomputed)
        write_png(&r.join("c/bomb.png"), 4, 4, 0);
        let mut png = fs::read(r.join("c/bomb.png")).unwrap();
        assert_eq!(&png[12..16], b"IHDR");
        png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32fast::hash(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        fs::write(r.join("c/bomb.png"), &png).unwrap();
        write_jpeg(&r.join("c/ok.jpg"), 16, 16, 0);

        let mut f = ImageFolder::scan(r).unwrap();
        assert_eq!(f.samples.len(), 5);
        let e = f.clone().verify(false, 50_000_000).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("BadImageError: ") && m.contains("x.jpg"),
            "{m}"
        );

        let skipped = f.verify(true, 50_000_000).unwrap();
        assert_eq!(f.samples.len(), 3);
        assert_eq!(skipped.len(), 2);
        assert!(skipped[0].0.ends_with("b/x.jpg"));
        assert!(skipped[1].0.ends_with("c/bomb.png"));
        assert!(skipped[1].1.contains("100000x100000"), "{}", skipped[1].1);

        // only the bomb: fails naming the file
        let mut f2 = ImageFolder::scan(r).unwrap();
        f2.samples.retain(|s| s.path.ends_with("bomb.png"));
        let m = f2.verify(false, 50_000_000).unwrap_err().to_string();
        assert!(m.contains("bomb.png") && m.contains("exceed"), "{m}");
        // the remaining good set verifies cleanly
        assert!(f.verify(false, 50_000_000).unwrap().is_empty());
    }

    #[test]
    fn shard_semantics() {
        // disjoint + covering when divisible
        let (len, world) = (12, 4);
        let mut all: Vec<usize> = Vec::new();
        for r in 0..world {
            let s = shard(len, r, world, 7, 0, true);
            assert_eq!(s.len(), 3);
            all.extend(s);
        }
        all.sort();
        assert_eq!(all, (0..len).collect::<Vec<_>>());
        // unshuffled matches torch exactly
        assert_eq!(shard(10, 0, 4, 0, 0, false), vec![0, 4, 8]);
        assert_eq!(shard(10, 1, 4, 0, 0, false), vec![1, 5, 9]);
        assert_eq!(shard(10, 2, 4, 0, 0, false), vec![2, 6, 0]);
        assert_eq!(shard(10, 3, 4, 0, 0, false), vec![3, 7, 1]);
        // padding larger than len
        assert_eq!(shard(2, 4, 5, 0, 0, false), vec![0]);
        assert_eq!(shard(0, 0, 3, 0, 0, true), Vec::<usize>::new());
        // union covers all when not divisible, padding repeats
        let len = 10;
        let mut all = Vec::new();
        for r in 0..4 {
            all.extend(shard(len, r, 4, 9, 1, true));
        }
        assert_eq!(all.len(), 12);
        let set: BTreeSet<usize> = all.iter().copied().collect();
        assert_eq!(set.len(), 10);
        // determinism and epoch dependence
        assert_eq!(shard(100, 1, 3, 5, 2, true), shard(100, 1, 3, 5, 2, true));
        assert_ne!(shard(100, 1, 3, 5, 2, true), shard(100, 1, 3, 5, 3, true));
        // real counts
        for (len, world) in [(10, 4), (12, 4), (2, 5), (0, 3), (1, 1), (1001, 8)] {
            let sum: usize = (0..world).map(|r| shard_real_count(len, r, world)).sum();
            assert_eq!(sum, len, "len {len} world {world}");
            for r in 0..world {
                let n = shard(len, r, world, 0, 0, false).len();
                assert!(shard_real_count(len, r, world) <= n);
            }
        }
        assert_eq!(shard_real_count(10, 2, 4), 2);
        assert_eq!(shard_real_count(10, 1, 4), 3);
    }

    #[test]
    fn loader_shapes_and_values() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 3, 7);
        let f = ImageFolder::scan(d.path()).unwrap();
        assert_eq!(f.samples.len(), 21);
        let idx: Vec<usize> = (0..21).rev().collect();
        for aug in [Augment::Train(TrainAugment::default()), Augment::Eval] {
            let it = load_batches(&f, idx.clone(), cfg(32, 8, 2, aug));
            assert_eq!(it.len(), 3);
            let batches: Vec<Batch> = it.map(|b| b.unwrap()).collect();
            assert_eq!(
                batches.iter().map(|b| b.len).collect::<Vec<_>>(),
                vec![8, 8, 5]
            );
            let n = Normalization::default();
            let lo = (0..3)
                .map(|c| (0.0 - n.mean[c]) / n.std[c])
                .fold(f32::MAX, f32::min);
            let hi = (0..3)
                .map(|c| (1.0 - n.mean[c]) / n.std[c])
                .fold(f32::MIN, f32::max);
            let mut pos = 0;
            for b in &batches {
                assert_eq!(b.size, 32);
                assert_eq!(b.images.len(), b.len * 3 * 32 * 32);
                assert_eq!(b.labels.len(), b.len);
                assert_eq!(b.paths.len(), b.len);
                for (k, p) in b.paths.iter().enumerate() {
                    assert_eq!(p, &f.samples[idx[pos]].path);
                    assert_eq!(b.labels[k], f.samples[idx[pos]].label as i64);
                    pos += 1;
                }
                assert!(b
                    .images
                    .iter()
                    .all(|v| v.is_finite() && *v >= lo - 1e-5 && *v <= hi + 1e-5));
                let var = {
                    let m = b.images.iter().sum::<f32>() / b.images.len() as f32;
                    b.images.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / b.images.len() as f32
                };
                assert!(var > 0.01, "images look constant");
            }
        }
    }

    #[test]
    fn eval_exact_colour() {
        // A constant-colour image must come out as exactly the normalized colour.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/c.png");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        ImageBuffer::from_pixel(50, 30, Rgb([255u8, 0, 128]))
            .save(&p)
            .unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        let b = load_batches(&f, vec![0], cfg(16, 1, 1, Augment::Eval))
            .next()
            .unwrap()
            .unwrap();
        let n = Normalization::default();
        let want = [255u8, 0, 128].map(|v| v as f32 / 255.0);
        for c in 0..3 {
            let exp = (want[c] - n.mean[c]) / n.std[c];
            for v in &b.images[c * 256..(c + 1) * 256] {
                assert!((v - exp).abs() < 1e-5, "channel {c}: {v} vs {exp}");
            }
        }
    }

    #[test]
    fn loader_color_types() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("a");
        fs::create_dir_all(&r).unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 10) as u8]))
            .save(r.join("1gray.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, y| Rgba([(x * 10) as u8, (y * 20) as u8, 7, 0]))
            .save(r.join("2rgba.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, y| {
            Rgb([(x * 3000) as u16, (y * 6000) as u16, 65535u16])
        })
        .save(r.join("3rgb16.png"))
        .unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 3000) as u16]))
            .save(r.join("4gray16.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 10) as u8]))
            .save_with_format(r.join("5gray.jpg"), image::ImageFormat::Jpeg)
            .unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        assert_eq!(f.samples.len(), 5);
        let b = load_batches(&f, (0..5).collect(), cfg(8, 5, 2, Augment::Eval))
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(b.len, 5);
        let n = Normalization::default();
        let plane = 64;
        // gray: the three channels carry the same 0..1 value
        for k in [0usize, 4] {
            let img = &b.images[k * 3 * plane..(k + 1) * 3 * plane];
            for i in 0..plane {
                let v: Vec<f32> = (0..3)
                    .map(|c| img[c * plane + i] * n.std[c] + n.mean[c])
                    .collect();
                assert!(
                    (v[0] - v[1]).abs() < 1e-4 && (v[1] - v[2]).abs() < 1e-4,
                    "{v:?}"
                );
            }
        }
        // rgba: alpha dropped (alpha 0 does not blacken the image), blue stays 7/255
        let img = &b.images[3 * plane..6 * plane];
        for i in 0..plane {
            let blue = img[2 * plane + i] * n.std[2] + n.mean[2];
            assert!((blue - 7.0 / 255.0).abs() < 1e-4, "{blue}");
        }
        // rgb16: blue 65535 -> 255
        let img = &b.images[6 * plane..9 * plane];
        for i in 0..plane {
            let blue = img[2 * plane + i] * n.std[2] + n.mean[2];
            assert!((blue - 1.0).abs() < 1e-4, "{blue}");
        }
    }

    #[test]
    fn loader_deterministic_across_threads() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 2, 10);
        let f = ImageFolder::scan(d.path()).unwrap();
        let idx = shard(f.samples.len(), 1, 2, 42, 3, true);
        let run = |threads: usize, seed: i64| -> Vec<f32> {
            let mut c = cfg(24, 3, threads, Augment::Train(TrainAugment::default()));
            c.seed = seed;
            load_batches(&f, idx.clone(), c)
                .flat_map(|b| b.unwrap().images)
                .collect()
        };
        let a = run(1, 42);
        assert_eq!(a, run(3, 42));
        assert_eq!(a, run(0, 42));
        assert_ne!(a, run(3, 43));
    }

    #[test]
    fn loader_bad_image_and_recycle() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 1, 6);
        fs::write(d.path().join("class0/002.jpg"), b"not a jpeg at all").unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        let mut it = load_batches(
            &f,
            (0..6).collect(),
            cfg(16, 2, 2, Augment::Train(TrainAugment::default())),
        );
        let b0 = it.next().unwrap().unwrap();
        it.recycle(b0);
        let e = it.next().unwrap().unwrap_err();
        assert!(
            matches!(e, DatasetError::BadImage { .. }) && e.to_string().contains("002.jpg"),
            "{e}"
        );
        let b2 = it.next().unwrap().unwrap();
        assert_eq!(b2.len, 2);
        assert!(it.next().is_none());
        // out of range index is an error, not a panic
        let mut it = load_batches(&f, vec![0, 99], cfg(16, 2, 1, Augment::Eval));
        assert!(matches!(
            it.next().unwrap(),
            Err(DatasetError::InvalidDataset { .. })
        ));
    }

    #[test]
    fn loader_drop_early_is_prompt() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..40 {
            write_jpeg(&d.path().join(format!("a/{i:03}.jpg")), 400, 300, i);
        }
        let f = ImageFolder::scan(d.path()).unwrap();
        let idx: Vec<usize> = (0..40).cycle().take(4000).collect();
        let mut it = load_batches(
            &f,
            idx,
            cfg(64, 8, 3, Augment::Train(TrainAugment::default())),
        );
        let _ = it.next().unwrap().unwrap();
        let t = Instant::now();
        drop(it);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            t.elapsed()
        );
    }

    /// cargo test --release -- --ignored --nocapture
    #[test]
    #[ignore]
    fn bench_decode_augment_224() {
        let d = tempfile::tempdir().unwrap();
        let n_files = 200;
        for i in 0..n_files {
            // photo-like content: smooth gradients + deterministic noise
            let mut rng = ChaCha8Rng::seed_from_u64(i);
            let img = ImageBuffer::from_fn(500, 375, |x, y| {
                let noise: i32 = rng.gen_range(-20..20);
                let f = |v: i32| (v + noise).clamp(0, 255) as u8;
                Rgb([
                    f(((x as f32 * 0.05 + i as f32).sin() * 100.0 + 128.0) as i32),
                    f((y * 255 / 375) as i32),
                    f(((x + y) as f32 * 0.02).cos() as i32 * 90 + 120),
                ])
            });
            let p = d.path().join(format!("c{}/{i:04}.jpg", i % 4));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let mut out = std::io::BufWriter::new(fs::File::create(&p).unwrap());
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
                .encode_image(&img)
                .unwrap();
        }
        let f = ImageFolder::scan(d.path()).unwrap();
        let avg_kb = f
            .samples
            .iter()
            .map(|s| fs::metadata(&s.path).unwrap().len())
            .sum::<u64>()
            / n_files
            / 1024;
        let cores = std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(1);
        let total = 2000usize;
        let idx: Vec<usize> = (0..n_files as usize).cycle().take(total).collect();
        for aug in [Augment::Train(TrainAugment::default()), Augment::Eval] {
            for threads in [1, cores] {
                let mut c = cfg(224, 32, threads, aug);
                c.prefetch = 4;
                // warm-up (page cache)
                for b in load_batches(&f, idx[..64].to_vec(), c.clone()) {
                    b.unwrap();
                }
                let t = Instant::now();
                let mut it = load_batches(&f, idx.clone(), c);
                let mut n = 0;
                while let Some(b) = it.next() {
                    let b = b.unwrap();
                    n += b.len;
                    it.recycle(b);
                }
                let secs = t.elapsed().as_secs_f64();
                println!(
                    "bench {aug:?}: {n} images 500x375 JPEG (~{avg_kb} KiB) -> 224x224, threads={threads} \
                     (cores={cores}): {:.0} images/s ({:.0} images/s/thread)",
                    n as f64 / secs,
                    n as f64 / secs / threads as f64
                );
            }
        }
        // Breakdown, single thread: decode only.
        let mut st = WorkerState::new(224);
        let t = Instant::now();
        for s in f.samples.iter().cycle().take(500) {
            decode_rgb(&s.path, &mut st, u64::MAX).unwrap();
        }
        println!(
            "bench decode-only 1 thread: {:.0} images/s",
            500.0 / t.elapsed().as_secs_f64()
        );
    }
}
