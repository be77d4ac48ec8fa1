//! `tchrun-worker`: one rank of a tchrun job. Started by mpirun, srun, `tchrun` or by hand;
//! joins the job (bootstrap), opens its driver log, builds the c10d process group and runs
//! the subcommand. Architecture Invariant: the worker never spawns ranks.

use clap::{Parser, Subcommand};
use std::process::ExitCode;
use tchrun::driver_log::{FailureKind, RankExit};
use tchrun_worker::checks::{bench_loader, bench_step, command as checks, doctor};
use tchrun_worker::comm::pg;
use tchrun_worker::infer::{command as infer, logits};
use tchrun_worker::rank::driver_log;
use tchrun_worker::rank::exec;
use tchrun_worker::rank::start::Fatal;
use tchrun_worker::train::command as train;

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
    Selftest(checks::SelftestArgs),
    /// One phase of `tchrun doctor`: this node's checks, or the pairwise link bandwidth.
    Doctor(tchrun::doctor::DoctorRank),
    /// Set torchrun's environment contract (RANK, WORLD_SIZE, MASTER_ADDR, ...) and exec PROGRAM.
    Exec(exec::ExecArgs),
    /// Train an image classifier data-parallel (one rank; start N with mpirun/srun/tchrun).
    Train(train::TrainArgs),
    /// Score images with a trained model directory into a CSV (sharded over the ranks).
    Score(infer::ScoreArgs),
    /// Evaluate a trained model on labeled images: scores, metrics, confusion matrix.
    Evaluate(infer::EvaluateArgs),
    /// Check that the cross-rank averaged gradient equals the combined-batch gradient.
    #[command(hide = true)]
    Gradcheck(checks::GradcheckArgs),
    /// Benchmark the input pipeline alone (decode + augment), images/s.
    #[command(hide = true)]
    BenchLoader(bench_loader::Args),
    /// Benchmark training steps on synthetic tensors, ms/step.
    #[command(hide = true)]
    BenchStep(bench_step::Args),
    /// A model directory's logits for fixed inputs, for the parity tests.
    #[command(hide = true)]
    Logits(logits::Args),
    /// `tchrun export`'s step: trace the model into TorchScript and check it.
    #[command(hide = true)]
    Export(tchrun::export::TraceArgs),
}

fn main() -> ExitCode {
    // A rank's `--recipe` was expanded by the launcher: its flags are the plain ones.
    let (cli, _given): (Cli, _) = tchrun::flags::parse_or_exit();
    // A panic (in tch usually a libtorch exception) ends the rank like any fatal error: its
    // record and the panic are already in the driver log (the hook); here it gets its exit code.
    let run = std::panic::AssertUnwindSafe(move || match cli.cmd {
        Cmd::Selftest(a) => checks::run_selftest(a),
        Cmd::Doctor(a) => doctor::run(a),
        Cmd::Exec(a) => exec::run(a),
        Cmd::Train(a) => train::run(a),
        Cmd::Score(a) => infer::run_score(a),
        Cmd::Evaluate(a) => infer::run_evaluate(a),
        Cmd::Gradcheck(a) => checks::run_gradcheck(a),
        Cmd::BenchLoader(a) => bench_loader::run(a).map_err(|e| (None, Fatal::invalid(e))),
        Cmd::BenchStep(a) => bench_step::run(a).map_err(|e| (None, Fatal::invalid(e))),
        Cmd::Logits(a) => logits::run(a).map_err(|e| (None, Fatal::invalid(e))),
        Cmd::Export(a) => {
            tchrun_worker::export::run(a).map_err(|(kind, err)| (None, Fatal { kind, err }))
        }
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
            tchrun_worker::heartbeat::done();
            tracing::info!("{}", RankExit { code: 0 }.write());
            ExitCode::SUCCESS
        }
        Err((console, f)) => {
            let msg = format!("{:#}", f.err);
            let code = f.kind.exit_code();
            // On the console as the `tchrun-worker: error:` line below.
            tracing::error!(target: driver_log::LOG_ONLY, "{msg}");
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

/// The failure record's kind of a rank's fatal error, from the first typed cause in its chain
/// (the launcher classifies by it).
fn failure_kind(f: &Fatal) -> FailureKind {
    let by_exit = FailureKind::from_error_kind(f.kind);
    for cause in f.err.chain() {
        if let Some(e) = cause.downcast_ref::<tchrun_worker::train::TrainError>() {
            return e.failure_kind(by_exit);
        }
        if let Some(b) = cause.downcast_ref::<tchrun_worker::comm::bootstrap::BootstrapError>() {
            // A setting that names no interface of the host is the user's to fix (exit 3
            // still: the launch failed), not a peer's or the network's: no "raise --timeout".
            if matches!(
                b,
                tchrun_worker::comm::bootstrap::BootstrapError::Interface(_)
            ) {
                return FailureKind::InvalidInput;
            }
            if b.is_network() {
                return FailureKind::Communication;
            }
        }
        if let Some(c) = cause.downcast_ref::<pg::C10dError>() {
            return driver_log::torch_failure_kind(&c.to_string(), FailureKind::Communication);
        }
        if let Some(t) = cause.downcast_ref::<tch::TchError>() {
            return driver_log::torch_failure_kind(&t.to_string(), by_exit);
        }
        if cause.downcast_ref::<tchrun_data::DatasetError>().is_some() {
            return FailureKind::Data;
        }
        if cause.downcast_ref::<std::io::Error>().is_some() {
            return FailureKind::Io;
        }
    }
    by_exit
}
