//! Foundation: the c10d process group across real MPI ranks, the env-contract path, driver
//! logs, the launcher's mpirun line, its exit codes and its dry run.
mod common;
use common::*;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);
const OK_LINE: &str = "all_reduce, broadcast, all_gather, barrier correct";

fn mpirun_selftest(np: usize) {
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = run(
        mpirun(np)
            .arg(worker_path())
            .args([
                "selftest",
                "--backend",
                "gloo",
                "--sizes",
                "4096,65536",
                "--iters",
                "3",
                "--log-dir",
            ])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains(&format!("selftest: {np} ranks on cpu (gloo): {OK_LINE}")),
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.contains("busbw GB/s") && r.stdout.contains("64 KiB"),
        "{}",
        r.explain()
    );
    let texts = driver_logs(&logs, np);
    for (rank, text) in texts.iter().enumerate() {
        assert!(text.contains("started_by: Mpi"), "rank {rank}:\n{text}");
        assert!(text.contains("collectives correct"), "rank {rank}:\n{text}");
        assert!(text.contains("process group ready"), "rank {rank}:\n{text}");
    }
    // Only rank 0 prints the table on the console.
    assert_eq!(r.stdout.matches("busbw GB/s").count(), 1, "{}", r.explain());
}

#[test]
fn mpirun_two_ranks_selftest() {
    mpirun_selftest(2);
}

#[test]
fn mpirun_four_ranks_selftest() {
    mpirun_selftest(4);
}

#[test]
fn tchrun_selftest_two_procs_per_node() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .args([
                "selftest",
                "--procs-per-node",
                "2",
                "--sizes",
                "4096",
                "--iters",
                "3",
                "--log-dir",
            ])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout
            .contains(&format!("selftest: 2 ranks on cpu (gloo): {OK_LINE}")),
        "{}",
        r.explain()
    );
    driver_logs(&logs, 2);
    let mpi_log = read(&logs.join("70_mpi_log"));
    assert!(
        mpi_log.contains("mpirun -np 2 --map-by ppr:2:node"),
        "{mpi_log}"
    );
    assert!(
        mpi_log.contains(OK_LINE),
        "70_mpi_log must hold what mpirun printed:\n{mpi_log}"
    );
}

#[test]
fn tchrun_selftest_local_launcher() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .args([
                "selftest",
                "--launcher",
                "local",
                "--procs-per-node",
                "2",
                "--sizes",
                "4096",
                "--iters",
                "2",
                "--log-dir",
            ])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let texts = driver_logs(&logs, 2);
    assert!(texts[1].contains("started_by: Torchrun"), "{}", texts[1]);
}

#[test]
fn env_contract_without_mpi() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let port = free_port().to_string();
    // Ranks started by hand without MPI share the job's secret through their environment.
    let secret = "5e".repeat(32);
    let handles: Vec<_> = (0..2)
        .map(|rank| {
            let logs = logs.clone();
            let port = port.clone();
            let secret = secret.clone();
            std::thread::spawn(move || {
                run(
                    worker()
                        .args([
                            "selftest",
                            "--backend",
                            "gloo",
                            "--sizes",
                            "4096",
                            "--iters",
                            "2",
                            "--log-dir",
                        ])
                        .arg(&logs)
                        .envs([
                            ("RANK", rank.to_string()),
                            ("WORLD_SIZE", "2".into()),
                            ("MASTER_ADDR", "127.0.0.1".into()),
                            ("MASTER_PORT", port),
                            ("TCHRUN_JOB_SECRET", secret),
                        ]),
                    LIMIT,
                )
            })
        })
        .collect();
    let runs: Vec<Run> = handles
        .into_iter()
        .map(|h| h.join().expect("thread"))
        .collect();
    for r in &runs {
        assert_eq!(r.code, Some(0), "{}", r.explain());
    }
    assert!(runs[0].stdout.contains(OK_LINE), "{}", runs[0].explain());
    let texts = driver_logs(&logs, 2);
    assert!(texts[0].contains("started_by: Torchrun"));
}

