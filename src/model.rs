//! Model directory format (`model.json`): architecture, input size, normalization, and for a
//! trained model the class names, training parameters and final metrics. Weights live beside it
//! in `model.safetensors` (torchvision `state_dict` names). Never pickles.
pub use crate::arch::{Arch, Family, MAX_INPUT_SIZE, MIN_INPUT_SIZE};
use crate::files::{MODEL_JSON, MODEL_WEIGHTS};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// Version of the `model.json` schema this build writes and reads.
pub const FORMAT_VERSION: u32 = 1;

/// Per-channel normalization applied to RGB inputs scaled to [0, 1].
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Normalization {
    pub mean: [f32; 3],
    pub std: [f32; 3],
}

impl Default for Normalization {
    /// ImageNet's mean and standard deviation.
    fn default() -> Self {
        Normalization {
            mean: [0.485, 0.456, 0.406],
            std: [0.229, 0.224, 0.225],
        }
    }
}

/// `model.json`'s `training`: how a trained model was trained, written by rank 0 at the end.
/// Fields added after the first version are `#[serde(default)]`, so older files stay readable.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainingRecord {
    /// `--epochs` (the most that could run).
    pub epochs: u32,
    /// Epochs run (fewer than `epochs` after early stopping).
    pub epochs_run: usize,
    /// The epoch of the lowest validation loss: the weights in `model.safetensors`.
    pub best_epoch: u32,
    /// `--batch-size` per rank.
    pub batch_size: u32,
    pub warmup_epochs: u32,
    /// `--lr`, the LR of a batch of `lr_reference_batch` images.
    pub lr: f64,
    /// The peak LR after `--lr-scaling` (by default × world size; see `lr_reference_batch`).
    pub effective_lr: f64,
    pub world_size: usize,
    pub seed: i64,
    pub patience: u32,
    pub momentum: f64,
    pub weight_decay: f64,
    pub lr_power: f64,
    /// Optimizer steps taken (all runs, resumes included).
    pub steps: u64,
    pub train_images: usize,
    pub valid_images: usize,
    /// `--freeze-backbone` (false in files written before it existed).
    #[serde(default)]
    pub freeze_backbone: bool,
    /// `--backbone-lr-scale` (1 in files written before it existed).
    #[serde(default = "one")]
    pub backbone_lr_scale: f64,
    /// `--global-batch-size` (images per optimizer step over every rank), if given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch_size: Option<u32>,
    /// `--lr-scaling` (effective LR = lr × factor).
    #[serde(default = "linear")]
    pub lr_scaling: crate::flags::LrScaling,
    /// The batch `--lr` is given for (`--lr-reference-batch`, else G, else `--batch-size`): the
    /// effective LR is `lr` scaled by (images per optimizer step) / this. Absent in files
    /// written before it existed (their reference was `--batch-size`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr_reference_batch: Option<u32>,
    /// Each rank's intra-op (libtorch) threads (`--threads`): the same model at any world size
    /// holds at equal threads per rank. Absent in files written before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<u32>,
    /// The MLflow run rank 0 logged this training to (`--mlflow-tracking-uri`), when the
    /// tracking server had made it by the time the model was written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mlflow_run_id: Option<String>,
    /// The recipe flags (`--lr-scheduler`, `--label-smoothing`, ...); absent in files written
    /// before they existed (the old behaviour).
    #[serde(flatten, default)]
    pub recipe: crate::recipe::RecipeRecord,
    /// The augmentation and crop-size flags; absent in files written before they existed.
    #[serde(flatten, default)]
    pub augment: crate::augment_flags::AugmentRecord,
    /// `--class-weights` and the weights it resolved to; absent without it.
    #[serde(flatten, default)]
    pub class_weights: crate::class_weights::ClassWeightsRecord,
}

fn linear() -> crate::flags::LrScaling {
    crate::flags::LrScaling::Linear
}

fn one() -> f64 {
    1.0
}

