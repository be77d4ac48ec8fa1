//! `tchrun doctor` end to end with the real binaries: two local ranks (healthy: doctor.json,
//! hostfile.healthy, the table), checks that fail and are named (an output that is a file, a
//! missing data folder, a GPU with ECC errors through a fake `nvidia-smi` on PATH), and with
//! real mpirun on two network-namespace nodes (scripts/netns-nodes.sh): healthy, and a node
//! whose output directory is not shared (its own tmpfs) left out of hostfile.healthy, a node
//! where no rank starts (its login fails) named alone, and four nodes with one link
//! rate-limited (its two pairs named slow). The
//! namespace tests need root; without it they say SKIP (and fail under
//! `TCHRUN_REQUIRE_PRIVILEGED=1`).
mod common;
use common::netns::Nodes;
use common::*;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

const LIMIT: Duration = Duration::from_secs(120);

fn report(logs: &Path) -> Value {
    serde_json::from_str(&read(&logs.join("doctor.json"))).expect("doctor.json is JSON")
}

fn hostfile_lines(logs: &Path) -> (Vec<String>, Vec<String>) {
    let text = read(&logs.join("hostfile.healthy"));
    let (comments, hosts): (Vec<String>, Vec<String>) = text
        .lines()
        .map(str::to_string)
        .partition(|l| l.starts_with('#'));
    (hosts, comments)
}

fn doctor(logs: &Path) -> Command {
    let mut c = tchrun();
    c.args(["doctor", "--link-bytes", "1048576", "--link-iters", "8"])
        .arg("--log-dir")
        .arg(logs);
    c
}

