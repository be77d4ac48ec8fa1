//! The flags of `tchrun-worker selftest` and `tchrun-worker exec`: the worker parses them, the
//! launcher builds them and derives the ranks' argv from them (`crate::argv`), so a flag's
//! spelling is its `#[arg]` alone. (`doctor`'s are `crate::doctor::DoctorRank`, `train`'s,
//! `score`'s and `evaluate`'s the groups of `crate::flags`, `export`'s
//! `crate::export::TraceArgs`.)
use crate::argv::{argv, argv_changed, ArgvError};
use crate::flags::{Device, ProgramConsole, RankFlags, DEFAULT_LOG_DIR};
use clap::Args;
use serde::Serialize;
use std::path::PathBuf;

/// `selftest`'s own checks: the bandwidth table's sizes and iterations, its JSON file.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct SelftestChecks {
    /// Message sizes in bytes for the bandwidth table.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "4096,65536,1048576,16777216"
    )]
    pub sizes: Vec<usize>,
    /// Timed all-reduce iterations per size.
    #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u64).range(1..))]
    pub iters: u64,
    /// Write the bandwidth table as JSON to this file (rank 0).
    #[arg(long)]
    pub json: Option<PathBuf>,
}

impl SelftestChecks {
    /// The checks at their defaults (`tchrun selftest` without `--sizes` or `--iters`).
    pub fn defaults() -> SelftestChecks {
        #[derive(clap::Parser)]
        struct Defaults {
            #[command(flatten)]
            checks: SelftestChecks,
        }
        <Defaults as clap::Parser>::parse_from(["selftest"]).checks
    }
}

/// `tchrun-worker selftest`'s flags.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct SelftestRank {
    #[command(flatten)]
    #[serde(flatten)]
    pub rank: RankFlags,
    #[command(flatten)]
    #[serde(flatten)]
    pub checks: SelftestChecks,
}

impl SelftestRank {
    /// The flags as command-line arguments for a rank (after `selftest`): every rank flag, the
    /// checks that differ from their defaults.
    pub fn to_args(&self) -> Result<Vec<String>, ArgvError> {
        let mut v = argv(&self.rank)?;
        v.extend(argv_changed(&self.checks)?);
        Ok(v)
    }
}

/// `tchrun-worker exec`'s flags: the rank's own checks and logs, then the program.
#[derive(Args, Debug, Clone, PartialEq, Serialize)]
pub struct ExecRank {
    /// The device the program's ranks use (one GPU per rank): with cuda or auto, more ranks on
    /// this node than its GPUs is refused before the program starts; cpu checks nothing.
    #[arg(long, env = "TCHRUN_DEVICE", value_enum)]
    pub device: Option<Device>,
    /// Directory of the per-rank driver logs.
    #[arg(long, env = "TCHRUN_LOG_DIR", default_value = DEFAULT_LOG_DIR)]
    pub log_dir: PathBuf,
    /// The network interface every rank uses (see `tchrun train --help`); the program gets
    /// GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME set to it unless they are set.
    #[arg(long, env = "TCHRUN_IFNAME", value_name = "NAME")]
    pub ifname: Option<String>,
    #[command(flatten)]
    #[serde(flatten)]
    pub console: ProgramConsole,
    /// The program and its arguments.
    #[arg(last = true, required = true)]
    pub program: Vec<String>,
}

impl ExecRank {
    /// The flags as command-line arguments for a rank (after `exec`): the flags, `--`, the
    /// program and its arguments.
    pub fn to_args(&self) -> Result<Vec<String>, ArgvError> {
        argv(self)
    }
}
