//! GPU counting for the pre-flight: `--procs-per-node` against the GPUs of the nodes the ranks
//! start on, checked only where the launcher can see them (this host: the local launcher, or
//! mpirun without `--hosts`/`--hostfile`). When the ranks start elsewhere (hosts, hostfile,
//! srun from a login node) this host's GPUs say nothing about theirs: the launcher says so and
//! each rank checks its own node before it creates the process group (tchrun-worker's
//! `resolve`). No CUDA here: the launcher never links libtorch.
use crate::error::JobError;
use crate::plan::launch::{LauncherKind, Plan};
use tchrun::flags::Device;

/// What the ranks will run on the GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GpuUse {
    /// Ranks with this `--device` (train, selftest, score, and exec given `--device`).
    Ranks(Device),
    /// A user's program (`tchrun exec` without `--device`): its device is its own business, so
    /// too many ranks for the GPUs is a note, not a refusal.
    Program,
}

/// This host's name, for messages.
pub fn this_host() -> String {
    hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "this host".into())
}

/// GPUs this host exposes to CUDA, counted without CUDA: the NVIDIA driver's device list
/// (`/proc/driver/nvidia/gpus`), `CUDA_VISIBLE_DEVICES` respected. `TCHRUN_TEST_CUDA_DEVICES`
/// replaces the count (tests on machines without GPUs).
pub fn visible_gpus() -> Result<usize, JobError> {
    let get = |k: &str| std::env::var(k).ok();
    if let Some(n) =
        tchrun::env::test_cuda_devices(&get).map_err(|e| JobError::invalid(e.to_string()))?
    {
        return Ok(n);
    }
    let present = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|rd| rd.count())
        .unwrap_or(0);
    Ok(count_visible(
        present,
        get("CUDA_VISIBLE_DEVICES").as_deref(),
    ))
}

/// The devices CUDA shows of `present`, given `CUDA_VISIBLE_DEVICES`.
fn count_visible(present: usize, cuda_visible_devices: Option<&str>) -> usize {
    match cuda_visible_devices.map(str::trim) {
        Some("") | Some("-1") => 0,
        Some(v) => v
            .split(',')
            .map(str::trim)
            // CUDA stops at the first invalid entry ("-1" hides the rest).
            .take_while(|s| !s.is_empty() && *s != "-1")
            .count()
            .min(present),
        None => present,
    }
}

/// `None` when the ranks start on this host (its GPUs are theirs), else where they start.
/// `get` reads the environment (mpirun inside a multi-node Slurm allocation uses its nodes).
pub fn ranks_start_elsewhere(
    plan: &Plan,
    get: &dyn Fn(&str) -> Option<String>,
) -> Option<&'static str> {
    const HOST_ARGS: &[&str] = &[
        "-H",
        "--host",
        "-host",
        "--hostfile",
        "-hostfile",
        "--machinefile",
        "-machinefile",
    ];
    match plan.kind {
        LauncherKind::Srun => Some("the Slurm allocation's nodes (srun)"),
        LauncherKind::Local => None,
        LauncherKind::Mpirun | LauncherKind::Auto => {
            if plan.hostfile.is_some() {
                Some("the hosts of --hostfile")
            } else if !plan.node_names.is_empty() || !plan.hosts.is_empty() {
                Some("the hosts of --hosts")
            } else if plan
                .mpirun_args
                .iter()
                .any(|a| HOST_ARGS.contains(&a.split('=').next().unwrap_or(a.as_str())))
            {
                Some("the hosts of --mpirun-args")
            } else if get("SLURM_JOB_ID").is_some()
                && get("SLURM_JOB_NUM_NODES").is_some_and(|n| n.trim() != "1")
            {
                Some("the Slurm allocation's nodes (mpirun inside Slurm)")
            } else {
                None
            }
        }
    }
}

/// The GPU check of a planned job: on this host when the ranks start here, else a note.
pub fn check(plan: &Plan, usage: GpuUse) -> Result<(), JobError> {
    if usage == GpuUse::Ranks(Device::Cpu) {
        return Ok(());
    }
    match ranks_start_elsewhere(plan, &|k| std::env::var(k).ok()) {
        None => check_here(plan.procs_per_node as usize, usage),
        Some(place) => {
            if matches!(usage, GpuUse::Ranks(_)) {
                let line = format!(
                    "the ranks start on {place}, whose GPUs this host cannot see: each rank checks \
                     --procs-per-node {} against the GPUs of its own node",
                    plan.procs_per_node
                );
                errln!("tchrun: note: {line}");
            }
            Ok(())
        }
    }
}

