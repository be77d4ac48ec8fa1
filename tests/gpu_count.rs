//! GPU counting (issue 18, item 5): one rank per GPU. The worker refuses more ranks on a host
//! than it has GPUs before it creates the process group; the launcher refuses it before any
//! rank starts where it can see the ranks' host, and leaves it to the ranks (saying so) where
//! it cannot. `TCHRUN_TEST_CUDA_DEVICES` fakes the device count on this GPU-less machine.
mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const FAKE: &str = "TCHRUN_TEST_CUDA_DEVICES";

/// The refusal's words (src/env.rs `too_many_ranks_for_gpus`), for 2 ranks and 1 GPU.
const REFUSAL: &str = "--procs-per-node 2 exceeds the 1 GPU(s) visible on";
const HINT: &str =
    "lower --procs-per-node to 1 or check CUDA_VISIBLE_DEVICES (or use --device cpu)";

fn has_gpu() -> bool {
    std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|rd| rd.count() > 0)
        .unwrap_or(false)
}

#[test]
fn worker_refuses_more_ranks_than_gpus_before_the_group_exists() {
    for device in ["cuda", "auto"] {
        let t = tempdir();
        let logs = t.path().join("logs");
        let r = run(
            mpirun(2)
                .arg(worker_path())
                .args(["selftest", "--device", device, "--log-dir"])
                .arg(&logs)
                .env(FAKE, "1"),
            LIMIT,
        );
        let text = format!("{}{}", r.stdout, r.stderr);
        assert_eq!(r.code, Some(2), "--device {device}: {}", r.explain());
        assert!(
            text.contains(&format!("tchrun-worker: error: {REFUSAL}")) && text.contains(HINT),
            "--device {device}: {}",
            r.explain()
        );
        assert!(
            !text.contains("process group ready") && !logs.join("70_driver_log_0").exists(),
            "refused before the driver log and the group: {}",
            r.explain()
        );
    }
}