/// `model.json`'s `initial_weights`: where a model's first weights came from. Two writers, one
/// shape: `tchrun model init --weights` (the file's name, sha256, format, its classifier's
/// classes and tensor count) and a training job started from a trained model directory (the
/// weights file's path, its sha256, `trained_model`). Fields are kept in the order written
/// (alphabetical, as the untyped map before was), each absent one left out; models written
/// before `format` existed still load.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InitialWeights {
    /// `model init`: the file name given to `--weights`; training: the trained model's weights
    /// file (its path).
    pub file: String,
    /// How the file was stored (`model init`); absent in models written before `.pth` support.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub format: Option<crate::weights::Format>,
    /// Output classes of the file's classifier (`model init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub head_classes: Option<usize>,
    /// ViT (`model init`): the image size the file's model was built for (its positional
    /// embedding's grid of patches times the patch size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_size: Option<u32>,
    /// ViT: the file's `encoder.pos_embedding` was resampled from `image_size` to the model's
    /// `input_size`, as torchvision's `interpolate_embeddings` does (bicubic,
    /// `align_corners=True`, the class token's position kept).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub pos_embedding_interpolated: bool,
    /// sha256 of the file given (not of a conversion).
    #[serde(default)]
    pub sha256: String,
    /// Tensors in the file (`model init`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tensors: Option<usize>,
    /// The weights were a trained model's (its directory given to `--model`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trained_model: bool,
}

impl InitialWeights {
    /// As `tchrun model init --weights FILE` records a checked file, for a model of
    /// `input_size` pixels.
    pub fn from_file(
        file: String,
        sha256: String,
        info: &crate::weights::WeightsInfo,
        input_size: u32,
    ) -> Self {
        InitialWeights {
            file,
            format: Some(info.format),
            head_classes: Some(info.head_classes),
            image_size: info.image_size,
            pos_embedding_interpolated: info.image_size.is_some_and(|s| s != input_size),
            sha256,
            tensors: Some(info.tensors),
            trained_model: false,
        }
    }

    /// As training records a start from a trained model's weights file.
    pub fn from_trained_model(file: String, sha256: String) -> Self {
        InitialWeights {
            file,
            format: None,
            head_classes: None,
            image_size: None,
            pos_embedding_interpolated: false,
            sha256,
            tensors: None,
            trained_model: true,
        }
    }
}

/// Contents of `model.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub format_version: u32,
    pub arch: Arch,
    pub input_size: u32,
    #[serde(default)]
    pub normalization: Normalization,
    /// Class names in index order; empty for an untrained model.
    #[serde(default)]
    pub class_names: Vec<String>,
    /// Training parameters used (trained models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub training: Option<TrainingRecord>,
    /// Final metrics (trained models only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<serde_json::Value>,
    /// Where the initial weights came from (`model init --weights`, or a trained model given
    /// to `--model`). Kept through training, so a trained model says how it began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub initial_weights: Option<InitialWeights>,
    /// ResNet: the last batch-norm weight of every residual block starts at zero (torchvision's
    /// `zero_init_residual=True`), so each block starts as the identity.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zero_init_residual: bool,
    /// DenseNet: each dense layer's concatenation, norm1 and relu are recomputed in backward
    /// instead of kept (torchvision's `memory_efficient=True`): less memory, the same values.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub memory_efficient: bool,
    /// `<output>/ema/`'s: these weights are `--model-ema`'s exponential moving average of the
    /// trained model's (its decay, steps and updates). Absent in every other model directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema: Option<crate::recipe::EmaRecord>,
    /// torchvision's recipe for this architecture where it is not tchrun's defaults (set by
    /// `model init` from `recipe_preset::suggestion`): what `train` suggests once. Never
    /// applied by itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub suggested_recipe: Option<SuggestedRecipe>,
}

/// `model.json`'s `suggested_recipe`: the flags to add and every flag they set, at the model's
/// input size, and where the recipe comes from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SuggestedRecipe {
    /// What to add to `tchrun train`: `--recipe NAME` and this model's own flags.
    pub flags: String,
    /// The flags the recipe sets (a flag given on the command line wins over its value).
    pub sets: String,
    pub source: String,
}

impl ModelConfig {
    pub fn untrained(arch: Arch, input_size: u32, normalization: Normalization) -> ModelConfig {
        ModelConfig {
            format_version: FORMAT_VERSION,
            arch,
            input_size,
            normalization,
            class_names: Vec::new(),
            training: None,
            metrics: None,
            initial_weights: None,
            zero_init_residual: false,
            memory_efficient: false,
            ema: None,
            suggested_recipe: None,
        }
    }

    /// A trained model has class names and weights.
    pub fn is_trained(&self) -> bool {
        !self.class_names.is_empty()
    }
}

