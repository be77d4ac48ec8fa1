//! `--random-erase`, `--mixup-alpha` and `--cutmix-alpha` (issue 32) against torchvision 0.26
//! (`tests/python/augment_reference.py`): the erasing of a given box equals `F.erase`'s; the
//! draws (MixUp's λ, CutMix's box and adjusted λ, `RandomChoice`'s pick, RandomErasing's box
//! and rate) follow torchvision's distributions. The mixing itself is compared with
//! `v2.MixUp`/`v2.CutMix` in `worker/src/train/mix.rs`'s unit test.
mod common;
use common::stats::same_distribution;
use common::*;
use std::time::Duration;
use tchrun_data::{
    center_crop_box, erase, erase_params, mix_params, mix_rng, resized_crop, BoxResize,
    Interpolation, Mix,
};

fn reference(args: &[&str]) -> serde_json::Value {
    let out = run(
        python()
            .arg(repo().join("tests/python/augment_reference.py"))
            .args(args),
        Duration::from_secs(120),
    );
    assert_eq!(out.code, Some(0), "{}", out.explain());
    serde_json::from_str(&out.stdout).expect("json")
}

fn floats(v: &serde_json::Value) -> Vec<f32> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_f64().expect("number") as f32)
        .collect()
}

fn usizes(v: &serde_json::Value) -> Vec<usize> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("integer") as usize)
        .collect()
}

/// RandomErasing's kernel at a given box `(i, j, h, w)`: every channel's box set to 0, the
/// rest untouched, bit for bit.
#[test]
fn erasing_a_box_equals_torchvisions_erase() {
    let v = reference(&["erase"]);
    for case in v["cases"].as_array().expect("cases") {
        let size = case["size"].as_u64().expect("size") as usize;
        let b = usizes(&case["box"]);
        let mut image = floats(&case["image"]);
        erase(&mut image, size, [b[0], b[1], b[2], b[3]]);
        assert_eq!(image, floats(&case["erased"]), "box {b:?} at {size}");
    }
}

/// The largest difference in grey levels between two RGB8 images, and how many values differ.
fn grey_diff(ours: &[u8], theirs: &[usize]) -> (u64, usize) {
    assert_eq!(ours.len(), theirs.len());
    let d = |(&a, &t): (&u8, &usize)| (a as i64 - t as i64).unsigned_abs();
    let max = ours.iter().zip(theirs).map(d).max().unwrap_or(0);
    (max, ours.iter().zip(theirs).filter(|p| d(*p) > 0).count())
}

/// The loader's crop and resize against torchvision's on PIL images (its reference's default
/// backend), for nearest, bilinear and bicubic: RandomResizedCrop's kernel (`resized_crop` of a
/// box, down and up in either axis, the box cut out first) and the eval transform (`Resize` of
/// the shorter side + `CenterCrop`). Nearest is equal pixel for pixel; the antialiased filters
/// are Pillow's, horizontal pass first as Pillow's, in another fixed-point arithmetic: within
/// one grey level, on at most 6 % of the values (measured: up to 4.8 %, most cases under 1 %).
/// Before the box was cut out first, RandomResizedCrop's filter read across the box's edges
/// (up to 29 levels off), and with the vertical pass first bicubic clipped elsewhere (11).
#[test]
fn resized_crop_equals_torchvisions_on_pil_images() {
    let v = reference(&["resize"]);
    let w = v["width"].as_u64().expect("width") as u32;
    let h = v["height"].as_u64().expect("height") as u32;
    let image: Vec<u8> = usizes(&v["image"]).into_iter().map(|x| x as u8).collect();
    let mut report = Vec::new();
    let mut check = |name: &str, what: String, ours: Vec<u8>, theirs: Vec<usize>| {
        let (max, n) = grey_diff(&ours, &theirs);
        let line = format!("{name} {what}: max {max}, {n}/{} differ", ours.len());
        let allowed = if name == "nearest" { 0 } else { 1 };
        assert!(max <= allowed && n * 100 <= ours.len() * 6, "{line}");
        report.push(line);
    };
    for case in v["cases"].as_array().expect("cases") {
        let b = usizes(&case["box"]);
        let size = case["size"].as_u64().expect("size") as usize;
        let name = case["interpolation"].as_str().expect("interpolation");
        let crop = (b[0] as f64, b[1] as f64, b[2] as f64, b[3] as f64);
        let mode = (crop, BoxResize::CropFirst);
        let ours = resized_crop((w, h, &image), mode, size, Interpolation::named(name));
        let what = format!("box {b:?} -> {size}");
        check(name, what, ours.expect("resize"), usizes(&case["out"]));
    }
    for case in v["evals"].as_array().expect("evals") {
        let resize = case["resize"].as_u64().expect("resize") as usize;
        let size = case["size"].as_u64().expect("size") as usize;
        let name = case["interpolation"].as_str().expect("interpolation");
        let mode = (center_crop_box(w, h, resize, size), BoxResize::WithinImage);
        let ours = resized_crop((w, h, &image), mode, size, Interpolation::named(name));
        let what = format!("Resize({resize}) + CenterCrop({size})");
        check(name, what, ours.expect("resize"), usizes(&case["out"]));
    }
    eprintln!("{}", report.join("\n"));
}

