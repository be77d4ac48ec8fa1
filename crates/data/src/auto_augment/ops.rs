//! The auto-augment ops on 8-bit RGB images, as `torchvision.transforms.v2.functional` computes
//! them on `uint8` tensors (torchvision 0.26): the colour ops with torch's float32 arithmetic
//! (its fused multiply-adds, truncation to `uint8`), the geometric ops as `affine_image` /
//! `rotate_image` (the inverse matrix in f64, the sampling grid in f32, `grid_sample` with zero
//! padding, nearest or bilinear, rounded half to even). Pure: no RNG.
use tchrun::augment_flags::Interpolation;

/// An RGB image, 8 bits per sample, rows of interleaved R, G, B (the loader's resize output).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Rgb8 {
    pub width: usize,
    pub height: usize,
    /// `height × width × 3` bytes, row-major.
    pub data: Vec<u8>,
}

/// The ops of torchvision's policies (`_AutoAugmentBase._apply_image_or_video_transform`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

impl Op {
    /// torchvision's name of the op (its `transform_id`).
    pub fn name(self) -> &'static str {
        match self {
            Op::Identity => "Identity",
            Op::ShearX => "ShearX",
            Op::ShearY => "ShearY",
            Op::TranslateX => "TranslateX",
            Op::TranslateY => "TranslateY",
            Op::Rotate => "Rotate",
            Op::Brightness => "Brightness",
            Op::Color => "Color",
            Op::Contrast => "Contrast",
            Op::Sharpness => "Sharpness",
            Op::Posterize => "Posterize",
            Op::Solarize => "Solarize",
            Op::AutoContrast => "AutoContrast",
            Op::Equalize => "Equalize",
            Op::Invert => "Invert",
        }
    }

    /// The op of torchvision's name.
    pub fn named(name: &str) -> Option<Op> {
        ALL_OPS.into_iter().find(|o| o.name() == name)
    }
}

/// Every op, in `Op`'s order.
pub const ALL_OPS: [Op; 15] = [
    Op::Identity,
    Op::ShearX,
    Op::ShearY,
    Op::TranslateX,
    Op::TranslateY,
    Op::Rotate,
    Op::Brightness,
    Op::Color,
    Op::Contrast,
    Op::Sharpness,
    Op::Posterize,
    Op::Solarize,
    Op::AutoContrast,
    Op::Equalize,
    Op::Invert,
];

/// Applies `op` at `magnitude` (the signed value torchvision passes) to `img`; `scratch` is a
/// reusable buffer for the geometric ops. `interpolation` is nearest or bilinear (torchvision's
/// tensor ops take no other; bicubic resamples as bilinear here and is refused with
/// `--auto-augment` before a job starts).
pub fn apply(
    op: Op,
    magnitude: f64,
    img: &mut Rgb8,
    interpolation: Interpolation,
    scratch: &mut Vec<u8>,
) {
    let bilinear = interpolation != Interpolation::Nearest;
    match op {
        Op::Identity => {}
        Op::ShearX | Op::ShearY => {
            let deg = magnitude.atan() * (180.0 / std::f64::consts::PI);
            let shear = if op == Op::ShearX {
                [deg, 0.0]
            } else {
                [0.0, deg]
            };
            // center=[0, 0]: the top-left corner, in coordinates centred on the image.
            let center = [-(img.width as f64) * 0.5, -(img.height as f64) * 0.5];
            let m = inverse_affine(center, 0.0, [0.0, 0.0], 1.0, shear);
            warp(img, &m, bilinear, Fill::Zeros, scratch);
        }
        Op::TranslateX | Op::TranslateY => {
            // int(magnitude): toward zero.
            let t = magnitude.trunc();
            let translate = if op == Op::TranslateX {
                [t, 0.0]
            } else {
                [0.0, t]
            };
            let m = inverse_affine([0.0, 0.0], 0.0, translate, 1.0, [0.0, 0.0]);
            warp(img, &m, bilinear, Fill::Zeros, scratch);
        }
        Op::Rotate => rotate(img, magnitude, bilinear, Fill::Zeros, scratch),
        Op::Brightness => brightness(img, 1.0 + magnitude),
        Op::Color => saturation(img, 1.0 + magnitude),
        Op::Contrast => contrast(img, 1.0 + magnitude),
        Op::Sharpness => sharpness(img, 1.0 + magnitude, scratch),
        Op::Posterize => posterize(img, magnitude as u32),
        Op::Solarize => solarize(img, 255.0 * magnitude),
        Op::AutoContrast => autocontrast(img),
        Op::Equalize => equalize(img),
        Op::Invert => img.data.iter_mut().for_each(|v| *v = !*v),
    }
}

