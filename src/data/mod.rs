//! Image-folder datasets, distributed sharding and a multi-threaded batch loader.
//!
//! * [`ImageFolder`] scans a torchvision `ImageFolder` layout (`ROOT/<class>/<image>`).
//! * [`shard`] / [`shard_real_count`] reproduce `torch.utils.data.DistributedSampler`
//!   (`drop_last=False`).
//! * [`load_batches`] decodes + augments images on background threads and yields
//!   normalized `f32` batches (`N x 3 x size x size`, CHW, RGB) in order.
//!
//! No torch dependency: batches are plain buffers.

use std::collections::{BTreeSet, VecDeque};
use std::fs;
use std::io::{Cursor, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use fast_image_resize as fr;
use image::{ColorType, DynamicImage, ImageDecoder, ImageReader};
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Image extensions accepted by [`ImageFolder::scan`] (compared case-insensitively).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// Largest decoded image (in bytes of 8-bit RGB) the loader accepts: 512 MiB, the
/// `image` crate's default allocation limit.
pub const MAX_DECODED_BYTES: u64 = 512 * 1024 * 1024;

const LAYOUT_HINT: &str = "images must be in one sub-folder per class: ROOT/<class>/<image>";

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The folder is not laid out as `ROOT/<class>/<image>`.
    #[error("NotLabeledDatasetError: {}: {detail}", path.display())]
    NotLabeled { path: PathBuf, detail: String },
    /// Train and valid disagree (class sets), or an argument is inconsistent.
    #[error("InvalidDatasetError: {detail}")]
    InvalidDataset { detail: String },
    /// Empty dataset or an empty class folder.
    #[error("EmptyDatasetError: {}: {detail}", path.display())]
    Empty { path: PathBuf, detail: String },
    /// Corrupt, unreadable, unsupported or too large image.
    #[error("BadImageError: {}: {detail}", path.display())]
    BadImage { path: PathBuf, detail: String },
    #[error(
        "IoError: {}: {source} (check that the path exists, is readable and is on a mounted volume)",
        path.display()
    )]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

fn io_err(path: &Path, source: std::io::Error) -> DatasetError {
    DatasetError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---------------------------------------------------------------------------------------------
// Normalization
// ---------------------------------------------------------------------------------------------

pub use crate::model::Normalization;

/// Lookup tables: `lut[c][v] = (v / 255 - mean[c]) / std[c]`.
fn norm_lut(n: &Normalization) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for c in 0..3 {
        for v in 0..256 {
            lut[c][v] = (v as f32 / 255.0 - n.mean[c]) / n.std[c];
        }
    }
    lut
}

// ---------------------------------------------------------------------------------------------
// ImageFolder
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sample {
    pub path: PathBuf,
    pub label: usize,
}

#[derive(Debug, Clone)]
pub struct ImageFolder {
    pub root: PathBuf,
    pub classes: Vec<String>,
    pub samples: Vec<Sample>,
}

fn is_hidden(name: &std::ffi::OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

fn has_image_ext(name: &std::ffi::OsStr) -> bool {
    Path::new(name)
        .extension()
        .and_then(|e| e.to_str())
        .map(|e| IMAGE_EXTENSIONS.iter().any(|x| e.eq_ignore_ascii_case(x)))
        .unwrap_or(false)
}

/// Non-hidden entries of `dir`, split into (sub-directories, image files), each sorted by
/// the byte order of their names. Symlinks are followed.
fn list_dir(dir: &Path) -> Result<(Vec<PathBuf>, Vec<PathBuf>), DatasetError> {
    let mut dirs = Vec::new();
    let mut images = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let entry = entry.map_err(|e| io_err(dir, e))?;
        let name = entry.file_name();
        if is_hidden(&name) {
            continue;
        }
        let path = entry.path();
        // fs::metadata follows symlinks. An image name that cannot be opened (a dangling link,
        // a vanished file) stays in the list, so that verification names it (or skips and
        // counts it) instead of losing it silently.
        let Ok(meta) = fs::metadata(&path) else {
            if has_image_ext(&name) {
                images.push(path);
            }
            continue;
        };
        if meta.is_dir() {
            dirs.push(path);
        } else if meta.is_file() && has_image_ext(&name) {
            images.push(path);
        }
    }
    let key = |p: &PathBuf| p.file_name().map(|n| n.as_encoded_bytes().to_vec());
    dirs.sort_by_key(key);
    images.sort_by_key(key);
    Ok((dirs, images))
}

fn name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// Reason string for an image whose header cannot be read or is too large.
/// Whether a JPEG file ends with its end-of-image marker. FF D9 cannot occur inside
/// entropy-coded data (0xFF is stuffed there), so a file cut short lacks it near its end;
/// some writers append a few bytes after it, hence the last KiB is searched.
fn jpeg_has_end_marker(path: &Path) -> std::io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let mut f = fs::File::open(path)?;
    let len = f.metadata()?.len();
    let tail = len.min(1024);
    f.seek(SeekFrom::Start(len - tail))?;
    let mut buf = Vec::with_capacity(tail as usize);
    f.read_to_end(&mut buf)?;
    Ok(buf.windows(2).any(|w| w == [0xFF, 0xD9]))
}

fn check_header(path: &Path, max_pixels: u64) -> Result<(), String> {
    let mut reader = ImageReader::open(path)
        .map_err(|e| format!("cannot open: {e}"))?
        .with_guessed_format()
        .map_err(|e| format!("cannot read: {e}"))?;
    if reader.format().is_none() {
        return Err("not a JPEG or PNG file (unrecognised header)".into());
    }
    let is_jpeg = reader.format() == Some(image::ImageFormat::Jpeg);
    // We only parse the header here; the pixel limit below is the one that matters.
    reader.no_limits();
    let (w, h) = reader
        .into_dimensions()
        .map_err(|e| format!("corrupt or unsupported image header: {e}"))?;
    if is_jpeg && !jpeg_has_end_marker(path).map_err(|e| format!("cannot read: {e}"))? {
        return Err("truncated JPEG: no end-of-image marker (FF D9) in its last KiB".into());
    }
    let pixels = w as u64 * h as u64;
    if pixels > max_pixels {
        return Err(format!(
            "declared dimensions {w}x{h} ({pixels} pixels) exceed the limit of {max_pixels} pixels \
             (possible decompression bomb); remove or downscale the file, or raise the pixel limit"
        ));
    }
    if pixels == 0 {
        return Err(format!("declared dimensions {w}x{h} are empty"));
    }
    Ok(())
}

