//! What travels over NATS between a run's coordinator and the workers: the
//! stream, consumer and bucket names, the subjects, a sibling's task, and
//! the reports a worker (or the coordinator itself) sends back. Every
//! message is JSON. No message carries a provider's key or any other
//! secret: a task names the pipeline (and its digest) and the sibling's
//! ctx, nothing about how the worker reaches its model.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::runtime::result::{StageResult, Usage};

/// The work queue of sibling tasks (work-queue retention).
pub const TASKS_STREAM: &str = "TROUPE_TASKS";
/// The durable pull consumer every worker shares.
pub const WORKERS_CONSUMER: &str = "troupe-workers";
/// Reports from workers to coordinators (kept until acknowledged by the
/// run's coordinator, so a restarted coordinator finds them).
pub const REPORTS_STREAM: &str = "TROUPE_REPORTS";
/// Key-value bucket of cancelled groups, read by a worker before it starts
/// a task it was delivered.
pub const CANCELLED_BUCKET: &str = "TROUPE_CANCELLED";
/// The key-value bucket of group contexts ([`GroupContext`]), one key
/// per group.
pub const GROUPS_BUCKET: &str = "TROUPE_GROUPS";

/// `troupe.task.<run>.<turn>`: a group's tasks (purged by this subject
/// when the group is cancelled).
pub fn task_subject(run_id: &str, turn: u64) -> String {
    format!("troupe.task.{run_id}.{turn}")
}

/// Every task of a run.
pub fn run_tasks_subject(run_id: &str) -> String {
    format!("troupe.task.{run_id}.>")
}

/// `troupe.report.<run>`: one subject per run, so a run's reports are
/// totally ordered.
pub fn report_subject(run_id: &str) -> String {
    format!("troupe.report.{run_id}")
}

/// The run's coordinator's durable consumer of its reports.
pub fn coordinator_consumer(run_id: &str) -> String {
    format!("coord-{run_id}")
}

/// `troupe.cancel.<run>` (core NATS, not stored): cancel a group's
/// siblings in flight.
pub fn cancel_subject(run_id: &str) -> String {
    format!("troupe.cancel.{run_id}")
}

/// Every run's cancel subject, for workers.
pub const CANCEL_ALL: &str = "troupe.cancel.>";

/// The cancelled-group key of `CANCELLED_BUCKET`.
pub fn cancelled_key(run_id: &str, turn: u64) -> String {
    group_key(run_id, turn)
}

/// `<run>.<turn>`: a group's key in [`GROUPS_BUCKET`].
pub fn group_key(run_id: &str, turn: u64) -> String {
    format!("{run_id}.{turn}")
}

/// One sibling to run on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub run_id: String,
    /// The session turn of the sibling's group.
    pub turn: u64,
    pub unit: usize,
    pub stage_execution_id: String,
    pub stage_id: String,
    pub index: Option<usize>,
    pub visit: u32,
    pub item: Option<Value>,
    /// The pipeline the task belongs to, and a digest of its files: a
    /// worker whose copy differs refuses the task.
    pub pipeline_id: String,
    pub digest: String,
}

/// What every sibling of a group shares, put once in [`GROUPS_BUCKET`]
/// before the group's first task: a fan-out over a long list would
/// otherwise carry the list (in the planning stage's result) in every
/// task, and workers would spend their time decoding it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupContext {
    /// The run's ctx fields.
    pub fields: Arc<Map<String, Value>>,
    /// The state slot as the group saw it when it started.
    pub slot: Arc<BTreeMap<String, Arc<StageResult>>>,
}

/// What a worker (or the coordinator) reports on a run's report subject:
/// a worker's message is a JSON array of them (a batch, see
/// [`outbox`](super::outbox)), the coordinator's barrier a single one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Adjacently tagged, the tag first: a reader decodes the body straight
// into its variant. (Internally tagged, serde buffers the whole report -
// an exited sibling's events and result - and decodes it twice; that was
// the coordinator's largest cost per sibling.)
#[serde(tag = "kind", content = "body", rename_all = "camelCase")]
pub enum Report {
    /// A worker took the task and is about to start it.
    #[serde(rename_all = "camelCase")]
    Accepted {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
    },
    /// The sibling ran to Exit; `events` are its audit events in order
    /// (the last its `StageExited`).
    #[serde(rename_all = "camelCase")]
    Exited {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        /// How many times the work queue delivered the task (above 1:
        /// a worker was lost and the sibling ran again from its start).
        delivered: u64,
        result: Arc<StageResult>,
        events: Vec<EventLine>,
    },
    /// The sibling was strictly cancelled (its `StageCancelled` is the
    /// last of `events`).
    #[serde(rename_all = "camelCase")]
    Cancelled {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        usage: Usage,
        events: Vec<EventLine>,
    },
    /// Delivered after its group was cancelled: never started.
    #[serde(rename_all = "camelCase")]
    NotStarted {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
    },
    /// The worker cannot run the task (another copy of the pipeline, an
    /// unknown pipeline, a group context it cannot read): `code` is
    /// `Distributed/PipelineMismatch` or `Distributed/GroupContextMissing`.
    #[serde(rename_all = "camelCase")]
    Refused {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        code: String,
        message: String,
    },
    /// Published by the coordinator after it marked a group cancelled:
    /// every worker that started a sibling of the group before the mark
    /// had reported `Accepted` before this.
    #[serde(rename_all = "camelCase")]
    Barrier { turn: u64 },
}

impl Report {
    /// The report's kind, as the task log (`--task-log`) names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Report::Accepted { .. } => "accepted",
            Report::Exited { .. } => "exited",
            Report::Cancelled { .. } => "cancelled",
            Report::NotStarted { .. } => "notStarted",
            Report::Refused { .. } => "refused",
            Report::Barrier { .. } => "barrier",
        }
    }

    /// The execution a report is about (`None` for a barrier).
    pub fn execution(&self) -> Option<(&str, u64, usize)> {
        match self {
            Report::Accepted {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Exited {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Cancelled {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::NotStarted {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Refused {
                stage_execution_id,
                turn,
                unit,
                ..
            } => Some((stage_execution_id, *turn, *unit)),
            Report::Barrier { .. } => None,
        }
    }
}

/// One audit event of a worker's execution, as the JSON line the worker's
/// bus wrote for it: the coordinator relays it into its own log without
/// building a JSON value of it ([`Event::from_line`]).
///
/// [`Event::from_line`]: crate::runtime::events::Event::from_line
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EventLine(pub Box<RawValue>);

impl EventLine {
    /// The line's JSON text.
    pub fn text(&self) -> &str {
        self.0.get()
    }
}

impl PartialEq for EventLine {
    fn eq(&self, other: &Self) -> bool {
        self.text() == other.text()
    }
}

/// A cancel broadcast: the group `turn` of run `run_id` is cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancel {
    pub run_id: String,
    pub turn: u64,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_as_tagged_json() {
        let report = Report::NotStarted {
            stage_execution_id: "r/w#1/1".to_owned(),
            turn: 2,
            unit: 1,
            worker: "host-1".to_owned(),
        };
        let text = serde_json::to_string(&report).expect("serializes");
        assert!(text.contains("\"kind\":\"notStarted\""), "{text}");
        let back: Report = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, report);
        assert_eq!(back.execution(), Some(("r/w#1/1", 2, 1)));
    }
}
