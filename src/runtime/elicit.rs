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

    fn answered(&self, request: &ElicitRequest, outcome: &'static str, by: &str) {
        self.bus.publish(
            Event::new(EventName::InteractionAnswered, Arc::clone(&self.run_id))
                .with("kind", "elicitation")
                .with("mcpServer", request.server.as_str())
                .with("outcome", outcome)
                .with("by", by),
        );
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
        for rules in &self.rules {
            if let Some((content, rule)) = rules.elicitation_for(&request.server) {
                let by = format!("answers:{}", rules.name);
                let answer = match content {
                    Some(content) => {
                        self.answered(&request, "accepted", &by);
                        ElicitAnswer::Accept(content)
                    }
                    None => {
                        self.answered(&request, "declined", &by);
                        ElicitAnswer::Decline
                    }
                };
                let _ = rule;
                return std::future::ready(answer).boxed();
            }
        }
        let Some(prompter) = self.prompter.clone() else {
            self.answered(&request, "declined", "noInteractor");
            return std::future::ready(ElicitAnswer::Decline).boxed();
        };
        // A person may take their time: a thread of its own, as the
        // terminal's approval prompts have.
        let (tx, rx) = tokio::sync::oneshot::channel();
        let wanted = Wanted::default();
        let unwanted = wanted.until_dropped();
        let form = FormView {
            server: request.server.clone(),
            message: request.message.clone(),
            schema: request.schema.clone(),
            wanted,
        };
        let spawned = std::thread::Builder::new()
            .name("troupe-form".into())
            .spawn(move || {
                let _ = tx.send(prompter.fill(&form));
            });
        if spawned.is_err() {
            self.answered(&request, "declined", "terminal");
            return std::future::ready(ElicitAnswer::Decline).boxed();
        }
        let bus = self.bus.clone();
        let run_id = Arc::clone(&self.run_id);
        async move {
            // The call ended first (this future dropped): the terminal
            // stops reading for the form.
            let _unwanted = unwanted;
            let filled = rx.await.ok().flatten();
            let outcome = if filled.is_some() {
                "accepted"
            } else {
                "declined"
            };
            bus.publish(
                Event::new(EventName::InteractionAnswered, run_id)
                    .with("kind", "elicitation")
                    .with("mcpServer", request.server.as_str())
                    .with("outcome", outcome)
                    .with("by", "terminal"),
            );
            filled.map_or(ElicitAnswer::Decline, ElicitAnswer::Accept)
        }
        .boxed()
    }
}
