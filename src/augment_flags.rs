//! torchvision's augmentation and crop-size flags (its `references/classification/train.py`):
//! `--mixup-alpha`, `--cutmix-alpha`, `--auto-augment` (`--ra-magnitude`,
//! `--augmix-severity`), `--random-erase`, `--train-crop-size`, `--val-resize-size`,
//! `--val-crop-size`, `--interpolation`. Both binaries parse them
//! (`AugmentFlags`, flattened into `TrainOptions`), the launcher hands them to the ranks
//! (`to_args`), the checkpoint's run record and `model.json`'s training record keep them
//! (`AugmentRecord`: a file written before they existed reads as the old behaviour). Knows the
//! architectures' input-size bounds, nothing of data loading.
use crate::arch::{Arch, MAX_INPUT_SIZE, MIN_INPUT_SIZE};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

crate::value_enum_serde!(Interpolation, AutoAugmentName);

/// `--interpolation`: the resampling of every resize (torchvision's `InterpolationMode`, on
/// PIL images: PIL's filters with antialiasing).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub enum Interpolation {
    Nearest,
    /// PIL's bilinear (triangle) filter: tchrun's resize before the flag existed.
    #[default]
    Bilinear,
    /// PIL's bicubic (a = -0.5, Catmull-Rom).
    Bicubic,
}

impl Interpolation {
    pub fn as_str(self) -> &'static str {
        match self {
            Interpolation::Nearest => "nearest",
            Interpolation::Bilinear => "bilinear",
            Interpolation::Bicubic => "bicubic",
        }
    }

    /// The recorded name's mode (`as_str`'s inverse; an unknown name: bilinear, the default).
    pub fn named(name: &str) -> Interpolation {
        <Interpolation as ValueEnum>::from_str(name, false).unwrap_or_default()
    }
}

/// `--auto-augment`: torchvision's policy names (train.py's `--auto-augment`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AutoAugmentName {
    /// TrivialAugmentWide: one op per image, its magnitude one of 31 bins at random.
    #[value(name = "ta_wide")]
    TaWide,
    /// RandAugment: two ops per image at magnitude --ra-magnitude.
    #[value(name = "ra")]
    Ra,
    /// AugMix: three chains of 1 to 3 ops mixed with the image, severity --augmix-severity.
    #[value(name = "augmix")]
    Augmix,
    /// AutoAugment's ImageNet policy: one of its 25 sub-policies.
    #[value(name = "imagenet")]
    Imagenet,
}

impl AutoAugmentName {
    pub fn as_str(self) -> &'static str {
        match self {
            AutoAugmentName::TaWide => "ta_wide",
            AutoAugmentName::Ra => "ra",
            AutoAugmentName::Augmix => "augmix",
            AutoAugmentName::Imagenet => "imagenet",
        }
    }
}

/// RandAugment's and TrivialAugmentWide's magnitude bins (`num_magnitude_bins`).
pub const RA_MAGNITUDE_BINS: u32 = 31;
/// AugMix's largest severity (`_PARAMETER_MAX`).
pub const AUGMIX_MAX_SEVERITY: u32 = 10;

