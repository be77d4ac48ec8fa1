//! Initial weights (part of issue 13): `tchrun model init --weights` takes a torchvision
//! `state_dict` in safetensors, checks it against the architecture without libtorch (names,
//! shapes and dtypes equal to torchvision's, a file of another architecture named as such,
//! truncated files refused, nothing written on a refusal), copies it into the model directory,
//! and training starts from it (a new, seeded head when the classes differ); a trained model
//! directory given to `--model` starts training from its weights too.
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);

/// Python writes seeded torchvision `state_dict`s as safetensors: `ARCH:CLASSES:FILE ...`.
fn torchvision_weights(dir: &Path, specs: &[(&str, usize, &str)]) {
    let list: Vec<String> = specs
        .iter()
        .map(|(a, c, f)| format!("('{a}', {c}, '{}')", dir.join(f).display()))
        .collect();
    let code = format!(
        "import torch, torchvision\n\
         from safetensors.torch import save_file\n\
         torch.manual_seed(0)\n\
         for arch, classes, path in [{}]:\n\
         \x20   save_file(getattr(torchvision.models, arch)(num_classes=classes).state_dict(), path)\n",
        list.join(", ")
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

fn init(arch: &str, weights: &Path, out: &Path) -> Run {
    run(&mut init_with_weights(arch, weights, out), LIMIT)
}

/// One epoch on the small digits at an LR so small (1e-15) that no weight moves measurably:
/// the trained model shows where training started.
fn train_still(model: &Path, out: &Path) -> Run {
    let d = small_digits();
    run(
        tchrun_train(model, &d.join("train"), &d.join("valid"), out).args([
            "--epochs",
            "1",
            "--batch-size",
            "40",
            "--lr",
            "1e-15",
            "--no-hflip",
        ]),
        LIMIT,
    )
}

/// `tchrun::weights::spec` is torchvision's `state_dict` for every architecture (names and
/// shapes, in order), as torchvision itself lists it (each model built on the meta device by
/// `parity.py`'s `meta`: RegNet's `BlockParams` on the CPU, as torchvision computes them).
#[test]
fn weight_spec_equals_torchvision_state_dicts() {
    use tchrun::model::Arch;
    let names: Vec<String> = Arch::ALL
        .iter()
        .map(|a| format!("'{}'", a.name()))
        .collect();
    let code = format!(
        "import json, sys\n\
         sys.path.insert(0, '{}')\n\
         from parity import meta\n\
         out = {{}}\n\
         for a in [{}]:\n\
         \x20   m = meta(a, num_classes=7)\n\
         \x20   out[a] = [[k, list(v.shape)] for k, v in m.state_dict().items()]\n\
         print(json.dumps(out))\n",
        repo().join("tests/python").display(),
        names.join(",")
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let tv: serde_json::Value = serde_json::from_str(r.stdout.trim()).expect("json");
    for arch in Arch::ALL {
        let want: Vec<(String, Vec<usize>)> = tv[arch.name()]
            .as_array()
            .expect("arch listed")
            .iter()
            .map(|e| {
                let name = e[0].as_str().expect("name").to_string();
                let shape = e[1]
                    .as_array()
                    .expect("shape")
                    .iter()
                    .map(|d| d.as_u64().expect("dim") as usize)
                    .collect();
                (name, shape)
            })
            .collect();
        assert_eq!(tchrun::weights::spec(arch, 7), want, "{}", arch.name());
    }
}

#[test]
fn model_init_checks_weights_and_training_starts_from_them() {
    let t = tempdir();
    torchvision_weights(
        t.path(),
        &[
            ("resnet18", 1000, "r18.safetensors"),
            ("densenet121", 3, "d121.safetensors"),
        ],
    );
    // Another architecture's file: exit 2, named, the right --arch suggested, nothing written.
    let bad = t.path().join("bad");
    let r = init("resnet18", &t.path().join("d121.safetensors"), &bad);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("d121.safetensors")
            && r.stderr
                .contains("looks like a densenet121 state_dict: use --arch densenet121"),
        "{}",
        r.explain()
    );
    assert!(!bad.exists(), "nothing may be written on a refusal");
    // Truncated: exit 2, named.
    let full = std::fs::read(t.path().join("r18.safetensors")).expect("weights");
    let cut = t.path().join("cut.safetensors");
    std::fs::write(&cut, &full[..full.len() / 2]).expect("write");
    let r = init("resnet18", &cut, &bad);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("cut.safetensors")
            && r.stderr.contains("not a complete safetensors file"),
        "{}",
        r.explain()
    );
    assert!(!bad.exists());
    // The right architecture: accepted, copied, recorded.
    let ok = init(
        "densenet121",
        &t.path().join("d121.safetensors"),
        &t.path().join("d"),
    );
    assert_eq!(ok.code, Some(0), "{}", ok.explain());
    let model = t.path().join("m");
    let r = init("resnet18", &t.path().join("r18.safetensors"), &model);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_eq!(
        std::fs::read(model.join("model.safetensors")).expect("copied"),
        full,
        "the model directory holds the weights"
    );
    let cfg: serde_json::Value =
        serde_json::from_str(&read(&model.join("model.json"))).expect("model.json");
    assert_eq!(cfg["initial_weights"]["file"], "r18.safetensors");
    assert_eq!(cfg["initial_weights"]["head_classes"], 1000);
    assert_eq!(
        cfg["initial_weights"]["sha256"].as_str().map(|s| s.len()),
        Some(64)
    );

    // Training starts from the file: a new head for the 10 digit classes, and at an LR so
    // small that no weight moves measurably, the backbone ends where the file began.
    let out = t.path().join("out");
    let r = train_still(&model, &out);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("initial weights from")
            && r.stdout
                .contains("a new head (fc) for 10 classes (the file's has 1000)"),
        "{}",
        r.explain()
    );
    let py = format!(
        "from safetensors.torch import load_file\n\
         a = load_file('{}'); b = load_file('{}')\n\
         d = max((a[k] - b[k]).abs().max().item() for k in a if k.endswith('conv1.weight') or k.endswith('conv2.weight'))\n\
         print('max conv diff', d)\n\
         assert d < 1e-6, d\n\
         assert b['fc.weight'].shape == (10, 512)\n",
        t.path().join("r18.safetensors").display(),
        out.join("model.safetensors").display()
    );
    let c = run(python().arg("-c").arg(py), LIMIT);
    assert_eq!(c.code, Some(0), "{}", c.explain());
    let trained: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
    assert_eq!(trained["initial_weights"]["file"], "r18.safetensors");

    // A trained model directory given to --model: training starts from its weights (10
    // classes again: the head is kept), and the new model says where it came from.
    let again = t.path().join("again");
    let r = train_still(&out, &again);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("initial weights from") && !r.stdout.contains("a new head"),
        "{}",
        r.explain()
    );
    let m: serde_json::Value =
        serde_json::from_str(&read(&again.join("model.json"))).expect("model.json");
    assert_eq!(m["initial_weights"]["trained_model"], true);
}

