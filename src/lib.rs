//! troupe: runs LLM agent workflows as state-machine stage pipelines on an
//! actor runtime. This crate holds the domain (definitions, runtime,
//! providers, tools) and a thin CLI; reusable actor machinery lives in
//! `troupe-actors`.
//!
//! Layers, lowest first; a module imports only its own layer and those
//! below (`tests/layering.rs` checks it): `error`, `environ`, `auditlog`,
//! `allocator` → `definition` → `provider`, `tools` → `runtime` → `store`,
//! `report`, `bench`, `distributed`, `control`, `telemetry` → `cli`.

/// `eprintln!` that never panics: a line stderr cannot take (a reader
/// that went away, a full disk) is lost, not the run. `eprintln!` panics
/// on such a write, which in a helper thread lost a run's report.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod allocator;
pub mod auditlog;
pub mod bench;
pub mod cli;
pub mod control;
pub mod definition;
pub mod distributed;
pub mod environ;
pub mod error;
pub mod provider;
pub mod report;
pub mod runtime;
pub mod store;
pub mod telemetry;
pub mod tools;
