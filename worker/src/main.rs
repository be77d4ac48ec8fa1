//! `tchrun-worker`: one rank of a tchrun job. Started by mpirun, srun, `tchrun` or by hand;
//! joins the job (bootstrap), opens its driver log, builds the c10d process group and runs
//! the subcommand. Architecture Invariant: the worker never spawns ranks.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tchrun::driver_log::{FailureKind, RankExit};
use tchrun::exit::ErrorKind;
use tchrun::flags::{Backend, Device as DeviceFlag, RankFlags, DEFAULT_LOG_DIR};
use tchrun_worker::{bench_loader, bootstrap, driver_log, gradcheck, pg, score, selftest, train};

#[derive(Parser, Debug)]
#[command(
    name = "tchrun-worker",
    version,
    about = "One rank of a tchrun job (started by mpirun, srun or tchrun)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Check collectives across all ranks with exact values, then measure all-reduce bandwidth.
    Selftest(SelftestArgs),
    /// Set torchrun's environment contract (RANK, WORLD_SIZE, MASTER_ADDR, ...) and exec PROGRAM.
    Exec(ExecArgs),
    /// Train an image classifier data-parallel (one rank; start N with mpirun/srun/tchrun).
    Train(TrainArgs),
    /// Score images with a trained model directory into a CSV (sharded over the ranks).
    Score(ScoreArgs),
    /// Evaluate a trained model on labeled images: scores, metrics, confusion matrix.
    Evaluate(EvaluateArgs),
    /// Check that the cross-rank averaged gradient equals the combined-batch gradient.
    #[command(hide = true)]
    Gradcheck(GradcheckArgs),
    /// Benchmark the input pipeline alone (decode + augment), images/s.
    #[command(hide = true)]
    BenchLoader(bench_loader::Args),
    /// Benchmark training steps on synthetic tensors, ms/step.
    #[command(hide = true)]
    BenchStep(tchrun_worker::bench_step::Args),
    /// A model directory's logits for fixed inputs, for the parity tests.
    #[command(hide = true)]
    Logits(tchrun_worker::logits::Args),
}

#[derive(Args, Debug)]
struct TrainArgs {
    #[command(flatten)]
    job: tchrun::flags::TrainJob,
    #[command(flatten)]
    rank: RankFlags,
    /// The launcher's hidden flags (dataset index copies, headers checked on decode).
    #[command(flatten)]
    handoff: tchrun::flags::TrainHandoff,
}

#[derive(Args, Debug)]
struct ScoreArgs {
    #[command(flatten)]
    job: tchrun::flags::ScoreJob,
    #[command(flatten)]
    rank: RankFlags,
}

#[derive(Args, Debug)]
struct EvaluateArgs {
    #[command(flatten)]
    job: tchrun::flags::EvaluateJob,
    #[command(flatten)]
    rank: RankFlags,
}

#[derive(Args, Debug)]
struct GradcheckArgs {
    #[command(flatten)]
    rank: RankFlags,
}

#[derive(Args, Debug)]
struct SelftestArgs {
    #[command(flatten)]
    rank: RankFlags,
    /// Message sizes in bytes for the bandwidth table.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096,65536,1048576,16777216"
    )]
    sizes: Vec<usize>,
    /// Timed all-reduce iterations per size.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    iters: u64,
    /// Write the bandwidth table as JSON to this file (rank 0).
    #[arg(long)]
    json: Option<PathBuf>,
}

