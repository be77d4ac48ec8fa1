//! DenseNet as torchvision builds it: the same layers and names as tch's `vision::densenet`,
//! with two of tch's defects fixed. tch pools the end with a fixed 7x7 window where torchvision
//! pools adaptively (`adaptive_avg_pool2d(1)`), so tch's DenseNet only ran at 224 px (at 32 px
//! the first forward fails with "Output size is too small", at 256 px the pooled features no
//! longer fit the classifier). And tch's pools pass `divisor_override = 1`: its transitions and
//! its final pool *sum* their windows instead of averaging them, so the same weights gave other
//! logits than torchvision's at every size (`tests/trainer.rs` compares the two).
//!
//! With `memory_efficient` (torchvision's `memory_efficient=True`), a dense block keeps its
//! feature maps as a list and gives every layer the list; the layer's bottleneck
//! `conv1(relu(norm1(cat(list))))` is the shim's custom autograd function
//! (`tchrun_dense_bottleneck`), which keeps only the list and the parameters and recomputes the
//! concatenation, norm1 and relu in backward. The plain model concatenates as it goes (each
//! layer returns `cat([xs, new])`), so what backward keeps grows quadratically with the layers
//! of a block. Both build the same parameters under the same names in the same order: a seed
//! gives the same weights, and the same safetensors load into either.
use super::init;
use crate::comm::ffi;
use tch::{nn, nn::init::FanInOut, nn::Conv2D, nn::ModuleT, Tensor};
use tchrun::model::Family;

fn conv2d(p: nn::Path, c_in: i64, c_out: i64, ksize: i64, padding: i64, stride: i64) -> Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ws_init: init::conv(FanInOut::FanIn),
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

/// The memory-efficient bottleneck failed in libtorch (a shape, dtype or device mismatch); the
/// message is libtorch's.
#[derive(Debug, thiserror::Error)]
#[error("memory-efficient dense layer: {0}")]
pub struct BottleneckError(pub String);

/// `conv1(relu(norm1(cat(features, 1))))` through the shim's checkpointed autograd function:
/// in training mode under grad mode only `features` and the parameters are kept for backward,
/// which recomputes the rest; norm1's running statistics move once per forward, as batch norm's
/// do. In eval mode or under `no_grad` it computes directly. `conv1` is 1x1, stride 1, no bias
/// (DenseNet's).
pub fn bottleneck(
    features: &[Tensor],
    norm1: &nn::BatchNorm,
    conv1: &Conv2D,
    train: bool,
) -> Result<Tensor, BottleneckError> {
    let (Some(weight), Some(bias)) = (&norm1.ws, &norm1.bs) else {
        return Err(BottleneckError(
            "norm1 has no affine weight and bias".into(),
        ));
    };
    // `nn::batch_norm2d` with `Default::default()` (what `DenseLayer::new` builds) normalizes
    // with these.
    let bn = nn::BatchNormConfig::default();
    let mut ptrs = crate::comm::pg::tensor_ptrs(features);
    let mut out: *mut std::ffi::c_void = std::ptr::null_mut();
    let err = unsafe {
        ffi::tchrun_dense_bottleneck(
            ptrs.as_mut_ptr(),
            ptrs.len(),
            weight.as_ptr() as *mut _,
            bias.as_ptr() as *mut _,
            norm1.running_mean.as_ptr() as *mut _,
            norm1.running_var.as_ptr() as *mut _,
            conv1.ws.as_ptr() as *mut _,
            train as i32,
            bn.momentum,
            bn.eps,
            &mut out,
        )
    };
    if let Some(message) = ffi::take_error(err) {
        return Err(BottleneckError(message));
    }
    if out.is_null() {
        return Err(BottleneckError("the shim returned no tensor".into()));
    }
    // SAFETY: on success `out` is a new at::Tensor* (tch's handle) that we now own.
    Ok(unsafe { Tensor::from_ptr(out as *mut torch_sys::C_tensor) })
}

/// torchvision's `_DenseLayer`: norm1, relu, conv1 (the bottleneck), norm2, relu, conv2.
#[derive(Debug)]
struct DenseLayer {
    norm1: nn::BatchNorm,
    conv1: Conv2D,
    norm2: nn::BatchNorm,
    conv2: Conv2D,
}

