//! `tchrun model init`: an untrained model directory (`model.json`: arch, input size,
//! normalization). Weights are initialized from `--seed` when training starts, or come from
//! `--weights` (a torchvision `state_dict` in safetensors or as a `torch.save` `.pth`, checked
//! without libtorch and written into the directory as `model.safetensors`, a `.pth` converted,
//! so the directory is self-contained).
use crate::error::JobError;
use clap::Args;
use std::path::PathBuf;
use tchrun::model::{self, Arch, ModelConfig, Normalization};
use tchrun::overlap::Named;

#[derive(Args, Debug)]
pub struct InitArgs {
    /// Architecture (torchvision name).
    #[arg(long, value_enum)]
    pub arch: Arch,
    /// Square input size in pixels (224 for ImageNet-like data; 32 or 64 for tiny images). A
    /// ViT is built for it: a multiple of its patch (16, vit_b_32 32); --weights of another
    /// size have their positional embedding resampled (torchvision's interpolate_embeddings).
    /// A Swin takes any size (windows padded); its checkpoints load at any size unchanged.
    #[arg(long, default_value_t = 224)]
    pub input_size: u32,
    /// Per-channel mean of RGB inputs in [0, 1] (default ImageNet's).
    #[arg(
        long,
        value_delimiter = ',',
        num_args = 3,
        allow_negative_numbers = true
    )]
    pub mean: Option<Vec<f32>>,
    /// Per-channel standard deviation (default ImageNet's).
    #[arg(long, value_delimiter = ',', num_args = 3)]
    pub std: Option<Vec<f32>>,
    /// Directory to write.
    #[arg(long)]
    pub output: PathBuf,
    /// Initial weights: a torchvision state_dict, as safetensors (saved with
    /// `safetensors.torch.save_file(model.state_dict(), PATH)`) or as a PyTorch .pth/.pt file
    /// (saved with `torch.save(model.state_dict(), PATH)`, e.g. torchvision's downloaded
    /// ImageNet checkpoints; read without running anything in it, and stored converted to
    /// safetensors). A classifier with another number of classes than the training set is
    /// replaced by a fresh one when training starts.
    #[arg(long)]
    pub weights: Option<PathBuf>,
    /// ResNet: start the last batch-norm weight of every residual block at zero
    /// (torchvision's zero_init_residual=True; ignored where --weights set those weights).
    #[arg(long)]
    pub zero_init_residual: bool,
    /// DenseNet: recompute each dense layer's concatenation, norm1 and relu in backward
    /// instead of keeping them (torchvision's memory_efficient=True): peak memory grows
    /// linearly, not quadratically, with a block's layers, for some more compute.
    #[arg(long)]
    pub memory_efficient: bool,
    /// Replace an existing model.json.
    #[arg(long)]
    pub force: bool,
}

pub fn run(a: &InitArgs) -> Result<(), JobError> {
    if let Some(w) = &a.weights {
        crate::plan::preflight::check_disjoint(
            &[Named::new("--output", "the model directory", &a.output)],
            vec![Named::new("--weights", "the initial weights file", w)],
            None,
        )?;
    }
    model::check_arch_input_size(a.arch, a.input_size)
        .map_err(|e| JobError::invalid(format!("--input-size: {e}")))?;
    let mut norm = Normalization::default();
    if let Some(m) = &a.mean {
        norm.mean = [m[0], m[1], m[2]];
    }
    if let Some(s) = &a.std {
        if s.iter().any(|v| !(v.is_finite() && *v > 0.0)) {
            return Err(JobError::invalid("--std: every value must be > 0"));
        }
        norm.std = [s[0], s[1], s[2]];
    }
    if a.zero_init_residual && !a.arch.is_resnet() {
        return Err(JobError::invalid(format!(
            "--zero-init-residual: {} is not a ResNet (ResNet only); leave the flag out",
            a.arch.name()
        )));
    }
    if a.memory_efficient && !a.arch.is_densenet() {
        return Err(JobError::invalid(format!(
            "--memory-efficient: {} has no dense blocks (DenseNet only); leave the flag out",
            a.arch.name()
        )));
    }
    // Before anything is written: a file for another architecture, truncated or corrupt.
    let loaded = match &a.weights {
        Some(w) => Some(
            tchrun::weights::load(a.arch, w, a.input_size)
                .map_err(|e| JobError::invalid(e.to_string()))?,
        ),
        None => None,
    };
    let target = a.output.join(tchrun::files::MODEL_JSON);
    if target.exists() && !a.force {
        return Err(JobError::invalid(format!(
            "--output {}: already holds a model.json; choose another directory or pass --force",
            a.output.display()
        )));
    }
    std::fs::create_dir_all(&a.output).map_err(|e| {
        JobError::invalid(format!(
            "--output {}: cannot create it: {e}",
            a.output.display()
        ))
    })?;
    let mut cfg = ModelConfig::untrained(a.arch, a.input_size, norm);
    cfg.zero_init_residual = a.zero_init_residual;
    cfg.memory_efficient = a.memory_efficient;
    cfg.suggested_recipe =
        tchrun::recipe_preset::suggestion(a.arch).map(|s| s.record(a.input_size));
    let weights_target = a.output.join(tchrun::files::MODEL_WEIGHTS);
    if let (Some(w), Some(loaded)) = (&a.weights, loaded) {
        tchrun::files::write_atomic(&weights_target, &loaded.safetensors).map_err(|e| {
            JobError::invalid(format!("--output {}: {}", a.output.display(), e.source))
        })?;
        cfg.initial_weights = Some(model::InitialWeights::from_file(
            w.file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default(),
            loaded.sha256,
            &loaded.info,
            a.input_size,
        ));
    } else if weights_target.exists() {
        // --force over a directory with weights: without --weights it starts from the seed.
        std::fs::remove_file(&weights_target).map_err(|e| {
            JobError::invalid(format!("--output {}: {e}", weights_target.display()))
        })?;
    }
    tchrun::files::write_atomic(&target, model::to_json(&cfg).as_bytes())
        .map_err(|e| JobError::invalid(format!("--output {}: {}", a.output.display(), e.source)))?;
    if let Some(s) = cfg.initial_weights.as_ref().and_then(|i| i.image_size) {
        if s != a.input_size {
            outln!(
                "{}: the positional embedding of the {s}x{s} checkpoint resampled for {}x{} \
                 (bicubic, as torchvision's interpolate_embeddings)",
                a.arch.name(),
                a.input_size,
                a.input_size
            );
        }
    }
    match &a.weights {
        Some(w) => outln!(
            "{} model ({}x{} input) with the weights of {} in {}",
            a.arch.name(),
            a.input_size,
            a.input_size,
            w.display(),
            a.output.display()
        ),
        None => outln!(
            "untrained {} model ({}x{} input) in {}",
            a.arch.name(),
            a.input_size,
            a.input_size,
            a.output.display()
        ),
    }
    Ok(())
}
