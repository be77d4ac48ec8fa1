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
        &["evaluate"],
        &["data"],
        &["data", "split"],
        &["data", "index"],
        &["data", "pack"],
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

/// The dataset index lines' listing time and path hash.
fn redact_index(text: &str) -> String {
    text.lines()
        .map(|l| {
            let mut l = l.to_string();
            if let (Some(a), Some(b)) = (l.find("listed in "), l.find(" s; in ")) {
                l.replace_range(a + "listed in ".len()..b, "[T]");
            }
            if let Some(b) = l.find(".v1") {
                if b >= 16 && l.is_char_boundary(b - 16) {
                    l.replace_range(b - 16..b, "[HASH]");
                }
            }
            l
        })
        .collect::<Vec<_>>()
        .join("\n")
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
        .args(["--procs-per-node", "2", "--epochs", "3", "--dry-run"])
        .env("TCHRUN_DATA_CACHE", t.path().join("cache")),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let text = redact(&r.stdout, Some(t.path())).replace(&data.display().to_string(), "[DATA]");
    let text = redact_index(&text);
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

/// What differs between runs in logs and reports: times, the host, ports, and the numbers of a
/// measurement (speeds, seconds, which rank was slowest). Applied to the failure summary and
/// the run report.
fn run_filters() -> Vec<(String, String)> {
    let host = hostname();
    vec![
        (r"\d{4}-\d\d-\d\dT[\d:.]+Z".into(), "[TIME]".into()),
        (format!(r"\b{}\b", regex_escape(&host)), "[HOST]".into()),
        (r"127\.0\.0\.1:\d+".into(), "127.0.0.1:[PORT]".into()),
        (r"[\d.]+ images/s".into(), "[N] images/s".into()),
        (r"(compute|communication) [\d.]+s".into(), "$1 [N]s".into()),
        (r"slowest rank \d+".into(), "slowest rank [N]".into()),
    ]
}

fn hostname() -> String {
    let r = run(Command::new("hostname").arg("-s"), LIMIT);
    r.stdout.trim().to_string()
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_string()
            } else {
                format!("\\{c}")
            }
        })
        .collect()
}

fn snapshot_with_run_filters(name: &str, text: &str) {
    let filters = run_filters();
    let mut settings = insta::Settings::clone_current();
    for (re, with) in &filters {
        settings.add_filter(re, with.as_str());
    }
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// The failure summary, live (stderr) and from `tchrun logs`: the first failing rank, its cause
/// and its log's last lines.
#[test]
fn failure_summary() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = run(
        clean(tchrun())
            .args(["exec", "--procs-per-node", "2", "--log-dir"])
            .arg(&logs)
            .args([
                "--",
                "sh",
                "-c",
                "echo hello from $RANK; if [ \"$RANK\" = 1 ]; then echo boom >&2; exit 3; fi; sleep 1",
            ]),
        LIMIT,
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let start = r
        .stderr
        .find("tchrun: rank 1 failed first")
        .unwrap_or_else(|| panic!("no summary:\n{}", r.explain()));
    let live: String = r.stderr[start..]
        .lines()
        .take_while(|l| l.starts_with("tchrun:") || l.starts_with("  "))
        .map(|l| format!("{l}\n"))
        .collect();
    snapshot_with_run_filters("failure summary", &redact(&live, Some(t.path())));
    let again = run(clean(tchrun()).arg("logs").arg(&logs), LIMIT);
    assert_eq!(again.code, Some(0), "{}", again.explain());
    snapshot_with_run_filters(
        "failure summary from tchrun logs",
        &redact(&again.stdout, Some(t.path())),
    );
}

/// The end-of-run report of a training job (2 ranks, one epoch on the small digits).
#[test]
fn run_report() {
    let t = tempdir();
    let (model, data) = job(t.path());
    let out = t.path().join("out");
    let r = run(
        clean(tchrun_train(
            &model,
            &data.join("train"),
            &data.join("valid"),
            &out,
        ))
        .args([
            "--procs-per-node",
            "2",
            "--epochs",
            "1",
            "--batch-size",
            "40",
        ]),
        Duration::from_secs(300),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let report: String = r
        .stdout
        .lines()
        .chain(r.stderr.lines())
        .filter(|l| l.starts_with("tchrun: run report") || l.starts_with("tchrun: trained model"))
        .map(|l| format!("{l}\n"))
        .collect();
    snapshot_with_run_filters("run report", &redact(&report, Some(t.path())));
}

/// The console of a 2-rank training job as the user reads it, by default (rank 0's lines, rank
/// 1's warning) and with `--console all` (the lines both ranks print alike folded into
/// `[ranks 0-1] ...`). The progress and epoch lines are left out: each carries its rank's own
/// images/s, so they fold only when both ranks measured the same (`console.rs` tests them).
#[test]
fn folded_console() {
    let t = tempdir();
    let (model, _) = job(t.path());
    let mut text = String::new();
    let mut host = String::new();
    // The default first: rank 0's training line names the host.
    for selection in [None, Some("all")] {
        let out = t.path().join(selection.unwrap_or("default"));
        let r = run(
            &mut clean(two_rank_console_job(&model, &out, "local", selection)),
            Duration::from_secs(300),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        if host.is_empty() {
            host = format!("{}:", console_host(&r.stdout));
        }
        let flag = selection
            .map(|s| format!(" --console {s}"))
            .unwrap_or_default();
        text.push_str(&format!("$ tchrun train ... --procs-per-node 2{flag}\n"));
        for (stream, lines) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
            for l in rank_lines(lines) {
                if !l.contains("images/s") {
                    text.push_str(&format!("{stream}: {}\n", l.replace(&host, "[HOST]:")));
                }
            }
        }
    }
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"\d+\.\d+", "[F]");
    settings.bind(|| insta::assert_snapshot!("folded console", text));
}
