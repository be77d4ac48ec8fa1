//! The optimizers of `--opt`, each exactly torch.optim's single-tensor step (torchvision's
//! train.py's arguments): SGD (dampening 0; `d = g + wd·p; buf = m·buf + d`, `buf = d` on the
//! first step; Nesterov: `d + m·buf`, else `buf`; `p -= lr·…`), RMSprop (alpha 0.9, eps
//! 0.0316, momentum) and AdamW (betas (0.9, 0.999), eps 1e-8, decoupled decay). Parameter
//! groups are per parameter: an LR multiplier (`--backbone-lr-scale`) and a weight decay
//! (`--norm-weight-decay`, `--bias-weight-decay`). Its state (buffers and step counts) is
//! ours, so checkpoints hold it and a resumed run continues exactly. SGD (plain and Nesterov)
//! and AdamW run torch's fused kernels (`SGD(fused=True)`, `AdamW(fused=True)`: `fused::sgd`,
//! `fused::adamw`: the same arithmetic, one pass per tensor instead of one per operation, and
//! the fp16 scaler's skip on the device); RMSprop the single-tensor step.
use std::collections::{BTreeMap, HashMap};
use tch::{Kind, Tensor};
use tchrun::recipe::Opt;

/// torchvision's RMSprop(alpha=0.9, eps=0.0316).
pub const RMSPROP_ALPHA: f64 = 0.9;
pub const RMSPROP_EPS: f64 = 0.0316;
/// torch's AdamW defaults.
pub const ADAMW_BETAS: (f64, f64) = (0.9, 0.999);
pub const ADAMW_EPS: f64 = 1e-8;
/// The state name of a parameter's step count (torch's `state["step"]`).
const STEP: &str = "step";

/// One parameter's state, made at its first step as torch makes it.
#[derive(Default)]
struct Slot {
    /// SGD: the momentum buffer; RMSprop: `square_avg`; AdamW: `exp_avg`.
    a: Option<Tensor>,
    /// RMSprop: the momentum buffer; AdamW: `exp_avg_sq`.
    b: Option<Tensor>,
    /// Steps taken (RMSprop).
    step: u64,
    /// AdamW: steps taken, on the device (a 0-d float: the fused kernel's `state_steps`).
    steps: Option<Tensor>,
}

/// The names of `opt`'s two buffers in the state (and the checkpoint: `<name>.<parameter>`)
/// and whether it counts steps. SGD's are the names checkpoints had before `--opt`.
fn state_names(opt: Opt) -> (&'static str, &'static str, bool) {
    match opt {
        Opt::Sgd | Opt::SgdNesterov => ("momentum", "", false),
        Opt::Rmsprop => ("square_avg", "momentum_buffer", true),
        Opt::Adamw => ("exp_avg", "exp_avg_sq", true),
    }
}

pub struct Optimizer {
    opt: Opt,
    params: Vec<(String, Tensor)>,
    /// Each parameter's LR multiplier (torch's parameter groups: `--backbone-lr-scale`).
    lr_scales: Vec<f64>,
    /// Each parameter's weight decay (torchvision's `set_weight_decay` groups).
    decays: Vec<f64>,
    momentum: f64,
    slots: Vec<Slot>,
}

impl Optimizer {
    /// `params`: the trainable parameters by name; every one decays by `weight_decay`.
    pub fn new(
        opt: Opt,
        params: Vec<(String, Tensor)>,
        momentum: f64,
        weight_decay: f64,
    ) -> Optimizer {
        Optimizer {
            opt,
            lr_scales: vec![1.0; params.len()],
            decays: vec![weight_decay; params.len()],
            slots: params.iter().map(|_| Slot::default()).collect(),
            params,
            momentum,
        }
    }

