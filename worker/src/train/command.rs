//! `tchrun-worker train` as a rank: outputs checked against inputs, the inputs checked, the
//! rank started, the job checked against the world size, then `train::train`.
use crate::rank::start::{command_line, leave, start_rank, Fatal, Rank, RankResult};
use clap::Args;
use tchrun::exit::ErrorKind;
use tchrun::flags::RankFlags;

#[derive(Args, Debug)]
pub struct TrainArgs {
    #[command(flatten)]
    pub job: tchrun::flags::TrainJob,
    #[command(flatten)]
    pub rank: RankFlags,
    /// The launcher's hidden flags (dataset index copies, headers checked on decode).
    #[command(flatten)]
    pub handoff: tchrun::flags::TrainHandoff,
}

/// Runs the training job as this rank.
pub fn run(a: TrainArgs) -> RankResult {
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
        super::check_inputs(&a.job, indexes, h.verify_on_decode).map_err(|e| {
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
    match tchrun_data::preflight::check_job(&inputs, &a.job, pg.size()) {
        Ok(warnings) => {
            // `tchrun train` (which sets TCHRUN_ATTEMPT) said them already on the console; else
            // rank 0 says them, once for the job.
            let said = std::env::var_os(tchrun::env::TCHRUN_ATTEMPT).is_some();
            for w in warnings {
                tracing::warn!(target: crate::rank::driver_log::LOG_ONLY, "{w}");
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
    // User-facing lines: in every driver log, and on the console of the ranks `--console`
    // selects.
    let say = |line: &str| {
        tracing::info!("{line}");
        console.out(line);
    };
    let host = &joined.info.place.host;
    let tracking = super::tracking::Tracking::start(&a.job, is_rank0, pg.size(), host);
    let ctx = super::RankCtx {
        pg: &pg,
        store: &joined.store,
        device,
        local_size: joined.info.place.local_size,
        local_rank: joined.info.place.local_rank,
        host: &joined.info.place.host,
        log_dir: &log_dir,
        say: &say,
        tracking: &tracking,
    };
    let r = super::train(&a.job, inputs, &ctx);
    crate::status::end_host(match &r {
        Ok(_) => tchrun::job_record::status::JobState::Finished,
        Err(_) if crate::rank::signals::requested() != 0 => {
            tchrun::job_record::status::JobState::Stopped
        }
        Err(_) => tchrun::job_record::status::JobState::Failed,
    });
    leave(pg, joined, r.is_ok());
    // After the group is left: no other rank waits while the last MLflow calls drain, and the
    // heartbeat says the rank drains (its own allowance in the launcher's watch).
    if r.is_ok() && tracking.is_tracking() {
        crate::heartbeat::phase(tchrun::job_record::heartbeat::Phase::Draining);
    }
    tracking.finish(&r, &a.job.output, &say);
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
