//! torchvision's per-epoch LR schedules, as `torch.optim.lr_scheduler` computes them: the
//! warmup (`LinearLR(start_factor = decay, total_iters = W)` or `ConstantLR(factor = decay,
//! total_iters = W)`) then the main scheduler (`CosineAnnealingLR(T_max = epochs - W,
//! eta_min)`, `StepLR(step_size, gamma)`, `ExponentialLR(gamma)`) joined by
//! `SequentialLR(milestones = [W])`, stepped once per epoch as torchvision's train.py does.
//! The values are torch's own arithmetic (its recursive, "chainable" forms, in the same f64
//! operations and order; the main scheduler restarts at the milestone from its closed form), so
//! a torchvision recipe gets the same LR at every epoch, bit for bit
//! (`tests/lr_schedulers.rs` against torch itself).
use crate::recipe::{LrScheduler, RecipeFlags, WarmupMethod};

/// The LR of each of the `epochs` epochs for a base LR `base` (the LR after `--lr-scaling`),
/// `warmup` warmup epochs and the recipe's scheduler. Poly (not an epoch scheduler) gives
/// `base` throughout: callers use `schedule::LrSchedule` for it.
pub fn epoch_lrs(base: f64, epochs: u32, warmup: u32, r: &RecipeFlags) -> Vec<f64> {
    let decay = r.warmup_decay().unwrap_or(crate::recipe::WARMUP_DECAY);
    let mut main = Main::new(base, epochs.saturating_sub(warmup), r);
    let mut out = Vec::with_capacity(epochs as usize);
    // SequentialLR's constructor: the optimizer's LR reset to the base, then the first
    // scheduler's initial step (warmup), or the main one alone without a warmup.
    let mut lr = if warmup > 0 {
        base * decay // LinearLR and ConstantLR at last_epoch 0
    } else {
        base // every main scheduler leaves the LR at its initial step
    };
    for e in 0..epochs {
        if e > 0 {
            lr = if e < warmup {
                warmup_step(lr, e, warmup, decay, r.lr_warmup_method)
            } else if e == warmup {
                main.closed_form_at_zero() // SequentialLR: `_update_lr(0)` at the milestone
            } else {
                main.step(lr, (e - warmup) as i64)
            };
        }
        out.push(lr);
    }
    out
}

/// The warmup scheduler's `get_lr` at `last_epoch` `e` (0 < e < W).
fn warmup_step(lr: f64, e: u32, w: u32, decay: f64, method: WarmupMethod) -> f64 {
    match method {
        WarmupMethod::Linear => {
            let (start, end) = (decay, 1.0f64);
            lr * (1.0 + (end - start) / (f64::from(w) * start + f64::from(e - 1) * (end - start)))
        }
        // ConstantLR changes the LR only at last_epoch == total_iters (the milestone).
        WarmupMethod::Constant => lr,
    }
}

/// The main scheduler and its parameters.
struct Main {
    kind: LrScheduler,
    base: f64,
    t_max: i64,
    eta_min: f64,
    step_size: i64,
    gamma: f64,
}

impl Main {
    fn new(base: f64, t_max: u32, r: &RecipeFlags) -> Main {
        Main {
            kind: r.lr_scheduler,
            base,
            t_max: i64::from(t_max),
            eta_min: r.lr_min,
            step_size: i64::from(r.lr_step_size.max(1)),
            gamma: r.lr_gamma,
        }
    }

    /// `_get_closed_form_lr` at last_epoch 0.
    fn closed_form_at_zero(&self) -> f64 {
        match self.kind {
            LrScheduler::Cosineannealinglr => {
                let t = self.t_max.max(1) as f64;
                self.eta_min
                    + (self.base - self.eta_min) * (1.0 + (std::f64::consts::PI * 0.0 / t).cos())
                        / 2.0
            }
            LrScheduler::Steplr | LrScheduler::Exponentiallr => self.base * self.gamma.powi(0),
            LrScheduler::Poly => self.base,
        }
    }

    /// `get_lr` (the recursive form) at `last_epoch` `e` ≥ 1 from the previous LR `lr`.
    fn step(&mut self, lr: f64, e: i64) -> f64 {
        use std::f64::consts::PI;
        match self.kind {
            LrScheduler::Cosineannealinglr => {
                if self.t_max == 0 {
                    return lr; // torch divides by zero here; never reached within --epochs
                }
                let t = self.t_max as f64;
                if (e - 1 - self.t_max).rem_euclid(2 * self.t_max) == 0 {
                    lr + (self.base - self.eta_min) * (1.0 - (PI / t).cos()) / 2.0
                } else {
                    (1.0 + (PI * e as f64 / t).cos()) / (1.0 + (PI * (e - 1) as f64 / t).cos())
                        * (lr - self.eta_min)
                        + self.eta_min
                }
            }
            LrScheduler::Steplr if e % self.step_size == 0 => lr * self.gamma,
            LrScheduler::Steplr => lr,
            LrScheduler::Exponentiallr => lr * self.gamma,
            LrScheduler::Poly => lr,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recipe(s: LrScheduler) -> RecipeFlags {
        RecipeFlags {
            lr_scheduler: s,
            ..RecipeFlags::default()
        }
    }

    #[test]
    fn warmup_then_main() {
        let r = recipe(LrScheduler::Steplr);
        let l = epoch_lrs(
            0.5,
            8,
            2,
            &RecipeFlags {
                lr_step_size: 2,
                ..r
            },
        );
        assert_eq!(l.len(), 8);
        assert_eq!(l[0], 0.5 * 0.01);
        assert!((l[1] - 0.5 * 0.505).abs() < 1e-15, "{l:?}");
        assert_eq!(l[2], 0.5); // the milestone: the main scheduler's first value
        assert_eq!(l[3], 0.5);
        assert!((l[4] - 0.05).abs() < 1e-15);
        let c = epoch_lrs(1.0, 5, 0, &recipe(LrScheduler::Cosineannealinglr));
        assert_eq!(c[0], 1.0);
        assert!((c[1] - (1.0 + (std::f64::consts::PI / 5.0).cos()) / 2.0).abs() < 1e-15);
        assert!(c.windows(2).all(|w| w[1] < w[0]));
        let e = epoch_lrs(1.0, 3, 1, &recipe(LrScheduler::Exponentiallr));
        assert_eq!(e, vec![0.01, 1.0, 0.1]);
    }
}
