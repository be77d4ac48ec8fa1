//! `tchrun sweep` (docs/sweeps.md): a 2×2 grid as one Slurm job array with `%2` on the real
//! single-node Slurm (scripts/slurm-cluster.sh, `common::slurm`), a task cancelled with
//! `scancel` mid-run resumed by re-running the command (its model byte for byte an
//! uninterrupted run's), `sweep results` against each run's own model.json and metrics, the
//! local form's table the same; a bad grid refused with exit 2 naming the parameter. Locally:
//! `--param-file` and `--extend` (a changed grid refused without it, its new run alone trained
//! with it, the finished ones kept), a failed run retried once and then reported with its cause,
//! `--param arch` (each run from a from-scratch model of its architecture). Small: 500
//! digits, resnet18 at 32 px, 1 rank, 1 epoch, one thread.
mod common;
use common::slurm::Slurm;
use common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);

/// Every run's train flags (after `--`).
fn train_flags(model: &Path) -> Vec<String> {
    let d = small_digits();
    let mut v = vec![
        format!("--model={}", model.display()),
        format!("--train={}", d.join("train").display()),
        format!("--valid={}", d.join("valid").display()),
    ];
    v.extend(
        [
            "--epochs=1",
            "--threads=1",
            "--loader-threads=1",
            "--print-freq=1",
            "--min-crop-scale=0.5",
            "--no-hflip",
        ]
        .map(String::from),
    );
    v
}

const GRID: [&str; 4] = ["--param", "lr=0.05,0.02", "--param", "batch-size=16,32"];
const NAMES: [&str; 4] = [
    "lr0.05_batch-size16",
    "lr0.05_batch-size32",
    "lr0.02_batch-size16",
    "lr0.02_batch-size32",
];

/// `tchrun sweep GRID --output DIR LAUNCH -- TRAIN`.
fn sweep_args(dir: &Path, launch: &[&str], model: &Path) -> Vec<String> {
    let mut v: Vec<String> = vec!["sweep".into()];
    v.extend(GRID.map(String::from));
    v.push(format!("--output={}", dir.display()));
    v.extend(launch.iter().map(|s| s.to_string()));
    v.push("--".into());
    v.extend(train_flags(model));
    v
}

/// `results.csv` as rows of cells.
fn csv_rows(dir: &Path) -> Vec<Vec<String>> {
    read(&dir.join("results.csv"))
        .lines()
        .skip(1)
        .map(|l| l.split(',').map(str::to_string).collect())
        .collect()
}

/// The columns two forms of the same sweep agree on: point, best epoch, top-1, top-5,
/// validation loss, state (not the speed, not the model's folder).
fn comparable(rows: &[Vec<String>]) -> Vec<Vec<String>> {
    rows.iter()
        .map(|r| [0, 2, 3, 4, 5, 7].iter().map(|&i| r[i].clone()).collect())
        .collect()
}

/// `sweep results`' rows (sweep.json) equal each run's own model.json and metrics.jsonl.
fn assert_results_are_the_runs(dir: &Path) {
    let rec: serde_json::Value =
        serde_json::from_str(&read(&dir.join("sweep.json"))).expect("sweep.json");
    let rows = rec["results"].as_array().expect("results in sweep.json");
    assert_eq!(rows.len(), 4, "{rec}");
    for row in rows {
        let out = dir.join(row["point"].as_str().expect("point"));
        let model: serde_json::Value =
            serde_json::from_str(&read(&out.join("model.json"))).expect("model.json");
        let best = model["training"]["best_epoch"]
            .as_u64()
            .expect("best_epoch");
        assert_eq!(row["best_epoch"].as_u64(), Some(best), "{row}");
        let m = metrics_rows(&out);
        let e = m
            .iter()
            .find(|r| r["epoch"].as_u64() == Some(best))
            .expect("the best epoch's metrics");
        for k in ["top1", "top5", "val_loss"] {
            assert_eq!(row[k], e[k], "{k} of {}", out.display());
        }
        assert_eq!(row["state"], "finished", "{row}");
        assert_eq!(row["model"].as_str(), Some(out.to_str().expect("utf8")));
    }
}

