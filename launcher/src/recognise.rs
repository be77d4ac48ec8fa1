//! The recognisers of a rank's failure cause (`tchrun::job_record::Cause`): in the words of
//! libtorch (CUDA memory, CUDA hardware errors), Gloo/NCCL (a peer), Slurm (time limit,
//! preemption) and the evidence of a killed rank (the kernel log, its memory cgroup, its last
//! known memory). Pure: the launcher gathers the evidence.
use crate::kernel_log::KernelEvent;
use tchrun::driver_log::FailureKind;
use tchrun::job_record::memory::RankMemory;
use tchrun::job_record::Cause;

/// Finds a [`Cause`] (the recognisers, the launcher's: `Cause::from_record` with this in scope;
/// the bodies are the trait's, `Cause` implements it as is).
pub trait Recognise {
    /// The cause a rank's own failure record shows (its kind and libtorch's message), for a
    /// rank on `device` (`cuda:0`); `None` when the words say nothing more than the kind.
    fn from_record(kind: FailureKind, message: &str, device: Option<&str>) -> Option<Cause> {
        if let Some(evidence) = cuda_hardware_error(message) {
            return Some(Cause::Hardware {
                device: device.map(str::to_string),
                evidence,
            });
        }
        if let Some(tried) = cuda_out_of_memory(message) {
            let gpu = message
                .split(". GPU ")
                .nth(1)
                .or_else(|| message.split(" (GPU ").nth(1))
                .and_then(|r| r.split([' ', ';']).next())
                .map(|n| format!("GPU {n}"));
            return Some(Cause::CudaOutOfMemory {
                device: gpu.or_else(|| device.map(str::to_string)),
                tried,
            });
        }
        if let Some(tried) = host_out_of_memory(message) {
            return Some(Cause::HostOutOfMemory { tried });
        }
        match kind {
            FailureKind::Communication => Some(Cause::Peer {
                peer: None,
                address: peer_address(message),
            }),
            FailureKind::Data => Some(Cause::InputFile {
                path: first_path(message),
            }),
            FailureKind::Interrupted => stop_signal(message),
            _ => None,
        }
    }

    /// Slurm's own words in srun's output (`slurmstepd: error: *** STEP 12.0 ON n1 CANCELLED
    /// AT ... DUE TO TIME LIMIT ***`, `... DUE TO PREEMPTION ***`).
    fn slurm(lines: &[String], signal: Option<i32>) -> Option<Cause> {
        lines.iter().find_map(|l| {
            let at = l.find("***")?;
            let reason = l[at..].trim_matches(|c: char| c == '*' || c.is_whitespace());
            if reason.contains("DUE TO TIME LIMIT") {
                Some(Cause::SlurmTimeLimit {
                    signal,
                    reason: reason.to_string(),
                })
            } else if reason.contains("DUE TO PREEMPTION") {
                Some(Cause::SlurmPreempted {
                    signal,
                    reason: reason.to_string(),
                })
            } else {
                None
            }
        })
    }

