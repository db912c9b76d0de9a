//! The interactor of the control API (`troupe run --remote`): it holds
//! the prompts put to it until a client answers one (`troupe approve`,
//! `POST /v1/runs/{id}/pending/{proposal}`), like a terminal that shows
//! them all at once. First answer wins across every interactor, as ever;
//! a withdrawn prompt leaves the list; the client's name is audited with
//! its answer. A remembering answer (`approve-same`, `approve-prefix`)
//! leaves a rule, as a person's at the terminal does: it answers the
//! prompts waiting that it matches at once, and those that come later.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use serde::Serialize;
use troupe_actors::InteractionId;

use super::messages::{Answer, Answered, Prompt, Released, Unprompt};
use super::remember::{Remembered, answer_by};

/// A pending approval as a client sees it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct PendingView {
    pub proposal_id: String,
    pub stage_id: String,
    pub stage_execution_id: String,
    pub tool: String,
    pub args_digest: String,
    pub args_summary: String,
    /// The whole arguments, as JSON text (the summary is shortened).
    pub args: std::sync::Arc<str>,
}

/// Holds the prompts put to the API until a client answers.
#[derive(Debug, Default)]
pub struct RemoteInteractor {
    pending: BTreeMap<InteractionId, Prompt>,
    /// What clients' remembering answers left, each described with the
    /// client who gave it.
    remembered: Vec<Remembered>,
}

impl Actor for RemoteInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for RemoteInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, _ctx: &mut Context<Self>) {
        if let Some(msg) = answer_by(&self.remembered, msg) {
            self.pending.insert(msg.id, msg);
        }
    }
}

impl Handler<Unprompt> for RemoteInteractor {
    type Result = ();

    fn handle(&mut self, msg: Unprompt, _ctx: &mut Context<Self>) {
        self.pending.remove(&msg.id);
        msg.release.do_send(Released {
            id: msg.id,
            responder: msg.responder,
        });
    }
}

/// The prompts waiting for a client, oldest first.
#[derive(Debug, Message)]
#[rtype(result = "Vec<PendingView>")]
pub struct ListPending;

impl Handler<ListPending> for RemoteInteractor {
    type Result = MessageResult<ListPending>;

    fn handle(&mut self, _msg: ListPending, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(
            self.pending
                .values()
                .map(|p| PendingView {
                    proposal_id: p.request.proposal_id.clone(),
                    stage_id: p.request.stage_id.clone(),
                    stage_execution_id: p.request.stage_execution_id.clone(),
                    tool: p.request.tool.clone(),
                    args_digest: p.request.args_digest.clone(),
                    args_summary: p.request.args_summary.clone(),
                    args: std::sync::Arc::clone(&p.args_json),
                })
                .collect(),
        )
    }
}

/// A client's answer to the prompt of `proposal_id`.
#[derive(Debug, Message)]
#[rtype(result = "Result<(), NotPending>")]
pub struct AnswerRemote {
    pub proposal_id: String,
    pub answer: Answer,
    /// The client's name (never a token), audited with the answer.
    pub client: String,
}

/// No prompt of that proposal is waiting: it was decided, withdrawn, or
/// never raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NotPending;

impl Handler<AnswerRemote> for RemoteInteractor {
    type Result = ResponseActFuture<Self, Result<(), NotPending>>;

    /// Told "done" only once the hub says this answer decided the
    /// prompt: one another interactor (or a timeout, or the step's end)
    /// decided meanwhile is late, refused, and leaves no rule behind.
    fn handle(&mut self, msg: AnswerRemote, _ctx: &mut Context<Self>) -> Self::Result {
        let Some(id) = self
            .pending
            .iter()
            .find(|(_, p)| p.request.proposal_id == msg.proposal_id)
            .map(|(id, _)| *id)
        else {
            return Box::pin(fut::ready(Err(NotPending)));
        };
        let Some(prompt) = self.pending.remove(&id) else {
            return Box::pin(fut::ready(Err(NotPending)));
        };
        let rule = Remembered::from_answer(msg.answer, &prompt.request, &prompt.args_json);
        let decided = prompt.hub.send(Answered {
            id,
            responder: prompt.responder,
            answer: msg.answer,
            rule: Some(Arc::from(format!("client: {}", msg.client))),
        });
        Box::pin(
            async move { decided.await.unwrap_or(false) }
                .into_actor(self)
                .map(move |decided, this, _ctx| {
                    if !decided {
                        return Err(NotPending);
                    }
                    if let Some(mut rule) = rule {
                        rule.describe =
                            Arc::from(format!("{} (client: {})", rule.describe, msg.client));
                        this.remembered.push(rule);
                        let waiting = std::mem::take(&mut this.pending);
                        this.pending = waiting
                            .into_iter()
                            .filter_map(|(id, p)| answer_by(&this.remembered, p).map(|p| (id, p)))
                            .collect();
                    }
                    Ok(())
                }),
        )
    }
}

/// Where the control API finds the run's remote interactor once the hub
/// started it.
#[derive(Debug, Default)]
pub struct RemoteDesk(OnceLock<Addr<RemoteInteractor>>);

