//! Helpers of the integration tests: the real binaries, bounded runs, temp dirs.
#![allow(dead_code)]
pub mod netns;
pub mod slurm;
pub mod stats;
pub mod stranger;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// Directory of the built binaries (`target/release` when the tests run from there).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    // target/<profile>/deps/<test> -> target/<profile>
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf();
    assert!(
        dir.join("tchrun").is_file() && dir.join("tchrun-worker").is_file(),
        "build the binaries first: cargo build --release (looked in {})",
        dir.display()
    );
    dir
}

pub fn tchrun() -> Command {
    let mut c = Command::new(bin_dir().join("tchrun"));
    c.env("RUST_BACKTRACE", "0");
    c
}

/// `tchrun train --model M --train T --valid V --output O`; each test adds its own flags.
pub fn tchrun_train(model: &Path, train: &Path, valid: &Path, out: &Path) -> Command {
    let mut c = tchrun();
    c.arg("train")
        .arg("--model")
        .arg(model)
        .arg("--train")
        .arg(train)
        .arg("--valid")
        .arg(valid)
        .arg("--output")
        .arg(out);
    c
}

/// A `--resume` run completed: exit 0, it said so, and `out` holds the trained model.
pub fn assert_resumed(r: &Run, out: &Path) {
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("resuming from") && out.join("model.json").is_file(),
        "{}",
        r.explain()
    );
}

pub fn worker_path() -> PathBuf {
    bin_dir().join("tchrun-worker")
}

pub fn worker() -> Command {
    Command::new(worker_path())
}

/// `mpirun` with what running as root on a small machine needs.
pub fn mpirun(np: usize) -> Command {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "--bind-to",
        "none",
        "-np",
        &np.to_string(),
    ]);
    c
}

/// The result of a bounded run.
pub struct Run {
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
    pub what: String,
}

impl Run {
    /// Everything a failing assertion should show.
    pub fn explain(&self) -> String {
        format!(
            "command: {}\nexit: {:?} after {:.1}s\n--- stdout\n{}\n--- stderr\n{}",
            self.what,
            self.code,
            self.elapsed.as_secs_f64(),
            self.stdout,
            self.stderr
        )
    }
}

/// Runs `cmd` to its end or kills it (and its process group) after `limit`.
pub fn run(cmd: &mut Command, limit: Duration) -> Run {
    use std::os::unix::process::CommandExt;
    let what = format!("{cmd:?}");
    cmd.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
    let pid = child.id() as i32;
    let out = child.stdout.take().expect("stdout");
    let err = child.stderr.take().expect("stderr");
    let to = std::thread::spawn(move || std::io::read_to_string(out).unwrap_or_default());
    let te = std::thread::spawn(move || std::io::read_to_string(err).unwrap_or_default());
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if start.elapsed() > limit {
            unsafe { libc_kill(-pid, 9) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let elapsed = start.elapsed();
    let stdout = to.join().unwrap_or_default();
    let stderr = te.join().unwrap_or_default();
    let code = status.and_then(|s| s.code());
    assert!(
        status.is_some(),
        "timed out after {limit:?}: {what}\n--- stdout\n{stdout}\n--- stderr\n{stderr}"
    );
    Run {
        code,
        stdout,
        stderr,
        elapsed,
        what,
    }
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}

pub fn output_text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn tempdir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("tchrun-test-")
        .tempdir()
        .expect("tempdir")
}

pub fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()))
}

/// A free TCP port on loopback.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port()
}

/// Asserts the driver logs 0..n exist with their header and returns their texts.
pub fn driver_logs(dir: &Path, n: usize) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().to_string())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    let logs: Vec<String> = (0..n)
        .map(|r| {
            let p = dir.join(format!("70_driver_log_{r}"));
            assert!(p.is_file(), "missing {} (dir has {names:?})", p.display());
            read(&p)
        })
        .collect();
    assert!(
        !dir.join(format!("70_driver_log_{n}")).exists(),
        "more driver logs than ranks: {names:?}"
    );
    for (r, text) in logs.iter().enumerate() {
        for field in [
            "host: ",
            &format!("rank: {r}\n"),
            "local_rank: ",
            &format!("world_size: {n}\n"),
            "pid: ",
            "device: ",
            "backend: ",
            "tchrun: ",
            "torch: 2.11.0",
        ] {
            assert!(
                text.contains(field),
                "driver log {r} lacks '{field}':\n{text}"
            );
        }
    }
    logs
}

