//! The GPU kit (issue 26): `scripts/gpu-kit.sh` builds one folder that runs the GPU check on a
//! machine with nothing but a `python3` with torch (no network, no compiler, no OpenMPI). Here,
//! without a GPU: the kit is built under its 60 MiB limit (and a tiny limit is refused, naming
//! the largest parts), its `run.sh` exits 77 at once without a GPU, and its CPU path
//! (`run.sh --cpu-smoke`: Gloo selftest, gradcheck, 2-rank training and score, all through the
//! kit's mpirun) passes offline, with the system OpenMPI and the build tree hidden and another
//! Python's torch (scripts/gpu-kit-cpu-test.sh).
mod common;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const MIB: u64 = 1024 * 1024;

fn script(name: &str) -> PathBuf {
    repo().join("scripts").join(name)
}

/// `scripts/gpu-kit.sh DIR` with the tests' binaries.
fn build_kit(dir: &Path, limit_mib: Option<u32>) -> Run {
    let mut c = Command::new("bash");
    c.arg(script("gpu-kit.sh"))
        .arg(dir)
        .env("TCHRUN_GPU_KIT_BIN_DIR", bin_dir());
    if let Some(l) = limit_mib {
        c.env("TCHRUN_GPU_KIT_LIMIT_MIB", l.to_string());
    }
    run(&mut c, Duration::from_secs(180))
}

/// Every entry under `dir` (links not followed).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir").flatten() {
            if e.path().symlink_metadata().expect("metadata").is_dir() {
                todo.push(e.path());
            }
            out.push(e.path());
        }
    }
    out
}

/// Every plain file under `dir` with its size.
fn files(dir: &Path) -> Vec<(PathBuf, u64)> {
    walk(dir)
        .into_iter()
        .filter_map(|p| {
            let m = p.symlink_metadata().ok()?;
            m.is_file().then(|| (p, m.len()))
        })
        .collect()
}

#[test]
fn the_kit_is_built_under_60_mib_and_exits_77_without_a_gpu() {
    for s in ["gpu-kit.sh", "gpu-kit-cpu-test.sh", "gpu-kit/run.sh"] {
        let r = run(
            Command::new("bash").arg("-n").arg(script(s)),
            Duration::from_secs(30),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
    }
    for s in ["gpu-kit/env.sh", "gpu-kit/wrapper.sh"] {
        let r = run(
            Command::new("sh").arg("-n").arg(script(s)),
            Duration::from_secs(30),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
    }
    let t = tempdir();
    let kit = t.path().join("kit");
    let worker = bin_dir().join("tchrun-worker");
    let before = std::fs::metadata(&worker).expect("worker").len();
    let r = build_kit(&kit, None);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert_eq!(
        std::fs::metadata(&worker).expect("worker").len(),
        before,
        "target/release/tchrun-worker must stay untouched (the kit strips a copy)"
    );

    // Everything the GPU machine needs is in it, and it all fits.
    for f in [
        "run.sh",
        "env.sh",
        "bin/tchrun",
        "bin/tchrun-worker",
        "bin/mpirun",
        "openmpi/bin/orterun",
        "openmpi/bin/orted",
        "openmpi/lib/libmpi.so.40",
        "openmpi/lib/libopen-rte.so.40",
        "openmpi/lib/libopen-pal.so.40",
        "openmpi/lib/libpmix.so.2",
        "openmpi/lib/libhwloc.so.15",
        "openmpi/lib/openmpi/mca_pmix_ext3x.so",
        "openmpi/lib/openmpi/mca_btl_vader.so",
        "openmpi/lib/openmpi/mca_schizo_ompi.so",
        "openmpi/share/openmpi/help-mpi-runtime.txt",
        "openmpi/etc/openmpi-mca-params.conf",
        "scripts/make_digits.py",
        "scripts/digits.csv.gz",
        "benches/bench.py",
        "benches/make_images.py",
        "benches/reference/bench_step.py",
        "benches/reference/train_ddp.py",
        "MANIFEST",
    ] {
        assert!(kit.join(f).exists(), "the kit lacks {f}\n{}", r.explain());
    }
    // Plain files only: some ways of carrying a folder keep no links.
    let links: Vec<_> = walk(&kit)
        .into_iter()
        .filter(|p| {
            p.symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink())
        })
        .collect();
    assert!(links.is_empty(), "links in the kit: {links:?}");
    let all = files(&kit);
    let total: u64 = all.iter().map(|(_, s)| s).sum();
    assert!(
        total < 60 * MIB,
        "the kit is {:.1} MiB, over 60 MiB",
        total as f64 / MIB as f64
    );
    // The wheel users install, with the worker stripped inside it.
    let wheels: Vec<_> = std::fs::read_dir(kit.join("wheel"))
        .expect("kit/wheel")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        wheels.len() == 1
            && wheels[0]
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("tchrun-")
                    && n.to_string_lossy().ends_with(".whl")),
        "{wheels:?}"
    );
    let wheel = std::fs::metadata(&wheels[0]).expect("wheel").len();
    assert!(
        wheel < before / 2,
        "the kit's wheel keeps the worker's debug info: {wheel} bytes, the worker {before}"
    );
    let manifest = read(&kit.join("MANIFEST"));
    assert!(
        manifest.contains("torch: 2.11.0")
            && manifest.contains("openmpi: ")
            && manifest.contains("wheel: tchrun-"),
        "{manifest}"
    );

    // A limit it exceeds: exit 2, the largest parts named, nothing written.
    let small = t.path().join("small");
    let r = build_kit(&small, Some(1));
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("over the limit of 1 MiB")
            && r.stderr.contains("wheel/tchrun-")
            && r.stderr.contains("MiB  "),
        "{}",
        r.explain()
    );
    assert!(!small.exists(), "{}", r.explain());
    // A folder that is not a kit is not replaced.
    let other = t.path().join("other");
    std::fs::create_dir_all(&other).expect("mkdir");
    std::fs::write(other.join("keep"), "mine").expect("write");
    let r = build_kit(&other, None);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(other.join("keep").is_file(), "{}", r.explain());

    // No GPU: the kit's run.sh says so and exits 77 at once, before any work.
    let r = run(
        Command::new(kit.join("run.sh")).arg("--help"),
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("77  no NVIDIA GPU on this machine"),
        "{}",
        r.explain()
    );
    let empty_proc = t.path().join("gpus");
    std::fs::create_dir_all(&empty_proc).expect("mkdir");
    let bin = fake_smi(&t.path().join("smi"), "No devices were found", 6);
    let out = t.path().join("out");
    for args in [&["--out"][..], &["--quick", "--out"][..]] {
        let r = run(
            Command::new(kit.join("run.sh"))
                .args(args)
                .arg(&out)
                .env("PATH", path_with(&bin))
                .env("TCHRUN_GPU_CHECK_PROC", &empty_proc)
                .env_remove("CUDA_VISIBLE_DEVICES"),
            Duration::from_secs(60),
        );
        assert_no_gpu_answer(&r, &out);
    }
    // The CPU path does not ask for a GPU: from the source folder (not a built kit) it goes on
    // to the kit check and is refused there (exit 2), not with 77.
    let r = run(
        Command::new("bash")
            .arg(script("gpu-kit/run.sh"))
            .args(["--cpu-smoke", "--out"])
            .arg(&out)
            .env("TCHRUN_GPU_CHECK_PROC", &empty_proc),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("is not a built kit"), "{}", r.explain());
}

