//! The rank table (`<log-dir>/ranks.json`): rank → host, local rank, device, driver log;
//! written when the job starts (from the launch plan) and completed with what each rank
//! reported (its host and device from the driver-log header, its exit) when it ends.
use crate::plan::launch::{LauncherKind, Plan};
use crate::report::RankLog;
use crate::run::supervise::Outcome;
use tchrun::files;
use tchrun::job_record::{RankRow, Record};

fn planned(plan: &Plan, attempt: u32) -> Vec<RankRow> {
    let local = hostname::get()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "localhost".into());
    // This host's GPUs only when the ranks start here (see gpus.rs).
    let gpus = match crate::plan::gpus::ranks_start_elsewhere(plan, &|k| std::env::var(k).ok()) {
        None => crate::plan::gpus::visible_gpus().ok(),
        Some(_) => None,
    };
    (0..plan.world_size())
        .map(|rank| {
            let node = (rank / plan.procs_per_node) as usize;
            let local_rank = rank % plan.procs_per_node;
            let host = match plan.kind {
                LauncherKind::Srun => format!("slurm node {node}"),
                _ => plan
                    .node_names
                    .get(node)
                    .cloned()
                    .unwrap_or_else(|| local.clone()),
            };
            RankRow {
                attempt,
                rank,
                host,
                local_rank,
                device: match gpus {
                    Some(g) if (local_rank as usize) < g => format!("cuda:{local_rank}"),
                    Some(_) => "cpu".into(),
                    None => "unknown until it starts".into(),
                },
                log: files::driver_log(&plan.log_dir, rank as usize)
                    .display()
                    .to_string(),
                status: "starting".into(),
                bootstrap: None,
            }
        })
        .collect()
}

/// Writes and prints the planned table of attempt `attempt`.
pub fn write_table(plan: &Plan, attempt: u32) {
    let rows = planned(plan, attempt);
    // Best effort: the table is also printed.
    let _ = rows.write(&plan.log_dir);
    const SHOWN: usize = 16;
    for r in rows.iter().take(SHOWN) {
        outln!(
            "tchrun: rank {:>3} -> {} (local rank {}, {}), log {}",
            r.rank,
            r.host,
            r.local_rank,
            r.device,
            r.log
        );
    }
    if rows.len() > SHOWN {
        outln!(
            "tchrun: ... {} more ranks in {}",
            rows.len() - SHOWN,
            Vec::<RankRow>::path(&plan.log_dir).display()
        );
    }
}

/// Completes the table with what the ranks reported.
pub fn finish(plan: &Plan, attempt: u32, logs: &[RankLog], outcome: &Outcome) {
    let mut rows = planned(plan, attempt);
    for row in &mut rows {
        match logs.iter().find(|l| l.rank == row.rank as usize) {
            Some(l) => {
                row.host = l.host.clone();
                row.bootstrap = l.bootstrap.clone();
                if let Some(d) = &l.device {
                    row.device = d.clone();
                }
                row.status = match l.exit_code {
                    Some(0) => "exited 0".into(),
                    Some(c) => format!("exited {c}"),
                    None if l.failure.is_some() => format!(
                        "failed ({}), no exit recorded",
                        l.failure
                            .as_ref()
                            .map(|f| f.kind.classification())
                            .unwrap_or("error")
                    ),
                    None if !outcome.succeeded() => "stopped or killed (no exit recorded)".into(),
                    None => "ended (no exit recorded)".into(),
                };
            }
            None => row.status = "never started (no driver log)".into(),
        }
    }
    // Best effort: the table is also printed.
    let _ = rows.write(&plan.log_dir);
}