    /// The job's optimizer (`--opt`, `--momentum`) over `trainable`, with its parameter groups:
    /// `--backbone-lr-scale` for the parameters outside the head (`head`: its name prefix),
    /// `--weight-decay` and torchvision's `--norm-weight-decay`/`--bias-weight-decay`
    /// (normalisation layers found among `named`, the model's variables with its buffers).
    pub fn of_job(
        job: &tchrun::flags::TrainJob,
        named: &[(String, Tensor)],
        trainable: Vec<(String, Tensor)>,
        head: &str,
    ) -> Optimizer {
        let o = &job.options;
        let names: Vec<(&str, usize)> = named.iter().map(|(n, t)| (n.as_str(), t.dim())).collect();
        let norm = tchrun::recipe::norm_parameters(&names);
        let decays: HashMap<String, f64> = trainable
            .iter()
            .map(|(n, _)| {
                let d = o
                    .recipe
                    .weight_decay_of(o.weight_decay, n, norm.contains(n.as_str()));
                (n.clone(), d)
            })
            .collect();
        Optimizer::new(o.recipe.opt, trainable, o.momentum, o.weight_decay)
            .with_backbone_lr_scale(|n| n.starts_with(head), o.backbone_lr_scale)
            .with_weight_decays(|n| decays.get(n).copied().unwrap_or(o.weight_decay))
    }

    /// Two parameter groups, as `torch.optim.SGD([{params: backbone, lr: lr × scale},
    /// {params: head}])`: parameters whose name `in_head` accepts step with the LR, the others
    /// with the LR × `backbone_scale`.
    pub fn with_backbone_lr_scale(
        mut self,
        in_head: impl Fn(&str) -> bool,
        backbone_scale: f64,
    ) -> Optimizer {
        self.lr_scales = self
            .params
            .iter()
            .map(|(n, _)| if in_head(n) { 1.0 } else { backbone_scale })
            .collect();
        self
    }

    /// Each parameter's weight decay, by name (`RecipeFlags::weight_decay_of`).
    pub fn with_weight_decays(mut self, decay_of: impl Fn(&str) -> f64) -> Optimizer {
        self.decays = self.params.iter().map(|(n, _)| decay_of(n)).collect();
        self
    }

    /// Drops the gradients (torch's default `set_to_none=True`): backward then hands its
    /// gradient tensors over instead of zero-filling and adding into ours.
    pub fn zero_grad(&mut self) -> Result<(), crate::comm::pg::C10dError> {
        crate::comm::pg::set_grads_to_none(self.params.iter().map(|(_, p)| p))
    }

    /// One step at `lr` (× each parameter's multiplier); parameters without a gradient are
    /// left alone, as torch does. `found_inf`: the fp16 loss scaler's overflow flag (0-d, on
    /// the device); when it is 1 nothing changes. The fused SGD and AdamW kernels read it on
    /// the device; RMSprop (no fused kernel in torch) reads it on the host first, as torch's
    /// GradScaler does with a non-fused optimizer.
    pub fn step(
        &mut self,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), crate::comm::pg::C10dError> {
        let (opt, momentum) = (self.opt, self.momentum);
        match opt {
            Opt::Sgd | Opt::SgdNesterov => {
                return self.fused_sgd(lr, opt == Opt::SgdNesterov, found_inf)
            }
            Opt::Adamw => return self.fused_adamw(lr, found_inf),
            Opt::Rmsprop => {}
        }
        if found_inf.is_some_and(|f| f.double_value(&[]) != 0.0) {
            return Ok(());
        }
        tch::no_grad(|| {
            for (i, ((_, p), slot)) in self.params.iter().zip(&mut self.slots).enumerate() {
                let g = p.grad();
                if g.defined() {
                    let (lr, wd) = (lr * self.lr_scales[i], self.decays[i]);
                    rmsprop(p, &g, slot, lr, wd, momentum);
                }
            }
        });
        Ok(())
    }