/// The venv's Python (made by scripts/setup.sh).
pub fn python() -> Command {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    Command::new(root.join(".venv/bin/python"))
}

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The digits dataset (train/ and valid/), generated once per test binary.
pub fn digits() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("tchrun-digits-{}", std::process::id()));
        let r = run(
            python()
                .arg(repo().join("scripts/make_digits.py"))
                .arg(&dir),
            Duration::from_secs(120),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        dir
    })
    .clone()
}

/// An untrained model directory.
pub fn model_dir(parent: &Path, arch: &str, size: u32) -> PathBuf {
    let m = parent.join(format!("{arch}-{size}"));
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                arch,
                "--input-size",
                &size.to_string(),
                "--output",
            ])
            .arg(&m),
        Duration::from_secs(30),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    m
}

/// `tchrun model init --arch ARCH --input-size 32 --weights WEIGHTS --output OUT`.
pub fn init_with_weights(arch: &str, weights: &Path, out: &Path) -> Command {
    let mut c = tchrun();
    c.args([
        "model",
        "init",
        "--arch",
        arch,
        "--input-size",
        "32",
        "--weights",
    ])
    .arg(weights)
    .arg("--output")
    .arg(out);
    c
}

/// A copy of the digits split `src` with the first `per_class` images of each class, the
/// labels shifted by `shift` classes (0: unchanged).
pub fn subset(src: &Path, dst: &Path, per_class: usize, shift: usize) -> PathBuf {
    for c in 0..10 {
        let to = dst.join(((c + shift) % 10).to_string());
        std::fs::create_dir_all(&to).expect("mkdir");
        let mut files: Vec<PathBuf> = std::fs::read_dir(src.join(c.to_string()))
            .expect("class dir")
            .flatten()
            .map(|e| e.path())
            .collect();
        files.sort();
        assert!(
            files.len() >= per_class,
            "digits class {c} has fewer than {per_class} images"
        );
        for f in files.into_iter().take(per_class) {
            std::fs::copy(&f, to.join(f.file_name().expect("name"))).expect("copy");
        }
    }
    dst.to_path_buf()
}

/// A small digits subset (40 train and 10 valid images per class), made once per test binary.
pub fn small_digits() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let src = digits();
        let dst = std::env::temp_dir().join(format!("tchrun-small-digits-{}", std::process::id()));
        subset(&src.join("train"), &dst.join("train"), 40, 0);
        subset(&src.join("valid"), &dst.join("valid"), 10, 0);
        dst
    })
    .clone()
}

/// One epoch of the small digits on 2 ranks (`launcher`), with `--console SELECTION` when
/// given; rank 1 warns once (`TCHRUN_TEST_STALL_AT_STEP`: 0.2 s before step 3), rank 0 does
/// not. The console tests (`console.rs`, `snapshots.rs`) run it.
pub fn two_rank_console_job(
    model: &Path,
    out: &Path,
    launcher: &str,
    selection: Option<&str>,
) -> Command {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    c.args([
        "--procs-per-node",
        "2",
        "--launcher",
        launcher,
        "--epochs",
        "1",
    ])
    .args(["--batch-size", "20", "--lr", "0.05", "--print-freq", "5"])
    .env(tchrun::env::TCHRUN_TEST_STALL_AT_STEP, "1:3:0.2")
    .env_remove("TCHRUN_CONSOLE");
    if let Some(s) = selection {
        c.args(["--console", s]);
    }
    c
}

/// The lines of the ranks in a console's text (the launcher's own `tchrun:` lines and their
/// indented continuations left out).
pub fn rank_lines(text: &str) -> Vec<&str> {
    text.lines()
        .filter(|l| !l.starts_with("tchrun:") && !l.starts_with(' ') && !l.is_empty())
        .collect()
}

/// The host the ranks of a local job name in their console prefix (`<host>:<rank> `), from
/// rank 0's training line.
pub fn console_host(stdout: &str) -> String {
    stdout
        .lines()
        .find_map(|l| l.split_once(":0 training ").map(|(h, _)| h.to_string()))
        .unwrap_or_else(|| panic!("no rank 0 training line in:\n{stdout}"))
}

