//! The interactors that answer approvals: by rule (`--answers FILE`) or
//! approving all (`--yolo`), and a person through a [`Prompter`] (the CLI
//! supplies the terminal's), one prompt at a time.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use tokio::sync::oneshot;
use troupe_actors::InteractionId;

use super::answers::AnswerRules;
use super::messages::{Answer, Answered, Prompt, Released, Unprompt};
use super::remember::{Remembered, answer_by};

/// Answers by rule (`--answers FILE`), or approves everything (`--yolo`).
pub struct RuleInteractor {
    rules: Option<AnswerRules>,
    /// Prompts whose (delayed) answer has not gone out yet; a withdrawn
    /// one leaves the set and its answer is never sent. Holds only the
    /// answers still on their way, however long the run.
    delayed: HashSet<InteractionId>,
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
            delayed: HashSet::new(),
        }
    }

    /// Approves every request at once.
    pub fn yolo() -> RuleInteractor {
        RuleInteractor {
            rules: None,
            delayed: HashSet::new(),
        }
    }
}

impl Actor for RuleInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for RuleInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, ctx: &mut Context<Self>) {
        let (answer, delay, rule) = match &self.rules {
            Some(rules) => rules.answer_for(&msg.request, &msg.args_json),
            None => (Some(Answer::Approve), Duration::ZERO, None),
        };
        let Some(answer) = answer else { return };
        let reply = Answered {
            id: msg.id,
            responder: msg.responder,
            answer,
            rule,
        };
        if delay.is_zero() {
            msg.hub.do_send(reply);
        } else {
            self.delayed.insert(reply.id);
            ctx.run_later(delay, move |act, _| {
                if act.delayed.remove(&reply.id) {
                    msg.hub.do_send(reply);
                }
            });
        }
    }
}

impl Handler<Unprompt> for RuleInteractor {
    type Result = ();

    /// A delayed answer not yet sent never will be; one already sent went
    /// out before this release.
    fn handle(&mut self, msg: Unprompt, _ctx: &mut Context<Self>) {
        self.delayed.remove(&msg.id);
        msg.release.do_send(Released {
            id: msg.id,
            responder: msg.responder,
        });
    }
}

impl RuleInteractor {
    /// Delayed answers still on their way.
    pub fn delayed(&self) -> usize {
        self.delayed.len()
    }
}

/// What a terminal prompt shows.
#[derive(Debug, Clone)]
pub struct PromptView {
    pub stage_id: String,
    pub stage_execution_id: String,
    pub tool: String,
    pub args_summary: String,
    /// The whole arguments, as JSON text: shown too when the summary is
    /// shortened, so a person never approves what they could not see.
    pub args_json: std::sync::Arc<str>,
    /// Prompts queued behind this one.
    pub waiting: usize,
}

/// Asks a person; blocking. The CLI's implementation prompts on the
/// terminal (`cli::prompter`); tests inject their own.
pub trait Prompter: Send + Sync + 'static {
    /// `None` when no answer can be had (end of input).
    fn ask(&self, view: &PromptView) -> Option<Answer>;
    /// Tells the person a prompt they are looking at no longer matters;
    /// called while `ask` may be blocked on another thread.
    fn withdrawn(&self, view: &PromptView);
    /// Asks the person to fill a form (an MCP server's elicitation):
    /// `Some(content)` to send, `None` to decline. By default declines.
    fn fill(&self, form: &FormView) -> Option<serde_json::Value> {
        let _ = form;
        None
    }
}

/// A form a server asks the person to fill.
#[derive(Debug, Clone)]
pub struct FormView {
    /// Who asks, as a person reads it: "MCP server `fs`", "stage `confirm`".
    pub asker: String,
    pub message: String,
    /// An object schema of primitive properties.
    pub schema: serde_json::Value,
    /// Whether the answer is still wanted (see [`Wanted`]).
    pub wanted: Wanted,
}

/// Whether a person's answer is still wanted: no longer once whoever
/// asked stopped waiting for it (the question was answered elsewhere, or
/// its step or run ended). A prompter that reads a person's input stops
/// reading then, so that the next line they type goes to whoever asks
/// next rather than to a question no one waits on.
#[derive(Debug, Clone, Default)]
pub struct Wanted(Arc<std::sync::atomic::AtomicBool>);