impl ImageFolder {
    /// torchvision ImageFolder layout: one sub-folder per class holding images. See module docs.
    ///
    /// Unlike torchvision, class folders are not searched recursively: images must be directly
    /// inside `ROOT/<class>/`. A class folder holding only sub-folders is reported as
    /// `NotLabeled` (nested layout), with a hint to pass the right folder.
    pub fn scan(root: &Path) -> Result<ImageFolder, DatasetError> {
        let meta = fs::metadata(root).map_err(|e| io_err(root, e))?;
        if !meta.is_dir() {
            return Err(DatasetError::NotLabeled {
                path: root.to_path_buf(),
                detail: format!("is not a directory; pass the dataset folder, {LAYOUT_HINT}"),
            });
        }
        let (class_dirs, loose_images) = list_dir(root)?;
        if class_dirs.is_empty() {
            if !loose_images.is_empty() {
                return Err(DatasetError::NotLabeled {
                    path: root.to_path_buf(),
                    detail: format!(
                        "holds {} image file(s) (e.g. {}) but no class sub-folders; {LAYOUT_HINT} \
                         (move each image into the folder named after its class)",
                        loose_images.len(),
                        name_of(&loose_images[0])
                    ),
                });
            }
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("no class sub-folders and no images found; {LAYOUT_HINT}"),
            });
        }

        let mut classes = Vec::with_capacity(class_dirs.len());
        let mut samples = Vec::new();
        for (label, dir) in class_dirs.iter().enumerate() {
            let (sub_dirs, images) = list_dir(dir)?;
            if images.is_empty() {
                if !sub_dirs.is_empty() {
                    return Err(DatasetError::NotLabeled {
                        path: root.to_path_buf(),
                        detail: format!(
                            "class folder '{}' holds no images, only sub-folders (e.g. '{}'): the \
                             layout looks nested; {LAYOUT_HINT} with images directly inside each \
                             class folder. If '{}' is itself the dataset, pass {} instead",
                            name_of(dir),
                            name_of(&sub_dirs[0]),
                            name_of(dir),
                            dir.display()
                        ),
                    });
                }
                return Err(DatasetError::Empty {
                    path: dir.clone(),
                    detail: format!(
                        "class folder '{}' holds no images ({}); add images to it or remove it",
                        name_of(dir),
                        IMAGE_EXTENSIONS.join("/")
                    ),
                });
            }
            classes.push(name_of(dir));
            samples.extend(images.into_iter().map(|path| Sample { path, label }));
        }
        if samples.is_empty() {
            return Err(DatasetError::Empty {
                path: root.to_path_buf(),
                detail: format!("no images found; {LAYOUT_HINT}"),
            });
        }
        Ok(ImageFolder {
            root: root.to_path_buf(),
            classes,
            samples,
        })
    }

    /// Compare the class sets of train and valid.
    pub fn check_same_classes(
        train: &ImageFolder,
        valid: &ImageFolder,
    ) -> Result<(), DatasetError> {
        if train.classes == valid.classes {
            return Ok(());
        }
        let t: BTreeSet<&str> = train.classes.iter().map(|s| s.as_str()).collect();
        let v: BTreeSet<&str> = valid.classes.iter().map(|s| s.as_str()).collect();
        let only_t: Vec<&str> = t.difference(&v).copied().collect();
        let only_v: Vec<&str> = v.difference(&t).copied().collect();
        Err(DatasetError::InvalidDataset {
            detail: format!(
                "train ({}) and valid ({}) have different classes: only in train: [{}]; only in \
                 valid: [{}]. Make both folders hold the same class sub-folders",
                train.root.display(),
                valid.root.display(),
                only_t.join(", "),
                only_v.join(", ")
            ),
        })
    }

    /// Check every image header (dimensions only) in parallel. See module docs.
    /// With `skip_bad`, bad samples are dropped and returned as `(path, reason)` in sample
    /// order; if nothing is left, `Empty` is returned.
    pub fn verify(
        &mut self,
        skip_bad: bool,
        max_pixels: u64,
    ) -> Result<Vec<(PathBuf, String)>, DatasetError> {
        let n = self.samples.len();
        if n == 0 {
            return Ok(Vec::new());
        }
        // Reading headers waits on storage far more than it computes (a cold page cache, a
        // network file system): many more threads than cores keep the device busy.
        let threads = std::thread::available_parallelism()
            .map(|p| p.get() * 8)
            .unwrap_or(16)
            .clamp(16, 64)
            .min(n);
        let chunk = n.div_ceil(threads);
        let samples = &self.samples;
        let reasons: Vec<Option<String>> = std::thread::scope(|s| {
            let handles: Vec<_> = samples
                .chunks(chunk)
                .map(|part| {
                    s.spawn(move || {
                        part.iter()
                            .map(|smp| check_header(&smp.path, max_pixels).err())
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().expect("verify thread panicked"))
                .collect()
        });

        if !skip_bad {
            if let Some((i, r)) = reasons
                .iter()
                .enumerate()
                .find_map(|(i, r)| r.as_ref().map(|r| (i, r)))
            {
                return Err(DatasetError::BadImage {
                    path: self.samples[i].path.clone(),
                    detail: format!("{r}; fix or delete the file, or skip bad images"),
                });
            }
            return Ok(Vec::new());
        }
        let mut skipped = Vec::new();
        let old = std::mem::take(&mut self.samples);
        for (smp, r) in old.into_iter().zip(reasons) {
            match r {
                Some(r) => skipped.push((smp.path, r)),
                None => self.samples.push(smp),
            }
        }
        if self.samples.is_empty() {
            return Err(DatasetError::Empty {
                path: self.root.clone(),
                detail: format!(
                    "all {n} images failed verification (first: {}: {}); check the files",
                    skipped[0].0.display(),
                    skipped[0].1
                ),
            });
        }
        Ok(skipped)
    }
}

// ---------------------------------------------------------------------------------------------
// Distributed sharding
// ---------------------------------------------------------------------------------------------

/// `DistributedSampler` (drop_last=False) indices for `rank` out of `world`.
///
/// Panics if `world == 0` or `rank >= world`.
pub fn shard(
    len: usize,
    rank: usize,
    world: usize,
    seed: i64,
    epoch: u64,
    shuffle: bool,
) -> Vec<usize> {
    assert!(world > 0, "shard: world size must be > 0");
    assert!(
        rank < world,
        "shard: rank {rank} must be < world size {world}"
    );
    if len == 0 {
        return Vec::new();
    }
    let mut indices: Vec<usize> = (0..len).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64((seed as u64).wrapping_add(epoch));
        indices.shuffle(&mut rng);
    }
    let total = len.div_ceil(world) * world;
    (rank..total)
        .step_by(world)
        .map(|p| indices[p % len])
        .collect()
}

/// Number of real (non-padding) samples in `rank`'s shard.
pub fn shard_real_count(len: usize, rank: usize, world: usize) -> usize {
    assert!(world > 0, "shard_real_count: world size must be > 0");
    assert!(
        rank < world,
        "shard_real_count: rank {rank} must be < world size {world}"
    );
    if rank >= len {
        0
    } else {
        (len - rank).div_ceil(world)
    }
}

// ---------------------------------------------------------------------------------------------
// Augmentation
// ---------------------------------------------------------------------------------------------

/// Training augmentation settings (torchvision's defaults: scale (0.08, 1), flip on).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TrainAugment {
    /// Lower bound of RandomResizedCrop's area scale.
    pub min_scale: f64,
    /// RandomHorizontalFlip(0.5).
    pub hflip: bool,
}

