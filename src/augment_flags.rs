//! torchvision's augmentation and crop-size flags (its `references/classification/train.py`):
//! `--mixup-alpha`, `--cutmix-alpha`, `--random-erase`, `--train-crop-size`,
//! `--val-resize-size`, `--val-crop-size`, `--interpolation`. Both binaries parse them
//! (`AugmentFlags`, flattened into `TrainOptions`), the launcher hands them to the ranks
//! (`to_args`), the checkpoint's run record and `model.json`'s training record keep them
//! (`AugmentRecord`: a file written before they existed reads as the old behaviour). Knows the
//! architectures' input-size bounds, nothing of data loading.
use crate::arch::{Arch, MAX_INPUT_SIZE, MIN_INPUT_SIZE};
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};

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

/// The augmentation flags (help heading "Data").
#[derive(Args, Debug, Clone, PartialEq, Default)]
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
    /// The resampling of the training crop's and validation's resize.
    #[arg(help_heading = "Data", long, env = "TCHRUN_INTERPOLATION", value_enum, default_value_t = Interpolation::Bilinear)]
    pub interpolation: Interpolation,
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
    /// The flags as arguments for a rank (only those not at their default).
    pub fn to_args(&self) -> Vec<String> {
        let mut v = Vec::new();
        for (name, x) in [
            ("mixup-alpha", self.mixup_alpha),
            ("cutmix-alpha", self.cutmix_alpha),
            ("random-erase", self.random_erase),
        ] {
            if x != 0.0 {
                v.push(format!("--{name}={x:e}"));
            }
        }
        for (name, x) in [
            ("train-crop-size", self.train_crop_size),
            ("val-resize-size", self.val_resize_size),
            ("val-crop-size", self.val_crop_size),
        ] {
            if let Some(x) = x {
                v.push(format!("--{name}={x}"));
            }
        }
        if self.interpolation != Interpolation::Bilinear {
            v.push(format!("--interpolation={}", self.interpolation.as_str()));
        }
        v
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
        }
    }
}

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
        out
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
        assert!(c.to_args().is_empty());
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
        args.extend(given.to_args());
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
