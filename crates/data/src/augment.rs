//! Augmentation: torchvision's `RandomResizedCrop` + horizontal flip (+ an auto-augment policy,
//! `auto_augment/`; + `RandomErasing` after normalisation) for training, resize + center crop for evaluation; the per-micro-batch draws
//! of MixUp and CutMix (`mix_params`: pure, the worker applies them to the batch tensor).
use fast_image_resize as fr;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
pub use tchrun::augment_flags::Interpolation;
use tchrun::model::Normalization;

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
    /// The crop's resampling (`--interpolation`).
    pub interpolation: Interpolation,
    /// `--random-erase`: RandomErasing's p on the normalised image (0: off, no draw).
    pub random_erase: f64,
    /// `--auto-augment`: the policy on the flipped crop, before normalisation (none: no draw).
    pub auto_augment: Option<super::auto_augment::Policy>,
    /// The designer's transforms (`--pad`, `--random-crop` around the crop; the rest on the
    /// flipped crop, before the policy): `transforms`.
    pub transforms: tchrun::transform_flags::TransformFlags,
}

impl Default for TrainAugment {
    fn default() -> Self {
        TrainAugment {
            min_scale: 0.08,
            hflip: true,
            interpolation: Interpolation::Bilinear,
            random_erase: 0.0,
            auto_augment: None,
            transforms: Default::default(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Augment {
    /// RandomResizedCrop(size, scale=(min_scale, 1), ratio=(3/4, 4/3)) + RandomHorizontalFlip(0.5).
    Train(TrainAugment),
    /// Resize(round(size * 256 / 224)) + CenterCrop(size), bilinear.
    Eval,
    /// Resize(resize, interpolation) + CenterCrop(size): `--val-resize-size`,
    /// `--val-crop-size` (the loader's size), `--interpolation`.
    Resize {
        resize: usize,
        interpolation: Interpolation,
    },
}

impl Augment {
    /// The designer's transforms of a training crop (none for evaluation).
    pub fn transforms(&self) -> tchrun::transform_flags::TransformFlags {
        match self {
            Augment::Train(t) => t.transforms,
            _ => Default::default(),
        }
    }

    /// The resampling of the resize.
    pub fn interpolation(&self) -> Interpolation {
        match self {
            Augment::Train(t) => t.interpolation,
            Augment::Eval => Interpolation::Bilinear,
            Augment::Resize { interpolation, .. } => *interpolation,
        }
    }
}

/// Source crop box `(left, top, width, height)` in source pixels and the flip flag.
pub(super) fn crop_params(
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
            let resize = tchrun::augment_flags::default_val_resize(size as u32) as usize;
            center_crop(w, h, resize, size)
        }
        Augment::Resize { resize, .. } => center_crop(w, h, resize, size),
    }
}

/// Resize(resize: the shorter side) + CenterCrop(size), as a source box (torchvision's: the
/// longer side floor(resize × long / short), the crop's corner rounded half to even).
fn center_crop(w: u32, h: u32, resize: usize, size: usize) -> ((f64, f64, f64, f64), bool) {
    let (wf, hf) = (w as f64, h as f64);
    let short_target = (resize as f64).max(1.0);
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

/// torchvision's `RandomErasing(p, scale=(0.02, 0.33), ratio=(0.3, 3.3))` draw for an image of
/// `img_h` x `img_w`: whether it erases (`u < p`), then up to ten tries of an area and a log-
/// uniform aspect ratio; the box `(i, j, h, w)` (top, left, height, width), or `None` (no
/// erasing: the draw said no, or no try fitted). `p` 0 draws nothing.
pub fn erase_params(p: f64, img_h: usize, img_w: usize, rng: &mut impl Rng) -> Option<[usize; 4]> {
    if p <= 0.0 || rng.gen::<f64>() >= p {
        return None;
    }
    let area = (img_h * img_w) as f64;
    let (lr0, lr1) = (0.3f64.ln(), 3.3f64.ln());
    for _ in 0..10 {
        let erase_area = area * rng.gen_range(0.02..0.33);
        let aspect = rng.gen_range(lr0..lr1).exp();
        let h = (erase_area * aspect).sqrt().round_ties_even() as usize;
        let w = (erase_area / aspect).sqrt().round_ties_even() as usize;
        if !(h < img_h && w < img_w) {
            continue;
        }
        let i = rng.gen_range(0..=img_h - h);
        let j = rng.gen_range(0..=img_w - w);
        return Some([i, j, h, w]);
    }
    None
}

/// Erases (sets to 0) the box `[i, j, h, w]` of every channel of a CHW image of side `size`
/// (torchvision's `F.erase` with value 0).
pub fn erase(image: &mut [f32], size: usize, [i, j, h, w]: [usize; 4]) {
    for plane in image.chunks_exact_mut(size * size) {
        for row in plane.chunks_exact_mut(size).skip(i).take(h) {
            row[j..j + w].fill(0.0);
        }
    }
}

/// One micro-batch's MixUp or CutMix (torchvision's v2 transforms, applied to the batch and
/// itself rolled by one).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Mix {
    /// `lam × batch + (1 - lam) × rolled`, labels alike.
    MixUp { lam: f64 },
    /// `rolled`'s box `[x1, y1, x2, y2)` pasted into the batch; labels mixed by `lam`, the
    /// share of the image outside the box.
    CutMix { boxed: [usize; 4], lam: f64 },
}

/// The RNG of a micro-batch's mixing: from (seed, epoch, the micro-batch's global index),
/// apart from every image's (`image_rng`).
pub fn mix_rng(seed: i64, epoch: u64, micro_batch: usize) -> ChaCha8Rng {
    let mut h = splitmix64(seed as u64 ^ 0x6d69_7875_705f_6375); // "mixup_cu"
    h = splitmix64(h ^ epoch);
    h = splitmix64(h ^ micro_batch as u64);
    ChaCha8Rng::seed_from_u64(h)
}

/// The seed of the model's own random layers (dropout, stochastic depth) for global
/// micro-batch `micro_batch` of `epoch`: set with `tch::manual_seed` before its forward, so the
/// same micro-batch drops the same units at any world size and on a resume (a seed per rank
/// would draw the same masks on every rank, and one stream per process another sequence on 1
/// rank accumulating than on 2). Non-negative, as `manual_seed` takes it.
pub fn layer_seed(seed: i64, epoch: u64, micro_batch: usize) -> i64 {
    let mut h = splitmix64(seed as u64 ^ 0x6c61_7965_725f_7264); // "layer_rd"
    h = splitmix64(h ^ epoch);
    h = splitmix64(h ^ micro_batch as u64);
    (h >> 1) as i64
}

/// The draw of one micro-batch of `h` x `w` images, as torchvision's
/// `RandomChoice([MixUp(alpha=mixup), CutMix(alpha=cutmix)])` (each alone when the other is 0;
/// `None` when both are): the choice (uniform), λ ~ Beta(α, α), CutMix's box centre uniform
/// over the pixels with half-sides int(0.5·√(1-λ)·side), clipped, and λ the share outside it.
pub fn mix_params(mixup: f64, cutmix: f64, h: usize, w: usize, rng: &mut impl Rng) -> Option<Mix> {
    let cut = match (mixup > 0.0, cutmix > 0.0) {
        (false, false) => return None,
        (true, false) => false,
        (false, true) => true,
        (true, true) => rng.gen_bool(0.5),
    };
    if !cut {
        return Some(Mix::MixUp {
            lam: beta_symmetric(mixup, rng),
        });
    }
    let lam = beta_symmetric(cutmix, rng);
    let (r_x, r_y) = (rng.gen_range(0..w), rng.gen_range(0..h));
    let (boxed, lam) = cutmix_box(lam, r_x, r_y, h, w);
    Some(Mix::CutMix { boxed, lam })
}

/// CutMix's box `[x1, y1, x2, y2)` and adjusted λ for a drawn λ and centre, as torchvision's
/// `CutMix.make_params`.
pub fn cutmix_box(lam: f64, r_x: usize, r_y: usize, h: usize, w: usize) -> ([usize; 4], f64) {
    let r = 0.5 * (1.0 - lam).sqrt();
    let (rw, rh) = ((r * w as f64) as usize, (r * h as f64) as usize);
    let x1 = r_x.saturating_sub(rw);
    let y1 = r_y.saturating_sub(rh);
    let x2 = (r_x + rw).min(w);
    let y2 = (r_y + rh).min(h);
    let lam = 1.0 - ((x2 - x1) * (y2 - y1)) as f64 / (w * h) as f64;
    ([x1, y1, x2, y2], lam)
}

/// Beta(α, α) as X / (X + Y), X, Y ~ Gamma(α) (torch's `Beta` samples so too).
pub fn beta_symmetric(alpha: f64, rng: &mut impl Rng) -> f64 {
    let (x, y) = (gamma(alpha, rng), gamma(alpha, rng));
    if x + y > 0.0 {
        x / (x + y)
    } else {
        // Both underflowed (a tiny α): λ is then 0 or 1 with equal odds.
        f64::from(u8::from(rng.gen_bool(0.5)))
    }
}

/// Gamma(α, 1): Marsaglia and Tsang's method; α < 1 through Gamma(α + 1) × U^(1/α).
fn gamma(alpha: f64, rng: &mut impl Rng) -> f64 {
    if alpha < 1.0 {
        let u: f64 = 1.0 - rng.gen::<f64>();
        return gamma(alpha + 1.0, rng) * u.powf(1.0 / alpha);
    }
    let d = alpha - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u: f64 = 1.0 - rng.gen::<f64>();
        if u < 1.0 - 0.0331 * x.powi(4) || u.ln() < 0.5 * x * x + d * (1.0 - v + v.ln()) {
            return d * v;
        }
    }
}

/// A standard normal draw (Box-Muller).
fn normal(rng: &mut impl Rng) -> f64 {
    let u1: f64 = 1.0 - rng.gen::<f64>();
    let u2: f64 = rng.gen();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// Where the resampling filter of a resized box reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BoxResize {
    /// The box is cut out first, as torchvision's `resized_crop` (RandomResizedCrop's kernel)
    /// does: the filter sees no pixel outside it. The box is in whole pixels.
    CropFirst,
    /// The box is resampled inside the whole image, as `Resize` + `CenterCrop` is: the filter
    /// reads across the box's edges, as it does when the whole image is resized.
    WithinImage,
}

/// The box `crop` (left, top, width, height) of the RGB8 image `src` (width, height, bytes)
/// resized into `dst` as Pillow resizes (torchvision's reference decodes with PIL): nearest,
/// or antialiased bilinear and bicubic (Catmull-Rom, Pillow's a = -0.5), the horizontal pass
/// first and rounded and clipped to 8 bits before the vertical one, as Pillow's
/// `ImagingResample` (fast_image_resize alone would run the vertical pass first, whose bicubic
/// overshoot clips elsewhere: up to 11 grey levels from torchvision's). `scratch` holds a
/// cut-out box and the horizontal pass's rows.
pub(super) fn resize_box(
    resizer: &mut fr::Resizer,
    src: (u32, u32, &[u8]),
    (crop, mode): ((f64, f64, f64, f64), BoxResize),
    interpolation: Interpolation,
    scratch: &mut (Vec<u8>, Vec<u8>),
    dst: &mut fr::images::Image<'static>,
) -> Result<(), String> {
    let (w, h, rgb) = src;
    if rgb.len() < (w as usize) * (h as usize) * 3 {
        return Err(format!("the buffer does not hold {w} x {h} RGB pixels"));
    }
    let alg = match interpolation {
        Interpolation::Nearest => fr::ResizeAlg::Nearest,
        Interpolation::Bilinear => fr::ResizeAlg::Convolution(fr::FilterType::Bilinear),
        Interpolation::Bicubic => fr::ResizeAlg::Convolution(fr::FilterType::CatmullRom),
    };
    let (cut, rows) = scratch;
    // The image the passes read, and the box in it.
    let ((sw, sh, pixels), (left, top, cw, ch)) = match mode {
        BoxResize::WithinImage => ((w, h, rgb), crop),
        BoxResize::CropFirst => {
            let (x0, y0) = (crop.0.round() as usize, crop.1.round() as usize);
            let (bw, bh) = (
                crop.2.round().max(1.0) as usize,
                crop.3.round().max(1.0) as usize,
            );
            let (x1, y1) = ((x0 + bw).min(w as usize), (y0 + bh).min(h as usize));
            if x0 >= x1 || y0 >= y1 {
                return Err(format!("crop box {crop:?} is outside the {w} x {h} image"));
            }
            cut.clear();
            let row = w as usize * 3;
            for y in y0..y1 {
                cut.extend_from_slice(&rgb[y * row + x0 * 3..y * row + x1 * 3]);
            }
            let (bw, bh) = ((x1 - x0) as u32, (y1 - y0) as u32);
            ((bw, bh, cut.as_slice()), (0.0, 0.0, bw as f64, bh as f64))
        }
    };
    let err = |e: &dyn std::fmt::Display| format!("resize failed: {e}");
    let src =
        fr::images::ImageRef::new(sw, sh, pixels, fr::PixelType::U8x3).map_err(|e| err(&e))?;
    // The horizontal pass over every row, then the vertical pass over the box's rows.
    let out_w = dst.width();
    rows.clear();
    rows.resize(out_w as usize * sh as usize * 3, 0);
    let mut tmp = fr::images::Image::from_slice_u8(out_w, sh, rows, fr::PixelType::U8x3)
        .map_err(|e| err(&e))?;
    let opts = fr::ResizeOptions::new().resize_alg(alg);
    let across = opts.crop(left, 0.0, cw, sh as f64);
    resizer
        .resize(&src, &mut tmp, &across)
        .map_err(|e| err(&e))?;
    let down = opts.crop(0.0, top, out_w as f64, ch);
    resizer.resize(&tmp, dst, &down).map_err(|e| err(&e))
}

/// The loader's crop and resize alone, for the parity tests: the box `crop` (left, top,
/// width, height, in source pixels) of the `w` x `h` RGB8 image `rgb`, resized to `size` x
/// `size` with `interpolation`, the filter reading where `mode` says; RGB8 bytes, row-major.
/// Errors name a box outside the image.
pub fn resized_crop(
    (w, h, rgb): (u32, u32, &[u8]),
    crop: ((f64, f64, f64, f64), BoxResize),
    size: usize,
    interpolation: Interpolation,
) -> Result<Vec<u8>, String> {
    let mut dst = fr::images::Image::new(size as u32, size as u32, fr::PixelType::U8x3);
    let mut scratch = (Vec::new(), Vec::new());
    let mut resizer = fr::Resizer::new();
    resize_box(
        &mut resizer,
        (w, h, rgb),
        crop,
        interpolation,
        &mut scratch,
        &mut dst,
    )?;
    Ok(dst.into_vec())
}

/// torchvision's eval transform `Resize(resize)` + `CenterCrop(size)` as the loader takes it:
/// the crop's box in the source image, resampled within it (the same grid as resizing the
/// whole image and cutting the centre).
pub fn center_crop_box(w: u32, h: u32, resize: usize, size: usize) -> (f64, f64, f64, f64) {
    center_crop(w, h, resize, size).0
}

/// The HWC RGB8 crop `px` (side `size`, mirrored if `flip`) into normalised CHW planes.
pub(super) fn normalize(
    px: &[u8],
    flip: bool,
    size: usize,
    lut: &[[f32; 256]; 3],
    out: &mut [f32],
) {
    let plane = size * size;
    let (r_out, rest) = out.split_at_mut(plane);
    let (g_out, b_out) = rest.split_at_mut(plane);
    let [l0, l1, l2] = lut;
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
}

/// Lookup tables: `lut[c][v] = (v / 255 - mean[c]) / std[c]`.
pub(crate) fn norm_lut(n: &Normalization) -> [[f32; 256]; 3] {
    let mut lut = [[0f32; 256]; 3];
    for c in 0..3 {
        for v in 0..256 {
            lut[c][v] = (v as f32 / 255.0 - n.mean[c]) / n.std[c];
        }
    }
    lut
}

pub(crate) fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
