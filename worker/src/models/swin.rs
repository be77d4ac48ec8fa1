//! The Swin Transformer as torchvision builds it (`torchvision.models.swin_transformer.
//! SwinTransformer`, V1): the same tensors, names and arithmetic, on (N, H, W, C) feature maps.
//! `features.0` cuts the image into 4x4 patches (a convolution of that kernel and stride, then
//! LayerNorm); the odd `features.N` are the stages of `SwinTransformerBlock`s (`norm1`, windowed
//! multi-head self-attention with a relative position bias, every second block on windows
//! shifted by 3, stochastic depth in "row" mode, the residual; `norm2`, the MLP `mlp.0` → exact
//! GELU → `mlp.3`, stochastic depth, the residual), the even ones `PatchMerging` (the 2x2
//! neighbours concatenated, an odd side padded, LayerNorm, `reduction`); then `norm`, the
//! average pool and the head `head`. The attention is torchvision's `shifted_window_attention`
//! written out: the map padded at the bottom and right to whole 7x7 windows (the padding's
//! zeros attend and are attended, as there), rolled by -3 for a shifted block, the windows'
//! tokens projected by `qkv`, q scaled by 1/√d, q·kᵀ plus the bias table's rows for each pair's
//! offset (`arch::swin::relative_position_index`), plus -100 between tokens of different
//! regions of a shifted map (`arch::swin::shift_mask`), softmax, ·v, `proj`, the windows put
//! back, rolled back and cropped. No dropout (torchvision's 0). Every LayerNorm has eps 1e-5.
//! From scratch, initialised as torchvision does (`SwinTransformer.__init__` last: every Linear
//! trunc-normal 0.02 with bias 0; the bias tables trunc-normal 0.02; the patch convolution
//! `nn.Conv2d`'s default).
use super::blocks::stochastic_depth;
use super::init;
use std::sync::Mutex;
use tch::{nn, nn::Init, nn::ModuleT, Device, Kind, Tensor};
use tchrun::arch::swin::{self, SwinShape, EPS, MLP_RATIO, PATCH, WINDOW};
use tchrun::model::Family;

fn layer_norm(p: nn::Path, c: i64) -> nn::LayerNorm {
    let cfg = nn::LayerNormConfig {
        eps: EPS,
        ..Default::default()
    };
    nn::layer_norm(p, vec![c], cfg)
}

/// A Linear as `SwinTransformer.__init__` leaves it: weight `trunc_normal_(std=0.02)` (its
/// bounds ±2 beyond reach: `init::trunc_normal`), bias 0.
fn linear(p: nn::Path, c_in: i64, c_out: i64, bias: bool) -> nn::Linear {
    let cfg = nn::LinearConfig {
        ws_init: init::trunc_normal(),
        bs_init: bias.then_some(Init::Const(0.0)),
        bias,
    };
    nn::linear(p, c_in, c_out, cfg)
}

/// A shifted-window mask, kept for the padded size and device it was made for.
type MaskCache = Mutex<Option<([i64; 2], Device, Kind, Tensor)>>;

/// torchvision's `ShiftedWindowAttention(dim, [7, 7], shift_size, num_heads)`.
struct WindowAttention {
    table: Tensor,
    index: Tensor,
    qkv: nn::Linear,
    proj: nn::Linear,
    heads: i64,
    shifted: bool,
    mask: MaskCache,
}

impl WindowAttention {
    fn new(p: nn::Path, dim: i64, heads: i64, shifted: bool) -> WindowAttention {
        let rows = swin::bias_table_rows() as i64;
        let table = p.var(
            "relative_position_bias_table",
            &[rows, heads],
            init::trunc_normal(),
        );
        let index = Tensor::from_slice(&swin::relative_position_index(WINDOW));
        WindowAttention {
            table,
            index,
            qkv: linear(&p / "qkv", dim, 3 * dim, true),
            proj: linear(&p / "proj", dim, dim, true),
            heads,
            shifted,
            mask: Mutex::new(None),
        }
    }

    /// `_get_relative_position_bias`: `[1, heads, 49, 49]`.
    fn bias(&self) -> Tensor {
        let n = (WINDOW * WINDOW) as i64;
        let index = self.index.to_device(self.table.device());
        self.table
            .index_select(0, &index)
            .view([n, n, -1])
            .permute([2, 0, 1])
            .contiguous()
            .unsqueeze(0)
    }

    /// The mask of a `padded` map shifted by `shift`, `[windows, 49, 49]` in `like`'s kind on its
    /// device (made once per size).
    fn mask(&self, padded: [i64; 2], shift: [i64; 2], like: &Tensor) -> Tensor {
        let mut cache = self.mask.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((p, d, k, m)) = cache.as_ref() {
            if *p == padded && *d == like.device() && *k == like.kind() {
                return m.shallow_clone();
            }
        }
        let u = |v: i64| v as usize;
        let values = swin::shift_mask(
            [u(padded[0]), u(padded[1])],
            WINDOW,
            [u(shift[0]), u(shift[1])],
        );
        let n = (WINDOW * WINDOW) as i64;
        let m = Tensor::from_slice(&values)
            .view([-1, n, n])
            .to_kind(like.kind())
            .to_device(like.device());
        *cache = Some((padded, like.device(), like.kind(), m.shallow_clone()));
        m
    }

