//! `tchrun-worker logits` (hidden): a model directory's logits for fixed input batches in
//! inference mode, and its weights as tchrun writes a `state_dict`. The parity tests hand the
//! same weights and batches to torchvision and compare (`tests/parity.rs`).
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
    let net = models::build(cfg.arch, &vs.root(), classes, cfg.memory_efficient);
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
