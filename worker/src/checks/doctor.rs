//! `tchrun-worker doctor`: one phase of `tchrun doctor` as a rank. `nodes` (one rank per
//! node): this node's facts (`node_probe`), the shared-file-system test (every rank writes a
//! file, every rank reads every file), the clock against rank 0's; `links` (the job's layout):
//! each round's pairs all-reduce in a group of their own, timed. Every rank's record reaches
//! rank 0 through the store; rank 0 writes the phase's JSON. The verdict is the launcher's.
use super::node_probe;
use crate::comm::bootstrap::Joined;
use crate::comm::pg::{C10dError, ProcessGroup, ReduceOp};
use crate::rank::start::{command_line, cuda_devices, leave, start_rank, Fatal, Rank, RankResult};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tch::{Kind, Tensor};
use tchrun::doctor::{self, DoctorRank, LinkReport, LinkVerdict, Network, NodeReport, Phase};
use tchrun::flags::DEFAULT_LOG_DIR;

/// Clock samples taken (their median is the offset).
const CLOCK_SAMPLES: usize = 5;

/// One phase of the doctor, as this rank.
pub fn run(a: DoctorRank) -> RankResult {
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
    let log_dir = a
        .rank
        .log_dir
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_LOG_DIR));
    let r = match a.phase {
        Phase::Nodes => nodes(&a, &joined, &pg, &log_dir),
        Phase::Links => links(&a, &joined, &pg),
    };
    leave(pg, joined, r.is_ok());
    r.map_err(|f| (Some(console), f))
}

fn comm(e: C10dError) -> Fatal {
    Fatal::rank(e.into())
}

/// Every rank's `key/<rank>` value, read by rank 0 (each waits for its key).
fn gather(joined: &Joined, key: &str, world: usize) -> Result<Vec<Vec<u8>>, Fatal> {
    (0..world)
        .map(|r| joined.store.get(&format!("{key}/{r}")).map_err(comm))
        .collect()
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) -> Result<(), Fatal> {
    let text = serde_json::to_vec_pretty(value)
        .context("serializing the doctor's records")
        .map_err(Fatal::rank)?;
    tchrun::files::write_atomic(path, &text)
        .with_context(|| format!("writing {}", path.display()))
        .map_err(Fatal::rank)
}

fn nodes(a: &DoctorRank, joined: &Joined, pg: &ProcessGroup, log_dir: &Path) -> Result<(), Fatal> {
    let (rank, world) = (pg.rank(), pg.size());
    let host = joined.info.place.host.clone();
    let paths = node_probe::paths(&a.checks);
    let shared_dir = node_probe::shared_dir(&paths, log_dir);
    let unread_from = shared_fs(joined, pg, &shared_dir, &host)?;
    let clock_offset_ms = clock_offset(pg).map_err(comm)?;
    let cuda = cuda_devices().map_err(|f| Fatal::rank(f.err))?;
    let report = NodeReport {
        rank,
        host,
        tchrun_version: env!("CARGO_PKG_VERSION").to_string(),
        torch_version: env!("TCHRUN_TORCH_VERSION").to_string(),
        gpus: node_probe::gpus(cuda),
        paths,
        disk_free_bytes: tchrun::files::free_bytes(&shared_dir),
        shared_dir,
        unread_from,
        memory_available_bytes: node_probe::memory_available(),
        clock_offset_ms,
        problems: Vec::new(),
    };
    tracing::info!("doctor: this node: {report:?}");
    let text = serde_json::to_vec(&report)
        .context("serializing the node's record")
        .map_err(Fatal::rank)?;
    joined
        .store
        .set(&format!("doctor/node/{rank}"), &text)
        .map_err(comm)?;
    if rank == 0 {
        let all = gather(joined, "doctor/node", world)?;
        let reports: Vec<NodeReport> = all
            .iter()
            .map(|b| serde_json::from_slice(b))
            .collect::<Result<_, _>>()
            .context("reading a node's record")
            .map_err(Fatal::rank)?;
        write_json(&a.json, &reports)?;
    }
    pg.barrier().map_err(comm)
}

/// The shared-file-system test in `dir`: every rank writes `.tchrun-doctor-<nonce>-<rank>`
/// (its host inside), then reads every rank's; returns the hosts whose file it could not read.
fn shared_fs(
    joined: &Joined,
    pg: &ProcessGroup,
    dir: &Path,
    host: &str,
) -> Result<Vec<String>, Fatal> {
    let (rank, world) = (pg.rank(), pg.size());
    let store = &joined.store;
    if rank == 0 {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let nonce = format!("{}-{nanos}", std::process::id());
        store.set("doctor/nonce", nonce.as_bytes()).map_err(comm)?;
    }
    let nonce = String::from_utf8_lossy(&store.get("doctor/nonce").map_err(comm)?).into_owned();
    let file = |r: usize| dir.join(format!(".tchrun-doctor-{nonce}-{r}"));
    if let Err(e) = std::fs::write(file(rank), host.as_bytes()) {
        tracing::warn!("doctor: cannot write {}: {e}", file(rank).display());
    }
    store
        .set(&format!("doctor/host/{rank}"), host.as_bytes())
        .map_err(comm)?;
    pg.barrier().map_err(comm)?;
    let mut unread = Vec::new();
    for r in 0..world {
        let theirs =
            String::from_utf8_lossy(&store.get(&format!("doctor/host/{r}")).map_err(comm)?)
                .into_owned();
        match tchrun::files::read_bounded_string(&file(r), tchrun::files::caps::RECORD) {
            Ok(text) if text == theirs => {}
            Ok(text) => {
                tracing::warn!(
                    "doctor: {} holds '{text}', not '{theirs}'",
                    file(r).display()
                );
                unread.push(theirs);
            }
            Err(e) => {
                tracing::warn!("doctor: cannot read {}: {e}", file(r).display());
                unread.push(theirs);
            }
        }
    }
    pg.barrier().map_err(comm)?;
    let _ = std::fs::remove_file(file(rank));
    Ok(unread)
}

