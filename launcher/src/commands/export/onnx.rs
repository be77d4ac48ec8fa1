//! The ONNX step of `tchrun export`: the environment's Python (`onnx_step.py`, embedded)
//! writes `model.onnx` from the traced `model.pt` with torch's TorchScript-based exporter, adds
//! the preprocessing as `metadata_props`, runs `onnx.checker` and checks the graph in ONNX
//! Runtime against tchrun's probabilities.
use super::failed::failed;
use crate::error::JobError;
use std::path::{Path, PathBuf};
use tchrun::export::{self as contract, Batch, Check, ExportJob, Preprocess, Target};

const SCRIPT: &str = include_str!("onnx_step.py");

/// `--python`, else the Python of the environment tchrun is installed in (`bin/python3` beside
/// it), else `python3` on PATH.
pub fn python(given: Option<&Path>) -> Result<PathBuf, JobError> {
    if let Some(p) = given {
        return if p.is_file() {
            Ok(p.to_path_buf())
        } else {
            Err(JobError::invalid(format!(
                "--python {}: no such file; pass the Python whose torch, onnx and onnxruntime \
                 the ONNX export uses",
                p.display()
            )))
        };
    }
    let beside = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("python3")))
        .filter(|p| p.is_file());
    Ok(beside.unwrap_or_else(|| PathBuf::from("python3")))
}

/// Runs the ONNX step in `staging` and returns its check (its verdict passed).
pub fn export(
    python: &Path,
    a: &ExportJob,
    staging: &Path,
    pre: &Preprocess,
    ts: &Check,
) -> Result<Check, JobError> {
    let (input, output) = Target::Onnx.io_names();
    let args = serde_json::json!({
        "pt": staging.join(contract::TORCHSCRIPT_FILE),
        "onnx": staging.join(contract::ONNX_FILE),
        "npz": staging.join(contract::CHECK_NPZ),
        "runs": ts.runs.len(),
        "dynamic": a.batch == Batch::Dynamic,
        "input": input,
        "output": output,
        "opset": a.opset,
        "tolerance": ts.tolerance,
        "threads": tchrun::env::threads_per_rank(1),
        "metadata": pre.metadata(),
    });
    let out = std::process::Command::new(python)
        .arg("-c")
        .arg(SCRIPT)
        .arg(args.to_string())
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            JobError::invalid(format!(
                "cannot run {} for the ONNX export ({e}); pass --python PATH (a Python with \
                 torch, onnx and onnxruntime) or use --format torchscript",
                python.display()
            ))
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| l.starts_with('{'));
    let reply: Option<serde_json::Value> = last.and_then(|l| serde_json::from_str(l).ok());
    if let Some(m) = reply.as_ref().and_then(|r| r.get("missing")) {
        let m = m.as_str().unwrap_or("?");
        return Err(JobError::invalid(format!(
            "the ONNX export needs the Python module '{m}' in {}: pip install onnx onnxruntime \
             (torch=={}.* is tchrun's own), pass --python PATH, or use --format torchscript",
            python.display(),
            tchrun_launcher::install::TORCH_SERIES
        )));
    }
    let runs = match (
        out.status.success(),
        reply.as_ref().and_then(|r| r.get("runs")),
    ) {
        (true, Some(runs)) => serde_json::from_value(runs.clone())
            .map_err(|e| failed(format!("the ONNX step's answer: {e}")))?,
        _ => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let tail: Vec<&str> = stderr.lines().rev().take(12).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            return Err(failed(format!(
                "writing the ONNX graph failed ({} exit {:?}):\n{}",
                python.display(),
                out.status.code(),
                tail.join("\n")
            )));
        }
    };
    let check = Check {
        target: Target::Onnx,
        images: ts.images.clone(),
        count: ts.count,
        tolerance: ts.tolerance,
        runs,
    };
    check.verdict().map_err(failed)?;
    Ok(check)
}
