//! `torch.utils.data.DistributedSampler` sharding (`drop_last=False`), torchvision's `RASampler`
//! (`--ra-sampler`: repeated augmentation, `Sampling`), and `--global-batch-size`'s fixed cut of
//! an epoch into optimizer steps and micro-batches (`GlobalCut`).
use rand::seq::SliceRandom;
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

// ---------------------------------------------------------------------------------------------
// Distributed sharding
// ---------------------------------------------------------------------------------------------

/// `DistributedSampler` (drop_last=False) indices for `rank` out of `world`.
///
/// Panics if `world == 0` or `rank >= world`.
pub fn shard(
    len: usize,
    rank: usize,
    world: usize,
    seed: i64,
    epoch: u64,
    shuffle: bool,
) -> Vec<usize> {
    shard_order(&epoch_order(len, seed, epoch, shuffle), rank, world)
}

/// `DistributedSampler`'s split of an epoch's `order` (dataset indices) among `world` ranks:
/// padded by wrapping around to a multiple of `world`, rank `r` takes positions `r, r + world,
/// ...`.
///
/// Panics if `world == 0` or `rank >= world`.
pub fn shard_order(order: &[usize], rank: usize, world: usize) -> Vec<usize> {
    assert!(world > 0, "shard: world size must be > 0");
    assert!(
        rank < world,
        "shard: rank {rank} must be < world size {world}"
    );
    let len = order.len();
    if len == 0 {
        return Vec::new();
    }
    let total = len.div_ceil(world) * world;
    (rank..total)
        .step_by(world)
        .map(|p| order[p % len])
        .collect()
}

/// torchvision's `RASampler` keeps `len // 256 * 256` samples of an epoch (DeiT's repeated
/// augmentation, "to be as close as possible to the original implementation").
pub const RA_ROUND: usize = 256;

/// What a training epoch is made of: every image once in a shuffled order
/// (`DistributedSampler`), or with `--ra-sampler` torchvision's `RASampler`: the shuffled
/// order with each image repeated `--ra-reps` times in a row, cut to the first
/// `len // 256 * 256` positions. The ranks then split those positions as `DistributedSampler`
/// does (rank `r` takes `r, r + world, ...`: `RASampler`'s own subsampling, so a repeated
/// image lands on different ranks, each copy augmented by its own position) or by
/// `GlobalCut`; the epoch's positions, and so the model, do not depend on the world size.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sampling {
    /// `--ra-reps` with `--ra-sampler`; none: every image once.
    pub ra_reps: Option<usize>,
}

impl Sampling {
    /// How a training job's epochs sample its images (`--ra-sampler`, `--ra-reps`).
    pub fn of(recipe: &tchrun::recipe::RecipeFlags) -> Sampling {
        Sampling {
            ra_reps: recipe.ra_sampler.then_some(recipe.ra_reps as usize),
        }
    }

    /// Positions in an epoch over `len` images.
    pub fn epoch_len(&self, len: usize) -> usize {
        match self.ra_reps {
            None => len,
            Some(_) => len / RA_ROUND * RA_ROUND,
        }
    }

    /// Epoch `epoch`'s dataset indices, in order (shuffled with seed + epoch).
    pub fn order(&self, len: usize, seed: i64, epoch: u64) -> Vec<usize> {
        let once = epoch_order(len, seed, epoch, true);
        match self.ra_reps {
            None => once,
            Some(reps) => once
                .into_iter()
                .flat_map(|i| std::iter::repeat_n(i, reps.max(1)))
                .take(self.epoch_len(len))
                .collect(),
        }
    }

    /// This rank's dataset indices of epoch `epoch` without `--global-batch-size`.
    pub fn shard(
        &self,
        len: usize,
        rank: usize,
        world: usize,
        seed: i64,
        epoch: u64,
    ) -> Vec<usize> {
        shard_order(&self.order(len, seed, epoch), rank, world)
    }
}

/// The epoch's order of the whole dataset: shuffled with seed + epoch (as DistributedSampler
/// does before splitting it among the ranks).
fn epoch_order(len: usize, seed: i64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut indices: Vec<usize> = (0..len).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64((seed as u64).wrapping_add(epoch));
        indices.shuffle(&mut rng);
    }
    indices
}

/// `--global-batch-size G`'s one fixed cut of an epoch, the same at every world size: the
/// epoch's order (`shard`'s shuffle) padded by wrapping around to a whole number of steps;
/// optimizer step k takes positions `[kG, (k+1)G)`; micro-batch j of the step positions
/// `[kG + jB, kG + (j+1)B)`, j in `0..world × accumulation`; rank r's accumulation step a is
/// micro-batch `j = a·world + r`. So (2 ranks, 1 step) and (1 rank, 2 steps) see the same
/// micro-batches, and so do (4, 1) and (2, 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GlobalCut {
    pub rank: usize,
    pub world: usize,
    /// `--batch-size` (B): images per micro-batch.
    pub batch: usize,
    /// Micro-batches per rank per optimizer step (A).
    pub accumulation: usize,
}

impl GlobalCut {
    /// G = world × accumulation × batch.
    pub fn global_batch(&self) -> usize {
        self.world * self.accumulation * self.batch
    }

    /// Optimizer steps per epoch over `len` samples (the last step padded).
    pub fn steps(&self, len: usize) -> usize {
        len.div_ceil(self.global_batch().max(1))
    }

    /// The global position (in the padded epoch order) of this rank's `p`-th sample.
    pub fn position(&self, p: usize) -> usize {
        let (micro, within) = (p / self.batch, p % self.batch);
        let (k, a) = (micro / self.accumulation, micro % self.accumulation);
        k * self.global_batch() + (a * self.world + self.rank) * self.batch + within
    }

