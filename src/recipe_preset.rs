//! `--recipe NAME`: a published training recipe's flag values in one flag. Each value is the
//! flag's own (the same checks, records and resume rules); a flag the user gives on the command
//! line or in its `TCHRUN_*` variable keeps the user's value. The launcher expands the recipe
//! before its pre-flight (`parse_or_exit` parses twice: once to learn the recipe and which flags
//! were given, once with the recipe's other flags added), so the ranks receive plain flags.
use clap::parser::ValueSource;
use clap::ArgMatches;
use std::ffi::OsString;
use std::path::PathBuf;

mod families;
pub use families::{suggestion, Suggestion};

/// `--recipe` (help heading "Training"); the launcher has expanded it when the ranks parse it.
#[derive(clap::Args, Debug, Clone, PartialEq, Default)]
pub struct PresetFlags {
    /// A published recipe's values for every flag it sets that is not given on the command
    /// line or in its variable: torchvision-v2 is torchvision's ResNet-50 IMAGENET1K_V2 recipe,
    /// the others torchvision's recipe of that family (docs/training.md lists their flags;
    /// sizes scaled to the model's input size). model.json's suggested_recipe names the
    /// model's.
    #[arg(help_heading = "Training", long, env = "TCHRUN_RECIPE", value_enum)]
    pub recipe: Option<Preset>,
}

/// The recipes `--recipe` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Preset {
    /// torchvision's "new training recipe" of ResNet-50's `IMAGENET1K_V2` weights (80.858 %
    /// top-1), `references/classification` README and the weights' `recipe` link.
    #[value(name = "torchvision-v2")]
    TorchvisionV2,
    /// torchvision's ConvNeXt recipe (AdamW, cosine; `references/classification` README).
    #[value(name = "torchvision-convnext")]
    TorchvisionConvnext,
    /// torchvision's EfficientNetV2 recipe (efficientnet_v2_s and _m's weights).
    #[value(name = "torchvision-efficientnet-v2")]
    TorchvisionEfficientnetV2,
    /// torchvision's MobileNetV3 recipe (RMSprop, a step decay every 2 epochs).
    #[value(name = "torchvision-mobilenet-v3")]
    TorchvisionMobilenetV3,
    /// torchvision's RegNet recipe (its small models'; cosine with a warmup).
    #[value(name = "torchvision-regnet")]
    TorchvisionRegnet,
    /// torchvision's Swin Transformer recipe (AdamW, cosine to 1e-5).
    #[value(name = "torchvision-swin")]
    TorchvisionSwin,
    /// torchvision's vit_b_16 recipe (AdamW, cosine, RandAugment).
    #[value(name = "torchvision-vit")]
    TorchvisionVit,
}

impl Preset {
    pub fn as_str(self) -> &'static str {
        match self {
            Preset::TorchvisionV2 => "torchvision-v2",
            Preset::TorchvisionConvnext => "torchvision-convnext",
            Preset::TorchvisionEfficientnetV2 => "torchvision-efficientnet-v2",
            Preset::TorchvisionMobilenetV3 => "torchvision-mobilenet-v3",
            Preset::TorchvisionRegnet => "torchvision-regnet",
            Preset::TorchvisionSwin => "torchvision-swin",
            Preset::TorchvisionVit => "torchvision-vit",
        }
    }

    /// The recipe's settings, in the order torchvision's command line gives them.
    pub fn settings(self) -> &'static [Setting] {
        match self {
            Preset::TorchvisionV2 => TORCHVISION_V2,
            Preset::TorchvisionConvnext => families::CONVNEXT,
            Preset::TorchvisionEfficientnetV2 => families::EFFICIENTNET_V2,
            Preset::TorchvisionMobilenetV3 => families::MOBILENET_V3,
            Preset::TorchvisionRegnet => families::REGNET,
            Preset::TorchvisionSwin => families::SWIN,
            Preset::TorchvisionVit => families::VIT,
        }
    }
}

/// One flag of a recipe: clap's argument id (the field's name), the flag, its value.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Setting {
    pub id: &'static str,
    pub flag: &'static str,
    pub value: Value,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// The value as written.
    Text(&'static str),
    /// A switch turned on.
    On,
    /// A size in pixels given for inputs of the second value's size (224 px for most of
    /// torchvision's recipes): scaled to the model's input size, `round(px × input / of)` (the
    /// value itself at that size).
    Scaled(u32, u32),
}

pub(crate) const fn text(id: &'static str, flag: &'static str, v: &'static str) -> Setting {
    Setting {
        id,
        flag,
        value: Value::Text(v),
    }
}

/// A switch the recipe turns on.
pub(crate) const fn on(id: &'static str, flag: &'static str) -> Setting {
    Setting {
        id,
        flag,
        value: Value::On,
    }
}

/// A size given at `of` px, scaled to the model's input size.
pub(crate) const fn sized(id: &'static str, flag: &'static str, px: u32, of: u32) -> Setting {
    Setting {
        id,
        flag,
        value: Value::Scaled(px, of),
    }
}

