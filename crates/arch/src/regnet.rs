//! RegNet's layouts as torchvision builds them (`torchvision.models.regnet`): the per-stage
//! widths, depths and group widths of `BlockParams.from_init_params` (float32 arithmetic and
//! round-half-even as torch computes them, then `_adjust_widths_groups_compatibilty`), and the
//! `ResBottleneckBlock`s of each stage with their projection, groups and squeeze-and-excitation.
use crate::channels::make_divisible_by;

/// `_regnet`'s `norm_layer`: `partial(nn.BatchNorm2d, eps=1e-05, momentum=0.1)`.
pub const REGNET_BN_EPS: f64 = 1e-5;
pub const REGNET_BN_MOMENTUM: f64 = 0.1;
/// `RegNet`'s `stem_width` default: `SimpleStemIN(3, 32)`, a 3x3 stride-2 convolution.
pub const REGNET_STEM: usize = 32;

/// The arguments `regnet_x_*` / `regnet_y_*` give `BlockParams.from_init_params` (bottleneck
/// multiplier 1.0 in every size): `w_a` and `w_m` in hundredths (27.89 is 2789), `se` for the
/// Y models' `se_ratio=0.25`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegnetParams {
    pub depth: usize,
    pub w_0: usize,
    pub w_a_centi: u32,
    pub w_m_centi: u32,
    pub group_width: usize,
    pub se: bool,
}

/// One `ResBottleneckBlock` (`trunk_output.blockS.blockS-J`): `f.a` a 1x1 convolution to
/// `c_out` (the bottleneck width, multiplier 1), `f.b` a 3x3 of `stride` in `groups` groups,
/// `f.se` the squeeze-and-excitation to `squeeze` channels (Y models), `f.c` a 1x1 to `c_out`;
/// `proj`, a strided 1x1 convolution of the input, when the shape changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RegnetBlock {
    pub c_in: usize,
    pub c_out: usize,
    pub stride: usize,
    pub groups: usize,
    /// `int(round(se_ratio * width_in))` when the model has squeeze-and-excitation.
    pub squeeze: Option<usize>,
}

impl RegnetBlock {
    /// `should_proj`: the input's width or size changes, so the shortcut is `proj`.
    pub fn projects(&self) -> bool {
        self.c_in != self.c_out || self.stride != 1
    }
}

/// A RegNet's layers: the stem's width and the stages' blocks (`trunk_output.block1` ...).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegnetLayout {
    pub stem: usize,
    pub stages: Vec<Vec<RegnetBlock>>,
}

impl RegnetLayout {
    /// The width `fc` reads (the last stage's, the stem's when there is none).
    pub fn last_width(&self) -> usize {
        self.stages
            .last()
            .and_then(|s| s.last())
            .map_or(self.stem, |b| b.c_out)
    }
}

impl RegnetParams {
    /// Every block's width as `from_init_params` computes it in float32 (torch's default
    /// dtype): `widths_cont = arange(depth) * w_a + w_0`, `block_capacity =
    /// round(log(widths_cont / w_0) / log(w_m))`, `round(w_0 * w_m ** block_capacity / 8) * 8`,
    /// `torch.round` rounding halves to even (regnet_x_1_6gf's 80 * 2.25 / 8 = 22.5 is 22).
    fn block_widths(self) -> Vec<usize> {
        let w_a = (f64::from(self.w_a_centi) / 100.0) as f32;
        let w_m64 = f64::from(self.w_m_centi) / 100.0;
        let (w_m, log_w_m) = (w_m64 as f32, w_m64.ln() as f32);
        let w_0 = self.w_0 as f32;
        (0..self.depth)
            .map(|i| {
                let cont = i as f32 * w_a + w_0;
                let capacity = ((cont / w_0).ln() / log_w_m).round_ties_even();
                ((w_0 * w_m.powf(capacity) / 8.0).round_ties_even() * 8.0) as usize
            })
            .collect()
    }