impl Wanted {
    pub fn still(&self) -> bool {
        !self.0.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Marks the answer unwanted.
    pub fn drop_it(&self) {
        self.0.store(true, std::sync::atomic::Ordering::Release);
    }

    /// A guard that marks the answer unwanted when it is dropped: held by
    /// whoever waits for the answer.
    pub fn until_dropped(&self) -> Unwanted {
        Unwanted(self.clone())
    }
}

/// See [`Wanted::until_dropped`].
#[derive(Debug)]
pub struct Unwanted(Wanted);

impl Drop for Unwanted {
    fn drop(&mut self) {
        self.0.drop_it();
    }
}

/// One prompt at a time on a person's terminal; the rest queue in order,
/// and a withdrawn prompt leaves the queue (or, if showing, is marked so).
pub struct TerminalInteractor {
    queue: VecDeque<Prompt>,
    showing: Option<Prompt>,
    /// Whether the prompt showing was withdrawn: an answer to it is late,
    /// and a remembering one leaves no rule (it answered nothing).
    withdrawn: bool,
    prompter: Arc<dyn Prompter>,
    /// What the person's `approve-same`/`approve-prefix` answers left:
    /// matching prompts are answered here, without asking again.
    remembered: Vec<Remembered>,
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
            withdrawn: false,
            prompter,
            remembered: Vec::new(),
        }
    }

    /// Answers `prompt` by a remembered rule, if one matches; gives it
    /// back otherwise.
    fn by_rule(&self, prompt: Prompt) -> Option<Prompt> {
        answer_by(&self.remembered, prompt)
    }

    fn view(prompt: &Prompt, waiting: usize) -> PromptView {
        PromptView {
            stage_id: prompt.request.stage_id.clone(),
            stage_execution_id: prompt.request.stage_execution_id.clone(),
            tool: prompt.request.tool.clone(),
            args_summary: prompt.request.args_summary.clone(),
            args_json: std::sync::Arc::clone(&prompt.args_json),
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
        self.withdrawn = false;
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
        ctx.spawn(
            asked
                .into_actor(self)
                .then(|joined, act, _ctx| {
                    // A prompter that panicked (dropping the sender) gave
                    // no answer.
                    let answer = joined.ok().flatten();
                    let withdrawn = std::mem::take(&mut act.withdrawn);
                    let kept: std::pin::Pin<Box<dyn Future<Output = Option<Remembered>>>> =
                        match (act.showing.take(), answer) {
                            // The answer goes to the hub (a withdrawn
                            // prompt's too: the hub audits it as late). A
                            // remembering one leaves its rule only once the
                            // hub says it decided the prompt: one decided
                            // elsewhere first (a timeout, another
                            // interactor, the step's end, whose withdrawal
                            // may not have reached this actor yet) answered
                            // nothing and must approve nothing later.
                            (Some(prompt), Some(answer)) => {
                                let rule = Remembered::from_answer(
                                    answer,
                                    &prompt.request,
                                    &prompt.args_json,
                                )
                                .filter(|_| !withdrawn);
                                let decided = prompt.hub.send(Answered {
                                    id: prompt.id,
                                    responder: prompt.responder,
                                    answer,
                                    rule: None,
                                });
                                Box::pin(async move {
                                    match decided.await {
                                        Ok(true) => rule,
                                        _ => None,
                                    }
                                })
                            }
                            // The person's input went away (end of input):
                            // no answer will ever come, and the hub must
                            // not wait for one.
                            (Some(prompt), None) => {
                                prompt.release.do_send(Released {
                                    id: prompt.id,
                                    responder: prompt.responder,
                                });
                                Box::pin(std::future::ready(None))
                            }
                            (None, _) => Box::pin(std::future::ready(None)),
                        };
                    kept.into_actor(act)
                })
                .map(|rule, act, ctx| {
                    // The rule then answers the prompts already queued
                    // that it matches.
                    if let Some(rule) = rule {
                        act.remembered.push(rule);
                        let queued = std::mem::take(&mut act.queue);
                        act.queue = queued.into_iter().filter_map(|p| act.by_rule(p)).collect();
                    }
                    act.show_next(ctx);
                }),
        );
    }
}

impl Actor for TerminalInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for TerminalInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, ctx: &mut Context<Self>) {
        if let Some(msg) = self.by_rule(msg) {
            self.queue.push_back(msg);
            self.show_next(ctx);
        }
    }
}

impl Handler<Unprompt> for TerminalInteractor {
    type Result = ();

    /// A prompt being shown ends when the person answers (late) or the
    /// prompter gives up; one that was queued, or already answered, is
    /// released at once.
    fn handle(&mut self, msg: Unprompt, _ctx: &mut Context<Self>) {
        self.queue.retain(|p| p.id != msg.id);
        if let Some(showing) = &self.showing
            && showing.id == msg.id
        {
            self.withdrawn = true;
            self.prompter
                .withdrawn(&Self::view(showing, self.queue.len()));
            return;
        }
        msg.release.do_send(Released {
            id: msg.id,
            responder: msg.responder,
        });
    }
}
