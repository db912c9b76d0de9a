//! troupe: runs LLM agent workflows as state-machine stage pipelines on an
//! actor runtime. This crate holds the domain (definitions, runtime,
//! providers, tools) and a thin CLI; reusable actor machinery lives in
//! `troupe-actors`.
//!
//! Layers, lowest first; a module imports only its own layer and those
//! below (`tests/layering.rs` checks it): `error`, `environ`, `auditlog`,
//! `allocator` → `definition` → `provider`, `tools` → `runtime` → `store`,
//! `report`, `bench`, `distributed`, `control`, `telemetry` → `cli`.

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
