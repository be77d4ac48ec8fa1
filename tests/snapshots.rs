//! The text users read, under snapshot (`insta`; the snapshots live in `tests/snapshots/`):
//! `--help` of every command, the `--dry-run` plan, the sbatch script, `tchrun status`. Paths, the version and
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
        &["doctor"],
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
        &["data", "transform"],
        &["logs"],
        &["status"],
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

/// torchrun's and torchvision's flag names are aliases: the same plan, to the byte, as
/// tchrun's own names.
#[test]
fn torchrun_and_torchvision_flag_names_give_the_same_plan() {
    let t = tempdir();
    let (model, data) = job(t.path());
    let plan = |flags: &[&str], out: &str| {
        let mut c = clean(tchrun());
        c.arg("train")
            .arg("--model")
            .arg(&model)
            .arg("--train")
            .arg(data.join("train"))
            .arg("--valid")
            .arg(data.join("valid"))
            .args(flags)
            .arg(t.path().join("out"))
            .args(["--epochs", "3", "--dry-run"])
            .env("TCHRUN_DATA_CACHE", t.path().join("cache"));
        let r = run(&mut c, LIMIT);
        assert_eq!(r.code, Some(0), "{out}: {}", r.explain());
        // The plan (the index lines say built, then reused).
        r.stdout
            .lines()
            .filter(|l| !l.starts_with("tchrun: "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let ours = plan(
        &[
            "--procs-per-node",
            "2",
            "--nodes",
            "1",
            "--loader-threads",
            "1",
            "--warmup-epochs",
            "1",
            "--output",
        ],
        "tchrun's names",
    );
    let theirs = plan(
        &[
            "--nproc-per-node",
            "2",
            "--nnodes",
            "1",
            "-j",
            "1",
            "--lr-warmup-epochs",
            "1",
            "--output-dir",
        ],
        "aliases",
    );
    assert_eq!(ours, theirs);
    assert!(
        ours.contains("--loader-threads=1") && ours.contains("--warmup-epochs"),
        "{ours}"
    );
    let workers = plan(
        &[
            "--nproc-per-node",
            "2",
            "--workers",
            "1",
            "--lr-warmup-epochs",
            "1",
            "--output",
        ],
        "--workers",
    );
    assert_eq!(ours, workers);
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

/// `status.json`'s time `secs` seconds ago.
fn seconds_ago(secs: u64) -> String {
    humantime::format_rfc3339_millis(std::time::SystemTime::now() - Duration::from_secs(secs))
        .to_string()
}

/// A training job of 4 ranks on 2 hosts, 2 GPUs each, in its second epoch: rank 3's loader is
/// slow (a straggler).
fn running_status() -> tchrun::job_record::JobStatus {
    use tchrun::job_record::heartbeat::Phase;
    use tchrun::job_record::status::*;
    let rank = |rank: usize, phase, idle_s, data_wait: f64, compute: f64| RankStatus {
        rank,
        host: if rank < 2 { "node1" } else { "node2" }.into(),
        device: format!("cuda:{}", rank % 2),
        phase: Some(phase),
        step: 1234,
        idle_s: Some(idle_s),
        shares: Some(Shares {
            data_wait,
            compute,
            comm: 1.0 - data_wait - compute,
        }),
        rss_bytes: Some((5000 + 10 * rank as u64) << 20),
        gpu_bytes: Some((11_000 + 100 * rank as u64) << 20),
    };
    let mut s = JobStatus::starting(1, 4);
    s.state = JobState::Training;
    s.updated = seconds_ago(1);
    s.started = Some(seconds_ago(1500));
    (s.epoch, s.epochs, s.step, s.total_steps) = (2, 5, 1234, 5000);
    (s.epoch_step, s.steps_per_epoch) = (234, 1000);
    s.images_per_s = Some(812.4);
    (s.eta_epoch_s, s.eta_job_s) = (Some(710.0), Some(4380.0));
    s.last_checkpoint = Some(CheckpointMark {
        step: 1000,
        time: seconds_ago(750),
    });
    s.window = Some(WindowMark {
        end_step: 1200,
        steps: 100,
        seconds: 12.3,
    });
    s.ranks = vec![
        rank(0, Phase::GradientAllReduce, 0.2, 0.04, 0.71),
        rank(1, Phase::GradientAllReduce, 0.2, 0.05, 0.70),
        rank(2, Phase::GradientAllReduce, 0.3, 0.04, 0.72),
        rank(3, Phase::Loading, 0.9, 0.45, 0.50),
    ];
    s.stragglers = vec![Straggler {
        rank: 3,
        host: "node2".into(),
        device: "cuda:1".into(),
        kind: SlowKind::DataWait,
        factor: 11.0,
        value: 0.45,
        median: 0.04,
        steps: 400,
        since_step: 800,
    }];
    s
}

/// `tchrun status` of a job's log directory holding `status` (and `failure`): `args` after
/// the path.
fn status_of(
    t: &Path,
    status: &tchrun::job_record::JobStatus,
    failure: Option<&tchrun::job_record::FailureSummary>,
    args: &[&str],
) -> String {
    use tchrun::job_record::Record;
    let out = t.join("out");
    let logs = out.join("logs");
    std::fs::create_dir_all(&logs).expect("logs");
    status.write(&logs).expect("status.json");
    if let Some(f) = failure {
        f.write(&logs).expect("failure.json");
    }
    let r = run(clean(tchrun()).arg("status").arg(&out).args(args), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    redact(&r.stdout, Some(t))
}

fn snapshot_status(name: &str, text: &str) {
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"updated \d+ s ago", "updated [N] s ago");
    settings.add_filter(r"ended \d+ s ago", "ended [N] s ago");
    settings.bind(|| insta::assert_snapshot!(name, text));
}

/// `tchrun status` of a running job (the ranks of a host folded when they agree, and with
/// `--ranks` one line each), a finished one and a failed one (with `failure.json` as
/// `tchrun logs` prints it), from fixtures.
#[test]
fn status_table() {
    use tchrun::job_record::status::{JobEnd, JobState, JobStatus};
    let t = tempdir();
    let running = running_status();
    snapshot_status("status running", &status_of(t.path(), &running, None, &[]));
    snapshot_status(
        "status running --ranks",
        &status_of(t.path(), &running, None, &["--ranks"]),
    );
    let mut last = running.clone();
    (last.epoch, last.step, last.epoch_step) = (5, 5000, 1000);
    last.stragglers.clear();
    for r in &mut last.ranks {
        (r.step, r.phase) = (5000, Some(tchrun::job_record::heartbeat::Phase::Done));
    }
    let finished = JobStatus::ended(
        Some(last),
        JobState::Finished,
        JobEnd {
            code: 0,
            summary: format!("model written to {}", t.path().join("out").display()),
            cause: None,
        },
    );
    snapshot_status(
        "status finished",
        &status_of(t.path(), &finished, None, &[]),
    );
    let failure = tchrun::job_record::FailureSummary {
        rank: Some(3),
        host: Some("node2".into()),
        local_rank: Some(1),
        exit_code: Some(137),
        signal: Some(9),
        time: Some("2030-01-01T10:00:00.000Z".into()),
        classification: "killed by signal".into(),
        message: "killed by signal 9".into(),
        log: Some(t.path().join("out/logs/70_driver_log_3")),
        tail: vec!["epoch 2 step 1234 loss 0.61".into()],
        exit_status: 4,
        earlier_attempts: Vec::new(),
        not_restarted: None,
        hang: None,
        cause: None,
    };
    let failed = JobStatus::ended(
        Some(running),
        JobState::Failed,
        JobEnd {
            code: 4,
            summary: "rank 3 failed first (host node2): killed by signal 9".into(),
            cause: None,
        },
    );
    snapshot_status(
        "status failed",
        &status_of(t.path(), &failed, Some(&failure), &[]),
    );
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

/// Issue 52: a flag given twice takes its last value, as argparse and torchrun do (`$COMMON
/// --epochs 3` after a `$COMMON` that holds `--epochs 1`): the same plan as the last value
/// alone, for an option, a boolean flag and a launch flag; and the worker (which the plan
/// starts with the flags as given) takes the last one too.
#[test]
fn a_flag_given_twice_takes_its_last_value() {
    let t = tempdir();
    let (model, data) = job(t.path());
    let plan = |flags: &[&str]| {
        let r = run(
            clean(tchrun_train(
                &model,
                &data.join("train"),
                &data.join("valid"),
                &t.path().join("out"),
            ))
            .args(flags)
            .arg("--dry-run")
            .env("TCHRUN_DATA_CACHE", t.path().join("cache")),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{flags:?}: {}", r.explain());
        r.stdout
            .lines()
            .filter(|l| !l.starts_with("tchrun: "))
            .map(|l| format!("{l}\n"))
            .collect::<String>()
    };
    let once = plan(&["--procs-per-node", "2", "--epochs", "3", "--no-hflip"]);
    let twice = plan(&[
        "--procs-per-node",
        "1",
        "--epochs",
        "1",
        "--no-hflip",
        "--procs-per-node",
        "2",
        "--epochs",
        "3",
        "--no-hflip",
    ]);
    assert!(
        once.contains("--epochs=3") && once.contains("-np 2"),
        "{once}"
    );
    assert_eq!(once, twice);
    // The worker's own parser: `--version` after a repeated flag parses, not "cannot be used
    // multiple times".
    let r = run(
        Command::new(bin_dir().join("tchrun-worker"))
            .args(["train", "--epochs", "1", "--epochs", "2", "--help"]),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}
