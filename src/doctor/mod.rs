//! `tchrun doctor`'s contract: the checks' flags (passed unchanged from the launcher to
//! `tchrun-worker doctor`), the records a rank writes (`NodeReport`, `LinkReport`), the pairs
//! of each round of the network test, and `doctor.json` (`DoctorReport`). The verdict (which
//! host failed, which link is slow), the table and `hostfile.healthy` are the launcher's (`launcher/src/verdict.rs`).
//! Knows no process group and spawns nothing.
use crate::flags::RankFlags;
use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The doctor's report in its log directory.
pub const REPORT_JSON: &str = "doctor.json";
/// The hostfile of the hosts that passed, beside `doctor.json`.
pub const HEALTHY_HOSTFILE: &str = "hostfile.healthy";
/// Rank 0's file of the per-node phase (in that phase's log directory).
pub const NODES_JSON: &str = "doctor-nodes.json";
/// Rank 0's file of the network phase (in that phase's log directory).
pub const LINKS_JSON: &str = "doctor-links.json";
/// A node's clock may differ from rank 0's by this much before it fails.
pub const MAX_CLOCK_OFFSET_MS: f64 = 1000.0;
/// The doctor.json schema version.
pub const SCHEMA: u32 = 1;

/// Which part of the doctor a rank runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    /// One rank per node: versions, paths, shared file system, disk, memory, clock, GPUs.
    Nodes,
    /// The job's layout: pairwise bus bandwidth in log2(N) rounds of pairs.
    Links,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Nodes => "nodes",
            Phase::Links => "links",
        }
    }
}

/// The doctor's checks, shared by `tchrun doctor` and `tchrun-worker doctor`.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct DoctorChecks {
    /// An input path every node must see (a training job's --train/--valid folders or
    /// archives); repeat or separate with commas.
    #[arg(help_heading = "Checks", long, value_delimiter = ',')]
    pub data: Vec<PathBuf>,
    /// The output directory every node must see and be able to write (created when missing);
    /// the shared-file-system test writes there (else in the log directory).
    #[arg(help_heading = "Checks", long)]
    pub output: Option<PathBuf>,
    /// A node with less free disk (GiB) where it writes fails.
    #[arg(help_heading = "Checks", long, default_value_t = 1.0)]
    pub min_free_disk_gib: f64,
    /// A node with less available memory (GiB) fails.
    #[arg(help_heading = "Checks", long, default_value_t = 1.0)]
    pub min_free_memory_gib: f64,
    /// Message size of the pairwise bandwidth test, in bytes.
    #[arg(help_heading = "Checks", long, default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(4..=(1 << 32)))]
    pub link_bytes: u64,
    /// Timed all-reduces per pair (the fastest counts).
    #[arg(help_heading = "Checks", long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub link_iters: u64,
    /// A link slower than this fraction of the median of its kind (intra- or inter-node) fails.
    #[arg(help_heading = "Checks", long, default_value_t = 0.5)]
    pub slow_link_ratio: f64,
    /// Seconds a pair may take to connect and measure before its link counts as broken.
    #[arg(help_heading = "Checks", long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub link_timeout: u64,
}

impl DoctorChecks {
    /// The checks at their defaults for a training job's inputs and output (`train
    /// --preflight doctor`, the per-node checks of a spare host before it joins).
    pub fn for_job(data: Vec<PathBuf>, output: PathBuf) -> DoctorChecks {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            checks: DoctorChecks,
        }
        let mut checks = <Defaults as clap::Parser>::parse_from(["doctor"]).checks;
        checks.data = data;
        checks.output = Some(output);
        checks
    }
}

/// `tchrun-worker doctor`'s flags: one phase of the doctor as a rank. The launcher's argv for
/// it is [`DoctorRank::to_args`], derived (`crate::argv`).
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct DoctorRank {
    #[command(flatten)]
    #[serde(flatten)]
    pub rank: RankFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub checks: DoctorChecks,
    /// The phase this rank runs.
    #[arg(long, value_enum)]
    pub phase: Phase,
    /// Where rank 0 writes the phase's records (JSON).
    #[arg(long)]
    pub json: PathBuf,
}

impl DoctorRank {
    /// The flags as command-line arguments for a rank (after `doctor`).
    pub fn to_args(&self) -> Result<Vec<String>, crate::argv::ArgvError> {
        crate::argv::argv(self)
    }
}

/// One path a node must see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathCheck {
    /// The flag that named it (`--data`, `--output`).
    pub flag: String,
    pub path: PathBuf,
    pub visible: bool,
    /// For the output: whether a file could be created in it.
    pub writable: Option<bool>,
    /// What went wrong, in words.
    pub error: Option<String>,
}

/// One GPU as `nvidia-smi` reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuHealth {
    pub index: u32,
    pub name: String,
    /// Uncorrected volatile ECC errors (None: not reported).
    pub ecc_uncorrected: Option<u64>,
    /// Retired pages pending a reset (None: not reported).
    pub retired_pending: Option<bool>,
    /// Active clock throttle reasons other than idle, as nvidia-smi's bit mask.
    pub throttle_reasons: Option<u64>,
}

/// A node's GPUs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Gpus {
    /// CUDA devices this rank's torch sees.
    pub count: usize,
    /// The NVIDIA driver's version (nvidia-smi), when present.
    pub driver: Option<String>,
    /// Per GPU health from nvidia-smi; empty when it did not run.
    pub health: Vec<GpuHealth>,
    /// Why health was not checked (no GPU, no nvidia-smi, its failure), in words.
    pub note: Option<String>,
}