impl RemoteDesk {
    pub fn set(&self, addr: Addr<RemoteInteractor>) {
        let _ = self.0.set(addr);
    }

    pub fn get(&self) -> Option<&Addr<RemoteInteractor>> {
        self.0.get()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::runtime::interaction::grants::GrantRequest;
    use serde_json::json;

    /// Records what the interactor answers.
    #[derive(Default)]
    struct Hub(Vec<(InteractionId, Answer, Option<String>)>);

    impl Actor for Hub {
        type Context = Context<Self>;
    }

    impl Handler<Answered> for Hub {
        type Result = bool;
        fn handle(&mut self, msg: Answered, _: &mut Context<Self>) -> bool {
            self.0
                .push((msg.id, msg.answer, msg.rule.map(|r| r.to_string())));
            // Prompts from 100 on were decided elsewhere first.
            msg.id < 100
        }
    }

    impl Handler<Released> for Hub {
        type Result = ();
        fn handle(&mut self, _: Released, _: &mut Context<Self>) {}
    }

    #[derive(Message)]
    #[rtype(result = "Vec<(InteractionId, Answer, Option<String>)>")]
    struct Seen;

    impl Handler<Seen> for Hub {
        type Result = MessageResult<Seen>;
        fn handle(&mut self, _: Seen, _: &mut Context<Self>) -> Self::Result {
            MessageResult(self.0.clone())
        }
    }

    /// The proposals waiting on `remote`, oldest first.
    async fn waiting(remote: &Addr<RemoteInteractor>) -> Vec<String> {
        remote
            .send(ListPending)
            .await
            .unwrap()
            .into_iter()
            .map(|p| p.proposal_id)
            .collect()
    }

    fn prompt(id: InteractionId, text: &str, hub: &Addr<Hub>) -> Prompt {
        let args = json!({ "text": text });
        Prompt {
            id,
            responder: 0,
            request: Arc::new(GrantRequest::sample(&format!("p{id}"), "Echo", &args)),
            args_json: Arc::from(args.to_string()),
            hub: hub.clone().recipient(),
            release: hub.clone().recipient(),
        }
    }

    /// `troupe approve --same` remembers, as the terminal's `a` does: the
    /// waiting prompts it matches are answered at once, later ones as
    /// they come, and the others still wait.
    #[actix::test]
    async fn a_remembering_answer_answers_what_it_matches_now_and_later() {
        let hub = Hub::default().start();
        let remote = RemoteInteractor::default().start();
        for (id, text) in [(1, "same"), (2, "same"), (3, "other")] {
            remote.send(prompt(id, text, &hub)).await.unwrap();
        }
        let answered = remote
            .send(AnswerRemote {
                proposal_id: "p1".into(),
                answer: Answer::ApproveSame,
                client: "alice".into(),
            })
            .await
            .unwrap();
        assert_eq!(answered, Ok(()));
        remote.send(prompt(4, "same", &hub)).await.unwrap();
        let pending = waiting(&remote).await;
        assert_eq!(pending, ["p3"]);
        let seen = hub.send(Seen).await.unwrap();
        let rule = "approve-same: Echo with arguments";
        assert_eq!(seen.len(), 3, "{seen:?}");
        assert_eq!(
            seen[0],
            (1, Answer::ApproveSame, Some("client: alice".into()))
        );
        for (at, id) in [(1, 2), (2, 4)] {
            let (got, answer, by) = &seen[at];
            assert_eq!((*got, *answer), (id, Answer::Approve));
            let by = by.as_deref().unwrap();
            assert!(
                by.starts_with(rule) && by.ends_with("(client: alice)"),
                "{by}"
            );
        }
        // A plain answer leaves no rule.
        remote
            .send(AnswerRemote {
                proposal_id: "p3".into(),
                answer: Answer::Approve,
                client: "bob".into(),
            })
            .await
            .unwrap()
            .unwrap();
        remote.send(prompt(5, "other", &hub)).await.unwrap();
        let pending = remote.send(ListPending).await.unwrap();
        assert_eq!(pending.len(), 1);
    }

    /// An answer the hub no longer takes (another interactor, a timeout
    /// or the step's end decided first) is refused, and its rule is not
    /// kept: the client is not told "done" for an answer that did nothing.
    #[actix::test]
    async fn an_answer_decided_elsewhere_first_is_refused_and_keeps_no_rule() {
        let hub = Hub::default().start();
        let remote = RemoteInteractor::default().start();
        remote.send(prompt(100, "same", &hub)).await.unwrap();
        let answered = remote
            .send(AnswerRemote {
                proposal_id: "p100".into(),
                answer: Answer::ApproveSame,
                client: "alice".into(),
            })
            .await
            .unwrap();
        assert_eq!(answered, Err(NotPending));
        remote.send(prompt(1, "same", &hub)).await.unwrap();
        let pending = waiting(&remote).await;
        assert_eq!(pending, ["p1"], "a refused answer left a rule");
        assert_eq!(hub.send(Seen).await.unwrap().len(), 1);
    }
}
