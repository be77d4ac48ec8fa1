//! A rank's start and end, shared by every command: who it is (`bootstrap`), its device and
//! backend, rank 0's job locks, the driver log, joining the store and the process group; the
//! fatal error with the exit code and failure kind it ends with; leaving the job.
use crate::comm::{bootstrap, pg};
use crate::rank::driver_log;
use anyhow::Context;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tchrun::exit::ErrorKind;
use tchrun::flags::{Backend, Device as DeviceFlag, RankFlags};

/// A rank's failure with the kind that decides its exit code.
pub struct Fatal {
    pub kind: ErrorKind,
    pub err: anyhow::Error,
}

impl Fatal {
    pub fn invalid(err: anyhow::Error) -> Fatal {
        Fatal {
            kind: ErrorKind::InvalidInput,
            err,
        }
    }
    pub fn rank(err: anyhow::Error) -> Fatal {
        Fatal {
            kind: ErrorKind::RankFailed,
            err,
        }
    }
    /// A bootstrap failure: the network's fault (exit 3) or the rank's.
    pub fn bootstrap(e: bootstrap::BootstrapError, context: &'static str) -> Fatal {
        let kind = if e.is_network() {
            ErrorKind::LaunchFailed
        } else {
            ErrorKind::RankFailed
        };
        Fatal {
            kind,
            err: anyhow::Error::new(e).context(context),
        }
    }
}

/// What a command returns: the console to report on (once the driver log is open) and the
/// failure.
pub type RankResult = Result<(), (Option<driver_log::Console>, Fatal)>;

/// Leaves the job. After success: the process group is destroyed and MPI finalized, the
/// heartbeat saying so (`Phase::Leaving`: the launcher bounds how long it may take, and the
/// rank is `done` only when `main` returns). After a failure neither: MPI_Finalize and c10d's
/// destructors wait for peers that may be dead or unreachable (a network cut hangs them); the
/// rank must exit now, and mpirun or tchrun stops the rest.
pub fn leave(pg: pg::ProcessGroup, joined: bootstrap::Joined, ok: bool) {
    if ok {
        crate::heartbeat::phase(tchrun::job_record::heartbeat::Phase::Leaving);
        stall_leaving_if_asked(joined.info.place.rank);
        drop(pg);
        drop(joined);
    } else {
        std::mem::forget(pg);
        std::mem::forget(joined);
    }
}

/// `TCHRUN_TEST_STALL_LEAVING=RANK`: that rank blocks here (bounded: 10 minutes).
fn stall_leaving_if_asked(rank: usize) {
    let asked = std::env::var(tchrun::env::TCHRUN_TEST_STALL_LEAVING)
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok());
    if asked == Some(rank) {
        tracing::info!("test hook: stalling while leaving the process group");
        std::thread::sleep(Duration::from_secs(600));
    }
}

/// The CUDA devices this rank can use: `TCHRUN_TEST_CUDA_DEVICES` when set (tests; nothing
/// touches CUDA to count them), else torch's device count (`CUDA_VISIBLE_DEVICES` respected).
pub fn cuda_devices() -> Result<usize, Fatal> {
    match tchrun::env::test_cuda_devices(&|k| std::env::var(k).ok()) {
        Ok(Some(n)) => Ok(n),
        Ok(None) if tch::Cuda::is_available() => Ok(tch::Cuda::device_count().max(0) as usize),
        Ok(None) => Ok(0),
        Err(e) => Err(Fatal::invalid(e.into())),
    }
}

/// Device and backend after `auto` is resolved. One rank per GPU: local rank `i` uses
/// `cuda:i`, and a host with more ranks than GPUs is refused here, before the process group
/// exists (NCCL would fail later with "Duplicate GPU detected").
fn resolve(
    flags: &RankFlags,
    local_rank: usize,
    local_size: usize,
    host: &str,
) -> Result<(tch::Device, pg::BackendKind), Fatal> {
    let gpus = match flags.device {
        DeviceFlag::Cpu => 0,
        DeviceFlag::Auto | DeviceFlag::Cuda => cuda_devices()?,
    };
    let device = match flags.device {
        DeviceFlag::Cpu => tch::Device::Cpu,
        DeviceFlag::Auto if gpus == 0 => tch::Device::Cpu,
        DeviceFlag::Cuda if gpus == 0 => {
            return Err(Fatal::invalid(anyhow::anyhow!(
                "--device cuda: no CUDA device is visible on {host}; use --device cpu or check CUDA_VISIBLE_DEVICES"
            )))
        }
        DeviceFlag::Auto | DeviceFlag::Cuda => {
            if local_size > gpus || local_rank >= gpus {
                return Err(Fatal::invalid(anyhow::anyhow!(
                    "{}",
                    tchrun::env::too_many_ranks_for_gpus(local_size.max(local_rank + 1), gpus, host)
                )));
            }
            if !tch::Cuda::is_available() {
                return Err(Fatal::invalid(anyhow::anyhow!(
                    "{}={gpus} claims CUDA devices but CUDA is not available on {host}; unset it (it is for tests)",
                    tchrun::env::TCHRUN_TEST_CUDA_DEVICES
                )));
            }
            tch::Device::Cuda(local_rank)
        }
    };
    let backend = match (flags.backend, device.is_cuda()) {
        (Backend::Auto, true) => pg::BackendKind::Nccl,
        (Backend::Auto, false) | (Backend::Gloo, _) => pg::BackendKind::Gloo,
        (Backend::Nccl, true) => pg::BackendKind::Nccl,
        (Backend::Nccl, false) => {
            return Err(Fatal::invalid(anyhow::anyhow!(
            "--backend nccl needs CUDA tensors but the device is cpu; use --backend gloo (or auto)"
        )))
        }
    };
    Ok((device, backend))
}

