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

/// The one reply of a question, shared by every interactor asked: the
/// first to take it answers, and the others learn that they came late.
/// The asking step holds only the receiver, so the question also ends
/// (unanswered) once every interactor let go of the slot.
type ReplySlot = Arc<Mutex<Option<tokio::sync::oneshot::Sender<Answer>>>>;

/// Takes the reply from `slot` and sends `answer` on it: `false` when
/// another interactor answered first or the step stopped waiting.
fn reply_once(slot: &ReplySlot, answer: Answer) -> bool {
    let taken = slot
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .take();
    taken.is_some_and(|reply| reply.send(answer).is_ok())
}

struct Waiting {
    question: Question,
    reply: ReplySlot,
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
        let answer = Answer {
            content,
            by: format!("api: {client}"),
        };
        if reply_once(&waiting.reply, answer) {
            Ok(())
        } else {
            Err(Refused::NotAsked)
        }
    }

    fn open(&self, question: Question, reply: ReplySlot) {
        let execution = question.stage_execution_id.clone();
        self.lock().insert(execution, Waiting { question, reply });
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
            let Some((content, rule, delay)) = rules.human_answer_for(&question.stage_id) else {
                continue;
            };
            // A rule whose content the step's fields refuse answers
            // nothing: said, and the question goes to the others.
            if let Err(errors) = question.fields.check(&content) {
                say!(
                    "warning: answers rule {rule} for stage `{}`: its content does not fit the step's fields ({}); the question goes to whoever else can answer",
                    question.stage_id,
                    errors.join("; ")
                );
                continue;
            }
            let answer = Answer {
                content,
                by: format!("answers:{}", rule),
            };
            // After the rule's `delay`, as its approvals are.
            return async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                Some(answer)
            }
            .boxed();
        }
        let (reply, answered) = tokio::sync::oneshot::channel();
        let slot: ReplySlot = Arc::new(Mutex::new(Some(reply)));
        // Off the desk when the step stops waiting, answered or dropped.
        let guard = self.desk.as_ref().map(|desk| {
            desk.open(question.clone(), Arc::clone(&slot));
            OpenGuard {
                desk: Arc::clone(desk),
                execution: question.stage_execution_id.clone(),
            }
        });
        let mut unwanted = None;
        if let Some(prompter) = self.prompter.clone() {
            let wanted = Wanted::default();
            unwanted = Some(wanted.until_dropped());
            let form = FormView {
                asker: format!("stage `{}`", question.stage_id),
                message: question.prompt.clone(),
                schema: question.fields.document().clone(),
                wanted,
            };
            let fields = question.fields.clone();
            let slot = Arc::clone(&slot);
            // Not started: the terminal simply does not answer.
            let _ = std::thread::Builder::new()
                .name("troupe-question".into())
                .spawn(move || {
                    // Asked again until the answer fits the form.
                    for _ in 0..5 {
                        let Some(content) = prompter.fill(&form) else {
                            return;
                        };
                        match fields.check(&content) {
                            Ok(()) => {
                                let answer = Answer {
                                    content,
                                    by: "terminal".to_owned(),
                                };
                                if !reply_once(&slot, answer) {
                                    say!("  answered elsewhere first: this answer was not used");
                                }
                                return;
                            }
                            Err(errors) => say!("  not accepted: {}", errors.join("; ")),
                        }
                    }
                });
        }
        // Only the interactors hold the slot now: when the last of them
        // lets go unanswered (the terminal's input ended, no API), the
        // question ends unanswered.
        drop(slot);
        async move {
            let _guard = guard;
            // Answered elsewhere or dropped: the terminal stops reading.
            let _unwanted = unwanted;
            answered.await.ok()
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::runtime::interaction::{self as messages, PromptView};
    use serde_json::json;
    use std::sync::mpsc;

    /// A person at the terminal who fills the form with `{"ok": true}`
    /// once the test lets them.
    struct Person(Mutex<mpsc::Receiver<()>>);

    impl Prompter for Person {
        fn ask(&self, _: &PromptView) -> Option<messages::Answer> {
            None
        }
        fn withdrawn(&self, _: &PromptView) {}
        fn fill(&self, _: &FormView) -> Option<Value> {
            self.0.lock().unwrap().recv().ok()?;
            Some(json!({ "ok": true }))
        }
    }

    /// The desk, the person, their go-ahead, and the step's wait.
    type Asked = (
        Arc<QuestionDesk>,
        Arc<dyn Prompter>,
        mpsc::Sender<()>,
        BoxFuture<'static, Option<Answer>>,
    );

    fn asked() -> Asked {
        let (go, gate) = mpsc::channel();
        let person: Arc<dyn Prompter> = Arc::new(Person(Mutex::new(gate)));
        let desk = Arc::new(QuestionDesk::default());
        let asker = RunAsker::new(
            &[InteractorSpec::Terminal(Arc::clone(&person))],
            Some(Arc::clone(&desk)),
        );
        let fields = json!({"type": "object", "properties": {"ok": {"type": "boolean"}}});
        let asking = asker.ask(Question {
            stage_id: "review".into(),
            stage_execution_id: "e1".into(),
            prompt: "ok?".into(),
            fields: Schema::compile(fields).unwrap(),
        });
        (desk, person, go, asking)
    }

    /// Waits for the terminal's thread to end: it holds the other handle
    /// on the person until then.
    fn terminal_done(person: &Arc<dyn Prompter>) {
        while Arc::strong_count(person) > 1 {
            std::thread::yield_now();
        }
    }

    /// The terminal answered first: the API's answer, arriving before the
    /// step took the terminal's, is refused rather than also told "done".
    #[tokio::test]
    async fn an_api_answer_after_the_terminals_is_refused() {
        let (desk, person, go, asking) = asked();
        go.send(()).unwrap();
        terminal_done(&person);
        assert_eq!(
            desk.answer("e1", json!({ "ok": false }), "alice"),
            Err(Refused::NotAsked)
        );
        let answer = asking.await.unwrap();
        assert_eq!(answer.by, "terminal");
        assert_eq!(answer.content, json!({ "ok": true }));
    }

    /// The API answered first: the step takes that answer, whatever the
    /// terminal sends after.
    #[tokio::test]
    async fn the_terminal_after_the_apis_answer_is_not_used() {
        let (desk, person, go, asking) = asked();
        assert_eq!(desk.answer("e1", json!({ "ok": false }), "alice"), Ok(()));
        go.send(()).unwrap();
        terminal_done(&person);
        let answer = asking.await.unwrap();
        assert_eq!(answer.by, "api: alice");
        assert_eq!(answer.content, json!({ "ok": false }));
        assert!(desk.list().is_empty());
    }
}
