//! Dynamic loss scaling for fp16 autocast: torch's `GradScaler` (initial scale 2^16, ×2 after
//! 2000 finite steps in a row, ×0.5 and the step skipped when a gradient overflowed) kept on
//! the device, so a step reads nothing back on the host (issue 30). The scale, its growth
//! tracker and the step's overflow flag are 0-d tensors: unscaling and the check are one fused
//! kernel group (`_amp_foreach_non_finite_check_and_unscale_`), the fused SGD and AdamW
//! kernels take the flag and skip an overflowing step themselves (torch's `fused=True`
//! optimizers under a GradScaler), and `_amp_update_scale_` updates the scale. The step's row
//! of the `StepWindow` carries the flag and the new scale to the host when the window is read,
//! which warns of each skipped step there. RMSprop (no fused kernel in torch) reads the flag
//! before its step, as torch's GradScaler does with an optimizer that cannot take it. A
//! checkpoint keeps the scale and its growth count (`LossScalerState`).
use crate::comm::pg::C10dError;
use tch::{Device, Kind, Tensor};
use tchrun::checkpoint::LossScalerState;

/// torch's `GradScaler` defaults.
pub(crate) const INITIAL_SCALE: f64 = 65536.0;
const GROWTH_FACTOR: f64 = 2.0;
const BACKOFF_FACTOR: f64 = 0.5;
const GROWTH_INTERVAL: i64 = 2000;

/// The scaler's state on the device.
struct Scaling {
    /// The loss's multiplier (float).
    scale: Tensor,
    /// Finite steps in a row since the scale last changed (int32, as torch keeps it).
    growth_tracker: Tensor,
    /// 1 when the last checked gradients held a NaN or an infinity, else 0 (float).
    found_inf: Tensor,
    /// 1 / scale, refilled every step (persistent: no allocation per step).
    inv_scale: Tensor,
}

/// Loss scaling on (fp16 autocast on CUDA, or the `TCHRUN_TEST_LOSS_SCALE` hook) or off
/// (scale 1, nothing checked, every step taken).
pub(crate) struct LossScaler {
    on: Option<Scaling>,
}

impl LossScaler {
    pub(crate) fn off() -> LossScaler {
        LossScaler { on: None }
    }

    /// Scaling on `device` from `scale`.
    pub(crate) fn on(device: Device, scale: f64) -> LossScaler {
        let float = (Kind::Float, device);
        LossScaler {
            on: Some(Scaling {
                scale: Tensor::full([], scale, float),
                growth_tracker: Tensor::zeros([], (Kind::Int, device)),
                found_inf: Tensor::zeros([], float),
                inv_scale: Tensor::zeros([], float),
            }),
        }
    }

    /// The run's scaler: on for fp16 autocast on CUDA (from 2^16) or under the test hook (from
    /// its `hook` scale, on any device), continuing the checkpoint's scaler when the resumed
    /// run had one (`resumed`); off otherwise.
    pub(crate) fn of_run(
        device: Device,
        fp16_cuda: bool,
        hook: Option<f64>,
        resumed: Option<LossScalerState>,
    ) -> LossScaler {
        match (fp16_cuda.then_some(INITIAL_SCALE).or(hook), resumed) {
            (None, _) => LossScaler::off(),
            (Some(_), Some(state)) => LossScaler::resumed(device, state),
            (Some(scale), None) => LossScaler::on(device, scale),
        }
    }

    /// The scaler's state in checkpoint `meta`, when its run scaled the loss. A checkpoint
    /// written before the state was recorded holds the scale alone, 1 when its run did not
    /// scale.
    pub(crate) fn in_checkpoint(meta: &tchrun::checkpoint::Last) -> Option<LossScalerState> {
        meta.loss_scaler.or_else(|| {
            (meta.loss_scale != 1.0).then_some(LossScalerState {
                scale: meta.loss_scale,
                growth_tracker: 0,
            })
        })
    }

    /// Scaling on `device`, continuing a checkpoint's scaler.
    pub(crate) fn resumed(device: Device, state: LossScalerState) -> LossScaler {
        let mut s = LossScaler::on(device, state.scale);
        if let Some(on) = s.on.as_mut() {
            tch::no_grad(|| {
                let _ = on.growth_tracker.fill_(i64::from(state.growth_tracker));
            });
        }
        s
    }

    /// The state a checkpoint keeps (read on the host), `None` when off.
    pub(crate) fn state(&self) -> Option<LossScalerState> {
        self.on.as_ref().map(|s| LossScalerState {
            scale: s.scale.double_value(&[]),
            growth_tracker: s.growth_tracker.int64_value(&[]).max(0) as u32,
        })
    }

    pub(crate) fn enabled(&self) -> bool {
        self.on.is_some()
    }