/// What one node (its one rank of the per-node phase) found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub rank: usize,
    pub host: String,
    pub tchrun_version: String,
    pub torch_version: String,
    pub gpus: Gpus,
    pub paths: Vec<PathCheck>,
    /// The directory of the shared-file-system test.
    pub shared_dir: PathBuf,
    /// Hosts whose test file this node could not read there.
    pub unread_from: Vec<String>,
    /// Free bytes where the node writes (the output, else the log directory).
    pub disk_free_bytes: Option<u64>,
    /// `MemAvailable` of /proc/meminfo.
    pub memory_available_bytes: Option<u64>,
    /// This node's clock minus rank 0's, in milliseconds (the median of several samples).
    pub clock_offset_ms: f64,
    /// Every failed check, in words; empty: healthy.
    pub problems: Vec<String>,
}

/// One pair's measured link.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkReport {
    /// The round (0-based) in which the pair was measured.
    pub round: u32,
    pub ranks: [usize; 2],
    pub hosts: [String; 2],
    /// Both ranks on one host.
    pub intra_node: bool,
    pub bytes: u64,
    /// Bus bandwidth of the pair's all-reduce (the slower rank's time), GB/s.
    pub busbw_gbs: Option<f64>,
    /// Why the pair could not be measured (a broken link).
    pub error: Option<String>,
    /// The bandwidth over the median of the links of its kind (set by the verdict).
    pub vs_median: Option<f64>,
    /// `ok`, `slow` or `broken` (set by the verdict).
    pub verdict: LinkVerdict,
}

/// A link's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LinkVerdict {
    Ok,
    Slow,
    Broken,
}

/// The network phase as rank 0 wrote it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Network {
    pub world_size: usize,
    pub backend: String,
    pub rounds: u32,
    pub links: Vec<LinkReport>,
    /// Median bandwidth of the intra-node links, GB/s.
    pub median_intra_gbs: Option<f64>,
    /// Median bandwidth of the inter-node links, GB/s.
    pub median_inter_gbs: Option<f64>,
}

/// A host left out of `hostfile.healthy`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FailedHost {
    pub host: String,
    pub reasons: Vec<String>,
}

/// `doctor.json`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DoctorReport {
    pub schema: u32,
    pub healthy: bool,
    pub nodes: Vec<NodeReport>,
    /// None when the network phase did not run (`network_note` says why).
    pub network: Option<Network>,
    pub network_note: Option<String>,
    pub failed_hosts: Vec<FailedHost>,
    /// Slow or broken links, each naming its two ranks and hosts.
    pub bad_links: Vec<String>,
    /// The hosts of `hostfile.healthy`.
    pub healthy_hosts: Vec<String>,
}

/// Rounds of the network test for `world` ranks: ceil(log2(world)).
pub fn rounds(world: usize) -> u32 {
    if world <= 1 {
        0
    } else {
        usize::BITS - (world - 1).leading_zeros()
    }
}

/// Rank `rank`'s partner in `round` (`rank XOR 2^round`), when that rank exists. Ranks of a
/// node are consecutive, so the first rounds pair ranks of one node and the later ones ranks
/// of different nodes.
pub fn partner(rank: usize, round: u32, world: usize) -> Option<usize> {
    let p = rank ^ (1usize << round);
    (p < world).then_some(p)
}

/// The median of `v` (None when empty).
pub fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(|a, b| a.total_cmp(b));
    let n = s.len();
    Some(if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    })
}

/// The problems of one GPU's health, in words.
pub fn gpu_problems(g: &GpuHealth) -> Vec<String> {
    let mut p = Vec::new();
    if let Some(n) = g.ecc_uncorrected.filter(|n| *n > 0) {
        p.push(format!("GPU {} has {n} uncorrected ECC error(s)", g.index));
    }
    if g.retired_pending == Some(true) {
        p.push(format!("GPU {} has retired pages pending a reset", g.index));
    }
    p
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_jobs_checks_are_the_defaults_with_its_paths() {
        let c = DoctorChecks::for_job(vec!["/d/train".into()], "/o".into());
        assert_eq!(c.data, vec![PathBuf::from("/d/train")]);
        assert_eq!(c.output, Some(PathBuf::from("/o")));
        assert_eq!(
            (c.min_free_disk_gib, c.link_iters, c.link_timeout),
            (1.0, 5, 30)
        );
    }

    #[test]
    fn rounds_and_partners_cover_every_rank() {
        assert_eq!(rounds(1), 0);
        assert_eq!(rounds(2), 1);
        assert_eq!(rounds(3), 2);
        assert_eq!(rounds(4), 2);
        assert_eq!(rounds(5), 3);
        assert_eq!(rounds(8), 3);
        // 2 nodes x 2 ranks: round 0 within a node, round 1 across.
        assert_eq!(partner(0, 0, 4), Some(1));
        assert_eq!(partner(3, 0, 4), Some(2));
        assert_eq!(partner(1, 1, 4), Some(3));
        assert_eq!(partner(1, 1, 3), None);
        assert_eq!(partner(2, 1, 3), Some(0));
        for world in 1..20 {
            for round in 0..rounds(world) {
                for r in 0..world {
                    if let Some(p) = partner(r, round, world) {
                        assert_eq!(partner(p, round, world), Some(r));
                    }
                }
            }
        }
    }

    #[test]
    fn median_of_odd_even_and_empty() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0]), Some(2.5));
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[f64::NAN]), None);
    }
}
