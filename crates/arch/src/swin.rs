//! The Swin Transformer (`swin_t`, `swin_s`, `swin_b`) as torchvision builds it: its numbers
//! (`SwinShape`), the constants its constructors fix (patch 4, window 7, MLP ratio 4, LayerNorm
//! eps 1e-5), the `relative_position_index` buffer every block's attention registers, the
//! feature-map sizes (a 4x4 patch embedding, then three `PatchMerging`s that pad odd sides) and
//! the shifted-window attention mask, in plain Rust so that the launcher checks sizes and files
//! without libtorch and the worker builds from the same numbers. Nothing here depends on the
//! input size but the feature maps: the relative position bias table is `(2·7 - 1)²` rows for
//! the window, so a checkpoint loads at any input size unchanged (torchvision pads each feature
//! map to whole windows).

/// `patch_size=[4, 4]` in every `swin_*` constructor: `features.0.0` is a 4x4 stride-4
/// convolution.
pub const PATCH: usize = 4;
/// `window_size=[7, 7]` in `swin_t`, `swin_s` and `swin_b`.
pub const WINDOW: usize = 7;
/// `SwinTransformer`'s `mlp_ratio` default: each block's MLP is `4 × dim` wide.
pub const MLP_RATIO: usize = 4;
/// `SwinTransformer`'s `norm_layer`: `partial(nn.LayerNorm, eps=1e-5)`.
pub const EPS: f64 = 1e-5;
/// The value torchvision's shifted-window mask adds to the attention logits between tokens of
/// different regions (`masked_fill(attn_mask != 0, -100.0)`).
pub const MASKED: f32 = -100.0;

/// A Swin Transformer's numbers (`SwinTransformer(patch_size, embed_dim, depths, num_heads,
/// window_size, stochastic_depth_prob)`), as `Family::Swin` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SwinShape {
    /// `embed_dim`: stage `s` works on `embed · 2^s` channels.
    pub embed: usize,
    pub depths: [usize; 4],
    pub heads: [usize; 4],
}

impl SwinShape {
    /// A Swin family's numbers; `None` for the other families.
    pub fn of(family: super::Family) -> Option<SwinShape> {
        match family {
            super::Family::Swin {
                embed,
                depths,
                heads,
                ..
            } => Some(SwinShape {
                embed,
                depths,
                heads,
            }),
            _ => None,
        }
    }

    /// Stage `s`'s channels (`embed_dim * 2 ** i_stage`).
    pub fn dim(&self, s: usize) -> usize {
        self.embed << s
    }

    /// The channels the final `norm` and the head see.
    pub fn features(&self) -> usize {
        self.dim(3)
    }
}

/// Rows of a block's `relative_position_bias_table`: one per relative offset within a window,
/// `(2·7 - 1)²`, whatever the input size.
pub const fn bias_table_rows() -> usize {
    (2 * WINDOW - 1) * (2 * WINDOW - 1)
}

/// `ShiftedWindowAttention.define_relative_position_index` for a square `window`: for each pair
/// (i, j) of the window's `window²` tokens (row-major), the row of the bias table for their
/// offset, `(dh + window - 1) · (2·window - 1) + (dw + window - 1)` with `d = coords_i -
/// coords_j`; `window⁴` values, as the `int64` buffer torchvision keeps in the `state_dict`.
pub fn relative_position_index(window: usize) -> Vec<i64> {
    let n = window * window;
    let side = 2 * window as i64 - 1;
    let w = window as i64;
    let mut out = Vec::with_capacity(n * n);
    for i in 0..n as i64 {
        for j in 0..n as i64 {
            let dh = i / w - j / w + w - 1;
            let dw = i % w - j % w + w - 1;
            out.push(dh * side + dw);
        }
    }
    out
}

/// The side of the feature map each stage sees for a square input of `input` pixels: the 4x4
/// stride-4 patch embedding (`floor(s / 4)`), then each `PatchMerging` pads an odd side by one
/// (`_patch_merging_pad`) and halves it (`ceil(s / 2)`).
pub fn stage_sides(input: u32) -> [u32; 4] {
    let first = input / PATCH as u32;
    let mut sides = [first; 4];
    for s in 1..4 {
        sides[s] = sides[s - 1].div_ceil(2);
    }
    sides
}

/// `(shift, padded side)` of a block's attention along a feature map's side of `side`, as
/// `shifted_window_attention` computes them: the map padded at the bottom and right to whole
/// windows, and no shift along a side one window covers (`window_size >= pad_H`).
pub fn shift_and_padded(side: usize, window: usize, shifted: bool) -> (usize, usize) {
    let padded = side.div_ceil(window) * window;
    let shift = if shifted && window < padded {
        window / 2
    } else {
        0
    };
    (shift, padded)
}