#[test]
fn doctor_two_local_ranks_is_healthy_and_writes_its_report() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let data = t.path().join("data");
    std::fs::create_dir_all(&data).expect("mkdir");
    let out = t.path().join("out");
    let r = run(
        doctor(&logs)
            .args(["--launcher", "local", "--procs-per-node", "2", "--data"])
            .arg(&data)
            .arg("--output")
            .arg(&out),
        LIMIT,
    );
    assert_eq!(r.code, Some(0), "{}", r.explain());
    assert!(
        r.stdout.contains("tchrun doctor: 1 node(s), healthy"),
        "{}",
        r.explain()
    );
    assert!(r.stdout.contains("intra"), "{}", r.explain());
    let j = report(&logs);
    assert_eq!(j["schema"], 1);
    assert_eq!(j["healthy"], true);
    let node = &j["nodes"][0];
    let host = node["host"].as_str().expect("host").to_string();
    assert_eq!(node["tchrun_version"], env!("CARGO_PKG_VERSION"));
    assert!(!node["torch_version"].as_str().unwrap_or("").is_empty());
    assert_eq!(node["paths"][0]["flag"], "--data");
    assert_eq!(node["paths"][0]["visible"], true);
    assert_eq!(node["paths"][1]["writable"], true);
    assert_eq!(node["shared_dir"], out.display().to_string());
    assert_eq!(node["unread_from"].as_array().map(Vec::len), Some(0));
    assert!(node["disk_free_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(node["memory_available_bytes"].as_u64().unwrap_or(0) > 0);
    assert!(node["clock_offset_ms"].as_f64().is_some());
    assert!(out.is_dir(), "the output is created");
    // The shared-file-system test leaves nothing behind.
    assert_eq!(std::fs::read_dir(&out).expect("ls").count(), 0);
    let links = j["network"]["links"].as_array().expect("links");
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(links[0]["ranks"], serde_json::json!([0, 1]));
    assert_eq!(links[0]["intra_node"], true);
    assert_eq!(links[0]["verdict"], "ok");
    assert!(links[0]["busbw_gbs"].as_f64().unwrap_or(0.0) > 0.0);
    let (hosts, _) = hostfile_lines(&logs);
    assert_eq!(hosts, [format!("{host} slots=2")]);
    eprintln!("doctor, 2 local ranks: {:.1}s", r.elapsed.as_secs_f64());
}

#[test]
fn doctor_names_each_failed_check_and_leaves_the_host_out() {
    let t = tempdir();
    let logs = t.path().join("logs");
    let not_dir = t.path().join("a-file");
    std::fs::write(&not_dir, "x").expect("write");
    let missing = t.path().join("no-such-data");
    // A GPU with uncorrected ECC errors, as nvidia-smi reports it.
    let bin = fake_smi(
        t.path(),
        "0, NVIDIA Fake, 550.54.15, 3, No, 0x0000000000000001",
        0,
    );
    let r = run(
        doctor(&logs)
            .env("PATH", path_with(&bin))
            .args(["--launcher", "local", "--device", "cpu", "--data"])
            .arg(&missing)
            .arg("--output")
            .arg(&not_dir),
        LIMIT,
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let j = report(&logs);
    assert_eq!(j["healthy"], false);
    let reasons = j["failed_hosts"][0]["reasons"].to_string();
    for want in [
        format!("--data {}: not visible here", missing.display()),
        format!(
            "--output {}: exists and is not a directory",
            not_dir.display()
        ),
        "GPU 0 has 3 uncorrected ECC error(s)".to_string(),
    ] {
        assert!(reasons.contains(&want), "{want} in {reasons}");
        assert!(r.stderr.contains(&want), "{want}\n{}", r.explain());
    }
    assert_eq!(j["nodes"][0]["gpus"]["driver"], "550.54.15");
    assert!(j["network"].is_null());
    let (hosts, comments) = hostfile_lines(&logs);
    assert!(hosts.is_empty(), "{hosts:?}");
    let host = j["nodes"][0]["host"].as_str().expect("host");
    assert!(
        comments.iter().any(
            |c| c.starts_with(&format!("# {host} slots=1  # left out: ")) && c.contains("--data")
        ),
        "{comments:?}"
    );
}

// ---------------------------------------------------------------- network-namespace nodes

fn script(name: &str) -> PathBuf {
    common::netns::script(name)
}

/// `tchrun doctor` on 2 namespace nodes × 2 ranks through mpirun with `agent` as rsh agent.
fn netns_doctor(t: &Path, agent: &Path, out: &Path) -> (Run, PathBuf) {
    let ompi = t.join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let hostfile = t.join("hostfile");
    std::fs::write(&hostfile, "tchrun-node1 slots=2\ntchrun-node2 slots=2\n").expect("hostfile");
    let logs = t.join("logs");
    let mpirun_args = Nodes::mpirun_args_with(&agent, &ompi);
    let r = run(
        doctor(&logs)
            .env("TMPDIR", &ompi)
            .args([
                "--procs-per-node",
                "2",
                "--launcher",
                "mpirun",
                "--hostfile",
            ])
            .arg(&hostfile)
            .arg("--output")
            .arg(out)
            .arg(format!("--mpirun-args={mpirun_args}")),
        LIMIT,
    );
    (r, logs)
}

#[test]
fn netns_doctor_two_nodes_measures_intra_and_inter_node_links() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let out = t.path().join("out");
    let (r, logs) = netns_doctor(t.path(), &script("netns-rsh.sh"), &out);
    assert_eq!(r.code, Some(0), "{}", r.explain());
    let j = report(&logs);
    let hosts: Vec<&str> = j["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["host"].as_str())
        .collect();
    assert_eq!(hosts, ["tchrun-node1", "tchrun-node2"]);
    let links = j["network"]["links"].as_array().expect("links");
    let pairs: Vec<(String, bool)> = links
        .iter()
        .map(|l| (l["ranks"].to_string(), l["intra_node"] == true))
        .collect();
    assert_eq!(
        pairs,
        [
            ("[0,1]".to_string(), true),
            ("[2,3]".to_string(), true),
            ("[0,2]".to_string(), false),
            ("[1,3]".to_string(), false)
        ]
    );
    assert_eq!(
        links[2]["hosts"],
        serde_json::json!(["tchrun-node1", "tchrun-node2"])
    );
    let (listed, _) = hostfile_lines(&logs);
    assert_eq!(listed, ["tchrun-node1 slots=2", "tchrun-node2 slots=2"]);
    eprintln!("doctor, 2 nodes x 2 ranks: {:.1}s", r.elapsed.as_secs_f64());
}

/// An rsh agent that runs `node2` (a shell command) before the command on tchrun-node2.
fn node2_agent(dir: &Path, node2: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let agent = dir.join("agent.sh");
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
    agent
}

/// A node where mpirun cannot start a rank (its login fails) fails the per-node phase as a
/// whole: `tchrun doctor` then checks each host alone, names that one (exit 4), checks the
/// others together, and measures the links of the healthy host only.
#[test]
fn netns_doctor_names_a_node_where_no_rank_starts() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let out = t.path().join("out");
    let agent = node2_agent(t.path(), "exit 255");
    let (r, logs) = netns_doctor(t.path(), &agent, &out);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    for want in [
        "; checking each host alone",
        "doctor: tchrun-node2 FAILED: its per-node check did not run: ",
    ] {
        assert!(r.stderr.contains(want), "no '{want}' in\n{}", r.explain());
    }
    assert!(!r.stderr.contains("tchrun-node1 FAILED"), "{}", r.explain());
    let j = report(&logs);
    assert_eq!(j["healthy_hosts"], serde_json::json!(["tchrun-node1"]));
    assert_eq!(j["failed_hosts"][0]["host"], "tchrun-node2");
    let (listed, comments) = hostfile_lines(&logs);
    assert_eq!(listed, ["tchrun-node1 slots=2"]);
    assert!(
        comments
            .iter()
            .any(|c| c.starts_with("# tchrun-node2 slots=2  # left out: ")),
        "{comments:?}"
    );
    let links = j["network"]["links"].as_array().expect("links");
    assert_eq!(links.len(), 1, "{links:?}");
}

#[test]
fn netns_doctor_names_a_node_whose_output_is_not_shared() {
    let Some(_nodes) = Nodes::up(2) else { return };
    let t = tempdir();
    let out = t.path().join("out");
    std::fs::create_dir_all(&out).expect("mkdir");
    // node 2 gets a tmpfs of its own over the output (ip netns exec: a private mount
    // namespace per login): what it writes there, no other node sees.
    let mount = format!("mount -t tmpfs tchrun-doctor-test {}", out.display());
    let agent = node2_agent(t.path(), &mount);
    let (r, logs) = netns_doctor(t.path(), &agent, &out);
    assert_eq!(r.code, Some(4), "{}", r.explain());
    let want = format!(
        "tchrun-node2 FAILED: {} is not shared with rank 0's host tchrun-node1: neither node sees the other's file",
        out.display()
    );
    assert!(r.stderr.contains(&want), "{want}\n{}", r.explain());
    let j = report(&logs);
    assert_eq!(j["healthy_hosts"], serde_json::json!(["tchrun-node1"]));
    assert_eq!(j["failed_hosts"][0]["host"], "tchrun-node2");
    let (listed, comments) = hostfile_lines(&logs);
    assert_eq!(listed, ["tchrun-node1 slots=2"]);
    assert!(
        comments
            .iter()
            .any(|c| c.starts_with("# tchrun-node2 slots=2  # left out: ")
                && c.contains("not shared")),
        "{comments:?}"
    );
    // The links were measured on the healthy host only (hostfile.healthy).
    let links = j["network"]["links"].as_array().expect("links");
    assert_eq!(links.len(), 1, "{links:?}");
    assert_eq!(
        links[0]["hosts"],
        serde_json::json!(["tchrun-node1", "tchrun-node1"])
    );
}

/// Issue 33 item 4: a slow link between namespace nodes. 4 nodes × 1 rank; the bridge side of
/// tchrun-node4's link is rate-limited to 40 Mbit/s with a token bucket (`tc qdisc ... tbf`;
/// this kernel has no `sch_netem`, and a rate limit is what a degraded link looks like to a
/// bandwidth test). The pairs of round 0 are (0,1) and (2,3), of round 1 (0,2) and (1,3): the
/// two through node 4 are named slow with their ranks and hosts, the others are not, and every
/// host stays in `hostfile.healthy` (a link does not say which of its hosts is at fault).
#[test]
fn netns_doctor_names_the_pairs_of_a_slowed_link() {
    let Some(_nodes) = Nodes::up(4) else { return };
    let tc = run(
        Command::new("tc").args([
            "qdisc",
            "add",
            "dev",
            "tchrun-v4",
            "root",
            "tbf",
            "rate",
            "40mbit",
            "burst",
            "32kbit",
            "latency",
            "400ms",
        ]),
        Duration::from_secs(10),
    );
    assert_eq!(tc.code, Some(0), "{}", tc.explain());
    let t = tempdir();
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("tmp");
    let hostfile = t.path().join("hostfile");
    let hosts: String = (1..=4)
        .map(|k| format!("tchrun-node{k} slots=1\n"))
        .collect();
    std::fs::write(&hostfile, hosts).expect("hostfile");
    let logs = t.path().join("logs");
    let mpirun_args = Nodes::mpirun_args(&ompi);
    let r = run(
        doctor(&logs)
            .env("TMPDIR", &ompi)
            .args([
                "--nodes",
                "4",
                "--procs-per-node",
                "1",
                "--launcher",
                "mpirun",
            ])
            .arg("--hostfile")
            .arg(&hostfile)
            .arg("--output")
            .arg(t.path().join("out"))
            .arg(format!("--mpirun-args={mpirun_args}")),
        LIMIT,
    );
    assert_eq!(r.code, Some(4), "{}", r.explain());
    for pair in [
        "link rank 1 (tchrun-node2) <-> rank 3 (tchrun-node4) slow: ",
        "link rank 2 (tchrun-node3) <-> rank 3 (tchrun-node4) slow: ",
    ] {
        assert!(
            r.stderr.contains(&format!("doctor: {pair}")),
            "no '{pair}' in\n{}",
            r.explain()
        );
    }
    let j = report(&logs);
    let bad = j["bad_links"].as_array().expect("bad_links");
    assert_eq!(bad.len(), 2, "{j}");
    assert!(
        bad.iter()
            .all(|l| l.as_str().is_some_and(|l| l.contains("tchrun-node4"))),
        "{j}"
    );
    assert_eq!(j["failed_hosts"], serde_json::json!([]), "{j}");
    let (listed, _) = hostfile_lines(&logs);
    assert_eq!(listed.len(), 4, "{listed:?}");
}
