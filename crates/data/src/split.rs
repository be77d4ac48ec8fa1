//! `tchrun data split` ("Split Image Directory"): one image folder into `train/` and `valid/`,
//! stratified per class and reproducible from a seed.
//!
//! * Per class (the files [`ImageFolder::scan`] finds, sorted by name bytes), the list is
//!   shuffled (Fisher-Yates, `rand` 0.8's `SliceRandom::shuffle`) by a ChaCha8 generator seeded
//!   with the first 8 bytes (little-endian) of `sha256("tchrun data split" ‖ seed as i64 LE ‖
//!   class name)`, so a class's split depends only on the seed and its own files. The first
//!   [`train_count`] files go to `train/`, the rest to `valid/`.
//! * [`train_count`]: `round(n × fraction)` (halves away from zero), kept within `1..=n-1` so
//!   that both sides hold every class with 2 or more images; a class with 1 image goes to
//!   `train/` only (reported).
//! * Files are hard links to the originals where the file system allows (same device), else
//!   copies; the report says which.
//! * The output is built in a hidden `.<name>.tchrun-split-<pid>` folder next to it and renamed
//!   into place at the end; an existing non-empty output is refused.
use super::*;
use std::io::ErrorKind as IoKind;

#[derive(Debug, thiserror::Error)]
pub enum SplitError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error(
        "--fraction {0}: must be strictly between 0 and 1 (the share of each class in train/)"
    )]
    Fraction(f64),
    #[error("--output {}: {detail}", path.display())]
    Output { path: PathBuf, detail: String },
}

/// Sub-folders of the output (the `--train`/`--valid` of `tchrun train`).
pub const SPLIT_TRAIN: &str = "train";
pub const SPLIT_VALID: &str = "valid";

/// Images of one class going to train: see the module docs.
pub fn train_count(n: usize, fraction: f64) -> usize {
    if n <= 1 {
        return n;
    }
    let k = (n as f64 * fraction).round();
    (k.max(1.0) as usize).min(n - 1)
}

/// One class's split.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSplit {
    pub class: String,
    pub train: Vec<PathBuf>,
    pub valid: Vec<PathBuf>,
}

fn class_rng(seed: i64, class: &str) -> ChaCha8Rng {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(b"tchrun data split");
    h.update(seed.to_le_bytes());
    h.update(class.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    ChaCha8Rng::seed_from_u64(u64::from_le_bytes(first))
}

/// The split of every class of `folder` (in class order).
pub fn plan_split(
    folder: &ImageFolder,
    fraction: f64,
    seed: i64,
) -> Result<Vec<ClassSplit>, SplitError> {
    if !(fraction > 0.0 && fraction < 1.0) {
        return Err(SplitError::Fraction(fraction));
    }
    let mut out = Vec::with_capacity(folder.classes.len());
    for (label, class) in folder.classes.iter().enumerate() {
        let mut files: Vec<PathBuf> = folder
            .samples
            .iter()
            .filter(|s| s.label == label)
            .map(|s| s.path.clone())
            .collect();
        files.sort_by(|a, b| {
            a.file_name()
                .map(|n| n.as_encoded_bytes())
                .cmp(&b.file_name().map(|n| n.as_encoded_bytes()))
        });
        files.shuffle(&mut class_rng(seed, class));
        let valid = files.split_off(train_count(files.len(), fraction));
        out.push(ClassSplit {
            class: class.clone(),
            train: files,
            valid,
        });
    }
    Ok(out)
}

/// What [`write_split`] did.
#[derive(Debug, Clone, PartialEq)]
pub struct SplitReport {
    pub linked: u64,
    pub copied: u64,
    /// Why files were copied (the first error of a hard link), when some were.
    pub copy_reason: Option<String>,
}

/// An output folder that may be written: absent, or an empty directory.
pub fn check_split_output(output: &Path) -> Result<(), SplitError> {
    let err = |detail: String| SplitError::Output {
        path: output.to_path_buf(),
        detail,
    };
    match fs::symlink_metadata(output) {
        Err(e) if e.kind() == IoKind::NotFound => Ok(()),
        Err(e) => Err(err(format!("cannot be read ({e})"))),
        Ok(m) if !m.is_dir() => Err(err("exists and is not a folder; choose a new folder".into())),
        Ok(_) => {
            let mut rd = fs::read_dir(output).map_err(|e| err(format!("cannot be read ({e})")))?;
            if rd.next().is_some() {
                Err(err(
                    "exists and is not empty; choose a new folder or remove this one (a split \
                     never writes into existing data)"
                        .into(),
                ))
            } else {
                Ok(())
            }
        }
    }
}

/// Writes `output/train/<class>/...` and `output/valid/<class>/...` (see the module docs).
pub fn write_split(plan: &[ClassSplit], output: &Path) -> Result<SplitReport, SplitError> {
    check_split_output(output)?;
    let out_err = |detail: String| SplitError::Output {
        path: output.to_path_buf(),
        detail,
    };
    let name = output
        .file_name()
        .ok_or_else(|| out_err("has no folder name; name the folder to create".into()))?
        .to_string_lossy()
        .into_owned();
    let parent = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).map_err(|e| out_err(format!("cannot create its parent ({e})")))?;
    let tmp = parent.join(format!(".{name}.tchrun-split-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    let built = fill(plan, &tmp).and_then(|report| {
        // rename(2) replaces an empty directory; a non-empty one (written meanwhile) fails.
        fs::rename(&tmp, output)
            .map_err(|e| out_err(format!("cannot move the finished split into place ({e})")))?;
        Ok(report)
    });
    if built.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    built
}

