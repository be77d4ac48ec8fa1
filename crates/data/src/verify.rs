//! Verification of every image header before a step (dimensions, truncated JPEGs,
//! decompression bombs), in parallel; under `--skip-bad-images` bad files are dropped and
//! listed.
use crate::dataset::{ImageFolder, Sample};
use crate::error::DatasetError;
use crate::images::IMAGE_FORMATS;
use image::ImageReader;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Reason string for an image whose header cannot be read or is too large.
/// Whether a JPEG file ends with its end-of-image marker. FF D9 cannot occur inside
/// entropy-coded data (0xFF is stuffed there), so a file cut short lacks it near its end;
/// some writers append a few bytes after it, hence the last KiB is searched.
fn jpeg_has_end_marker(path: &Path) -> std::io::Result<bool> {
    use std::io::{Seek, SeekFrom};
    let (mut f, len) = tchrun::files::open_regular(path, u64::MAX)
        .map_err(tchrun::files::BoundedReadError::into_io)?;
    let tail = len.min(1024);
    f.seek(SeekFrom::Start(len - tail))?;
    let mut buf = Vec::with_capacity(tail as usize);
    f.read_to_end(&mut buf)?;
    Ok(buf.windows(2).any(|w| w == [0xFF, 0xD9]))
}

/// The checks of `check_header` that need the whole file, on bytes the loader has read
/// anyway: run on every decode, so an image that was never verified up front (a large set,
/// see `index::UPFRONT_VERIFY_LIMIT`) gets the same verdicts, with the same words, when it is
/// first decoded.
pub(super) fn check_decoded(
    bytes: &[u8],
    format: Option<image::ImageFormat>,
    (w, h): (u32, u32),
    max_pixels: u64,
) -> Result<(), String> {
    if format == Some(image::ImageFormat::Jpeg) {
        let tail = &bytes[bytes.len().saturating_sub(1024)..];
        if !tail.windows(2).any(|w| w == [0xFF, 0xD9]) {
            return Err("truncated JPEG: no end-of-image marker (FF D9) in its last KiB".into());
        }
    }
    check_dimensions(w, h, max_pixels)
}

fn check_dimensions(w: u32, h: u32, max_pixels: u64) -> Result<(), String> {
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

/// Every header of `samples` checked on many threads (a packed sample: the dimensions its
/// pack recorded); `None` for a good image, else why not.
pub(super) fn check_headers(samples: &[Sample], max_pixels: u64) -> Vec<Option<String>> {
    let n = samples.len();
    if n == 0 {
        return Vec::new();
    }
    // Reading headers waits on storage far more than it computes (a cold page cache, a
    // network file system): many more threads than cores keep the device busy.
    let threads = std::thread::available_parallelism()
        .map(|p| p.get() * 8)
        .unwrap_or(16)
        .clamp(16, 64)
        .min(n);
    let chunk = n.div_ceil(threads);
    std::thread::scope(|s| {
        let handles: Vec<_> = samples
            .chunks(chunk)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|smp| match &smp.member {
                            Some(m) => m.check_pixels(max_pixels).err(),
                            None => check_header(&smp.path, max_pixels).err(),
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| {
                h.join()
                    .unwrap_or_else(|_| vec![Some("header check panicked".to_string()); chunk])
            })
            .take(n)
            .collect()
    })
}

pub(super) fn check_header(path: &Path, max_pixels: u64) -> Result<(), String> {
    // Opened with bounds: a FIFO or device among the images is refused, never waited on.
    let (file, _) = tchrun::files::open_regular(path, tchrun::files::caps::IMAGE)
        .map_err(|e| format!("cannot open: {e}"))?;
    let mut reader = ImageReader::new(std::io::BufReader::new(file));
    if let Ok(f) = image::ImageFormat::from_path(path) {
        reader.set_format(f); // as ImageReader::open: the extension, unless the bytes say more
    }
    let mut reader = reader
        .with_guessed_format()
        .map_err(|e| format!("cannot read: {e}"))?;
    if reader.format().is_none() {
        return Err(format!("not a {IMAGE_FORMATS} file (unrecognised header)"));
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
    check_dimensions(w, h, max_pixels)
}

impl ImageFolder {
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
        let reasons = check_headers(&self.samples, max_pixels);
        self.apply_verdicts(reasons, skip_bad)
    }

    /// The header verdicts of every sample (`None`: good), applied: without `skip_bad` the
    /// first bad sample is the error; with it the bad ones are dropped and returned as
    /// `(path, reason)` in sample order, and `Empty` if nothing is left.
    pub(super) fn apply_verdicts(
        &mut self,
        reasons: Vec<Option<String>>,
        skip_bad: bool,
    ) -> Result<Vec<(PathBuf, String)>, DatasetError> {
        let n = self.samples.len();
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
