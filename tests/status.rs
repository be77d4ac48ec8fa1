//! `tchrun status` after real training jobs (issue 29): the launcher's own `status.json` at
//! the end of the job says `finished` with where the model is, or `failed` with the rank that
//! failed first (and `failure.json`'s summary below); a directory without `status.json` is
//! refused in words (exit 2). What rank 0 writes while the job runs is not relied on here.
mod common;
use common::*;
use std::path::Path;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(300);
const QUICK: Duration = Duration::from_secs(60);

/// One epoch on the small digits with 2 local ranks (400 images, batches of 40: 5 steps).
fn train(t: &Path, out: &Path, kill: Option<&str>) -> Run {
    let model = model_dir(t, "resnet18", 32);
    let d = small_digits();
    let mut c = tchrun_train(&model, &d.join("train"), &d.join("valid"), out);
    c.args([
        "--epochs",
        "1",
        "--batch-size",
        "40",
        "--procs-per-node",
        "2",
        "--launcher",
        "local",
    ])
    .env_remove("TCHRUN_ATTEMPT")
    .env_remove("TCHRUN_TEST_KILL_ON_HOST");
    match kill {
        Some(k) => c.env("TCHRUN_TEST_KILL_AT_STEP", k),
        None => c.env_remove("TCHRUN_TEST_KILL_AT_STEP"),
    };
    run(&mut c, LIMIT)
}

fn status(args: &[&str], path: &Path) -> Run {
    run(tchrun().arg("status").arg(path).args(args), QUICK)
}

#[test]
fn a_finished_job_says_finished_and_where_its_model_is() {
    let t = tempdir();
    let out = t.path().join("out");
    let r = train(t.path(), &out, None);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // The --output leads to its logs/.
    let s = status(&[], &out);
    assert_eq!(s.code, Some(0), "{}", s.explain());
    assert!(
        s.stdout
            .contains("state:      finished, attempt 1, 2 rank(s)")
            && s.stdout.contains(&format!(
                "ended:      exit code 0: model written to {}",
                out.display()
            ))
            && !s.stdout.contains("stale"),
        "{}",
        s.explain()
    );
    let j = status(&["--json"], &out.join("logs"));
    assert_eq!(j.code, Some(0), "{}", j.explain());
    let v: serde_json::Value = serde_json::from_str(&j.stdout).expect("--json prints JSON");
    assert_eq!(
        (&v["state"], &v["attempt"], &v["end"]["code"]),
        (&"finished".into(), &1.into(), &0.into()),
        "{v}"
    );
    // --watch of an ended job: its last line and the table, at once (stdout is a pipe).
    let w = status(&["--watch", "--interval", "0.2"], &out);
    assert_eq!(w.code, Some(0), "{}", w.explain());
    let first = w.stdout.lines().next().unwrap_or_default();
    assert!(
        first.contains(" finished (attempt 1), ")
            && first.ends_with(&format!(
                ", exit code 0: model written to {}",
                out.display()
            ))
            && w.stdout.contains("state:      finished"),
        "{}",
        w.explain()
    );
}

#[test]
fn a_failed_job_says_failed_and_names_the_rank() {
    let t = tempdir();
    let out = t.path().join("out");
    let r = train(t.path(), &out, Some("1:3"));
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let s = status(&[], &out);
    assert_eq!(s.code, Some(0), "{}", s.explain());
    assert!(
        s.stdout
            .contains("state:      failed, attempt 1, 2 rank(s)")
            && s.stdout
                .contains("ended:      exit code 4: rank 1 failed first (host ")
            && s.stdout.contains("tchrun: rank 1 failed first (host "),
        "{}",
        s.explain()
    );
}

#[test]
fn a_directory_without_status_json_is_refused_in_words() {
    let t = tempdir();
    let s = status(&[], t.path());
    assert_eq!(s.code, Some(2), "{}", s.explain());
    assert!(
        s.stderr.contains(&format!(
            "no status.json in {}: not a tchrun train log directory, or the job has not \
             started yet",
            t.path().display()
        )),
        "{}",
        s.explain()
    );
    let s = status(&[], &t.path().join("absent"));
    assert_eq!(s.code, Some(2), "{}", s.explain());
    assert!(s.stderr.contains("not a directory"), "{}", s.explain());
}