#[test]
fn shim_failure_is_a_readable_error_not_a_hang() {
    let t = tempdir();
    let logs = t.path().join("logs");
    // Rank 1 of 2 connecting to a port nobody serves: the store times out.
    let r = run(
        worker()
            .args(["selftest", "--timeout", "2", "--log-dir"])
            .arg(&logs)
            .envs([
                ("RANK", "1"),
                ("WORLD_SIZE", "2"),
                ("MASTER_ADDR", "127.0.0.1"),
                ("MASTER_PORT", "1"),
                ("TCHRUN_JOB_SECRET", &"5e".repeat(32)),
            ]),
        Duration::from_secs(60),
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    assert!(
        r.stderr
            .contains("tchrun-worker: error: joining the job: rendezvous: cannot reach rank 0's store at 127.0.0.1:1"),
        "{}",
        r.explain()
    );
    let log = read(&logs.join("70_driver_log_1"));
    assert!(
        log.contains("ERROR joining the job: rendezvous: cannot reach rank 0's store"),
        "{log}"
    );
    assert!(
        !log.contains("Aborted") && !log.contains("terminate called"),
        "{log}"
    );
}

#[test]
fn launch_failure_more_ranks_than_slots_is_exit_3() {
    let t = tempdir();
    let hf = t.path().join("hosts");
    std::fs::write(&hf, "localhost slots=1\n").expect("hostfile");
    let logs = t.path().join("logs");
    let r = run(
        tchrun()
            .args(["selftest", "--procs-per-node", "2", "--hostfile"])
            .arg(&hf)
            .arg("--log-dir")
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(3), "{}", r.explain());
    assert!(
        r.stderr.contains("not enough slots") && r.stderr.contains("--procs-per-node"),
        "{}",
        r.explain()
    );
    let mpi_log = read(&logs.join("70_mpi_log"));
    assert!(
        mpi_log.contains("There are not enough slots available"),
        "{mpi_log}"
    );
    let failure = read(&logs.join("failure.json"));
    assert!(failure.contains("launch error"), "{failure}");
    let again = run(tchrun().arg("logs").arg(&logs), LIMIT);
    assert_eq!(again.code, Some(0), "{}", again.explain());
    assert!(
        again.stdout.contains("no driver log was written") && again.stdout.contains("70_mpi_log"),
        "{}",
        again.explain()
    );
}

#[test]
fn invalid_flags_are_exit_2_naming_the_flag() {
    // One rank more than this host has cores (refused without --oversubscribe).
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let too_many = (cores + 1).to_string();
    let too_many_named = format!("--procs-per-node {too_many}");
    let cases: &[(&[&str], &str)] = &[
        (&["selftest", "--procs-per-node", "0"], "--procs-per-node"),
        (&["selftest", "--backend", "mpi"], "--backend"),
        (&["selftest", "--nodes", "2"], "--nodes 2"),
        (
            &["selftest", "--procs-per-node", &too_many],
            &too_many_named,
        ),
        (
            &["selftest", "--launcher", "local", "--nodes", "2"],
            "--launcher local",
        ),
        (
            &["selftest", "--hostfile", "/nonexistent/hosts"],
            "--hostfile /nonexistent/hosts",
        ),
        (
            &["selftest", "--worker", "/nonexistent/w"],
            "--worker /nonexistent/w",
        ),
        (&["selftest", "--timeout", "0"], "--timeout"),
    ];
    for (args, needle) in cases {
        let r = run(tchrun().args(*args), LIMIT);
        assert_eq!(r.code, Some(2), "{}", r.explain());
        assert!(
            r.stderr.contains(needle),
            "expected '{needle}' in:\n{}",
            r.explain()
        );
    }
    let r = run(worker().args(["selftest", "--device", "gpu"]), LIMIT);
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(r.stderr.contains("--device"), "{}", r.explain());
    let r = run(
        worker()
            .args(["selftest", "--device", "cuda"])
            .env("TCHRUN_LOG_DIR", tempdir().path()),
        LIMIT,
    );
    assert_eq!(r.code, Some(2), "{}", r.explain());
    assert!(
        r.stderr.contains("--device cuda: no CUDA device"),
        "{}",
        r.explain()
    );
}

#[test]
fn dry_run_prints_command_and_redacts_secrets() {
    let t = tempdir();
    let r = run(
        tchrun()
            .args([
                "selftest",
                "--procs-per-node",
                "2",
                "--dry-run",
                "--log-dir",
            ])
            .arg(t.path().join("logs"))
            .env("TCHRUN_API_TOKEN", "hunter2")
            .env("NCCL_DEBUG", "INFO"),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("mpirun -np 2 --map-by ppr:2:node"),
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.contains("-x NCCL_DEBUG") && r.stdout.contains("NCCL_DEBUG=INFO"),
        "{}",
        r.explain()
    );
    assert!(
        r.stdout.contains("TCHRUN_API_TOKEN=<redacted>") && !r.stdout.contains("hunter2"),
        "{}",
        r.explain()
    );
    assert!(
        !t.path().join("logs").exists(),
        "a dry run must start nothing and write nothing"
    );
}

#[test]
fn exec_sets_the_torchrun_contract() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let script = "echo contract rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK/$LOCAL_WORLD_SIZE node=$NODE_RANK master=$MASTER_ADDR:$MASTER_PORT";
    for launcher in ["mpirun", "local"] {
        let r = run(
            tchrun()
                .args([
                    "exec",
                    "--launcher",
                    launcher,
                    "--procs-per-node",
                    "2",
                    "--log-dir",
                ])
                .arg(&logs)
                .args(["--", "sh", "-c", script]),
            LIMIT,
        );
        assert_eq!(r.code, Some(0), "{}", r.explain());
        let texts = driver_logs(&logs, 2);
        for (rank, text) in texts.iter().enumerate() {
            assert!(
                text.contains(&format!(
                    "contract rank={rank} world=2 local={rank}/2 node=0 master=127.0.0.1:"
                )),
                "{launcher} rank {rank}:\n{text}"
            );
        }
    }
    let r = run(
        tchrun()
            .args(["exec", "--procs-per-node", "2", "--log-dir"])
            .arg(&logs)
            .args(["--", "sh", "-c", "exit 7"]),
        LIMIT,
    );
    assert_eq!(
        r.code,
        Some(4),
        "a rank exiting 7 is 'a rank failed': {}",
        r.explain()
    );
    assert!(r.stderr.contains("failed first"), "{}", r.explain());
}

