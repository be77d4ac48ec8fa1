//! EfficientNet (B0-B7) and EfficientNetV2 (S, M, L) as torchvision builds them
//! (`torchvision.models.efficientnet.EfficientNet`): the same layers, names and strides, from
//! the one layout `tchrun::arch` computes (`EfficientnetTable::layout`: the block tables, the
//! width and depth multipliers, `_make_divisible`). `features.0` is the stem (3x3 stride-2
//! `Conv2dNormActivation` with SiLU), `features.1` ... the stages of MBConv blocks (1x1
//! expansion, depthwise k x k, squeeze-and-excitation with SiLU and sigmoid, 1x1 projection)
//! or FusedMBConv blocks (k x k expansion, 1x1 projection), each with row-mode stochastic depth
//! on its residual, then the last 1x1 convolution with SiLU; `classifier` is dropout and the
//! Linear head (`classifier.1`). Batch norm takes the size's eps and momentum
//! (`EfficientnetNorm`); from scratch the layers are initialised as `EfficientNet.__init__`
//! does (Kaiming-normal fan-out convolutions, zero biases, batch norm 1/0, the head's weight
//! Uniform(±1/√classes) and bias 0).
use super::blocks::{conv_norm_act, squeeze_excitation, stochastic_depth, Act, Norm};
use tch::{nn, nn::Init, nn::ModuleT};
use tchrun::arch::{EfficientnetNorm, Family, MbBlock};

/// The batch norm of an EfficientNet size.
fn bn(norm: EfficientnetNorm) -> Norm {
    Norm {
        eps: norm.eps(),
        momentum: norm.momentum(),
    }
}

/// torchvision's `MBConv` or `FusedMBConv(cnf, stochastic_depth_prob = drop, norm_layer)`: the
/// layers under `block.K` in order; stochastic depth and the residual only when
/// `use_res_connect`.
fn block(p: nn::Path, b: &MbBlock, norm: EfficientnetNorm, drop: f64) -> impl ModuleT {
    let l = &p / "block";
    let (c_in, mid, c_out) = (b.c_in as i64, b.expanded as i64, b.c_out as i64);
    let k = b.kernel as i64;
    let stride = b.stride as i64;
    let mut layers = nn::seq_t();
    let mut next = {
        let mut i = 0;
        move || {
            i += 1;
            &l / (i - 1).to_string()
        }
    };
    let norm = bn(norm);
    if b.fused && b.expands() {
        layers = layers
            .add(conv_norm_act(
                next(),
                (c_in, mid, k),
                stride,
                1,
                norm,
                Act::Silu,
            ))
            .add(conv_norm_act(
                next(),
                (mid, c_out, 1),
                1,
                1,
                norm,
                Act::None,
            ));
    } else if b.fused {
        layers = layers.add(conv_norm_act(
            next(),
            (c_in, c_out, k),
            stride,
            1,
            norm,
            Act::Silu,
        ));
    } else {
        if b.expands() {
            layers = layers.add(conv_norm_act(next(), (c_in, mid, 1), 1, 1, norm, Act::Silu));
        }
        let squeeze = b.squeeze as i64;
        layers = layers
            .add(conv_norm_act(
                next(),
                (mid, mid, k),
                stride,
                mid,
                norm,
                Act::Silu,
            ))
            .add(squeeze_excitation(
                next(),
                mid,
                squeeze,
                Act::Silu,
                Act::Sigmoid,
            ))
            .add(conv_norm_act(
                next(),
                (mid, c_out, 1),
                1,
                1,
                norm,
                Act::None,
            ));
    }
    let residual = b.residual();
    nn::func_t(move |x, train| {
        let y = x.apply_t(&layers, train);
        if residual {
            stochastic_depth(&y, drop, train) + x
        } else {
            y
        }
    })
}