    /// AdamW through torch's fused kernel, one call per group of parameters that share an LR
    /// multiplier and a weight decay; a parameter's moments and step count start at zero on its
    /// first step, as torch's do.
    fn fused_adamw(
        &mut self,
        lr: f64,
        found_inf: Option<&Tensor>,
    ) -> Result<(), crate::comm::pg::C10dError> {
        type Group = [Vec<Tensor>; 5];
        let mut groups: Vec<((f64, f64), Group)> = Vec::new();
        for (i, ((_, p), slot)) in self.params.iter().zip(&mut self.slots).enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            let exp_avg = held_in_layout(p, &mut slot.a, Tensor::zeros_like);
            let exp_avg_sq = held_in_layout(p, &mut slot.b, Tensor::zeros_like);
            let steps = slot
                .steps
                .get_or_insert_with(|| Tensor::zeros([], (Kind::Float, p.device())))
                .shallow_clone();
            let group = group_of(&mut groups, (self.lr_scales[i], self.decays[i]));
            let tensors = [
                p.shallow_clone(),
                in_layout_of(p, g),
                exp_avg,
                exp_avg_sq,
                steps,
            ];
            for (list, t) in group.iter_mut().zip(tensors) {
                list.push(t);
            }
        }
        for ((scale, weight_decay), [ps, gs, avgs, sqs, steps]) in groups {
            let h = super::fused::AdamwHyper {
                lr: lr * scale,
                betas: ADAMW_BETAS,
                weight_decay,
                eps: ADAMW_EPS,
            };
            super::fused::adamw(&ps, &gs, (&avgs, &sqs), &steps, &h, found_inf)?;
        }
        Ok(())
    }

    /// SGD through torch's fused kernel, one call per group of parameters that share an LR
    /// multiplier, a weight decay and whether their momentum buffer exists yet (on its first
    /// step the kernel sets the buffer to the gradient plus decay, as torch's loop does).
    fn fused_sgd(
        &mut self,
        lr: f64,
        nesterov: bool,
        found_inf: Option<&Tensor>,
    ) -> Result<(), crate::comm::pg::C10dError> {
        type Group = (Vec<Tensor>, Vec<Tensor>, Vec<Tensor>);
        let momentum = self.momentum;
        let mut groups: Vec<((f64, f64, bool), Group)> = Vec::new();
        for (i, ((_, p), slot)) in self.params.iter().zip(&mut self.slots).enumerate() {
            let g = p.grad();
            if !g.defined() {
                continue;
            }
            // A new buffer is set to the gradient (plus decay) by the kernel's first step. With
            // the scaler's flag, which may skip that step on the device, it starts at zero
            // instead (`m·0 + d` is `d` exactly), so a skipped first step leaves none unset.
            let first = momentum != 0.0 && slot.a.is_none() && found_inf.is_none();
            let buf = (momentum != 0.0).then(|| {
                held_in_layout(p, &mut slot.a, |p| {
                    if first {
                        p.empty_like()
                    } else {
                        p.zeros_like()
                    }
                })
            });
            let g = in_layout_of(p, g);
            let (ps, gs, bs) = group_of(&mut groups, (self.lr_scales[i], self.decays[i], first));
            ps.push(p.shallow_clone());
            gs.push(g);
            bs.extend(buf);
        }
        for ((scale, wd, first), (ps, gs, bs)) in groups {
            let hyper = (wd, momentum, lr * scale, nesterov);
            super::fused::sgd(&ps, &gs, &bs, hyper, first, found_inf)?;
        }
        Ok(())
    }

    /// The state by name (`<buffer>.<parameter>`, `step.<parameter>`), for checkpoints and the
    /// resume's broadcast: the buffers themselves, the step counts as new f64 tensors of one
    /// element on the parameter's device.
    pub fn state(&self) -> BTreeMap<String, Tensor> {
        let (a, b, counts) = state_names(self.opt);
        let mut out = BTreeMap::new();
        for ((name, p), slot) in self.params.iter().zip(&self.slots) {
            if let Some(t) = &slot.a {
                out.insert(format!("{a}.{name}"), t.shallow_clone());
            }
            if let Some(t) = &slot.b {
                out.insert(format!("{b}.{name}"), t.shallow_clone());
            }
            // With its buffers, even at 0 (the placeholders of a resume's broadcast).
            if let Some(t) = &slot.steps {
                out.insert(
                    format!("{STEP}.{name}"),
                    t.to_kind(Kind::Double).reshape([1]),
                );
            } else if counts && (slot.step > 0 || slot.a.is_some()) {
                let s = Tensor::from_slice(&[slot.step as f64]).to_device(p.device());
                out.insert(format!("{STEP}.{name}"), s);
            }
        }
        out
    }

    /// Which parameter and which of its slots a state name means.
    fn locate(&self, key: &str) -> Result<(usize, &'static str), String> {
        let (a, b, counts) = state_names(self.opt);
        let not_ours = || {
            format!(
                "the checkpoint's optimizer state '{key}' is not state of --opt {} for this \
                 model's parameters",
                self.opt.as_str()
            )
        };
        let (kind, param) = key.split_once('.').ok_or_else(not_ours)?;
        let which = match kind {
            k if k == a => a,
            k if !b.is_empty() && k == b => b,
            STEP if counts => STEP,
            _ => return Err(not_ours()),
        };
        let i = self
            .params
            .iter()
            .position(|(n, _)| n == param)
            .ok_or_else(not_ours)?;
        Ok((i, which))
    }

    /// A tensor of the shape, kind and device the state `key` has (zeros), for the ranks that
    /// receive rank 0's state by broadcast.
    pub fn placeholder(&self, key: &str) -> Result<Tensor, String> {
        let (i, which) = self.locate(key)?;
        let p = &self.params[i].1;
        Ok(if which == STEP {
            Tensor::zeros([1], (Kind::Double, p.device()))
        } else {
            p.detach().zeros_like()
        })
    }

    /// Restores a state saved by `state` (the previous state is dropped).
    pub fn load_state(&mut self, state: BTreeMap<String, Tensor>) -> Result<(), String> {
        let (a, _, _) = state_names(self.opt);
        let mut slots: HashMap<usize, Slot> = HashMap::new();
        for (key, t) in state {
            let (i, which) = self.locate(&key)?;
            let p = &self.params[i].1;
            if which != STEP && t.size() != p.size() {
                return Err(format!(
                    "the checkpoint's optimizer state '{key}' has shape {:?}, its parameter {:?}",
                    t.size(),
                    p.size()
                ));
            }
            let slot = slots.entry(i).or_default();
            match which {
                STEP if self.opt == Opt::Adamw => {
                    let count = t.double_value(&[0]).max(0.0);
                    slot.steps = Some(Tensor::full([], count, (Kind::Float, p.device())));
                }
                STEP => slot.step = t.double_value(&[0]).max(0.0) as u64,
                w if w == a => slot.a = Some(t.to_device(p.device()).to_kind(p.kind())),
                _ => slot.b = Some(t.to_device(p.device()).to_kind(p.kind())),
            }
        }
        self.slots = (0..self.params.len())
            .map(|i| slots.remove(&i).unwrap_or_default())
            .collect();
        Ok(())
    }

    /// The trainable parameters (fp16 gradient checks, clipping).
    pub fn params(&self) -> &[(String, Tensor)] {
        &self.params
    }
}

