//! `RunRecord`: what defines a run, recorded in `last.json`, and the mismatches a resume
//! refuses (`Mismatch`).
use crate::flags::TrainJob;
use crate::model::ModelConfig;
use serde::{Deserialize, Serialize};

/// The model, data and flags that define a run: a resume must use the same (but `--epochs`,
/// which may grow, and the world size, which `--global-batch-size` makes irrelevant).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct RunRecord {
    pub arch: String,
    pub input_size: u32,
    pub class_names: Vec<String>,
    pub epochs: u32,
    pub batch_size: u32,
    pub global_batch_size: Option<u32>,
    pub warmup_epochs: u32,
    pub lr: f64,
    /// `--lr-scaling`, as the flag spells it (`"linear"`).
    pub lr_scaling: crate::flags::LrScaling,
    /// The batch `--lr` is given for (`schedule::lr_reference_batch`); absent in checkpoints
    /// written before it existed, whose reference was `--batch-size`.
    #[serde(default)]
    pub lr_reference_batch: Option<u32>,
    pub lr_power: f64,
    pub momentum: f64,
    pub weight_decay: f64,
    pub seed: i64,
    pub patience: u32,
    pub min_crop_scale: f64,
    pub no_hflip: bool,
    pub freeze_backbone: bool,
    pub backbone_lr_scale: f64,
    /// `--amp`, as the flag spells it (`"off"`).
    pub amp: crate::flags::Amp,
    /// Each rank's intra-op (libtorch) threads, as the ranks ran them (the launcher's record
    /// has none). Not compared: a resume at another thread count is allowed, and said
    /// (`threads_note`), since sums over other thread splits round differently.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_op_threads: Option<u32>,
    /// The recipe flags (`--lr-scheduler`, `--label-smoothing`, ...); absent in checkpoints
    /// written before they existed, which read as the old behaviour.
    #[serde(flatten, default)]
    pub recipe: crate::recipe::RecipeRecord,
    /// The augmentation and crop-size flags (`--mixup-alpha`, `--train-crop-size`, ...);
    /// absent in checkpoints written before they existed (the old behaviour).
    #[serde(flatten, default)]
    pub augment: crate::augment_flags::AugmentRecord,
    /// `--class-weights` (the flag and, from a rank, the weights it resolved to).
    #[serde(flatten, default)]
    pub class_weights: crate::class_weights::ClassWeightsRecord,
}

impl RunRecord {
    /// The record of `job` training `cfg` on a dataset with `classes`.
    pub fn of(job: &TrainJob, cfg: &ModelConfig, classes: &[String]) -> RunRecord {
        let (p, o) = (&job.params, &job.options);
        RunRecord {
            arch: cfg.arch.name().to_string(),
            input_size: cfg.input_size,
            class_names: classes.to_vec(),
            epochs: p.epochs,
            batch_size: p.batch_size,
            global_batch_size: o.global_batch_size,
            warmup_epochs: p.warmup_epochs,
            lr: p.lr,
            lr_scaling: o.lr_scaling,
            lr_reference_batch: Some(crate::schedule::lr_reference_batch(
                p.batch_size,
                o.global_batch_size,
                o.lr_reference_batch,
            )),
            lr_power: o.lr_power,
            momentum: o.momentum,
            weight_decay: o.weight_decay,
            seed: p.seed,
            patience: p.patience,
            min_crop_scale: o.min_crop_scale,
            no_hflip: o.no_hflip,
            freeze_backbone: o.freeze_backbone,
            backbone_lr_scale: o.backbone_lr_scale,
            amp: o.amp,
            intra_op_threads: None,
            recipe: o.recipe.record(),
            augment: o.augment.record(cfg.input_size),
            class_weights: o.class_weights.record(),
        }
    }

    /// What a resume at `threads` intra-op threads per rank says when the checkpoint's run
    /// used another count with `--global-batch-size` (whose promise, the same model at any
    /// world size, holds at equal threads per rank); `None` when nothing is to be said.
    pub fn threads_note(&self, threads: u32) -> Option<String> {
        let was = self.intra_op_threads?;
        (self.global_batch_size.is_some() && was != threads).then(|| {
            format!(
                "this job runs {threads} intra-op thread(s) per rank, the checkpoint's run ran \
                 {was}: with --global-batch-size the model is the same at any world size only at \
                 equal threads per rank (sums split over other threads round differently); \
                 --threads {was} gives the checkpoint's"
            )
        })
    }

