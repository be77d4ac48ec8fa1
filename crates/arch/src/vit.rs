//! The Vision Transformer (`vit_b_16`, `vit_b_32`, `vit_l_16`) as torchvision builds it: its
//! `state_dict` layout for an image size (the positional embedding has one position per patch
//! and one for the class token), the input-size rule (whole patches only), and torchvision's
//! `interpolate_embeddings` (a checkpoint's positional embedding resampled for another image
//! size), in plain Rust so that `model init` runs it without libtorch.
use safetensors::{Dtype, SafeTensors};

/// torchvision's `image_size` default (`_vision_transformer`'s `kwargs.pop("image_size", 224)`).
pub const DEFAULT_IMAGE_SIZE: u32 = 224;

/// The positional embedding's name in a `state_dict`.
pub const POS_EMBEDDING: &str = "encoder.pos_embedding";

/// A ViT's numbers (`VisionTransformer(image_size, patch_size, num_layers, num_heads,
/// hidden_dim, mlp_dim)`), as `Family::Vit` holds them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VitShape {
    pub patch: usize,
    pub layers: usize,
    pub hidden: usize,
    pub mlp: usize,
}

impl VitShape {
    /// A ViT family's numbers; `None` for the other families.
    pub fn of(family: super::Family) -> Option<VitShape> {
        match family {
            super::Family::Vit {
                patch,
                layers,
                hidden,
                mlp,
                ..
            } => Some(VitShape {
                patch,
                layers,
                hidden,
                mlp,
            }),
            _ => None,
        }
    }
}

/// torchvision's `VisionTransformer` `state_dict` at `image_size`: `class_token`, `conv_proj`
/// (the patch projection), `encoder.pos_embedding` `[1, (s/p)² + 1, hidden]`, each
/// `encoder.layers.encoder_layer_{i}` (`ln_1`, `self_attention`'s packed `in_proj` and its
/// `out_proj`, `ln_2`, the MLP's Linears `mlp.0` and `mlp.3`), `encoder.ln`, and the head
/// `heads.head` (no representation layer in `vit_b_16`, `vit_b_32`, `vit_l_16`).
pub fn spec(out: &mut Vec<(String, Vec<usize>)>, v: VitShape, classes: usize, image_size: u32) {
    let h = v.hidden;
    let grid = image_size as usize / v.patch;
    out.push(("class_token".into(), vec![1, 1, h]));
    let mut wb = |name: String, weight: Vec<usize>, c: usize| {
        out.push((format!("{name}.weight"), weight));
        out.push((format!("{name}.bias"), vec![c]));
    };
    wb("conv_proj".into(), vec![h, 3, v.patch, v.patch], h);
    out.push((POS_EMBEDDING.into(), vec![1, grid * grid + 1, h]));
    for i in 0..v.layers {
        let p = format!("encoder.layers.encoder_layer_{i}");
        let mut wb = |name: &str, weight: Vec<usize>, c: usize| {
            out.push((format!("{p}.{name}weight"), weight));
            out.push((format!("{p}.{name}bias"), vec![c]));
        };
        wb("ln_1.", vec![h], h);
        // torch names the packed projection `in_proj_weight`, `in_proj_bias`.
        wb("self_attention.in_proj_", vec![3 * h, h], 3 * h);
        wb("self_attention.out_proj.", vec![h, h], h);
        wb("ln_2.", vec![h], h);
        wb("mlp.0.", vec![v.mlp, h], v.mlp);
        wb("mlp.3.", vec![h, v.mlp], h);
    }
    for (name, shape) in [
        ("encoder.ln.weight", vec![h]),
        ("encoder.ln.bias", vec![h]),
        ("heads.head.weight", vec![classes, h]),
        ("heads.head.bias", vec![classes]),
    ] {
        out.push((name.into(), shape));
    }
}

/// The side of the patch grid a positional embedding of `positions` positions holds (one is
/// the class token's), when the rest is a square.
pub fn grid_of(positions: usize) -> Option<usize> {
    let n = positions.checked_sub(1)?;
    let g = (n as f64).sqrt().round() as usize;
    (g * g == n && g > 0).then_some(g)
}

/// The image size a ViT checkpoint was built for, from its positional embedding's shape
/// (`None`: the file has none, the spec check names it); a length that is no square grid plus
/// the class token is refused as torchvision's `interpolate_embeddings` refuses it.
pub fn checkpoint_image_size(patch: usize, pos: Option<&[usize]>) -> Result<Option<u32>, String> {
    let Some(shape) = pos else {
        return Ok(None);
    };
    let positions = shape.get(1).copied().unwrap_or(0);
    match grid_of(positions) {
        Some(g) => Ok(Some((g * patch) as u32)),
        None => Err(format!(
            "tensor '{POS_EMBEDDING}' has shape {shape:?}: {positions} positions are not a \
             square grid of patches plus the class token"
        )),
    }
}

/// torch's cubic convolution weights (`get_cubic_upsample_coefficients`, A = -0.75) at
/// fraction `t`.
fn cubic_weights(t: f32) -> [f32; 4] {
    const A: f32 = -0.75;
    let near = |x: f32| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let far = |x: f32| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    [far(t + 1.0), near(t), near(1.0 - t), far(2.0 - t)]
}