/// The augmentation flags (help heading "Data").
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct AugmentFlags {
    /// MixUp's alpha (torchvision's v2.MixUp): each training micro-batch becomes λ × itself +
    /// (1 - λ) × itself rolled by one, labels alike, λ ~ Beta(α, α). 0: off. With
    /// --cutmix-alpha, one of the two per micro-batch, chosen uniformly.
    #[arg(help_heading = "Data", long, env = "TCHRUN_MIXUP_ALPHA", default_value_t = 0.0, value_parser = parse_alpha, allow_negative_numbers = true)]
    pub mixup_alpha: f64,
    /// CutMix's alpha (torchvision's v2.CutMix): a box of each training micro-batch's images is
    /// pasted from the batch rolled by one, the labels mixed by the box's area. 0: off.
    #[arg(help_heading = "Data", long, env = "TCHRUN_CUTMIX_ALPHA", default_value_t = 0.0, value_parser = parse_alpha, allow_negative_numbers = true)]
    pub cutmix_alpha: f64,
    /// torchvision's auto-augment policy on each training crop, after its flip and before
    /// normalisation (ClassificationPresetTrain's order): ta_wide (TrivialAugmentWide), ra
    /// (RandAugment), augmix (AugMix), imagenet (AutoAugment). Default: none.
    #[arg(help_heading = "Data", long, env = "TCHRUN_AUTO_AUGMENT", value_enum)]
    pub auto_augment: Option<AutoAugmentName>,
    /// RandAugment's magnitude (--auto-augment ra): a bin of 31, 0 to 30.
    #[arg(help_heading = "Data", long, env = "TCHRUN_RA_MAGNITUDE", default_value_t = DEFAULT_RA_MAGNITUDE, value_parser = parse_ra_magnitude, allow_negative_numbers = true)]
    pub ra_magnitude: u32,
    /// AugMix's severity (--auto-augment augmix), 1 to 10.
    #[arg(help_heading = "Data", long, env = "TCHRUN_AUGMIX_SEVERITY", default_value_t = DEFAULT_AUGMIX_SEVERITY, value_parser = parse_augmix_severity, allow_negative_numbers = true)]
    pub augmix_severity: u32,
    /// The probability of torchvision's RandomErasing(scale=(0.02, 0.33), ratio=(0.3, 3.3),
    /// value=0) on each normalised training image, in [0, 1]. 0: off.
    #[arg(help_heading = "Data", long, env = "TCHRUN_RANDOM_ERASE", default_value_t = 0.0, value_parser = crate::recipe::parse_closed_unit, allow_negative_numbers = true)]
    pub random_erase: f64,
    /// The training crop's side (RandomResizedCrop's size). Default: the model's input size.
    #[arg(help_heading = "Data", long, env = "TCHRUN_TRAIN_CROP_SIZE", value_parser = clap::value_parser!(u32).range(MIN_INPUT_SIZE as i64..=MAX_INPUT_SIZE as i64))]
    pub train_crop_size: Option<u32>,
    /// Validation's resize of the shorter side, before its center crop. Default:
    /// round(--val-crop-size × 256 / 224).
    #[arg(help_heading = "Data", long, env = "TCHRUN_VAL_RESIZE_SIZE", value_parser = clap::value_parser!(u32).range(MIN_INPUT_SIZE as i64..=2 * MAX_INPUT_SIZE as i64))]
    pub val_resize_size: Option<u32>,
    /// Validation's center crop side. Default: the model's input size.
    #[arg(help_heading = "Data", long, env = "TCHRUN_VAL_CROP_SIZE", value_parser = clap::value_parser!(u32).range(MIN_INPUT_SIZE as i64..=MAX_INPUT_SIZE as i64))]
    pub val_crop_size: Option<u32>,
    /// The resampling of the training crop's and validation's resize, and of --auto-augment's
    /// geometric ops (nearest or bilinear there, as torchvision's tensor ops).
    #[arg(help_heading = "Data", long, env = "TCHRUN_INTERPOLATION", value_enum, default_value_t = Interpolation::Bilinear)]
    pub interpolation: Interpolation,
    /// The designer's image transforms (`--vflip`, `--rotation`, `--affine`, ...).
    #[command(flatten)]
    #[serde(flatten)]
    pub transforms: crate::transform_flags::TransformFlags,
}

impl Default for AugmentFlags {
    /// The flags' defaults (as parsed from no arguments).
    fn default() -> AugmentFlags {
        AugmentFlags {
            mixup_alpha: 0.0,
            cutmix_alpha: 0.0,
            auto_augment: None,
            ra_magnitude: DEFAULT_RA_MAGNITUDE,
            augmix_severity: DEFAULT_AUGMIX_SEVERITY,
            random_erase: 0.0,
            train_crop_size: None,
            val_resize_size: None,
            val_crop_size: None,
            interpolation: Interpolation::Bilinear,
            transforms: Default::default(),
        }
    }
}

/// The crop sizes of a run, resolved against the model's input size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Crops {
    pub train: u32,
    pub val_resize: u32,
    pub val_crop: u32,
}

/// Validation's resize for a crop of `crop`: round(crop × 256 / 224), ties to even (tchrun's
/// evaluation before the flags existed).
pub fn default_val_resize(crop: u32) -> u32 {
    ((f64::from(crop) * 256.0 / 224.0).round_ties_even() as u32).max(1)
}

