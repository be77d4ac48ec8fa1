//! Launch policy: which launcher runs the ranks and the exact command line it gets. Pure
//! functions from a validated `Plan` to `CommandSpec`s, unit-tested; nothing here spawns.
use clap::{Args, ValueEnum};
use std::path::PathBuf;

/// How ranks are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LauncherKind {
    /// srun inside a Slurm allocation, else mpirun when installed, else local processes.
    Auto,
    Mpirun,
    Srun,
    Local,
}

/// `--max-restarts`, declared once for `tchrun train` (`RestartArgs`) and `tchrun sbatch`
/// (which says it in its terms: `SBATCH_HELP`, set with `mut_arg`).
#[derive(clap::Args, Debug, Clone, Copy)]
pub struct MaxRestarts {
    /// Restarts of the whole job after a rank failure, each resuming from the last complete
    /// checkpoint (only when the failed attempt wrote a newer one: a job that fails before
    /// making progress is not retried). 0: fail as soon as a rank fails.
    #[arg(
        help_heading = "Fault tolerance",
        long,
        env = "TCHRUN_MAX_RESTARTS",
        default_value_t = 0
    )]
    pub max_restarts: u32,
}

impl MaxRestarts {
    /// `tchrun sbatch --max-restarts`' help.
    pub const SBATCH_HELP: &'static str = "Restarts within the allocation after a rank failure, \
        each resuming from the last complete checkpoint (only when the failed attempt wrote a \
        newer one). 0: the first failure ends the job. A preempted or timed-out job is requeued \
        either way";
}

/// Launch flags (the design's names; each also reads `TCHRUN_<FLAG>`).
#[derive(Args, Debug, Clone)]
pub struct LaunchArgs {
    /// Nodes to run on.
    #[arg(help_heading = "Launch", visible_alias = "nnodes", long, env = "TCHRUN_NODES", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub nodes: u32,
    /// Ranks per node (at most the GPUs per node on CUDA, the cores on CPU).
    #[arg(help_heading = "Launch", visible_alias = "nproc-per-node", long, env = "TCHRUN_PROCS_PER_NODE", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..), allow_negative_numbers = true)]
    pub procs_per_node: u32,
    /// How to start the ranks.
    #[arg(help_heading = "Launch", long, env = "TCHRUN_LAUNCHER", value_enum, default_value_t = LauncherKind::Auto)]
    pub launcher: LauncherKind,
    /// OpenMPI hostfile (`host slots=N` lines).
    #[arg(
        help_heading = "Launch",
        long,
        env = "TCHRUN_HOSTFILE",
        conflicts_with = "hosts"
    )]
    pub hostfile: Option<PathBuf>,
    /// Comma-separated hosts (instead of --hostfile).
    #[arg(
        help_heading = "Launch",
        long,
        env = "TCHRUN_HOSTS",
        value_delimiter = ','
    )]
    pub hosts: Vec<String>,
    /// Allow more ranks than slots/cores (mpirun --oversubscribe).
    #[arg(help_heading = "Launch", long, env = "TCHRUN_OVERSUBSCRIBE")]
    pub oversubscribe: bool,
    /// Print the exact command and environment, start nothing.
    #[arg(help_heading = "Launch", long, env = "TCHRUN_DRY_RUN")]
    pub dry_run: bool,
    /// The tchrun-worker binary (default: the one beside tchrun, which must exist at the same
    /// path on every node).
    #[arg(help_heading = "Launch", long, env = "TCHRUN_WORKER")]
    pub worker: Option<PathBuf>,
    /// Seconds the ranks get to stop cleanly (checkpoint) after Ctrl-C/SIGTERM before they are
    /// killed.
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_GRACE_PERIOD", default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=tchrun::counts::MAX_SECONDS))]
    pub grace_period: u64,
    /// End the job when no rank made progress for this many seconds (0: off). Unset: a rank
    /// that stops beating while the others wait in a collective ends the job, and so does no
    /// step for max(60 s, 10 × the slowest step; 30 min in validation and writes); exec's
    /// programs are watched only with a number (their driver logs' writes). A launch that
    /// starts no rank (no driver log) within this many seconds (at least 30; unset: 300) is
    /// ended, exit 3.
    #[arg(help_heading = "Fault tolerance", long, env = "TCHRUN_HANG_TIMEOUT", value_parser = clap::value_parser!(u64).range(0..=tchrun::counts::MAX_SECONDS))]
    pub hang_timeout: Option<u64>,
    /// Extra arguments for mpirun, one string (e.g. "--mca btl self,tcp").
    #[arg(
        help_heading = "Launch",
        long,
        env = "TCHRUN_MPIRUN_ARGS",
        allow_hyphen_values = true
    )]
    pub mpirun_args: Option<String>,
}

