//! The run's interaction hub: owns the arbiter (first answer wins, the
//! other interactors' prompts are withdrawn) and the interactor set, and
//! audits every outcome (`InteractionRaised`, `InteractionAnswered`:
//! answered, late, timed out, withdrawn, no interactor); and how a run's
//! hub is started with its interactors.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use troupe_actors::{Arbiter, ArbiterCommand, EventBus, InteractionId, Unanswered};

use super::answers::AnswerRules;
use super::grants::{GrantDecision, GrantRequest};
use super::interactors::{Prompter, RuleInteractor, TerminalInteractor};
use super::messages::{Answer, Answered, InteractorHandle, Prompt, Raise, Unprompt, WithdrawOwner};
use crate::runtime::events::{Event, EventName};

/// Interaction `id` waited `--approval-timeout` without an answer.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct TimedOut(InteractionId);

/// A raised request waiting for its decision.
struct Waiting {
    request: Arc<GrantRequest>,
    /// The full arguments as JSON, for rule matching.
    args_json: Arc<str>,
    reply: oneshot::Sender<GrantDecision>,
}

/// The run's interaction hub: owns the arbiter and the interactor set.
pub struct InteractionHub {
    arbiter: Arbiter<String>,
    interactors: Vec<InteractorHandle>,
    waiting: HashMap<InteractionId, Waiting>,
    /// The last [`LATE_WINDOW`] requests answered or closed, kept for
    /// auditing late answers (oldest first in `closed_order`).
    closed: HashMap<InteractionId, Arc<GrantRequest>>,
    closed_order: VecDeque<InteractionId>,
    timeout: Option<Duration>,
    bus: EventBus<Event>,
}

impl std::fmt::Debug for InteractionHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InteractionHub")
            .field("interactors", &self.interactors.len())
            .field("open", &self.arbiter.open_count())
            .finish()
    }
}

/// How many decided interactions the hub remembers for a late answer's
/// audit record. A late answer comes from a prompt that was on screen (or
/// a delayed rule) when its interaction was decided, so it follows within
/// a few interactions; one later than this many is ignored, as an answer
/// to an unknown id is. Bounds the hub's memory over a long run.
pub const LATE_WINDOW: usize = 1024;

impl InteractionHub {
    /// Remembers a decided request for a late answer's audit, forgetting
    /// the oldest past [`LATE_WINDOW`].
    fn remember_closed(&mut self, id: InteractionId, request: Arc<GrantRequest>) {
        self.closed.insert(id, request);
        self.closed_order.push_back(id);
        while self.closed_order.len() > LATE_WINDOW {
            if let Some(old) = self.closed_order.pop_front() {
                self.closed.remove(&old);
            }
        }
    }

    /// Decided requests remembered now (at most [`LATE_WINDOW`]).
    pub fn remembered(&self) -> usize {
        self.closed.len()
    }

    pub fn new(
        interactors: Vec<InteractorHandle>,
        timeout: Option<Duration>,
        bus: EventBus<Event>,
    ) -> InteractionHub {
        InteractionHub {
            arbiter: Arbiter::new(),
            interactors,
            waiting: HashMap::new(),
            closed: HashMap::new(),
            closed_order: VecDeque::new(),
            timeout,
            bus,
        }
    }

    fn event(&self, name: EventName, request: &GrantRequest, id: InteractionId) -> Event {
        Event::new(name, request.workflow_run_id.as_str())
            .stage(
                request.stage_id.as_str(),
                request.stage_execution_id.as_str(),
            )
            .tool(request.tool.as_str())
            .with("interactionId", id)
            .with("proposalId", request.proposal_id.as_str())
    }

