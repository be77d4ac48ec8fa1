//! A recipe's vocabulary: the flag (`PresetFlags`), the recipes it knows (`Preset`), one flag
//! of a recipe (`Setting`: clap's id, the flag, its value, a size scaled to the model's input
//! size) and the flags the user gave (`Given`), which a recipe leaves alone. A leaf: the
//! tables (`families.rs`), the expansion (`recipe_preset.rs`) and the parse (`flags.rs`) build
//! on it.
use clap::parser::ValueSource;
use clap::ArgMatches;
use std::collections::BTreeSet;

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

/// The arguments the user gave a (sub)command, on the command line or in their `TCHRUN_*`
/// variable (clap ids, from clap's `value_source`): what a recipe leaves to the user.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Given(BTreeSet<String>);

impl Given {
    /// The arguments given to the command `m` holds the matches of.
    pub fn of(m: &ArgMatches) -> Given {
        let given = |id: &&str| {
            matches!(
                m.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        };
        Given(
            m.ids()
                .map(|i| i.as_str())
                .filter(given)
                .map(str::to_string)
                .collect(),
        )
    }

    /// Those of the subcommand of `m` (none without one).
    pub fn of_subcommand(m: &ArgMatches) -> Given {
        m.subcommand()
            .map(|(_, sub)| Given::of(sub))
            .unwrap_or_default()
    }

    /// Whether the user gave argument `id`.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }
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

pub(super) const fn text(id: &'static str, flag: &'static str, v: &'static str) -> Setting {
    Setting {
        id,
        flag,
        value: Value::Text(v),
    }
}

/// A switch the recipe turns on.
pub(super) const fn on(id: &'static str, flag: &'static str) -> Setting {
    Setting {
        id,
        flag,
        value: Value::On,
    }
}

/// A size given at `of` px, scaled to the model's input size.
pub(super) const fn sized(id: &'static str, flag: &'static str, px: u32, of: u32) -> Setting {
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

/// `round(px × input / 224)`.
pub fn at_input(px: u32, input: u32) -> u32 {
    scaled(px, 224, input)
}

/// `round(px × input / of)`, halves up.
pub fn scaled(px: u32, of: u32, input: u32) -> u32 {
    let of = u64::from(of.max(1));
    ((u64::from(px) * u64::from(input) + of / 2) / of) as u32
}
