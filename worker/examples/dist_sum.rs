//! A Rust program that becomes a rank with `tchrun_worker::dist::init()`:
//! `tchrun exec --procs-per-node 2 -- target/release/examples/dist_sum`.
use tchrun_worker::{dist, pg::ReduceOp};

fn main() {
    let d = match dist::init() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("dist_sum: {e}");
            std::process::exit(4);
        }
    };
    // On the group's device: CUDA under NCCL (a CPU tensor there is refused by name).
    let mut t = tch::Tensor::from_slice(&[d.rank() as f32 + 1.0; 4]).to_device(d.device());
    if let Err(e) = d.pg.all_reduce(&mut [&mut t], ReduceOp::Sum) {
        eprintln!("dist_sum: {e}");
        std::process::exit(4);
    }
    let n = d.world_size() as f64;
    let sum = t.double_value(&[0]);
    println!(
        "rust rank {}/{} all_reduce sum={sum} (expected {})",
        d.rank(),
        d.world_size(),
        n * (n + 1.0) / 2.0
    );
    if sum != n * (n + 1.0) / 2.0 {
        std::process::exit(4);
    }
}
