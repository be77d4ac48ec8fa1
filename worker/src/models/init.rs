//! torchvision's initialisation of the layers it builds from scratch (tch's layer defaults
//! differ: batch-norm weights Uniform(0, 1), convolutions Kaiming-uniform, linear weights
//! Kaiming-uniform with the ReLU gain). So `model init` without `--weights` starts training
//! where PyTorch starts it:
//! * ResNet/ResNeXt/Wide ResNet convolutions: `kaiming_normal_(mode="fan_out",
//!   nonlinearity="relu")`; DenseNet's: `kaiming_normal_()` (fan in, gain √2).
//! * Batch norm: weight 1, bias 0 (and zero-init residual when asked: `zero_init_residual`).
//! * The classifier: `nn.Linear`'s own default, weight and bias Uniform(±1/√fan_in)
//!   (`kaiming_uniform_(a=√5)`); DenseNet then sets its bias to 0.
//! * ConvNeXt: every convolution and Linear weight `trunc_normal_(std=0.02)`, every bias 0;
//!   LayerNorm weight 1, bias 0; `layer_scale` 1e-6.
//! * EfficientNet: convolutions `kaiming_normal_(mode="fan_out")` (the squeeze-and-excitation's
//!   biases 0), batch norm 1/0, the head's weight Uniform(±1/√out_features) and bias 0.
//! * ViT (in `vit.rs`): the patch projection N(0, 1/fan_in) (`trunc_normal_`, its bounds beyond
//!   reach), bias 0; class token 0; positional embedding N(0, 0.02²); attention `in_proj`
//!   xavier-uniform, its biases 0, `out_proj.weight` `nn.Linear`'s default; MLP Linears
//!   xavier-uniform with N(0, 1e-6²) biases; LayerNorm 1/0; the head `heads.head` all 0.
//! * MobileNetV3: convolutions `kaiming_normal_(mode="fan_out")` (biases 0), batch norm 1/0,
//!   both Linears (`classifier.0`, `classifier.3`) N(0, 0.01²) with bias 0.
//! * RegNet: convolution weights N(0, 2/fan_out) (`kaiming_normal_(mode="fan_out")`'s law),
//!   the squeeze-and-excitation's biases left at `nn.Conv2d`'s default Uniform(±1/√fan_in),
//!   batch norm 1/0, the head `fc` N(0, 0.01²) with bias 0.
//! * Swin (in `swin.rs`): every Linear `trunc_normal_(std=0.02)` (`trunc_normal`) with bias 0,
//!   the relative position bias tables likewise, LayerNorm 1/0, the patch embedding
//!   convolution `nn.Conv2d`'s default (weight and bias Uniform(±1/√fan_in)).
use tch::nn::{self, init::FanInOut, init::NonLinearity, init::NormalOrUniform, Init};

/// Kaiming normal with the ReLU gain, over fan out (ResNet) or fan in (DenseNet).
pub fn conv(fan: FanInOut) -> Init {
    Init::Kaiming {
        dist: NormalOrUniform::Normal,
        fan,
        non_linearity: NonLinearity::ReLU,
    }
}

/// `nn.Conv2d`'s default bias, Uniform(±1/√fan_in) with `fan_in` the input channels per group
/// times the kernel's area (what RegNet's squeeze-and-excitation keeps).
pub fn conv_default_bias(fan_in: i64) -> Init {
    let bound = 1.0 / (fan_in as f64).sqrt();
    Init::Uniform {
        lo: -bound,
        up: bound,
    }
}

/// torchvision's `nn.init.trunc_normal_(w, std=0.02)` (ConvNeXt): its bounds are the defaults
/// a = -2, b = 2 in absolute terms, 100 standard deviations, which no float32 normal draw
/// reaches, so the law is the normal N(0, 0.02²).
pub fn trunc_normal() -> Init {
    Init::Randn {
        mean: 0.0,
        stdev: 0.02,
    }
}

/// Batch norm as torchvision initialises it: weight 1, bias 0 (torch's defaults otherwise).
pub fn batch_norm() -> nn::BatchNormConfig {
    nn::BatchNormConfig {
        ws_init: Init::Const(1.0),
        bs_init: Init::Const(0.0),
        ..Default::default()
    }
}

