//! The modern recipe's flags, with torchvision's names, meanings and defaults (its
//! `references/classification/train.py`): the LR scheduler and its warmup, label smoothing,
//! gradient clipping, the optimizer and its weight-decay groups, the model EMA
//! (`--model-ema*`) and which model `--patience` watches. Both binaries parse them (`RecipeFlags`, flattened into
//! `TrainOptions`), the launcher hands them to the ranks (`to_args`), and the checkpoint's run
//! record and `model.json`'s training record keep them (`RecipeRecord`: a checkpoint or model
//! written before they existed reads as the old behaviour).
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

crate::value_enum_serde!(LrScheduler, WarmupMethod, Opt, EarlyStopOn);

/// `--lr-scheduler`: tchrun's per-step polynomial decay (the default), or one of torchvision's
/// per-epoch schedulers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum LrScheduler {
    /// lr × (1 - t)^--lr-power, per optimizer step (tchrun's default).
    #[default]
    Poly,
    /// torch's CosineAnnealingLR(T_max = epochs - warmup epochs, eta_min = --lr-min), per epoch.
    Cosineannealinglr,
    /// torch's StepLR(step_size = --lr-step-size, gamma = --lr-gamma), per epoch.
    Steplr,
    /// torch's ExponentialLR(gamma = --lr-gamma), per epoch.
    Exponentiallr,
}

impl LrScheduler {
    pub fn as_str(self) -> &'static str {
        match self {
            LrScheduler::Poly => "poly",
            LrScheduler::Cosineannealinglr => "cosineannealinglr",
            LrScheduler::Steplr => "steplr",
            LrScheduler::Exponentiallr => "exponentiallr",
        }
    }

    /// torchvision's schedulers step per epoch (poly steps per optimizer step).
    pub fn per_epoch(self) -> bool {
        self != LrScheduler::Poly
    }
}

/// `--lr-warmup-method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum WarmupMethod {
    /// torch's LinearLR: the LR rises linearly to the scheduled one.
    #[default]
    Linear,
    /// torch's ConstantLR: the LR × --lr-warmup-decay until the warmup ends.
    Constant,
}

impl WarmupMethod {
    pub fn as_str(self) -> &'static str {
        match self {
            WarmupMethod::Linear => "linear",
            WarmupMethod::Constant => "constant",
        }
    }
}

/// `--opt`: torchvision's optimizers, each exactly torch.optim's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Opt {
    /// torch.optim.SGD(momentum = --momentum, weight_decay = --weight-decay).
    #[default]
    Sgd,
    /// torch.optim.SGD(..., nesterov=True).
    #[value(name = "sgd_nesterov")]
    SgdNesterov,
    /// torch.optim.RMSprop(momentum = --momentum, eps = 0.0316, alpha = 0.9), as torchvision's
    /// train.py builds it.
    Rmsprop,
    /// torch.optim.AdamW(betas = (0.9, 0.999), eps = 1e-8), torch's defaults.
    Adamw,
}

impl Opt {
    pub fn as_str(self) -> &'static str {
        match self {
            Opt::Sgd => "sgd",
            Opt::SgdNesterov => "sgd_nesterov",
            Opt::Rmsprop => "rmsprop",
            Opt::Adamw => "adamw",
        }
    }
}

/// `--early-stop-on`: whose validation loss `--patience` watches and the best epoch follows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum EarlyStopOn {
    /// The trained model's (as before `--model-ema`).
    #[default]
    Raw,
    /// The EMA model's (`--model-ema`).
    Ema,
}

impl EarlyStopOn {
    pub fn as_str(self) -> &'static str {
        match self {
            EarlyStopOn::Raw => "raw",
            EarlyStopOn::Ema => "ema",
        }
    }
}

/// torchvision's `--model-ema-steps` and `--model-ema-decay` defaults.
pub const MODEL_EMA_STEPS: u32 = 32;
pub const MODEL_EMA_DECAY: f64 = 0.99998;

/// The EMA's decay as torchvision's train.py adjusts it: `adjust = world_size × batch_size ×
/// steps / epochs`, `alpha = min(1, (1 - decay) × adjust)`, `1 - alpha`. `step_images` is
/// torchvision's world_size × batch_size: the images of one optimizer step (G with
/// `--global-batch-size`, so the same at any world size).
pub fn ema_decay(decay: f64, step_images: u64, steps: u32, epochs: u32) -> f64 {
    let adjust = (step_images * u64::from(steps)) as f64 / f64::from(epochs);
    let alpha = 1.0 - decay;
    let alpha = (alpha * adjust).min(1.0);
    1.0 - alpha
}

