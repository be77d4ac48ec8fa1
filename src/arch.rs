//! The architectures (torchvision names: the model list of Azure ML designer's ResNet and
//! DenseNet components, ConvNeXt, EfficientNet and EfficientNetV2) and what each is built from
//! (`Family`: torchvision's constructor arguments; `EfficientnetLayout`: EfficientNet's blocks
//! after its width and depth multipliers), the one description `weights::spec` and the worker's
//! builders read.
use serde::{Deserialize, Serialize};

/// Smallest and largest accepted input sizes (pixels, square).
pub const MIN_INPUT_SIZE: u32 = 16;
pub const MAX_INPUT_SIZE: u32 = 1024;

/// Supported architectures (torchvision names): the model list of Azure ML designer's ResNet and
/// DenseNet components, and torchvision's ConvNeXt, EfficientNet and EfficientNetV2.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Arch {
    Resnet18,
    Resnet34,
    Resnet50,
    Resnet101,
    Resnet152,
    #[serde(rename = "resnext50_32x4d")]
    #[value(name = "resnext50_32x4d")]
    Resnext50_32x4d,
    #[serde(rename = "resnext101_32x8d")]
    #[value(name = "resnext101_32x8d")]
    Resnext101_32x8d,
    #[serde(rename = "resnext101_64x4d")]
    #[value(name = "resnext101_64x4d")]
    Resnext101_64x4d,
    #[serde(rename = "wide_resnet50_2")]
    #[value(name = "wide_resnet50_2")]
    WideResnet50_2,
    #[serde(rename = "wide_resnet101_2")]
    #[value(name = "wide_resnet101_2")]
    WideResnet101_2,
    Densenet121,
    Densenet161,
    Densenet169,
    Densenet201,
    #[serde(rename = "convnext_tiny")]
    #[value(name = "convnext_tiny")]
    ConvnextTiny,
    #[serde(rename = "convnext_small")]
    #[value(name = "convnext_small")]
    ConvnextSmall,
    #[serde(rename = "convnext_base")]
    #[value(name = "convnext_base")]
    ConvnextBase,
    #[serde(rename = "convnext_large")]
    #[value(name = "convnext_large")]
    ConvnextLarge,
    #[serde(rename = "efficientnet_b0")]
    #[value(name = "efficientnet_b0")]
    EfficientnetB0,
    #[serde(rename = "efficientnet_b1")]
    #[value(name = "efficientnet_b1")]
    EfficientnetB1,
    #[serde(rename = "efficientnet_b2")]
    #[value(name = "efficientnet_b2")]
    EfficientnetB2,
    #[serde(rename = "efficientnet_b3")]
    #[value(name = "efficientnet_b3")]
    EfficientnetB3,
    #[serde(rename = "efficientnet_b4")]
    #[value(name = "efficientnet_b4")]
    EfficientnetB4,
    #[serde(rename = "efficientnet_b5")]
    #[value(name = "efficientnet_b5")]
    EfficientnetB5,
    #[serde(rename = "efficientnet_b6")]
    #[value(name = "efficientnet_b6")]
    EfficientnetB6,
    #[serde(rename = "efficientnet_b7")]
    #[value(name = "efficientnet_b7")]
    EfficientnetB7,
    #[serde(rename = "efficientnet_v2_s")]
    #[value(name = "efficientnet_v2_s")]
    EfficientnetV2S,
    #[serde(rename = "efficientnet_v2_m")]
    #[value(name = "efficientnet_v2_m")]
    EfficientnetV2M,
    #[serde(rename = "efficientnet_v2_l")]
    #[value(name = "efficientnet_v2_l")]
    EfficientnetV2L,
}

