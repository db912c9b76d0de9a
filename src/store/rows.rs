//! The store's rows as troupe reads them: a run, one execution, a run's
//! counts by outcome.

use serde::Serialize;
use serde_json::Value;

use crate::provider::Usage;
use crate::runtime::result::Verdict;

/// A run as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunRow {
    pub id: String,
    pub pipeline_id: String,
    /// The pipeline folder it was started from.
    pub pipeline_dir: String,
    /// `sha256:…` of the pipeline's files when it started.
    pub digest: String,
    pub ctx: Value,
    pub cap: u64,
    /// The run's folder: `audit.jsonl` and the run's lock.
    pub run_dir: String,
    /// `running`, `ok`, `failed` or `cancelled` as written; a `running`
    /// run whose process is gone reads as `interrupted`.
    pub status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Unix milliseconds.
    pub started_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ended_at: Option<i64>,
    /// The run's summary (`troupe run --json` without the results), once
    /// a session of it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub summary: Option<Value>,
    /// How many processes ran it (1 + resumes).
    pub sessions: u64,
}

/// Executions of a run by how they ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Counts {
    pub ok: u64,
    pub failed: u64,
    pub skipped: u64,
    pub cancelled: u64,
}

impl Counts {
    /// Counts one execution that ended as `end` says: its verdict, or
    /// `None` when it was cancelled.
    pub fn count(&mut self, end: Option<Verdict>) {
        match end {
            Some(Verdict::Ok) => self.ok += 1,
            Some(Verdict::Skipped) => self.skipped += 1,
            Some(Verdict::Fail) => self.failed += 1,
            None => self.cancelled += 1,
        }
    }
}

/// One stage execution as the store keeps it: its result once it exited,
/// where it was once it was cancelled.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExecRow {
    pub stage_execution_id: String,
    pub stage_id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<u64>,
    pub visit: u32,
    /// `exited` or `cancelled`.
    pub outcome: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub verdict: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub attempts: u32,
    pub cap_hit: bool,
    /// Where a cancelled execution was: phase, turn, tool calls in flight.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub turn: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Value>,
    pub usage: Usage,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub entered_at: Option<i64>,
    pub ended_at: i64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parsed: Option<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<Value>,
}

impl ExecRow {
    /// Milliseconds from entry to end, when the entry time is known.
    pub fn duration_ms(&self) -> Option<i64> {
        self.entered_at
            .filter(|e| *e > 0)
            .map(|e| (self.ended_at - e).max(0))
    }
}