/// The EMA model directory's `model.json` `ema`: what the weights average and how.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EmaRecord {
    /// `--model-ema-decay` as given.
    pub decay: f64,
    /// The decay each update used (`ema_decay`: torchvision's adjustment).
    pub adjusted_decay: f64,
    /// `--model-ema-steps`.
    pub steps: u32,
    /// The updates averaged since the last reset (torch's `n_averaged`) at the written epoch.
    pub n_averaged: u64,
}

/// torchvision's `--lr-warmup-decay` default (LinearLR's start_factor, ConstantLR's factor).
pub const WARMUP_DECAY: f64 = 0.01;

/// The recipe flags (help heading "Training").
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct RecipeFlags {
    /// The LR schedule after warmup. poly: lr × (1 - t)^--lr-power per optimizer step (tchrun's
    /// default); cosineannealinglr, steplr, exponentiallr: torch's schedulers, stepped per epoch
    /// as torchvision's train.py does (the LR is constant within an epoch).
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_SCHEDULER", value_enum, default_value_t = LrScheduler::Poly)]
    pub lr_scheduler: LrScheduler,
    /// steplr: multiply the LR by --lr-gamma every this many epochs (after warmup).
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_STEP_SIZE", default_value_t = 30, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub lr_step_size: u32,
    /// steplr and exponentiallr: the LR's factor (per --lr-step-size epochs; per epoch).
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_GAMMA", default_value_t = 0.1, value_parser = parse_positive, allow_negative_numbers = true)]
    pub lr_gamma: f64,
    /// cosineannealinglr: the LR it decays to (torch's eta_min), not scaled by --lr-scaling.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_MIN", default_value_t = 0.0, value_parser = parse_nonneg, allow_negative_numbers = true)]
    pub lr_min: f64,
    /// How the LR warms up over --warmup-epochs: linear (torch's LinearLR from --lr-warmup-decay
    /// × LR) or constant (torch's ConstantLR: --lr-warmup-decay × LR). torchvision's default is
    /// constant; tchrun's is linear, its warmup before these flags existed.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_WARMUP_METHOD", value_enum, default_value_t = WarmupMethod::Linear)]
    pub lr_warmup_method: WarmupMethod,
    /// The warmup's first LR factor (LinearLR's start_factor, ConstantLR's factor), in (0, 1].
    /// Default: 0.01 (torchvision's); with poly and a linear warmup, not given, the warmup
    /// rises per step from peak/warmup steps to the peak, as before.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LR_WARMUP_DECAY", value_parser = parse_unit, allow_negative_numbers = true)]
    pub lr_warmup_decay: Option<f64>,
    /// The training loss's label smoothing (torch's cross_entropy label_smoothing), in [0, 1].
    /// The validation loss stays plain cross entropy.
    #[arg(help_heading = "Training", long, env = "TCHRUN_LABEL_SMOOTHING", default_value_t = 0.0, value_parser = parse_closed_unit, allow_negative_numbers = true)]
    pub label_smoothing: f64,
    /// Clip the gradients' total L2 norm to this (torch's clip_grad_norm_, on the gradient
    /// averaged over every rank, after AMP's unscaling, before the optimizer step).
    #[arg(help_heading = "Training", long, env = "TCHRUN_CLIP_GRAD_NORM", value_parser = parse_positive, allow_negative_numbers = true)]
    pub clip_grad_norm: Option<f64>,
    /// The optimizer (torchvision's --opt): sgd, sgd_nesterov, rmsprop (eps 0.0316, alpha 0.9,
    /// as torchvision's train.py) or adamw (torch's defaults); --momentum is SGD's and
    /// RMSprop's, AdamW has none.
    #[arg(help_heading = "Training", long, env = "TCHRUN_OPT", value_enum, default_value_t = Opt::Sgd)]
    pub opt: Opt,
    /// Weight decay of normalisation layers' parameters (torchvision's set_weight_decay).
    /// Default: --weight-decay.
    #[arg(help_heading = "Training", long, env = "TCHRUN_NORM_WEIGHT_DECAY", value_parser = parse_nonneg, allow_negative_numbers = true)]
    pub norm_weight_decay: Option<f64>,
    /// Weight decay of every layer's bias, normalisation layers' too (torchvision's
    /// set_weight_decay). Default: --weight-decay (or --norm-weight-decay for theirs).
    #[arg(help_heading = "Training", long, env = "TCHRUN_BIAS_WEIGHT_DECAY", value_parser = parse_nonneg, allow_negative_numbers = true)]
    pub bias_weight_decay: Option<f64>,
    /// Keep an exponential moving average of the weights and batch-norm statistics
    /// (torchvision's --model-ema, ExponentialMovingAverage): validated every epoch beside
    /// the model, checkpointed, written as the model directory <output>/ema/.
    /// `--model-ema=false` turns it off where a --recipe turns it on.
    #[arg(help_heading = "Training", long, env = "TCHRUN_MODEL_EMA", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub model_ema: bool,
    /// --model-ema: update the average after every this many optimizer steps of an epoch
    /// (its steps 0, N, 2N, ...), as torchvision's train.py.
    #[arg(help_heading = "Training", long, env = "TCHRUN_MODEL_EMA_STEPS", default_value_t = MODEL_EMA_STEPS, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub model_ema_steps: u32,
    /// --model-ema: the decay, in (0, 1), adjusted as torchvision's: alpha = min(1, (1 -
    /// decay) × images per optimizer step × --model-ema-steps / --epochs), decay = 1 - alpha.
    #[arg(help_heading = "Training", long, env = "TCHRUN_MODEL_EMA_DECAY", default_value_t = MODEL_EMA_DECAY, value_parser = parse_open_unit, allow_negative_numbers = true)]
    pub model_ema_decay: f64,
    /// Whose validation loss --patience watches and the best epoch (the weights written to
    /// --output and <output>/ema/) follows: raw (the trained model's) or ema (--model-ema's).
    #[arg(help_heading = "Training", long, env = "TCHRUN_EARLY_STOP_ON", value_enum, default_value_t = EarlyStopOn::Raw)]
    pub early_stop_on: EarlyStopOn,
    /// Repeated augmentation (torchvision's --ra-sampler, RASampler): each training image
    /// --ra-reps times per epoch, each copy augmented on its own, the epoch cut to the first
    /// images // 256 × 256 positions (so it keeps about as many steps as without).
    /// `--ra-sampler=false` turns it off where a --recipe turns it on.
    #[arg(help_heading = "Data", long, env = "TCHRUN_RA_SAMPLER", num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value_t = false, action = clap::ArgAction::Set, value_parser = clap::builder::BoolishValueParser::new())]
    pub ra_sampler: bool,
    /// --ra-sampler: how many times each image is repeated (torchvision's --ra-reps).
    #[arg(help_heading = "Data", long, env = "TCHRUN_RA_REPS", default_value_t = RA_REPS, value_parser = clap::value_parser!(u32).range(1..=64), allow_negative_numbers = true)]
    pub ra_reps: u32,
}

