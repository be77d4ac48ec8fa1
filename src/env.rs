//! Environment contracts: how a rank learns who it is (MPI, Slurm, torchrun variables) and the
//! variables tchrun itself sets. Pure functions over a variable lookup, so both binaries and
//! the tests use the same code.

/// torchrun's contract, set by `tchrun exec` for every rank and read by `tchrun-worker`.
pub const RANK: &str = "RANK";
pub const WORLD_SIZE: &str = "WORLD_SIZE";
pub const LOCAL_RANK: &str = "LOCAL_RANK";
pub const LOCAL_WORLD_SIZE: &str = "LOCAL_WORLD_SIZE";
pub const NODE_RANK: &str = "NODE_RANK";
pub const MASTER_ADDR: &str = "MASTER_ADDR";
pub const MASTER_PORT: &str = "MASTER_PORT";
/// Log directory handed from the launcher to the ranks.
pub const TCHRUN_LOG_DIR: &str = "TCHRUN_LOG_DIR";
/// For tests on machines without GPUs: the number of CUDA devices `tchrun` and
/// `tchrun-worker` count instead of the driver's (launcher) and `torch.cuda.device_count()`
/// (worker). Only the checks of `--procs-per-node` against the GPUs use it: a worker that
/// passes them still needs real CUDA, and says so, before it touches a device.
pub const TCHRUN_TEST_CUDA_DEVICES: &str = "TCHRUN_TEST_CUDA_DEVICES";

/// Set by `tchrun train` for the ranks of each attempt of a job (`--max-restarts`): 1 for the
/// first, 2 after one restart, ... Recorded in `ranks.json`; read by the test hook below.
pub const TCHRUN_ATTEMPT: &str = "TCHRUN_ATTEMPT";
/// Test hook (fault injection), read by the worker: `RANK:STEP` makes that rank SIGKILL itself
/// just before optimizer step STEP (0-based, counted over the whole run), in the first attempt
/// only (`TCHRUN_ATTEMPT` unset or 1). For the restart tests and `scripts/soak.sh`; never set
/// it in a real job.
pub const TCHRUN_TEST_KILL_AT_STEP: &str = "TCHRUN_TEST_KILL_AT_STEP";
/// Test hook (fault injection), read by the worker: `RANK:STEP` makes rank RANK's input of
/// optimizer step STEP (0-based) NaN, so that step's loss and update go non-finite. For the
/// divergence guard's tests (the first non-finite step named, nothing non-finite written);
/// never set it in a real job.
pub const TCHRUN_TEST_NAN_AT_STEP: &str = "TCHRUN_TEST_NAN_AT_STEP";
/// Test hook, read by the worker: `SCALE` runs the fp16 dynamic loss scaler (otherwise CUDA
/// with `--amp fp16` only) on any device with this initial scale, so the CPU tests exercise
/// its unscale, overflow check, skipped step and backoff. Never set it in a real job.
pub const TCHRUN_TEST_LOSS_SCALE: &str = "TCHRUN_TEST_LOSS_SCALE";
/// Test hook (fault injection), read by the worker: `RANK:STEP:SECONDS` makes rank RANK's main
/// thread spin (a busy loop) SECONDS in forward just before optimizer step STEP (its heartbeat thread goes
/// on beating): a rank that is stuck, not stopped. For `tests/hang.rs`; never set it in a real
/// job.
pub const TCHRUN_TEST_STALL_AT_STEP: &str = "TCHRUN_TEST_STALL_AT_STEP";
/// Test hook (fault injection), read by the loader: `RANK:IMAGE:SECONDS` makes rank RANK's
/// IMAGE-th image decode (counted from 1 over the run, by all its loader threads) block for
/// SECONDS: a rank stuck in the data wait. For `tests/hang.rs`; never set it in a real job.
pub const TCHRUN_TEST_STALL_DECODE: &str = "TCHRUN_TEST_STALL_DECODE";
/// Test hook (fault injection), read by the worker: `RANK` makes that rank, once its work is
/// done and it succeeded, block (up to 10 minutes) while it leaves the process group: a rank
/// stuck in MPI_Finalize. For `tests/hang.rs`; never set it in a real job.
pub const TCHRUN_TEST_STALL_LEAVING: &str = "TCHRUN_TEST_STALL_LEAVING";
/// `0` turns off rank 0's `status.json` and the straggler windows (their all-gather every
/// `--print-freq` steps): for `benches/off_cost.sh`, which measures what they cost.
pub const TCHRUN_LIVE_STATUS: &str = "TCHRUN_LIVE_STATUS";
/// Test hook (fault injection): `WHO:SECONDS` makes every optimizer step of rank WHO (a rank
/// number, or a host name: every rank on that host) sleep SECONDS inside its compute (a slow
/// GPU or CPU). For the straggler tests; never set it in a real job.
pub const TCHRUN_TEST_SLOW_STEP: &str = "TCHRUN_TEST_SLOW_STEP";
/// Test hook (fault injection), read by the loader: `WHO:SECONDS` makes every image decode of
/// rank WHO (a rank number or a host name) sleep SECONDS (a slow disk). For the straggler
/// tests; never set it in a real job.
pub const TCHRUN_TEST_SLOW_LOADER: &str = "TCHRUN_TEST_SLOW_LOADER";
/// Test hook (fault injection), read by the worker: `SECONDS` makes every rank sleep that long
/// before each validation batch: a slow validation that still progresses. For `tests/hang.rs`;
/// never set it in a real job.
pub const TCHRUN_TEST_SLOW_VALIDATION: &str = "TCHRUN_TEST_SLOW_VALIDATION";
/// Test hook (fault injection), read by the worker: `RANK:STEP:MIB` makes rank RANK's main
/// thread allocate and touch MIB MiB (16 MiB every 20 ms, kept) just before optimizer step
/// STEP: a rank that outgrows its memory limit, for the OOM-killer test of `tests/causes.rs`.
/// Never set it in a real job.
pub const TCHRUN_TEST_ALLOCATE_AT_STEP: &str = "TCHRUN_TEST_ALLOCATE_AT_STEP";
/// Test hook (fault injection), read by the worker: `HOST:STEPS` makes every rank that runs on
/// HOST (its hostname) SIGKILL itself after STEPS optimizer steps of the attempt (counted from
/// the step the attempt started at, so each attempt makes progress first), in every attempt: a
/// node that keeps failing, for the `--exclude-failed-hosts` tests. Never set it in a real job.
pub const TCHRUN_TEST_KILL_ON_HOST: &str = "TCHRUN_TEST_KILL_ON_HOST";