/// `--zero-init-residual` (torchvision's `zero_init_residual=True`): the last batch-norm weight
/// of every residual block starts at zero, which training with a negligible LR keeps; the other
/// batch-norm weights do not; DenseNet (no residual blocks) and ConvNeXt refuse the flag.
#[test]
fn zero_init_residual_starts_every_block_as_the_identity() {
    let t = tempdir();
    let model = t.path().join("m");
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                "resnet18",
                "--input-size",
                "32",
                "--zero-init-residual",
                "--output",
            ])
            .arg(&model),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let out = t.path().join("out");
    let r = train_still(&model, &out);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let py = format!(
        "from safetensors.torch import load_file\n\
         w = load_file('{}')\n\
         last = [k for k in w if k.startswith('layer') and k.endswith('.bn2.weight')]\n\
         assert len(last) == 8, last\n\
         assert all(w[k].abs().max().item() < 1e-6 for k in last)\n\
         assert all(w[k].abs().max().item() > 0.01 for k in w if k.endswith('.bn1.weight'))\n\
         print('zeroed', len(last))\n",
        out.join("model.safetensors").display()
    );
    let c = run(python().arg("-c").arg(py), LIMIT);
    assert_eq!(c.code, Some(0), "{}", c.explain());
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                "densenet121",
                "--zero-init-residual",
                "--output",
            ])
            .arg(t.path().join("dn")),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("ResNet only"), "{}", r.explain());
    assert!(!t.path().join("dn").exists());
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                "convnext_tiny",
                "--zero-init-residual",
                "--output",
            ])
            .arg(t.path().join("cnx")),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(
            "--zero-init-residual: convnext_tiny is not a ResNet (ResNet only); leave the flag out"
        ),
        "{}",
        r.explain()
    );
}

