//! Simulated cluster nodes for the tests: network namespaces tchrun-node1..n made by
//! `scripts/netns-nodes.sh` (root only), reached by mpirun through `scripts/netns-rsh.sh`.
use super::{run, skip_or_fail};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// One set of namespaces at a time (cargo runs tests on several threads).
static NETNS: Mutex<()> = Mutex::new(());

/// A script of the repository's `scripts/`.
pub fn script(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("scripts")
        .join(name)
}

extern "C" {
    fn geteuid() -> u32;
}

/// `n` namespaces tchrun-node1..n; removed (with their /etc/hosts lines) on drop.
pub struct Nodes {
    _lock: MutexGuard<'static, ()>,
}

impl Nodes {
    /// None (after printing why, or failing under `TCHRUN_REQUIRE_PRIVILEGED=1`) where
    /// namespaces cannot be made.
    pub fn up(n: usize) -> Option<Nodes> {
        let lock = NETNS.lock().unwrap_or_else(|e| e.into_inner());
        if unsafe { geteuid() } != 0 {
            skip_or_fail("network-namespace nodes need root (CAP_NET_ADMIN); not root here");
            return None;
        }
        let nodes = Nodes { _lock: lock };
        let r = run(
            Command::new(script("netns-nodes.sh")).args(["up", &n.to_string()]),
            Duration::from_secs(30),
        );
        if r.code == Some(3) {
            skip_or_fail(&format!(
                "cannot create network namespaces here: {}",
                r.stderr.trim()
            ));
            return None;
        }
        assert_eq!(r.code, Some(0), "{}", r.explain());
        Some(nodes)
    }

    /// `dir/hostfile` with tchrun-node1..n, `slots` each.
    pub fn hostfile(dir: &Path, n: usize, slots: usize) -> PathBuf {
        let f = dir.join("hostfile");
        let text: String = (1..=n)
            .map(|k| format!("tchrun-node{k} slots={slots}\n"))
            .collect();
        std::fs::write(&f, text).expect("hostfile");
        f
    }

    /// mpirun's flags for the namespaces, with a private session directory under `tmp`.
    pub fn mpirun_args(tmp: &Path) -> String {
        Nodes::mpirun_args_with(&script("netns-rsh.sh"), tmp)
    }

    /// `mpirun_args` with another rsh agent (a wrapper of netns-rsh.sh).
    pub fn mpirun_args_with(agent: &Path, tmp: &Path) -> String {
        format!(
            "--mca plm_rsh_agent {} --mca btl_tcp_if_include 10.250.0.0/24 --mca oob_tcp_if_include 10.250.0.0/24 --mca orte_tmpdir_base {}",
            agent.display(),
            tmp.display()
        )
    }
}

impl Drop for Nodes {
    fn drop(&mut self) {
        let r = Command::new("timeout")
            .arg("30")
            .arg(script("netns-nodes.sh"))
            .arg("down")
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            eprintln!("warning: scripts/netns-nodes.sh down failed: {r:?}");
        }
    }
}