/// How torchvision builds an architecture: the numbers its constructor takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `torchvision.models.resnet.ResNet(block, layers, groups, width_per_group)`: a bottleneck's
    /// 3x3 convolution has `planes * width_per_group / 64 * groups` channels in `groups` groups.
    Resnet {
        bottleneck: bool,
        blocks: [usize; 4],
        groups: usize,
        width_per_group: usize,
    },
    /// `torchvision.models.densenet.DenseNet(growth_rate, block_config, num_init_features)`
    /// (bn_size 4).
    Densenet {
        init_features: usize,
        growth: usize,
        blocks: [usize; 4],
    },
    /// `torchvision.models.convnext.ConvNeXt(block_setting, stochastic_depth_prob)` with
    /// LayerNorm2d (eps 1e-6) and layer scale 1e-6: stage `s` has `blocks[s]` CNBlocks of
    /// `dims[s]` channels; `stochastic_depth_pct` is the constructor's default
    /// `stochastic_depth_prob` in percent (the last block's; block `i` of `n` drops with
    /// `p * i / (n - 1)`).
    Convnext {
        dims: [usize; 4],
        blocks: [usize; 4],
        stochastic_depth_pct: u32,
    },
    /// `torchvision.models.efficientnet.EfficientNet(inverted_residual_setting, dropout,
    /// stochastic_depth_prob=0.2, norm_layer, last_channel)` as `efficientnet_b0` ...
    /// `efficientnet_v2_l` call it: `table` the block table (with V1's width and depth
    /// multipliers), `dropout_pct` the dropout before the head in percent, `norm` the batch
    /// norm's eps and momentum. Block `i` of `n` drops with `0.2 * i / n` (not `n - 1`).
    Efficientnet {
        table: EfficientnetTable,
        dropout_pct: u32,
        norm: EfficientnetNorm,
    },
}

/// Which of torchvision's EfficientNet block tables (`_efficientnet_conf`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfficientnetTable {
    /// EfficientNet B0-B7: MBConv blocks, `width_mult` and `depth_mult` in percent.
    B {
        width_pct: u32,
        depth_pct: u32,
    },
    V2S,
    V2M,
    V2L,
}

/// The `norm_layer` torchvision gives an EfficientNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EfficientnetNorm {
    /// `nn.BatchNorm2d`'s defaults: eps 1e-5, momentum 0.1 (B0-B4).
    Torch,
    /// `partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)` (B5-B7).
    Eps1e3Momentum1e2,
    /// `partial(nn.BatchNorm2d, eps=1e-03)` (V2: momentum 0.1).
    Eps1e3,
}

impl EfficientnetNorm {
    pub fn eps(self) -> f64 {
        match self {
            EfficientnetNorm::Torch => 1e-5,
            EfficientnetNorm::Eps1e3Momentum1e2 | EfficientnetNorm::Eps1e3 => 1e-3,
        }
    }

    pub fn momentum(self) -> f64 {
        match self {
            EfficientnetNorm::Eps1e3Momentum1e2 => 0.01,
            EfficientnetNorm::Torch | EfficientnetNorm::Eps1e3 => 0.1,
        }
    }
}

/// torchvision's `stochastic_depth_prob` default for EfficientNet.
const EFFICIENTNET_STOCHASTIC_DEPTH: f64 = 0.2;

/// One block of an EfficientNet as torchvision builds it (`MBConv` or `FusedMBConv`), channels
/// after the multipliers and `_make_divisible`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MbBlock {
    pub fused: bool,
    pub kernel: usize,
    pub stride: usize,
    pub c_in: usize,
    /// `adjust_channels(c_in, expand_ratio)`: no expansion layer when equal to `c_in`.
    pub expanded: usize,
    pub c_out: usize,
    /// The squeeze-and-excitation's channels, `max(1, c_in // 4)` (MBConv only).
    pub squeeze: usize,
}

impl MbBlock {
    /// Whether the block has its own expansion layer (`expanded != c_in`).
    pub fn expands(&self) -> bool {
        self.expanded != self.c_in
    }

    /// `use_res_connect`: stride 1 and as many channels out as in.
    pub fn residual(&self) -> bool {
        self.stride == 1 && self.c_in == self.c_out
    }
}

/// An EfficientNet's layers: the stem's channels (`features.0`), the stages of blocks
/// (`features.1` ...), the last 1x1 convolution's channels (the head's input).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EfficientnetLayout {
    pub stem: usize,
    pub stages: Vec<Vec<MbBlock>>,
    pub last: usize,
}

/// torchvision's `_make_divisible(v, 8)`: to the nearest multiple of 8 (at least 8), one more
/// step up when that lost more than 10 %.
fn make_divisible(v: f64) -> usize {
    let n = (((v + 4.0) as usize) / 8 * 8).max(8);
    if (n as f64) < 0.9 * v {
        n + 8
    } else {
        n
    }
}

