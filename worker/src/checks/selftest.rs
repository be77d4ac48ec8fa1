//! `tchrun-worker selftest`: exact checks of all-reduce, broadcast, all-gather and barrier
//! across all ranks, then all-reduce bus bandwidth per message size (nccl-tests' busbw:
//! algbw × 2(n-1)/n), printed as a table by rank 0.
use crate::comm::pg::{C10dError, ProcessGroup, ReduceOp};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// One row of the bandwidth table.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BandwidthRow {
    pub bytes: usize,
    pub iters: usize,
    pub time_us: f64,
    pub algbw_gbs: f64,
    pub busbw_gbs: f64,
}

/// Outcome of the correctness checks: names of the checks that failed on this rank. Tensors
/// live on the group's device (CUDA under NCCL).
pub fn check_collectives(pg: &ProcessGroup) -> Result<Vec<String>, C10dError> {
    let device = pg.device();
    let n = pg.size() as i64;
    let r = pg.rank() as i64;
    let mut failed = Vec::new();
    let opts = (Kind::Float, device);

    // all-reduce sum / avg / max on floats and a sum on int64.
    let mut t = Tensor::full([1024], (r + 1) as f64, opts);
    pg.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
    expect_all(&t, (n * (n + 1) / 2) as f64, "all_reduce(sum)", &mut failed);
    let mut t = Tensor::full([1024], (r + 1) as f64, opts);
    pg.all_reduce(&mut [&mut t], ReduceOp::Avg)?;
    // Within a few ulps: Gloo sums then divides (exact here), NCCL multiplies by a rounded
    // 1/n first (at 6 ranks, 1..6 may average to 3.5000002). SUM stays exact.
    expect_close(&t, (n + 1) as f64 / 2.0, "all_reduce(avg)", &mut failed);
    let mut t = Tensor::full([17], r as f64, opts);
    pg.all_reduce(&mut [&mut t], ReduceOp::Max)?;
    expect_all(&t, (n - 1) as f64, "all_reduce(max)", &mut failed);
    let mut t = Tensor::full([33], (1i64 << 40) + r, (Kind::Int64, device));
    pg.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
    let want = n * (1i64 << 40) + n * (n - 1) / 2;
    if t.ne(want).any().int64_value(&[]) != 0 {
        failed.push(format!("all_reduce(sum, int64): expected {want}"));
    }

    // broadcast from the last rank: every rank must hold root's values.
    let root = pg.size() - 1;
    let mut t = if r as usize == root {
        Tensor::arange(4096, opts) * 3.0
    } else {
        Tensor::zeros([4096], opts)
    };
    pg.broadcast(&mut [&mut t], root)?;
    let want = Tensor::arange(4096, opts) * 3.0;
    if !t.equal(&want) {
        failed.push(format!("broadcast(root={root})"));
    }

    // all-gather: rank k contributes k*100 + [0, 1, 2, 3, 4].
    let input = Tensor::arange(5, opts) + (r * 100) as f64;
    let outs = pg.all_gather(&input)?;
    for (k, o) in outs.iter().enumerate() {
        let want = Tensor::arange(5, opts) + (k as i64 * 100) as f64;
        if !o.equal(&want) {
            failed.push(format!("all_gather(slot {k})"));
        }
    }

    pg.barrier()?;
    Ok(failed)
}

/// Ulps of float32 an averaged value may be off by.
const AVG_ULPS: f32 = 4.0;

/// Whether `got` is within `AVG_ULPS` float32 ulps of `want`.
pub fn avg_close(got: f32, want: f32) -> bool {
    let ulp = f32::EPSILON * want.abs().max(f32::MIN_POSITIVE);
    (got - want).abs() <= AVG_ULPS * ulp
}

fn expect_close(t: &Tensor, value: f64, name: &str, failed: &mut Vec<String>) {
    let got = Vec::<f32>::try_from(t.flatten(0, -1).to_device(Device::Cpu)).unwrap_or_default();
    if let Some(bad) = got.iter().find(|g| !avg_close(**g, value as f32)) {
        failed.push(format!(
            "{name}: expected {value} within {AVG_ULPS} ulps, got {bad}"
        ));
    } else if got.is_empty() {
        failed.push(format!("{name}: no values to check"));
    }
}

