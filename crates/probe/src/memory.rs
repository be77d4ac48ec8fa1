//! A process's memory and the limit it runs under, read from `/proc` and the memory cgroup
//! (v1: `memory.limit_in_bytes`, `memory.oom_control`; v2: `memory.max`, `memory.events`):
//! what a rank publishes (`job_record::memory`) and what the launcher reads after a rank was
//! killed, to tell the kernel's OOM killer from a signal someone sent. Pure parsers plus thin
//! readers; knows nothing of ranks or jobs.
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MIB: u64 = 1024 * 1024;
/// cgroup v1 writes "no limit" as the largest page-aligned `i64`; anything this large is none.
const UNLIMITED_V1: u64 = 1 << 62;

/// Which cgroup hierarchy a memory cgroup belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CgroupVersion {
    V1,
    V2,
}

/// A process's memory cgroup: its hierarchy and its path inside it (`/` for the root).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cgroup {
    pub version: CgroupVersion,
    pub path: String,
}

/// Where the cgroup file systems are mounted (the usual places; systemd and Docker use them).
pub const V1_MEMORY_ROOT: &str = "/sys/fs/cgroup/memory";
pub const V2_ROOT: &str = "/sys/fs/cgroup";

impl Cgroup {
    /// The memory cgroup named in `/proc/<pid>/cgroup`'s text: the v1 line whose controllers
    /// include `memory`, else the v2 line (`0::/path`).
    pub fn parse_proc(text: &str) -> Option<Cgroup> {
        let mut v2 = None;
        for line in text.lines() {
            let mut parts = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            if controllers.split(',').any(|c| c == "memory") {
                return Some(Cgroup {
                    version: CgroupVersion::V1,
                    path: path.to_string(),
                });
            }
            if id == "0" && controllers.is_empty() {
                v2 = Some(Cgroup {
                    version: CgroupVersion::V2,
                    path: path.to_string(),
                });
            }
        }
        v2
    }

    /// This process's memory cgroup.
    pub fn of_self() -> Option<Cgroup> {
        Cgroup::parse_proc(&std::fs::read_to_string("/proc/self/cgroup").ok()?)
    }

    /// The cgroup's directory under `root` (`V1_MEMORY_ROOT` or `V2_ROOT` on a real system).
    pub fn dir_under(&self, root: &Path) -> PathBuf {
        root.join(self.path.trim_start_matches('/'))
    }

    /// The cgroup's directory on this system.
    pub fn dir(&self) -> PathBuf {
        self.dir_under(Path::new(match self.version {
            CgroupVersion::V1 => V1_MEMORY_ROOT,
            CgroupVersion::V2 => V2_ROOT,
        }))
    }

    /// The file that counts the cgroup's OOM kills (`oom_kill N` in both).
    pub fn events_file(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "memory.oom_control",
            CgroupVersion::V2 => "memory.events",
        }
    }

    /// The file of the cgroup's own limit.
    pub fn limit_file(&self) -> &'static str {
        match self.version {
            CgroupVersion::V1 => "memory.limit_in_bytes",
            CgroupVersion::V2 => "memory.max",
        }
    }

    /// The OOM kills the kernel counted in this cgroup (and, on v2, below it) so far; `None`
    /// when the file cannot be read (another host's cgroup, no memory controller).
    pub fn oom_kills(&self) -> Option<u64> {
        let text = std::fs::read_to_string(self.dir().join(self.events_file())).ok()?;
        oom_kill_count(&text)
    }

    /// The tightest memory limit on this cgroup and its ancestors, with the path of the
    /// cgroup that sets it; `None` when none is set (or none can be read).
    pub fn limit(&self) -> Option<(u64, String)> {
        let root = Path::new(match self.version {
            CgroupVersion::V1 => V1_MEMORY_ROOT,
            CgroupVersion::V2 => V2_ROOT,
        });
        self.limit_under(root)
    }

    /// `limit` with the hierarchy mounted at `root` (for tests).
    pub fn limit_under(&self, root: &Path) -> Option<(u64, String)> {
        let mut best: Option<(u64, String)> = None;
        let mut path = PathBuf::from(&self.path);
        loop {
            let cg = Cgroup {
                version: self.version,
                path: path.to_string_lossy().into_owned(),
            };
            let limit = std::fs::read_to_string(cg.dir_under(root).join(cg.limit_file()))
                .ok()
                .and_then(|t| parse_limit(&t));
            if let Some(l) = limit {
                let tighter = match &best {
                    Some((b, _)) => l < *b,
                    None => true,
                };
                if tighter {
                    best = Some((l, cg.path.clone()));
                }
            }
            if !path.pop() {
                break;
            }
        }
        best
    }
}

