//! The designer's transforms that the auto-augment ops do not already compute, on 8-bit RGB
//! images as `torchvision.transforms.v2.functional` computes them on `uint8` tensors (0.26):
//! `vertical_flip`, `rgb_to_grayscale(num_output_channels=3)`, `adjust_hue` (torch's float32
//! HSV round trip), `pad` (constant 0, edge, reflect, symmetric), and `perspective` (its
//! coefficients solved in f64 and kept as float32, its grid in float32). Pure: no RNG.
use crate::auto_augment::{gray, sample, Fill, Rgb8};
use tchrun::transform_flags::PadMode;

/// `vertical_flip_image`: the rows in reverse order.
pub fn vflip(img: &mut Rgb8) {
    let row = img.width * 3;
    let h = img.height;
    for y in 0..h / 2 {
        let (top, bottom) = img.data.split_at_mut((h - 1 - y) * row);
        top[y * row..(y + 1) * row].swap_with_slice(&mut bottom[..row]);
    }
}

/// `rgb_to_grayscale_image(num_output_channels=3)`: `0.2989 r + 0.587 g + 0.114 b` in float32,
/// truncated to `uint8`, in every channel.
pub fn grayscale(img: &mut Rgb8) {
    for p in img.data.chunks_exact_mut(3) {
        p.fill(gray(p) as u8);
    }
}

/// `adjust_hue_image(hue_factor)`: the image to float32 (`x · (1/255)`), to HSV as
/// `_rgb_to_hsv`, the hue shifted by `factor` and taken modulo 1 (`remainder`), back to RGB as
/// `_hsv_to_rgb`, and to `uint8` as `to_dtype_image` (`x · 255.999`, truncated), every step in
/// float32 as torch's kernels.
pub fn adjust_hue(img: &mut Rgb8, factor: f64) {
    let shift = factor as f32;
    let inv = (1.0f64 / 255.0) as f32;
    let up = (255.0f64 + 1.0 - 1e-3) as f32;
    for p in img.data.chunks_exact_mut(3) {
        let [r, g, b] = [p[0], p[1], p[2]].map(|v| f32::from(v) * inv);
        let (h, s, v) = rgb_to_hsv(r, g, b);
        let h = remainder1(h + shift);
        let rgb = hsv_to_rgb(h, s, v);
        for (o, x) in p.iter_mut().zip(rgb) {
            *o = (x * up) as u8;
        }
    }
}

/// torch's float `remainder(x, 1)`: `fmod`, plus 1 when negative.
fn remainder1(x: f32) -> f32 {
    let m = x % 1.0;
    if m < 0.0 {
        m + 1.0
    } else {
        m
    }
}

/// `_rgb_to_hsv` for one pixel, operation for operation in float32.
fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let eqc = maxc == minc;
    let range = maxc - minc;
    let s = range / if eqc { 1.0 } else { maxc };
    let div = if eqc { 1.0 } else { range };
    let (rc, gc, bc) = ((maxc - r) / div, (maxc - g) / div, (maxc - b) / div);
    let (neq_r, eq_g) = (maxc != r, maxc == g);
    let on = |c: bool| if c { 1.0f32 } else { 0.0 };
    let hg = (rc + 2.0 - bc) * on(eq_g && neq_r);
    let hr = (bc - gc) * on(!neq_r);
    let hb = (gc + 4.0 - rc) * on(neq_r && !eq_g);
    let h = hr + hg + hb;
    let h = (h * (1.0f64 / 6.0) as f32 + 1.0) % 1.0;
    (h, s, maxc)
}

/// `_hsv_to_rgb` for one pixel, operation for operation in float32.
fn hsv_to_rgb(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h6 = h * 6.0;
    let i = h6.floor();
    let f = h6 - i;
    let i = (i as i32).rem_euclid(6);
    let sxf = s * f;
    let one_minus_s = 1.0 - s;
    let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
    let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
    let p = (one_minus_s * v).clamp(0.0, 1.0);
    match i {
        0 => [v, t, p],
        1 => [q, v, p],
        2 => [p, v, t],
        3 => [p, q, v],
        4 => [t, p, v],
        _ => [v, p, q],
    }
}

/// The source index of padded index `i` (may be negative or past the end) of a side of `n`
/// pixels; `None`: the constant fill. Reflect and symmetric mirror again past a whole side
/// (torch refuses a reflect pad of a side or more; within it, the same indices).
fn source_index(i: i64, n: i64, mode: PadMode) -> Option<usize> {
    if (0..n).contains(&i) {
        return Some(i as usize);
    }
    let k = match mode {
        PadMode::Constant => return None,
        PadMode::Edge => i.clamp(0, n - 1),
        PadMode::Reflect if n == 1 => 0,
        PadMode::Reflect => {
            let period = 2 * (n - 1);
            let k = i.rem_euclid(period);
            if k >= n {
                period - k
            } else {
                k
            }
        }
        PadMode::Symmetric => {
            let k = i.rem_euclid(2 * n);
            if k >= n {
                2 * n - 1 - k
            } else {
                k
            }
        }
    };
    Some(k as usize)
}