/// This rank's clock minus rank 0's, in ms: the median over samples each taken right after a
/// barrier (precision: the barrier's exit skew, well under a millisecond on one network).
fn clock_offset(pg: &ProcessGroup) -> Result<f64, C10dError> {
    let mut samples = Vec::with_capacity(CLOCK_SAMPLES);
    for _ in 0..CLOCK_SAMPLES {
        pg.barrier()?;
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64() * 1e3);
        let t = Tensor::from_slice(&[now]).to_device(pg.device());
        let all = pg.all_gather(&t)?;
        let t0 = all.first().map_or(now, |t| t.double_value(&[0]));
        samples.push(now - t0);
    }
    Ok(doctor::median(&samples).unwrap_or(0.0))
}

fn links(a: &DoctorRank, joined: &Joined, pg: &ProcessGroup) -> Result<(), Fatal> {
    let (rank, world) = (pg.rank(), pg.size());
    let store = &joined.store;
    store
        .set(
            &format!("doctor/lhost/{rank}"),
            joined.info.place.host.as_bytes(),
        )
        .map_err(comm)?;
    let hosts: Vec<String> = gather(joined, "doctor/lhost", world)?
        .iter()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .collect();
    let rounds = doctor::rounds(world);
    let mut mine = Vec::new();
    for round in 0..rounds {
        pg.barrier().map_err(comm)?;
        let Some(p) = doctor::partner(rank, round, world) else {
            continue;
        };
        let measured = measure_pair(a, joined, pg, round, p);
        if let Err(e) = &measured {
            tracing::error!("doctor: link to rank {p} ({}): {e}", hosts[p]);
        }
        if rank < p {
            mine.push(LinkReport {
                round,
                ranks: [rank, p],
                hosts: [hosts[rank].clone(), hosts[p].clone()],
                intra_node: hosts[rank] == hosts[p],
                bytes: (a.checks.link_bytes / 4).max(1) * 4,
                busbw_gbs: measured.as_ref().ok().copied(),
                error: measured.err(),
                vs_median: None,
                verdict: LinkVerdict::Ok,
            });
        }
    }
    let text = serde_json::to_vec(&mine)
        .context("serializing the links")
        .map_err(Fatal::rank)?;
    store
        .set(&format!("doctor/links/{rank}"), &text)
        .map_err(comm)?;
    if rank == 0 {
        let mut links = Vec::new();
        for b in gather(joined, "doctor/links", world)? {
            let some: Vec<LinkReport> = serde_json::from_slice(&b)
                .context("reading a rank's links")
                .map_err(Fatal::rank)?;
            links.extend(some);
        }
        links.sort_by_key(|l| (l.round, l.ranks));
        let net = Network {
            world_size: world,
            backend: pg.backend().name().to_string(),
            rounds,
            links,
            median_intra_gbs: None,
            median_inter_gbs: None,
        };
        write_json(&a.json, &net)?;
    }
    pg.barrier().map_err(comm)
}

/// The bus bandwidth (GB/s) of this rank and `partner`'s all-reduce in a group of their own:
/// each side's fastest of `--link-iters` all-reduces, the slower side's; or why it could not
/// be measured.
fn measure_pair(
    a: &DoctorRank,
    joined: &Joined,
    pg: &ProcessGroup,
    round: u32,
    partner: usize,
) -> Result<f64, String> {
    let rank = pg.rank();
    let (lo, hi) = (rank.min(partner), rank.max(partner));
    let name = format!("tchrun/doctor/{round}/{lo}-{hi}");
    let timeout = Duration::from_secs(a.checks.link_timeout);
    let group = ProcessGroup::new(
        &joined.store,
        &name,
        pg.backend(),
        usize::from(rank > partner),
        2,
        timeout,
        &joined.info.gloo,
        pg.device(),
    )
    .map_err(|e| e.to_string())?;
    let elems = (a.checks.link_bytes / 4).max(1) as i64;
    let iters = a.checks.link_iters as usize;
    let timed = || -> Result<f64, C10dError> {
        let device = group.device();
        let mut t = Tensor::ones([elems], (Kind::Float, device));
        group.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
        group.barrier()?;
        // The fastest of the timed all-reduces: what the link sustains. A mean lets one
        // preemption of a rank (another job, a busy core) call a healthy link slow; a link
        // that is slow in every round stays slow.
        let mut mine = f64::INFINITY;
        for _ in 0..iters {
            let start = Instant::now();
            group.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
            if let tch::Device::Cuda(i) = device {
                tch::Cuda::synchronize(i as i64);
            }
            mine = mine.min(start.elapsed().as_secs_f64());
        }
        let mut slowest = Tensor::from_slice(&[mine]).to_device(device);
        group.all_reduce(&mut [&mut slowest], ReduceOp::Max)?;
        let secs = slowest.double_value(&[0]).max(1e-9);
        // Two ranks: bus bandwidth = algorithm bandwidth (2(n-1)/n = 1).
        Ok((elems * 4) as f64 / secs / 1e9)
    };
    match timed() {
        Ok(bw) => {
            drop(group);
            Ok(bw)
        }
        Err(e) => {
            // Its peer may be gone: c10d's destructor would wait for it.
            std::mem::forget(group);
            Err(e.to_string())
        }
    }
}
