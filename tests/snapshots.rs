//! The text users read, under snapshot (`insta`; the snapshots live in `tests/snapshots/`):
//! `--help` of every command, the `--dry-run` plan, the sbatch script. Paths, the version and
//! the forwarded `PATH` are redacted, so a snapshot changes only when the text does. To accept
//! an intended change: `INSTA_UPDATE=always cargo test --release --test snapshots`, then review
//! the diff of `tests/snapshots/`.
mod common;
use common::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `tchrun` with none of the caller's `TCHRUN_*` or `SLURM_*` variables (clap prints them in
/// `--help`; Slurm's pick the launcher) nor `LD_LIBRARY_PATH` (forwarded to the ranks when set).
fn clean(mut c: Command) -> Command {
    c.env_remove("LD_LIBRARY_PATH");
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("TCHRUN_") || k.to_string_lossy().starts_with("SLURM_") {
            c.env_remove(k);
        }
    }
    c
}

/// Replaces what differs between machines and runs.
fn redact(text: &str, tmp: Option<&Path>) -> String {
    let mut s = text.to_string();
    if let Some(t) = tmp {
        s = s.replace(&t.display().to_string(), "[TMP]");
    }
    s = s.replace(&bin_dir().display().to_string(), "[BIN]");
    s = s.replace(&repo().display().to_string(), "[REPO]");
    s = s.replace(env!("CARGO_PKG_VERSION"), "[VERSION]");
    s.lines()
        .map(|l| match l.find("PATH=") {
            Some(i) if l.starts_with('#') => format!("{}PATH=[PATH]", &l[..i]),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn help(args: &[&str]) -> String {
    let mut c = clean(tchrun());
    let r = run(c.args(args).arg("--help"), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    redact(&r.stdout, None)
}

#[test]
fn help_of_every_command() {
    for args in [
        &[][..],
        &["selftest"],
        &["exec"],
        &["train"],
        &["sbatch"],
        &["model"],
        &["model", "init"],
        &["score"],
        &["logs"],
    ] {
        let name = if args.is_empty() {
            "tchrun".to_string()
        } else {
            format!("tchrun {}", args.join(" "))
        };
        insta::assert_snapshot!(format!("help {name}"), help(args));
    }
}

/// A model directory and a tiny image folder (the plan does not read images).
fn job(t: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let model = model_dir(t, "resnet18", 32);
    let data = small_digits();
    (model, data)
}

#[test]
fn dry_run_plan() {
    let t = tempdir();
    let (model, data) = job(t.path());
    let r = run(
        clean(tchrun_train(
            &model,
            &data.join("train"),
            &data.join("valid"),
            &t.path().join("out"),
        ))
        .args(["--procs-per-node", "2", "--epochs", "3", "--dry-run"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let text = redact(&r.stdout, Some(t.path())).replace(&data.display().to_string(), "[DATA]");
    insta::assert_snapshot!("dry run train", text);
}

#[test]
fn sbatch_script() {
    let t = tempdir();
    let (model, data) = job(t.path());
    let out = t.path().join("out");
    let r = run(
        clean(tchrun())
            .arg("sbatch")
            .arg("--model")
            .arg(&model)
            .arg("--train")
            .arg(data.join("train"))
            .arg("--valid")
            .arg(data.join("valid"))
            .arg("--output")
            .arg(&out)
            .args(["--nodes", "2", "--procs-per-node", "2", "--epochs", "3"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let script = read(&out.join("logs/tchrun-job.sbatch"));
    let text = redact(&script, Some(t.path())).replace(&data.display().to_string(), "[DATA]");
    insta::assert_snapshot!("sbatch script", text);
    insta::assert_snapshot!(
        "sbatch stdout",
        redact(&r.stdout, Some(t.path())).replace(&data.display().to_string(), "[DATA]")
    );
}
