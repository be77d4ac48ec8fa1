//! `tchrun-worker score` ("Score Image Model"), and the batch inference of a trained model
//! directory on every rank of the job that `evaluate` ("Evaluate Model", `evaluate.rs`) shares.
//!
//! Sharding is by whole batches: the images (sorted paths) are cut into batches of
//! `--batch-size` once, and rank `r` scores batches `r, r + W, r + 2W, ...`. Every image is
//! scored exactly once (no padding to count out), inside the same batch as with one rank, and
//! each rank hands its rows to rank 0 through the job's store; rank 0 writes them in the
//! images' order, so the output of W ranks is byte-identical to one rank's.
use crate::models;
use std::path::{Path, PathBuf};
use tch::{nn, Device, Kind, Tensor};
use tchrun::model::{self, ModelConfig};
use tchrun_data::{self as data, Augment, ImageFolder, LoaderConfig, Sample};

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
    #[error("gathering the scores on rank 0: {0}")]
    Gather(String),
    /// Two models that cannot be compared (`tchrun_data::comparison::check_same_classes`).
    #[error("{0}")]
    Models(String),
}

impl ScoreError {
    pub fn is_input_error(&self) -> bool {
        !matches!(
            self,
            ScoreError::Torch(_) | ScoreError::Output { .. } | ScoreError::Gather(_)
        )
    }
}

/// Where this rank stands in the job, and how rows reach rank 0.
pub struct Ranks<'a> {
    pub rank: usize,
    pub world: usize,
    /// Rank `r` publishes its rows under key `r`; rank 0 reads them all.
    pub set: &'a dyn Fn(&str, &[u8]) -> Result<(), String>,
    pub get: &'a dyn Fn(&str) -> Result<Vec<u8>, String>,
}

/// Compute settings of one rank.
pub struct Compute {
    pub batch_size: usize,
    pub device: Device,
    pub threads: usize,
}

/// One image's result: up to five (class, probability), most probable first, and the
/// probability of its label (evaluate; 0 for unlabeled scoring).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Row {
    pub top: Vec<(usize, f32)>,
    pub p_label: f32,
}

/// Every image under `dir` (recursively, sorted, hidden entries skipped).
pub(crate) fn list_images(dir: &Path) -> Result<Vec<PathBuf>, ScoreError> {
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

/// The indices of the images rank `rank` of `world` scores: its whole batches, in order.
pub fn shard(n: usize, batch: usize, rank: usize, world: usize) -> Vec<usize> {
    let batches = n.div_ceil(batch);
    (rank..batches)
        .step_by(world.max(1))
        .flat_map(|b| b * batch..((b + 1) * batch).min(n))
        .collect()
}

/// Rows as bytes for the store: per row its image index, the label probability and the top-k.
fn encode(rows: &[(usize, Row)]) -> Vec<u8> {
    let mut out = Vec::with_capacity(rows.len() * 48);
    for (i, r) in rows {
        out.extend_from_slice(&(*i as u64).to_le_bytes());
        out.extend_from_slice(&r.p_label.to_le_bytes());
        out.push(r.top.len() as u8);
        for &(c, p) in &r.top {
            out.extend_from_slice(&(c as u32).to_le_bytes());
            out.extend_from_slice(&p.to_le_bytes());
        }
    }
    out
}

fn decode(mut b: &[u8]) -> Result<Vec<(usize, Row)>, String> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Result<&'a [u8], String> {
        if b.len() < n {
            return Err("truncated rows".into());
        }
        let (h, t) = b.split_at(n);
        *b = t;
        Ok(h)
    }
    let mut out = Vec::new();
    while !b.is_empty() {
        let i = u64::from_le_bytes(take(&mut b, 8)?.try_into().map_err(|_| "index")?);
        let p_label = f32::from_le_bytes(take(&mut b, 4)?.try_into().map_err(|_| "p")?);
        let k = take(&mut b, 1)?[0] as usize;
        let mut top = Vec::with_capacity(k);
        for _ in 0..k {
            let c = u32::from_le_bytes(take(&mut b, 4)?.try_into().map_err(|_| "class")?);
            let p = f32::from_le_bytes(take(&mut b, 4)?.try_into().map_err(|_| "prob")?);
            top.push((c as usize, p));
        }
        out.push((i as usize, Row { top, p_label }));
    }
    Ok(out)
}

