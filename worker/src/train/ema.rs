//! `--model-ema`: torchvision's `ExponentialMovingAverage` (torch's `AveragedModel` with
//! `use_buffers=True`) of the trained model's parameters and batch-norm statistics. Every rank
//! keeps it (the replicas are identical after each step, and validation is sharded): updated
//! after the optimizer step of an epoch's steps 0, N, 2N, ... (`--model-ema-steps` N), its
//! count reset to 0 during the warmup epochs, validated every epoch beside the model,
//! checkpointed (`ema.<name>`, `ema.n_averaged`) and written by rank 0 as `<output>/ema/`.
//! Knows no loader and no file format.
use super::validate::{validate, BadImages, Validation};
use super::{RankCtx, TrainError};
use crate::comm::ddp::Replicator;
use crate::models;
use std::collections::BTreeMap;
use tch::{nn, Device, Kind, Tensor};
use tchrun::flags::TrainJob;
use tchrun::model::ModelConfig;
use tchrun::recipe::EmaRecord;
use tchrun_data::ImageFolder;

/// The names of the EMA's tensors in a checkpoint and in the best weights: `ema.<name>`, and
/// its update count.
pub(super) const PREFIX: &str = "ema.";
pub(super) const N_AVERAGED: &str = "ema.n_averaged";

/// The average: tensors paired, in order, with the model's of the same names.
pub(crate) struct Average {
    pub(crate) named: Vec<(String, Tensor)>,
    /// torch's `n_averaged`: updates since the start or the last reset.
    pub(crate) n_averaged: i64,
    /// The decay each update uses (`tchrun::recipe::ema_decay`).
    pub(crate) decay: f64,
}

impl Average {
    /// torch's `AveragedModel.update_parameters` with torchvision's `ema_avg`: the first update
    /// (`n_averaged` 0) copies the model; later ones set `avg = decay × avg + (1 - decay) × p`,
    /// the same tensor operations torch runs (its dtype, its rounding).
    pub(crate) fn update(&mut self, model: &[(String, Tensor)]) {
        tch::no_grad(|| {
            for ((_, avg), (_, p)) in self.named.iter().zip(model) {
                let mut a = avg.detach();
                let p = p.detach();
                if self.n_averaged == 0 {
                    a.copy_(&p);
                } else {
                    let v = &a * self.decay + &p * (1.0 - self.decay);
                    a.copy_(&v);
                }
            }
        });
        self.n_averaged += 1;
    }
}

/// The EMA model: its average, its own network (for validation) and when it updates.
pub(super) struct Ema {
    pub(super) avg: Average,
    /// `--model-ema-steps`.
    every: u64,
    warmup_epochs: u32,
    /// `--model-ema-decay` as given.
    flag_decay: f64,
    /// The variables `net` and `avg` live in.
    _vs: nn::VarStore,
    net: Box<dyn nn::ModuleT>,
}

