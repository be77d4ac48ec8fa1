//! Rank 0's TensorBoard events (`<output>/tensorboard/`, see `tchrun_tensorboard`) and the
//! per-step training losses and learning rates the metrics plot draws (kept across
//! `--resume`: they come back from the events file).
//!
//! Events are cosmetic: a failure to write them is logged once (driver log and console, with
//! the reason) and the run goes on without them; it never stops a long job.
use std::path::Path;
use tchrun::metrics::EpochMetrics;
use tchrun_tensorboard::{self as tensorboard, EventWriter};

/// Per-step scalars (every `--print-freq` iterations and at each epoch's end).
pub const STEP_LOSS: &str = "train/loss";
pub const STEP_LR: &str = "train/lr";
pub const STEP_IMAGES_PER_SEC: &str = "train/images_per_sec";

pub(super) struct Board {
    writer: Option<EventWriter>,
    /// (step, training loss) at each logged step, this run's and (after a resume) the kept ones.
    pub(super) losses: Vec<(u64, f64)>,
    /// (step, learning rate) at the same steps.
    pub(super) lrs: Vec<(u64, f64)>,
}

impl Board {
    /// Ranks other than 0: nothing written, nothing kept.
    pub(super) fn off() -> Self {
        Board {
            writer: None,
            losses: Vec::new(),
            lrs: Vec::new(),
        }
    }

    /// Rank 0: a new events file (`resume_step` None), or the directory's events up to the
    /// checkpoint's step rewritten into one file that this run continues.
    pub(super) fn open(output: &Path, resume_step: Option<u64>, say: &dyn Fn(&str)) -> Self {
        let dir = output.join(tensorboard::DIR);
        let host = hostname::get()
            .map(|h| h.to_string_lossy().into_owned())
            .unwrap_or_else(|_| "localhost".into());
        let opened = match resume_step {
            None => EventWriter::create(&dir, &host).map(|w| (w, Vec::new())),
            Some(step) => EventWriter::resume(&dir, &host, step),
        };
        match opened {
            Ok((w, kept)) => {
                tracing::info!("TensorBoard events: {}", w.path().display());
                let series = |name: &'static str| -> Vec<(u64, f64)> {
                    kept.iter()
                        .flat_map(|e| {
                            e.scalars()
                                .into_iter()
                                .filter(move |(tag, _)| *tag == name)
                                .map(move |(_, v)| (e.step.max(0) as u64, v as f64))
                        })
                        .collect()
                };
                Board {
                    writer: Some(w),
                    losses: series(STEP_LOSS),
                    lrs: series(STEP_LR),
                }
            }
            Err(e) => {
                let mut b = Board::off();
                b.fail(&e, say);
                b
            }
        }
    }

    fn fail(&mut self, e: &tensorboard::TensorBoardError, say: &dyn Fn(&str)) {
        self.writer = None;
        tracing::warn!("TensorBoard events not written from here on: {e}");
        say(&format!(
            "warning: TensorBoard events not written from here on ({e}); training goes on"
        ));
    }

    fn scalars(&mut self, step: u64, values: &[(&str, f64)], sync: bool, say: &dyn Fn(&str)) {
        let Some(w) = &mut self.writer else {
            return;
        };
        let r = w
            .scalars(step, values)
            .and_then(|()| if sync { w.sync() } else { Ok(()) });
        if let Err(e) = r {
            self.fail(&e, say);
        }
    }

    /// A progress line's values (rank 0 only; `active` is false elsewhere).
    pub(super) fn step(
        &mut self,
        active: bool,
        step: u64,
        loss: f64,
        lr: f64,
        images_per_s: f64,
        say: &dyn Fn(&str),
    ) {
        if !active {
            return;
        }
        self.losses.push((step, loss));
        self.lrs.push((step, lr));
        self.scalars(
            step,
            &[
                (STEP_LOSS, loss),
                (STEP_LR, lr),
                (STEP_IMAGES_PER_SEC, images_per_s),
            ],
            false,
            say,
        );
    }

    /// A window's stragglers (`live.rs`): their count and each one's factor (rank 0).
    pub(super) fn stragglers(&mut self, step: u64, values: &[(String, f64)], say: &dyn Fn(&str)) {
        let values: Vec<(&str, f64)> = values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        self.scalars(step, &values, false, say);
    }

    /// An epoch's row of `metrics.jsonl`, at the step the epoch ended (the same axis as the
    /// per-step scalars, so a resume's truncation applies to both).
    pub(super) fn epoch(&mut self, step: u64, m: &EpochMetrics, say: &dyn Fn(&str)) {
        let mut values = vec![
            ("epoch/train_loss", m.train_loss),
            ("epoch/valid_loss", m.val_loss),
            // In percent, as the console and the report say them (metrics.jsonl: fractions).
            ("epoch/top1", 100.0 * m.top1),
            ("epoch/top5", 100.0 * m.top5),
            ("epoch/images_per_sec", m.train_images_per_sec),
            ("epoch/data_wait_share", m.data_wait_share()),
            ("epoch/lr", m.lr),
        ];
        // `--model-ema`: the EMA model's validation beside the model's.
        if let (Some(loss), Some(top1), Some(top5)) = (m.ema_val_loss, m.ema_top1, m.ema_top5) {
            values.push(("epoch/ema_valid_loss", loss));
            values.push(("epoch/ema_top1", 100.0 * top1));
            values.push(("epoch/ema_top5", 100.0 * top5));
        }
        self.scalars(step, &values, true, say);
    }
}