/// `nn.Linear`'s default: weight Uniform(±1/√fan_in) (gain √(1/3) on Kaiming-uniform's
/// √(3/fan_in)); bias Uniform(±1/√fan_in) (tch's `bs_init: None`), or 0 with `zero_bias`.
pub fn linear(zero_bias: bool) -> nn::LinearConfig {
    nn::LinearConfig {
        ws_init: Init::Kaiming {
            dist: NormalOrUniform::Uniform,
            fan: FanInOut::FanIn,
            non_linearity: NonLinearity::ExplicitGain((1.0f64 / 3.0).sqrt()),
        },
        bs_init: zero_bias.then_some(Init::Const(0.0)),
        bias: true,
    }
}

/// A Linear whose weight torchvision draws from N(0, std²) and whose bias it zeroes
/// (`nn.init.normal_(m.weight, 0, std)`, `nn.init.zeros_(m.bias)`: MobileNetV3, RegNet).
pub fn linear_normal(std: f64) -> nn::LinearConfig {
    nn::LinearConfig {
        ws_init: Init::Randn {
            mean: 0.0,
            stdev: std,
        },
        bs_init: Some(Init::Const(0.0)),
        bias: true,
    }
}

/// Every tensor of a from-scratch model against torchvision's own from-scratch model
/// (`tests/python/init_reference.py`): one architecture of each code path.
#[cfg(test)]
mod against_torchvision {
    use crate::models::build;
    use tch::{nn, Device};
    use tchrun::model::Arch;

    const ARCHS: [Arch; 14] = [
        Arch::Resnet18,
        Arch::Resnet50,
        Arch::Resnext50_32x4d,
        Arch::Densenet121,
        Arch::ConvnextTiny,
        Arch::EfficientnetB0,
        Arch::EfficientnetV2S,
        Arch::MobilenetV3Small,
        Arch::MobilenetV3Large,
        Arch::RegnetY400mf,
        Arch::RegnetX400mf,
        Arch::VitB32,
        Arch::SwinT,
        Arch::WideResnet50_2,
    ];