impl Ema {
    /// The EMA of `named` when `--model-ema` is given: a copy of the model (rank 0 reads a
    /// resumed one from `loaded`, the checkpoint's `ema.*`), then rank 0's sent to every rank.
    pub(super) fn start(
        job: &TrainJob,
        ctx: &RankCtx,
        cfg: &ModelConfig,
        classes: usize,
        named: &[(String, Tensor)],
        loaded: Option<BTreeMap<String, Tensor>>,
    ) -> Result<Option<Ema>, TrainError> {
        let r = &job.options.recipe;
        if !r.model_ema {
            return Ok(None);
        }
        let (p, pg) = (&job.params, ctx.pg);
        let step_images = match job.options.global_batch_size {
            Some(g) => u64::from(g),
            None => pg.size() as u64 * u64::from(p.batch_size),
        };
        let decay =
            tchrun::recipe::ema_decay(r.model_ema_decay, step_images, r.model_ema_steps, p.epochs);
        let vs = nn::VarStore::new(ctx.device);
        let net = models::build(
            cfg.arch,
            &vs.root(),
            classes as i64,
            cfg.input_size.into(),
            cfg.memory_efficient,
        );
        let ema: Vec<(String, Tensor)> = models::named(&vs).into_iter().collect();
        let names = |v: &[(String, Tensor)]| v.iter().map(|x| x.0.clone()).collect::<Vec<_>>();
        if names(&ema) != names(named) {
            return Err(TrainError::Invalid(
                "--model-ema: the average's tensors are not the model's".into(),
            ));
        }
        for (_, t) in &ema {
            let _ = t.set_requires_grad(false);
        }
        if super::layout(job, ctx.device, cfg).channels_last {
            models::to_channels_last(&ema);
        }
        let mut avg = Average {
            named: ema,
            n_averaged: 0,
            decay,
        };
        tch::no_grad(|| -> Result<(), TrainError> {
            for ((name, a), (_, m)) in avg.named.iter().zip(named) {
                let src = match &loaded {
                    Some(l) => l.get(&format!("{PREFIX}{name}")).ok_or_else(|| {
                        TrainError::Checkpoint(format!(
                            "--resume with --model-ema: the checkpoint lacks '{PREFIX}{name}'"
                        ))
                    })?,
                    None => m,
                };
                a.detach().copy_(&src.to_kind(a.kind()));
            }
            Ok(())
        })?;
        if let Some(n) = loaded.as_ref().and_then(|l| l.get(N_AVERAGED)) {
            avg.n_averaged = n.int64_value(&[]);
        }
        if pg.size() > 1 {
            let tensors: Vec<Tensor> = avg.named.iter().map(|(_, t)| t.shallow_clone()).collect();
            Replicator::broadcast_tensors(pg, &tensors)?;
            let mut n = Tensor::full([1], avg.n_averaged as f64, (Kind::Double, ctx.device));
            pg.broadcast(&mut [&mut n], 0)?;
            avg.n_averaged = n.to_device(Device::Cpu).double_value(&[0]).round() as i64;
        }
        tracing::info!(
            "--model-ema: decay {decay:e} per update (--model-ema-decay {:e} adjusted for {} \
             images per step × --model-ema-steps {} / --epochs {}), {} update(s) so far",
            r.model_ema_decay,
            step_images,
            r.model_ema_steps,
            p.epochs,
            avg.n_averaged
        );
        Ok(Some(Ema {
            avg,
            every: u64::from(r.model_ema_steps),
            warmup_epochs: p.warmup_epochs,
            flag_decay: r.model_ema_decay,
            _vs: vs,
            net,
        }))
    }

    /// After the optimizer step `it` (0-based in its epoch) of `epoch` (0-based), as
    /// torchvision's train_one_epoch: every `--model-ema-steps`-th step updates, and during the
    /// warmup epochs the count is reset (the next update copies the weights again).
    pub(super) fn after_step(&mut self, epoch: u32, it: u64, model: &[(String, Tensor)]) {
        if it % self.every == 0 {
            self.avg.update(model);
            if epoch < self.warmup_epochs {
                self.avg.n_averaged = 0;
            }
        }
    }

    /// The EMA's tensors and count under their checkpoint names (the tensors shared, not
    /// copied).
    fn state(&self) -> impl Iterator<Item = (String, Tensor)> + '_ {
        self.avg
            .named
            .iter()
            .map(|(n, t)| (format!("{PREFIX}{n}"), t.shallow_clone()))
            .chain(std::iter::once((
                N_AVERAGED.to_string(),
                Tensor::from(self.avg.n_averaged),
            )))
    }

    /// `model.json`'s `ema` of the weights written with `n_averaged` updates.
    pub(super) fn record(&self, n_averaged: i64) -> EmaRecord {
        EmaRecord {
            decay: self.flag_decay,
            adjusted_decay: self.avg.decay,
            steps: self.every as u32,
            n_averaged: n_averaged.max(0) as u64,
        }
    }
}

/// The EMA's part of best weights (`ema.*`, taken out of `weights`): its tensors by the
/// model's names, and its count. `None` when there is none.
pub(super) fn split_best(
    weights: &mut BTreeMap<String, Tensor>,
) -> Option<(BTreeMap<String, Tensor>, i64)> {
    let keys: Vec<String> = weights
        .keys()
        .filter(|k| k.starts_with(PREFIX))
        .cloned()
        .collect();
    if keys.is_empty() {
        return None;
    }
    let mut n = 0;
    let mut out = BTreeMap::new();
    for k in keys {
        if let Some(t) = weights.remove(&k) {
            if k == N_AVERAGED {
                n = t.int64_value(&[]);
            } else {
                out.insert(k[PREFIX.len()..].to_string(), t);
            }
        }
    }
    Some((out, n))
}

/// What a checkpoint keeps beside the model: the optimizer's state (`opt_state`) and the EMA's.
pub(super) fn saved_state(
    mut opt_state: BTreeMap<String, Tensor>,
    ema: Option<&Ema>,
) -> BTreeMap<String, Tensor> {
    if let Some(e) = ema {
        opt_state.extend(e.state());
    }
    opt_state
}

