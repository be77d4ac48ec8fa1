//! The learning-rate schedule: effective LR = lr scaled by the batch of one optimizer step
//! (`--lr-scaling`: × k, × √k or × 1, k = the images of one optimizer step over the batch
//! `--lr` is given for, `lr_reference_batch`: the world size by default, 1 with
//! `--global-batch-size G`, never a function of the micro-batch then); linear warmup over the first `warmup_epochs`; then polynomial decay
//! `(1 - t)^power` reaching 0 at the end of the last step; or, with `--lr-scheduler` one of
//! torchvision's (`epoch_lr`), its LR per epoch, constant within the epoch. Also the accumulation steps of
//! `--global-batch-size` (`accumulation_steps`) and early stopping.
use crate::flags::LrScaling;
use crate::recipe::{RecipeFlags, WarmupMethod};

/// `--global-batch-size G` with `--batch-size B` on `world` ranks: the micro-batches each rank
/// accumulates per optimizer step, `A = G / (world × B)`, which must be a positive integer.
/// The error names both flags, the world size and the valid values.
pub fn accumulation_steps(global: u32, batch: u32, world: usize) -> Result<u32, String> {
    let per_step = world as u64 * batch as u64;
    if per_step > 0 && (global as u64).is_multiple_of(per_step) && global as u64 >= per_step {
        return Ok((global as u64 / per_step) as u32);
    }
    let valid: Vec<String> = (1..=4).map(|a| (a * per_step).to_string()).collect();
    // Every divisor of G / world is a --batch-size that fits (when world divides G).
    let batches: Vec<String> = divisors(global as u64 / (world as u64).max(1))
        .into_iter()
        .map(|b| b.to_string())
        .collect();
    let mut msg = format!(
        "--global-batch-size {global} is not a multiple of world size {world} × --batch-size \
         {batch} = {per_step}: each rank must accumulate a whole number of micro-batches per \
         optimizer step. Use --global-batch-size {}, ... (multiples of {per_step})",
        valid.join(", ")
    );
    if (global as u64).is_multiple_of(world as u64) && !batches.is_empty() {
        msg.push_str(&format!(
            ", or a --batch-size dividing {}: {}",
            global as u64 / world as u64,
            batches.join(", ")
        ));
    } else {
        msg.push_str(&format!(
            "; with {world} ranks the global batch must be a multiple of {world}"
        ));
    }
    Err(msg)
}

fn divisors(n: u64) -> Vec<u64> {
    (1..=n.min(1 << 20))
        .filter(|d| n.is_multiple_of(*d))
        .collect()
}

/// The batch `--lr` is given for: `--lr-reference-batch` when set; else, with
/// `--global-batch-size G`, G itself (`--lr` is the LR of the global batch, as torchvision's
/// `--lr` is that of the batch it was tuned with); else `--batch-size` (`--lr` is the LR of one
/// rank's batch, so the factor is the world size). Never the micro-batch when G is given: that
/// is a memory choice and must not change the training.
pub fn lr_reference_batch(batch_size: u32, global: Option<u32>, reference: Option<u32>) -> u32 {
    reference.or(global).unwrap_or(batch_size)
}

/// The LR factor for `k` = `step_images` / `reference` (the images of one optimizer step over
/// every rank against the batch `--lr` is given for) under `scaling`, and how the log writes
/// it ("4", "√8", "1", "32/256").
pub fn lr_factor(scaling: LrScaling, step_images: u64, reference: u32) -> (f64, String) {
    let r = u64::from(reference.max(1));
    let k = step_images as f64 / r as f64;
    let text = if step_images.is_multiple_of(r) {
        (step_images / r).to_string()
    } else {
        format!("{step_images}/{r}")
    };
    match scaling {
        LrScaling::Linear => (k, text),
        LrScaling::Sqrt if step_images.is_multiple_of(r) => (k.sqrt(), format!("√{text}")),
        LrScaling::Sqrt => (k.sqrt(), format!("√({text})")),
        LrScaling::None => (1.0, "1".into()),
    }
}

/// A schedule over `total_steps` optimizer steps.
#[derive(Debug, Clone, PartialEq)]
pub struct LrSchedule {
    /// The scaled LR (by default `lr × world_size`, the seed's "actual learning rate").
    pub peak: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub power: f64,
    /// Poly's warmup other than the default linear rise from peak/warmup steps
    /// (`--lr-warmup-method`, `--lr-warmup-decay`), per optimizer step `s < W`: linear, torch's
    /// LinearLR law `d + (1 - d) · s / W`; constant, `d`.
    pub warmup_law: Option<(WarmupMethod, f64)>,
    /// torchvision's per-epoch schedulers: each epoch's LR (`epoch_lr::epoch_lrs`) and the
    /// optimizer steps of an epoch.
    pub per_epoch: Option<(Vec<f64>, u64)>,
}