    /// torchvision's layout: consecutive blocks of one width are a stage (stride 2 for its
    /// first block), each stage's width and group width made compatible
    /// (`_adjust_widths_groups_compatibilty`: group width `min(group_width, width)`, width
    /// `_make_divisible(width, group width)`), `groups = width // group width`; a stage's first
    /// block reads the previous stage's width (the stem's, 32, for the first).
    pub fn layout(self) -> RegnetLayout {
        let mut stages: Vec<(usize, usize)> = Vec::new(); // (width, depth)
        for w in self.block_widths() {
            match stages.last_mut() {
                Some((last, depth)) if *last == w => *depth += 1,
                _ => stages.push((w, 1)),
            }
        }
        let mut c_in = REGNET_STEM;
        let stages = stages
            .into_iter()
            .map(|(width, depth)| {
                let group_width = self.group_width.min(width);
                let c_out = make_divisible_by(width as f64, group_width);
                let blocks = (0..depth)
                    .map(|j| {
                        let block_in = if j == 0 { c_in } else { c_out };
                        RegnetBlock {
                            c_in: block_in,
                            c_out,
                            stride: if j == 0 { 2 } else { 1 },
                            groups: c_out / group_width,
                            squeeze: self
                                .se
                                .then(|| (0.25 * block_in as f64).round_ties_even() as usize),
                        }
                    })
                    .collect();
                c_in = c_out;
                blocks
            })
            .collect();
        RegnetLayout {
            stem: REGNET_STEM,
            stages,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `from_init_params`' stage widths, depths and group widths, as torchvision 0.26's
    /// `BlockParams` gives them for three sizes (every size's tensors are compared with
    /// torchvision's `state_dict` in `tests/finetune.rs`): regnet_x_1_6gf's width rounded half
    /// to even (22.5 * 8), regnet_x_8gf's first group width cut to its stage's width.
    #[test]
    fn regnet_layouts_follow_torchvisions_block_params() {
        let stages = |p: RegnetParams| -> Vec<(usize, usize, usize)> {
            p.layout()
                .stages
                .iter()
                .map(|s| (s[0].c_out, s.len(), s[0].c_out / s[0].groups))
                .collect()
        };
        let x = |depth, w_0, w_a_centi, w_m_centi, group_width| RegnetParams {
            depth,
            w_0,
            w_a_centi,
            w_m_centi,
            group_width,
            se: false,
        };
        assert_eq!(
            stages(x(18, 80, 3401, 225, 24)),
            [(72, 2, 24), (168, 4, 24), (408, 10, 24), (912, 2, 24)]
        );
        assert_eq!(
            stages(x(23, 80, 4956, 288, 120)),
            [(80, 2, 80), (240, 5, 120), (720, 15, 120), (1920, 1, 120)]
        );
        let y400 = RegnetParams {
            se: true,
            ..x(16, 48, 2789, 209, 8)
        };
        assert_eq!(
            stages(y400),
            [(48, 1, 8), (104, 3, 8), (208, 6, 8), (440, 6, 8)]
        );
        let l = y400.layout();
        assert_eq!((l.stem, l.last_width()), (32, 440));
        let b = l.stages[1][0];
        assert_eq!((b.c_in, b.squeeze, b.stride), (48, Some(12), 2));
        assert!(b.projects() && !l.stages[1][1].projects());
        assert_eq!(l.stages[1][1].squeeze, Some(26)); // round(0.25 * 104)
    }

    /// Every size has four stages (what `Arch::last_feature_size` counts on: the stem and four
    /// stride-2 blocks), the Y sizes a squeeze-and-excitation in every block, the X sizes none.
    #[test]
    fn every_regnet_has_four_stages() {
        use crate::{Arch, Family};
        let mut n = 0;
        for arch in Arch::ALL {
            let Family::Regnet { params } = arch.family() else {
                continue;
            };
            let l = params.layout();
            assert_eq!(l.stages.len(), 4, "{}", arch.name());
            let y = arch.name().starts_with("regnet_y");
            assert!(l.stages.iter().flatten().all(|b| b.squeeze.is_some() == y));
            n += 1;
        }
        assert_eq!(n, 14);
    }
}
