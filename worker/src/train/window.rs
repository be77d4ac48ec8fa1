//! The steps between two reads of the device (issue 30). Each optimizer step leaves its reduced
//! mean loss, samples, stop vote and the divergence guard's total in its row of one persistent
//! buffer on the device; the host reads every row at once when the trainer asks: at the print
//! frequency, before any checkpoint or model write, at an epoch's end, and when the buffer is
//! full. So a CUDA step never waits for the device (the launch queue stays ahead), no
//! non-finite value is ever written (every write reads first), and the first failing step is
//! still named, with its LR. The read points depend only on the step, so every rank reads the
//! same rows at the same step and a stop vote stops every rank together. Knows no model and no
//! data: the trainer pushes rows and decides when to read.
use super::state::Epoch;
use crate::comm::ddp::StepStats;
use tch::{Device, Kind, Tensor};

/// Rows a CUDA window holds before it must be read (a 10–100 ms step: a stop is seen within
/// 0.3–3 s). CPU steps are slower and a read costs nothing there; its windows stay short so a
/// stop is seen within about a second, and the tests run the same code as CUDA.
const CUDA_ROWS: usize = 32;
const CPU_ROWS: usize = 4;

/// Columns of a row: mean loss, samples, stop vote, the guard's total (0 without an update),
/// and the loss scaler's overflow flag (1: the device skipped the update) and scale after the
/// step (both 0 without the scaler).
const COLS: i64 = 6;

/// Where a row's step stands: for the message of a step that went non-finite.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowInfo {
    pub(crate) step: u64,
    /// 1-based, as the driver log says it.
    pub(crate) epoch: u32,
    /// The LR the step's loss was computed after (the previous update's).
    pub(crate) lr_before: f64,
    /// The LR of the step's own update.
    pub(crate) lr_after: f64,
}

/// What the host learnt from a read.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct Read {
    /// Σ loss × samples and Σ samples over the rows (for the epoch's mean and images/s).
    pub(super) loss_sum: f64,
    pub(super) samples: f64,
    /// The last row's mean loss (the progress line's).
    pub(super) last_loss: f64,
    /// Some rank voted to stop in one of the rows.
    pub(super) stop: bool,
    pub(super) rows: usize,
    /// Rows whose update the loss scaler skipped (fp16 overflow).
    pub(super) overflowed: usize,
}

/// A row's step went non-finite.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum NonFinite {
    /// Its loss (before its update), with the value.
    Loss { row: usize, value: f64 },
    /// The weights after its update (the guard's total).
    Weights { row: usize },
}

pub(crate) struct StepWindow {
    rows: Tensor,
    info: Vec<RowInfo>,
    capacity: usize,
    /// Rows carry the loss scaler's columns.
    scaled: bool,
}

/// The loss scaler's flags of a step (`LossScaler::flags`): its overflow flag and the scale
/// after it, 0-d on the device.
pub(crate) type ScalerFlags<'a> = Option<(&'a Tensor, &'a Tensor)>;

impl StepWindow {
    /// A window on `device`; `scaled`: the run scales its loss (fp16), so rows carry the
    /// scaler's columns.
    pub(crate) fn new(device: Device, scaled: bool) -> StepWindow {
        let capacity = if device.is_cuda() {
            CUDA_ROWS
        } else {
            CPU_ROWS
        };
        StepWindow::with_capacity(capacity, device, scaled)
    }

    fn with_capacity(capacity: usize, device: Device, scaled: bool) -> StepWindow {
        StepWindow {
            rows: Tensor::zeros([capacity as i64, COLS], (Kind::Double, device)),
            info: Vec::with_capacity(capacity),
            capacity,
            scaled,
        }
    }

    /// The step's row: its stats, the guard's `total` and the scaler's `flags` when it checked
    /// this step (copies on the device, no read). Full: the caller reads before the next push
    /// (`is_full`); a push into a full window overwrites its last row (never happens in the
    /// trainer, which reads first).
    pub(crate) fn push(
        &mut self,
        stats: &StepStats,
        total: Option<&Tensor>,
        flags: ScalerFlags,
        info: RowInfo,
    ) {
        let i = self.info.len().min(self.capacity - 1);
        tch::no_grad(|| {
            let row = self.rows.get(i as i64);
            row.narrow(0, 0, 3).copy_(&stats.tail);
            let mut guard = row.get(3);
            match total {
                Some(t) => guard.copy_(t),
                None => {
                    let _ = guard.fill_(0.0);
                }
            }
            if self.scaled {
                let mut overflow = row.get(4);
                match flags {
                    Some((found_inf, scale)) => {
                        overflow.copy_(found_inf);
                        row.get(5).copy_(scale);
                    }
                    None => {
                        let _ = overflow.fill_(0.0);
                    }
                }
            }
        });
        if self.info.len() < self.capacity {
            self.info.push(info);
        } else if let Some(last) = self.info.last_mut() {
            *last = info;
        }
    }

    pub(crate) fn is_full(&self) -> bool {
        self.info.len() >= self.capacity
    }

