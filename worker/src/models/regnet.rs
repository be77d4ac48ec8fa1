//! RegNet (X and Y) as torchvision builds it (`torchvision.models.regnet.RegNet`): the same
//! layers, names and strides, from the one layout `tchrun::arch` computes
//! (`RegnetParams::layout`). `stem` is `SimpleStemIN` (3x3 stride-2 `Conv2dNormActivation`
//! with ReLU, 32 wide), `trunk_output.blockS.blockS-J` the `ResBottleneckBlock`s (`f.a` 1x1,
//! `f.b` 3x3 grouped and strided, the Y models' squeeze-and-excitation `f.se` with ReLU and
//! sigmoid, `f.c` 1x1 without activation; the input, or its `proj` when the shape changes,
//! added; ReLU), then the average pool and the Linear head `fc`. Batch norm eps 1e-5, momentum
//! 0.1. From scratch the layers are initialised as `RegNet.__init__` does (convolution weights
//! N(0, 2/fan_out), the squeeze-and-excitation's biases `nn.Conv2d`'s default, batch norm 1/0,
//! `fc` N(0, 0.01²) with bias 0).
use super::blocks::{conv_norm_act, squeeze_excitation_default_bias, Act, Norm};
use super::init;
use tch::{nn, nn::ModuleT};
use tchrun::arch::{Family, RegnetBlock, REGNET_BN_EPS, REGNET_BN_MOMENTUM};

const NORM: Norm = Norm {
    eps: REGNET_BN_EPS,
    momentum: REGNET_BN_MOMENTUM,
};

/// torchvision's `ResBottleneckBlock(width_in, width_out, stride, ..., group_width,
/// bottleneck_multiplier=1.0, se_ratio)`: `relu(proj(x) + f(x))`, or `relu(x + f(x))`.
fn block(p: nn::Path, b: &RegnetBlock) -> impl ModuleT {
    let (c_in, c_out, stride) = (b.c_in as i64, b.c_out as i64, b.stride as i64);
    let proj = b
        .projects()
        .then(|| conv_norm_act(&p / "proj", (c_in, c_out, 1), stride, 1, NORM, Act::None));
    let f = &p / "f";
    let mut layers = nn::seq_t()
        .add(conv_norm_act(
            &f / "a",
            (c_in, c_out, 1),
            1,
            1,
            NORM,
            Act::Relu,
        ))
        .add(conv_norm_act(
            &f / "b",
            (c_out, c_out, 3),
            stride,
            b.groups as i64,
            NORM,
            Act::Relu,
        ));
    if let Some(squeeze) = b.squeeze {
        layers = layers.add(squeeze_excitation_default_bias(
            &f / "se",
            c_out,
            squeeze as i64,
            Act::Relu,
            Act::Sigmoid,
        ));
    }
    layers = layers.add(conv_norm_act(
        &f / "c",
        (c_out, c_out, 1),
        1,
        1,
        NORM,
        Act::None,
    ));
    nn::func_t(move |x, train| {
        let y = x.apply_t(&layers, train);
        let shortcut = match &proj {
            Some(proj) => x.apply_t(proj, train),
            None => x.shallow_clone(),
        };
        (shortcut + y).relu()
    })
}

/// torchvision's `regnet_x_*` / `regnet_y_*(num_classes = classes)` for a `Family::Regnet`
/// (no dropout or stochastic depth: one build serves training and the parity test). Panics on
/// another family (a programming error: `models::build` picks).
pub fn regnet(p: &nn::Path, family: Family, classes: i64) -> impl ModuleT {
    let Family::Regnet { params } = family else {
        unreachable!("regnet() is only called with a RegNet family")
    };
    let layout = params.layout();
    let stem = conv_norm_act(
        p / "stem",
        (3, layout.stem as i64, 3),
        2,
        1,
        NORM,
        Act::Relu,
    );
    let trunk = p / "trunk_output";
    let mut body = nn::seq_t().add(stem);
    for (s, stage) in layout.stages.iter().enumerate() {
        let stage_path = &trunk / format!("block{}", s + 1);
        for (j, b) in stage.iter().enumerate() {
            body = body.add(block(&stage_path / format!("block{}-{j}", s + 1), b));
        }
    }
    let last = layout.last_width() as i64;
    let fc = nn::linear(p / "fc", last, classes, init::linear_normal(0.01));
    nn::func_t(move |x, train| {
        x.apply_t(&body, train)
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&fc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};
    use tchrun::model::Arch;

    /// The smallest X and Y sizes and regnet_x_8gf (a stage whose group width is cut to its
    /// width: one group) build exactly `weights::spec` (torchvision's `state_dict`, checked
    /// for every size against torchvision itself in
    /// `tests/finetune.rs::weight_spec_equals_torchvision_state_dicts`): the same names and
    /// shapes, nothing more; and run forward at 32 px.
    #[test]
    fn every_size_builds_torchvisions_state_dict() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::RegnetX400mf, Arch::RegnetY400mf, Arch::RegnetX8gf] {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = regnet(&vs.root(), arch.family(), 3);
            crate::models::assert_builds_spec(&vs, arch);
            let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
            let y = tch::no_grad(|| net.forward_t(&x, false));
            assert_eq!(y.size(), vec![2, 3], "{}", arch.name());
        }
    }
}