/// A `.pth` torchvision wrote for `arch` (seeded, 1000 classes): refused as each of `refusals`
/// (an architecture and what its message says) before anything is written, the message
/// naming `arch`; as `arch`, fine-tuned on 4 digits of each class at 32 px (one epoch, 2 steps,
/// with the family's dropout and stochastic depth): a new head `head` (a Linear of `head_in`
/// inputs) for 10 classes, each tensor of `moved` trained from the file's value, and the
/// trained `state_dict` loads into torchvision's `arch` with `strict=True`.
fn pth_is_fine_tuned_with_a_new_head(
    arch: &str,
    refusals: &[(&str, &str)],
    head: &str,
    head_in: usize,
    moved: &[&str],
) {
    let t = tempdir();
    let pth = t.path().join(format!("{arch}.pth"));
    let code = format!(
        "import torch, torchvision\n\
         torch.manual_seed(0)\n\
         torch.save(torchvision.models.{arch}().state_dict(), '{}')\n",
        pth.display()
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let bad = t.path().join("bad");
    for (other, detail) in refusals {
        let r = init(other, &pth, &bad);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        let want = format!(
            "--weights {}: {detail}; the file looks like a {arch} state_dict: use --arch {arch}",
            pth.display()
        );
        assert!(r.stderr.contains(&want), "{want}\n{}", r.explain());
        assert!(!bad.exists(), "nothing may be written on a refusal");
    }
    let model = t.path().join("m");
    let r = init(arch, &pth, &model);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let train = subset(&digits().join("train"), &t.path().join("train"), 4, 0);
    let valid = subset(&digits().join("valid"), &t.path().join("valid"), 2, 0);
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &train, &valid, &out).args([
            "--epochs",
            "1",
            "--batch-size",
            "20",
            "--lr",
            "0.01",
        ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let note = format!("a new head ({head}) for 10 classes (the file's has 1000)");
    assert!(r.stdout.contains(&note), "{note}\n{}", r.explain());
    let moved: Vec<String> = moved.iter().map(|k| format!("'{k}'")).collect();
    let py = format!(
        "import torch, torchvision\n\
         from safetensors.torch import load_file\n\
         a = torch.load('{}'); b = load_file('{}')\n\
         assert b['{head}.weight'].shape == (10, {head_in}), b['{head}.weight'].shape\n\
         moved = [k for k in a if not k.startswith('{head}.') and not torch.equal(a[k], b[k])]\n\
         for k in [{}]:\n\
         \x20   assert k in moved, (k, moved[:5])\n\
         assert all(torch.isfinite(v).all() for v in b.values())\n\
         m = torchvision.models.{arch}(num_classes=10)\n\
         m.load_state_dict(b, strict=True)\n\
         print('fine-tuned', len(moved), 'tensors')\n",
        pth.display(),
        out.join("model.safetensors").display(),
        moved.join(", "),
    );
    let c = run(python().arg("-c").arg(py), LIMIT);
    assert_eq!(c.code, Some(0), "{}", c.explain());
}

/// ConvNeXt (convnext_tiny) refused as another ConvNeXt size and as a ResNet; fine-tuned with a
/// new head `classifier.2`, `classifier.0` (the last LayerNorm) kept from the file and trained
/// with the rest.
#[test]
fn convnext_pth_is_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    pth_is_fine_tuned_with_a_new_head(
        "convnext_tiny",
        &[
            (
                "convnext_small",
                "it lacks 'features.5.9.layer_scale', which convnext_small needs",
            ),
            ("resnet50", "it lacks 'fc.weight', which resnet50 needs"),
        ],
        "classifier.2",
        768,
        &["classifier.0.weight", "features.0.0.weight"],
    );
}

/// EfficientNet (efficientnet_b0) refused as another EfficientNet size (B1: one more block per
/// stage; V2-S: another stem), as EfficientNetV2 and as ConvNeXt; fine-tuned with a new head
/// `classifier.1`, the backbone (batch norms and squeeze-and-excitations too) trained from the
/// file's weights.
#[test]
fn efficientnet_pth_is_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    pth_is_fine_tuned_with_a_new_head(
        "efficientnet_b0",
        &[
            (
                "efficientnet_b1",
                "it lacks 'features.1.1.block.0.0.weight', which efficientnet_b1 needs",
            ),
            (
                "efficientnet_v2_s",
                "tensor 'features.0.0.weight' has shape [32, 3, 3, 3], efficientnet_v2_s needs \
                 [24, 3, 3, 3]",
            ),
            (
                "convnext_tiny",
                "it lacks 'classifier.2.weight', which convnext_tiny needs",
            ),
        ],
        "classifier.1",
        1280,
        &[
            "features.0.0.weight",
            "features.0.1.running_mean",
            "features.8.1.weight",
            "features.2.0.block.2.fc1.bias",
        ],
    );
}

