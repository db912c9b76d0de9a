//! The tool-call actor: one per proposed call. It runs the tool under the
//! stage's cancellation token, so a strict cancel drops the work (and kills
//! child processes) and the call is recorded as cancelled.

use std::panic::AssertUnwindSafe;

use actix::prelude::*;
use futures::FutureExt;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::tools::ToolEnv;
use crate::tools::exec::{ToolError, execute};

/// Runs one tool call, then stops.
#[derive(Debug, Default)]
pub struct ToolCallActor;

impl Actor for ToolCallActor {
    type Context = Context<Self>;
}

/// The request to a tool-call actor.
#[derive(Debug)]
pub struct RunTool {
    pub name: String,
    pub args: Value,
    /// The root the call is confined to, and its caps.
    pub env: ToolEnv,
    pub cancel: CancellationToken,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolOutcome {
    Succeeded(String),
    Failed(ToolError),
    Cancelled,
}

impl Message for RunTool {
    type Result = ToolOutcome;
}

impl Handler<RunTool> for ToolCallActor {
    type Result = ResponseActFuture<Self, ToolOutcome>;

    fn handle(&mut self, msg: RunTool, _ctx: &mut Context<Self>) -> Self::Result {
        let fut = async move {
            let run = AssertUnwindSafe(execute(&msg.env, &msg.name, &msg.args, &msg.cancel))
                .catch_unwind();
            match run.await {
                _ if msg.cancel.is_cancelled() => ToolOutcome::Cancelled,
                Ok(Ok(out)) => ToolOutcome::Succeeded(out),
                Ok(Err(err)) => ToolOutcome::Failed(err),
                Err(_) => ToolOutcome::Failed(ToolError::Terminal {
                    code: "ToolPanicked",
                    message: format!("tool `{}` crashed", msg.name),
                }),
            }
        };
        Box::pin(fut.into_actor(self).map(|outcome, _act, ctx| {
            ctx.stop();
            outcome
        }))
    }
}
