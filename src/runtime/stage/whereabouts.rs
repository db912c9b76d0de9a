//! Where a running execution is (phase, attempt, turn, the tool calls in
//! flight) and what it holds and has used: shared between the execution
//! and the actor that owns it, which records it if the execution is
//! cancelled.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use crate::provider::Usage;
use crate::runtime::interaction::GrantLedger;

/// Where the execution is, for the `StageCancelled` record.
#[derive(Debug, Clone, Default)]
pub struct Whereabouts {
    pub phase: &'static str,
    pub attempt: u32,
    pub turn: u32,
    pub tool_calls: Vec<(Arc<str>, Arc<str>)>,
    /// One-shot grant tokens of this execution; they die with it. Made on
    /// the first call outside `allowedTools`: most executions never have one.
    pub grants: Option<Rc<RefCell<GrantLedger>>>,
    /// Whether this execution ever put a call to the interactors, so a
    /// cancelled one that never did has no prompts to withdraw.
    pub raised: bool,
    /// A human step's question is open: a cancelled execution records it
    /// withdrawn (`InteractionAnswered`), as its approvals are.
    pub question: bool,
    /// What its model requests used so far (a cancelled execution reports
    /// it, so the run's totals include it). A try counts as a request as
    /// it is sent, so one cut off by a cancel or the stage's timeout does.
    pub usage: Usage,
    /// The turn of the model request in flight, if one is: a stage timed
    /// out meanwhile records that try's end (`ProviderRequestFailed`).
    pub requesting: Option<u32>,
}