/// The loader of the model's validation preprocessing (--val-resize-size, --val-crop-size,
/// --interpolation as trained; the input size's for a model trained before them): what
/// `score`, `evaluate` and `tchrun export`'s check feed the model.
pub(crate) fn val_loader(cfg: &ModelConfig, batch_size: usize, threads: usize) -> LoaderConfig {
    let (size, augment) = match &cfg.training {
        Some(t) => {
            let c = t.augment.crops(cfg.input_size);
            let interpolation = data::Interpolation::named(&t.augment.interpolation);
            let resize = c.val_resize as usize;
            (
                c.val_crop,
                Augment::Resize {
                    resize,
                    interpolation,
                },
            )
        }
        None => (cfg.input_size, Augment::Eval),
    };
    LoaderConfig {
        size: size as usize,
        batch_size,
        threads: threads.max(1),
        prefetch: 4,
        augment,
        norm: cfg.normalization,
        seed: 0,
        epoch: 0,
        rank: 0,
        first_position: 0,
        skip_bad: false,
        max_pixels: tchrun_data::DEFAULT_MAX_IMAGE_PIXELS,
        global: None,
    }
}

/// Scores this rank's shard of `folder` (labels: indices into the model's classes).
pub(super) fn infer(
    model_dir: &Path,
    cfg: &ModelConfig,
    folder: &ImageFolder,
    indices: Vec<usize>,
    compute: &Compute,
) -> Result<Vec<(usize, Row)>, ScoreError> {
    if indices.is_empty() {
        return Ok(Vec::new());
    }
    let device = compute.device;
    let mut vs = nn::VarStore::new(device);
    let net = models::build(
        cfg.arch,
        &vs.root(),
        cfg.class_names.len() as i64,
        cfg.input_size.into(),
        cfg.memory_efficient,
    );
    models::load(&mut vs, &model_dir.join(tchrun::files::MODEL_WEIGHTS))?;
    let order = indices.clone();
    let loader = data::load_batches(
        folder,
        indices,
        val_loader(cfg, compute.batch_size, compute.threads),
    );
    let k = 5.min(cfg.class_names.len() as i64);
    let mut rows = Vec::with_capacity(order.len());
    let mut next = order.into_iter();
    for batch in loader {
        let batch = batch?;
        let s = batch.size as i64;
        let x = Tensor::from_slice(&batch.images)
            .view([batch.len as i64, 3, s, s])
            .to_device(device);
        let labels = Tensor::from_slice(&batch.labels).to_device(device);
        let probs = tch::no_grad(|| {
            net.forward_t(&x, false)
                .to_kind(Kind::Float)
                .softmax(-1, Kind::Float)
        });
        let (p, i) = probs.topk(k, -1, true, true);
        let p_label = probs.gather(1, &labels.unsqueeze(1), false).squeeze_dim(1);
        let p = Vec::<Vec<f32>>::try_from(p.to_device(Device::Cpu))?;
        let i = Vec::<Vec<i64>>::try_from(i.to_device(Device::Cpu))?;
        let p_label = Vec::<f32>::try_from(p_label.to_device(Device::Cpu))?;
        for n in 0..batch.len {
            let index = next.next().ok_or_else(|| {
                ScoreError::Gather("the loader yielded more images than asked".into())
            })?;
            rows.push((
                index,
                Row {
                    top: i[n]
                        .iter()
                        .zip(&p[n])
                        .map(|(&c, &v)| (c as usize, v))
                        .collect(),
                    p_label: p_label[n],
                },
            ));
        }
    }
    Ok(rows)
}

/// This rank's rows of model `model` (its index among `--model`s) to rank 0; on rank 0 every
/// image's row, in the images' order.
pub(super) fn gather(
    ranks: &Ranks,
    model: usize,
    mine: Vec<(usize, Row)>,
    n: usize,
) -> Result<Option<Vec<Row>>, ScoreError> {
    let key = |r: usize| format!("tchrun/inference/{model}/rows/{r}");
    if ranks.rank != 0 {
        (ranks.set)(&key(ranks.rank), &encode(&mine)).map_err(ScoreError::Gather)?;
        return Ok(None);
    }
    let mut all: Vec<Option<Row>> = vec![None; n];
    let mut put = |rows: Vec<(usize, Row)>| {
        for (i, r) in rows {
            if let Some(slot) = all.get_mut(i) {
                *slot = Some(r);
            }
        }
    };
    put(mine);
    for r in 1..ranks.world {
        let bytes = (ranks.get)(&key(r)).map_err(ScoreError::Gather)?;
        put(decode(&bytes).map_err(|e| ScoreError::Gather(format!("rank {r}: {e}")))?);
    }
    all.into_iter()
        .enumerate()
        .map(|(i, r)| r.ok_or_else(|| ScoreError::Gather(format!("no rank scored image {i}"))))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
}

use tchrun::csv_out::cell;

pub(super) fn out_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> ScoreError + '_ {
    move |e| ScoreError::Output {
        path: path.into(),
        why: e.to_string(),
    }
}

/// Writes a CSV through the one CSV writer (`tchrun::csv_out`: quoting, formula-safe cells,
/// atomic).
pub(super) fn write_csv(
    path: &Path,
    header: &[&str],
    rows: impl Iterator<Item = Vec<String>>,
) -> Result<(), ScoreError> {
    tchrun::csv_out::write(path, header, rows).map_err(|e| out_err(path)(&e.why))
}

