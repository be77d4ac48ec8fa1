//! Issue 51 across nodes: two network-namespace nodes (one rank each, started by mpirun over
//! the bridge, `scripts/netns-nodes.sh`) and a stranger on a third node of the same bridge,
//! as another user (`tests/python/stranger.py --targets`). The stranger cannot list another
//! node's sockets, so the test, which sees every namespace, finds the job's listening ports
//! every 20 ms (from each process's `/proc/PID/fd` and its namespace's `/proc/PID/net/tcp*`)
//! and hands them over as they appear. Only what the bridge reaches is attacked: a port bound
//! to a node's loopback is out of the stranger's reach, which is the point.
mod common;
use common::netns::Nodes;
use common::stranger::Stranger;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

const LIMIT: Duration = Duration::from_secs(240);
/// `--hang-timeout` of the attacked runs: the bound on a launch that starts no rank.
const HANG_TIMEOUT_S: u64 = 30;

/// The job's programs whose ports are attacked: the ranks, and Open MPI's daemons.
const RANKS: &[&str] = &["tchrun-worker"];
const MPI_DAEMONS: &[&str] = &["orted", "mpirun", "orterun"];

/// The inode of `/proc/PID/ns/net`.
fn netns_of(pid: u32) -> Option<String> {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .ok()
        .map(|l| l.to_string_lossy().into_owned())
}

/// The listening TCP sockets of `pid`'s namespace: inode -> (address, port).
fn listening_in(pid: u32) -> BTreeMap<u64, (String, u16)> {
    let mut found = BTreeMap::new();
    for table in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 || f[3] != "0A" {
                continue;
            }
            let (Some((addr, port)), Ok(inode)) = (f[1].split_once(':'), f[9].parse::<u64>())
            else {
                continue;
            };
            let Ok(port) = u16::from_str_radix(port, 16) else {
                continue;
            };
            let bytes: Vec<u8> = (0..addr.len() / 8)
                .flat_map(|i| {
                    u32::from_str_radix(&addr[8 * i..8 * i + 8], 16)
                        .unwrap_or(0)
                        .to_le_bytes()
                })
                .collect();
            let host = match <[u8; 4]>::try_from(bytes.as_slice()) {
                Ok(v4) => std::net::Ipv4Addr::from(v4).to_string(),
                Err(_) => match <[u8; 16]>::try_from(bytes.as_slice()) {
                    Ok(v6) => {
                        let v6 = std::net::Ipv6Addr::from(v6);
                        v6.to_ipv4_mapped()
                            .map_or(v6.to_string(), |v4| v4.to_string())
                    }
                    Err(_) => continue,
                },
            };
            found.insert(inode, (host, port));
        }
    }
    found
}

/// The socket inodes `pid` holds open.
fn sockets_of(pid: u32) -> BTreeSet<u64> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let l = std::fs::read_link(e.path()).ok()?;
            let l = l.to_string_lossy();
            l.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// `/proc/PID/stat`'s parent pid.
fn parent_of(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Where the job runs: each node's namespace and bridge address, and the launcher's pid
/// (mpirun, its child, runs in the head's namespace at 10.250.0.1).
struct Layout {
    nodes: Vec<(String, String)>,
    launcher: u32,
}

impl Layout {
    /// Every port of the job's `programs` that the bridge reaches, as "ADDRESS PORT", and
    /// those out of its reach (loopback) as "NODE:ADDRESS:PORT".
    fn ports(&self, programs: &[&str]) -> (BTreeSet<(String, u16)>, BTreeSet<String>) {
        let (mut reach, mut out) = (BTreeSet::new(), BTreeSet::new());
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
            if !programs.contains(&comm.trim()) {
                continue;
            }
            let ns = netns_of(pid);
            let node = match self.nodes.iter().find(|(n, _)| Some(n) == ns.as_ref()) {
                Some((_, ip)) => ip.clone(),
                None if parent_of(pid) == Some(self.launcher) => "10.250.0.1".to_string(),
                None => continue, // not this job's
            };
            let mine = sockets_of(pid);
            for (inode, (host, port)) in listening_in(pid) {
                if !mine.contains(&inode) {
                    continue;
                }
                match host.as_str() {
                    "0.0.0.0" | "::" => reach.insert((node.clone(), port)),
                    h if h.starts_with("10.250.0.") => reach.insert((h.to_string(), port)),
                    h => out.insert(format!("{node}:{h}:{port}")),
                };
            }
        }
        (reach, out)
    }
}

impl Layout {
    /// The processes still in the nodes' namespaces (but the parked ones), as "PID COMM".
    fn left(&self, parked: &[Parked]) -> Vec<String> {
        let mut left = Vec::new();
        for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|p| p.parse::<u32>().ok()) else {
                continue;
            };
            let in_node = netns_of(pid).is_some_and(|n| self.nodes.iter().any(|(id, _)| *id == n));
            if in_node && !parked.iter().any(|p| p.0.id() == pid) {
                let comm = std::fs::read_to_string(e.path().join("comm")).unwrap_or_default();
                left.push(format!("{pid} {}", comm.trim()));
            }
        }
        left
    }
}

