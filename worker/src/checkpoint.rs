//! Checkpoints in `<output>/checkpoints/`: `last` (model, optimizer momentum, epoch, step
//! within the epoch, LR schedule position, early-stopping state, metrics so far) and `best`
//! (the weights of the best epoch). Written by rank 0 atomically (temp file, fsync, rename);
//! the JSON is renamed last, so it only ever names complete tensor files. Safetensors only.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::Tensor;
use tchrun::metrics::EpochMetrics;

pub const DIR: &str = tchrun::files::CHECKPOINT_DIR;
pub const FORMAT_VERSION: u32 = 1;

/// What `last.json` records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Meta {
    pub format_version: u32,
    /// Epochs fully done (0-based index of the epoch to run next when `batches_done == 0`).
    pub epoch: u32,
    /// Batches of `epoch` already done (mid-epoch stop), with the world size they used.
    pub batches_done: u64,
    /// Optimizer steps taken in all.
    pub step: u64,
    pub world_size: usize,
    pub seed: i64,
    pub best_loss: Option<f64>,
    pub best_epoch: Option<u32>,
    pub since_best: u32,
    pub history: Vec<EpochMetrics>,
    /// Partial sums of the interrupted epoch: (loss sum, samples, seconds).
    pub partial: (f64, f64, f64),
    pub loss_scale: f64,
    /// The run ended (early stop or last epoch) and wrote its model.
    pub finished: bool,
    /// `--global-batch-size` of the run (its steps do not depend on the world size).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub global_batch_size: Option<u32>,
}

pub fn dir(output: &Path) -> PathBuf {
    output.join(DIR)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), String> {
    tchrun::files::write_atomic(path, bytes).map_err(|e| e.to_string())
}

fn write_tensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<(), String> {
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.detach().to_device(tch::Device::Cpu).contiguous(),
            )
        })
        .collect();
    tchrun::files::write_atomic_with(
        path,
        |tmp| Tensor::write_safetensors(&cpu, tmp).map_err(|e| format!("{}: {e}", tmp.display())),
        |e| e.to_string(),
    )
}

/// The best weights' file of checkpoints written before it was tied to a step.
const LEGACY_BEST: &str = "best.safetensors";

/// A tensors file name from `last.json`: a plain file name in the checkpoint directory.
fn valid_name(name: &str) -> bool {
    !name.is_empty() && !name.contains('/') && !name.contains("..")
}

/// The best weights' file the checkpoint in `d` names (an older checkpoint: `best.safetensors`
/// when it is there).
fn named_best(d: &Path) -> Option<String> {
    let text = std::fs::read_to_string(d.join(tchrun::files::CHECKPOINT_LAST)).ok();
    let json: Option<serde_json::Value> = text.and_then(|t| serde_json::from_str(&t).ok());
    match json.as_ref().map(|j| &j["best_tensors"]) {
        Some(serde_json::Value::String(f)) if valid_name(f) => Some(f.clone()),
        _ => d
            .join(LEGACY_BEST)
            .is_file()
            .then(|| LEGACY_BEST.to_string()),
    }
}

/// Saves the last state; `best` (when given) replaces the best weights first.
pub fn save(
    output: &Path,
    meta: &Meta,
    model: &[(String, Tensor)],
    momentum: &BTreeMap<String, Tensor>,
    best: Option<&BTreeMap<String, Tensor>>,
) -> Result<(), String> {
    save_with_pause(output, meta, model, momentum, best, None)
}

