//! `tchrun-worker exec`: torchrun's environment contract (RANK, WORLD_SIZE, MASTER_ADDR, ...)
//! set from the bootstrap, then the user's program run as the rank's child, its output read
//! line by line into the driver log and the console (`output`); the rank ends as it ended.
use crate::comm::bootstrap;
use crate::rank::start::{command_line, cuda_devices, Fatal, RankResult};
use crate::rank::{driver_log, output};
use anyhow::Context;
use tchrun::flags::Device as DeviceFlag;

pub use tchrun::worker_flags::ExecRank as ExecArgs;

/// Runs the program as this rank (returns only on failure).
pub fn run(a: ExecArgs) -> RankResult {
    let mut id = bootstrap::identify().map_err(|e| (None, Fatal::invalid(e.into())))?;
    if let Some(device @ (DeviceFlag::Auto | DeviceFlag::Cuda)) = a.device {
        // The launcher's GPU pre-flight, on this rank's own node (before the driver log, like
        // `resolve`): the program has not started yet.
        let gpus = cuda_devices().map_err(|f| (None, f))?;
        if device == DeviceFlag::Cuda && gpus == 0 {
            return Err((
                None,
                Fatal::invalid(anyhow::anyhow!(
                    "--device cuda: no CUDA device is visible on {}; use --device cpu or check CUDA_VISIBLE_DEVICES",
                    id.place.host
                )),
            ));
        }
        if gpus > 0 && (id.place.local_size > gpus || id.place.local_rank >= gpus) {
            return Err((
                None,
                Fatal::invalid(anyhow::anyhow!(
                    "{}",
                    tchrun::env::too_many_ranks_for_gpus(
                        id.place.local_size.max(id.place.local_rank + 1),
                        gpus,
                        &id.place.host
                    )
                )),
            ));
        }
    }
    let header = driver_log::Header {
        host: &id.place.host,
        rank: id.place.rank,
        local_rank: id.place.local_rank,
        world_size: id.place.world_size,
        device: "(program's)",
        backend: "(program's)",
        command: &command_line(),
        started_by: &format!("{:?}", id.place.started_by),
    };
    let (_path, console) = driver_log::open(&a.log_dir, &header, &a.console.console)
        .with_context(|| {
            format!(
                "cannot write the driver log in {} (check --log-dir)",
                a.log_dir.display()
            )
        })
        .map_err(|e| (None, Fatal::rank(e)))?;
    if let Err(e) = super::signals::install() {
        let e = anyhow::Error::from(e).context("cannot install the rank's signal handlers");
        return Err((Some(console), Fatal::rank(e)));
    }
    // The program may use either backend: both variables are checked.
    if let Err(e) = id.check_network(a.ifname.as_deref(), true, true) {
        return Err((Some(console), Fatal::bootstrap(e, "joining the job")));
    }
    let info = match id.master_for_program() {
        Ok(i) => i,
        Err(e) => return Err((Some(console), Fatal::bootstrap(e, "joining the job"))),
    };
    tracing::info!("{}", info.bootstrap);
    use tchrun::env as c;
    tracing::info!(program = %a.program.join(" "), master = %format!("{}:{}", info.master_addr, info.master_port), "exec");
    let mut cmd = std::process::Command::new(&a.program[0]);
    for m in c::MPI_MARKERS {
        cmd.env_remove(m);
    }
    if std::env::var_os(c::PYTHONUNBUFFERED).is_none() {
        cmd.env(c::PYTHONUNBUFFERED, "1");
    }
    cmd.args(&a.program[1..])
        .env(c::RANK, info.place.rank.to_string())
        .env(c::WORLD_SIZE, info.place.world_size.to_string())
        .env(c::LOCAL_RANK, info.place.local_rank.to_string())
        .env(c::LOCAL_WORLD_SIZE, info.place.local_size.to_string())
        .env(c::NODE_RANK, info.place.node_rank.to_string())
        .env(c::MASTER_ADDR, &info.master_addr)
        .env(c::MASTER_PORT, info.master_port.to_string());
    // The program runs as this rank's child; its output goes to the driver log and, line by
    // line, to the console, and the rank ends as it ended, after its last line went out.
    let status = match output::run(cmd, &console) {
        Ok(s) => s,
        Err(err) => {
            return Err((
                Some(console),
                Fatal::invalid(anyhow::anyhow!("cannot run {:?}: {err}", a.program[0])),
            ))
        }
    };
    use std::os::unix::process::ExitStatusExt;
    if let Some(sig) = status.signal() {
        tracing::debug!("the program ended by signal {sig}");
        // The rank ends by the same signal: its default action, whatever handler was set.
        // SAFETY: resets one signal's disposition and raises it; the rank is ending.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
    // The program's exit code is the rank's (the launcher reports it; nothing to add here).
    std::process::exit(status.code().unwrap_or(1))
}
