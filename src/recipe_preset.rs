//! `--recipe NAME`: a published training recipe's flag values in one flag. Each value is the
//! flag's own (the same checks, records and resume rules); a flag the user gives on the command
//! line or in its `TCHRUN_*` variable keeps the user's value. The command line is parsed once;
//! clap says which flags the user gave (`Given`), and the launcher then expands the recipe, an
//! explicit step before its pre-flight (`TrainJob::with_recipe`, the model's input size read
//! by the launcher), so the ranks receive plain flags. Nothing is read while parsing.
use crate::flags::TrainJob;
use clap::{Args, Command, FromArgMatches};

mod families;
mod setting;
pub use families::{expand, suggestion, Suggestion};
pub use setting::{at_input, scaled, Given, Preset, PresetFlags, Setting, Value};

/// Why a recipe could not be applied to a job.
#[derive(Debug, thiserror::Error)]
pub enum RecipeError {
    #[error(transparent)]
    Argv(#[from] crate::argv::ArgvError),
    #[error("--recipe {recipe}: {error}")]
    Flags { recipe: &'static str, error: String },
}

impl TrainJob {
    /// The job with its `--recipe` applied: each flag of the recipe that the user did not give
    /// takes the recipe's value (`expand`), a size scaled to `input_size` (left out when it is
    /// unknown: the pre-flight then refuses the model directory itself); the job itself when
    /// it names no recipe. Reads nothing: the job's flags as a rank gets them (`argv`), then
    /// the recipe's, parsed as a job with no `TCHRUN_*` variable read (the job already holds
    /// theirs); the groups a recipe never sets are kept as parsed.
    pub fn with_recipe(&self, given: &Given, input_size: Option<u32>) -> Result<Self, RecipeError> {
        let Some(preset) = self.options.preset.recipe else {
            return Ok(self.clone());
        };
        let extra = expand(preset, |id| given.contains(id), input_size);
        if extra.is_empty() {
            return Ok(self.clone());
        }
        // The paths are no recipe's: placeholders, so that any path passes through argv.
        let mut probe = self.clone();
        for p in [
            &mut probe.model,
            &mut probe.train,
            &mut probe.valid,
            &mut probe.output,
        ] {
            *p = "-".into();
        }
        probe.options.prometheus_textfile = None;
        let mut line = vec!["recipe".to_string()];
        line.extend(crate::argv::argv(&probe)?);
        line.extend(crate::argv::argv_changed(&probe.options.recipe)?);
        line.extend(crate::argv::argv_changed(&probe.options.augment)?);
        line.extend(extra);
        let cmd = TrainJob::augment_args(Command::new("recipe"))
            .args_override_self(true)
            .mut_args(|a| a.env(None::<&str>));
        let bad = |e: clap::Error| RecipeError::Flags {
            recipe: preset.as_str(),
            error: e.to_string(),
        };
        let m = cmd.try_get_matches_from(line).map_err(bad)?;
        let parsed = TrainJob::from_arg_matches(&m).map_err(bad)?;
        let mut out = self.clone();
        out.params = parsed.params;
        let kept = std::mem::replace(&mut out.options, parsed.options);
        out.options.prometheus_textfile = kept.prometheus_textfile;
        out.options.class_weights = kept.class_weights;
        out.options.preset = kept.preset;
        out.options.mlflow = kept.mlflow;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The recipe's values at 224 px are torchvision's command's; sizes scale with the input;
    /// a flag the user gave is left to the user.
    #[test]
    fn expansion_keeps_given_flags_and_scales_sizes() {
        let all = expand(Preset::TorchvisionV2, |_| false, Some(224));
        for want in [
            "--train-crop-size=176",
            "--val-resize-size=232",
            "--lr=0.5",
            "--lr-reference-batch=1024",
            "--model-ema",
            "--ra-sampler",
            "--ra-reps=4",
            "--auto-augment=ta_wide",
        ] {
            assert!(all.iter().any(|a| a == want), "{want} in {all:?}");
        }
        let small = expand(Preset::TorchvisionV2, |id| id == "epochs", Some(32));
        assert!(
            small.iter().any(|a| a == "--train-crop-size=25"),
            "{small:?}"
        );
        assert!(
            small.iter().any(|a| a == "--val-resize-size=33"),
            "{small:?}"
        );
        assert!(
            !small.iter().any(|a| a.starts_with("--epochs")),
            "{small:?}"
        );
        let unknown = expand(Preset::TorchvisionV2, |_| false, None);
        assert!(!unknown
            .iter()
            .any(|a| a.contains("crop") || a.contains("resize")));
        assert_eq!(at_input(176, 224), 176);
        assert_eq!(at_input(232, 64), 66);
    }

    /// The recipe applied after one parse: the flags the user gave keep their value (one at
    /// its default too: `--lr-scheduler poly`), the others take the recipe's, sizes scaled;
    /// what the recipe does not set is as parsed, and a job without a recipe is unchanged.
    #[test]
    fn with_recipe_keeps_the_given_flags_and_sets_the_others() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: Cmd,
        }
        #[derive(clap::Subcommand)]
        enum Cmd {
            Train(TrainJob),
        }
        let parse = |extra: &[&str]| {
            let mut line = vec!["x", "train", "--model=m", "--train=t", "--valid=v"];
            line.extend(["--output=o", "--seed=7"]);
            line.extend(extra);
            let args = line.into_iter().map(std::ffi::OsString::from).collect();
            let (
                Cli {
                    cmd: Cmd::Train(job),
                },
                given,
            ) = crate::flags::try_parse_from::<Cli>(args).expect("parses");
            (job, given)
        };
        let (job, given) = parse(&[
            "--recipe",
            "torchvision-v2",
            "--epochs=1",
            "--lr-scheduler=poly",
        ]);
        assert!(given.contains("epochs") && given.contains("lr_scheduler"));
        assert!(!given.contains("batch_size"));
        let out = job.with_recipe(&given, Some(32)).expect("applies");
        assert_eq!(out.params.epochs, 1);
        assert_eq!(out.params.batch_size, 128);
        assert_eq!(out.params.seed, job.params.seed);
        assert_eq!(
            out.options.recipe.lr_scheduler,
            job.options.recipe.lr_scheduler
        );
        assert_eq!(out.options.recipe.label_smoothing, 0.1);
        assert!(out.options.recipe.model_ema);
        assert_eq!(out.options.augment.train_crop_size, Some(25));
        assert_eq!(out.options.lr_reference_batch, Some(1024));
        assert_eq!(out.options.preset, job.options.preset);
        assert_eq!((&out.model, &out.output), (&job.model, &job.output));
        let (plain, given) = parse(&["--epochs=1"]);
        assert_eq!(
            plain.with_recipe(&given, Some(32)).expect("nothing to do"),
            plain
        );
    }
}
