//! ResNet, ResNeXt and Wide ResNet as torchvision builds them (`torchvision.models.resnet.ResNet`
//! with `groups` and `width_per_group`): the same layers, names and strides. tch's
//! `vision::resnet` has neither grouped nor widened bottlenecks. From scratch, the layers are
//! initialised as torchvision initialises them (`init`).
use super::init;
use tch::{nn, nn::init::FanInOut, nn::Conv2D, nn::ModuleT};
use tchrun::model::Family;

fn conv2d(p: nn::Path, c_in: i64, c_out: i64, ksize: i64, stride: i64, groups: i64) -> Conv2D {
    let cfg = nn::ConvConfig {
        stride,
        padding: ksize / 2,
        groups,
        bias: false,
        ws_init: init::conv(FanInOut::FanOut),
        ..Default::default()
    };
    nn::conv2d(p, c_in, c_out, ksize, cfg)
}

fn downsample(p: nn::Path, c_in: i64, c_out: i64, stride: i64) -> nn::SequentialT {
    if stride != 1 || c_in != c_out {
        nn::seq_t()
            .add(conv2d(&p / "0", c_in, c_out, 1, stride, 1))
            .add(nn::batch_norm2d(&p / "1", c_out, init::batch_norm()))
    } else {
        nn::seq_t()
    }
}

fn basic_block(p: nn::Path, c_in: i64, planes: i64, stride: i64) -> impl ModuleT {
    let conv1 = conv2d(&p / "conv1", c_in, planes, 3, stride, 1);
    let bn1 = nn::batch_norm2d(&p / "bn1", planes, init::batch_norm());
    let conv2 = conv2d(&p / "conv2", planes, planes, 3, 1, 1);
    let bn2 = nn::batch_norm2d(&p / "bn2", planes, init::batch_norm());
    let downsample = downsample(&p / "downsample", c_in, planes, stride);
    nn::func_t(move |xs, train| {
        let ys = xs
            .apply(&conv1)
            .apply_t(&bn1, train)
            .relu()
            .apply(&conv2)
            .apply_t(&bn2, train);
        (xs.apply_t(&downsample, train) + ys).relu()
    })
}

/// torchvision's `Bottleneck`: 1x1 to `width`, 3x3 (stride, `groups` groups), 1x1 to
/// `4 * planes`, where `width = planes * width_per_group / 64 * groups`.
fn bottleneck(
    p: nn::Path,
    c_in: i64,
    planes: i64,
    stride: i64,
    groups: i64,
    width_per_group: i64,
) -> impl ModuleT {
    let width = planes * width_per_group / 64 * groups;
    let conv1 = conv2d(&p / "conv1", c_in, width, 1, 1, 1);
    let bn1 = nn::batch_norm2d(&p / "bn1", width, init::batch_norm());
    let conv2 = conv2d(&p / "conv2", width, width, 3, stride, groups);
    let bn2 = nn::batch_norm2d(&p / "bn2", width, init::batch_norm());
    let conv3 = conv2d(&p / "conv3", width, 4 * planes, 1, 1, 1);
    let bn3 = nn::batch_norm2d(&p / "bn3", 4 * planes, init::batch_norm());
    let downsample = downsample(&p / "downsample", c_in, 4 * planes, stride);
    nn::func_t(move |xs, train| {
        let ys = xs
            .apply(&conv1)
            .apply_t(&bn1, train)
            .relu()
            .apply(&conv2)
            .apply_t(&bn2, train)
            .relu()
            .apply(&conv3)
            .apply_t(&bn3, train);
        (xs.apply_t(&downsample, train) + ys).relu()
    })
}