#[test]
fn the_kit_runs_its_cpu_path_offline_without_the_system_openmpi_or_the_build_tree() {
    let probe = Command::new("unshare").args(["-m", "-n", "true"]).output();
    if !probe.as_ref().is_ok_and(|o| o.status.success()) {
        let why = match &probe {
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_string(),
            Err(e) => e.to_string(),
        };
        skip_or_fail(&format!(
            "cannot make mount and network namespaces here (unshare -m -n: {why})"
        ));
        return;
    }
    let t = tempdir();
    let kit = t.path().join("kit");
    let r = build_kit(&kit, None);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // The second Python: hard links of .venv's packages (no scikit-learn), kept in target/.
    let venv = bin_dir()
        .parent()
        .expect("target dir")
        .join("gpu-kit-python");
    let r = run(
        Command::new("bash")
            .arg(script("gpu-kit-cpu-test.sh"))
            .arg("python")
            .arg(&venv),
        Duration::from_secs(300),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());

    let r = run(
        Command::new("bash")
            .arg(script("gpu-kit-cpu-test.sh"))
            .arg("run")
            .arg(&kit)
            .arg(&venv)
            .arg(t.path()),
        Duration::from_secs(480),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(r.stdout.contains("controls hold"), "{}", r.explain());
    let out = t.path().join("out");
    let table = read(&out.join("gpu-check.md"));
    for row in [
        "| python and torch | pass |",
        "| pip install the wheel | pass |",
        "| tchrun-worker links libtorch_cuda.so | pass |",
        "| the kit's programs load | pass |",
        "| Gloo selftest, 2 CPU ranks (the kit's mpirun) | pass |",
        "| gradcheck on CPU, 2 rank(s) | pass |",
        "| train 5 steps, --amp off, 2 CPU rank(s) | pass |",
        "| score on CPU | pass |",
        "All 8 checks passed",
    ] {
        assert!(
            table.contains(row),
            "no '{row}' in\n{table}\n{}",
            r.explain()
        );
    }
    // The libraries came from the kit and the other Python (through the installed wheel's
    // RUNPATH), not the build tree.
    assert!(
        table.contains("OpenMPI 4.1")
            && table.contains(&format!(
                "libtorch (RUNPATH, no LD_LIBRARY_PATH) from {}/py/",
                t.path().display()
            )),
        "{table}"
    );
    // What comes back from a GPU machine: at most 8 plain files directly in OUT, each under
    // 16 MiB; the work files are elsewhere.
    let entries: Vec<_> = std::fs::read_dir(&out)
        .expect("OUT")
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(entries.len() <= 8, "{entries:?}");
    for e in &entries {
        let m = e.symlink_metadata().expect("metadata");
        assert!(m.is_file() && m.len() < 16 * MIB, "{}: {m:?}", e.display());
    }
    let log = read(&out.join("checks.log"));
    assert!(
        log.contains("======== Gloo selftest") && log.contains("--launcher mpirun"),
        "{log}"
    );
    assert!(t.path().join("work/digits/train").is_dir());
}
