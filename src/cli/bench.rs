//! `troupe bench`: runs a pipeline offline with the scripted provider over a
//! matrix of widths, caps, per-turn latencies, threads and store on/off,
//! beside the plain-tokio floor doing the same work, and prints wall time,
//! per-sibling cost, the ratios to the floor and to the ideal, peak RSS
//! and (with `--fail-sibling`) the cancellation latency.

pub mod args;
pub mod cell;
pub mod orchestrate;
pub mod render;

pub use args::BenchArgs;
pub use orchestrate::run;