/// Processes whose command line contains `needle` (other than this test process).
pub fn processes_with(needle: &str) -> Vec<String> {
    let me = std::process::id().to_string();
    std::fs::read_dir("/proc")
        .map(|rd| {
            rd.flatten()
                .filter(|e| e.file_name().to_string_lossy() != me)
                .filter_map(|e| {
                    let cmd = std::fs::read(e.path().join("cmdline")).ok()?;
                    let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
                    cmd.contains(needle)
                        .then(|| format!("{}: {cmd}", e.file_name().to_string_lossy()))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Polls `cond` every 50 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = Instant::now();
    while start.elapsed() < limit {
        if cond() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    cond()
}

/// Every floating-point value of a safetensors file (the model a run wrote) is finite; the
/// first tensor holding a NaN or an infinity otherwise.
pub fn all_weights_finite(path: &Path) -> Result<usize, String> {
    use safetensors::{Dtype, SafeTensors};
    let bytes = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let st = SafeTensors::deserialize(&bytes).map_err(|e| format!("{}: {e:?}", path.display()))?;
    let mut n = 0;
    for (name, view) in st.tensors() {
        let finite = match view.dtype() {
            Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .all(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]).is_finite()),
            Dtype::F64 => view.data().chunks_exact(8).all(|b| {
                let mut a = [0u8; 8];
                a.copy_from_slice(b);
                f64::from_le_bytes(a).is_finite()
            }),
            _ => true,
        };
        if !finite {
            return Err(format!("{name} holds a NaN or an infinity"));
        }
        n += 1;
    }
    Ok(n)
}

/// The rows of a `metrics.jsonl`.
pub fn metrics_rows(out: &Path) -> Vec<serde_json::Value> {
    read(&out.join("metrics.jsonl"))
        .lines()
        .map(|l| serde_json::from_str(l).expect("metrics.jsonl rows are JSON"))
        .collect()
}

/// A test that cannot get a privilege it needs (root, network namespaces, a tmpfs, another
/// user): under `TCHRUN_REQUIRE_PRIVILEGED=1` (set by `.ci/run`, which runs as root) that is a
/// failure, so CI cannot pass by skipping; elsewhere it prints `SKIP: why` and the test returns.
pub fn skip_or_fail(why: &str) {
    assert!(
        std::env::var("TCHRUN_REQUIRE_PRIVILEGED").as_deref() != Ok("1"),
        "TCHRUN_REQUIRE_PRIVILEGED=1, but this test lacks a privilege it needs: {why}"
    );
    eprintln!("SKIP: {why}");
}

/// A job running in the background with its output in files.
pub struct Job {
    pub child: Option<std::process::Child>,
    pub out: PathBuf,
    pub err: PathBuf,
}

impl Job {
    pub fn start(cmd: &mut Command, dir: &Path) -> Job {
        use std::os::unix::process::CommandExt;
        let (out, err) = (dir.join("tchrun.out"), dir.join("tchrun.err"));
        cmd.stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).expect("stdout file"))
            .stderr(std::fs::File::create(&err).expect("stderr file"))
            .process_group(0);
        Job {
            child: Some(cmd.spawn().expect("start tchrun")),
            out,
            err,
        }
    }
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.as_ref().map(|c| c.id() as i32).unwrap_or(0))
    }
    pub fn wait(&mut self, limit: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let start = Instant::now();
        loop {
            if let Ok(Some(s)) = child.try_wait() {
                self.child = None;
                return s.code();
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    pub fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            read(&self.out),
            read(&self.err)
        )
    }
}

impl Drop for Job {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGKILL,
            );
            let _ = c.wait();
        }
    }
}

