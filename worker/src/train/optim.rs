//! SGD with momentum and weight decay, exactly torch.optim.SGD (dampening 0, no Nesterov):
//! `d = g + wd·p; buf = m·buf + d (buf = d on the first step); p -= lr·buf`. Its state (the
//! momentum buffers) is ours, so checkpoints hold it and a resumed run continues exactly.
use std::collections::BTreeMap;
use tch::Tensor;

pub struct Sgd {
    params: Vec<(String, Tensor)>,
    /// Each parameter's LR multiplier (torch's parameter groups: `--backbone-lr-scale`).
    lr_scales: Vec<f64>,
    momentum: f64,
    weight_decay: f64,
    buffers: BTreeMap<String, Tensor>,
}

impl Sgd {
    /// `params`: the trainable parameters by name.
    pub fn new(params: Vec<(String, Tensor)>, momentum: f64, weight_decay: f64) -> Sgd {
        Sgd {
            lr_scales: vec![1.0; params.len()],
            params,
            momentum,
            weight_decay,
            buffers: BTreeMap::new(),
        }
    }

    /// Drops the gradients (torch's default `set_to_none=True`): backward then hands its
    /// gradient tensors over instead of zero-filling and adding into ours.
    /// Two parameter groups, as `torch.optim.SGD([{params: backbone, lr: lr × scale},
    /// {params: head}])`: parameters whose name `in_head` accepts step with the LR, the others
    /// with the LR × `backbone_scale`.
    pub fn with_backbone_lr_scale(
        mut self,
        in_head: impl Fn(&str) -> bool,
        backbone_scale: f64,
    ) -> Sgd {
        self.lr_scales = self
            .params
            .iter()
            .map(|(n, _)| if in_head(n) { 1.0 } else { backbone_scale })
            .collect();
        self
    }

    pub fn zero_grad(&mut self) -> Result<(), crate::comm::pg::C10dError> {
        crate::comm::pg::set_grads_to_none(self.params.iter().map(|(_, p)| p))
    }

    pub fn step(&mut self, lr: f64) {
        tch::no_grad(|| {
            for ((name, p), &scale) in self.params.iter().zip(&self.lr_scales) {
                let g = p.grad();
                if !g.defined() {
                    continue;
                }
                // The gradient is ours until the next zero_grad: add the decay in place.
                let mut d = g.shallow_clone();
                if self.weight_decay != 0.0 {
                    let _ = d.g_add_(&(p * self.weight_decay));
                }
                let d = if self.momentum != 0.0 {
                    match self.buffers.get_mut(name) {
                        Some(buf) => {
                            let _ = buf.g_mul_scalar_(self.momentum).g_add_(&d);
                            buf.shallow_clone()
                        }
                        None => {
                            let buf = d.detach().copy();
                            self.buffers.insert(name.clone(), buf.shallow_clone());
                            buf
                        }
                    }
                } else {
                    d
                };
                let mut p = p.shallow_clone();
                let _ = p.g_add_(&(d * (-lr * scale)));
            }
        });
    }

    /// Momentum buffers by parameter name (for checkpoints).
    pub fn state(&self) -> &BTreeMap<String, Tensor> {
        &self.buffers
    }

    /// Restores momentum buffers saved by `state`.
    pub fn load_state(&mut self, state: BTreeMap<String, Tensor>) {
        let device = self
            .params
            .first()
            .map(|(_, p)| p.device())
            .unwrap_or(tch::Device::Cpu);
        self.buffers = state
            .into_iter()
            .map(|(k, v)| (k, v.to_device(device)))
            .collect();
    }

    /// The momentum buffers, for fp16 gradient checks.
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
}
