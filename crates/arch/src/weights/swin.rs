//! torchvision's Swin Transformer `state_dict` (`weights::spec` for `Family::Swin`).
use super::layers::Spec;
use crate::swin::{bias_table_rows, SwinShape, MLP_RATIO, PATCH, WINDOW};

/// The buffer every block's attention keeps in the `state_dict` (`int64`, `window⁴` values,
/// `arch::swin::relative_position_index`): tch's store does not hold it, the worker writes it.
pub const RELATIVE_POSITION_INDEX: &str = "relative_position_index";

/// torchvision's `SwinTransformer`: `features.0` the patch embedding (`.0` the 4x4 stride-4
/// convolution, `.1` the Permute, `.2` its LayerNorm), odd `features.N` the stages of
/// `SwinTransformerBlock`s (`norm1`; `attn`'s `relative_position_bias_table` `[(2·7-1)²,
/// heads]`, its `relative_position_index` buffer, `qkv` and `proj`; `norm2`; the MLP's Linears
/// `mlp.0` and `mlp.3`), even ones the `PatchMerging`s (`reduction`, a Linear without bias from
/// 4C to 2C, then `norm` over 4C, registered in that order); `norm` the last LayerNorm and
/// `head` the Linear head.
pub(super) fn swin_spec(out: &mut Spec, v: SwinShape, classes: usize) {
    let wb = |out: &mut Spec, name: &str, weight: Vec<usize>, c: usize| {
        out.push((format!("{name}.weight"), weight));
        out.push((format!("{name}.bias"), vec![c]));
    };
    let e = v.embed;
    wb(out, "features.0.0", vec![e, 3, PATCH, PATCH], e);
    wb(out, "features.0.2", vec![e], e);
    for (s, &n) in v.depths.iter().enumerate() {
        let c = v.dim(s);
        for j in 0..n {
            let p = format!("features.{}.{j}", 1 + 2 * s);
            wb(out, &format!("{p}.norm1"), vec![c], c);
            let a = format!("{p}.attn");
            out.push((
                format!("{a}.relative_position_bias_table"),
                vec![bias_table_rows(), v.heads[s]],
            ));
            out.push((
                format!("{a}.{RELATIVE_POSITION_INDEX}"),
                vec![WINDOW.pow(4)],
            ));
            wb(out, &format!("{a}.qkv"), vec![3 * c, c], 3 * c);
            wb(out, &format!("{a}.proj"), vec![c, c], c);
            wb(out, &format!("{p}.norm2"), vec![c], c);
            wb(
                out,
                &format!("{p}.mlp.0"),
                vec![MLP_RATIO * c, c],
                MLP_RATIO * c,
            );
            wb(out, &format!("{p}.mlp.3"), vec![c, MLP_RATIO * c], c);
        }
        if s + 1 < v.depths.len() {
            let p = format!("features.{}", 2 + 2 * s);
            out.push((format!("{p}.reduction.weight"), vec![2 * c, 4 * c]));
            wb(out, &format!("{p}.norm"), vec![4 * c], 4 * c);
        }
    }
    let f = v.features();
    wb(out, "norm", vec![f], f);
    wb(out, "head", vec![classes, f], classes);
}