impl LrSchedule {
    pub fn new(
        lr: f64,
        world_size: usize,
        warmup_epochs: u32,
        epochs: u32,
        steps_per_epoch: u64,
        power: f64,
    ) -> LrSchedule {
        LrSchedule::with_peak(
            lr * world_size as f64,
            warmup_epochs,
            epochs,
            steps_per_epoch,
            power,
        )
    }

    /// A schedule that peaks at `peak` (the LR already scaled, see `lr_factor`).
    pub fn with_peak(
        peak: f64,
        warmup_epochs: u32,
        epochs: u32,
        steps_per_epoch: u64,
        power: f64,
    ) -> LrSchedule {
        let total_steps = (epochs as u64 * steps_per_epoch).max(1);
        let warmup_steps = (warmup_epochs as u64 * steps_per_epoch).min(total_steps);
        LrSchedule {
            peak,
            warmup_steps,
            total_steps,
            power,
            warmup_law: None,
            per_epoch: None,
        }
    }

    /// The schedule of `recipe` (`--lr-scheduler` and its warmup flags) over `epochs` epochs
    /// of `steps_per_epoch` optimizer steps, `warmup_epochs` of them warmup. Poly with the
    /// default warmup is `with_peak`'s schedule, unchanged.
    pub fn of_recipe(
        self,
        recipe: &RecipeFlags,
        warmup_epochs: u32,
        epochs: u32,
        steps_per_epoch: u64,
    ) -> LrSchedule {
        if recipe.lr_scheduler.per_epoch() {
            let lrs = crate::epoch_lr::epoch_lrs(self.peak, epochs, warmup_epochs, recipe);
            return LrSchedule {
                per_epoch: Some((lrs, steps_per_epoch.max(1))),
                ..self
            };
        }
        let law = recipe.warmup_decay().map(|d| (recipe.lr_warmup_method, d));
        LrSchedule {
            warmup_law: law,
            ..self
        }
    }

    /// The LR used by optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if let Some((lrs, per_epoch)) = &self.per_epoch {
            let e = (step / per_epoch) as usize;
            return lrs.get(e).or(lrs.last()).copied().unwrap_or(self.peak);
        }
        if let Some((method, d)) = self.warmup_law {
            if step < self.warmup_steps {
                return match method {
                    WarmupMethod::Linear => {
                        self.peak * (d + (1.0 - d) * step as f64 / self.warmup_steps as f64)
                    }
                    WarmupMethod::Constant => self.peak * d,
                };
            }
        }
        if step + 1 < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        if step < self.warmup_steps {
            return self.peak; // the last warmup step, exactly (no rounding above the peak)
        }
        let decay_steps = self.total_steps - self.warmup_steps;
        if decay_steps == 0 {
            return self.peak;
        }
        let t = (step - self.warmup_steps).min(decay_steps) as f64 / decay_steps as f64;
        self.peak * (1.0 - t).powf(self.power)
    }
}

/// Early stopping on validation loss: stop once it has not decreased for `patience` epochs.
#[derive(Debug, Clone, PartialEq)]
pub struct EarlyStopping {
    pub patience: u32,
    /// Lowest validation loss so far and its 1-based epoch.
    pub best: Option<(f64, u32)>,
    /// Epochs since the best one.
    pub since_best: u32,
}

/// What to do after an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// A new best model: keep it, go on.
    Improved,
    /// No improvement, patience left.
    Continue,
    /// No improvement for `patience` epochs.
    Stop,
}

impl EarlyStopping {
    pub fn new(patience: u32) -> EarlyStopping {
        EarlyStopping {
            patience,
            best: None,
            since_best: 0,
        }
    }

    /// Records epoch `epoch` (1-based) with validation loss `loss` (NaN never improves).
    pub fn update(&mut self, epoch: u32, loss: f64) -> Decision {
        let improved = match self.best {
            None => !loss.is_nan(),
            Some((b, _)) => loss < b,
        };
        if improved {
            self.best = Some((loss, epoch));
            self.since_best = 0;
            Decision::Improved
        } else {
            self.since_best += 1;
            if self.since_best >= self.patience {
                Decision::Stop
            } else {
                Decision::Continue
            }
        }
    }
}

#[cfg(test)]
mod early_stopping_tests {
    use super::*;

