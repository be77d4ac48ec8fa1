//! `tchrun sweep`'s own flags (`SweepArgs`), parsed by the command (`mod.rs`) and read by the
//! job array's writer (`array.rs`).
use clap::Parser;
use std::path::PathBuf;

/// `tchrun sweep`'s own flags (the launch flags before `--` and the train flags after it are
/// every run's, checked by `tchrun train`'s or `tchrun sbatch`'s parser).
#[derive(Parser, Debug)]
#[command(
    name = "tchrun sweep",
    about = "Train one run per point of a grid of train flags, each into DIR/<name>/ (locally in turn, or as one Slurm job array with --sbatch); `tchrun sweep results DIR` tabulates them",
    override_usage = "tchrun sweep --param NAME=V1,V2 [--param ...] [--param-file F] --output DIR [--sbatch [--submit] [--max-parallel N]] [--extend] [LAUNCH FLAGS] -- [TRAIN FLAGS]\n       tchrun sweep results DIR [--sort top1|top5|loss|images-per-sec|name]",
    after_help = "LAUNCH FLAGS are `tchrun train`'s (--procs-per-node, --launcher, ...) or, with --sbatch, `tchrun sbatch`'s (--partition, --time, --cpus-per-task, ...); TRAIN FLAGS (after --) are every run's. Re-running the same command continues the sweep. Docs: docs/sweeps.md"
)]
pub struct SweepArgs {
    /// A train flag and its values (repeatable; the grid is every combination), e.g.
    /// --param lr=0.1,0.05 --param batch-size=16,32; vary the architecture with
    /// --param arch=resnet18,efficientnet_b0 (each from scratch at the input size of the runs'
    /// --model) or --param model=DIR1,DIR2 (directories of `tchrun model init`).
    #[arg(long = "param", value_name = "NAME=V1,V2")]
    pub params: Vec<String>,
    /// A file with one run's flags a line (e.g. `--lr 0.1 --batch-size 32`), for searches that
    /// are not a grid; combined with every --param point when both are given.
    #[arg(long, value_name = "FILE")]
    pub param_file: Option<PathBuf>,
    /// The sweep's directory: DIR/sweep.json, DIR/<run>/ (each run's --output), DIR/results.csv.
    #[arg(long, value_name = "DIR")]
    pub output: PathBuf,
    /// Write the runs as one Slurm job array, DIR/sweep.sbatch (`tchrun sbatch`'s script).
    #[arg(long)]
    pub sbatch: bool,
    /// With --sbatch: submit the array.
    #[arg(long, requires = "sbatch")]
    pub submit: bool,
    /// With --sbatch: at most N runs at once (`#SBATCH --array=...%N`).
    #[arg(long, requires = "sbatch", value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_parallel: Option<u32>,
    /// Add the points of a changed grid to the sweep in DIR (its runs are kept).
    #[arg(long)]
    pub extend: bool,
    /// Every run's train flags (after --).
    #[arg(last = true, value_name = "TRAIN FLAGS")]
    pub run_flags: Vec<String>,
    /// The launch flags (before --), not sweep's own: filled by `split`.
    #[arg(skip)]
    pub launch: Vec<String>,
}
