//! [`Family`]: how torchvision builds an architecture, the numbers its constructor takes, and
//! what follows from them alone (each block's stochastic depth).
use crate::efficientnet::EFFICIENTNET_STOCHASTIC_DEPTH;
use crate::{EfficientnetNorm, EfficientnetTable, MobilenetTable, RegnetParams};

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
