//! `tchrun export`: a trained model directory as ONNX and/or TorchScript in a Triton model
//! repository. The inputs are checked here (no libtorch); `tchrun-worker export` traces and
//! checks the TorchScript module, the environment's Python writes and checks the ONNX graph
//! (`onnx`); everything is made in a staging folder inside `--output` and each model folder
//! renamed into place only once every check passed: nothing half-written.
mod failed;
mod onnx;
mod triton;

use crate::error::JobError;
use crate::plan::preflight::{absolute, check_disjoint};
use failed::failed;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tchrun::export::{self as contract, Check, ExportJob, Preprocess, Report, Target};
use tchrun::overlap::Named;

/// The staging folder, removed on drop (a failed or interrupted export leaves nothing).
struct Staging(PathBuf);

impl Drop for Staging {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io(what: &Path) -> impl Fn(std::io::Error) -> JobError + '_ {
    move |e| failed(format!("{}: {e}", what.display()))
}

/// The model folders this export writes, by target: `NAME`, or `NAME_onnx` and
/// `NAME_torchscript` for both.
fn folders(name: &str, targets: &[Target]) -> Vec<(Target, String)> {
    match targets {
        [one] => vec![(*one, name.to_string())],
        _ => targets
            .iter()
            .map(|t| (*t, format!("{name}_{}", t.name())))
            .collect(),
    }
}

/// The checks before anything is written: the model, the name, the output and the images.
fn preflight(a: &ExportJob) -> Result<(tchrun::model::ModelConfig, String), JobError> {
    let name = match &a.name {
        Some(n) => n.clone(),
        None => contract::default_name(&a.model),
    };
    contract::check_name(&name).map_err(JobError::invalid)?;
    check_disjoint(
        &[Named::new("--output", "the model repository", &a.output)],
        vec![Named::new(
            "--model",
            "the trained model directory",
            &a.model,
        )],
        None,
    )?;
    let cfg = tchrun::model::load(&a.model, true)?;
    if let Some(d) = &a.check_images {
        if !d.is_dir() {
            return Err(JobError::invalid(format!(
                "--check-images {}: not a directory; pass a folder of images (e.g. the \
                 validation folder) or leave it out for a synthetic check",
                d.display()
            )));
        }
    }
    if a.output.exists() && !a.output.is_dir() {
        return Err(JobError::invalid(format!(
            "--output {}: is a file; export writes a Triton model repository (a directory)",
            a.output.display()
        )));
    }
    for (_, f) in folders(&name, &a.format.targets()) {
        let dest = a.output.join(&f);
        if dest.exists() {
            return Err(JobError::invalid(format!(
                "--output {}: the model {f} is already there ({}); remove it or pass another \
                 --name",
                a.output.display(),
                dest.display()
            )));
        }
    }
    Ok((cfg, name))
}

/// `tchrun-worker export` into `staging`: exit 2 is the user's input, anything else a failed
/// export (exit 4) with the worker's words.
fn trace(a: &ExportJob, staging: &Path) -> Result<Check, JobError> {
    let worker = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(|d| d.join("tchrun-worker")))
        .filter(|w| w.is_file())
        .ok_or_else(|| JobError::invalid("tchrun-worker not found beside tchrun"))?;
    let args = contract::TraceArgs {
        model: a.model.clone(),
        staging: staging.to_path_buf(),
        batch: a.batch,
        fp16: a.fp16,
        with_preprocess: a.with_preprocess,
        check_images: a.check_images.clone(),
    };
    let argv = args.to_args()?;
    let out = std::process::Command::new(&worker)
        .arg("export")
        .args(argv)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| JobError::invalid(format!("{}: {e}", worker.display())))?;
    let said = |b: &[u8]| String::from_utf8_lossy(b).trim().to_string();
    let (stdout, stderr) = (said(&out.stdout), said(&out.stderr));
    let err = stderr
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("tchrun-worker: error: "))
        .map(str::to_string)
        .unwrap_or_else(|| format!("{stderr}\n{stdout}").trim().to_string());
    match out.status.code() {
        Some(0) => {
            outln!("tchrun: {stdout}");
            let path = staging.join(contract::CHECK_JSON);
            let text = std::fs::read_to_string(&path).map_err(io(&path))?;
            serde_json::from_str(&text).map_err(|e| failed(format!("{}: {e}", path.display())))
        }
        Some(2) => Err(JobError::invalid(err)),
        code => Err(failed(format!(
            "tracing the model failed (tchrun-worker exit {}): {err}",
            code.map(|c| c.to_string())
                .unwrap_or_else(|| "by a signal".into())
        ))),
    }
}

