//! `--auto-augment`: torchvision's `TrivialAugmentWide`, `RandAugment`, `AugMix` and
//! `AutoAugment(IMAGENET)` (v2, 0.26) on the loader's 8-bit RGB training crop, after the crop
//! and flip and before normalisation, as `ClassificationPresetTrain`. What each policy draws
//! (`draw`: the ops, their magnitude bins and signs, AugMix's chains and Dirichlet weights) is
//! drawn from the image's own RNG; applying a draw (`Draw::apply`) is pure. The ops themselves
//! are in `ops.rs`. Knows nothing of files or flags.
mod ops;

pub use ops::{apply as apply_op, inverse_affine, Fill, Op, Rgb8, ALL_OPS};
/// The kernels `data::transforms` shares (its rotation, affine and perspective warps and its
/// colour jitter are these ops with other parameters).
pub(crate) use ops::{brightness, contrast, gray, rotate, sample, saturation, warp};

use rand::Rng;
use tchrun::augment_flags::{AugmentFlags, AutoAugmentName, Interpolation};

/// A policy with its parameters (`--auto-augment`, `--ra-magnitude`, `--augmix-severity`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// `TrivialAugmentWide()`: one op, a uniform magnitude bin of 31.
    TrivialAugmentWide,
    /// `RandAugment(num_ops=2, magnitude)`: two ops at the bin `magnitude` of 31.
    RandAugment { magnitude: u32 },
    /// `AugMix(severity, mixture_width=3, chain_depth=-1, alpha=1, all_ops=True)`.
    AugMix { severity: u32 },
    /// `AutoAugment(AutoAugmentPolicy.IMAGENET)`: one of its 25 sub-policies.
    ImageNet,
}

pub use tchrun::augment_flags::{AUGMIX_MAX_SEVERITY, RA_MAGNITUDE_BINS as MAGNITUDE_BINS};

/// Which table of magnitudes an op reads (torchvision's `_AUGMENTATION_SPACE`s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Space {
    /// TrivialAugmentWide's (wide ranges, 31 bins).
    Wide,
    /// RandAugment's and AutoAugment's (translations of 150/331 of the side).
    RandAugment,
    /// AugMix's (translations of a third of the side, posterize from 4 bits).
    AugMix,
}

const TA_OPS: [Op; 14] = [
    Op::Identity,
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
];

const AUGMIX_OPS: [Op; 13] = [
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
];

/// `AutoAugmentPolicy.IMAGENET`'s 25 sub-policies: (op, probability, magnitude bin).
const IMAGENET: [[(Op, f64, usize); 2]; 25] = {
    use Op::*;
    [
        [(Posterize, 0.4, 8), (Rotate, 0.6, 9)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
        [(Posterize, 0.6, 7), (Posterize, 0.6, 6)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Equalize, 0.4, 0), (Rotate, 0.8, 8)],
        [(Solarize, 0.6, 3), (Equalize, 0.6, 0)],
        [(Posterize, 0.8, 5), (Equalize, 1.0, 0)],
        [(Rotate, 0.2, 3), (Solarize, 0.6, 8)],
        [(Equalize, 0.6, 0), (Posterize, 0.4, 6)],
        [(Rotate, 0.8, 8), (Color, 0.4, 0)],
        [(Rotate, 0.4, 9), (Equalize, 0.6, 0)],
        [(Equalize, 0.0, 0), (Equalize, 0.8, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Rotate, 0.8, 8), (Color, 1.0, 2)],
        [(Color, 0.8, 8), (Solarize, 0.8, 7)],
        [(Sharpness, 0.4, 7), (Invert, 0.6, 0)],
        [(ShearX, 0.6, 5), (Equalize, 1.0, 0)],
        [(Color, 0.4, 0), (Equalize, 0.6, 0)],
        [(Equalize, 0.4, 0), (Solarize, 0.2, 4)],
        [(Solarize, 0.6, 5), (AutoContrast, 0.6, 0)],
        [(Invert, 0.6, 0), (Equalize, 1.0, 0)],
        [(Color, 0.6, 4), (Contrast, 1.0, 8)],
        [(Equalize, 0.8, 0), (Equalize, 0.6, 0)],
    ]
};

