//! The training job's input checks (the seed's errors), shared by the launcher's pre-flight
//! (before any rank starts) and every rank (which also decodes every image header).
use crate::data::{DatasetError, ImageFolder};
use crate::flags::TrainJob;
use crate::model::{self, ModelConfig};
use std::path::{Path, PathBuf};

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

/// Refuses an `--output` that holds a trained model (unless resuming) or is not a directory.
pub fn check_output(output: &Path, resume: bool) -> Result<(), PreflightError> {
    let model_json = output.join(crate::files::MODEL_JSON);
    if output.exists() && !output.is_dir() {
        return Err(PreflightError::Output(format!(
            "--output {}: exists and is not a directory",
            output.display()
        )));
    }
    if model_json.exists() && !resume {
        return Err(PreflightError::Output(format!(
            "--output {}: already holds a trained model ({}); choose another --output or remove it",
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
        Verification::Full
    } else {
        Verification::None
    };
    check_train_job_with(job, verification).map(|c| c.inputs)
}

/// How `check_train_job_with` treats the image headers.
pub enum Verification<'a> {
    /// Layout and classes only.
    None,
    /// Every header.
    Full,
    /// Reuse the launcher's verification when it describes exactly the images scanned here
    /// (same roots, same file lists, same limits); otherwise every header.
    Reuse(&'a VerifiedInputs),
}

/// The result of `check_train_job_with`.
pub struct Checked {
    /// The archives among `--train`/`--valid`, extracted (or found extracted); the inputs'
    /// roots are their folders.
    pub extracted: Vec<crate::data::archive::Extracted>,
    pub inputs: Inputs,
    /// What was verified, for the ranks (`None` without verification or for a non-UTF-8 path).
    pub manifest: Option<VerifiedInputs>,
    /// `Verification::Reuse` only: `Ok` when the manifest was used, else why not.
    pub reused: Result<(), String>,
}

pub fn check_train_job_with(
    job: &TrainJob,
    verification: Verification,
) -> Result<Checked, PreflightError> {
    let cfg = model::load(&job.model, false).map_err(PreflightError::Model)?;
    check_output(&job.output, job.options.resume)?;
    let weights = job.model.join(crate::files::MODEL_WEIGHTS);
    if weights.is_file() {
        crate::weights::check(cfg.arch, &weights).map_err(|e| {
            PreflightError::Model(model::InvalidModelDirectory {
                path: weights.clone(),
                detail: format!(
                    "its weights do not fit {}: {e}; run `tchrun model init` again",
                    cfg.arch.name()
                ),
            })
        })?;
    }
    let last = cfg.arch.last_feature_size(cfg.input_size);
    if job.params.batch_size == 1 && last <= 1 {
        return Err(PreflightError::Flags(format!(
            "--batch-size 1: {} at input size {} ends in a 1x1 feature map, so batch norm would see \
             one value per channel and its running variance would become NaN; use --batch-size 2 \
             or more, or a model with --input-size {} or more",
            cfg.arch.name(),
            cfg.input_size,
            cfg.arch.min_input_for_single_image()
        )));
    }
    let ds = |flag: &'static str| move |error| PreflightError::Dataset { flag, error };
    // Archives become their extracted folders (once, cached next to --output).
    let cache = crate::data::archive::cache_root(&job.output);
    let mut extracted = Vec::new();
    let mut folder = |flag: &'static str, src: &Path| -> Result<PathBuf, PreflightError> {
        match crate::data::archive::resolve(src, &cache).map_err(ds(flag))? {
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
    let mut train = ImageFolder::scan(&train_dir).map_err(ds("--train"))?;
    let mut valid = ImageFolder::scan(&valid_dir).map_err(ds("--valid"))?;
    ImageFolder::check_same_classes(&train, &valid).map_err(ds("--train/--valid"))?;
    let (skip, max) = (job.options.skip_bad_images, job.options.max_image_pixels);
    // The file lists the manifest records and compares (not needed without verification).
    let scanned = match verification {
        Verification::None => (None, None),
        _ => (
            VerifiedFolder::listing(&train),
            VerifiedFolder::listing(&valid),
        ),
    };
    let mut skipped = Vec::new();
    let mut reused = Err("not asked to reuse a verification".to_string());
    let mut manifest = None;
    let full = match (&verification, &scanned) {
        (Verification::None, _) => false,
        (Verification::Full, _) => true,
        (Verification::Reuse(m), (Some(t), Some(v))) => {
            match m.matches(skip, max, (&train.root, t), (&valid.root, v)) {
                Ok(()) => {
                    skipped.extend(m.train.apply(&mut train).map_err(ds("--train"))?);
                    skipped.extend(m.valid.apply(&mut valid).map_err(ds("--valid"))?);
                    reused = Ok(());
                    false
                }
                Err(why) => {
                    reused = Err(why);
                    true
                }
            }
        }
        (Verification::Reuse(_), _) => {
            reused = Err("an image path is not UTF-8".into());
            true
        }
    };
    if full {
        let bad_train = train.verify(skip, max).map_err(ds("--train"))?;
        let bad_valid = valid.verify(skip, max).map_err(ds("--valid"))?;
        if let (Some(t), Some(v)) = scanned {
            manifest = Some(VerifiedInputs {
                format: VerifiedInputs::FORMAT,
                skip_bad_images: skip,
                max_image_pixels: max,
                train: VerifiedFolder::new(&train.root, t, &bad_train),
                valid: VerifiedFolder::new(&valid.root, v, &bad_valid),
            });
        }
        skipped.extend(bad_train);
        skipped.extend(bad_valid);
    }
    Ok(Checked {
        extracted,
        inputs: Inputs {
            cfg,
            train,
            valid,
            skipped,
        },
        manifest,
        reused,
    })
}

/// The launcher's header verification, handed to the ranks (`verified_inputs.json` in the log
/// directory) so that they do not read every image header again before the first step. A rank
/// uses it only if its own scan of the folders gives exactly the same files (a node with a
/// different copy of the data verifies for itself).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VerifiedInputs {
    pub format: u32,
    pub skip_bad_images: bool,
    pub max_image_pixels: u64,
    pub train: VerifiedFolder,
    pub valid: VerifiedFolder,
}

/// One image folder: every image file found (relative paths, scan order) and the bad ones.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct VerifiedFolder {
    pub root: PathBuf,
    pub images: Vec<String>,
    /// `(relative path, reason)`, only under `--skip-bad-images`.
    pub bad: Vec<(String, String)>,
}

impl VerifiedInputs {
    pub const FORMAT: u32 = 1;

    pub fn read(path: &Path) -> Result<VerifiedInputs, String> {
        let text = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let m: VerifiedInputs =
            serde_json::from_slice(&text).map_err(|e| format!("{}: {e}", path.display()))?;
        if m.format != Self::FORMAT {
            return Err(format!(
                "{}: format {} (expected {})",
                path.display(),
                m.format,
                Self::FORMAT
            ));
        }
        Ok(m)
    }

    /// Writes atomically (`files::write_atomic`).
    pub fn write(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_vec(self).map_err(std::io::Error::other)?;
        crate::files::write_atomic(path, &text).map_err(|e| e.source)
    }

    fn matches(
        &self,
        skip: bool,
        max: u64,
        train: (&Path, &[String]),
        valid: (&Path, &[String]),
    ) -> Result<(), String> {
        if self.skip_bad_images != skip || self.max_image_pixels != max {
            return Err("verified with other --skip-bad-images/--max-image-pixels".into());
        }
        if !skip && !(self.train.bad.is_empty() && self.valid.bad.is_empty()) {
            return Err("lists bad images but --skip-bad-images is off".into());
        }
        for (name, mine, theirs) in [("train", train, &self.train), ("valid", valid, &self.valid)] {
            if mine.0 != theirs.root {
                return Err(format!(
                    "{name} folder differs ({} here, {} verified)",
                    mine.0.display(),
                    theirs.root.display()
                ));
            }
            if mine.1 != theirs.images.as_slice() {
                return Err(format!(
                    "{name} images differ ({} here, {} verified)",
                    mine.1.len(),
                    theirs.images.len()
                ));
            }
        }
        Ok(())
    }
}

impl VerifiedFolder {
    /// Relative paths of every sample, or `None` if one is not UTF-8.
    fn listing(f: &ImageFolder) -> Option<Vec<String>> {
        f.samples
            .iter()
            .map(|s| {
                s.path
                    .strip_prefix(&f.root)
                    .ok()
                    .and_then(|p| p.to_str())
                    .map(str::to_string)
            })
            .collect()
    }

    fn new(root: &Path, images: Vec<String>, bad: &[(PathBuf, String)]) -> VerifiedFolder {
        VerifiedFolder {
            root: root.to_path_buf(),
            images,
            bad: bad
                .iter()
                .filter_map(|(p, why)| {
                    let rel = p.strip_prefix(root).ok()?.to_str()?;
                    Some((rel.to_string(), why.clone()))
                })
                .collect(),
        }
    }

    /// Drops the bad images from `folder`; returns them as `(path, reason)`.
    fn apply(&self, folder: &mut ImageFolder) -> Result<Vec<(PathBuf, String)>, DatasetError> {
        if self.bad.is_empty() {
            return Ok(Vec::new());
        }
        let bad: std::collections::HashMap<&str, &str> = self
            .bad
            .iter()
            .map(|(p, w)| (p.as_str(), w.as_str()))
            .collect();
        let root = folder.root.clone();
        let n = folder.samples.len();
        let mut skipped = Vec::new();
        folder.samples.retain(|s| {
            let rel = s.path.strip_prefix(&root).ok().and_then(|p| p.to_str());
            match rel.and_then(|r| bad.get(r)) {
                Some(why) => {
                    skipped.push((s.path.clone(), why.to_string()));
                    false
                }
                None => true,
            }
        });
        if folder.samples.is_empty() {
            return Err(DatasetError::Empty {
                path: root,
                detail: format!("all {n} images failed verification; check the files"),
            });
        }
        Ok(skipped)
    }
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

    #[test]
    fn ranks_reuse_the_launchers_verification_only_for_the_same_files() {
        let t = tempfile::tempdir().expect("tempdir");
        let r = t.path();
        for (i, c) in ["a", "b"].iter().enumerate() {
            image(&r.join(format!("train/{c}/1.png")), i as u8);
            image(&r.join(format!("train/{c}/2.png")), i as u8);
            image(&r.join(format!("valid/{c}/1.png")), i as u8);
        }
        std::fs::write(r.join("train/b/bad.png"), b"not a png").expect("write");
        let j = job(r, true);

        let launcher = check_train_job_with(&j, Verification::Full).expect("launcher");
        let m = launcher.manifest.clone().expect("manifest");
        assert_eq!(m.train.images.len(), 5);
        assert_eq!(m.train.bad.len(), 1);
        assert_eq!(m.train.bad[0].0, "b/bad.png");
        let file = r.join(crate::files::VERIFIED_INPUTS);
        m.write(&file).expect("write manifest");
        let read = VerifiedInputs::read(&file).expect("read manifest");
        assert_eq!(read, m);

        // Same files: reused, and the result equals a full verification.
        let rank = check_train_job_with(&j, Verification::Reuse(&read)).expect("rank");
        assert_eq!(rank.reused, Ok(()));
        assert_eq!(paths(&rank.inputs.train), paths(&launcher.inputs.train));
        assert_eq!(rank.inputs.skipped, launcher.inputs.skipped);
        assert_eq!(rank.inputs.train.samples.len(), 4);

        // Another limit, or a file the launcher did not see: verified again.
        let mut strict = j.clone();
        strict.options.max_image_pixels = 1000;
        let e = check_train_job_with(&strict, Verification::Reuse(&read));
        assert!(e.is_ok_and(|c| c.reused.is_err() && c.inputs.skipped.len() == 1));
        std::fs::write(r.join("valid/a/new.png"), b"junk").expect("write");
        let c = check_train_job_with(&j, Verification::Reuse(&read)).expect("rank");
        let why = c.reused.expect_err("must not reuse");
        assert!(why.contains("valid images differ"), "{why}");
        assert_eq!(c.inputs.skipped.len(), 2, "{:?}", c.inputs.skipped);

        // Without --skip-bad-images a bad file fails, as it would without a manifest.
        let plain = job(r, false);
        let e = check_train_job_with(&plain, Verification::Reuse(&read))
            .err()
            .expect("bad image refused")
            .to_string();
        assert!(e.contains("bad.png"), "{e}");
    }
}
