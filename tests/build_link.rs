//! Linking (issue 18, item 7): `tchrun-worker` loads `libtorch_cuda.so` whenever the libtorch it
//! was built against ships it, so CUDA is visible at run time whether or not the NCCL part of
//! the shim was compiled; and the binary still starts on a host without a GPU.
mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(60);

/// `readelf -d`'s `(NEEDED)` libraries and `(RUNPATH)`/`(RPATH)` directories of `bin`.
fn dynamic_section(bin: &std::path::Path) -> (Vec<String>, Vec<PathBuf>) {
    let r = run(Command::new("readelf").arg("-d").arg(bin), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let bracketed = |l: &str| -> Option<String> {
        let a = l.find('[')?;
        let b = l.rfind(']')?;
        (a < b).then(|| l[a + 1..b].to_string())
    };
    let mut needed = Vec::new();
    let mut rpath = Vec::new();
    for l in r.stdout.lines() {
        if l.contains("(NEEDED)") {
            needed.extend(bracketed(l));
        } else if l.contains("(RUNPATH)") || l.contains("(RPATH)") {
            if let Some(dirs) = bracketed(l) {
                rpath.extend(dirs.split(':').map(PathBuf::from));
            }
        }
    }
    (needed, rpath)
}

#[test]
fn worker_needs_libtorch_cuda_whenever_the_wheel_ships_it() {
    let worker = worker_path();
    let (needed, rpath) = dynamic_section(&worker);
    assert!(
        needed.iter().any(|n| n == "libtorch_cpu.so"),
        "readelf found no NEEDED libtorch_cpu.so in {}: {needed:?}",
        worker.display()
    );
    // The libtorch it was linked against: its rpath (build.rs), and the venv's (setup.sh).
    let venv = repo().join(".venv/libtorch/lib");
    let ships_cuda: Vec<PathBuf> = rpath
        .iter()
        .chain(std::iter::once(&venv))
        .map(|d| d.join("libtorch_cuda.so"))
        .filter(|p| p.is_file())
        .collect();
    if ships_cuda.is_empty() {
        eprintln!(
            "CPU-only libtorch (no libtorch_cuda.so in {rpath:?} or {venv:?}): nothing to link"
        );
        return;
    }
    assert!(
        needed.iter().any(|n| n == "libtorch_cuda.so"),
        "{} ships with the wheel ({ships_cuda:?}) but {} does not NEED it, so CUDA would be \
         invisible at run time (worker/build.rs: -Wl,--no-as-needed,-ltorch_cuda,--as-needed).\n\
         NEEDED: {needed:?}",
        ships_cuda[0].display(),
        worker.display()
    );
}

#[test]
fn worker_with_cuda_linked_starts_on_a_host_without_a_gpu() {
    let r = run(Command::new("ldd").arg(worker_path()), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let missing: Vec<&str> = r
        .stdout
        .lines()
        .filter(|l| l.contains("not found"))
        .collect();
    assert!(
        missing.is_empty(),
        "unresolved libraries: {missing:?}\n{}",
        r.stdout
    );
    let r = run(worker().arg("--version"), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(r.stdout.starts_with("tchrun-worker "), "{}", r.explain());
    // The device is resolved through libtorch (CUDA hooks loaded from libtorch_cuda): on a host
    // without a GPU `--device auto` is the CPU and `--device cuda` a clear refusal (exit 2).
    let t = tempdir();
    let r = run(
        worker()
            .args(["selftest", "--sizes", "4096", "--iters", "1", "--log-dir"])
            .arg(t.path())
            .env_remove("TCHRUN_TEST_CUDA_DEVICES"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    if !has_gpu() {
        assert!(
            r.stdout.contains("selftest: 1 rank on cpu (gloo)"),
            "{}",
            r.explain()
        );
    }
}

/// The NVIDIA driver lists a GPU on this host.
fn has_gpu() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|rd| rd.count() > 0)
        .unwrap_or(false)
}