/// A user's GLOO_SOCKET_IFNAME is honoured as PyTorch honours it: `lo` works (Gloo binds it),
/// and a name that is no interface of the host is refused at once by name, exit 3, under
/// mpirun (rank 0 offers and every rank probes) and under the local launcher alike, as the
/// user's setting to fix, never as a peer's or the network's ("communication error ... raise
/// --timeout" followed the right message before). A name that is an interface's in another
/// case (`LO`) names the interface it almost is.
#[test]
fn gloo_socket_ifname_is_honoured_and_a_missing_interface_is_exit_3() {
    let t = tempdir();
    for (launcher, name) in [("mpirun", "nope0"), ("local", "nope0"), ("local", "LO")] {
        let logs = t.path().join(format!("{name}-{launcher}"));
        let r = run(
            tchrun()
                .env("GLOO_SOCKET_IFNAME", name)
                .args(["selftest", "--procs-per-node", "2", "--launcher", launcher])
                .args(["--sizes", "4096", "--iters", "2", "--log-dir"])
                .arg(&logs),
            LIMIT,
        );
        assert_eq!(r.code, Some(3), "{}", r.explain());
        let all = format!("{}{}", r.stdout, r.stderr);
        let hint = name != "LO" || all.contains("case-sensitive: did you mean lo?");
        assert!(
            all.contains(&format!(
                "GLOO_SOCKET_IFNAME={name}: no such network interface on"
            )) && all.contains("its interfaces: lo")
                && all.contains("set it to one of them or unset it")
                && all.contains("cause: invalid input")
                && !all.contains("communication error")
                && !all.contains("raise --timeout")
                && hint,
            "{}",
            r.explain()
        );
        assert!(r.elapsed < Duration::from_secs(30), "{}", r.explain());
    }
    let logs = t.path().join("lo");
    let r = run(
        tchrun()
            .env("GLOO_SOCKET_IFNAME", "lo")
            .args(["selftest", "--procs-per-node", "2"])
            .args(["--sizes", "4096", "--iters", "2", "--log-dir"])
            .arg(&logs),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    for text in driver_logs(&logs, 2) {
        assert!(
            text.contains("bootstrap: 127.0.0.1 (lo), reached by all 2 ranks")
                && text.contains("Gloo binds interface lo"),
            "{text}"
        );
    }
}
