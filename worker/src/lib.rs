//! tchrun-worker as a library: everything one rank does (bootstrap, driver log, c10d process
//! group, training, scoring), used by the `tchrun-worker` binary, and `dist::init()` for Rust
//! programs that want to be a rank of a tchrun job with their own training function.
//! Architecture Invariant: nothing here spawns ranks.
pub mod bench_loader;
pub mod bench_step;
pub mod bootstrap;
pub mod checkpoint;
pub mod confusion;
pub mod ddp;
pub mod densenet;
pub mod dist;
pub mod driver_log;
mod ffi;
pub mod gradcheck;
pub mod logits;
pub mod models;
pub mod optim;
pub mod outputs;
pub mod pg;
pub mod plot;
pub mod resnet;
pub mod score;
pub mod selftest;
pub mod signals;
pub mod train;

/// libtorch's random generator is global to the process: unit tests that draw from it (or
/// seed it and compare) hold this lock, so parallel tests do not interleave their draws.
#[cfg(test)]
pub(crate) static TEST_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
