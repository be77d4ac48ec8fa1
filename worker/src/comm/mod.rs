//! The process group and its collectives: MPI bootstrap (`bootstrap`, over Open MPI loaded at
//! run time: `mpi`), the c10d shim's FFI
//! (`ffi`) and safe wrapper (`pg`: store, Gloo/NCCL group), data parallelism over it (`ddp`)
//! and `dist::init()` for programs of their own. Knows nothing of models, datasets or the
//! training loop: it moves tensors between ranks.
pub mod bootstrap;
pub mod ddp;
pub mod dist;
pub(crate) mod ffi;
pub mod mpi;
pub mod netif;
pub mod pg;
pub mod probe;
