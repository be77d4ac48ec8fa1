//! Cluster tests on one machine: several "nodes" as network namespaces reached by mpirun through
//! an rsh agent (scripts/netns-nodes.sh, scripts/netns-rsh.sh), and a real single-node Slurm
//! (scripts/slurm-cluster.sh): srun inside salloc, `tchrun sbatch --submit` training to the end,
//! USR1 → graceful stop and requeue, `scancel` stopping every rank. Needs root (namespaces,
//! munged as the munge user); without it each test says SKIP and returns (and fails under
//! `TCHRUN_REQUIRE_PRIVILEGED=1`, as in CI). Every daemon,
//! namespace and /etc/hosts line a test makes is removed by a guard, also when it fails.
mod common;
use common::netns::Nodes;
use common::slurm::{field, Slurm};
use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(120);
const TRAIN_FLAGS: &[&str] = &[
    "--batch-size",
    "32",
    "--lr",
    "0.025",
    "--min-crop-scale",
    "0.5",
    "--no-hflip",
];

fn root_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn script(name: &str) -> PathBuf {
    root_dir().join("scripts").join(name)
}

/// The digits dataset, made once and kept beside the binaries (deterministic).
fn digits() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = bin_dir().join("test-data").join("digits-32");
        if dir.join(".complete").is_file() {
            return dir;
        }
        let tmp = bin_dir()
            .join("test-data")
            .join(format!("digits-32.tmp{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        let r = run(
            Command::new(root_dir().join(".venv/bin/python"))
                .arg(script("make_digits.py"))
                .arg(&tmp),
            LIMIT,
        );
        assert_eq!(
            r.code,
            Some(0),
            "run scripts/setup.sh first\n{}",
            r.explain()
        );
        std::fs::write(tmp.join(".complete"), "").expect("stamp");
        let _ = std::fs::remove_dir_all(&dir);
        if std::fs::rename(&tmp, &dir).is_err() {
            let _ = std::fs::remove_dir_all(&tmp); // another test binary made it first
        }
        dir
    })
    .clone()
}

fn model_init(dir: &Path) -> PathBuf {
    let m = dir.join("model");
    let r = run(
        tchrun()
            .args([
                "model",
                "init",
                "--arch",
                "resnet18",
                "--input-size",
                "32",
                "--output",
            ])
            .arg(&m),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    m
}

/// `--model M --train D/train --valid D/valid --output O --epochs E` and the small-run flags.
fn train_args(model: &Path, output: &Path, epochs: u32) -> Vec<String> {
    let d = digits();
    let mut v: Vec<String> = vec![
        format!("--model={}", model.display()),
        format!("--train={}", d.join("train").display()),
        format!("--valid={}", d.join("valid").display()),
        format!("--output={}", output.display()),
        format!("--epochs={epochs}"),
    ];
    v.extend(TRAIN_FLAGS.iter().map(|s| s.to_string()));
    v
}

/// Live processes whose program (argv[0]'s file name) starts with `program` and whose command
/// line contains `needle` (so srun, whose arguments name the worker, is not a rank).
fn processes_with(program: &str, needle: &str) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(raw) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&raw).replace('\0', " ");
        let argv0 = cmd.split_whitespace().next().unwrap_or("");
        let name = argv0.rsplit('/').next().unwrap_or("");
        let zombie = std::fs::read_to_string(e.path().join("stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true);
        if !zombie && name.starts_with(program) && cmd.contains(needle) {
            found.push((pid, cmd));
        }
    }
    found
}

// ---------------------------------------------------------------- network-namespace nodes

/// Checks 4 driver logs of a 2 nodes × 2 ranks job: ranks 0,1 on node 1, ranks 2,3 on node 2,
/// each with its node's address.
fn assert_two_nodes(logs: &Path) {
    let texts = driver_logs(logs, 4);
    let mut seen = Vec::new();
    for (rank, text) in texts.iter().enumerate() {
        let host = field(text, "host: ").unwrap_or_default().to_string();
        let addr = field(text, "local_addr=").unwrap_or_default().to_string();
        let node = rank / 2 + 1;
        assert_eq!(host, format!("tchrun-node{node}"), "rank {rank}:\n{text}");
        assert_eq!(
            addr,
            format!("10.250.0.{}", 10 + node),
            "rank {rank}:\n{text}"
        );
        assert!(
            text.contains(&format!("local_rank: {}\n", rank % 2)),
            "rank {rank}:\n{text}"
        );
        assert!(text.contains("started_by: Mpi"), "rank {rank}:\n{text}");
        seen.push((host, addr));
    }
    eprintln!("ranks → (host, address): {seen:?}");
}

#[test]
fn netns_two_nodes_selftest() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .env("TMPDIR", &ompi)
            .args([
                "selftest",
                "--nodes",
                "2",
                "--procs-per-node",
                "2",
                "--hostfile",
            ])
            .arg(Nodes::hostfile(t.path(), 2, 2))
            .args(["--sizes", "4096", "--iters", "3", "--log-dir"])
            .arg(&logs)
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("selftest: 4 ranks on cpu (gloo)"),
        "{}",
        r.explain()
    );
    assert_two_nodes(&logs);
    eprintln!(
        "2 nodes x 2 ranks selftest: {:.1}s",
        r.elapsed.as_secs_f64()
    );
    let t_path = t.path().display().to_string();
    assert!(
        processes_with("tchrun-worker", &t_path).is_empty(),
        "ranks left"
    );
}

#[test]
fn netns_two_nodes_training() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(t.path());
    let out = t.path().join("out");
    let r = run(
        tchrun()
            .env("TMPDIR", &ompi)
            .arg("train")
            .args(train_args(&model, &out, 1))
            .args(["--nodes", "2", "--procs-per-node", "2", "--hostfile"])
            .arg(Nodes::hostfile(t.path(), 2, 2))
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        Duration::from_secs(240),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    for f in ["model.json", "model.safetensors", "metrics.jsonl"] {
        assert!(
            out.join(f).is_file(),
            "no {f} in {}\n{}",
            out.display(),
            r.explain()
        );
    }
    assert_two_nodes(&out.join("logs"));
    eprintln!(
        "2 nodes x 2 ranks, 1 epoch: {:.1}s",
        r.elapsed.as_secs_f64()
    );
}

/// Runs `ip ARGS` (in a node's namespace with `-n NODE`); panics with its output on failure.
fn ip(args: &[&str]) {
    let r = run(Command::new("ip").args(args), Duration::from_secs(10));
    assert_eq!(r.code, Some(0), "{}", r.explain());
}