fn expect_all(t: &Tensor, value: f64, name: &str, failed: &mut Vec<String>) {
    let ok = t.eq(value).all().int64_value(&[]) != 0;
    if !ok {
        let got = t.flatten(0, -1).get(0).double_value(&[]);
        failed.push(format!("{name}: expected {value}, got {got}"));
    }
}

/// Agrees across ranks: total failures of all ranks.
pub fn total_failures(pg: &ProcessGroup, mine: usize) -> Result<i64, C10dError> {
    let mut t = Tensor::from_slice(&[mine as i64]).to_device(pg.device());
    pg.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
    Ok(t.int64_value(&[0]))
}

/// All-reduce bandwidth for each size (bytes, float32 messages).
pub fn bandwidth(
    pg: &ProcessGroup,
    sizes: &[usize],
    iters: usize,
) -> Result<Vec<BandwidthRow>, C10dError> {
    let device = pg.device();
    let n = pg.size() as f64;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let elems = (bytes / 4).max(1) as i64;
        let mut t = Tensor::ones([elems], (Kind::Float, device));
        for _ in 0..2 {
            pg.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
        }
        pg.barrier()?;
        let start = Instant::now();
        for _ in 0..iters {
            pg.all_reduce(&mut [&mut t], ReduceOp::Sum)?;
        }
        if device.is_cuda() {
            tch::Cuda::synchronize(device_index(device));
        }
        let mine = start.elapsed().as_secs_f64() / iters as f64;
        // The slowest rank defines the time (as nccl-tests reports).
        let mut slowest = Tensor::from_slice(&[mine]).to_device(device);
        pg.all_reduce(&mut [&mut slowest], ReduceOp::Max)?;
        let secs = slowest.double_value(&[0]);
        let actual = elems as usize * 4;
        let algbw = actual as f64 / secs / 1e9;
        let busbw = if n > 1.0 {
            algbw * 2.0 * (n - 1.0) / n
        } else {
            algbw
        };
        rows.push(BandwidthRow {
            bytes: actual,
            iters,
            time_us: secs * 1e6,
            algbw_gbs: algbw,
            busbw_gbs: busbw,
        });
    }
    Ok(rows)
}

fn device_index(d: Device) -> i64 {
    match d {
        Device::Cuda(i) => i as i64,
        _ => 0,
    }
}

/// Human-readable size: 1024 → "1 KiB".
pub fn human_bytes(b: usize) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if v.fract() == 0.0 {
        format!("{v} {}", UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

/// The table rank 0 prints.
pub fn format_table(rows: &[BandwidthRow], world: usize, backend: &str) -> String {
    let mut s = format!(
        "all-reduce bandwidth ({backend}, {}, float32, sum)\n",
        tchrun::counts::ranks(world)
    );
    s.push_str(&format!(
        "{:>10} {:>7} {:>12} {:>12} {:>12}\n",
        "size", "iters", "time (us)", "algbw GB/s", "busbw GB/s"
    ));
    for r in rows {
        s.push_str(&format!(
            "{:>10} {:>7} {:>12.1} {:>12.3} {:>12.3}\n",
            human_bytes(r.bytes),
            r.iters,
            r.time_us,
            r.algbw_gbs,
            r.busbw_gbs
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn avg_check_allows_a_few_ulps_and_no_more() {
        // NCCL's AVG at 6 ranks: (1 + ... + 6) * fl(1/6).
        let nccl = (1..=6).map(|v| v as f32).sum::<f32>() * (1.0f32 / 6.0);
        assert!(avg_close(nccl, 3.5), "{nccl}");
        assert!(avg_close(3.500_000_2, 3.5));
        assert!(avg_close(3.5, 3.5));
        assert!(!avg_close(3.5001, 3.5));
        assert!(!avg_close(f32::NAN, 3.5));
        assert!(avg_close(1.0, 1.0) && !avg_close(1.0 + 8.0 * f32::EPSILON, 1.0));
    }
}
