//! One rank's life around its work: `start` (identity, device and backend, job locks, the
//! driver log, joining the store, the process group; leaving; the fatal error and its exit
//! code), `driver_log` (fd 1/2 captured into `70_driver_log_<rank>`),
//! `signals` (stop requests), `exec` (a program of the user's as the rank) and `output` (its
//! output read into the driver log and the console). Knows what a rank is, not what it
//! computes.
pub mod driver_log;
pub mod exec;
pub mod output;
pub mod signals;
pub mod start;
