//! The run's elicitor: an MCP server's question (a form) put to the run's
//! interactors in order — an answers file's `elicit:` rule, then the person
//! at the terminal — and audited like an approval (`InteractionRaised` and
//! `InteractionAnswered` with `kind: elicitation`). Headless with no rule,
//! it is declined.

use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use troupe_actors::EventBus;

use super::events::{Event, EventName};
use super::interaction::{AnswerRules, FormView, InteractorSpec, Prompter, Wanted, form_fillers};
use crate::definition::schema::Schema;
use crate::tools::mcp::{ElicitAnswer, ElicitRequest, Elicitor};

/// Answers elicitations from a run's interactors.
pub struct RunElicitor {
    rules: Vec<Arc<AnswerRules>>,
    prompter: Option<Arc<dyn Prompter>>,
    bus: EventBus<Event>,
    run_id: Arc<str>,
}

impl std::fmt::Debug for RunElicitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunElicitor")
            .field("rules", &self.rules.len())
            .field("terminal", &self.prompter.is_some())
            .finish()
    }
}

impl RunElicitor {
    pub fn new(interactors: &[InteractorSpec], bus: EventBus<Event>, run_id: &str) -> RunElicitor {
        let (rules, prompter) = form_fillers(interactors);
        RunElicitor {
            rules,
            prompter,
            bus,
            run_id: Arc::from(run_id),
        }
    }

    /// Audits the answer; `unfit` names the answers-file rules passed
    /// over because their content did not fit the form.
    fn answered(&self, request: &ElicitRequest, outcome: &'static str, by: &str, unfit: &[String]) {
        let mut event = Event::new(EventName::InteractionAnswered, Arc::clone(&self.run_id))
            .with("kind", "elicitation")
            .with("mcpServer", request.server.as_str())
            .with("outcome", outcome)
            .with("by", by);
        if !unfit.is_empty() {
            event = event.with("unfit", unfit.join("; "));
        }
        self.bus.publish(event);
    }
}

impl Elicitor for RunElicitor {
    fn elicit(&self, request: ElicitRequest) -> BoxFuture<'static, ElicitAnswer> {
        self.bus.publish(
            Event::new(EventName::InteractionRaised, Arc::clone(&self.run_id))
                .with("kind", "elicitation")
                .with("mcpServer", request.server.as_str())
                .with("message", request.message.as_str()),
        );
        // The server's form, checked as a JSON Schema: an answer that
        // does not fit it is never sent. A form troupe cannot read is
        // declined.
        let fields = match Schema::compile(request.schema.clone()) {
            Ok(fields) => fields,
            Err(e) => {
                let by = format!("troupe: the form's requestedSchema is not a schema: {e}");
                self.answered(&request, "declined", &by, &[]);
                return std::future::ready(ElicitAnswer::Decline).boxed();
            }
        };
        let mut unfit = Vec::new();
        for rules in &self.rules {
            if let Some((content, rule)) = rules.elicitation_for(&request.server) {
                let by = format!("answers:{}", rules.name);
                let answer = match content {
                    Some(content) => {
                        if let Err(errors) = fields.check(&content) {
                            // Left to the next interactor, as a human
                            // step's rule that does not fit is.
                            unfit.push(format!("{rule}: {}", errors.join(", ")));
                            continue;
                        }
                        self.answered(&request, "accepted", &by, &unfit);
                        ElicitAnswer::Accept(content)
                    }
                    None => {
                        self.answered(&request, "declined", &by, &unfit);
                        ElicitAnswer::Decline
                    }
                };
                return std::future::ready(answer).boxed();
            }
        }
        let Some(prompter) = self.prompter.clone() else {
            self.answered(&request, "declined", "noInteractor", &unfit);
            return std::future::ready(ElicitAnswer::Decline).boxed();
        };
        // A person may take their time: a thread of its own, as the
        // terminal's approval prompts have.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let wanted = Wanted::default();
        let unwanted = wanted.until_dropped();
        let form = FormView {
            asker: format!("MCP server `{}`", request.server),
            message: request.message.clone(),
            schema: request.schema.clone(),
            wanted,
        };
        let spawned = std::thread::Builder::new()
            .name("troupe-form".into())
            .spawn(move || {
                // Asked again until the answer fits the form.
                for _ in 0..5 {
                    let Some(content) = prompter.fill(&form) else {
                        break;
                    };
                    match fields.check(&content) {
                        Ok(()) => {
                            let _ = tx.send(Some(content));
                            return;
                        }
                        Err(errors) => {
                            use std::io::Write as _;
                            let _ = writeln!(
                                std::io::stderr(),
                                "  not accepted: {}",
                                errors.join("; ")
                            );
                        }
                    }
                }
                let _ = tx.send(None);
            });
        if spawned.is_err() {
            self.answered(&request, "declined", "terminal", &unfit);
            return std::future::ready(ElicitAnswer::Decline).boxed();
        }
        /// Audits the terminal's answer, or, dropped before one (the call
        /// or the server's question withdrawn), `outcome: withdrawn`.
        struct Audit {
            bus: EventBus<Event>,
            run_id: Arc<str>,
            server: String,
            unfit: Vec<String>,
            outcome: &'static str,
        }
        impl Drop for Audit {
            fn drop(&mut self) {
                let mut event =
                    Event::new(EventName::InteractionAnswered, Arc::clone(&self.run_id))
                        .with("kind", "elicitation")
                        .with("mcpServer", self.server.as_str())
                        .with("outcome", self.outcome)
                        .with("by", "terminal");
                if !self.unfit.is_empty() {
                    event = event.with("unfit", self.unfit.join("; "));
                }
                self.bus.publish(event);
            }
        }
        let mut audit = Audit {
            bus: self.bus.clone(),
            run_id: Arc::clone(&self.run_id),
            server: request.server.clone(),
            unfit,
            outcome: "withdrawn",
        };
        async move {
            // The call ended first (this future dropped): the terminal
            // stops reading for the form.
            let _unwanted = unwanted;
            let filled = rx.await.ok().flatten();
            audit.outcome = if filled.is_some() {
                "accepted"
            } else {
                "declined"
            };
            drop(audit);
            filled.map_or(ElicitAnswer::Decline, ElicitAnswer::Accept)
        }
        .boxed()
    }
}
