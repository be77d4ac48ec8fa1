//! What a node's operating system says, read without loading anything and without knowing
//! tchrun's jobs: `memory` (a process's memory and its cgroup's limit), `cpu` (the cores other
//! processes keep busy now), `openmpi` (where Open MPI is). Below the contracts: the root crate
//! re-exports `memory` and `openmpi`, and `tchrun::env::busy_cores` is `cpu::busy_cores`.

pub mod cpu;
pub mod memory;
pub mod openmpi;
