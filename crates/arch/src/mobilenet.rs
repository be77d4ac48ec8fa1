//! MobileNetV3's layouts as torchvision builds them (`_mobilenet_v3_conf`, width 1.0, no
//! dilation, full tail): the inverted-residual table of `mobilenet_v3_large` and
//! `mobilenet_v3_small` after `_make_divisible`, the last convolution's and the classifier's
//! widths, the batch norm and the dropout.
use crate::channels::make_divisible;

/// Which of torchvision's MobileNetV3 tables (`_mobilenet_v3_conf(arch)`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MobilenetTable {
    Large,
    Small,
}

/// `MobileNetV3`'s `norm_layer`: `partial(nn.BatchNorm2d, eps=0.001, momentum=0.01)`.
pub const MOBILENET_BN_EPS: f64 = 0.001;
pub const MOBILENET_BN_MOMENTUM: f64 = 0.01;
/// `MobileNetV3`'s `dropout` default, `classifier.2` (between the two Linears).
pub const MOBILENET_DROPOUT: f64 = 0.2;

/// One `InvertedResidual` as torchvision builds it from an `InvertedResidualConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IrBlock {
    pub kernel: usize,
    pub stride: usize,
    pub c_in: usize,
    /// `expanded_channels`: no expansion layer when equal to `c_in`.
    pub expanded: usize,
    pub c_out: usize,
    /// The squeeze-and-excitation's channels, `_make_divisible(expanded // 4, 8)`, when the
    /// block has one (`use_se`).
    pub squeeze: Option<usize>,
    /// Hardswish (`"HS"`) rather than ReLU (`"RE"`).
    pub hardswish: bool,
}

impl IrBlock {
    /// Whether the block has its own 1x1 expansion layer.
    pub fn expands(&self) -> bool {
        self.expanded != self.c_in
    }

    /// `use_res_connect`: stride 1 and as many channels out as in.
    pub fn residual(&self) -> bool {
        self.stride == 1 && self.c_in == self.c_out
    }
}

/// A MobileNetV3's layers: the stem's channels (`features.0`), the blocks (`features.1` ...),
/// the last 1x1 convolution's channels (six times the last block's), and `last_channel`, the
/// width of the classifier's hidden Linear (`classifier.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MobilenetLayout {
    pub stem: usize,
    pub blocks: Vec<IrBlock>,
    pub last_conv: usize,
    pub last_channel: usize,
}

/// A row of `_mobilenet_v3_conf`: (input_channels, kernel, expanded_channels, out_channels,
/// use_se, hardswish, stride).
type Row = (usize, usize, usize, usize, bool, bool, usize);

impl MobilenetTable {
    fn rows(self) -> &'static [Row] {
        const LARGE: [Row; 15] = [
            (16, 3, 16, 16, false, false, 1),
            (16, 3, 64, 24, false, false, 2),
            (24, 3, 72, 24, false, false, 1),
            (24, 5, 72, 40, true, false, 2),
            (40, 5, 120, 40, true, false, 1),
            (40, 5, 120, 40, true, false, 1),
            (40, 3, 240, 80, false, true, 2),
            (80, 3, 200, 80, false, true, 1),
            (80, 3, 184, 80, false, true, 1),
            (80, 3, 184, 80, false, true, 1),
            (80, 3, 480, 112, true, true, 1),
            (112, 3, 672, 112, true, true, 1),
            (112, 5, 672, 160, true, true, 2),
            (160, 5, 960, 160, true, true, 1),
            (160, 5, 960, 160, true, true, 1),
        ];
        const SMALL: [Row; 11] = [
            (16, 3, 16, 16, true, false, 2),
            (16, 3, 72, 24, false, false, 2),
            (24, 3, 88, 24, false, false, 1),
            (24, 5, 96, 40, true, true, 2),
            (40, 5, 240, 40, true, true, 1),
            (40, 5, 240, 40, true, true, 1),
            (40, 5, 120, 48, true, true, 1),
            (48, 5, 144, 48, true, true, 1),
            (48, 5, 288, 96, true, true, 2),
            (96, 5, 576, 96, true, true, 1),
            (96, 5, 576, 96, true, true, 1),
        ];
        match self {
            MobilenetTable::Large => &LARGE,
            MobilenetTable::Small => &SMALL,
        }
    }

    /// The layers torchvision builds from the table: every width through `adjust_channels`
    /// (`_make_divisible(c * 1.0, 8)`), the stem as wide as the first block's input, the last
    /// convolution `6 * ` the last block's output, `last_channel` 1280 (large) or 1024 (small).
    pub fn layout(self) -> MobilenetLayout {
        let adjust = |c: usize| make_divisible(c as f64);
        let blocks: Vec<IrBlock> = self
            .rows()
            .iter()
            .map(|&(c_in, kernel, expanded, c_out, se, hardswish, stride)| {
                let expanded = adjust(expanded);
                IrBlock {
                    kernel,
                    stride,
                    c_in: adjust(c_in),
                    expanded,
                    c_out: adjust(c_out),
                    squeeze: se.then(|| make_divisible((expanded / 4) as f64)),
                    hardswish,
                }
            })
            .collect();
        let stem = blocks.first().map_or(0, |b| b.c_in);
        let last_conv = 6 * blocks.last().map_or(0, |b| b.c_out);
        let last_channel = adjust(match self {
            MobilenetTable::Large => 1280,
            MobilenetTable::Small => 1024,
        });
        MobilenetLayout {
            stem,
            blocks,
            last_conv,
            last_channel,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The layouts' ends, block counts and squeeze-and-excitation widths (every tensor is
    /// compared with torchvision's `state_dict` in `tests/finetune.rs`).
    #[test]
    fn mobilenet_layouts_follow_torchvisions_tables() {
        let large = MobilenetTable::Large.layout();
        assert_eq!(
            (
                large.stem,
                large.blocks.len(),
                large.last_conv,
                large.last_channel
            ),
            (16, 15, 960, 1280)
        );
        assert!(!large.blocks[0].expands() && large.blocks[0].residual());
        assert_eq!(large.blocks[3].squeeze, Some(24)); // 72 // 4 = 18 -> 24
        assert_eq!(large.blocks[11].squeeze, Some(168));
        let small = MobilenetTable::Small.layout();
        assert_eq!(
            (
                small.stem,
                small.blocks.len(),
                small.last_conv,
                small.last_channel
            ),
            (16, 11, 576, 1024)
        );
        assert_eq!(small.blocks[0].squeeze, Some(8)); // 16 // 4 = 4 -> 8
        assert!(!small.blocks[0].residual() && small.blocks[4].residual());
        assert!(!small.blocks[2].hardswish && small.blocks[3].hardswish);
    }
}
