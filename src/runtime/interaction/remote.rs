//! The interactor of the control API (`troupe run --remote`): it holds
//! the prompts put to it until a client answers one (`troupe approve`,
//! `POST /v1/runs/{id}/pending/{proposal}`), like a terminal that shows
//! them all at once. First answer wins across every interactor, as ever;
//! a withdrawn prompt leaves the list; the client's name is audited with
//! its answer.

use std::collections::BTreeMap;
use std::sync::{Arc, OnceLock};

use actix::prelude::*;
use serde::Serialize;
use troupe_actors::InteractionId;

use super::messages::{Answer, Answered, Prompt, Released, Unprompt};

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
}

/// Holds the prompts put to the API until a client answers.
#[derive(Debug, Default)]
pub struct RemoteInteractor {
    pending: BTreeMap<InteractionId, Prompt>,
}

impl Actor for RemoteInteractor {
    type Context = Context<Self>;
}

impl Handler<Prompt> for RemoteInteractor {
    type Result = ();

    fn handle(&mut self, msg: Prompt, _ctx: &mut Context<Self>) {
        self.pending.insert(msg.id, msg);
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
    type Result = Result<(), NotPending>;

    fn handle(&mut self, msg: AnswerRemote, _ctx: &mut Context<Self>) -> Self::Result {
        let id = self
            .pending
            .iter()
            .find(|(_, p)| p.request.proposal_id == msg.proposal_id)
            .map(|(id, _)| *id)
            .ok_or(NotPending)?;
        let prompt = self.pending.remove(&id).ok_or(NotPending)?;
        prompt.hub.do_send(Answered {
            id,
            responder: prompt.responder,
            answer: msg.answer,
            rule: Some(Arc::from(format!("client: {}", msg.client))),
        });
        Ok(())
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
