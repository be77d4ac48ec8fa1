//! The resume decision: `check`, the one decision of what a training job does with
//! the checkpoint in its `--output` (the launcher before any rank starts; rank 0 for jobs
//! started without it).
use super::last::{best_file, dir, read, verify_tensors, CheckpointError, Last};
use super::run_record::{Mismatch, RunRecord};
use crate::flags::TrainJob;
use crate::model::ModelConfig;
use std::path::{Path, PathBuf};

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
