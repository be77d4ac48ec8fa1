//! `tchrun`: validates a job before any rank starts, launches its ranks through mpirun, srun or
//! local processes, tees launch output into `70_mpi_log`, and reports the first failing rank.
//! Architecture Invariant: the launcher links neither libtorch nor MPI.

/// `println!` that never panics: a closed stdout (`tchrun train ... | head`) must not take the
/// launcher down while it supervises ranks; the lines still reach `70_mpi_log`.
macro_rules! outln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// `eprintln!` that never panics (see `outln!`).
macro_rules! errln {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

mod commands;
mod error;
mod plan;
mod report;
mod run;
mod train;

use commands::{
    data as data_cmd, doctor, export, inference, model_init, sbatch, stacks, status, sweep,
};
use plan::{gpus, launch, preflight};

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;
use std::process::ExitCode;
use tchrun::flags::RankFlags;
use tchrun::inference_flags::Inference;

#[derive(Parser, Debug)]
#[command(
    name = "tchrun",
    version,
    about = "Distributed training launcher and trainer (mpirun, Slurm, local)"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Check collectives on every rank and measure all-reduce bandwidth (first thing to run on a cluster).
    Selftest(SelftestArgs),
    /// Check the cluster before a job: versions, paths, shared file system, disk, memory, clock
    /// and GPUs per node, then the bandwidth of every pair of ranks; writes doctor.json and
    /// hostfile.healthy.
    Doctor(doctor::DoctorArgs),
    /// Run any program as the ranks with torchrun's environment contract.
    Exec(ExecArgs),
    /// Train an image classifier on nodes × procs-per-node ranks ("Train PyTorch Model").
    Train(TrainArgs),
    /// Write (and with --submit, submit) a Slurm batch script that trains with srun.
    Sbatch(sbatch::SbatchArgs),
    /// Train one run per point of a grid of train flags (locally in turn, or as one Slurm job
    /// array with --sbatch); `tchrun sweep results DIR` tabulates them. `tchrun sweep --help`.
    #[command(disable_help_flag = true)]
    Sweep {
        /// --param NAME=V1,V2 ... --output DIR [--sbatch [--submit]] [LAUNCH FLAGS] -- [TRAIN
        /// FLAGS], or `results DIR [--sort top1]`
        #[arg(trailing_var_arg = true, allow_hyphen_values = true, num_args = 0..)]
        args: Vec<String>,
    },
    /// Model directories.
    #[command(subcommand)]
    Model(ModelCmd),
    /// Score images with a trained model into a CSV, on one or many ranks ("Score Image Model").
    Score(ScoreArgs),
    /// Evaluate a trained model on labeled images: scores, metrics, confusion matrix ("Evaluate Model").
    Evaluate(EvaluateArgs),
    /// Export a trained model as ONNX and/or TorchScript into a Triton model repository, with
    /// its preprocessing, checked against tchrun's own forward.
    Export(tchrun::export::ExportJob),
    /// Datasets: split an image folder into train/valid, pack one into tar shards.
    #[command(subcommand)]
    Data(data_cmd::DataCmd),
    /// Print every rank's stacks of a running job (what each rank's threads are doing), without stopping it.
    Stacks {
        /// The job's log directory (a training --output: its logs/), seen from this machine
        /// [default: the newest job in ./tchrun-logs]
        dir: Option<PathBuf>,
    },
    /// Where a training job is (state, progress, ETA, each host's ranks, stragglers), from its status.json.
    Status(status::StatusArgs),
    /// Print the failure summary of a job's log directory, or a per-rank overview.
    Logs {
        /// The job's log directory (a training --output: its logs/; a folder of job folders: its
        /// newest job) [default: the newest job in ./tchrun-logs]
        dir: Option<PathBuf>,
    },
}

#[derive(Args, Debug)]
struct SelftestArgs {
    #[command(flatten)]
    launch: launch::LaunchArgs,
    #[command(flatten)]
    rank: RankFlags,
    /// Message sizes in bytes for the bandwidth table.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Timed all-reduce iterations per size.
    #[arg(long)]
    iters: Option<u64>,
}

