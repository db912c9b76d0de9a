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
    // Built by hand: one per sibling on the scheduler's thread, where
    // `format!` cost five times as much.
    let mut id = String::with_capacity(run.as_str().len() + stage.len() + 24);
    id.push_str(run.as_str());
    id.push('/');
    id.push_str(stage);
    if let Some(i) = index {
        id.push('#');
        crate::auditlog::json::push_decimal(&mut id, i as u64);
    }
    id.push('/');
    crate::auditlog::json::push_decimal(&mut id, u64::from(visit));
    id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn execution_ids_are_what_format_would_write() {
        let run = RunId::existing("01a2-run");
        for index in [
            None,
            Some(0),
            Some(9),
            Some(10),
            Some(99_999),
            Some(usize::MAX),
        ] {
            for visit in [0, 1, 10, u32::MAX] {
                let want = match index {
                    Some(i) => format!("{run}/worker#{i}/{visit}"),
                    None => format!("{run}/worker/{visit}"),
                };
                assert_eq!(stage_execution_id(&run, "worker", index, visit), want);
            }
        }
    }
}