/// The seed's `InvalidModelDirectoryError`.
#[derive(Debug, thiserror::Error)]
#[error("InvalidModelDirectoryError: {path}: {detail}")]
pub struct InvalidModelDirectory {
    pub path: PathBuf,
    pub detail: String,
}

fn invalid(path: &Path, detail: impl Into<String>) -> InvalidModelDirectory {
    InvalidModelDirectory {
        path: path.to_path_buf(),
        detail: detail.into(),
    }
}

/// Checks a configuration's values (used for files read and for flags given).
pub fn check_input_size(size: u32) -> Result<(), String> {
    if (MIN_INPUT_SIZE..=MAX_INPUT_SIZE).contains(&size) {
        Ok(())
    } else {
        Err(format!(
            "input size {size} is outside {MIN_INPUT_SIZE}..={MAX_INPUT_SIZE}"
        ))
    }
}

/// `check_input_size`, and the architecture's own minimum: below it a DenseNet's feature map
/// shrinks to nothing in its last 2x2 average pool; a ViT's input is a whole number of patches.
pub fn check_arch_input_size(arch: Arch, size: u32) -> Result<(), String> {
    check_input_size(size)?;
    if let Some(p) = arch.patch_size().filter(|p| size % p != 0) {
        let below = (size / p * p).max(p);
        return Err(format!(
            "input size {size} does not divide by {}'s patch size {p} (a Vision Transformer \
             takes whole {p}x{p} patches); use {below} or {}",
            arch.name(),
            below + p
        ));
    }
    let min = arch.min_input_size();
    if size < min {
        return Err(format!(
            "input size {size} is too small for {}: its feature maps vanish before the classifier; \
             use an input size of {min} or more",
            arch.name()
        ));
    }
    Ok(())
}

/// Reads and validates `<dir>/model.json`. With `need_weights`, also requires
/// `model.safetensors` (a trained model, as `score` needs).
pub fn load(dir: &Path, need_weights: bool) -> Result<ModelConfig, InvalidModelDirectory> {
    let ext = dir
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase);
    // Decided by what it is: a directory is a model directory whatever its name (`x.pth/`);
    // a file named as a pickle is refused as one.
    if !dir.is_dir()
        && matches!(
            ext.as_deref(),
            Some("pt") | Some("pth") | Some("pkl") | Some("ckpt")
        )
    {
        return Err(invalid(
            dir,
            "pickled PyTorch files are refused (unpickling runs arbitrary code); give a model \
             directory made by `tchrun model init --arch ARCH --output DIR` (weights as safetensors)",
        ));
    }
    if !dir.is_dir() {
        return Err(invalid(
            dir,
            "not a directory; create an untrained model with `tchrun model init --arch resnet18 --output DIR`",
        ));
    }
    let file = dir.join(MODEL_JSON);
    if let Some(e) = unfinished_training(dir) {
        return Err(e);
    }
    let text =
        crate::files::read_bounded_string(&file, crate::files::caps::MODEL_JSON).map_err(|e| {
            invalid(
                &file,
                format!(
                "cannot read {MODEL_JSON} ({e}); a model directory is made by `tchrun model init`"
            ),
            )
        })?;
    let raw: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| invalid(&file, format!("not valid JSON: {e}")))?;
    if let Some(arch) = raw.get("arch").and_then(|a| a.as_str()) {
        if Arch::from_name(arch).is_none() {
            let known: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
            return Err(invalid(
                &file,
                format!("unknown arch '{arch}'; supported: {}", known.join(", ")),
            ));
        }
    }
    let cfg: ModelConfig = serde_json::from_value(raw)
        .map_err(|e| invalid(&file, format!("not a tchrun model description: {e}")))?;
    if cfg.format_version != FORMAT_VERSION {
        return Err(invalid(
            &file,
            format!(
                "format_version {} is not supported (this tchrun reads {FORMAT_VERSION})",
                cfg.format_version
            ),
        ));
    }
    check_arch_input_size(cfg.arch, cfg.input_size).map_err(|e| invalid(&file, e))?;
    if cfg.memory_efficient && !cfg.arch.is_densenet() {
        return Err(invalid(
            &file,
            format!(
                "memory_efficient is a DenseNet option and {} is not a DenseNet; remove it",
                cfg.arch.name()
            ),
        ));
    }
    if cfg.zero_init_residual && !cfg.arch.is_resnet() {
        return Err(invalid(
            &file,
            format!(
                "zero_init_residual is a ResNet option and {} is not a ResNet; remove it",
                cfg.arch.name()
            ),
        ));
    }
    if cfg
        .normalization
        .std
        .iter()
        .any(|s| !(s.is_finite() && *s > 0.0))
        || cfg.normalization.mean.iter().any(|m| !m.is_finite())
    {
        return Err(invalid(
            &file,
            "normalization std must be finite and > 0, mean finite",
        ));
    }
    if need_weights {
        if !cfg.is_trained() {
            return Err(invalid(
                &file,
                "untrained model (no class names): train it with `tchrun train` first",
            ));
        }
        let weights = dir.join(MODEL_WEIGHTS);
        if !weights.is_file() {
            return Err(invalid(&weights, "missing weights of a trained model"));
        }
    }
    // Strict loading: the weights are exactly model.json's architecture (and classes), checked
    // from the file's header before anything loads them (launcher and ranks alike).
    let weights = dir.join(MODEL_WEIGHTS);
    if weights.is_file() {
        crate::weights::check_model_weights(
            cfg.arch,
            cfg.is_trained().then_some(cfg.class_names.len()),
            cfg.input_size,
            &weights,
        )
        .map_err(|e| invalid(&weights, e))?;
    }
    for entry in std::fs::read_dir(dir)
        .map_err(|e| invalid(dir, e.to_string()))?
        .flatten()
    {
        let name = entry.file_name().to_string_lossy().to_lowercase();
        if name.ends_with(".pt") || name.ends_with(".pth") || name.ends_with(".pkl") {
            return Err(invalid(
                &entry.path(),
                "pickled weights are refused (unpickling runs arbitrary code); tchrun reads model.safetensors only",
            ));
        }
    }
    Ok(cfg)
}