/// A sparse safetensors file with `arch`'s torchvision tensors for `classes` classes: a real
/// header, zero data (no write of the megabytes).
pub fn sparse_weights(path: &Path, arch: tchrun::model::Arch, classes: usize) {
    let mut header = serde_json::Map::new();
    let mut offset = 0usize;
    for (name, shape) in tchrun::weights::spec(arch, classes) {
        let (dtype, size) = if name.ends_with("num_batches_tracked") {
            ("I64", 8)
        } else {
            ("F32", 4)
        };
        let len = size * shape.iter().product::<usize>();
        header.insert(
            name,
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let mut text = serde_json::Value::Object(header).to_string();
    while !text.len().is_multiple_of(8) {
        text.push(' ');
    }
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend(text.as_bytes());
    std::fs::write(path, &bytes).expect("write weights");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(path)
        .expect("open");
    f.set_len((bytes.len() + offset) as u64).expect("set_len");
}

/// A tmpfs mounted for the test, unmounted on drop.
pub struct Mount(pub PathBuf);

impl Mount {
    pub fn new(dir: &Path, opts: &str) -> Option<Mount> {
        std::fs::create_dir_all(dir).expect("mkdir");
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", opts, "tmpfs"])
            .arg(dir)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            skip_or_fail("cannot mount a tmpfs here (needs root)");
            return None;
        }
        Some(Mount(dir.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A directory holding an `nvidia-smi` that prints `out` and exits `code` (a machine with or
/// without GPUs, as the GPU scripts see it).
pub fn fake_smi(dir: &Path, out: &str, code: i32) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let bin = dir.join("bin");
    std::fs::create_dir_all(&bin).expect("mkdir");
    let smi = bin.join("nvidia-smi");
    std::fs::write(
        &smi,
        format!("#!/bin/sh\nprintf '%s\\n' '{out}'\nexit {code}\n"),
    )
    .expect("fake nvidia-smi");
    std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    bin
}

/// `PATH` with `bin` first.
pub fn path_with(bin: &Path) -> String {
    format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    )
}

/// A GPU script's no-GPU answer: exit 77 with its words, at once, and `out` never made.
pub fn assert_no_gpu_answer(r: &Run, out: &Path) {
    assert_eq!(r.code, Some(77), "{}", r.explain());
    assert!(
        r.stdout
            .contains("gpu-check: no NVIDIA GPU on this machine")
            && r.stdout.contains("nothing was run"),
        "{}",
        r.explain()
    );
    assert!(
        r.elapsed < Duration::from_secs(10),
        "the no-GPU answer must come at once: {:?}",
        r.elapsed
    );
    assert!(
        !out.exists(),
        "no work before the GPU test: {}",
        r.explain()
    );
}

/// Whether `tchrun` printed the main-thread stack group that holds `rank` marked at fault
/// ("rank 1 (...)" alone, or "ranks 0-3 (...)" when a stopped rank waiting in the collective
/// too has the others' stack: identical stacks are one group).
pub fn culprit_stack_shown(err: &str, rank: usize) -> bool {
    err.lines()
        .filter_map(|l| l.trim().strip_suffix(" (tchrun-worker thread, at fault):"))
        .filter_map(|head| head.split_once(' ').map(|(_, list)| list))
        .any(|list| {
            list.split(',').any(|part| match part.split_once('-') {
                Some((a, b)) => a
                    .parse()
                    .ok()
                    .zip(b.parse().ok())
                    .is_some_and(|(a, b): (usize, usize)| (a..=b).contains(&rank)),
                None => part.parse::<usize>().ok() == Some(rank),
            })
        })
}

/// Every tensor of `model.safetensors` as f32 values, by name.
pub fn tensors(out: &Path) -> Vec<(String, Vec<f32>)> {
    let bytes = std::fs::read(out.join("model.safetensors")).expect("model.safetensors");
    let st = safetensors::SafeTensors::deserialize(&bytes).expect("safetensors");
    let mut v: Vec<(String, Vec<f32>)> = st
        .tensors()
        .into_iter()
        .filter(|(_, t)| t.dtype() == safetensors::Dtype::F32)
        .map(|(n, t)| {
            let vals = t
                .data()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            (n, vals)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The largest absolute difference over every tensor (and the tensor it is in).
pub fn max_diff(a: &Path, b: &Path) -> (f32, String) {
    let (ta, tb) = (tensors(a), tensors(b));
    assert_eq!(ta.len(), tb.len());
    assert!(!ta.is_empty());
    let mut worst = (0.0f32, String::new());
    for ((na, va), (nb, vb)) in ta.iter().zip(&tb) {
        assert_eq!(na, nb);
        assert_eq!(va.len(), vb.len(), "{na}");
        for (x, y) in va.iter().zip(vb) {
            let d = (x - y).abs();
            assert!(d.is_finite(), "{na}: {x} vs {y}");
            if d > worst.0 {
                worst = (d, na.clone());
            }
        }
    }
    worst
}