impl AugmentFlags {
    /// The flags as arguments for a rank (only those not at their default; `argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv_changed(self)
    }

    /// The crop sizes for a model of `input_size`.
    pub fn crops(&self, input_size: u32) -> Crops {
        let val_crop = self.val_crop_size.unwrap_or(input_size);
        Crops {
            train: self.train_crop_size.unwrap_or(input_size),
            val_resize: self
                .val_resize_size
                .unwrap_or_else(|| default_val_resize(val_crop)),
            val_crop,
        }
    }

    /// MixUp or CutMix is on.
    pub fn mixes(&self) -> bool {
        self.mixup_alpha > 0.0 || self.cutmix_alpha > 0.0
    }

    /// The crop sizes against `arch`'s input-size bounds (every feature map at least 1x1; a
    /// ViT's crops its model's input size), and validation's resize at least its crop; the
    /// message names the flag.
    pub fn check(&self, arch: Arch, input_size: u32) -> Result<(), String> {
        let c = self.crops(input_size);
        let min = arch.min_input_size();
        for (flag, given, v) in [
            ("--train-crop-size", self.train_crop_size, c.train),
            ("--val-crop-size", self.val_crop_size, c.val_crop),
        ] {
            if given.is_some() && arch.patch_size().is_some() && v != input_size {
                return Err(format!(
                    "{flag} {v}: {} is built for its model's input size, {input_size} pixels (its \
                     positional embedding has one position per patch); leave the flag out, or \
                     make a model of that size with `tchrun model init --input-size {v}` (with \
                     --weights, the embedding is resampled)",
                    arch.name()
                ));
            }
            if given.is_some() && !(min..=MAX_INPUT_SIZE).contains(&v) {
                return Err(format!(
                    "{flag} {v}: {} takes crops of {min} to {MAX_INPUT_SIZE} pixels (every \
                     feature map at least 1x1); give a size in that range",
                    arch.name()
                ));
            }
        }
        if self.transforms.resamples() && self.interpolation == Interpolation::Bicubic {
            return Err(
                "--interpolation bicubic with --rotation, --affine or --perspective: torchvision \
                 resamples these on tensors with nearest or bilinear only (bicubic raises there); \
                 give --interpolation bilinear (torchvision's default) or nearest"
                    .into(),
            );
        }
        if self.auto_augment.is_some() && self.interpolation == Interpolation::Bicubic {
            return Err(
                "--interpolation bicubic with --auto-augment: torchvision's auto-augment ops on \
                 tensors take nearest or bilinear only (bicubic raises there); give \
                 --interpolation bilinear (torchvision's default) or nearest"
                    .into(),
            );
        }
        if c.val_resize < c.val_crop {
            return Err(format!(
                "--val-resize-size {}: smaller than the validation crop ({} pixels, \
                 --val-crop-size or the model's input size), which would crop outside the \
                 resized image; give --val-resize-size {} or more",
                c.val_resize, c.val_crop, c.val_crop
            ));
        }
        Ok(())
    }

    /// What the checkpoint and `model.json` record (the crop sizes resolved).
    pub fn record(&self, input_size: u32) -> AugmentRecord {
        let c = self.crops(input_size);
        AugmentRecord {
            mixup_alpha: self.mixup_alpha,
            cutmix_alpha: self.cutmix_alpha,
            random_erase: self.random_erase,
            train_crop_size: Some(c.train),
            val_resize_size: Some(c.val_resize),
            val_crop_size: Some(c.val_crop),
            interpolation: self.interpolation.as_str().into(),
            auto_augment: self.auto_augment.map(|p| p.as_str().into()),
            ra_magnitude: (self.auto_augment == Some(AutoAugmentName::Ra))
                .then_some(self.ra_magnitude),
            augmix_severity: (self.auto_augment == Some(AutoAugmentName::Augmix))
                .then_some(self.augmix_severity),
            transforms: self.transforms,
        }
    }
}

/// `--ra-magnitude`'s default (torchvision's train.py).
pub const DEFAULT_RA_MAGNITUDE: u32 = 9;
/// `--augmix-severity`'s default (torchvision's train.py).
pub const DEFAULT_AUGMIX_SEVERITY: u32 = 3;