    /// Every tensor of each architecture, whatever its size (the 9 408-value ResNet stem, a
    /// bias of 10 values), is drawn from torchvision's law: the constants equal, every other
    /// tensor passes the two-sample Kolmogorov-Smirnov test against torchvision's tensor of the
    /// same name (p ≥ 1e-6, `init_reference.py`), and no tensor of torchvision's is missing.
    #[test]
    fn every_tensor_follows_torchvisions_law() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("tchrun-init-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for (i, arch) in ARCHS.iter().enumerate() {
            tch::manual_seed(10 + i as i64);
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = build(*arch, &vs.root(), 10, 32, false);
            vs.save(dir.join(format!("{}.safetensors", arch.name())))
                .expect("save");
        }
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let out = std::process::Command::new(root.join(".venv/bin/python"))
            .arg(root.join("tests/python/init_reference.py"))
            .args(["32", "10"])
            .arg(&dir)
            .output()
            .expect("the venv's python (scripts/setup.sh)");
        let _ = std::fs::remove_dir_all(&dir);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        for arch in ARCHS {
            let r = &v[arch.name()];
            let compared = r["compared"].as_u64().expect("compared");
            assert!(
                compared > 10,
                "{}: {compared} tensors compared",
                arch.name()
            );
            for list in ["differ", "missing", "extra"] {
                assert_eq!(
                    r[list].as_array().map_or(0, Vec::len),
                    0,
                    "{}: {list}: {}",
                    arch.name(),
                    r[list]
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::models::build;
    use tch::{nn, Device, Kind};
    use tchrun::model::Arch;

    /// The standard deviation and the largest magnitude of a tensor.
    fn stats(t: &tch::Tensor) -> (f64, f64) {
        (
            t.to_kind(Kind::Double).std(true).double_value(&[]),
            t.abs().max().double_value(&[]),
        )
    }

    /// Whether a sample standard deviation `std` of `n` values is `want` within sampling
    /// error: the relative standard error of a sample's std is √((κ − 1)/(4n)) for a law of
    /// kurtosis κ (3 normal, 1.8 uniform); 6 standard errors (with the normal's κ, the larger)
    /// fail a correct tensor with probability 2e-9, and a law off by a factor 4.6 (a stem drawn
    /// over fan in for fan out, 9 408 values: 4.4 % allowed) on any tensor of 20 values or more.
    fn std_within_sampling_error(std: f64, want: f64, n: i64) -> bool {
        let se = (2.0 / (4.0 * n as f64)).sqrt();
        (std / want - 1.0).abs() <= 6.0 * se
    }

    #[test]
    fn the_sampling_error_bound_fails_a_fan_in_stem_and_passes_a_fan_out_one() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(3);
        // resnet18's stem: 64 x 3 x 7 x 7 = 9 408 values; torchvision's law N(0, 2/3136).
        let want = (2.0f64 / 3136.0).sqrt();
        let right = tch::Tensor::randn([64, 3, 7, 7], (Kind::Float, Device::Cpu)) * want;
        let wrong =
            tch::Tensor::randn([64, 3, 7, 7], (Kind::Float, Device::Cpu)) * (2.0f64 / 147.0).sqrt();
        assert!(std_within_sampling_error(stats(&right).0, want, 9408));
        assert!(!std_within_sampling_error(stats(&wrong).0, want, 9408));
    }

    /// A from-scratch model's tensors follow torchvision's rules: every convolution, whatever
    /// its size (the 9 408-value stem too), with the standard deviation torchvision draws from
    /// within sampling error (`std_within_sampling_error`).
    #[test]
    fn from_scratch_models_are_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for (arch, conv_fan_out, bias_zero) in [
            ("resnet18", true, false),
            ("resnext50_32x4d", true, false),
            ("densenet121", false, true),
        ] {
            tch::manual_seed(1);
            let vs = nn::VarStore::new(Device::Cpu);
            let arch = Arch::from_name(arch).expect("arch");
            let _model = build(arch, &vs.root(), 10, 32, false);
            let vars = vs.variables();
            let mut convs = 0;
            for (name, t) in &vars {
                let dims = t.size();
                if dims.len() == 4 {
                    let rf: i64 = dims[2] * dims[3];
                    let fan = if conv_fan_out {
                        dims[0] * rf
                    } else {
                        dims[1] * rf
                    };
                    let want = (2.0 / fan as f64).sqrt();
                    let (std, _) = stats(t);
                    assert!(
                        std_within_sampling_error(std, want, t.numel() as i64),
                        "{arch:?} {name}: std {std}, torchvision {want}"
                    );
                    convs += 1;
                } else if name.ends_with(".weight") && dims.len() == 1 {
                    assert!(
                        bool::try_from(t.eq(1.0).all()).expect("bool"),
                        "{arch:?} {name}: not all 1"
                    );
                } else if name.ends_with(".bias") && dims.len() == 1 && dims[0] != 10 {
                    assert!(
                        bool::try_from(t.eq(0.0).all()).expect("bool"),
                        "{arch:?} {name}: not all 0"
                    );
                }
            }
            assert!(convs >= 5, "{arch:?}: {convs} convolutions");
            let head = vars
                .iter()
                .find(|(n, t)| n.ends_with(".weight") && t.size().len() == 2 && t.size()[0] == 10)
                .map(|(_, t)| t)
                .expect("the classifier");
            let fan_in = head.size()[1] as f64;
            let (std, max) = stats(head);
            let bound = 1.0 / fan_in.sqrt();
            assert!(
                max <= bound && (std / (bound / 3f64.sqrt()) - 1.0).abs() < 0.05,
                "{arch:?} head: std {std}, max {max}, bound {bound}"
            );
            let bias = vars
                .iter()
                .find(|(n, t)| n.ends_with(".bias") && t.size() == [10])
                .map(|(_, t)| t)
                .expect("the classifier's bias");
            let (_, bmax) = stats(bias);
            if bias_zero {
                assert_eq!(bmax, 0.0, "{arch:?}: DenseNet's classifier bias is 0");
            } else {
                assert!(
                    bmax > 0.0 && bmax <= bound,
                    "{arch:?} bias: {bmax} vs {bound}"
                );
            }
        }
    }

    /// ConvNeXt from scratch, as torchvision initialises it: every convolution and Linear
    /// weight N(0, 0.02²) (every one within sampling error, and no value beyond 10
    /// standard deviations), every bias 0, LayerNorm weights 1, `layer_scale` 1e-6.
    #[test]
    fn convnext_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = build(Arch::ConvnextTiny, &vs.root(), 10, 32, false);
        let mut large = 0;
        for (name, t) in vs.variables() {
            let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
            if name.ends_with("layer_scale") {
                assert!(all(1e-6), "{name}");
            } else if name.ends_with(".bias") {
                assert!(all(0.0), "{name}: not all 0");
            } else if t.dim() == 1 {
                assert!(all(1.0), "{name}: LayerNorm weight not all 1");
            } else {
                let (std, max) = stats(&t);
                assert!(max < 0.2, "{name}: {max}");
                assert!(
                    std_within_sampling_error(std, 0.02, t.numel() as i64),
                    "{name}: std {std}"
                );
                large += 1;
            }
        }
        assert!(large >= 30, "{large} large weights");
    }