/// Gives node `k` an interface `tchrun-d0` (one end of a veth pair inside the node) with
/// `addr`, a network no other node routes. With `first`, it comes before eth0 in the kernel's
/// order (eth0 leaves the namespace and comes back with a higher index), so rank 0 offers its
/// address first.
fn extra_interface(k: usize, addr: &str, first: bool) {
    let ns = format!("tchrun-node{k}");
    let pid = std::process::id().to_string();
    if first {
        ip(&["-n", &ns, "link", "set", "eth0", "down"]);
        ip(&["-n", &ns, "link", "set", "eth0", "name", "tchrun-e1"]);
        ip(&["-n", &ns, "link", "set", "tchrun-e1", "netns", &pid]);
    }
    ip(&["link", "add", "tchrun-d0", "netns", &ns, "type", "veth"]
        .into_iter()
        .chain(["peer", "name", "tchrun-d0p", "netns", &ns])
        .collect::<Vec<_>>());
    ip(&["-n", &ns, "addr", "add", addr, "dev", "tchrun-d0"]);
    ip(&["-n", &ns, "link", "set", "tchrun-d0", "up"]);
    ip(&["-n", &ns, "link", "set", "tchrun-d0p", "up"]);
    if first {
        ip(&["link", "set", "tchrun-e1", "netns", &ns]);
        ip(&["-n", &ns, "link", "set", "tchrun-e1", "name", "eth0"]);
        let own = format!("10.250.0.{}/24", 10 + k);
        ip(&["-n", &ns, "addr", "add", &own, "dev", "eth0"]);
        ip(&["-n", &ns, "link", "set", "eth0", "up"]);
    }
}

/// A selftest of 2 nodes × 2 ranks over the namespaces, with `extra` flags.
fn netns_selftest(t: &Path, logs: &Path, extra: &[&str]) -> Run {
    let ompi = t.join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    run(
        tchrun()
            .env("TMPDIR", &ompi)
            .args(["selftest", "--nodes", "2", "--procs-per-node", "2"])
            .arg("--hostfile")
            .arg(Nodes::hostfile(t, 2, 2))
            .args(["--sizes", "4096", "--iters", "2", "--log-dir"])
            .arg(logs)
            .args(extra)
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        LIMIT,
    )
}

/// Issue 33: rank 0's node offers first an address node 2 cannot route (10.251.0.11 on an
/// interface before eth0): the probe skips it, the job starts on the reachable 10.250.0.11,
/// and every driver log and ranks.json say which.
#[test]
fn netns_bootstrap_skips_an_address_other_nodes_cannot_reach() {
    let Some(_nodes) = Nodes::up(2) else { return };
    extra_interface(1, "10.251.0.11/24", true);
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = netns_selftest(t.path(), &logs, &[]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let line = "bootstrap: 10.250.0.11 (eth0), reached by all 4 ranks; \
                not reached by every rank: 10.251.0.11 (tchrun-d0)";
    for (rank, text) in driver_logs(&logs, 4).iter().enumerate() {
        assert!(text.contains(line), "rank {rank}:\n{text}");
    }
    let ranks = std::fs::read_to_string(logs.join("ranks.json")).expect("ranks.json");
    assert!(
        ranks.contains("\"bootstrap\": \"10.250.0.11 (eth0), reached by all 4 ranks"),
        "{ranks}"
    );
    eprintln!(
        "probe past an unreachable address: {:.1}s",
        r.elapsed.as_secs_f64()
    );
}

/// Issue 33: `--ifname` forces an interface whose network only rank 0's node has (a dummy
/// of the same name on each node, on different subnets): every rank fails within seconds,
/// exit 3, and the message names the ranks of node 2, what was tried and the fix.
#[test]
fn netns_bootstrap_unreachable_forced_interface_is_exit_3_naming_the_ranks() {
    let Some(_nodes) = Nodes::up(2) else { return };
    extra_interface(1, "10.252.1.1/24", false);
    extra_interface(2, "10.252.2.1/24", false);
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = netns_selftest(t.path(), &logs, &["--ifname", "tchrun-d0"]);
    assert_eq!(r.code, Some(3), "{}", r.explain());
    assert!(r.elapsed < Duration::from_secs(30), "{}", r.explain());
    let all = format!("{}{}", r.stdout, r.stderr);
    for want in [
        "no address of rank 0 (tchrun-node1) was reached by every rank within 3 s",
        "tried 10.252.1.1 (tchrun-d0), chosen by --ifname tchrun-d0",
        "rank 2 (tchrun-node2) reached none; rank 3 (tchrun-node2) reached none",
        "fix: pass --ifname (or TCHRUN_IFNAME)",
    ] {
        assert!(all.contains(want), "{want:?} missing:\n{}", r.explain());
    }
    eprintln!(
        "unreachable forced interface: exit 3 in {:.1}s",
        r.elapsed.as_secs_f64()
    );
}

/// Issue 28: a rank stopped with SIGSTOP on node 2 (2 nodes × 2 ranks through mpirun) is named
/// with its host; its stacks are taken on its own host by the live rank there (rank 2), and the
/// launcher on node 1 reads them from the log directory: the verdict groups ranks 0-2 waiting
/// in the gradient all-reduce and names rank 3 as never having entered it.
#[test]
fn netns_a_stopped_rank_on_node2_is_named_with_its_stacks_taken_on_its_host() {
    use tchrun::job_record::heartbeat::Heartbeat;
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(t.path());
    let out = t.path().join("out");
    let logs = out.join("logs");
    let mut c = tchrun();
    c.env("TMPDIR", &ompi)
        .arg("train")
        .args(train_args(&model, &out, 50))
        .args(["--timeout", "120", "--print-freq", "1"])
        .args(["--nodes", "2", "--procs-per-node", "2", "--hostfile"])
        .arg(Nodes::hostfile(t.path(), 2, 2))
        .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi)));
    let mut job = Job::start(&mut c, t.path());
    let beat3 = || Heartbeat::read_all(&logs).into_iter().find(|b| b.rank == 3);
    assert!(
        wait_for(Duration::from_secs(240), || beat3()
            .is_some_and(|b| b.step >= 2)),
        "training never started: {}",
        job.output()
    );
    let pid = beat3().map(|b| b.pid as i32).expect("rank 3's pid");
    let pid = nix::unistd::Pid::from_raw(pid);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP rank 3");
    let code = job.wait(Duration::from_secs(120));
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    assert_eq!(code, Some(4), "{}", job.output());
    let err = read(&job.err);
    let line = err.lines().find(|l| l.contains("hang:")).unwrap_or("");
    eprintln!("{line}");
    assert!(
        // Which collective the others wait in depends on where the stop caught rank 3 (inside
        // backward: the gradient all-reduce; in its optimizer step: the window's all-gather).
        line.contains("ranks 0-2 (tchrun-node1, tchrun-node2) wait in ")
            && line.contains("rank 3 (tchrun-node2, pid")
            && line.contains("is stopped (state T: SIGSTOP or a debugger); at its last beat at"),
        "{}",
        job.output()
    );
    let theirs: tchrun::job_record::stacks::RankStacks =
        serde_json::from_str(&read(&tchrun::job_record::stacks::path(&logs, 3)))
            .expect("stacks-3.json");
    assert_eq!(
        (theirs.captured_by.as_str(), theirs.host.as_str()),
        ("rank 2", "tchrun-node2")
    );
    assert!(culprit_stack_shown(&err, 3), "{err}");
}

// ---------------------------------------------------------------- real Slurm

