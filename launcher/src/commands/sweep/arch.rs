//! `--param arch=resnet18,efficientnet_b0` (or `--arch A` on a `--param-file` line): each such
//! run starts from a from-scratch model of that architecture, as `tchrun model init --arch A`
//! makes it, at the input size and normalization of the runs' own `--model` (the one every
//! run gets): written once into `DIR/models/<arch>/` and given to the run as its `--model`.
//! The point keeps `--arch=A` (its name, `sweep.json`); only the run's command line has the
//! model. Checked before anything starts: a name that is not an architecture, an architecture
//! too big for the input size, a run that also chooses its `--model`.
use super::grid::{flag_pairs, Point};
use crate::error::JobError;
use std::path::{Path, PathBuf};
use tchrun::flags::TrainJob;
use tchrun::model::{self, Arch, ModelConfig};

/// The parameter's name (`--param arch=...`).
pub const NAME: &str = "arch";

/// Where the sweep in `dir` keeps the from-scratch model of `arch`.
pub fn model_dir(dir: &Path, arch: &str) -> PathBuf {
    dir.join("models").join(arch)
}

/// The point's architecture, if it names one (`--arch=A` or `--arch A`).
pub fn of(flags: &[String]) -> Option<String> {
    flag_pairs(flags)
        .into_iter()
        .rev()
        .find(|(n, _)| n == NAME)
        .map(|(_, v)| v.unwrap_or_default())
}

/// A run's flags with its `--arch A` replaced by `--model=DIR/models/A` (`dir`: the sweep's).
pub fn translate(flags: &[String], dir: &Path) -> Result<Vec<String>, JobError> {
    let model = |v: &str| tchrun::argv::flag::<TrainJob, _>("model", &model_dir(dir, v));
    let mut out = Vec::with_capacity(flags.len());
    let mut i = 0;
    while i < flags.len() {
        let f = &flags[i];
        if let Some(v) = f.strip_prefix("--arch=") {
            out.extend(model(v)?);
        } else if f == "--arch" {
            let v = flags.get(i + 1).cloned().unwrap_or_default();
            out.extend(model(&v)?);
            i += 1;
        } else {
            out.push(f.clone());
        }
        i += 1;
    }
    Ok(out)
}

/// The architectures the points name, checked (see the module documentation) against the
/// common flags' `--model` (`common`: the launch and train flags every run gets); empty when
/// no point names one.
pub fn check(points: &[Point], common: &[String]) -> Result<Vec<(Arch, String)>, JobError> {
    let mut archs: Vec<(Arch, String)> = Vec::new();
    for p in points {
        let Some(name) = of(&p.flags) else { continue };
        let Some(arch) = parse(&name) else {
            return Err(JobError::invalid(format!(
                "--param arch: {name:?} (run {}) is not an architecture of `tchrun model init \
                 --arch` ({})",
                p.name,
                known()
            )));
        };
        if flag_pairs(&p.flags).iter().any(|(n, _)| n == "model") {
            return Err(JobError::invalid(format!(
                "--param arch: run {} ({}) names both --arch and --model; a run starts from one \
                 model: vary one of them",
                p.name, p.origin
            )));
        }
        if !archs.iter().any(|(a, _)| *a == arch) {
            archs.push((arch, name));
        }
    }
    if archs.is_empty() {
        return Ok(archs);
    }
    let base = template(common)?;
    for (arch, name) in &archs {
        model::check_arch_input_size(*arch, base.input_size).map_err(|e| {
            JobError::invalid(format!(
                "--param arch: {name} at the input size of --model ({}): {e}",
                base.input_size
            ))
        })?;
    }
    Ok(archs)
}

/// The runs' common `--model`: its input size and normalization are the new models'.
fn template(common: &[String]) -> Result<ModelConfig, JobError> {
    let Some(dir) = flag_pairs(common)
        .into_iter()
        .rev()
        .find(|(n, _)| n == "model")
        .and_then(|(_, v)| v)
    else {
        return Err(JobError::invalid(
            "--param arch: give every run's --model DIR after -- (a `tchrun model init` \
             directory): the from-scratch models are made at its input size and normalization, \
             and the runs without an arch train it",
        ));
    };
    model::load(Path::new(&dir), false)
        .map_err(|e| JobError::invalid(format!("--param arch: the runs' --model: {e}")))
}

/// Writes `DIR/models/<arch>/model.json` for each architecture (kept when it already holds
/// the same model: a re-run or `--extend` of the sweep).
pub fn write_models(
    dir: &Path,
    archs: &[(Arch, String)],
    common: &[String],
) -> Result<(), JobError> {
    if archs.is_empty() {
        return Ok(());
    }
    let base = template(common)?;
    for (arch, name) in archs {
        let out = model_dir(dir, name);
        let mut cfg = ModelConfig::untrained(*arch, base.input_size, base.normalization);
        cfg.suggested_recipe =
            tchrun::recipe_preset::suggestion(*arch).map(|s| s.record(base.input_size));
        let text = model::to_json(&cfg);
        let file = out.join(tchrun::files::MODEL_JSON);
        if std::fs::read_to_string(&file).is_ok_and(|t| t == text) {
            continue;
        }
        std::fs::create_dir_all(&out)
            .and_then(|_| tchrun::files::write_atomic(&file, text.as_bytes()).map_err(|e| e.source))
            .map_err(|e| {
                JobError::invalid(format!(
                    "--param arch: cannot write {}: {e}",
                    file.display()
                ))
            })?;
        outln!(
            "tchrun sweep: from-scratch {name} (input size {}) in {}",
            base.input_size,
            out.display()
        );
    }
    Ok(())
}

fn parse(name: &str) -> Option<Arch> {
    <Arch as clap::ValueEnum>::from_str(name, false).ok()
}

fn known() -> String {
    <Arch as clap::ValueEnum>::value_variants()
        .iter()
        .filter_map(|a| clap::ValueEnum::to_possible_value(a).map(|v| v.get_name().to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_arch_flag_becomes_the_runs_model() {
        let flags: Vec<String> = ["--lr=0.1", "--arch=resnet18", "--arch", "vgg11"]
            .map(String::from)
            .to_vec();
        assert_eq!(of(&flags).as_deref(), Some("vgg11"));
        assert_eq!(
            translate(&flags, Path::new("/s")).expect("translate"),
            [
                "--lr=0.1",
                "--model=/s/models/resnet18",
                "--model=/s/models/vgg11"
            ]
        );
        assert!(parse("resnet18").is_some() && parse("resnet19").is_none());
        assert!(known().contains("efficientnet_b0"), "{}", known());
    }
}