    /// `shifted_window_attention` on `x` (B, H, W, C).
    fn forward(&self, input: &Tensor) -> Tensor {
        // The batch stays -1 in every view: a traced graph (`tchrun export`) keeps it dynamic.
        let (_, h, w, c) = input.size4().expect("(batch, height, width, channels)");
        let ws = WINDOW as i64;
        let along = |side: i64| {
            let (s, p) = swin::shift_and_padded(side as usize, WINDOW, self.shifted);
            (s as i64, p as i64)
        };
        let ((sh, ph), (sw, pw)) = (along(h), along(w));
        let mut x = input.constant_pad_nd([0, 0, 0, pw - w, 0, ph - h]);
        let shifted = sh + sw > 0;
        if shifted {
            x = x.roll([-sh, -sw], [1, 2]);
        }
        let (nh, nw) = (ph / ws, pw / ws);
        let (l, d) = (ws * ws, c / self.heads);
        let x = x
            .view([-1, nh, ws, nw, ws, c])
            .permute([0, 1, 3, 2, 4, 5])
            .reshape([-1, l, c]);
        let qkv = x
            .apply(&self.qkv)
            .reshape([-1, l, 3, self.heads, d])
            .permute([2, 0, 3, 1, 4]);
        let q = qkv.get(0) * (d as f64).powf(-0.5);
        let mut attn = q.matmul(&qkv.get(1).transpose(-2, -1)) + self.bias();
        if shifted {
            let mask = self.mask([ph, pw], [sh, sw], &x);
            attn = (attn.view([-1, nh * nw, self.heads, l, l]) + mask.unsqueeze(1).unsqueeze(0))
                .view([-1, self.heads, l, l]);
        }
        let x = attn
            .softmax(-1, None)
            .matmul(&qkv.get(2))
            .transpose(1, 2)
            .reshape([-1, l, c])
            .apply(&self.proj);
        let mut x = x
            .view([-1, nh, nw, ws, ws, c])
            .permute([0, 1, 3, 2, 4, 5])
            .reshape([-1, ph, pw, c]);
        if shifted {
            x = x.roll([sh, sw], [1, 2]);
        }
        x.slice(1, 0, h, 1).slice(2, 0, w, 1).contiguous()
    }
}

/// torchvision's `SwinTransformerBlock(dim, num_heads, [7, 7], shift_size,
/// stochastic_depth_prob = drop)`: shifted windows when `shifted` (the odd blocks of a stage).
fn block(p: nn::Path, dim: i64, heads: i64, shifted: bool, drop: f64) -> impl ModuleT {
    let norm1 = layer_norm(&p / "norm1", dim);
    let attn = WindowAttention::new(&p / "attn", dim, heads, shifted);
    let norm2 = layer_norm(&p / "norm2", dim);
    let hidden = MLP_RATIO as i64 * dim;
    let fc1 = linear(&p / "mlp" / "0", dim, hidden, true);
    let fc2 = linear(&p / "mlp" / "3", hidden, dim, true);
    nn::func_t(move |x, train| {
        let x = x + stochastic_depth(&attn.forward(&x.apply(&norm1)), drop, train);
        let y = x.apply(&norm2).apply(&fc1).gelu("none").apply(&fc2);
        &x + stochastic_depth(&y, drop, train)
    })
}

/// torchvision's `PatchMerging(dim)` on (B, H, W, C): `_patch_merging_pad` (an odd side padded
/// by one at the bottom or right, the four 2x2 neighbours concatenated in the order (0, 0),
/// (1, 0), (0, 1), (1, 1)), `norm` over 4C, `reduction` to 2C without bias.
fn patch_merging(p: nn::Path, dim: i64) -> impl ModuleT {
    let reduction = linear(&p / "reduction", 4 * dim, 2 * dim, false);
    let norm = layer_norm(&p / "norm", 4 * dim);
    nn::func_t(move |x, _train| {
        let (_, h, w, _) = x.size4().expect("(batch, height, width, channels)");
        let x = x.constant_pad_nd([0, 0, 0, w % 2, 0, h % 2]);
        let at = |i: i64, j: i64| x.slice(1, i, None, 2).slice(2, j, None, 2);
        Tensor::cat(&[at(0, 0), at(1, 0), at(0, 1), at(1, 1)], -1)
            .apply(&norm)
            .apply(&reduction)
    })
}

