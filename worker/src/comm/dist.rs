//! Become a rank from your own Rust program (TorchDistributor's `run(train_fn)` for Rust):
//! start it with `tchrun exec -- ./my_program` (or mpirun/srun/torchrun variables) and call
//! `dist::init()`: it joins the job the same way `tchrun-worker` does and hands back the c10d
//! process group (Gloo on CPU, NCCL when CUDA is available).
//!
//! ```no_run
//! let d = tchrun_worker::dist::init().expect("join the job");
//! // Tensors live on the group's device (CUDA under NCCL).
//! let mut t = tch::Tensor::from_slice(&[d.info.place.rank as f32 + 1.0]).to_device(d.device());
//! d.pg.all_reduce(&mut [&mut t], tchrun_worker::pg::ReduceOp::Sum).expect("all-reduce");
//! ```
use crate::comm::bootstrap::{self, BootstrapError, RankInfo};
use crate::comm::pg::{BackendKind, C10dError, ProcessGroup, Store};
use std::time::Duration;

/// This process as a rank: where it sits and its process group.
pub struct Dist {
    pub info: RankInfo,
    pub pg: ProcessGroup,
    /// The store the group is built on (rank 0 serves it).
    pub store: Store,
    _universe: Option<crate::comm::mpi::Universe>,
}

#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("joining the job: {0}")]
    Join(#[from] BootstrapError),
    #[error("creating the process group: {0}")]
    Group(#[from] C10dError),
}

impl Dist {
    /// This rank's device: `cuda:<local rank>` under NCCL, the CPU under Gloo. Collectives take
    /// tensors of this device only.
    pub fn device(&self) -> tch::Device {
        self.pg.device()
    }

    /// This rank (0-based).
    pub fn rank(&self) -> usize {
        self.info.place.rank
    }

    /// The number of ranks.
    pub fn world_size(&self) -> usize {
        self.info.place.world_size
    }
}

/// Joins the job (timeout: `TCHRUN_TIMEOUT` seconds, default 300) and creates the group.
/// Backend: `TCHRUN_BACKEND` (gloo|nccl), else NCCL with CUDA and Gloo without. Under NCCL the
/// rank's device is `cuda:<local rank>` (one GPU per rank: more ranks on a node than GPUs is
/// refused).
pub fn init() -> Result<Dist, DistError> {
    let timeout = Duration::from_secs(
        std::env::var(tchrun::env::TCHRUN_TIMEOUT)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(tchrun::flags::DEFAULT_TIMEOUT_S),
    );
    let backend = match std::env::var(tchrun::env::TCHRUN_BACKEND).as_deref() {
        Ok("nccl") => BackendKind::Nccl,
        Ok("gloo") => BackendKind::Gloo,
        _ if tch::Cuda::is_available() && crate::comm::pg::has_nccl() => BackendKind::Nccl,
        _ => BackendKind::Gloo,
    };
    let mut id = bootstrap::identify()?;
    let ifname = std::env::var(tchrun::env::TCHRUN_IFNAME).ok();
    let nccl = backend == BackendKind::Nccl;
    id.check_network(ifname.as_deref(), !nccl, nccl)?;
    let joined = id.join(timeout)?;
    tracing::info!("{}", joined.info.bootstrap);
    let info = joined.info.clone();
    let device = if backend == BackendKind::Nccl {
        let gpus = tch::Cuda::device_count().max(0) as usize;
        if info.place.local_size > gpus {
            return Err(DistError::Group(C10dError {
                op: "ProcessGroup create",
                message: format!(
                    "{} on this node but {gpus} GPU(s) visible: NCCL needs one GPU per rank; \
                     start fewer ranks per node or set TCHRUN_BACKEND=gloo",
                    tchrun::counts::ranks(info.place.local_size)
                ),
            }));
        }
        tch::Device::Cuda(info.place.local_rank)
    } else {
        tch::Device::Cpu
    };
    let pg = ProcessGroup::new(
        &joined.store,
        "tchrun/dist",
        backend,
        info.place.rank,
        info.place.world_size,
        timeout,
        &info.gloo,
        device,
    )?;
    Ok(Dist {
        info,
        pg,
        store: joined.store,
        _universe: joined.universe,
    })
}
