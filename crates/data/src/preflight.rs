//! The training job's input checks (the seed's errors), shared by the launcher's pre-flight
//! (before any rank starts) and every rank (which also decodes every image header).
use crate::{index, index::DatasetIndex, DatasetError, ImageFolder};
use std::path::{Path, PathBuf};
use tchrun::flags::TrainJob;
use tchrun::model::{self, ModelConfig};

/// A training input that cannot be used; the message names the flag and the fix.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    // The inner errors are shown, not chained (their text already holds everything).
    #[error("--model {0}")]
    Model(model::InvalidModelDirectory),
    #[error("{flag} {error}")]
    Dataset {
        flag: &'static str,
        error: DatasetError,
    },
    #[error("{0}")]
    Output(String),
    /// Training flags that cannot work with this model.
    #[error("{0}")]
    Flags(String),
}

/// The checked inputs of a training job.
pub struct Inputs {
    pub cfg: ModelConfig,
    pub train: ImageFolder,
    pub valid: ImageFolder,
    /// Images skipped under `--skip-bad-images` (verified inputs only).
    pub skipped: Vec<(PathBuf, String)>,
}

/// Refuses an `--output` that holds a trained model (unless resuming or overwriting) or is not
/// a directory.
pub fn check_output(output: &Path, resume: bool, overwrite: bool) -> Result<(), PreflightError> {
    let model_json = output.join(tchrun::files::MODEL_JSON);
    if output.exists() && !output.is_dir() {
        return Err(PreflightError::Output(format!(
            "--output {}: exists and is not a directory",
            output.display()
        )));
    }
    if model_json.exists() && !resume && !overwrite {
        return Err(PreflightError::Output(format!(
            "--output {}: already holds a trained model ({}); choose another --output, continue \
             its training with --resume and a larger --epochs, or replace it with --overwrite",
            output.display(),
            model_json.display()
        )));
    }
    Ok(())
}

/// Model directory, image directories (layout, class sets) and output; with `verify`, also
/// every image's header (corrupt files, decompression bombs).
pub fn check_train_job(job: &TrainJob, verify: bool) -> Result<Inputs, PreflightError> {
    let verification = if verify {
        Verification::Launcher {
            upfront_limit: usize::MAX,
        }
    } else {
        Verification::None
    };
    check_train_job_with(job, verification).map(|c| c.inputs)
}

/// How `check_train_job_with` finds the images and treats their headers.
#[derive(Debug, Clone, Copy)]
pub enum Verification<'a> {
    /// Layout and classes only: a scan, no index, no headers.
    None,
    /// The launcher: each folder's dataset index reused or built (`data::index::open`); the
    /// headers never verified with this `--max-image-pixels` are verified now when there are
    /// at most `upfront_limit` of them, else when each image is first decoded.
    Launcher { upfront_limit: usize },
    /// A rank: the launcher's indexes (copies in the log directory) when they pass the
    /// stamps check on this rank's copy of the data; otherwise its own scan. Headers: on
    /// decode when the launcher said so (`on_decode`), else the launcher's policy with
    /// `data::index::upfront_limit()` (a rank started without the launcher: srun, sbatch).
    Rank {
        train: Option<&'a Path>,
        valid: Option<&'a Path>,
        on_decode: bool,
    },
}

/// What happened to the image headers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Headers {
    /// Not looked at (`Verification::None`).
    Unchecked,
    /// Every header verified (now or by an earlier job: the index).
    Verified { now: usize, before: usize },
    /// Too many unverified headers to check before the first step: each image is checked
    /// when first decoded.
    OnDecode { unverified: usize },
}

/// The result of `check_train_job_with`.
pub struct Checked {
    /// The archives among `--train`/`--valid`, extracted (or found extracted); the inputs'
    /// roots are their folders.
    pub extracted: Vec<crate::archive::Extracted>,
    pub inputs: Inputs,
    /// The dataset indexes of train and valid (`None`: not indexed), for the ranks.
    pub indexes: [Option<DatasetIndex>; 2],
    pub headers: Headers,
    /// For the log: where each folder's file list came from, what was verified.
    pub notes: Vec<String>,
}

/// One folder, listed or taken from its index.
struct Listed {
    folder: ImageFolder,
    index: Option<DatasetIndex>,
    /// Where the index is kept (launcher: the cache), to record a verification in it.
    path: Option<PathBuf>,
}

