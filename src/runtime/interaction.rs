//! Tool approvals beyond `allowedTools` (SPEC §5): the `grantStageTool`
//! interaction, the one-shot grant ledger of a stage execution, and the
//! actors that answer — the interaction hub (the run's arbiter: first answer
//! wins, the others withdraw) and the interactors (scripted rules, `--yolo`,
//! the terminal).
//!
//! Every decision is audited: `InteractionRaised`, `InteractionAnswered`
//! (with the outcome: answered, late, timed out, withdrawn, no interactor).

use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};
use tokio::sync::oneshot;
use troupe_actors::{Arbiter, ArbiterCommand, EventBus, InteractionId, ResponderId, Unanswered};

use super::events::{Event, EventName};
use crate::definition::duration::parse_duration;

/// A `grantStageTool` interaction: may this out-of-envelope call run?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRequest {
    pub workflow_run_id: String,
    pub stage_execution_id: String,
    pub stage_id: String,
    pub attempt: u32,
    pub proposal_id: String,
    pub tool: String,
    /// SHA-256 of the key-sorted JSON arguments, hex.
    pub args_digest: String,
    /// The arguments, shortened for a prompt.
    pub args_summary: String,
}

/// An interactor's answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Approve,
    Deny,
    /// Not now: treated as a denial of this proposal.
    Defer,
}

impl Answer {
    pub fn as_str(self) -> &'static str {
        match self {
            Answer::Approve => "approve",
            Answer::Deny => "deny",
            Answer::Defer => "defer",
        }
    }
}

/// The hub's decision on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    Approved { by: String },
    Denied { reason: String },
}