/// `_get_inverse_affine_matrix(center, angle, translate, scale, shear)`, operation for
/// operation in f64 (Python's floats): the map from output to input pixel coordinates, both
/// centred on the image.
pub fn inverse_affine(
    center: [f64; 2],
    angle: f64,
    translate: [f64; 2],
    scale: f64,
    shear: [f64; 2],
) -> [f64; 6] {
    let rad = |d: f64| d * (std::f64::consts::PI / 180.0);
    let (rot, sx, sy) = (rad(angle), rad(shear[0]), rad(shear[1]));
    let [cx, cy] = center;
    let [tx, ty] = translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let (cx_plus_tx, cy_plus_ty) = (cx + tx, cy + ty);
    let a = rot_minus_sy.cos() / cos_sy;
    let b = -(a * tan_sx + rot.sin());
    let c = rot_minus_sy.sin() / cos_sy;
    let d = rot.cos() - c * tan_sx;
    let mut m = [d / scale, -b / scale, 0.0, -c / scale, a / scale, 0.0];
    m[2] += cx - m[0] * cx_plus_tx - m[1] * cy_plus_ty;
    m[5] += cy - m[3] * cx_plus_tx - m[4] * cy_plus_ty;
    m
}

/// What `_apply_grid_transform` does outside the image: `fill=None` (the auto-augment ops):
/// `grid_sample`'s zero padding alone; `fill=0` (RandomRotation's, RandomAffine's and
/// RandomPerspective's default): a mask channel of ones resampled with the image, each value
/// times it (bilinear; nearest: the same as zeros).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fill {
    Zeros,
    Masked,
}

/// `rotate_image(angle, expand=False, center=None, fill)`: the angle taken modulo 360 as Python's
/// `%`; 0 and 180 degrees (and 90, 270 on square images) as exact transposes, as torchvision's
/// fast paths; otherwise the affine warp about the centre by -angle.
pub fn rotate(img: &mut Rgb8, angle: f64, bilinear: bool, fill: Fill, scratch: &mut Vec<u8>) {
    let mut angle = angle % 360.0;
    if angle != 0.0 && angle < 0.0 {
        angle += 360.0;
    }
    let square = img.width == img.height;
    let quarter_turns = match angle {
        a if a == 0.0 => Some(0),
        a if a == 180.0 => Some(2),
        a if a == 90.0 && square => Some(1),
        a if a == 270.0 && square => Some(3),
        _ => None,
    };
    if let Some(k) = quarter_turns {
        rot90(img, k, scratch);
        return;
    }
    let m = inverse_affine([0.0, 0.0], -angle, [0.0, 0.0], 1.0, [0.0, 0.0]);
    warp(img, &m, bilinear, fill, scratch);
}

/// `torch.rot90(img, k, dims=(-2, -1))` of a square image (or k = 0, 2 of any image):
/// counter-clockwise quarter turns.
fn rot90(img: &mut Rgb8, k: u32, scratch: &mut Vec<u8>) {
    let (w, h) = (img.width, img.height);
    if k == 0 {
        return;
    }
    scratch.clear();
    scratch.resize(img.data.len(), 0);
    for y in 0..h {
        for x in 0..w {
            // out[y][x] = in[sy][sx]
            let (sy, sx) = match k {
                1 => (x, w - 1 - y),
                2 => (h - 1 - y, w - 1 - x),
                _ => (h - 1 - x, y),
            };
            let (o, i) = ((y * w + x) * 3, (sy * w + sx) * 3);
            scratch[o..o + 3].copy_from_slice(&img.data[i..i + 3]);
        }
    }
    std::mem::swap(&mut img.data, scratch);
}

/// `_affine_grid` + `_apply_grid_transform`: the matrix as f32 `theta`, divided by the half
/// sizes; each output pixel's grid point `x·t0 + y·t1 + t2` (f32, the product sum fused as the
/// BLAS kernel does), then `grid_sample` (`sample`).
pub fn warp(img: &mut Rgb8, m: &[f64; 6], bilinear: bool, fill: Fill, scratch: &mut Vec<u8>) {
    let (w, h) = (img.width, img.height);
    let (hw, hh) = ((0.5 * w as f64) as f32, (0.5 * h as f64) as f32);
    let t: [f32; 6] = m.map(|v| v as f32);
    // rescaled_theta = theta^T / [0.5 w, 0.5 h]
    let (rx, ry) = (
        [t[0] / hw, t[1] / hw, t[2] / hw],
        [t[3] / hh, t[4] / hh, t[5] / hh],
    );
    let grid = |ox: usize, oy: usize| {
        let yc = (1.0 - h as f32) * 0.5 + oy as f32;
        let xc = (1.0 - w as f32) * 0.5 + ox as f32;
        let gx = yc.mul_add(rx[1], xc * rx[0]) + rx[2];
        let gy = yc.mul_add(ry[1], xc * ry[0]) + ry[2];
        (gx, gy)
    };
    sample(img, grid, bilinear, fill, scratch);
}

