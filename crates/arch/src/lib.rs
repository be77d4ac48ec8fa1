//! The architectures (torchvision names: the model list of Azure ML designer's ResNet and
//! DenseNet components, ConvNeXt, EfficientNet and EfficientNetV2, MobileNetV3, the Vision
//! Transformer, RegNet, the Swin Transformer) and what each is built from (`Family`:
//! torchvision's constructor arguments; `EfficientnetLayout`: EfficientNet's blocks after its
//! width and depth multipliers; `MobilenetLayout`: MobileNetV3's inverted residuals; `vit`: ViT's
//! layout at an image size; `RegnetLayout`: RegNet's stages from `BlockParams.from_init_params`;
//! `swin`: Swin's constants, attention index and mask), the one description
//! `weights::spec` and the worker's builders read.
use serde::{Deserialize, Serialize};

pub mod weights;

mod efficientnet;
mod family;
use efficientnet::EFFICIENTNET_STOCHASTIC_DEPTH;
pub use efficientnet::{EfficientnetLayout, EfficientnetNorm, EfficientnetTable, MbBlock};
mod mobilenet;
pub mod swin;
pub mod vit;
pub use mobilenet::{
    IrBlock, MobilenetLayout, MobilenetTable, MOBILENET_BN_EPS, MOBILENET_BN_MOMENTUM,
    MOBILENET_DROPOUT,
};
mod regnet;
pub use regnet::{
    RegnetBlock, RegnetLayout, RegnetParams, REGNET_BN_EPS, REGNET_BN_MOMENTUM, REGNET_STEM,
};

/// Smallest and largest accepted input sizes (pixels, square).
pub const MIN_INPUT_SIZE: u32 = 16;
pub const MAX_INPUT_SIZE: u32 = 1024;

/// Supported architectures (torchvision names): the model list of Azure ML designer's ResNet and
/// DenseNet components, and torchvision's ConvNeXt, EfficientNet and EfficientNetV2,
/// MobileNetV3, Vision Transformers, RegNet (X and Y) and Swin Transformers.
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
    #[serde(rename = "vit_b_16")]
    #[value(name = "vit_b_16")]
    VitB16,
    #[serde(rename = "vit_b_32")]
    #[value(name = "vit_b_32")]
    VitB32,
    #[serde(rename = "vit_l_16")]
    #[value(name = "vit_l_16")]
    VitL16,
    #[serde(rename = "mobilenet_v3_small")]
    #[value(name = "mobilenet_v3_small")]
    MobilenetV3Small,
    #[serde(rename = "mobilenet_v3_large")]
    #[value(name = "mobilenet_v3_large")]
    MobilenetV3Large,
    #[serde(rename = "regnet_y_400mf")]
    #[value(name = "regnet_y_400mf")]
    RegnetY400mf,
    #[serde(rename = "regnet_y_800mf")]
    #[value(name = "regnet_y_800mf")]
    RegnetY800mf,
    #[serde(rename = "regnet_y_1_6gf")]
    #[value(name = "regnet_y_1_6gf")]
    RegnetY1_6gf,
    #[serde(rename = "regnet_y_3_2gf")]
    #[value(name = "regnet_y_3_2gf")]
    RegnetY3_2gf,
    #[serde(rename = "regnet_y_8gf")]
    #[value(name = "regnet_y_8gf")]
    RegnetY8gf,
    #[serde(rename = "regnet_y_16gf")]
    #[value(name = "regnet_y_16gf")]
    RegnetY16gf,
    #[serde(rename = "regnet_y_32gf")]
    #[value(name = "regnet_y_32gf")]
    RegnetY32gf,
    #[serde(rename = "regnet_x_400mf")]
    #[value(name = "regnet_x_400mf")]
    RegnetX400mf,
    #[serde(rename = "regnet_x_800mf")]
    #[value(name = "regnet_x_800mf")]
    RegnetX800mf,
    #[serde(rename = "regnet_x_1_6gf")]
    #[value(name = "regnet_x_1_6gf")]
    RegnetX1_6gf,
    #[serde(rename = "regnet_x_3_2gf")]
    #[value(name = "regnet_x_3_2gf")]
    RegnetX3_2gf,
    #[serde(rename = "regnet_x_8gf")]
    #[value(name = "regnet_x_8gf")]
    RegnetX8gf,
    #[serde(rename = "regnet_x_16gf")]
    #[value(name = "regnet_x_16gf")]
    RegnetX16gf,
    #[serde(rename = "regnet_x_32gf")]
    #[value(name = "regnet_x_32gf")]
    RegnetX32gf,
    #[serde(rename = "swin_t")]
    #[value(name = "swin_t")]
    SwinT,
    #[serde(rename = "swin_s")]
    #[value(name = "swin_s")]
    SwinS,
    #[serde(rename = "swin_b")]
    #[value(name = "swin_b")]
    SwinB,
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
    /// `torchvision.models.vision_transformer.VisionTransformer(image_size, patch_size,
    /// num_layers, num_heads, hidden_dim, mlp_dim)` with its defaults (dropout and attention
    /// dropout 0, LayerNorm eps 1e-6, no representation layer), as `vit_b_16`, `vit_b_32` and
    /// `vit_l_16` call it. The image size is the model's input size (`model.json`): the
    /// positional embedding has one position per `patch` x `patch` patch.
    Vit {
        patch: usize,
        layers: usize,
        heads: usize,
        hidden: usize,
        mlp: usize,
    },
    /// `torchvision.models.mobilenetv3.MobileNetV3(inverted_residual_setting, last_channel,
    /// dropout=0.2)` as `mobilenet_v3_large` and `mobilenet_v3_small` call it: `table` the
    /// inverted-residual table; batch norm eps 0.001 and momentum 0.01 (`MOBILENET_BN_*`), no
    /// stochastic depth.
    Mobilenet { table: MobilenetTable },
    /// `torchvision.models.regnet.RegNet(BlockParams.from_init_params(depth, w_0, w_a, w_m,
    /// group_width, se_ratio))` as `regnet_y_*` (`se_ratio=0.25`) and `regnet_x_*` call it: the
    /// stem 32 wide, `ResBottleneckBlock`s with bottleneck multiplier 1, batch norm eps 1e-5 and
    /// momentum 0.1 (`REGNET_BN_*`), no dropout or stochastic depth, head `fc`.
    Regnet { params: RegnetParams },
    /// `torchvision.models.swin_transformer.SwinTransformer(patch_size=[4, 4], embed_dim,
    /// depths, num_heads, window_size=[7, 7], stochastic_depth_prob)` with its defaults (MLP
    /// ratio 4, dropout and attention dropout 0, LayerNorm eps 1e-5, `PatchMerging`), as
    /// `swin_t`, `swin_s` and `swin_b` call it (`swin::{PATCH, WINDOW}`); block `i` of `n` drops
    /// with `p * i / (n - 1)`, `p` = `stochastic_depth_pct` / 100, as ConvNeXt's.
    Swin {
        embed: usize,
        depths: [usize; 4],
        heads: [usize; 4],
        stochastic_depth_pct: u32,
    },
}

