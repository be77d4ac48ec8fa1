//! The resume decision: `RunRecord` (what defines a run, recorded in `last.json`), the
//! mismatches a resume refuses, and `check`, the one decision of what a training job does with
//! the checkpoint in its `--output` (the launcher before any rank starts; rank 0 for jobs
//! started without it).
use super::{best_file, dir, read, verify_tensors, CheckpointError, Last};
use crate::flags::TrainJob;
use crate::model::ModelConfig;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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

/// What a training job does with the checkpoint in its `--output`.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No checkpoint and no `--resume`: a new run.
    Fresh,
    /// `--overwrite`: a new run replacing the previous one's checkpoint and outputs.
    Overwrite { previous: Option<Box<Last>> },
    /// `--resume` into an existing output without a checkpoint: a new run (said so).
    NothingToResume,
    /// Resume from the checkpoint; the notes say what changed (the world size, `--epochs`).
    Resume { last: Box<Last>, notes: Vec<String> },
    /// `--resume` of a run that finished with `--epochs` not larger: nothing to do.
    Complete { last: Box<Last> },
}

/// Why a training job cannot use (or ignore) the checkpoint it finds; every message says the
/// fix.
#[derive(Debug, thiserror::Error)]
pub enum ResumeError {
    #[error(
        "--output {output}: holds the checkpoint of an interrupted run (epoch {epoch}, step \
         {step}{written}); continue it with --resume, or start over in this --output with \
         --overwrite (its checkpoint and metrics are then replaced)"
    )]
    Interrupted {
        output: PathBuf,
        epoch: u32,
        step: u64,
        written: String,
    },
    #[error(
        "--output {output}: holds the checkpoint of a finished run ({epochs} epoch(s)); train \
         longer with --resume and a larger --epochs, or start over in this --output with \
         --overwrite, or choose another --output"
    )]
    Finished { output: PathBuf, epochs: u32 },
    #[error(
        "--resume: --output {0} does not exist, so there is nothing to resume; check the path, \
         or drop --resume to start a new run"
    )]
    NoOutput(PathBuf),
    #[error("--resume: the checkpoint cannot be used: {error}; {advice}")]
    Damaged {
        error: CheckpointError,
        advice: String,
    },
    #[error("{}", mismatch_text(.0))]
    Mismatch(Vec<Mismatch>),
    #[error(
        "--resume --epochs {now}: the checkpoint has done {done} epoch(s) already; pass --epochs \
         {done} or more (the run's was {was})"
    )]
    FewerEpochs { now: u32, done: u32, was: u32 },
}

fn mismatch_text(m: &[Mismatch]) -> String {
    let mut s = String::from(
        "--resume: this job does not match the checkpoint it would continue (start over in this \
         --output with --overwrite, or use another --output):",
    );
    for m in m {
        s.push_str(&format!(
            "\n  {}: checkpoint {}, this job {}; to resume, pass {}",
            m.what, m.checkpoint, m.now, m.fix
        ));
    }
    s
}

/// What can still be used when the checkpoint is damaged: the intact tensor files beside it.
fn damaged_advice(output: &Path, last: Option<&Last>) -> String {
    let d = dir(output);
    let mut intact = Vec::new();
    if let Ok(rd) = std::fs::read_dir(&d) {
        let mut names: Vec<String> = rd
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors") && !n.starts_with('.'))
            .collect();
        names.sort();
        for n in names {
            if verify_tensors(&d.join(&n)).is_ok() {
                intact.push(n);
            }
        }
    }
    let best = intact.iter().find(|n| n.starts_with("best"));
    let mut s = String::from("start over in this --output with --overwrite");
    if let Some(b) = best {
        let (arch, size) = last
            .and_then(|l| l.run.as_ref())
            .map(|r| (r.arch.clone(), r.input_size.to_string()))
            .unwrap_or_else(|| ("ARCH".into(), "SIZE".into()));
        s.push_str(&format!(
            ", or start a new run from the best weights kept intact in {}: tchrun model init \
             --arch {arch} --input-size {size} --weights {} --output NEW_MODEL",
            d.join(b).display(),
            d.join(b).display()
        ));
    }
    s
}