/// One model folder in `staging`: `1/<model file>`, config.pbtxt, labels, preprocess.json
/// and export.json.
fn assemble(
    a: &ExportJob,
    staging: &Path,
    (target, folder): (Target, &str),
    pre: &Preprocess,
    check: Check,
    started: Instant,
) -> Result<PathBuf, JobError> {
    let dir = staging.join(folder);
    let version = dir.join("1");
    std::fs::create_dir_all(&version).map_err(io(&version))?;
    let model = version.join(target.file());
    std::fs::rename(staging.join(target.file()), &model).map_err(io(&model))?;
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        tchrun::files::write_atomic(&p, text.as_bytes())
            .map_err(|e| failed(format!("{}: {e}", p.display())))
    };
    let config = triton::config_pbtxt(folder, target, pre, a.batch, a.with_preprocess);
    write(contract::CONFIG_PBTXT, &config)?;
    write(contract::LABELS_TXT, &triton::labels(pre))?;
    let json = |v: &dyn erased::Json| v.pretty();
    write(contract::PREPROCESS_JSON, &json(pre))?;
    let bytes = std::fs::metadata(&model).map_err(io(&model))?.len();
    let report = Report {
        name: folder.to_string(),
        target,
        model: a.model.display().to_string(),
        arch: pre.arch.clone(),
        file: format!("1/{}", target.file()),
        bytes,
        batch: a.batch.to_string(),
        opset: (target == Target::Onnx).then_some(a.opset),
        fp16: a.fp16,
        with_preprocess: a.with_preprocess,
        check,
        seconds: started.elapsed().as_secs_f64(),
        tchrun_version: env!("CARGO_PKG_VERSION").to_string(),
    };
    write(contract::REPORT_JSON, &json(&report))?;
    Ok(dir)
}

/// serde_json's pretty text of the two records (never fails for them).
mod erased {
    pub trait Json {
        fn pretty(&self) -> String;
    }
    impl<T: serde::Serialize> Json for T {
        fn pretty(&self) -> String {
            serde_json::to_string_pretty(self).unwrap_or_default() + "\n"
        }
    }
}

/// `tchrun export`.
pub fn run(job: &ExportJob) -> Result<i32, JobError> {
    let started = Instant::now();
    let mut a = job.clone();
    a.model = absolute(a.model);
    a.output = absolute(a.output);
    a.check_images = a.check_images.map(absolute);
    let (cfg, name) = preflight(&a)?;
    let targets = a.format.targets();
    let python = if targets.contains(&Target::Onnx) {
        Some(onnx::python(a.python.as_deref())?)
    } else {
        None
    };
    std::fs::create_dir_all(&a.output).map_err(|e| {
        JobError::invalid(format!(
            "--output {}: cannot create it: {e}",
            a.output.display()
        ))
    })?;
    let staging = Staging(
        a.output
            .join(format!(".tchrun-export-{name}-{}", std::process::id())),
    );
    std::fs::create_dir(&staging.0).map_err(|e| {
        JobError::invalid(format!(
            "--output {}: not writable: {e}",
            a.output.display()
        ))
    })?;
    let pre = Preprocess::of(&cfg, a.with_preprocess);
    let ts_check = trace(&a, &staging.0)?;
    let onnx_check = match &python {
        Some(py) => Some(onnx::export(py, &a, &staging.0, &pre, &ts_check)?),
        None => None,
    };
    let mut done = Vec::new();
    for (target, folder) in folders(&name, &targets) {
        let check = match target {
            Target::Onnx => onnx_check
                .clone()
                .ok_or_else(|| failed("no ONNX check".into()))?,
            Target::Torchscript => ts_check.clone(),
        };
        let dir = assemble(&a, &staging.0, (target, &folder), &pre, check, started)?;
        done.push((target, folder, dir));
    }
    for (target, folder, dir) in &done {
        let dest = a.output.join(folder);
        std::fs::rename(dir, &dest).map_err(io(&dest))?;
        let check = match target {
            Target::Onnx => onnx_check.as_ref(),
            Target::Torchscript => Some(&ts_check),
        };
        let worst = check
            .and_then(|c| c.worst())
            .map(|w| w.max_abs_diff)
            .unwrap_or(0.0);
        outln!(
            "tchrun: exported {} as {} into {} (checked on {} image(s) of {}: largest \
             probability difference {worst:.2e})",
            a.model.display(),
            target.name(),
            dest.display(),
            check.map(|c| c.count).unwrap_or(0),
            check.map(|c| c.images.as_str()).unwrap_or("-")
        );
    }
    outln!(
        "tchrun: serve with `tritonserver --model-repository {}` ({:.1} s)",
        a.output.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(0)
}