    /// This rank's dataset indices of epoch `epoch`, in order: per step, its micro-batches.
    pub fn indices(&self, len: usize, seed: i64, epoch: u64) -> Vec<usize> {
        self.indices_of(&epoch_order(len, seed, epoch, true))
    }

    /// This rank's share of an epoch's `order` (dataset indices; `Sampling::order`), in order:
    /// per step, its micro-batches.
    pub fn indices_of(&self, order: &[usize]) -> Vec<usize> {
        let len = order.len();
        if len == 0 {
            return Vec::new();
        }
        let n = self.steps(len) * self.accumulation * self.batch;
        (0..n).map(|p| order[self.position(p) % len]).collect()
    }
}

/// Number of real (non-padding) samples in `rank`'s shard.
pub fn shard_real_count(len: usize, rank: usize, world: usize) -> usize {
    assert!(world > 0, "shard_real_count: world size must be > 0");
    assert!(
        rank < world,
        "shard_real_count: rank {rank} must be < world size {world}"
    );
    if rank >= len {
        0
    } else {
        (len - rank).div_ceil(world)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cut(rank: usize, world: usize, accumulation: usize) -> GlobalCut {
        GlobalCut {
            rank,
            world,
            batch: 3,
            accumulation,
        }
    }

    /// The micro-batches of every step, in micro-batch order j, over all ranks.
    fn micro_batches(world: usize, accumulation: usize, len: usize) -> Vec<Vec<usize>> {
        let per_rank: Vec<Vec<usize>> = (0..world)
            .map(|r| cut(r, world, accumulation).indices(len, 7, 2))
            .collect();
        let steps = cut(0, world, accumulation).steps(len);
        let mut out = Vec::new();
        for k in 0..steps {
            for j in 0..world * accumulation {
                let (a, r) = (j / world, j % world);
                let m = k * accumulation + a;
                out.push(per_rank[r][m * 3..(m + 1) * 3].to_vec());
            }
        }
        out
    }

    /// `--ra-sampler` equals torchvision's `RASampler` on the same shuffled order: each image
    /// `reps` times in a row, `len // 256 * 256` positions, rank `r` of `world` taking
    /// `indices[r::world][:num_selected]`; and the epoch's positions are the same at any world
    /// size under `--global-batch-size`.
    #[test]
    fn ra_sampler_is_torchvisions() {
        for (len, reps, world) in [(300, 3, 1), (300, 3, 2), (1000, 4, 4), (700, 2, 8)] {
            let s = Sampling {
                ra_reps: Some(reps),
            };
            let once = epoch_order(len, 5, 1, true);
            // RASampler.__iter__, written out.
            let mut rep: Vec<usize> = once.iter().flat_map(|&i| vec![i; reps]).collect();
            let num_samples = (len * reps).div_ceil(world);
            let total = num_samples * world;
            let head: Vec<usize> = rep[..total - rep.len()].to_vec();
            rep.extend(head);
            let selected = len / 256 * 256 / world;
            let mut union = Vec::new();
            for r in 0..world {
                let want: Vec<usize> = rep[r..]
                    .iter()
                    .step_by(world)
                    .take(selected)
                    .copied()
                    .collect();
                assert_eq!(
                    s.shard(len, r, world, 5, 1),
                    want,
                    "{len} {reps} {world} {r}"
                );
                union.extend(want);
            }
            assert_eq!(union.len(), s.epoch_len(len), "{len} {reps} {world}");
        }
        let s = Sampling { ra_reps: Some(3) };
        assert_eq!(s.epoch_len(255), 0);
        let order = s.order(600, 9, 2);
        for w in [1, 2, 4] {
            let all: Vec<Vec<usize>> = (0..w)
                .map(|r| cut(r, w, 4 / w).indices_of(&order))
                .collect();
            let mut flat: Vec<usize> = all.concat();
            flat.sort_unstable();
            let mut want = order.clone();
            want.extend_from_slice(&order[..(order.len().div_ceil(12) * 12 - order.len())]);
            want.sort_unstable();
            assert_eq!(flat, want, "world {w}");
        }
    }

    #[test]
    fn the_same_micro_batches_at_any_world_size() {
        for len in [1, 11, 12, 13, 25, 40] {
            assert_eq!(micro_batches(2, 1, len), micro_batches(1, 2, len), "{len}");
            assert_eq!(micro_batches(4, 1, len), micro_batches(2, 2, len), "{len}");
            assert_eq!(micro_batches(4, 1, len), micro_batches(1, 4, len), "{len}");
            // Every sample is seen; only the last step is padded (wrapping around).
            let all: Vec<usize> = micro_batches(2, 2, len).concat();
            assert_eq!(all.len(), len.div_ceil(12) * 12);
            let mut first: Vec<usize> = all[..len].to_vec();
            first.sort_unstable();
            assert_eq!(first, (0..len).collect::<Vec<_>>());
        }
        // Positions of all ranks cover the padded epoch exactly once.
        let mut seen: Vec<usize> = (0..2)
            .flat_map(|r| (0..2 * 2 * 3 * 2).map(move |p| cut(r, 2, 2).position(p)))
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..48).collect::<Vec<_>>());
        // The order is `shard`'s shuffle: one rank with one step per batch is the permutation.
        assert_eq!(
            cut(0, 1, 1).indices(12, 7, 2),
            shard(12, 0, 1, 7, 2, true),
            "the epoch order is DistributedSampler's"
        );
    }
}