/// `pad_image(padding=[left, top, right, bottom], fill=0, padding_mode)` of the `w` x `h` RGB8
/// image `src` into `out`; returns the new width and height.
pub fn pad(
    (w, h, src): (usize, usize, &[u8]),
    [left, top, right, bottom]: [usize; 4],
    mode: PadMode,
    out: &mut Vec<u8>,
) -> (usize, usize) {
    let (nw, nh) = (w + left + right, h + top + bottom);
    out.clear();
    out.resize(nw * nh * 3, 0);
    let cols: Vec<Option<usize>> = (0..nw)
        .map(|x| source_index(x as i64 - left as i64, w as i64, mode))
        .collect();
    for y in 0..nh {
        let Some(sy) = source_index(y as i64 - top as i64, h as i64, mode) else {
            continue;
        };
        let row = &src[sy * w * 3..(sy + 1) * w * 3];
        let dst = &mut out[y * nw * 3..(y + 1) * nw * 3];
        for (x, sx) in cols.iter().enumerate() {
            if let Some(sx) = sx {
                dst[x * 3..x * 3 + 3].copy_from_slice(&row[sx * 3..sx * 3 + 3]);
            }
        }
    }
    (nw, nh)
}

/// `_get_perspective_coeffs(startpoints, endpoints)`: the eight coefficients mapping output to
/// input pixels, the 8 x 8 system solved in f64 (Gaussian elimination with partial pivoting;
/// torchvision's least squares of the same square system), kept as float32 as torchvision
/// keeps them.
pub fn perspective_coefficients(start: [[i64; 2]; 4], end: [[i64; 2]; 4]) -> [f32; 8] {
    let mut a = [[0f64; 9]; 8];
    for (i, (p1, p2)) in end.iter().zip(&start).enumerate() {
        let (x1, y1) = (p1[0] as f64, p1[1] as f64);
        let (x2, y2) = (p2[0] as f64, p2[1] as f64);
        a[2 * i] = [x1, y1, 1.0, 0.0, 0.0, 0.0, -x2 * x1, -x2 * y1, x2];
        a[2 * i + 1] = [0.0, 0.0, 0.0, x1, y1, 1.0, -y2 * x1, -y2 * y1, y2];
    }
    for col in 0..8 {
        let pivot = (col..8)
            .max_by(|&i, &j| a[i][col].abs().total_cmp(&a[j][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        let d = a[col][col];
        if d == 0.0 {
            continue;
        }
        let pivot_row = a[col];
        for (r, row) in a.iter_mut().enumerate() {
            if r != col {
                let k = row[col] / d;
                for (x, p) in row.iter_mut().zip(&pivot_row).skip(col) {
                    *x -= k * p;
                }
            }
        }
    }
    std::array::from_fn(|i| {
        let d = a[i][i];
        (if d == 0.0 { 0.0 } else { a[i][8] / d }) as f32
    })
}

/// `perspective_image(coefficients, interpolation, fill=0)`: `_perspective_grid` in float32
/// (pixel centres `x + 0.5`; the numerators' coefficients divided by the half sizes; each grid
/// point `num / den - 1`, the product sums fused as the BLAS kernel does), then `grid_sample`
/// with the fill's mask (`sample`).
pub fn perspective(img: &mut Rgb8, c: [f32; 8], bilinear: bool, scratch: &mut Vec<u8>) {
    let (ow, oh) = (img.width, img.height);
    let (hw, hh) = ((0.5 * ow as f64) as f32, (0.5 * oh as f64) as f32);
    let (rx, ry) = (
        [c[0] / hw, c[1] / hw, c[2] / hw],
        [c[3] / hh, c[4] / hh, c[5] / hh],
    );
    let grid = |ox: usize, oy: usize| {
        let (x, y) = (ox as f32 + 0.5, oy as f32 + 0.5);
        let gx = y.mul_add(rx[1], x * rx[0]) + rx[2];
        let gy = y.mul_add(ry[1], x * ry[0]) + ry[2];
        let den = y.mul_add(c[7], x * c[6]) + 1.0;
        (gx / den - 1.0, gy / den - 1.0)
    };
    sample(img, grid, bilinear, Fill::Masked, scratch);
}