/// SHA-256 of `value` serialized with object keys sorted, as hex.
pub fn args_digest(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The arguments as one short line for a prompt.
pub fn args_summary(value: &Value) -> String {
    const MAX: usize = 200;
    let text = value.to_string();
    if text.chars().count() <= MAX {
        text
    } else {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// Why a grant token could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("no grant was given for proposal `{0}`")]
    NoToken(String),
    #[error("the grant for proposal `{0}` was already used")]
    AlreadyConsumed(String),
    #[error("the grant for proposal `{0}` was for other arguments or another tool")]
    Mismatch(String),
}

/// One-shot grant tokens of one stage execution. A token is bound to
/// exactly one proposal (tool and argument digest); using it consumes it.
/// The ledger dies with the execution, and its tokens with it.
#[derive(Debug, Default)]
pub struct GrantLedger {
    tokens: HashMap<String, (String, String)>,
    consumed: HashSet<String>,
}

impl GrantLedger {
    /// Mints the token for an approved proposal.
    pub fn mint(&mut self, request: &GrantRequest) {
        self.tokens.insert(
            request.proposal_id.clone(),
            (request.tool.clone(), request.args_digest.clone()),
        );
    }

    /// Uses the token of `proposal_id` for `tool` with `digest`.
    pub fn consume(
        &mut self,
        proposal_id: &str,
        tool: &str,
        digest: &str,
    ) -> Result<(), GrantError> {
        if self.consumed.contains(proposal_id) {
            return Err(GrantError::AlreadyConsumed(proposal_id.to_owned()));
        }
        match self.tokens.get(proposal_id) {
            None => Err(GrantError::NoToken(proposal_id.to_owned())),
            Some((t, d)) if t != tool || d != digest => {
                Err(GrantError::Mismatch(proposal_id.to_owned()))
            }
            Some(_) => {
                self.tokens.remove(proposal_id);
                self.consumed.insert(proposal_id.to_owned());
                Ok(())
            }
        }
    }
}

// ---------------------------------------------------------------------------
// Scripted answers (`--answers FILE`)

/// One rule of an answers file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerRule {
    /// Stage id the rule applies to (any when absent).
    #[serde(default)]
    pub stage: Option<String>,
    /// Tool name (any when absent).
    #[serde(default)]
    pub tool: Option<String>,
    /// Text the arguments (as JSON) must contain.
    #[serde(default)]
    pub args: Option<String>,
    /// `approve`, `deny`, `defer`, or `none` (never answer).
    pub answer: String,
    /// Wait this long before answering, e.g. `20ms`.
    #[serde(default)]
    pub delay: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswersFile {
    answers: Vec<AnswerRule>,
}

/// A checked rule.
#[derive(Debug, Clone)]
struct Rule {
    stage: Option<String>,
    tool: Option<String>,
    args: Option<String>,
    answer: Option<Answer>,
    delay: Duration,
}

/// The rules of one answers file, first match wins.
#[derive(Debug, Clone)]
pub struct AnswerRules {
    pub name: String,
    rules: Vec<Rule>,
}

impl AnswerRules {
    /// Reads an answers file; errors say which rule is wrong and why.
    pub fn load(path: &Path) -> Result<AnswerRules, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path.file_name().map_or_else(
            || "answers".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        AnswerRules::parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses answers-file text.
    pub fn parse(name: &str, text: &str) -> Result<AnswerRules, String> {
        let file: AnswersFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut rules = Vec::with_capacity(file.answers.len());
        for (i, r) in file.answers.into_iter().enumerate() {
            let answer = match r.answer.as_str() {
                "approve" => Some(Answer::Approve),
                "deny" => Some(Answer::Deny),
                "defer" => Some(Answer::Defer),
                "none" => None,
                other => {
                    return Err(format!(
                        "answers[{i}].answer: `{other}` is not one of approve, deny, defer, none"
                    ));
                }
            };
            let delay = match &r.delay {
                Some(d) => parse_duration(d).map_err(|e| format!("answers[{i}].delay: {e}"))?,
                None => Duration::ZERO,
            };
            rules.push(Rule {
                stage: r.stage,
                tool: r.tool,
                args: r.args,
                answer,
                delay,
            });
        }
        Ok(AnswerRules {
            name: name.to_owned(),
            rules,
        })
    }

    /// The answer (and its delay) for `request`; `None` to stay silent.
    /// With no matching rule the answer is a denial.
    pub fn answer_for(
        &self,
        request: &GrantRequest,
        args_json: &str,
    ) -> (Option<Answer>, Duration) {
        let hit = self.rules.iter().find(|r| {
            r.stage.as_deref().is_none_or(|s| s == request.stage_id)
                && r.tool.as_deref().is_none_or(|t| t == request.tool)
                && r.args.as_deref().is_none_or(|a| args_json.contains(a))
        });
        match hit {
            Some(r) => (r.answer, r.delay),
            None => (Some(Answer::Deny), Duration::ZERO),
        }
    }
}

// ---------------------------------------------------------------------------
// Messages

/// Raise a `grantStageTool` interaction; the decision arrives on `reply`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Raise {
    pub request: GrantRequest,
    /// The full arguments as JSON, for rule matching.
    pub args_json: String,
    pub reply: oneshot::Sender<Decision>,
}

/// An interactor's answer to interaction `id`.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Answered {
    pub id: InteractionId,
    pub responder: ResponderId,
    pub answer: Answer,
}

/// A stage execution ended: withdraw its open interactions everywhere.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct WithdrawOwner {
    pub stage_execution_id: String,
}

/// Put interaction `id` to an interactor.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Prompt {
    pub id: InteractionId,
    pub responder: ResponderId,
    pub request: Arc<GrantRequest>,
    pub args_json: Arc<str>,
    pub hub: Recipient<Answered>,
}

/// Take interaction `id`'s prompt away from an interactor.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Unprompt {
    pub id: InteractionId,
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
struct TimedOut(InteractionId);

/// An interactor as the hub knows it.
#[derive(Debug, Clone)]
pub struct InteractorHandle {
    pub name: String,
    pub prompt: Recipient<Prompt>,
    pub unprompt: Recipient<Unprompt>,
}

// ---------------------------------------------------------------------------
// The hub

