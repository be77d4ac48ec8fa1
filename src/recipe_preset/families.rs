//! torchvision's training recipes, each as a `--recipe`, and the arguments one adds
//! (`expand`): ResNet-50's V2 recipe and those of the families whose recipe is not tchrun's
//! defaults (the source component's SGD with polynomial decay), from
//! `references/classification/README.md` of torchvision; and the suggestion `model init`
//! writes into `model.json` and `train` prints once. Nothing is applied unless the user gives
//! `--recipe`.
//!
//! Two translations, as for `torchvision-v2`: each command's `--lr` is the LR of its 8 GPUs ×
//! `--batch-size` images per step, hence `--lr-reference-batch` (tchrun scales `--lr` by the
//! images per step, torchvision does not); sizes are given at the recipe's input size and
//! scaled to the model's. Flags tchrun does not have are left out and said in the docs
//! (`--amp`, device-dependent; Swin's `--transformer-embedding-decay`; Swin's `--interpolation
//! bicubic`, which tchrun's auto-augment ops refuse, as torchvision's tensor ops do).
use super::setting::{on, sized, text, Preset, Setting};
use crate::arch::Arch;
use crate::model::SuggestedRecipe;

impl Preset {
    /// The recipe's settings, in the order torchvision's command line gives them.
    pub fn settings(self) -> &'static [Setting] {
        match self {
            Preset::TorchvisionV2 => TORCHVISION_V2,
            Preset::TorchvisionConvnext => CONVNEXT,
            Preset::TorchvisionEfficientnetV2 => EFFICIENTNET_V2,
            Preset::TorchvisionMobilenetV3 => MOBILENET_V3,
            Preset::TorchvisionRegnet => REGNET,
            Preset::TorchvisionSwin => SWIN,
            Preset::TorchvisionVit => VIT,
        }
    }
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

