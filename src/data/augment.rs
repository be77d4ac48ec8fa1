//! Augmentation: torchvision's `RandomResizedCrop` + horizontal flip for training, resize +
//! center crop for evaluation.
use super::*;

// ---------------------------------------------------------------------------------------------
// Augmentation
// ---------------------------------------------------------------------------------------------

/// Training augmentation settings (torchvision's defaults: scale (0.08, 1), flip on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainAugment {
    /// Lower bound of RandomResizedCrop's area scale.
    pub min_scale: f64,
    /// RandomHorizontalFlip(0.5).
    pub hflip: bool,
}

impl Default for TrainAugment {
    fn default() -> Self {
        TrainAugment {
            min_scale: 0.08,
            hflip: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Augment {
    /// RandomResizedCrop(size, scale=(min_scale, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip(0.5).
    Train(TrainAugment),
    /// Resize(round(size * 256 / 224)) + CenterCrop(size).
    Eval,
}

/// Source crop box `(left, top, width, height)` in source pixels and the flip flag.
pub(super) fn crop_params(
    aug: Augment,
    w: u32,
    h: u32,
    size: usize,
    rng: &mut ChaCha8Rng,
) -> ((f64, f64, f64, f64), bool) {
    let (wf, hf) = (w as f64, h as f64);
    match aug {
        Augment::Train(t) => {
            let (wi, hi) = (w as i64, h as i64);
            let area = wf * hf;
            let (s0, s1) = (t.min_scale.clamp(1e-3, 1.0), 1.0f64);
            let (lr0, lr1) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
            let mut found = None;
            for _ in 0..10 {
                let target_area = area * if s0 < s1 { rng.gen_range(s0..s1) } else { s1 };
                let aspect = rng.gen_range(lr0..lr1).exp();
                let cw = (target_area * aspect).sqrt().round_ties_even() as i64;
                let ch = (target_area / aspect).sqrt().round_ties_even() as i64;
                if 0 < cw && cw <= wi && 0 < ch && ch <= hi {
                    let top = rng.gen_range(0..=hi - ch);
                    let left = rng.gen_range(0..=wi - cw);
                    found = Some((left, top, cw, ch));
                    break;
                }
            }
            let (left, top, cw, ch) = found.unwrap_or_else(|| {
                // torchvision fallback: central crop clamped to the ratio range
                let in_ratio = wf / hf;
                let (cw, ch) = if in_ratio < 3.0 / 4.0 {
                    (
                        wi,
                        ((wf / (3.0 / 4.0)).round_ties_even() as i64).clamp(1, hi),
                    )
                } else if in_ratio > 4.0 / 3.0 {
                    (
                        ((hf * (4.0 / 3.0)).round_ties_even() as i64).clamp(1, wi),
                        hi,
                    )
                } else {
                    (wi, hi)
                };
                ((wi - cw) / 2, (hi - ch) / 2, cw, ch)
            });
            let flip = rng.gen_bool(0.5) && t.hflip;
            ((left as f64, top as f64, cw as f64, ch as f64), flip)
        }
        Augment::Eval => {
            let short_target = ((size as f64) * 256.0 / 224.0).round_ties_even().max(1.0);
            let (new_w, new_h) = if w <= h {
                (short_target, (short_target * hf / wf).floor())
            } else {
                ((short_target * wf / hf).floor(), short_target)
            };
            let (new_w, new_h) = (new_w.max(size as f64), new_h.max(size as f64));
            let s = size as f64;
            let top = ((new_h - s) / 2.0).round_ties_even();
            let left = ((new_w - s) / 2.0).round_ties_even();
            let (sx, sy) = (wf / new_w, hf / new_h);
            ((left * sx, top * sy, s * sx, s * sy), false)
        }
    }
}
