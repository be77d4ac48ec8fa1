//! tchrun-worker as a library: everything one rank does (bootstrap, driver log, c10d process
//! group, training, scoring), used by the `tchrun-worker` binary, and `dist::init()` for Rust
//! programs that want to be a rank of a tchrun job with their own training function.
//! Architecture Invariant: nothing here spawns ranks.
pub mod checks;
pub mod comm;
pub mod export;
pub mod heartbeat;
pub mod infer;
pub mod layout;
pub mod memory;
pub mod mlflow;
pub mod models;
pub mod plot;
pub mod rank;
pub mod status;
pub mod straggler;
pub mod train;

// The paths programs of their own use (`tchrun_worker::dist::init()`, `tchrun_worker::pg`).
pub use comm::{dist, pg};

/// libtorch's random generator is global to the process: unit tests that draw from it (or
/// seed it and compare) hold this lock, so parallel tests do not interleave their draws.
#[cfg(test)]
pub(crate) static TEST_RNG: std::sync::Mutex<()> = std::sync::Mutex::new(());