    fn carry_out(&mut self, cmds: Vec<ArbiterCommand<Answer>>, ctx: &mut Context<Self>) {
        for cmd in cmds {
            match cmd {
                ArbiterCommand::Ask { id, responder } => {
                    let (Some(w), Some(i)) =
                        (self.waiting.get(&id), self.interactors.get(responder))
                    else {
                        continue;
                    };
                    i.prompt.do_send(Prompt {
                        id,
                        responder,
                        request: Arc::clone(&w.request),
                        args_json: Arc::clone(&w.args_json),
                        hub: ctx.address().recipient(),
                    });
                }
                ArbiterCommand::Withdraw { id, responder } => {
                    if let Some(i) = self.interactors.get(responder) {
                        i.unprompt.do_send(Unprompt { id });
                    }
                }
                ArbiterCommand::Answered {
                    id,
                    responder,
                    answer,
                } => {
                    let by = self
                        .interactors
                        .get(responder)
                        .map_or_else(|| "?".to_owned(), |i| i.name.clone());
                    if let Some(w) = self.waiting.remove(&id) {
                        self.bus.publish(
                            self.event(EventName::InteractionAnswered, &w.request, id)
                                .with("outcome", "answered")
                                .with("answer", answer.as_str())
                                .with("by", by.as_str()),
                        );
                        let decision = match answer {
                            Answer::Approve => GrantDecision::Approved { by },
                            Answer::Deny => GrantDecision::Denied {
                                reason: format!("denied by {by}"),
                            },
                            Answer::Defer => GrantDecision::Denied {
                                reason: format!("deferred by {by}"),
                            },
                        };
                        let _ = w.reply.send(decision);
                        self.remember_closed(id, w.request);
                    }
                }
                ArbiterCommand::Unanswered { id, why } => {
                    if let Some(w) = self.waiting.remove(&id) {
                        let (outcome, reason) = match why {
                            Unanswered::NoResponder => (
                                "noInteractor",
                                "no interactor can approve it (headless)".to_owned(),
                            ),
                            Unanswered::TimedOut => (
                                "timedOut",
                                format!(
                                    "no answer within {}",
                                    self.timeout.map(|t| format!("{t:?}")).unwrap_or_default()
                                ),
                            ),
                            Unanswered::Withdrawn => {
                                ("withdrawn", "the stage execution ended".to_owned())
                            }
                        };
                        self.bus.publish(
                            self.event(EventName::InteractionAnswered, &w.request, id)
                                .with("outcome", outcome),
                        );
                        let _ = w.reply.send(GrantDecision::Denied { reason });
                        self.remember_closed(id, w.request);
                    }
                }
                ArbiterCommand::Late {
                    id,
                    responder,
                    answer,
                } => {
                    if let Some(request) = self.closed.get(&id) {
                        let by = self
                            .interactors
                            .get(responder)
                            .map_or("?", |i| i.name.as_str());
                        self.bus.publish(
                            self.event(EventName::InteractionAnswered, request, id)
                                .with("outcome", "late")
                                .with("answer", answer.as_str())
                                .with("by", by),
                        );
                    }
                }
            }
        }
    }
}

impl Actor for InteractionHub {
    type Context = Context<Self>;
}

impl Handler<Raise> for InteractionHub {
    type Result = ();

    fn handle(&mut self, msg: Raise, ctx: &mut Context<Self>) {
        let request = Arc::new(msg.request);
        let names: Vec<&str> = self.interactors.iter().map(|i| i.name.as_str()).collect();
        let mut out = Vec::new();
        let id = self.arbiter.raise(
            request.stage_execution_id.clone(),
            0..self.interactors.len(),
            &mut out,
        );
        self.bus.publish(
            self.event(EventName::InteractionRaised, &request, id)
                .with("kind", "grantStageTool")
                .with("attempt", request.attempt)
                .with("argsDigest", request.args_digest.as_str())
                .with("argsSummary", request.args_summary.as_str())
                .with("interactors", serde_json::json!(names)),
        );
        self.waiting.insert(
            id,
            Waiting {
                request,
                args_json: Arc::from(msg.args_json),
                reply: msg.reply,
            },
        );
        if self.arbiter.is_open(id)
            && let Some(timeout) = self.timeout
        {
            ctx.notify_later(TimedOut(id), timeout);
        }
        self.carry_out(out, ctx);
    }
}

