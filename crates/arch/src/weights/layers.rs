//! The tensors of the layers every family's `state_dict` is made of: [`Spec`], a batch norm
//! (`bn`) and a `Conv2dNormActivation` (`conv_norm`).

/// `(name, shape)` of a `state_dict`'s tensors, in order.
pub(super) type Spec = Vec<(String, Vec<usize>)>;

/// A batch-norm layer's tensors, in a `state_dict`'s order.
/// A `Conv2dNormActivation`'s tensors: `.0` the convolution without bias, `[c_out,
/// c_in_per_group, k]` (k x k), and `.1` its batch norm.
pub(super) fn conv_norm(out: &mut Spec, name: &str, [c_out, c_in_per_group, k]: [usize; 3]) {
    out.push((
        format!("{name}.0.weight"),
        vec![c_out, c_in_per_group, k, k],
    ));
    bn(out, &format!("{name}.1"), c_out);
}

pub(super) fn bn(out: &mut Vec<(String, Vec<usize>)>, name: &str, c: usize) {
    for p in ["weight", "bias", "running_mean", "running_var"] {
        out.push((format!("{name}.{p}"), vec![c]));
    }
    out.push((format!("{name}.num_batches_tracked"), vec![]));
}