/// `torch.linspace(start, end, steps)[i]` in float32, as torch's CPU kernel computes it (the
/// first half from `start`, the second from `end`, each a fused multiply-add).
pub fn linspace(start: f64, end: f64, steps: usize, i: usize) -> f32 {
    let (s, e) = (start as f32, end as f32);
    let step = (e - s) / (steps.max(2) - 1) as f32;
    if i < steps / 2 {
        step.mul_add(i as f32, s)
    } else {
        (-step).mul_add((steps - i - 1) as f32, e)
    }
}

/// `(top - arange(bins) / ((bins - 1) / div)).round().int()[i]` (float32, half to even).
fn posterize_bits(top: f32, div: f64, bins: usize, i: usize) -> f32 {
    let d = ((bins - 1) as f64 / div) as f32;
    (top - i as f32 / d).round_ties_even()
}

/// The magnitude of `op` at bin `i` of `bins` in `space` for an `h` × `w` image, as the
/// float torchvision reads (`float(magnitudes[i])`), and whether it takes a random sign;
/// `None` for the ops without magnitudes.
pub fn magnitude(
    space: Space,
    op: Op,
    bins: usize,
    i: usize,
    h: usize,
    w: usize,
) -> Option<(f64, bool)> {
    let lin = |end: f64| Some((f64::from(linspace(0.0, end, bins, i)), true));
    let wide = space == Space::Wide;
    match op {
        Op::Identity | Op::AutoContrast | Op::Equalize | Op::Invert => None,
        Op::ShearX | Op::ShearY => lin(if wide { 0.99 } else { 0.3 }),
        Op::TranslateX | Op::TranslateY => {
            let side = if op == Op::TranslateX { w } else { h } as f64;
            lin(match space {
                Space::Wide => 32.0,
                Space::RandAugment => 150.0 / 331.0 * side,
                Space::AugMix => side / 3.0,
            })
        }
        Op::Rotate => lin(if wide { 135.0 } else { 30.0 }),
        Op::Brightness | Op::Color | Op::Contrast | Op::Sharpness => {
            lin(if wide { 0.99 } else { 0.9 })
        }
        Op::Posterize => {
            let (top, div) = match space {
                Space::Wide => (8.0, 6.0),
                Space::RandAugment => (8.0, 4.0),
                Space::AugMix => (4.0, 4.0),
            };
            Some((f64::from(posterize_bits(top, div, bins, i)), false))
        }
        Op::Solarize => Some((f64::from(linspace(1.0, 0.0, bins, i)), false)),
    }
}

/// One image's draw: the ops in order with their signed magnitudes, or AugMix's.
#[derive(Debug, Clone, PartialEq)]
pub enum Draw {
    Ops(Vec<(Op, f64)>),
    AugMix(AugMixDraw),
}

/// AugMix's draw: `m` ~ Dirichlet(1, 1) (the original's weight `m[0]`), `d` ~ Dirichlet(1,
/// 1, 1) (the chains' shares of `m[1]`), and the three chains of 1 to 3 ops.
#[derive(Debug, Clone, PartialEq)]
pub struct AugMixDraw {
    pub m: [f32; 2],
    pub d: [f32; 3],
    pub chains: [Vec<(Op, f64)>; 3],
}

/// The op's magnitude with torchvision's random sign (`torch.rand(()) <= 0.5`: negated).
fn signed(
    space: Space,
    op: Op,
    bins: usize,
    i: usize,
    h: usize,
    w: usize,
    rng: &mut impl Rng,
) -> f64 {
    match magnitude(space, op, bins, i, h, w) {
        Some((m, true)) if rng.gen_bool(0.5) => -m,
        Some((m, _)) => m,
        None => 0.0,
    }
}

/// Dirichlet(1, …, 1) as normalised Exp(1) draws, in float32 as torch returns it.
fn dirichlet_ones<const N: usize>(rng: &mut impl Rng) -> [f32; N] {
    let g: [f64; N] = std::array::from_fn(|_| -(1.0 - rng.gen::<f64>()).ln());
    let s: f64 = g.iter().sum();
    g.map(|x| {
        if s > 0.0 {
            (x / s) as f32
        } else {
            1.0 / N as f32
        }
    })
}

