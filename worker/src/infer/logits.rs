//! `tchrun-worker logits` (hidden): a model directory's logits for fixed input batches in
//! inference mode, and its weights as tchrun writes a `state_dict`. The parity tests hand the
//! same weights and batches to torchvision and compare (`tests/parity.rs`). With `--grads`,
//! also one training step's loss and gradients (training mode, stochastic depth and dropout
//! off).
use crate::models;
use std::path::PathBuf;
use tch::{nn, Device, Tensor};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory (`model.json` and `model.safetensors`, trained or from `model init
    /// --weights`).
    #[arg(long)]
    model: PathBuf,
    /// Safetensors file of input batches (N, 3, H, W), float32, any names.
    #[arg(long)]
    input: PathBuf,
    /// Safetensors file to write: the logits of each input under the input's name.
    #[arg(long)]
    output: PathBuf,
    /// Also write the model's weights as tchrun's `state_dict` (what training writes).
    #[arg(long)]
    state_dict: Option<PathBuf>,
    /// Safetensors file holding a batch `x` (N, 3, H, W) and its labels `y` (int64) for
    /// `--grads`.
    #[arg(long, requires = "grads")]
    train_input: Option<PathBuf>,
    /// Safetensors file to write: the cross-entropy `loss` of `--train-input`'s batch in
    /// training mode with stochastic depth and dropout off, and the gradient of every parameter under its
    /// `state_dict` name.
    #[arg(long, requires = "train_input")]
    grads: Option<PathBuf>,
}

/// One training step's loss and gradients (`--grads`), on a model of its own built without
/// stochastic depth and dropout.
fn grads(
    cfg: &tchrun::model::ModelConfig,
    classes: i64,
    weights: &std::path::Path,
    input: &std::path::Path,
    output: &std::path::Path,
) -> anyhow::Result<()> {
    use anyhow::Context;
    let mut vs = nn::VarStore::new(Device::Cpu);
    let net = models::build_deterministic(cfg.arch, &vs.root(), classes, cfg.input_size.into());
    models::load(&mut vs, weights)?;
    let batch: std::collections::HashMap<String, Tensor> = Tensor::read_safetensors(input)
        .with_context(|| input.display().to_string())?
        .into_iter()
        .collect();
    let (x, y) = match (batch.get("x"), batch.get("y")) {
        (Some(x), Some(y)) => (x, y),
        _ => anyhow::bail!("{}: needs tensors 'x' and 'y'", input.display()),
    };
    let loss = net.forward_t(x, true).cross_entropy_for_logits(y);
    loss.backward();
    let mut out = vec![("loss".to_string(), loss.detach())];
    for (name, t) in models::named(&vs) {
        if t.requires_grad() {
            out.push((name, t.grad()));
        }
    }
    Tensor::write_safetensors(&out, output).with_context(|| output.display().to_string())?;
    Ok(())
}

pub fn run(a: Args) -> anyhow::Result<()> {
    use anyhow::Context;
    let cfg = tchrun::model::load(&a.model, false).map_err(|e| anyhow::anyhow!("{e}"))?;
    let weights = a.model.join(tchrun::files::MODEL_WEIGHTS);
    let head = format!("{}weight", tchrun::weights::head_prefix(cfg.arch));
    let classes = Tensor::read_safetensors(&weights)
        .with_context(|| format!("{}", weights.display()))?
        .into_iter()
        .find(|(n, _)| *n == head)
        .map(|(_, t)| t.size()[0])
        .with_context(|| format!("{}: no {head}", weights.display()))?;
    let mut vs = nn::VarStore::new(Device::Cpu);
    let net = models::build(
        cfg.arch,
        &vs.root(),
        classes,
        cfg.input_size.into(),
        cfg.memory_efficient,
    );
    models::load(&mut vs, &weights)?;
    let inputs =
        Tensor::read_safetensors(&a.input).with_context(|| a.input.display().to_string())?;
    let outputs: Vec<(String, Tensor)> = tch::no_grad(|| {
        inputs
            .iter()
            .map(|(name, x)| (name.clone(), net.forward_t(x, false)))
            .collect()
    });
    Tensor::write_safetensors(&outputs, &a.output)
        .with_context(|| a.output.display().to_string())?;
    if let (Some(input), Some(output)) = (&a.train_input, &a.grads) {
        grads(&cfg, classes, &weights, input, output)?;
    }
    if let Some(path) = &a.state_dict {
        let sd = models::state_dict(&models::named(&vs), 0);
        Tensor::write_safetensors(&sd, path).with_context(|| path.display().to_string())?;
    }
    println!(
        "{}: {} classes, {} input batch(es)",
        cfg.arch.name(),
        classes,
        outputs.len()
    );
    Ok(())
}
