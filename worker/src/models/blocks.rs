//! Layers more than one architecture shares, as torchvision defines them: row-mode stochastic
//! depth (`torchvision.ops.StochasticDepth(p, "row")`, ConvNeXt's and EfficientNet's blocks),
//! `Conv2dNormActivation` and `SqueezeExcitation` (`torchvision.ops.misc`), initialised as
//! EfficientNet, MobileNetV3 and RegNet initialise them (Kaiming-normal fan-out convolutions,
//! zero biases or, RegNet's, `nn.Conv2d`'s default ones; batch norm 1/0).
use super::init;
use tch::{nn, nn::init::FanInOut, nn::Init, nn::ModuleT, Tensor};

/// An activation torchvision's layers take (`activation_layer`, `scale_activation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Act {
    None,
    Relu,
    Silu,
    Sigmoid,
    Hardswish,
    Hardsigmoid,
}

impl Act {
    pub fn apply(self, x: Tensor) -> Tensor {
        match self {
            Act::None => x,
            Act::Relu => x.relu(),
            Act::Silu => x.silu(),
            Act::Sigmoid => x.sigmoid(),
            Act::Hardswish => x.hardswish(),
            Act::Hardsigmoid => x.hardsigmoid(),
        }
    }
}

/// A batch norm's `eps` and `momentum` (torchvision's `norm_layer`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Norm {
    pub eps: f64,
    pub momentum: f64,
}

/// torchvision's `Conv2dNormActivation(c_in, c_out, k, stride, groups, norm_layer,
/// activation_layer)`: `.0` the convolution (no bias, padding (k-1)/2), `.1` the batch norm,
/// then the activation.
#[derive(Debug)]
pub struct ConvNormAct {
    conv: nn::Conv2D,
    bn: nn::BatchNorm,
    act: Act,
}

impl ModuleT for ConvNormAct {
    fn forward_t(&self, x: &Tensor, train: bool) -> Tensor {
        self.act.apply(x.apply(&self.conv).apply_t(&self.bn, train))
    }
}

/// A `ConvNormAct` under `p`: `shape` is (c_in, c_out, kernel), then stride and groups.
pub fn conv_norm_act(
    p: nn::Path,
    shape: (i64, i64, i64),
    stride: i64,
    groups: i64,
    norm: Norm,
    act: Act,
) -> ConvNormAct {
    let (c_in, c_out, k) = shape;
    let cfg = nn::ConvConfig {
        stride,
        padding: (k - 1) / 2,
        groups,
        bias: false,
        ws_init: init::conv(FanInOut::FanOut),
        ..Default::default()
    };
    let bn = nn::BatchNormConfig {
        eps: norm.eps,
        momentum: norm.momentum,
        ..init::batch_norm()
    };
    ConvNormAct {
        conv: nn::conv2d(&p / "0", c_in, c_out, k, cfg),
        bn: nn::batch_norm2d(&p / "1", c_out, bn),
        act,
    }
}

/// torchvision's `SqueezeExcitation(c, squeeze, activation, scale_activation)`: the average of
/// each channel, 1x1 convolution `fc1` to `squeeze` channels, `activation`, `fc2` back,
/// `scale_activation`; the input scaled by it.
#[derive(Debug)]
pub struct SqueezeExcitation {
    fc1: nn::Conv2D,
    fc2: nn::Conv2D,
    act: Act,
    scale: Act,
}

impl nn::Module for SqueezeExcitation {
    fn forward(&self, x: &Tensor) -> Tensor {
        let s = self
            .act
            .apply(x.adaptive_avg_pool2d([1, 1]).apply(&self.fc1));
        self.scale.apply(s.apply(&self.fc2)) * x
    }
}

/// A `SqueezeExcitation` under `p` whose convolution biases are zero (EfficientNet's and
/// MobileNetV3's `__init__` zero them).
pub fn squeeze_excitation(
    p: nn::Path,
    c: i64,
    squeeze: i64,
    act: Act,
    scale: Act,
) -> SqueezeExcitation {
    se_with_biases(p, (c, squeeze), (act, scale), |_| Init::Const(0.0))
}

