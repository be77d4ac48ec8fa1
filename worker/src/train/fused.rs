//! torch's fused optimizer kernels through the shim (`worker/csrc`): one pass per tensor over
//! parameter, gradient and state, where the plain loop makes one per operation. Must not know
//! which parameters exist or how the LR was chosen.
use crate::comm::ffi;
use crate::comm::pg::{check, tensor_ptrs as ptrs, C10dError};
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
            flag_ptr(found_inf),
        )
    })
}

/// The AdamW moments' decay rates and epsilon, and the step's LR and weight decay.
pub struct AdamwHyper {
    pub lr: f64,
    pub betas: (f64, f64),
    pub weight_decay: f64,
    pub eps: f64,
}

/// torch's fused AdamW step (`torch.optim.AdamW(fused=True)`, not amsgrad) over one parameter
/// group: the step counts (`steps`, 0-d floats) + 1, then decoupled weight decay, both moments,
/// the bias corrections and the update in one pass per tensor. `found_inf`: the loss scaler's
/// overflow flag; at 1 nothing changes, the counts included. The five lists are parallel and
/// share one device and dtype.
pub fn adamw(
    params: &[Tensor],
    grads: &[Tensor],
    moments: (&[Tensor], &[Tensor]),
    steps: &[Tensor],
    h: &AdamwHyper,
    found_inf: Option<&Tensor>,
) -> Result<(), C10dError> {
    let n = params.len();
    let (exp_avgs, exp_avg_sqs) = moments;
    if [grads.len(), exp_avgs.len(), exp_avg_sqs.len(), steps.len()]
        .iter()
        .any(|&l| l != n)
    {
        return Err(C10dError {
            op: "optimizer step",
            message: format!(
                "{n} parameters, {} gradients, {}/{} moments, {} step counts",
                grads.len(),
                exp_avgs.len(),
                exp_avg_sqs.len(),
                steps.len()
            ),
        });
    }
    let (mut p, mut g) = (ptrs(params), ptrs(grads));
    let (mut a, mut b, mut c) = (ptrs(exp_avgs), ptrs(exp_avg_sqs), ptrs(steps));
    check("optimizer step", unsafe {
        ffi::tchrun_fused_adamw(
            p.as_mut_ptr(),
            g.as_mut_ptr(),
            a.as_mut_ptr(),
            b.as_mut_ptr(),
            c.as_mut_ptr(),
            n,
            h.lr,
            h.betas.0,
            h.betas.1,
            h.weight_decay,
            h.eps,
            flag_ptr(found_inf),
        )
    })
}

/// The loss scaler's flag for a kernel call: its handle, or null without one.
fn flag_ptr(found_inf: Option<&Tensor>) -> *mut std::ffi::c_void {
    found_inf.map_or(std::ptr::null_mut(), |f| f.as_ptr() as *mut _)
}
