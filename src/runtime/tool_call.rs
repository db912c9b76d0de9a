//! The tool-call actor: one per proposed call. It runs the tool under the
//! stage's cancellation token, so a strict cancel drops the work (and kills
//! child processes) and the call is recorded as cancelled.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;

use crate::runtime::cancel::CancelScope;
use actix::prelude::*;
use futures::FutureExt;
use serde_json::Value;

use crate::tools::ToolEnv;
use crate::tools::ToolError;
use crate::tools::exec::{ToolOutput, execute_output};

/// Runs one tool call, then stops.
#[derive(Debug, Default)]
pub struct ToolCallActor;

impl Actor for ToolCallActor {
    type Context = Context<Self>;
}

/// The request to a tool-call actor.
#[derive(Debug)]
pub struct RunTool {
    pub name: Arc<str>,
    pub args: Value,
    /// The root the call is confined to, and its caps.
    pub env: ToolEnv,
    /// The call's scope, a child of its execution's: checked (marks
    /// first) before the call runs, its token watched while it runs.
    pub cancel: CancelScope,
}

/// How a tool call ended.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolOutcome {
    Succeeded(ToolOutput),
    Failed(ToolError),
    Cancelled,
}

impl Message for RunTool {
    type Result = ToolOutcome;
}

impl Handler<RunTool> for ToolCallActor {
    type Result = ResponseActFuture<Self, ToolOutcome>;

    fn handle(&mut self, msg: RunTool, _ctx: &mut Context<Self>) -> Self::Result {
        // Cancelled before it ran (fail-fast tripped while the call waited
        // for its actor to be polled): nothing is run, and the teardown
        // waits a turn of the run queue, so that the thousands of stage
        // executions cancelled with it record their cancellation first.
        if msg.cancel.is_cancelled() {
            return Box::pin(
                tokio::task::yield_now()
                    .into_actor(self)
                    .map(|(), _act, ctx| {
                        ctx.stop();
                        ToolOutcome::Cancelled
                    }),
            );
        }
        let fut = async move {
            let run = AssertUnwindSafe(execute_output(
                &msg.env,
                &msg.name,
                &msg.args,
                msg.cancel.token(),
            ))
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn write_call(root: &Path, cancel: CancelScope) -> ToolOutcome {
        let args = serde_json::json!({"path": "made.txt", "content": "x"});
        actix::System::new().block_on(async move {
            ToolCallActor
                .start()
                .send(RunTool {
                    name: "Write".into(),
                    args,
                    env: ToolEnv::new(root.to_path_buf()),
                    cancel,
                })
                .await
                .expect("the tool-call actor answers")
        })
    }

    #[test]
    fn a_call_cancelled_before_its_actor_runs_it_does_nothing() {
        let root = tempfile::tempdir().expect("a temp folder");
        let cancelled = CancelScope::root().child();
        cancelled.stop();
        assert_eq!(write_call(root.path(), cancelled), ToolOutcome::Cancelled);
        assert!(!root.path().join("made.txt").exists());
        // Under a relay whose task has not forwarded the group's cancel
        // yet: the marks refuse it all the same.
        let group = CancelScope::root();
        let (relay, _forward) = group.relay();
        let execution = relay.child();
        group.cancel("sibling failed");
        assert!(!execution.token().is_cancelled());
        assert_eq!(
            write_call(root.path(), execution.child()),
            ToolOutcome::Cancelled
        );
        assert!(!root.path().join("made.txt").exists());
        // The same call, not cancelled, writes the file.
        let outcome = write_call(root.path(), CancelScope::root().child());
        assert!(matches!(outcome, ToolOutcome::Succeeded(_)), "{outcome:?}");
        assert!(root.path().join("made.txt").is_file());
    }
}