/// The group of `key` in `groups`, added empty when new (torch's parameter groups, by what
/// their fused kernel call must share).
fn group_of<K: PartialEq, G: Default>(groups: &mut Vec<(K, G)>, key: K) -> &mut G {
    let at = match groups.iter().position(|(k, _)| *k == key) {
        Some(at) => at,
        None => {
            groups.push((key, G::default()));
            groups.len() - 1
        }
    };
    &mut groups[at].1
}

/// Parameter `p`'s state tensor `held`, in `p`'s layout (a fused kernel walks parameter,
/// gradient and state memory in step; a buffer read from a checkpoint, or a channels-last
/// weight's, may have other strides), made by `fresh` when `p` has none yet; kept in `held`.
fn held_in_layout(
    p: &Tensor,
    held: &mut Option<Tensor>,
    fresh: impl FnOnce(&Tensor) -> Tensor,
) -> Tensor {
    let t = match held.take() {
        Some(t) => in_layout_of(p, t),
        None => tch::no_grad(|| fresh(p)),
    };
    *held = Some(t.shallow_clone());
    t
}

/// `t` with `p`'s strides: itself when it has them, else a copy laid out as `p`.
fn in_layout_of(p: &Tensor, t: Tensor) -> Tensor {
    if t.stride() == p.stride() {
        return t;
    }
    tch::no_grad(|| {
        let mut c = p.empty_like();
        c.copy_(&t);
        c
    })
}