/// A `SqueezeExcitation` under `p` whose convolution biases keep `nn.Conv2d`'s default,
/// Uniform(±1/√fan_in) (`RegNet.__init__` draws only the weights again).
pub fn squeeze_excitation_default_bias(
    p: nn::Path,
    c: i64,
    squeeze: i64,
    act: Act,
    scale: Act,
) -> SqueezeExcitation {
    se_with_biases(p, (c, squeeze), (act, scale), init::conv_default_bias)
}

/// `fc1` (`c` to `squeeze`) and `fc2` (back) with Kaiming-normal fan-out weights and the
/// biases `bias(fan_in)` draws.
fn se_with_biases(
    p: nn::Path,
    (c, squeeze): (i64, i64),
    (act, scale): (Act, Act),
    bias: fn(i64) -> Init,
) -> SqueezeExcitation {
    let cfg = |fan_in| nn::ConvConfig {
        ws_init: init::conv(FanInOut::FanOut),
        bs_init: bias(fan_in),
        ..Default::default()
    };
    SqueezeExcitation {
        fc1: nn::conv2d(&p / "fc1", c, squeeze, 1, cfg(c)),
        fc2: nn::conv2d(&p / "fc2", squeeze, c, 1, cfg(squeeze)),
        act,
        scale,
    }
}

/// torchvision's `stochastic_depth(x, p, "row", training)`: in training, each row (sample) of
/// `x` is zeroed with probability `p` and the others scaled by 1 / (1 - p); otherwise `x`.
pub fn stochastic_depth(x: &Tensor, p: f64, train: bool) -> Tensor {
    if !train || p == 0.0 {
        return x.shallow_clone();
    }
    let survival = 1.0 - p;
    let mut size = vec![1i64; x.dim()];
    if let Some(n) = size.first_mut() {
        *n = x.size().first().copied().unwrap_or(1);
    }
    let mut noise = Tensor::empty(size, (x.kind(), x.device()));
    let _ = noise.bernoulli_float_(survival);
    if survival > 0.0 {
        let _ = noise.g_div_scalar_(survival);
    }
    x * noise
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Stochastic depth in "row" mode, statistically: for every block's drop probability of
    /// convnext_small (0 to 0.4), the fraction of rows zeroed over 4000 rows is within 4.5
    /// standard deviations of p (a false failure about once in 150 000 runs per p), a kept row
    /// is scaled by exactly 1 / (1 - p), a row is zeroed or kept whole, and inference mode
    /// leaves the input as it is.
    #[test]
    fn stochastic_depth_drops_rows_with_the_blocks_probability() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(7);
        let probs = tchrun::model::Arch::ConvnextSmall
            .family()
            .stochastic_depth_probs();
        assert_eq!(probs.len(), 36);
        let rows = 4000i64;
        let x = Tensor::ones([rows, 2, 3, 3], (Kind::Float, Device::Cpu));
        for &p in probs.iter().step_by(5).chain(probs.last()) {
            let y = stochastic_depth(&x, p, true);
            let per_row = y.reshape([rows, -1]);
            let first = per_row.select(1, 0);
            assert!(
                bool::try_from(per_row.eq_tensor(&first.unsqueeze(1)).all()).expect("bool"),
                "p {p}: a row partly dropped"
            );
            let dropped = first.eq(0.0).sum(Kind::Float).double_value(&[]) / rows as f64;
            let sd = (p * (1.0 - p) / rows as f64).sqrt();
            assert!(
                (dropped - p).abs() <= 4.5 * sd + 1e-12,
                "p {p}: {dropped} of the rows dropped"
            );
            let kept = first.max().double_value(&[]);
            assert!(
                (kept - 1.0 / (1.0 - p)).abs() < 1e-6,
                "p {p}: kept rows scaled by {kept}"
            );
            assert!(stochastic_depth(&x, p, false).equal(&x));
        }
    }
}
