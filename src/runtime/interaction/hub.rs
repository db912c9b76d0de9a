//! The run's interaction hub: owns the arbiter (first answer wins, the
//! other interactors' prompts are withdrawn) and the interactor set, and
//! audits every outcome (`InteractionRaised`, `InteractionAnswered`:
//! answered, late, timed out, withdrawn, abandoned, no interactor); and
//! how a run's hub is started with its interactors.
//!
//! A decided interaction is remembered (to audit a late answer) only while
//! an interactor it was withdrawn from may still answer: each one ends
//! with its late answer or its `Released`, and the last one forgets it. So
//! the hub holds the open interactions plus those still showing on some
//! interactor, however long the run.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use troupe_actors::{Arbiter, ArbiterCommand, EventBus, InteractionId, ResponderId, Unanswered};

use super::answers::AnswerRules;
use super::grants::{GrantDecision, GrantRequest};
use super::interactors::{Prompter, RuleInteractor, TerminalInteractor};
use super::messages::{
    Answer, Answered, InteractorHandle, Prompt, Raise, Released, Unprompt, WithdrawOwner,
};
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

/// A decided request an interactor may still answer late.
struct Closed {
    request: Arc<GrantRequest>,
    /// Interactors whose prompt was withdrawn and who have not yet
    /// answered late or released it.
    holders: BTreeSet<ResponderId>,
}

/// The run's interaction hub: owns the arbiter and the interactor set.
pub struct InteractionHub {
    arbiter: Arbiter<String>,
    interactors: Vec<InteractorHandle>,
    waiting: HashMap<InteractionId, Waiting>,
    /// Decided requests kept for auditing late answers, while someone may
    /// still give one.
    closed: HashMap<InteractionId, Closed>,
    timeout: Option<Duration>,
    bus: EventBus<Event>,
    /// The rule behind an answer on its way through the arbiter, for the
    /// audit line (an answer not given by a person).
    rules: HashMap<(InteractionId, ResponderId), Arc<str>>,
}

impl std::fmt::Debug for InteractionHub {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InteractionHub")
            .field("interactors", &self.interactors.len())
            .field("open", &self.arbiter.open_count())
            .finish()
    }
}

impl InteractionHub {
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
            rules: HashMap::new(),
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
                        release: ctx.address().recipient(),
                    });
                }
                ArbiterCommand::Withdraw { id, responder } => {
                    if let Some(i) = self.interactors.get(responder) {
                        if let Some(c) = self.closed.get_mut(&id) {
                            c.holders.insert(responder);
                        }
                        i.unprompt.do_send(Unprompt {
                            id,
                            responder,
                            release: ctx.address().recipient(),
                        });
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
                        let mut event = self
                            .event(EventName::InteractionAnswered, &w.request, id)
                            .with("outcome", "answered")
                            .with("answer", answer.as_str())
                            .with("by", by.as_str());
                        if let Some(rule) = self.rules.remove(&(id, responder)) {
                            event = event.with("rule", rule);
                        }
                        self.bus.publish(event);
                        let decision = match answer {
                            Answer::Approve | Answer::ApproveSame | Answer::ApprovePrefix => {
                                GrantDecision::Approved { by }
                            }
                            Answer::Deny => GrantDecision::Denied {
                                reason: format!("denied by {by}"),
                            },
                            Answer::Defer => GrantDecision::Denied {
                                reason: format!("deferred by {by}"),
                            },
                        };
                        let _ = w.reply.send(decision);
                        self.closed.insert(id, Closed::new(w.request));
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
                            Unanswered::Abandoned => (
                                "abandoned",
                                "every interactor asked went away without an answer (end of input)"
                                    .to_owned(),
                            ),
                        };
                        self.bus.publish(
                            self.event(EventName::InteractionAnswered, &w.request, id)
                                .with("outcome", outcome),
                        );
                        let _ = w.reply.send(GrantDecision::Denied { reason });
                        self.closed.insert(id, Closed::new(w.request));
                    }
                }
                ArbiterCommand::Late {
                    id,
                    responder,
                    answer,
                } => {
                    self.rules.remove(&(id, responder));
                    if let Some(c) = self.closed.get(&id) {
                        let by = self
                            .interactors
                            .get(responder)
                            .map_or("?", |i| i.name.as_str());
                        self.bus.publish(
                            self.event(EventName::InteractionAnswered, &c.request, id)
                                .with("outcome", "late")
                                .with("answer", answer.as_str())
                                .with("by", by),
                        );
                    }
                    self.let_go(id, responder);
                }
            }
        }
        // Decided with no prompt withdrawn (no interactor, or the only
        // one answered): no late answer can come.
        self.closed.retain(|_, c| !c.holders.is_empty());
    }

    /// `responder` will never answer decided request `id` again.
    fn let_go(&mut self, id: InteractionId, responder: ResponderId) {
        if let Some(c) = self.closed.get_mut(&id) {
            c.holders.remove(&responder);
            if c.holders.is_empty() {
                self.closed.remove(&id);
            }
        }
    }

    /// Decided requests still remembered for a late answer.
    pub fn remembered(&self) -> usize {
        self.closed.len()
    }
}

