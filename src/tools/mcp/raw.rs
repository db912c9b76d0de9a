//! Requests whose answers troupe reads as the JSON the server sent, not
//! through the SDK's types. Those refuse a whole answer for one part they
//! do not know: a listing with one malformed tool (a schema that is no
//! object, a hint that is no boolean), a result with one content block of
//! a kind newer than the SDK. troupe leaves out or names that part alone
//! (`Listed::from_entries`, `result::render_redacted`). The SDK's union of
//! results falls back to the raw object for an answer none of its types
//! take, so both paths end in JSON here.

use futures::FutureExt;
use rmcp::model::{
    CancelledNotificationParam, ClientRequest, CustomRequest, CustomResult, ServerResult,
};
use rmcp::service::{PeerRequestOptions, RoleClient};
use rmcp::{Peer, ServiceError};
use serde_json::{Value, json};

/// `method` with `params`; the answer as JSON.
pub(super) async fn request(
    peer: &Peer<RoleClient>,
    method: &str,
    params: Option<Value>,
) -> Result<Value, ServiceError> {
    let request = ClientRequest::CustomRequest(CustomRequest::new(method, params));
    Ok(json_of(peer.send_request(request).await?))
}

/// One `tools/call`, its answer as JSON. Dropping the future (the call's
/// timeout, a cancel) tells the server with `notifications/cancelled`, as
/// the SDK's own call does.
pub(super) async fn call(
    peer: &Peer<RoleClient>,
    tool: &str,
    args: &Value,
) -> Result<Value, ServiceError> {
    let mut params = json!({ "name": tool });
    if args.is_object() {
        params["arguments"] = args.clone();
    }
    let request = ClientRequest::CustomRequest(CustomRequest::new("tools/call", Some(params)));
    let handle = peer
        .send_request_with_option(request, PeerRequestOptions::no_options())
        .await?;
    let mut abandoned = Abandoned {
        peer: peer.clone(),
        id: Some(handle.id.clone()),
    };
    let answer = handle.await_response().await;
    abandoned.id = None;
    Ok(json_of(answer?))
}

fn json_of(answer: ServerResult) -> Value {
    match answer {
        ServerResult::CustomResult(CustomResult(raw)) => raw,
        typed => serde_json::to_value(&typed).unwrap_or(Value::Null),
    }
}

/// A call whose caller went away before its answer: the server is told.
struct Abandoned {
    peer: Peer<RoleClient>,
    id: Option<rmcp::model::RequestId>,
}

impl Drop for Abandoned {
    fn drop(&mut self) {
        let Some(id) = self.id.take() else {
            return;
        };
        // Put on the connection's outgoing queue now, within this drop
        // (as the SDK's own call does): the first poll of the send queues
        // the message, and only the wait for it to be written is given up.
        // Sent from a task instead, a fail-fast's cancels could still be
        // waiting for that task when the pool stopped the server.
        // Unconstrained: a task that spent its scheduling budget would
        // otherwise see the send pending however much room the queue has.
        let _ = tokio::task::unconstrained(self.peer.notify_cancelled(
            CancelledNotificationParam::new(
                Some(id),
                Some("request abandoned by the caller".to_owned()),
            ),
        ))
        .now_or_never();
    }
}
