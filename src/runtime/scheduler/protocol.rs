//! The scheduler's protocol: what executions and the session tell the
//! scheduler ([`ToScheduler`]), how an execution ended ([`StageOutcome`]),
//! which execution a message is about ([`ExecKey`]), and the reasons the
//! scheduler's decisions are recorded with.
//!
//! Every message carries the execution's identity; the scheduler never
//! guesses which execution a report belongs to.

use std::sync::Arc;

use actix::Message;

use crate::runtime::result::{Kept, Usage};
use crate::runtime::summary::RunReport;

pub use crate::runtime::cancel::TURN_CANCELLED;

/// Which execution of a session turn a message is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// The one stage of a sequential turn.
    Sequential,
    /// Sibling `n` of the turn's parallel group.
    Unit(usize),
    /// The join of the turn's parallel group.
    Join,
}

/// One execution: the session turn it belongs to, its place in the turn,
/// its `stageExecutionId` and its stage.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ExecKey {
    pub turn: u64,
    pub slot: Slot,
    pub id: Arc<str>,
    pub stage: Arc<str>,
}

/// How an execution ended.
#[derive(Debug)]
pub enum StageOutcome {
    /// Exit ran (verdict ok, fail or skipped) and `StageExited` was
    /// published with `seq`: the order of Exits, whatever the order the
    /// reports arrive in. A sibling's result comes packed, but on a
    /// worker (which sends it on at once).
    Exited { result: Kept, seq: u64 },
    /// Strictly cancelled after it started: no Exit. `usage` is what its
    /// model requests had used by then.
    Cancelled { usage: Usage },
    /// Cancelled (fail-fast, Ctrl-C, a limit) before it began: it never
    /// started, though the scheduler counted it running from its spawn.
    CancelledBeforeStart,
}

/// What the scheduler is told: by executions (their reports), by the
/// session (Ctrl-C) and by the run's limits. (A sibling does not ask to
/// start: the scheduler records its start as it spawns it.)
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub enum ToScheduler {
    /// An execution ended.
    Report {
        exec: ExecKey,
        outcome: StageOutcome,
    },
    /// Cancel the run strictly (the first Ctrl-C or signal).
    CancelRun,
    /// A limit of the run was reached (`--max-run-time`, the budget, a
    /// store that cannot write): cancel it strictly, like Ctrl-C, and end
    /// it as failed with `reason` (`Class/Code: message`).
    LimitReached { reason: String },
    /// Letters posted together ([`super::post::gathered`]: the reports of
    /// one committed batch), handled one by one in this order; what they
    /// free room for is started once all of them are handled.
    Batch(Vec<ToScheduler>),
}

/// Sent to the scheduler's owner (the session) when the run is over.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RunFinished(pub RunReport);

/// The name fail-fast gives a sibling, as in `ParallelSiblingFailure`:
/// `worker#3` for a map sibling, the stage id for a static one (which has
/// no index).
pub fn sibling_label(stage_id: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{stage_id}#{i}"),
        None => stage_id.to_owned(),
    }
}

/// The `StageCancelled` reason of a sibling cancelled because `sibling`
/// (its label, e.g. `worker#3`) failed.
pub fn sibling_failed_reason(sibling: &str) -> String {
    format!("ExtensionHost/ParallelSiblingFailure: sibling {sibling} failed")
}
