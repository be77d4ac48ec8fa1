//! `torch.utils.data.DistributedSampler` sharding (`drop_last=False`).
use super::*;

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
    assert!(world > 0, "shard: world size must be > 0");
    assert!(
        rank < world,
        "shard: rank {rank} must be < world size {world}"
    );
    if len == 0 {
        return Vec::new();
    }
    let mut indices: Vec<usize> = (0..len).collect();
    if shuffle {
        let mut rng = ChaCha8Rng::seed_from_u64((seed as u64).wrapping_add(epoch));
        indices.shuffle(&mut rng);
    }
    let total = len.div_ceil(world) * world;
    (rank..total)
        .step_by(world)
        .map(|p| indices[p % len])
        .collect()
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
