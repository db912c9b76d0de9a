//! The run store: one SQLite file per project (`.troupe/troupe.db`) with
//! every run, every stage execution and every StageResult, so a run
//! survives its process (resume without re-running finished work) and can
//! be browsed afterwards. See ARCHITECTURE.md for how it and the audit log
//! stay consistent.

mod checkpoint;
pub mod db;
pub mod digest;
pub mod error;
pub mod lock;
pub mod pack;
pub mod records;
pub mod repair;
pub mod rows;
pub mod schema;
pub mod writer;

pub use db::Store;
pub use digest::pipeline_digest;
pub use error::StoreError;
pub use lock::RunLock;
pub use pack::unix_ms;
pub use rows::{Counts, ExecRow, RunRow};
pub use writer::{StoreLedger, StoreWriter};