impl Default for TrainAugment {
    fn default() -> Self {
        TrainAugment {
            min_scale: 0.08,
            hflip: true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Augment {
    /// RandomResizedCrop(size, scale=(min_scale, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip(0.5).
    Train(TrainAugment),
    /// Resize(round(size * 256 / 224)) + CenterCrop(size).
    Eval,
}

/// Source crop box `(left, top, width, height)` in source pixels and the flip flag.
fn crop_params(
    aug: Augment,
    w: u32,
    h: u32,
    size: usize,
    rng: &mut ChaCha8Rng,
) -> ((f64, f64, f64, f64), bool) {
    let (wf, hf) = (w as f64, h as f64);
    match aug {
        Augment::Train(t) => {
            let (wi, hi) = (w as i64, h as i64);
            let area = wf * hf;
            let (s0, s1) = (t.min_scale.clamp(1e-3, 1.0), 1.0f64);
            let (lr0, lr1) = ((3.0f64 / 4.0).ln(), (4.0f64 / 3.0).ln());
            let mut found = None;
            for _ in 0..10 {
                let target_area = area * if s0 < s1 { rng.gen_range(s0..s1) } else { s1 };
                let aspect = rng.gen_range(lr0..lr1).exp();
                let cw = (target_area * aspect).sqrt().round_ties_even() as i64;
                let ch = (target_area / aspect).sqrt().round_ties_even() as i64;
                if 0 < cw && cw <= wi && 0 < ch && ch <= hi {
                    let top = rng.gen_range(0..=hi - ch);
                    let left = rng.gen_range(0..=wi - cw);
                    found = Some((left, top, cw, ch));
                    break;
                }
            }
            let (left, top, cw, ch) = found.unwrap_or_else(|| {
                // torchvision fallback: central crop clamped to the ratio range
                let in_ratio = wf / hf;
                let (cw, ch) = if in_ratio < 3.0 / 4.0 {
                    (
                        wi,
                        ((wf / (3.0 / 4.0)).round_ties_even() as i64).clamp(1, hi),
                    )
                } else if in_ratio > 4.0 / 3.0 {
                    (
                        ((hf * (4.0 / 3.0)).round_ties_even() as i64).clamp(1, wi),
                        hi,
                    )
                } else {
                    (wi, hi)
                };
                ((wi - cw) / 2, (hi - ch) / 2, cw, ch)
            });
            let flip = rng.gen_bool(0.5) && t.hflip;
            ((left as f64, top as f64, cw as f64, ch as f64), flip)
        }
        Augment::Eval => {
            let short_target = ((size as f64) * 256.0 / 224.0).round_ties_even().max(1.0);
            let (new_w, new_h) = if w <= h {
                (short_target, (short_target * hf / wf).floor())
            } else {
                ((short_target * wf / hf).floor(), short_target)
            };
            let (new_w, new_h) = (new_w.max(size as f64), new_h.max(size as f64));
            let s = size as f64;
            let top = ((new_h - s) / 2.0).round_ties_even();
            let left = ((new_w - s) / 2.0).round_ties_even();
            let (sx, sy) = (wf / new_w, hf / new_h);
            ((left * sx, top * sy, s * sx, s * sy), false)
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Loader
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone)]
pub struct Batch {
    /// `len x 3 x size x size`, CHW per image, normalized.
    pub images: Vec<f32>,
    pub labels: Vec<i64>,
    pub paths: Vec<PathBuf>,
    pub len: usize,
    pub size: usize,
    /// Images of this batch that failed to decode and were dropped (`skip_bad`), with the
    /// reason; `len` counts only the images that remain (it may be 0).
    pub skipped: Vec<(PathBuf, String)>,
}

#[derive(Debug, Clone)]
pub struct LoaderConfig {
    pub size: usize,
    pub batch_size: usize,
    /// Background decode threads; 0 decodes synchronously in `next()`.
    pub threads: usize,
    /// Finished batches that may wait in the queue (in addition to one in progress per thread).
    pub prefetch: usize,
    pub augment: Augment,
    pub norm: Normalization,
    pub seed: i64,
    pub epoch: u64,
    pub rank: usize,
    /// Position of `indices[0]` in the epoch's shard (non-zero when resuming mid-epoch), so
    /// augmentation is the same as in an uninterrupted epoch.
    pub first_position: usize,
    /// `--skip-bad-images`: an image that fails to decode is dropped alone (listed in
    /// `Batch::skipped`) and its batch goes on with the others; otherwise the batch fails.
    pub skip_bad: bool,
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Per-image RNG derived from (seed, epoch, rank, position); independent of threads.
fn image_rng(seed: i64, epoch: u64, rank: usize, position: usize) -> ChaCha8Rng {
    let mut h = splitmix64(seed as u64);
    h = splitmix64(h ^ epoch);
    h = splitmix64(h ^ rank as u64);
    h = splitmix64(h ^ position as u64);
    ChaCha8Rng::seed_from_u64(h)
}

struct Shared {
    samples: Vec<Sample>,
    indices: Vec<usize>,
    cfg: LoaderConfig,
    lut: [[f32; 256]; 3],
    cancel: AtomicBool,
    spare: Receiver<Vec<f32>>,
}

/// Per-thread reusable buffers.
struct WorkerState {
    file: Vec<u8>,
    rgb: Vec<u8>,
    dst: fr::images::Image<'static>,
    resizer: fr::Resizer,
}

impl WorkerState {
    fn new(size: usize) -> Self {
        WorkerState {
            file: Vec::new(),
            rgb: Vec::new(),
            dst: fr::images::Image::new(size as u32, size as u32, fr::PixelType::U8x3),
            resizer: fr::Resizer::new(),
        }
    }
}

fn bad(path: &Path, detail: impl Into<String>) -> DatasetError {
    DatasetError::BadImage {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// Decode `path` to 8-bit RGB in `st.rgb`; returns (width, height).
fn decode_rgb(path: &Path, st: &mut WorkerState) -> Result<(u32, u32), DatasetError> {
    st.file.clear();
    fs::File::open(path)
        .and_then(|mut f| f.read_to_end(&mut st.file))
        .map_err(|e| io_err(path, e))?;
    let reader = ImageReader::new(Cursor::new(&st.file[..]))
        .with_guessed_format()
        .map_err(|e| io_err(path, e))?;
    if reader.format().is_none() {
        return Err(bad(
            path,
            "not a JPEG or PNG file (unrecognised header); fix or delete the file",
        ));
    }
    let dec = reader
        .into_decoder()
        .map_err(|e| bad(path, format!("cannot decode: {e}; fix or delete the file")))?;
    let (w, h) = dec.dimensions();
    let rgb_bytes = w as u64 * h as u64 * 3;
    if rgb_bytes > MAX_DECODED_BYTES || dec.total_bytes() > MAX_DECODED_BYTES {
        return Err(bad(
            path,
            format!(
                "image {w}x{h} is too large to decode (limit {MAX_DECODED_BYTES} bytes); downscale or delete it"
            ),
        ));
    }
    if w == 0 || h == 0 {
        return Err(bad(path, format!("empty image {w}x{h}")));
    }
    let decode_err =
        |e: image::ImageError| bad(path, format!("cannot decode: {e}; fix or delete the file"));
    if dec.color_type() == ColorType::Rgb8 {
        // Fast path (most JPEGs): decode straight into the reusable buffer.
        st.rgb.resize(rgb_bytes as usize, 0);
        dec.read_image(&mut st.rgb).map_err(decode_err)?;
    } else {
        let img = DynamicImage::from_decoder(dec)
            .map_err(decode_err)?
            .into_rgb8();
        st.rgb = img.into_raw();
    }
    Ok((w, h))
}

/// Decode, augment, normalize one image into `out` (3 x size x size).
fn process_image(
    path: &Path,
    rng: &mut ChaCha8Rng,
    shared: &Shared,
    st: &mut WorkerState,
    out: &mut [f32],
) -> Result<(), DatasetError> {
    let size = shared.cfg.size;
    let (w, h) = decode_rgb(path, st)?;
    let ((mut left, mut top, mut cw, mut ch), flip) =
        crop_params(shared.cfg.augment, w, h, size, rng);
    // guard against float drift outside the image
    left = left.clamp(0.0, w as f64);
    top = top.clamp(0.0, h as f64);
    cw = cw.min(w as f64 - left).max(1e-3);
    ch = ch.min(h as f64 - top).max(1e-3);
    let src = fr::images::ImageRef::new(w, h, &st.rgb, fr::PixelType::U8x3)
        .map_err(|e| bad(path, format!("internal buffer error: {e}")))?;
    let opts = fr::ResizeOptions::new()
        .resize_alg(fr::ResizeAlg::Convolution(fr::FilterType::Bilinear))
        .crop(left, top, cw, ch);
    st.resizer
        .resize(&src, &mut st.dst, &opts)
        .map_err(|e| bad(path, format!("resize failed: {e}")))?;

    let px = st.dst.buffer();
    let plane = size * size;
    let (r_out, rest) = out.split_at_mut(plane);
    let (g_out, b_out) = rest.split_at_mut(plane);
    let [l0, l1, l2] = &shared.lut;
    for y in 0..size {
        let row = &px[y * size * 3..(y + 1) * size * 3];
        let o = y * size;
        if flip {
            for (x, p) in row.chunks_exact(3).rev().enumerate() {
                r_out[o + x] = l0[p[0] as usize];
                g_out[o + x] = l1[p[1] as usize];
                b_out[o + x] = l2[p[2] as usize];
            }
        } else {
            for (x, p) in row.chunks_exact(3).enumerate() {
                r_out[o + x] = l0[p[0] as usize];
                g_out[o + x] = l1[p[1] as usize];
                b_out[o + x] = l2[p[2] as usize];
            }
        }
    }
    Ok(())
}

fn build_batch(
    shared: &Shared,
    batch_idx: usize,
    st: &mut WorkerState,
) -> Result<Batch, DatasetError> {
    let cfg = &shared.cfg;
    let start = batch_idx * cfg.batch_size;
    let end = (start + cfg.batch_size).min(shared.indices.len());
    let len = end - start;
    let per = 3 * cfg.size * cfg.size;
    let mut images = shared.spare.try_recv().unwrap_or_default();
    images.clear();
    images.resize(len * per, 0.0);
    let mut labels = Vec::with_capacity(len);
    let mut paths = Vec::with_capacity(len);
    let mut skipped = Vec::new();
    for pos in start..end {
        if shared.cancel.load(Ordering::Relaxed) {
            return Err(DatasetError::InvalidDataset {
                detail: "loader cancelled".into(),
            });
        }
        let idx = shared.indices[pos];
        let Some(smp) = shared.samples.get(idx) else {
            return Err(DatasetError::InvalidDataset {
                detail: format!(
                    "sample index {idx} out of range (dataset has {} samples)",
                    shared.samples.len()
                ),
            });
        };
        // The RNG follows the image's position in the shard, so a dropped image never shifts
        // the augmentation of the others.
        let mut rng = image_rng(cfg.seed, cfg.epoch, cfg.rank, cfg.first_position + pos);
        let k = labels.len();
        match process_image(
            &smp.path,
            &mut rng,
            shared,
            st,
            &mut images[k * per..(k + 1) * per],
        ) {
            Ok(()) => {
                labels.push(smp.label as i64);
                paths.push(smp.path.clone());
            }
            Err(e @ (DatasetError::BadImage { .. } | DatasetError::Io { .. })) if cfg.skip_bad => {
                skipped.push((smp.path.clone(), e.to_string()));
            }
            Err(e) => return Err(e),
        }
    }
    let kept = labels.len();
    images.truncate(kept * per);
    Ok(Batch {
        images,
        labels,
        paths,
        len: kept,
        size: cfg.size,
        skipped,
    })
}

struct Job {
    batch_idx: usize,
    reply: Sender<Result<Batch, DatasetError>>,
}

/// Iterator returned by [`load_batches`]. Dropping it cancels and joins the worker threads
/// (each finishes at most the image it is decoding).
pub struct BatchIter {
    shared: Arc<Shared>,
    jobs: Option<Sender<Job>>,
    pending: VecDeque<Receiver<Result<Batch, DatasetError>>>,
    next_to_submit: usize,
    next_to_yield: usize,
    n_batches: usize,
    workers: Vec<JoinHandle<()>>,
    spare_tx: Sender<Vec<f32>>,
    sync_state: Option<WorkerState>,
}

impl BatchIter {
    /// Number of batches this iterator yields in total.
    pub fn num_batches(&self) -> usize {
        self.n_batches
    }

    /// Give a consumed batch's image buffer back for reuse (optional; avoids re-allocating
    /// and page-faulting large buffers every batch).
    pub fn recycle(&self, batch: Batch) {
        let _ = self.spare_tx.try_send(batch.images);
    }

    fn submit(&mut self) {
        if self.next_to_submit >= self.n_batches {
            return;
        }
        let Some(jobs) = &self.jobs else { return };
        let (tx, rx) = crossbeam_channel::bounded(1);
        if jobs
            .send(Job {
                batch_idx: self.next_to_submit,
                reply: tx,
            })
            .is_ok()
        {
            self.pending.push_back(rx);
            self.next_to_submit += 1;
        }
    }
}

impl Iterator for BatchIter {
    type Item = Result<Batch, DatasetError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.next_to_yield >= self.n_batches {
            return None;
        }
        let b = self.next_to_yield;
        self.next_to_yield += 1;
        if let Some(st) = self.sync_state.as_mut() {
            return Some(build_batch(&self.shared, b, st));
        }
        let rx = self.pending.pop_front()?;
        self.submit();
        Some(rx.recv().unwrap_or_else(|_| {
            Err(DatasetError::InvalidDataset {
                detail: format!("loader worker thread died while building batch {b}"),
            })
        }))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = self.n_batches - self.next_to_yield;
        (n, Some(n))
    }
}

impl ExactSizeIterator for BatchIter {}

impl Drop for BatchIter {
    fn drop(&mut self) {
        self.shared.cancel.store(true, Ordering::Relaxed);
        self.jobs = None; // disconnect: idle workers wake up and exit
        self.pending.clear();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Decode + augment on `cfg.threads` background threads; batches come in the order of
/// `indices` (chunks of `batch_size`, last may be short). At most `threads + prefetch`
/// batches are in flight. See module docs.
///
/// Panics if `cfg.size == 0` or `cfg.batch_size == 0`.
pub fn load_batches(folder: &ImageFolder, indices: Vec<usize>, cfg: LoaderConfig) -> BatchIter {
    assert!(cfg.size > 0, "load_batches: size must be > 0");
    assert!(cfg.batch_size > 0, "load_batches: batch_size must be > 0");
    let n_batches = indices.len().div_ceil(cfg.batch_size);
    let threads = cfg.threads.min(n_batches);
    let max_in_flight = threads + cfg.prefetch;
    let (spare_tx, spare_rx) = crossbeam_channel::bounded(max_in_flight + 2);
    let shared = Arc::new(Shared {
        samples: folder.samples.clone(),
        indices,
        lut: norm_lut(&cfg.norm),
        cfg,
        cancel: AtomicBool::new(false),
        spare: spare_rx,
    });
    let mut it = BatchIter {
        shared: shared.clone(),
        jobs: None,
        pending: VecDeque::new(),
        next_to_submit: 0,
        next_to_yield: 0,
        n_batches,
        workers: Vec::new(),
        spare_tx,
        sync_state: None,
    };
    if threads == 0 {
        it.sync_state = Some(WorkerState::new(shared.cfg.size));
        return it;
    }
    let (jobs_tx, jobs_rx) = crossbeam_channel::unbounded::<Job>();
    for t in 0..threads {
        let shared = shared.clone();
        let jobs_rx = jobs_rx.clone();
        let h = std::thread::Builder::new()
            .name(format!("data-loader-{t}"))
            .spawn(move || {
                let mut st = WorkerState::new(shared.cfg.size);
                while let Ok(job) = jobs_rx.recv() {
                    if shared.cancel.load(Ordering::Relaxed) {
                        break;
                    }
                    let res = build_batch(&shared, job.batch_idx, &mut st);
                    let _ = job.reply.send(res); // capacity 1: never blocks
                }
            })
            .expect("failed to spawn data loader thread");
        it.workers.push(h);
    }
    it.jobs = Some(jobs_tx);
    for _ in 0..max_in_flight {
        it.submit();
    }
    it
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

#[cfg(test)]
mod tests {
    use super::*;
    use image::{ImageBuffer, Luma, Rgb, RgbImage, Rgba};
    use std::time::{Duration, Instant};

    fn rgb_image(w: u32, h: u32, seed: u32) -> RgbImage {
        ImageBuffer::from_fn(w, h, |x, y| {
            let v = x
                .wrapping_mul(7)
                .wrapping_add(y.wrapping_mul(13))
                .wrapping_add(seed * 31);
            Rgb([
                (v % 256) as u8,
                ((x * 255) / w.max(1)) as u8,
                ((y * 255) / h.max(1)) as u8,
            ])
        })
    }

    fn write_jpeg(path: &Path, w: u32, h: u32, seed: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        rgb_image(w, h, seed)
            .save_with_format(path, image::ImageFormat::Jpeg)
            .unwrap();
    }

    fn write_png(path: &Path, w: u32, h: u32, seed: u32) {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        rgb_image(w, h, seed)
            .save_with_format(path, image::ImageFormat::Png)
            .unwrap();
    }

    fn cfg(size: usize, bs: usize, threads: usize, augment: Augment) -> LoaderConfig {
        LoaderConfig {
            size,
            batch_size: bs,
            threads,
            prefetch: 2,
            augment,
            norm: Normalization::default(),
            seed: 42,
            epoch: 3,
            rank: 1,
            first_position: 0,
            skip_bad: false,
        }
    }

    /// Dataset with `classes` classes x `per` JPEGs of varied sizes.
    fn make_dataset(root: &Path, classes: usize, per: usize) {
        for c in 0..classes {
            for i in 0..per {
                let (w, h) = (
                    40 + ((i * 17 + c * 5) % 60) as u32,
                    30 + ((i * 11) % 70) as u32,
                );
                write_jpeg(
                    &root.join(format!("class{c}")).join(format!("{i:03}.jpg")),
                    w,
                    h,
                    (c * 100 + i) as u32,
                );
            }
        }
    }

    #[test]
    fn scan_ordering_hidden_uppercase() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write_jpeg(&r.join("b/2.JPG"), 8, 8, 0);
        write_jpeg(&r.join("b/1.jpeg"), 8, 8, 0);
        write_png(&r.join("b/10.PNG"), 8, 8, 0);
        write_jpeg(&r.join("b/.hidden.jpg"), 8, 8, 0);
        fs::write(r.join("b/notes.txt"), "x").unwrap();
        write_jpeg(&r.join("a/z.jpg"), 8, 8, 0);
        write_jpeg(&r.join("B/x.jpg"), 8, 8, 0);
        write_jpeg(&r.join(".git/x.jpg"), 8, 8, 0);
        let f = ImageFolder::scan(r).unwrap();
        assert_eq!(f.classes, vec!["B", "a", "b"]);
        let names: Vec<(String, usize)> = f
            .samples
            .iter()
            .map(|s| (name_of(&s.path), s.label))
            .collect();
        assert_eq!(
            names,
            vec![
                ("x.jpg".into(), 0),
                ("z.jpg".into(), 1),
                ("1.jpeg".into(), 2),
                ("10.PNG".into(), 2),
                ("2.JPG".into(), 2)
            ]
        );
    }

    #[test]
    fn scan_errors() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        // missing root
        let e = ImageFolder::scan(&r.join("nope")).unwrap_err();
        assert!(matches!(e, DatasetError::Io { .. }), "{e}");
        assert!(e.to_string().contains("nope"), "{e}");
        // flat folder of images
        let flat = r.join("flat");
        write_jpeg(&flat.join("a.jpg"), 8, 8, 0);
        let e = ImageFolder::scan(&flat).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }));
        let m = e.to_string();
        assert!(m.starts_with("NotLabeledDatasetError: "), "{m}");
        assert!(
            m.contains("flat") && m.contains("ROOT/<class>/<image>"),
            "{m}"
        );
        // root is a file
        let e = ImageFolder::scan(&flat.join("a.jpg")).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }), "{e}");
        // nested layout: ROOT/data/<class>/<image>
        let nested = r.join("nested");
        write_jpeg(&nested.join("data/cat/1.jpg"), 8, 8, 0);
        write_jpeg(&nested.join("data/dog/1.jpg"), 8, 8, 0);
        let e = ImageFolder::scan(&nested).unwrap_err();
        assert!(matches!(e, DatasetError::NotLabeled { .. }), "{e}");
        assert!(e.to_string().contains("data"), "{e}");
        // empty class folder
        let ec = r.join("emptyclass");
        write_jpeg(&ec.join("a/1.jpg"), 8, 8, 0);
        fs::create_dir_all(ec.join("b")).unwrap();
        fs::write(ec.join("b/readme.txt"), "x").unwrap();
        let e = ImageFolder::scan(&ec).unwrap_err();
        match &e {
            DatasetError::Empty { path, .. } => assert!(path.ends_with("b")),
            _ => panic!("{e}"),
        }
        // totally empty
        let em = r.join("empty");
        fs::create_dir_all(&em).unwrap();
        assert!(matches!(
            ImageFolder::scan(&em).unwrap_err(),
            DatasetError::Empty { .. }
        ));
    }

    #[test]
    fn class_mismatch() {
        let d = tempfile::tempdir().unwrap();
        let (t, v) = (d.path().join("train"), d.path().join("valid"));
        for c in ["cat", "dog", "emu"] {
            write_jpeg(&t.join(c).join("1.jpg"), 8, 8, 0);
        }
        for c in ["cat", "dog", "fox"] {
            write_jpeg(&v.join(c).join("1.jpg"), 8, 8, 0);
        }
        let (tf, vf) = (
            ImageFolder::scan(&t).unwrap(),
            ImageFolder::scan(&v).unwrap(),
        );
        assert!(ImageFolder::check_same_classes(&tf, &tf).is_ok());
        let m = ImageFolder::check_same_classes(&tf, &vf)
            .unwrap_err()
            .to_string();
        assert!(m.starts_with("InvalidDatasetError: "), "{m}");
        assert!(
            m.contains("only in train: [emu]") && m.contains("only in valid: [fox]"),
            "{m}"
        );
    }

    #[test]
    fn verify_corrupt_and_bomb() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path();
        write_jpeg(&r.join("a/good.jpg"), 16, 16, 0);
        write_png(&r.join("a/good2.png"), 16, 16, 0);
        // corrupt: random bytes
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let junk: Vec<u8> = (0..1000).map(|_| rng.r#gen::<u8>()).collect();
        fs::create_dir_all(r.join("b")).unwrap();
        fs::write(r.join("b/x.jpg"), &junk).unwrap();
        // bomb: valid tiny PNG with IHDR patched to 100000 x 100000 (CRC recomputed)
        write_png(&r.join("c/bomb.png"), 4, 4, 0);
        let mut png = fs::read(r.join("c/bomb.png")).unwrap();
        assert_eq!(&png[12..16], b"IHDR");
        png[16..20].copy_from_slice(&100_000u32.to_be_bytes());
        png[20..24].copy_from_slice(&100_000u32.to_be_bytes());
        let crc = crc32fast::hash(&png[12..29]);
        png[29..33].copy_from_slice(&crc.to_be_bytes());
        fs::write(r.join("c/bomb.png"), &png).unwrap();
        write_jpeg(&r.join("c/ok.jpg"), 16, 16, 0);

        let mut f = ImageFolder::scan(r).unwrap();
        assert_eq!(f.samples.len(), 5);
        let e = f.clone().verify(false, 50_000_000).unwrap_err();
        let m = e.to_string();
        assert!(
            m.starts_with("BadImageError: ") && m.contains("x.jpg"),
            "{m}"
        );

        let skipped = f.verify(true, 50_000_000).unwrap();
        assert_eq!(f.samples.len(), 3);
        assert_eq!(skipped.len(), 2);
        assert!(skipped[0].0.ends_with("b/x.jpg"));
        assert!(skipped[1].0.ends_with("c/bomb.png"));
        assert!(skipped[1].1.contains("100000x100000"), "{}", skipped[1].1);

        // only the bomb: fails naming the file
        let mut f2 = ImageFolder::scan(r).unwrap();
        f2.samples.retain(|s| s.path.ends_with("bomb.png"));
        let m = f2.verify(false, 50_000_000).unwrap_err().to_string();
        assert!(m.contains("bomb.png") && m.contains("exceed"), "{m}");
        // the remaining good set verifies cleanly
        assert!(f.verify(false, 50_000_000).unwrap().is_empty());
    }

    #[test]
    fn shard_semantics() {
        // disjoint + covering when divisible
        let (len, world) = (12, 4);
        let mut all: Vec<usize> = Vec::new();
        for r in 0..world {
            let s = shard(len, r, world, 7, 0, true);
            assert_eq!(s.len(), 3);
            all.extend(s);
        }
        all.sort();
        assert_eq!(all, (0..len).collect::<Vec<_>>());
        // unshuffled matches torch exactly
        assert_eq!(shard(10, 0, 4, 0, 0, false), vec![0, 4, 8]);
        assert_eq!(shard(10, 1, 4, 0, 0, false), vec![1, 5, 9]);
        assert_eq!(shard(10, 2, 4, 0, 0, false), vec![2, 6, 0]);
        assert_eq!(shard(10, 3, 4, 0, 0, false), vec![3, 7, 1]);
        // padding larger than len
        assert_eq!(shard(2, 4, 5, 0, 0, false), vec![0]);
        assert_eq!(shard(0, 0, 3, 0, 0, true), Vec::<usize>::new());
        // union covers all when not divisible, padding repeats
        let len = 10;
        let mut all = Vec::new();
        for r in 0..4 {
            all.extend(shard(len, r, 4, 9, 1, true));
        }
        assert_eq!(all.len(), 12);
        let set: BTreeSet<usize> = all.iter().copied().collect();
        assert_eq!(set.len(), 10);
        // determinism and epoch dependence
        assert_eq!(shard(100, 1, 3, 5, 2, true), shard(100, 1, 3, 5, 2, true));
        assert_ne!(shard(100, 1, 3, 5, 2, true), shard(100, 1, 3, 5, 3, true));
        // real counts
        for (len, world) in [(10, 4), (12, 4), (2, 5), (0, 3), (1, 1), (1001, 8)] {
            let sum: usize = (0..world).map(|r| shard_real_count(len, r, world)).sum();
            assert_eq!(sum, len, "len {len} world {world}");
            for r in 0..world {
                let n = shard(len, r, world, 0, 0, false).len();
                assert!(shard_real_count(len, r, world) <= n);
            }
        }
        assert_eq!(shard_real_count(10, 2, 4), 2);
        assert_eq!(shard_real_count(10, 1, 4), 3);
    }

    #[test]
    fn loader_shapes_and_values() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 3, 7);
        let f = ImageFolder::scan(d.path()).unwrap();
        assert_eq!(f.samples.len(), 21);
        let idx: Vec<usize> = (0..21).rev().collect();
        for aug in [Augment::Train(TrainAugment::default()), Augment::Eval] {
            let it = load_batches(&f, idx.clone(), cfg(32, 8, 2, aug));
            assert_eq!(it.len(), 3);
            let batches: Vec<Batch> = it.map(|b| b.unwrap()).collect();
            assert_eq!(
                batches.iter().map(|b| b.len).collect::<Vec<_>>(),
                vec![8, 8, 5]
            );
            let n = Normalization::default();
            let lo = (0..3)
                .map(|c| (0.0 - n.mean[c]) / n.std[c])
                .fold(f32::MAX, f32::min);
            let hi = (0..3)
                .map(|c| (1.0 - n.mean[c]) / n.std[c])
                .fold(f32::MIN, f32::max);
            let mut pos = 0;
            for b in &batches {
                assert_eq!(b.size, 32);
                assert_eq!(b.images.len(), b.len * 3 * 32 * 32);
                assert_eq!(b.labels.len(), b.len);
                assert_eq!(b.paths.len(), b.len);
                for (k, p) in b.paths.iter().enumerate() {
                    assert_eq!(p, &f.samples[idx[pos]].path);
                    assert_eq!(b.labels[k], f.samples[idx[pos]].label as i64);
                    pos += 1;
                }
                assert!(b
                    .images
                    .iter()
                    .all(|v| v.is_finite() && *v >= lo - 1e-5 && *v <= hi + 1e-5));
                let var = {
                    let m = b.images.iter().sum::<f32>() / b.images.len() as f32;
                    b.images.iter().map(|v| (v - m) * (v - m)).sum::<f32>() / b.images.len() as f32
                };
                assert!(var > 0.01, "images look constant");
            }
        }
    }

    #[test]
    fn eval_exact_colour() {
        // A constant-colour image must come out as exactly the normalized colour.
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("a/c.png");
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        ImageBuffer::from_pixel(50, 30, Rgb([255u8, 0, 128]))
            .save(&p)
            .unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        let b = load_batches(&f, vec![0], cfg(16, 1, 1, Augment::Eval))
            .next()
            .unwrap()
            .unwrap();
        let n = Normalization::default();
        let want = [255u8, 0, 128].map(|v| v as f32 / 255.0);
        for c in 0..3 {
            let exp = (want[c] - n.mean[c]) / n.std[c];
            for v in &b.images[c * 256..(c + 1) * 256] {
                assert!((v - exp).abs() < 1e-5, "channel {c}: {v} vs {exp}");
            }
        }
    }

    #[test]
    fn loader_color_types() {
        let d = tempfile::tempdir().unwrap();
        let r = d.path().join("a");
        fs::create_dir_all(&r).unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 10) as u8]))
            .save(r.join("1gray.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, y| Rgba([(x * 10) as u8, (y * 20) as u8, 7, 0]))
            .save(r.join("2rgba.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, y| {
            Rgb([(x * 3000) as u16, (y * 6000) as u16, 65535u16])
        })
        .save(r.join("3rgb16.png"))
        .unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 3000) as u16]))
            .save(r.join("4gray16.png"))
            .unwrap();
        ImageBuffer::from_fn(20, 10, |x, _| Luma([(x * 10) as u8]))
            .save_with_format(r.join("5gray.jpg"), image::ImageFormat::Jpeg)
            .unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        assert_eq!(f.samples.len(), 5);
        let b = load_batches(&f, (0..5).collect(), cfg(8, 5, 2, Augment::Eval))
            .next()
            .unwrap()
            .unwrap();
        assert_eq!(b.len, 5);
        let n = Normalization::default();
        let plane = 64;
        // gray: the three channels carry the same 0..1 value
        for k in [0usize, 4] {
            let img = &b.images[k * 3 * plane..(k + 1) * 3 * plane];
            for i in 0..plane {
                let v: Vec<f32> = (0..3)
                    .map(|c| img[c * plane + i] * n.std[c] + n.mean[c])
                    .collect();
                assert!(
                    (v[0] - v[1]).abs() < 1e-4 && (v[1] - v[2]).abs() < 1e-4,
                    "{v:?}"
                );
            }
        }
        // rgba: alpha dropped (alpha 0 does not blacken the image), blue stays 7/255
        let img = &b.images[3 * plane..6 * plane];
        for i in 0..plane {
            let blue = img[2 * plane + i] * n.std[2] + n.mean[2];
            assert!((blue - 7.0 / 255.0).abs() < 1e-4, "{blue}");
        }
        // rgb16: blue 65535 -> 255
        let img = &b.images[6 * plane..9 * plane];
        for i in 0..plane {
            let blue = img[2 * plane + i] * n.std[2] + n.mean[2];
            assert!((blue - 1.0).abs() < 1e-4, "{blue}");
        }
    }

    #[test]
    fn loader_deterministic_across_threads() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 2, 10);
        let f = ImageFolder::scan(d.path()).unwrap();
        let idx = shard(f.samples.len(), 1, 2, 42, 3, true);
        let run = |threads: usize, seed: i64| -> Vec<f32> {
            let mut c = cfg(24, 3, threads, Augment::Train(TrainAugment::default()));
            c.seed = seed;
            load_batches(&f, idx.clone(), c)
                .flat_map(|b| b.unwrap().images)
                .collect()
        };
        let a = run(1, 42);
        assert_eq!(a, run(3, 42));
        assert_eq!(a, run(0, 42));
        assert_ne!(a, run(3, 43));
    }

    #[test]
    fn loader_bad_image_and_recycle() {
        let d = tempfile::tempdir().unwrap();
        make_dataset(d.path(), 1, 6);
        fs::write(d.path().join("class0/002.jpg"), b"not a jpeg at all").unwrap();
        let f = ImageFolder::scan(d.path()).unwrap();
        let mut it = load_batches(
            &f,
            (0..6).collect(),
            cfg(16, 2, 2, Augment::Train(TrainAugment::default())),
        );
        let b0 = it.next().unwrap().unwrap();
        it.recycle(b0);
        let e = it.next().unwrap().unwrap_err();
        assert!(
            matches!(e, DatasetError::BadImage { .. }) && e.to_string().contains("002.jpg"),
            "{e}"
        );
        let b2 = it.next().unwrap().unwrap();
        assert_eq!(b2.len, 2);
        assert!(it.next().is_none());
        // out of range index is an error, not a panic
        let mut it = load_batches(&f, vec![0, 99], cfg(16, 2, 1, Augment::Eval));
        assert!(matches!(
            it.next().unwrap(),
            Err(DatasetError::InvalidDataset { .. })
        ));
    }

    #[test]
    fn loader_drop_early_is_prompt() {
        let d = tempfile::tempdir().unwrap();
        for i in 0..40 {
            write_jpeg(&d.path().join(format!("a/{i:03}.jpg")), 400, 300, i);
        }
        let f = ImageFolder::scan(d.path()).unwrap();
        let idx: Vec<usize> = (0..40).cycle().take(4000).collect();
        let mut it = load_batches(
            &f,
            idx,
            cfg(64, 8, 3, Augment::Train(TrainAugment::default())),
        );
        let _ = it.next().unwrap().unwrap();
        let t = Instant::now();
        drop(it);
        assert!(
            t.elapsed() < Duration::from_secs(2),
            "drop took {:?}",
            t.elapsed()
        );
    }

    /// cargo test --release -- --ignored --nocapture
    #[test]
    #[ignore]
    fn bench_decode_augment_224() {
        let d = tempfile::tempdir().unwrap();
        let n_files = 200;
        for i in 0..n_files {
            // photo-like content: smooth gradients + deterministic noise
            let mut rng = ChaCha8Rng::seed_from_u64(i);
            let img = ImageBuffer::from_fn(500, 375, |x, y| {
                let noise: i32 = rng.gen_range(-20..20);
                let f = |v: i32| (v + noise).clamp(0, 255) as u8;
                Rgb([
                    f(((x as f32 * 0.05 + i as f32).sin() * 100.0 + 128.0) as i32),
                    f((y * 255 / 375) as i32),
                    f(((x + y) as f32 * 0.02).cos() as i32 * 90 + 120),
                ])
            });
            let p = d.path().join(format!("c{}/{i:04}.jpg", i % 4));
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            let mut out = std::io::BufWriter::new(fs::File::create(&p).unwrap());
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, 90)
                .encode_image(&img)
                .unwrap();
        }
        let f = ImageFolder::scan(d.path()).unwrap();
        let avg_kb = f
            .samples
            .iter()
            .map(|s| fs::metadata(&s.path).unwrap().len())
            .sum::<u64>()
            / n_files
            / 1024;
        let cores = std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(1);
        let total = 2000usize;
        let idx: Vec<usize> = (0..n_files as usize).cycle().take(total).collect();
        for aug in [Augment::Train(TrainAugment::default()), Augment::Eval] {
            for threads in [1, cores] {
                let mut c = cfg(224, 32, threads, aug);
                c.prefetch = 4;
                // warm-up (page cache)
                for b in load_batches(&f, idx[..64].to_vec(), c.clone()) {
                    b.unwrap();
                }
                let t = Instant::now();
                let mut it = load_batches(&f, idx.clone(), c);
                let mut n = 0;
                while let Some(b) = it.next() {
                    let b = b.unwrap();
                    n += b.len;
                    it.recycle(b);
                }
                let secs = t.elapsed().as_secs_f64();
                println!(
                    "bench {aug:?}: {n} images 500x375 JPEG (~{avg_kb} KiB) -> 224x224, threads={threads} \
                     (cores={cores}): {:.0} images/s ({:.0} images/s/thread)",
                    n as f64 / secs,
                    n as f64 / secs / threads as f64
                );
            }
        }
        // Breakdown, single thread: decode only.
        let mut st = WorkerState::new(224);
        let t = Instant::now();
        for s in f.samples.iter().cycle().take(500) {
            decode_rgb(&s.path, &mut st).unwrap();
        }
        println!(
            "bench decode-only 1 thread: {:.0} images/s",
            500.0 / t.elapsed().as_secs_f64()
        );
    }
}