/// The one decision of what a training job does with `--output`'s checkpoint, before any rank
/// starts (the launcher) and on rank 0 (a job started without the launcher): `cfg` is the
/// `--model` directory's, `classes` the training set's.
pub fn check(
    job: &TrainJob,
    cfg: &ModelConfig,
    classes: &[String],
) -> Result<Decision, ResumeError> {
    let output = &job.output;
    let resume = job.options.resume;
    let damaged = |error: CheckpointError, last: Option<&Last>| ResumeError::Damaged {
        advice: damaged_advice(output, last),
        error,
    };
    if resume && !output.exists() {
        return Err(ResumeError::NoOutput(output.clone()));
    }
    let last = match read(output) {
        Ok(l) => l,
        // Overwriting replaces whatever is there, readable or not.
        Err(_) if job.options.overwrite => None,
        Err(e) => return Err(damaged(e, None)),
    };
    if job.options.overwrite {
        return Ok(Decision::Overwrite {
            previous: last.map(Box::new),
        });
    }
    let Some(last) = last else {
        return Ok(if resume {
            Decision::NothingToResume
        } else {
            Decision::Fresh
        });
    };
    if !resume {
        if last.finished {
            return Err(ResumeError::Finished {
                output: output.clone(),
                epochs: last.history.len() as u32,
            });
        }
        return Err(ResumeError::Interrupted {
            output: output.clone(),
            epoch: last.epoch + u32::from(last.batches_done > 0),
            step: last.step,
            written: last
                .written
                .as_ref()
                .map(|w| format!(", written {w}"))
                .unwrap_or_default(),
        });
    }
    let d = dir(output);
    verify_tensors(&d.join(&last.tensors)).map_err(|e| damaged(e, Some(&last)))?;
    match best_file(output, &last) {
        Some(b) => verify_tensors(&b).map_err(|e| damaged(e, Some(&last)))?,
        None if last.best_epoch.is_some() => {
            let error = CheckpointError::Damaged {
                path: d.join(crate::files::CHECKPOINT_LAST),
                reason: format!(
                    "names best epoch {} but no file of its weights",
                    last.best_epoch.unwrap_or_default()
                ),
            };
            return Err(damaged(error, Some(&last)));
        }
        None => Vec::new(),
    };
    let now = RunRecord::of(job, cfg, classes);
    let mut notes = Vec::new();
    let epochs_done = last.history.len() as u32;
    match &last.run {
        Some(was) => {
            let m = was.mismatches(&now);
            if !m.is_empty() {
                return Err(ResumeError::Mismatch(m));
            }
            if now.epochs < epochs_done.max(last.epoch) {
                return Err(ResumeError::FewerEpochs {
                    now: now.epochs,
                    done: epochs_done.max(last.epoch),
                    was: was.epochs,
                });
            }
            if last.finished && now.epochs <= was.epochs {
                return Ok(Decision::Complete {
                    last: Box::new(last),
                });
            }
            if now.epochs != was.epochs {
                notes.push(format!(
                    "--epochs {} (the checkpoint's run: {}): the LR schedule now ends after epoch {}{}",
                    now.epochs,
                    was.epochs,
                    now.epochs,
                    if last.finished {
                        format!("; the finished run continues from epoch {}", epochs_done + 1)
                    } else {
                        String::new()
                    }
                ));
            }
        }
        None => {
            // A checkpoint from before the record: only its own state can be compared.
            if last.seed != now.seed {
                return Err(ResumeError::Mismatch(vec![Mismatch {
                    what: "--seed".into(),
                    checkpoint: last.seed.to_string(),
                    now: now.seed.to_string(),
                    fix: format!("--seed {}", last.seed),
                }]));
            }
            if last.finished && now.epochs <= epochs_done {
                return Ok(Decision::Complete {
                    last: Box::new(last),
                });
            }
            notes.push(
                "the checkpoint predates the run record: its model, classes and flags are not \
                 compared with this job's"
                    .into(),
            );
        }
    }
    Ok(Decision::Resume {
        last: Box::new(last),
        notes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_global_batch_resumed_at_another_thread_count_is_said() {
        let mut r: RunRecord = serde_json::from_value(serde_json::json!({
            "arch": "resnet18", "input_size": 32, "class_names": ["a"], "epochs": 2,
            "batch_size": 8, "global_batch_size": 16, "warmup_epochs": 0, "lr": 0.1,
            "lr_scaling": "linear", "lr_power": 2.0, "momentum": 0.9, "weight_decay": 0.0001,
            "seed": 1, "patience": 0, "min_crop_scale": 0.08, "no_hflip": false,
            "freeze_backbone": false, "backbone_lr_scale": 1.0, "amp": "off"
        }))
        .expect("a record from before the thread count");
        // A checkpoint from before the recipe flags: their defaults, the old behaviour.
        assert_eq!(r.recipe, crate::recipe::RecipeRecord::default());
        assert_eq!(
            r.threads_note(2),
            None,
            "no count recorded: nothing to compare"
        );
        r.intra_op_threads = Some(1);
        assert_eq!(r.threads_note(1), None);
        let note = r.threads_note(2).expect("a note");
        assert!(
            note.starts_with(
                "this job runs 2 intra-op thread(s) per rank, the checkpoint's run ran 1"
            ),
            "{note}"
        );
        assert!(
            note.ends_with("--threads 1 gives the checkpoint's"),
            "{note}"
        );
        r.global_batch_size = None;
        assert_eq!(
            r.threads_note(2),
            None,
            "without a global batch no promise is at stake"
        );
    }

    fn record() -> RunRecord {
        RunRecord {
            arch: "resnet18".into(),
            input_size: 32,
            class_names: vec!["a".into(), "b".into()],
            epochs: 3,
            batch_size: 8,
            global_batch_size: None,
            warmup_epochs: 0,
            lr: 0.001,
            lr_scaling: crate::flags::LrScaling::Linear,
            lr_reference_batch: Some(8),
            lr_power: 1.0,
            momentum: 0.9,
            weight_decay: 1e-4,
            seed: 1,
            patience: 3,
            min_crop_scale: 0.5,
            no_hflip: true,
            freeze_backbone: false,
            backbone_lr_scale: 1.0,
            amp: crate::flags::Amp::Off,
            intra_op_threads: None,
            recipe: Default::default(),
            augment: Default::default(),
            class_weights: Default::default(),
        }
    }

    #[test]
    fn a_run_record_names_every_difference_and_its_fix() {
        let was = record();
        assert!(was.mismatches(&was).is_empty());
        let mut now = record();
        now.epochs = 5; // may grow: not a mismatch
        assert!(was.mismatches(&now).is_empty());
        now.batch_size = 16;
        now.lr_reference_batch = Some(16);
        now.input_size = 64;
        now.class_names = vec!["b".into(), "a".into()];
        now.no_hflip = false;
        let m = was.mismatches(&now);
        let whats: Vec<&str> = m.iter().map(|m| m.what.as_str()).collect();
        assert_eq!(
            whats,
            ["input size", "classes", "--batch-size", "--no-hflip"]
        );
        assert_eq!(m[2].fix, "--batch-size 8");
        assert_eq!(m[1].checkpoint, "2 classes, class 0 is \"a\"");
        assert_eq!(m[3].fix, "--no-hflip");
        // With --global-batch-size the per-rank batch follows the world size.
        let (mut a, mut b) = (record(), record());
        a.global_batch_size = Some(32);
        b.global_batch_size = Some(32);
        (a.lr_reference_batch, b.lr_reference_batch) = (Some(32), Some(32));
        b.batch_size = 16;
        assert!(a.mismatches(&b).is_empty());
        // A checkpoint from before the reference batch: its LR was --lr × G / --batch-size.
        a.lr_reference_batch = None;
        let m = a.mismatches(&b);
        assert_eq!(m.len(), 1, "{m:?}");
        assert_eq!(
            (
                m[0].what.as_str(),
                m[0].checkpoint.as_str(),
                m[0].now.as_str()
            ),
            ("--lr-reference-batch", "8", "32")
        );
        assert_eq!(m[0].fix, "--lr-reference-batch 8");
        // The recipe flags: each difference names the flag that gives the checkpoint's back.
        let mut now = record();
        now.recipe.lr_scheduler = "cosineannealinglr".into();
        now.recipe.label_smoothing = 0.1;
        let m = record().mismatches(&now);
        let fixes: Vec<&str> = m.iter().map(|m| m.fix.as_str()).collect();
        assert_eq!(fixes, ["--lr-scheduler poly", "--label-smoothing 0"]);
        // A run record round-trips with the recipe flattened into it.
        let text = serde_json::to_string(&now).expect("json");
        assert!(
            text.contains("\"lr_scheduler\":\"cosineannealinglr\""),
            "{text}"
        );
        assert_eq!(
            serde_json::from_str::<RunRecord>(&text).expect("reads"),
            now
        );
        // The augmentation flags: an old checkpoint (none recorded) is the input size's crops;
        // a change names the flag; the record round-trips beside the recipe's.
        let mut now = record();
        now.augment.train_crop_size = Some(32);
        assert!(record().mismatches(&now).is_empty());
        now.augment.mixup_alpha = 0.2;
        now.augment.val_resize_size = Some(40);
        let m = record().mismatches(&now);
        let fixes: Vec<&str> = m.iter().map(|m| m.fix.as_str()).collect();
        assert_eq!(fixes, ["--mixup-alpha 0", "--val-resize-size 37"]);
        let text = serde_json::to_string(&now).expect("json");
        assert_eq!(
            serde_json::from_str::<RunRecord>(&text).expect("reads"),
            now
        );
    }
}