    /// EfficientNet from scratch, as `EfficientNet.__init__` initialises it: every convolution
    /// (depthwise ones too) Kaiming normal over fan out, `out_channels * k * k` (each within
    /// sampling error), the squeeze-and-excitation's biases 0, batch
    /// norm 1/0, the head Uniform(±1/√classes) (not `nn.Linear`'s ±1/√fan_in) with bias 0.
    #[test]
    fn efficientnet_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::EfficientnetB0, Arch::EfficientnetV2S] {
            tch::manual_seed(1);
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = build(arch, &vs.root(), 10, 32, false);
            let mut large = 0;
            for (name, t) in vs.variables() {
                let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
                let dims = t.size();
                if name == "classifier.1.weight" {
                    let (std, max) = stats(&t);
                    let bound = 1.0 / 10f64.sqrt();
                    assert!(max <= bound, "{name}: {max}");
                    assert!(
                        (std / (bound / 3f64.sqrt()) - 1.0).abs() < 0.05,
                        "{name}: {std}"
                    );
                } else if name.ends_with(".bias") {
                    assert!(all(0.0), "{arch:?} {name}: not all 0");
                } else if name.ends_with(".weight") && dims.len() == 1 {
                    assert!(all(1.0), "{arch:?} {name}: not all 1");
                } else if dims.len() == 4 {
                    let want = (2.0 / (dims[0] * dims[2] * dims[3]) as f64).sqrt();
                    let (std, _) = stats(&t);
                    assert!(
                        std_within_sampling_error(std, want, t.numel() as i64),
                        "{arch:?} {name}: {std}"
                    );
                    large += 1;
                }
            }
            assert!(large >= 20, "{arch:?}: {large} large convolutions");
        }
    }

    /// ViT from scratch, as `VisionTransformer.__init__`, `MLPBlock` and
    /// `nn.MultiheadAttention` initialise it (vit_b_32 at 32 px: one patch): every rule of
    /// `vit.rs`, the standard deviations within 3 % (5 % on the 1 536 values of the positional
    /// embedding, 10 % on the MLP's biases), the uniform laws within their bounds.
    #[test]
    fn vit_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = build(Arch::VitB32, &vs.root(), 10, 64, false);
        let vars = vs.variables();
        assert_eq!(vars["encoder.pos_embedding"].size(), [1, 5, 768]);
        let (mut uniform, mut normal) = (0, 0);
        for (name, t) in &vars {
            let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
            let (std, max) = stats(t);
            let close = |want: f64, tol: f64| (std / want - 1.0).abs() < tol;
            let uniform_within = |b: f64| max <= b && close(b / 3f64.sqrt(), 0.03);
            let short = name
                .rsplit_once("encoder_layer_")
                .map_or(name.as_str(), |x| x.1);
            let ok = match short {
                "class_token" | "conv_proj.bias" | "heads.head.weight" | "heads.head.bias" => {
                    all(0.0)
                }
                "conv_proj.weight" => close((1.0f64 / 3072.0).sqrt(), 0.03),
                "encoder.pos_embedding" => close(0.02, 0.05),
                _ if short.ends_with("in_proj_bias") || short.ends_with("out_proj.bias") => {
                    all(0.0)
                }
                _ if short.ends_with("in_proj_weight") => {
                    uniform += 1;
                    uniform_within((6.0f64 / (4.0 * 768.0)).sqrt())
                }
                _ if short.ends_with("out_proj.weight") => uniform_within(1.0 / 768f64.sqrt()),
                _ if short.ends_with("mlp.0.weight") || short.ends_with("mlp.3.weight") => {
                    uniform_within((6.0f64 / (768.0 + 3072.0)).sqrt())
                }
                _ if short.ends_with("mlp.0.bias") || short.ends_with("mlp.3.bias") => {
                    normal += 1;
                    close(1e-6, 0.1)
                }
                _ if short.ends_with("ln_1.weight")
                    || short.ends_with("ln_2.weight")
                    || short == "encoder.ln.weight" =>
                {
                    all(1.0)
                }
                _ if short.ends_with(".bias") => all(0.0),
                _ => panic!("{name}: no rule"),
            };
            assert!(ok, "{name}: std {std}, max {max}");
        }
        assert_eq!((uniform, normal), (12, 24));
    }

    /// MobileNetV3 from scratch, as `MobileNetV3.__init__` initialises it: every convolution
    /// (depthwise and squeeze-and-excitation ones too) Kaiming normal over fan out (each within
    /// sampling error), every bias 0, batch norm weights 1, both
    /// Linears N(0, 0.01²).
    #[test]
    fn mobilenet_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::MobilenetV3Small, Arch::MobilenetV3Large] {
            tch::manual_seed(1);
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = build(arch, &vs.root(), 10, 32, false);
            let (mut large, mut linears) = (0, 0);
            for (name, t) in vs.variables() {
                let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
                let dims = t.size();
                if name.ends_with(".bias") {
                    assert!(all(0.0), "{arch:?} {name}: not all 0");
                } else if name.ends_with(".weight") && dims.len() == 1 {
                    assert!(all(1.0), "{arch:?} {name}: not all 1");
                } else if dims.len() == 2 {
                    let (std, _) = stats(&t);
                    assert!(
                        std_within_sampling_error(std, 0.01, t.numel() as i64),
                        "{arch:?} {name}: {std}"
                    );
                    linears += 1;
                } else if dims.len() == 4 {
                    let want = (2.0 / (dims[0] * dims[2] * dims[3]) as f64).sqrt();
                    let (std, _) = stats(&t);
                    assert!(
                        std_within_sampling_error(std, want, t.numel() as i64),
                        "{arch:?} {name}: {std}"
                    );
                    large += 1;
                }
            }
            assert_eq!(linears, 2, "{arch:?}");
            assert!(large >= 10, "{arch:?}: {large} large convolutions");
        }
    }

    /// RegNet from scratch, as `RegNet.__init__` initialises it: every convolution weight
    /// N(0, 2/fan_out) (each within sampling error), batch norm 1/0,
    /// `fc` N(0, 0.01²) (within 5 %: 4 400 values) with bias 0; the Y models'
    /// squeeze-and-excitation biases keep `nn.Conv2d`'s default Uniform(±1/√fan_in), which
    /// `__init__` does not touch: each within its bound and, pooled over the model in units of
    /// their bounds, with the standard deviation 1/√3 within 3 %.
    #[test]
    fn regnet_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::RegnetY400mf, Arch::RegnetX400mf] {
            tch::manual_seed(1);
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = build(arch, &vs.root(), 10, 32, false);
            let vars = vs.variables();
            let (mut large, mut se_biases) = (0, Vec::new());
            for (name, t) in &vars {
                let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
                let dims = t.size();
                if name.contains(".f.se.") && name.ends_with(".bias") {
                    let w = &vars[&name.replace(".bias", ".weight")];
                    let bound = 1.0 / (w.size()[1] as f64).sqrt();
                    let (_, max) = stats(t);
                    assert!(max <= bound && max > 0.0, "{arch:?} {name}: max {max}");
                    se_biases.push(t / bound);
                } else if name.ends_with(".bias") {
                    assert!(all(0.0), "{arch:?} {name}: not all 0");
                } else if name.ends_with(".weight") && dims.len() == 1 {
                    assert!(all(1.0), "{arch:?} {name}: not all 1");
                } else if name == "fc.weight" {
                    let (std, _) = stats(t);
                    assert!((std / 0.01 - 1.0).abs() < 0.05, "{arch:?} {name}: {std}");
                } else if dims.len() == 4 {
                    let want = (2.0 / (dims[0] * dims[2] * dims[3]) as f64).sqrt();
                    let (std, _) = stats(t);
                    assert!(
                        std_within_sampling_error(std, want, t.numel() as i64),
                        "{arch:?} {name}: {std}"
                    );
                    large += 1;
                }
            }
            assert!(large >= 10, "{arch:?}: {large} large convolutions");
            if arch == Arch::RegnetY400mf {
                assert_eq!(se_biases.len(), 2 * 16, "two per block");
                let (std, _) = stats(&tch::Tensor::cat(&se_biases, 0));
                let want = 1.0 / 3f64.sqrt();
                assert!((std / want - 1.0).abs() < 0.03, "{arch:?} SE biases: {std}");
            } else {
                assert!(
                    se_biases.is_empty(),
                    "regnet_x has no squeeze-and-excitation"
                );
            }
        }
    }

    /// Swin from scratch, as `SwinTransformer.__init__` leaves it (its loop over every Linear
    /// runs last, overriding the blocks' own MLP init): every Linear weight (qkv, proj, the MLP,
    /// the patch mergings' reductions, the head) N(0, 0.02²) and every bias 0, the relative
    /// position bias tables N(0, 0.02²), LayerNorm 1/0, the patch embedding `nn.Conv2d`'s
    /// default (weight and bias Uniform(±1/√48)). Standard deviations within sampling error
    /// (`std_within_sampling_error`), each tensor and the 23 322 values of all bias tables together.
    #[test]
    fn swin_is_initialised_as_torchvision_does() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(1);
        let vs = nn::VarStore::new(Device::Cpu);
        let _model = build(Arch::SwinT, &vs.root(), 10, 32, false);
        let close = std_within_sampling_error;
        let (mut linears, mut tables) = (0, Vec::new());
        let conv_bound = 1.0 / 48f64.sqrt();
        for (name, t) in vs.variables() {
            let all = |v: f64| bool::try_from(t.eq(v).all()).expect("bool");
            let (std, max) = stats(&t);
            let ok = match name.as_str() {
                "features.0.0.weight" => {
                    max <= conv_bound && close(std, conv_bound / 3f64.sqrt(), t.numel() as i64)
                }
                "features.0.0.bias" => max <= conv_bound && !all(0.0),
                _ if name.ends_with("relative_position_bias_table") => {
                    tables.push(t.flatten(0, -1));
                    close(std, 0.02, t.numel() as i64)
                }
                _ if name.ends_with(".bias") => all(0.0),
                _ if t.dim() == 1 => all(1.0),
                _ if t.dim() == 2 => {
                    linears += 1;
                    close(std, 0.02, t.numel() as i64)
                }
                _ => panic!("{name}: no rule"),
            };
            assert!(ok, "{name}: std {std}, max {max}");
        }
        // Per block qkv, proj, mlp.0, mlp.3; three reductions; the head.
        assert_eq!((linears, tables.len()), (12 * 4 + 3 + 1, 12));
        let (std, _) = stats(&tch::Tensor::cat(&tables, 0));
        assert!(close(std, 0.02, 23_322), "bias tables: std {std}");
    }
}