/// torchvision's `ResNet(block, layers, num_classes, groups, width_per_group)` for a
/// `Family::Resnet`. Panics on a DenseNet family (a programming error: `models::build` picks).
pub fn resnet(p: &nn::Path, family: Family, classes: i64) -> impl ModuleT {
    let Family::Resnet {
        bottleneck: is_bottleneck,
        blocks,
        groups,
        width_per_group,
    } = family
    else {
        unreachable!("resnet() is only called with a ResNet family")
    };
    let (groups, width_per_group) = (groups as i64, width_per_group as i64);
    let expansion = if is_bottleneck { 4 } else { 1 };
    let conv1 = nn::conv2d(
        p / "conv1",
        3,
        64,
        7,
        nn::ConvConfig {
            stride: 2,
            padding: 3,
            bias: false,
            ws_init: init::conv(FanInOut::FanOut),
            ..Default::default()
        },
    );
    let bn1 = nn::batch_norm2d(p / "bn1", 64, init::batch_norm());
    let mut layers = Vec::with_capacity(4);
    let mut c_in = 64;
    for (s, &n) in blocks.iter().enumerate() {
        let planes = 64i64 << s;
        let lp = p / format!("layer{}", s + 1);
        let mut layer = nn::seq_t();
        for j in 0..n {
            let stride = if s > 0 && j == 0 { 2 } else { 1 };
            let bp = &lp / j.to_string();
            layer = if is_bottleneck {
                layer.add(bottleneck(
                    bp,
                    c_in,
                    planes,
                    stride,
                    groups,
                    width_per_group,
                ))
            } else {
                layer.add(basic_block(bp, c_in, planes, stride))
            };
            c_in = planes * expansion;
        }
        layers.push(layer);
    }
    let fc = nn::linear(p / "fc", 512 * expansion, classes, init::linear(false));
    nn::func_t(move |xs, train| {
        let mut ys = xs.apply(&conv1).apply_t(&bn1, train).relu().max_pool2d(
            [3, 3],
            [2, 2],
            [1, 1],
            [1, 1],
            false,
        );
        for layer in &layers {
            ys = ys.apply_t(layer, train);
        }
        ys.adaptive_avg_pool2d([1, 1]).flatten(1, -1).apply(&fc)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind, Tensor};
    use tchrun::model::Arch;

    /// The plain ResNets have the variables of tch's own builders, by name and shape (their
    /// initial values are torchvision's, `init`, not tch's).
    #[test]
    fn plain_resnets_have_the_variables_of_tchs_builders() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for (arch, tch_build) in [
            (
                Arch::Resnet18,
                tch::vision::resnet::resnet18 as fn(&nn::Path, i64) -> nn::FuncT<'static>,
            ),
            (Arch::Resnet34, tch::vision::resnet::resnet34),
        ] {
            tch::manual_seed(7);
            let a = nn::VarStore::new(Device::Cpu);
            let _ = resnet(&a.root(), arch.family(), 5);
            tch::manual_seed(7);
            let b = nn::VarStore::new(Device::Cpu);
            let _ = tch_build(&b.root(), 5);
            let (va, vb) = (a.variables(), b.variables());
            assert_eq!(va.len(), vb.len(), "{}", arch.name());
            for (name, t) in &va {
                assert_eq!(t.size(), vb[name].size(), "{}: {name} differs", arch.name());
            }
        }
        tch::manual_seed(7);
        let a = nn::VarStore::new(Device::Cpu);
        let _ = resnet(&a.root(), Arch::Resnet50.family(), 5);
        tch::manual_seed(7);
        let b = nn::VarStore::new(Device::Cpu);
        let _ = tch::vision::resnet::resnet50(&b.root(), 5);
        for (name, t) in a.variables() {
            assert_eq!(
                t.size(),
                b.variables()[&name].size(),
                "resnet50: {name} differs"
            );
        }
    }

    #[test]
    fn resnext_and_wide_resnet_run_with_torchvision_shapes() {
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        for arch in [Arch::Resnext50_32x4d, Arch::WideResnet50_2] {
            let vs = nn::VarStore::new(Device::Cpu);
            let net = resnet(&vs.root(), arch.family(), 3);
            let vars = vs.variables();
            let spec = tchrun::weights::spec(arch, 3);
            for (name, shape) in spec
                .iter()
                .filter(|(n, _)| !n.ends_with("num_batches_tracked"))
            {
                let want: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
                assert_eq!(vars[name].size(), want, "{}: {name}", arch.name());
            }
            let x = Tensor::randn([2, 3, 32, 32], (Kind::Float, Device::Cpu));
            let y = tch::no_grad(|| net.forward_t(&x, false));
            assert_eq!(y.size(), vec![2, 3]);
        }
    }
}
