//! Rank 0's outputs in `--output`: `metrics.jsonl` (appended each epoch), the metrics plot,
//! and the trained model (`model.safetensors` + `model.json`) written atomically: files are
//! staged in a hidden directory, fsynced, renamed into place, `model.json` last — a crash
//! leaves either the previous state or a complete model, never a half-written one.
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use tch::Tensor;
use tchrun::files::{METRICS_JSONL, METRICS_PLOT, MODEL_JSON, MODEL_WEIGHTS};
use tchrun::metrics::EpochMetrics;
use tchrun::model::{self, ModelConfig};

fn sync_dir(dir: &Path) {
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
}

/// Appends one epoch to `<output>/metrics.jsonl`.
pub fn append_metrics(output: &Path, m: &EpochMetrics) -> Result<(), String> {
    std::fs::create_dir_all(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let path = output.join(METRICS_JSONL);
    let line = serde_json::to_string(m).map_err(|e| e.to_string())?;
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o640)
        .open(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    writeln!(f, "{line}")
        .and_then(|_| f.sync_data())
        .map_err(|e| {
            tchrun::files::describe_write_error(
                "metrics.jsonl's row",
                &path,
                &e.to_string(),
                line.len() as u64 + 1,
            )
        })
}

/// Rewrites `<output>/metrics.jsonl` from a checkpoint's history (atomically), so a resumed
/// run neither repeats nor loses an epoch.
pub fn rewrite_metrics(output: &Path, history: &[EpochMetrics]) -> Result<(), String> {
    std::fs::create_dir_all(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let mut text = String::new();
    for m in history {
        text.push_str(&serde_json::to_string(m).map_err(|e| e.to_string())?);
        text.push('\n');
    }
    tchrun::files::write_atomic(&output.join(METRICS_JSONL), text.as_bytes())
        .map_err(|e| e.to_string())
}

/// Removes what an earlier run left in `--output` before a new run writes there (a fresh
/// start, `--overwrite`): `model.json` first (so a crash in between never leaves a model
/// directory that looks whole), then the weights, metrics, plot and checkpoints. The logs and
/// TensorBoard events are the launcher's and `Board`'s to replace.
pub fn clear_previous_run(output: &Path) -> Result<(), String> {
    for name in [MODEL_JSON, MODEL_WEIGHTS, METRICS_JSONL, METRICS_PLOT] {
        let p = output.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => tracing::info!("removed {} (an earlier run's)", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    // `--model-ema`'s model directory: its model.json first, then the rest.
    let ema = output.join(tchrun::files::EMA_DIR);
    for name in [MODEL_JSON, MODEL_WEIGHTS, METRICS_PLOT] {
        let p = ema.join(name);
        match std::fs::remove_file(&p) {
            Ok(()) => tracing::info!("removed {} (an earlier run's)", p.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(format!("{}: {e}", p.display())),
        }
    }
    let _ = std::fs::remove_dir(&ema);
    let d = tchrun::checkpoint::dir(output);
    match std::fs::remove_dir_all(&d) {
        Ok(()) => tracing::info!("removed {} (an earlier run's)", d.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", d.display())),
    }
    Ok(())
}

/// Writes the trained model directory atomically (see module docs).
pub fn write_model_dir(
    output: &Path,
    cfg: &ModelConfig,
    state: &[(String, Tensor)],
    history: &[EpochMetrics],
    steps: &crate::plot::StepSeries,
) -> Result<(), String> {
    std::fs::create_dir_all(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let staging = output.join(format!(".staging-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| format!("{}: {e}", staging.display()))?;
    let result = (|| -> Result<(), String> {
        let weights = staging.join(MODEL_WEIGHTS);
        Tensor::write_safetensors(state, &weights).map_err(|e| {
            let needed = crate::train::checkpoint::data_bytes(state.iter().map(|(_, t)| t));
            tchrun::files::describe_write_error("the model", &weights, &format!("{e:?}"), needed)
        })?;
        tchrun::files::narrow_mode(&weights)
            .and_then(|()| File::open(&weights))
            .and_then(|f| f.sync_all())
            .map_err(|e| format!("{}: {e}", weights.display()))?;
        let plot = staging.join(METRICS_PLOT);
        match crate::plot::metrics_png(history, steps, &plot) {
            Ok(()) => {
                let _ = tchrun::files::narrow_mode(&plot);
            }
            Err(e) => tracing::warn!("metrics plot not written: {e}"),
        }
        let json = staging.join(MODEL_JSON);
        let mut f = OpenOptions::new()
            .create(true)
            .write(true)
            .truncate(true)
            .mode(0o640)
            .open(&json)
            .map_err(|e| format!("{}: {e}", json.display()))?;
        f.write_all(model::to_json(cfg).as_bytes())
            .and_then(|_| f.sync_all())
            .map_err(|e| format!("{}: {e}", json.display()))?;
        sync_dir(&staging);
        for name in [MODEL_WEIGHTS, METRICS_PLOT, MODEL_JSON] {
            let from = staging.join(name);
            if from.exists() {
                std::fs::rename(&from, output.join(name))
                    .map_err(|e| format!("{}: {e}", output.join(name).display()))?;
            }
        }
        sync_dir(output);
        Ok(())
    })();
    let _ = std::fs::remove_dir_all(&staging);
    result
}