    /// The cause of a rank killed by `signal` that wrote no failure record (the rank's `pid`),
    /// from the evidence the launcher gathered: the kernel log since the attempt started (or
    /// why it could not be read), the OOM kills its memory cgroup counts now, its last known
    /// memory.
    fn killed(
        signal: i32,
        pid: Option<u32>,
        kernel: &Result<Vec<KernelEvent>, String>,
        oom_kills_now: Option<u64>,
        memory: Option<&RankMemory>,
    ) -> Cause {
        const SIGKILL: i32 = 9;
        let mut evidence = Vec::new();
        let mut rss_mib = None;
        let events = kernel.as_deref().unwrap_or_default();
        for e in events {
            match e {
                KernelEvent::Hardware { device, line } => {
                    return Cause::Hardware {
                        device: device.clone(),
                        evidence: format!("kernel log: {line}"),
                    }
                }
                KernelEvent::OomKill {
                    pid: killed,
                    rss_kib,
                    line,
                    ..
                } if Some(*killed) == pid => {
                    evidence.push(format!("kernel log: {line}"));
                    rss_mib = rss_kib.map(|k| k / 1024);
                }
                _ => {}
            }
        }
        let (at_start, cgroup) = memory
            .map(|m| (m.oom_kills_at_start, m.cgroup.as_ref()))
            .unwrap_or_default();
        if let (Some(now), Some(before), Some(cg)) = (oom_kills_now, at_start, cgroup) {
            if signal == SIGKILL && now > before {
                evidence.push(format!(
                    "the memory cgroup {} counted {} OOM kill(s) since the rank started",
                    cg.path,
                    now - before
                ));
            }
        }
        if let (Some(m), Err(why)) = (memory, kernel) {
            // Without the kernel log: a SIGKILL at the limit is the OOM killer's, probably.
            let near = m
                .limit_mib
                .is_some_and(|l| m.rss_mib.max(m.peak_rss_mib) * 10 >= l * 9);
            if signal == SIGKILL && near && evidence.is_empty() {
                evidence.push(format!(
                    "the rank's last known memory was within 10% of its limit (the kernel log is not readable: {why})"
                ));
            }
        }
        if evidence.is_empty() {
            return Cause::Signal {
                signal,
                sender: None,
            };
        }
        let rss_mib = rss_mib.or(memory.map(|m| m.rss_mib.max(m.peak_rss_mib)));
        if let Some(m) = memory {
            evidence.push(format!("last known memory: {}", m.describe()));
        }
        Cause::OomKiller {
            rss_mib,
            limit_mib: memory.and_then(|m| m.limit_mib),
            limit_of: memory.and_then(|m| m.limit_of.as_ref().map(|l| l.describe())),
            evidence,
        }
    }
}

impl Recognise for Cause {}

/// CUDA errors that mean the GPU failed, not the program (the CUDA runtime's texts of
/// `cudaErrorECCUncorrectable`, `cudaErrorHardwareStackError`, `cudaErrorNvlinkUncorrectable`,
/// `cudaErrorDevicesUnavailable`'s "fallen off the bus" cousin in NCCL, and NVML's).
const CUDA_HARDWARE: &[&str] = &[
    "uncorrectable ECC error encountered",
    "hardware stack error",
    "uncorrectable NVLink error",
    "GPU has fallen off the bus",
    "GPU is lost",
];

/// The CUDA hardware error in a message (its line), if any.
pub fn cuda_hardware_error(message: &str) -> Option<String> {
    let lower = message.to_ascii_lowercase();
    CUDA_HARDWARE
        .iter()
        .any(|t| lower.contains(&t.to_ascii_lowercase()))
        .then(|| {
            message
                .lines()
                .find(|l| {
                    let l = l.to_ascii_lowercase();
                    CUDA_HARDWARE
                        .iter()
                        .any(|t| l.contains(&t.to_ascii_lowercase()))
                })
                .unwrap_or(message)
                .trim()
                .to_string()
        })
}

/// libtorch's CUDA allocator failing (`CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0
/// has a total capacity of ...`, older `(GPU 0; ... total capacity; ...)`) or the CUDA
/// runtime's `CUDA error: out of memory`: `Some(what it tried to allocate)`.
pub fn cuda_out_of_memory(message: &str) -> Option<Option<String>> {
    if let Some(at) = message.find("CUDA out of memory. Tried to allocate ") {
        let rest = &message[at + "CUDA out of memory. Tried to allocate ".len()..];
        let size: String = rest
            .split_whitespace()
            .take(2)
            .collect::<Vec<_>>()
            .join(" ");
        return Some(Some(size.trim_end_matches(['.', ',']).to_string()));
    }
    (message.contains("CUDA error: out of memory") || message.contains("CUDA out of memory"))
        .then_some(None)
}

