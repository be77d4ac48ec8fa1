//! The stranger of the security tests (`tests/python/stranger.py`): another user who attacks
//! every port a job opens, from before it starts until it ends.
use super::{read, repo, skip_or_fail, wait_for};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The stranger's user and group (nobody).
pub const STRANGER_ID: &str = "65534";

/// The stranger, running as another user.
pub struct Stranger {
    child: Child,
    out: PathBuf,
    stop: PathBuf,
}

impl Stranger {
    /// Starts the stranger (as `nobody`; root is needed to be another user) in the network
    /// namespace `ns` and waits until it has noted the ports already open. None: skipped (not
    /// root). With `targets` the ports to attack come from that file
    /// (`HOST PORT` lines, appended as they appear) instead of the stranger's own namespace.
    pub fn start(
        dir: &Path,
        ns: &str,
        forge: Option<(&str, &str)>,
        targets: Option<&Path>,
    ) -> Option<Stranger> {
        if !nix::unistd::geteuid().is_root() {
            skip_or_fail("the stranger runs as another user, which needs root");
            return None;
        }
        use std::os::unix::fs::PermissionsExt;
        let sdir = dir.join("stranger");
        std::fs::create_dir_all(&sdir).expect("stranger dir");
        for d in [dir, sdir.as_path()] {
            std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let (out, stop) = (sdir.join("rows.jsonl"), sdir.join("stop"));
        std::fs::write(&out, "").expect("rows file");
        std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let py = repo().join(".venv/bin/python");
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, "setpriv"])
            .args([
                "--reuid",
                STRANGER_ID,
                "--regid",
                STRANGER_ID,
                "--clear-groups",
            ])
            .arg(&py)
            .arg(repo().join("tests/python/stranger.py"))
            .arg(&out)
            .arg(&stop)
            .arg("240")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(sdir.join("stderr")).expect("stderr"));
        if let Some((k, v)) = forge {
            c.args(["--forge", k, v]);
        }
        if let Some(f) = targets {
            c.arg("--targets").arg(f);
        }
        let child = c.spawn().expect("start the stranger");
        let s = Stranger { child, out, stop };
        assert!(
            wait_for(Duration::from_secs(60), || read(&s.out).contains("ready")),
            "the stranger did not start: {}",
            read(&sdir.join("stderr"))
        );
        Some(s)
    }

    /// Stops it and returns its c10d attempts and the ports it attacked.
    pub fn stop(mut self) -> (Vec<serde_json::Value>, Vec<u64>) {
        std::fs::write(&self.stop, "").expect("stop file");
        let start = Instant::now();
        while self.child.try_wait().ok().flatten().is_none() && start.elapsed().as_secs() < 30 {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let rows: Vec<serde_json::Value> = read(&self.out)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        let ports = rows
            .iter()
            .find(|r| r["done"] == true)
            .and_then(|r| r["ports"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|p| p.as_u64())
            .collect();
        (
            rows.into_iter()
                .filter(|r| r.get("joined").is_some())
                .collect(),
            ports,
        )
    }
}