impl Closed {
    fn new(request: Arc<GrantRequest>) -> Closed {
        Closed {
            request,
            holders: BTreeSet::new(),
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
    type Result = bool;

    fn handle(&mut self, msg: Answered, ctx: &mut Context<Self>) -> bool {
        if let Some(rule) = msg.rule {
            self.rules.insert((msg.id, msg.responder), rule);
        }
        let mut out = Vec::new();
        self.arbiter
            .answer(msg.id, msg.responder, msg.answer, &mut out);
        let decided = out.iter().any(|c| {
            matches!(c, ArbiterCommand::Answered { id, responder, .. }
                if *id == msg.id && *responder == msg.responder)
        });
        self.carry_out(out, ctx);
        decided
    }
}

impl Handler<Released> for InteractionHub {
    type Result = ();

    fn handle(&mut self, msg: Released, ctx: &mut Context<Self>) {
        let mut out = Vec::new();
        self.arbiter.release(msg.id, msg.responder, &mut out);
        self.let_go(msg.id, msg.responder);
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

impl Handler<super::messages::Settle> for InteractionHub {
    type Result = ();

    fn handle(&mut self, _msg: super::messages::Settle, _ctx: &mut Context<Self>) {}
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
    /// Holds prompts for the control API's clients (`--remote`); the desk
    /// gets the interactor's address when it starts.
    Remote(Arc<super::remote::RemoteDesk>),
}

impl std::fmt::Debug for InteractorSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            InteractorSpec::Yolo => f.write_str("Yolo"),
            InteractorSpec::Scripted(rules) => f.debug_tuple("Scripted").field(rules).finish(),
            InteractorSpec::Terminal(_) => f.write_str("Terminal"),
            InteractorSpec::Remote(_) => f.write_str("Remote"),
        }
    }
}

/// The answers files and the terminal prompter among `specs`: who can fill
/// a form (an MCP elicitation, a human step's question).
pub fn form_fillers(
    specs: &[InteractorSpec],
) -> (Vec<Arc<AnswerRules>>, Option<Arc<dyn Prompter>>) {
    let mut rules = Vec::new();
    let mut prompter = None;
    for spec in specs {
        match spec {
            InteractorSpec::Scripted(r) => rules.push(Arc::clone(r)),
            InteractorSpec::Terminal(p) => prompter = Some(Arc::clone(p)),
            // `--yolo` approves tool calls; it has nothing to say to a
            // form. The API takes questions through its own desk.
            InteractorSpec::Yolo | InteractorSpec::Remote(_) => {}
        }
    }
    (rules, prompter)
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
            InteractorSpec::Remote(desk) => {
                let a = super::remote::RemoteInteractor::default().start();
                desk.set(a.clone());
                InteractorHandle {
                    name: "api".to_owned(),
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
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::runtime::interaction::AnswerRules;

    /// Asks an actor how much it remembers, after everything already in
    /// its mailbox.
    #[derive(Message)]
    #[rtype(result = "usize")]
    struct Held;

    impl Handler<Held> for InteractionHub {
        type Result = usize;
        fn handle(&mut self, _: Held, _: &mut Context<Self>) -> usize {
            self.remembered() + self.waiting.len()
        }
    }

    impl Handler<Held> for RuleInteractor {
        type Result = usize;
        fn handle(&mut self, _: Held, _: &mut Context<Self>) -> usize {
            self.delayed()
        }
    }

    fn handle(name: &str, a: &Addr<RuleInteractor>) -> InteractorHandle {
        InteractorHandle {
            name: name.to_owned(),
            prompt: a.clone().recipient(),
            unprompt: a.clone().recipient(),
        }
    }

    fn request(i: usize) -> GrantRequest {
        GrantRequest {
            workflow_run_id: "run".into(),
            stage_execution_id: format!("run/s/{i}"),
            stage_id: "s".into(),
            attempt: 1,
            proposal_id: format!("p{i}"),
            tool: "Bash".into(),
            args_digest: String::new(),
            args_summary: String::new(),
        }
    }

    /// A thousand requests, each answered by the first of two yolo
    /// interactors, answered late by the second, and withdrawn from an
    /// interactor whose answer waits an hour: every late answer is still
    /// audited, and afterwards neither the hub nor the slow interactor
    /// remembers any of them.
    #[test]
    fn decided_requests_are_forgotten_once_no_late_answer_can_come() {
        let n = 1000;
        let bus: EventBus<Event> = EventBus::new();
        let sub = bus.subscribe_audit("test", 1 << 16);
        let hub_bus = bus.clone();
        actix::System::new().block_on(async move {
            let first = RuleInteractor::yolo().start();
            let second = RuleInteractor::yolo().start();
            let rules =
                AnswerRules::parse("slow", "answers:\n  - { answer: deny, delay: 1h }\n").unwrap();
            let slow = RuleInteractor::scripted(rules).start();
            let hub = InteractionHub::new(
                vec![
                    handle("first", &first),
                    handle("second", &second),
                    handle("slow", &slow),
                ],
                None,
                hub_bus,
            )
            .start();
            for i in 0..n {
                let (reply, decision) = oneshot::channel();
                hub.do_send(Raise {
                    request: request(i),
                    args_json: "{}".into(),
                    reply,
                });
                assert_eq!(
                    decision.await.unwrap(),
                    GrantDecision::Approved { by: "first".into() }
                );
            }
            // The hub sent every withdrawal before its decision: once the
            // interactors have read their mailboxes, their releases and
            // late answers are in the hub's, ahead of the question.
            assert_eq!(second.send(Held).await.unwrap(), 0);
            assert_eq!(slow.send(Held).await.unwrap(), 0, "no delayed answer kept");
            assert_eq!(hub.send(Held).await.unwrap(), 0, "no decided request kept");
        });
        bus.close();
        let late = sub
            .iter()
            .filter(|d| match d {
                troupe_actors::Delivery::Event(env) => {
                    env.event.to_json(env.seq)["outcome"] == "late"
                }
                troupe_actors::Delivery::Lagged { .. } => false,
            })
            .count();
        assert_eq!(late, n, "every late answer was audited");
    }
}
