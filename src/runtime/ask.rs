//! Human steps' questions: a form put to the run's interactors — an
//! answers file's `human:` rule, the person at the terminal, the control
//! API's clients (`--remote`) — first valid answer wins. An answer that
//! does not match the form's schema is refused and the question stays
//! open. A question leaves every list when its step ends (answered,
//! timed out or cancelled).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;

use super::interaction::{AnswerRules, FormView, InteractorSpec, Prompter, Wanted, form_fillers};
use crate::definition::schema::Schema;

/// A question a human step asks.
#[derive(Debug, Clone)]
pub struct Question {
    pub stage_id: String,
    pub stage_execution_id: String,
    pub prompt: String,
    pub fields: Schema,
}

/// The answer and who gave it.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub content: Value,
    pub by: String,
}

/// Who answers a run's questions.
pub trait Asker: Send + Sync + std::fmt::Debug {
    /// `None`: no one can answer (headless, nothing matching).
    fn ask(&self, question: Question) -> BoxFuture<'static, Option<Answer>>;
}

/// An open question as an API client sees it.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct OpenQuestion {
    pub stage_id: String,
    pub stage_execution_id: String,
    pub prompt: String,
    pub fields: Value,
}

struct Waiting {
    question: Question,
    reply: tokio::sync::oneshot::Sender<Answer>,
}

/// The questions open to the control API's clients.
#[derive(Default)]
pub struct QuestionDesk {
    open: Mutex<BTreeMap<String, Waiting>>,
}

impl std::fmt::Debug for QuestionDesk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuestionDesk").finish_non_exhaustive()
    }
}

/// Why an API answer was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refused {
    /// No question of that execution is open.
    NotAsked,
    /// The answer does not match the form: the schema's errors.
    Invalid(Vec<String>),
}

impl QuestionDesk {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Waiting>> {
        self.open
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The open questions, by execution.
    pub fn list(&self) -> Vec<OpenQuestion> {
        self.lock()
            .values()
            .map(|w| OpenQuestion {
                stage_id: w.question.stage_id.clone(),
                stage_execution_id: w.question.stage_execution_id.clone(),
                prompt: w.question.prompt.clone(),
                fields: w.question.fields.document().clone(),
            })
            .collect()
    }

    /// A client's answer to the question of `execution`; refused (and the
    /// question left open) when it does not match the form.
    pub fn answer(&self, execution: &str, content: Value, client: &str) -> Result<(), Refused> {
        let mut open = self.lock();
        let waiting = open.get(execution).ok_or(Refused::NotAsked)?;
        waiting
            .question
            .fields
            .check(&content)
            .map_err(Refused::Invalid)?;
        let waiting = open.remove(execution).ok_or(Refused::NotAsked)?;
        let _ = waiting.reply.send(Answer {
            content,
            by: format!("api: {client}"),
        });
        Ok(())
    }

    fn open(&self, question: Question) -> tokio::sync::oneshot::Receiver<Answer> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let execution = question.stage_execution_id.clone();
        self.lock().insert(execution, Waiting { question, reply });
        rx
    }

    fn withdraw(&self, execution: &str) {
        self.lock().remove(execution);
    }
}

/// Asks a run's interactors.
pub struct RunAsker {
    rules: Vec<Arc<AnswerRules>>,
    prompter: Option<Arc<dyn Prompter>>,
    desk: Option<Arc<QuestionDesk>>,
}

impl std::fmt::Debug for RunAsker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunAsker")
            .field("rules", &self.rules.len())
            .field("terminal", &self.prompter.is_some())
            .field("api", &self.desk.is_some())
            .finish()
    }
}

impl RunAsker {
    pub fn new(interactors: &[InteractorSpec], desk: Option<Arc<QuestionDesk>>) -> RunAsker {
        let (rules, prompter) = form_fillers(interactors);
        RunAsker {
            rules,
            prompter,
            desk,
        }
    }
}

impl Asker for RunAsker {
    fn ask(&self, question: Question) -> BoxFuture<'static, Option<Answer>> {
        for rules in &self.rules {
            if let Some((content, rule)) = rules.human_answer_for(&question.stage_id)
                && question.fields.check(&content).is_ok()
            {
                return std::future::ready(Some(Answer {
                    content,
                    by: format!("answers:{}", rule),
                }))
                .boxed();
            }
        }
        let mut waits: Vec<BoxFuture<'static, Option<Answer>>> = Vec::new();
        // Off the desk when the step stops waiting, answered or dropped.
        let guard = self.desk.as_ref().map(|desk| {
            let rx = desk.open(question.clone());
            waits.push(async move { rx.await.ok() }.boxed());
            OpenGuard {
                desk: Arc::clone(desk),
                execution: question.stage_execution_id.clone(),
            }
        });
        if let Some(prompter) = self.prompter.clone() {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let wanted = Wanted::default();
            let unwanted = wanted.until_dropped();
            let form = FormView {
                server: format!("stage {}", question.stage_id),
                message: question.prompt.clone(),
                schema: question.fields.document().clone(),
                wanted,
            };
            let fields = question.fields.clone();
            let spawned = std::thread::Builder::new()
                .name("troupe-question".into())
                .spawn(move || {
                    // Asked again until the answer fits the form.
                    for _ in 0..5 {
                        let Some(content) = prompter.fill(&form) else {
                            return;
                        };
                        match fields.check(&content) {
                            Ok(()) => {
                                let _ = tx.send(content);
                                return;
                            }
                            Err(errors) => eprintln!("  not accepted: {}", errors.join("; ")),
                        }
                    }
                });
            if spawned.is_ok() {
                waits.push(
                    async move {
                        // Answered elsewhere (this wait dropped): the
                        // terminal stops reading for the form.
                        let _unwanted = unwanted;
                        rx.await.ok().map(|content| Answer {
                            content,
                            by: "terminal".to_owned(),
                        })
                    }
                    .boxed(),
                );
            }
        }
        if waits.is_empty() {
            return std::future::ready(None).boxed();
        }
        async move {
            let _guard = guard;
            // First answer wins; an interactor that gives up (the terminal's
            // input ended) leaves the others to answer.
            let mut waits = waits;
            let mut answer = None;
            while !waits.is_empty() {
                let (got, _, rest) = futures::future::select_all(waits).await;
                if got.is_some() {
                    answer = got;
                    break;
                }
                waits = rest;
            }
            answer
        }
        .boxed()
    }
}

/// Takes a question off the desk when the asking future ends or is
/// dropped (a cancelled step).
struct OpenGuard {
    desk: Arc<QuestionDesk>,
    execution: String,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.desk.withdraw(&self.execution);
    }
}
