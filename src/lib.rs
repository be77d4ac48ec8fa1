//! Shared contracts of tchrun: the job spec and its flags, defaults and ranges, log and output
//! file names, environment variables, error kinds and exit codes, and the on-disk schemas.
//! Both binaries (`tchrun`, `tchrun-worker`) call these; no name or code is written twice.
//! Architecture Invariant: this crate links neither libtorch nor MPI.

pub mod checkpoint;
pub mod counts;
pub mod csv_out;
pub mod data;
pub mod driver_log;
pub mod env;
pub mod evaluation;
pub mod exit;
pub mod files;
pub mod flags;
pub mod hostfile;
pub mod interrupt;
pub mod job_record;
pub mod lock;
pub mod metrics;
pub mod model;
pub mod overlap;
pub mod preflight;
pub mod pth;
pub mod schedule;
pub mod tensorboard;
pub mod weights;

/// tchrun's version, written into every driver log header.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
