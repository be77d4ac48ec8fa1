//! The threaded decode/augment loader: bounded prefetch, batches in order, augmentation
//! seeded per (seed, epoch, rank, position), images that fail to decode dropped alone under
//! `--skip-bad-images`.
use crate::augment::{
    crop_params, erase, erase_params, norm_lut, normalize, resize_box, splitmix64, Augment,
    BoxResize,
};
use crate::dataset::{ImageFolder, Sample};
use crate::error::{bad, bounded_err, io_err, DatasetError};
use crate::images::{IMAGE_FORMATS, MAX_DECODED_BYTES};
use crate::pack::{self, Member};
use crate::shard::GlobalCut;
use crate::{auto_augment, transforms};
use crossbeam_channel::{Receiver, Sender};
use fast_image_resize as fr;
use image::{ColorType, DynamicImage, ImageDecoder, ImageReader};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::VecDeque;
use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use tchrun::model::Normalization;

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
    /// `--max-image-pixels`: checked on every decode, with the other header checks that need
    /// the whole file (a truncated JPEG), so that images never verified up front get the same
    /// verdicts (`verify::check_decoded`).
    pub max_pixels: u64,
    /// `--global-batch-size`: augmentation seeded by the sample's global position in the epoch
    /// (not rank and shard position), so an image gets the same crop at any world size.
    pub global: Option<GlobalCut>,
}

/// Per-image RNG derived from (seed, epoch, rank, position); independent of threads.
pub(super) fn image_rng(seed: i64, epoch: u64, rank: usize, position: usize) -> ChaCha8Rng {
    let mut h = splitmix64(seed as u64);
    h = splitmix64(h ^ epoch);
    h = splitmix64(h ^ rank as u64);
    h = splitmix64(h ^ position as u64);
    ChaCha8Rng::seed_from_u64(h)
}

pub(super) struct Shared {
    samples: Vec<Sample>,
    indices: Vec<usize>,
    cfg: LoaderConfig,
    lut: [[f32; 256]; 3],
    cancel: AtomicBool,
    spare: Receiver<Vec<f32>>,
}

/// Per-thread reusable buffers.
pub(super) struct WorkerState {
    file: Vec<u8>,
    rgb: Vec<u8>,
    dst: fr::images::Image<'static>,
    resizer: fr::Resizer,
    /// A RandomResizedCrop box cut out before it is resized, and the horizontal pass's rows.
    crop: (Vec<u8>, Vec<u8>),
    /// Packed samples: the shards kept open.
    shards: pack::ShardFiles,
    /// `--auto-augment` and the transforms: the crop they work on, and their buffers.
    policy_image: auto_augment::Rgb8,
    policy_scratch: auto_augment::Scratch,
    /// `--pad`'s padded image, and the transforms' warp buffer.
    padded: Vec<u8>,
    transform_scratch: Vec<u8>,
}

impl WorkerState {
    pub(super) fn new(size: usize) -> Self {
        WorkerState {
            file: Vec::new(),
            rgb: Vec::new(),
            dst: fr::images::Image::new(size as u32, size as u32, fr::PixelType::U8x3),
            resizer: fr::Resizer::new(),
            crop: (Vec::new(), Vec::new()),
            shards: pack::ShardFiles::default(),
            policy_image: auto_augment::Rgb8::default(),
            policy_scratch: auto_augment::Scratch::default(),
            padded: Vec::new(),
            transform_scratch: Vec::new(),
        }
    }
}

/// Decode `path` to 8-bit RGB in `st.rgb`; returns (width, height). The image is refused
/// (`BadImage`) if it fails the header checks (`verify::check_decoded`, `max_pixels`).
pub(super) fn decode_rgb(
    path: &Path,
    st: &mut WorkerState,
    max_pixels: u64,
) -> Result<(u32, u32), DatasetError> {
    tchrun::files::read_bounded_into(path, tchrun::files::caps::IMAGE, &mut st.file)
        .map_err(|e| bounded_err(path, e))?;
    decode_file_buf(path, st, max_pixels)
}

