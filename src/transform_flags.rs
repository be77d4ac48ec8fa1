//! The image transforms of Azure ML designer's "Init Image Transformation" under
//! `torchvision.transforms.v2`'s names and meanings: `--vflip P` (RandomVerticalFlip),
//! `--rotation DEG` (RandomRotation), `--affine DEG,TRANSLATE,SCALE_MIN,SCALE_MAX,SHEAR`
//! (RandomAffine), `--perspective DISTORTION,P` (RandomPerspective), `--color-jitter B,C,S,H`
//! (ColorJitter), `--grayscale P` (RandomGrayscale), `--pad N[,MODE]` (Pad) and
//! `--random-crop` (RandomCrop instead of RandomResizedCrop). Both binaries parse them
//! (`TransformFlags`, flattened into `AugmentFlags`), the launcher hands them to the ranks
//! (`to_args`), the run record and `model.json` keep them (the flags themselves, serialised:
//! a file written before they existed reads as none), and `tchrun data transform` takes the
//! same. Knows nothing of pixels (`data::transforms` applies them).
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::fmt;

/// `--pad`'s MODE: torchvision's `padding_mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PadMode {
    /// Zeros (black): torchvision's default, fill 0.
    #[default]
    Constant,
    /// The edge pixel repeated.
    Edge,
    /// Mirrored without repeating the edge: [1, 2, 3] padded by 2 is [3, 2, 1, 2, 3, 2, 1].
    Reflect,
    /// Mirrored repeating the edge: [1, 2, 3] padded by 2 is [2, 1, 1, 2, 3, 3, 2].
    Symmetric,
}

impl PadMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PadMode::Constant => "constant",
            PadMode::Edge => "edge",
            PadMode::Reflect => "reflect",
            PadMode::Symmetric => "symmetric",
        }
    }

    /// The mode of torchvision's name (`as_str`'s inverse; an unknown name: constant).
    pub fn named(name: &str) -> PadMode {
        <PadMode as ValueEnum>::from_str(name, false).unwrap_or_default()
    }
}

/// `--pad N[,MODE]`: `v2.Pad(N, fill=0, padding_mode=MODE)` on every side.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pad {
    pub pixels: u32,
    pub mode: PadMode,
}

/// `--affine DEG,TRANSLATE,SCALE_MIN,SCALE_MAX,SHEAR`: `v2.RandomAffine(degrees=DEG,
/// translate=(T, T), scale=(MIN, MAX), shear=SHEAR)` (the shear along x, in (-SHEAR, SHEAR)).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Affine {
    pub degrees: f64,
    pub translate: f64,
    pub scale_min: f64,
    pub scale_max: f64,
    pub shear: f64,
}

/// `--perspective DISTORTION,P`: `v2.RandomPerspective(distortion_scale, p)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Perspective {
    pub distortion: f64,
    pub p: f64,
}

/// `--color-jitter B,C,S,H`: `v2.ColorJitter(brightness=B, contrast=C, saturation=S, hue=H)`.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ColorJitter {
    pub brightness: f64,
    pub contrast: f64,
    pub saturation: f64,
    pub hue: f64,
}

impl fmt::Display for Pad {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.pixels, self.mode.as_str())
    }
}

impl fmt::Display for Affine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let a = self;
        let (d, t, s0, s1, sh) = (a.degrees, a.translate, a.scale_min, a.scale_max, a.shear);
        write!(f, "{d},{t},{s0},{s1},{sh}")
    }
}

impl fmt::Display for Perspective {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{},{}", self.distortion, self.p)
    }
}

impl fmt::Display for ColorJitter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let c = self;
        let (b, k, s, h) = (c.brightness, c.contrast, c.saturation, c.hue);
        write!(f, "{b},{k},{s},{h}")
    }
}

