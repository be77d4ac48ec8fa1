//! Shared contracts of tchrun: the job spec and its flags, defaults and ranges, log and output
//! file names, environment variables, error kinds and exit codes, and the on-disk schemas.
//! Both binaries (`tchrun`, `tchrun-worker`) call these; no name or code is written twice.
//! Architecture Invariant: this crate links neither libtorch nor MPI.
//!
//! The modules below are in two groups. The contracts: what both sides must agree on (a name, a
//! schema, a decision). The machinery: code both sides run that agrees on nothing by itself
//! (TensorBoard event files, native stacks); it is here only so that both binaries share one
//! copy. Below this crate: the torchvision tables (`crates/arch`, re-exported as [`arch`] and
//! [`weights`]) and the `.pth` reader (`crates/pth`, re-exported as [`pth`]). Above it: the data
//! pipeline (`crates/data`, `tchrun-data`), which writes through these contracts.

// Contracts.
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
pub mod faults;
pub mod files;
pub mod flags;
pub mod hostfile;
pub mod install;
pub mod interrupt;
pub mod job_record;
pub mod kernel_log;
pub mod layout;
pub mod lock;
pub mod memory;
pub mod metrics;
pub mod model;
pub mod openmpi;
pub mod overlap;
pub mod prometheus;
pub mod recipe;
pub mod recipe_preset;
pub mod schedule;
pub mod secret;
pub mod straggler;
pub mod transform_flags;

// Machinery (no contract of its own).
pub mod mlflow;
pub mod stacks;
pub mod tensorboard;
pub use tchrun_arch as arch;
pub use tchrun_arch::weights;
pub use tchrun_pth as pth;

/// tchrun's version, written into every driver log header.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
