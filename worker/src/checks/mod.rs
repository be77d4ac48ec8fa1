//! Benchmarks and self-tests of one rank: `selftest` (collectives exact, bandwidth),
//! `gradcheck` (distributed gradient = combined batch), `bench_loader` (the input pipeline
//! alone), `bench_step` (training steps alone), `doctor` (a phase of `tchrun doctor`, with
//! `node_probe`, what a node finds alone), and the commands that run them as ranks
//! (`command`). They write no model and no checkpoint.
pub mod bench_loader;
pub mod bench_step;
pub mod command;
pub mod doctor;
pub mod gradcheck;
pub mod node_probe;
pub mod selftest;
