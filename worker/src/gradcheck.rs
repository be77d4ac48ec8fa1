//! `tchrun-worker gradcheck` (a test of the training path): the gradient averaged across the
//! ranks by `Replicator::reduce_gradients` must equal the single-process gradient of the
//! combined batch. Uses a model without batch-norm and an uneven split of the batch.
use crate::ddp::Replicator;
use crate::pg::ProcessGroup;
use tch::{nn, nn::Module, Device, Kind, Tensor};

fn net(p: &nn::Path) -> impl Module {
    nn::seq()
        .add(nn::conv2d(p / "conv", 3, 8, 3, Default::default()))
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(nn::linear(p / "fc", 8 * 6 * 6, 10, Default::default()))
}

fn grads(vs: &nn::VarStore) -> Tensor {
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    Tensor::cat(
        &named
            .iter()
            .map(|(_, t)| t.grad().reshape([-1]))
            .collect::<Vec<_>>(),
        0,
    )
}

/// Returns the max absolute difference on rank 0 (0 elsewhere).
pub fn run(pg: &ProcessGroup) -> Result<f64, crate::pg::C10dError> {
    let (rank, world) = (pg.rank() as i64, pg.size() as i64);
    tch::manual_seed(1234 + rank); // different init per rank: the broadcast must fix it
    let vs = nn::VarStore::new(Device::Cpu);
    let model = net(&vs.root());
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    let rep = Replicator::new(&named, |_| false);
    rep.broadcast_all(pg)?;
    // The same global batch on every rank; rank r takes an uneven contiguous slice.
    tch::manual_seed(99);
    let total = 3 * world + 1;
    let x = Tensor::randn([total, 3, 8, 8], (Kind::Float, Device::Cpu));
    let y = Tensor::arange(total, (Kind::Int64, Device::Cpu)).remainder(10);
    let bounds: Vec<i64> = (0..=world)
        .map(|r| if r == world { total } else { r * 3 + r.min(1) })
        .collect();
    let (lo, hi) = (bounds[rank as usize], bounds[rank as usize + 1]);
    let loss = model
        .forward(&x.narrow(0, lo, hi - lo))
        .cross_entropy_for_logits(&y.narrow(0, lo, hi - lo));
    loss.backward();
    let stats = rep.reduce_gradients(pg, &loss, (hi - lo) as usize, false)?;
    let distributed = grads(&vs);
    if rank != 0 {
        return Ok(0.0);
    }
    // Single process, whole batch, same weights.
    for (_, t) in &named {
        let mut g = t.grad();
        let _ = g.zero_();
    }
    let full = model.forward(&x).cross_entropy_for_logits(&y);
    full.backward();
    let reference = grads(&vs);
    let diff = (&distributed - &reference).abs().max().double_value(&[]);
    let loss_diff = (stats.loss - full.double_value(&[])).abs();
    Ok(diff.max(loss_diff))
}
