//! The export's check batch (`--check-images` through `score`'s own preprocessing, or a
//! seeded synthetic batch) and the difference of two probability tables.
use super::error::ExportError;
use crate::infer::score;
use std::path::Path;
use tch::{Device, Kind, Tensor};
use tchrun::export::{Difference, Preprocess, CHECK_IMAGES, SYNTHETIC_IMAGES};
use tchrun::model::ModelConfig;
use tchrun_data::{self as data, ImageFolder, Sample};

/// The images the check runs, as the model takes them (`floats`: normalized NCHW float32)
/// and as a client of `--with-preprocess` sends them (`pixels`: NHWC uint8).
pub struct CheckBatch {
    pub floats: Tensor,
    pub pixels: Tensor,
    pub count: usize,
    /// `--check-images`' folder, or `synthetic`.
    pub source: String,
}

impl CheckBatch {
    pub fn load(
        dir: Option<&Path>,
        cfg: &ModelConfig,
        pre: &Preprocess,
    ) -> Result<CheckBatch, ExportError> {
        let side = pre.crop as i64;
        let mean = Tensor::from_slice(&pre.mean).view([1, 3, 1, 1]);
        let std = Tensor::from_slice(&pre.std).view([1, 3, 1, 1]);
        let (floats, source) = match dir {
            Some(d) => (images(d, cfg)?, d.display().to_string()),
            None => {
                // Seeded uint8 pixels, normalized as the loader does: both forms agree.
                tch::manual_seed(0);
                let g = Tensor::randint_low(
                    0,
                    256,
                    [SYNTHETIC_IMAGES as i64, 3, side, side],
                    (Kind::Int64, Device::Cpu),
                );
                let x = (g.to_kind(Kind::Float) / 255.0 - &mean) / &std;
                (x, "synthetic".to_string())
            }
        };
        // The loader's value is (v / 255 - mean) / std in float32: v is recovered exactly.
        let pixels = ((&floats * &std + &mean) * 255.0)
            .round()
            .clamp(0.0, 255.0)
            .to_kind(Kind::Uint8)
            .permute([0, 2, 3, 1])
            .contiguous();
        let count = floats.size()[0] as usize;
        Ok(CheckBatch {
            floats,
            pixels,
            count,
            source,
        })
    }
}

/// The first `CHECK_IMAGES` images of `dir` (sorted) through `score`'s preprocessing.
fn images(dir: &Path, cfg: &ModelConfig) -> Result<Tensor, ExportError> {
    let bad = |why: String| ExportError::Images {
        path: dir.into(),
        why,
    };
    if !dir.is_dir() {
        return Err(bad(
            "not a directory; pass a folder of images (e.g. the validation folder)".into(),
        ));
    }
    let mut files = score::list_images(dir).map_err(|e| bad(e.to_string()))?;
    files.truncate(CHECK_IMAGES);
    if files.is_empty() {
        return Err(bad(format!(
            "no images in it ({})",
            data::IMAGE_EXTENSIONS
                .iter()
                .map(|x| format!(".{x}"))
                .collect::<Vec<_>>()
                .join("/")
        )));
    }
    let folder = ImageFolder {
        root: dir.to_path_buf(),
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
    let n = files.len();
    let loader = data::load_batches(&folder, (0..n).collect(), score::val_loader(cfg, n, 1));
    let mut out = Vec::new();
    for b in loader {
        let b = b.map_err(|e| bad(e.to_string()))?;
        let s = b.size as i64;
        out.push(Tensor::from_slice(&b.images).view([b.len as i64, 3, s, s]));
    }
    Ok(Tensor::cat(&out, 0))
}

/// The largest absolute difference of `got` against `want` (both N x classes), where it is,
/// and the images whose top-1 class differs.
pub fn difference(
    batch: usize,
    got: &Tensor,
    want: &Tensor,
    tolerance: f64,
) -> Result<Difference, ExportError> {
    if got.size() != want.size() {
        return Err(ExportError::Mismatch(format!(
            "the exported graph returned shape {:?} at batch {batch}, tchrun's forward {:?}",
            got.size(),
            want.size()
        )));
    }
    let diff = (got - want).abs();
    let flat = diff.flatten(0, -1);
    let at = flat.argmax(0, false).int64_value(&[]);
    let classes = want.size()[1];
    let max = flat.max().double_value(&[]);
    let max = if bool::try_from(diff.isnan().any())? {
        f64::NAN
    } else {
        max
    };
    // A top-1 class differs where the reference's first two are not within the tolerance of
    // each other (a tie may fall either way in any runtime).
    let (top, _) = want.topk(2.min(classes), -1, true, true);
    let margin = if classes > 1 {
        top.select(1, 0) - top.select(1, 1)
    } else {
        Tensor::ones([want.size()[0]], (Kind::Float, Device::Cpu))
    };
    let disagree = got
        .argmax(-1, false)
        .ne_tensor(&want.argmax(-1, false))
        .logical_and(&margin.gt(2.0 * tolerance))
        .sum(Kind::Int64)
        .int64_value(&[]);
    Ok(Difference {
        batch,
        max_abs_diff: max,
        image: (at / classes) as usize,
        class: (at % classes) as usize,
        top1_disagree: disagree as usize,
    })
}
