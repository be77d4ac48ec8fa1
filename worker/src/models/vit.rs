//! The Vision Transformer as torchvision builds it (`torchvision.models.vision_transformer.
//! VisionTransformer`): the same tensors, names and arithmetic. `conv_proj` cuts the image into
//! `patch` x `patch` patches (a convolution of that kernel and stride), the class token
//! (`class_token`) goes first, `encoder.pos_embedding` is added, then `layers` encoder blocks
//! (`ln_1`, multi-head self-attention, the residual; `ln_2`, the MLP `mlp.0` → exact GELU →
//! `mlp.3`, the residual), `encoder.ln`, and the head `heads.head` on the class token. The
//! attention is torch's `nn.MultiheadAttention` written out (tch has none): the packed
//! `in_proj_weight`/`in_proj_bias` give queries, keys and values, each head's scaled dot
//! product attention (softmax of q·kᵀ/√d), the heads concatenated and `out_proj`. torchvision's
//! ViTs have dropout and attention dropout 0, so training and inference differ in nothing but
//! autograd. Every LayerNorm has eps 1e-6. From scratch, initialised as torchvision does
//! (`VisionTransformer.__init__`, `MLPBlock`, `nn.MultiheadAttention._reset_parameters`).
use super::init;
use tch::{nn, nn::Init, nn::ModuleT, Tensor};
use tchrun::model::Family;

/// torchvision's `partial(nn.LayerNorm, eps=1e-6)`.
const EPS: f64 = 1e-6;

fn layer_norm(p: nn::Path, c: i64) -> nn::LayerNorm {
    let cfg = nn::LayerNormConfig {
        eps: EPS,
        ..Default::default()
    };
    nn::layer_norm(p, vec![c], cfg)
}

/// `nn.init.xavier_uniform_` of a `[fan_out, fan_in]` weight: Uniform(±√(6 / (fan_in +
/// fan_out))).
fn xavier_uniform(fan_in: i64, fan_out: i64) -> Init {
    let b = (6.0 / (fan_in + fan_out) as f64).sqrt();
    Init::Uniform { lo: -b, up: b }
}

/// torchvision's `MLPBlock`'s Linear: xavier-uniform weight, bias N(0, 1e-6²).
fn mlp_linear(p: nn::Path, c_in: i64, c_out: i64) -> nn::Linear {
    let cfg = nn::LinearConfig {
        ws_init: xavier_uniform(c_in, c_out),
        bs_init: Some(Init::Randn {
            mean: 0.0,
            stdev: 1e-6,
        }),
        bias: true,
    };
    nn::linear(p, c_in, c_out, cfg)
}

/// torch's `nn.MultiheadAttention(hidden, heads, batch_first=True)` on `x` as query, key and
/// value (no mask, no dropout): `in_proj` is `[3 * hidden, hidden]`, queries, keys, values in
/// that order; each of `heads` heads attends over `hidden / heads` channels.
struct SelfAttention {
    in_w: Tensor,
    in_b: Tensor,
    out: nn::Linear,
    heads: i64,
}

impl SelfAttention {
    /// `_reset_parameters`: `in_proj_weight` xavier-uniform, `in_proj_bias` and `out_proj.bias`
    /// 0, `out_proj.weight` `nn.Linear`'s default.
    fn new(p: nn::Path, hidden: i64, heads: i64) -> SelfAttention {
        SelfAttention {
            in_w: p.var(
                "in_proj_weight",
                &[3 * hidden, hidden],
                xavier_uniform(hidden, 3 * hidden),
            ),
            in_b: p.var("in_proj_bias", &[3 * hidden], Init::Const(0.0)),
            out: nn::linear(&p / "out_proj", hidden, hidden, init::linear(true)),
            heads,
        }
    }