/// MobileNetV3 (mobilenet_v3_small) refused as mobilenet_v3_large (another table), as
/// EfficientNet and as ResNet; fine-tuned with a new head `classifier.3`, the hidden Linear
/// `classifier.0` kept from the file and trained with the backbone (batch norms and
/// squeeze-and-excitations too).
#[test]
fn mobilenet_pth_is_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    pth_is_fine_tuned_with_a_new_head(
        "mobilenet_v3_small",
        &[
            (
                "mobilenet_v3_large",
                "it lacks 'features.1.block.1.0.weight', which mobilenet_v3_large needs",
            ),
            (
                "efficientnet_b0",
                "it lacks 'classifier.1.weight', which efficientnet_b0 needs",
            ),
            ("resnet18", "it lacks 'fc.weight', which resnet18 needs"),
        ],
        "classifier.3",
        1024,
        &[
            "features.0.0.weight",
            "features.0.1.running_mean",
            "features.1.block.1.fc1.bias",
            "features.12.1.weight",
            "classifier.0.weight",
        ],
    );
}

/// RegNet (regnet_y_400mf) refused as regnet_x_400mf (other widths, no squeeze-and-excitation),
/// as regnet_y_1_6gf (the same first width in groups of 24, not 8) and as ResNet (whose head is
/// `fc` too), naming regnet_y_400mf; fine-tuned with a new head `fc`, the backbone (stem,
/// projections, grouped convolutions, batch norms and squeeze-and-excitations) trained from the
/// file's weights.
#[test]
fn regnet_pth_is_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    pth_is_fine_tuned_with_a_new_head(
        "regnet_y_400mf",
        &[
            (
                "regnet_x_400mf",
                "tensor 'trunk_output.block1.block1-0.proj.0.weight' has shape [48, 32, 1, 1], \
                 regnet_x_400mf needs [32, 32, 1, 1]",
            ),
            (
                "regnet_y_1_6gf",
                "tensor 'trunk_output.block1.block1-0.f.b.0.weight' has shape [48, 8, 3, 3], \
                 regnet_y_1_6gf needs [48, 24, 3, 3]",
            ),
            ("resnet18", "it lacks 'conv1.weight', which resnet18 needs"),
        ],
        "fc",
        440,
        &[
            "stem.0.weight",
            "stem.1.running_mean",
            "trunk_output.block1.block1-0.proj.0.weight",
            "trunk_output.block2.block2-1.f.b.0.weight",
            "trunk_output.block3.block3-0.f.se.fc1.bias",
            "trunk_output.block4.block4-5.f.c.1.weight",
        ],
    );
}

