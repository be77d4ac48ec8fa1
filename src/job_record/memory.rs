//! `memory-<rank>.json`: a rank's last known memory, rewritten about once a second by a thread
//! of the rank (`tchrun-worker`'s `memory.rs`, the one writer) and read by the launcher after
//! the rank died (the one reader): its resident memory, the limit it ran under (its memory
//! cgroup's, else the node's) and the OOM kills its cgroup had counted when it started, so that
//! a SIGKILL can be told to be the OOM killer's, with the memory it used.
use crate::memory::Cgroup;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
/// What limited a rank's memory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitOf {
    /// A memory cgroup's limit (the path of the cgroup that sets it).
    Cgroup(String),
    /// The node's memory (`MemTotal`).
    Node,
}

impl LimitOf {
    pub fn describe(&self) -> String {
        match self {
            LimitOf::Cgroup(p) => format!("the memory cgroup {p}'s limit"),
            LimitOf::Node => "the node's memory".into(),
        }
    }
}

/// One rank's last known memory.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankMemory {
    pub rank: usize,
    pub host: String,
    pub pid: u32,
    /// Resident memory at `time`, MiB.
    pub rss_mib: u64,
    /// The most resident memory so far (`VmHWM`), MiB.
    pub peak_rss_mib: u64,
    /// The limit it runs under, MiB, and what sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_mib: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit_of: Option<LimitOf>,
    /// Its memory cgroup and the OOM kills counted there when the rank started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cgroup: Option<Cgroup>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kills_at_start: Option<u64>,
    /// RFC 3339 (the rank's clock).
    pub time: String,
}

/// `<log_dir>/memory-<rank>.json`.
pub fn path(log_dir: &Path, rank: usize) -> PathBuf {
    log_dir.join(format!("memory-{rank}.json"))
}

/// The rank of a memory file's name.
pub fn rank_of(file_name: &str) -> Option<usize> {
    super::per_rank::rank_of_file(file_name, "memory-")
}

impl RankMemory {
    /// Rewrites the rank's file in place, as a heartbeat (`super::per_rank::write_in_place`): a full
    /// disk does not stop it.
    pub fn write(&self, log_dir: &Path) -> std::io::Result<()> {
        super::per_rank::write_in_place(&path(log_dir, self.rank), self)
    }

    /// The rank's last record in `log_dir`, if there is a readable one.
    pub fn read(log_dir: &Path, rank: usize) -> Option<RankMemory> {
        serde_json::from_slice(&super::per_rank::read_small(&path(log_dir, rank))?).ok()
    }

    /// "3012 MiB (peak 3050 MiB) of the memory cgroup /x's limit of 3072 MiB".
    pub fn describe(&self) -> String {
        let mut s = format!("{} MiB", self.rss_mib);
        if self.peak_rss_mib > self.rss_mib {
            s.push_str(&format!(" (peak {} MiB)", self.peak_rss_mib));
        }
        if let (Some(l), Some(of)) = (self.limit_mib, &self.limit_of) {
            s.push_str(&format!(" against {} of {l} MiB", of.describe()));
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::CgroupVersion;

    #[test]
    fn the_record_is_rewritten_in_place_and_reads_back() {
        let t = tempfile::tempdir().expect("tempdir");
        let mut m = RankMemory {
            rank: 1,
            host: "node1".into(),
            pid: 42,
            rss_mib: 3012,
            peak_rss_mib: 3050,
            limit_mib: Some(3072),
            limit_of: Some(LimitOf::Cgroup("/tchrun-test".into())),
            cgroup: Some(Cgroup {
                version: CgroupVersion::V1,
                path: "/tchrun-test".into(),
            }),
            oom_kills_at_start: Some(0),
            time: "2026-11-25T00:00:00.000Z".into(),
        };
        m.write(t.path()).expect("write");
        assert_eq!(RankMemory::read(t.path(), 1), Some(m.clone()));
        m.rss_mib = 10;
        m.write(t.path()).expect("rewrite");
        assert_eq!(RankMemory::read(t.path(), 1).map(|r| r.rss_mib), Some(10));
        assert_eq!(
            m.describe(),
            "10 MiB (peak 3050 MiB) against the memory cgroup /tchrun-test's limit of 3072 MiB"
        );
        assert_eq!(rank_of("memory-12.json"), Some(12));
        assert_eq!(rank_of("heartbeat-1.json"), None);
        assert_eq!(RankMemory::read(t.path(), 0), None);
    }
}
