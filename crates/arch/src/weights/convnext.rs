//! torchvision's ConvNeXt `state_dict` (`weights::spec` for `Family::Convnext`).
use super::layers::Spec;

/// torchvision's ConvNeXt: `features.0` the stem (4x4 convolution, LayerNorm2d), odd
/// `features.N` the stages of CNBlocks (`layer_scale`, then `block.0` the 7x7 depthwise
/// convolution, `block.2` the LayerNorm, `block.3`/`block.5` the two Linears), even ones the
/// downsamplings (LayerNorm2d, 2x2 convolution); `classifier.0` a LayerNorm2d, `classifier.2`
/// the Linear head.
pub(super) fn convnext_spec(out: &mut Spec, dims: [usize; 4], blocks: [usize; 4], classes: usize) {
    let wb = |out: &mut Spec, name: &str, weight: Vec<usize>, c: usize| {
        out.push((format!("{name}.weight"), weight));
        out.push((format!("{name}.bias"), vec![c]));
    };
    wb(out, "features.0.0", vec![dims[0], 3, 4, 4], dims[0]);
    wb(out, "features.0.1", vec![dims[0]], dims[0]);
    for (s, (&c, &n)) in dims.iter().zip(&blocks).enumerate() {
        let stage = 1 + 2 * s;
        for j in 0..n {
            let p = format!("features.{stage}.{j}");
            // The block's own parameter comes before its children's in a state_dict.
            out.push((format!("{p}.layer_scale"), vec![c, 1, 1]));
            wb(out, &format!("{p}.block.0"), vec![c, 1, 7, 7], c);
            wb(out, &format!("{p}.block.2"), vec![c], c);
            wb(out, &format!("{p}.block.3"), vec![4 * c, c], 4 * c);
            wb(out, &format!("{p}.block.5"), vec![c, 4 * c], c);
        }
        if s + 1 < dims.len() {
            let p = format!("features.{}", stage + 1);
            wb(out, &format!("{p}.0"), vec![c], c);
            wb(
                out,
                &format!("{p}.1"),
                vec![dims[s + 1], c, 2, 2],
                dims[s + 1],
            );
        }
    }
    wb(out, "classifier.0", vec![dims[3]], dims[3]);
    wb(out, "classifier.2", vec![classes, dims[3]], classes);
}