/// Swin (swin_t, its checkpoint for 224 px made at 32 px: the bias tables depend on the 7x7
/// window, not the input size, so nothing is resampled) refused as swin_s (more blocks), swin_b
/// (wider), a ViT and ConvNeXt, naming swin_t; fine-tuned with a new head `head`, with its
/// stochastic depth on, the backbone (patch embedding, bias tables, patch mergings, the last
/// LayerNorm) trained from the file's weights; the trained `state_dict` (with the
/// `relative_position_index` buffers tchrun writes) loads into torchvision strictly.
#[test]
fn swin_pth_is_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    pth_is_fine_tuned_with_a_new_head(
        "swin_t",
        &[
            (
                "swin_s",
                "it lacks 'features.5.6.norm1.weight', which swin_s needs",
            ),
            (
                "swin_b",
                "tensor 'features.0.0.weight' has shape [96, 3, 4, 4], swin_b needs \
                 [128, 3, 4, 4]",
            ),
            (
                "vit_b_16",
                "it lacks 'heads.head.weight', which vit_b_16 needs",
            ),
            (
                "convnext_tiny",
                "it lacks 'classifier.2.weight', which convnext_tiny needs",
            ),
        ],
        "head",
        768,
        &[
            "features.0.0.weight",
            "features.1.0.attn.relative_position_bias_table",
            "features.2.reduction.weight",
            "features.7.1.mlp.3.weight",
            "norm.weight",
        ],
    );
}

