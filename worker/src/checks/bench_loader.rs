//! `tchrun-worker bench-loader` (hidden): the input pipeline alone — decode + augment +
//! normalize an image folder into batches with the training loader, report images/s per
//! epoch. The counterpart of torchvision's `ImageFolder` + `DataLoader` in
//! `benches/reference/bench_loader.py`; used by `scripts/bench.sh`.
use std::path::PathBuf;
use std::time::Instant;
use tchrun::model::Normalization;
use tchrun_data::{self as data, Augment, ImageFolder, LoaderConfig, TrainAugment};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Image folder (ROOT/<class>/<image>).
    #[arg(long)]
    images: PathBuf,
    /// Output side in pixels (RandomResizedCrop size).
    #[arg(long, default_value_t = 224)]
    size: usize,
    /// Loader threads.
    #[arg(long, default_value_t = 1)]
    threads: usize,
    /// Images per batch.
    #[arg(long, default_value_t = 32)]
    batch_size: usize,
    /// Passes over the folder.
    #[arg(long, default_value_t = 1)]
    epochs: u64,
    /// Batches that may wait in the queue (the trainer uses 4).
    #[arg(long, default_value_t = 4)]
    prefetch: usize,
    /// Evaluation transform (Resize + CenterCrop) instead of the training augmentation.
    #[arg(long)]
    eval: bool,
    /// Shuffle seed.
    #[arg(long, default_value_t = 1)]
    seed: i64,
    /// The training flags' `--auto-augment`, `--ra-magnitude`, `--augmix-severity`,
    /// `--interpolation`, `--random-erase` as the trainer's loader applies them (the others,
    /// applied to batches by the trainer, are not run here).
    #[command(flatten)]
    augment: tchrun::augment_flags::AugmentFlags,
}

/// Runs the benchmark and prints one JSON line on stdout.
pub fn run(a: Args) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let folder = ImageFolder::scan(&a.images)?;
    let scan_s = t0.elapsed().as_secs_f64();
    let n = folder.samples.len();
    let mut per_epoch = Vec::new();
    let mut checksum = 0.0f64;
    for epoch in 0..a.epochs {
        let t = Instant::now();
        let indices = data::shard(n, 0, 1, a.seed, epoch, true);
        let mut it = data::load_batches(
            &folder,
            indices,
            LoaderConfig {
                size: a.size,
                batch_size: a.batch_size,
                threads: a.threads,
                prefetch: a.prefetch,
                augment: if a.eval {
                    Augment::Eval
                } else {
                    Augment::Train(TrainAugment {
                        interpolation: a.augment.interpolation,
                        auto_augment: data::auto_augment::Policy::from_flags(&a.augment),
                        random_erase: a.augment.random_erase,
                        transforms: a.augment.transforms,
                        ..TrainAugment::default()
                    })
                },
                norm: Normalization::default(),
                seed: a.seed,
                epoch,
                rank: 0,
                first_position: 0,
                skip_bad: false,
                max_pixels: tchrun_data::DEFAULT_MAX_IMAGE_PIXELS,
                global: None,
            },
        );
        let mut images = 0usize;
        while let Some(batch) = it.next() {
            let batch = batch?;
            images += batch.len;
            // touch the data so nothing is optimized away (one value per image)
            checksum += batch.images[0] as f64;
            it.recycle(batch);
        }
        per_epoch.push(images as f64 / t.elapsed().as_secs_f64().max(1e-9));
    }
    let line = serde_json::json!({
        "tool": "tchrun",
        "images": n,
        "size": a.size,
        "threads": a.threads,
        "batch_size": a.batch_size,
        "auto_augment": a.augment.auto_augment.map(|p| p.as_str()),
        "scan_s": scan_s,
        "images_per_sec": per_epoch,
        "checksum": checksum,
    });
    println!("{line}");
    Ok(())
}
