//! Issue 51: nobody joins a job who does not belong. A stranger (another user on rank 0's
//! host, `tests/python/stranger.py`; both in a network namespace of the test's own, so that
//! nobody else's ports are attacked) attacks every port the job opens, from before it starts
//! until it ends: a real c10d client without the secret never joins the store, the job's
//! model equals an unattacked run's bit for bit, a forged `scores.csv` row never lands, and
//! the job's secret is in no process's argv and no file under the log and output dirs.
mod common;
use common::stranger::Stranger;
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(300);

/// A network namespace of the test's own (loopback only): the attacked job and the stranger
/// run in it, so that the stranger sees and attacks the job's ports and nobody else's on a
/// shared machine. Removed on drop.
struct Netns(String);

impl Netns {
    fn new() -> Netns {
        static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let name = format!("tchrun-sec-{}-{n}", std::process::id());
        for args in [
            vec!["netns", "add", &name],
            vec!["netns", "exec", &name, "ip", "link", "set", "lo", "up"],
        ] {
            let r = run(Command::new("ip").args(&args), Duration::from_secs(10));
            assert_eq!(r.code, Some(0), "{}", r.explain());
        }
        Netns(name)
    }

    /// `cmd` run inside the namespace, with its environment.
    fn wrap(&self, cmd: &Command) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.0])
            .arg(cmd.get_program())
            .args(cmd.get_args());
        for (k, v) in cmd.get_envs() {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// The job's secret, read from a rank's environment while the job runs, and every process's
/// argv seen meanwhile.
fn watch_for_secret(job: &mut Job) -> (Option<String>, Vec<String>, Option<i32>) {
    let mut secret = None;
    let mut argvs = Vec::new();
    let start = Instant::now();
    loop {
        if let Some(code) = job.wait(Duration::from_millis(200)) {
            return (secret, argvs, Some(code));
        }
        if start.elapsed() > LIMIT {
            return (secret, argvs, None);
        }
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            if let Ok(cmd) = std::fs::read(e.path().join("cmdline")) {
                argvs.push(String::from_utf8_lossy(&cmd).replace('\0', " "));
            }
            let Ok(env) = std::fs::read(e.path().join("environ")) else {
                continue;
            };
            for var in env.split(|&b| b == 0) {
                let var = String::from_utf8_lossy(var);
                if let Some(v) = var.strip_prefix("TCHRUN_JOB_SECRET=") {
                    if secret.is_none() && var.len() > 20 {
                        secret = Some(v.to_string());
                    }
                }
            }
        }
        argvs.sort();
        argvs.dedup();
    }
}

/// Every file under `dir` that holds `needle` (its text or, for the secret, its 32 bytes).
fn files_holding(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let raw: Vec<u8> = (0..needle.len() / 2)
        .filter_map(|i| u8::from_str_radix(&needle[2 * i..2 * i + 2], 16).ok())
        .collect();
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if let Ok(b) = std::fs::read(&p) {
                let has = |n: &[u8]| !n.is_empty() && b.windows(n.len()).any(|w| w == n);
                if has(needle.as_bytes()) || has(&raw) {
                    found.push(p);
                }
            }
        }
    }
    found
}

fn train(model: &Path, out: &Path) -> Command {
    let d = small_digits();
    let mut c = tchrun_train(model, &d.join("train"), &d.join("valid"), out);
    c.args([
        "--launcher",
        "local",
        "--procs-per-node",
        "2",
        "--epochs",
        "1",
    ])
    .args(["--batch-size", "20", "--threads", "1"])
    .env_remove("TCHRUN_THREADS")
    .env_remove("TCHRUN_ATTEMPT")
    .env_remove("TCHRUN_JOB_SECRET");
    c
}

/// The stranger attacks every new port of a 2-rank training job from before it starts until
/// it ends: never joins the store (refused, logged with its address), and the model is the
/// unattacked run's bit for bit; the secret (from a rank's environment) is in no argv and no
/// file under the output and log directories.
#[test]
fn a_stranger_neither_joins_nor_harms_a_training_job() {
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let (calm, attacked) = (t.path().join("calm"), t.path().join("attacked"));
    let r = run(&mut train(&model, &calm), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail("the stranger runs as another user in a namespace of its own: needs root");
        return;
    }
    let ns = Netns::new();
    let Some(stranger) = Stranger::start(t.path(), &ns.0, None, None) else {
        return;
    };
    let mut job = Job::start(&mut ns.wrap(&train(&model, &attacked)), t.path());
    let (secret, argvs, code) = watch_for_secret(&mut job);
    let (tries, ports) = stranger.stop();
    assert_eq!(code, Some(0), "{}", job.output());
    let joined: Vec<_> = tries.iter().filter(|r| r["joined"] == true).collect();
    assert!(joined.is_empty(), "a stranger joined the store: {joined:?}");
    let log0 = read(&attacked.join("logs/70_driver_log_0"));
    let front = log0
        .split("master=")
        .nth(1)
        .and_then(|s| s.split([' ', '\n']).next())
        .and_then(|m| m.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u64>().ok())
        .expect("rank 0's driver log names the store's address");
    assert!(
        ports.contains(&front) && tries.iter().any(|r| r["port"] == front),
        "the stranger never tried the front ({front}): {ports:?} {tries:?}"
    );
    assert!(
        log0.contains("rendezvous: refused an unauthenticated connection from 127.0.0.1:"),
        "{log0}"
    );
    let read_model = |o: &Path| std::fs::read(o.join("model.safetensors")).expect("model");
    assert!(
        read_model(&calm) == read_model(&attacked),
        "the attacked run's model differs from the unattacked run's"
    );
    let secret = secret.expect("a rank's environment holds TCHRUN_JOB_SECRET");
    assert_eq!(secret.len(), 64, "{secret}");
    let in_argv: Vec<_> = argvs.iter().filter(|a| a.contains(&secret)).collect();
    assert!(in_argv.is_empty(), "the secret is in an argv: {in_argv:?}");
    let in_files = files_holding(&attacked, &secret);
    assert!(in_files.is_empty(), "the secret is in {in_files:?}");
    assert!(!read(&job.out).contains(&secret) && !read(&job.err).contains(&secret));
}

