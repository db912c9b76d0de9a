//! The ledger seam: where a stage execution's end is made durable. The
//! runtime defines what it hands over; the run store implements it.
//!
//! The rule it carries: an execution's `StageExited` is published only
//! after its [`ExitRecord`] is durable, so a result the audit log (or the
//! `--events` stream) shows as exited is never run again, whatever happens
//! to the process afterwards. A cancellation's record is not on that path:
//! a cancelled execution runs again when the run is resumed, so its
//! [`CancelRecord`] is written when it can be.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;

use super::result::Kept;
use crate::provider::Usage;

/// A finished execution: its result and the `StageExited` record it will
/// publish once this is durable.
#[derive(Debug, Clone)]
pub struct ExitRecord {
    pub run_id: Arc<str>,
    pub stage_execution_id: Arc<str>,
    pub stage_id: Arc<str>,
    /// The map index of a sibling.
    pub index: Option<usize>,
    pub visit: u32,
    pub result: Kept,
    pub entered_at: SystemTime,
    pub exited_at: SystemTime,
}

/// A strictly cancelled execution, as `StageCancelled` records it.
#[derive(Debug, Clone)]
pub struct CancelRecord {
    pub run_id: Arc<str>,
    pub stage_execution_id: Arc<str>,
    pub stage_id: Arc<str>,
    pub index: Option<usize>,
    pub visit: u32,
    pub reason: Arc<str>,
    pub phase: &'static str,
    pub attempt: u32,
    pub turn: u32,
    /// The tool calls in flight, `{callId, tool}`.
    pub tool_calls: Value,
    pub usage: Usage,
    pub entered_at: SystemTime,
    pub cancelled_at: SystemTime,
}

/// Why a record could not be made durable (`Class/Code: message`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct LedgerError(pub String);

/// What runs once a record is durable (or could not be made so), on the
/// ledger's own thread: the execution's `StageExited` and its report, so
/// the stage actor does not wait for the commit.
pub type AfterCommit = Box<dyn FnOnce(Result<(), LedgerError>) + Send>;

/// Where executions' ends are made durable (the run store).
pub trait Ledger: Send + Sync + std::fmt::Debug {
    /// Makes `record` durable, then calls `then` (when given) with the
    /// outcome. Records of many executions are written together (one
    /// transaction per batch), so a wide fan-out commits in batches; a
    /// record handed over without `then` (a failed execution, which a
    /// resumed run runs again anyway) is written all the same.
    fn persist(&self, record: ExitRecord, then: Option<AfterCommit>);

    /// Records a cancellation (best effort, not waited for).
    fn cancelled(&self, record: CancelRecord);
}
