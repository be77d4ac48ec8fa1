//! The designer's image transforms (`transform_flags`) in the loader, as
//! `torchvision.transforms.v2` on `uint8` tensors: `--pad` and `--random-crop` before and as
//! the crop (`pad_and_place`, `cut`), then on the flipped crop, before `--auto-augment` and
//! normalisation, in this order: vertical flip, rotation, affine, perspective, colour jitter,
//! grayscale. What each draws (`draw`) comes from the image's own RNG, after the crop's and the
//! horizontal flip's draws, and a transform that is off draws nothing; applying a draw
//! (`Draw::apply`) is pure. The rotation, affine and colour kernels are the auto-augment ops'
//! (`auto_augment::ops`) with torchvision's `fill=0`; the rest are in `ops.rs`. Knows nothing
//! of files.
mod ops;

pub use ops::{adjust_hue, grayscale, pad, perspective, perspective_coefficients, vflip};

use super::auto_augment::{
    brightness, contrast, inverse_affine, rotate, saturation, warp, Fill, Rgb8,
};
use rand::seq::SliceRandom;
use rand::Rng;
use tchrun::augment_flags::Interpolation;
use tchrun::transform_flags::{PadMode, TransformFlags};

/// RandomAffine's draw: the angle, the translation in whole pixels, the scale and the x-shear.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AffineDraw {
    pub angle: f64,
    pub translate: [i64; 2],
    pub scale: f64,
    pub shear: f64,
}

/// ColorJitter's draw: the order of its four adjustments (0 brightness, 1 contrast, 2
/// saturation, 3 hue: `torch.randperm(4)`) and each factor (none: that one is off).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct JitterDraw {
    pub order: [usize; 4],
    pub factors: [Option<f64>; 4],
}

/// One image's draw of the transforms after the crop (each `None`/false: not applied).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Draw {
    pub vflip: bool,
    /// RandomRotation's angle (degrees).
    pub rotation: Option<f64>,
    pub affine: Option<AffineDraw>,
    /// RandomPerspective's end points (top-left, top-right, bottom-right, bottom-left), when
    /// its `p` said yes.
    pub perspective: Option<[[i64; 2]; 4]>,
    pub jitter: Option<JitterDraw>,
    pub grayscale: bool,
}

/// A draw of `torch.empty(1).uniform_(lo, hi).item()`: uniform in [lo, hi), a float32 value.
fn uniform(lo: f64, hi: f64, rng: &mut impl Rng) -> f64 {
    if lo < hi {
        f64::from(rng.gen_range(lo..hi) as f32)
    } else {
        lo
    }
}

/// `torch.randint(lo, hi)`: uniform in [lo, hi).
fn randint(lo: i64, hi: i64, rng: &mut impl Rng) -> i64 {
    rng.gen_range(lo..hi.max(lo + 1))
}

/// `_RandomApplyTransform`'s coin: applied when `torch.rand(1) < p` (`p` 0: no draw).
fn coin(p: f64, rng: &mut impl Rng) -> bool {
    p > 0.0 && rng.gen::<f64>() < p
}

/// RandomPerspective's `make_params`: each corner moved inwards by up to
/// `int(distortion × half side)` pixels.
pub fn perspective_endpoints(
    distortion: f64,
    h: usize,
    w: usize,
    rng: &mut impl Rng,
) -> [[i64; 2]; 4] {
    let (h, w) = (h as i64, w as i64);
    let bh = (distortion * (h / 2) as f64) as i64 + 1;
    let bw = (distortion * (w / 2) as f64) as i64 + 1;
    let tl = [randint(0, bw, rng), randint(0, bh, rng)];
    let tr = [randint(w - bw, w, rng), randint(0, bh, rng)];
    let br = [randint(w - bw, w, rng), randint(h - bh, h, rng)];
    let bl = [randint(0, bw, rng), randint(h - bh, h, rng)];
    [tl, tr, br, bl]
}

/// RandomPerspective's start points: the corners of an `h` x `w` image.
pub fn perspective_startpoints(h: usize, w: usize) -> [[i64; 2]; 4] {
    let (h, w) = (h as i64, w as i64);
    [[0, 0], [w - 1, 0], [w - 1, h - 1], [0, h - 1]]
}

