//! `tchrun data ...`: dataset commands. `split` ("Split Image Directory") and `pack` (tar
//! shards in the WebDataset layout): the logic is `tchrun_data::split` / `tchrun_data::pack`;
//! here the flags, archive sources and the report. `index`: the dataset index
//! (`tchrun_data::index`) made and every header verified once for every later job.
//! `transform` ("Apply Image Transformation"): the logic is `tchrun_data::transform_folder`.
use crate::error::JobError;
use crate::plan::preflight::{absolute, check_disjoint};
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tchrun::overlap::Named;
use tchrun_data::pack;
use tchrun_data::split::{self, SPLIT_TRAIN, SPLIT_VALID};

#[derive(Subcommand, Debug)]
pub enum DataCmd {
    /// Split an image folder into train/ and valid/, stratified per class, reproducible from
    /// the seed ("Split Image Directory").
    Split(SplitArgs),
    /// Index image folders once for every later job: the file list, and every image header
    /// verified, kept in the cache ($TCHRUN_DATA_CACHE, else ~/.cache/tchrun). Training jobs
    /// on them then start without listing a folder or reading a header.
    Index(IndexArgs),
    /// Pack an image folder into tar shards (WebDataset layout: KEY.jpg + KEY.cls) plus an
    /// index, for shared file systems; --train/--valid/--images accept the packed directory.
    Pack(PackArgs),
    /// Write a transformed copy of an image folder ("Apply Image Transformation"): the
    /// training transforms given (--pad, the crop of --size, --hflip, --vflip, --rotation, ...),
    /// each image as PNG under its own relative path; --inference keeps only what is not
    /// random (--pad, --grayscale 1, and validation's resize and center crop to --size).
    Transform(TransformArgs),
}

#[derive(Args, Debug)]
pub struct TransformArgs {
    /// Images to transform: a folder, searched recursively (class sub-folders are kept).
    #[arg(long)]
    pub images: PathBuf,
    /// New (or empty) folder to write: the same sub-folders, each image as NAME.png.
    #[arg(long, env = "TCHRUN_OUTPUT")]
    pub output: PathBuf,
    /// The output side: training's RandomResizedCrop (or RandomCrop with --random-crop),
    /// inference's center crop. Default: each image keeps its size.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=4096))]
    pub size: Option<u32>,
    /// With --inference: the shorter side's resize before the center crop (default
    /// round(--size × 256 / 224), as validation's).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=8192))]
    pub resize: Option<u32>,
    /// RandomHorizontalFlip(0.5) ("Random horizontal flip"; training flips unless --no-hflip,
    /// this command only when asked).
    #[arg(long)]
    pub hflip: bool,
    /// Lower bound of RandomResizedCrop's area scale (as training's).
    #[arg(long, default_value_t = 0.08, value_parser = parse_scale)]
    pub min_crop_scale: f64,
    /// The resampling of the crop's resize and of --rotation, --affine and --perspective.
    #[arg(long, value_enum, default_value_t = tchrun::augment_flags::Interpolation::Bilinear)]
    pub interpolation: tchrun::augment_flags::Interpolation,
    /// Keep only what is not random ("for inference").
    #[arg(long)]
    pub inference: bool,
    /// Seeds each image's draws (with its place in the sorted list): the same seed and files
    /// give the same images.
    #[arg(long, default_value_t = 1, allow_negative_numbers = true)]
    pub seed: i64,
    /// Refuse images whose header declares more pixels than this (decompression bombs).
    #[arg(long, env = "TCHRUN_MAX_IMAGE_PIXELS", default_value_t = tchrun_data::DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
    #[command(flatten)]
    pub transforms: tchrun::transform_flags::TransformFlags,
}

fn parse_scale(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 1.0 => Ok(v),
        _ => Err(format!("must be in (0, 1], got {s}")),
    }
}

#[derive(Args, Debug)]
pub struct IndexArgs {
    /// Image folders (one sub-folder per class), e.g. the train and valid folders.
    #[arg(required = true)]
    pub dirs: Vec<PathBuf>,
    /// The pixel limit the headers are verified against (training's --max-image-pixels: a
    /// job with another limit verifies again).
    #[arg(long, env = "TCHRUN_MAX_IMAGE_PIXELS", default_value_t = tchrun_data::DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
}

