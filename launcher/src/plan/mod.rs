//! Planning, before anything starts: the launch flags, the hosts and the GPUs checked into one
//! validated `Plan`, and the exact command lines it gives (mpirun, srun, local ranks); the
//! pre-flight helpers every command shares (absolute paths, writable outputs, overlap, job
//! locks). Must not know how processes are spawned or supervised, what a rank's log says, or
//! what any one command does with its plan.
pub mod gpus;
pub mod launch;
pub mod preflight;
pub mod slurm_flags;