#[derive(Args, Debug)]
struct ExecArgs {
    /// The device the program's ranks use (one GPU per rank): with cuda or auto, more ranks on
    /// this node than its GPUs is refused before the program starts; cpu checks nothing.
    #[arg(long, env = "TCHRUN_DEVICE", value_enum)]
    device: Option<DeviceFlag>,
    /// Directory of the per-rank driver logs.
    #[arg(long, env = "TCHRUN_LOG_DIR", default_value = DEFAULT_LOG_DIR)]
    log_dir: PathBuf,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

/// A rank's failure with the kind that decides its exit code.
struct Fatal {
    kind: ErrorKind,
    err: anyhow::Error,
}

impl Fatal {
    fn invalid(err: anyhow::Error) -> Fatal {
        Fatal {
            kind: ErrorKind::InvalidInput,
            err,
        }
    }
    fn rank(err: anyhow::Error) -> Fatal {
        Fatal {
            kind: ErrorKind::RankFailed,
            err,
        }
    }
}

fn main() -> ExitCode {
    let cli: Cli = tchrun::flags::parse_or_exit();
    // A panic (in tch usually a libtorch exception) ends the rank like any fatal error: its
    // record and the panic are already in the driver log (the hook); here it gets its exit code.
    let run = std::panic::AssertUnwindSafe(move || match cli.cmd {
        Cmd::Selftest(a) => run_selftest(a),
        Cmd::Exec(a) => run_exec(a),
        Cmd::Train(a) => run_train(a),
        Cmd::Score(a) => run_score(a),
        Cmd::Evaluate(a) => run_evaluate(a),
        Cmd::Gradcheck(a) => run_gradcheck(a),
        Cmd::BenchLoader(a) => bench_loader::run(a).map_err(|e| (None, Fatal::invalid(e))),
        Cmd::BenchStep(a) => {
            tchrun_worker::bench_step::run(a).map_err(|e| (None, Fatal::invalid(e)))
        }
        Cmd::Logits(a) => tchrun_worker::logits::run(a).map_err(|e| (None, Fatal::invalid(e))),
    });
    let (result, panicked) = match std::panic::catch_unwind(run) {
        Ok(r) => (r, false),
        Err(payload) => {
            let text = payload
                .downcast_ref::<&str>()
                .copied()
                .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(a panic without a message)");
            let msg = tchrun::driver_log::panic_message(text);
            (
                Err((None, Fatal::rank(anyhow::anyhow!("panicked: {msg}")))),
                true,
            )
        }
    };
    match result {
        Ok(()) => {
            tracing::info!("{}", RankExit { code: 0 }.write());
            ExitCode::SUCCESS
        }
        Err((console, f)) => {
            let msg = format!("{:#}", f.err);
            let code = f.kind.exit_code();
            tracing::error!("{msg}");
            let kind = if panicked {
                driver_log::torch_failure_kind(&msg, FailureKind::Panic)
            } else {
                failure_kind(&f)
            };
            driver_log::record_failure(kind, &msg, None, Some(code));
            tracing::info!("{}", RankExit { code }.write());
            let mut line = format!("tchrun-worker: error: {msg}");
            if let Some(note) = driver_log::log_write_failure() {
                line.push_str(&format!(" (note: {note})"));
            }
            match console {
                Some(c) => c.err(&line),
                // Never a panic on a failed write (see `driver_log::LogWriter`).
                None => {
                    use std::io::Write as _;
                    let _ = writeln!(std::io::stderr(), "{line}");
                }
            }
            ExitCode::from(code as u8)
        }
    }
}

/// The failure record's kind of a rank's fatal error, from its type (the launcher classifies
/// by it). libtorch's own messages say more (memory, CUDA) than their types.
fn failure_kind(f: &Fatal) -> FailureKind {
    use train::TrainError as T;
    let by_exit = FailureKind::from_error_kind(f.kind);
    for cause in f.err.chain() {
        if let Some(e) = cause.downcast_ref::<T>() {
            return match e {
                T::Invalid(_) | T::Preflight(_) => FailureKind::InvalidInput,
                T::Data(_) => FailureKind::Data,
                T::Diverged { .. } => FailureKind::Diverged,
                T::Comm(c) => {
                    driver_log::torch_failure_kind(&c.to_string(), FailureKind::Communication)
                }
                T::Replicas(_) => FailureKind::Internal,
                T::Checkpoint(_) | T::Output(_) => FailureKind::Io,
                T::Stopped(_) => FailureKind::Interrupted,
                T::Torch(t) => driver_log::torch_failure_kind(&t.to_string(), by_exit),
            };
        }
        if let Some(c) = cause.downcast_ref::<pg::C10dError>() {
            return driver_log::torch_failure_kind(&c.to_string(), FailureKind::Communication);
        }
        if let Some(t) = cause.downcast_ref::<tch::TchError>() {
            return driver_log::torch_failure_kind(&t.to_string(), by_exit);
        }
        if cause.downcast_ref::<tchrun::data::DatasetError>().is_some() {
            return FailureKind::Data;
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return FailureKind::Io;
        }
    }
    by_exit
}

/// Leaves the job. After success: the process group is destroyed and MPI finalized. After a
/// failure neither: MPI_Finalize and c10d's destructors wait for peers that may be dead or
/// unreachable (a network cut hangs them); the rank must exit now, and mpirun or tchrun
/// stops the rest.
fn leave(pg: pg::ProcessGroup, joined: bootstrap::Joined, ok: bool) {
    if ok {
        drop(pg);
        drop(joined);
    } else {
        std::mem::forget(pg);
        std::mem::forget(joined);
    }
}

type RankResult = Result<(), (Option<driver_log::Console>, Fatal)>;

/// The CUDA devices this rank can use: `TCHRUN_TEST_CUDA_DEVICES` when set (tests; nothing
/// touches CUDA to count them), else torch's device count (`CUDA_VISIBLE_DEVICES` respected).
fn cuda_devices() -> Result<usize, Fatal> {
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

/// Intra-op threads: the host's cores shared among the ranks on it (no oversubscription).
fn set_threads(local_size: usize) {
    let n = std::env::var(tchrun::env::TCHRUN_THREADS)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| tchrun::env::threads_per_rank(local_size));
    tch::set_num_threads(n as i32);
}

/// Identify the rank, open its driver log, join the store and build the process group.
struct Rank {
    joined: bootstrap::Joined,
    pg: pg::ProcessGroup,
    device: tch::Device,
    console: driver_log::Console,
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

fn start_rank(
    flags: &RankFlags,
    default_log_dir: PathBuf,
    command: &str,
    lock_dirs: &[(&'static str, PathBuf)],
) -> Result<Rank, (Option<driver_log::Console>, Fatal)> {
    let t0 = Instant::now();
    let id = bootstrap::identify().map_err(|e| (None, Fatal::invalid(e.into())))?;
    // Before the driver log: a refused rank 0 overwrites nothing of the other job's.
    let locks = lock_as_rank0(id.rank, lock_dirs, command)?;
    let (device, backend) =
        resolve(flags, id.local_rank, id.local_size, &id.host).map_err(|f| (None, f))?;
    let log_dir = flags.log_dir.clone().unwrap_or(default_log_dir);
    let header = driver_log::Header {
        host: &id.host,
        rank: id.rank,
        local_rank: id.local_rank,
        world_size: id.world_size,
        device: &pg::device_name(device),
        backend: backend.name(),
        command,
        started_by: &format!("{:?}", id.started_by),
    };
    let (_path, console) = driver_log::open(&log_dir, &header)
        .with_context(|| {
            format!(
                "cannot write the driver log in {} (check --log-dir)",
                log_dir.display()
            )
        })
        .map_err(|e| (None, Fatal::rank(e)))?;
    set_threads(id.local_size);
    let timeout = Duration::from_secs(flags.timeout);
    let joined = match id.join(timeout) {
        Ok(j) => j,
        Err(e) => {
            return Err((
                Some(console),
                Fatal::rank(anyhow::Error::new(e).context("joining the job")),
            ))
        }
    };
    let info = &joined.info;
    tracing::info!(
        rank = info.rank,
        world_size = info.world_size,
        local_rank = info.local_rank,
        node_rank = info.node_rank,
        master = %format!("{}:{}", info.master_addr, info.master_port),
        local_addr = %info.local_addr,
        "joined the store"
    );
    let pg = match pg::ProcessGroup::new(
        &joined.store,
        "tchrun/world",
        backend,
        info.rank,
        info.world_size,
        timeout,
        &info.local_addr,
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

fn command_line() -> String {
    std::env::args().collect::<Vec<_>>().join(" ")
}

fn run_selftest(a: SelftestArgs) -> RankResult {
    let rank = start_rank(
        &a.rank,
        PathBuf::from(DEFAULT_LOG_DIR),
        &command_line(),
        &[],
    )?;
    let Rank {
        joined,
        pg,
        device,
        console,
        ..
    } = rank;
    let fail = |e: anyhow::Error| Fatal::rank(e);
    let body = || -> Result<(), Fatal> {
        let failed = selftest::check_collectives(&pg).map_err(|e| fail(e.into()))?;
        for f in &failed {
            tracing::error!("selftest check failed: {f}");
        }
        let total = selftest::total_failures(&pg, failed.len()).map_err(|e| fail(e.into()))?;
        if total > 0 {
            return Err(fail(anyhow::anyhow!(
                "{total} collective check(s) failed across the ranks (this rank: {}); see the driver logs",
                if failed.is_empty() { "none".to_string() } else { failed.join("; ") }
            )));
        }
        tracing::info!(
            "collectives correct: all_reduce sum/avg/max, broadcast, all_gather, barrier"
        );
        let rows =
            selftest::bandwidth(&pg, &a.sizes, a.iters as usize).map_err(|e| fail(e.into()))?;
        let table = selftest::format_table(&rows, pg.size(), pg.backend().name());
        tracing::info!("\n{table}");
        if pg.rank() == 0 {
            console.out(&format!(
                "selftest: {} ranks on {} ({}): all_reduce, broadcast, all_gather, barrier correct",
                pg.size(),
                pg::device_name(device),
                pg.backend().name()
            ));
            console.out(table.trim_end());
            if let Some(path) = &a.json {
                let text = serde_json::to_string_pretty(&rows).unwrap_or_default();
                std::fs::write(path, text)
                    .with_context(|| format!("writing {}", path.display()))
                    .map_err(Fatal::invalid)?;
            }
        }
        pg.barrier().map_err(|e| fail(e.into()))?;
        Ok(())
    };
    let r = body();
    leave(pg, joined, r.is_ok());
    r.map_err(|f| (Some(console), f))
}

fn run_exec(a: ExecArgs) -> RankResult {
    use std::os::unix::process::CommandExt;
    let id = bootstrap::identify().map_err(|e| (None, Fatal::invalid(e.into())))?;
    if let Some(device @ (DeviceFlag::Auto | DeviceFlag::Cuda)) = a.device {
        // The launcher's GPU pre-flight, on this rank's own node (before the driver log, like
        // `resolve`): the program has not started yet.
        let gpus = cuda_devices().map_err(|f| (None, f))?;
        if device == DeviceFlag::Cuda && gpus == 0 {
            return Err((
                None,
                Fatal::invalid(anyhow::anyhow!(
                    "--device cuda: no CUDA device is visible on {}; use --device cpu or check CUDA_VISIBLE_DEVICES",
                    id.host
                )),
            ));
        }
        if gpus > 0 && (id.local_size > gpus || id.local_rank >= gpus) {
            return Err((
                None,
                Fatal::invalid(anyhow::anyhow!(
                    "{}",
                    tchrun::env::too_many_ranks_for_gpus(
                        id.local_size.max(id.local_rank + 1),
                        gpus,
                        &id.host
                    )
                )),
            ));
        }
    }
    let header = driver_log::Header {
        host: &id.host,
        rank: id.rank,
        local_rank: id.local_rank,
        world_size: id.world_size,
        device: "(program's)",
        backend: "(program's)",
        command: &command_line(),
        started_by: &format!("{:?}", id.started_by),
    };
    let (_path, console) = driver_log::open(&a.log_dir, &header)
        .with_context(|| {
            format!(
                "cannot write the driver log in {} (check --log-dir)",
                a.log_dir.display()
            )
        })
        .map_err(|e| (None, Fatal::rank(e)))?;
    let info = match id.master_for_program() {
        Ok(i) => i,
        Err(e) => return Err((Some(console), Fatal::rank(e.into()))),
    };
    use tchrun::env as c;
    tracing::info!(program = %a.program.join(" "), master = %format!("{}:{}", info.master_addr, info.master_port), "exec");
    let mut cmd = std::process::Command::new(&a.program[0]);
    for m in c::MPI_MARKERS {
        cmd.env_remove(m);
    }
    let err = cmd
        .args(&a.program[1..])
        .env(c::RANK, info.rank.to_string())
        .env(c::WORLD_SIZE, info.world_size.to_string())
        .env(c::LOCAL_RANK, info.local_rank.to_string())
        .env(c::LOCAL_WORLD_SIZE, info.local_size.to_string())
        .env(c::NODE_RANK, info.node_rank.to_string())
        .env(c::MASTER_ADDR, &info.master_addr)
        .env(c::MASTER_PORT, info.master_port.to_string())
        .exec();
    Err((
        Some(console),
        Fatal::invalid(anyhow::anyhow!("cannot run {:?}: {err}", a.program[0])),
    ))
}

fn run_train(a: TrainArgs) -> RankResult {
    let default_logs = a.job.output.join(tchrun::files::DEFAULT_LOG_SUBDIR);
    // Outputs that would overwrite inputs (as `tchrun train` refuses them).
    {
        let log_dir = a
            .rank
            .log_dir
            .clone()
            .unwrap_or_else(|| default_logs.clone());
        let (outputs, inputs) = tchrun::overlap::train_job(&a.job, &log_dir);
        tchrun::overlap::check_disjoint(&outputs, &inputs)
            .map_err(|e| (None, Fatal::invalid(e.into())))?;
    }
    // Input errors need no log directory: report them before anything is written to --output.
    let h = &a.handoff;
    let indexes = [h.train_index.as_deref(), h.valid_index.as_deref()];
    let (inputs, verification) =
        train::check_inputs(&a.job, indexes, h.verify_on_decode).map_err(|e| {
            (
                None,
                Fatal {
                    kind: e.kind(),
                    err: e.into(),
                },
            )
        })?;
    let log_dir = a
        .rank
        .log_dir
        .clone()
        .unwrap_or_else(|| default_logs.clone());
    let lock_dirs = tchrun::lock::job_dirs(Some(&a.job.output), &log_dir);
    let rank = start_rank(&a.rank, default_logs, &command_line(), &lock_dirs)?;
    let Rank {
        joined,
        pg,
        device,
        console,
        ..
    } = rank;
    for line in &verification {
        tracing::info!("{line}");
    }
    let is_rank0 = pg.rank() == 0;
    // The job against the world size (as the launcher's pre-flight; a rank started by hand,
    // srun or sbatch has had no other check).
    match tchrun::preflight::check_job(&inputs, &a.job, pg.size()) {
        Ok(warnings) => {
            // `tchrun train` (which sets TCHRUN_ATTEMPT) said them already on the console.
            let said = std::env::var_os(tchrun::env::TCHRUN_ATTEMPT).is_some();
            for w in warnings {
                tracing::warn!("{w}");
                if is_rank0 && !said {
                    console.err(&w);
                }
            }
        }
        Err(e) => {
            leave(pg, joined, false);
            return Err((
                Some(console),
                Fatal {
                    kind: ErrorKind::InvalidInput,
                    err: e.into(),
                },
            ));
        }
    }
    // User-facing lines: in every driver log, and on rank 0's console.
    let say = |line: &str| {
        tracing::info!("{line}");
        if is_rank0 {
            console.out(line);
        }
    };
    let ctx = train::RankCtx {
        pg: &pg,
        store: &joined.store,
        device,
        local_size: joined.info.local_size,
        say: &say,
    };
    let r = train::train(&a.job, inputs, &ctx);
    leave(pg, joined, r.is_ok());
    r.map_err(|e| {
        (
            Some(console),
            Fatal {
                kind: e.kind(),
                err: e.into(),
            },
        )
    })
}

/// Runs `body` (scoring or evaluation) as one rank of the job: the store carries each
/// rank's rows to rank 0.
fn run_inference(
    flags: &RankFlags,
    default_logs: PathBuf,
    output_dir: Option<&std::path::Path>,
    batch_size: u32,
    body: impl FnOnce(&score::Compute, &score::Ranks, &dyn Fn(&str)) -> Result<(), score::ScoreError>,
) -> RankResult {
    let log_dir = flags
        .log_dir
        .clone()
        .unwrap_or_else(|| default_logs.clone());
    let lock_dirs = tchrun::lock::job_dirs(output_dir, &log_dir);
    let rank = start_rank(flags, default_logs, &command_line(), &lock_dirs)?;
    let Rank {
        joined,
        pg,
        device,
        console,
        ..
    } = rank;
    let store = &joined.store;
    let set = |k: &str, v: &[u8]| store.set(k, v).map_err(|e| e.to_string());
    let get = |k: &str| store.get(k).map_err(|e| e.to_string());
    let ranks = score::Ranks {
        rank: pg.rank(),
        world: pg.size(),
        set: &set,
        get: &get,
    };
    let compute = score::Compute {
        batch_size: batch_size as usize,
        device,
        threads: tchrun::env::threads_per_rank(joined.info.local_size),
    };
    let is_rank0 = pg.rank() == 0;
    let say = |line: &str| {
        tracing::info!("{line}");
        if is_rank0 {
            console.out(line);
        }
    };
    let r = body(&compute, &ranks, &say);
    leave(pg, joined, r.is_ok());
    r.map_err(|e| {
        let kind = if e.is_input_error() {
            ErrorKind::InvalidInput
        } else {
            ErrorKind::RankFailed
        };
        (
            Some(console),
            Fatal {
                kind,
                err: e.into(),
            },
        )
    })
}

/// `score`/`evaluate` started by hand: outputs that would overwrite the model or the images
/// are refused (as `tchrun` refuses them) before anything is written.
fn check_inference_paths(
    output: (&str, &std::path::Path),
    log_dir: &std::path::Path,
    model: &std::path::Path,
    images: &std::path::Path,
) -> RankResult {
    use tchrun::overlap::Named;
    tchrun::overlap::check_disjoint(
        &[
            Named::new("--output", output.0, output.1),
            Named::new("--log-dir", "the job's logs", log_dir),
        ],
        &[
            Named::new("--model", "the trained model directory", model),
            Named::new("--images", "the images", images),
        ],
    )
    .map_err(|e| (None, Fatal::invalid(e.into())))
}

fn run_score(ScoreArgs { job: a, rank }: ScoreArgs) -> RankResult {
    check_inference_paths(
        ("the scores CSV", &a.output),
        &rank.log_dir.clone().unwrap_or_else(|| a.default_log_dir()),
        &a.model,
        &a.images,
    )?;
    run_inference(
        &rank,
        a.default_log_dir(),
        None,
        a.batch_size,
        |compute, ranks, say| {
            let n = score::score(&a.model, &a.images, &a.output, compute, ranks)?;
            if ranks.rank == 0 {
                say(&format!(
                    "scored {n} image(s) on {} rank(s) into {}",
                    ranks.world,
                    a.output.display()
                ));
            }
            Ok(())
        },
    )
}

fn run_evaluate(EvaluateArgs { job: a, rank }: EvaluateArgs) -> RankResult {
    check_inference_paths(
        ("the evaluation directory", &a.output),
        &rank.log_dir.clone().unwrap_or_else(|| a.default_log_dir()),
        &a.model,
        &a.images,
    )?;
    run_inference(
        &rank,
        a.default_log_dir(),
        Some(&a.output),
        a.batch_size,
        |compute, ranks, say| {
            if let Some(e) = score::evaluate(&a.model, &a.images, &a.output, compute, ranks)? {
                let m = &e.metrics;
                say(&format!(
                "evaluated {} image(s) on {} rank(s): top-1 {:.2}%, top-5 {:.2}%, log loss {:.4}, \
                 macro F1 {:.4}; scores.csv, metrics.json and confusion_matrix.csv/.png in {}",
                e.images,
                ranks.world,
                100.0 * m.top1,
                100.0 * m.top5,
                m.log_loss,
                m.macro_avg.f1,
                a.output.display()
            ));
            }
            Ok(())
        },
    )
}

fn run_gradcheck(a: GradcheckArgs) -> RankResult {
    let rank = start_rank(
        &a.rank,
        PathBuf::from(DEFAULT_LOG_DIR),
        &command_line(),
        &[],
    )?;
    let Rank {
        joined,
        pg,
        console,
        ..
    } = rank;
    let r = gradcheck::run(&pg);
    let is_rank0 = pg.rank() == 0;
    leave(pg, joined, matches!(r, Ok(d) if d.max_diff <= 1e-6));
    match r {
        Ok(d) if d.max_diff <= 1e-6 => {
            if is_rank0 {
                console.out(&format!(
                    "gradcheck: max |distributed - combined batch| = {:.3e} (tolerance 1e-6); \
                     {} of {} bucket(s) all-reduced during backward",
                    d.max_diff, d.early, d.buckets
                ));
            }
            Ok(())
        }
        Ok(d) => Err((
            Some(console),
            Fatal::rank(anyhow::anyhow!(
                "gradcheck: difference {:e} exceeds 1e-6",
                d.max_diff
            )),
        )),
        Err(e) => Err((Some(console), Fatal::rank(e.into()))),
    }
}
