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

mod channels;
mod constructor;
mod efficientnet;
mod family;
pub use constructor::Family;
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