/// Polls until no task of array `id` is queued or running (bounded).
fn wait_array(slurm: &Slurm, id: u64, limit: Duration) {
    let done = wait_for(limit, || {
        let r = run(
            slurm.cmd("squeue").args(["-h", "-j", &id.to_string()]),
            Duration::from_secs(10),
        );
        r.code == Some(0) && r.stdout.trim().is_empty()
    });
    assert!(done, "array {id} not finished after {limit:?}");
}

fn submitted(r: &Run) -> u64 {
    r.stdout
        .lines()
        .find_map(|l| l.strip_prefix("Submitted batch job ")?.trim().parse().ok())
        .unwrap_or_else(|| panic!("no job id\n{}", r.explain()))
}

#[test]
fn slurm_array_cancelled_task_resumed_results_and_the_local_form_agree() {
    let Some(slurm) = Slurm::start() else { return };
    let start = Instant::now();
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let dir = t.path().join("sweep");
    let launch = [
        "--sbatch",
        "--submit",
        "--max-parallel=2",
        "--cpus-per-task=2",
        "--time=10",
    ];
    let args = sweep_args(&dir, &launch, &model);
    let r = run(slurm.tchrun().args(&args), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let id = submitted(&r);
    let script = read(&dir.join("sweep.sbatch"));
    assert!(script.contains("#SBATCH --array=0-3%2\n"), "{script}");
    // Run 0 is cancelled once it has trained a few steps.
    let log0 = dir.join(NAMES[0]).join("logs/70_driver_log_0");
    assert!(
        wait_for(Duration::from_secs(90), || read_or_empty(&log0)
            .contains("iter 3/")),
        "task 0 did not train\n{}",
        read_or_empty(&dir.join(NAMES[0]).join("logs/70_mpi_log"))
    );
    let r = run(
        slurm.cmd("scancel").arg(format!("{id}_0")),
        Duration::from_secs(10),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    wait_array(&slurm, id, Duration::from_secs(180));
    let r = run(tchrun().args(["sweep", "results"]).arg(&dir), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let rows = csv_rows(&dir);
    let states: Vec<&str> = rows.iter().map(|r| r[7].as_str()).collect();
    assert_eq!(
        states,
        ["interrupted", "finished", "finished", "finished"],
        "{}",
        r.explain()
    );

    // The same command again: only run 0, resumed.
    let r = run(slurm.tchrun().args(&args), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains(&format!("{}: interrupted at epoch", NAMES[0])),
        "{}",
        r.explain()
    );
    let again = submitted(&r);
    assert!(read(&dir.join("sweep.sbatch")).contains("#SBATCH --array=0%2\n"));
    wait_array(&slurm, again, Duration::from_secs(120));
    let mpi0 = read_or_empty(&dir.join(NAMES[0]).join("logs/70_mpi_log"));
    assert!(mpi0.contains("resuming from"), "{mpi0}");
    let r = run(
        tchrun()
            .args(["sweep", "results", "--sort", "top1"])
            .arg(&dir),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_results_are_the_runs(&dir);
    let on_slurm = csv_rows(&dir);
    let slurm_s = start.elapsed();

    // The local form: the same table, and each model byte for byte the array's (run 0's was
    // cancelled and resumed there).
    let local = t.path().join("local");
    let r = run(
        tchrun().args(sweep_args(&local, &["--launcher=local"], &model)),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("point                best epoch"),
        "{}",
        r.explain()
    );
    let r = run(
        tchrun()
            .args(["sweep", "results", "--sort", "top1"])
            .arg(&local),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_eq!(comparable(&csv_rows(&local)), comparable(&on_slurm));
    for n in NAMES {
        let a = std::fs::read(dir.join(n).join("model.safetensors")).expect("array's model");
        let b = std::fs::read(local.join(n).join("model.safetensors")).expect("local model");
        assert!(
            a == b,
            "{n}: the array's model differs from the local run's"
        );
    }
    eprintln!(
        "sweep: 2x2 array %2 with a cancelled task resumed: {:.1}s; the local form: {:.1}s",
        slurm_s.as_secs_f64(),
        (start.elapsed() - slurm_s).as_secs_f64()
    );
}

fn read_or_empty(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

#[test]
fn a_bad_grid_exits_2_naming_the_parameter_before_anything_starts() {
    let t = tempdir();
    let model: PathBuf = model_dir(t.path(), "resnet18", 32);
    let dir = t.path().join("sweep");
    let cases: [(&[&str], &str); 7] = [
        (&["--param", "arch=resnet18,resnet19"], "--param arch: \"resnet19\" (run archresnet19) is not an architecture of `tchrun model init --arch` (resnet18, "),
        (&["--param", "arch=resnet18", "--param", "model=/m"], "--param arch: run archresnet18_modelm (--param arch=resnet18, model=/m) names both --arch and --model"),
        (&["--param", "lr=0.1,-1"], "--param lr: --lr=-1 (run lr-1) is refused: invalid value '-1' for '--lr <LR>'"),
        (&["--param", "lr-max=1"], "--param lr-max: --lr-max=1 (run lr-max1) is refused: unexpected argument '--lr-max'"),
        (&["--param", "output=a,b"], "--param output: --output cannot vary in a sweep"),
        (&["--param", "resume=x"], "--param resume: --resume cannot vary in a sweep"),
        (&["--param", "lr=0.1", "--sbatch", "--param", "opt=sgd,adam"], "--param opt: --opt=adam (run lr0.1_optadam) is refused: invalid value 'adam' for '--opt <OPT>'"),
    ];
    for (grid, want) in cases {
        let mut c = tchrun();
        c.arg("sweep")
            .args(grid)
            .arg("--output")
            .arg(&dir)
            .arg("--");
        c.args(train_flags(&model));
        let r = run(&mut c, LIMIT);
        assert_eq!(r.code, Some(2), "{grid:?}\n{}", r.explain());
        assert!(
            r.stderr.contains(want),
            "{grid:?}: want {want:?}\n{}",
            r.explain()
        );
        assert!(!dir.exists(), "{grid:?} wrote {}", dir.display());
    }
}

/// `tchrun sweep --output DIR --launcher=local OWN -- TRAIN` (hooks of the faults tests unset).
fn local_sweep(dir: &Path, own: &[&str], model: &Path) -> std::process::Command {
    let mut c = tchrun();
    c.arg("sweep")
        .args(own)
        .arg(format!("--output={}", dir.display()))
        .arg("--launcher=local")
        .arg("--")
        .args(train_flags(model))
        .env_remove("TCHRUN_TEST_KILL_AT_STEP")
        .env_remove("TCHRUN_ATTEMPT");
    c
}

/// The runs sweep.json names: (name, flags).
fn recorded(dir: &Path) -> Vec<(String, Vec<String>)> {
    let rec: serde_json::Value =
        serde_json::from_str(&read(&dir.join("sweep.json"))).expect("sweep.json");
    rec["runs"]
        .as_array()
        .expect("runs")
        .iter()
        .map(|r| {
            let flags = r["flags"].as_array().expect("flags");
            (
                r["name"].as_str().expect("name").to_string(),
                flags
                    .iter()
                    .map(|f| f.as_str().unwrap_or_default().to_string())
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn local_param_file_then_a_changed_grid_refused_without_extend_and_added_with_it() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let dir = t.path().join("sweep");
    let file = t.path().join("points.txt");
    std::fs::write(
        &file,
        "# two searches\n--lr 0.05 --batch-size 32\n\n--lr 0.02 --batch-size 32\n",
    )
    .expect("param file");
    let own = ["--param-file".to_string(), file.display().to_string()];
    let own: Vec<&str> = own.iter().map(String::as_str).collect();
    let r = run(&mut local_sweep(&dir, &own, &model), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let first = ["lr0.05_batch-size32", "lr0.02_batch-size32"];
    let names: Vec<String> = recorded(&dir).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, first, "{}", r.explain());
    let mtime = |n: &str| {
        std::fs::metadata(dir.join(n).join("model.safetensors"))
            .and_then(|m| m.modified())
            .unwrap_or_else(|e| panic!("{n}'s model: {e}"))
    };
    let before: Vec<_> = first.iter().map(|n| mtime(n)).collect();

    // A third line: the grid changed, refused without --extend (nothing written).
    std::fs::write(&file, format!("{}--lr 0.01 --batch-size 32\n", read(&file)))
        .expect("param file");
    let r = run(&mut local_sweep(&dir, &own, &model), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("the grid changed: 1 new point(s)") && r.stderr.contains("--extend"),
        "{}",
        r.explain()
    );
    assert_eq!(recorded(&dir).len(), 2);
    assert!(!dir.join("lr0.01_batch-size32").exists());

    // With --extend: the new run alone trains; the finished ones are kept as they were.
    let mut extend = own.clone();
    extend.push("--extend");
    let r = run(&mut local_sweep(&dir, &extend, &model), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    for n in first {
        assert!(
            r.stdout.contains(&format!("{n}: finished, kept")),
            "{}",
            r.explain()
        );
    }
    assert!(
        r.stdout.contains("run 1/1: lr0.01_batch-size32"),
        "{}",
        r.explain()
    );
    let after: Vec<_> = first.iter().map(|n| mtime(n)).collect();
    assert_eq!(before, after, "a finished run was trained again");
    let rows = csv_rows(&dir);
    assert_eq!(rows.len(), 3, "{}", read(&dir.join("results.csv")));
    assert!(rows.iter().all(|r| r[7] == "finished"), "{rows:?}");
}

#[test]
fn local_a_failed_run_is_retried_once_then_reported_with_its_cause() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let dir = t.path().join("sweep");
    let own = ["--param", "lr=0.05", "--param", "batch-size=32"];
    // The faults tests' hook: rank 0 killed at its step 2 (SIGKILL), on every attempt of this
    // command; the run fails.
    let failing = || {
        let mut c = local_sweep(&dir, &own, &model);
        c.env("TCHRUN_TEST_KILL_AT_STEP", "0:2");
        c
    };
    let name = "lr0.05_batch-size32";
    let r = run(&mut failing(), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(&format!("{name} failed (exit")),
        "{}",
        r.explain()
    );
    let r = run(&mut failing(), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(&format!("{name}: failed ("))
            && r.stdout.contains("retrying it once")
            && r.stdout.contains(&format!("run 1/1: {name}"))
            && r.stdout.contains(&format!("{name} failed (exit")),
        "{}",
        r.explain()
    );
    // Its retry failed too: the same command (the hook gone) does not start it again.
    let r = run(&mut local_sweep(&dir, &own, &model), LIMIT);
    assert_ne!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains(&format!(
            "{name}: failed again after its retry, not retried: "
        )),
        "{}",
        r.explain()
    );
    assert!(!r.stdout.contains("run 1/1"), "{}", r.explain());
    let rec: serde_json::Value =
        serde_json::from_str(&read(&dir.join("sweep.json"))).expect("sweep.json");
    assert_eq!(rec["runs"][0]["retries"], 1, "{rec}");
    let r = run(tchrun().args(["sweep", "results"]).arg(&dir), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let rows = csv_rows(&dir);
    assert_eq!(rows[0][7], "failed", "{}", r.explain());
    let failure: serde_json::Value =
        serde_json::from_str(&read(&dir.join(name).join("logs").join("failure.json")))
            .expect("failure.json");
    let message = failure["message"].as_str().unwrap_or_default();
    let first_line = message.lines().next().unwrap_or_default().trim();
    assert!(
        !first_line.is_empty() && r.stdout.contains(first_line),
        "the cause {first_line:?} is not in\n{}",
        r.explain()
    );
}

#[test]
fn local_param_arch_trains_each_architecture_from_scratch_at_the_models_input_size() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let dir = t.path().join("sweep");
    let own = [
        "--param",
        "arch=resnet18,efficientnet_b0",
        "--param",
        "batch-size=32",
    ];
    let r = run(&mut local_sweep(&dir, &own, &model), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let runs = recorded(&dir);
    let names: Vec<&str> = runs.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(
        names,
        [
            "archresnet18_batch-size32",
            "archefficientnet-b0_batch-size32"
        ]
    );
    for (arch, (name, flags)) in ["resnet18", "efficientnet_b0"].iter().zip(&runs) {
        assert!(flags.contains(&format!("--arch={arch}")), "{flags:?}");
        let fresh: serde_json::Value =
            serde_json::from_str(&read(&dir.join("models").join(arch).join("model.json")))
                .expect("the from-scratch model.json");
        assert_eq!(
            (&fresh["arch"], &fresh["input_size"]),
            (&(*arch).into(), &32.into())
        );
        let trained: serde_json::Value =
            serde_json::from_str(&read(&dir.join(name).join("model.json"))).expect("model.json");
        assert_eq!(trained["arch"], *arch, "{trained}");
        assert!(
            trained.get("initial_weights").is_none_or(|w| w.is_null()),
            "{trained}"
        );
    }
}