/// torchvision's `SwinTransformer` for a `Family::Swin`, with `classes` outputs;
/// `stochastic_depth: false` builds every block with drop probability 0 (the parity test's
/// training step). Panics on another family (a programming error: `models::build` picks).
pub fn swin(p: &nn::Path, family: Family, classes: i64, stochastic_depth: bool) -> impl ModuleT {
    let shape = SwinShape::of(family).expect("swin() is only called with a Swin family");
    let probs = family.stochastic_depth_probs();
    let f = p / "features";
    let embed = shape.embed as i64;
    let (patch, fan_in) = (PATCH as i64, (3 * PATCH * PATCH) as f64);
    // `nn.Conv2d`'s own initialisation (torchvision leaves it): weight and bias
    // Uniform(±1/√fan_in).
    let bound = 1.0 / fan_in.sqrt();
    let conv_cfg = nn::ConvConfig {
        stride: patch,
        bias: true,
        ws_init: init::linear(false).ws_init,
        bs_init: Init::Uniform {
            lo: -bound,
            up: bound,
        },
        ..Default::default()
    };
    let conv = nn::conv2d(&f / "0" / "0", 3, embed, patch, conv_cfg);
    let stem_norm = layer_norm(&f / "0" / "2", embed);
    let mut layers = nn::seq_t();
    let mut id = 0;
    for (s, &n) in shape.depths.iter().enumerate() {
        let dim = shape.dim(s) as i64;
        let sp = &f / (1 + 2 * s).to_string();
        for j in 0..n {
            let drop = match stochastic_depth {
                true => probs.get(id).copied().unwrap_or(0.0),
                false => 0.0,
            };
            let heads = shape.heads[s] as i64;
            layers = layers.add(block(&sp / j.to_string(), dim, heads, j % 2 == 1, drop));
            id += 1;
        }
        if s + 1 < shape.depths.len() {
            layers = layers.add(patch_merging(&f / (2 + 2 * s).to_string(), dim));
        }
    }
    let features = shape.features() as i64;
    let norm = layer_norm(p / "norm", features);
    let head = linear(p / "head", features, classes, true);
    nn::func_t(move |x, train| {
        x.apply(&conv)
            .permute([0, 2, 3, 1])
            .apply(&stem_norm)
            .apply_t(&layers, train)
            .apply(&norm)
            .permute([0, 3, 1, 2])
            .adaptive_avg_pool2d([1, 1])
            .flatten(1, -1)
            .apply(&head)
    })
}

#[cfg(test)]
mod tests {
    use tch::{nn, Device};
    use tchrun::model::Arch;

    /// Every Swin's store is `weights::spec` (the `relative_position_index` buffers aside: the
    /// worker writes them, `models::state_dict`), built on the meta device's cheap cousin: a
    /// store on the CPU without a forward.
    #[test]
    fn every_size_builds_torchvisions_state_dict() {
        for arch in [Arch::SwinT, Arch::SwinS, Arch::SwinB] {
            let vs = nn::VarStore::new(Device::Cpu);
            let _model = crate::models::build(arch, &vs.root(), 3, 32, false);
            crate::models::assert_builds_spec(&vs, arch);
        }
    }

    /// Stochastic depth is on in training, per block: a block of drop probability 0.2 (swin_t's
    /// last) with its MLP branch zeroed, on 4000 one-token maps, leaves the input as it is
    /// (the attention branch dropped) on a fraction of rows within 4.5 standard deviations of
    /// 0.2, and adds the inference-mode branch scaled by 1 / 0.8 on the others; inference mode
    /// drops nothing.
    #[test]
    fn blocks_drop_their_branches_with_their_probability_in_training() {
        use tch::{nn::ModuleT, Kind, Tensor};
        let _seed = crate::TEST_RNG.lock().unwrap_or_else(|e| e.into_inner());
        tch::manual_seed(3);
        let p = 0.2;
        let vs = nn::VarStore::new(Device::Cpu);
        let b = super::block(vs.root() / "b", 8, 2, false, p);
        tch::no_grad(|| {
            for (name, mut v) in vs.variables() {
                if name.contains("mlp.3") {
                    let _ = v.zero_();
                }
            }
        });
        let rows = 4000i64;
        let x = Tensor::randn([rows, 1, 1, 8], (Kind::Float, Device::Cpu));
        let branch = (b.forward_t(&x, false) - &x).reshape([rows, 8]);
        let got = (b.forward_t(&x, true) - &x).reshape([rows, 8]);
        let dropped = got.abs().sum_dim_intlist(1, false, Kind::Float).eq(0.0);
        let frac = dropped
            .to_kind(Kind::Float)
            .mean(Kind::Float)
            .double_value(&[]);
        let sd = (p * (1.0 - p) / rows as f64).sqrt();
        assert!((frac - p).abs() <= 4.5 * sd, "{frac} of the rows dropped");
        let kept = dropped.logical_not();
        let want = branch.index_select(0, &kept.nonzero().squeeze_dim(1)) / (1.0 - p);
        let have = got.index_select(0, &kept.nonzero().squeeze_dim(1));
        assert!(have.allclose(&want, 1e-5, 1e-6, false));
        assert!(bool::try_from(branch.abs().sum(Kind::Float).gt(0.0)).expect("bool"));
    }
}