impl Handler<Answered> for InteractionHub {
    type Result = ();

    fn handle(&mut self, msg: Answered, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.arbiter
            .answer(msg.id, msg.responder, msg.answer, &mut out);
        self.carry_out(out, ctx);
    }
}

impl Handler<TimedOut> for InteractionHub {
    type Result = ();

    fn handle(&mut self, msg: TimedOut, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.arbiter.time_out(msg.0, &mut out);
        self.carry_out(out, ctx);
    }
}

impl Handler<WithdrawOwner> for InteractionHub {
    type Result = ();

    fn handle(&mut self, msg: WithdrawOwner, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.arbiter
            .withdraw_owner(&msg.stage_execution_id, &mut out);
        self.carry_out(out, ctx);
    }
}

/// An interactor to start for a run.
#[derive(Clone)]
pub enum InteractorSpec {
    /// Approves everything (`--yolo`).
    Yolo,
    /// Answers by the rules of an answers file (`--answers FILE`).
    Scripted(Arc<AnswerRules>),
    /// Asks a person through `prompter` (the CLI's terminal prompt when
    /// stdin is a TTY and not `--headless`).
    Terminal(Arc<dyn Prompter>),
}

impl std::fmt::Debug for InteractorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InteractorSpec::Yolo => f.write_str("Yolo"),
            InteractorSpec::Scripted(rules) => f.debug_tuple("Scripted").field(rules).finish(),
            InteractorSpec::Terminal(_) => f.write_str("Terminal"),
        }
    }
}

/// Starts the interactors and the hub (inside an actix system).
pub fn start_hub(
    specs: &[InteractorSpec],
    timeout: Option<Duration>,
    bus: EventBus<Event>,
) -> Addr<InteractionHub> {
    let interactors = specs
        .iter()
        .map(|spec| match spec {
            InteractorSpec::Yolo => {
                let a = RuleInteractor::yolo().start();
                InteractorHandle {
                    name: "yolo".to_owned(),
                    prompt: a.clone().recipient(),
                    unprompt: a.recipient(),
                }
            }
            InteractorSpec::Scripted(rules) => {
                let name = format!("answers:{}", rules.name);
                let a = RuleInteractor::scripted((**rules).clone()).start();
                InteractorHandle {
                    name,
                    prompt: a.clone().recipient(),
                    unprompt: a.recipient(),
                }
            }
            InteractorSpec::Terminal(prompter) => {
                let a = TerminalInteractor::new(Arc::clone(prompter)).start();
                InteractorHandle {
                    name: "terminal".to_owned(),
                    prompt: a.clone().recipient(),
                    unprompt: a.recipient(),
                }
            }
        })
        .collect();
    InteractionHub::new(interactors, timeout, bus).start()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_run_remembers_only_the_last_window_of_decided_requests() {
        let mut hub = InteractionHub::new(Vec::new(), None, EventBus::new());
        let request = Arc::new(GrantRequest {
            workflow_run_id: "r".to_owned(),
            stage_execution_id: "r/s/1".to_owned(),
            stage_id: "s".to_owned(),
            attempt: 1,
            proposal_id: "p".to_owned(),
            tool: "Bash".to_owned(),
            args_digest: "d".to_owned(),
            args_summary: "{}".to_owned(),
        });
        let total = LATE_WINDOW as u64 * 3;
        for id in 1..=total {
            hub.remember_closed(id, Arc::clone(&request));
        }
        assert_eq!(hub.remembered(), LATE_WINDOW);
        // The newest are the ones kept.
        assert!(hub.closed.contains_key(&total));
        assert!(!hub.closed.contains_key(&(total - LATE_WINDOW as u64)));
    }
}