#[derive(Args, Debug)]
pub struct PackArgs {
    /// Image folder (one sub-folder per class) or a .zip/.tar/.tar.gz archive of one.
    pub src: PathBuf,
    /// New (or empty) folder to write: shard-000000.tar, ... and tchrun-pack.json.
    #[arg(long, env = "TCHRUN_OUTPUT")]
    pub output: PathBuf,
    /// Approximate size of each shard: bytes, or a number with K, M or G (e.g. 256M).
    #[arg(long, env = "TCHRUN_SHARD_SIZE", default_value = "256M", value_parser = parse_shard_size)]
    pub shard_size: u64,
    /// Leave out (and list) images whose header is bad instead of refusing the pack.
    #[arg(long, env = "TCHRUN_SKIP_BAD_IMAGES")]
    pub skip_bad_images: bool,
    /// Seeds the order in which samples are spread over the shards (every shard a random mix
    /// of the classes, for readers that stream shards in order); recorded in the index. The
    /// index keeps the folder's order, so training reads the same samples as from the folder.
    #[arg(
        long,
        env = "TCHRUN_SEED",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub seed: i64,
    /// Refuse images whose header declares more pixels than this (decompression bombs).
    #[arg(long, env = "TCHRUN_MAX_IMAGE_PIXELS", default_value_t = tchrun_data::DEFAULT_MAX_IMAGE_PIXELS, value_parser = clap::value_parser!(u64).range(1..))]
    pub max_image_pixels: u64,
}

fn parse_shard_size(s: &str) -> Result<u64, String> {
    pack::parse_size(s).map_err(|e| match e {
        pack::PackError::ShardSize(_, why) => why,
        e => e.to_string(),
    })
}

#[derive(Args, Debug)]
pub struct SplitArgs {
    /// Image folder (one sub-folder per class) or a .zip/.tar/.tar.gz archive of one.
    pub src: PathBuf,
    /// Share of each class's images that goes to train/ (round(n × F), kept within 1..n-1;
    /// a class with 1 image goes to train/ only).
    #[arg(long, env = "TCHRUN_FRACTION")]
    pub fraction: f64,
    /// Seeds the per-class shuffle: the same seed and files give the same split.
    #[arg(
        long,
        env = "TCHRUN_SEED",
        default_value_t = 1,
        allow_negative_numbers = true
    )]
    pub seed: i64,
    /// New (or empty) folder to write: OUTPUT/train and OUTPUT/valid, hard links to the
    /// originals where possible, else copies.
    #[arg(long, env = "TCHRUN_OUTPUT")]
    pub output: PathBuf,
}

pub fn run(cmd: &DataCmd) -> Result<i32, JobError> {
    match cmd {
        DataCmd::Split(a) => run_split(a),
        DataCmd::Index(a) => run_index(a),
        DataCmd::Pack(a) => run_pack(a),
        DataCmd::Transform(a) => run_transform(a),
    }
}

/// `SRC` of `split` and `pack`: an image folder, or an archive extracted into the data cache
/// (said on the console); its path and its scan.
fn source_folder(src: &std::path::Path) -> Result<(PathBuf, tchrun_data::ImageFolder), JobError> {
    let invalid = |e: &dyn std::fmt::Display| JobError::invalid(e.to_string());
    let src = absolute(src.to_path_buf());
    let cache = tchrun_data::archive::cache_root();
    let folder_path = match tchrun_data::archive::resolve(&src, &cache)
        .map_err(|e| JobError::from_dataset(e, |e| invalid(&e)))?
    {
        Some(x) => {
            outln!("tchrun: {}", x.describe());
            x.root
        }
        None => src,
    };
    let folder = tchrun_data::ImageFolder::scan(&folder_path).map_err(|e| invalid(&e))?;
    Ok((folder_path, folder))
}

/// `--output` of `split` and `pack` neither is, contains nor lies inside `SRC`.
fn check_source_and_output(
    src: &std::path::Path,
    output: &std::path::Path,
) -> Result<(), JobError> {
    check_disjoint(
        &[Named::new("--output", "the new dataset folder", output)],
        vec![Named::new(
            "SRC",
            "the source dataset",
            absolute(src.to_path_buf()),
        )],
        None,
    )
}

fn run_pack(a: &PackArgs) -> Result<i32, JobError> {
    let invalid = |e: &dyn std::fmt::Display| JobError::invalid(e.to_string());
    let started = std::time::Instant::now();
    let output = absolute(a.output.clone());
    check_source_and_output(&a.src, &output)?;
    // Refuse a bad output before extracting anything.
    pack::check_output(&output).map_err(|e| invalid(&e))?;
    let (folder_path, folder) = source_folder(&a.src)?;
    let opts = pack::PackOptions {
        seed: a.seed,
        shard_size: a.shard_size,
        skip_bad: a.skip_bad_images,
        max_pixels: a.max_image_pixels,
    };
    let report = pack::pack(&folder, &output, &opts).map_err(|e| invalid(&e))?;
    for (path, why) in &report.skipped {
        outln!("tchrun: skipped bad image {}: {why}", path.display());
    }
    outln!(
        "tchrun: packed {} ({} classes) into {}: {} samples in {} shards, {:.1} MiB, {:.1} s{}",
        folder_path.display(),
        report.classes,
        output.display(),
        report.samples,
        report.shards,
        report.bytes as f64 / (1u64 << 20) as f64,
        started.elapsed().as_secs_f64(),
        if report.skipped.is_empty() {
            String::new()
        } else {
            format!(" ({} bad images left out)", report.skipped.len())
        }
    );
    Ok(0)
}