struct Waiting {
    request: Arc<GrantRequest>,
    /// The full arguments as JSON, for rule matching.
    args_json: Arc<str>,
    reply: oneshot::Sender<Decision>,
}

/// The run's interaction hub: owns the arbiter and the interactor set.
pub struct InteractionHub {
    arbiter: Arbiter<String>,
    interactors: Vec<InteractorHandle>,
    waiting: HashMap<InteractionId, Waiting>,
    /// Requests answered or closed, kept for auditing late answers.
    closed: HashMap<InteractionId, Arc<GrantRequest>>,
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
                            Answer::Approve => Decision::Approved { by },
                            Answer::Deny => Decision::Denied {
                                reason: format!("denied by {by}"),
                            },
                            Answer::Defer => Decision::Denied {
                                reason: format!("deferred by {by}"),
                            },
                        };
                        let _ = w.reply.send(decision);
                        self.closed.insert(id, w.request);
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
                        let _ = w.reply.send(Decision::Denied { reason });
                        self.closed.insert(id, w.request);
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

// ---------------------------------------------------------------------------
// Interactors

/// Answers by rule (`--answers FILE`), or approves everything (`--yolo`).
pub struct RuleInteractor {
    rules: Option<AnswerRules>,
    /// Prompts withdrawn before their (delayed) answer went out.
    withdrawn: HashSet<InteractionId>,
}

impl std::fmt::Debug for RuleInteractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RuleInteractor")
            .field("rules", &self.rules.as_ref().map(|r| r.name.as_str()))
            .finish()
    }
}

impl RuleInteractor {
    /// Answers by `rules`.
    pub fn scripted(rules: AnswerRules) -> RuleInteractor {
        RuleInteractor {
            rules: Some(rules),
            withdrawn: HashSet::new(),
        }
    }

    /// Approves every request at once.
    pub fn yolo() -> RuleInteractor {
        RuleInteractor {
            rules: None,
            withdrawn: HashSet::new(),
        }
    }
}

impl Actor for RuleInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for RuleInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, ctx: &mut Context<Self>) {
        let (answer, delay) = match &self.rules {
            Some(rules) => rules.answer_for(&msg.request, &msg.args_json),
            None => (Some(Answer::Approve), Duration::ZERO),
        };
        let Some(answer) = answer else { return };
        let reply = Answered {
            id: msg.id,
            responder: msg.responder,
            answer,
        };
        if delay.is_zero() {
            msg.hub.do_send(reply);
        } else {
            ctx.run_later(delay, move |act, _| {
                if !act.withdrawn.remove(&reply.id) {
                    msg.hub.do_send(reply);
                }
            });
        }
    }
}

impl Handler<Unprompt> for RuleInteractor {
    type Result = ();

    fn handle(&mut self, msg: Unprompt, _ctx: &mut Context<Self>) {
        if self.rules.is_some() {
            self.withdrawn.insert(msg.id);
        }
    }
}

/// What a terminal prompt shows.
#[derive(Debug, Clone)]
pub struct PromptView {
    pub stage_id: String,
    pub stage_execution_id: String,
    pub tool: String,
    pub args_summary: String,
    /// Prompts queued behind this one.
    pub waiting: usize,
}

/// Asks a person; blocking. The terminal implementation reads a line from
/// stdin; tests inject their own.
pub trait Prompter: Send + Sync + 'static {
    /// `None` when no answer can be had (end of input).
    fn ask(&self, view: &PromptView) -> Option<Answer>;
    /// Tells the person a prompt they are looking at no longer matters;
    /// called while `ask` may be blocked on another thread.
    fn withdrawn(&self, view: &PromptView);
}

/// Prompts on stderr and reads `y`/`n` from stdin.
#[derive(Debug, Default)]
pub struct StdinPrompter;