impl DenseLayer {
    fn new(p: nn::Path, c_in: i64, bn_size: i64, growth: i64) -> DenseLayer {
        let c_inter = bn_size * growth;
        DenseLayer {
            norm1: nn::batch_norm2d(&p / "norm1", c_in, init::batch_norm()),
            conv1: conv2d(&p / "conv1", c_in, c_inter, 1, 0, 1),
            norm2: nn::batch_norm2d(&p / "norm2", c_inter, init::batch_norm()),
            conv2: conv2d(&p / "conv2", c_inter, growth, 3, 1, 1),
        }
    }

    /// The layer's new feature maps from its bottleneck's output.
    fn grow(&self, ys: &Tensor, train: bool) -> Tensor {
        ys.apply_t(&self.norm2, train).relu().apply(&self.conv2)
    }

    /// Plain: `cat([xs, new], 1)`, everything kept for backward.
    fn forward_cat(&self, xs: &Tensor, train: bool) -> Tensor {
        let ys = xs.apply_t(&self.norm1, train).relu().apply(&self.conv1);
        Tensor::cat(&[xs, &self.grow(&ys, train)], 1)
    }

    /// Memory-efficient: the new feature maps alone, from the list of the block's so far.
    /// A libtorch error panics with its message, as tch's own layers do inside a forward.
    fn forward_list(&self, features: &[Tensor], train: bool) -> Tensor {
        let ys =
            bottleneck(features, &self.norm1, &self.conv1, train).unwrap_or_else(|e| panic!("{e}"));
        self.grow(&ys, train)
    }
}

fn transition(p: nn::Path, c_in: i64, c_out: i64) -> nn::SequentialT {
    nn::seq_t()
        .add(nn::batch_norm2d(&p / "norm", c_in, init::batch_norm()))
        .add_fn(|xs| xs.relu())
        .add(conv2d(&p / "conv", c_in, c_out, 1, 0, 1))
        // Not tch's `avg_pool2d_default`, which passes divisor_override = 1 (a 2x2 *sum*).
        .add_fn(|xs| xs.avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>))
}

#[derive(Debug)]
struct DenseBlock {
    layers: Vec<DenseLayer>,
    /// After every block but the last.
    transition: Option<nn::SequentialT>,
}

/// torchvision's `DenseNet`; `memory_efficient` as its constructor argument of that name.
#[derive(Debug)]
pub struct DenseNet {
    stem: nn::SequentialT,
    blocks: Vec<DenseBlock>,
    norm5: nn::BatchNorm,
    classifier: nn::Linear,
    memory_efficient: bool,
}

impl ModuleT for DenseNet {
    fn forward_t(&self, xs: &Tensor, train: bool) -> Tensor {
        let mut x = xs.apply_t(&self.stem, train);
        for block in &self.blocks {
            x = if self.memory_efficient {
                // torchvision's `_DenseBlock.forward`: a list, every layer given all of it.
                let mut features = Vec::with_capacity(block.layers.len() + 1);
                features.push(x);
                for layer in &block.layers {
                    let new = layer.forward_list(&features, train);
                    features.push(new);
                }
                Tensor::cat(&features, 1)
            } else {
                block
                    .layers
                    .iter()
                    .fold(x, |x, layer| layer.forward_cat(&x, train))
            };
            if let Some(t) = &block.transition {
                x = x.apply_t(t, train);
            }
        }
        x.apply_t(&self.norm5, train)
            .relu()
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&self.classifier)
    }
}

