//! `<output>/checkpoints/last.json`: the contract between rank 0, which writes checkpoints, and
//! everything that reads them: the ranks of a `--resume`, the launcher's pre-flight (before any
//! rank starts) and its restart loop. `Last` is the file; `RunRecord` the model, data and flags
//! that define the run, so that a resume with another model, dataset or recipe is refused
//! naming both values instead of continuing silently; `check` is the one decision of what a
//! training job does with the checkpoint it finds (resume, refuse, nothing to do); `verify`
//! checks the tensor files without libtorch (header and size), so damage is found before launch.

mod last;
mod resume;
mod run_record;
pub use last::{
    best_file, dir, last_json, parse, read, valid_name, verify_tensors, CheckpointError, Last,
    LossScalerState, FORMAT_VERSION, LEGACY_BEST,
};
pub use resume::{check, Decision, ResumeError};
pub use run_record::{Mismatch, RunRecord};
