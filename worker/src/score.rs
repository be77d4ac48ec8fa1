//! `tchrun-worker score` ("Score Image Model"): batch inference of a trained model directory
//! over an image directory, written atomically as CSV: file, predicted class, probability,
//! top-5 classes and probabilities.
use crate::models;
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};
use tchrun::data::{self, Augment, ImageFolder, LoaderConfig, Sample};
use tchrun::model;

#[derive(Debug, thiserror::Error)]
pub enum ScoreError {
    #[error(transparent)]
    Model(#[from] model::InvalidModelDirectory),
    #[error(transparent)]
    Weights(#[from] models::WeightsError),
    #[error("--images {path}: {why}")]
    Images { path: PathBuf, why: String },
    #[error(transparent)]
    Data(#[from] data::DatasetError),
    #[error("--output {path}: {why}")]
    Output { path: PathBuf, why: String },
    #[error("tensor error: {0}")]
    Torch(#[from] tch::TchError),
}

impl ScoreError {
    pub fn is_input_error(&self) -> bool {
        !matches!(self, ScoreError::Torch(_) | ScoreError::Output { .. })
    }
}

/// Every image under `dir` (recursively, sorted, hidden entries skipped).
fn list_images(dir: &Path) -> Result<Vec<PathBuf>, ScoreError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let rd = std::fs::read_dir(&d).map_err(|e| ScoreError::Images {
            path: d.clone(),
            why: e.to_string(),
        })?;
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            if name.starts_with('.') {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if data::IMAGE_EXTENSIONS
                .iter()
                .any(|x| name.to_ascii_lowercase().ends_with(&format!(".{x}")))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// A CSV cell that a spreadsheet will not run as a formula.
fn cell(s: &str) -> String {
    if s.starts_with(['=', '+', '-', '@', '\t', '\r']) {
        format!("'{s}")
    } else {
        s.to_string()
    }
}

pub fn score(
    model_dir: &Path,
    images: &Path,
    output: &Path,
    batch_size: usize,
    device: Device,
    threads: usize,
) -> Result<usize, ScoreError> {
    let cfg = model::load(model_dir, true)?;
    if !images.is_dir() {
        return Err(ScoreError::Images {
            path: images.into(),
            why: "not a directory".into(),
        });
    }
    let files = list_images(images)?;
    if files.is_empty() {
        return Err(ScoreError::Images {
            path: images.into(),
            why: "no .jpg/.jpeg/.png images in it".into(),
        });
    }
    let mut vs = nn::VarStore::new(device);
    let net = models::build(
        cfg.arch,
        &vs.root(),
        cfg.class_names.len() as i64,
        cfg.memory_efficient,
    );
    models::load(&mut vs, &model_dir.join(tchrun::files::MODEL_WEIGHTS))?;
    let folder = ImageFolder {
        root: images.to_path_buf(),
        classes: cfg.class_names.clone(),
        samples: files
            .iter()
            .map(|p| Sample {
                path: p.clone(),
                label: 0,
            })
            .collect(),
    };
    let loader = data::load_batches(
        &folder,
        (0..files.len()).collect(),
        LoaderConfig {
            size: cfg.input_size as usize,
            batch_size,
            threads,
            prefetch: 4,
            augment: Augment::Eval,
            norm: cfg.normalization,
            seed: 0,
            epoch: 0,
            rank: 0,
            first_position: 0,
            skip_bad: false,
        },
    );
    let out_err = |e: &dyn std::fmt::Display| ScoreError::Output {
        path: output.into(),
        why: e.to_string(),
    };
    let k = 5.min(cfg.class_names.len() as i64);
    let mut rows = 0;
    // The CSV goes to a temporary file, renamed over --output once complete.
    let fill = |tmp: &Path| -> Result<(), ScoreError> {
        let mut w = csv::Writer::from_path(tmp).map_err(|e| out_err(&e))?;
        w.write_record([
            "file",
            "predicted_class",
            "probability",
            "top5_classes",
            "top5_probabilities",
        ])
        .map_err(|e| out_err(&e))?;
        for batch in loader {
            let batch = batch?;
            let s = batch.size as i64;
            let x = Tensor::from_slice(&batch.images)
                .view([batch.len as i64, 3, s, s])
                .to_device(device);
            let probs = tch::no_grad(|| {
                net.forward_t(&x, false)
                    .to_kind(Kind::Float)
                    .softmax(-1, Kind::Float)
            });
            let (p, i) = probs.topk(k, -1, true, true);
            let p = Vec::<Vec<f32>>::try_from(p.to_device(Device::Cpu))?;
            let i = Vec::<Vec<i64>>::try_from(i.to_device(Device::Cpu))?;
            for (n, path) in batch.paths.iter().enumerate() {
                let rel = path
                    .strip_prefix(images)
                    .unwrap_or(path)
                    .display()
                    .to_string();
                let name = |c: i64| {
                    cell(
                        cfg.class_names
                            .get(c as usize)
                            .map(String::as_str)
                            .unwrap_or("?"),
                    )
                };
                let classes: Vec<String> = i[n].iter().map(|&c| name(c)).collect();
                let probs: Vec<String> = p[n].iter().map(|v| format!("{v:.6}")).collect();
                w.write_record([
                    cell(&rel),
                    name(i[n][0]),
                    format!("{:.6}", p[n][0]),
                    classes.join(";"),
                    probs.join(";"),
                ])
                .map_err(|e| out_err(&e))?;
                rows += 1;
            }
        }
        w.flush().map_err(|e| out_err(&e))?;
        Ok(())
    };
    tchrun::files::write_atomic_with(output, fill, |e| out_err(&e.source))?;
    Ok(rows)
}
