//! Checkpoints in `<output>/checkpoints/`: `last` (model, optimizer state, epoch, step
//! within the epoch, LR schedule position, early-stopping state, metrics so far) and `best`
//! (the weights of the best epoch). Written by rank 0 atomically (temp file, fsync, rename);
//! the JSON is renamed last, so it only ever names complete tensor files. Safetensors only.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::Tensor;

/// What `last.json` records: the contract type of the root crate (the launcher reads it too).
pub use tchrun::checkpoint::Last as Meta;
pub use tchrun::checkpoint::{RunRecord, FORMAT_VERSION, LEGACY_BEST};

pub const DIR: &str = tchrun::files::CHECKPOINT_DIR;

pub fn dir(output: &Path) -> PathBuf {
    tchrun::checkpoint::dir(output)
}

fn write_atomic(path: &Path, bytes: &[u8], step: u64) -> Result<(), String> {
    tchrun::files::write_atomic(path, bytes)
        .map_err(|e| write_error(path, &e.to_string(), bytes.len() as u64, step))
}

/// A failed checkpoint write in words (a full disk says so, with the space needed and left).
fn write_error(path: &Path, error: &str, needed: u64, step: u64) -> String {
    tchrun::files::describe_write_error(
        &format!("the checkpoint of step {step}"),
        path,
        error,
        needed,
    )
}

/// Bytes of `tensors`' data (what a safetensors file of them needs, less its header).
pub fn data_bytes<'a>(tensors: impl Iterator<Item = &'a Tensor>) -> u64 {
    tensors
        .map(|t| t.numel() as u64 * t.kind().elt_size_in_bytes() as u64)
        .sum()
}

fn write_tensors(path: &Path, tensors: &[(String, Tensor)], step: u64) -> Result<(), String> {
    let cpu: Vec<(String, Tensor)> = tensors
        .iter()
        .map(|(n, t)| {
            (
                n.clone(),
                t.detach().to_device(tch::Device::Cpu).contiguous(),
            )
        })
        .collect();
    let needed = data_bytes(cpu.iter().map(|(_, t)| t));
    tchrun::files::write_atomic_with(
        path,
        |tmp| {
            Tensor::write_safetensors(&cpu, tmp)
                .map_err(|e| write_error(path, &format!("{e:?}"), needed, step))
        },
        |e| write_error(path, &e.to_string(), needed, step),
    )
}

/// The best weights' file the checkpoint in `d`'s output names (an older checkpoint:
/// `best.safetensors` when it is there).
fn named_best(output: &Path) -> Option<String> {
    let last = tchrun::checkpoint::read(output).ok().flatten()?;
    tchrun::checkpoint::best_file(output, &last)
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
}