fn fill(plan: &[ClassSplit], tmp: &Path) -> Result<SplitReport, SplitError> {
    let mut report = SplitReport {
        linked: 0,
        copied: 0,
        copy_reason: None,
    };
    fs::create_dir(tmp).map_err(|e| io_err(tmp, e))?;
    for side in [SPLIT_TRAIN, SPLIT_VALID] {
        fs::create_dir(tmp.join(side)).map_err(|e| io_err(&tmp.join(side), e))?;
    }
    for c in plan {
        for (side, files) in [(SPLIT_TRAIN, &c.train), (SPLIT_VALID, &c.valid)] {
            if files.is_empty() {
                continue;
            }
            let dir = tmp.join(side).join(&c.class);
            fs::create_dir(&dir).map_err(|e| io_err(&dir, e))?;
            for src in files {
                let file_name = src.file_name().ok_or_else(|| DatasetError::BadImage {
                    path: src.clone(),
                    detail: "has no file name".into(),
                })?;
                let dst = dir.join(file_name);
                // The file itself, not a link to it (scans follow links).
                let real = fs::canonicalize(src).map_err(|e| io_err(src, e))?;
                match fs::hard_link(&real, &dst) {
                    Ok(()) => report.linked += 1,
                    Err(e) => {
                        fs::copy(&real, &dst).map_err(|e| io_err(&dst, e))?;
                        report.copied += 1;
                        report.copy_reason.get_or_insert_with(|| e.to_string());
                    }
                }
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn train_counts() {
        assert_eq!(train_count(0, 0.9), 0);
        assert_eq!(train_count(1, 0.9), 1);
        assert_eq!(train_count(1, 0.1), 1);
        assert_eq!(train_count(2, 0.9), 1);
        assert_eq!(train_count(2, 0.1), 1);
        assert_eq!(train_count(5, 0.9), 4); // round(4.5) = 5, kept at n-1
        assert_eq!(train_count(10, 0.9), 9);
        assert_eq!(train_count(10, 0.25), 3); // round(2.5) = 3
        assert_eq!(train_count(11, 0.5), 6); // round(5.5) = 6
        assert_eq!(train_count(100, 0.01), 1);
        for n in 2..50 {
            for f in [0.01, 0.3, 0.5, 0.77, 0.99] {
                let k = train_count(n, f);
                assert!(k >= 1 && k < n, "{n} {f} {k}");
            }
        }
    }

    #[test]
    fn rng_depends_on_seed_and_class() {
        use rand::RngCore;
        let a = class_rng(1, "cat").next_u64();
        assert_eq!(a, class_rng(1, "cat").next_u64());
        assert_ne!(a, class_rng(2, "cat").next_u64());
        assert_ne!(a, class_rng(1, "dog").next_u64());
    }
}
