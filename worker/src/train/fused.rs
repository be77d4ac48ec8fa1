//! torch's fused optimizer kernels through the shim (`worker/csrc`): one pass per tensor over
//! parameter, gradient and state, where the plain loop makes one per operation. Must not know
//! which parameters exist or how the LR was chosen.
use crate::comm::ffi;
use crate::comm::pg::{check, C10dError};
use tch::Tensor;

/// torch's fused SGD kernel (`torch.optim.SGD(fused=True)`, dampening 0) over one parameter
/// group: weight decay, momentum (`bufs` set to the gradient on the `first_step`; unused when
/// `momentum` is 0) and the update, one pass per tensor instead of one per operation.
/// The three lists are parallel and share one device and dtype. `found_inf`: the loss
/// scaler's overflow flag (a 0-d float on the device); at 1 the kernel changes nothing.
pub fn sgd(
    params: &[Tensor],
    grads: &[Tensor],
    bufs: &[Tensor],
    hyper: (f64, f64, f64, bool),
    first_step: bool,
    found_inf: Option<&Tensor>,
) -> Result<(), C10dError> {
    let (weight_decay, momentum, lr, nesterov) = hyper;
    let n = params.len();
    if grads.len() != n || (momentum != 0.0 && bufs.len() != n) {
        return Err(C10dError {
            op: "optimizer step",
            message: format!(
                "{n} parameters, {} gradients, {} momentum buffers",
                grads.len(),
                bufs.len()
            ),
        });
    }
    let ptrs = |ts: &[Tensor]| -> Vec<*mut std::ffi::c_void> {
        ts.iter().map(|t| t.as_ptr() as *mut _).collect()
    };
    let (mut p, mut g, mut b) = (ptrs(params), ptrs(grads), ptrs(bufs));
    check("optimizer step", unsafe {
        ffi::tchrun_fused_sgd(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            b.as_mut_ptr(),
            n,
            weight_decay,
            momentum,
            lr,
            nesterov as i32,
            first_step as i32,
            found_inf.map_or(std::ptr::null_mut(), |f| f.as_ptr() as *mut _),
        )
    })
}