/// Test hook, read by rank 0's checkpoint writer: every background checkpoint write pauses
/// this many seconds after writing its tensors, before `last.json` names them (a slow shared
/// filesystem; a kill in the pause is a kill mid-write). For the tests; never set it in a job.
pub const TCHRUN_TEST_CHECKPOINT_DELAY_S: &str = "TCHRUN_TEST_CHECKPOINT_DELAY_S";

/// Test hook, read by the worker: `RANK` makes that rank add two tensors of mismatched shapes
/// (64 and 3 values) before its first step, so libtorch raises and tch panics: a real panic
/// inside libtorch, for the failure-summary tests. Never set it in a job.
pub const TCHRUN_TEST_TORCH_PANIC: &str = "TCHRUN_TEST_TORCH_PANIC";

/// Test hook, read by the archive extraction (`data::archive`): every member waits this many
/// milliseconds before it is written (a slow archive, so that a test can interrupt an
/// extraction). For the tests; never set it in a job.
pub const TCHRUN_TEST_EXTRACT_DELAY_MS: &str = "TCHRUN_TEST_EXTRACT_DELAY_MS";

/// Set by the launcher (`tchrun train|score|evaluate`) for its ranks: the job lock files
/// (`lock.rs`, `.tchrun.lock`) it holds for the job's output and log directories, joined like
/// `PATH`. Rank 0 takes the lock of each of its directories not listed here itself, so ranks
/// started without the launcher (`mpirun tchrun-worker train ...` by hand, a batch script)
/// are protected too. Never set it by hand.
pub const TCHRUN_LOCK_HELD: &str = "TCHRUN_LOCK_HELD";

