//! Shared contracts of tchrun: the job spec and its flags, defaults and ranges, log and output
//! file names, environment variables, error kinds and exit codes, and the on-disk schemas.
//! Both binaries (`tchrun`, `tchrun-worker`) call these; no name or code is written twice.
//! Architecture Invariant: this crate links neither libtorch nor MPI.
//!
//! Below this crate: the torchvision tables (`crates/arch`, re-exported as [`arch`] and
//! [`weights`]) and the `.pth` reader (`crates/pth`, re-exported as [`pth`]). Above it, each
//! job's machinery, which writes through these contracts: the data pipeline (`crates/data`),
//! TensorBoard event files (`crates/tensorboard`), native stacks (`crates/stacks`); what only
//! one binary runs is that binary's (MLflow's client and the straggler rule the worker's; the
//! doctor's verdict, hostfiles and the failure-cause recognisers the launcher's).

// Contracts.
pub mod argv;
pub mod augment_flags;
pub mod bounded_read;
pub mod checkpoint;
pub mod class_weights;
pub mod console;
pub mod counts;
pub mod csv_out;
pub mod doctor;
pub mod driver_log;
pub mod env;
pub mod epoch_lr;
pub mod exit;
pub mod export;
pub mod files;
pub mod flags;
pub mod inference_flags;
pub mod interrupt;
pub mod job_record;
pub mod layout;
pub mod lock;
pub mod metrics;
pub mod mlflow;
pub mod model;
pub mod overlap;
pub mod recipe;
pub mod recipe_preset;
pub mod schedule;
pub mod secret;
pub mod transform_flags;
pub mod worker_flags;

// Below the contracts.
pub use tchrun_arch as arch;
pub use tchrun_arch::weights;
pub use tchrun_probe::{memory, openmpi};
pub use tchrun_pth as pth;

/// tchrun's version, written into every driver log header.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