impl Prompter for StdinPrompter {
    fn ask(&self, view: &PromptView) -> Option<Answer> {
        use std::io::{BufRead, Write};
        let queued = if view.waiting > 0 {
            format!(" ({} more waiting)", view.waiting)
        } else {
            String::new()
        };
        // Write and release stderr before waiting on stdin: holding its
        // lock while a person thinks would block every other writer
        // (the withdrawal notice, the runtime's own messages).
        {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\napproval{queued}: stage `{}` ({}) wants to run {} {}\n  allow this one call? [y/N] ",
                view.stage_id, view.stage_execution_id, view.tool, view.args_summary
            );
            let _ = err.flush();
        }
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => Some(Answer::Approve),
                _ => Some(Answer::Deny),
            },
        }
    }

    fn withdrawn(&self, view: &PromptView) {
        eprintln!(
            "\n(no longer needed: the {} call of stage `{}` was decided or its stage ended; an answer will be ignored)",
            view.tool, view.stage_id
        );
    }
}

/// One prompt at a time on a person's terminal; the rest queue in order,
/// and a withdrawn prompt leaves the queue (or, if showing, is marked so).
pub struct TerminalInteractor {
    queue: VecDeque<Prompt>,
    showing: Option<Prompt>,
    prompter: Arc<dyn Prompter>,
}

impl std::fmt::Debug for TerminalInteractor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TerminalInteractor")
            .field("queued", &self.queue.len())
            .finish()
    }
}

impl TerminalInteractor {
    pub fn new(prompter: Arc<dyn Prompter>) -> TerminalInteractor {
        TerminalInteractor {
            queue: VecDeque::new(),
            showing: None,
            prompter,
        }
    }

    fn view(prompt: &Prompt, waiting: usize) -> PromptView {
        PromptView {
            stage_id: prompt.request.stage_id.clone(),
            stage_execution_id: prompt.request.stage_execution_id.clone(),
            tool: prompt.request.tool.clone(),
            args_summary: prompt.request.args_summary.clone(),
            waiting,
        }
    }

    /// Shows the next prompt on a blocking thread; the prompter comes back
    /// with the answer.
    fn show_next(&mut self, ctx: &mut Context<Self>) {
        if self.showing.is_some() {
            return;
        }
        let Some(prompt) = self.queue.pop_front() else {
            return;
        };
        let view = Self::view(&prompt, self.queue.len());
        self.showing = Some(prompt);
        let prompter = Arc::clone(&self.prompter);
        // A plain thread, not the runtime's blocking pool: a person may
        // never answer, and the run must be able to end (and the process
        // exit) without waiting for them.
        let (tx, asked) = oneshot::channel();
        let spawned = std::thread::Builder::new()
            .name("troupe-prompt".into())
            .spawn(move || {
                let _ = tx.send(prompter.ask(&view));
            });
        if spawned.is_err() {
            self.showing = None;
            return;
        }
        ctx.spawn(asked.into_actor(self).map(|joined, act, ctx| {
            // A prompter that panicked (dropping the sender) gave no answer.
            let answer = joined.ok().flatten();
            if let (Some(prompt), Some(answer)) = (act.showing.take(), answer) {
                // A withdrawn prompt's answer goes out too: the hub audits it as late.
                prompt.hub.do_send(Answered {
                    id: prompt.id,
                    responder: prompt.responder,
                    answer,
                });
            }
            act.show_next(ctx);
        }));
    }
}

impl Actor for TerminalInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for TerminalInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, ctx: &mut Context<Self>) {
        self.queue.push_back(msg);
        self.show_next(ctx);
    }
}

impl Handler<Unprompt> for TerminalInteractor {
    type Result = ();

    fn handle(&mut self, msg: Unprompt, _ctx: &mut Context<Self>) {
        self.queue.retain(|p| p.id != msg.id);
        if let Some(showing) = &self.showing
            && showing.id == msg.id
        {
            self.prompter
                .withdrawn(&Self::view(showing, self.queue.len()));
        }
    }
}

