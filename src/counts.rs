//! Range checks of the counts a user gives and of their products (`--nodes` ×
//! `--procs-per-node`, `--epochs` × steps per epoch, `--batch-size` × world size, a batch's
//! pixels): every product is computed with checked arithmetic and refused, naming the flags,
//! when it leaves the range tchrun works in, so no later arithmetic on user input can wrap or
//! saturate silently. Shared by the launcher's pre-flight and the ranks.

/// The most ranks one job may have (`--nodes` × `--procs-per-node`).
pub const MAX_WORLD_SIZE: u64 = 1 << 16;

/// The most optimizer steps one job may run (`--epochs` × steps per epoch): the step counters
/// (TensorBoard's step axis, checkpoints) stay exact in an i64 and an f64 (2^53).
pub const MAX_TOTAL_STEPS: u64 = 1 << 40;

/// The largest input batch in bytes (`--batch-size` × 3 × input size² × 4 bytes of f32): larger
/// cannot be allocated on any host (an allocation failure aborts the rank with SIGABRT).
pub const MAX_BATCH_BYTES: u64 = 1 << 40;

/// The longest duration a flag in seconds may give (`--timeout`, `--grace-period`,
/// `--hang-timeout`): a year. Longer ones overflow `Instant + Duration` (a panic) or the
/// milliseconds c10d takes (an i64).
pub const MAX_SECONDS: u64 = 365 * 24 * 3600;

/// The most decode threads one rank may start (`--loader-threads`).
pub const MAX_LOADER_THREADS: u32 = 1024;

/// "1 rank", "4 ranks": a count of ranks in words.
pub fn ranks(n: usize) -> String {
    if n == 1 {
        "1 rank".to_string()
    } else {
        format!("{n} ranks")
    }
}

/// A count or a product of counts out of range; the message names the flags and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct CountError(pub String);

/// `--nodes` × `--procs-per-node`, at most `MAX_WORLD_SIZE`.
pub fn world_size(nodes: u32, procs_per_node: u32) -> Result<u32, CountError> {
    let w = u64::from(nodes) * u64::from(procs_per_node);
    if w > MAX_WORLD_SIZE {
        return Err(CountError(format!(
            "--nodes {nodes} × --procs-per-node {procs_per_node} = {w} ranks, more than the \
             {MAX_WORLD_SIZE} tchrun runs in one job; lower --nodes or --procs-per-node"
        )));
    }
    Ok(w as u32)
}

/// The bytes of one input batch: `flag` (`--batch-size`) × 3 channels × `input_size`² × 4.
pub fn batch_bytes(flag: &str, batch: u32, input_size: u32) -> Result<u64, CountError> {
    let bytes = u64::from(batch)
        .checked_mul(3 * 4)
        .and_then(|b| b.checked_mul(u64::from(input_size) * u64::from(input_size)))
        .filter(|b| *b <= MAX_BATCH_BYTES);
    bytes.ok_or_else(|| {
        CountError(format!(
            "{flag} {batch} at input size {input_size}: one batch would be {batch} × 3 × \
             {input_size}² float32 values, more than {} GiB; lower {flag}",
            MAX_BATCH_BYTES >> 30
        ))
    })
}

/// Optimizer steps of the whole job: `--epochs` × `steps_per_epoch`, at most
/// `MAX_TOTAL_STEPS`; `--warmup-epochs` × `steps_per_epoch` is then in range too (it is
/// refused the same way when it is larger).
pub fn total_steps(
    epochs: u32,
    warmup_epochs: u32,
    steps_per_epoch: u64,
) -> Result<u64, CountError> {
    let check = |flag: &str, n: u32| {
        u64::from(n)
            .checked_mul(steps_per_epoch)
            .filter(|t| *t <= MAX_TOTAL_STEPS)
            .ok_or_else(|| {
                CountError(format!(
                    "{flag} {n} × {steps_per_epoch} steps per epoch is more than the \
                     {MAX_TOTAL_STEPS} optimizer steps one job runs; lower {flag}"
                ))
            })
    };
    check("--warmup-epochs", warmup_epochs)?;
    check("--epochs", epochs)
}

/// Images of one optimizer step over all ranks: `--global-batch-size` when given, else
/// `--batch-size` × world size (in u64: it cannot overflow).
pub fn images_per_step(batch: u32, world: u32, global: Option<u32>) -> u64 {
    global.map_or(u64::from(batch) * u64::from(world), u64::from)
}

/// `--global-batch-size G`'s epoch over `n` training images: padded (with copies) to whole
/// optimizer steps of G images, which each rank holds as a list of positions. Refused, naming
/// the flag and the fix, when G is more than twice the images (more than half of every step
/// would be copies: `--global-batch-size 4294967280` on 120 images made each rank list four
/// billion positions, 10.8 GB and growing); fewer images than one step, up to twice, is one
/// partial step (a warning of the pre-flight). Returns the padded positions of an epoch.
pub fn padded_epoch(global: u32, n: u64) -> Result<u64, CountError> {
    let g = u64::from(global);
    let positions = n.div_ceil(g.max(1)).checked_mul(g);
    match positions {
        Some(p) if g <= n.saturating_mul(2) => Ok(p),
        _ => Err(CountError(format!(
            "--global-batch-size {global} is more than twice the {n} training image(s): every \
             optimizer step would train each image {} times over (the step is filled with \
             copies); lower --global-batch-size to {n} or less, or add images",
            g / n.max(1)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_rank_is_singular() {
        assert_eq!(
            (ranks(1), ranks(0), ranks(4)),
            ("1 rank".into(), "0 ranks".into(), "4 ranks".into())
        );
    }

    #[test]
    fn products_are_refused_not_wrapped() {
        assert_eq!(world_size(4, 8), Ok(32));
        let e = world_size(u32::MAX, u32::MAX).unwrap_err().0;
        assert!(
            e.contains("--nodes 4294967295 × --procs-per-node 4294967295"),
            "{e}"
        );
        assert!(world_size(65_536, 1).is_ok() && world_size(65_537, 1).is_err());
        assert_eq!(batch_bytes("--batch-size", 8, 32), Ok(8 * 3 * 32 * 32 * 4));
        let e = batch_bytes("--batch-size", u32::MAX, 1024).unwrap_err().0;
        assert!(
            e.starts_with("--batch-size 4294967295 at input size 1024"),
            "{e}"
        );
        assert_eq!(total_steps(5, 1, 10), Ok(50));
        assert_eq!(padded_epoch(32, 20), Ok(32));
        assert_eq!(padded_epoch(64, 100), Ok(128));
        let e = padded_epoch(4_294_967_280, 120).unwrap_err().0;
        assert!(
            e.starts_with("--global-batch-size 4294967280 is more than twice the 120")
                && e.contains("lower --global-batch-size to 120 or less"),
            "{e}"
        );
        assert!(padded_epoch(41, 20).is_err() && padded_epoch(40, 20).is_ok());
        assert!(padded_epoch(8, 0).is_err());
        let e = total_steps(u32::MAX, 0, u64::MAX).unwrap_err().0;
        assert!(e.starts_with("--epochs 4294967295"), "{e}");
        let e = total_steps(1, u32::MAX, 1 << 20).unwrap_err().0;
        assert!(e.starts_with("--warmup-epochs"), "{e}");
        assert_eq!(
            images_per_step(u32::MAX, u32::MAX, None),
            (u32::MAX as u64).pow(2)
        );
    }
}