/// Intra-op threads: `--threads`, else the host's cores shared among the ranks on it. The
/// host's first rank says in its driver log when ranks × threads exceed the cores or other
/// processes keep them busy (the launcher said it on the console); it watches the others in
/// a thread of its own (`BUSY_WINDOW`), so that its start waits for nothing.
fn set_threads(flags: &RankFlags, local_rank: usize, local_size: usize) {
    let n = flags.threads_per_rank(local_size);
    tch::set_num_threads(n as i32);
    let judge = move || {
        let cpu = tchrun::metrics::CpuUse::of_this_host(local_size, n, local_rank == 0);
        if local_rank == 0 {
            // The launcher said it on the console (once); the driver log keeps it at info
            // level, which stays off the console.
            if let Some(w) = cpu.warning() {
                tracing::info!("warning: {w}");
            }
        }
        let _ = CPU_AT_START.set(cpu);
    };
    if local_rank == 0 {
        if let Err(e) = std::thread::Builder::new()
            .name("cpu-use".into())
            .spawn(judge)
        {
            tracing::debug!("cannot watch the CPU use: {e}");
        }
    } else {
        judge();
    }
}

static CPU_AT_START: std::sync::OnceLock<tchrun::metrics::CpuUse> = std::sync::OnceLock::new();

/// This rank's node as the rank found it at start (cores, ranks × threads, others' use), when
/// that was oversubscribed: the epoch metrics record it and the run report's verdict says it.
pub fn cpu_oversubscribed() -> Option<tchrun::metrics::CpuUse> {
    CPU_AT_START.get().filter(|c| c.oversubscribed()).cloned()
}

/// Identify the rank, open its driver log, join the store and build the process group.
pub struct Rank {
    pub joined: bootstrap::Joined,
    pub pg: pg::ProcessGroup,
    pub device: tch::Device,
    pub console: driver_log::Console,
    /// Rank 0's job locks (those the launcher does not hold), for the rank's whole life.
    _locks: Vec<tchrun::lock::JobLock>,
}

