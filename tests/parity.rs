//! Parity with torchvision for every architecture: the same weights (a seeded torchvision model
//! written by Python as `.pth` and as safetensors, batch-norm statistics perturbed) give the
//! same logits in tchrun and in torchvision, in inference mode (relative tolerance 1e-4 of the
//! largest logit, `tests/python/parity.py`; reached: 0, the logits are bit-identical), at input
//! sizes 32 and 64 for every architecture, and also at 224, 256 and 299 for the cheapest of each
//! kind (resnet18, resnext50_32x4d, densenet121): what depends on the input size (stem, pools,
//! the adaptive final pool) is one code path per kind, and the whole matrix costs about ten
//! CPU-minutes here. `TCHRUN_PARITY_ALL_SIZES=1` runs every architecture at every size. The model
//! directories `model init` makes from the `.pth` and from the safetensors file hold the same
//! tensors; and the `state_dict` tchrun writes loads into torchvision with `strict=True`, equal
//! tensor for tensor. ConvNeXt (LayerNorms, layer scales and biases perturbed too): also one
//! training step with stochastic depth off, the loss and every gradient within 1e-4 of the
//! largest of its tensor (`GRAD_RTOL`); convnext_tiny at 32 and 64 px here, the other sizes
//! only with `TCHRUN_PARITY_ALL_SIZES=1` (then at every size). EfficientNet and EfficientNetV2
//! (biases perturbed too): the same, training step with stochastic depth and dropout off,
//! efficientnet_b0 and efficientnet_v2_s at 32 and 64 px here, the other sizes with
//! `TCHRUN_PARITY_ALL_SIZES=1`; every size's batch-norm eps and momentum, dropout and per-block
//! stochastic-depth probabilities equal torchvision's model's. Vision Transformers (a model is
//! built for its input size): a checkpoint of torchvision's `VisionTransformer(image_size=64)`
//! (class token, head, LayerNorms and biases perturbed) made into a model at 64 px (from the
//! `.pth` and the safetensors file) and at 32 px (its positional embedding resampled by `model
//! init`); each gives the logits of torchvision's model built for that size with the checkpoint
//! through `interpolate_embeddings`, holds its positional embedding within 1e-6, and writes a
//! `state_dict` torchvision loads strictly; one training step at 64 px, loss and gradients
//! within `GRAD_RTOL`. vit_b_32 here (at 32 px one patch, at 64 px four), vit_b_16 and vit_l_16
//! (at 32, 64 and 224 px) with `TCHRUN_PARITY_ALL_SIZES=1`. The resampling itself equals
//! `interpolate_embeddings` (within 1e-5 on N(0, 1) values) on random embeddings between grids
//! of 1 to 24 patches a side.
//! MobileNetV3 (biases perturbed
//! too): the same, training step with dropout off, mobilenet_v3_small at 32 and 64 px here,
//! mobilenet_v3_large with `TCHRUN_PARITY_ALL_SIZES=1`; its batch-norm eps and momentum and its
//! dropout equal torchvision's. RegNet (biases perturbed too): the same, training step as it is
//! (no dropout, no stochastic depth), regnet_x_400mf and regnet_y_400mf at 32 and 64 px here,
//! the twelve other sizes with `TCHRUN_PARITY_ALL_SIZES=1`; every size's batch-norm eps and
//! momentum equal torchvision's, none has dropout or stochastic depth.
//! dropout equal torchvision's. Swin Transformers (LayerNorms and biases perturbed too): the
//! same, training step with stochastic depth off, swin_t at 32 px (8x8 patches padded to 14x14:
//! four windows, the shifted blocks masked), 36 px (9x9 patches: every patch merging pads an
//! odd side) and 64 px (16x16 padded to 21x21, then 8x8 to 14x14) here, swin_s and swin_b with `TCHRUN_PARITY_ALL_SIZES=1`; every size's LayerNorm eps,
//! dropouts, window and shift per block and per-block stochastic depth equal torchvision's.
mod common;
use common::*;
use std::time::Duration;
use tchrun::model::Arch;

const LIMIT: Duration = Duration::from_secs(300);

/// Architectures compared at the large sizes too (one of each kind).
const LARGE_SIZES_FOR: [Arch; 3] = [Arch::Resnet18, Arch::Resnext50_32x4d, Arch::Densenet121];