/// torchvision's `--ra-reps` default.
pub const RA_REPS: u32 = 3;

impl Default for RecipeFlags {
    fn default() -> RecipeFlags {
        RecipeFlags {
            lr_scheduler: LrScheduler::Poly,
            lr_step_size: 30,
            lr_gamma: 0.1,
            lr_min: 0.0,
            lr_warmup_method: WarmupMethod::Linear,
            lr_warmup_decay: None,
            label_smoothing: 0.0,
            clip_grad_norm: None,
            opt: Opt::Sgd,
            norm_weight_decay: None,
            bias_weight_decay: None,
            model_ema: false,
            model_ema_steps: MODEL_EMA_STEPS,
            model_ema_decay: MODEL_EMA_DECAY,
            early_stop_on: EarlyStopOn::Raw,
            ra_sampler: false,
            ra_reps: RA_REPS,
        }
    }
}

impl RecipeFlags {
    /// The flags as arguments for a rank (only those not at their default; `argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv_changed(self)
    }

    /// The combinations torch refuses: Nesterov momentum without momentum (torch.optim.SGD's
    /// "Nesterov momentum requires a momentum and zero dampening").
    pub fn check(&self, momentum: f64) -> Result<(), String> {
        if self.opt == Opt::SgdNesterov && momentum == 0.0 {
            return Err(
                "--opt sgd_nesterov needs a momentum (torch.optim.SGD refuses Nesterov with \
                 momentum 0): give --momentum > 0, or --opt sgd"
                    .into(),
            );
        }
        if self.early_stop_on == EarlyStopOn::Ema && !self.model_ema {
            return Err(
                "--early-stop-on ema watches the EMA model's validation loss: add --model-ema, \
                 or --early-stop-on raw"
                    .into(),
            );
        }
        Ok(())
    }

    /// The weight decay of the trainable parameter `name`, as torchvision's `set_weight_decay`
    /// groups them: a bias (its last name part is `bias`) takes --bias-weight-decay when given;
    /// else a normalisation layer's parameter (`in_norm`) --norm-weight-decay when given; else
    /// `weight_decay`.
    pub fn weight_decay_of(&self, weight_decay: f64, name: &str, in_norm: bool) -> f64 {
        let leaf = name.rsplit('.').next().unwrap_or(name);
        match (self.bias_weight_decay, self.norm_weight_decay) {
            (Some(b), _) if leaf == "bias" => b,
            (_, Some(n)) if in_norm => n,
            _ => weight_decay,
        }
    }

    /// The warmup's first factor: the flag, else torchvision's 0.01, else (poly with a linear
    /// warmup) `None`: tchrun's warmup from peak/warmup steps.
    pub fn warmup_decay(&self) -> Option<f64> {
        match self.lr_warmup_decay {
            Some(x) => Some(x),
            None if self.lr_scheduler == LrScheduler::Poly
                && self.lr_warmup_method == WarmupMethod::Linear =>
            {
                None
            }
            None => Some(WARMUP_DECAY),
        }
    }

    /// What the checkpoint and `model.json` record.
    pub fn record(&self) -> RecipeRecord {
        RecipeRecord {
            lr_scheduler: self.lr_scheduler.as_str().into(),
            lr_step_size: self.lr_step_size,
            lr_gamma: self.lr_gamma,
            lr_min: self.lr_min,
            lr_warmup_method: self.lr_warmup_method.as_str().into(),
            lr_warmup_decay: self.warmup_decay(),
            label_smoothing: self.label_smoothing,
            clip_grad_norm: self.clip_grad_norm,
            opt: self.opt.as_str().into(),
            norm_weight_decay: self.norm_weight_decay,
            bias_weight_decay: self.bias_weight_decay,
            model_ema: self.model_ema,
            model_ema_steps: self.model_ema.then_some(self.model_ema_steps),
            model_ema_decay: self.model_ema.then_some(self.model_ema_decay),
            early_stop_on: self.early_stop_on.as_str().into(),
            ra_reps: self.ra_sampler.then_some(self.ra_reps),
        }
    }
}