/// torchvision's `_make_divisible(v, 8)`: to the nearest multiple of 8 (at least 8), one more
/// step up when that lost more than 10 %.
pub(crate) fn make_divisible(v: f64) -> usize {
    make_divisible_by(v, 8)
}

/// torchvision's `_make_divisible(v, divisor)`: `max(divisor, int(v + divisor / 2) // divisor *
/// divisor)`, one more `divisor` when that lost more than 10 %.
pub(crate) fn make_divisible_by(v: f64, divisor: usize) -> usize {
    let n = (((v + divisor as f64 / 2.0) as usize) / divisor * divisor).max(divisor);
    if (n as f64) < 0.9 * v {
        n + divisor
    } else {
        n
    }
}

impl Family {
    /// The drop probability of each block, in order: ConvNeXt's and Swin's (torchvision's
    /// `sd_prob = stochastic_depth_prob * stage_block_id / (total_stage_blocks - 1)`) or EfficientNet's
    /// (divided by `total_stage_blocks`); empty for the families without stochastic depth.
    pub fn stochastic_depth_probs(self) -> Vec<f64> {
        match self {
            Family::Convnext {
                blocks,
                stochastic_depth_pct,
                ..
            }
            | Family::Swin {
                depths: blocks,
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
            Family::Resnet { .. }
            | Family::Densenet { .. }
            | Family::Vit { .. }
            | Family::Mobilenet { .. }
            | Family::Regnet { .. } => Vec::new(),
        }
    }
}

impl Arch {
    /// Side of the last feature map (what the final normalisation layer sees) for a square
    /// input of `input` pixels: torchvision's strides and paddings (ResNet: conv1, max-pool and
    /// three stride-2 stages, each ceil(s/2); DenseNet: conv0 and pool0 ceil(s/2), then three
    /// 2x2 average-pool transitions, each floor(s/2); ConvNeXt: the 4x4 stride-4 stem, floor(s/4),
    /// then three 2x2 stride-2 downsampling convolutions, each floor(s/2): floor(s/32);
    /// EfficientNet and MobileNetV3: the stem and four stride-2 stages, each a k x k convolution
    /// padded by (k-1)/2, so ceil(s/2) as ResNet's; RegNet: the 3x3 stride-2 stem and four
    /// stages whose first block strides 2 (3x3 padded by 1, its shortcut 1x1), each ceil(s/2);
    /// ViT: the patch grid, floor(s/patch); Swin: floor(s/4), then three patch mergings, each
    /// ceil(s/2): `swin::stage_sides`).
    pub fn last_feature_size(self, input: u32) -> u32 {
        let half_up = |s: u32| s.div_ceil(2);
        match self.family() {
            Family::Swin { .. } => swin::stage_sides(input)[3],
            Family::Vit { patch, .. } => input / patch as u32,
            Family::Convnext { .. } => input / 4 / 2 / 2 / 2,
            Family::Densenet { .. } => half_up(half_up(input)) / 2 / 2 / 2,
            Family::Resnet { .. }
            | Family::Efficientnet { .. }
            | Family::Mobilenet { .. }
            | Family::Regnet { .. } => half_up(half_up(half_up(half_up(half_up(input))))),
        }
    }