/// The weights of an epoch that improved (rank 0 keeps them on the CPU): the model's `named`
/// and the EMA's (`ema.*`).
pub(super) fn best_snapshot(
    named: &[(String, Tensor)],
    ema: Option<&Ema>,
) -> BTreeMap<String, Tensor> {
    let cpu = |t: &Tensor| t.detach().to_device(Device::Cpu).copy();
    let mut b: BTreeMap<String, Tensor> = named.iter().map(|(n, t)| (n.clone(), cpu(t))).collect();
    if let Some(e) = ema {
        b.extend(e.state().map(|(n, t)| (n, cpu(&t))));
    }
    b
}

impl Ema {
    /// The EMA model's validation on the same images as the model's (its skipped images are
    /// the model's: `bad_images` is the trainer's).
    pub(super) fn validate(
        &self,
        valid: &ImageFolder,
        cfg: &ModelConfig,
        job: &TrainJob,
        ctx: &RankCtx,
        bad_images: &mut BadImages,
    ) -> Result<Validation, TrainError> {
        validate(self.net.as_ref(), valid, cfg, job, ctx, bad_images, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The EMA of a sequence of weights equals torchvision's `ExponentialMovingAverage` on the
    /// same sequence (tests/python/recipe_reference.py `ema`): the decay adjusted as
    /// torchvision's train.py, updates every `steps` steps of an epoch, the count reset during
    /// the warmup epochs; parameters, float buffers and an integer buffer alike, within 1e-6.
    #[test]
    fn ema_equals_torchvision_exponential_moving_average() {
        let v = crate::train::recipe_reference("ema");
        let mut checked = 0;
        for case in v["cases"].as_array().expect("cases") {
            let c = &case["config"];
            let n = |k: &str| c[k].as_u64().expect(k);
            let decay = tchrun::recipe::ema_decay(
                c["decay"].as_f64().expect("decay"),
                n("world_size") * n("batch_size"),
                n("steps") as u32,
                n("epochs") as u32,
            );
            assert_eq!(decay, case["adjusted_decay"].as_f64().expect("adjusted"));
            let names: Vec<String> = case["names"]
                .as_array()
                .expect("names")
                .iter()
                .map(|x| x.as_str().expect("name").to_string())
                .collect();
            let tensor = |x: &serde_json::Value, name: &str| {
                let vals: Vec<f64> = x
                    .as_array()
                    .expect("values")
                    .iter()
                    .map(|x| x.as_f64().expect("number"))
                    .collect();
                let t = Tensor::from_slice(&vals);
                if name.ends_with("num_batches_tracked") {
                    t.to_kind(Kind::Int64)
                } else {
                    t.to_kind(Kind::Float)
                }
            };
            let model_at = |s: &serde_json::Value| -> Vec<(String, Tensor)> {
                names
                    .iter()
                    .map(|name| (name.clone(), tensor(&s[name], name)))
                    .collect()
            };
            let seq = case["weights"].as_array().expect("weights");
            let (epochs, per_epoch) = (n("epochs"), n("steps_per_epoch"));
            let mut ema = Ema {
                avg: Average {
                    named: model_at(&seq[0]),
                    n_averaged: 0,
                    decay,
                },
                every: n("steps"),
                warmup_epochs: n("warmup_epochs") as u32,
                flag_decay: 0.0,
                _vs: nn::VarStore::new(Device::Cpu),
                net: Box::new(nn::seq_t()),
            };
            let wants = case["ema"].as_array().expect("ema");
            for epoch in 0..epochs {
                for it in 0..per_epoch {
                    let k = (epoch * per_epoch + it) as usize;
                    ema.after_step(epoch as u32, it, &model_at(&seq[k]));
                    let want = &wants[k];
                    assert_eq!(
                        ema.avg.n_averaged,
                        want["n_averaged"].as_i64().expect("n"),
                        "step {k}"
                    );
                    for (name, t) in &ema.avg.named {
                        let w = tensor(&want[name.as_str()], name);
                        let d = (t.to_kind(Kind::Double) - w.to_kind(Kind::Double))
                            .abs()
                            .max()
                            .double_value(&[]);
                        assert!(d <= 1e-6, "step {k} {name}: off by {d}");
                        checked += 1;
                    }
                }
            }
        }
        assert!(checked > 100, "{checked}");
    }
}