impl Policy {
    /// The policy the flags select (`--auto-augment` with `--ra-magnitude`,
    /// `--augmix-severity`); none without `--auto-augment`.
    pub fn from_flags(f: &AugmentFlags) -> Option<Policy> {
        Some(match f.auto_augment? {
            AutoAugmentName::TaWide => Policy::TrivialAugmentWide,
            AutoAugmentName::Ra => Policy::RandAugment {
                magnitude: f.ra_magnitude,
            },
            AutoAugmentName::Augmix => Policy::AugMix {
                severity: f.augmix_severity,
            },
            AutoAugmentName::Imagenet => Policy::ImageNet,
        })
    }

    /// What the policy draws for an `h` × `w` image, as torchvision's `forward` draws it.
    pub fn draw(self, h: usize, w: usize, rng: &mut impl Rng) -> Draw {
        let bins = MAGNITUDE_BINS as usize;
        match self {
            Policy::TrivialAugmentWide => {
                let op = TA_OPS[rng.gen_range(0..TA_OPS.len())];
                let m = if magnitude(Space::Wide, op, bins, 0, h, w).is_some() {
                    let i = rng.gen_range(0..bins);
                    signed(Space::Wide, op, bins, i, h, w, rng)
                } else {
                    0.0
                };
                Draw::Ops(vec![(op, m)])
            }
            Policy::RandAugment { magnitude: i } => Draw::Ops(
                (0..2)
                    .map(|_| {
                        let op = TA_OPS[rng.gen_range(0..TA_OPS.len())];
                        (
                            op,
                            signed(Space::RandAugment, op, bins, i as usize, h, w, rng),
                        )
                    })
                    .collect(),
            ),
            Policy::ImageNet => {
                let sub = IMAGENET[rng.gen_range(0..IMAGENET.len())];
                let mut ops = Vec::new();
                for (op, p, i) in sub {
                    if rng.gen::<f32>() <= p as f32 {
                        ops.push((op, signed(Space::RandAugment, op, 10, i, h, w, rng)));
                    }
                }
                Draw::Ops(ops)
            }
            Policy::AugMix { severity } => {
                let m = dirichlet_ones::<2>(rng);
                let d = dirichlet_ones::<3>(rng);
                let max = AUGMIX_MAX_SEVERITY as usize;
                let chains = std::array::from_fn(|_| {
                    let depth = rng.gen_range(1..=3);
                    (0..depth)
                        .map(|_| {
                            let op = AUGMIX_OPS[rng.gen_range(0..AUGMIX_OPS.len())];
                            let i = rng.gen_range(0..severity.max(1) as usize);
                            (op, signed(Space::AugMix, op, max, i, h, w, rng))
                        })
                        .collect()
                });
                Draw::AugMix(AugMixDraw { m, d, chains })
            }
        }
    }
}

/// Reusable buffers of one loader thread.
#[derive(Debug, Default)]
pub struct Scratch {
    warp: Vec<u8>,
    chain: Rgb8,
    mix: Vec<f32>,
}

impl Draw {
    /// Applies the draw to `img` (the same pixels as torchvision's policy at these draws).
    pub fn apply(&self, img: &mut Rgb8, interpolation: Interpolation, s: &mut Scratch) {
        match self {
            Draw::Ops(ops) => {
                for &(op, m) in ops {
                    ops::apply(op, m, img, interpolation, &mut s.warp);
                }
            }
            Draw::AugMix(a) => a.apply(img, interpolation, s),
        }
    }
}

impl AugMixDraw {
    /// AugMix's mix in float32, as torchvision: `m0·x`, then each chain's image times its
    /// weight `d[i]·m1` added in turn; truncated to `uint8`.
    pub fn apply(&self, img: &mut Rgb8, interpolation: Interpolation, s: &mut Scratch) {
        let m0 = self.m[0];
        s.mix.clear();
        s.mix.extend(img.data.iter().map(|&v| m0 * f32::from(v)));
        for (chain, d) in self.chains.iter().zip(self.d) {
            let weight = d * self.m[1];
            s.chain.width = img.width;
            s.chain.height = img.height;
            s.chain.data.clear();
            s.chain.data.extend_from_slice(&img.data);
            for &(op, m) in chain {
                ops::apply(op, m, &mut s.chain, interpolation, &mut s.warp);
            }
            for (acc, &v) in s.mix.iter_mut().zip(&s.chain.data) {
                *acc += weight * f32::from(v);
            }
        }
        for (v, &x) in img.data.iter_mut().zip(&s.mix) {
            *v = x as u8;
        }
    }
}