    /// The differences that a resume refuses (what, the checkpoint's value, this job's value,
    /// the flag that gives the checkpoint's value back).
    pub fn mismatches(&self, now: &RunRecord) -> Vec<Mismatch> {
        let mut out = Vec::new();
        let flag = |out: &mut Vec<Mismatch>, what: &str, flag: String, was: String, is: String| {
            if was != is {
                out.push(Mismatch {
                    what: what.to_string(),
                    checkpoint: was,
                    now: is,
                    fix: flag,
                });
            }
        };
        flag(
            &mut out,
            "architecture",
            "--model: a model directory of that architecture".into(),
            self.arch.clone(),
            now.arch.clone(),
        );
        flag(
            &mut out,
            "input size",
            format!(
                "--model: a model directory of input size {}",
                self.input_size
            ),
            self.input_size.to_string(),
            now.input_size.to_string(),
        );
        if self.class_names != now.class_names {
            let fix = if self.class_names.len() != now.class_names.len() {
                format!(
                    "--train/--valid: the dataset with the checkpoint's {} classes",
                    self.class_names.len()
                )
            } else {
                "--train/--valid: the dataset with the checkpoint's class folders (the labels follow \
                 the sorted folder names)"
                    .to_string()
            };
            out.push(Mismatch {
                what: "classes".into(),
                checkpoint: describe_classes(&self.class_names, &now.class_names),
                now: describe_classes(&now.class_names, &self.class_names),
                fix,
            });
        }
        let fl = |name: &str, v: String| format!("--{name} {v}");
        let opt = |v: Option<u32>| v.map(|g| g.to_string()).unwrap_or_else(|| "(none)".into());
        // Per-rank batch size only defines the steps without --global-batch-size.
        if self.global_batch_size.is_none() && now.global_batch_size.is_none() {
            flag(
                &mut out,
                "--batch-size",
                fl("batch-size", self.batch_size.to_string()),
                self.batch_size.to_string(),
                now.batch_size.to_string(),
            );
        }
        flag(
            &mut out,
            "--global-batch-size",
            match self.global_batch_size {
                Some(g) => fl("global-batch-size", g.to_string()),
                None => "no --global-batch-size".into(),
            },
            opt(self.global_batch_size),
            opt(now.global_batch_size),
        );
        // The batch --lr is given for (a checkpoint without it: --batch-size, the old rule);
        // without a global batch and the flag it is --batch-size, compared above.
        let reference = |r: &RunRecord| r.lr_reference_batch.unwrap_or(r.batch_size);
        let plain = |r: &RunRecord| r.global_batch_size.is_none() && reference(r) == r.batch_size;
        if !(plain(self) && plain(now)) {
            flag(
                &mut out,
                "--lr-reference-batch",
                fl("lr-reference-batch", reference(self).to_string()),
                reference(self).to_string(),
                reference(now).to_string(),
            );
        }
        let f = |x: f64| format!("{x}");
        for (name, was, is) in [
            (
                "warmup-epochs",
                self.warmup_epochs.to_string(),
                now.warmup_epochs.to_string(),
            ),
            ("lr", f(self.lr), f(now.lr)),
            (
                "lr-scaling",
                self.lr_scaling.as_str().to_string(),
                now.lr_scaling.as_str().to_string(),
            ),
            ("lr-power", f(self.lr_power), f(now.lr_power)),
            ("momentum", f(self.momentum), f(now.momentum)),
            ("weight-decay", f(self.weight_decay), f(now.weight_decay)),
            ("seed", self.seed.to_string(), now.seed.to_string()),
            (
                "patience",
                self.patience.to_string(),
                now.patience.to_string(),
            ),
            (
                "min-crop-scale",
                f(self.min_crop_scale),
                f(now.min_crop_scale),
            ),
            (
                "backbone-lr-scale",
                f(self.backbone_lr_scale),
                f(now.backbone_lr_scale),
            ),
            ("amp", self.amp.as_str().into(), now.amp.as_str().into()),
        ] {
            flag(
                &mut out,
                &format!("--{name}"),
                fl(name, was.clone()),
                was,
                is,
            );
        }
        for (name, was, is) in [
            ("no-hflip", self.no_hflip, now.no_hflip),
            ("freeze-backbone", self.freeze_backbone, now.freeze_backbone),
        ] {
            let fix = if was {
                format!("--{name}")
            } else {
                format!("no --{name}")
            };
            let word = |b: bool| if b { "on" } else { "off" }.to_string();
            flag(&mut out, &format!("--{name}"), fix, word(was), word(is));
        }
        for (what, was, is, fix) in self.recipe.differences(&now.recipe) {
            flag(&mut out, &what, fix, was, is);
        }
        let augment = self
            .augment
            .differences(self.input_size, &now.augment, now.input_size);
        for (what, was, is, fix) in augment {
            flag(&mut out, &what, fix, was, is);
        }
        if let Some((what, was, is, fix)) = self.class_weights.difference(&now.class_weights) {
            flag(&mut out, &what, fix, was, is);
        }
        out
    }
}

/// Two class lists, told apart: the count, and the first name that differs.
fn describe_classes(a: &[String], b: &[String]) -> String {
    let first = a.iter().zip(b).position(|(x, y)| x != y);
    match first {
        Some(i) => format!("{} classes, class {i} is {:?}", a.len(), a[i]),
        None => format!("{} classes", a.len()),
    }
}

/// One value a resume would change.
#[derive(Debug, Clone, PartialEq)]
pub struct Mismatch {
    pub what: String,
    pub checkpoint: String,
    pub now: String,
    /// What gives the checkpoint's value back.
    pub fix: String,
}