/// The normalisation layers' parameters among `vars` (a model's variables, buffers included,
/// each with its number of dimensions): those of a module that keeps running statistics
/// (`<module>.running_mean`: batch norm, a `_BatchNorm`) or whose `weight` is a vector (a
/// LayerNorm, as in ConvNeXt; convolution and Linear weights have two dimensions or more), which
/// in torchvision's models are exactly the layers `set_weight_decay` counts as normalisation.
pub fn norm_parameters<'a>(vars: &[(&'a str, usize)]) -> std::collections::BTreeSet<&'a str> {
    let all: std::collections::HashMap<&str, usize> = vars.iter().copied().collect();
    vars.iter()
        .map(|(n, _)| *n)
        .filter(|n| {
            n.rsplit_once('.').is_some_and(|(module, leaf)| {
                matches!(leaf, "weight" | "bias")
                    && (all.contains_key(format!("{module}.running_mean").as_str())
                        || all.get(format!("{module}.weight").as_str()) == Some(&1))
            })
        })
        .collect()
}

/// The recipe as recorded (flattened into the run record and `model.json`'s training record).
/// Each field absent in a file written before it existed reads as the old behaviour
/// (`Default`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct RecipeRecord {
    pub lr_scheduler: String,
    pub lr_step_size: u32,
    pub lr_gamma: f64,
    pub lr_min: f64,
    pub lr_warmup_method: String,
    /// The warmup's first factor (`RecipeFlags::warmup_decay`); none: tchrun's linear warmup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_warmup_decay: Option<f64>,
    pub label_smoothing: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
    /// `--opt`; a record from before it: `sgd`.
    pub opt: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub norm_weight_decay: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bias_weight_decay: Option<f64>,
    /// `--model-ema`, and (with it) `--model-ema-steps` and `--model-ema-decay` as given.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub model_ema: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_ema_steps: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model_ema_decay: Option<f64>,
    /// `--early-stop-on`; a record from before it: `raw`.
    pub early_stop_on: String,
    /// `--ra-sampler`'s `--ra-reps`; none: no repeated augmentation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ra_reps: Option<u32>,
}