/// `grid_sample(align_corners=False, padding_mode="zeros")` at each output pixel's grid point
/// `grid(x, y)` (normalised to [-1, 1]): source coordinate `(g + 1)·size/2 - 0.5`; nearest
/// (rounded half to even) or bilinear (`GridSamplerKernel`'s weights, its four weighted corners
/// summed in order), with `fill` (`Fill`), then rounded half to even to `uint8`. The
/// multiply-adds are fused where torch's x86 kernels (AVX2 and AVX-512 builds) fuse them, which
/// makes the result torchvision's bit for bit.
pub fn sample(
    img: &mut Rgb8,
    grid: impl Fn(usize, usize) -> (f32, f32),
    bilinear: bool,
    fill: Fill,
    scratch: &mut Vec<u8>,
) {
    let (w, h) = (img.width, img.height);
    let (scale_x, scale_y) = (w as f32 / 2.0, h as f32 / 2.0);
    scratch.clear();
    scratch.resize(img.data.len(), 0);
    let src = &img.data;
    let pixel = |x: i64, y: i64| -> Option<&[u8]> {
        (x >= 0 && y >= 0 && (x as usize) < w && (y as usize) < h).then(|| {
            let i = (y as usize * w + x as usize) * 3;
            &src[i..i + 3]
        })
    };
    for oy in 0..h {
        for ox in 0..w {
            let (gx, gy) = grid(ox, oy);
            // unnormalize: (g + 1)·size/2 - 0.5, fused as torch's kernel is compiled.
            let ix = (gx + 1.0).mul_add(scale_x, -0.5);
            let iy = (gy + 1.0).mul_add(scale_y, -0.5);
            let o = (oy * w + ox) * 3;
            let out = &mut scratch[o..o + 3];
            if !bilinear {
                let (nx, ny) = (ix.round_ties_even() as i64, iy.round_ties_even() as i64);
                match pixel(nx, ny) {
                    Some(p) => out.copy_from_slice(p),
                    None => out.fill(0),
                }
                continue;
            }
            let (x0, y0) = (ix.floor(), iy.floor());
            let (dw, dn) = (ix - x0, iy - y0);
            let (de, ds) = (1.0 - dw, 1.0 - dn);
            let (nw, ne, sw, se) = (ds * de, ds * dw, dn * de, dn * dw);
            let (x0, y0) = (x0 as i64, y0 as i64);
            let corners = [
                (pixel(x0, y0), nw),
                (pixel(x0 + 1, y0), ne),
                (pixel(x0, y0 + 1), sw),
                (pixel(x0 + 1, y0 + 1), se),
            ];
            // The mask channel: ones resampled alike (`Fill::Masked` only).
            let mut mask = 0.0f32;
            if fill == Fill::Masked {
                for (p, wt) in corners {
                    mask = p.map_or(0.0f32, |_| 1.0).mul_add(wt, mask);
                }
            }
            for (c, v) in out.iter_mut().enumerate() {
                let mut acc = 0.0f32;
                for (p, wt) in corners {
                    acc = p.map_or(0.0, |p| f32::from(p[c])).mul_add(wt, acc);
                }
                if fill == Fill::Masked {
                    acc *= mask;
                }
                *v = acc.round_ties_even().clamp(0.0, 255.0) as u8;
            }
        }
    }
    std::mem::swap(&mut img.data, scratch);
}

/// `adjust_brightness_image`: `x·f`, clamped to [0, 255], truncated.
pub fn brightness(img: &mut Rgb8, factor: f64) {
    let f = factor as f32;
    for v in img.data.iter_mut() {
        *v = (f32::from(*v) * f).clamp(0.0, 255.0) as u8;
    }
}

/// `_rgb_to_grayscale_image(preserve_dtype=False)` floored: `0.2989 r + 0.587 g + 0.114 b`,
/// the two adds fused as torch's `add_(alpha=...)`.
pub fn gray(p: &[u8]) -> f32 {
    let r = f32::from(p[0]) * 0.2989f32;
    let rg = f32::from(p[1]).mul_add(0.587f32, r);
    f32::from(p[2]).mul_add(0.114f32, rg).floor()
}

/// `_blend(x, other, ratio)` for uint8: `x·ratio + other·(1 - ratio)` (fused), clamped,
/// truncated.
fn blend(x: u8, other: f32, ratio: f32, rest: f32) -> u8 {
    other.mul_add(rest, f32::from(x) * ratio).clamp(0.0, 255.0) as u8
}

