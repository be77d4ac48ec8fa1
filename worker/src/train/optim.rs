//! SGD with momentum and weight decay, exactly torch.optim.SGD (dampening 0, no Nesterov):
//! `d = g + wd·p; buf = m·buf + d (buf = d on the first step); p -= lr·buf`, computed by
//! torch's fused kernel (`SGD(fused=True)`, one pass per tensor, `fused::sgd`). Its state (the
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

    /// One update with torch's fused SGD kernel (`torch.optim.SGD(fused=True)`: the same
    /// arithmetic as the default loop, one pass per tensor): the parameters with a gradient,
    /// grouped by LR multiplier and by whether their momentum buffer exists yet (on its first
    /// step a buffer becomes the gradient plus decay, as torch's).
    pub fn step(&mut self, lr: f64) -> Result<(), crate::comm::pg::C10dError> {
        // (LR multiplier, first step) → (params, grads, buffers).
        type Group = (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>);
        let mut groups: Vec<((f64, bool), Group)> = Vec::new();
        for ((name, p), &scale) in self.params.iter().zip(&self.lr_scales) {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let (buf, first) = if self.momentum == 0.0 {
                (None, false)
            } else {
                match self.buffers.get(name) {
                    Some(b) => (Some(b.shallow_clone()), false),
                    None => {
                        let b = tch::no_grad(|| g.empty_like());
                        self.buffers.insert(name.clone(), b.shallow_clone());
                        (Some(b), true)
                    }
                }
            };
            let key = (scale, first);
            let at = match groups.iter().position(|(k, _)| *k == key) {
                Some(i) => i,
                None => {
                    groups.push((key, Default::default()));
                    groups.len() - 1
                }
            };
            let (ps, gs, bs) = &mut groups[at].1;
            ps.push(p.shallow_clone());
            gs.push(g);
            bs.extend(buf);
        }
        for ((scale, first), (ps, gs, bs)) in groups {
            super::fused::sgd(
                &ps,
                &gs,
                &bs,
                (self.weight_decay, self.momentum, lr * scale, false),
                first,
            )?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    /// torch.optim.SGD's loop, written out: `d = g + wd·p; buf = m·buf + d (buf = d first);
    /// p -= lr·buf`, in float64 for the comparison.
    fn reference_step(
        p: &mut Tensor,
        buf: &mut Option<Tensor>,
        g: &Tensor,
        hyper: (f64, f64, f64),
    ) {
        let (lr, m, wd) = hyper;
        let d = g + &*p * wd;
        let b = match buf.take() {
            Some(b) => b * m + &d,
            None => d,
        };
        *p = &*p - &b * lr;
        *buf = Some(b);
    }

    #[test]
    fn the_fused_step_is_torchs_sgd_with_groups_and_a_late_first_gradient() {
        tch::manual_seed(1);
        let opts = (Kind::Float, Device::Cpu);
        let init: Vec<Tensor> = [vec![5, 3], vec![7], vec![2, 2, 3]]
            .iter()
            .map(|s| Tensor::randn(s.as_slice(), opts))
            .collect();
        let params: Vec<(String, Tensor)> = init
            .iter()
            .enumerate()
            .map(|(i, t)| (format!("p{i}"), t.copy().set_requires_grad(true)))
            .collect();
        let mut sgd = Sgd::new(
            params
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect(),
            0.9,
            1e-2,
        )
        .with_backbone_lr_scale(|n| n == "p0", 0.1);
        let mut reference: Vec<Tensor> = init.iter().map(|t| t.to_kind(Kind::Double)).collect();
        let mut bufs: Vec<Option<Tensor>> = vec![None, None, None];
        for step in 0..4 {
            let lr = 0.5 / (step + 1) as f64;
            sgd.zero_grad().expect("zero_grad");
            for (i, (_, p)) in params.iter().enumerate() {
                // p2 gets its first gradient at step 2: its buffer starts later than the others'.
                if i == 2 && step < 2 {
                    continue;
                }
                let g = Tensor::randn(p.size().as_slice(), opts);
                let mut grad = p.grad();
                if !grad.defined() {
                    (p * 0.0).sum(Kind::Float).backward();
                    grad = p.grad();
                }
                tch::no_grad(|| grad.copy_(&g));
                let scale = if i == 0 { 1.0 } else { 0.1 };
                reference_step(
                    &mut reference[i],
                    &mut bufs[i],
                    &g.to_kind(Kind::Double),
                    (lr * scale, 0.9, 1e-2),
                );
            }
            sgd.step(lr).expect("step");
            for (i, (_, p)) in params.iter().enumerate() {
                let diff = (p.to_kind(Kind::Double) - &reference[i])
                    .abs()
                    .max()
                    .double_value(&[]);
                assert!(diff < 1e-5, "step {step}, p{i}: differs by {diff}");
            }
        }
        assert_eq!(
            sgd.state().len(),
            3,
            "every parameter has its momentum buffer"
        );
    }
}