impl Default for RecipeRecord {
    fn default() -> RecipeRecord {
        RecipeFlags::default().record()
    }
}

impl RecipeRecord {
    /// The fields that differ between `self` (the checkpoint's) and `now`: (flag, the
    /// checkpoint's value, this job's, the flag(s) that give the checkpoint's value back).
    pub fn differences(&self, now: &RecipeRecord) -> Vec<(String, String, String, String)> {
        let f = |x: f64| format!("{x}");
        let o = |x: Option<f64>| x.map(f);
        let mut out = Vec::new();
        for (name, was, is) in [
            (
                "lr-scheduler",
                Some(self.lr_scheduler.clone()),
                Some(now.lr_scheduler.clone()),
            ),
            (
                "lr-step-size",
                Some(self.lr_step_size.to_string()),
                Some(now.lr_step_size.to_string()),
            ),
            ("lr-gamma", Some(f(self.lr_gamma)), Some(f(now.lr_gamma))),
            ("lr-min", Some(f(self.lr_min)), Some(f(now.lr_min))),
            (
                "lr-warmup-method",
                Some(self.lr_warmup_method.clone()),
                Some(now.lr_warmup_method.clone()),
            ),
            (
                "lr-warmup-decay",
                o(self.lr_warmup_decay),
                o(now.lr_warmup_decay),
            ),
            (
                "label-smoothing",
                Some(f(self.label_smoothing)),
                Some(f(now.label_smoothing)),
            ),
            (
                "clip-grad-norm",
                o(self.clip_grad_norm),
                o(now.clip_grad_norm),
            ),
            ("opt", Some(self.opt.clone()), Some(now.opt.clone())),
            (
                "norm-weight-decay",
                o(self.norm_weight_decay),
                o(now.norm_weight_decay),
            ),
            (
                "bias-weight-decay",
                o(self.bias_weight_decay),
                o(now.bias_weight_decay),
            ),
            (
                "model-ema",
                self.model_ema.then(|| "on".to_string()),
                now.model_ema.then(|| "on".to_string()),
            ),
            (
                "model-ema-steps",
                self.model_ema_steps.map(|x| x.to_string()),
                now.model_ema_steps.map(|x| x.to_string()),
            ),
            (
                "model-ema-decay",
                o(self.model_ema_decay),
                o(now.model_ema_decay),
            ),
            (
                "early-stop-on",
                Some(self.early_stop_on.clone()),
                Some(now.early_stop_on.clone()),
            ),
            (
                "ra-sampler",
                self.ra_reps.map(|_| "on".to_string()),
                now.ra_reps.map(|_| "on".to_string()),
            ),
            (
                "ra-reps",
                self.ra_reps.map(|x| x.to_string()),
                now.ra_reps.map(|x| x.to_string()),
            ),
        ] {
            if was == is {
                continue;
            }
            let switch = name == "model-ema" || name == "ra-sampler";
            let fix = match &was {
                Some(_) if switch => format!("--{name}"),
                Some(v) => format!("--{name} {v}"),
                // `=false` also overrides a --recipe that turns the switch on.
                None if switch => format!("--{name}=false"),
                None => format!("no --{name}"),
            };
            let show = |v: Option<String>| v.unwrap_or_else(|| "(none)".into());
            out.push((format!("--{name}"), show(was), show(is), fix));
        }
        out
    }
}

pub(crate) fn number(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("'{s}' is not a number"))?;
    if !v.is_finite() {
        return Err(format!("must be a finite number, got {s}"));
    }
    Ok(v)
}

fn parse_positive(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v <= 0.0 {
        return Err(format!("must be > 0, got {s}"));
    }
    Ok(v)
}

fn parse_nonneg(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v < 0.0 {
        return Err(format!("must be >= 0, got {s}"));
    }
    Ok(v)
}