#[derive(Args, Debug)]
struct TrainArgs {
    #[command(flatten)]
    job: tchrun::flags::TrainJob,
    #[command(flatten)]
    launch: launch::LaunchArgs,
    #[command(flatten)]
    rank: RankFlags,
    #[command(flatten)]
    restarts: train::restart::RestartArgs,
}

#[derive(Subcommand, Debug)]
enum ModelCmd {
    /// Write an untrained model directory (model.json).
    Init(model_init::InitArgs),
}

#[derive(Args, Debug)]
#[command(
    mut_arg("model", |a| a.help(Inference::Score.model_help())),
    mut_arg("images", |a| a.help(Inference::Score.images_help())),
    mut_arg("output", |a| a.help(Inference::Score.output_help()))
)]
struct ScoreArgs {
    #[command(flatten)]
    job: tchrun::inference_flags::InferenceJob,
    #[command(flatten)]
    launch: launch::LaunchArgs,
    #[command(flatten)]
    rank: RankFlags,
}

#[derive(Args, Debug)]
#[command(
    mut_arg("model", |a| a.help(Inference::Evaluate.model_help())),
    mut_arg("images", |a| a.help(Inference::Evaluate.images_help())),
    mut_arg("output", |a| a.help(Inference::Evaluate.output_help()))
)]
struct EvaluateArgs {
    #[command(flatten)]
    job: tchrun::inference_flags::InferenceJob,
    #[command(flatten)]
    launch: launch::LaunchArgs,
    #[command(flatten)]
    rank: RankFlags,
}

#[derive(Args, Debug)]
struct ExecArgs {
    #[command(flatten)]
    launch: launch::LaunchArgs,
    /// The device the program's ranks use, one GPU per rank (cuda:LOCAL_RANK): with cuda or
    /// auto, more ranks on a node than its GPUs is refused before any rank starts (as train
    /// does); cpu checks nothing. Without it the program's device is its own: a note only.
    #[arg(long, env = "TCHRUN_DEVICE", value_enum)]
    device: Option<tchrun::flags::Device>,
    /// Directory of the per-rank driver logs (default: a new folder per job in ./tchrun-logs).
    #[arg(long, env = "TCHRUN_LOG_DIR")]
    log_dir: Option<PathBuf>,
    /// The network interface every rank uses (e.g. eth0; the same name on every node): rank 0
    /// offers only its addresses as MASTER_ADDR, and the program gets GLOO_SOCKET_IFNAME and
    /// NCCL_SOCKET_IFNAME set to it unless already set. Default: the first address of rank 0
    /// every rank reaches within seconds.
    #[arg(long, env = "TCHRUN_IFNAME", value_name = "NAME")]
    ifname: Option<String>,
    #[command(flatten)]
    console: tchrun::flags::ProgramConsole,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    program: Vec<String>,
}

fn main() -> ExitCode {
    let (cli, given): (Cli, _) = tchrun::flags::parse_or_exit();
    let result = match cli.cmd {
        Cmd::Selftest(a) => run_selftest(&a),
        Cmd::Doctor(a) => doctor::run(&a),
        Cmd::Exec(a) => run_exec(&a),
        Cmd::Train(a) => with_recipe(&a.job, &given)
            .and_then(|job| train::run_train(&job, &given, &a.launch, &a.rank, &a.restarts)),
        Cmd::Sbatch(mut a) => with_recipe(&a.job, &given).and_then(|job| {
            a.job = job;
            sbatch::run(&a)
        }),
        Cmd::Sweep { args } => sweep::run(&args, &parse_run),
        Cmd::Model(ModelCmd::Init(a)) => model_init::run(&a).map(|_| 0),
        Cmd::Score(a) => inference::run_score(&a.job, &a.launch, &a.rank),
        Cmd::Evaluate(a) => inference::run_evaluate(&a.job, &a.launch, &a.rank),
        Cmd::Export(a) => export::run(&a),
        Cmd::Data(c) => data_cmd::run(&c),
        Cmd::Stacks { dir } => stacks::run(dir.as_deref()),
        Cmd::Status(a) => status::run(&a),
        Cmd::Logs { dir } => match report::logs::logs_command(dir.as_deref()) {
            Ok(text) => {
                {
                    use std::io::Write as _;
                    let _ = write!(std::io::stdout(), "{text}");
                }
                Ok(0)
            }
            Err(e) => Err(error::JobError::invalid(e)),
        },
    };
    match result {
        Ok(code) => ExitCode::from(code as u8),
        Err(e) => {
            {
                use std::io::Write as _;
                let _ = write!(std::io::stderr(), "{}", e.render());
            }
            ExitCode::from(e.kind().exit_code() as u8)
        }
    }
}

