//! `tchrun-worker gradcheck` (a test of the training path): the gradient averaged across the
//! ranks by `Replicator::begin_step`/`end_step` must equal the single-process gradient of the
//! combined batch. Uses a model without batch-norm, channels-last weights and inputs, an uneven
//! split of the batch, one bucket per parameter (so buckets are all-reduced while backward runs), a parameter that never gets a
//! gradient, and a step in which the last rank has no samples (a skipped batch).
use crate::comm::ddp::Replicator;
use crate::comm::pg::ProcessGroup;
use crate::train::step::{train_step, StepModel};
use tch::{nn, nn::Module, Kind, Tensor};

fn net(p: &nn::Path) -> impl Module {
    // Registered, never used in forward: its gradient stays zero everywhere.
    let _unused = p.var("unused", &[5], nn::Init::Const(0.0));
    nn::seq()
        .add(nn::conv2d(p / "conv", 3, 8, 3, Default::default()))
        .add_fn(|x| x.relu().flatten(1, -1))
        .add(nn::linear(p / "fc", 8 * 6 * 6, 10, Default::default()))
}

fn grads(named: &[(String, Tensor)]) -> Tensor {
    Tensor::cat(
        &named
            .iter()
            .map(|(_, t)| {
                let g = t.grad();
                if g.defined() {
                    g.reshape([-1])
                } else {
                    t.zeros_like().reshape([-1])
                }
            })
            .collect::<Vec<_>>(),
        0,
    )
}

fn zero_grads(named: &[(String, Tensor)]) {
    for (_, t) in named {
        let mut g = t.grad();
        if g.defined() {
            let _ = g.zero_();
        }
    }
}

/// What `run` found.
#[derive(Debug, Clone, Copy)]
pub struct Report {
    /// Max absolute difference (gradient or loss) over every step, on rank 0 (0 elsewhere).
    pub max_diff: f64,
    /// Buckets of the overlapped steps, and how many started during backward (the second step).
    pub buckets: usize,
    pub early: usize,
}

pub fn run(pg: &ProcessGroup) -> Result<Report, crate::comm::pg::C10dError> {
    let (rank, world) = (pg.rank() as i64, pg.size() as i64);
    tch::manual_seed(1234 + rank); // different init per rank: the broadcast must fix it
                                   // The group's device: on a GPU host this covers the CUDA hooks, buckets and NCCL.
    let dev = pg.device();
    let vs = nn::VarStore::new(dev);
    let model = net(&vs.root());
    let mut named: Vec<(String, Tensor)> = vs.variables().into_iter().collect();
    named.sort_by(|a, b| a.0.cmp(&b.0));
    // Channels-last convolution weights, as training uses: bucket slots take their strides.
    crate::models::to_channels_last(&named);
    // One bucket per parameter: the first ones are reduced while backward still runs.
    let rep = Replicator::new(&named, |_| false).with_bucket_caps(4, 4);
    rep.broadcast_all(pg)?;
    let mut report = Report {
        max_diff: 0.0,
        buckets: 0,
        early: 0,
    };
    // Step 0 finds the bucket order (one flat all-reduce), steps 1 and 2 overlap; in step 2
    // the last rank has no samples.
    for it in 0..3i64 {
        zero_grads(&named);
        // The same global batch on every rank; rank r takes an uneven contiguous slice.
        tch::manual_seed(99 + it);
        let total = 3 * world + 1;
        let x = crate::models::channels_last(&Tensor::randn([total, 3, 8, 8], (Kind::Float, dev)));
        let y = Tensor::arange(total, (Kind::Int64, dev)).remainder(10);
        let mut bounds: Vec<i64> = (0..=world)
            .map(|r| if r == world { total } else { r * 3 + r.min(1) })
            .collect();
        if it == 2 && world > 1 {
            bounds[world as usize - 1] = total;
        }
        let (lo, hi) = (bounds[rank as usize], bounds[rank as usize + 1]);
        let n_local = (hi - lo) as usize;
        // The training step itself (forward, begin_step, backward, end_step), without an update.
        let (xs, ys) = (x.narrow(0, lo, hi - lo), y.narrow(0, lo, hi - lo));
        let done = train_step(
            &StepModel {
                net: &model,
                train: true,
                amp: false,
                device: dev,
                label_smoothing: 0.0,
                class_weights: None,
            },
            (n_local > 0).then_some((&xs, &ys)),
            false,
            Some((pg, &rep)),
            None,
            None,
        )?;
        let loss = done.stats.map_or(f64::NAN, |s| s.read().0);
        if it == 1 {
            if let Some(r) = rep.last_reduction() {
                report.buckets = r.buckets;
                report.early = r.early;
            }
        }
        let distributed = grads(&named);
        if rank != 0 {
            continue;
        }
        // Single process, the samples of every rank that had any, same weights.
        let end = bounds[world as usize];
        zero_grads(&named);
        let full = model
            .forward(&x.narrow(0, 0, end))
            .cross_entropy_for_logits(&y.narrow(0, 0, end));
        full.backward();
        let reference = grads(&named);
        let diff = (&distributed - &reference).abs().max().double_value(&[]);
        let loss_diff = (loss - full.double_value(&[])).abs();
        report.max_diff = report.max_diff.max(diff).max(loss_diff);
        if !(report.max_diff.is_finite()) {
            report.max_diff = f64::INFINITY;
        }
    }
    Ok(report)
}