/// A training `--output` that is not a model yet: it holds `checkpoints/last.json` (training
/// started there) but not both `model.json` and `model.safetensors`, or its `last.json` says
/// the training has not finished while no `model.json` is there.
fn unfinished_training(dir: &Path) -> Option<InvalidModelDirectory> {
    let last = dir
        .join(crate::files::CHECKPOINT_DIR)
        .join(crate::files::CHECKPOINT_LAST);
    if !last.is_file() {
        return None;
    }
    let complete = dir.join(MODEL_JSON).is_file() && dir.join(MODEL_WEIGHTS).is_file();
    if complete {
        return None;
    }
    Some(invalid(
        dir,
        format!(
            "training has not finished in {d} (it holds {c}/{l} but no complete model: \
             {MODEL_JSON} and {MODEL_WEIGHTS} are written when training ends); use `tchrun train \
             ... --output {d} --resume` with the interrupted job's flags to finish it (or give \
             --model a finished model directory)",
            d = dir.display(),
            c = crate::files::CHECKPOINT_DIR,
            l = crate::files::CHECKPOINT_LAST,
        ),
    ))
}

/// Serializes a configuration for `model.json`.
pub fn to_json(cfg: &ModelConfig) -> String {
    let mut s =
        serde_json::to_string_pretty(cfg).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"));
    s.push('\n');
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn training_record_of_an_older_file_reads_with_defaults() {
        let old = r#"{"epochs": 3, "epochs_run": 2, "best_epoch": 2, "batch_size": 8,
            "warmup_epochs": 0, "lr": 0.1, "effective_lr": 0.2, "world_size": 2, "seed": 1,
            "patience": 5, "momentum": 0.9, "weight_decay": 0.0001, "lr_power": 2.0,
            "steps": 10, "train_images": 40, "valid_images": 10}"#;
        let r: TrainingRecord = serde_json::from_str(old).expect("an older record reads");
        assert!(!r.freeze_backbone);
        assert_eq!(r.backbone_lr_scale, 1.0);
        assert_eq!(r.world_size, 2);
    }

    /// Both writers' `initial_weights`, byte for byte as the untyped maps wrote them, and the
    /// shape of models written before `format` existed.
    #[test]
    fn initial_weights_keep_both_writers_shapes() {
        let info = crate::weights::WeightsInfo {
            head_classes: 1000,
            tensors: 122,
            format: crate::weights::Format::Pth,
            image_size: None,
        };
        let init = InitialWeights::from_file("r18.pth".into(), "ab".into(), &info, 224);
        assert_eq!(
            serde_json::to_string(&init).unwrap(),
            r#"{"file":"r18.pth","format":"pth","head_classes":1000,"sha256":"ab","tensors":122}"#
        );
        let trained =
            InitialWeights::from_trained_model("/m/model.safetensors".into(), "cd".into());
        assert_eq!(
            serde_json::to_string(&trained).unwrap(),
            r#"{"file":"/m/model.safetensors","sha256":"cd","trained_model":true}"#
        );
        for w in [&init, &trained] {
            let back: InitialWeights =
                serde_json::from_str(&serde_json::to_string(w).unwrap()).unwrap();
            assert_eq!(&back, w);
        }
        let older: InitialWeights = serde_json::from_str(
            r#"{"file": "r18.safetensors", "head_classes": 1000, "sha256": "ef", "tensors": 122}"#,
        )
        .expect("a model written before .pth support loads");
        assert_eq!((older.format, older.head_classes), (None, Some(1000)));
    }

    fn write(dir: &Path, text: &str) {
        std::fs::write(dir.join(MODEL_JSON), text).expect("write model.json");
    }

    #[test]
    fn feature_map_sizes_follow_torchvision() {
        // ResNet: 224 -> 7, 32 -> 1, 33 -> 2; DenseNet: 224 -> 7, 256 -> 8, 40 -> 1, 28 -> 0.
        assert_eq!(Arch::Resnet50.last_feature_size(224), 7);
        assert_eq!(Arch::Resnet18.last_feature_size(32), 1);
        assert_eq!(Arch::Resnet18.last_feature_size(33), 2);
        assert_eq!(Arch::Densenet121.last_feature_size(224), 7);
        assert_eq!(Arch::Densenet121.last_feature_size(256), 8);
        assert_eq!(Arch::Densenet121.last_feature_size(40), 1);
        assert_eq!(Arch::Densenet121.last_feature_size(28), 0);
        assert_eq!(Arch::Densenet201.min_input_size(), 29);
        assert_eq!(Arch::Resnet18.min_input_size(), MIN_INPUT_SIZE);
        assert_eq!(Arch::Resnet18.min_input_for_single_image(), 33);
        // ConvNeXt: floor(s / 32) (4x4 stride-4 stem, three 2x2 stride-2 downsamplings).
        assert_eq!(Arch::ConvnextTiny.last_feature_size(224), 7);
        assert_eq!(Arch::ConvnextTiny.last_feature_size(63), 1);
        assert_eq!(Arch::ConvnextTiny.last_feature_size(31), 0);
        assert_eq!(Arch::ConvnextLarge.min_input_size(), 32);
        assert_eq!(Arch::ConvnextTiny.min_input_for_single_image(), 32);
        // EfficientNet: the stem and four stride-2 stages, each ceil(s / 2), as ResNet's.
        assert_eq!(Arch::EfficientnetB0.last_feature_size(224), 7);
        assert_eq!(Arch::EfficientnetV2S.last_feature_size(384), 12);
        assert_eq!(Arch::EfficientnetB7.last_feature_size(600), 19);
        assert_eq!(Arch::EfficientnetB0.min_input_size(), MIN_INPUT_SIZE);
        assert_eq!(Arch::EfficientnetV2L.min_input_for_single_image(), 33);
        // MobileNetV3: the stem and four stride-2 blocks, each ceil(s / 2).
        assert_eq!(Arch::MobilenetV3Small.last_feature_size(224), 7);
        assert_eq!(Arch::MobilenetV3Large.last_feature_size(33), 2);
        assert_eq!(Arch::MobilenetV3Large.min_input_size(), MIN_INPUT_SIZE);
        assert_eq!(Arch::MobilenetV3Small.min_input_for_single_image(), 33);
        // RegNet: the stem and four stages' first blocks, each stride 2, ceil(s / 2).
        assert_eq!(Arch::RegnetY400mf.last_feature_size(224), 7);
        assert_eq!(Arch::RegnetX32gf.last_feature_size(33), 2);
        assert_eq!(Arch::RegnetX400mf.min_input_size(), MIN_INPUT_SIZE);
        assert_eq!(Arch::RegnetY32gf.min_input_for_single_image(), 33);
        // Swin: the 4x4 patches, floor(s / 4), then three patch mergings, each ceil(s / 2);
        // torchvision runs it at any size from 4 px (checked: 4, 15, 17, 33, 100), windows and
        // odd sides padded, so every accepted size is.
        assert_eq!(Arch::SwinT.last_feature_size(224), 7);
        assert_eq!(Arch::SwinB.last_feature_size(100), 4);
        assert_eq!(Arch::SwinS.min_input_size(), MIN_INPUT_SIZE);
        assert_eq!(Arch::SwinT.min_input_for_single_image(), MIN_INPUT_SIZE);
        assert!(check_arch_input_size(Arch::SwinT, 17).is_ok());
        assert!(check_arch_input_size(Arch::Densenet121, 28)
            .unwrap_err()
            .contains("use an input size of 29 or more"));
        assert!(check_arch_input_size(Arch::Densenet121, 29).is_ok());
        assert!(check_arch_input_size(Arch::Resnet18, 16).is_ok());
    }

    #[test]
    fn round_trip_and_errors() {
        let t = tempfile::tempdir().expect("tempdir");
        let cfg = ModelConfig::untrained(Arch::Densenet121, 64, Normalization::default());
        write(t.path(), &to_json(&cfg));
        assert_eq!(load(t.path(), false).expect("valid"), cfg);
        let err = load(t.path(), true).expect_err("untrained").to_string();
        assert!(
            err.starts_with("InvalidModelDirectoryError:") && err.contains("untrained"),
            "{err}"
        );

        write(
            t.path(),
            r#"{"format_version":1,"arch":"vgg16","input_size":224}"#,
        );
        let err = load(t.path(), false).expect_err("bad arch").to_string();
        assert!(err.contains("vgg16") && err.contains("resnet18"), "{err}");
        write(t.path(), "{not json");
        assert!(load(t.path(), false)
            .expect_err("bad json")
            .to_string()
            .contains("not valid JSON"));
        write(
            t.path(),
            r#"{"format_version":1,"arch":"resnet18","input_size":4}"#,
        );
        assert!(load(t.path(), false)
            .expect_err("small")
            .to_string()
            .contains("input size 4"));
        let missing = t.path().join("nope");
        assert!(load(&missing, false)
            .expect_err("missing")
            .to_string()
            .contains("not a directory"));
        write(
            t.path(),
            r#"{"format_version":1,"arch":"resnet18","input_size":32,"memory_efficient":true}"#,
        );
        assert!(load(t.path(), false)
            .expect_err("resnet memory_efficient")
            .to_string()
            .contains("memory_efficient is a DenseNet option"));
        write(
            t.path(),
            r#"{"format_version":1,"arch":"densenet121","input_size":32,"zero_init_residual":true}"#,
        );
        assert!(load(t.path(), false)
            .expect_err("densenet zero_init_residual")
            .to_string()
            .contains("zero_init_residual is a ResNet option"));
        write(
            t.path(),
            r#"{"format_version":1,"arch":"convnext_tiny","input_size":32,"zero_init_residual":true}"#,
        );
        let e = load(t.path(), false).expect_err("convnext zero_init_residual");
        assert!(
            e.to_string().ends_with(
                "zero_init_residual is a ResNet option and convnext_tiny is not a ResNet; remove it"
            ),
            "{e}"
        );
        assert!(load(Path::new("weights.pth"), false)
            .expect_err("pickle")
            .to_string()
            .contains("pickled"));
    }

    /// Issue 52 item 6: a model directory named `x.pth` is a model directory (decided by what
    /// it is, not by its name); a file of that name is still refused as a pickle.
    #[test]
    fn a_model_directory_named_like_a_pickle_is_a_model_directory() {
        let t = tempfile::tempdir().expect("tmp");
        let d = t.path().join("x.pth");
        std::fs::create_dir(&d).expect("mkdir");
        let cfg = ModelConfig::untrained(Arch::Resnet18, 32, Normalization::default());
        std::fs::write(d.join(MODEL_JSON), to_json(&cfg)).expect("model.json");
        assert_eq!(
            load(&d, false).expect("a model directory").arch,
            Arch::Resnet18
        );
        std::fs::write(t.path().join("y.pth"), b"PK").expect("file");
        let e = load(&t.path().join("y.pth"), false).expect_err("a pickle file");
        assert!(e.to_string().contains("pickled"), "{e}");
    }
}
