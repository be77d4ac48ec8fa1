//! ConvNeXt as torchvision builds it (`torchvision.models.convnext.ConvNeXt`): the same layers,
//! names and strides. `features.0` is the stem (4x4 stride-4 convolution, LayerNorm2d); the odd
//! `features.N` are the stages of CNBlocks (7x7 depthwise convolution, LayerNorm over channels,
//! Linear to 4x, exact GELU, Linear back, `layer_scale`, stochastic depth in "row" mode, the
//! residual), the even ones the downsamplings (LayerNorm2d, 2x2 stride-2 convolution);
//! `classifier` is LayerNorm2d, flatten and the Linear head (`classifier.2`). Every LayerNorm
//! has eps 1e-6, every `layer_scale` starts at 1e-6; from scratch the convolutions and Linears
//! are initialised as torchvision does (`init::trunc_normal`, zero biases).
use super::blocks::stochastic_depth;
use super::init;
use tch::{nn, nn::Init, nn::ModuleT, Tensor};
use tchrun::model::Family;

/// torchvision's `layer_scale` default.
const LAYER_SCALE: f64 = 1e-6;
/// torchvision's `LayerNorm2d`/`nn.LayerNorm` eps in ConvNeXt.
const EPS: f64 = 1e-6;

fn conv(
    p: nn::Path,
    c_in: i64,
    c_out: i64,
    k: i64,
    stride: i64,
    pad: i64,
    groups: i64,
) -> nn::Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding: pad,
        groups,
        bias: true,
        ws_init: init::trunc_normal(),
        bs_init: Init::Const(0.0),
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, k, cfg)
}

fn linear(p: nn::Path, c_in: i64, c_out: i64) -> nn::Linear {
    let cfg = nn::LinearConfig {
        ws_init: init::trunc_normal(),
        bs_init: Some(Init::Const(0.0)),
        bias: true,
    };
    nn::linear(p, c_in, c_out, cfg)
}

fn layer_norm(p: nn::Path, c: i64) -> nn::LayerNorm {
    let cfg = nn::LayerNormConfig {
        eps: EPS,
        ..Default::default()
    };
    nn::layer_norm(p, vec![c], cfg)
}

/// torchvision's `LayerNorm2d`: LayerNorm over the channels of an (N, C, H, W) tensor.
fn layer_norm_2d(norm: &nn::LayerNorm, x: &Tensor) -> Tensor {
    x.permute([0, 2, 3, 1]).apply(norm).permute([0, 3, 1, 2])
}

/// torchvision's `CNBlock(dim, layer_scale, stochastic_depth_prob = drop)`.
fn block(p: nn::Path, dim: i64, drop: f64) -> impl ModuleT {
    let b = &p / "block";
    let dwconv = conv(&b / "0", dim, dim, 7, 1, 3, dim);
    let norm = layer_norm(&b / "2", dim);
    let fc1 = linear(&b / "3", dim, 4 * dim);
    let fc2 = linear(&b / "5", 4 * dim, dim);
    let scale = p.var("layer_scale", &[dim, 1, 1], Init::Const(LAYER_SCALE));
    nn::func_t(move |x, train| {
        let y = x
            .apply(&dwconv)
            .permute([0, 2, 3, 1])
            .apply(&norm)
            .apply(&fc1)
            .gelu("none")
            .apply(&fc2)
            .permute([0, 3, 1, 2]);
        stochastic_depth(&(&scale * y), drop, train) + x
    })
}

/// A stage of blocks and the downsampling after it (none after the last).
struct Stage {
    blocks: nn::SequentialT,
    down: Option<(nn::LayerNorm, nn::Conv2D)>,
}

/// torchvision's `ConvNeXt(block_setting, stochastic_depth_prob)` for a `Family::Convnext`,
/// with `classes` outputs; `stochastic_depth: false` builds every block with drop probability 0
/// (the parity test's training step). Panics on another family (a programming error:
/// `models::build` picks).
pub fn convnext(
    p: &nn::Path,
    family: Family,
    classes: i64,
    stochastic_depth: bool,
) -> impl ModuleT {
    let Family::Convnext { dims, blocks, .. } = family else {
        unreachable!("convnext() is only called with a ConvNeXt family")
    };
    let probs = family.stochastic_depth_probs();
    let dims = dims.map(|d| d as i64);
    let f = p / "features";
    let stem_conv = conv(&f / "0" / "0", 3, dims[0], 4, 4, 0, 1);
    let stem_norm = layer_norm(&f / "0" / "1", dims[0]);
    let mut stages = Vec::with_capacity(4);
    let mut id = 0;
    for (s, &n) in blocks.iter().enumerate() {
        let sp = &f / (1 + 2 * s).to_string();
        let mut seq = nn::seq_t();
        for j in 0..n {
            let drop = match stochastic_depth {
                true => probs.get(id).copied().unwrap_or(0.0),
                false => 0.0,
            };
            seq = seq.add(block(&sp / j.to_string(), dims[s], drop));
            id += 1;
        }
        let down = dims.get(s + 1).map(|&next| {
            let dp = &f / (2 + 2 * s).to_string();
            (
                layer_norm(&dp / "0", dims[s]),
                conv(&dp / "1", dims[s], next, 2, 2, 0, 1),
            )
        });
        stages.push(Stage { blocks: seq, down });
    }
    let c = p / "classifier";
    let head_norm = layer_norm(&c / "0", dims[3]);
    let head = linear(&c / "2", dims[3], classes);
    nn::func_t(move |x, train| {
        let mut x = layer_norm_2d(&stem_norm, &x.apply(&stem_conv));
        for stage in &stages {
            x = x.apply_t(&stage.blocks, train);
            if let Some((norm, conv)) = &stage.down {
                x = layer_norm_2d(norm, &x).apply(conv);
            }
        }
        let x = x.adaptive_avg_pool2d([1, 1]);
        layer_norm_2d(&head_norm, &x).flatten(1, -1).apply(&head)
    })
}

#[cfg(test)]
mod tests {
    /// The blocks' probabilities are torchvision's: `p * i / (n - 1)` for block i of n, so the
    /// first block never drops and the last drops with the constructor's default.
    #[test]
    fn block_drop_probabilities_follow_torchvisions_defaults() {
        use tchrun::model::Arch;
        for (arch, n, last) in [
            (Arch::ConvnextTiny, 18, 0.1),
            (Arch::ConvnextSmall, 36, 0.4),
            (Arch::ConvnextBase, 36, 0.5),
            (Arch::ConvnextLarge, 36, 0.5),
        ] {
            let probs = arch.family().stochastic_depth_probs();
            assert_eq!(probs.len(), n, "{arch:?}");
            assert_eq!(probs[0], 0.0);
            assert!((probs[n - 1] - last).abs() < 1e-12, "{arch:?}: {probs:?}");
            // torchvision's first nonzero value for convnext_tiny: 0.1 * 1 / 17.
            if n == 18 {
                assert!((probs[1] - 0.1 / 17.0).abs() < 1e-15);
            }
        }
    }
}