pub use tchrun_launcher::hostfile::{parse_hostfile, Host};

/// A validated launch.
#[derive(Debug, Clone)]
pub struct Plan {
    pub kind: LauncherKind,
    /// Node names from --hostfile/--hosts (for the rank table), empty otherwise.
    pub node_names: Vec<String>,
    pub nodes: u32,
    pub procs_per_node: u32,
    pub hosts: Vec<Host>,
    pub hostfile: Option<PathBuf>,
    pub oversubscribe: bool,
    pub worker: PathBuf,
    pub log_dir: PathBuf,
    pub mpirun_args: Vec<String>,
    pub as_root: bool,
    /// The ranks whose lines reach the terminal (`--console`; checked against the world size).
    pub console: tchrun::console::Selection,
}

impl Plan {
    /// `nodes × procs_per_node`, range-checked by the pre-flight (`tchrun::counts::world_size`)
    /// before any plan exists.
    pub fn world_size(&self) -> u32 {
        self.nodes * self.procs_per_node
    }

    /// The ranks run on this node (no hosts, no Slurm): its cores are theirs.
    pub fn on_this_node(&self) -> bool {
        self.kind != LauncherKind::Srun && self.hostfile.is_none() && self.node_names.is_empty()
    }

    /// On this node, the warning when its ranks × `threads` each, or its load average now,
    /// exceed its cores (`tchrun::metrics::CpuUse`), said once before any rank starts.
    pub fn cpu_warning(&self, flags: &tchrun::flags::RankFlags) -> Option<String> {
        if !self.on_this_node() {
            return None;
        }
        let ranks = self.procs_per_node as usize;
        tchrun::metrics::CpuUse::of_this_host(ranks, flags.threads_per_rank(ranks), true).warning()
    }
}

/// One process to spawn.
#[derive(Debug, Clone, PartialEq)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    /// Variables set for the child (on top of the inherited environment).
    pub env: Vec<(String, String)>,
}