/// Rank 0 of ranks started without the launcher (`mpirun tchrun-worker train ...` by hand, a
/// batch script) takes the job locks of `dirs` itself (`tchrun::lock`); the launcher's own
/// ranks find them in `TCHRUN_LOCK_HELD`. A directory another job holds is refused (exit 2).
fn lock_as_rank0(
    rank: usize,
    dirs: &[(&'static str, PathBuf)],
    command: &str,
) -> Result<Vec<tchrun::lock::JobLock>, (Option<driver_log::Console>, Fatal)> {
    if rank != 0 {
        return Ok(Vec::new());
    }
    let held = std::env::var(tchrun::env::TCHRUN_LOCK_HELD).ok();
    let info = tchrun::lock::LockInfo::here(command);
    let mut locks = Vec::new();
    for (flag, dir) in dirs {
        if tchrun::lock::held_by_launcher(held.as_deref(), dir) {
            continue;
        }
        let taken = tchrun::lock::acquire(flag, dir, &info)
            .map_err(|e| (None, Fatal::invalid(e.into())))?;
        if let Some(note) = taken.note() {
            eprintln!("tchrun-worker: {note}");
        }
        locks.push(taken.lock);
    }
    Ok(locks)
}

/// The variables that switch on libtorch's NCCL flight recorder (old and new names), each
/// unless the user set it: a small ring of NCCL collectives, dumped by NCCL's watchdog on a
/// timeout into `<log_dir>/nccl-flight-recorder-<rank>`, next to the rank's stacks.
pub const FLIGHT_RECORDER: [(&str, &str); 4] = [
    ("TORCH_FR_BUFFER_SIZE", "2000"),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "2000"),
    ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"),
    ("TORCH_FR_DUMP_TEMP_FILE", ""),
];

/// Switches on NCCL's flight recorder (before the process group reads its variables; the
/// rank's threads read none of them).
fn flight_recorder(log_dir: &std::path::Path, rank: usize) {
    let prefix = log_dir.join("nccl-flight-recorder-");
    for (k, v) in FLIGHT_RECORDER {
        let v = if v.is_empty() {
            prefix.to_string_lossy().into_owned()
        } else {
            v.to_string()
        };
        if std::env::var_os(k).is_none() {
            std::env::set_var(k, &v);
        }
    }
    if std::env::var_os("TORCH_NCCL_DEBUG_INFO_TEMP_FILE").is_none() {
        std::env::set_var("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", &prefix);
    }
    tracing::debug!(
        "NCCL flight recorder on: dumps on a timeout into {}{rank}",
        prefix.display()
    );
}

/// Starts the rank: identity, rank 0's locks, device, driver log, store, process group.
pub fn start_rank(
    flags: &RankFlags,
    default_log_dir: PathBuf,
    command: &str,
    lock_dirs: &[(&'static str, PathBuf)],
) -> Result<Rank, (Option<driver_log::Console>, Fatal)> {
    let t0 = Instant::now();
    let mut id = bootstrap::identify().map_err(|e| (None, Fatal::invalid(e.into())))?;
    // Before the driver log: a refused rank 0 overwrites nothing of the other job's.
    let locks = lock_as_rank0(id.place.rank, lock_dirs, command)?;
    let (device, backend) = resolve(
        flags,
        id.place.local_rank,
        id.place.local_size,
        &id.place.host,
    )
    .map_err(|f| (None, f))?;
    let log_dir = flags.log_dir.clone().unwrap_or(default_log_dir);
    if backend == pg::BackendKind::Nccl {
        flight_recorder(&log_dir, id.place.rank);
    }
    let header = driver_log::Header {
        host: &id.place.host,
        rank: id.place.rank,
        local_rank: id.place.local_rank,
        world_size: id.place.world_size,
        device: &pg::device_name(device),
        backend: backend.name(),
        command,
        started_by: &format!("{:?}", id.place.started_by),
    };
    let (_path, console) = driver_log::open(&log_dir, &header, &flags.console)
        .with_context(|| {
            format!(
                "cannot write the driver log in {} (check --log-dir)",
                log_dir.display()
            )
        })
        .map_err(|e| (None, Fatal::rank(e)))?;
    if let Err(e) = super::signals::install() {
        let e = anyhow::Error::from(e).context("cannot install the rank's signal handlers");
        return Err((Some(console), Fatal::rank(e)));
    }
    crate::heartbeat::start(log_dir.clone(), id.place.rank, &id.place.host);
    crate::memory::start(log_dir.clone(), id.place.rank, &id.place.host);
    set_threads(flags, id.place.local_rank, id.place.local_size);
    let timeout = Duration::from_secs(flags.timeout);
    let nccl = backend == pg::BackendKind::Nccl;
    if let Err(e) = id.check_network(flags.ifname.as_deref(), !nccl, nccl) {
        return Err((Some(console), Fatal::bootstrap(e, "joining the job")));
    }
    let joined = match id.join(timeout) {
        Ok(j) => j,
        Err(e) => return Err((Some(console), Fatal::bootstrap(e, "joining the job"))),
    };
    let info = &joined.info;
    tracing::info!("{}", info.bootstrap);
    tracing::info!(
        rank = info.place.rank,
        world_size = info.place.world_size,
        local_rank = info.place.local_rank,
        node_rank = info.place.node_rank,
        master = %format!("{}:{}", info.master_addr, info.master_port),
        local_addr = %info.local_addr,
        "joined the store"
    );
    let pg = match pg::ProcessGroup::new(
        &joined.store,
        "tchrun/world",
        backend,
        info.place.rank,
        info.place.world_size,
        timeout,
        &info.gloo,
        device,
    ) {
        Ok(pg) => pg,
        Err(e) => {
            return Err((
                Some(console),
                Fatal::rank(anyhow::Error::new(e).context("creating the process group")),
            ))
        }
    };
    tracing::info!(
        backend = backend.name(),
        secs = t0.elapsed().as_secs_f64(),
        "process group ready"
    );
    Ok(Rank {
        joined,
        pg,
        device,
        console,
        _locks: locks,
    })
}

/// The rank's command line, for its driver log header and lock.
pub fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}
