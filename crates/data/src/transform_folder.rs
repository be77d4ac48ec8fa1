//! `tchrun data transform` ("Apply Image Transformation"): every image under a folder
//! (recursively, sorted, hidden entries skipped) decoded as the loader decodes it, transformed
//! (`--pad`, the crop, `--hflip`, then the designer's transforms in the loader's order), and
//! written as PNG (lossless: the pixels are the transform's) under the same relative path.
//! `inference` keeps only what is not random: `--pad`, `--grayscale 1` and validation's resize
//! and center crop. Each image draws from its own RNG (the seed and its place in the sorted
//! list). The output is built in a hidden `.<name>.tchrun-transform-<pid>` folder next to it
//! and renamed into place at the end; an existing non-empty output is refused, and a failure
//! leaves nothing.
use super::augment::crop_params;
use super::error::bad;
use super::loader::image_rng;
use super::transforms::{self, cut, pad_and_place};
use super::*;
use tchrun::transform_flags::TransformFlags;

/// What to do to each image.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TransformJob {
    pub transforms: TransformFlags,
    /// The output side: training's crop (RandomResizedCrop, or RandomCrop with
    /// `--random-crop`), inference's center crop; none: each image keeps its size.
    pub size: Option<u32>,
    /// Inference's resize of the shorter side before its center crop (default
    /// round(size × 256 / 224)).
    pub resize: Option<u32>,
    /// RandomHorizontalFlip(0.5) after the crop (training only).
    pub hflip: bool,
    /// RandomResizedCrop's smallest area scale.
    pub min_scale: f64,
    pub interpolation: Interpolation,
    pub inference: bool,
    pub seed: i64,
    pub max_pixels: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum TransformError {
    #[error("{0}")]
    Dataset(#[from] DatasetError),
    #[error("--output {}: {detail}", path.display())]
    Output { path: PathBuf, detail: String },
    #[error("{0}")]
    Flags(String),
}

impl TransformJob {
    /// The flags against each other; the message names the flag and the fix.
    pub fn check(&self) -> Result<(), TransformError> {
        let bad = |s: &str| Err(TransformError::Flags(s.into()));
        if self.transforms.random_crop && self.size.is_none() {
            return bad("--random-crop needs --size N (the side of the crop)");
        }
        if self.transforms.resamples() && self.interpolation == Interpolation::Bicubic {
            return bad(
                "--interpolation bicubic with --rotation, --affine or --perspective: torchvision \
                 resamples these with nearest or bilinear only; give --interpolation bilinear or \
                 nearest",
            );
        }
        if let (Some(r), Some(s)) = (self.resize, self.size) {
            if r < s {
                return Err(TransformError::Flags(format!(
                    "--resize {r}: smaller than --size {s}, the center crop would leave the \
                     image; give --resize {s} or more"
                )));
            }
        }
        if self.resize.is_some() && !(self.inference && self.size.is_some()) {
            return bad("--resize is inference's resize before its center crop: give it with --inference and --size");
        }
        Ok(())
    }
}

/// Every image under `dir`, recursively, sorted; hidden entries skipped.
pub fn list_images(dir: &Path) -> Result<Vec<PathBuf>, DatasetError> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).map_err(|e| io_err(&d, e))? {
            let e = e.map_err(|e| io_err(&d, e))?;
            let name = e.file_name().to_string_lossy().to_lowercase();
            if name.starts_with('.') {
                continue;
            }
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if IMAGE_EXTENSIONS
                .iter()
                .any(|x| name.ends_with(&format!(".{x}")))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    Ok(out)
}