/// A row of `_efficientnet_conf`: (fused, expand_ratio, kernel, stride, input_channels,
/// out_channels, num_layers).
type Row = (bool, usize, usize, usize, usize, usize, usize);

impl EfficientnetTable {
    fn rows(self) -> &'static [Row] {
        const B: [Row; 7] = [
            (false, 1, 3, 1, 32, 16, 1),
            (false, 6, 3, 2, 16, 24, 2),
            (false, 6, 5, 2, 24, 40, 2),
            (false, 6, 3, 2, 40, 80, 3),
            (false, 6, 5, 1, 80, 112, 3),
            (false, 6, 5, 2, 112, 192, 4),
            (false, 6, 3, 1, 192, 320, 1),
        ];
        const V2S: [Row; 6] = [
            (true, 1, 3, 1, 24, 24, 2),
            (true, 4, 3, 2, 24, 48, 4),
            (true, 4, 3, 2, 48, 64, 4),
            (false, 4, 3, 2, 64, 128, 6),
            (false, 6, 3, 1, 128, 160, 9),
            (false, 6, 3, 2, 160, 256, 15),
        ];
        const V2M: [Row; 7] = [
            (true, 1, 3, 1, 24, 24, 3),
            (true, 4, 3, 2, 24, 48, 5),
            (true, 4, 3, 2, 48, 80, 5),
            (false, 4, 3, 2, 80, 160, 7),
            (false, 6, 3, 1, 160, 176, 14),
            (false, 6, 3, 2, 176, 304, 18),
            (false, 6, 3, 1, 304, 512, 5),
        ];
        const V2L: [Row; 7] = [
            (true, 1, 3, 1, 32, 32, 4),
            (true, 4, 3, 2, 32, 64, 7),
            (true, 4, 3, 2, 64, 96, 7),
            (false, 4, 3, 2, 96, 192, 10),
            (false, 6, 3, 1, 192, 224, 19),
            (false, 6, 3, 2, 224, 384, 25),
            (false, 6, 3, 1, 384, 640, 7),
        ];
        match self {
            EfficientnetTable::B { .. } => &B,
            EfficientnetTable::V2S => &V2S,
            EfficientnetTable::V2M => &V2M,
            EfficientnetTable::V2L => &V2L,
        }
    }

    /// The layers torchvision builds from the table: `MBConvConfig` scales channels by
    /// `width_mult` through `_make_divisible` and layers by `ceil(n * depth_mult)` (in f64, as
    /// Python does: `pct / 100.0` is the same double as torchvision's literal); within a stage
    /// the blocks after the first take its output channels and stride 1; the last convolution
    /// has `last_channel` (1280 for V2) or four times the last stage's channels.
    pub fn layout(self) -> EfficientnetLayout {
        let (width, depth) = match self {
            EfficientnetTable::B {
                width_pct,
                depth_pct,
            } => (f64::from(width_pct) / 100.0, f64::from(depth_pct) / 100.0),
            _ => (1.0, 1.0),
        };
        let channels = |c: usize| make_divisible(c as f64 * width);
        let mut stages = Vec::new();
        for &(fused, expand, kernel, stride, c_in, c_out, n) in self.rows() {
            // FusedMBConvConfig adjusts neither channels nor depth (its numbers are multiples
            // of 8, so `channels` leaves them as they are).
            let n = if fused {
                n
            } else {
                (n as f64 * depth).ceil() as usize
            };
            let (first_in, c_out) = (channels(c_in), channels(c_out));
            let stage = (0..n)
                .map(|j| {
                    let c_in = if j == 0 { first_in } else { c_out };
                    MbBlock {
                        fused,
                        kernel,
                        stride: if j == 0 { stride } else { 1 },
                        c_in,
                        expanded: make_divisible((c_in * expand) as f64),
                        c_out,
                        squeeze: (c_in / 4).max(1),
                    }
                })
                .collect();
            stages.push(stage);
        }
        let stem = stages
            .first()
            .and_then(|s: &Vec<MbBlock>| s.first())
            .map_or(0, |b| b.c_in);
        let last_out = stages.last().and_then(|s| s.last()).map_or(0, |b| b.c_out);
        let last = match self {
            EfficientnetTable::B { .. } => 4 * last_out,
            _ => 1280,
        };
        EfficientnetLayout { stem, stages, last }
    }
}

