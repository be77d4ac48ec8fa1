//! The launcher's pure parts, a library so that the integration tests call them too: the
//! hostfile, the doctor's verdict, the failure-cause recognisers and the kernel log they read,
//! and the install check. The `tchrun` binary (`main.rs`) is the rest.
pub mod hostfile;
pub mod install;
pub mod kernel_log;
pub mod recognise;
pub mod verdict;
