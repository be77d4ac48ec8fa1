//! `tchrun-worker export` (hidden; `tchrun export` runs it): tchrun's own model traced by
//! libtorch into a TorchScript module (`model.pt`, its weights as constants), the module
//! loaded back and checked against tchrun's forward on the check batch at each batch size,
//! and the check batch with tchrun's probabilities left (`check.npz`) for the ONNX step.
//! Writes only into `--staging` (the launcher's, renamed into place when all is checked).
pub mod check;
mod error;

pub use error::ExportError;

use crate::models;
use std::path::Path;
use tch::{nn, CModule, Device, Kind, Tensor};
use tchrun::export::{self as contract, Batch, Check, Target, TraceArgs};
use tchrun::model::ModelConfig;

/// The model as the exported graph computes it: (uint8 NHWC →) normalized float NCHW → (half
/// →) the network → float32 probabilities.
struct Graph<'a> {
    net: &'a dyn nn::ModuleT,
    mean: Tensor,
    std: Tensor,
    with_preprocess: bool,
    fp16: bool,
}

impl Graph<'_> {
    fn forward(&self, x: &Tensor) -> Tensor {
        let x = if self.with_preprocess {
            // The loader's arithmetic: v / 255, minus the mean, over the std (float32).
            (x.permute([0, 3, 1, 2]).to_kind(Kind::Float) / 255.0 - &self.mean) / &self.std
        } else {
            x.shallow_clone()
        };
        let x = if self.fp16 { x.to_kind(Kind::Half) } else { x };
        self.net
            .forward_t(&x, false)
            .to_kind(Kind::Float)
            .softmax(-1, Kind::Float)
    }
}

fn write_err(path: &Path) -> impl Fn(&dyn std::fmt::Display) -> ExportError + '_ {
    move |e| ExportError::Write {
        path: path.into(),
        why: e.to_string(),
    }
}

/// The model's network with its weights, frozen (traced weights become constants), in
/// float32 or half precision.
fn network(
    dir: &Path,
    cfg: &ModelConfig,
    half: bool,
) -> Result<(nn::VarStore, Box<dyn nn::ModuleT>), ExportError> {
    let mut vs = nn::VarStore::new(Device::Cpu);
    // Inference only: a memory-efficient DenseNet computes the same forward without it.
    let net = models::build(
        cfg.arch,
        &vs.root(),
        cfg.class_names.len() as i64,
        cfg.input_size.into(),
        false,
    );
    models::load(&mut vs, &dir.join(tchrun::files::MODEL_WEIGHTS))?;
    vs.freeze();
    if half {
        vs.half();
    }
    Ok((vs, net))
}

/// The batch sizes the check runs: 1 and all the check images for a dynamic axis (the trace
/// ran at 3, so neither is the traced size unless there are 3), N for a fixed one.
fn check_batches(batch: Batch, count: usize) -> Vec<usize> {
    match batch {
        Batch::Dynamic if count > 1 => vec![1, count],
        Batch::Dynamic => vec![1],
        Batch::Fixed(n) => vec![n as usize],
    }
}

/// The first `n` rows of `x`, repeated as needed.
fn rows(x: &Tensor, n: usize) -> Tensor {
    let have = x.size()[0] as usize;
    let idx: Vec<i64> = (0..n).map(|i| (i % have) as i64).collect();
    x.index_select(0, &Tensor::from_slice(&idx))
}

/// Traces, saves, reloads and checks; leaves `model.pt`, `check.npz` and `check.json` in
/// `--staging`. Returns the TorchScript check (its verdict already passed).
pub fn export(a: &TraceArgs) -> Result<Check, ExportError> {
    let cfg = tchrun::model::load(&a.model, true)?;
    let pre = contract::Preprocess::of(&cfg, a.with_preprocess);
    let (_vs, net) = network(&a.model, &cfg, false)?;
    let (_vs16, net16) = if a.fp16 {
        let (v, n) = network(&a.model, &cfg, true)?;
        (Some(v), Some(n))
    } else {
        (None, None)
    };
    let batch = check::CheckBatch::load(a.check_images.as_deref(), &cfg, &pre)?;
    let norm = |v: [f32; 3]| Tensor::from_slice(&v).view([1, 3, 1, 1]);
    let graph = Graph {
        net: net16.as_deref().unwrap_or(net.as_ref()),
        mean: norm(pre.mean),
        std: norm(pre.std),
        with_preprocess: a.with_preprocess,
        fp16: a.fp16,
    };
    let input = |n: usize| {
        if a.with_preprocess {
            rows(&batch.pixels, n)
        } else {
            rows(&batch.floats, n)
        }
    };
    let trace_at = match a.batch {
        Batch::Dynamic => 3,
        Batch::Fixed(n) => n as usize,
    };
    let example = input(trace_at);
    // One forward before the trace: a tensor made from host data inside a trace (tch's
    // `from_slice`, e.g. the Swin's shifted-window mask, cached on first use) would be
    // recorded as `zeros` with its values lost; made here, the trace keeps it as a constant.
    let _ = tch::no_grad(|| graph.forward(&example));
    let module = tch::no_grad(|| {
        CModule::create_by_tracing("tchrun_export", "forward", &[example], &mut |xs| {
            vec![graph.forward(&xs[0])]
        })
    })?;
    let pt = a.staging.join(contract::TORCHSCRIPT_FILE);
    module.save(&pt)?;
    let loaded = CModule::load(&pt)?;
    let tolerance = if a.fp16 {
        contract::TOLERANCE_FP16
    } else {
        contract::TOLERANCE_FP32
    };
    let mut runs = Vec::new();
    let mut npz: Vec<(String, Tensor)> = Vec::new();
    for (i, n) in check_batches(a.batch, batch.count).into_iter().enumerate() {
        let reference = tch::no_grad(|| {
            net.forward_t(&rows(&batch.floats, n), false)
                .to_kind(Kind::Float)
                .softmax(-1, Kind::Float)
        });
        let x = input(n);
        let got = tch::no_grad(|| loaded.forward_ts(&[&x]))?;
        runs.push(check::difference(n, &got, &reference, tolerance)?);
        npz.push((format!("x{i}"), x));
        npz.push((format!("p{i}"), reference));
    }
    let record = Check {
        target: Target::Torchscript,
        images: batch.source.clone(),
        count: batch.count,
        tolerance,
        runs,
    };
    let json = a.staging.join(contract::CHECK_JSON);
    let text = serde_json::to_string_pretty(&record).map_err(|e| write_err(&json)(&e))?;
    tchrun::files::write_atomic(&json, text.as_bytes()).map_err(|e| write_err(&json)(&e))?;
    record.verdict().map_err(ExportError::Mismatch)?;
    let path = a.staging.join(contract::CHECK_NPZ);
    Tensor::write_npz(&npz, &path)?;
    Ok(record)
}

/// `tchrun-worker export`.
pub fn run(a: TraceArgs) -> Result<(), (tchrun::exit::ErrorKind, anyhow::Error)> {
    tch::set_num_threads(tchrun::env::threads_per_rank(1) as i32);
    match export(&a) {
        Ok(c) => {
            let worst = c.worst().map(|w| w.max_abs_diff).unwrap_or(0.0);
            println!(
                "traced {} into {}: TorchScript agrees with tchrun's forward (largest \
                 probability difference {worst:.2e} on {} image(s))",
                a.model.display(),
                a.staging.join(contract::TORCHSCRIPT_FILE).display(),
                c.count
            );
            Ok(())
        }
        Err(e) => Err((e.kind(), e.into())),
    }
}