/// One image transformed: (width, height, RGB8).
pub fn transform_image(
    job: &TransformJob,
    (w, h, mut rgb): (u32, u32, Vec<u8>),
    rng: &mut ChaCha8Rng,
) -> Result<(usize, usize, Vec<u8>), String> {
    let tf = if job.inference {
        job.transforms.for_inference()
    } else {
        job.transforms
    };
    let size = job.size.map_or(0, |s| s as usize);
    let mut spare = Vec::new();
    let ((w, h), corner) = pad_and_place(
        &tf,
        &mut rgb,
        &mut spare,
        (w as usize, h as usize),
        size,
        rng,
    );
    let mut img = auto_augment::Rgb8 {
        width: w,
        height: h,
        data: rgb,
    };
    let mut flip = false;
    if let Some(s) = job.size {
        let s = s as usize;
        let src = (w as u32, h as u32, img.data.as_slice());
        let data = if let Some(c) = corner {
            let mut out = vec![0; s * s * 3];
            cut(src.2, w, c, s, &mut out);
            flip = rng.gen_bool(0.5) && job.hflip;
            out
        } else if job.inference {
            let resize = job
                .resize
                .unwrap_or(tchrun::augment_flags::default_val_resize(s as u32));
            let b = center_crop_box(w as u32, h as u32, resize as usize, s);
            resized_crop(src, (b, BoxResize::WithinImage), s, job.interpolation)?
        } else {
            let t = TrainAugment {
                min_scale: job.min_scale,
                hflip: job.hflip,
                interpolation: job.interpolation,
                ..TrainAugment::default()
            };
            let (b, f) = crop_params(Augment::Train(t), w as u32, h as u32, s, rng);
            flip = f;
            resized_crop(src, (b, BoxResize::CropFirst), s, job.interpolation)?
        };
        img = auto_augment::Rgb8 {
            width: s,
            height: s,
            data,
        };
    } else if !job.inference {
        flip = rng.gen_bool(0.5) && job.hflip;
    }
    if flip {
        for row in img.data.chunks_exact_mut(img.width * 3) {
            let px: Vec<[u8; 3]> = row
                .chunks_exact(3)
                .rev()
                .map(|p| [p[0], p[1], p[2]])
                .collect();
            row.copy_from_slice(px.as_flattened());
        }
    }
    let mut scratch = Vec::new();
    transforms::draw(&tf, img.height, img.width, rng).apply(
        &mut img,
        job.interpolation,
        &mut scratch,
    );
    Ok((img.width, img.height, img.data))
}

/// What [`transform_folder`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct TransformReport {
    pub images: usize,
    pub bytes: u64,
}

/// An output folder that may be written: absent, or an empty directory.
pub fn check_output(output: &Path) -> Result<(), TransformError> {
    split::check_split_output(output).map_err(|e| match e {
        split::SplitError::Output { path, detail } => TransformError::Output {
            path,
            detail: detail.replace("a split never", "data transform never"),
        },
        e => TransformError::Flags(e.to_string()),
    })
}

/// Transforms every image under `input` into `output` (see the module docs).
pub fn transform_folder(
    input: &Path,
    output: &Path,
    job: &TransformJob,
) -> Result<TransformReport, TransformError> {
    job.check()?;
    check_output(output)?;
    let images = list_images(input)?;
    if images.is_empty() {
        return Err(DatasetError::Empty {
            path: input.to_path_buf(),
            detail: format!("no images ({IMAGE_FORMATS}) in it or its sub-folders"),
        }
        .into());
    }
    let out_err = |detail: String| TransformError::Output {
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
    let tmp = parent.join(format!(".{name}.tchrun-transform-{}", std::process::id()));
    if tmp.exists() {
        fs::remove_dir_all(&tmp).map_err(|e| io_err(&tmp, e))?;
    }
    let built = fill(input, &images, &tmp, job).and_then(|report| {
        fs::rename(&tmp, output)
            .map_err(|e| out_err(format!("cannot move the finished folder into place ({e})")))?;
        Ok(report)
    });
    if built.is_err() {
        let _ = fs::remove_dir_all(&tmp);
    }
    built
}

fn fill(
    input: &Path,
    images: &[PathBuf],
    tmp: &Path,
    job: &TransformJob,
) -> Result<TransformReport, TransformError> {
    let mut report = TransformReport {
        images: 0,
        bytes: 0,
    };
    let mut written = BTreeSet::new();
    fs::create_dir(tmp).map_err(|e| io_err(tmp, e))?;
    for (i, path) in images.iter().enumerate() {
        let rel = path
            .strip_prefix(input)
            .unwrap_or(path)
            .with_extension("png");
        if !written.insert(rel.clone()) {
            return Err(bad(
                path,
                format!(
                    "another image of the same name in its folder is also written as {} (every \
                     image is written as PNG); rename one of them",
                    rel.display()
                ),
            )
            .into());
        }
        let decoded = decode_rgb8_within(path, job.max_pixels)?;
        let mut rng = image_rng(job.seed, 0, 0, i);
        let (w, h, rgb) = transform_image(job, decoded, &mut rng).map_err(|e| bad(path, e))?;
        let mut png = Vec::new();
        image::RgbImage::from_raw(w as u32, h as u32, rgb)
            .ok_or_else(|| bad(path, "the transformed buffer is not its size"))?
            .write_to(&mut Cursor::new(&mut png), image::ImageFormat::Png)
            .map_err(|e| bad(path, format!("cannot encode as PNG: {e}")))?;
        let dst = tmp.join(&rel);
        if let Some(d) = dst.parent() {
            fs::create_dir_all(d).map_err(|e| io_err(d, e))?;
        }
        fs::write(&dst, &png).map_err(|e| io_err(&dst, e))?;
        report.images += 1;
        report.bytes += png.len() as u64;
    }
    Ok(report)
}