/// For each output index along one axis, the four source indices (clamped to the edge, as
/// torch reads them) and their weights: `F.interpolate(mode="bicubic", align_corners=True)`,
/// whose source coordinate is `dst * (from - 1) / (to - 1)` in float.
fn axis(from: usize, to: usize) -> Vec<([usize; 4], [f32; 4])> {
    let scale = if to > 1 {
        (from - 1) as f32 / (to - 1) as f32
    } else {
        0.0
    };
    (0..to)
        .map(|d| {
            let real = scale * d as f32;
            let i = real.floor();
            let t = (real - i).clamp(0.0, 1.0);
            let i = i as i64;
            let at = |k: i64| (i - 1 + k).clamp(0, from as i64 - 1) as usize;
            ([at(0), at(1), at(2), at(3)], cubic_weights(t))
        })
        .collect()
}

/// torchvision's `interpolate_embeddings`: the positional embedding `pos` (`[1, from² + 1,
/// hidden]`, row-major) for a `to` x `to` patch grid: the class token's position kept, the
/// patches' resampled as a `hidden`-channel image by bicubic interpolation with
/// `align_corners=True`, along the width first, then the height.
pub fn interpolate(pos: &[f32], hidden: usize, from: usize, to: usize) -> Vec<f32> {
    let at = |y: usize, x: usize, c: usize| pos[(1 + y * from + x) * hidden + c];
    let (ax, mut out) = (axis(from, to), Vec::with_capacity((to * to + 1) * hidden));
    out.extend_from_slice(&pos[..hidden]);
    // Width: (from rows) x (to columns) x hidden.
    let mut rows = vec![0f32; from * to * hidden];
    for y in 0..from {
        for (x, (idx, w)) in ax.iter().enumerate() {
            for c in 0..hidden {
                rows[(y * to + x) * hidden + c] = w[0] * at(y, idx[0], c)
                    + w[1] * at(y, idx[1], c)
                    + w[2] * at(y, idx[2], c)
                    + w[3] * at(y, idx[3], c);
            }
        }
    }
    let row = |y: usize, x: usize, c: usize| rows[(y * to + x) * hidden + c];
    for (idx, w) in &ax {
        for x in 0..to {
            for c in 0..hidden {
                out.push(
                    w[0] * row(idx[0], x, c)
                        + w[1] * row(idx[1], x, c)
                        + w[2] * row(idx[2], x, c)
                        + w[3] * row(idx[3], x, c),
                );
            }
        }
    }
    out
}

/// A safetensors `state_dict` with its positional embedding resampled for a `to` x `to` patch
/// grid (`interpolate`), every other tensor as it was. The embedding is read as float32 or
/// float64 and written as float32.
pub fn resample_safetensors(bytes: &[u8], to: usize) -> Result<Vec<u8>, String> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| format!("cannot read it: {e:?}"))?;
    let view = st
        .tensor(POS_EMBEDDING)
        .map_err(|_| format!("it lacks '{POS_EMBEDDING}'"))?;
    let shape = view.shape().to_vec();
    let (positions, hidden) = (shape[1], shape[2]);
    let from = grid_of(positions).ok_or_else(|| format!("'{POS_EMBEDDING}' is no square grid"))?;
    let pos: Vec<f32> = match view.dtype() {
        Dtype::F32 => view
            .data()
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        Dtype::F64 => view
            .data()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32)
            .collect(),
        other => {
            return Err(format!(
                "'{POS_EMBEDDING}' is {other:?}; tchrun resamples a float32 or float64 \
                 positional embedding: save the state_dict in float32 \
                 ({{k: v.float() for k, v in sd.items()}})"
            ))
        }
    };
    let new: Vec<u8> = interpolate(&pos, hidden, from, to)
        .iter()
        .flat_map(|v| v.to_le_bytes())
        .collect();
    let mut new_view = Some(
        safetensors::tensor::TensorView::new(Dtype::F32, vec![1, to * to + 1, hidden], &new)
            .map_err(|e| format!("cannot write '{POS_EMBEDDING}': {e:?}"))?,
    );
    let tensors = st.tensors().into_iter().map(|(name, v)| {
        let v = match new_view.take() {
            Some(resampled) if name == POS_EMBEDDING => resampled,
            other => {
                new_view = other;
                v
            }
        };
        (name, v)
    });
    safetensors::serialize(tensors, &None).map_err(|e| format!("cannot write it: {e:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_are_squares_plus_the_class_token() {
        assert_eq!(grid_of(197), Some(14));
        assert_eq!(grid_of(5), Some(2));
        assert_eq!(grid_of(2), Some(1));
        assert_eq!(grid_of(1), None);
        assert_eq!(grid_of(196), None);
        assert_eq!(
            checkpoint_image_size(16, Some(&[1, 197, 768])),
            Ok(Some(224))
        );
        assert!(checkpoint_image_size(16, Some(&[1, 196, 768]))
            .unwrap_err()
            .contains("196 positions are not a square grid"));
    }

    /// The same grid is the identity; a constant embedding stays constant (the weights sum to
    /// 1); the class token is kept.
    #[test]
    fn interpolation_keeps_the_class_token_and_constants() {
        let pos: Vec<f32> = (0..(10 * 2)).map(|i| i as f32).collect();
        assert_eq!(interpolate(&pos, 2, 3, 3), pos);
        let flat = vec![0.5f32; 5 * 3];
        let up = interpolate(&flat, 3, 2, 7);
        assert_eq!(up.len(), 50 * 3);
        assert!(up.iter().all(|v| (v - 0.5).abs() < 1e-6), "{up:?}");
        let mut tok = flat.clone();
        tok[..3].copy_from_slice(&[9.0, 8.0, 7.0]);
        assert_eq!(
            &interpolate(&tok, 3, 2, 1)[..6],
            &[9.0, 8.0, 7.0, 0.5, 0.5, 0.5]
        );
    }
}
