//! `tchrun-worker selftest` and `gradcheck` as ranks: started like any rank, then the checks
//! of `selftest` and `gradcheck`, rank 0 printing the verdict.
use super::{gradcheck, selftest};
use crate::comm::pg;
use crate::rank::start::{command_line, leave, start_rank, Fatal, Rank, RankResult};
use anyhow::Context;
use clap::Args;
use std::path::PathBuf;
use tchrun::flags::{RankFlags, DEFAULT_LOG_DIR};

pub use tchrun::worker_flags::SelftestRank as SelftestArgs;

#[derive(Args, Debug)]
pub struct GradcheckArgs {
    #[command(flatten)]
    pub rank: RankFlags,
}

/// The collective checks and the bandwidth table, as this rank.
pub fn run_selftest(a: SelftestArgs) -> RankResult {
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
        let rows = selftest::bandwidth(&pg, &a.checks.sizes, a.checks.iters as usize)
            .map_err(|e| fail(e.into()))?;
        let table = selftest::format_table(&rows, pg.size(), pg.backend().name());
        tracing::info!("\n{table}");
        if pg.rank() == 0 {
            console.out(&format!(
                "selftest: {} on {} ({}): all_reduce, broadcast, all_gather, barrier correct",
                tchrun::counts::ranks(pg.size()),
                pg::device_name(device),
                pg.backend().name()
            ));
            console.out(table.trim_end());
            if let Some(path) = &a.checks.json {
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

/// The gradient check, as this rank.
pub fn run_gradcheck(a: GradcheckArgs) -> RankResult {
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
