//! The learning-rate schedule: effective LR = lr × world size; linear warmup over the first
//! `warmup_epochs`; then polynomial decay `(1 - t)^power` reaching 0 at the end of the last step.

/// A schedule over `total_steps` optimizer steps.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LrSchedule {
    /// `lr × world_size` (the seed's "actual learning rate").
    pub peak: f64,
    pub warmup_steps: u64,
    pub total_steps: u64,
    pub power: f64,
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
        let total_steps = (epochs as u64 * steps_per_epoch).max(1);
        let warmup_steps = (warmup_epochs as u64 * steps_per_epoch).min(total_steps);
        LrSchedule {
            peak: lr * world_size as f64,
            warmup_steps,
            total_steps,
            power,
        }
    }

    /// The LR used by optimizer step `step` (0-based).
    pub fn lr(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let decay_steps = self.total_steps - self.warmup_steps;
        if decay_steps == 0 {
            return self.peak;
        }
        let t = (step - self.warmup_steps).min(decay_steps) as f64 / decay_steps as f64;
        self.peak * (1.0 - t).powf(self.power)
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
}
