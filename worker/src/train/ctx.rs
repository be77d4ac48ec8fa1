//! `RankCtx`, what the rank gives the trainer (process group, store, device, host, log
//! directory, the console and tracking), and what follows from it alone: the layout, a batch
//! on the device, the loader's threads, the epoch's time split reduced over the group.
use super::tracking;
use super::TrainError;
use crate::comm::pg::ProcessGroup;
use crate::models;
use tch::{Device, Kind, Tensor};
use tchrun::flags::TrainJob;
use tchrun_data as data;

/// What the training loop needs from the rank.
pub struct RankCtx<'a> {
    pub pg: &'a ProcessGroup,
    pub store: &'a crate::comm::pg::Store,
    pub device: Device,
    pub local_size: usize,
    /// This rank's place on its host (0: it writes its host's `--prometheus-textfile` file).
    pub local_rank: usize,
    /// This rank's host and the job's log directory (`status.json`).
    pub host: &'a str,
    pub log_dir: &'a std::path::Path,
    pub say: &'a dyn Fn(&str),
    /// Rank 0's MLflow run (`--mlflow-tracking-uri`); off elsewhere.
    pub tracking: &'a tracking::Tracking,
}

/// The memory format this rank's model and batches use (`--channels-last`; every rank alike).
pub(super) fn layout(
    job: &TrainJob,
    device: Device,
    cfg: &tchrun::model::ModelConfig,
) -> crate::layout::Layout {
    crate::layout::choose(
        job.options.layout_setting(),
        device.is_cuda(),
        cfg.arch,
        cfg.input_size as i64,
    )
}

pub(super) fn to_input(
    batch: &data::Batch,
    device: Device,
    channels_last: bool,
) -> (Tensor, Tensor) {
    let s = batch.size as i64;
    let x = Tensor::from_slice(&batch.images).view([batch.len as i64, 3, s, s]);
    let y = Tensor::from_slice(&batch.labels);
    let (x, y) = if device.is_cuda() {
        (
            x.pin_memory(device)
                .to_device_(device, Kind::Float, true, false),
            y.to_device_(device, Kind::Int64, true, false),
        )
    } else {
        (x, y)
    };
    if channels_last {
        (models::channels_last(&x), y)
    } else {
        (x, y)
    }
}

pub(super) fn loader_threads(job: &TrainJob, local_size: usize) -> usize {
    job.options
        .loader_threads
        .map(|t| t as usize)
        .unwrap_or_else(|| tchrun::env::threads_per_rank(local_size))
}

/// A per-rank time split reduced over the group: mean and largest of each value.
pub(super) struct Split {
    pub(super) mean: [f64; 4],
    pub(super) max: [f64; 4],
}

/// One sum and one max all-reduce of four numbers (data wait, compute, communication, loop
/// time) at the end of an epoch; every rank calls it at the same point.
pub(super) fn time_split(pg: &ProcessGroup, values: [f64; 4]) -> Result<Split, TrainError> {
    let mut sum = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut sum], crate::comm::pg::ReduceOp::Sum)?;
    let mut max = Tensor::from_slice(&values).to_device(pg.device());
    pg.all_reduce(&mut [&mut max], crate::comm::pg::ReduceOp::Max)?;
    let read = |t: &Tensor| -> Result<[f64; 4], TrainError> {
        let v = Vec::<f64>::try_from(t.to_device(Device::Cpu))?;
        let mut out = [0.0; 4];
        for (o, x) in out.iter_mut().zip(v) {
            *o = x;
        }
        Ok(out)
    };
    let n = pg.size().max(1) as f64;
    Ok(Split {
        mean: read(&sum)?.map(|x| x / n),
        max: read(&max)?,
    })
}