/// libtorch's CPU allocator failing (`DefaultCPUAllocator: can't allocate memory: you tried to
/// allocate 8589934592 bytes. Error code 12 (Cannot allocate memory)`).
pub fn host_out_of_memory(message: &str) -> Option<Option<String>> {
    if !(message.contains("can't allocate memory") || message.contains("Cannot allocate memory")) {
        return None;
    }
    let tried = message
        .split("you tried to allocate ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|b| b.parse::<u64>().ok())
        .map(|b| format!("{} MiB", b / (1024 * 1024)));
    Some(tried)
}

/// The peer's address in a Gloo or NCCL error: `[10.0.0.2]:34567` (Gloo's "Connection closed
/// by peer", "Read error"), `node2<34567>` (NCCL's "remote peer").
pub fn peer_address(message: &str) -> Option<String> {
    let mut rest = message;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        if let Some((addr, tail)) = after.split_once("]:") {
            let port: String = tail.chars().take_while(char::is_ascii_digit).collect();
            let plausible = !addr.is_empty()
                && !port.is_empty()
                && addr
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || c == '.' || c == ':');
            if plausible {
                return Some(format!("{addr}:{port}"));
            }
        }
        rest = after;
    }
    let at = message.find("remote peer ")?;
    let token = message[at + "remote peer ".len()..]
        .split_whitespace()
        .next()?;
    let (host, port) = token.split_once('<')?;
    Some(format!("{host}:{}", port.trim_end_matches(['>', ',', '.'])))
}

/// A rank's stop by a signal that its launcher did not send (`stopped by signal 15 from pid
/// 4242 (bash, uid 0); ...`, the worker's words): `None` when the rank's parent sent it.
fn stop_signal(message: &str) -> Option<Cause> {
    let after = message.split("signal ").nth(1)?;
    let signal: i32 = after
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()?;
    let sender = after.split_once(" from ").and_then(|(_, s)| {
        let end = s.find(')')?;
        Some(s[..=end].to_string())
    });
    if sender
        .as_deref()
        .is_some_and(|s| s.contains("its launcher"))
    {
        return None;
    }
    Some(Cause::Signal { signal, sender })
}