/// `oom_kill N` of `memory.oom_control` (v1) or `memory.events` (v2).
pub fn oom_kill_count(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (key, value) = l.trim().split_once(' ')?;
        (key == "oom_kill").then(|| value.trim().parse().ok())?
    })
}

/// A limit file's bytes: `memory.max` (`max` is none) or `memory.limit_in_bytes` (a huge
/// value is none).
pub fn parse_limit(text: &str) -> Option<u64> {
    let t = text.trim();
    if t == "max" {
        return None;
    }
    t.parse::<u64>().ok().filter(|b| *b < UNLIMITED_V1)
}

/// Bytes to whole MiB (rounded down).
pub fn mib(bytes: u64) -> u64 {
    bytes / MIB
}

/// Resident memory of this process now and at its peak (`VmRSS`, `VmHWM` of
/// `/proc/self/status`), bytes.
pub fn rss_bytes() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/status").ok()?;
    Some((
        status_kb(&text, "VmRSS:")?,
        status_kb(&text, "VmHWM:").unwrap_or(0),
    ))
}

/// A `Key:   123 kB` line of `/proc/<pid>/status` or `/proc/meminfo`, bytes.
pub fn status_kb(text: &str, key: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024)
}

/// The node's memory (`MemTotal` of `/proc/meminfo`), bytes.
pub fn node_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    status_kb(&text, "MemTotal:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_memory_cgroup_is_found_in_v1_and_v2_proc_files() {
        // This machine's shape (cgroup v1, the memory controller on its own line).
        let v1 = "9:name=systemd:/\n5:devices:/\n4:memory:/process_api/6841\n3:cpuset:/\n0::/\n";
        assert_eq!(
            Cgroup::parse_proc(v1),
            Some(Cgroup {
                version: CgroupVersion::V1,
                path: "/process_api/6841".into()
            })
        );
        // Controllers joined on one line (RHEL 7).
        let joined = "11:cpuacct,cpu:/a\n7:memory,hugetlb:/slurm/uid_0/job_5\n";
        assert_eq!(
            Cgroup::parse_proc(joined).map(|c| c.path),
            Some("/slurm/uid_0/job_5".to_string())
        );
        // A unified (v2) system: one line.
        let v2 = "0::/user.slice/user-1000.slice/session-3.scope\n";
        let cg = Cgroup::parse_proc(v2).expect("v2");
        assert_eq!(cg.version, CgroupVersion::V2);
        assert_eq!(
            cg.dir(),
            Path::new("/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope")
        );
        assert_eq!(cg.events_file(), "memory.events");
        assert_eq!(Cgroup::parse_proc("garbage\n"), None);
    }

    #[test]
    fn oom_kills_and_limits_are_read_from_both_versions() {
        // v1 `memory.oom_control` as the kernel writes it.
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(oom_kill_count(v1), Some(2));
        // v2 `memory.events`.
        let v2 = "low 0\nhigh 0\nmax 17\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(oom_kill_count(v2), Some(1));
        assert_eq!(oom_kill_count("oom_kill_disable 0\n"), None);
        assert_eq!(parse_limit("max\n"), None);
        assert_eq!(parse_limit("9223372036854771712\n"), None);
        assert_eq!(parse_limit("1073741824\n"), Some(1 << 30));
        assert_eq!(parse_limit("bogus"), None);
        assert_eq!(
            status_kb("MemTotal:       24683712 kB\nMemFree: 1 kB\n", "MemTotal:"),
            Some(24683712 * 1024)
        );
    }

    #[test]
    fn the_tightest_limit_of_the_ancestors_counts() {
        let t = tempfile::tempdir().expect("tempdir");
        let root = t.path();
        std::fs::create_dir_all(root.join("job/step")).expect("mkdir");
        std::fs::write(root.join("memory.max"), "max\n").expect("write");
        std::fs::write(root.join("job/memory.max"), "2147483648\n").expect("write");
        std::fs::write(root.join("job/step/memory.max"), "max\n").expect("write");
        let cg = Cgroup {
            version: CgroupVersion::V2,
            path: "/job/step".into(),
        };
        assert_eq!(cg.limit_under(root), Some((2 << 30, "/job".to_string())));
        std::fs::write(root.join("job/step/memory.max"), "1073741824\n").expect("write");
        assert_eq!(
            cg.limit_under(root),
            Some((1 << 30, "/job/step".to_string()))
        );
        let none = Cgroup {
            version: CgroupVersion::V1,
            path: "/".into(),
        };
        assert_eq!(none.limit_under(&root.join("absent")), None);
        assert!(rss_bytes().is_some_and(|(now, peak)| now > 0 && peak >= now));
    }
}