/// The augmentation flags as recorded (flattened into the run record and `model.json`'s
/// training record). A file written before they existed reads as the old behaviour: no
/// mixing or erasing, the crops of the input size, bilinear.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AugmentRecord {
    #[serde(skip_serializing_if = "is_zero")]
    pub mixup_alpha: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub cutmix_alpha: f64,
    #[serde(skip_serializing_if = "is_zero")]
    pub random_erase: f64,
    /// The crop sizes as run; none in files written before them: the input size's.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub train_crop_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_resize_size: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub val_crop_size: Option<u32>,
    pub interpolation: String,
    /// `--auto-augment`'s policy; none: off (and in files written before it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auto_augment: Option<String>,
    /// `--ra-magnitude`, recorded with `--auto-augment ra` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ra_magnitude: Option<u32>,
    /// `--augmix-severity`, recorded with `--auto-augment augmix` only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub augmix_severity: Option<u32>,
    /// The designer's transforms (`--vflip`, `--pad`, ...), each left out at its default.
    #[serde(flatten)]
    pub transforms: crate::transform_flags::TransformFlags,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl Default for AugmentRecord {
    fn default() -> AugmentRecord {
        AugmentRecord {
            mixup_alpha: 0.0,
            cutmix_alpha: 0.0,
            random_erase: 0.0,
            train_crop_size: None,
            val_resize_size: None,
            val_crop_size: None,
            interpolation: Interpolation::Bilinear.as_str().into(),
            auto_augment: None,
            ra_magnitude: None,
            augmix_severity: None,
            transforms: Default::default(),
        }
    }
}

impl AugmentRecord {
    /// The crop sizes, an older record's resolved against its `input_size`.
    pub fn crops(&self, input_size: u32) -> Crops {
        let val_crop = self.val_crop_size.unwrap_or(input_size);
        Crops {
            train: self.train_crop_size.unwrap_or(input_size),
            val_resize: self
                .val_resize_size
                .unwrap_or_else(|| default_val_resize(val_crop)),
            val_crop,
        }
    }

    /// The fields that differ between `self` (the checkpoint's, for a model of `input_size`)
    /// and `now` (this job's, for `now_input`): (flag, the checkpoint's value, this job's, the
    /// flag that gives the checkpoint's value back). The crop sizes are compared at equal
    /// input sizes only (another input size is its own mismatch).
    pub fn differences(
        &self,
        input_size: u32,
        now: &AugmentRecord,
        now_input: u32,
    ) -> Vec<(String, String, String, String)> {
        let (a, b) = (self.crops(input_size), now.crops(now_input));
        let mut out = Vec::new();
        for (name, was, is) in [
            (
                "mixup-alpha",
                format!("{}", self.mixup_alpha),
                format!("{}", now.mixup_alpha),
            ),
            (
                "cutmix-alpha",
                format!("{}", self.cutmix_alpha),
                format!("{}", now.cutmix_alpha),
            ),
            (
                "random-erase",
                format!("{}", self.random_erase),
                format!("{}", now.random_erase),
            ),
            ("train-crop-size", a.train.to_string(), b.train.to_string()),
            (
                "val-resize-size",
                a.val_resize.to_string(),
                b.val_resize.to_string(),
            ),
            (
                "val-crop-size",
                a.val_crop.to_string(),
                b.val_crop.to_string(),
            ),
            (
                "interpolation",
                self.interpolation.clone(),
                now.interpolation.clone(),
            ),
        ] {
            // Another input size is refused as such; the crops that follow it are not news.
            let crop = name.ends_with("-size");
            if was != is && !(crop && input_size != now_input) {
                let fix = format!("--{name} {was}");
                out.push((format!("--{name}"), was, is, fix));
            }
        }
        out.extend(self.transforms.differences(&now.transforms));
        // The policy, then its parameter (compared under the same policy only).
        let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(none)".into());
        if self.auto_augment != now.auto_augment {
            let fix = match &self.auto_augment {
                Some(p) => format!("--auto-augment {p}"),
                None => "no --auto-augment".into(),
            };
            let (was, is) = (show(&self.auto_augment), show(&now.auto_augment));
            out.push(("--auto-augment".into(), was, is, fix));
            return out;
        }
        for (name, was, is) in [
            ("ra-magnitude", self.ra_magnitude, now.ra_magnitude),
            ("augmix-severity", self.augmix_severity, now.augmix_severity),
        ] {
            if let (Some(was), Some(is)) = (was, is) {
                if was != is {
                    let fix = format!("--{name} {was}");
                    out.push((format!("--{name}"), was.to_string(), is.to_string(), fix));
                }
            }
        }
        out
    }
}