/// What the transforms after the crop draw for an `h` x `w` crop, as each torchvision
/// transform's `make_params` (and `_RandomApplyTransform`'s coin) draws it.
pub fn draw(t: &TransformFlags, h: usize, w: usize, rng: &mut impl Rng) -> Draw {
    let vflip = coin(t.vflip, rng);
    let rotation = (t.rotation > 0.0).then(|| uniform(-t.rotation, t.rotation, rng));
    let affine = t.affine.map(|a| {
        let angle = uniform(-a.degrees, a.degrees, rng);
        let shift = |side: usize, rng: &mut _| {
            let max = a.translate * side as f64;
            uniform(-max, max, rng).round_ties_even() as i64
        };
        let translate = [shift(w, rng), shift(h, rng)];
        let scale = uniform(a.scale_min, a.scale_max, rng);
        let shear = uniform(-a.shear, a.shear, rng);
        AffineDraw {
            angle,
            translate,
            scale,
            shear,
        }
    });
    let perspective = t
        .perspective
        .and_then(|p| coin(p.p, rng).then(|| perspective_endpoints(p.distortion, h, w, rng)));
    let jitter = t.color_jitter.map(|c| {
        let mut order = [0, 1, 2, 3];
        order.shuffle(rng);
        let mut factor = |x: f64, lo: f64, hi: f64| (x > 0.0).then(|| uniform(lo, hi, rng));
        let factors = [
            factor(
                c.brightness,
                (1.0 - c.brightness).max(0.0),
                1.0 + c.brightness,
            ),
            factor(c.contrast, (1.0 - c.contrast).max(0.0), 1.0 + c.contrast),
            factor(
                c.saturation,
                (1.0 - c.saturation).max(0.0),
                1.0 + c.saturation,
            ),
            factor(c.hue, -c.hue, c.hue),
        ];
        JitterDraw { order, factors }
    });
    let grayscale = coin(t.grayscale, rng);
    Draw {
        vflip,
        rotation,
        affine,
        perspective,
        jitter,
        grayscale,
    }
}

impl Draw {
    /// Applies the draw to `img` in the module's order (`interpolation`: the geometric
    /// transforms' resampling, nearest or bilinear).
    pub fn apply(&self, img: &mut Rgb8, interpolation: Interpolation, scratch: &mut Vec<u8>) {
        let bilinear = interpolation != Interpolation::Nearest;
        if self.vflip {
            vflip(img);
        }
        if let Some(angle) = self.rotation {
            rotate(img, angle, bilinear, Fill::Masked, scratch);
        }
        if let Some(a) = self.affine {
            let t = [a.translate[0] as f64, a.translate[1] as f64];
            let m = inverse_affine([0.0, 0.0], a.angle, t, a.scale, [a.shear, 0.0]);
            warp(img, &m, bilinear, Fill::Masked, scratch);
        }
        if let Some(end) = self.perspective {
            let start = perspective_startpoints(img.height, img.width);
            let c = perspective_coefficients(start, end);
            perspective(img, c, bilinear, scratch);
        }
        if let Some(j) = self.jitter {
            for k in j.order {
                match (k, j.factors[k]) {
                    (0, Some(f)) => brightness(img, f),
                    (1, Some(f)) => contrast(img, f),
                    (2, Some(f)) => saturation(img, f),
                    (3, Some(f)) => adjust_hue(img, f),
                    _ => {}
                }
            }
        }
        if self.grayscale {
            grayscale(img);
        }
    }
}

/// RandomCrop(size, padding=pad, pad_if_needed=True)'s draw for a `w` x `h` image: the
/// padding (left, top, right, bottom: `--pad` on every side, plus on both sides of a side still
/// shorter than the crop, its shortfall) and the crop's top-left corner in the padded image.
pub fn random_crop_params(
    w: usize,
    h: usize,
    size: usize,
    pad: usize,
    rng: &mut impl Rng,
) -> ([usize; 4], (usize, usize)) {
    let mut padding = [pad; 4];
    let (mut pw, mut ph) = (w + 2 * pad, h + 2 * pad);
    if ph < size {
        let diff = size - ph;
        padding[1] += diff;
        padding[3] += diff;
        ph += 2 * diff;
    }
    if pw < size {
        let diff = size - pw;
        padding[0] += diff;
        padding[2] += diff;
        pw += 2 * diff;
    }
    let top = rng.gen_range(0..=ph - size);
    let left = rng.gen_range(0..=pw - size);
    (padding, (top, left))
}

/// `--pad` and `--random-crop` on a decoded training image (`rgb`, `w` x `h`): the image padded
/// in place (`spare` its buffer), its new size, and with `--random-crop` the crop's top-left
/// corner (drawn from `rng` before the flip, as RandomCrop comes first).
pub fn pad_and_place(
    t: &TransformFlags,
    rgb: &mut Vec<u8>,
    spare: &mut Vec<u8>,
    (w, h): (usize, usize),
    size: usize,
    rng: &mut impl Rng,
) -> ((usize, usize), Option<(usize, usize)>) {
    let (n, mode) = t
        .pad
        .map_or((0, PadMode::Constant), |p| (p.pixels as usize, p.mode));
    let (padding, corner) = if t.random_crop {
        let (padding, corner) = random_crop_params(w, h, size, n, rng);
        (padding, Some(corner))
    } else {
        ([n; 4], None)
    };
    if padding == [0; 4] {
        return ((w, h), corner);
    }
    let new = pad((w, h, rgb), padding, mode, spare);
    std::mem::swap(rgb, spare);
    (new, corner)
}

/// The `size` x `size` crop at `(top, left)` of the `w`-wide RGB8 image `rgb` into `out`
/// (RandomCrop's `F.crop`).
pub fn cut(rgb: &[u8], w: usize, (top, left): (usize, usize), size: usize, out: &mut [u8]) {
    let row = size * 3;
    for (y, dst) in out.chunks_exact_mut(row).take(size).enumerate() {
        let at = ((top + y) * w + left) * 3;
        dst.copy_from_slice(&rgb[at..at + row]);
    }
}