/// The transform flags (help heading "Data"); serialised as they are into the run record and
/// `model.json` (each left out at its default).
#[derive(Args, Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
#[serde(default)]
pub struct TransformFlags {
    /// RandomVerticalFlip: the probability of flipping each training crop upside down ("Random
    /// vertical flip"). 0: off.
    #[arg(help_heading = "Data", long, env = "TCHRUN_VFLIP", value_name = "P", default_value_t = 0.0, value_parser = crate::recipe::parse_closed_unit, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "is_zero")]
    pub vflip: f64,
    /// RandomRotation(DEG): each training crop rotated by an angle uniform in [-DEG, DEG]
    /// about its centre, the corners filled black ("Random rotation"), 0 to 180. 0: off.
    #[arg(help_heading = "Data", long, env = "TCHRUN_ROTATION", value_name = "DEG", default_value_t = 0.0, value_parser = parse_degrees, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "is_zero")]
    pub rotation: f64,
    /// RandomAffine(degrees=DEG, translate=(T, T), scale=(SCALE_MIN, SCALE_MAX),
    /// shear=SHEAR) on each training crop ("Random affine"): a rotation in [-DEG, DEG], a shift
    /// of up to T × the side (T in [0, 1]), a scale in [SCALE_MIN, SCALE_MAX], an x-shear in
    /// [-SHEAR, SHEAR] degrees. E.g. 10,0.1,0.9,1.1,5.
    #[arg(help_heading = "Data", long, env = "TCHRUN_AFFINE", value_name = "DEG,TRANSLATE,SCALE_MIN,SCALE_MAX,SHEAR", value_parser = parse_affine, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub affine: Option<Affine>,
    /// RandomPerspective(distortion_scale=DISTORTION, p=P) on each training crop ("Random
    /// perspective"): with probability P its corners move inwards by up to DISTORTION × half
    /// the side (both in [0, 1]). E.g. 0.5,0.5.
    #[arg(help_heading = "Data", long, env = "TCHRUN_PERSPECTIVE", value_name = "DISTORTION,P", value_parser = parse_perspective, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perspective: Option<Perspective>,
    /// ColorJitter(brightness=B, contrast=C, saturation=S, hue=H) on each training crop
    /// ("Color jitter"): factors uniform in [max(0, 1 - B), 1 + B] (C, S alike) and a hue
    /// shift in [-H, H] (H at most 0.5), in a random order; 0 leaves one out. E.g. 0.4,0.4,0.4,0.1.
    #[arg(help_heading = "Data", long, env = "TCHRUN_COLOR_JITTER", value_name = "B,C,S,H", value_parser = parse_color_jitter, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub color_jitter: Option<ColorJitter>,
    /// RandomGrayscale(P): the probability of turning each training crop grey (three equal
    /// channels); 1: always ("Grayscale"), else "Random grayscale". 0: off.
    #[arg(help_heading = "Data", long, env = "TCHRUN_GRAYSCALE", value_name = "P", default_value_t = 0.0, value_parser = crate::recipe::parse_closed_unit, allow_negative_numbers = true)]
    #[serde(skip_serializing_if = "is_zero")]
    pub grayscale: f64,
    /// Pad(N, padding_mode=MODE): N pixels on every side of each training image before its
    /// crop ("Pad"); MODE constant (black, the default), edge, reflect or symmetric. E.g. 4 or
    /// 4,reflect.
    #[arg(help_heading = "Data", long, env = "TCHRUN_PAD", value_name = "N[,MODE]", value_parser = parse_pad)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pad: Option<Pad>,
    /// RandomCrop(--train-crop-size, pad_if_needed=True) instead of RandomResizedCrop ("Random
    /// crop"): a crop of the (padded) image at its own scale, at a uniform place; an image
    /// smaller than the crop is padded (--pad's MODE) first.
    #[arg(help_heading = "Data", long, env = "TCHRUN_RANDOM_CROP")]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub random_crop: bool,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

impl TransformFlags {
    /// The flags as arguments for a rank (only those not at their default; `argv`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv_changed(self)
    }

    /// The flags with a value list that are given: (flag name, value as the flag takes it).
    fn given(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        if let Some(a) = self.affine {
            v.push(("affine", a.to_string()));
        }
        if let Some(p) = self.perspective {
            v.push(("perspective", p.to_string()));
        }
        if let Some(c) = self.color_jitter {
            v.push(("color-jitter", c.to_string()));
        }
        if let Some(p) = self.pad {
            v.push(("pad", p.to_string()));
        }
        v
    }

    /// A transform that resamples the image (rotation, affine, perspective) is on.
    pub fn resamples(&self) -> bool {
        self.rotation > 0.0 || self.affine.is_some() || self.perspective.is_some()
    }

    /// Any per-pixel transform after the crop is on (all but `--pad` and `--random-crop`).
    pub fn after_crop(&self) -> bool {
        self.vflip > 0.0 || self.resamples() || self.color_jitter.is_some() || self.grayscale > 0.0
    }

    /// The deterministic transforms alone (`data transform --inference`, "for inference"):
    /// `--pad`, and `--grayscale 1` (the designer's "Grayscale", not random).
    pub fn for_inference(&self) -> TransformFlags {
        TransformFlags {
            pad: self.pad,
            grayscale: if self.grayscale >= 1.0 { 1.0 } else { 0.0 },
            ..TransformFlags::default()
        }
    }

