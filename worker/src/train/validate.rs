//! Validation after every epoch (exact: sums reduced over the ranks), and the images dropped
//! while decoding under `--skip-bad-images`, named once per rank.
use super::{loader_threads, to_input, RankCtx, TrainError};
use crate::comm::pg::ReduceOp;
use tch::{nn::ModuleT, Device, Kind, Tensor};
use tchrun::flags::TrainJob;
use tchrun::model::ModelConfig;
use tchrun_data::{self as data, Augment, ImageFolder, LoaderConfig};

/// Validation of one epoch, reduced over every rank.
pub(super) struct Validation {
    pub(super) loss: f64,
    pub(super) top1: f64,
    pub(super) top5: f64,
    /// Images dropped while decoding in this epoch (training and validation, all ranks).
    pub(super) skipped: u64,
}

pub(super) fn validate(
    model: &dyn ModuleT,
    valid: &ImageFolder,
    cfg: &ModelConfig,
    job: &TrainJob,
    ctx: &RankCtx,
    bad_images: &mut BadImages,
    train_skipped: u64,
) -> Result<Validation, TrainError> {
    let (rank, world) = (ctx.pg.rank(), ctx.pg.size());
    // --val-resize-size, --val-crop-size (the model's input size's by default).
    let crops = job.options.augment.crops(cfg.input_size);
    let mut idx = data::shard(valid.samples.len(), rank, world, 0, 0, false);
    idx.truncate(data::shard_real_count(valid.samples.len(), rank, world));
    let loader = data::load_batches(
        valid,
        idx,
        LoaderConfig {
            size: crops.val_crop as usize,
            batch_size: job.params.batch_size as usize,
            threads: loader_threads(job, ctx.local_size),
            prefetch: 4,
            augment: Augment::Resize {
                resize: crops.val_resize as usize,
                interpolation: job.options.augment.interpolation,
            },
            norm: cfg.normalization,
            seed: job.params.seed,
            epoch: 0,
            rank,
            first_position: 0,
            skip_bad: job.options.skip_bad_images,
            max_pixels: job.options.max_image_pixels,
            global: None,
        },
    );
    let k = 5.min(valid.classes.len() as i64);
    // [loss sum, top-1 correct, top-5 correct, samples, skipped images (validation here, plus
    // this rank's training epoch)], reduced exactly over the ranks.
    let mut totals = Tensor::zeros([5], (Kind::Double, ctx.device));
    let mut skipped_here = train_skipped;
    let channels_last = super::layout(job, ctx.device, cfg).channels_last;
    for batch in loader {
        // Each batch is progress the hang watch sees (a long validation is not a hang).
        crate::heartbeat::progressed();
        tchrun_faults::maybe_slow_validation_batch();
        let batch = batch.map_err(TrainError::Data)?;
        skipped_here += bad_images.note(&batch.skipped);
        if batch.len == 0 {
            continue;
        }
        let (x, y) = to_input(&batch, ctx.device, channels_last);
        tch::no_grad(|| {
            let logits = model.forward_t(&x, false).to_kind(Kind::Float);
            let loss =
                logits.cross_entropy_loss::<Tensor>(&y, None, tch::Reduction::Sum, -100, 0.0);
            let (_, top) = logits.topk(k, -1, true, true);
            let hits = top.eq_tensor(&y.unsqueeze(1));
            let top1 = hits.narrow(1, 0, 1).sum(Kind::Double);
            let topk = hits.any_dim(1, false).sum(Kind::Double);
            // A fill, not a host-to-device copy: no synchronization per batch on CUDA.
            let n = Tensor::full([], batch.len as f64, (Kind::Double, ctx.device));
            // Into the first four slots (a view): the fifth is this rank's skipped count.
            let mut sums = totals.narrow(0, 0, 4);
            sums += Tensor::stack(&[loss.to_kind(Kind::Double), top1, topk, n], 0);
        });
    }
    if skipped_here > 0 {
        let _ = totals.get(4).fill_(skipped_here as f64);
    }
    ctx.pg.all_reduce(&mut [&mut totals], ReduceOp::Sum)?;
    let t = Vec::<f64>::try_from(totals.to_device(Device::Cpu))?;
    let n = t[3].max(1.0);
    Ok(Validation {
        loss: t[0] / n,
        top1: t[1] / n,
        top5: t[2] / n,
        skipped: t[4].round().max(0.0) as u64,
    })
}

/// The driver-log line naming a skipped image (pre-flight or decoding), with the contract's
/// prefix (`tchrun::files::SKIPPED_IMAGE`) the launcher's run report counts.
pub(super) fn log_skipped(path: &std::path::Path, why: &str) {
    tracing::warn!(
        "{}{} (--skip-bad-images): {why}",
        tchrun::files::SKIPPED_IMAGE,
        path.display()
    );
}

/// Images dropped while decoding (`--skip-bad-images`): each file is named once in this rank's
/// driver log, with the contract's prefix (`tchrun::files::SKIPPED_IMAGE`) the launcher counts.
#[derive(Default)]
pub(super) struct BadImages {
    named: std::collections::HashSet<std::path::PathBuf>,
}

impl BadImages {
    /// Logs the files not named yet; returns how many images were dropped.
    pub(super) fn note(&mut self, skipped: &[(std::path::PathBuf, String)]) -> u64 {
        for (path, why) in skipped {
            if self.named.insert(path.clone()) {
                log_skipped(path, why);
            }
        }
        skipped.len() as u64
    }

    pub(super) fn distinct(&self) -> usize {
        self.named.len()
    }
}
