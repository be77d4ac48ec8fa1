//! The tests' real single-node Slurm (scripts/slurm-cluster.sh): started in a directory of
//! its own on free ports, one at a time per test binary, stopped on drop (`cluster.rs`,
//! `sweep.rs`).
use super::{repo, run, skip_or_fail, tchrun, tempdir, wait_for};
use std::path::PathBuf;
use std::process::Command;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

/// `value` of the first `key` in a text (`JobState=X`, `host: Y`).
pub fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let i = text.find(key)?;
    text[i + key.len()..].split_whitespace().next()
}

static SLURM: Mutex<()> = Mutex::new(());

/// A running single-node Slurm (scripts/slurm-cluster.sh) in its own directory; stopped on
/// drop. Every Slurm command gets `SLURM_CONF` through `cmd()`.
pub struct Slurm {
    pub dir: tempfile::TempDir,
    pub conf: PathBuf,
    _lock: MutexGuard<'static, ()>,
}

impl Slurm {
    pub fn start() -> Option<Slurm> {
        let lock = SLURM.lock().unwrap_or_else(|e| e.into_inner());
        if !nix::unistd::geteuid().is_root() {
            skip_or_fail(
                "the test Slurm runs as root (SlurmUser=root, munged as munge); not root here",
            );
            return None;
        }
        let dir = tempdir();
        let conf = dir.path().join("slurm.conf");
        let s = Slurm {
            dir,
            conf,
            _lock: lock,
        };
        // Ports nobody holds (a daemon of a killed earlier run may still hold the default).
        let free = |p: u16| (p..p + 2).all(|q| std::net::TcpListener::bind(("0.0.0.0", q)).is_ok());
        let port = (0..20)
            .map(|i| 16817 + 1000 * i)
            .find(|&p| free(p))
            .expect("no free port pair for Slurm");
        let r = run(
            Command::new(repo().join("scripts/slurm-cluster.sh"))
                .env("SLURM_CLUSTER_PORT", port.to_string())
                .arg("start")
                .arg(s.dir.path()),
            Duration::from_secs(60),
        );
        assert_eq!(
            r.code,
            Some(0),
            "scripts/slurm-cluster.sh start failed (run scripts/setup.sh for slurmctld/slurmd/munge)\n{}",
            r.explain()
        );
        assert!(
            r.stdout
                .contains(&format!("export SLURM_CONF={}", s.conf.display())),
            "{}",
            r.explain()
        );
        Some(s)
    }

    /// A Slurm client (or anything that runs one) with this cluster's config.
    pub fn cmd(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    pub fn tchrun(&self) -> Command {
        let mut c = tchrun();
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// `JobState=...` and `ExitCode=...` of a job.
    pub fn job_state(&self, id: u64) -> (String, String) {
        let r = run(
            self.cmd("scontrol").args(["show", "job", &id.to_string()]),
            Duration::from_secs(10),
        );
        let state = field(&r.stdout, "JobState=")
            .unwrap_or("UNKNOWN")
            .to_string();
        let code = field(&r.stdout, "ExitCode=").unwrap_or("?").to_string();
        (state, code)
    }

    /// Polls until the job is in a final state (bounded); returns (state, exit code).
    pub fn wait_job(&self, id: u64, limit: Duration) -> (String, String) {
        let mut last = (String::new(), String::new());
        let done = wait_for(limit, || {
            last = self.job_state(id);
            matches!(
                last.0.as_str(),
                "COMPLETED" | "FAILED" | "CANCELLED" | "TIMEOUT" | "NODE_FAIL" | "OUT_OF_MEMORY"
            )
        });
        assert!(done, "job {id} not finished after {limit:?}: {last:?}");
        last
    }
}

impl Drop for Slurm {
    fn drop(&mut self) {
        let r = Command::new("timeout")
            .arg("60")
            .arg(repo().join("scripts/slurm-cluster.sh"))
            .arg("stop")
            .arg(self.dir.path())
            .env("SLURM_CONF", &self.conf)
            .status();
        if !matches!(r, Ok(s) if s.success()) {
            eprintln!("warning: scripts/slurm-cluster.sh stop failed: {r:?}");
        }
    }
}