/// Decode a packed sample: its member read by offset into `st.file`; errors name the shard
/// and the member.
fn decode_member(
    path: &Path,
    m: &Member,
    st: &mut WorkerState,
    max_pixels: u64,
) -> Result<(u32, u32), DatasetError> {
    m.read_with(&mut st.file, &mut st.shards)?;
    decode_file_buf(path, st, max_pixels).map_err(|e| m.locate(e))
}

/// Decode the image bytes in `st.file` (read from `path`) to 8-bit RGB in `st.rgb`; refused
/// (`BadImage`) if they fail the header checks (`verify::check_decoded`, `max_pixels`).
fn decode_file_buf(
    path: &Path,
    st: &mut WorkerState,
    max_pixels: u64,
) -> Result<(u32, u32), DatasetError> {
    let reader = ImageReader::new(Cursor::new(&st.file[..]))
        .with_guessed_format()
        .map_err(|e| io_err(path, e))?;
    let format = reader.format();
    if format.is_none() {
        return Err(bad(
            path,
            format!("not a {IMAGE_FORMATS} file (unrecognised header); fix or delete the file"),
        ));
    }
    let dec = reader
        .into_decoder()
        .map_err(|e| bad(path, format!("cannot decode: {e}; fix or delete the file")))?;
    let (w, h) = dec.dimensions();
    super::verify::check_decoded(&st.file, format, (w, h), max_pixels).map_err(|r| {
        bad(
            path,
            format!("{r}; fix or delete the file, or skip bad images"),
        )
    })?;
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

/// One image file decoded as the loader decodes it, before any crop: `(width, height, RGB8
/// bytes, row-major)`. Grayscale becomes three equal channels and alpha is dropped, as
/// Pillow's `.convert("RGB")`; 16-bit samples are scaled to 8 bits (`v / 257`, rounded).
pub fn decode_rgb8(path: &Path) -> Result<(u32, u32, Vec<u8>), DatasetError> {
    decode_rgb8_within(path, u64::MAX)
}

/// [`decode_rgb8`] with the header checks of `--max-image-pixels` `max_pixels`.
pub fn decode_rgb8_within(path: &Path, max: u64) -> Result<(u32, u32, Vec<u8>), DatasetError> {
    let mut st = WorkerState::new(1);
    let (w, h) = decode_rgb(path, &mut st, max)?;
    Ok((w, h, std::mem::take(&mut st.rgb)))
}

/// Decode, augment, normalize one image into `out` (3 x size x size).
pub(super) fn process_image(
    path: &Path,
    member: Option<&Member>,
    rng: &mut ChaCha8Rng,
    shared: &Shared,
    st: &mut WorkerState,
    out: &mut [f32],
) -> Result<(), DatasetError> {
    let size = shared.cfg.size;
    let max = shared.cfg.max_pixels;
    let (w, h) = match member {
        Some(m) => decode_member(path, m, st, max)?,
        None => decode_rgb(path, st, max)?,
    };
    let tf = shared.cfg.augment.transforms();
    let (wh, corner) = transforms::pad_and_place(
        &tf,
        &mut st.rgb,
        &mut st.padded,
        (w as usize, h as usize),
        size,
        rng,
    );
    let (w, h) = (wh.0 as u32, wh.1 as u32);
    let interpolation = shared.cfg.augment.interpolation();
    let flip = match (corner, shared.cfg.augment) {
        (Some(c), Augment::Train(t)) => {
            transforms::cut(&st.rgb, w as usize, c, size, st.dst.buffer_mut());
            rng.gen_bool(0.5) && t.hflip
        }
        _ => resized(st, (w, h), size, shared.cfg.augment, rng).map_err(|e| bad(path, e))?,
    };
    let policy = match shared.cfg.augment {
        Augment::Train(t) => t.auto_augment,
        _ => None,
    };
    if policy.is_some() || tf.after_crop() {
        // The transforms and the policy run on the flipped crop (ClassificationPresetTrain's
        // order), their draws from the image's own RNG after the crop's and flip's.
        let img = &mut st.policy_image;
        img.width = size;
        img.height = size;
        img.data.clear();
        let px = st.dst.buffer();
        for row in px.chunks_exact(size * 3) {
            if flip {
                for p in row.chunks_exact(3).rev() {
                    img.data.extend_from_slice(p);
                }
            } else {
                img.data.extend_from_slice(row);
            }
        }
        transforms::draw(&tf, size, size, rng).apply(img, interpolation, &mut st.transform_scratch);
        if let Some(policy) = policy {
            policy
                .draw(size, size, rng)
                .apply(img, interpolation, &mut st.policy_scratch);
        }
        normalize(&st.policy_image.data, false, size, &shared.lut, out);
    } else {
        normalize(st.dst.buffer(), flip, size, &shared.lut, out);
    }
    // RandomErasing after normalisation (ClassificationPresetTrain's order), drawn from the
    // image's own RNG after its crop and flip.
    if let Augment::Train(t) = shared.cfg.augment {
        if let Some(b) = erase_params(t.random_erase, size, size, rng) {
            erase(out, size, b);
        }
    }
    Ok(())
}

/// RandomResizedCrop (training) or Resize + CenterCrop of the decoded `w` x `h` image in
/// `st.rgb` into `st.dst`; whether the crop is to be flipped.
fn resized(
    st: &mut WorkerState,
    (w, h): (u32, u32),
    size: usize,
    augment: Augment,
    rng: &mut ChaCha8Rng,
) -> Result<bool, String> {
    let ((mut left, mut top, mut cw, mut ch), flip) = crop_params(augment, w, h, size, rng);
    // guard against float drift outside the image
    left = left.clamp(0.0, w as f64);
    top = top.clamp(0.0, h as f64);
    cw = cw.min(w as f64 - left).max(1e-3);
    ch = ch.min(h as f64 - top).max(1e-3);
    // RandomResizedCrop cuts its box out before resizing; Resize + CenterCrop resizes the
    // whole image, so its filter reads across the crop's edges.
    let mode = match augment {
        Augment::Train(_) => BoxResize::CropFirst,
        Augment::Eval | Augment::Resize { .. } => BoxResize::WithinImage,
    };
    let crop = ((left, top, cw, ch), mode);
    let src = (w, h, st.rgb.as_slice());
    let dst = &mut st.dst;
    resize_box(
        &mut st.resizer,
        src,
        crop,
        augment.interpolation(),
        &mut st.crop,
        dst,
    )?;
    Ok(flip)
}

pub(super) fn build_batch(
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
        let mut rng = match cfg.global {
            Some(cut) => image_rng(
                cfg.seed,
                cfg.epoch,
                0,
                cut.position(cfg.first_position + pos),
            ),
            None => image_rng(cfg.seed, cfg.epoch, cfg.rank, cfg.first_position + pos),
        };
        let k = labels.len();
        let _work = Working::begin(&smp.path, cfg.rank);
        match process_image(
            &smp.path,
            smp.member.as_ref(),
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

/// The files the loader threads are decoding now (thread name, file, since), for the stacks a
/// hung rank writes: two uncontended locks per image, nothing against a decode.
static IN_PROGRESS: std::sync::Mutex<Vec<(String, PathBuf, std::time::SystemTime)>> =
    std::sync::Mutex::new(Vec::new());

/// The files the loader threads of this process are decoding now: (thread, file, since).
pub fn in_progress() -> Vec<(String, PathBuf, std::time::SystemTime)> {
    IN_PROGRESS
        .lock()
        .map(|w| w.clone())
        .unwrap_or_else(|e| e.into_inner().clone())
}

/// One image in progress on this thread, until dropped.
struct Working {
    thread: String,
}

impl Working {
    fn begin(path: &Path, rank: usize) -> Working {
        let thread = std::thread::current().name().unwrap_or("main").to_string();
        if let Ok(mut w) = IN_PROGRESS.lock() {
            w.retain(|(t, _, _)| *t != thread);
            w.push((
                thread.clone(),
                path.to_path_buf(),
                std::time::SystemTime::now(),
            ));
        }
        tchrun_faults::maybe_stall_decode(rank);
        tchrun_faults::maybe_slow_decode(rank);
        Working { thread }
    }
}

impl Drop for Working {
    fn drop(&mut self) {
        if let Ok(mut w) = IN_PROGRESS.lock() {
            w.retain(|(t, _, _)| *t != self.thread);
        }
    }
}

pub(super) struct Job {
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