    /// The fields that differ between `self` (the checkpoint's) and `now`: (flag, the
    /// checkpoint's value, this job's, the flag that gives the checkpoint's value back).
    pub fn differences(&self, now: &TransformFlags) -> Vec<(String, String, String, String)> {
        let mut out = Vec::new();
        for (name, was, is) in [
            ("vflip", self.vflip, now.vflip),
            ("rotation", self.rotation, now.rotation),
            ("grayscale", self.grayscale, now.grayscale),
        ] {
            if was != is {
                let fix = format!("--{name} {was}");
                out.push((format!("--{name}"), was.to_string(), is.to_string(), fix));
            }
        }
        let (was, is) = (self.given(), now.given());
        for name in ["affine", "perspective", "color-jitter", "pad"] {
            let find = |v: &[(&str, String)]| v.iter().find(|x| x.0 == name).map(|x| x.1.clone());
            let (a, b) = (find(&was), find(&is));
            if a != b {
                let fix = a
                    .as_ref()
                    .map_or(format!("no --{name}"), |v| format!("--{name} {v}"));
                let show = |v: Option<String>| v.unwrap_or_else(|| "(none)".into());
                out.push((format!("--{name}"), show(a), show(b), fix));
            }
        }
        if self.random_crop != now.random_crop {
            let word = |b: bool| if b { "on" } else { "off" }.to_string();
            let fix = if self.random_crop {
                "--random-crop"
            } else {
                "no --random-crop"
            };
            let (a, b) = (word(self.random_crop), word(now.random_crop));
            out.push(("--random-crop".into(), a, b, fix.into()));
        }
        out
    }
}

/// The numbers of a comma-separated flag value: exactly `n` of them, finite.
fn numbers(s: &str, n: usize, form: &str) -> Result<Vec<f64>, String> {
    let parts: Vec<&str> = s.split(',').collect();
    if parts.len() != n {
        return Err(format!(
            "takes {n} comma-separated numbers ({form}), got '{s}'"
        ));
    }
    parts.iter().map(|p| crate::recipe::number(p)).collect()
}

/// Degrees of a rotation range: 0 to 180.
fn parse_degrees(s: &str) -> Result<f64, String> {
    let v = crate::recipe::number(s)?;
    if !(0.0..=180.0).contains(&v) {
        return Err(format!("must be 0 to 180 degrees, got {s}"));
    }
    Ok(v)
}

fn parse_affine(s: &str) -> Result<Affine, String> {
    let v = numbers(
        s,
        5,
        "DEG,TRANSLATE,SCALE_MIN,SCALE_MAX,SHEAR, e.g. 10,0.1,0.9,1.1,5",
    )?;
    let a = Affine {
        degrees: v[0],
        translate: v[1],
        scale_min: v[2],
        scale_max: v[3],
        shear: v[4],
    };
    if !(0.0..=180.0).contains(&a.degrees) {
        return Err(format!("DEG must be 0 to 180, got {}", a.degrees));
    }
    if !(0.0..=1.0).contains(&a.translate) {
        return Err(format!(
            "TRANSLATE is a share of the side, 0 to 1, got {}",
            a.translate
        ));
    }
    if !(a.scale_min > 0.0 && a.scale_min <= a.scale_max && a.scale_max <= 10.0) {
        return Err(format!(
            "SCALE_MIN and SCALE_MAX must be positive, SCALE_MIN <= SCALE_MAX <= 10 (1,1: no \
             scaling), got {} and {}",
            a.scale_min, a.scale_max
        ));
    }
    if !(0.0..90.0).contains(&a.shear) {
        return Err(format!(
            "SHEAR must be 0 to less than 90 degrees, got {}",
            a.shear
        ));
    }
    Ok(a)
}

fn parse_perspective(s: &str) -> Result<Perspective, String> {
    let v = numbers(s, 2, "DISTORTION,P, e.g. 0.5,0.5")?;
    for (what, x) in [("DISTORTION", v[0]), ("P", v[1])] {
        if !(0.0..=1.0).contains(&x) {
            return Err(format!("{what} must be in [0, 1], got {x}"));
        }
    }
    Ok(Perspective {
        distortion: v[0],
        p: v[1],
    })
}

fn parse_color_jitter(s: &str) -> Result<ColorJitter, String> {
    let v = numbers(s, 4, "B,C,S,H, e.g. 0.4,0.4,0.4,0.1")?;
    for (what, x) in [("B", v[0]), ("C", v[1]), ("S", v[2])] {
        if x < 0.0 {
            return Err(format!("{what} must be >= 0 (0: unchanged), got {x}"));
        }
    }
    if !(0.0..=0.5).contains(&v[3]) {
        return Err(format!("H must be in [0, 0.5], got {}", v[3]));
    }
    Ok(ColorJitter {
        brightness: v[0],
        contrast: v[1],
        saturation: v[2],
        hue: v[3],
    })
}

/// The largest `--pad` (pixels per side).
pub const MAX_PAD: u32 = 1024;

