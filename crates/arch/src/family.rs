//! Each architecture's `Family`: the numbers torchvision's constructors take, as
//! `torchvision.models.<arch>()` passes them.
use super::*;

impl Arch {
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
        let vit = |patch, layers, heads, hidden, mlp| Family::Vit {
            patch,
            layers,
            heads,
            hidden,
            mlp,
        };
        let regnet = |depth, w_0, w_a_centi, w_m_centi, group_width, se| Family::Regnet {
            params: RegnetParams {
                depth,
                w_0,
                w_a_centi,
                w_m_centi,
                group_width,
                se,
            },
        };
        let y = |d, w_0, w_a, w_m, g| regnet(d, w_0, w_a, w_m, g, true);
        let x = |d, w_0, w_a, w_m, g| regnet(d, w_0, w_a, w_m, g, false);
        let swin = |embed, depths, heads, stochastic_depth_pct| Family::Swin {
            embed,
            depths,
            heads,
            stochastic_depth_pct,
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
            Arch::VitB16 => vit(16, 12, 12, 768, 3072),
            Arch::VitB32 => vit(32, 12, 12, 768, 3072),
            Arch::VitL16 => vit(16, 24, 16, 1024, 4096),
            Arch::MobilenetV3Small => Family::Mobilenet {
                table: MobilenetTable::Small,
            },
            Arch::MobilenetV3Large => Family::Mobilenet {
                table: MobilenetTable::Large,
            },
            Arch::RegnetY400mf => y(16, 48, 2789, 209, 8),
            Arch::RegnetY800mf => y(14, 56, 3884, 240, 16),
            Arch::RegnetY1_6gf => y(27, 48, 2071, 265, 24),
            Arch::RegnetY3_2gf => y(21, 80, 4263, 266, 24),
            Arch::RegnetY8gf => y(17, 192, 7682, 219, 56),
            Arch::RegnetY16gf => y(18, 200, 10623, 248, 112),
            Arch::RegnetY32gf => y(20, 232, 11589, 253, 232),
            Arch::RegnetX400mf => x(22, 24, 2448, 254, 16),
            Arch::RegnetX800mf => x(16, 56, 3573, 228, 16),
            Arch::RegnetX1_6gf => x(18, 80, 3401, 225, 24),
            Arch::RegnetX3_2gf => x(25, 88, 2631, 225, 48),
            Arch::RegnetX8gf => x(23, 80, 4956, 288, 120),
            Arch::RegnetX16gf => x(22, 216, 5559, 210, 128),
            Arch::RegnetX32gf => x(23, 320, 6986, 200, 168),
            Arch::SwinT => swin(96, [2, 2, 6, 2], [3, 6, 12, 24], 20),
            Arch::SwinS => swin(96, [2, 2, 18, 2], [3, 6, 12, 24], 30),
            Arch::SwinB => swin(128, [2, 2, 18, 2], [4, 8, 16, 32], 50),
        }
    }
}