/// torch's `_single_tensor_rmsprop` (not centered), with torchvision's alpha and eps.
fn rmsprop(p: &Tensor, g: &Tensor, slot: &mut Slot, lr: f64, wd: f64, momentum: f64) {
    slot.step += 1;
    let g = if wd != 0.0 {
        g + p * wd
    } else {
        g.shallow_clone()
    };
    let square_avg = slot.a.get_or_insert_with(|| p.detach().zeros_like());
    let _ = square_avg
        .g_mul_scalar_(RMSPROP_ALPHA)
        .addcmul_(&(&g * (1.0 - RMSPROP_ALPHA)), &g);
    let avg = square_avg.sqrt().g_add_scalar_(RMSPROP_EPS);
    let mut p = p.shallow_clone();
    if momentum > 0.0 {
        let buf = slot.b.get_or_insert_with(|| p.detach().zeros_like());
        let _ = buf.g_mul_scalar_(momentum).addcdiv_(&g, &avg);
        let _ = p.g_add_(&(&*buf * (-lr)));
    } else {
        let _ = p.addcdiv_(&(&g * (-lr)), &avg);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Device;

    fn floats(v: &serde_json::Value) -> Vec<f32> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number") as f32)
            .collect()
    }

    /// Gives `p` the gradient `g` (backward of <p, g>; the previous one dropped first).
    fn set_grad(p: &Tensor, g: &[f32]) {
        crate::comm::pg::set_grads_to_none(std::iter::once(p)).expect("grads to none");
        let g = Tensor::from_slice(g).view(p.size().as_slice());
        (p * &g).sum(Kind::Float).backward();
    }

    /// Every `--opt` on the same gradients as torch.optim (built as torchvision's train.py
    /// builds it: RMSprop eps 0.0316 and alpha 0.9, AdamW's defaults), with per-parameter
    /// groups (an LR multiplier of 0.1, as `--backbone-lr-scale`; the weight decays of
    /// `--norm-weight-decay`/`--bias-weight-decay`) and an LR that changes every step
    /// (`tests/python/recipe_reference.py optim`): the parameters after every step agree within
    /// 1e-6 (relative, or absolute below 1). The run is also interrupted after two steps, its
    /// state carried through `state`/`load_state` into a new optimizer (a checkpoint's path),
    /// and continues to torch's parameters.
    #[test]
    fn every_opt_equals_torch_optim() {
        let v = crate::train::recipe_reference("optim");
        let names: Vec<(String, f64)> = v["params"]
            .as_array()
            .expect("params")
            .iter()
            .map(|p| {
                let n = p[0].as_str().expect("name").to_string();
                (n, p[2].as_f64().expect("scale"))
            })
            .collect();
        let lrs: Vec<f64> = v["lrs"]
            .as_array()
            .expect("lrs")
            .iter()
            .map(|x| x.as_f64().expect("lr"))
            .collect();
        let mut seen = std::collections::BTreeSet::new();
        for case in v["cases"].as_array().expect("cases") {
            let opt = match case["opt"].as_str().expect("opt") {
                "sgd" => Opt::Sgd,
                "sgd_nesterov" => Opt::SgdNesterov,
                "rmsprop" => Opt::Rmsprop,
                "adamw" => Opt::Adamw,
                o => panic!("unknown optimizer {o}"),
            };
            seen.insert(opt.as_str());
            let momentum = case["momentum"].as_f64().expect("momentum");
            let decays = floats(&case["decays"]);
            let make = || {
                let params: Vec<(String, Tensor)> = names
                    .iter()
                    .enumerate()
                    .map(|(i, (n, _))| {
                        let t = Tensor::from_slice(&floats(&case["init"][i]))
                            .to_device(Device::Cpu)
                            .set_requires_grad(true);
                        (n.clone(), t)
                    })
                    .collect();
                let scales: HashMap<String, f64> = names.iter().cloned().collect();
                let decay_of: HashMap<String, f64> = names
                    .iter()
                    .zip(&decays)
                    .map(|((n, _), d)| (n.clone(), f64::from(*d)))
                    .collect();
                Optimizer::new(opt, params, momentum, 0.0)
                    .with_backbone_lr_scale(|n| scales[n] == 1.0, 0.1)
                    .with_weight_decays(|n| decay_of[n])
            };
            let mut o = make();
            for (step, lr) in lrs.iter().enumerate() {
                if step == 2 {
                    // Interrupted: the state and the parameters go on in a new optimizer.
                    let state = o.state();
                    let kinds = |o: &Optimizer| o.state().keys().cloned().collect::<Vec<_>>();
                    let mut resumed = make();
                    for ((_, p), (_, q)) in resumed.params().iter().zip(o.params()) {
                        tch::no_grad(|| p.detach().copy_(q));
                    }
                    resumed.load_state(state).expect("state of this optimizer");
                    assert_eq!(kinds(&resumed), kinds(&o), "{case}");
                    o = resumed;
                }
                for (i, (_, p)) in o.params().iter().enumerate() {
                    set_grad(p, &floats(&case["grads"][step][i]));
                }
                o.step(*lr, None).expect("step");
                for (i, (name, p)) in o.params().iter().enumerate() {
                    let got = Vec::<f32>::try_from(p.detach()).expect("values");
                    let want = floats(&case["after"][step][i]);
                    let init = floats(&case["init"][i]);
                    let mut moved = 0.0f32;
                    for ((a, b), c) in got.iter().zip(&want).zip(&init) {
                        assert!(
                            (a - b).abs() <= 1e-6 * b.abs().max(1.0),
                            "{} step {step} {name}: {a} vs torch {b}",
                            opt.as_str()
                        );
                        moved = moved.max((a - c).abs());
                    }
                    // The steps are large against the tolerance: a wrong step cannot hide.
                    assert!(moved > 1e-3, "{} {name} did not move", opt.as_str());
                }
            }
        }
        assert_eq!(seen.len(), 4, "{seen:?}");
    }

    /// `--opt sgd` is the step tchrun took before `--opt` and the fused kernel, up to float
    /// rounding: the old `Sgd::step`'s arithmetic (kept here verbatim: decay added into the
    /// gradient, `buf = m·buf + d`, `p += d·(-lr·scale)`) on the same parameters and gradients,
    /// with two LR groups, agrees within 1e-6 relative after every step (the fused kernel
    /// rounds once where the loop rounds twice, so the last bit may differ).
    #[test]
    fn sgd_is_the_old_step_up_to_rounding() {
        let gen = |seed: i64, n: i64| {
            tch::manual_seed(seed);
            Tensor::randn([n], (Kind::Float, Device::Cpu))
        };
        let (momentum, wd) = (0.9, 1e-4);
        let ours: Vec<(String, Tensor)> = (0..2)
            .map(|i| (format!("p{i}"), gen(i, 7).set_requires_grad(true)))
            .collect();
        let old: Vec<Tensor> = ours.iter().map(|(_, p)| p.detach().copy()).collect();
        let mut opt =
            Optimizer::new(Opt::Sgd, ours, momentum, wd).with_backbone_lr_scale(|n| n == "p1", 0.3);
        let mut bufs: Vec<Option<Tensor>> = vec![None, None];
        for (step, lr) in [0.1, 0.07, 0.2].into_iter().enumerate() {
            for (i, (_, p)) in opt.params().iter().enumerate() {
                let g = gen(100 + 10 * step as i64 + i as i64, 7);
                set_grad(p, &Vec::<f32>::try_from(&g).expect("grad"));
                // The old step, on the old copy.
                tch::no_grad(|| {
                    let scale = if i == 1 { 1.0 } else { 0.3 };
                    let mut d = g.shallow_clone();
                    let _ = d.g_add_(&(&old[i] * wd));
                    let d = match &mut bufs[i] {
                        Some(buf) => {
                            let _ = buf.g_mul_scalar_(momentum).g_add_(&d);
                            buf.shallow_clone()
                        }
                        None => {
                            let buf = d.detach().copy();
                            bufs[i] = Some(buf.shallow_clone());
                            buf
                        }
                    };
                    let mut p = old[i].shallow_clone();
                    let _ = p.g_add_(&(d * (-lr * scale)));
                });
            }
            opt.step(lr, None).expect("step");
            for ((_, p), q) in opt.params().iter().zip(&old) {
                let (a, b) = (
                    Vec::<f32>::try_from(p.detach()).expect("ours"),
                    Vec::<f32>::try_from(q).expect("old"),
                );
                assert!(
                    a.iter()
                        .zip(&b)
                        .all(|(x, y)| (x - y).abs() <= 1e-6 * y.abs().max(1e-3)),
                    "step {step}: {a:?} vs {b:?}"
                );
            }
        }
    }

    /// SGD's state keeps the checkpoint names it had before `--opt` (`momentum.<param>`);
    /// another optimizer's state is refused by name; RMSprop and AdamW count steps.
    #[test]
    fn state_names_and_refusals() {
        let p = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let mut sgd = Optimizer::new(Opt::Sgd, vec![("w".into(), p.shallow_clone())], 0.9, 0.0);
        set_grad(&p, &[1.0, 2.0, 3.0]);
        sgd.step(0.1, None).expect("step");
        assert_eq!(sgd.state().keys().collect::<Vec<_>>(), ["momentum.w"]);
        let mut adamw = Optimizer::new(Opt::Adamw, vec![("w".into(), p.shallow_clone())], 0.9, 0.0);
        adamw.step(0.1, None).expect("step");
        adamw.step(0.1, None).expect("step");
        let state = adamw.state();
        assert_eq!(
            state.keys().collect::<Vec<_>>(),
            ["exp_avg.w", "exp_avg_sq.w", "step.w"]
        );
        assert_eq!(state["step.w"].double_value(&[0]), 2.0);
        let e = adamw.load_state(sgd.state()).expect_err("SGD's state");
        assert!(
            e.contains("'momentum.w'") && e.contains("--opt adamw"),
            "{e}"
        );
        assert!(adamw.placeholder("exp_avg.v").is_err());
        assert_eq!(adamw.placeholder("step.w").expect("step").size(), [1]);
    }

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
        let mut sgd = Optimizer::new(
            Opt::Sgd,
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
            sgd.step(lr, None).expect("step");
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

    /// A channels-last weight whose gradient (a bucket view) and momentum buffer (read from a
    /// checkpoint) are laid out as NCHW: the fused kernel walks memory, so they are put into the
    /// weight's layout first, and the step is the plain arithmetic's.
    #[test]
    fn the_fused_step_is_right_for_a_channels_last_weight_with_an_nchw_gradient() {
        tch::manual_seed(3);
        let opts = (Kind::Float, Device::Cpu);
        let w0 = Tensor::randn([8, 4, 3, 3], opts);
        let w = crate::models::channels_last(&w0.copy()).set_requires_grad(true);
        assert_ne!(w.stride(), w0.stride(), "the weight is channels-last");
        let mut opt = Optimizer::new(Opt::Sgd, vec![("w".into(), w.shallow_clone())], 0.9, 0.0);
        let buf = Tensor::randn([8, 4, 3, 3], opts);
        let mut state = BTreeMap::new();
        state.insert("momentum.w".to_string(), buf.copy());
        opt.load_state(state).expect("state");
        let g = Tensor::randn([8, 4, 3, 3], opts);
        set_grad(&w, &Vec::<f32>::try_from(&g.flatten(0, -1)).expect("grad"));
        // The gradient as a contiguous (NCHW) tensor, as a bucket view hands it over.
        tch::no_grad(|| {
            let mut grad = w.grad();
            let _ = grad.copy_(&g);
        });
        opt.step(0.1, None).expect("step");
        let want = &w0 - (buf * 0.9 + &g) * 0.1;
        let diff = (w.detach() - want).abs().max().double_value(&[]);
        assert!(diff < 1e-5, "differs by {diff}");
    }

    /// The fp16 scaler's overflow flag: at 1 no optimizer changes a weight or its state (SGD's
    /// fused kernel reads it on the device; a skipped first step leaves a zero buffer, not an
    /// unset one), and at 0 every step equals the step without the flag bit for bit (SGD's
    /// first step from a zero buffer is the first step).
    #[test]
    fn the_overflow_flag_skips_the_step_and_otherwise_changes_nothing() {
        let (set, clear) = (Tensor::from(1.0f32), Tensor::from(0.0f32));
        for opt in [Opt::Sgd, Opt::SgdNesterov, Opt::Rmsprop, Opt::Adamw] {
            let make = || {
                let p = Tensor::from_slice(&[0.5f32, -1.5, 2.0]).set_requires_grad(true);
                Optimizer::new(opt, vec![("p".into(), p)], 0.9, 1e-4)
            };
            let (mut flagged, mut plain) = (make(), make());
            let weights =
                |o: &Optimizer| Vec::<f32>::try_from(o.params()[0].1.detach()).expect("w");
            set_grad(&flagged.params()[0].1, &[f32::NAN, 1.0, 2.0]);
            flagged.step(0.1, Some(&set)).expect("skipped step");
            assert_eq!(weights(&flagged), vec![0.5, -1.5, 2.0], "{opt:?}");
            for (step, g) in [[0.1f32, -0.2, 0.3], [0.4, 0.5, -0.6]].iter().enumerate() {
                set_grad(&flagged.params()[0].1, g);
                set_grad(&plain.params()[0].1, g);
                flagged.step(0.1, Some(&clear)).expect("step");
                plain.step(0.1, None).expect("step");
                assert_eq!(weights(&flagged), weights(&plain), "{opt:?} step {step}");
            }
        }
    }
}