// Every other variable tchrun reads (the `TCHRUN_<FLAG>` variables of the shared flags are
// documented with their flags in `flags.rs`).

/// The job's secret (64 hex digits: 32 random bytes, `tchrun::secret`): made by `tchrun` for
/// each attempt and set on the commands it spawns (mpirun `-x` forwards it by name), never
/// on a command line or in a file. Every rank proves it to rank 0's rendezvous front before
/// it reaches the store. A job started by hand under MPI needs none (rank 0 makes one and
/// sends it to the others over MPI); one started by hand without MPI with more than one
/// rank needs the same value in every rank's environment.
pub const TCHRUN_JOB_SECRET: &str = "TCHRUN_JOB_SECRET";

/// Rank 0's address as the other ranks reach it (store and process group): overrides the
/// first non-loopback IPv4 address of rank 0's host (multi-node) or 127.0.0.1 (one node).
pub const TCHRUN_MASTER_ADDR: &str = "TCHRUN_MASTER_ADDR";
/// `--ifname`'s variable: the network interface every rank uses (rank 0 offers only its
/// addresses; Gloo binds it; `GLOO_SOCKET_IFNAME`/`NCCL_SOCKET_IFNAME` are set to it).
pub const TCHRUN_IFNAME: &str = "TCHRUN_IFNAME";
/// PyTorch's Gloo interfaces (comma-separated; one Gloo device each). Honoured as PyTorch
/// honours it; set by each rank to its chosen interface unless the user set it.
pub const GLOO_SOCKET_IFNAME: &str = "GLOO_SOCKET_IFNAME";
/// NCCL's socket interfaces (prefixes; `=` exact, `^` excludes). Honoured (NCCL reads it); set
/// by each rank to its chosen interface unless the user set it.
pub const NCCL_SOCKET_IFNAME: &str = "NCCL_SOCKET_IFNAME";
/// The most never-verified image headers a training job checks before its first step
/// (`data::index::upfront_limit`); above it each image is checked when first decoded.
/// Default `data::index::UPFRONT_VERIFY_LIMIT` (50,000); 0 never checks up front.
pub const TCHRUN_VERIFY_UPFRONT_MAX: &str = "TCHRUN_VERIFY_UPFRONT_MAX";
/// `--threads`' variable: intra-op (libtorch) threads of each rank; default:
/// [`threads_per_rank`].
pub const TCHRUN_THREADS: &str = "TCHRUN_THREADS";
/// The driver log's `tracing` filter (`EnvFilter` syntax, e.g. `debug`); default `info`.
pub const TCHRUN_LOG: &str = "TCHRUN_LOG";
/// `dist::init()` (Rust programs that are ranks): seconds to join the job; default 300.
pub const TCHRUN_TIMEOUT: &str = "TCHRUN_TIMEOUT";
/// `dist::init()`: `gloo` or `nccl`; default NCCL with CUDA, Gloo without.
pub const TCHRUN_BACKEND: &str = "TCHRUN_BACKEND";
/// Build time (`worker/build.rs`, which reads it by name): `1` builds the shim without NCCL
/// even where the libtorch wheel ships CUDA.
pub const TCHRUN_NO_NCCL: &str = "TCHRUN_NO_NCCL";
/// Where the launcher looks for `mpirun` and `srun` (and `tensorboard`, for the command it
/// prints after training).
pub const PATH: &str = "PATH";
/// The active Python virtual environment: where the launcher looks for `tensorboard` when it is
/// not on PATH.
pub const VIRTUAL_ENV: &str = "VIRTUAL_ENV";
/// Set inside a Slurm allocation: the launcher's default launch is then srun, and the rank's
/// Slurm contract uses it (with the step id) to pick a port.
pub const SLURM_JOB_ID: &str = "SLURM_JOB_ID";
/// An srun task's step, rank, size, node-local rank and node index.
pub const SLURM_STEP_ID: &str = "SLURM_STEP_ID";
pub const SLURM_PROCID: &str = "SLURM_PROCID";
pub const SLURM_NTASKS: &str = "SLURM_NTASKS";
pub const SLURM_LOCALID: &str = "SLURM_LOCALID";
pub const SLURM_NODEID: &str = "SLURM_NODEID";
/// Tasks per node of the step (`SLURM_STEP_TASKS_PER_NODE`, else the job's), e.g. `2(x3),1`.
pub const SLURM_STEP_TASKS_PER_NODE: &str = "SLURM_STEP_TASKS_PER_NODE";
pub const SLURM_TASKS_PER_NODE: &str = "SLURM_TASKS_PER_NODE";
/// The step's (else the job's) node list; its first host serves the store.
pub const SLURM_STEP_NODELIST: &str = "SLURM_STEP_NODELIST";
pub const SLURM_JOB_NODELIST: &str = "SLURM_JOB_NODELIST";