/// The flag's dataset error.
fn ds(flag: &'static str) -> impl Fn(DatasetError) -> PreflightError {
    move |error| PreflightError::Dataset { flag, error }
}

/// The model directory (with its weights, if any) and `--output`, and a batch size the model
/// can train with.
fn check_model(job: &TrainJob) -> Result<ModelConfig, PreflightError> {
    let cfg = model::load(&job.model, false).map_err(PreflightError::Model)?;
    check_output(&job.output, job.options.resume, job.options.overwrite)?;
    let weights = job.model.join(tchrun::files::MODEL_WEIGHTS);
    if weights.is_file() {
        tchrun::weights::check(cfg.arch, &weights).map_err(|e| {
            PreflightError::Model(model::InvalidModelDirectory {
                path: weights.clone(),
                detail: format!(
                    "its weights do not fit {}: {e}; run `tchrun model init` again",
                    cfg.arch.name()
                ),
            })
        })?;
    }
    // Training sees the training crop (`--train-crop-size`, else the input size).
    let train_size = job.options.augment.crops(cfg.input_size).train;
    let last = cfg.arch.last_feature_size(train_size);
    if job.params.batch_size == 1 && last <= 1 && cfg.arch.has_batch_norm() {
        let size = if train_size == cfg.input_size {
            format!("input size {train_size}")
        } else {
            format!("training crop size {train_size} (--train-crop-size)")
        };
        let min = cfg.arch.min_input_for_single_image();
        return Err(PreflightError::Flags(format!(
            "--batch-size 1: {} at {size} ends in a 1x1 feature map, so batch norm would see \
             one value per channel and its running variance would become NaN; use --batch-size 2 \
             or more, or train at {min} px or more (--train-crop-size {min}, or a model made \
             with --input-size {min})",
            cfg.arch.name(),
        )));
    }
    Ok(cfg)
}

/// One folder, listed or taken from its index as `verification` says; where its list came
/// from goes to `notes`.
fn list(
    verification: Verification,
    flag: &'static str,
    root: &Path,
    copy: Option<&Path>,
    notes: &mut Vec<String>,
) -> Result<Listed, PreflightError> {
    let scanned = || -> Result<Listed, PreflightError> {
        Ok(Listed {
            folder: ImageFolder::scan(root).map_err(ds(flag))?,
            index: None,
            path: None,
        })
    };
    // A packed directory has its own index (`tchrun-pack.json`): nothing to list.
    if crate::pack::is_pack(root) {
        return scanned();
    }
    match verification {
        Verification::None => scanned(),
        Verification::Launcher { .. } => {
            let opened = index::open(root).map_err(ds(flag))?;
            notes.push(format!("{flag}: {}", opened.note));
            let indexed = opened.path.is_some() || !opened.index.classes.is_empty();
            Ok(Listed {
                folder: opened.folder,
                index: indexed.then_some(opened.index),
                path: opened.path,
            })
        }
        Verification::Rank { .. } => match index::load_for_rank(root, copy) {
            Ok((ix, path)) => {
                notes.push(format!(
                    "{flag}: dataset index {} ({} images; not listed here)",
                    path.display(),
                    ix.len()
                ));
                Ok(Listed {
                    folder: ix.folder(root),
                    index: Some(ix),
                    path: None,
                })
            }
            Err(why) => {
                notes.push(format!(
                    "{flag}: listed here (no usable dataset index: {why})"
                ));
                scanned()
            }
        },
    }
}