/// The forged-scores attack: a c10d client that sets `tchrun/inference/rows/1` while
/// a 2-rank `tchrun score` runs. It cannot join, and the CSV is the unattacked run's.
#[test]
fn a_forged_score_row_never_lands() {
    let t = tempdir();
    let untrained = model_dir(t.path(), "resnet18", 32);
    let model = t.path().join("trained");
    let r = run(&mut train(&untrained, &model), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let images = subset(
        &small_digits().join("valid"),
        &t.path().join("images"),
        4,
        0,
    );
    let score = |csv: &Path| {
        let mut c = tchrun();
        c.arg("score")
            .arg("--model")
            .arg(&model)
            .arg("--images")
            .arg(&images)
            .arg("--output")
            .arg(csv)
            .args([
                "--batch-size",
                "8",
                "--procs-per-node",
                "2",
                "--launcher",
                "local",
            ])
            .env_remove("TCHRUN_JOB_SECRET");
        c
    };
    let (calm, forged) = (t.path().join("calm.csv"), t.path().join("forged.csv"));
    let r = run(&mut score(&calm), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail("the stranger runs as another user in a namespace of its own: needs root");
        return;
    }
    let ns = Netns::new();
    let forge = Some(("tchrun/inference/rows/1", "forged"));
    let Some(stranger) = Stranger::start(t.path(), &ns.0, forge, None) else {
        return;
    };
    let r = run(&mut ns.wrap(&score(&forged)), LIMIT);
    let (tries, _) = stranger.stop();
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        tries.iter().all(|r| r["joined"] == false) && !tries.is_empty(),
        "{tries:?}"
    );
    assert_eq!(
        read(&calm),
        read(&forged),
        "the scores differ from the unattacked run's"
    );
}

/// A log directory others can write (mode 0777), with `70_mpi_log` planted as a link to a
/// file of someone else's: tchrun warns naming owner and mode, and the link is not followed
/// (the file keeps its bytes and mode; the job stops naming the log it cannot write).
#[test]
fn a_link_planted_in_a_shared_log_directory_is_not_followed() {
    use std::os::unix::fs::PermissionsExt;
    let t = tempdir();
    let logs = t.path().join("shared");
    std::fs::create_dir(&logs).expect("mkdir");
    std::fs::set_permissions(&logs, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let victim = t.path().join("precious");
    std::fs::write(&victim, "precious\n").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    std::os::unix::fs::symlink(&victim, logs.join("70_mpi_log")).expect("plant the link");
    let r = run(
        tchrun()
            .args(["selftest", "--launcher", "local", "--procs-per-node", "1"])
            .args(["--sizes", "4096", "--iters", "1", "--log-dir"])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(read(&victim), "precious\n", "{}", r.explain());
    let mode = std::fs::metadata(&victim)
        .expect("victim")
        .permissions()
        .mode()
        & 0o7777;
    assert_eq!(mode, 0o600, "{}", r.explain());
    assert!(
        r.stderr.contains("is writable by other users (owner uid")
            && r.stderr.contains("mode 0777"),
        "{}",
        r.explain()
    );
    assert_ne!(r.code, Some(0), "{}", r.explain());
    assert!(r.stderr.contains("70_mpi_log"), "{}", r.explain());
}

/// The hostile tester's Open MPI ports (issue 51 item 3): the ranks of a one-node `mpirun`
/// job listened on every interface through MPI's TCP transport (`0.0.0.0:1024`, `[::]:1025`),
/// where a stranger's random bytes kept a finished rank from leaving. Now they reach each
/// other through shared memory and listen on loopback only (the store, its front and relays);
/// mpirun's own out-of-band listener is Open MPI's (SECURITY.md). Watched with `ss` every
/// 20 ms in a namespace of the test's own, from before the ranks start until the job ends.
#[test]
fn the_ranks_of_a_one_node_mpirun_job_listen_on_loopback_only() {
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail("a network namespace of the test's own: needs root");
        return;
    }
    let t = tempdir();
    let ns = Netns::new();
    let mut job = tchrun();
    job.args(["selftest", "--launcher", "mpirun", "--procs-per-node", "2"])
        .arg("--log-dir")
        .arg(t.path().join("logs"));
    let mut job = ns.wrap(&job);
    let runner = std::thread::spawn(move || run(&mut job, LIMIT));
    let mut seen = std::collections::BTreeSet::new();
    let start = Instant::now();
    while !runner.is_finished() && start.elapsed() < LIMIT {
        let listing = Command::new("ip")
            .args(["netns", "exec", &ns.0, "ss", "-ltnpH"])
            .output()
            .expect("ss (iproute2)");
        for line in String::from_utf8_lossy(&listing.stdout).lines() {
            if let (true, Some(local)) = (
                line.contains("\"tchrun-worker\""),
                line.split_whitespace().nth(3),
            ) {
                let host = local.rsplit_once(':').map_or(local, |(h, _)| h);
                seen.insert(host.to_string());
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let r = runner.join().expect("the job's thread");
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(!seen.is_empty(), "the watch never saw a rank listen");
    let wild: Vec<_> = seen.iter().filter(|h| !h.starts_with("127.")).collect();
    assert!(
        wild.is_empty(),
        "the ranks listened on {wild:?} (all seen: {seen:?})"
    );
}