/// Threads one rank may use: this host's cores shared among the `local_size` ranks on it (at
/// least one), so ranks do not oversubscribe the host. The one rule for a rank's intra-op
/// threads and its loader's decode threads.
pub fn threads_per_rank(local_size: usize) -> usize {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    (cores / local_size.max(1)).max(1)
}

pub use tchrun_probe::cpu::busy_cores;

/// Prefixes of variables the launcher forwards to remote ranks.
pub const FORWARD_PREFIXES: &[&str] = &["TCHRUN_", "NCCL_", "CUDA_", "GLOO_", "TORCH_", "OMP_"];
/// Exact names the launcher forwards to remote ranks.
pub const FORWARD_NAMES: &[&str] = &["LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "VIRTUAL_ENV"];

/// `tchrun-worker exec` sets it to `1` for the program unless the environment has it (set it
/// empty to keep Python's buffering): a Python program's prints then reach the driver log and
/// the console as it prints them, not when a buffer fills or the program ends.
pub const PYTHONUNBUFFERED: &str = "PYTHONUNBUFFERED";

/// The variables that mark a process as an MPI rank. `tchrun-worker exec` finalizes MPI and
/// removes them before exec'ing the program, which then joins through torchrun's variables.
pub const MPI_MARKERS: &[&str] = &["OMPI_COMM_WORLD_RANK", "PMIX_RANK"];

/// Who started this process, decided before MPI is touched (MPI_Init aborts under
/// `srun --mpi=none`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartedBy {
    /// OpenMPI's mpirun or `srun --mpi=pmix`: `OMPI_COMM_WORLD_*` or `PMIX_RANK` present.
    Mpi,
    /// An srun task without PMIx: `SLURM_STEP_ID` and `SLURM_PROCID` set.
    Slurm,
    /// torchrun's variables (`RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT`).
    Torchrun,
    /// None of these: a single process.
    Single,
}

/// Decides how this process was started. Under mpirun inside an sbatch allocation every rank
/// inherits misleading `SLURM_PROCID`, so MPI's variables win.
pub fn started_by(get: &dyn Fn(&str) -> Option<String>) -> StartedBy {
    if MPI_MARKERS.iter().any(|m| get(m).is_some()) {
        StartedBy::Mpi
    } else if get(RANK).is_some() && get(WORLD_SIZE).is_some() {
        StartedBy::Torchrun
    } else if get(SLURM_STEP_ID).is_some() && get(SLURM_PROCID).is_some() {
        StartedBy::Slurm
    } else {
        StartedBy::Single
    }
}

/// Where a rank sits in the job.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RankEnv {
    pub rank: usize,
    pub world_size: usize,
    pub local_rank: usize,
    pub local_size: usize,
    pub node_rank: usize,
    /// Address of rank 0's store (None: rank 0 picks and shares it, as under MPI).
    pub master_addr: Option<String>,
    pub master_port: Option<u16>,
}

/// A variable of the rank contract is missing or malformed.
#[derive(Debug, thiserror::Error)]
pub enum EnvError {
    #[error("environment variable {name} is not set; {hint}")]
    Missing {
        name: &'static str,
        hint: &'static str,
    },
    #[error("environment variable {name}={value:?} is not valid: {why}")]
    Invalid {
        name: &'static str,
        value: String,
        why: String,
    },
}