impl Slurm {
    /// `tchrun sbatch --submit` of a small training; returns the job id.
    fn submit_training(&self, model: &Path, out: &Path, epochs: u32, extra: &[&str]) -> u64 {
        let r = run(
            self.tchrun()
                .arg("sbatch")
                .args(train_args(model, out, epochs))
                .args([
                    "--procs-per-node",
                    "2",
                    "--time",
                    "10",
                    "--job-name",
                    "tchrun-test",
                    // The node has 4 CPUs: the default (--threads + --loader-threads) is more.
                    "--cpus-per-task",
                    "2",
                ])
                .args(extra)
                .arg("--submit"),
            Duration::from_secs(30),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        let id = r
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("Submitted batch job ")?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no job id\n{}", r.explain()));
        assert!(
            r.stdout
                .contains(&format!("logs in {}", out.join("logs").display())),
            "{}",
            r.explain()
        );
        id
    }
}

#[test]
fn slurm_srun_inside_salloc() {
    let Some(slurm) = Slurm::start() else { return };
    let t = tempdir();
    // tchrun's auto launcher picks srun --mpi=pmix inside the allocation.
    let logs = t.path().join("pmix");
    let r = run(
        slurm
            .cmd("salloc")
            .args(["-N1", "-n2"])
            .arg(bin_dir().join("tchrun"))
            .args([
                "selftest",
                "--procs-per-node",
                "2",
                "--sizes",
                "4096",
                "--iters",
                "3",
            ])
            .arg("--log-dir")
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("selftest: 2 ranks on cpu (gloo)"),
        "{}",
        r.explain()
    );
    let mpi_log = read(&logs.join("70_mpi_log"));
    assert!(
        mpi_log.starts_with("# srun --nodes=1 --ntasks=2 --ntasks-per-node=2 --mpi=pmix"),
        "{mpi_log}"
    );
    for (rank, text) in driver_logs(&logs, 2).iter().enumerate() {
        assert!(text.contains("started_by: Mpi"), "rank {rank}:\n{text}");
    }
    eprintln!(
        "salloc + tchrun selftest (srun --mpi=pmix): {:.1}s",
        r.elapsed.as_secs_f64()
    );

    // srun without PMIx (MpiDefault=none clusters): ranks use Slurm's variables, no MPI_Init.
    let logs = t.path().join("none");
    let r = run(
        slurm
            .cmd("salloc")
            .args(["-N1", "-n2", "srun", "--mpi=none"])
            .arg(worker_path())
            .args(["selftest", "--sizes", "4096", "--iters", "3", "--log-dir"])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    for (rank, text) in driver_logs(&logs, 2).iter().enumerate() {
        assert!(text.contains("started_by: Slurm"), "rank {rank}:\n{text}");
    }
    eprintln!(
        "salloc + srun --mpi=none selftest: {:.1}s",
        r.elapsed.as_secs_f64()
    );

    // `tchrun doctor` inside the allocation (issue 33): its two phases through srun, one rank
    // on the node, then the 2-rank layout and its one intra-node link.
    let logs = t.path().join("doctor");
    let r = run(
        slurm
            .cmd("salloc")
            .args(["-N1", "-n2"])
            .arg(bin_dir().join("tchrun"))
            .args(["doctor", "--procs-per-node", "2", "--link-bytes", "65536"])
            .args(["--link-iters", "2", "--log-dir"])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("tchrun doctor: 1 node(s), healthy"),
        "{}",
        r.explain()
    );
    for (phase, tasks) in [("nodes", "--ntasks=1"), ("links", "--ntasks=2")] {
        let mpi_log = read(&logs.join(phase).join("70_mpi_log"));
        assert!(
            mpi_log.starts_with("# srun --nodes=1 ") && mpi_log.contains(tasks),
            "{phase}: {mpi_log}"
        );
    }
    let report: serde_json::Value =
        serde_json::from_str(&read(&logs.join("doctor.json"))).expect("doctor.json");
    assert_eq!(report["healthy"], true, "{report}");
    assert_eq!(
        report["network"]["links"][0]["intra_node"], true,
        "{report}"
    );
    eprintln!("salloc + tchrun doctor: {:.1}s", r.elapsed.as_secs_f64());
}

#[test]
fn slurm_sbatch_trains_to_completion() {
    let Some(slurm) = Slurm::start() else { return };
    let t = tempdir();
    let model = model_init(t.path());
    let out = t.path().join("out");
    let start = Instant::now();
    // Slurm's options reach the job (--mem, --sbatch-arg lines), and rank 1 is killed at step 7
    // of the first attempt (the test hook, in the job's environment through --export): the
    // script restarts the ranks in the allocation from the step-6 checkpoint (--max-restarts).
    let id = slurm.submit_training(
        &model,
        &out,
        1,
        &[
            "--mem",
            "100M",
            "--sbatch-arg=--comment=tchrun-test",
            "--sbatch-arg=--export=ALL,TCHRUN_TEST_KILL_AT_STEP=1:7",
            "--max-restarts",
            "1",
            "--checkpoint-every",
            "3",
        ],
    );
    let script = out.join("logs/tchrun-job.sbatch");
    assert!(script.is_file(), "no batch script {}", script.display());
    let shown = run(
        slurm.cmd("scontrol").args(["show", "job", &id.to_string()]),
        Duration::from_secs(10),
    )
    .stdout;
    for want in [
        "Comment=tchrun-test",
        "MinMemoryNode=100M",
        "NumCPUs=4",
        "CPUs/Task=2",
    ] {
        assert!(
            shown.contains(want),
            "{want} not in scontrol show job:\n{shown}"
        );
    }
    let (state, code) = slurm.wait_job(id, Duration::from_secs(180));
    let logs = out.join("logs");
    let mpi_log = std::fs::read_to_string(logs.join("70_mpi_log")).unwrap_or_default();
    assert_eq!(
        (state.as_str(), code.as_str()),
        ("COMPLETED", "0:0"),
        "job {id}\n--- 70_mpi_log\n{mpi_log}"
    );
    assert!(
        mpi_log.contains("tchrun: attempt 1 failed (exit ")
            && mpi_log
                .contains("restarting all ranks in 1 s with --resume (restart 1 of at most 1"),
        "{mpi_log}"
    );
    let killed =
        std::fs::read_to_string(logs.join("attempt-1/70_driver_log_1")).unwrap_or_default();
    assert!(
        killed.contains("TCHRUN_TEST_KILL_AT_STEP: SIGKILL at step 7"),
        "attempt 1's rank 1 log:\n{killed}\n--- 70_mpi_log\n{mpi_log}"
    );
    for f in ["model.json", "model.safetensors", "metrics.jsonl"] {
        assert!(
            out.join(f).is_file(),
            "no {f} in {}\n{mpi_log}",
            out.display()
        );
    }
    for (rank, text) in driver_logs(&logs, 2).iter().enumerate() {
        assert!(text.contains("started_by: Mpi"), "rank {rank}:\n{text}");
    }
    assert!(
        mpi_log.contains(&format!("tchrun: job {id} (restart 0)")),
        "{mpi_log}"
    );
    assert!(
        mpi_log.contains("tchrun: ranks ended with exit code 0"),
        "{mpi_log}"
    );
    eprintln!(
        "sbatch --submit → killed, restarted, COMPLETED (2 ranks, 1 epoch): {:.1}s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
fn slurm_accepts_the_scripts_directives_and_tchrun_explains_a_refusal() {
    let Some(slurm) = Slurm::start() else { return };
    let t = tempdir();
    let model = model_init(t.path());
    let out = t.path().join("out");
    let sbatch = |extra: &[&str]| {
        run(
            slurm
                .tchrun()
                .arg("sbatch")
                .args(train_args(&model, &out, 1))
                .args(["--procs-per-node", "2"])
                .args(extra),
            Duration::from_secs(30),
        )
    };
    // Account and QOS (this cluster has no accounting, so `--test-only` checks their syntax).
    let r = sbatch(&[
        "--cpus-per-task",
        "2",
        "--account",
        "proj42",
        "--qos",
        "high",
        "--mem",
        "100M",
    ]);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let r = run(
        slurm
            .cmd("sbatch")
            .arg("--test-only")
            .arg(out.join("logs/tchrun-job.sbatch")),
        Duration::from_secs(10),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(r.stderr.contains("using 4 processors"), "{}", r.explain());
    // More memory than the node has: Slurm refuses, tchrun says which flags make the request.
    let r = sbatch(&["--cpus-per-task", "1", "--mem", "100G", "--submit"]);
    assert_eq!(r.code, Some(3), "{}", r.explain());
    assert!(
        r.stderr.contains(
            "each node must have 2 CPUs (2 ranks × --cpus-per-task 1), 100G of memory: lower --cpus-per-task, --procs-per-node or --mem"
        ),
        "{}",
        r.explain()
    );
    let r = sbatch(&["--cpus-per-task", "1", "--constraint", "a100", "--submit"]);
    assert_eq!(r.code, Some(3), "{}", r.explain());
    assert!(
        r.stderr
            .contains("--constraint a100: no node has that feature"),
        "{}",
        r.explain()
    );
}

#[test]
fn slurm_usr1_requeues_and_scancel_stops_every_rank() {
    let Some(slurm) = Slurm::start() else { return };
    let t = tempdir();
    let t_path = t.path().display().to_string();
    let model = model_init(t.path());
    let out = t.path().join("out");
    let logs = out.join("logs");
    let id = slurm.submit_training(&model, &out, 50, &["--print-freq", "1"]);
    let rank_pids = || -> Vec<String> {
        (0..2)
            .map(|r| {
                let t = std::fs::read_to_string(logs.join(format!("70_driver_log_{r}")))
                    .unwrap_or_default();
                match (t.contains("iter 1/"), field(&t, "pid: ")) {
                    (true, Some(p)) => p.to_string(),
                    _ => String::new(),
                }
            })
            .collect()
    };
    let mpi_log = || std::fs::read_to_string(logs.join("70_mpi_log")).unwrap_or_default();
    // Both ranks of run `restart` (pids other than `before`) have done a training step.
    let training = |restart: u32, before: &[String]| {
        wait_for(Duration::from_secs(90), || {
            rank_pids()
                .iter()
                .all(|p| !p.is_empty() && !before.contains(p))
                && mpi_log().contains(&format!("(restart {restart})"))
        })
    };
    assert!(
        training(0, &[]),
        "job {id} did not start training\n{}",
        mpi_log()
    );
    let pids0 = rank_pids();

    // Preemption warning (what --signal=B:USR1@120 sends before the time limit): the batch
    // script stops the ranks and requeues the job.
    let r = run(
        slurm
            .cmd("scancel")
            .args(["--signal=USR1", "--batch", &id.to_string()]),
        Duration::from_secs(10),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        wait_for(Duration::from_secs(30), || mpi_log()
            .contains(&format!("requeueing job {id}"))),
        "no requeue after USR1\n{}",
        mpi_log()
    );
    // Requeued jobs are held ~120 s before they start again: start it now.
    assert!(
        wait_for(Duration::from_secs(30), || {
            let (state, _) = slurm.job_state(id);
            state == "PENDING" || state == "RUNNING"
        }),
        "job {id} not requeued: {:?}",
        slurm.job_state(id)
    );
    // ... once the first run's step is gone: the rerun's step has the same id (J.0) and
    // launching it while the old slurmstepd still finalizes PMIx fails ("aborted before step
    // completely launched"). Real clusters hold requeued jobs long enough.
    let step = format!("[{id}.0]");
    assert!(
        wait_for(Duration::from_secs(30), || processes_with(
            "slurmstepd",
            &step
        )
        .is_empty()
            && processes_with("tchrun-worker", &t_path).is_empty()),
        "step {id}.0 still running after the requeue: {:?}",
        processes_with("slurmstepd", &step)
    );
    let r = run(
        slurm
            .cmd("scontrol")
            .args(["update", &format!("jobid={id}"), "StartTime=now"]),
        Duration::from_secs(10),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        training(1, &pids0),
        "requeued job {id} did not train again\n{}",
        mpi_log()
    );
    let first = mpi_log();
    assert!(
        first.contains("(restart 0)") && first.contains("(restart 1)"),
        "{first}"
    );

    // scancel: every rank gets SIGTERM, the job ends, no rank is left.
    let pids = rank_pids();
    let ranks = processes_with("tchrun-worker", &t_path);
    assert_eq!(ranks.len(), 2, "expected 2 running ranks: {ranks:?}");
    let start = Instant::now();
    let r = run(
        slurm.cmd("scancel").arg(id.to_string()),
        Duration::from_secs(10),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let gone = wait_for(Duration::from_secs(20), || {
        processes_with("tchrun-worker", &t_path).is_empty()
    });
    let stopped = start.elapsed();
    let (state, _) = slurm.wait_job(id, Duration::from_secs(30));
    let text = mpi_log();
    assert!(
        gone,
        "ranks left after scancel: {:?}",
        processes_with("tchrun-worker", &t_path)
    );
    assert_eq!(state, "CANCELLED", "{text}");
    assert!(
        text.contains(&format!("JOB {id} ON")) && text.contains("CANCELLED"),
        "{text}"
    );
    let tails: Vec<String> = (0..2)
        .map(|r| {
            let l = read(&logs.join(format!("70_driver_log_{r}")));
            l.lines().rev().take(2).collect::<Vec<_>>().join(" | ")
        })
        .collect();
    eprintln!(
        "scancel: ranks {pids:?} gone after {:.2}s; 70_mpi_log says CANCELLED; last driver log lines: {tails:?}",
        stopped.as_secs_f64()
    );
}

extern "C" {
    #[link_name = "kill"]
    fn kill_pid(pid: i32, sig: i32) -> i32;
}

/// SIGKILLs every live process whose program starts with `program` and whose command line
/// names `needle`; returns what it found.
fn kill_leftovers(program: &str, needle: &str) -> Vec<(u32, String)> {
    let found = processes_with(program, needle);
    for (pid, _) in &found {
        unsafe { kill_pid(*pid as i32, 9) };
    }
    found
}

/// Cuts node `k`'s link (its veth on the bridge, root side) and undoes it on drop; also kills
/// whatever tchrun-worker/orted of the job (command line naming `needle`) is still alive, so a
/// failing test leaves nothing behind.
struct LinkCut {
    dev: String,
    needle: String,
}

impl LinkCut {
    fn cut(k: usize, needle: &str) -> LinkCut {
        let c = LinkCut {
            dev: format!("tchrun-v{k}"),
            needle: needle.to_string(),
        };
        let r = run(
            Command::new("ip").args(["link", "set", &c.dev, "down"]),
            Duration::from_secs(10),
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        c
    }
}

impl Drop for LinkCut {
    fn drop(&mut self) {
        let _ = Command::new("timeout")
            .args(["10", "ip", "link", "set", &self.dev, "up"])
            .status();
        for p in ["tchrun-worker", "orted"] {
            let left = kill_leftovers(p, &self.needle);
            if !left.is_empty() {
                eprintln!("guard: killed leftover {p}: {left:?}");
            }
        }
    }
}

/// A background `tchrun` with its output in files; SIGKILLed (process group) on drop.
struct Background {
    child: std::process::Child,
    stdout: PathBuf,
    stderr: PathBuf,
}

impl Background {
    fn spawn(cmd: &mut Command, dir: &Path) -> Background {
        use std::os::unix::process::CommandExt;
        let stdout = dir.join("tchrun.stdout");
        let stderr = dir.join("tchrun.stderr");
        let child = cmd
            .stdin(std::process::Stdio::null())
            .stdout(std::fs::File::create(&stdout).expect("stdout file"))
            .stderr(std::fs::File::create(&stderr).expect("stderr file"))
            .process_group(0)
            .spawn()
            .expect("start tchrun");
        Background {
            child,
            stdout,
            stderr,
        }
    }

    /// The exit code (None: killed by a signal) if it ended within `limit`.
    fn wait(&mut self, limit: Duration) -> Option<Option<i32>> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.try_wait().expect("wait") {
                return Some(s.code());
            }
            if start.elapsed() > limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn output(&self) -> String {
        format!(
            "--- stdout\n{}\n--- stderr\n{}",
            std::fs::read_to_string(&self.stdout).unwrap_or_default(),
            std::fs::read_to_string(&self.stderr).unwrap_or_default()
        )
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            unsafe { kill_pid(-(self.child.id() as i32), 9) };
            let _ = self.child.wait();
        }
    }
}

/// 2 nodes × 1 rank training through mpirun; node 2's link goes down mid-training. With
/// `--timeout 10` the ranks' collectives fail, and tchrun must end (code 4, a failure summary
/// naming a rank) within timeout + 20 s of the cut, leaving no rank behind.
#[test]
fn netns_network_cut_ends_the_job_within_the_timeout() {
    const TIMEOUT: u64 = 10;
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let t_path = t.path().display().to_string();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(t.path());
    let out = t.path().join("out");
    let logs = out.join("logs");
    let hang: Vec<String> = std::env::var("TCHRUN_TEST_CUT_HANG_TIMEOUT")
        .map(|h| vec!["--hang-timeout".into(), h])
        .unwrap_or_default();
    let mut job = Background::spawn(
        tchrun()
            .env("TMPDIR", &ompi)
            .arg("train")
            .args(train_args(&model, &out, 50))
            .args(["--print-freq", "1", "--timeout", &TIMEOUT.to_string()])
            .args(&hang)
            .args(["--nodes", "2", "--procs-per-node", "1", "--hostfile"])
            .arg(Nodes::hostfile(t.path(), 2, 1))
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        t.path(),
    );
    let driver_log = |r: usize| {
        std::fs::read_to_string(logs.join(format!("70_driver_log_{r}"))).unwrap_or_default()
    };
    let training = wait_for(Duration::from_secs(180), || {
        driver_log(0).contains(" iter 2/") || job.child.try_wait().ok().flatten().is_some()
    });
    assert!(
        training && driver_log(0).contains(" iter 2/"),
        "rank 0 did not start training\n{}\n--- driver log 0\n{}",
        job.output(),
        driver_log(0)
    );
    assert!(
        job.child.try_wait().expect("wait").is_none(),
        "the job ended before the cut\n{}",
        job.output()
    );
    let workers = processes_with("tchrun-worker", &t_path);
    assert_eq!(workers.len(), 2, "expected 2 running ranks: {workers:?}");

    let cut = LinkCut::cut(2, &t_path);
    let cut_at = Instant::now();
    let deadline = Duration::from_secs(TIMEOUT + 20);
    // Wait past the deadline (bounded) to measure how late a late end is.
    let code = job.wait(deadline + Duration::from_secs(40));
    let took = cut_at.elapsed();
    let ranks_left = processes_with("tchrun-worker", &t_path);
    let orted_left = processes_with("orted", &t_path);
    let mpirun_left = processes_with("mpirun", &t_path);
    let tails: Vec<String> = (0..2)
        .map(|r| {
            let l = driver_log(r);
            l.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        })
        .collect();
    eprintln!(
        "network cut of node 2 ({}): tchrun {} {:.1}s after the cut; left: ranks {:?}, orted {:?}, mpirun {:?}; driver log tails: {tails:?}",
        if hang.is_empty() { "no --hang-timeout".to_string() } else { hang.join(" ") },
        match code {
            Some(c) => format!("exited with {c:?}"),
            None => "still running".to_string(),
        },
        took.as_secs_f64(),
        ranks_left.len(),
        orted_left.len(),
        mpirun_left.len(),
    );
    let output = job.output();
    let mpi_log = std::fs::read_to_string(logs.join("70_mpi_log")).unwrap_or_default();
    assert!(
        code.is_some() && took <= deadline,
        "tchrun did not end within {deadline:?} of the cut (ended: {code:?} after {took:?})\n{output}\n--- 70_mpi_log\n{mpi_log}\n--- driver logs (tails)\n{tails:?}"
    );
    assert_eq!(code, Some(Some(4)), "{output}\n--- 70_mpi_log\n{mpi_log}");
    let failure = std::fs::read_to_string(logs.join("failure.json")).unwrap_or_default();
    let summary: serde_json::Value = serde_json::from_str(&failure)
        .unwrap_or_else(|e| panic!("failure.json: {e}\n{failure}\n{output}"));
    assert!(
        summary["rank"].is_u64(),
        "failure.json names no rank:\n{failure}\n{output}"
    );
    assert!(
        output.contains("rank"),
        "no failure summary on the terminal\n{output}"
    );
    // Every rank gone (a short grace: mpirun's teardown may trail tchrun's exit).
    let gone = wait_for(Duration::from_secs(5), || {
        processes_with("tchrun-worker", &t_path).is_empty()
    });
    drop(cut); // restores the link, kills leftovers
    assert!(gone, "ranks left after the job ended: {ranks_left:?}");
    eprintln!(
        "failure.json: rank {} ({}), exit status {}",
        summary["rank"], summary["classification"], summary["exit_status"]
    );
}

// ---------------------------------------------------------------- a node that keeps failing

/// `tchrun train` on 2 nodes × 1 rank with `--max-restarts 3 --exclude-failed-hosts` and the
/// extra flags; every rank on tchrun-node2 SIGKILLs itself 7 steps into each attempt
/// (`TCHRUN_TEST_KILL_ON_HOST`), after `--checkpoint-every 2` wrote checkpoints (so every
/// attempt makes progress). 400 images, batch 20: 10 steps per epoch on 2 ranks, 2 epochs.
fn train_with_failing_node2(dir: &Path, extra: &[&str]) -> (Run, PathBuf) {
    train_with_failing_node2_of(dir, 2, extra)
}

/// `train_with_failing_node2` with `hosts` hosts in the hostfile (those beyond --nodes 2 are
/// spares).
fn train_with_failing_node2_of(dir: &Path, hosts: usize, extra: &[&str]) -> (Run, PathBuf) {
    let ompi = dir.join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(dir);
    let d = small_digits();
    let out = dir.join("out");
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .env("TMPDIR", &ompi)
            .env("TCHRUN_TEST_KILL_ON_HOST", "tchrun-node2:7")
            // One intra-op thread: the same kernels at every world size (the model comparison).
            .env("TCHRUN_THREADS", "1")
            .env_remove("TCHRUN_ATTEMPT")
            .env_remove("TCHRUN_TEST_KILL_AT_STEP")
            .args(["--epochs", "2", "--batch-size", "20", "--lr", "0.05"])
            .args(["--checkpoint-every", "2", "--print-freq", "5"])
            .args(["--max-restarts", "3", "--exclude-failed-hosts"])
            .args(extra)
            .args(["--nodes", "2", "--procs-per-node", "1", "--hostfile"])
            .arg(Nodes::hostfile(dir, hosts, 1))
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        Duration::from_secs(420),
    );
    (r, out)
}

/// Issue 15 item 3: node 2's rank fails in attempts 1 and 2 (each after a newer checkpoint);
/// tchrun drops tchrun-node2 and attempt 3 runs on tchrun-node1 alone (1 rank, resuming the
/// 2-rank checkpoint at the new world size) to the end: exit 0, the console, `restarts.json`
/// and the rewritten hostfile name the dropped host, the model directory is complete. With
/// `--global-batch-size 40` (2 ranks × 20, then 1 rank accumulating 2 × 20), the job that lost a
/// node trains the same model, bit for bit, as the same job on 2 ranks that lost nothing (issue
/// 15 item 4).
#[test]
fn netns_a_host_that_keeps_failing_is_dropped() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let gbs = ["--min-nodes", "1", "--global-batch-size", "40"];
    let (r, out) = train_with_failing_node2(t.path(), &gbs);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stderr.contains(
            "tchrun: dropping host tchrun-node2: its ranks failed in attempts 1 and 2 (killed by signal 9"
        ) && r.stderr.contains("; continuing on 1 node(s), 1 rank(s)"),
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.contains("tchrun: recovered after 2 restart(s)")
            && r.stdout.contains("host tchrun-node2 dropped"),
        "{}",
        r.explain()
    );
    let logs = out.join("logs");
    let history: serde_json::Value =
        serde_json::from_str(&read(&logs.join("restarts.json"))).expect("restarts.json");
    assert_eq!(history.as_array().map(Vec::len), Some(2), "{history}");
    for (i, a) in history.as_array().into_iter().flatten().enumerate() {
        assert_eq!(a["host"], "tchrun-node2", "{history}");
        assert_eq!(a["failed_hosts"][0], "tchrun-node2", "{history}");
        let log = read(&logs.join(format!("attempt-{}/70_driver_log_1", i + 1)));
        assert!(log.contains("TCHRUN_TEST_KILL_ON_HOST: SIGKILL"), "{log}");
    }
    assert!(history[0].get("dropped_hosts").is_none(), "{history}");
    let dropped = &history[1]["dropped_hosts"][0];
    assert_eq!(dropped["host"], "tchrun-node2", "{history}");
    assert_eq!(dropped["failed_in"], serde_json::json!([1, 2]), "{history}");
    assert_eq!(dropped["ranks_left"], 1, "{history}");
    let hostfile = read(&logs.join("hostfile.remaining"));
    assert!(
        hostfile.contains("tchrun-node1 slots=1") && !hostfile.contains("\ntchrun-node2"),
        "{hostfile}"
    );
    // Attempt 3: one rank on node 1, resumed from the 2-rank checkpoint.
    let ranks: serde_json::Value =
        serde_json::from_str(&read(&logs.join("ranks.json"))).expect("ranks.json");
    assert_eq!(ranks.as_array().map(Vec::len), Some(1), "{ranks}");
    assert_eq!(ranks[0]["host"], "tchrun-node1", "{ranks}");
    assert_eq!(ranks[0]["attempt"], 3, "{ranks}");
    let log0 = read(&logs.join("70_driver_log_0"));
    assert!(
        log0.contains("world size 1 (checkpoint: 2)") && log0.contains("rank exiting with code 0"),
        "{log0}"
    );
    assert!(!logs.join("70_driver_log_1").exists());
    for f in ["model.json", "model.safetensors", "metrics.jsonl"] {
        assert!(out.join(f).is_file(), "no {f}\n{}", r.explain());
    }
    let last: serde_json::Value =
        serde_json::from_str(&read(&out.join("checkpoints/last.json"))).expect("last.json");
    assert_eq!(last["finished"], true, "{last}");
    assert_eq!(metrics_rows(&out).len(), 2, "two epochs in metrics.jsonl");
    eprintln!(
        "2 nodes, node 2 failing twice, finished on node 1: {:.1}s",
        r.elapsed.as_secs_f64()
    );
    assert_same_model_as_undisturbed(t.path(), &out);
}

/// The same training (`model` in `dir`, 2 epochs, batch 20, `--global-batch-size 40`) on 2
/// local ranks that lose nothing gives the model in `out`, bit for bit.
fn assert_same_model_as_undisturbed(dir: &Path, out: &Path) {
    let d = small_digits();
    let undisturbed = dir.join("undisturbed");
    let u = run(
        tchrun_train(
            &dir.join("model"),
            &d.join("train"),
            &d.join("valid"),
            &undisturbed,
        )
        .env("TCHRUN_THREADS", "1")
        .env_remove("TCHRUN_TEST_KILL_ON_HOST")
        .env_remove("TCHRUN_TEST_SLOW_STEP")
        .env_remove("TCHRUN_ATTEMPT")
        .env_remove("TCHRUN_TEST_KILL_AT_STEP")
        .args(["--epochs", "2", "--batch-size", "20", "--lr", "0.05"])
        .args(["--print-freq", "5", "--global-batch-size", "40"])
        .args(["--launcher", "local", "--procs-per-node", "2"]),
        Duration::from_secs(420),
    );
    assert_eq!(u.code, Some(0), "{}", u.explain());
    let a = std::fs::read(out.join("model.safetensors")).expect("model");
    let b = std::fs::read(undisturbed.join("model.safetensors")).expect("model");
    assert!(
        a == b,
        "the job that lost a node trained another model than the undisturbed one"
    );
}

/// Issue 29: `--straggler-action exclude` on 2 nodes × 1 rank where every step of
/// tchrun-node2's rank sleeps 0.3 s (`TCHRUN_TEST_SLOW_STEP`): it is named a straggler, is slow
/// in every window of epoch 1, so the ranks stop after epoch 1's checkpoint, tchrun drops
/// tchrun-node2 at once, and attempt 2 trains epoch 2 on tchrun-node1 alone; with
/// `--global-batch-size 40` the model equals the undisturbed 2-rank run's, bit for bit.
#[test]
fn netns_a_straggling_node_is_left_out_and_the_model_stays_the_same() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(t.path());
    let d = small_digits();
    let out = t.path().join("out");
    let r = run(
        tchrun_train(&model, &d.join("train"), &d.join("valid"), &out)
            .env("TMPDIR", &ompi)
            .env("TCHRUN_TEST_SLOW_STEP", "tchrun-node2:0.3")
            .env("TCHRUN_THREADS", "1")
            .env_remove("TCHRUN_ATTEMPT")
            .env_remove("TCHRUN_TEST_KILL_ON_HOST")
            .env_remove("TCHRUN_TEST_KILL_AT_STEP")
            .args(["--epochs", "2", "--batch-size", "20", "--lr", "0.05"])
            .args(["--print-freq", "2", "--global-batch-size", "40"])
            .args(["--straggler-action", "exclude", "--max-restarts", "2"])
            .args(["--nodes", "2", "--procs-per-node", "1", "--hostfile"])
            .arg(Nodes::hostfile(t.path(), 2, 1))
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi))),
        Duration::from_secs(420),
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let all = format!("{}{}", r.stdout, r.stderr);
    for want in [
        "straggler: rank 1 (tchrun-node2, cpu) compute ",
        "straggler: rank 1 (tchrun-node2) was slower than the other ranks in every window of epoch 1",
        "stopping after epoch 1 to leave out host(s) tchrun-node2: rank(s) 1 slower than the other ranks in every window of epoch 1 (--straggler-action exclude)",
        "tchrun: dropping host tchrun-node2: ",
        "; continuing on 1 node(s), 1 rank(s)",
        "tchrun: recovered after 1 restart(s)",
    ] {
        assert!(all.contains(want), "no '{want}' in\n{}", r.explain());
    }
    let logs = out.join("logs");
    let history: serde_json::Value =
        serde_json::from_str(&read(&logs.join("restarts.json"))).expect("restarts.json");
    assert_eq!(history.as_array().map(Vec::len), Some(1), "{history}");
    assert_eq!(
        history[0]["dropped_hosts"][0]["host"], "tchrun-node2",
        "{history}"
    );
    assert_eq!(history[0]["resumed_from_step"], 10, "{history}");
    let ranks: serde_json::Value =
        serde_json::from_str(&read(&logs.join("ranks.json"))).expect("ranks.json");
    assert_eq!(ranks.as_array().map(Vec::len), Some(1), "{ranks}");
    assert_eq!(
        (&ranks[0]["host"], &ranks[0]["attempt"]),
        (&"tchrun-node1".into(), &2.into()),
        "{ranks}"
    );
    let rows = metrics_rows(&out);
    assert_eq!(rows.len(), 2, "two epochs in metrics.jsonl");
    assert_eq!(
        rows[0]["stragglers"][0]["host"], "tchrun-node2",
        "{}",
        rows[0]
    );
    assert_same_model_as_undisturbed(t.path(), &out);
}

