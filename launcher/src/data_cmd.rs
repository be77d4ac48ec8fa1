//! `tchrun data ...`: dataset commands. `split` ("Split Image Directory"): the logic is
//! `tchrun::data::split`; here the flags, archive sources and the report.
use crate::error::JobError;
use crate::preflight::absolute;
use clap::{Args, Subcommand};
use std::path::PathBuf;
use tchrun::data::split::{self, SPLIT_TRAIN, SPLIT_VALID};

#[derive(Subcommand, Debug)]
pub enum DataCmd {
    /// Split an image folder into train/ and valid/, stratified per class, reproducible from
    /// the seed ("Split Image Directory").
    Split(SplitArgs),
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
    }
}

fn run_split(a: &SplitArgs) -> Result<i32, JobError> {
    let invalid = |e: &dyn std::fmt::Display| JobError::invalid(e.to_string());
    let output = absolute(a.output.clone());
    // Refuse a bad output or fraction before extracting anything.
    split::check_split_output(&output).map_err(|e| invalid(&e))?;
    if !(a.fraction > 0.0 && a.fraction < 1.0) {
        return Err(invalid(&split::SplitError::Fraction(a.fraction)));
    }
    let src = absolute(a.src.clone());
    let cache_parent = output
        .parent()
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    let cache = tchrun::data::archive::cache_root(&cache_parent);
    let folder_path = match tchrun::data::archive::resolve(&src, &cache)
        .map_err(|e| JobError::invalid(format!("{}", e)))?
    {
        Some(x) => {
            outln!("tchrun: {}", x.describe());
            x.root
        }
        None => src,
    };
    let folder = tchrun::data::ImageFolder::scan(&folder_path).map_err(|e| invalid(&e))?;
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
    for c in &plan {
        outln!(
            "tchrun:   class {}: {} train, {} valid",
            c.class,
            c.train.len(),
            c.valid.len()
        );
        if c.valid.is_empty() {
            outln!(
                "tchrun: note: class {} has 1 image: it went to {} only, so {} lacks the class \
                 (add images to it before training with this split)",
                c.class,
                SPLIT_TRAIN,
                SPLIT_VALID
            );
        }
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