fn parse_pad(s: &str) -> Result<Pad, String> {
    let (n, mode) = match s.split_once(',') {
        Some((n, m)) => (n, Some(m)),
        None => (s, None),
    };
    let pixels = match n.trim().parse::<i64>() {
        Ok(v) if (1..=i64::from(MAX_PAD)).contains(&v) => v as u32,
        _ => {
            return Err(format!(
                "N must be a whole number of pixels, 1 to {MAX_PAD}, got '{n}' (the form is \
                 N[,MODE], e.g. 4 or 4,reflect)"
            ))
        }
    };
    let mode = match mode {
        None => PadMode::Constant,
        Some(m) => <PadMode as ValueEnum>::from_str(m.trim(), true)
            .map_err(|_| format!("MODE must be constant, edge, reflect or symmetric, got '{m}'"))?,
    };
    Ok(Pad { pixels, mode })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        t: TransformFlags,
    }

    fn parse(args: &[&str]) -> Result<TransformFlags, String> {
        let mut v = vec!["x"];
        v.extend(args);
        Cli::try_parse_from(v)
            .map(|c| c.t)
            .map_err(|e| e.to_string())
    }

    #[test]
    fn flags_round_trip_through_args_and_records() {
        let none = parse(&[]).expect("defaults");
        assert_eq!(none, TransformFlags::default());
        assert!(none.to_args().expect("argv").is_empty() && !none.after_crop());
        assert_eq!(serde_json::to_string(&none).expect("json"), "{}");
        let all = parse(&[
            "--vflip",
            "0.5",
            "--rotation",
            "15",
            "--affine",
            "10,0.1,0.9,1.1,5",
            "--perspective",
            "0.5,0.25",
            "--color-jitter",
            "0.4,0.3,0.2,0.1",
            "--grayscale",
            "0.2",
            "--pad",
            "4,reflect",
            "--random-crop",
        ])
        .expect("valid");
        let args: Vec<String> = all.to_args().expect("argv");
        let again = parse(&args.iter().map(String::as_str).collect::<Vec<_>>()).expect("again");
        assert_eq!(again, all);
        let json = serde_json::to_string(&all).expect("json");
        let back: TransformFlags = serde_json::from_str(&json).expect("back");
        assert_eq!(back, all);
        assert!(
            json.contains(r#""pad":{"pixels":4,"mode":"reflect"}"#),
            "{json}"
        );
        assert_eq!(
            parse(&["--pad", "2"]).expect("pad").pad.map(|p| p.mode),
            Some(PadMode::Constant)
        );
        // Differences name the flag and the value that gives the checkpoint's back.
        let d = all.differences(&none);
        let names: Vec<&str> = d.iter().map(|x| x.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "--vflip",
                "--rotation",
                "--grayscale",
                "--affine",
                "--perspective",
                "--color-jitter",
                "--pad",
                "--random-crop"
            ]
        );
        assert_eq!(d[3].3, "--affine 10,0.1,0.9,1.1,5");
        assert_eq!(d[6].3, "--pad 4,reflect");
        assert_eq!(none.differences(&all)[3].3, "no --affine");
        assert!(all.differences(&again).is_empty());
        let inf = all.for_inference();
        assert_eq!(
            (inf.pad, inf.grayscale, inf.after_crop()),
            (all.pad, 0.0, false)
        );
        assert_eq!(
            parse(&["--grayscale", "1"])
                .expect("g")
                .for_inference()
                .grayscale,
            1.0
        );
    }

    #[test]
    fn bad_values_name_the_flag_and_the_form() {
        for (flag, v, says) in [
            ("--vflip", "1.5", "[0, 1]"),
            ("--rotation", "-5", "0 to 180"),
            ("--rotation", "200", "0 to 180"),
            ("--affine", "10,0.1,0.9", "5 comma-separated"),
            ("--affine", "10,2,0.9,1.1,5", "TRANSLATE"),
            ("--affine", "10,0.1,1.2,1.1,5", "SCALE_MIN"),
            ("--affine", "10,0.1,0,1.1,5", "SCALE_MIN"),
            ("--affine", "10,0.1,0.9,1.1,90", "SHEAR"),
            ("--perspective", "1.5,0.5", "DISTORTION"),
            ("--perspective", "0.5", "2 comma-separated"),
            ("--color-jitter", "0.4,-1,0,0", "C must"),
            ("--color-jitter", "0.4,0.4,0.4,0.6", "H must"),
            ("--color-jitter", "a,b,c,d", "not a number"),
            ("--grayscale", "2", "[0, 1]"),
            ("--pad", "0", "N must"),
            ("--pad", "4,wrap", "MODE must"),
        ] {
            let e = parse(&[flag, v]).expect_err(flag);
            assert!(e.contains(flag) && e.contains(says), "{flag} {v}: {e}");
        }
    }
}