#[test]
fn worker_fake_device_count_never_touches_cuda_and_junk_is_refused() {
    // A count that passes the check on a machine without CUDA: a clean refusal naming the
    // variable, not a CUDA error from deep inside libtorch.
    if !has_gpu() {
        let r = run(
            worker()
                .args(["selftest", "--device", "cuda", "--log-dir"])
                .arg(tempdir().path())
                .env(FAKE, "1"),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr.contains(
                "TCHRUN_TEST_CUDA_DEVICES=1 claims CUDA devices but CUDA is not available"
            ),
            "{}",
            r.explain()
        );
    }
    let r = run(
        worker()
            .args(["selftest", "--device", "cuda", "--log-dir"])
            .arg(tempdir().path())
            .env(FAKE, "two"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("TCHRUN_TEST_CUDA_DEVICES=\"two\""),
        "{}",
        r.explain()
    );
    // --device cpu never counts GPUs.
    let r = run(
        worker()
            .args([
                "selftest",
                "--device",
                "cpu",
                "--sizes",
                "4096",
                "--iters",
                "1",
                "--log-dir",
            ])
            .arg(tempdir().path())
            .env(FAKE, "two"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

#[test]
fn launcher_refuses_more_ranks_than_gpus_before_any_rank_starts() {
    let t = tempdir();
    let logs = t.path().join("logs");
    for (launcher, device) in [("mpirun", "cuda"), ("local", "auto"), ("mpirun", "auto")] {
        let r = run(
            tchrun()
                .args([
                    "selftest",
                    "--launcher",
                    launcher,
                    "--device",
                    device,
                    "--procs-per-node",
                    "2",
                    "--log-dir",
                ])
                .arg(&logs)
                .env(FAKE, "1"),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{launcher} {device}: {}", r.explain());
        assert!(
            r.stderr.contains(&format!("tchrun: error: {REFUSAL}")) && r.stderr.contains(HINT),
            "{launcher} {device}: {}",
            r.explain()
        );
        assert!(!logs.exists(), "nothing may start: {}", r.explain());
    }
    // --device cpu is never checked against GPUs.
    let r = run(
        tchrun()
            .args([
                "selftest",
                "--device",
                "cpu",
                "--procs-per-node",
                "2",
                "--dry-run",
            ])
            .env(FAKE, "1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    // No GPU at all: --device cuda is refused by name.
    let r = run(
        tchrun()
            .args(["selftest", "--device", "cuda", "--dry-run"])
            .env(FAKE, "0"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--device cuda: no GPU is visible on"),
        "{}",
        r.explain()
    );
    // `tchrun score` (one local process) is checked before the worker starts; its model and
    // images need not exist for that.
    let r = run(
        tchrun()
            .args(["score", "--device", "cuda", "--model"])
            .arg(t.path().join("no-model"))
            .arg("--images")
            .arg(t.path())
            .arg("--output")
            .arg(t.path().join("s.csv"))
            .env(FAKE, "0"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--device cuda: no GPU is visible on"),
        "{}",
        r.explain()
    );
    // `tchrun exec` runs a user's program, whose device is its own: a note, not a refusal.
    let r = run(
        tchrun()
            .args(["exec", "--procs-per-node", "2", "--log-dir"])
            .arg(t.path().join("exec-logs"))
            .args(["--", "true"])
            .env(FAKE, "1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stderr
            .contains("note: --procs-per-node 2 is more than the 1 GPU(s) visible on"),
        "{}",
        r.explain()
    );
}

#[test]
fn launcher_refuses_train_with_auto_device_before_writing_output() {
    let t = tempdir();
    let data = small_digits();
    let model = model_dir(t.path(), "resnet18", 32);
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &data.join("train"), &data.join("valid"), &out)
            .args(["--procs-per-node", "2"])
            .env(FAKE, "1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains(&format!("tchrun: error: {REFUSAL}")),
        "{}",
        r.explain()
    );
    assert!(
        !out.exists(),
        "nothing written to --output: {}",
        r.explain()
    );
}

#[test]
fn launcher_with_hostfile_leaves_the_gpu_check_to_each_rank() {
    let t = tempdir();
    let hf = t.path().join("hosts");
    std::fs::write(&hf, "localhost slots=2\n").expect("hostfile");
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .args([
                "selftest",
                "--device",
                "cuda",
                "--procs-per-node",
                "2",
                "--hostfile",
            ])
            .arg(&hf)
            .arg("--log-dir")
            .arg(&logs)
            .env(FAKE, "1"),
        LIMIT,
    );
    // The launcher does not judge the hosts' GPUs by its own...
    assert!(
        r.stderr.contains(
            "tchrun: note: the ranks start on the hosts of --hostfile, whose GPUs this host cannot see"
        ) && !r.stderr.contains(&format!("tchrun: error: {REFUSAL}")),
        "{}",
        r.explain()
    );
    // ...each rank refuses on its own node (TCHRUN_* variables reach the ranks), exit 2.
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains(&format!("tchrun-worker: error: {REFUSAL}")) && text.contains(HINT),
        "{}",
        r.explain()
    );
    assert!(
        r.stderr.contains("the ranks refused the input"),
        "{}",
        r.explain()
    );
    let mpi_log = read(&logs.join("70_mpi_log"));
    assert!(mpi_log.contains(REFUSAL), "{mpi_log}");
}

/// Issue 17, item 8: `tchrun exec --device` takes the GPU pre-flight train has. With cuda or
/// auto, more ranks on this host than its GPUs is refused before any rank starts (a user's GPU
/// script at 8 ranks per node on fewer GPUs is the same mistake); cpu is never checked; without
/// `--device` it stays a note (the test above). Where the launcher cannot see the ranks' GPUs
/// (a hostfile), each rank's `tchrun-worker exec --device` refuses on its own node.
#[test]
fn exec_with_device_refuses_more_ranks_than_gpus() {
    let t = tempdir();
    for (launcher, device) in [("local", "cuda"), ("mpirun", "auto"), ("local", "auto")] {
        let logs = t.path().join(format!("logs-{launcher}-{device}"));
        let r = run(
            tchrun()
                .args([
                    "exec",
                    "--launcher",
                    launcher,
                    "--device",
                    device,
                    "--procs-per-node",
                    "2",
                    "--log-dir",
                ])
                .arg(&logs)
                .args(["--", "true"])
                .env(FAKE, "1"),
            LIMIT,
        );
        assert_eq!(r.code, Some(2), "{launcher} {device}: {}", r.explain());
        assert!(
            r.stderr.contains(&format!("tchrun: error: {REFUSAL}")) && r.stderr.contains(HINT),
            "{launcher} {device}: {}",
            r.explain()
        );
        assert!(!logs.exists(), "nothing may start: {}", r.explain());
    }
    // The flag's variable works like every TCHRUN_<FLAG>.
    let r = run(
        tchrun()
            .args(["exec", "--procs-per-node", "2", "--dry-run", "--", "true"])
            .env("TCHRUN_DEVICE", "cuda")
            .env(FAKE, "1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains(REFUSAL), "{}", r.explain());
    // No GPU at all: --device cuda is refused by name; cpu is never checked.
    let r = run(
        tchrun()
            .args(["exec", "--device", "cuda", "--dry-run", "--", "true"])
            .env(FAKE, "0"),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--device cuda: no GPU is visible on"),
        "{}",
        r.explain()
    );
    let r = run(
        tchrun()
            .args([
                "exec",
                "--device",
                "cpu",
                "--procs-per-node",
                "2",
                "--log-dir",
            ])
            .arg(t.path().join("cpu-logs"))
            .args(["--", "true"])
            .env(FAKE, "1"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!r.stderr.contains("GPU(s) visible"), "{}", r.explain());
    // Ranks started elsewhere: the launcher says so, each rank refuses on its own node.
    let hf = t.path().join("hosts");
    std::fs::write(&hf, "localhost slots=2\n").expect("hostfile");
    let logs = t.path().join("hostfile-logs");
    let r = run(
        tchrun()
            .args([
                "exec",
                "--device",
                "cuda",
                "--procs-per-node",
                "2",
                "--hostfile",
            ])
            .arg(&hf)
            .arg("--log-dir")
            .arg(&logs)
            .args(["--", "true"])
            .env(FAKE, "1"),
        LIMIT,
    );
    assert!(
        r.stderr.contains(
            "tchrun: note: the ranks start on the hosts of --hostfile, whose GPUs this host cannot see"
        ),
        "{}",
        r.explain()
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    let text = format!("{}{}", r.stdout, r.stderr);
    assert!(
        text.contains(&format!("tchrun-worker: error: {REFUSAL}")) && text.contains(HINT),
        "{}",
        r.explain()
    );
}