/// [`save`], pausing `pause` (the test hook `TCHRUN_TEST_CHECKPOINT_DELAY_S`) in the middle of
/// the write: the new tensors are on disk, `last.json` still names the previous checkpoint.
fn save_with_pause(
    output: &Path,
    meta: &Meta,
    model: &[(String, Tensor)],
    momentum: &BTreeMap<String, Tensor>,
    best: Option<&BTreeMap<String, Tensor>>,
    pause: Option<std::time::Duration>,
) -> Result<(), String> {
    let d = dir(output);
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    // The best weights, also under a name tied to the step: a kill before `last.json` switches
    // leaves the previous checkpoint's best weights named and intact. A save without new best
    // weights keeps naming the previous ones.
    let best_file = match best {
        Some(b) => {
            let v: Vec<(String, Tensor)> = b
                .iter()
                .map(|(n, t)| (n.clone(), t.shallow_clone()))
                .collect();
            let f = format!("best-{}.safetensors", meta.step);
            write_tensors(&d.join(&f), &v)?;
            Some(f)
        }
        // This run has best weights (its state names a best epoch): the previous save's.
        None if meta.best_epoch.is_some() => named_best(&d),
        None => None,
    };
    let mut all: Vec<(String, Tensor)> = model
        .iter()
        .map(|(n, t)| (format!("model.{n}"), t.shallow_clone()))
        .collect();
    all.extend(
        momentum
            .iter()
            .map(|(n, t)| (format!("momentum.{n}"), t.shallow_clone())),
    );
    // Tensors under a name tied to the step, so the JSON switches atomically to a complete file.
    let file = format!("last-{}.safetensors", meta.step);
    write_tensors(&d.join(&file), &all)?;
    if let Some(p) = pause {
        tracing::info!(
            "checkpoint of step {}: {file} written, pausing {:.1} s before last.json names it ({})",
            meta.step,
            p.as_secs_f64(),
            tchrun::env::TCHRUN_TEST_CHECKPOINT_DELAY_S
        );
        std::thread::sleep(p);
    }
    let mut json = serde_json::to_value(meta).map_err(|e| e.to_string())?;
    json["tensors"] = serde_json::Value::String(file.clone());
    if let Some(b) = &best_file {
        json["best_tensors"] = serde_json::Value::String(b.clone());
    }
    write_atomic(
        &d.join(tchrun::files::CHECKPOINT_LAST),
        serde_json::to_string_pretty(&json)
            .map_err(|e| e.to_string())?
            .as_bytes(),
    )?;
    if let Ok(f) = std::fs::File::open(&d) {
        let _ = f.sync_all();
    }
    // Older tensor files are no longer named by last.json.
    if let Ok(rd) = std::fs::read_dir(&d) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            let stale_last = n.starts_with("last-") && n != file;
            let stale_best =
                (n.starts_with("best-") || n == LEGACY_BEST) && Some(&n) != best_file.as_ref();
            if n.ends_with(".safetensors") && (stale_last || stale_best) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    Ok(())
}

/// Rank 0's checkpoint writer: `save` copies the state to host memory (so training goes on
/// changing its own tensors) and writes it on a background thread, atomically as `save` does,
/// so that no rank waits on rank 0's storage. A save while the previous write still runs waits
/// for it first (one copy of the state in flight at most) and logs that.
#[derive(Default)]
pub struct Writer {
    pending: Option<(u64, std::thread::JoinHandle<Result<(), String>>)>,
    /// Test hook (`TCHRUN_TEST_CHECKPOINT_DELAY_S`): every write pauses this long after its
    /// tensors, before `last.json` switches to them.
    delay: Option<std::time::Duration>,
}

/// Deep copies on the CPU (the originals keep training).
fn host_copy<'a>(tensors: impl Iterator<Item = (&'a String, &'a Tensor)>) -> Vec<(String, Tensor)> {
    tensors
        .map(|(n, t)| (n.clone(), t.detach().to_device(tch::Device::Cpu).copy()))
        .collect()
}

impl Writer {
    pub fn new(delay: Option<std::time::Duration>) -> Writer {
        Writer {
            pending: None,
            delay,
        }
    }

    /// Starts writing this state (after the previous write, if one still runs).
    pub fn save(
        &mut self,
        output: &Path,
        meta: &Meta,
        model: &[(String, Tensor)],
        momentum: &BTreeMap<String, Tensor>,
        best: Option<&BTreeMap<String, Tensor>>,
    ) -> Result<(), String> {
        if let Some((step, h)) = &self.pending {
            if !h.is_finished() {
                tracing::info!(
                    "checkpoint of step {} is still being written; waiting for it before the one of step {}",
                    step,
                    meta.step
                );
            }
        }
        self.wait()?;
        let model = host_copy(model.iter().map(|(n, t)| (n, t)));
        let momentum: BTreeMap<String, Tensor> = host_copy(momentum.iter()).into_iter().collect();
        let best: Option<BTreeMap<String, Tensor>> =
            best.map(|b| host_copy(b.iter()).into_iter().collect());
        let (output, meta, delay) = (output.to_path_buf(), meta.clone(), self.delay);
        let step = meta.step;
        let handle = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                let t0 = std::time::Instant::now();
                let r = save_with_pause(&output, &meta, &model, &momentum, best.as_ref(), delay);
                if r.is_ok() {
                    tracing::info!(
                        step = meta.step,
                        secs = t0.elapsed().as_secs_f64(),
                        "checkpoint written (background)"
                    );
                }
                r
            })
            .map_err(|e| format!("cannot start the checkpoint writer: {e}"))?;
        self.pending = Some((step, handle));
        Ok(())
    }

    /// Waits for the write in flight, if any, and returns its result.
    pub fn wait(&mut self) -> Result<(), String> {
        match self.pending.take() {
            None => Ok(()),
            Some((step, h)) => h
                .join()
                .map_err(|_| format!("the checkpoint writer of step {step} panicked"))?,
        }
    }
}