    /// Whether the architecture has batch-norm layers (whose running statistics one value per
    /// channel would poison); ConvNeXt, ViT and Swin normalise with LayerNorm, per image.
    pub fn has_batch_norm(self) -> bool {
        !matches!(
            self.family(),
            Family::Convnext { .. } | Family::Vit { .. } | Family::Swin { .. }
        )
    }

    /// ViT's patch side: its input size must be a multiple of it (torchvision's
    /// `VisionTransformer` asserts `image_size % patch_size == 0`); `None` for the
    /// convolutional families, which take any size.
    pub fn patch_size(self) -> Option<u32> {
        match self.family() {
            Family::Vit { patch, .. } => Some(patch as u32),
            _ => None,
        }
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

    pub const ALL: [Arch; 51] = [
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
        Arch::VitB16,
        Arch::VitB32,
        Arch::VitL16,
        Arch::MobilenetV3Small,
        Arch::MobilenetV3Large,
        Arch::RegnetY400mf,
        Arch::RegnetY800mf,
        Arch::RegnetY1_6gf,
        Arch::RegnetY3_2gf,
        Arch::RegnetY8gf,
        Arch::RegnetY16gf,
        Arch::RegnetY32gf,
        Arch::RegnetX400mf,
        Arch::RegnetX800mf,
        Arch::RegnetX1_6gf,
        Arch::RegnetX3_2gf,
        Arch::RegnetX8gf,
        Arch::RegnetX16gf,
        Arch::RegnetX32gf,
        Arch::SwinT,
        Arch::SwinS,
        Arch::SwinB,
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
            Arch::VitB16 => "vit_b_16",
            Arch::VitB32 => "vit_b_32",
            Arch::VitL16 => "vit_l_16",
            Arch::MobilenetV3Small => "mobilenet_v3_small",
            Arch::MobilenetV3Large => "mobilenet_v3_large",
            Arch::RegnetY400mf => "regnet_y_400mf",
            Arch::RegnetY800mf => "regnet_y_800mf",
            Arch::RegnetY1_6gf => "regnet_y_1_6gf",
            Arch::RegnetY3_2gf => "regnet_y_3_2gf",
            Arch::RegnetY8gf => "regnet_y_8gf",
            Arch::RegnetY16gf => "regnet_y_16gf",
            Arch::RegnetY32gf => "regnet_y_32gf",
            Arch::RegnetX400mf => "regnet_x_400mf",
            Arch::RegnetX800mf => "regnet_x_800mf",
            Arch::RegnetX1_6gf => "regnet_x_1_6gf",
            Arch::RegnetX3_2gf => "regnet_x_3_2gf",
            Arch::RegnetX8gf => "regnet_x_8gf",
            Arch::RegnetX16gf => "regnet_x_16gf",
            Arch::RegnetX32gf => "regnet_x_32gf",
            Arch::SwinT => "swin_t",
            Arch::SwinS => "swin_s",
            Arch::SwinB => "swin_b",
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
        // RegNet's `_make_divisible(w, group_width)`.
        assert_eq!(make_divisible_by(440.0, 8), 440);
        assert_eq!(make_divisible_by(100.0, 24), 96);
        assert_eq!(make_divisible_by(10.0, 16), 16);
    }
}