/// An interactor to start for a run.
#[derive(Debug, Clone)]
pub enum InteractorSpec {
    /// Approves everything (`--yolo`).
    Yolo,
    /// Answers by the rules of an answers file (`--answers FILE`).
    Scripted(Arc<AnswerRules>),
    /// Asks the person at the terminal (stdin a TTY and not `--headless`).
    Terminal,
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
            InteractorSpec::Terminal => {
                let a = TerminalInteractor::new(Arc::new(StdinPrompter)).start();
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
    use serde_json::json;

    fn request(proposal: &str, tool: &str, args: &Value) -> GrantRequest {
        GrantRequest {
            workflow_run_id: "r".into(),
            stage_execution_id: "r/s/1".into(),
            stage_id: "s".into(),
            attempt: 1,
            proposal_id: proposal.into(),
            tool: tool.into(),
            args_digest: args_digest(args),
            args_summary: args_summary(args),
        }
    }

    #[test]
    fn the_digest_ignores_key_order_but_not_values() {
        let a = json!({"command": "ls", "timeout": 5, "env": {"b": 1, "a": 2}});
        let b = json!({"env": {"a": 2, "b": 1}, "timeout": 5, "command": "ls"});
        let c = json!({"command": "ls -la", "timeout": 5, "env": {"b": 1, "a": 2}});
        assert_eq!(args_digest(&a), args_digest(&b));
        assert_ne!(args_digest(&a), args_digest(&c));
        assert_eq!(args_digest(&a).len(), 64);
    }

    #[test]
    fn a_grant_is_used_once_for_exactly_its_proposal() {
        let args = json!({"command": "git status"});
        let req = request("p1", "Bash", &args);
        let mut ledger = GrantLedger::default();
        assert_eq!(
            ledger.consume("p1", "Bash", &req.args_digest),
            Err(GrantError::NoToken("p1".into()))
        );
        ledger.mint(&req);
        let other = args_digest(&json!({"command": "rm -rf /"}));
        assert_eq!(
            ledger.consume("p1", "Bash", &other),
            Err(GrantError::Mismatch("p1".into()))
        );
        assert_eq!(ledger.consume("p1", "Bash", &req.args_digest), Ok(()));
        assert_eq!(
            ledger.consume("p1", "Bash", &req.args_digest),
            Err(GrantError::AlreadyConsumed("p1".into()))
        );
    }

    #[test]
    fn rules_match_in_order_and_default_to_deny() {
        let rules = AnswerRules::parse(
            "a.yaml",
            "answers:\n  - { tool: Bash, args: \"git status\", answer: approve, delay: 5ms }\n  - { stage: quiet, answer: none }\n",
        )
        .unwrap();
        let ok = request("p", "Bash", &json!({"command": "git status"}));
        assert_eq!(
            rules.answer_for(&ok, r#"{"command":"git status"}"#),
            (Some(Answer::Approve), Duration::from_millis(5))
        );
        let other = request("p", "Bash", &json!({"command": "rm"}));
        assert_eq!(
            rules.answer_for(&other, r#"{"command":"rm"}"#),
            (Some(Answer::Deny), Duration::ZERO)
        );
        let mut quiet = other.clone();
        quiet.stage_id = "quiet".into();
        assert_eq!(rules.answer_for(&quiet, "{}").0, None);
    }

    #[test]
    fn bad_answers_files_say_what_is_wrong() {
        let e = AnswerRules::parse("a", "answers:\n  - { answer: maybe }\n").unwrap_err();
        assert!(
            e.contains("answers[0].answer") && e.contains("maybe"),
            "{e}"
        );
        let e =
            AnswerRules::parse("a", "answers:\n  - { answer: deny, delay: soon }\n").unwrap_err();
        assert!(e.contains("answers[0].delay"), "{e}");
        let e =
            AnswerRules::parse("a", "answers:\n  - { answer: deny, colour: red }\n").unwrap_err();
        assert!(e.contains("colour"), "{e}");
        assert!(AnswerRules::parse("a", "nope: 1\n").is_err());
    }
}