fn run_transform(a: &TransformArgs) -> Result<i32, JobError> {
    use tchrun_data::transform_folder::{self as tf, TransformError, TransformJob};
    let started = std::time::Instant::now();
    let job = TransformJob {
        transforms: a.transforms,
        size: a.size,
        resize: a.resize,
        hflip: a.hflip,
        min_scale: a.min_crop_scale,
        interpolation: a.interpolation,
        inference: a.inference,
        seed: a.seed,
        max_pixels: a.max_image_pixels,
    };
    let err = |e: TransformError| match e {
        TransformError::Dataset(e) => {
            JobError::from_dataset(e, |e| JobError::invalid(e.to_string()))
        }
        e => JobError::invalid(e.to_string()),
    };
    job.check().map_err(err)?;
    let output = absolute(a.output.clone());
    check_source_and_output(&a.images, &output)?;
    tf::check_output(&output).map_err(err)?;
    let images = absolute(a.images.clone());
    let report = tf::transform_folder(&images, &output, &job).map_err(err)?;
    outln!(
        "tchrun: transformed {} images of {} into {} ({}): {:.1} MiB of PNG, {:.1} s",
        report.images,
        images.display(),
        output.display(),
        if a.inference {
            "for inference"
        } else {
            "for training"
        },
        report.bytes as f64 / (1u64 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}

fn run_index(a: &IndexArgs) -> Result<i32, JobError> {
    use tchrun_data::index;
    // The indexes are written in the cache: never inside one of the folders.
    let dirs: Vec<PathBuf> = a.dirs.iter().map(|d| absolute(d.clone())).collect();
    check_disjoint(
        &dirs
            .iter()
            .map(|d| {
                Named::new(
                    format!("${}", tchrun_data::archive::DATA_CACHE_ENV),
                    "the dataset index, kept in the cache",
                    index::location(d),
                )
            })
            .collect::<Vec<_>>(),
        dirs.iter()
            .map(|d| Named::new("DIR", "an indexed folder", d))
            .collect(),
        None,
    )?;
    for dir in &a.dirs {
        let dir = absolute(dir.clone());
        if tchrun_data::archive::ArchiveKind::of(&dir).is_some() {
            return Err(JobError::invalid(format!(
                "{}: an archive; training extracts archives and indexes the extracted folder \
                 itself (or extract it and index that folder)",
                dir.display()
            )));
        }
        if tchrun_data::pack::is_pack(&dir) {
            return Err(JobError::invalid(format!(
                "{}: a packed directory (`tchrun data pack`): it has its own index and its \
                 headers were verified when it was packed; nothing to index",
                dir.display()
            )));
        }
        let mut opened = index::open(&dir).map_err(|e| JobError::invalid(e.to_string()))?;
        outln!("tchrun: {}: {}", dir.display(), opened.note);
        let Some(path) = opened.path.clone() else {
            return Err(JobError::launch(format!(
                "{}: the index could not be kept ({}); set {} to a writable folder",
                dir.display(),
                opened.note,
                tchrun_data::archive::DATA_CACHE_ENV
            )));
        };
        if opened.index.headers_for(a.max_image_pixels).is_none() {
            let t = std::time::Instant::now();
            opened
                .index
                .verify_headers(&opened.folder, a.max_image_pixels);
            index::store(&opened.index, &path).map_err(JobError::launch)?;
            outln!(
                "tchrun: {}: {} image headers verified in {:.1} s (--max-image-pixels {})",
                dir.display(),
                opened.index.len(),
                t.elapsed().as_secs_f64(),
                a.max_image_pixels
            );
        } else {
            outln!(
                "tchrun: {}: image headers already verified (--max-image-pixels {})",
                dir.display(),
                a.max_image_pixels
            );
        }
        let bad = opened
            .index
            .headers_for(a.max_image_pixels)
            .map(|h| h.bad.clone())
            .unwrap_or_default();
        for (i, why, _) in bad.iter().take(10) {
            if let Some(s) = opened.folder.samples.get(*i as usize) {
                outln!("tchrun:   bad image {}: {why}", s.path.display());
            }
        }
        if !bad.is_empty() {
            outln!(
                "tchrun: {}: {} bad image(s){}: training refuses them unless --skip-bad-images (then they are left out)",
                dir.display(),
                bad.len(),
                if bad.len() > 10 { " (the first 10 above)" } else { "" }
            );
        }
    }
    Ok(0)
}

fn run_split(a: &SplitArgs) -> Result<i32, JobError> {
    let invalid = |e: &dyn std::fmt::Display| JobError::invalid(e.to_string());
    let output = absolute(a.output.clone());
    check_source_and_output(&a.src, &output)?;
    // Refuse a bad output or fraction before extracting anything.
    split::check_split_output(&output).map_err(|e| invalid(&e))?;
    if !(a.fraction > 0.0 && a.fraction < 1.0) {
        return Err(invalid(&split::SplitError::Fraction(a.fraction)));
    }
    let (folder_path, folder) = source_folder(&a.src)?;
    let plan = split::plan_split(&folder, a.fraction, a.seed).map_err(|e| invalid(&e))?;
    let report = split::write_split(&plan, &output).map_err(|e| invalid(&e))?;
    let (n_train, n_valid) = plan
        .iter()
        .fold((0, 0), |(t, v), c| (t + c.train.len(), v + c.valid.len()));
    outln!(
        "tchrun: split {} ({} classes, {} images) with --fraction {} --seed {}: {} images in {}, {} in {}",
        folder_path.display(),
        plan.len(),
        n_train + n_valid,
        a.fraction,
        a.seed,
        n_train,
        output.join(SPLIT_TRAIN).display(),
        n_valid,
        output.join(SPLIT_VALID).display()
    );
    for line in split_summary(
        plan.iter()
            .map(|c| (c.class.as_str(), c.train.len(), c.valid.len())),
    ) {
        outln!("tchrun: {line}");
    }
    match (&report.copy_reason, report.linked) {
        (None, _) => outln!("tchrun: files are hard links to the originals ({} files)", report.linked),
        (Some(why), 0) => outln!(
            "tchrun: files are copies ({} files): hard links were not possible ({why}; another file system?)",
            report.copied
        ),
        (Some(why), _) => outln!(
            "tchrun: {} files are hard links to the originals, {} copies (a hard link failed: {why})",
            report.linked,
            report.copied
        ),
    }
    Ok(0)
}

/// The lines `data split` prints about its classes (one summary, however many classes: not a
/// line per class): how many images a class got on each side (least, median, most), and the
/// classes whose only image went to `train` (named, the first few).
fn split_summary<'a>(classes: impl Iterator<Item = (&'a str, usize, usize)>) -> Vec<String> {
    const NAMED: usize = 5;
    let (mut train, mut valid, mut lone) = (Vec::new(), Vec::new(), Vec::new());
    for (class, t, v) in classes {
        train.push(t);
        valid.push(v);
        if v == 0 {
            lone.push(class);
        }
    }
    let spread = |v: &mut Vec<usize>| {
        v.sort_unstable();
        match (v.first(), v.get(v.len() / 2), v.last()) {
            (Some(lo), Some(mid), Some(hi)) => format!("{lo} to {hi} (median {mid})"),
            _ => "none".to_string(),
        }
    };
    let mut lines = vec![format!(
        "  images per class: {SPLIT_TRAIN} {}, {SPLIT_VALID} {}",
        spread(&mut train),
        spread(&mut valid)
    )];
    if !lone.is_empty() {
        let mut names = lone
            .iter()
            .take(NAMED)
            .copied()
            .collect::<Vec<_>>()
            .join(", ");
        if lone.len() > NAMED {
            names.push_str(&format!(" and {} more", lone.len() - NAMED));
        }
        let (n, has, it) = match lone.len() {
            1 => ("1 class".to_string(), "has", "it"),
            n => (format!("{n} classes"), "have", "they"),
        };
        lines.push(format!(
            "note: {n} {has} 1 image ({names}): {it} went to {SPLIT_TRAIN} only, so {SPLIT_VALID} \
             lacks {} (add images before training with this split)",
            if lone.len() == 1 { "the class" } else { "them" }
        ));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_split_of_many_classes_is_summarised_in_two_lines() {
        let names: Vec<String> = (0..1000).map(|i| format!("n{i:04}")).collect();
        let lines = split_summary(names.iter().enumerate().map(|(i, n)| {
            let v = usize::from(i >= 7);
            (n.as_str(), 4 + i % 3, v)
        }));
        assert_eq!(
            lines,
            [
                "  images per class: train 4 to 6 (median 5), valid 0 to 1 (median 1)",
                "note: 7 classes have 1 image (n0000, n0001, n0002, n0003, n0004 and 2 more): \
                 they went to train only, so valid lacks them (add images before training with \
                 this split)"
            ]
        );
        let one = split_summary([("a", 32, 8), ("c", 1, 0)].into_iter());
        assert!(one[1].starts_with("note: 1 class has 1 image (c): it went to train only"));
    }
}
