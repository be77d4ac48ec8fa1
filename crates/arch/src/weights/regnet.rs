//! torchvision's RegNet `state_dict` (`weights::spec` for `Family::Regnet`), from the one layout
//! `arch` computes.
use super::layers::{conv_norm, Spec};
use crate::RegnetLayout;

/// torchvision's RegNet: every `Conv2dNormActivation` is `.0` a convolution without bias and
/// `.1` its batch norm; `stem` the 3x3 stem, `trunk_output.blockS.blockS-J` the `J`th
/// `ResBottleneckBlock` of stage `S` (from 1 and 0): `proj` when it projects, then `f.a` (1x1),
/// `f.b` (3x3, grouped), `f.se.fc1`/`f.se.fc2` with biases (Y models), `f.c` (1x1); `fc` the
/// Linear head.
pub(super) fn regnet_spec(out: &mut Spec, layout: &RegnetLayout, classes: usize) {
    conv_norm(out, "stem", [layout.stem, 3, 3]);
    for (s, stage) in layout.stages.iter().enumerate() {
        for (j, b) in stage.iter().enumerate() {
            let p = format!("trunk_output.block{}.block{}-{j}", s + 1, s + 1);
            if b.projects() {
                conv_norm(out, &format!("{p}.proj"), [b.c_out, b.c_in, 1]);
            }
            conv_norm(out, &format!("{p}.f.a"), [b.c_out, b.c_in, 1]);
            conv_norm(out, &format!("{p}.f.b"), [b.c_out, b.c_out / b.groups, 3]);
            if let Some(squeeze) = b.squeeze {
                let se = format!("{p}.f.se");
                out.push((format!("{se}.fc1.weight"), vec![squeeze, b.c_out, 1, 1]));
                out.push((format!("{se}.fc1.bias"), vec![squeeze]));
                out.push((format!("{se}.fc2.weight"), vec![b.c_out, squeeze, 1, 1]));
                out.push((format!("{se}.fc2.bias"), vec![b.c_out]));
            }
            conv_norm(out, &format!("{p}.f.c"), [b.c_out, b.c_out, 1]);
        }
    }
    let last = layout.last_width();
    out.push(("fc.weight".into(), vec![classes, last]));
    out.push(("fc.bias".into(), vec![classes]));
}