fn parse<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &'static str,
    hint: &'static str,
) -> Result<T, EnvError>
where
    T::Err: std::fmt::Display,
{
    let value = get(name).ok_or(EnvError::Missing { name, hint })?;
    value.trim().parse().map_err(|e: T::Err| EnvError::Invalid {
        name,
        value: value.clone(),
        why: e.to_string(),
    })
}

fn parse_or<T: std::str::FromStr>(
    get: &dyn Fn(&str) -> Option<String>,
    name: &'static str,
    default: T,
) -> Result<T, EnvError>
where
    T::Err: std::fmt::Display,
{
    match get(name) {
        None => Ok(default),
        Some(_) => parse(get, name, ""),
    }
}

fn check_rank(env: RankEnv) -> Result<RankEnv, EnvError> {
    if env.world_size == 0 || env.rank >= env.world_size {
        return Err(EnvError::Invalid {
            name: RANK,
            value: env.rank.to_string(),
            why: format!("rank must be below the world size {}", env.world_size),
        });
    }
    if env.local_size == 0 || env.local_rank >= env.local_size {
        return Err(EnvError::Invalid {
            name: LOCAL_RANK,
            value: env.local_rank.to_string(),
            why: format!(
                "local rank must be below the local world size {}",
                env.local_size
            ),
        });
    }
    Ok(env)
}

const TORCHRUN_HINT: &str = "set RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT (torchrun's contract) or start the ranks with mpirun/srun";

