//! EfficientNet's and EfficientNetV2's layouts as torchvision builds them: the block tables
//! (`_efficientnet_conf`), the per-size batch norm, and the blocks after the width and depth
//! multipliers and `_make_divisible`.
use crate::channels::make_divisible;

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
pub(super) const EFFICIENTNET_STOCHASTIC_DEPTH: f64 = 0.2;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Arch, Family};

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