impl CommandSpec {
    /// The command as one shell-quoted line.
    pub fn display(&self) -> String {
        // shell_words quotes every '=': keep `--flag=value` words readable.
        let plain = |w: &str| {
            !w.is_empty()
                && w.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_./=:,@%+".contains(c))
        };
        std::iter::once(&self.program)
            .chain(&self.args)
            .map(|w| {
                if plain(w) {
                    w.clone()
                } else {
                    shell_words::quote(w).into_owned()
                }
            })
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Names of the variables forwarded to remote ranks, from the current environment.
pub fn forwarded_vars(vars: impl Iterator<Item = String>) -> Vec<String> {
    use tchrun::env::{FORWARD_NAMES, FORWARD_PREFIXES};
    let mut v: Vec<String> = vars
        .filter(|k| {
            FORWARD_NAMES.contains(&k.as_str()) || FORWARD_PREFIXES.iter().any(|p| k.starts_with(p))
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

/// OpenMPI's wait between SIGTERM and SIGKILL when it tears a job down.
pub const SIGKILL_TIMEOUT_MCA: &str = "odls_base_sigkill_timeout";

/// `mpirun -np N --map-by ppr:P:node ... WORKER ARGS`.
pub fn mpirun_command(plan: &Plan, worker_args: &[String], forward: &[String]) -> CommandSpec {
    let mut args = vec!["-np".to_string(), plan.world_size().to_string()];
    args.extend([
        "--map-by".into(),
        format!("ppr:{}:node", plan.procs_per_node),
    ]);
    // Ranks size their own thread pools (cores / local ranks); OpenMPI's default core
    // binding would pin each rank to one core.
    args.extend(["--bind-to".into(), "none".into()]);
    if let Some(f) = &plan.hostfile {
        args.extend(["--hostfile".into(), f.display().to_string()]);
    } else if !plan.hosts.is_empty() {
        let hosts: Vec<String> = plan
            .hosts
            .iter()
            .map(|h| format!("{}:{}", h.name, plan.procs_per_node))
            .collect();
        args.extend(["--host".into(), hosts.join(",")]);
    }
    if plan.oversubscribe {
        args.push("--oversubscribe".into());
    }
    if plan.as_root {
        args.push("--allow-run-as-root".into());
    }
    // When one rank dies the job is lost: mpirun's default waits 1 s between its SIGTERM and
    // SIGKILL to the others; 0 ends them at once (the clean stop, SIGUSR1, is not a kill and
    // keeps its path; checkpoints are atomic). `--mpirun-args` may set it otherwise.
    if !plan.mpirun_args.iter().any(|a| a == SIGKILL_TIMEOUT_MCA) {
        args.extend(["--mca".into(), SIGKILL_TIMEOUT_MCA.into(), "0".into()]);
    }
    args.extend(single_node_transport(plan));
    for k in forward {
        args.extend(["-x".into(), k.clone()]);
    }
    args.extend(plan.mpirun_args.iter().cloned());
    args.push(plan.worker.display().to_string());
    args.extend(worker_args.iter().cloned());
    CommandSpec {
        program: "mpirun".into(),
        args,
        env: Vec::new(),
    }
}

/// MPI's byte transports (BTLs) of a job whose ranks share one node: itself and shared memory
/// only (`--mca btl self,vader`; Open MPI 5 takes `vader` as the alias of its `sm`). The TCP
/// BTL would listen on every interface (`0.0.0.0` and `[::]`, measured on Open MPI 4.1 even
/// with `btl_tcp_if_include`) for nothing: ranks on one node reach each other through memory,
/// and a stranger's bytes on that port could keep a rank from leaving MPI (issue 51). Empty
/// when the ranks span nodes, or when `--mpirun-args` chooses the BTLs itself.
fn single_node_transport(plan: &Plan) -> Vec<String> {
    let chosen = plan.mpirun_args.iter().any(|a| a == "btl");
    if plan.nodes != 1 || chosen || std::env::var_os("OMPI_MCA_btl").is_some() {
        return Vec::new();
    }
    vec!["--mca".into(), "btl".into(), "self,vader".into()]
}

/// `srun --nodes N --ntasks-per-node P --mpi=pmix ... WORKER ARGS` (inside an allocation).
pub fn srun_command(plan: &Plan, worker_args: &[String]) -> CommandSpec {
    let options = super::slurm_flags::SrunOptions {
        nodes: plan.nodes,
        ntasks: plan.world_size(),
        ntasks_per_node: plan.procs_per_node,
        mpi: "pmix".into(),
        kill_on_bad_exit: 1,
        export: "ALL".into(),
        overcommit: plan.oversubscribe,
    };
    let mut args =
        tchrun::argv::argv(&options).expect("srun's options are numbers and words (srun_line)");
    args.push(plan.worker.display().to_string());
    args.extend(worker_args.iter().cloned());
    CommandSpec {
        program: "srun".into(),
        args,
        env: Vec::new(),
    }
}

/// One local process per rank with torchrun's environment contract.
pub fn local_commands(plan: &Plan, worker_args: &[String], master_port: u16) -> Vec<CommandSpec> {
    use tchrun::env as c;
    let world = plan.world_size();
    (0..world)
        .map(|rank| CommandSpec {
            program: plan.worker.display().to_string(),
            args: worker_args.to_vec(),
            env: vec![
                (c::RANK.into(), rank.to_string()),
                (c::WORLD_SIZE.into(), world.to_string()),
                (c::LOCAL_RANK.into(), rank.to_string()),
                (c::LOCAL_WORLD_SIZE.into(), world.to_string()),
                (c::NODE_RANK.into(), "0".into()),
                (c::MASTER_ADDR.into(), "127.0.0.1".into()),
                (c::MASTER_PORT.into(), master_port.to_string()),
            ],
        })
        .collect()
}

/// Whether an environment variable's value must not be shown.
pub fn is_secret(name: &str) -> bool {
    let n = name.to_ascii_uppercase();
    ["TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL"]
        .iter()
        .any(|s| n.contains(s))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> Plan {
        Plan {
            node_names: vec!["a".into(), "b".into()],
            kind: LauncherKind::Mpirun,
            nodes: 2,
            procs_per_node: 4,
            hosts: vec![
                Host {
                    name: "a".into(),
                    slots: None,
                },
                Host {
                    name: "b".into(),
                    slots: None,
                },
            ],
            hostfile: None,
            oversubscribe: false,
            worker: PathBuf::from("/opt/tchrun/tchrun-worker"),
            log_dir: PathBuf::from("/tmp/logs"),
            mpirun_args: vec![],
            as_root: true,
            console: Default::default(),
        }
    }

    #[test]
    fn mpirun_line() {
        let c = mpirun_command(&plan(), &["selftest".into()], &["TCHRUN_X".into()]);
        assert_eq!(
            c.display(),
            "mpirun -np 8 --map-by ppr:4:node --bind-to none --host a:4,b:4 --allow-run-as-root --mca odls_base_sigkill_timeout 0 -x TCHRUN_X /opt/tchrun/tchrun-worker selftest"
        );
        // The user's own teardown wait wins.
        let mut p = plan();
        p.mpirun_args = vec!["--mca".into(), SIGKILL_TIMEOUT_MCA.into(), "2".into()];
        let c = mpirun_command(&p, &["selftest".into()], &[]);
        assert_eq!(
            c.display().matches(SIGKILL_TIMEOUT_MCA).count(),
            1,
            "{}",
            c.display()
        );
    }

    #[test]
    fn one_nodes_ranks_use_memory_not_tcp_unless_told() {
        let mut p = plan();
        assert!(!mpirun_command(&p, &[], &[]).display().contains(" btl "));
        p.nodes = 1;
        p.hosts.truncate(1);
        let line = mpirun_command(&p, &[], &[]).display();
        assert!(line.contains(" --mca btl self,vader "), "{line}");
        // The user's own choice wins.
        p.mpirun_args = vec!["--mca".into(), "btl".into(), "self,tcp".into()];
        let line = mpirun_command(&p, &[], &[]).display();
        assert_eq!(line.matches(" btl ").count(), 1, "{line}");
        assert!(line.contains("self,tcp"), "{line}");
    }

    #[test]
    fn srun_line() {
        let c = srun_command(&plan(), &["train".into()]);
        assert!(
            c.display()
                .starts_with("srun --nodes=2 --ntasks=8 --ntasks-per-node=4 --mpi=pmix"),
            "{}",
            c.display()
        );
    }

    #[test]
    fn local_env() {
        let mut p = plan();
        p.nodes = 1;
        p.procs_per_node = 2;
        let cs = local_commands(&p, &[], 29511);
        assert_eq!(cs.len(), 2);
        assert!(cs[1].env.contains(&("RANK".into(), "1".into())));
        assert!(cs[1].env.contains(&("MASTER_PORT".into(), "29511".into())));
    }

    #[test]
    fn secrets_and_forwarding() {
        assert!(
            is_secret("HF_TOKEN") && is_secret("aws_secret_access_key") && !is_secret("NCCL_DEBUG")
        );
        let f = forwarded_vars(
            ["NCCL_DEBUG", "HOME", "TCHRUN_EPOCHS", "PATH"]
                .iter()
                .map(|s| s.to_string()),
        );
        assert_eq!(f, vec!["NCCL_DEBUG", "PATH", "TCHRUN_EPOCHS"]);
    }
}