/// torchvision's `efficientnet_b0` ... `efficientnet_v2_l(num_classes = classes)` for a
/// `Family::Efficientnet`; `stochastic: false` builds every block with drop probability 0 and
/// the head without dropout (the parity test's training step). Panics on another family (a
/// programming error: `models::build` picks).
pub fn efficientnet(p: &nn::Path, family: Family, classes: i64, stochastic: bool) -> impl ModuleT {
    let Family::Efficientnet {
        table,
        dropout_pct,
        norm,
    } = family
    else {
        unreachable!("efficientnet() is only called with an EfficientNet family")
    };
    let layout = table.layout();
    let probs = family.stochastic_depth_probs();
    let f = p / "features";
    let stem = layout.stem as i64;
    let stem = conv_norm_act(&f / "0", (3, stem, 3), 2, 1, bn(norm), Act::Silu);
    let mut features = nn::seq_t().add(stem);
    let mut id = 0;
    for (s, stage) in layout.stages.iter().enumerate() {
        let sp = &f / (s + 1).to_string();
        let mut seq = nn::seq_t();
        for (j, b) in stage.iter().enumerate() {
            let drop = match stochastic {
                true => probs.get(id).copied().unwrap_or(0.0),
                false => 0.0,
            };
            seq = seq.add(block(&sp / j.to_string(), b, norm, drop));
            id += 1;
        }
        features = features.add(seq);
    }
    let last_in = layout
        .stages
        .last()
        .and_then(|s| s.last())
        .map_or(0, |b| b.c_out as i64);
    let last = layout.last as i64;
    let lp = &f / (layout.stages.len() + 1).to_string();
    features = features.add(conv_norm_act(
        lp,
        (last_in, last, 1),
        1,
        1,
        bn(norm),
        Act::Silu,
    ));
    let dropout = match stochastic {
        true => f64::from(dropout_pct) / 100.0,
        false => 0.0,
    };
    let range = 1.0 / (classes as f64).sqrt();
    let head_cfg = nn::LinearConfig {
        ws_init: Init::Uniform {
            lo: -range,
            up: range,
        },
        bs_init: Some(Init::Const(0.0)),
        bias: true,
    };
    let head = nn::linear(p / "classifier" / "1", last, classes, head_cfg);
    nn::func_t(move |x, train| {
        let x = x
            .apply_t(&features, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1);
        let x = match dropout > 0.0 {
            true => x.dropout(dropout, train),
            false => x,
        };
        x.apply(&head)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};
    use tchrun::model::Arch;

    /// Every EfficientNet and EfficientNetV2 size tchrun offers.
    fn efficientnets() -> impl Iterator<Item = Arch> {
        Arch::ALL
            .into_iter()
            .filter(|a| matches!(a.family(), tchrun::model::Family::Efficientnet { .. }))
    }

    /// Every size builds exactly `weights::spec` (torchvision's `state_dict`, checked against
    /// torchvision itself in `tests/finetune.rs::weight_spec_equals_torchvision_state_dicts`):
    /// the same names and shapes, nothing more; B0 and V2-S also run forward at 32 px.
    #[test]
    fn every_size_builds_torchvisions_state_dict() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in efficientnets() {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = efficientnet(&vs.root(), arch.family(), 3, true);
            crate::models::assert_builds_spec(&vs, arch);
            if matches!(arch, Arch::EfficientnetB0 | Arch::EfficientnetV2S) {
                let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
                let y = tch::no_grad(|| net.forward_t(&x, false));
                assert_eq!(y.size(), vec![2, 3], "{}", arch.name());
            }
        }
    }

    /// torchvision's per-block drop probabilities, `0.2 * i / n` for block i of n (16 blocks in
    /// B0, 40 in V2-S, 55 in B7), and its batch-norm settings per size.
    #[test]
    fn block_drop_probabilities_and_batch_norm_follow_torchvision() {
        for (arch, n) in [
            (Arch::EfficientnetB0, 16),
            (Arch::EfficientnetB7, 55),
            (Arch::EfficientnetV2S, 40),
        ] {
            let probs = arch.family().stochastic_depth_probs();
            assert_eq!(probs.len(), n, "{}", arch.name());
            assert_eq!(probs[0], 0.0);
            assert!((probs[n - 1] - 0.2 * (n - 1) as f64 / n as f64).abs() < 1e-15);
        }
        let norm = |a: Arch| match a.family() {
            Family::Efficientnet { norm, .. } => (norm.eps(), norm.momentum()),
            _ => unreachable!(),
        };
        assert_eq!(norm(Arch::EfficientnetB4), (1e-5, 0.1));
        assert_eq!(norm(Arch::EfficientnetB5), (1e-3, 0.01));
        assert_eq!(norm(Arch::EfficientnetV2L), (1e-3, 0.1));
    }
}