/// Every header of both folders verified (those the index already verified with `max` are
/// taken from it; new verifications recorded in the launcher's index); the bad images
/// skipped under `skip`.
fn verify_headers(
    folders: [(&'static str, &mut Listed); 2],
    skip: bool,
    max: u64,
) -> Result<Vec<(PathBuf, String)>, PreflightError> {
    let mut skipped = Vec::new();
    for (flag, l) in folders {
        match &mut l.index {
            Some(ix) => {
                if ix.headers_for(max).is_none() {
                    ix.verify_headers(&l.folder, max);
                    if let Some(p) = &l.path {
                        // Only a shortcut for the next job.
                        let _ = index::store(ix, p);
                    }
                }
                let h = ix.headers_for(max).cloned();
                if let Some(h) = h {
                    skipped.extend(h.apply(&mut l.folder, skip).map_err(ds(flag))?);
                }
            }
            None => skipped.extend(l.folder.verify(skip, max).map_err(ds(flag))?),
        }
    }
    Ok(skipped)
}

pub fn check_train_job_with(
    job: &TrainJob,
    verification: Verification,
) -> Result<Checked, PreflightError> {
    let cfg = check_model(job)?;
    // Archives become their extracted folders (once, in the data cache).
    let cache = crate::archive::cache_root();
    let mut extracted = Vec::new();
    let mut folder = |flag: &'static str, src: &Path| -> Result<PathBuf, PreflightError> {
        match crate::archive::resolve(src, &cache).map_err(ds(flag))? {
            Some(x) => {
                let root = x.root.clone();
                extracted.push(x);
                Ok(root)
            }
            None => Ok(src.to_path_buf()),
        }
    };
    let (train_dir, valid_dir) = (
        folder("--train", &job.train)?,
        folder("--valid", &job.valid)?,
    );
    let mut notes = Vec::new();
    let (tcopy, vcopy) = match verification {
        Verification::Rank { train, valid, .. } => (train, valid),
        _ => (None, None),
    };
    let mut train = list(verification, "--train", &train_dir, tcopy, &mut notes)?;
    let mut valid = list(verification, "--valid", &valid_dir, vcopy, &mut notes)?;
    ImageFolder::check_same_classes(&train.folder, &valid.folder).map_err(ds("--train/--valid"))?;
    let (skip, max) = (job.options.skip_bad_images, job.options.max_image_pixels);
    let limit = match verification {
        Verification::None => 0,
        Verification::Launcher { upfront_limit } => upfront_limit,
        Verification::Rank {
            on_decode: true, ..
        } => 0,
        Verification::Rank { .. } => index::upfront_limit(),
    };
    // Headers never verified with this pixel limit.
    let unverified = |l: &Listed| match l.index.as_ref().and_then(|ix| ix.headers_for(max)) {
        Some(_) => 0,
        None => l.folder.samples.len(),
    };
    let todo = unverified(&train) + unverified(&valid);
    let total = train.folder.samples.len() + valid.folder.samples.len();
    let headers = match verification {
        Verification::None => Headers::Unchecked,
        _ if todo > limit => Headers::OnDecode { unverified: todo },
        _ => Headers::Verified {
            now: todo,
            before: total - todo,
        },
    };
    let mut skipped = Vec::new();
    if let Headers::Verified { .. } = headers {
        skipped = verify_headers(
            [("--train", &mut train), ("--valid", &mut valid)],
            skip,
            max,
        )?;
    }
    match headers {
        Headers::Unchecked => {}
        Headers::Verified { now, before } => notes.push(format!(
            "image headers: {now} verified now, {before} already verified (dataset index); {} bad",
            skipped.len()
        )),
        Headers::OnDecode { unverified } => notes.push(format!(
            "image headers: {unverified} not verified yet, more than the {limit} checked before \
             the first step: each image gets the same checks when it is first decoded (a bad \
             one fails the job, or is skipped under --skip-bad-images); `tchrun data index` \
             verifies a folder once for every later job"
        )),
    }
    Ok(Checked {
        extracted,
        inputs: Inputs {
            cfg,
            train: train.folder,
            valid: valid.folder,
            skipped,
        },
        indexes: [train.index, valid.index],
        headers,
        notes,
    })
}

/// The job against its world size (launcher, before any rank starts; and every rank, for
/// jobs started without the launcher): refuses a job that cannot learn anything meaningful and
/// range-checks the counts and their products (`tchrun::counts`). Returns warnings for the
/// console.
///
/// * A single class: refused. A classifier of one class learns nothing; it would predict that
///   class for every image and report top-1 100 %.
/// * Fewer training images than ranks: refused. Each rank needs an image per step; the rest
///   would be the padding copies DistributedSampler adds (the model learns from duplicates).
/// * With `--global-batch-size G`, fewer than G images: a warning. Every epoch is one partial
///   step of real images (nothing is duplicated), but the LR is scaled for G.
/// * Fewer validation images than ranks: a warning (its metrics count padding copies).
pub fn check_job(
    inputs: &Inputs,
    job: &TrainJob,
    world: usize,
) -> Result<Vec<String>, PreflightError> {
    let p = &job.params;
    let (train, valid) = (&inputs.train, &inputs.valid);
    if train.classes.len() < 2 {
        return Err(PreflightError::Flags(format!(
            "--train {}: a single class ({}): a classifier of one class learns nothing (it \
             predicts that class for every image, top-1 100 %); give one folder per class, at \
             least 2",
            train.root.display(),
            train.classes.first().map(String::as_str).unwrap_or("none")
        )));
    }
    job.options
        .recipe
        .check(job.options.momentum)
        .map_err(PreflightError::Flags)?;
    job.options
        .augment
        .check(inputs.cfg.arch, inputs.cfg.input_size)
        .map_err(PreflightError::Flags)?;
    (job.options.class_weights)
        .resolve(&train.classes, train.samples.iter().map(|s| s.label))
        .map_err(PreflightError::Flags)?;
    let sampling = crate::Sampling::of(&job.options.recipe);
    if sampling.epoch_len(train.samples.len()) == 0 && sampling.ra_reps.is_some() {
        return Err(PreflightError::Flags(format!(
            "--ra-sampler: --train {} has {} image(s); torchvision's RASampler keeps the first \
             images // {} × {} positions of an epoch, none here; add images, or turn it off \
             with --ra-sampler=false (which also overrides a --recipe that turns it on)",
            train.root.display(),
            train.samples.len(),
            crate::RA_ROUND,
            crate::RA_ROUND
        )));
    }
    let n = sampling.epoch_len(train.samples.len()) as u64;
    let world64 = world as u64;
    if n < world64 {
        return Err(PreflightError::Flags(format!(
            "--train {}: {n} image(s) for {world} ranks: every rank needs at least one image \
             per step (the others would train on padding copies); add images or lower \
             --nodes/--procs-per-node to {n} rank(s) or fewer",
            train.root.display()
        )));
    }
    let world32 = u32::try_from(world)
        .map_err(|_| PreflightError::Flags(format!("{world} ranks is more than tchrun runs")))?;
    let counts = |e: tchrun::counts::CountError| PreflightError::Flags(e.0);
    let train_size = job.options.augment.crops(inputs.cfg.input_size).train;
    tchrun::counts::batch_bytes("--batch-size", p.batch_size, train_size).map_err(counts)?;
    let per_step =
        tchrun::counts::images_per_step(p.batch_size, world32, job.options.global_batch_size);
    let steps_per_epoch = n.div_ceil(per_step.max(1));
    tchrun::counts::total_steps(p.epochs, p.warmup_epochs, steps_per_epoch).map_err(counts)?;
    let mut warnings = Vec::new();
    if let Some(g) = job.options.global_batch_size {
        tchrun::counts::padded_epoch(g, n).map_err(counts)?;
        if n < u64::from(g) {
            warnings.push(format!(
                "warning: --global-batch-size {g}: --train {} has {n} image(s), fewer than one \
                 optimizer step takes: every epoch is one partial step of {n} images (the LR \
                 is scaled for {g}); lower --global-batch-size or add images",
                train.root.display()
            ));
        }
    }
    if (valid.samples.len() as u64) < world64 {
        warnings.push(format!(
            "warning: --valid {}: {} image(s) for {world} ranks: some ranks validate padding \
             copies, so the validation metrics count some images twice; add validation images",
            valid.root.display(),
            valid.samples.len()
        ));
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        job: TrainJob,
    }

    fn image(path: &Path, fill: u8) {
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        image::RgbImage::from_pixel(8, 8, image::Rgb([fill, 0, 0]))
            .save_with_format(path, image::ImageFormat::Png)
            .expect("png");
    }

    fn job(root: &Path, skip: bool) -> TrainJob {
        let cfg = model::ModelConfig::untrained(
            model::Arch::Resnet18,
            32,
            model::Normalization::default(),
        );
        std::fs::create_dir_all(root.join("model")).expect("mkdir");
        std::fs::write(root.join("model/model.json"), model::to_json(&cfg)).expect("model.json");
        let mut args: Vec<String> = ["t", "--model", "M", "--train", "T", "--valid", "V"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args[2] = root.join("model").display().to_string();
        args[4] = root.join("train").display().to_string();
        args[6] = root.join("valid").display().to_string();
        args.push("--output".into());
        args.push(root.join("out").display().to_string());
        if skip {
            args.push("--skip-bad-images".into());
        }
        Cli::try_parse_from(args).expect("flags").job
    }

    fn paths(f: &ImageFolder) -> Vec<PathBuf> {
        f.samples.iter().map(|s| s.path.clone()).collect()
    }

    fn launcher(limit: usize) -> Verification<'static> {
        Verification::Launcher {
            upfront_limit: limit,
        }
    }

    #[test]
    fn the_index_is_reused_by_ranks_and_jobs_and_rebuilt_when_the_data_changes() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        for (i, c) in ["a", "b"].iter().enumerate() {
            image(&r.join(format!("train/{c}/1.png")), i as u8);
            image(&r.join(format!("train/{c}/2.png")), i as u8);
            image(&r.join(format!("valid/{c}/1.png")), i as u8);
        }
        std::fs::write(r.join("train/b/bad.png"), b"not a png").expect("write");
        let j = job(r, true);

        // First job: built, verified now, bad image skipped and recorded.
        let first = check_train_job_with(&j, launcher(100)).expect("launcher");
        assert!(
            first.notes[0].contains("dataset index built"),
            "{:?}",
            first.notes
        );
        assert_eq!(first.headers, Headers::Verified { now: 7, before: 0 });
        assert_eq!(first.inputs.skipped.len(), 1);
        assert!(first.inputs.skipped[0].0.ends_with("b/bad.png"));
        assert_eq!(first.inputs.train.samples.len(), 4);

        // A rank given the launcher's copies: same samples, same skipped, nothing listed.
        let [tix, vix] = &first.indexes;
        let (tp, vp) = (r.join("train.idx"), r.join("valid.idx"));
        tix.as_ref().expect("train index").write(&tp).expect("copy");
        vix.as_ref().expect("valid index").write(&vp).expect("copy");
        let rank = Verification::Rank {
            train: Some(&tp),
            valid: Some(&vp),
            on_decode: false,
        };
        let c = check_train_job_with(&j, rank).expect("rank");
        assert!(c.notes[0].contains("not listed here"), "{:?}", c.notes);
        assert_eq!(paths(&c.inputs.train), paths(&first.inputs.train));
        assert_eq!(c.inputs.skipped, first.inputs.skipped);

        // Second job: reused, no header read again.
        let second = check_train_job_with(&j, launcher(100)).expect("second");
        assert!(second.notes[0].contains("reused"), "{:?}", second.notes);
        assert_eq!(second.headers, Headers::Verified { now: 0, before: 7 });
        assert_eq!(paths(&second.inputs.train), paths(&first.inputs.train));

        // Another pixel limit: verified again.
        let mut strict = j.clone();
        strict.options.max_image_pixels = 1000;
        let c = check_train_job_with(&strict, launcher(100)).expect("strict");
        assert_eq!(c.headers, Headers::Verified { now: 7, before: 0 });

        // A file added: the rank's copy is stale (it lists the folder itself) and the next job
        // rebuilds; the new bad file is found.
        std::thread::sleep(std::time::Duration::from_millis(20));
        std::fs::write(r.join("valid/a/new.png"), b"junk").expect("write");
        let c = check_train_job_with(&j, rank).expect("rank");
        assert!(c.notes[1].contains("listed here"), "{:?}", c.notes);
        assert_eq!(c.inputs.skipped.len(), 2, "{:?}", c.inputs.skipped);
        let c = check_train_job_with(&j, launcher(100)).expect("rebuilt");
        assert!(c.notes[1].contains("rebuilt"), "{:?}", c.notes);
        assert!(c.notes[1].contains("class folder 'a'"), "{:?}", c.notes);
        assert_eq!(c.inputs.skipped.len(), 2);

        // Without --skip-bad-images a bad file fails, from the index as without one.
        let plain = job(r, false);
        let e = check_train_job_with(&plain, launcher(100))
            .err()
            .expect("bad image refused")
            .to_string();
        assert!(e.contains("bad.png"), "{e}");

        // Above the limit, nothing is verified up front.
        let t2 = tempfile::tempdir().expect("tempdir");
        let r2 = t2.path();
        for c in ["a", "b"] {
            image(&r2.join(format!("train/{c}/1.png")), 0);
            image(&r2.join(format!("valid/{c}/1.png")), 0);
        }
        std::fs::write(r2.join("train/b/bad.png"), b"not a png").expect("write");
        let c = check_train_job_with(&job(r2, false), launcher(2)).expect("on decode");
        assert_eq!(c.headers, Headers::OnDecode { unverified: 5 });
        assert_eq!(c.inputs.train.samples.len(), 3);
        assert!(c.inputs.skipped.is_empty());
    }
}