    /// The scale now, read on the host (1 when off): for the epoch's summary, which reads the
    /// window (and so waits for the device) first anyway.
    pub(crate) fn scale(&self) -> f64 {
        self.on.as_ref().map_or(1.0, |s| s.scale.double_value(&[]))
    }

    /// `loss` × the scale for backward (the loss itself when off). The multiplication runs on
    /// the device; a power of two, it is exact.
    pub(crate) fn scaled(&self, loss: &Tensor) -> Tensor {
        match &self.on {
            Some(s) => loss * &s.scale,
            None => loss.shallow_clone(),
        }
    }

    /// Divides the (reduced, identical on every rank) gradients of `params` by the scale and
    /// sets the overflow flag, on the device; returns the flag (a 0-d float tensor, 1: skip the
    /// step), `None` when off. Nothing is read on the host.
    pub(crate) fn unscale(
        &mut self,
        params: &[(String, Tensor)],
    ) -> Result<Option<Tensor>, C10dError> {
        let Some(s) = self.on.as_mut() else {
            return Ok(None);
        };
        let grads: Vec<Tensor> = params
            .iter()
            .map(|(_, p)| p.grad())
            .filter(|g| g.defined())
            .collect();
        tch::no_grad(|| {
            let _ = s.found_inf.zero_();
            let _ = s.scale.reciprocal_out(&s.inv_scale);
        });
        crate::comm::pg::amp_unscale(&grads, &s.found_inf, &s.inv_scale)?;
        Ok(Some(s.found_inf.shallow_clone()))
    }

    /// After the step: the scale halves when the flag is set (and the growth count restarts),
    /// else the count grows and the scale doubles every `GROWTH_INTERVAL` finite steps.
    pub(crate) fn update(&mut self) {
        if let Some(s) = self.on.as_mut() {
            tch::no_grad(|| {
                let _ = s.scale.internal_amp_update_scale_(
                    &s.growth_tracker,
                    &s.found_inf,
                    GROWTH_FACTOR,
                    BACKOFF_FACTOR,
                    GROWTH_INTERVAL,
                );
            });
        }
    }

    /// The last checked step's overflow flag and the scale after its update, for the step's
    /// row in the window (on the device; `None` when off).
    pub(crate) fn flags(&self) -> Option<(&Tensor, &Tensor)> {
        self.on.as_ref().map(|s| (&s.found_inf, &s.scale))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn param(values: &[f32], scale: f32) -> (String, Tensor) {
        let p = Tensor::zeros([values.len() as i64], (Kind::Float, Device::Cpu))
            .set_requires_grad(true);
        let g = Tensor::from_slice(values);
        (&p * &g * f64::from(scale)).sum(Kind::Float).backward();
        ("p".into(), p)
    }

    /// Unscaling divides by the scale and raises the flag on a NaN or an infinity; the update
    /// halves the scale on an overflow and doubles it after 2000 finite steps, as torch's
    /// GradScaler does, also across a checkpoint; nothing of it needs a read on the host until
    /// `scale()`.
    #[test]
    fn the_scale_backs_off_on_overflow_and_grows_after_2000_finite_steps() {
        let mut s = LossScaler::on(Device::Cpu, 1024.0);
        let p = param(&[1.0, -2.0], 1024.0);
        let found = s
            .unscale(std::slice::from_ref(&p))
            .expect("unscale")
            .expect("on");
        assert_eq!(found.double_value(&[]), 0.0);
        assert_eq!(
            Vec::<f32>::try_from(p.1.grad()).expect("grad"),
            vec![1.0, -2.0]
        );
        s.update();
        assert_eq!(s.scale(), 1024.0);
        for bad in [f32::NAN, f32::INFINITY] {
            let q = param(&[1.0, bad], 1.0);
            let found = s.unscale(&[q]).expect("unscale").expect("on");
            assert_eq!(found.double_value(&[]), 1.0);
            s.update();
        }
        assert_eq!(s.scale(), 256.0);
        // The flag is cleared for the next check.
        let q = param(&[3.0], 1.0);
        s.unscale(&[q]).expect("unscale");
        assert_eq!(s.flags().expect("on").0.double_value(&[]), 0.0);
        let mut s = LossScaler::on(Device::Cpu, 8.0);
        for _ in 0..GROWTH_INTERVAL - 1 {
            s.update();
        }
        assert_eq!(s.scale(), 8.0);
        // A checkpoint's state carries the growth count: the resumed scaler grows on its next
        // finite step, as the uninterrupted one would.
        let state = s.state().expect("on");
        assert_eq!((state.scale, state.growth_tracker), (8.0, 1999));
        let mut s = LossScaler::resumed(Device::Cpu, state);
        s.update();
        assert_eq!(s.scale(), 16.0);
        let mut off = LossScaler::off();
        assert!(off
            .unscale(&[param(&[f32::NAN], 1.0)])
            .expect("off")
            .is_none());
        assert_eq!((off.scale(), off.state()), (1.0, None));
    }
}