/// (0, 1]: torch's LinearLR refuses a start factor of 0.
fn parse_unit(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v <= 0.0 || v > 1.0 {
        return Err(format!("must be in (0, 1], got {s}"));
    }
    Ok(v)
}

/// (0, 1): `--model-ema-decay` (1 would never move, 0 is no average).
fn parse_open_unit(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if v <= 0.0 || v >= 1.0 {
        return Err(format!("must be in (0, 1), got {s}"));
    }
    Ok(v)
}

/// [0, 1]: torch's cross_entropy refuses label smoothing outside.
pub(crate) fn parse_closed_unit(s: &str) -> Result<f64, String> {
    let v = number(s)?;
    if !(0.0..=1.0).contains(&v) {
        return Err(format!("must be in [0, 1], got {s}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// As the binaries parse: the last of a repeated flag wins.
    #[derive(Parser, Debug)]
    #[command(args_override_self = true)]
    struct Cli {
        #[command(flatten)]
        r: RecipeFlags,
    }

    /// The switches a --recipe turns on take `=false` (and `=true`), as the recipe's
    /// message and a resume's mismatch advise; bare, they are on and never take the next
    /// argument as their value; the last one given wins.
    #[test]
    fn recipe_switches_can_be_turned_off_with_equals_false() {
        let parse = |a: &[&str]| {
            let mut v = vec!["x"];
            v.extend_from_slice(a);
            Cli::try_parse_from(v)
        };
        for (args, ema, ra) in [
            (
                &["--ra-sampler=false", "--model-ema=false"][..],
                false,
                false,
            ),
            (&["--ra-sampler=true", "--model-ema=true"][..], true, true),
            (&["--ra-sampler", "--model-ema"][..], true, true),
            (&["--ra-sampler", "--ra-sampler=false"][..], false, false),
            (&["--model-ema=false", "--model-ema"][..], true, false),
        ] {
            let r = parse(args).expect("valid").r;
            assert_eq!((r.model_ema, r.ra_sampler), (ema, ra), "{args:?}");
        }
        let r = parse(&["--ra-sampler", "--ra-reps", "4"]).expect("valid").r;
        assert_eq!((r.ra_sampler, r.ra_reps), (true, 4));
        let e = parse(&["--ra-sampler=maybe"]).expect_err("not a boolean");
        assert!(e.to_string().contains("--ra-sampler"), "{e}");
        // `--ra-sampler false` (a space) is not a value: it is a stray argument.
        assert!(parse(&["--ra-sampler", "false"]).is_err());
    }

    #[test]
    fn defaults_round_trip_and_old_records_read_as_before() {
        let c = Cli::try_parse_from(["x"]).expect("defaults");
        assert_eq!(c.r, RecipeFlags::default());
        assert!(c.r.to_args().expect("argv").is_empty());
        let mut args = vec!["x".to_string()];
        let r = Cli::try_parse_from([
            "x",
            "--lr-scheduler",
            "cosineannealinglr",
            "--lr-min",
            "1e-5",
            "--lr-warmup-method",
            "constant",
            "--label-smoothing",
            "0.1",
            "--clip-grad-norm",
            "2",
            "--lr-gamma",
            "0.5",
            "--lr-step-size",
            "3",
            "--lr-warmup-decay",
            "0.1",
            "--opt",
            "sgd_nesterov",
            "--norm-weight-decay",
            "0",
            "--bias-weight-decay",
            "1e-5",
            "--model-ema",
            "--model-ema-steps",
            "4",
            "--model-ema-decay",
            "0.999",
            "--early-stop-on",
            "ema",
            "--ra-sampler",
            "--ra-reps",
            "4",
        ])
        .expect("valid")
        .r;
        assert_eq!((r.ra_sampler, r.ra_reps), (true, 4));
        args.extend(r.to_args().expect("argv"));
        assert_eq!(Cli::try_parse_from(&args).expect("round trip").r, r);
        // torchvision's default decay with its schedulers; none for poly's linear warmup.
        let mut c = RecipeFlags {
            lr_scheduler: LrScheduler::Steplr,
            ..RecipeFlags::default()
        };
        assert_eq!(c.warmup_decay(), Some(0.01));
        c.lr_scheduler = LrScheduler::Poly;
        assert_eq!(c.warmup_decay(), None);
        let old: RecipeRecord = serde_json::from_str("{}").expect("old record");
        assert_eq!(old, RecipeFlags::default().record());
        assert!(old.differences(&RecipeFlags::default().record()).is_empty());
        let d = old.differences(&r.record());
        assert!(d
            .iter()
            .any(|x| x.0 == "--lr-scheduler" && x.3 == "--lr-scheduler poly"));
        assert!(d
            .iter()
            .any(|x| x.0 == "--clip-grad-norm" && x.3 == "no --clip-grad-norm"));
        // A checkpoint from before --opt was SGD's: another optimizer names the flag.
        assert_eq!(old.opt, "sgd");
        assert!(d.iter().any(|x| x.0 == "--opt"
            && x.1 == "sgd"
            && x.2 == "sgd_nesterov"
            && x.3 == "--opt sgd"));
        assert!(d
            .iter()
            .any(|x| x.0 == "--norm-weight-decay" && x.3 == "no --norm-weight-decay"));
        assert!(d
            .iter()
            .any(|x| x.0 == "--ra-sampler" && x.3 == "--ra-sampler=false"));
        let back = r.record().differences(&old);
        assert!(back
            .iter()
            .any(|x| x.0 == "--ra-sampler" && x.3 == "--ra-sampler"));
        assert!(back
            .iter()
            .any(|x| x.0 == "--ra-reps" && x.3 == "--ra-reps 4"));
        for (opt, name) in [
            (Opt::Sgd, "sgd"),
            (Opt::SgdNesterov, "sgd_nesterov"),
            (Opt::Rmsprop, "rmsprop"),
            (Opt::Adamw, "adamw"),
        ] {
            let c = Cli::try_parse_from(["x", "--opt", name]).expect(name).r;
            assert_eq!((c.opt, c.opt.as_str()), (opt, name));
            assert_eq!(c.check(0.0).is_err(), opt == Opt::SgdNesterov, "{name}");
            assert!(c.check(0.9).is_ok());
        }
    }

    /// torchvision's set_weight_decay: a bias takes --bias-weight-decay (a norm layer's too),
    /// a norm layer's weight --norm-weight-decay, anything else (and every parameter when
    /// neither is given) --weight-decay.
    #[test]
    fn weight_decay_groups_follow_torchvision() {
        let names = [
            ("conv1.weight", 4),
            ("bn1.weight", 1),
            ("bn1.bias", 1),
            ("bn1.running_mean", 1),
            ("bn1.running_var", 1),
            ("bn1.num_batches_tracked", 0),
            ("layer1.0.downsample.1.weight", 1),
            ("layer1.0.downsample.1.running_mean", 1),
            ("fc.weight", 2),
            ("fc.bias", 1),
        ];
        let norm = norm_parameters(&names);
        assert_eq!(
            norm.into_iter().collect::<Vec<_>>(),
            ["bn1.bias", "bn1.weight", "layer1.0.downsample.1.weight"]
        );
        // ConvNeXt's LayerNorms (nn.LayerNorm, LayerNorm2d): norm layers for torchvision too;
        // its layer_scale, convolutions and Linears are not.
        let convnext = [
            ("features.0.0.weight", 4),
            ("features.0.0.bias", 1),
            ("features.0.1.weight", 1),
            ("features.0.1.bias", 1),
            ("features.1.0.layer_scale", 3),
            ("features.1.0.block.0.weight", 4),
            ("features.1.0.block.2.weight", 1),
            ("features.1.0.block.2.bias", 1),
            ("features.1.0.block.3.weight", 2),
            ("features.1.0.block.3.bias", 1),
            ("classifier.0.weight", 1),
            ("classifier.0.bias", 1),
            ("classifier.2.weight", 2),
            ("classifier.2.bias", 1),
        ];
        assert_eq!(
            norm_parameters(&convnext).into_iter().collect::<Vec<_>>(),
            [
                "classifier.0.bias",
                "classifier.0.weight",
                "features.0.1.bias",
                "features.0.1.weight",
                "features.1.0.block.2.bias",
                "features.1.0.block.2.weight"
            ]
        );
        let none = RecipeFlags::default();
        let both = RecipeFlags {
            norm_weight_decay: Some(0.0),
            bias_weight_decay: Some(2e-5),
            ..RecipeFlags::default()
        };
        let norm_only = RecipeFlags {
            norm_weight_decay: Some(0.0),
            ..RecipeFlags::default()
        };
        for (name, in_norm, want_none, want_both, want_norm) in [
            ("conv1.weight", false, 1e-4, 1e-4, 1e-4),
            ("bn1.weight", true, 1e-4, 0.0, 0.0),
            ("bn1.bias", true, 1e-4, 2e-5, 0.0),
            ("fc.weight", false, 1e-4, 1e-4, 1e-4),
            ("fc.bias", false, 1e-4, 2e-5, 1e-4),
        ] {
            assert_eq!(
                none.weight_decay_of(1e-4, name, in_norm),
                want_none,
                "{name}"
            );
            assert_eq!(
                both.weight_decay_of(1e-4, name, in_norm),
                want_both,
                "{name}"
            );
            assert_eq!(
                norm_only.weight_decay_of(1e-4, name, in_norm),
                want_norm,
                "{name}"
            );
        }
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, v) in [
            ("--lr-warmup-decay", "0"),
            ("--lr-warmup-decay", "1.5"),
            ("--label-smoothing", "-0.1"),
            ("--label-smoothing", "2"),
            ("--clip-grad-norm", "0"),
            ("--lr-gamma", "-1"),
            ("--lr-min", "-1"),
            ("--lr-step-size", "0"),
            ("--lr-scheduler", "onecycle"),
            ("--opt", "adam"),
            ("--norm-weight-decay", "-1"),
            ("--bias-weight-decay", "nan"),
            ("--model-ema-steps", "0"),
            ("--model-ema-steps", "-1"),
            ("--model-ema-decay", "0"),
            ("--model-ema-decay", "1"),
            ("--model-ema-decay", "1.5"),
            ("--model-ema-decay", "-0.5"),
            ("--early-stop-on", "best"),
        ] {
            let e = Cli::try_parse_from(["x", flag, v])
                .expect_err(flag)
                .to_string();
            assert!(e.contains(flag), "{e}");
        }
    }

    /// The flags' defaults are torchvision's; the record keeps steps and decay only with
    /// --model-ema; a resume that changes them names the flag; --early-stop-on ema needs the
    /// EMA.
    #[test]
    fn model_ema_flags_as_torchvision() {
        let c = Cli::try_parse_from(["x"]).expect("defaults").r;
        assert_eq!((c.model_ema, c.model_ema_steps), (false, 32));
        assert_eq!(c.model_ema_decay, 0.99998);
        assert_eq!(c.early_stop_on, EarlyStopOn::Raw);
        let off = c.record();
        assert_eq!(
            (off.model_ema, off.model_ema_steps, off.model_ema_decay),
            (false, None, None)
        );
        let json = serde_json::to_string(&off).expect("json");
        assert!(!json.contains("model_ema"), "{json}");
        let on = Cli::try_parse_from(["x", "--model-ema", "--early-stop-on", "ema"])
            .expect("on")
            .r;
        assert!(on.check(0.9).is_ok());
        let r = on.record();
        assert_eq!(
            (r.model_ema, r.model_ema_steps, r.model_ema_decay),
            (true, Some(32), Some(0.99998))
        );
        let d = off.differences(&r);
        assert!(d
            .iter()
            .any(|x| x.0 == "--model-ema" && x.1 == "(none)" && x.3 == "--model-ema=false"));
        assert!(d
            .iter()
            .any(|x| x.0 == "--early-stop-on" && x.3 == "--early-stop-on raw"));
        assert!(r
            .differences(&off)
            .iter()
            .any(|x| x.0 == "--model-ema" && x.3 == "--model-ema"));
        let mut steps = on.clone();
        steps.model_ema_steps = 8;
        assert!(r
            .differences(&steps.record())
            .iter()
            .any(|x| x.0 == "--model-ema-steps" && x.3 == "--model-ema-steps 32"));
        let e = Cli::try_parse_from(["x", "--early-stop-on", "ema"])
            .expect("parses")
            .r
            .check(0.9)
            .expect_err("needs --model-ema");
        assert_eq!(
            e,
            "--early-stop-on ema watches the EMA model's validation loss: add --model-ema, or \
             --early-stop-on raw"
        );
        // torchvision's adjustment: 32 images × 32 steps / 10 epochs; clamped to decay 0.
        let a = ema_decay(0.99998, 32, 32, 10);
        assert_eq!(a, 1.0 - (1.0 - 0.99998) * (32.0 * 32.0 / 10.0));
        assert_eq!(ema_decay(0.5, 1024, 32, 1), 0.0);
    }
}
