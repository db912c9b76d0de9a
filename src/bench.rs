//! Benchmark machinery shared by `troupe bench` and the criterion benches:
//! the workload, the plain-tokio floor, the in-process runtime runner, the
//! matrix flags and the peak-RSS probe.

pub mod floor;
pub mod matrix;
pub mod rss;
pub mod runner;
pub mod workload;

pub use workload::{WORKER_SCHEMA, WORKER_TURNS, ideal_wall};