    #[test]
    fn stops_after_patience_epochs_without_improvement() {
        let mut e = EarlyStopping::new(2);
        assert_eq!(e.update(1, 1.0), Decision::Improved);
        assert_eq!(e.update(2, 0.5), Decision::Improved);
        assert_eq!(e.update(3, 0.5), Decision::Continue); // equal is not a decrease
        assert_eq!(e.update(4, 0.7), Decision::Stop);
        assert_eq!(e.best, Some((0.5, 2)));
        let mut e = EarlyStopping::new(1);
        assert_eq!(e.update(1, f64::NAN), Decision::Stop);
        let mut e = EarlyStopping::new(3);
        for (i, l) in [3.0, 2.0, 2.5, 2.4, 1.9, 2.0].iter().enumerate() {
            assert_ne!(e.update(i as u32 + 1, *l), Decision::Stop);
        }
        assert_eq!(e.best, Some((1.9, 5)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_warmup_decay() {
        // lr 0.01 on 4 ranks, 2 warmup epochs of 10 steps, 5 epochs, linear decay.
        let s = LrSchedule::new(0.01, 4, 2, 5, 10, 1.0);
        assert_eq!(s.peak, 0.04);
        assert_eq!((s.warmup_steps, s.total_steps), (20, 50));
        assert!((s.lr(0) - 0.04 / 20.0).abs() < 1e-15);
        assert!((s.lr(9) - 0.02).abs() < 1e-15);
        assert!((s.lr(19) - 0.04).abs() < 1e-15);
        assert!((s.lr(20) - 0.04).abs() < 1e-15);
        assert!((s.lr(35) - 0.02).abs() < 1e-15);
        assert!((s.lr(49) - 0.04 / 30.0).abs() < 1e-15);
        assert_eq!(s.lr(50), 0.0);
        // Monotone after warmup.
        assert!((20..50).all(|i| s.lr(i + 1) <= s.lr(i)));
    }

    #[test]
    fn power_and_no_warmup() {
        let s = LrSchedule::new(0.1, 1, 0, 2, 5, 2.0);
        assert_eq!(s.lr(0), 0.1);
        assert!((s.lr(5) - 0.1 * 0.25).abs() < 1e-15);
        assert_eq!(s.lr(10), 0.0);
        // Warmup as long as training: never decays.
        let w = LrSchedule::new(0.1, 2, 3, 3, 4, 1.0);
        assert!((w.lr(11) - 0.2).abs() < 1e-15);
    }

    #[test]
    fn lr_scaling_follows_the_factor() {
        assert_eq!(lr_factor(LrScaling::Linear, 8, 1), (8.0, "8".to_string()));
        assert_eq!(
            lr_factor(LrScaling::Linear, 32, 256),
            (0.125, "32/256".to_string())
        );
        assert_eq!(lr_factor(LrScaling::Sqrt, 64, 256).1, "√(64/256)");
        let (f, s) = lr_factor(LrScaling::Sqrt, 16, 1);
        assert_eq!((f, s.as_str()), (4.0, "√16"));
        assert_eq!(lr_factor(LrScaling::None, 8, 1), (1.0, "1".to_string()));
        // The reference batch: the flag, else G, else --batch-size (k = world size); with a
        // global batch never the micro-batch.
        assert_eq!(lr_reference_batch(16, None, None), 16);
        for micro in [4, 8, 16] {
            assert_eq!(lr_reference_batch(micro, Some(32), None), 32);
            assert_eq!(lr_reference_batch(micro, Some(32), Some(256)), 256);
        }
        assert_eq!(lr_reference_batch(16, None, Some(256)), 256);
        // The default (linear over the world size) is today's schedule, bit for bit.
        let s = LrSchedule::with_peak(0.01 * lr_factor(LrScaling::Linear, 4, 1).0, 2, 5, 10, 1.0);
        assert_eq!(s, LrSchedule::new(0.01, 4, 2, 5, 10, 1.0));
        let q = LrSchedule::with_peak(0.01 * lr_factor(LrScaling::Sqrt, 4, 1).0, 0, 1, 10, 1.0);
        assert_eq!(q.lr(0), 0.02);
    }

    #[test]
    fn accumulation_steps_must_be_whole() {
        assert_eq!(accumulation_steps(32, 8, 2), Ok(2));
        assert_eq!(accumulation_steps(32, 8, 4), Ok(1));
        assert_eq!(accumulation_steps(32, 16, 1), Ok(2));
        let e = accumulation_steps(24, 8, 2).expect_err("24 is not a multiple of 16");
        assert!(
            e.contains("--global-batch-size 24")
                && e.contains("world size 2")
                && e.contains("--batch-size 8")
                && e.contains("16, 32, 48, 64")
                && e.contains("--batch-size dividing 12: 1, 2, 3, 4, 6, 12"),
            "{e}"
        );
        // Smaller than one micro-batch per rank.
        assert!(accumulation_steps(8, 8, 2).is_err());
        let e = accumulation_steps(7, 1, 2).expect_err("odd over 2 ranks");
        assert!(e.contains("must be a multiple of 2"), "{e}");
    }
}