/// `--model convnext_* --batch-size 128 --opt adamw --lr 1e-3 --lr-scheduler cosineannealinglr
/// --lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide --epochs 600
/// --random-erase 0.1 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --weight-decay
/// 0.05 --norm-weight-decay 0.0 --train-crop-size 176 --model-ema --val-resize-size 232
/// --ra-sampler --ra-reps 4`.
pub(super) const CONVNEXT: &[Setting] = &[
    text("batch_size", "--batch-size", "128"),
    text("opt", "--opt", "adamw"),
    text("lr", "--lr", "1e-3"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("warmup_epochs", "--warmup-epochs", "5"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("auto_augment", "--auto-augment", "ta_wide"),
    text("epochs", "--epochs", "600"),
    text("random_erase", "--random-erase", "0.1"),
    text("label_smoothing", "--label-smoothing", "0.1"),
    text("mixup_alpha", "--mixup-alpha", "0.2"),
    text("cutmix_alpha", "--cutmix-alpha", "1.0"),
    text("weight_decay", "--weight-decay", "0.05"),
    text("norm_weight_decay", "--norm-weight-decay", "0.0"),
    sized("train_crop_size", "--train-crop-size", 176, 224),
    on("model_ema", "--model-ema"),
    sized("val_resize_size", "--val-resize-size", 232, 224),
    on("ra_sampler", "--ra-sampler"),
    text("ra_reps", "--ra-reps", "4"),
];

/// `--model efficientnet_v2_s --batch-size 128 --lr 0.5 --lr-scheduler cosineannealinglr
/// --lr-warmup-epochs 5 --lr-warmup-method linear --auto-augment ta_wide --epochs 600
/// --random-erase 0.1 --label-smoothing 0.1 --mixup-alpha 0.2 --cutmix-alpha 1.0 --weight-decay
/// 0.00002 --norm-weight-decay 0.0 --train-crop-size 300 --model-ema --val-crop-size 384
/// --val-resize-size 384 --ra-sampler --ra-reps 4` (the S variant's sizes, for its 384 px).
pub(super) const EFFICIENTNET_V2: &[Setting] = &[
    text("batch_size", "--batch-size", "128"),
    text("lr", "--lr", "0.5"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("warmup_epochs", "--warmup-epochs", "5"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("auto_augment", "--auto-augment", "ta_wide"),
    text("epochs", "--epochs", "600"),
    text("random_erase", "--random-erase", "0.1"),
    text("label_smoothing", "--label-smoothing", "0.1"),
    text("mixup_alpha", "--mixup-alpha", "0.2"),
    text("cutmix_alpha", "--cutmix-alpha", "1.0"),
    text("weight_decay", "--weight-decay", "0.00002"),
    text("norm_weight_decay", "--norm-weight-decay", "0.0"),
    sized("train_crop_size", "--train-crop-size", 300, 384),
    on("model_ema", "--model-ema"),
    sized("val_crop_size", "--val-crop-size", 384, 384),
    sized("val_resize_size", "--val-resize-size", 384, 384),
    on("ra_sampler", "--ra-sampler"),
    text("ra_reps", "--ra-reps", "4"),
];

/// `--model mobilenet_v3_* --epochs 600 --opt rmsprop --batch-size 128 --lr 0.064 --wd 0.00001
/// --lr-step-size 2 --lr-gamma 0.973 --auto-augment imagenet --random-erase 0.2` (train.py's
/// scheduler default is `steplr`, tchrun's is `poly`: the recipe names it).
pub(super) const MOBILENET_V3: &[Setting] = &[
    text("epochs", "--epochs", "600"),
    text("opt", "--opt", "rmsprop"),
    text("batch_size", "--batch-size", "128"),
    text("lr", "--lr", "0.064"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("weight_decay", "--weight-decay", "0.00001"),
    text("lr_scheduler", "--lr-scheduler", "steplr"),
    text("lr_step_size", "--lr-step-size", "2"),
    text("lr_gamma", "--lr-gamma", "0.973"),
    text("auto_augment", "--auto-augment", "imagenet"),
    text("random_erase", "--random-erase", "0.2"),
];

/// The small models' command: `--epochs 100 --batch-size 128 --wd 0.00005 --lr=0.8
/// --lr-scheduler=cosineannealinglr --lr-warmup-method=linear --lr-warmup-epochs=5
/// --lr-warmup-decay=0.1` (the medium and large models halve the batch and the LR together:
/// the same LR per image, which is what tchrun's `--lr-reference-batch` keeps).
pub(super) const REGNET: &[Setting] = &[
    text("epochs", "--epochs", "100"),
    text("batch_size", "--batch-size", "128"),
    text("weight_decay", "--weight-decay", "0.00005"),
    text("lr", "--lr", "0.8"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("warmup_epochs", "--warmup-epochs", "5"),
    text("lr_warmup_decay", "--lr-warmup-decay", "0.1"),
];

/// `--model swin_* --epochs 300 --batch-size 128 --opt adamw --lr 0.001 --weight-decay 0.05
/// --norm-weight-decay 0.0 --bias-weight-decay 0.0 --transformer-embedding-decay 0.0
/// --lr-scheduler cosineannealinglr --lr-min 0.00001 --lr-warmup-method linear
/// --lr-warmup-epochs 20 --lr-warmup-decay 0.01 --amp --label-smoothing 0.1 --mixup-alpha 0.8
/// --clip-grad-norm 5.0 --cutmix-alpha 1.0 --random-erase 0.25 --interpolation bicubic
/// --auto-augment ta_wide --model-ema --ra-sampler --ra-reps 4 --val-resize-size 224`, less
/// the flags the module's comment names.
pub(super) const SWIN: &[Setting] = &[
    text("epochs", "--epochs", "300"),
    text("batch_size", "--batch-size", "128"),
    text("opt", "--opt", "adamw"),
    text("lr", "--lr", "0.001"),
    text("lr_reference_batch", "--lr-reference-batch", "1024"),
    text("weight_decay", "--weight-decay", "0.05"),
    text("norm_weight_decay", "--norm-weight-decay", "0.0"),
    text("bias_weight_decay", "--bias-weight-decay", "0.0"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("lr_min", "--lr-min", "0.00001"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("warmup_epochs", "--warmup-epochs", "20"),
    text("lr_warmup_decay", "--lr-warmup-decay", "0.01"),
    text("label_smoothing", "--label-smoothing", "0.1"),
    text("mixup_alpha", "--mixup-alpha", "0.8"),
    text("clip_grad_norm", "--clip-grad-norm", "5.0"),
    text("cutmix_alpha", "--cutmix-alpha", "1.0"),
    text("random_erase", "--random-erase", "0.25"),
    text("auto_augment", "--auto-augment", "ta_wide"),
    on("model_ema", "--model-ema"),
    on("ra_sampler", "--ra-sampler"),
    text("ra_reps", "--ra-reps", "4"),
    sized("val_resize_size", "--val-resize-size", 224, 224),
];

/// `--model vit_b_16 --epochs 300 --batch-size 512 --opt adamw --lr 0.003 --wd 0.3
/// --lr-scheduler cosineannealinglr --lr-warmup-method linear --lr-warmup-epochs 30
/// --lr-warmup-decay 0.033 --amp --label-smoothing 0.11 --mixup-alpha 0.2 --auto-augment ra
/// --clip-grad-norm 1 --ra-sampler --cutmix-alpha 1.0 --model-ema` (8 × 512 images per step).
pub(super) const VIT: &[Setting] = &[
    text("epochs", "--epochs", "300"),
    text("batch_size", "--batch-size", "512"),
    text("opt", "--opt", "adamw"),
    text("lr", "--lr", "0.003"),
    text("lr_reference_batch", "--lr-reference-batch", "4096"),
    text("weight_decay", "--weight-decay", "0.3"),
    text("lr_scheduler", "--lr-scheduler", "cosineannealinglr"),
    text("lr_warmup_method", "--lr-warmup-method", "linear"),
    text("warmup_epochs", "--warmup-epochs", "30"),
    text("lr_warmup_decay", "--lr-warmup-decay", "0.033"),
    text("label_smoothing", "--label-smoothing", "0.11"),
    text("mixup_alpha", "--mixup-alpha", "0.2"),
    text("auto_augment", "--auto-augment", "ra"),
    text("clip_grad_norm", "--clip-grad-norm", "1"),
    on("ra_sampler", "--ra-sampler"),
    text("cutmix_alpha", "--cutmix-alpha", "1.0"),
    on("model_ema", "--model-ema"),
];

/// What torchvision trained an architecture with, as tchrun flags: a `--recipe` and the flags
/// that differ for this model from the recipe's (given after it, they win).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Suggestion {
    pub recipe: Preset,
    pub extra: &'static [Setting],
    /// Where the recipe comes from, for the note.
    pub source: &'static str,
}

const README: &str = "torchvision's references/classification/README.md";

/// The recipe torchvision published for `arch`, where it is not tchrun's defaults: `None` for
/// the ResNet, ResNeXt, Wide-ResNet and DenseNet families (the source component's, whose
/// defaults tchrun keeps; `--recipe torchvision-v2` is their modern recipe) and for
/// EfficientNet B0-B7 (ported weights: torchvision published no recipe).
pub fn suggestion(arch: Arch) -> Option<Suggestion> {
    let name = arch.name();
    let s = |recipe, extra, source| {
        Some(Suggestion {
            recipe,
            extra,
            source,
        })
    };
    const VIT_B_32: &[Setting] = &[text("auto_augment", "--auto-augment", "imagenet")];
    // vit_l_16's command is the V2 recipe with clipping, RASampler's default 3 repetitions
    // and no smaller training crop (a ViT trains at its own size).
    const VIT_L_16: &[Setting] = &[
        text("clip_grad_norm", "--clip-grad-norm", "1"),
        text("ra_reps", "--ra-reps", "3"),
        sized("train_crop_size", "--train-crop-size", 224, 224),
    ];
    // efficientnet_v2_m: --train-crop-size 384 --val-crop-size 480 --val-resize-size 480.
    const EFFICIENTNET_V2_M: &[Setting] =
        &[sized("train_crop_size", "--train-crop-size", 384, 480)];
    // The medium and the large RegNets: batches of 64 and 32, the LR halved with each.
    const REGNET_MEDIUM: &[Setting] = &[text("batch_size", "--batch-size", "64")];
    const REGNET_LARGE: &[Setting] = &[text("batch_size", "--batch-size", "32")];
    // "we used learning rate 0.4 for regnet_y_400mf".
    const REGNET_Y_400MF: &[Setting] = &[text("lr", "--lr", "0.4")];
    match name {
        _ if name.starts_with("convnext_") => s(Preset::TorchvisionConvnext, &[], README),
        "efficientnet_v2_s" | "efficientnet_v2_l" => {
            s(Preset::TorchvisionEfficientnetV2, &[], README)
        }
        "efficientnet_v2_m" => s(Preset::TorchvisionEfficientnetV2, EFFICIENTNET_V2_M, README),
        _ if name.starts_with("mobilenet_v3_") => s(Preset::TorchvisionMobilenetV3, &[], README),
        "regnet_y_400mf" => s(Preset::TorchvisionRegnet, REGNET_Y_400MF, README),
        "regnet_x_3_2gf" | "regnet_x_8gf" | "regnet_x_16gf" | "regnet_y_3_2gf" | "regnet_y_8gf" => {
            s(Preset::TorchvisionRegnet, REGNET_MEDIUM, README)
        }
        "regnet_x_32gf" | "regnet_y_16gf" | "regnet_y_32gf" => {
            s(Preset::TorchvisionRegnet, REGNET_LARGE, README)
        }
        _ if name.starts_with("regnet_") => s(Preset::TorchvisionRegnet, &[], README),
        _ if name.starts_with("swin_") => s(Preset::TorchvisionSwin, &[], README),
        "vit_b_16" => s(Preset::TorchvisionVit, &[], README),
        "vit_b_32" => s(Preset::TorchvisionVit, VIT_B_32, README),
        "vit_l_16" => s(Preset::TorchvisionV2, VIT_L_16, README),
        _ => None,
    }
}

impl Suggestion {
    /// The record `model init` writes.
    pub fn record(&self, input_size: u32) -> SuggestedRecipe {
        let sets = expand(self.recipe, |_| false, Some(input_size));
        SuggestedRecipe {
            flags: self.flags(input_size),
            sets: sets.join(" "),
            source: self.source.to_string(),
        }
    }

    /// The flags to add, at the model's input size: `--recipe NAME` and this model's own.
    pub fn flags(&self, input_size: u32) -> String {
        let mut out = vec![format!("--recipe {}", self.recipe.as_str())];
        out.extend(
            self.extra
                .iter()
                .filter_map(|e| e.arg(" ", Some(input_size))),
        );
        out.join(" ")
    }

    /// Whether the user chose for themselves: gave `--recipe`, or any flag the recipe sets
    /// but `--epochs` and `--batch-size` (the run's length and the memory's, which nearly
    /// every job gives).
    pub fn chosen(&self, given: impl Fn(&str) -> bool) -> bool {
        given("recipe")
            || self
                .recipe
                .settings()
                .iter()
                .chain(self.extra)
                .filter(|s| !matches!(s.id, "epochs" | "batch_size"))
                .any(|s| given(s.id))
    }

    /// The note `train` prints once when the user chose nothing of the recipe.
    pub fn note(&self, arch: Arch, input_size: u32) -> String {
        format!(
            "note: torchvision trains {} with its own recipe ({}), not with tchrun's defaults \
             (SGD, polynomial decay): add `{}` to train with it (each flag you give still \
             wins; `--dry-run` lists them). Nothing was changed.",
            arch.name(),
            self.source,
            self.flags(input_size)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every recipe's flags parse as `tchrun train`'s own: an id that is not a flag's would
    /// be silently never "given" (the user's value would lose), and a value that does not
    /// parse would fail every job that names the recipe.
    #[test]
    fn every_recipe_names_train_flags_with_values_they_take() {
        use clap::{Args, FromArgMatches};
        let cmd = crate::flags::TrainJob::augment_args(clap::Command::new("train"));
        for p in <Preset as clap::ValueEnum>::value_variants() {
            for s in p.settings() {
                let arg = cmd.get_arguments().find(|a| a.get_id() == s.id);
                let long = arg.and_then(|a| a.get_long());
                assert_eq!(long.map(|l| format!("--{l}")).as_deref(), Some(s.flag));
            }
            let mut line: Vec<String> = ["train", "--model=m", "--train=t", "--valid=v"]
                .iter()
                .map(|a| a.to_string())
                .collect();
            line.push("--output=o".into());
            line.extend(expand(*p, |_| false, Some(224)));
            let m = cmd.clone().try_get_matches_from(&line);
            let job = m.map(|m| crate::flags::TrainJob::from_arg_matches(&m));
            assert!(matches!(job, Ok(Ok(_))), "{}: {job:?}", p.as_str());
        }
    }

    /// The families torchvision trains otherwise have their recipe, with each model's own
    /// flags; the source component's families have none.
    #[test]
    fn suggestions_follow_torchvisions_readme() {
        let flags = |name: &str, size| {
            let arch = Arch::from_name(name).expect(name);
            suggestion(arch).map(|s| s.flags(size))
        };
        assert_eq!(flags("resnet50", 224), None);
        assert_eq!(flags("densenet121", 224), None);
        assert_eq!(flags("efficientnet_b0", 224), None);
        assert_eq!(
            flags("convnext_tiny", 224).as_deref(),
            Some("--recipe torchvision-convnext")
        );
        assert_eq!(
            flags("vit_b_32", 224).as_deref(),
            Some("--recipe torchvision-vit --auto-augment imagenet")
        );
        assert_eq!(
            flags("vit_l_16", 224).as_deref(),
            Some("--recipe torchvision-v2 --clip-grad-norm 1 --ra-reps 3 --train-crop-size 224")
        );
        assert_eq!(
            flags("efficientnet_v2_m", 480).as_deref(),
            Some("--recipe torchvision-efficientnet-v2 --train-crop-size 384")
        );
        assert_eq!(
            flags("mobilenet_v3_small", 224).as_deref(),
            Some("--recipe torchvision-mobilenet-v3")
        );
        let s = suggestion(Arch::from_name("convnext_tiny").expect("arch")).expect("recipe");
        assert!(!s.chosen(|_| false));
        assert!(s.chosen(|id| id == "opt"));
        assert!(s.chosen(|id| id == "recipe"));
        assert!(!s.chosen(|id| id == "data"));
        assert!(!s.chosen(|id| id == "epochs" || id == "batch_size"));
        // The EfficientNetV2 sizes are the S variant's at its 384 px, scaled.
        let e = expand(Preset::TorchvisionEfficientnetV2, |_| false, Some(384));
        assert!(e.iter().any(|a| a == "--train-crop-size=300"), "{e:?}");
        assert!(e.iter().any(|a| a == "--val-crop-size=384"), "{e:?}");
    }
}