/// A loaded checkpoint.
pub struct Loaded {
    pub meta: Meta,
    pub model: BTreeMap<String, Tensor>,
    pub momentum: BTreeMap<String, Tensor>,
    pub best: Option<BTreeMap<String, Tensor>>,
}

/// Reads `last.json` and its tensors; `Ok(None)` when there is no checkpoint.
pub fn load(output: &Path) -> Result<Option<Loaded>, String> {
    let d = dir(output);
    let json_path = d.join(tchrun::files::CHECKPOINT_LAST);
    let text = match std::fs::read_to_string(&json_path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(format!("{}: {e}", json_path.display())),
    };
    let json: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", json_path.display()))?;
    let meta: Meta = serde_json::from_value(json.clone())
        .map_err(|e| format!("{}: {e}", json_path.display()))?;
    if meta.format_version != FORMAT_VERSION {
        return Err(format!(
            "{}: checkpoint format {} is not supported",
            json_path.display(),
            meta.format_version
        ));
    }
    let file = json["tensors"]
        .as_str()
        .ok_or_else(|| format!("{}: no tensors file named", json_path.display()))?;
    if !valid_name(file) {
        return Err(format!(
            "{}: invalid tensors file name {file:?}",
            json_path.display()
        ));
    }
    let tensors = Tensor::read_safetensors(d.join(file))
        .map_err(|e| format!("{}: {e}", d.join(file).display()))?;
    let (mut model, mut momentum) = (BTreeMap::new(), BTreeMap::new());
    for (n, t) in tensors {
        if let Some(k) = n.strip_prefix("model.") {
            model.insert(k.to_string(), t);
        } else if let Some(k) = n.strip_prefix("momentum.") {
            momentum.insert(k.to_string(), t);
        }
    }
    let best_path = named_best(&d).map(|f| d.join(f));
    let best = if let Some(best_path) = best_path {
        Some(
            Tensor::read_safetensors(&best_path)
                .map_err(|e| format!("{}: {e}", best_path.display()))?
                .into_iter()
                .collect(),
        )
    } else {
        None
    };
    Ok(Some(Loaded {
        meta,
        model,
        momentum,
        best,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(step: u64, best_epoch: Option<u32>) -> Meta {
        Meta {
            format_version: FORMAT_VERSION,
            epoch: 1,
            batches_done: 0,
            step,
            world_size: 1,
            seed: 1,
            best_loss: best_epoch.map(|_| 0.5),
            best_epoch,
            since_best: 0,
            history: Vec::new(),
            partial: (0.0, 0.0, 0.0),
            loss_scale: 1.0,
            finished: false,
            global_batch_size: None,
        }
    }

    /// The best weights are tied to the step that wrote them and named by `last.json`, so a
    /// later save without new best weights keeps them, and a kill before the JSON switches
    /// leaves the previous pair intact.
    #[test]
    fn the_best_weights_are_named_by_last_json() {
        let t = std::env::temp_dir().join(format!("tchrun-ckpt-best-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&t);
        let out = t.as_path();
        let model = vec![("w".to_string(), Tensor::from_slice(&[1.0f32, 2.0]))];
        let best: BTreeMap<String, Tensor> =
            [("w".to_string(), Tensor::from_slice(&[3.0f32, 4.0]))].into();
        let none = BTreeMap::new();
        save(out, &meta(10, Some(1)), &model, &none, Some(&best)).unwrap();
        save(out, &meta(12, Some(1)), &model, &none, None).unwrap();
        let d = dir(out);
        assert!(d.join("best-10.safetensors").is_file());
        let l = load(out).unwrap().unwrap();
        assert_eq!(l.meta.step, 12);
        let w = l.best.expect("best weights")["w"].shallow_clone();
        assert_eq!(Vec::<f32>::try_from(&w).unwrap(), vec![3.0, 4.0]);
        // New best weights replace the old file once the JSON names them.
        save(out, &meta(20, Some(2)), &model, &none, Some(&best)).unwrap();
        assert!(d.join("best-20.safetensors").is_file() && !d.join("best-10.safetensors").exists());
        assert!(!d.join("last-12.safetensors").exists());
        // A run without a best epoch names none.
        save(out, &meta(22, None), &model, &none, None).unwrap();
        assert!(load(out).unwrap().unwrap().best.is_none());
        let _ = std::fs::remove_dir_all(&t);
    }
}