fn all_sizes_asked() -> bool {
    std::env::var("TCHRUN_PARITY_ALL_SIZES").is_ok_and(|v| v == "1")
}

/// The first `n` of a family's `archs`, or all of them with `TCHRUN_PARITY_ALL_SIZES=1`.
fn first_unless_all_asked(archs: &[Arch], n: usize) -> &[Arch] {
    if all_sizes_asked() {
        archs
    } else {
        &archs[..n.min(archs.len())]
    }
}

fn parity_of(arch: Arch) {
    let t = tempdir();
    let d = t.path();
    let all_sizes = LARGE_SIZES_FOR.contains(&arch) || all_sizes_asked();
    let swin = matches!(arch.family(), tchrun::model::Family::Swin { .. });
    let sizes: &[&str] = if all_sizes {
        &["32", "64", "224", "256", "299"]
    } else if swin {
        // 36 px: 9x9 patches, then 5x5 and 3x3: every patch merging pads an odd side.
        &["32", "36", "64"]
    } else {
        &["32", "64"]
    };
    let py = |step: &str| {
        let r = run(
            python()
                .arg(repo().join("tests/python/parity.py"))
                .arg(step)
                .arg(arch.name())
                .arg(d)
                .args(sizes),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r
    };
    py("write");
    for (weights, tag) in [("w.pth", "pth"), ("w.safetensors", "st")] {
        let r = run(
            &mut init_with_weights(
                arch.name(),
                &d.join(weights),
                &d.join(format!("model-{tag}")),
            ),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
    }
    // The .pth's model directory holds the same tensors (checked below): one forward serves.
    let mut logits = worker();
    logits.arg("logits");
    if d.join("train.safetensors").exists() {
        logits
            .arg("--train-input")
            .arg(d.join("train.safetensors"))
            .arg("--grads")
            .arg(d.join("grads.safetensors"));
    }
    let r = run(
        logits
            .arg("--model")
            .arg(d.join("model-st"))
            .arg("--input")
            .arg(d.join("x.safetensors"))
            .arg("--output")
            .arg(d.join("logits.safetensors"))
            .arg("--state-dict")
            .arg(d.join("sd.safetensors")),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = py("check");
    eprintln!("{}", r.stdout.trim());
}

fn parity(archs: &[Arch]) {
    for &arch in archs {
        parity_of(arch);
    }
}

/// `tchrun model init` of `arch` at `size` px from `weights` into `out`.
fn init_at(arch: Arch, size: &str, weights: &std::path::Path, out: &std::path::Path) {
    let r = run(
        tchrun()
            .args(["model", "init", "--arch", arch.name(), "--input-size", size])
            .arg("--weights")
            .arg(weights)
            .arg("--output")
            .arg(out),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

/// A ViT's parity (`parity.py write vit_*`): the checkpoint built for the last of `sizes`, a
/// model directory per size, the logits of each, the training step at the checkpoint's size.
fn vit_parity_of(arch: Arch, sizes: &[&str]) {
    let t = tempdir();
    let d = t.path();
    let py = |step: &str| {
        let r = run(
            python()
                .arg(repo().join("tests/python/parity.py"))
                .arg(step)
                .arg(arch.name())
                .arg(d)
                .args(sizes),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        r
    };
    py("write");
    let base = sizes[sizes.len() - 1];
    for &size in sizes {
        let model = if size == base {
            init_at(arch, size, &d.join("w.safetensors"), &d.join("model-st"));
            d.join("model-pth")
        } else {
            d.join(format!("model-{size}"))
        };
        init_at(arch, size, &d.join("w.pth"), &model);
        let json = read(&model.join("model.json"));
        let resampled =
            format!("\"image_size\": {base},\n    \"pos_embedding_interpolated\": true");
        assert_eq!(json.contains(&resampled), size != base, "{json}");
        let mut logits = worker();
        logits.arg("logits");
        if size == base {
            logits
                .arg("--train-input")
                .arg(d.join("train.safetensors"))
                .arg("--grads")
                .arg(d.join("grads.safetensors"));
        }
        let r = run(
            logits
                .arg("--model")
                .arg(&model)
                .arg("--input")
                .arg(d.join(format!("x{size}.safetensors")))
                .arg("--output")
                .arg(d.join(format!("logits{size}.safetensors")))
                .arg("--state-dict")
                .arg(d.join(format!("sd{size}.safetensors"))),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
    }
    let r = py("check");
    eprintln!("{}", r.stdout.trim());
}

const RESNETS: [Arch; 5] = [
    Arch::Resnet18,
    Arch::Resnet34,
    Arch::Resnet50,
    Arch::Resnet101,
    Arch::Resnet152,
];
const RESNEXTS_AND_WIDE: [Arch; 5] = [
    Arch::Resnext50_32x4d,
    Arch::Resnext101_32x8d,
    Arch::Resnext101_64x4d,
    Arch::WideResnet50_2,
    Arch::WideResnet101_2,
];
const DENSENETS: [Arch; 4] = [
    Arch::Densenet121,
    Arch::Densenet161,
    Arch::Densenet169,
    Arch::Densenet201,
];

#[test]
fn resnets_give_torchvisions_logits() {
    parity(&RESNETS);
}

#[test]
fn resnexts_and_wide_resnets_give_torchvisions_logits() {
    parity(&RESNEXTS_AND_WIDE);
}

#[test]
fn densenets_give_torchvisions_logits() {
    parity(&DENSENETS);
}

const CONVNEXTS: [Arch; 4] = [
    Arch::ConvnextTiny,
    Arch::ConvnextSmall,
    Arch::ConvnextBase,
    Arch::ConvnextLarge,
];

/// convnext_tiny always; the larger ConvNeXts (88 to 198 million parameters) only with
/// `TCHRUN_PARITY_ALL_SIZES=1`: their code path is tiny's with other block counts and widths.
#[test]
fn convnexts_give_torchvisions_logits_and_gradients() {
    parity(first_unless_all_asked(&CONVNEXTS, 1));
}

const EFFICIENTNETS: [Arch; 11] = [
    Arch::EfficientnetB0,
    Arch::EfficientnetV2S,
    Arch::EfficientnetB1,
    Arch::EfficientnetB2,
    Arch::EfficientnetB3,
    Arch::EfficientnetB4,
    Arch::EfficientnetB5,
    Arch::EfficientnetB6,
    Arch::EfficientnetB7,
    Arch::EfficientnetV2M,
    Arch::EfficientnetV2L,
];

/// efficientnet_b0 and efficientnet_v2_s (MBConv and FusedMBConv, both batch-norm settings of
/// the sizes up to B4 and of V2) always; the others only with `TCHRUN_PARITY_ALL_SIZES=1`: the
/// same code paths with other widths, depths and batch-norm numbers, which
/// `efficientnet_settings_equal_torchvisions` and `tests/finetune.rs`'s spec test compare.
#[test]
fn efficientnets_give_torchvisions_logits_and_gradients() {
    parity(first_unless_all_asked(&EFFICIENTNETS, 2));
}

/// torchvision's settings of `archs` (`parity.py config`, built on the meta device): each one's
/// batch norm `eps` and `momentum`, `dropout` and per-block stochastic depth `sd`.
fn torchvision_settings(archs: &[Arch]) -> serde_json::Value {
    let r = run(
        python()
            .arg(repo().join("tests/python/parity.py"))
            .arg("config")
            .args(archs.iter().map(|a| a.name())),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    serde_json::from_str(r.stdout.trim()).expect("json")
}

/// Every EfficientNet size's batch norm (eps, momentum), dropout before the head and per-block
/// stochastic-depth probabilities (bit for bit) are torchvision's (`parity.py config`, built on
/// the meta device).
#[test]
fn efficientnet_settings_equal_torchvisions() {
    use tchrun::model::Family;
    let tv = torchvision_settings(&EFFICIENTNETS);
    for arch in EFFICIENTNETS {
        let family = arch.family();
        let Family::Efficientnet {
            dropout_pct, norm, ..
        } = family
        else {
            panic!("{} is not an EfficientNet", arch.name());
        };
        let t = &tv[arch.name()];
        let f = |k: &str| t[k].as_f64().expect("number");
        let name = arch.name();
        assert_eq!(
            (norm.eps(), norm.momentum()),
            (f("eps"), f("momentum")),
            "{name}"
        );
        assert_eq!(f64::from(dropout_pct) / 100.0, f("dropout"), "{name}");
        let sd: Vec<f64> = t["sd"]
            .as_array()
            .expect("sd")
            .iter()
            .map(|v| v.as_f64().expect("p"))
            .collect();
        assert_eq!(family.stochastic_depth_probs(), sd, "{name}");
    }
}

const VITS: [Arch; 3] = [Arch::VitB32, Arch::VitB16, Arch::VitL16];

/// vit_b_32 at 32 and 64 px always (its 88 million parameters are the cost: the layers run on
/// one to four patches); vit_b_16 and vit_l_16, at 32, 64 and 224 px, only with
/// `TCHRUN_PARITY_ALL_SIZES=1`: the same code with another patch, depth and width.
#[test]
fn vits_give_torchvisions_logits_and_gradients_at_their_size() {
    vit_parity_of(VITS[0], &["32", "64"]);
    if all_sizes_asked() {
        for arch in &VITS[1..] {
            vit_parity_of(*arch, &["32", "64", "224"]);
        }
    }
}

/// `model init`'s resampling of a ViT's positional embedding (`tchrun::arch::vit`) equals
/// torchvision's `interpolate_embeddings` (`parity.py interpolate`: random embeddings of 8
/// channels of N(0, 1), from grids of 1, 2, 3, 7 and 14 patches a side to 1 ... 24) within
/// 1e-5 (float rounding: torch's own float32 sums are 2e-6 to 4e-6 from the exact ones here);
/// the class token's position is kept bit for bit.
#[test]
fn vit_positional_embedding_is_resampled_as_interpolate_embeddings() {
    let t = tempdir();
    let r = run(
        python()
            .arg(repo().join("tests/python/parity.py"))
            .arg("interpolate")
            .arg(t.path()),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let bytes = std::fs::read(t.path().join("interp.safetensors")).expect("interp");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let floats = |name: &str| -> Vec<f32> {
        let v = st.tensor(name).expect(name);
        v.data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    };
    let mut pairs = 0;
    for from in [1, 2, 3, 7, 14] {
        let pos = floats(&format!("g{from}"));
        for to in [1, 2, 3, 4, 5, 7, 14, 24] {
            let want = floats(&format!("g{from}to{to}"));
            let got = tchrun::arch::vit::interpolate(&pos, 8, from, to);
            assert_eq!(got.len(), want.len(), "{from} -> {to}");
            assert_eq!(got[..8], want[..8], "{from} -> {to}: the class token");
            let worst = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst <= 1e-5, "{from} -> {to}: off by {worst}");
            pairs += 1;
        }
    }
    assert_eq!(pairs, 40);
}

const MOBILENETS: [Arch; 2] = [Arch::MobilenetV3Small, Arch::MobilenetV3Large];

/// mobilenet_v3_small always; mobilenet_v3_large only with `TCHRUN_PARITY_ALL_SIZES=1`: the
/// same code path with the other table, which `tests/finetune.rs`'s spec test compares.
#[test]
fn mobilenets_give_torchvisions_logits_and_gradients() {
    parity(first_unless_all_asked(&MOBILENETS, 1));
}

/// Both MobileNetV3s' batch norm (eps 0.001, momentum 0.01) and dropout (0.2) are
/// torchvision's, and neither has stochastic depth.
#[test]
fn mobilenet_settings_equal_torchvisions() {
    use tchrun::arch::{MOBILENET_BN_EPS, MOBILENET_BN_MOMENTUM, MOBILENET_DROPOUT};
    let tv = torchvision_settings(&MOBILENETS);
    for arch in MOBILENETS {
        let t = &tv[arch.name()];
        let f = |k: &str| t[k].as_f64().expect("number");
        assert_eq!(
            (MOBILENET_BN_EPS, MOBILENET_BN_MOMENTUM, MOBILENET_DROPOUT),
            (f("eps"), f("momentum"), f("dropout")),
            "{}",
            arch.name()
        );
        assert_eq!(t["sd"], serde_json::json!([]), "{}", arch.name());
        assert!(arch.family().stochastic_depth_probs().is_empty());
    }
}

const REGNETS: [Arch; 14] = [
    Arch::RegnetX400mf,
    Arch::RegnetY400mf,
    Arch::RegnetX800mf,
    Arch::RegnetX1_6gf,
    Arch::RegnetX3_2gf,
    Arch::RegnetX8gf,
    Arch::RegnetX16gf,
    Arch::RegnetX32gf,
    Arch::RegnetY800mf,
    Arch::RegnetY1_6gf,
    Arch::RegnetY3_2gf,
    Arch::RegnetY8gf,
    Arch::RegnetY16gf,
    Arch::RegnetY32gf,
];

/// regnet_x_400mf and regnet_y_400mf (without and with squeeze-and-excitation) always; the
/// others (up to 145 million parameters) only with `TCHRUN_PARITY_ALL_SIZES=1`: the same code
/// paths with other widths, depths and group widths, which `tests/finetune.rs`'s spec test
/// compares for every size.
#[test]
fn regnets_give_torchvisions_logits_and_gradients() {
    parity(first_unless_all_asked(&REGNETS, 2));
}

/// Every RegNet's batch norm (eps 1e-5, momentum 0.1) is torchvision's (`parity.py config`:
/// the model built on the meta device after `BlockParams` on the CPU), and none has dropout or
/// stochastic depth.
#[test]
fn regnet_settings_equal_torchvisions() {
    use tchrun::arch::{REGNET_BN_EPS, REGNET_BN_MOMENTUM};
    let tv = torchvision_settings(&REGNETS);
    for arch in REGNETS {
        let t = &tv[arch.name()];
        let f = |k: &str| t[k].as_f64().expect("number");
        let name = arch.name();
        assert_eq!(
            (REGNET_BN_EPS, REGNET_BN_MOMENTUM),
            (f("eps"), f("momentum")),
            "{name}"
        );
        assert_eq!(t["dropout"], serde_json::Value::Null, "{name}");
        assert_eq!(t["sd"], serde_json::json!([]), "{name}");
        assert!(arch.family().stochastic_depth_probs().is_empty());
    }
}

const SWINS: [Arch; 3] = [Arch::SwinT, Arch::SwinS, Arch::SwinB];

/// swin_t always (28 million parameters; at 32 and 64 px its windows are padded, and its
/// shifted blocks masked, in the first stages); swin_s and swin_b only with
/// `TCHRUN_PARITY_ALL_SIZES=1`: the same code with more blocks, wider and more heads.
#[test]
fn swins_give_torchvisions_logits_and_gradients() {
    parity(first_unless_all_asked(&SWINS, 1));
}

/// Every Swin's LayerNorm eps (1e-5), dropouts (0), window (7) and shift (0, then 3, in turn
/// within each stage) per block, and per-block stochastic-depth probabilities (bit for bit,
/// "row" mode) are torchvision's (`parity.py config`, built on the meta device).
#[test]
fn swin_settings_equal_torchvisions() {
    use tchrun::arch::swin::SwinShape;
    use tchrun::arch::swin::{EPS, WINDOW};
    let tv = torchvision_settings(&SWINS);
    for arch in SWINS {
        let t = &tv[arch.name()];
        let name = arch.name();
        let family = arch.family();
        let shape = SwinShape::of(family).expect("a Swin");
        assert_eq!(t["eps"].as_f64(), Some(EPS), "{name}");
        assert_eq!(t["dropout"].as_f64(), Some(0.0), "{name}");
        let (mut window, mut shift) = (Vec::new(), Vec::new());
        for &n in &shape.depths {
            for j in 0..n {
                window.push(serde_json::json!([WINDOW, WINDOW]));
                let s = if j % 2 == 1 { WINDOW / 2 } else { 0 };
                shift.push(serde_json::json!([s, s]));
            }
        }
        assert_eq!(t["window"], serde_json::Value::from(window), "{name}");
        assert_eq!(t["shift"], serde_json::Value::from(shift), "{name}");
        let sd: Vec<f64> = t["sd"]
            .as_array()
            .expect("sd")
            .iter()
            .map(|v| v.as_f64().expect("p"))
            .collect();
        assert_eq!(family.stochastic_depth_probs(), sd, "{name}");
    }
}

/// The tests above cover every architecture tchrun offers.
#[test]
fn every_architecture_is_compared() {
    let mut covered: Vec<&str> = RESNETS
        .iter()
        .chain(&RESNEXTS_AND_WIDE)
        .chain(&DENSENETS)
        .chain(&CONVNEXTS)
        .chain(&EFFICIENTNETS)
        .chain(&VITS)
        .chain(&MOBILENETS)
        .chain(&REGNETS)
        .chain(&SWINS)
        .map(|a| a.name())
        .collect();
    let mut all: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
    covered.sort();
    all.sort();
    assert_eq!(covered, all);
}