/// The same failing node with `--min-nodes 2`: leaving it out would leave 1 node, so after its
/// second failure the job stops (exit 4) and says which host and which minimum.
#[test]
fn netns_dropping_a_host_below_min_nodes_stops_the_job() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let (r, out) = train_with_failing_node2(t.path(), &["--min-nodes", "2"]);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let why = "tchrun: not restarting: host tchrun-node2: its ranks failed in attempts 1 and 2 (killed by signal 9";
    assert!(
        r.stderr.contains(why)
            && r.stderr
                .contains("leaving it out would leave 1 node(s), fewer than --min-nodes 2"),
        "{}",
        r.explain()
    );
    let logs = out.join("logs");
    let summary: serde_json::Value =
        serde_json::from_str(&read(&logs.join("failure.json"))).expect("failure.json");
    assert!(
        summary["not_restarted"]
            .as_str()
            .is_some_and(|s| s.contains("--min-nodes 2")),
        "{summary}"
    );
    assert_eq!(summary["earlier_attempts"][0]["attempt"], 1, "{summary}");
    assert!(!logs.join("hostfile.remaining").exists());
    assert!(!logs.join("attempt-2").exists(), "attempt 2 was the last");
}

// ---------------------------------------------------------------- spare hosts (issue 33)

/// The hosts of `ranks.json`, in rank order, and the attempt each rank ran in.
fn rank_hosts(logs: &Path) -> Vec<(String, u64)> {
    let ranks: serde_json::Value =
        serde_json::from_str(&read(&logs.join("ranks.json"))).expect("ranks.json");
    ranks
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["host"].as_str().unwrap_or_default().to_string(),
                r["attempt"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Issue 33 item 3: the failing node 2 of `train_with_failing_node2` with a spare host,
/// tchrun-node3 (`--spare-hosts FILE`: the job's hostfile then the spares, in
/// `hostfile.with-spares`). After node 2's second failure tchrun runs the
/// per-node checks on tchrun-node3, which passes and takes node 2's place: attempt 3 runs on
/// nodes 1 and 3 at the same world size, the console and `restarts.json` say which host
/// replaced which, and with `--global-batch-size 40` the model equals the undisturbed 2-rank
/// run's, bit for bit.
#[test]
fn netns_a_spare_host_takes_the_place_of_one_that_keeps_failing() {
    let Some(_nodes) = Nodes::up(3) else { return };
    let t = tempdir();
    let spare = t.path().join("spares");
    std::fs::write(&spare, "tchrun-node3 slots=1\n").expect("spares");
    let spare = spare.display().to_string();
    let extra = ["--global-batch-size", "40", "--min-nodes", "2"];
    let extra = [&extra[..], &["--spare-hosts", spare.as_str()]].concat();
    let (r, out) = train_with_failing_node2_of(t.path(), 2, &extra);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    for want in [
        "tchrun: per-node checks of host(s) tchrun-node3 before attempt 3",
        "tchrun: dropping host tchrun-node2: its ranks failed in attempts 1 and 2 (killed by signal 9",
        "; spare host tchrun-node3 takes its place; continuing on 2 node(s), 2 rank(s)",
    ] {
        assert!(r.stderr.contains(want), "no '{want}' in\n{}", r.explain());
    }
    assert!(
        r.stdout
            .contains("host tchrun-node2 dropped (spare tchrun-node3 in its place)"),
        "{}",
        r.explain()
    );
    let logs = out.join("logs");
    let history: serde_json::Value =
        serde_json::from_str(&read(&logs.join("restarts.json"))).expect("restarts.json");
    let dropped = &history[1]["dropped_hosts"][0];
    assert_eq!(dropped["host"], "tchrun-node2", "{history}");
    assert_eq!(dropped["replaced_by"], "tchrun-node3", "{history}");
    assert_eq!(
        (&dropped["nodes_left"], &dropped["ranks_left"]),
        (&2.into(), &2.into()),
        "{history}"
    );
    // The spare's check ran on it (one rank, its report in the log directory).
    let nodes: serde_json::Value = serde_json::from_str(&read(
        &logs.join("doctor-attempt-3/round-1/doctor-nodes.json"),
    ))
    .expect("doctor-nodes.json");
    assert_eq!(nodes[0]["host"], "tchrun-node3", "{nodes}");
    assert_eq!(nodes[0]["problems"], serde_json::json!([]), "{nodes}");
    assert_eq!(
        rank_hosts(&logs),
        vec![
            ("tchrun-node1".to_string(), 3),
            ("tchrun-node3".to_string(), 3)
        ]
    );
    let hostfile = read(&logs.join("hostfile.remaining"));
    assert!(
        hostfile.contains("tchrun-node1 slots=1\ntchrun-node3 slots=1"),
        "{hostfile}"
    );
    let merged = read(&logs.join("hostfile.with-spares"));
    assert!(
        merged.ends_with("tchrun-node1 slots=1\ntchrun-node2 slots=1\ntchrun-node3 slots=1\n"),
        "{merged}"
    );
    let log0 = read(&logs.join("70_driver_log_0"));
    assert!(log0.contains("rank exiting with code 0"), "{log0}");
    assert_same_model_as_undisturbed(t.path(), &out);
}

/// Issue 33 item 2: `train --preflight doctor` on 3 hosts with --nodes 2, where tchrun-node2
/// sees a tmpfs of its own over --output (not shared: `ip netns exec` gives each login a private
/// mount namespace, and the rsh agent mounts it there). The doctor names node 2 before any
/// training rank starts, leaves it out, the spare tchrun-node3 (which passed) takes its place,
/// and the job trains on nodes 1 and 3 to the end. A node mpirun cannot start at all (its rsh
/// login fails) makes the doctor check each host alone: with `--min-nodes 3 --nodes 3` the job
/// is refused (exit 4) naming that host and the minimum.
#[test]
fn netns_preflight_doctor_leaves_out_a_host_whose_output_is_not_shared() {
    use std::os::unix::fs::PermissionsExt;
    let Some(_nodes) = Nodes::up(3) else { return };
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let model = model_init(t.path());
    let d = small_digits();
    let agent = t.path().join("agent.sh");
    // On node 2 the agent runs `node2` before the command (a mount, or a failure).
    let job = |out: &Path, extra: &[&str], node2: &str| {
        std::fs::create_dir_all(out).expect("mkdir");
        std::fs::write(
            &agent,
            format!(
                "#!/usr/bin/env bash\nout=(); done=0\nfor a in \"$@\"; do out+=(\"$a\"); \
                 if [ $done = 0 ] && {{ [ \"$a\" = tchrun-node2 ] || [ \"$a\" = 10.250.0.12 ]; }}; then \
                 out+=(\"{node2} &&\"); done=1; fi; done\n\
                 exec {} \"${{out[@]}}\"\n",
                script("netns-rsh.sh").display()
            ),
        )
        .expect("agent");
        std::fs::set_permissions(&agent, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let mpirun_args = Nodes::mpirun_args_with(&agent, &ompi);
        run(
            tchrun_train(&model, &d.join("train"), &d.join("valid"), out)
                .env("TMPDIR", &ompi)
                .env_remove("TCHRUN_TEST_KILL_ON_HOST")
                .env_remove("TCHRUN_ATTEMPT")
                .env_remove("TCHRUN_MIN_NODES")
                .args(["--epochs", "1", "--batch-size", "20", "--lr", "0.05"])
                .args(["--preflight", "doctor"])
                .args(extra)
                .args(["--procs-per-node", "1", "--hostfile"])
                .arg(Nodes::hostfile(t.path(), 3, 1))
                .arg(format!("--mpirun-args={mpirun_args}")),
            Duration::from_secs(300),
        )
    };
    let out = t.path().join("out");
    let mount = format!("mount -t tmpfs tchrun-preflight-test {}", out.display());
    let r = job(&out, &["--nodes", "2"], &mount);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let not_shared = format!(
        "{} is not shared with rank 0's host tchrun-node1",
        out.display()
    );
    for want in [
        "tchrun: dropping host tchrun-node2: it failed the per-node checks before attempt 1 (",
        not_shared.as_str(),
        "; spare host tchrun-node3 takes its place; continuing on 2 node(s), 2 rank(s)",
    ] {
        assert!(r.stderr.contains(want), "no '{want}' in\n{}", r.explain());
    }
    assert!(
        r.stdout.contains("tchrun: --preflight doctor: ")
            && r.stdout.contains("tchrun-node2")
            && r.stdout.contains("FAILED"),
        "{}",
        r.explain()
    );
    // The spare passed the doctor: not checked twice.
    assert!(
        !r.stderr.contains("per-node checks of host(s)"),
        "{}",
        r.explain()
    );
    let logs = out.join("logs");
    let report: serde_json::Value =
        serde_json::from_str(&read(&logs.join("doctor/doctor.json"))).expect("doctor.json");
    assert_eq!(
        report["failed_hosts"][0]["host"], "tchrun-node2",
        "{report}"
    );
    assert_eq!(
        rank_hosts(&logs),
        vec![
            ("tchrun-node1".to_string(), 1),
            ("tchrun-node3".to_string(), 1)
        ]
    );
    assert!(out.join("model.safetensors").is_file(), "{}", r.explain());
    assert!(!logs.join("restarts.json").exists());

    // A node mpirun cannot start at all (its rsh login fails), below --min-nodes: the doctor
    // fails as a whole, each host is then checked alone, node 2 is named, and the job is
    // refused before any training rank starts, exit 4.
    let out3 = t.path().join("out3");
    let r = job(&out3, &["--min-nodes", "3", "--nodes", "3"], "exit 255");
    assert_eq!(r.code, Some(4), "{}", r.explain());
    for want in [
        "; checking each host alone",
        "tchrun: error: --preflight doctor: host tchrun-node2: it failed the per-node checks before attempt 1 (its per-node check did not run: ",
        "leaving it out would leave 2 node(s), fewer than --min-nodes 3",
    ] {
        assert!(r.stderr.contains(want), "no '{want}' in\n{}", r.explain());
    }
    for host in ["tchrun-node1", "tchrun-node3"] {
        assert!(
            !r.stderr.contains(&format!("host {host}:")),
            "{host} was blamed\n{}",
            r.explain()
        );
    }
    assert!(
        !out3.join("logs/70_driver_log_0").exists(),
        "a training rank ran"
    );
    assert!(!out3.join("model.json").exists());
}