/// Temporary files a killed writer left in the checkpoint directory (`.NAME.<pid>.tmp`):
/// never named by `last.json`, removed before the next write.
fn remove_stale_temporaries(d: &Path) {
    if let Ok(rd) = std::fs::read_dir(d) {
        for e in rd.flatten() {
            let n = e.file_name().to_string_lossy().to_string();
            if n.starts_with('.') && n.ends_with(".tmp") {
                tracing::info!(
                    "removing {} (left by an interrupted checkpoint write)",
                    e.path().display()
                );
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
}

/// Saves the last state; `best` (when given) replaces the best weights first.
pub fn save(
    output: &Path,
    meta: &Meta,
    model: &[(String, Tensor)],
    optimizer: &BTreeMap<String, Tensor>,
    best: Option<&BTreeMap<String, Tensor>>,
) -> Result<(), String> {
    save_with_pause(output, meta, model, optimizer, best, None)
}

/// [`save`], pausing `pause` (the test hook `TCHRUN_TEST_CHECKPOINT_DELAY_S`) in the middle of
/// the write: the new tensors are on disk, `last.json` still names the previous checkpoint.
fn save_with_pause(
    output: &Path,
    meta: &Meta,
    model: &[(String, Tensor)],
    optimizer: &BTreeMap<String, Tensor>,
    best: Option<&BTreeMap<String, Tensor>>,
    pause: Option<std::time::Duration>,
) -> Result<(), String> {
    let d = dir(output);
    std::fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
    remove_stale_temporaries(&d);
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
            write_tensors(&d.join(&f), &v, meta.step)?;
            Some(f)
        }
        // This run has best weights (its state names a best epoch): the previous save's.
        None if meta.best_epoch.is_some() => named_best(output),
        None => None,
    };
    let mut all: Vec<(String, Tensor)> = model
        .iter()
        .map(|(n, t)| (format!("model.{n}"), t.shallow_clone()))
        .collect();
    // The optimizer's state under its own names (`momentum.<parameter>` for SGD, as before
    // `--opt`; `exp_avg.<parameter>`, `step.<parameter>`, ... for the others).
    all.extend(
        optimizer
            .iter()
            .map(|(n, t)| (n.clone(), t.shallow_clone())),
    );
    // Tensors under a name tied to the step, so the JSON switches atomically to a complete file.
    let file = format!("last-{}.safetensors", meta.step);
    write_tensors(&d.join(&file), &all, meta.step)?;
    if let Some(p) = pause {
        tracing::info!(
            "checkpoint of step {}: {file} written, pausing {:.1} s before last.json names it ({})",
            meta.step,
            p.as_secs_f64(),
            tchrun::env::TCHRUN_TEST_CHECKPOINT_DELAY_S
        );
        std::thread::sleep(p);
    }
    let mut meta = meta.clone();
    meta.tensors = file.clone();
    meta.best_tensors = best_file.clone();
    meta.written = Some(tchrun::files::timestamp_now());
    let json = serde_json::to_string_pretty(&meta).map_err(|e| e.to_string())?;
    write_atomic(
        &d.join(tchrun::files::CHECKPOINT_LAST),
        json.as_bytes(),
        meta.step,
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
        optimizer: &BTreeMap<String, Tensor>,
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
        let optimizer: BTreeMap<String, Tensor> = host_copy(optimizer.iter()).into_iter().collect();
        let best: Option<BTreeMap<String, Tensor>> =
            best.map(|b| host_copy(b.iter()).into_iter().collect());
        let (output, meta, delay) = (output.to_path_buf(), meta.clone(), self.delay);
        let step = meta.step;
        let handle = std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                let t0 = std::time::Instant::now();
                let r = save_with_pause(&output, &meta, &model, &optimizer, best.as_ref(), delay);
                match &r {
                    Ok(()) => tracing::info!(
                        step = meta.step,
                        secs = t0.elapsed().as_secs_f64(),
                        "checkpoint written (background)"
                    ),
                    // Said when it happens; the training loop ends the job at its next step.
                    Err(e) => tracing::error!("checkpoint of step {} failed: {e}", meta.step),
                }
                r
            })
            .map_err(|e| format!("cannot start the checkpoint writer: {e}"))?;
        self.pending = Some((step, handle));
        Ok(())
    }

    /// The result of a write that has ended since the last call (`Ok` while one still runs or
    /// none was started): the training loop asks after every step, so a failed write ends the
    /// job when it happens, not when the next checkpoint is due.
    pub fn poll(&mut self) -> Result<(), String> {
        match &self.pending {
            Some((_, h)) if h.is_finished() => self.wait(),
            _ => Ok(()),
        }
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

/// A rank that ends (an error, a stop) lets the write in flight finish: the checkpoint it
/// writes is complete, or the previous one stays named.
impl Drop for Writer {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            tracing::warn!("{e}");
        }
    }
}

/// A loaded checkpoint.
pub struct Loaded {
    pub meta: Meta,
    pub model: BTreeMap<String, Tensor>,
    /// The optimizer's state by its names (`Optimizer::state`).
    pub optimizer: BTreeMap<String, Tensor>,
    /// `--model-ema`'s average and count (`ema.<name>`, `ema.n_averaged`); empty without it.
    pub ema: BTreeMap<String, Tensor>,
    pub best: Option<BTreeMap<String, Tensor>>,
}

/// Reads `last.json` and its tensors; `Ok(None)` when there is no checkpoint.
pub fn load(output: &Path) -> Result<Option<Loaded>, String> {
    let Some(meta) = tchrun::checkpoint::read(output).map_err(|e| e.to_string())? else {
        return Ok(None);
    };
    let d = dir(output);
    let read = |p: &Path| -> Result<Vec<(String, Tensor)>, String> {
        tchrun::checkpoint::verify_tensors(p).map_err(|e| e.to_string())?;
        Tensor::read_safetensors(p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let (mut model, mut optimizer, mut ema) = (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for (n, t) in read(&d.join(&meta.tensors))? {
        if let Some(k) = n.strip_prefix("model.") {
            model.insert(k.to_string(), t);
        } else if n.starts_with("ema.") {
            ema.insert(n, t);
        } else {
            optimizer.insert(n, t);
        }
    }
    let best = match tchrun::checkpoint::best_file(output, &meta) {
        Some(p) => Some(read(&p)?.into_iter().collect()),
        None => None,
    };
    Ok(Some(Loaded {
        meta,
        model,
        optimizer,
        ema,
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
            loss_scaler: None,
            finished: false,
            global_batch_size: None,
            tensors: String::new(),
            best_tensors: None,
            run: None,
            written: None,
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