/// A bin of RandAugment's 31: 0 to 30 (torchvision indexes its magnitudes with it).
fn parse_ra_magnitude(s: &str) -> Result<u32, String> {
    let max = RA_MAGNITUDE_BINS - 1;
    match s.trim().parse::<i64>() {
        Ok(v) if (0..=i64::from(max)).contains(&v) => Ok(v as u32),
        Ok(_) => Err(format!(
            "must be 0 to {max} (a bin of RandAugment's {RA_MAGNITUDE_BINS} magnitude bins), got {s}"
        )),
        Err(_) => Err(format!("'{s}' is not a whole number (0 to {max})")),
    }
}

/// AugMix's severity: 1 to 10 (torchvision raises outside).
fn parse_augmix_severity(s: &str) -> Result<u32, String> {
    let max = AUGMIX_MAX_SEVERITY;
    match s.trim().parse::<i64>() {
        Ok(v) if (1..=i64::from(max)).contains(&v) => Ok(v as u32),
        Ok(_) => Err(format!("must be 1 to {max}, got {s}")),
        Err(_) => Err(format!("'{s}' is not a whole number (1 to {max})")),
    }
}

/// Beta(α, α) needs α > 0; 0 is off.
fn parse_alpha(s: &str) -> Result<f64, String> {
    let v = crate::recipe::number(s)?;
    if v < 0.0 {
        return Err(format!("must be >= 0 (0: off), got {s}"));
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        a: AugmentFlags,
    }

    #[test]
    fn defaults_round_trip_and_old_records_read_as_before() {
        let c = Cli::try_parse_from(["x"]).expect("defaults").a;
        assert_eq!(c, AugmentFlags::default());
        assert!(c.to_args().expect("argv").is_empty());
        assert_eq!(
            c.crops(224),
            Crops {
                train: 224,
                val_resize: 256,
                val_crop: 224
            }
        );
        assert_eq!(c.crops(32).val_resize, 37);
        let given = Cli::try_parse_from([
            "x",
            "--mixup-alpha",
            "0.2",
            "--cutmix-alpha",
            "1",
            "--random-erase",
            "0.25",
            "--train-crop-size",
            "176",
            "--val-resize-size",
            "232",
            "--val-crop-size",
            "224",
            "--interpolation",
            "bicubic",
        ])
        .expect("valid")
        .a;
        let mut args = vec!["x".to_string()];
        args.extend(given.to_args().expect("argv"));
        assert_eq!(Cli::try_parse_from(&args).expect("round trip").a, given);
        let old: AugmentRecord = serde_json::from_str("{}").expect("old record");
        assert_eq!(old, AugmentRecord::default());
        // An old record equals a new run without the flags, and one that names its defaults.
        assert!(old.differences(64, &c.record(64), 64).is_empty());
        let explicit = Cli::try_parse_from(["x", "--train-crop-size", "64"])
            .expect("valid")
            .a;
        assert!(old.differences(64, &explicit.record(64), 64).is_empty());
        let d = old.differences(224, &given.record(224), 224);
        let flags: Vec<&str> = d.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            flags,
            [
                "--mixup-alpha",
                "--cutmix-alpha",
                "--random-erase",
                "--train-crop-size",
                "--val-resize-size",
                "--interpolation"
            ]
        );
        assert_eq!(d[3].3, "--train-crop-size 224");
        assert_eq!(d[5].3, "--interpolation bilinear");
        // The policy and its parameter: round trip, recorded with their policy only, a change
        // named (a parameter only under the same policy).
        for args in [
            &["x", "--auto-augment", "ra", "--ra-magnitude", "30"][..],
            &["x", "--auto-augment", "augmix", "--augmix-severity", "10"],
            &["x", "--auto-augment", "ta_wide", "--augmix-severity", "1"],
            &["x", "--auto-augment", "imagenet"],
        ] {
            let f = Cli::try_parse_from(args).expect("valid").a;
            let mut again = vec!["x".to_string()];
            again.extend(f.to_args().expect("argv"));
            assert_eq!(Cli::try_parse_from(&again).expect("round trip").a, f);
        }
        let ra = |m: &str| {
            Cli::try_parse_from(["x", "--auto-augment", "ra", "--ra-magnitude", m])
                .expect("valid")
                .a
                .record(64)
        };
        assert_eq!(
            (ra("9").ra_magnitude, ra("9").augmix_severity),
            (Some(9), None)
        );
        let d = ra("9").differences(64, &ra("12"), 64);
        assert_eq!(
            d,
            [(
                "--ra-magnitude".into(),
                "9".into(),
                "12".into(),
                "--ra-magnitude 9".into()
            )]
        );
        let d = old.differences(64, &ra("12"), 64);
        assert_eq!(
            d,
            [(
                "--auto-augment".into(),
                "(none)".into(),
                "ra".into(),
                "no --auto-augment".into()
            )]
        );
        let d = ra("12").differences(64, &c.record(64), 64);
        assert_eq!(d[0].3, "--auto-augment ra");
        let json = serde_json::to_string(&ra("12")).expect("json");
        assert!(
            json.ends_with(r#""auto_augment":"ra","ra_magnitude":12}"#),
            "{json}"
        );
        let json = serde_json::to_string(&c.record(224)).expect("json");
        assert_eq!(
            json,
            r#"{"train_crop_size":224,"val_resize_size":256,"val_crop_size":224,"interpolation":"bilinear"}"#
        );
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (flag, v) in [
            ("--mixup-alpha", "-0.1"),
            ("--cutmix-alpha", "-1"),
            ("--mixup-alpha", "nan"),
            ("--random-erase", "1.5"),
            ("--random-erase", "-0.1"),
            ("--interpolation", "lanczos"),
            ("--train-crop-size", "8"),
            ("--train-crop-size", "2048"),
            ("--val-crop-size", "0"),
            ("--val-resize-size", "4"),
            ("--auto-augment", "cifar"),
            ("--ra-magnitude", "-1"),
            ("--ra-magnitude", "31"),
            ("--augmix-severity", "0"),
            ("--augmix-severity", "11"),
        ] {
            let e = Cli::try_parse_from(["x", flag, v])
                .expect_err(flag)
                .to_string();
            assert!(e.contains(flag), "{e}");
        }
        // Below the architecture's smallest input (ConvNeXt: 32), and a resize below the crop.
        let small = Cli::try_parse_from(["x", "--train-crop-size", "16"])
            .expect("parses")
            .a;
        assert!(small.check(Arch::Resnet18, 64).is_ok());
        assert_eq!(
            small.check(Arch::ConvnextTiny, 64).expect_err("too small"),
            "--train-crop-size 16: convnext_tiny takes crops of 32 to 1024 pixels (every feature \
             map at least 1x1); give a size in that range"
        );
        // A ViT is built for its model's input size: a crop of another size is refused.
        let crop = Cli::try_parse_from(["x", "--train-crop-size", "64"])
            .expect("parses")
            .a;
        assert!(crop.check(Arch::VitB32, 64).is_ok());
        assert!(crop
            .check(Arch::VitB32, 32)
            .expect_err("another size")
            .starts_with("--train-crop-size 64: vit_b_32 is built for its model's input size, 32"));
        let bicubic = Cli::try_parse_from([
            "x",
            "--auto-augment",
            "ta_wide",
            "--interpolation",
            "bicubic",
        ])
        .expect("parses")
        .a;
        let e = bicubic
            .check(Arch::Resnet18, 64)
            .expect_err("bicubic policy");
        assert!(
            e.starts_with("--interpolation bicubic with --auto-augment"),
            "{e}"
        );
        let resize = Cli::try_parse_from(["x", "--val-resize-size", "60"])
            .expect("parses")
            .a;
        assert_eq!(
            resize.check(Arch::Resnet18, 64).expect_err("resize < crop"),
            "--val-resize-size 60: smaller than the validation crop (64 pixels, --val-crop-size \
             or the model's input size), which would crop outside the resized image; give \
             --val-resize-size 64 or more"
        );
    }
}