/// `procs_per_node` ranks on this host against its GPUs.
pub fn check_here(procs_per_node: usize, usage: GpuUse) -> Result<(), JobError> {
    if usage == GpuUse::Ranks(Device::Cpu) {
        return Ok(());
    }
    let gpus = visible_gpus()?;
    let host = this_host();
    match usage {
        GpuUse::Ranks(Device::Cuda) if gpus == 0 => Err(JobError::invalid(format!(
            "--device cuda: no GPU is visible on {host}; use --device cpu or check CUDA_VISIBLE_DEVICES"
        ))),
        GpuUse::Ranks(Device::Cuda | Device::Auto) if gpus > 0 && procs_per_node > gpus => Err(
            JobError::invalid(tchrun::env::too_many_ranks_for_gpus(procs_per_node, gpus, &host)),
        ),
        GpuUse::Program if gpus > 0 && procs_per_node > gpus => {
            errln!(
                "tchrun: note: --procs-per-node {procs_per_node} is more than the {gpus} GPU(s) visible on {host}; \
                 a program that uses one GPU per rank (cuda:LOCAL_RANK) will fail"
            );
            Ok(())
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    fn plan(kind: LauncherKind, hosts: &[&str], hostfile: bool) -> Plan {
        Plan {
            kind,
            node_names: hosts.iter().map(|h| h.to_string()).collect(),
            nodes: 1,
            procs_per_node: 2,
            hosts: hosts
                .iter()
                .map(|h| crate::plan::launch::Host {
                    name: h.to_string(),
                    slots: None,
                })
                .collect(),
            hostfile: hostfile.then(|| PathBuf::from("/tmp/hosts")),
            oversubscribe: false,
            worker: PathBuf::from("/bin/true"),
            log_dir: PathBuf::from("/tmp/logs"),
            mpirun_args: Vec::new(),
            as_root: false,
            console: Default::default(),
        }
    }

    #[test]
    fn gpus_are_checked_only_where_the_ranks_start() {
        let none = |_: &str| None;
        let elsewhere = |p: &Plan| ranks_start_elsewhere(p, &none);
        assert_eq!(elsewhere(&plan(LauncherKind::Local, &[], false)), None);
        assert_eq!(elsewhere(&plan(LauncherKind::Mpirun, &[], false)), None);
        assert!(elsewhere(&plan(LauncherKind::Mpirun, &["a", "b"], false))
            .is_some_and(|p| p.contains("--hosts")));
        assert!(elsewhere(&plan(LauncherKind::Mpirun, &[], true))
            .is_some_and(|p| p.contains("--hostfile")));
        assert!(
            elsewhere(&plan(LauncherKind::Srun, &[], false)).is_some_and(|p| p.contains("srun"))
        );
        let mut p = plan(LauncherKind::Mpirun, &[], false);
        p.mpirun_args = vec!["--host=a,b".into()];
        assert!(elsewhere(&p).is_some_and(|w| w.contains("--mpirun-args")));
        let p = plan(LauncherKind::Mpirun, &[], false);
        let slurm = |n: &'static str| {
            move |k: &str| match k {
                "SLURM_JOB_ID" => Some("7".to_string()),
                "SLURM_JOB_NUM_NODES" => Some(n.to_string()),
                _ => None,
            }
        };
        assert!(ranks_start_elsewhere(&p, &slurm("2")).is_some_and(|w| w.contains("Slurm")));
        assert_eq!(ranks_start_elsewhere(&p, &slurm("1")), None);
    }

    #[test]
    fn cuda_visible_devices_is_respected() {
        assert_eq!(count_visible(4, None), 4);
        assert_eq!(count_visible(4, Some("0,1")), 2);
        assert_eq!(count_visible(4, Some(" ")), 0);
        assert_eq!(count_visible(4, Some("-1")), 0);
        assert_eq!(count_visible(4, Some("0,-1,2")), 1);
        assert_eq!(count_visible(1, Some("0,1,2")), 1);
        assert_eq!(count_visible(0, Some("0")), 0);
    }
}
