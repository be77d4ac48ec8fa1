//! DenseNet as torchvision builds it: the same layers and names as tch's `vision::densenet`,
//! with two of tch's defects fixed. tch pools the end with a fixed 7x7 window where torchvision
//! pools adaptively (`adaptive_avg_pool2d(1)`), so tch's DenseNet only ran at 224 px (at 32 px
//! the first forward fails with "Output size is too small", at 256 px the pooled features no
//! longer fit the classifier). And tch's pools pass `divisor_override = 1`: its transitions and
//! its final pool *sum* their windows instead of averaging them, so the same weights gave other
//! logits than torchvision's at every size (`tests/trainer.rs` compares the two).
use tch::{nn, nn::Conv2D, nn::ModuleT, Tensor};
use tchrun::model::Family;

fn conv2d(p: nn::Path, c_in: i64, c_out: i64, ksize: i64, padding: i64, stride: i64) -> Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding,
        bias: false,
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

fn dense_layer(p: nn::Path, c_in: i64, bn_size: i64, growth: i64) -> impl ModuleT {
    let c_inter = bn_size * growth;
    let bn1 = nn::batch_norm2d(&p / "norm1", c_in, Default::default());
    let conv1 = conv2d(&p / "conv1", c_in, c_inter, 1, 0, 1);
    let bn2 = nn::batch_norm2d(&p / "norm2", c_inter, Default::default());
    let conv2 = conv2d(&p / "conv2", c_inter, growth, 3, 1, 1);
    nn::func_t(move |xs, train| {
        let ys = xs
            .apply_t(&bn1, train)
            .relu()
            .apply(&conv1)
            .apply_t(&bn2, train)
            .relu()
            .apply(&conv2);
        Tensor::cat(&[xs, &ys], 1)
    })
}

fn transition(p: nn::Path, c_in: i64, c_out: i64) -> impl ModuleT {
    nn::seq_t()
        .add(nn::batch_norm2d(&p / "norm", c_in, Default::default()))
        .add_fn(|xs| xs.relu())
        .add(conv2d(&p / "conv", c_in, c_out, 1, 0, 1))
        // Not tch's `avg_pool2d_default`, which passes divisor_override = 1 (a 2x2 *sum*).
        .add_fn(|xs| xs.avg_pool2d([2, 2], [2, 2], [0, 0], false, true, None::<i64>))
}

/// torchvision's `DenseNet(growth_rate, block_config, num_init_features, bn_size)`.
/// Panics on a ResNet family (a programming error: `models::build` picks).
pub fn densenet(p: &nn::Path, family: Family, classes: i64) -> impl ModuleT {
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
    let mut seq = nn::seq_t()
        .add(conv2d(&fp / "conv0", 3, c_in, 7, 3, 2))
        .add(nn::batch_norm2d(&fp / "norm0", c_in, Default::default()))
        .add_fn(|xs| xs.relu().max_pool2d([3, 3], [2, 2], [1, 1], [1, 1], false));
    let mut nfeat = c_in;
    for (i, &nlayers) in block_config.iter().enumerate() {
        let bp = &fp / format!("denseblock{}", 1 + i);
        for l in 0..nlayers {
            seq = seq.add(dense_layer(
                &bp / format!("denselayer{}", 1 + l),
                nfeat + l * growth,
                bn_size,
                growth,
            ));
        }
        nfeat += nlayers * growth;
        if i + 1 != block_config.len() {
            seq = seq.add(transition(
                &fp / format!("transition{}", 1 + i),
                nfeat,
                nfeat / 2,
            ));
            nfeat /= 2;
        }
    }
    seq.add(nn::batch_norm2d(&fp / "norm5", nfeat, Default::default()))
        .add_fn(|xs| xs.relu().adaptive_avg_pool2d([1, 1]).flat_view())
        .add(nn::linear(
            p / "classifier",
            nfeat,
            classes,
            Default::default(),
        ))
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
        let net = densenet(&vs.root(), tchrun::model::Arch::Densenet121.family(), 7);
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
}
