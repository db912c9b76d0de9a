//! Run and stage-execution identifiers: a UUIDv7 run id and the
//! stable `<workflowRunId>/<stageId>[#<index>]/<visit>` execution id.

use std::fmt;
use std::sync::Arc;

/// A workflow run's id: a UUIDv7, so ids sort by start time.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(Arc<str>);

impl RunId {
    pub fn new() -> RunId {
        RunId(uuid::Uuid::now_v7().to_string().into())
    }

    /// The id of an existing run (a resumed one keeps its id).
    pub fn existing(id: &str) -> RunId {
        RunId(id.into())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The id as a shared string (events carry it without copying).
    pub fn shared(&self) -> Arc<str> {
        Arc::clone(&self.0)
    }
}

impl Default for RunId {
    fn default() -> Self {
        RunId::new()
    }
}

impl fmt::Display for RunId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// `<workflowRunId>/<stageId>[#<index>]/<visit>`; stable across a re-run so
/// it can serve as an idempotency key.
pub fn stage_execution_id(run: &RunId, stage: &str, index: Option<usize>, visit: u32) -> String {
    match index {
        Some(i) => format!("{run}/{stage}#{i}/{visit}"),
        None => format!("{run}/{stage}/{visit}"),
    }
}