/// The job with its `--recipe` applied (`TrainJob::with_recipe`), the sizes scaled to the
/// input size in `--model`'s `model.json` (unknown when it cannot be read: the pre-flight then
/// refuses the model directory).
fn with_recipe(
    job: &tchrun::flags::TrainJob,
    given: &tchrun::recipe_preset::Given,
) -> Result<tchrun::flags::TrainJob, error::JobError> {
    let input_size = job.options.preset.recipe.and_then(|_| {
        let cfg = tchrun::model::load(&job.model, false).ok()?;
        Some(cfg.input_size)
    });
    job.with_recipe(given, input_size)
        .map_err(|e| error::JobError::invalid(e.to_string()))
}

/// One run of a sweep through the real `tchrun train` / `tchrun sbatch` parser (`argv` without
/// the program name), a `--recipe` applied.
fn parse_run(argv: &[String]) -> Result<sweep::Parsed, clap::Error> {
    let all = std::iter::once("tchrun".to_string())
        .chain(argv.iter().cloned())
        .map(std::ffi::OsString::from)
        .collect();
    let (cli, given): (Cli, _) = tchrun::flags::try_parse_from(all)?;
    match cli.cmd {
        Cmd::Train(_) => Ok(sweep::Parsed::Train),
        Cmd::Sbatch(mut a) => {
            a.job = with_recipe(&a.job, &given).map_err(|e| {
                clap::Error::raw(clap::error::ErrorKind::ValueValidation, e.to_string())
            })?;
            Ok(sweep::Parsed::Sbatch(Box::new(a)))
        }
        _ => Err(clap::Error::raw(
            clap::error::ErrorKind::InvalidSubcommand,
            "a sweep's runs are `train` or `sbatch` jobs",
        )),
    }
}

/// `tchrun selftest`: the ranks' collectives checked and timed.
fn run_selftest(a: &SelftestArgs) -> Result<i32, error::JobError> {
    let mut args = vec!["selftest".to_string()];
    let mut rank = a.rank.clone();
    let (log_dir, _new) = preflight::own_log_dir(
        rank.log_dir.clone(),
        PathBuf::from(tchrun::flags::DEFAULT_LOG_DIR),
        "selftest",
        a.launch.dry_run,
    )?;
    rank.log_dir = Some(log_dir.clone());
    let mut checks = tchrun::worker_flags::SelftestChecks::defaults();
    if !a.sizes.is_empty() {
        checks.sizes = a.sizes.clone();
    }
    if let Some(i) = a.iters {
        checks.iters = i;
    }
    args.extend(tchrun::worker_flags::SelftestRank { rank, checks }.to_args()?);
    let usage = gpus::GpuUse::Ranks(a.rank.device);
    run::run_job(&a.launch, log_dir, args, usage, &a.rank.console)
}

/// `tchrun exec`: the user's program as the ranks.
fn run_exec(a: &ExecArgs) -> Result<i32, error::JobError> {
    let (log_dir, _new) = preflight::own_log_dir(
        a.log_dir.clone(),
        PathBuf::from(tchrun::flags::DEFAULT_LOG_DIR),
        "exec",
        a.launch.dry_run,
    )?;
    // Each rank checks its own node too (where the launcher cannot see the GPUs).
    let rank = tchrun::worker_flags::ExecRank {
        device: a.device,
        log_dir: log_dir.clone(),
        ifname: a.ifname.clone(),
        console: a.console.clone(),
        program: a.program.clone(),
    };
    let mut args = vec!["exec".to_string()];
    args.extend(rank.to_args()?);
    let usage = a.device.map_or(gpus::GpuUse::Program, gpus::GpuUse::Ranks);
    run::run_job(&a.launch, log_dir, args, usage, &a.console.console)
}