/// tchrun's draws against torchvision's, N = 4000 each, both from fixed seeds (the test is
/// deterministic: it cannot flake). Continuous and integer quantities: the two-sample KS test
/// at significance 0.001 (distance < 1.949 × √(2/N) = 0.0436); proportions: within 4 standard
/// errors of the difference (4 × √(2 × 0.25 / N) = 0.045).
#[test]
fn mix_and_erase_draws_follow_torchvisions_distributions() {
    const N: usize = 4000;
    let v = reference(&["samples", &N.to_string()]);
    let draws = |mixup: f64, cutmix: f64, h: usize, w: usize| -> Vec<Mix> {
        (0..N)
            .map(|i| {
                let mut rng = mix_rng(7, 3, i);
                mix_params(mixup, cutmix, h, w, &mut rng).expect("a draw")
            })
            .collect()
    };
    for alpha in [0.2, 1.0] {
        let ours: Vec<f64> = draws(alpha, 0.0, 8, 8)
            .into_iter()
            .map(|m| match m {
                Mix::MixUp { lam } => lam,
                Mix::CutMix { .. } => panic!("MixUp alone drew CutMix"),
            })
            .collect();
        let theirs: Vec<f64> = floats(&v["lam"][format!("{alpha:?}")])
            .into_iter()
            .map(f64::from)
            .collect();
        assert_eq!(theirs.len(), N);
        same_distribution(&format!("MixUp λ, α {alpha}"), ours, theirs);
    }
    // CutMix on 24 x 32 images: the box's corner and sides, and the adjusted λ.
    let ours: Vec<([usize; 4], f64)> = draws(0.0, 1.0, 24, 32)
        .into_iter()
        .map(|m| match m {
            Mix::CutMix { boxed, lam } => (boxed, lam),
            Mix::MixUp { .. } => panic!("CutMix alone drew MixUp"),
        })
        .collect();
    let theirs: Vec<[usize; 4]> = v["cutmix_boxes"]
        .as_array()
        .expect("boxes")
        .iter()
        .map(|b| {
            let b = usizes(b);
            [b[0], b[1], b[2], b[3]]
        })
        .collect();
    for (k, what) in ["x1", "y1", "x2", "y2"].iter().enumerate() {
        same_distribution(
            &format!("CutMix box {what}"),
            ours.iter().map(|(b, _)| b[k] as f64).collect(),
            theirs.iter().map(|b| b[k] as f64).collect(),
        );
    }
    same_distribution(
        "CutMix box area",
        ours.iter()
            .map(|(b, _)| ((b[2] - b[0]) * (b[3] - b[1])) as f64)
            .collect(),
        theirs
            .iter()
            .map(|b| ((b[2] - b[0]) * (b[3] - b[1])) as f64)
            .collect(),
    );
    same_distribution(
        "CutMix adjusted λ",
        ours.iter().map(|(_, l)| *l).collect(),
        floats(&v["cutmix_lam"])
            .into_iter()
            .map(f64::from)
            .collect(),
    );
    // Our λ is the area outside the box, as torchvision's lam_adjusted.
    for (b, lam) in &ours {
        let inside = ((b[2] - b[0]) * (b[3] - b[1])) as f64 / (24.0 * 32.0);
        assert_eq!(*lam, 1.0 - inside, "{b:?}");
    }
    // RandomChoice([MixUp, CutMix]): CutMix's share.
    let tol = 4.0 * (2.0 * 0.25 / N as f64).sqrt();
    let ours = draws(1.0, 1.0, 8, 8)
        .iter()
        .filter(|m| matches!(m, Mix::CutMix { .. }))
        .count() as f64
        / N as f64;
    let theirs = usizes(&v["choices"]).iter().sum::<usize>() as f64 / N as f64;
    assert!(
        (ours - theirs).abs() < tol,
        "CutMix chosen {ours} vs {theirs}"
    );
    // RandomErasing(p=0.5) on 32 x 32: the rate and the box.
    let ours: Vec<Option<[usize; 4]>> = (0..N)
        .map(|i| erase_params(0.5, 32, 32, &mut mix_rng(11, 0, i)))
        .collect();
    let theirs: Vec<Option<[usize; 4]>> = v["erase"]
        .as_array()
        .expect("erase")
        .iter()
        .map(|b| {
            (!b.is_null()).then(|| {
                let b = usizes(b);
                [b[0], b[1], b[2], b[3]]
            })
        })
        .collect();
    let rate = |x: &[Option<[usize; 4]>]| x.iter().flatten().count() as f64 / N as f64;
    assert!(
        (rate(&ours) - rate(&theirs)).abs() < tol,
        "erased {} vs {}",
        rate(&ours),
        rate(&theirs)
    );
    for (k, what) in ["top", "left", "height", "width"].iter().enumerate() {
        same_distribution(
            &format!("RandomErasing {what}"),
            ours.iter().flatten().map(|b| b[k] as f64).collect(),
            theirs.iter().flatten().map(|b| b[k] as f64).collect(),
        );
    }
    // p 0 draws nothing; p 1 always erases (a try fits on 32 x 32).
    let mut rng = mix_rng(1, 0, 0);
    assert!((0..100).all(|_| erase_params(0.0, 32, 32, &mut rng).is_none()));
    assert!((0..100).all(|_| erase_params(1.0, 32, 32, &mut rng).is_some()));
}