/// A process parked in namespace `ns`, so that the namespace's identity can be read.
struct Parked(Child);

impl Drop for Parked {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What one attacked run came to.
struct Attacked {
    code: Option<i32>,
    output: String,
    seen: BTreeSet<(String, u16)>,
    out_of_reach: BTreeSet<String>,
    tries: Vec<serde_json::Value>,
    elapsed: Duration,
    /// Open MPI's ports in the ranks, left alone (`tchruns_own`).
    mpi_init: BTreeSet<(String, u16)>,
    /// The job's processes still on the nodes 10 s after it ended.
    left: Vec<String>,
}

/// Runs `job` while the stranger on tchrun-node3 attacks every port of `programs` as it
/// appears; with `tchruns_own`, only the ports that open once the ranks have their driver
/// logs (`logs`): those before are Open MPI's, opened by `MPI_Init`. None: skipped (not root).
fn attacked_run(
    t: &Path,
    name: &str,
    job: &mut Command,
    programs: &[&str],
    tchruns_own: Option<&Path>,
) -> Option<Attacked> {
    let parked: Vec<Parked> = (1..=2)
        .map(|k| {
            let child = Command::new("ip")
                .args(["netns", "exec", &format!("tchrun-node{k}"), "sleep", "600"])
                .spawn()
                .expect("sleep in a node's namespace");
            Parked(child)
        })
        .collect();
    let ids: Vec<String> = parked
        .iter()
        .map(|p| {
            let mut id = None;
            wait_for(Duration::from_secs(10), || {
                id =
                    netns_of(p.0.id()).filter(|n| Some(n) != netns_of(std::process::id()).as_ref());
                id.is_some()
            });
            id.expect("a node's namespace")
        })
        .collect();
    let dir = t.join(name);
    std::fs::create_dir_all(&dir).expect("dir");
    let targets = dir.join("targets");
    std::fs::write(&targets, "").expect("targets");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&targets, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let stranger = Stranger::start(&dir, "tchrun-node3", None, Some(&targets))?;
    let start = Instant::now();
    let mut running = Job::start(job, &dir);
    let layout = Layout {
        nodes: ids
            .into_iter()
            .zip(["10.250.0.11", "10.250.0.12"])
            .map(|(n, ip)| (n, ip.to_string()))
            .collect(),
        launcher: running.pid().as_raw() as u32,
    };
    let (mut seen, mut out_of_reach) = (BTreeSet::new(), BTreeSet::new());
    let mut mpi_init = BTreeSet::new();
    let code = loop {
        if let Some(code) = running.wait(Duration::from_millis(20)) {
            break Some(code);
        }
        if start.elapsed() > LIMIT {
            break None;
        }
        let (reach, out) = layout.ports(programs);
        out_of_reach.extend(out);
        if let Some(logs) = tchruns_own {
            let started = (0..2).all(|r| logs.join(format!("70_driver_log_{r}")).exists());
            if !started {
                mpi_init.extend(reach);
                continue;
            }
        }
        let text: String = reach
            .into_iter()
            .filter(|p| !mpi_init.contains(p) && seen.insert(p.clone()))
            .map(|(h, p)| format!("{h} {p}\n"))
            .collect();
        if !text.is_empty() {
            let mut f = std::fs::OpenOptions::new()
                .append(true)
                .open(&targets)
                .expect("targets");
            std::io::Write::write_all(&mut f, text.as_bytes()).expect("write targets");
        }
    };
    let elapsed = start.elapsed();
    let (tries, _) = stranger.stop();
    let mut left = Vec::new();
    wait_for(Duration::from_secs(10), || {
        left = layout.left(&parked);
        left.is_empty()
    });
    Some(Attacked {
        code,
        output: running.output(),
        seen,
        out_of_reach,
        tries,
        elapsed,
        mpi_init,
        left,
    })
}

/// The stranger on the third node attacks first every port of the two ranks (store front,
/// relays, Gloo, Open MPI's transport in the ranks), then, in a second job, Open MPI's own
/// daemons too (mpirun on the head, orted on each node). The ranks' ports are robust: the
/// job's model equals the unattacked run's bit for bit, no c10d client without the secret
/// joins, and rank 0 logs the refusal with the stranger's address. Open MPI's daemons are
/// not tchrun's: a stranger's bytes there can wedge Open MPI's launch (measured: every
/// attacked launch here), and then tchrun ends the job within `--hang-timeout`, exit 3,
/// naming the hosts whose daemons received them and leaving no process behind.
#[test]
fn a_stranger_on_another_node_neither_joins_nor_harms_a_two_node_job() {
    let Some(_nodes) = Nodes::up(3) else { return };
    if !nix::unistd::geteuid().is_root() {
        skip_or_fail("the stranger runs as another user: needs root");
        return;
    }
    let t = tempdir();
    let model = model_dir(t.path(), "resnet18", 32);
    let hostfile = t.path().join("hostfile");
    std::fs::write(&hostfile, "tchrun-node1 slots=1\ntchrun-node2 slots=1\n").expect("hostfile");
    let ompi = t.path().join("ompi");
    std::fs::create_dir_all(&ompi).expect("ompi tmp");
    let d = small_digits();
    let job = |out: &Path| {
        let mut c = tchrun_train(&model, &d.join("train"), &d.join("valid"), out);
        c.env("TMPDIR", &ompi)
            .args(["--nodes", "2", "--procs-per-node", "1", "--hostfile"])
            .arg(&hostfile)
            .arg(format!("--mpirun-args={}", Nodes::mpirun_args(&ompi)))
            .args(["--epochs", "1", "--batch-size", "20", "--threads", "1"])
            .args(["--hang-timeout", &HANG_TIMEOUT_S.to_string()])
            .env_remove("TCHRUN_THREADS")
            .env_remove("TCHRUN_ATTEMPT")
            .env_remove("TCHRUN_JOB_SECRET");
        c
    };
    let calm = t.path().join("calm");
    let r = run(&mut job(&calm), LIMIT);
    assert_eq!(r.code, Some(0), "{}", r.explain());

    // 1. The ranks' ports.
    let ranks_out = t.path().join("ranks-attacked");
    let Some(a) = attacked_run(
        t.path(),
        "ranks",
        &mut job(&ranks_out),
        RANKS,
        Some(&ranks_out.join("logs")),
    ) else {
        return;
    };
    let facts = format!(
        "attacked {:?}; Open MPI's, left alone {:?}; out of reach {:?}",
        a.seen, a.mpi_init, a.out_of_reach
    );
    assert_eq!(a.code, Some(0), "{}\n{facts}", a.output);
    let joined: Vec<_> = a.tries.iter().filter(|r| r["joined"] == true).collect();
    assert!(joined.is_empty(), "a stranger joined the store: {joined:?}");
    let log0 = read(&ranks_out.join("logs/70_driver_log_0"));
    let front = log0
        .split("master=")
        .nth(1)
        .and_then(|s| s.split([' ', '\n']).next())
        .and_then(|m| m.rsplit_once(':'))
        .and_then(|(_, p)| p.parse::<u16>().ok())
        .expect("rank 0's driver log names the store's address");
    assert!(
        a.seen.contains(&("10.250.0.11".to_string(), front)),
        "the stranger never reached the front ({front}): {facts}"
    );
    assert!(
        log0.contains("rendezvous: refused an unauthenticated connection from 10.250.0.13:"),
        "{log0}\n{facts}"
    );
    let read_model = |o: &Path| std::fs::read(o.join("model.safetensors")).expect("model");
    assert!(
        read_model(&calm) == read_model(&ranks_out),
        "the attacked run's model differs from the unattacked run's: {facts}"
    );
    assert!(a.left.is_empty(), "left on the nodes: {:?}", a.left);
    eprintln!(
        "ranks attacked: {} port(s) in {:.1} s: {facts}",
        a.seen.len(),
        a.elapsed.as_secs_f64()
    );

    // 2. Open MPI's daemons too: finished as the calm run, or ended in bounded time, exit 3,
    // naming what happened.
    let all_out = t.path().join("all-attacked");
    let programs = [RANKS, MPI_DAEMONS].concat();
    let Some(a) = attacked_run(t.path(), "all", &mut job(&all_out), &programs, None) else {
        return;
    };
    let facts = format!("attacked {:?}; out of reach {:?}", a.seen, a.out_of_reach);
    assert!(
        a.seen.iter().any(|(h, _)| h == "10.250.0.1"),
        "mpirun's port was never attacked: {facts}"
    );
    let joined: Vec<_> = a.tries.iter().filter(|r| r["joined"] == true).collect();
    assert!(joined.is_empty(), "a stranger joined the store: {joined:?}");
    match a.code {
        Some(0) => assert!(
            read_model(&calm) == read_model(&all_out),
            "the attacked run's model differs from the unattacked run's: {facts}"
        ),
        Some(3) => {
            let mpi_log = read(&all_out.join("logs/70_mpi_log"));
            eprintln!("70_mpi_log of the wedged launch:\n{mpi_log}");
            assert!(
                a.output
                    .contains("no rank started within 30 s (--hang-timeout)")
                    && a.output.contains("Open MPI's out-of-band listener on ")
                    && a.output.contains("received bytes that are not Open MPI's"),
                "{}\n{facts}\n70_mpi_log:\n{mpi_log}",
                a.output
            );
            assert!(
                a.elapsed < Duration::from_secs(HANG_TIMEOUT_S + 30),
                "ended after {:?}",
                a.elapsed
            );
            let failure = read(&all_out.join("logs/failure.json"));
            assert!(failure.contains("launch error"), "{failure}");
            assert!(!all_out.join("model.safetensors").exists());
        }
        other => panic!(
            "exit {other:?}:\n{}\n{facts}\n70_mpi_log:\n{}",
            a.output,
            std::fs::read_to_string(all_out.join("logs/70_mpi_log")).unwrap_or_default()
        ),
    }
    assert!(a.left.is_empty(), "left on the nodes: {:?}", a.left);
    eprintln!(
        "daemons and ranks attacked: exit {:?} after {:.1} s: {facts}",
        a.code,
        a.elapsed.as_secs_f64()
    );
}
