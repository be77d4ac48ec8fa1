//! The cause of a rank's failure, as `failure.json` keeps it (`Cause`, under `cause`): its
//! class, what was found, and one line of advice. The recognisers that find it in a rank's
//! words and the evidence of a killed rank are the launcher's (`launcher/src/recognise.rs`).
use serde::{Deserialize, Serialize};

/// Why a rank died, when tchrun can tell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "class", rename_all = "snake_case")]
pub enum Cause {
    /// The kernel's OOM killer ended the rank (SIGKILL): the node's or its cgroup's memory ran
    /// out. `rss_mib`: its memory when killed (the kernel's figure) or last known.
    OomKiller {
        rss_mib: Option<u64>,
        limit_mib: Option<u64>,
        limit_of: Option<String>,
        /// What showed it: the kernel log line, the cgroup's OOM kill count, the memory.
        evidence: Vec<String>,
    },
    /// libtorch's CUDA caching allocator could not allocate on the GPU.
    CudaOutOfMemory {
        device: Option<String>,
        tried: Option<String>,
    },
    /// The host could not allocate (libtorch's CPU allocator, `Cannot allocate memory`).
    HostOutOfMemory { tried: Option<String> },
    /// A peer rank failed or the network between them did.
    Peer {
        /// The peer, when known ("rank 1 (node2)").
        peer: Option<String>,
        /// The peer's address in the error (`10.0.0.2:34567`).
        address: Option<String>,
    },
    /// Slurm ended the job at its time limit.
    SlurmTimeLimit { signal: Option<i32>, reason: String },
    /// Slurm preempted the job.
    SlurmPreempted { signal: Option<i32>, reason: String },
    /// A signal tchrun did not send (nor the OOM killer): a user, a watchdog, the batch system.
    Signal {
        signal: i32,
        /// Who sent it, when the rank learned it (`pid 4242 (bash)`).
        sender: Option<String>,
    },
    /// An input file could not be read or decoded.
    InputFile { path: Option<String> },
    /// The GPU or the host's memory reported a hardware error (a CUDA error that names it, an
    /// Xid or ECC line in the kernel log): the host counts as failed at once.
    Hardware {
        device: Option<String>,
        evidence: String,
    },
}

impl Cause {
    /// The class in words (the summary's `cause:` line begins with it).
    pub fn class(&self) -> &'static str {
        match self {
            Cause::OomKiller { .. } => "killed by the kernel's OOM killer",
            Cause::CudaOutOfMemory { .. } => "CUDA out of memory",
            Cause::HostOutOfMemory { .. } => "host out of memory",
            Cause::Peer { .. } => "a peer or the network failed",
            Cause::SlurmTimeLimit { .. } => "Slurm time limit",
            Cause::SlurmPreempted { .. } => "Slurm preemption",
            Cause::Signal { .. } => "a signal sent by another process",
            Cause::InputFile { .. } => "an input file could not be read",
            Cause::Hardware { .. } => "hardware error",
        }
    }

    /// What was found, in one line.
    pub fn detail(&self) -> String {
        let or_unknown = |o: &Option<String>| o.clone().unwrap_or_else(|| "unknown".into());
        match self {
            Cause::OomKiller {
                rss_mib,
                limit_mib,
                limit_of,
                ..
            } => {
                let used = rss_mib.map_or("an unknown amount of memory".into(), |m| {
                    format!("{m} MiB resident")
                });
                match (limit_mib, limit_of) {
                    (Some(l), Some(of)) => format!("the rank had {used}, against {of} of {l} MiB"),
                    _ => format!("the rank had {used}"),
                }
            }
            Cause::CudaOutOfMemory { device, tried } => format!(
                "{} could not allocate {}",
                device.as_deref().unwrap_or("the GPU"),
                tried.as_deref().unwrap_or("more memory")
            ),
            Cause::HostOutOfMemory { tried } => format!(
                "the host could not allocate {}",
                tried.as_deref().unwrap_or("more memory")
            ),
            Cause::Peer { peer, address } => format!(
                "peer {}, address {}",
                or_unknown(peer),
                or_unknown(address)
            ),
            Cause::SlurmTimeLimit { reason, signal } | Cause::SlurmPreempted { reason, signal } => {
                match signal {
                    Some(s) => format!("signal {s}; Slurm: {reason}"),
                    None => format!("Slurm: {reason}"),
                }
            }
            Cause::Signal { signal, sender } => match sender {
                Some(s) => format!("signal {signal} from {s}"),
                None => format!(
                    "signal {signal}, not sent by tchrun, nor by the OOM killer as far as the kernel log and the memory cgroup tell"
                ),
            },
            Cause::InputFile { path } => format!("file {}", or_unknown(path)),
            Cause::Hardware { device, evidence } => match device {
                Some(d) => format!("{d}: {evidence}"),
                None => evidence.clone(),
            },
        }
    }

    /// One line of advice.
    pub fn advice(&self) -> &'static str {
        match self {
            Cause::OomKiller { .. } => {
                "lower --batch-size or --loader-threads, or run fewer ranks per node (--procs-per-node); or ask for more memory (Slurm --mem, the container's limit)"
            }
            Cause::CudaOutOfMemory { .. } => {
                "lower --batch-size, use --amp bf16, or --global-batch-size to keep the same training with smaller steps per rank"
            }
            Cause::HostOutOfMemory { .. } => {
                "lower --batch-size or --loader-threads, or run fewer ranks per node (--procs-per-node)"
            }
            Cause::Peer { .. } => {
                "look at the peer's own cause first (tchrun logs); if it did not fail, check the network between the hosts and raise --timeout for a slow one"
            }
            Cause::SlurmTimeLimit { .. } => {
                "ask Slurm for more --time, or continue the run with --resume (use --checkpoint-every to lose less)"
            }
            Cause::SlurmPreempted { .. } => {
                "resubmit, or let `tchrun sbatch` requeue it: --resume continues from the last checkpoint"
            }
            Cause::Signal { .. } => {
                "find who ended the rank (a user's kill, a watchdog, the batch system); --resume continues from the last checkpoint"
            }
            Cause::InputFile { .. } => {
                "check that the file exists and is readable on every node, or pass --skip-bad-images to leave bad images out"
            }
            Cause::Hardware { .. } => {
                "the host counts as failed at once (--exclude-failed-hosts leaves it out); report it to the cluster's administrators"
            }
        }
    }

    /// Whether the failure counts against its host at once for `--exclude-failed-hosts`.
    pub fn is_hardware(&self) -> bool {
        matches!(self, Cause::Hardware { .. })
    }
}