impl Setting {
    /// The setting as an argument, `flag` and value joined by `sep` (a switch alone); `None` for
    /// a size when the model's input size is unknown.
    pub fn arg(&self, sep: &str, input_size: Option<u32>) -> Option<String> {
        match self.value {
            Value::Text(v) => Some(format!("{}{sep}{v}", self.flag)),
            Value::On => Some(self.flag.to_string()),
            Value::Scaled(px, of) => {
                input_size.map(|i| format!("{}{sep}{}", self.flag, scaled(px, of, i)))
            }
        }
    }
}

/// torchvision's command for `ResNet50_Weights.IMAGENET1K_V2` (8 GPUs):
/// `--batch-size 128 --lr 0.5 --lr-scheduler cosineannealinglr --lr-warmup-epochs 5
/// --lr-warmup-method linear --auto-augment ta_wide --epochs 600 --random-erase 0.1
/// --weight-decay 0.00002 --norm-weight-decay 0.0 --label-smoothing 0.1 --mixup-alpha 0.2
/// --cutmix-alpha 1.0 --train-crop-size 176 --model-ema --val-resize-size 232 --ra-sampler
/// --ra-reps 4`. Its `--lr 0.5` is the LR of 8 × 128 = 1024 images per step, hence
/// `--lr-reference-batch 1024` (tchrun scales `--lr` by the batch, torchvision does not).
const TORCHVISION_V2: &[Setting] = &[
    text("batch_size", "--batch-size", "128"),
    text("lr", "--lr", "0.5"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("warmup_epochs", "--warmup-epochs", "5"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("auto_augment", "--auto-augment", "ta_wide"),
    text("epochs", "--epochs", "600"),
    text("random_erase", "--random-erase", "0.1"),
    text("weight_decay", "--weight-decay", "0.00002"),
    text("norm_weight_decay", "--norm-weight-decay", "0.0"),
    text("label_smoothing", "--label-smoothing", "0.1"),
    text("mixup_alpha", "--mixup-alpha", "0.2"),
    text("cutmix_alpha", "--cutmix-alpha", "1.0"),
    sized("train_crop_size", "--train-crop-size", 176, 224),
    on("model_ema", "--model-ema"),
    sized("val_resize_size", "--val-resize-size", 232, 224),
    on("ra_sampler", "--ra-sampler"),
    text("ra_reps", "--ra-reps", "4"),
];

/// `round(px × input / 224)`.
pub fn at_input(px: u32, input: u32) -> u32 {
    scaled(px, 224, input)
}

/// `round(px × input / of)`, halves up.
pub fn scaled(px: u32, of: u32, input: u32) -> u32 {
    let of = u64::from(of.max(1));
    ((u64::from(px) * u64::from(input) + of / 2) / of) as u32
}

/// The arguments the recipe adds: every setting whose flag was not `given`, the sizes scaled to
/// `input_size` (left out when the model's input size is unknown: the pre-flight then refuses
/// the model directory itself).
pub fn expand(
    preset: Preset,
    given: impl Fn(&str) -> bool,
    input_size: Option<u32>,
) -> Vec<String> {
    let settings = preset.settings().iter().filter(|s| !given(s.id));
    settings.filter_map(|s| s.arg("=", input_size)).collect()
}

/// Whether the user gave argument `id` (on the command line or in its variable).
fn given(m: &ArgMatches, id: &str) -> bool {
    matches!(
        m.value_source(id),
        Some(ValueSource::CommandLine | ValueSource::EnvVariable)
    )
}

/// The arguments the user gave to the subcommand (clap ids), recorded by `try_parse_from`.
static GIVEN: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();

/// Whether the user gave argument `id` of this process's subcommand on the command line or in
/// its variable (false before `try_parse_from` ran).
pub fn user_gave(id: &str) -> bool {
    GIVEN.get().is_some_and(|g| g.iter().any(|x| x == id))
}

/// The arguments a `--recipe` in the (sub)command of `m` adds, if any.
fn recipe_args(m: &ArgMatches) -> Vec<String> {
    let Some((_, sub)) = m.subcommand() else {
        return Vec::new();
    };
    let Ok(Some(preset)) = sub.try_get_one::<Preset>("recipe") else {
        return Vec::new();
    };
    let input_size = sub
        .try_get_one::<PathBuf>("model")
        .ok()
        .flatten()
        .and_then(|dir| crate::model::load(dir, false).ok())
        .map(|cfg| cfg.input_size);
    expand(*preset, |id| given(sub, id), input_size)
}

/// Parses `args` (the program's name first) as `C`, expanding a `--recipe`: its flags that the
/// user did not give are appended and the line parsed again.
pub fn try_parse_from<C: clap::Parser>(args: Vec<OsString>) -> Result<C, clap::Error> {
    // A flag given twice takes its last value, as argparse (and so torchrun, a Python
    // script's flags) does: `$COMMON --epochs 3` after a `$COMMON` holding `--epochs`.
    let command = || C::command().args_override_self(true);
    let m = command().try_get_matches_from(args.clone())?;
    if let Some((_, sub)) = m.subcommand() {
        let ids = sub.ids().map(|i| i.as_str()).filter(|i| given(sub, i));
        let _ = GIVEN.set(ids.map(str::to_string).collect());
    }
    let extra = recipe_args(&m);
    if extra.is_empty() {
        return C::from_arg_matches(&m);
    }
    let mut all = args;
    all.extend(extra.into_iter().map(OsString::from));
    C::from_arg_matches(&command().try_get_matches_from(all)?)
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
}