/// The first absolute path in a message (an input file's), without trailing punctuation.
pub fn first_path(message: &str) -> Option<String> {
    message
        .split(|c: char| c.is_whitespace() || c == '\'' || c == '"' || c == '(' || c == ')')
        .find(|w| w.starts_with('/') && w.len() > 1)
        .map(|w| w.trim_end_matches([':', ',', ';', '.']).to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tchrun::job_record::memory::LimitOf;
    use tchrun::memory::{Cgroup, CgroupVersion};

    /// libtorch 2.x's message (c10/cuda/CUDACachingAllocator.cpp), as a rank records it.
    const CUDA_OOM: &str = "CUDA out of memory. Tried to allocate 1.22 GiB. GPU 0 has a total \
        capacity of 15.77 GiB of which 959.44 MiB is free. Process 12447 has 14.83 GiB memory in \
        use. Of the allocated memory 14.01 GiB is allocated by PyTorch, and 472.05 MiB is reserved \
        by PyTorch but unallocated. If reserved but unallocated memory is large try setting \
        PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See \
        documentation for Memory Management  \
        (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)";
    /// The same before PyTorch 2.1.
    const CUDA_OOM_OLD: &str = "CUDA out of memory. Tried to allocate 36.00 MiB (GPU 1; 7.93 GiB \
        total capacity; 130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in \
        total by PyTorch)";

    #[test]
    fn cuda_out_of_memory_names_the_gpu_the_size_and_the_flags() {
        let c = Cause::from_record(FailureKind::OutOfMemory, CUDA_OOM, Some("cuda:0"))
            .expect("a cause");
        assert_eq!(
            c,
            Cause::CudaOutOfMemory {
                device: Some("GPU 0".into()),
                tried: Some("1.22 GiB".into())
            }
        );
        assert_eq!(c.detail(), "GPU 0 could not allocate 1.22 GiB");
        for flag in ["--batch-size", "--amp bf16", "--global-batch-size"] {
            assert!(c.advice().contains(flag), "{}", c.advice());
        }
        let old = Cause::from_record(FailureKind::Panic, CUDA_OOM_OLD, None).expect("a cause");
        assert_eq!(
            old,
            Cause::CudaOutOfMemory {
                device: Some("GPU 1".into()),
                tried: Some("36.00 MiB".into())
            }
        );
        // The CUDA runtime's own text (c10's CUDA check), the device from the rank's header.
        let raw = "CUDA error: out of memory\nCUDA kernel errors might be asynchronously \
                   reported at some other API call, so the stacktrace below might be incorrect.";
        assert_eq!(
            Cause::from_record(FailureKind::Cuda, raw, Some("cuda:3")),
            Some(Cause::CudaOutOfMemory {
                device: Some("cuda:3".into()),
                tried: None
            })
        );
        // libtorch's CPU allocator (c10/core/impl/alloc_cpu.cpp).
        let cpu = "DefaultCPUAllocator: can't allocate memory: you tried to allocate \
                   8589934592 bytes. Error code 12 (Cannot allocate memory)";
        assert_eq!(
            Cause::from_record(FailureKind::OutOfMemory, cpu, Some("cpu")),
            Some(Cause::HostOutOfMemory {
                tried: Some("8192 MiB".into())
            })
        );
    }

    #[test]
    fn cuda_hardware_errors_count_against_the_host() {
        let ecc = "CUDA error: uncorrectable ECC error encountered\nCUDA kernel errors might be \
                   asynchronously reported at some other API call, so the stacktrace below might \
                   be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1";
        let c = Cause::from_record(FailureKind::Cuda, ecc, Some("cuda:1")).expect("a cause");
        assert_eq!(
            c,
            Cause::Hardware {
                device: Some("cuda:1".into()),
                evidence: "CUDA error: uncorrectable ECC error encountered".into()
            }
        );
        assert!(c.is_hardware());
        let illegal = "CUDA error: an illegal memory access was encountered";
        assert_eq!(Cause::from_record(FailureKind::Cuda, illegal, None), None);
        assert!(
            !Cause::from_record(FailureKind::OutOfMemory, CUDA_OOM, None)
                .expect("oom")
                .is_hardware()
        );
    }

    #[test]
    fn a_peer_failure_names_the_address_and_a_data_error_the_file() {
        // Gloo (third_party/gloo/gloo/transport/tcp/pair.cc).
        let closed = "c10d allreduce: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] \
                      Connection closed by peer [10.0.0.2]:35126";
        assert_eq!(
            Cause::from_record(FailureKind::Communication, closed, None),
            Some(Cause::Peer {
                peer: None,
                address: Some("10.0.0.2:35126".into())
            })
        );
        let read = "[/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:598] Read error \
                    [172.17.0.2]:6255: Connection reset by peer";
        assert_eq!(peer_address(read).as_deref(), Some("172.17.0.2:6255"));
        // NCCL's socket transport.
        let nccl = "NCCL WARN NET/Socket : socketProgress: Connection closed by remote peer \
                    gpu-node-2.cluster<48320>";
        assert_eq!(
            peer_address(nccl).as_deref(),
            Some("gpu-node-2.cluster:48320")
        );
        assert_eq!(peer_address("Timed out waiting 1800000ms for recv"), None);
        let bad = "BadImageError: /data/train/3/img_17.png: unexpected end of file";
        let c = Cause::from_record(FailureKind::Data, bad, None).expect("a cause");
        assert_eq!(
            c,
            Cause::InputFile {
                path: Some("/data/train/3/img_17.png".into())
            }
        );
        assert!(c.advice().contains("--skip-bad-images"));
        assert_eq!(
            Cause::from_record(FailureKind::Diverged, "loss is NaN", None),
            None
        );
        // A stop the rank's launcher did not ask for, with the sender the kernel named.
        let other = "stopped by signal 15 from pid 4242 (bash, uid 0); a checkpoint was written: \
                     continue with --resume";
        assert_eq!(
            Cause::from_record(FailureKind::Interrupted, other, None),
            Some(Cause::Signal {
                signal: 15,
                sender: Some("pid 4242 (bash, uid 0)".into())
            })
        );
        let launcher = "stopped by signal 15 from pid 7 (tchrun, uid 0, the rank's parent: its \
                        launcher); a checkpoint was written: continue with --resume";
        assert_eq!(
            Cause::from_record(FailureKind::Interrupted, launcher, None),
            None
        );
    }

    #[test]
    fn slurm_time_limit_and_preemption_are_recognised_in_srun_output() {
        let lines = |t: &str| -> Vec<String> { t.lines().map(str::to_string).collect() };
        let limit = lines(
            "srun: Job step aborted: Waiting up to 32 seconds for job step to finish.\n\
             slurmstepd: error: *** STEP 1234.0 ON node1 CANCELLED AT 2026-11-25T12:00:00 DUE TO TIME LIMIT ***",
        );
        let c = Cause::slurm(&limit, Some(15)).expect("time limit");
        assert_eq!(
            c,
            Cause::SlurmTimeLimit {
                signal: Some(15),
                reason: "STEP 1234.0 ON node1 CANCELLED AT 2026-11-25T12:00:00 DUE TO TIME LIMIT"
                    .into()
            }
        );
        assert!(c.advice().contains("--time") && c.advice().contains("--resume"));
        let pre = lines(
            "slurmstepd: error: *** JOB 99 ON node3 CANCELLED AT 2026-11-25T12:00:00 DUE TO PREEMPTION ***",
        );
        assert!(matches!(
            Cause::slurm(&pre, None),
            Some(Cause::SlurmPreempted { .. })
        ));
        let cancelled =
            lines("slurmstepd: error: *** STEP 7.0 ON node1 CANCELLED AT 2026-11-25T12:00:00 ***");
        assert_eq!(Cause::slurm(&cancelled, None), None);
    }

    fn memory(rss: u64, limit: u64, kills_at_start: u64) -> RankMemory {
        RankMemory {
            rank: 1,
            host: "h".into(),
            pid: 4242,
            rss_mib: rss,
            peak_rss_mib: rss,
            limit_mib: Some(limit),
            limit_of: Some(LimitOf::Cgroup("/job".into())),
            cgroup: Some(Cgroup {
                version: CgroupVersion::V2,
                path: "/job".into(),
            }),
            oom_kills_at_start: Some(kills_at_start),
            time: "t".into(),
        }
    }

    #[test]
    fn a_sigkill_is_the_oom_killers_by_the_kernel_log_or_the_cgroup_else_someone_elses() {
        let oom = KernelEvent::OomKill {
            pid: 4242,
            name: "tchrun-worker".into(),
            rss_kib: Some(3_000 * 1024),
            cgroup: true,
            line: "Memory cgroup out of memory: Killed process 4242 (tchrun-worker)".into(),
        };
        let m = memory(2500, 3072, 0);
        // The kernel's line for this pid: its figure of the memory.
        let c = Cause::killed(9, Some(4242), &Ok(vec![oom.clone()]), Some(1), Some(&m));
        match &c {
            Cause::OomKiller {
                rss_mib,
                limit_mib,
                evidence,
                ..
            } => {
                assert_eq!((*rss_mib, *limit_mib), (Some(3000), Some(3072)));
                assert_eq!(evidence.len(), 3, "{evidence:?}");
            }
            other => panic!("{other:?}"),
        }
        assert!(c.detail().contains("3000 MiB resident"), "{}", c.detail());
        // No kernel log: the cgroup's count rose.
        let c = Cause::killed(9, Some(4242), &Err("EPERM".into()), Some(1), Some(&m));
        assert!(
            matches!(
                c,
                Cause::OomKiller {
                    rss_mib: Some(2500),
                    ..
                }
            ),
            "{c:?}"
        );
        // Nothing at all but memory at the limit: still the OOM killer.
        let full = memory(3000, 3072, 0);
        let c = Cause::killed(9, Some(4242), &Err("EPERM".into()), None, Some(&full));
        assert!(matches!(c, Cause::OomKiller { .. }), "{c:?}");
        // Another pid's OOM kill, no count, far from the limit: a signal from someone.
        let c = Cause::killed(9, Some(1), &Ok(vec![oom]), Some(0), Some(&m));
        assert_eq!(
            c,
            Cause::Signal {
                signal: 9,
                sender: None
            }
        );
        // A hardware line in the kernel log wins.
        let xid = KernelEvent::Hardware {
            device: Some("PCI:0000:3b:00".into()),
            line: "NVRM: Xid (PCI:0000:3b:00): 79, GPU has fallen off the bus.".into(),
        };
        assert!(Cause::killed(9, None, &Ok(vec![xid]), None, None).is_hardware());
    }
}