impl Family {
    /// The drop probability of each block, in order: ConvNeXt's (torchvision's `sd_prob =
    /// stochastic_depth_prob * stage_block_id / (total_stage_blocks - 1.0)`) or EfficientNet's
    /// (divided by `total_stage_blocks`); empty for the families without stochastic depth.
    pub fn stochastic_depth_probs(self) -> Vec<f64> {
        match self {
            Family::Convnext {
                blocks,
                stochastic_depth_pct,
                ..
            } => {
                let total: usize = blocks.iter().sum();
                let p = f64::from(stochastic_depth_pct) / 100.0;
                (0..total)
                    .map(|i| p * i as f64 / (total as f64 - 1.0))
                    .collect()
            }
            // torchvision's `sd_prob = stochastic_depth_prob * float(stage_block_id) /
            // total_stage_blocks`.
            Family::Efficientnet { table, .. } => {
                let total: usize = table.layout().stages.iter().map(Vec::len).sum();
                (0..total)
                    .map(|i| EFFICIENTNET_STOCHASTIC_DEPTH * i as f64 / total as f64)
                    .collect()
            }
            Family::Resnet { .. } | Family::Densenet { .. } => Vec::new(),
        }
    }
}

impl Arch {
    /// Side of the last feature map (what the final normalisation layer sees) for a square
    /// input of `input` pixels: torchvision's strides and paddings (ResNet: conv1, max-pool and
    /// three stride-2 stages, each ceil(s/2); DenseNet: conv0 and pool0 ceil(s/2), then three
    /// 2x2 average-pool transitions, each floor(s/2); ConvNeXt: the 4x4 stride-4 stem, floor(s/4),
    /// then three 2x2 stride-2 downsampling convolutions, each floor(s/2): floor(s/32);
    /// EfficientNet: the stem and four stride-2 stages, each a k x k convolution padded by
    /// (k-1)/2, so ceil(s/2) as ResNet's).
    pub fn last_feature_size(self, input: u32) -> u32 {
        let half_up = |s: u32| s.div_ceil(2);
        match self.family() {
            Family::Convnext { .. } => input / 4 / 2 / 2 / 2,
            Family::Densenet { .. } => half_up(half_up(input)) / 2 / 2 / 2,
            Family::Resnet { .. } | Family::Efficientnet { .. } => {
                half_up(half_up(half_up(half_up(half_up(input)))))
            }
        }
    }

    /// Whether the architecture has batch-norm layers (whose running statistics one value per
    /// channel would poison); ConvNeXt normalises with LayerNorm, per image.
    pub fn has_batch_norm(self) -> bool {
        !matches!(self.family(), Family::Convnext { .. })
    }

    /// The smallest input size the architecture works at (every feature map at least 1x1).
    pub fn min_input_size(self) -> u32 {
        (MIN_INPUT_SIZE..=MAX_INPUT_SIZE)
            .find(|&i| self.last_feature_size(i) >= 1)
            .unwrap_or(MAX_INPUT_SIZE)
    }

    /// The smallest input size at which one image still gives batch norm more than one value
    /// per channel in every layer (any accepted size for an architecture without batch norm).
    pub fn min_input_for_single_image(self) -> u32 {
        if !self.has_batch_norm() {
            return self.min_input_size();
        }
        (1..=4096)
            .find(|&i| self.last_feature_size(i) >= 2)
            .unwrap_or(4096)
    }

