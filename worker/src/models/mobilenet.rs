//! MobileNetV3 (large, small) as torchvision builds it (`torchvision.models.mobilenetv3.
//! MobileNetV3`): the same layers, names and strides, from the one layout `tchrun::arch`
//! computes (`MobilenetTable::layout`). `features.0` is the stem (3x3 stride-2
//! `Conv2dNormActivation` with Hardswish), `features.1` ... the inverted residuals (1x1
//! expansion, depthwise k x k, squeeze-and-excitation with ReLU and Hardsigmoid, 1x1
//! projection; ReLU or Hardswish per block; the input added when stride 1 keeps the width), then
//! the last 1x1 convolution with Hardswish; `classifier` is the hidden Linear
//! (`classifier.0`), Hardswish, dropout 0.2 and the Linear head (`classifier.3`). Batch norm eps
//! 0.001, momentum 0.01. From scratch the layers are initialised as `MobileNetV3.__init__` does
//! (Kaiming-normal fan-out convolutions, zero biases, batch norm 1/0, both Linears N(0, 0.01²)
//! with bias 0).
use super::blocks::{conv_norm_act, squeeze_excitation, Act, Norm};
use super::init;
use tch::{nn, nn::ModuleT};
use tchrun::arch::{Family, IrBlock, MOBILENET_BN_EPS, MOBILENET_BN_MOMENTUM, MOBILENET_DROPOUT};

const NORM: Norm = Norm {
    eps: MOBILENET_BN_EPS,
    momentum: MOBILENET_BN_MOMENTUM,
};

/// torchvision's `InvertedResidual(cnf, norm_layer)`: the layers under `block.K` in order; the
/// residual only when `use_res_connect`.
fn block(p: nn::Path, b: &IrBlock) -> impl ModuleT {
    let l = &p / "block";
    let (c_in, mid, c_out) = (b.c_in as i64, b.expanded as i64, b.c_out as i64);
    let act = if b.hardswish {
        Act::Hardswish
    } else {
        Act::Relu
    };
    let mut layers = nn::seq_t();
    let mut k = 0;
    if b.expands() {
        layers = layers.add(conv_norm_act(&l / "0", (c_in, mid, 1), 1, 1, NORM, act));
        k += 1;
    }
    let dw = (mid, mid, b.kernel as i64);
    layers = layers.add(conv_norm_act(
        &l / k.to_string(),
        dw,
        b.stride as i64,
        mid,
        NORM,
        act,
    ));
    k += 1;
    if let Some(squeeze) = b.squeeze {
        layers = layers.add(squeeze_excitation(
            &l / k.to_string(),
            mid,
            squeeze as i64,
            Act::Relu,
            Act::Hardsigmoid,
        ));
        k += 1;
    }
    layers = layers.add(conv_norm_act(
        &l / k.to_string(),
        (mid, c_out, 1),
        1,
        1,
        NORM,
        Act::None,
    ));
    let residual = b.residual();
    nn::func_t(move |x, train| {
        let y = x.apply_t(&layers, train);
        if residual {
            y + x
        } else {
            y
        }
    })
}

/// torchvision's `mobilenet_v3_large` / `mobilenet_v3_small(num_classes = classes)` for a
/// `Family::Mobilenet`; `stochastic: false` builds the classifier without dropout (the parity
/// test's training step). Panics on another family (a programming error: `models::build`
/// picks).
pub fn mobilenet(p: &nn::Path, family: Family, classes: i64, stochastic: bool) -> impl ModuleT {
    let Family::Mobilenet { table } = family else {
        unreachable!("mobilenet() is only called with a MobileNetV3 family")
    };
    let layout = table.layout();
    let f = p / "features";
    let stem = layout.stem as i64;
    let mut features = nn::seq_t().add(conv_norm_act(
        &f / "0",
        (3, stem, 3),
        2,
        1,
        NORM,
        Act::Hardswish,
    ));
    for (i, b) in layout.blocks.iter().enumerate() {
        features = features.add(block(&f / (i + 1).to_string(), b));
    }
    let last_in = layout.blocks.last().map_or(0, |b| b.c_out as i64);
    let last = layout.last_conv as i64;
    features = features.add(conv_norm_act(
        &f / (layout.blocks.len() + 1).to_string(),
        (last_in, last, 1),
        1,
        1,
        NORM,
        Act::Hardswish,
    ));
    let dropout = if stochastic { MOBILENET_DROPOUT } else { 0.0 };
    let c = p / "classifier";
    let hidden = layout.last_channel as i64;
    let fc = nn::linear(&c / "0", last, hidden, init::linear_normal(0.01));
    let head = nn::linear(&c / "3", hidden, classes, init::linear_normal(0.01));
    nn::func_t(move |x, train| {
        let x = x
            .apply_t(&features, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&fc)
            .hardswish();
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

    /// Both sizes build exactly `weights::spec` (torchvision's `state_dict`, checked against
    /// torchvision itself in `tests/finetune.rs::weight_spec_equals_torchvision_state_dicts`):
    /// the same names and shapes, nothing more; and run forward at 32 px.
    #[test]
    fn every_size_builds_torchvisions_state_dict() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::MobilenetV3Small, Arch::MobilenetV3Large] {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = mobilenet(&vs.root(), arch.family(), 3, true);
            crate::models::assert_builds_spec(&vs, arch);
            let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
            let y = tch::no_grad(|| net.forward_t(&x, false));
            assert_eq!(y.size(), vec![2, 3], "{}", arch.name());
        }
    }
}