    fn forward(&self, x: &Tensor) -> Tensor {
        // The batch stays -1: a traced graph (`tchrun export`) keeps it dynamic.
        let (_, l, e) = x.size3().expect("(batch, sequence, hidden)");
        let d = e / self.heads;
        let qkv = x
            .linear(&self.in_w, Some(&self.in_b))
            .view([-1, l, 3, self.heads, d])
            .permute([2, 0, 3, 1, 4]);
        let o = Tensor::scaled_dot_product_attention(
            &qkv.get(0),
            &qkv.get(1),
            &qkv.get(2),
            None::<Tensor>,
            0.0,
            false,
            None,
            false,
        );
        o.transpose(1, 2).reshape([-1, l, e]).apply(&self.out)
    }
}

/// torchvision's `EncoderBlock(num_heads, hidden_dim, mlp_dim, dropout=0, attention_dropout=0)`.
fn encoder_block(p: nn::Path, hidden: i64, heads: i64, mlp: i64) -> impl ModuleT {
    let ln_1 = layer_norm(&p / "ln_1", hidden);
    let attention = SelfAttention::new(&p / "self_attention", hidden, heads);
    let ln_2 = layer_norm(&p / "ln_2", hidden);
    let fc1 = mlp_linear(&p / "mlp" / "0", hidden, mlp);
    let fc2 = mlp_linear(&p / "mlp" / "3", mlp, hidden);
    nn::func_t(move |input, _train| {
        let x = attention.forward(&input.apply(&ln_1)) + input;
        let y = x.apply(&ln_2).apply(&fc1).gelu("none").apply(&fc2);
        &x + y
    })
}

/// torchvision's `VisionTransformer` for a `Family::Vit` built for `image_size` pixels, with
/// `classes` outputs. Panics on another family (a programming error: `models::build` picks).
pub fn vit(p: &nn::Path, family: Family, image_size: i64, classes: i64) -> impl ModuleT {
    let Family::Vit {
        patch,
        layers,
        heads,
        hidden,
        mlp,
    } = family
    else {
        unreachable!("vit() is only called with a ViT family")
    };
    let (patch, hidden) = (patch as i64, hidden as i64);
    let grid = image_size / patch;
    let fan_in = 3 * patch * patch;
    let conv_cfg = nn::ConvConfig {
        stride: patch,
        bias: true,
        // `trunc_normal_(std=√(1/fan_in))`: its bounds ±2 lie beyond 50 standard deviations.
        ws_init: Init::Randn {
            mean: 0.0,
            stdev: (1.0 / fan_in as f64).sqrt(),
        },
        bs_init: Init::Const(0.0),
        ..Default::default()
    };
    let conv_proj = nn::conv2d(p / "conv_proj", 3, hidden, patch, conv_cfg);
    let class_token = p.var("class_token", &[1, 1, hidden], Init::Const(0.0));
    let e = p / "encoder";
    let pos_embedding = e.var(
        "pos_embedding",
        &[1, grid * grid + 1, hidden],
        Init::Randn {
            mean: 0.0,
            stdev: 0.02,
        },
    );
    let mut blocks = nn::seq_t();
    for i in 0..layers {
        let bp = &e / "layers" / format!("encoder_layer_{i}");
        blocks = blocks.add(encoder_block(bp, hidden, heads as i64, mlp as i64));
    }
    let ln = layer_norm(&e / "ln", hidden);
    let head_cfg = nn::LinearConfig {
        ws_init: Init::Const(0.0),
        bs_init: Some(Init::Const(0.0)),
        bias: true,
    };
    let head = nn::linear(p / "heads" / "head", hidden, classes, head_cfg);
    nn::func_t(move |x, train| {
        // No batch size read from `x`: a traced graph (`tchrun export`) keeps it dynamic.
        let patches = x.apply(&conv_proj).flatten(2, 3).permute([0, 2, 1]);
        let class_tokens = class_token.expand_as(&patches.narrow(1, 0, 1));
        let x = Tensor::cat(&[class_tokens, patches], 1);
        let x = (x + &pos_embedding).apply_t(&blocks, train).apply(&ln);
        x.select(1, 0).apply(&head)
    })
}