/// A Vision Transformer from a torchvision `.pth` (vit_b_32 at torchvision's 224 px): refused
/// as another ViT or family, naming vit_b_32; refused at an input size that is no multiple of
/// its patch, naming the patch size; made at 32 px with its positional embedding resampled
/// (`model.json` says from which size), fine-tuned on the digits with a new `heads.head`, and
/// the trained `state_dict` loads into torchvision's `vit_b_32(image_size=32)` with
/// `strict=True`. A training crop of another size than the model's is refused before any rank
/// starts.
#[test]
fn vit_pth_is_resampled_fine_tuned_with_a_new_head_and_refused_as_another_architecture() {
    let t = tempdir();
    let pth = t.path().join("vit.pth");
    let code = format!(
        "import torch, torchvision\n\
         torch.manual_seed(0)\n\
         torch.save(torchvision.models.vit_b_32().state_dict(), '{}')\n",
        pth.display()
    );
    let r = run(python().arg("-c").arg(code), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let bad = t.path().join("bad");
    for (arch, detail) in [
        (
            "vit_b_16",
            "tensor 'conv_proj.weight' has shape [768, 3, 32, 32], vit_b_16 needs [768, 3, 16, 16]",
        ),
        (
            "vit_l_16",
            "tensor 'class_token' has shape [1, 1, 768], vit_l_16 needs [1, 1, 1024]",
        ),
        (
            "convnext_tiny",
            "it lacks 'classifier.2.weight', which convnext_tiny needs",
        ),
    ] {
        let r = init(arch, &pth, &bad);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        let want = format!(
            "--weights {}: {detail}; the file looks like a vit_b_32 state_dict: use --arch \
             vit_b_32",
            pth.display()
        );
        assert!(r.stderr.contains(&want), "{want}\n{}", r.explain());
        assert!(!bad.exists(), "nothing may be written on a refusal");
    }
    let r = run(
        tchrun()
            .args(["model", "init", "--arch", "vit_b_32", "--input-size", "48"])
            .arg("--weights")
            .arg(&pth)
            .arg("--output")
            .arg(&bad),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(
            "input size 48 does not divide by vit_b_32's patch size 32 (a Vision Transformer \
             takes whole 32x32 patches); use 32 or 64"
        ),
        "{}",
        r.explain()
    );
    assert!(!bad.exists(), "nothing may be written on a refusal");
    let model = t.path().join("m");
    let r = init("vit_b_32", &pth, &model);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(
            "vit_b_32: the positional embedding of the 224x224 checkpoint resampled for 32x32"
        ),
        "{}",
        r.explain()
    );
    let json: serde_json::Value =
        serde_json::from_str(&read(&model.join("model.json"))).expect("model.json");
    let initial = &json["initial_weights"];
    assert_eq!(initial["image_size"], 224, "{json}");
    assert_eq!(initial["pos_embedding_interpolated"], true, "{json}");
    let train = subset(&digits().join("train"), &t.path().join("train"), 4, 0);
    let valid = subset(&digits().join("valid"), &t.path().join("valid"), 2, 0);
    let out = t.path().join("out");
    let args = ["--epochs", "1", "--batch-size", "20", "--lr", "0.01"];
    let r = run(
        tchrun_train(&model, &train, &valid, &out)
            .args(args)
            .args(["--train-crop-size", "64"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--train-crop-size 64: vit_b_32 is built for its model's input size, 32"),
        "{}",
        r.explain()
    );
    let r = run(tchrun_train(&model, &train, &valid, &out).args(args), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains("a new head (heads.head) for 10 classes (the file's has 1000)"),
        "{}",
        r.explain()
    );
    let py = format!(
        "import torch, torchvision\n\
         from safetensors.torch import load_file\n\
         a = torch.load('{}'); b = load_file('{}')\n\
         assert b['heads.head.weight'].shape == (10, 768)\n\
         assert b['encoder.pos_embedding'].shape == (1, 2, 768)\n\
         moved = [k for k in b if not k.startswith('heads.') and k != 'encoder.pos_embedding' and not torch.equal(a[k], b[k])]\n\
         for k in ['conv_proj.weight', 'class_token', 'encoder.layers.encoder_layer_0.self_attention.in_proj_weight', 'encoder.ln.weight']:\n\
         \x20   assert k in moved, (k, moved[:5])\n\
         assert all(torch.isfinite(v).all() for v in b.values())\n\
         m = torchvision.models.vit_b_32(num_classes=10, image_size=32)\n\
         m.load_state_dict(b, strict=True)\n\
         print('fine-tuned', len(moved), 'tensors')\n",
        pth.display(),
        out.join("model.safetensors").display()
    );
    let c = run(python().arg("-c").arg(py), LIMIT);
    assert_eq!(c.code, Some(0), "{}", c.explain());
}

/// The digits of classes `lo..lo + 5` of `split`, at most `per_class` images each, copied to
/// `dst/<class>` (class names kept: "5" stays "5").
fn five_digits(split: &str, lo: usize, per_class: usize, dst: &Path) -> std::path::PathBuf {
    let src = digits().join(split);
    for c in lo..lo + 5 {
        let to = dst.join(c.to_string());
        std::fs::create_dir_all(&to).expect("mkdir");
        let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(src.join(c.to_string()))
            .expect("class dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        for f in files.into_iter().take(per_class) {
            std::fs::copy(&f, to.join(f.file_name().expect("name"))).expect("copy");
        }
    }
    dst.to_path_buf()
}

fn top1(out: &Path) -> f64 {
    let m: serde_json::Value =
        serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
    m["metrics"]["top1"].as_f64().expect("top1")
}

/// Transfer that shows: resnet18 pretrained on digits 0–4, then fine-tuned on digits 5–9 (a
/// trained model directory with other classes: a new 5-class head), beats the same budget from
/// random initialization. `--freeze-backbone` (at 2 ranks) keeps every backbone tensor bit for
/// bit, batch-norm statistics included, while the head learns; `--backbone-lr-scale 0` keeps the
/// backbone's weights but not its batch-norm statistics (batch norm still trains).
#[test]
#[ignore = "issue 52: after the stem fix (fac4d76) from-scratch training beat the in-test pretraining here once (0.51 vs 0.36); the pretraining recipe must be re-derived"]
fn pretrained_digits_transfer_and_freeze_backbone_keeps_the_backbone() {
    let t = tempdir();
    let p = t.path();
    const FLAGS: &[&str] = &[
        "--min-crop-scale",
        "0.5",
        "--no-hflip",
        "--print-freq",
        "50",
    ];
    let pre = p.join("pre");
    let untrained = model_dir(p, "resnet18", 32);
    let r = run(
        tchrun_train(
            &untrained,
            &five_digits("train", 0, usize::MAX, &p.join("a/train")),
            &five_digits("valid", 0, usize::MAX, &p.join("a/valid")),
            &pre,
        )
        .args(["--epochs", "3", "--batch-size", "32", "--lr", "0.05"])
        .args(FLAGS),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // Few images of the new classes: what the backbone already knows is what helps.
    let (ft_train, ft_valid) = (
        five_digits("train", 5, 20, &p.join("b/train")),
        five_digits("valid", 5, usize::MAX, &p.join("b/valid")),
    );
    let budget = |model: &Path, out: &Path, extra: &[&str], ranks: &str| {
        // The head alone (a linear layer on fixed features) gets 3 short epochs: 5 steps of
        // one epoch leave it at the mercy of the features' rounding (the memory format, the
        // optimizer kernel), 15 do not.
        let (lr, epochs) = if extra.contains(&"--freeze-backbone") {
            ("0.05", "3")
        } else {
            ("0.02", "1")
        };
        run(
            tchrun_train(model, &ft_train, &ft_valid, out)
                .args(["--epochs", epochs, "--batch-size", "10", "--lr", lr])
                .args(["--procs-per-node", ranks])
                .args(FLAGS)
                .args(extra),
            LIMIT,
        )
    };
    let (tuned, scratch) = (p.join("tuned"), p.join("scratch"));
    let r = budget(&pre, &tuned, &[], "1");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(
            "a new head (fc) for 5 classes (the model's classes are not the training set's)"
        ),
        "{}",
        r.explain()
    );
    let r = budget(&untrained, &scratch, &[], "1");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let (t_tuned, t_scratch) = (top1(&tuned), top1(&scratch));
    eprintln!("top-1 after one epoch: fine-tuned {t_tuned:.3}, from scratch {t_scratch:.3}");
    assert!(
        t_tuned > t_scratch + 0.1,
        "fine-tuned top-1 {t_tuned} is not clearly above random initialization's {t_scratch}"
    );

    let frozen = p.join("frozen");
    let r = budget(&pre, &frozen, &["--freeze-backbone"], "2");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("--freeze-backbone: training fc only"),
        "{}",
        r.explain()
    );
    let m: serde_json::Value =
        serde_json::from_str(&read(&frozen.join("model.json"))).expect("model.json");
    assert_eq!(m["training"]["freeze_backbone"], true);
    // Clearly above what the whole network learns from scratch in one epoch (chance is 0.2).
    assert!(
        top1(&frozen) > t_scratch + 0.15,
        "the head alone should learn the new digits: top-1 {} (from scratch {t_scratch})",
        top1(&frozen)
    );
    let scaled = p.join("scaled");
    let r = budget(&pre, &scaled, &["--backbone-lr-scale", "0"], "1");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let py = format!(
        "import torch\n\
         from safetensors.torch import load_file\n\
         pre = load_file('{}'); fr = load_file('{}'); sc = load_file('{}')\n\
         back = [k for k in pre if not k.startswith('fc.') and not k.endswith('num_batches_tracked')]\n\
         same = [k for k in back if torch.equal(pre[k], fr[k])]\n\
         assert len(same) == len(back), [k for k in back if k not in same][:5]\n\
         assert not torch.equal(pre['fc.weight'], fr['fc.weight'])\n\
         w = [k for k in back if not k.endswith(('running_mean', 'running_var'))]\n\
         assert all(torch.equal(pre[k], sc[k]) for k in w), 'scale 0 moved a backbone weight'\n\
         assert any(not torch.equal(pre[k], sc[k]) for k in back if k.endswith('running_mean'))\n\
         assert not torch.equal(pre['fc.weight'], sc['fc.weight'])\n\
         print('frozen backbone tensors identical:', len(same))\n",
        pre.join("model.safetensors").display(),
        frozen.join("model.safetensors").display(),
        scaled.join("model.safetensors").display()
    );
    let c = run(python().arg("-c").arg(py), LIMIT);
    assert_eq!(c.code, Some(0), "{}", c.explain());
}

/// An unknown architecture name: exit 2, the valid names listed, nothing written.
#[test]
fn unknown_architecture_lists_the_valid_ones() {
    let t = tempdir();
    let out = t.path().join("m");
    let r = run(
        tchrun()
            .args(["model", "init", "--arch", "vgg16", "--output"])
            .arg(&out),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    for name in [
        "vgg16",
        "resnext101_32x8d",
        "wide_resnet50_2",
        "densenet201",
        "convnext_tiny",
        "convnext_large",
        "efficientnet_b0",
        "efficientnet_v2_l",
        "vit_b_16",
        "vit_l_16",
        "mobilenet_v3_small",
        "mobilenet_v3_large",
        "regnet_y_400mf",
        "regnet_x_32gf",
        "swin_t",
        "swin_b",
    ] {
        assert!(r.stderr.contains(name), "{}", r.explain());
    }
    assert!(!out.exists());
}
