//! torchvision's MobileNetV3 `state_dict` (`weights::spec` for `Family::Mobilenet`), from the
//! one layout `arch` computes.
use super::layers::{conv_norm, Spec};
use crate::MobilenetLayout;

/// torchvision's MobileNetV3: every `Conv2dNormActivation` is `.0` a convolution without bias
/// and `.1` its batch norm; `features.0` the stem, `features.1` ... one `InvertedResidual` each,
/// its layers under `block.K` in order (the 1x1 expansion when it expands, the depthwise
/// convolution, the squeeze-and-excitation `fc1`/`fc2` with biases when it has one, the 1x1
/// projection), the last 1x1 convolution after them; `classifier.0` the hidden Linear,
/// `classifier.3` the head (`.1` is the Hardswish, `.2` the dropout).
pub(super) fn mobilenet_spec(out: &mut Spec, layout: &MobilenetLayout, classes: usize) {
    conv_norm(out, "features.0", [layout.stem, 3, 3]);
    for (i, b) in layout.blocks.iter().enumerate() {
        let p = format!("features.{}.block", i + 1);
        let mut k = 0;
        if b.expands() {
            conv_norm(out, &format!("{p}.0"), [b.expanded, b.c_in, 1]);
            k += 1;
        }
        conv_norm(out, &format!("{p}.{k}"), [b.expanded, 1, b.kernel]);
        k += 1;
        if let Some(squeeze) = b.squeeze {
            let se = format!("{p}.{k}");
            out.push((format!("{se}.fc1.weight"), vec![squeeze, b.expanded, 1, 1]));
            out.push((format!("{se}.fc1.bias"), vec![squeeze]));
            out.push((format!("{se}.fc2.weight"), vec![b.expanded, squeeze, 1, 1]));
            out.push((format!("{se}.fc2.bias"), vec![b.expanded]));
            k += 1;
        }
        conv_norm(out, &format!("{p}.{k}"), [b.c_out, b.expanded, 1]);
    }
    let c_in = layout.blocks.last().map_or(0, |b| b.c_out);
    let last = format!("features.{}", layout.blocks.len() + 1);
    conv_norm(out, &last, [layout.last_conv, c_in, 1]);
    out.push((
        "classifier.0.weight".into(),
        vec![layout.last_channel, layout.last_conv],
    ));
    out.push(("classifier.0.bias".into(), vec![layout.last_channel]));
    out.push((
        "classifier.3.weight".into(),
        vec![classes, layout.last_channel],
    ));
    out.push(("classifier.3.bias".into(), vec![classes]));
}