/// `adjust_saturation_image`: each pixel blended with its floored grey.
pub fn saturation(img: &mut Rgb8, factor: f64) {
    let (ratio, rest) = (factor as f32, (1.0 - factor) as f32);
    for p in img.data.chunks_exact_mut(3) {
        let g = gray(p);
        for v in p.iter_mut() {
            *v = blend(*v, g, ratio, rest);
        }
    }
}

/// `adjust_contrast_image`: each sample blended with the mean of the floored grey image (the
/// sum is exact below 2^24, as torch's float32 sum of integers; its mean a float32 division).
pub fn contrast(img: &mut Rgb8, factor: f64) {
    let sum: u64 = img.data.chunks_exact(3).map(|p| gray(p) as u64).sum();
    let n = (img.data.len() / 3).max(1);
    let mean = sum as f32 / n as f32;
    let (ratio, rest) = (factor as f32, (1.0 - factor) as f32);
    for v in img.data.iter_mut() {
        *v = blend(*v, mean, ratio, rest);
    }
}

/// `adjust_sharpness_image`: the interior blended with the 3×3 blur (1s around a 5, over 13),
/// rounded half to even (exact here: a sum over 13 never ends in .5); the border unchanged;
/// images of side 2 or less unchanged.
fn sharpness(img: &mut Rgb8, factor: f64, scratch: &mut Vec<u8>) {
    let (w, h) = (img.width, img.height);
    if w <= 2 || h <= 2 {
        return;
    }
    let alpha = (1.0 - factor) as f32;
    scratch.clear();
    scratch.extend_from_slice(&img.data);
    let src = &scratch[..];
    for y in 1..h - 1 {
        for x in 1..w - 1 {
            for c in 0..3 {
                let at = |yy: usize, xx: usize| u32::from(src[(yy * w + xx) * 3 + c]);
                let mut s = 0;
                for yy in y - 1..=y + 1 {
                    for xx in x - 1..=x + 1 {
                        s += at(yy, xx);
                    }
                }
                let centre = at(y, x);
                let n = s + 4 * centre;
                let (q, r) = (n / 13, n % 13);
                let blurred = q + u32::from(2 * r > 13);
                let v = f32::from(centre as u8);
                let out = (blurred as f32 - v).mul_add(alpha, v);
                img.data[(y * w + x) * 3 + c] = out.clamp(0.0, 255.0) as u8;
            }
        }
    }
}

/// `posterize_image`: the top `bits` bits kept (8 or more: unchanged; 0: black).
fn posterize(img: &mut Rgb8, bits: u32) {
    if bits >= 8 {
        return;
    }
    let mask = (((1u32 << bits) - 1) << (8 - bits)) as u8;
    img.data.iter_mut().for_each(|v| *v &= mask);
}

/// `solarize_image`: samples at or above the threshold inverted (compared in float32).
fn solarize(img: &mut Rgb8, threshold: f64) {
    let t = threshold as f32;
    for v in img.data.iter_mut() {
        if f32::from(*v) >= t {
            *v = !*v;
        }
    }
}

/// `autocontrast_image`: each channel stretched from its [min, max] to [0, 255] in float32
/// (`(x - min) / ((max - min)·(1/255))`, truncated); a flat channel unchanged.
fn autocontrast(img: &mut Rgb8) {
    for c in 0..3 {
        let channel = img.data.iter().skip(c).step_by(3);
        let (lo, hi) = channel.fold((255u8, 0u8), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if lo == hi {
            continue;
        }
        let min = f32::from(lo);
        let inv_scale = (f32::from(hi) - min) * (1.0f64 / 255.0) as f32;
        for v in img.data.iter_mut().skip(c).step_by(3) {
            *v = ((f32::from(*v) - min) / inv_scale).clamp(0.0, 255.0) as u8;
        }
    }
}

/// `equalize_image` (PIL's scheme): per channel, `step = (pixels - count of the largest
/// value) // 255`; `lut[k] = (cdf[k-1] + step // 2) // step`, clamped; a channel with step 0
/// unchanged.
fn equalize(img: &mut Rgb8) {
    let n = img.data.len() / 3;
    for c in 0..3 {
        let mut hist = [0u64; 256];
        for &v in img.data.iter().skip(c).step_by(3) {
            hist[v as usize] += 1;
        }
        let last = hist.iter().rposition(|&k| k > 0).unwrap_or(0);
        let step = (n as u64 - hist[last]) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut cum = 0u64;
        for k in 1..256 {
            cum += hist[k - 1];
            lut[k] = ((cum + step / 2) / step).min(255) as u8;
        }
        for v in img.data.iter_mut().skip(c).step_by(3) {
            *v = lut[*v as usize];
        }
    }
}
