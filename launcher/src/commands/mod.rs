//! The commands besides `train`'s attempts loop: `data` (split, pack, index), `model init`,
//! `score`/`evaluate`, `sbatch`, `sweep`, `stacks`, `status` and `doctor`. Each owns its flags and input checks
//! and starts ranks only through `plan` and `run`; none knows another command, the restart
//! policy or how a failure is read from the logs.
pub mod data;
pub mod doctor;
pub mod export;
pub mod inference;
pub mod model_init;
pub mod sbatch;
pub mod stacks;
pub mod status;
pub mod sweep;