pub(super) fn relative(path: &Path, root: &Path) -> String {
    path.strip_prefix(root)
        .unwrap_or(path)
        .display()
        .to_string()
}

/// The top-5 cells: class names joined by `;`, probabilities with 6 decimals joined by `;`.
pub(super) fn top_cells(cfg: &ModelConfig, top: &[(usize, f32)]) -> [String; 4] {
    let name = |c: usize| cell(cfg.class_names.get(c).map(String::as_str).unwrap_or("?"));
    let (c0, p0) = top.first().copied().unwrap_or((usize::MAX, 0.0));
    [
        name(c0),
        format!("{p0:.6}"),
        top.iter()
            .map(|&(c, _)| name(c))
            .collect::<Vec<_>>()
            .join(";"),
        top.iter()
            .map(|&(_, p)| format!("{p:.6}"))
            .collect::<Vec<_>>()
            .join(";"),
    ]
}

/// `score`: every image under `images`; rank 0 writes the CSV. Returns the rows written (0 on
/// the other ranks).
pub fn score(
    model_dir: &Path,
    images: &Path,
    output: &Path,
    compute: &Compute,
    ranks: &Ranks,
) -> Result<usize, ScoreError> {
    let cfg = model::load(model_dir, true)?;
    // A packed directory (`tchrun data pack`): its samples (their labels unused), read from
    // the shards; the file column is their original path.
    if data::pack::is_pack(images) {
        let mut folder = data::pack::open(images)?;
        for s in &mut folder.samples {
            s.label = 0;
        }
        folder.classes = cfg.class_names.clone();
        let files: Vec<PathBuf> = folder.samples.iter().map(|s| s.path.clone()).collect();
        return score_folder(model_dir, &cfg, folder, files, output, compute, ranks);
    }
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
            why: format!(
                "no images in it ({})",
                data::IMAGE_EXTENSIONS
                    .iter()
                    .map(|x| format!(".{x}"))
                    .collect::<Vec<_>>()
                    .join("/")
            ),
        });
    }
    let folder = ImageFolder {
        root: images.to_path_buf(),
        classes: cfg.class_names.clone(),
        samples: files
            .iter()
            .map(|p| Sample {
                path: p.clone(),
                label: 0,
                member: None,
            })
            .collect(),
    };
    score_folder(model_dir, &cfg, folder, files, output, compute, ranks)
}

/// `score` of the images of `folder` (`files`: their paths, in order).
fn score_folder(
    model_dir: &Path,
    cfg: &model::ModelConfig,
    folder: ImageFolder,
    files: Vec<PathBuf>,
    output: &Path,
    compute: &Compute,
    ranks: &Ranks,
) -> Result<usize, ScoreError> {
    let images = folder.root.as_path();
    let n = files.len();
    let mine = shard(n, compute.batch_size, ranks.rank, ranks.world);
    tracing::info!(images = n, this_rank = mine.len(), "scoring");
    let rows = infer(model_dir, cfg, &folder, mine, compute)?;
    let Some(all) = gather(ranks, 0, rows, n)? else {
        return Ok(0);
    };
    write_csv(
        output,
        &[
            "file",
            "predicted_class",
            "probability",
            "top5_classes",
            "top5_probabilities",
        ],
        files.iter().zip(&all).map(|(path, r)| {
            let mut v = vec![cell(&relative(path, images))];
            v.extend(top_cells(cfg, &r.top));
            v
        }),
    )?;
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_whole_batches_covering_every_image_once() {
        for n in [1usize, 7, 10, 11, 64, 65] {
            for batch in [1usize, 3, 4, 64] {
                for world in [1usize, 2, 3, 5] {
                    let mut all: Vec<usize> =
                        (0..world).flat_map(|r| shard(n, batch, r, world)).collect();
                    // Each rank's list, cut into `batch`-sized chunks, gives the global batches.
                    for r in 0..world {
                        for c in shard(n, batch, r, world).chunks(batch) {
                            assert_eq!(c[0] % batch, 0, "n={n} batch={batch} world={world}");
                            assert!(c.windows(2).all(|w| w[1] == w[0] + 1));
                        }
                    }
                    all.sort();
                    assert_eq!(all, (0..n).collect::<Vec<_>>());
                }
            }
        }
    }

    #[test]
    fn rows_round_trip_through_bytes() {
        let rows = vec![
            (
                3,
                Row {
                    top: vec![(1, 0.5), (0, 0.25)],
                    p_label: 1e-30,
                },
            ),
            (
                0,
                Row {
                    top: vec![],
                    p_label: 0.0,
                },
            ),
        ];
        assert_eq!(decode(&encode(&rows)).unwrap(), rows);
        assert!(decode(&encode(&rows)[..5]).is_err());
    }
}