    /// Reads every row (one copy to the host) and empties the window: the sums, or the first
    /// row that went non-finite (its loss first: it came before its update).
    pub(crate) fn read(&mut self) -> Result<Read, (NonFinite, RowInfo)> {
        let n = self.info.len();
        let info = std::mem::take(&mut self.info);
        if n == 0 {
            return Ok(Read::default());
        }
        let values = Vec::<f64>::try_from(
            self.rows
                .narrow(0, 0, n as i64)
                .reshape([-1])
                .to_device(Device::Cpu),
        )
        .unwrap_or_else(|_| vec![f64::NAN; n * COLS as usize]);
        let mut read = Read {
            rows: n,
            ..Read::default()
        };
        for (row, (v, at)) in values.chunks(COLS as usize).zip(&info).enumerate() {
            let (loss, samples, stop, total) = (v[0], v[1], v[2], v[3]);
            if v[4] != 0.0 {
                read.overflowed += 1;
                tracing::warn!(
                    step = at.step,
                    scale = v[5],
                    "fp16 gradients overflowed; step skipped, loss scale lowered"
                );
            }
            if !loss.is_finite() {
                return Err((NonFinite::Loss { row, value: loss }, *at));
            }
            if !total.is_finite() {
                return Err((NonFinite::Weights { row }, *at));
            }
            if samples == 0.0 {
                // Every image of every rank's batch was bad: nothing to learn from. Weights,
                // momentum and batch-norm statistics stayed as they were (a no-op step).
                tracing::warn!(
                    "step {}: no images on any rank (all skipped as bad); weights unchanged",
                    at.step
                );
            }
            read.loss_sum += loss * samples;
            read.samples += samples;
            read.last_loss = loss;
            read.stop |= stop > 0.0;
        }
        Ok(read)
    }
}

impl StepWindow {
    /// Reads the window into the epoch's sums (on CUDA the read waits for the device's queue:
    /// backward, the all-reduce, the update). A non-finite row comes back with the number of
    /// rows read, for the trainer to name the step.
    pub(super) fn read_into(&mut self, e: &mut Epoch) -> Result<Read, (NonFinite, RowInfo, usize)> {
        let _wait = self
            .rows
            .device()
            .is_cuda()
            .then(crate::heartbeat::gradient_wait);
        let rows = self.info.len();
        match self.read() {
            Ok(r) => {
                e.loss_sum += r.loss_sum;
                e.seen += r.samples;
                e.seen_print += r.samples;
                e.overflowed += r.overflowed;
                Ok(r)
            }
            Err((bad, at)) => Err((bad, at, rows)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(loss: f64, samples: f64, stop: bool) -> StepStats {
        StepStats {
            tail: Tensor::from_slice(&[loss, samples, if stop { 1.0 } else { 0.0 }]),
            any_sample: samples > 0.0,
        }
    }

    fn info(step: u64) -> RowInfo {
        RowInfo {
            step,
            epoch: 1,
            lr_before: 0.1,
            lr_after: 0.2,
        }
    }

    #[test]
    fn a_read_sums_the_rows_and_names_the_first_non_finite_step() {
        let mut w = StepWindow::with_capacity(3, Device::Cpu, false);
        assert_eq!(w.read().ok(), Some(Read::default()));
        let ok = Tensor::from(5.0f32);
        w.push(&stats(2.0, 16.0, false), Some(&ok), None, info(0));
        w.push(&stats(1.0, 0.0, false), None, None, info(1));
        assert!(!w.is_full());
        w.push(&stats(3.0, 8.0, true), Some(&ok), None, info(2));
        assert!(w.is_full());
        let r = w.read().expect("finite");
        assert_eq!(
            r,
            Read {
                loss_sum: 2.0 * 16.0 + 3.0 * 8.0,
                samples: 24.0,
                last_loss: 3.0,
                stop: true,
                rows: 3,
                overflowed: 0,
            }
        );
        // The window is empty again and reused.
        assert!(!w.is_full());
        let nan = Tensor::from(f32::NAN);
        w.push(&stats(2.0, 16.0, false), Some(&ok), None, info(3));
        w.push(&stats(2.5, 16.0, false), Some(&nan), None, info(4));
        w.push(&stats(f64::NAN, 16.0, false), Some(&nan), None, info(5));
        match w.read() {
            Err((NonFinite::Weights { row: 1 }, at)) => assert_eq!(at.step, 4),
            other => panic!("expected the weights of step 4: {other:?}"),
        }
        w.push(
            &stats(f64::INFINITY, 16.0, false),
            Some(&nan),
            None,
            info(6),
        );
        match w.read() {
            Err((NonFinite::Loss { row: 0, value }, at)) => {
                assert_eq!((at.step, value), (6, f64::INFINITY))
            }
            other => panic!("expected the loss of step 6: {other:?}"),
        }
    }

    /// With the scaler, a row carries its overflow flag: the read counts the skipped updates,
    /// and a row the scaler did not check (no sample anywhere) is not counted from an earlier
    /// window's value in the same place.
    #[test]
    fn a_read_counts_the_updates_the_scaler_skipped() {
        let mut w = StepWindow::with_capacity(2, Device::Cpu, true);
        let ok = Tensor::from(5.0f32);
        let (set, clear) = (Tensor::from(1.0f32), Tensor::from(0.0f32));
        let scale = Tensor::from(32768.0f32);
        w.push(
            &stats(2.0, 16.0, false),
            Some(&ok),
            Some((&set, &scale)),
            info(0),
        );
        w.push(
            &stats(2.0, 16.0, false),
            Some(&ok),
            Some((&clear, &scale)),
            info(1),
        );
        assert_eq!(w.read().ok().map(|r| r.overflowed), Some(1));
        w.push(&stats(2.0, 0.0, false), None, None, info(2));
        w.push(
            &stats(2.0, 16.0, false),
            Some(&ok),
            Some((&set, &scale)),
            info(3),
        );
        assert_eq!(w.read().ok().map(|r| r.overflowed), Some(1));
    }
}