    pub const ALL: [Arch; 29] = [
        Arch::Resnet18,
        Arch::Resnet34,
        Arch::Resnet50,
        Arch::Resnet101,
        Arch::Resnet152,
        Arch::Resnext50_32x4d,
        Arch::Resnext101_32x8d,
        Arch::Resnext101_64x4d,
        Arch::WideResnet50_2,
        Arch::WideResnet101_2,
        Arch::Densenet121,
        Arch::Densenet161,
        Arch::Densenet169,
        Arch::Densenet201,
        Arch::ConvnextTiny,
        Arch::ConvnextSmall,
        Arch::ConvnextBase,
        Arch::ConvnextLarge,
        Arch::EfficientnetB0,
        Arch::EfficientnetB1,
        Arch::EfficientnetB2,
        Arch::EfficientnetB3,
        Arch::EfficientnetB4,
        Arch::EfficientnetB5,
        Arch::EfficientnetB6,
        Arch::EfficientnetB7,
        Arch::EfficientnetV2S,
        Arch::EfficientnetV2M,
        Arch::EfficientnetV2L,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Arch::Resnet18 => "resnet18",
            Arch::Resnet34 => "resnet34",
            Arch::Resnet50 => "resnet50",
            Arch::Resnet101 => "resnet101",
            Arch::Resnet152 => "resnet152",
            Arch::Resnext50_32x4d => "resnext50_32x4d",
            Arch::Resnext101_32x8d => "resnext101_32x8d",
            Arch::Resnext101_64x4d => "resnext101_64x4d",
            Arch::WideResnet50_2 => "wide_resnet50_2",
            Arch::WideResnet101_2 => "wide_resnet101_2",
            Arch::Densenet121 => "densenet121",
            Arch::Densenet161 => "densenet161",
            Arch::Densenet169 => "densenet169",
            Arch::Densenet201 => "densenet201",
            Arch::ConvnextTiny => "convnext_tiny",
            Arch::ConvnextSmall => "convnext_small",
            Arch::ConvnextBase => "convnext_base",
            Arch::ConvnextLarge => "convnext_large",
            Arch::EfficientnetB0 => "efficientnet_b0",
            Arch::EfficientnetB1 => "efficientnet_b1",
            Arch::EfficientnetB2 => "efficientnet_b2",
            Arch::EfficientnetB3 => "efficientnet_b3",
            Arch::EfficientnetB4 => "efficientnet_b4",
            Arch::EfficientnetB5 => "efficientnet_b5",
            Arch::EfficientnetB6 => "efficientnet_b6",
            Arch::EfficientnetB7 => "efficientnet_b7",
            Arch::EfficientnetV2S => "efficientnet_v2_s",
            Arch::EfficientnetV2M => "efficientnet_v2_m",
            Arch::EfficientnetV2L => "efficientnet_v2_l",
        }
    }

    /// torchvision's constructor arguments for the architecture.
    pub fn family(self) -> Family {
        let resnet = |bottleneck, blocks, groups, width_per_group| Family::Resnet {
            bottleneck,
            blocks,
            groups,
            width_per_group,
        };
        let densenet = |init_features, growth, blocks| Family::Densenet {
            init_features,
            growth,
            blocks,
        };
        let convnext = |dims, blocks, stochastic_depth_pct| Family::Convnext {
            dims,
            blocks,
            stochastic_depth_pct,
        };
        let b = |width_pct, depth_pct, dropout_pct, norm| Family::Efficientnet {
            table: EfficientnetTable::B {
                width_pct,
                depth_pct,
            },
            dropout_pct,
            norm,
        };
        let v2 = |table, dropout_pct| Family::Efficientnet {
            table,
            dropout_pct,
            norm: EfficientnetNorm::Eps1e3,
        };
        let (torch_bn, tf_bn) = (EfficientnetNorm::Torch, EfficientnetNorm::Eps1e3Momentum1e2);
        match self {
            Arch::Resnet18 => resnet(false, [2, 2, 2, 2], 1, 64),
            Arch::Resnet34 => resnet(false, [3, 4, 6, 3], 1, 64),
            Arch::Resnet50 => resnet(true, [3, 4, 6, 3], 1, 64),
            Arch::Resnet101 => resnet(true, [3, 4, 23, 3], 1, 64),
            Arch::Resnet152 => resnet(true, [3, 8, 36, 3], 1, 64),
            Arch::Resnext50_32x4d => resnet(true, [3, 4, 6, 3], 32, 4),
            Arch::Resnext101_32x8d => resnet(true, [3, 4, 23, 3], 32, 8),
            Arch::Resnext101_64x4d => resnet(true, [3, 4, 23, 3], 64, 4),
            Arch::WideResnet50_2 => resnet(true, [3, 4, 6, 3], 1, 128),
            Arch::WideResnet101_2 => resnet(true, [3, 4, 23, 3], 1, 128),
            Arch::Densenet121 => densenet(64, 32, [6, 12, 24, 16]),
            Arch::Densenet161 => densenet(96, 48, [6, 12, 36, 24]),
            Arch::Densenet169 => densenet(64, 32, [6, 12, 32, 32]),
            Arch::Densenet201 => densenet(64, 32, [6, 12, 48, 32]),
            Arch::ConvnextTiny => convnext([96, 192, 384, 768], [3, 3, 9, 3], 10),
            Arch::ConvnextSmall => convnext([96, 192, 384, 768], [3, 3, 27, 3], 40),
            Arch::ConvnextBase => convnext([128, 256, 512, 1024], [3, 3, 27, 3], 50),
            Arch::ConvnextLarge => convnext([192, 384, 768, 1536], [3, 3, 27, 3], 50),
            Arch::EfficientnetB0 => b(100, 100, 20, torch_bn),
            Arch::EfficientnetB1 => b(100, 110, 20, torch_bn),
            Arch::EfficientnetB2 => b(110, 120, 30, torch_bn),
            Arch::EfficientnetB3 => b(120, 140, 30, torch_bn),
            Arch::EfficientnetB4 => b(140, 180, 40, torch_bn),
            Arch::EfficientnetB5 => b(160, 220, 40, tf_bn),
            Arch::EfficientnetB6 => b(180, 260, 50, tf_bn),
            Arch::EfficientnetB7 => b(200, 310, 50, tf_bn),
            Arch::EfficientnetV2S => v2(EfficientnetTable::V2S, 20),
            Arch::EfficientnetV2M => v2(EfficientnetTable::V2M, 30),
            Arch::EfficientnetV2L => v2(EfficientnetTable::V2L, 40),
        }
    }

    /// DenseNet (no residual blocks; classifier `classifier.`).
    pub fn is_densenet(self) -> bool {
        matches!(self.family(), Family::Densenet { .. })
    }

    /// A ResNet variant (ResNet, ResNeXt, Wide ResNet: residual blocks ending in batch norm,
    /// classifier `fc.`).
    pub fn is_resnet(self) -> bool {
        matches!(self.family(), Family::Resnet { .. })
    }

    pub fn from_name(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `_make_divisible(v, 8)` as torchvision's: the nearest multiple of 8, at least 8, one
    /// step up when rounding lost more than 10 %.
    #[test]
    fn make_divisible_is_torchvisions() {
        assert_eq!(make_divisible(35.2), 32); // B2's stem: 32 * 1.1
        assert_eq!(make_divisible(17.6), 16);
        assert_eq!(make_divisible(20.0), 24);
        assert_eq!(make_divisible(11.0), 16); // 8 would lose 27 %
        assert_eq!(make_divisible(3.0), 8);
        assert_eq!(make_divisible(640.0), 640);
    }

    /// The layouts' ends and block counts (every tensor is compared with torchvision's
    /// `state_dict` in `tests/finetune.rs`).
    #[test]
    fn efficientnet_layouts_follow_torchvisions_tables() {
        let layout = |a: Arch| match a.family() {
            Family::Efficientnet { table, .. } => table.layout(),
            other => panic!("{other:?}"),
        };
        let blocks = |l: &EfficientnetLayout| l.stages.iter().map(Vec::len).sum::<usize>();
        for (arch, stem, last, n) in [
            (Arch::EfficientnetB0, 32, 1280, 16),
            (Arch::EfficientnetB3, 40, 1536, 26),
            (Arch::EfficientnetB7, 64, 2560, 55),
            (Arch::EfficientnetV2S, 24, 1280, 40),
            (Arch::EfficientnetV2L, 32, 1280, 79),
        ] {
            let l = layout(arch);
            assert_eq!(
                (l.stem, l.last, blocks(&l)),
                (stem, last, n),
                "{}",
                arch.name()
            );
        }
        let b0 = layout(Arch::EfficientnetB0);
        let first = b0.stages[0][0];
        assert!(!first.expands() && !first.residual() && first.squeeze == 8);
        assert!(b0.stages[1][1].residual() && b0.stages[1][1].expanded == 144);
        let v2s = layout(Arch::EfficientnetV2S);
        assert!(v2s.stages[0][0].fused && v2s.stages[0][0].residual());
        assert!(!v2s.stages[3][0].fused && v2s.stages[3][0].expanded == 256);
    }
}
