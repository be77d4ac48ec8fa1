//! `scripts/gpu-check.sh` (issue 18) cannot rot unnoticed on the GPU-less CI: the whole script
//! parses (`bash -n`), and without a GPU it says so and exits 77 at once, before any setup or
//! build (no GPU is simulated with a fake `nvidia-smi` and an empty driver list, so the test
//! means the same on any machine).
mod common;
use common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

const NO_GPU: i32 = 77;
const LIMIT: Duration = Duration::from_secs(60);

fn script() -> PathBuf {
    repo().join("scripts/gpu-check.sh")
}

#[test]
fn gpu_check_script_parses() {
    let r = run(Command::new("bash").arg("-n").arg(script()), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = run(Command::new("bash").arg(script()).arg("--help"), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("77  no NVIDIA GPU on this machine"),
        "--help documents exit 77:\n{}",
        r.explain()
    );
    let r = run(Command::new("bash").arg(script()).arg("--bogus"), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
}

#[test]
fn gpu_check_without_a_gpu_exits_77_before_any_work() {
    let t = tempdir();
    let empty_proc = t.path().join("gpus");
    std::fs::create_dir_all(&empty_proc).expect("mkdir");
    let out = t.path().join("out");
    // nvidia-smi as on a host with the driver but no device, then as a failing one.
    for (smi_out, smi_code) in [("No devices were found", 6), ("NVIDIA-SMI has failed", 9)] {
        let bin = fake_smi(&t.path().join(format!("smi{smi_code}")), smi_out, smi_code);
        let r = run(
            Command::new("bash")
                .arg(script())
                .arg("--out")
                .arg(&out)
                .env("PATH", path_with(&bin))
                .env("TCHRUN_GPU_CHECK_PROC", &empty_proc)
                .env_remove("CUDA_VISIBLE_DEVICES"),
            LIMIT,
        );
        assert_no_gpu_answer(&r, &out);
    }
    // GPUs the driver lists but CUDA_VISIBLE_DEVICES hides are no GPUs either.
    let bin = fake_smi(
        &t.path().join("smi0"),
        "GPU 0: NVIDIA H100 (UUID: GPU-0)",
        0,
    );
    let r = run(
        Command::new("bash")
            .arg(script())
            .arg("--out")
            .arg(&out)
            .env("PATH", path_with(&bin))
            .env("TCHRUN_GPU_CHECK_PROC", &empty_proc)
            .env("CUDA_VISIBLE_DEVICES", "-1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(NO_GPU), "{}", r.explain());
    assert!(
        r.stdout.contains("CUDA_VISIBLE_DEVICES=-1"),
        "{}",
        r.explain()
    );
    assert!(!out.exists(), "{}", r.explain());
}

#[test]
fn gpu_check_on_this_machine_without_a_gpu() {
    let listed = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|rd| rd.count() > 0)
        .unwrap_or(false);
    let smi = Command::new("nvidia-smi")
        .arg("-L")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("GPU 0"))
        .unwrap_or(false);
    if listed || smi {
        eprintln!("this machine has a GPU: run scripts/gpu-check.sh itself");
        return;
    }
    let t = tempdir();
    let r = run(
        Command::new("bash")
            .arg(script())
            .arg("--out")
            .arg(t.path().join("out"))
            .env_remove("TCHRUN_GPU_CHECK_PROC"),
        LIMIT,
    );
    assert_eq!(r.code, Some(NO_GPU), "{}", r.explain());
    assert!(
        r.stdout
            .contains("gpu-check: no NVIDIA GPU on this machine"),
        "{}",
        r.explain()
    );
}
