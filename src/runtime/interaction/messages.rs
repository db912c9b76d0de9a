//! The messages of an approval, by direction: to the hub (a stage raises
//! a request, an interactor answers, a stage execution withdraws its
//! requests) and to an interactor (put a prompt to it, take it away), with
//! an interactor's answer and the handle the hub reaches an interactor by.

use std::sync::Arc;

use actix::prelude::*;
use tokio::sync::oneshot;
use troupe_actors::{InteractionId, ResponderId};

use super::grants::{GrantDecision, GrantRequest};

/// An interactor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approve,
    Deny,
    /// Not now: treated as a denial of this proposal.
    Defer,
    /// Approve, and every later proposal of this run with the same tool
    /// and arguments (the interactor answers those itself).
    ApproveSame,
    /// Approve, and every later `Bash` proposal of this run whose command
    /// runs the same program and chains, substitutes or redirects nothing.
    ApprovePrefix,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::Deny => "deny",
            Answer::Defer => "defer",
            Answer::ApproveSame => "approve-same",
            Answer::ApprovePrefix => "approve-prefix",
        }
    }
}

// To the hub.

/// Raise a `grantStageTool` interaction; the decision arrives on `reply`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Raise {
    pub request: GrantRequest,
    /// The full arguments as JSON, for rule matching.
    pub args_json: String,
    pub reply: oneshot::Sender<GrantDecision>,
}

/// An interactor's answer to interaction `id`. The hub replies whether
/// it decided the interaction (`true`), or came after another
/// interactor's answer, a timeout or a withdrawal (`false`, audited as
/// late): an interactor that tells its client "done" asks and waits.
#[derive(Debug, Message)]
#[rtype(result = "bool")]
pub struct Answered {
    pub id: InteractionId,
    pub responder: ResponderId,
    pub answer: Answer,
    /// The rule that answered, when no one was asked: a remembered answer
    /// (`approve-same: …`) or a rule of an answers file (`answers.yaml#2`).
    pub rule: Option<Arc<str>>,
}

/// Interactor `responder` will never answer interaction `id`: its input
/// went away before an answer, or the prompt was withdrawn and no answer
/// of its is on the way. Every prompt an interactor is given ends with
/// its `Answered` or its `Released` (or both), so the hub knows when a
/// late answer can no longer come and forgets the interaction.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Released {
    pub id: InteractionId,
    pub responder: ResponderId,
}

/// Answered once every message sent to the hub before it was handled: the
/// run's end waits for it, so that the withdrawals of the executions that
/// just stopped are in the log before its `WorkflowExit`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Settle;

/// A stage execution ended: withdraw its open interactions everywhere.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WithdrawOwner {
    pub stage_execution_id: String,
}

// To an interactor.

/// Put interaction `id` to an interactor.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Prompt {
    pub id: InteractionId,
    pub responder: ResponderId,
    pub request: Arc<GrantRequest>,
    pub args_json: Arc<str>,
    pub hub: Recipient<Answered>,
    pub release: Recipient<Released>,
}

/// Take interaction `id`'s prompt away from an interactor, which answers
/// with [`Released`] once no answer of its can follow.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Unprompt {
    pub id: InteractionId,
    pub responder: ResponderId,
    pub release: Recipient<Released>,
}

/// An interactor as the hub knows it.
#[derive(Debug, Clone)]
pub struct InteractorHandle {
    pub name: String,
    pub prompt: Recipient<Prompt>,
    pub unprompt: Recipient<Unprompt>,
}