/// The region of each row (or column) of a `padded`-long side for the mask: torchvision labels
/// the slices `[0, -window)`, `[-window, -shift)`, `[-shift, None)` in that order, so a band
/// written later wins; with no shift along the side (`-0` is 0) the last slice is the whole side.
fn bands(padded: usize, window: usize, shift: usize) -> Vec<usize> {
    (0..padded)
        .map(|x| match x {
            _ if shift == 0 => 2,
            x if x < padded - window => 0,
            x if x < padded - shift => 1,
            _ => 2,
        })
        .collect()
}

/// torchvision's shifted-window attention mask for a `[padded_h, padded_w]` map cut into
/// `window` x `window` windows after a cyclic shift of `[shift_h, shift_w]`: `[windows,
/// window², window²]` row-major (windows and tokens row-major), 0 between two tokens of the
/// same region (three bands per shifted side, `bands`) and `MASKED` between tokens of
/// different regions.
pub fn shift_mask(padded: [usize; 2], window: usize, shift: [usize; 2]) -> Vec<f32> {
    let rows = bands(padded[0], window, shift[0]);
    let cols = bands(padded[1], window, shift[1]);
    let (per_h, per_w) = (padded[0] / window, padded[1] / window);
    let n = window * window;
    let mut out = Vec::with_capacity(per_h * per_w * n * n);
    for wh in 0..per_h {
        for ww in 0..per_w {
            let region = |t: usize| {
                let (h, w) = (wh * window + t / window, ww * window + t % window);
                rows[h] * 3 + cols[w]
            };
            for i in 0..n {
                for j in 0..n {
                    out.push(if region(i) == region(j) { 0.0 } else { MASKED });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The index torchvision's `define_relative_position_index` gives (its first row, its
    /// corners, its symmetry) and the sides of each stage.
    #[test]
    fn relative_position_index_and_sides_are_torchvisions() {
        let idx = relative_position_index(WINDOW);
        assert_eq!(idx.len(), 2401);
        // Token 0 against itself: offset (0, 0) is row 6 · 13 + 6 = 84, the table's middle.
        assert_eq!(idx[0], 84);
        // Token 0 against token 48 (6, 6): offset (-6, -6), row 0; the reverse the last row.
        assert_eq!(idx[48], 0);
        assert_eq!(idx[48 * 49], 168);
        assert_eq!(
            *idx.iter().max().expect("max"),
            bias_table_rows() as i64 - 1
        );
        assert_eq!(stage_sides(224), [56, 28, 14, 7]);
        assert_eq!(stage_sides(32), [8, 4, 2, 1]);
        assert_eq!(stage_sides(33), [8, 4, 2, 1]);
        assert_eq!(stage_sides(100), [25, 13, 7, 4]);
        assert_eq!(stage_sides(16), [4, 2, 1, 1]);
        assert_eq!(shift_and_padded(8, 7, true), (3, 14));
        assert_eq!(shift_and_padded(7, 7, true), (0, 7));
        assert_eq!(shift_and_padded(56, 7, false), (0, 56));
    }

    /// The mask of a 14 x 14 map shifted by 3: the first window is one region (all 0); the
    /// last mixes four regions, a token masked from those of the other regions only.
    #[test]
    fn shift_mask_separates_the_regions() {
        let m = shift_mask([14, 14], 7, [3, 3]);
        let n = 49;
        assert_eq!(m.len(), 4 * n * n);
        assert!(m[..n * n].iter().all(|&v| v == 0.0));
        let last = &m[3 * n * n..];
        // Tokens 0 (7, 7) and 4 (7, 11): bands (1, 1) and (1, 2); 3 (7, 10) is in (1, 1).
        assert_eq!(last[4], MASKED);
        assert_eq!(last[3], 0.0);
        // Tokens 0 and 3 · 7 + 3 = 24 (10, 10): bands (1, 1) both.
        assert_eq!(last[24], 0.0);
        assert_eq!(
            last.iter().filter(|&&v| v == 0.0).count(),
            16 * 16 + 2 * 12 * 12 + 9 * 9
        );
        // Shifted along the rows alone (a 14 x 7 map): regions by rows only.
        let m = shift_mask([14, 7], 7, [3, 0]);
        assert_eq!(m.len(), 2 * n * n);
        assert_eq!(m[n * n + 1], 0.0);
        assert_eq!(m[n * n + 4 * 7], MASKED);
    }
}