/// `TCHRUN_TEST_CUDA_DEVICES`: `None` when unset (or empty), else the device count it claims.
pub fn test_cuda_devices(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<usize>, EnvError> {
    match get(TCHRUN_TEST_CUDA_DEVICES) {
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(_) => parse(get, TCHRUN_TEST_CUDA_DEVICES, "").map(Some),
        None => Ok(None),
    }
}

/// `TCHRUN_TEST_KILL_AT_STEP`: the (rank, step) to kill in this attempt, if any.
pub fn test_kill_at_step(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(usize, u64)>, EnvError> {
    let Some(v) = get(TCHRUN_TEST_KILL_AT_STEP).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let attempt: u32 = parse_or(get, TCHRUN_ATTEMPT, 1)?;
    let invalid = |why: &str| EnvError::Invalid {
        name: TCHRUN_TEST_KILL_AT_STEP,
        value: v.clone(),
        why: why.into(),
    };
    let (r, k) = v
        .trim()
        .split_once(':')
        .ok_or_else(|| invalid("expected RANK:STEP"))?;
    let rank = r.parse().map_err(|_| invalid("RANK is not a number"))?;
    let step = k.parse().map_err(|_| invalid("STEP is not a number"))?;
    Ok((attempt <= 1).then_some((rank, step)))
}

/// `TCHRUN_TEST_KILL_ON_HOST`: `(host, steps)` when set.
pub fn test_kill_on_host(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<(String, u64)>, EnvError> {
    let Some(v) = get(TCHRUN_TEST_KILL_ON_HOST).filter(|v| !v.trim().is_empty()) else {
        return Ok(None);
    };
    let invalid = |why: &str| EnvError::Invalid {
        name: TCHRUN_TEST_KILL_ON_HOST,
        value: v.clone(),
        why: why.into(),
    };
    let (host, steps) = v
        .trim()
        .rsplit_once(':')
        .ok_or_else(|| invalid("expected HOST:STEPS"))?;
    if host.is_empty() {
        return Err(invalid("HOST is empty"));
    }
    let steps = steps
        .parse()
        .map_err(|_| invalid("STEPS is not a number"))?;
    Ok(Some((host.to_string(), steps)))
}

/// `TCHRUN_TEST_CHECKPOINT_DELAY_S`: the delay of every background checkpoint write, if any.
pub fn test_checkpoint_delay(
    get: &dyn Fn(&str) -> Option<String>,
) -> Result<Option<std::time::Duration>, EnvError> {
    match get(TCHRUN_TEST_CHECKPOINT_DELAY_S) {
        Some(v) if v.trim().is_empty() => Ok(None),
        Some(_) => parse::<f64>(get, TCHRUN_TEST_CHECKPOINT_DELAY_S, "")
            .and_then(|s| {
                std::time::Duration::try_from_secs_f64(s).map_err(|e| EnvError::Invalid {
                    name: TCHRUN_TEST_CHECKPOINT_DELAY_S,
                    value: s.to_string(),
                    why: e.to_string(),
                })
            })
            .map(Some),
        None => Ok(None),
    }
}

/// The refusal when more ranks share a host than it has GPUs (one rank per GPU; NCCL fails
/// later with "Duplicate GPU detected" otherwise). Both binaries print the same words.
pub fn too_many_ranks_for_gpus(procs_per_node: usize, gpus: usize, host: &str) -> String {
    format!(
        "--procs-per-node {procs_per_node} exceeds the {gpus} GPU(s) visible on {host}; \
         lower --procs-per-node to {gpus} or check CUDA_VISIBLE_DEVICES (or use --device cpu)"
    )
}

/// torchrun's contract: `RANK`, `WORLD_SIZE`, `MASTER_ADDR`, `MASTER_PORT` (+ optional
/// `LOCAL_RANK`, `LOCAL_WORLD_SIZE`, `NODE_RANK`).
pub fn from_torchrun(get: &dyn Fn(&str) -> Option<String>) -> Result<RankEnv, EnvError> {
    let rank: usize = parse(get, RANK, TORCHRUN_HINT)?;
    let world_size: usize = parse(get, WORLD_SIZE, TORCHRUN_HINT)?;
    let local_rank = parse_or(get, LOCAL_RANK, rank)?;
    let local_size = parse_or(get, LOCAL_WORLD_SIZE, world_size)?;
    let node_rank = parse_or(get, NODE_RANK, 0usize)?;
    let master_addr = get(MASTER_ADDR).ok_or(EnvError::Missing {
        name: MASTER_ADDR,
        hint: TORCHRUN_HINT,
    })?;
    let master_port: u16 = parse(get, MASTER_PORT, TORCHRUN_HINT)?;
    check_rank(RankEnv {
        rank,
        world_size,
        local_rank,
        local_size,
        node_rank,
        master_addr: Some(master_addr),
        master_port: Some(master_port),
    })
}

const SLURM_HINT: &str = "run inside an srun job step";

/// Slurm's task contract (srun without PMIx): `SLURM_PROCID`, `SLURM_NTASKS`, `SLURM_LOCALID`,
/// `SLURM_NODEID`, first host of `SLURM_STEP_NODELIST`/`SLURM_JOB_NODELIST`. `MASTER_ADDR` and
/// `MASTER_PORT` override; the port otherwise derives from the job and step ids.
pub fn from_slurm(get: &dyn Fn(&str) -> Option<String>) -> Result<RankEnv, EnvError> {
    let rank: usize = parse(get, SLURM_PROCID, SLURM_HINT)?;
    let world_size: usize = parse(get, SLURM_NTASKS, SLURM_HINT)?;
    let local_rank: usize = parse_or(get, SLURM_LOCALID, 0usize)?;
    let node_rank: usize = parse_or(get, SLURM_NODEID, 0usize)?;
    let local_size = match get(SLURM_STEP_TASKS_PER_NODE).or_else(|| get(SLURM_TASKS_PER_NODE)) {
        Some(v) => tasks_per_node(&v, node_rank).ok_or(EnvError::Invalid {
            name: SLURM_TASKS_PER_NODE,
            value: v.clone(),
            why: "expected Slurm's form such as 2(x3),1".into(),
        })?,
        None => world_size,
    };
    let master_addr = match get(MASTER_ADDR) {
        Some(a) => a,
        None => {
            let list = get(SLURM_STEP_NODELIST)
                .or_else(|| get(SLURM_JOB_NODELIST))
                .ok_or(EnvError::Missing {
                    name: SLURM_JOB_NODELIST,
                    hint: SLURM_HINT,
                })?;
            first_host(&list).ok_or(EnvError::Invalid {
                name: SLURM_JOB_NODELIST,
                value: list.clone(),
                why: "no host in the node list".into(),
            })?
        }
    };
    let master_port = match get(MASTER_PORT) {
        Some(_) => parse(get, MASTER_PORT, "")?,
        None => {
            let job: u64 = parse_or(get, SLURM_JOB_ID, 0u64)?;
            let step: u64 = parse_or(get, SLURM_STEP_ID, 0u64)?;
            // A port in 20000..40000 that all tasks of the step compute alike.
            (20000 + (job.wrapping_mul(31).wrapping_add(step)) % 20000) as u16
        }
    };
    check_rank(RankEnv {
        rank,
        world_size,
        local_rank,
        local_size,
        node_rank,
        master_addr: Some(master_addr),
        master_port: Some(master_port),
    })
}

/// Tasks on node `node` from Slurm's compressed `2(x3),1` form.
pub fn tasks_per_node(spec: &str, node: usize) -> Option<usize> {
    let mut seen = 0usize;
    for part in spec.split(',') {
        let (count, repeat) = match part.split_once("(x") {
            Some((c, r)) => (
                c.trim().parse::<usize>().ok()?,
                r.trim_end_matches(')').parse::<usize>().ok()?,
            ),
            None => (part.trim().parse::<usize>().ok()?, 1),
        };
        // Checked: a repeat count near usize::MAX must not wrap (a wrong answer, or a panic
        // in debug builds); past usize::MAX every node is inside this part.
        match seen.checked_add(repeat) {
            Some(end) if node >= end => seen = end,
            _ => return Some(count),
        }
    }
    None
}

/// First host of a Slurm host list: `node[07-09,12],gpu1` → `node07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let end = list.find(',').unwrap_or(list.len());
    let bracket = list.find('[');
    match bracket {
        Some(b) if b < end => {
            let close = list[b..].find(']')? + b;
            let inner = &list[b + 1..close];
            let first = inner.split(',').next()?.split('-').next()?;
            let host = format!(
                "{}{}{}",
                &list[..b],
                first,
                &list[close + 1..].split(',').next().unwrap_or("")
            );
            // `[]` or `[,]` name no host.
            (!host.is_empty()).then_some(host)
        }
        _ => {
            let host = &list[..end];
            (!host.is_empty()).then(|| host.to_string())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn the_kill_hook_fires_in_the_first_attempt_only() {
        let k = TCHRUN_TEST_KILL_AT_STEP;
        assert_eq!(test_kill_at_step(&vars(&[])).unwrap(), None);
        assert_eq!(
            test_kill_at_step(&vars(&[(k, "1:7")])).unwrap(),
            Some((1, 7))
        );
        let first = vars(&[(k, "1:7"), (TCHRUN_ATTEMPT, "1")]);
        assert_eq!(test_kill_at_step(&first).unwrap(), Some((1, 7)));
        let second = vars(&[(k, "1:7"), (TCHRUN_ATTEMPT, "2")]);
        assert_eq!(test_kill_at_step(&second).unwrap(), None);
        assert!(test_kill_at_step(&vars(&[(k, "7")])).is_err());
        assert!(test_kill_at_step(&vars(&[(k, "a:1")])).is_err());
    }

    #[test]
    fn the_host_kill_hook_names_a_host_and_a_step_count() {
        let k = TCHRUN_TEST_KILL_ON_HOST;
        assert_eq!(test_kill_on_host(&vars(&[])).unwrap(), None);
        assert_eq!(
            test_kill_on_host(&vars(&[(k, "tchrun-node2:5"), (TCHRUN_ATTEMPT, "3")])).unwrap(),
            Some(("tchrun-node2".to_string(), 5))
        );
        for bad in ["node2", ":5", "node2:x"] {
            let e = test_kill_on_host(&vars(&[(k, bad)])).expect_err(bad);
            assert!(e.to_string().contains(k), "{e}");
        }
    }

    #[test]
    fn detection_prefers_mpi_over_inherited_slurm() {
        let v = vars(&[
            ("OMPI_COMM_WORLD_RANK", "1"),
            ("SLURM_PROCID", "0"),
            ("SLURM_STEP_ID", "0"),
        ]);
        assert_eq!(started_by(&v), StartedBy::Mpi);
        let v = vars(&[("SLURM_PROCID", "3"), ("SLURM_STEP_ID", "0")]);
        assert_eq!(started_by(&v), StartedBy::Slurm);
        let v = vars(&[("RANK", "0"), ("WORLD_SIZE", "2")]);
        assert_eq!(started_by(&v), StartedBy::Torchrun);
        assert_eq!(started_by(&vars(&[])), StartedBy::Single);
    }

    #[test]
    fn torchrun_env() {
        let v = vars(&[
            ("RANK", "1"),
            ("WORLD_SIZE", "4"),
            ("LOCAL_RANK", "1"),
            ("LOCAL_WORLD_SIZE", "2"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29500"),
        ]);
        let e = from_torchrun(&v).expect("valid env");
        assert_eq!(
            (e.rank, e.world_size, e.local_rank, e.local_size),
            (1, 4, 1, 2)
        );
        assert_eq!(e.master_addr.as_deref(), Some("10.0.0.1"));
        let bad = vars(&[
            ("RANK", "4"),
            ("WORLD_SIZE", "4"),
            ("MASTER_ADDR", "a"),
            ("MASTER_PORT", "1"),
        ]);
        assert!(from_torchrun(&bad).is_err());
        let missing = vars(&[("RANK", "0"), ("WORLD_SIZE", "1")]);
        let err = from_torchrun(&missing).expect_err("no master");
        assert!(err.to_string().contains("MASTER_ADDR"), "{err}");
        let junk = vars(&[("RANK", "x"), ("WORLD_SIZE", "1")]);
        assert!(from_torchrun(&junk)
            .expect_err("junk")
            .to_string()
            .contains("RANK=\"x\""));
    }

    #[test]
    fn slurm_env() {
        let v = vars(&[
            ("SLURM_PROCID", "3"),
            ("SLURM_NTASKS", "4"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_NODEID", "1"),
            ("SLURM_TASKS_PER_NODE", "2(x2)"),
            ("SLURM_JOB_NODELIST", "gpu[07-08]"),
            ("SLURM_JOB_ID", "42"),
            ("SLURM_STEP_ID", "0"),
        ]);
        let e = from_slurm(&v).expect("valid");
        assert_eq!(
            (
                e.rank,
                e.world_size,
                e.local_rank,
                e.local_size,
                e.node_rank
            ),
            (3, 4, 1, 2, 1)
        );
        assert_eq!(e.master_addr.as_deref(), Some("gpu07"));
        assert_eq!(e.master_port, Some(20000 + (42 * 31) % 20000));
    }

    #[test]
    fn test_cuda_devices_variable() {
        assert_eq!(test_cuda_devices(&vars(&[])).expect("unset"), None);
        assert_eq!(
            test_cuda_devices(&vars(&[(TCHRUN_TEST_CUDA_DEVICES, "")])).expect("empty"),
            None
        );
        assert_eq!(
            test_cuda_devices(&vars(&[(TCHRUN_TEST_CUDA_DEVICES, " 2 ")])).expect("2"),
            Some(2)
        );
        let err = test_cuda_devices(&vars(&[(TCHRUN_TEST_CUDA_DEVICES, "two")])).expect_err("junk");
        assert!(
            err.to_string().contains("TCHRUN_TEST_CUDA_DEVICES=\"two\""),
            "{err}"
        );
        let m = too_many_ranks_for_gpus(4, 2, "gpu07");
        assert!(
            m.starts_with("--procs-per-node 4 exceeds the 2 GPU(s) visible on gpu07; lower --procs-per-node to 2"),
            "{m}"
        );
    }

    #[test]
    fn host_lists() {
        assert_eq!(first_host("node[07-09,12],gpu1").as_deref(), Some("node07"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("solo").as_deref(), Some("solo"));
        assert_eq!(first_host("").as_deref(), None);
        assert_eq!(tasks_per_node("2(x3),1", 3), Some(1));
        assert_eq!(tasks_per_node("2(x3),1", 2), Some(2));
        assert_eq!(tasks_per_node("4", 0), Some(4));
        assert_eq!(tasks_per_node("4", 1), None);
    }
}