/// torchvision's `DenseNet(growth_rate, block_config, num_init_features, bn_size,
/// memory_efficient)`. Panics on a ResNet family (a programming error: `models::build` picks).
pub fn densenet(p: &nn::Path, family: Family, classes: i64, memory_efficient: bool) -> DenseNet {
    let Family::Densenet {
        init_features,
        growth,
        blocks,
    } = family
    else {
        unreachable!("densenet() is only called with a DenseNet family")
    };
    let (c_in, growth, bn_size) = (init_features as i64, growth as i64, 4);
    let block_config = blocks.map(|b| b as i64);
    let fp = p / "features";
    // Created in torchvision's order (and the plain model's before this struct): conv0, norm0,
    // then each block's layers and transition, norm5, classifier; the seed draws in this order.
    let stem = nn::seq_t()
        .add(conv2d(&fp / "conv0", 3, c_in, 7, 3, 2))
        .add(nn::batch_norm2d(&fp / "norm0", c_in, init::batch_norm()))
        .add_fn(|xs| xs.relu().max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false));
    let mut nfeat = c_in;
    let mut dense_blocks = Vec::with_capacity(block_config.len());
    for (i, &nlayers) in block_config.iter().enumerate() {
        let bp = &fp / format!("denseblock{}", 1 + i);
        let layers = (0..nlayers)
            .map(|l| {
                DenseLayer::new(
                    &bp / format!("denselayer{}", 1 + l),
                    nfeat + l * growth,
                    bn_size,
                    growth,
                )
            })
            .collect();
        nfeat += nlayers * growth;
        let transition = (i + 1 != block_config.len()).then(|| {
            let t = transition(&fp / format!("transition{}", 1 + i), nfeat, nfeat / 2);
            nfeat /= 2;
            t
        });
        dense_blocks.push(DenseBlock { layers, transition });
    }
    let norm5 = nn::batch_norm2d(&fp / "norm5", nfeat, init::batch_norm());
    let classifier = nn::linear(p / "classifier", nfeat, classes, init::linear(true));
    DenseNet {
        stem,
        blocks: dense_blocks,
        norm5,
        classifier,
        memory_efficient,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// Every input size `model init` accepts gives logits (tch's fixed 7x7 pool failed below
    /// 224 px and misfit above it).
    #[test]
    fn densenet121_runs_at_any_input_size() {
        let _rng = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        let vs = nn::VarStore::new(Device::Cpu);
        let net = densenet(
            &vs.root(),
            tchrun::model::Arch::Densenet121.family(),
            7,
            false,
        );
        for size in [29i64, 32, 64, 224, 256, 299] {
            let x = Tensor::randn([2, 3, size, size], (Kind::Float, Device::Cpu));
            let y = tch::no_grad(|| net.forward_t(&x, false));
            assert_eq!(y.size(), vec![2, 7], "input {size}");
            assert!(
                y.isfinite().all().int64_value(&[]) == 1,
                "input {size}: non-finite logits"
            );
        }
    }

    fn max_abs(t: &Tensor) -> f64 {
        t.abs().max().double_value(&[])
    }

    /// densenet121 built with `seed`, plain or memory-efficient.
    fn seeded(seed: i64, memory_efficient: bool) -> (nn::VarStore, DenseNet) {
        tch::manual_seed(seed);
        let vs = nn::VarStore::new(Device::Cpu);
        let family = tchrun::model::Arch::Densenet121.family();
        let net = densenet(&vs.root(), family, 10, memory_efficient);
        (vs, net)
    }

    /// Gradients are compared relative to each parameter's gradient scale (its largest
    /// magnitude). With torch 2.11 they are bitwise equal (difference 0): autograd adds a
    /// feature map's contributions from the later layers last layer first, the order in which
    /// the plain chain of concatenations nests them; the tolerance leaves room for a libtorch
    /// that sums them in another order.
    const GRAD_TOLERANCE: f64 = 1e-6;

    /// The memory-efficient DenseNet is the plain one, computed with less memory: the same
    /// parameters from the same seed, the same logits and gradients (every parameter) in
    /// training mode at 32 and 64 px and in channels-last, and the same running statistics
    /// after each step (updated once per forward, not again by the recompute in backward).
    #[test]
    fn memory_efficient_densenet_equals_the_plain_one() {
        let _rng = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        let (vs_plain, plain) = seeded(11, false);
        let (vs_eff, eff) = seeded(11, true);
        let (a, b) = (
            crate::models::named(&vs_plain),
            crate::models::named(&vs_eff),
        );
        assert_eq!(
            a.keys().collect::<Vec<_>>(),
            b.keys().collect::<Vec<_>>(),
            "parameter names"
        );
        for (name, t) in &a {
            assert!(t.equal(&b[name]), "{name} differs from the same seed");
        }
        let mut worst = (0.0f64, "all bitwise equal".to_string());
        for (size, channels_last) in [(32i64, false), (64, false), (32, true)] {
            if channels_last {
                for vs in [&vs_plain, &vs_eff] {
                    let named: Vec<(String, Tensor)> =
                        crate::models::named(vs).into_iter().collect();
                    crate::models::to_channels_last(&named);
                }
            }
            let mut x = Tensor::randn([4, 3, size, size], (Kind::Float, Device::Cpu));
            if channels_last {
                x = crate::models::channels_last(&x);
            }
            let w = Tensor::randn([4, 10], (Kind::Float, Device::Cpu));
            let step = |vs: &nn::VarStore, net: &DenseNet| {
                // Fresh gradients (the trainer's zero_grad): each takes its parameter's layout.
                crate::comm::pg::set_grads_to_none(&vs.trainable_variables()).expect("zero_grad");
                let y = net.forward_t(&x, true);
                (&y * &w).sum(Kind::Float).backward();
                y
            };
            let (ya, yb) = (step(&vs_plain, &plain), step(&vs_eff, &eff));
            let case = format!(
                "{size} px{}",
                if channels_last { ", channels-last" } else { "" }
            );
            let dy = max_abs(&(&ya - &yb));
            assert!(
                dy <= 1e-5 * max_abs(&ya).max(1.0),
                "{case}: logits differ by {dy}"
            );
            let (a, b) = (
                crate::models::named(&vs_plain),
                crate::models::named(&vs_eff),
            );
            for (name, ta) in &a {
                let tb = &b[name];
                if crate::models::is_buffer(name) {
                    assert!(ta.equal(tb), "{case}: {name} differs after one step");
                    continue;
                }
                let (ga, gb) = (ta.grad(), tb.grad());
                assert!(
                    ga.defined() && gb.defined(),
                    "{case}: {name} has no gradient"
                );
                let scale = max_abs(&ga);
                let rel = max_abs(&(&ga - &gb)) / scale.max(f64::MIN_POSITIVE);
                assert!(
                    rel <= GRAD_TOLERANCE,
                    "{case}: {name}: gradients differ by {rel:e} of their scale {scale:e}"
                );
                if rel > worst.0 {
                    worst = (rel, format!("{case}: {name}"));
                }
            }
        }
        // The first layer's running mean moved (once: it equals the plain model's).
        let rm =
            &crate::models::named(&vs_eff)["features.denseblock1.denselayer1.norm1.running_mean"];
        assert!(max_abs(rm) > 0.0, "running statistics never updated");
        println!(
            "largest gradient difference: {:e} of the gradient's scale ({})",
            worst.0, worst.1
        );
        // Evaluation (running statistics, no graph) gives the plain model's logits too.
        let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
        let x = crate::models::channels_last(&x);
        let (ya, yb) = tch::no_grad(|| (plain.forward_t(&x, false), eff.forward_t(&x, false)));
        assert!(max_abs(&(&ya - &yb)) <= 1e-5 * max_abs(&ya).max(1.0));
    }

    /// A libtorch error inside the bottleneck comes back as a typed error with libtorch's
    /// message, not an abort.
    #[test]
    fn bottleneck_errors_come_back_typed() {
        let vs = nn::VarStore::new(Device::Cpu);
        let layer = DenseLayer::new(vs.root() / "l", 8, 4, 2);
        let wrong = Tensor::zeros([2, 5, 4, 4], (Kind::Float, Device::Cpu));
        for train in [true, false] {
            let err = bottleneck(&[wrong.shallow_clone()], &layer.norm1, &layer.conv1, train)
                .expect_err("5 channels into a layer built for 8");
            assert!(
                err.to_string()
                    .starts_with("memory-efficient dense layer: "),
                "{err}"
            );
        }
        let err = bottleneck(&[], &layer.norm1, &layer.conv1, true).expect_err("no inputs");
        assert!(err.to_string().contains("no input feature maps"), "{err}");
        let ok = Tensor::zeros([2, 8, 4, 4], (Kind::Float, Device::Cpu));
        let y = bottleneck(&[ok], &layer.norm1, &layer.conv1, true).expect("8 channels");
        assert_eq!(y.size(), vec![2, 8, 4, 4]);
    }
}
