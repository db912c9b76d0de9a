//! Tool dispatch: one response's calls, approved one at a time in call
//! order, then run concurrently (bounded), each on its own tool-call
//! actor, with TOOL_CALL/post hooks on the results, which come back in
//! call order.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use actix::Actor;
use futures::StreamExt;
use serde_json::{Value, json};

use super::approval::{Approved, tool_terminal};
use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::StageDefinition;
use crate::error::{Code, ErrorClass, HasCode};
use crate::provider::ToolCall;
use crate::runtime::events::EventName;
use crate::runtime::hooks::SlotOutcome;
use crate::runtime::tool_call::{RunTool, ToolCallActor, ToolOutcome};
use crate::tools::exec::ToolOutput;
use crate::tools::{ModelError, ToolEnv, ToolError};

impl StageRun {
    /// Runs one response's tool calls: approvals first, one at a time in
    /// call order (so prompts reach people in order), then the approved
    /// calls concurrently (bounded); results come back in call order.
    pub(super) async fn run_tools(
        &self,
        def: &StageDefinition,
        calls: &[ToolCall],
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Vec<String> {
        whereabouts.borrow_mut().tool_calls = calls
            .iter()
            .map(|c| (c.id.clone(), c.name.clone()))
            .collect();
        let mut approved = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            approved.push(self.approve(def, call, i, whereabouts).await);
        }
        // One call (the common case) needs no concurrency: a bounded
        // stream builds a FuturesUnordered, boxes the call into a task of
        // its own and wakes through it, ~3% of a fan-out sibling's time.
        let results = if let [call] = calls
            && let Some(approval) = approved.pop()
        {
            vec![self.run_approved(call, approval).await]
        } else {
            futures::stream::iter(
                calls
                    .iter()
                    .zip(approved)
                    .map(|(call, approval)| self.run_approved(call, approval)),
            )
            .buffered(self.kit.settings.tool_concurrency.max(1))
            .collect::<Vec<String>>()
            .await
        };
        whereabouts.borrow_mut().tool_calls.clear();
        results
    }

    /// Runs an approved call; a refused one's result is already made.
    async fn run_approved(&self, call: &ToolCall, approval: Result<Approved, String>) -> String {
        match approval {
            Ok(approved) => self.execute_tool(call, approved).await,
            Err(content) => content,
        }
    }

    /// Executes one approved call, then lets TOOL_CALL/post hooks see (and
    /// transforms rewrite) its result.
    async fn execute_tool(&self, call: &ToolCall, approved: Approved) -> String {
        let Approved { args, rewritten } = approved;
        if !self.kit.hooks.has("TOOL_CALL/post", Some(&call.name)) {
            return self.run_tool_actor(call, args, rewritten).await;
        }
        let result = self.run_tool_actor(call, args.clone(), rewritten).await;
        let fields =
            json!({"tool": call.name, "callId": call.id, "arguments": args, "result": result});
        match Box::pin(self.hook("TOOL_CALL/post", Some(&call.name), fields)).await {
            // A transform that dropped or retyped the result withholds it,
            // rather than letting the one it meant to change through.
            SlotOutcome::Proceed(payload) => match payload.get("result") {
                Some(Value::String(r)) => r.clone(),
                _ => tool_terminal(
                    "HookFailed",
                    "a transform hook at TOOL_CALL/post left no `result` text, so the result was withheld".to_owned(),
                ),
            },
            // The call already ran: a post guard or failed transform
            // withholds its result from the model.
            SlotOutcome::Denied { hook, reason } => tool_terminal(
                "HookDenied",
                format!("guard hook `{hook}` withheld this result: {reason}"),
            ),
            SlotOutcome::Failed { hook, error } => tool_terminal(
                "HookFailed",
                format!("transform hook `{hook}` failed on this result: {error}"),
            ),
        }
    }

    /// Runs `name` with `args` on a tool-call actor of its own, under a
    /// child of this execution's token, in the run's tool environment
    /// (root, sandbox, MCP servers, network switch).
    pub(super) async fn call_on_actor(&self, name: &Arc<str>, args: Value) -> ToolOutcome {
        ToolCallActor
            .start()
            .send(RunTool {
                name: Arc::clone(name),
                args,
                env: ToolEnv::new(self.kit.settings.root.clone())
                    .with_sandbox(self.kit.settings.sandbox.clone())
                    .with_mcp(self.kit.settings.mcp.clone())
                    .with_deny_network(self.kit.settings.deny_network || self.network_denied()),
                cancel: self.cancel.child(),
            })
            .await
            .unwrap_or(ToolOutcome::Failed(ToolError::Terminal {
                code: "ToolActorLost",
                message: "the tool-call actor stopped without answering".to_owned(),
            }))
    }

    /// Runs one approved call on its own tool-call actor. Arguments a
    /// transform rewrote are audited as the call starts: the proposed ones
    /// are in `ToolInvocationProposed`, and the log says what ran.
    async fn run_tool_actor(&self, call: &ToolCall, args: Value, rewritten: bool) -> String {
        let ev = |name: EventName| self.tool_event(name, call);
        let started = ev(EventName::ToolInvocationStarted);
        self.emit(if rewritten {
            started.with("arguments", args.to_string())
        } else {
            started
        });
        let outcome = self.call_on_actor(&call.name, args).await;
        match outcome {
            ToolOutcome::Succeeded(ToolOutput { text: out, .. }) => {
                self.emit(ev(EventName::ToolInvocationSucceeded).with("bytes", out.len()));
                out
            }
            ToolOutcome::Failed(err) => {
                self.emit(
                    ev(EventName::ToolInvocationFailed)
                        .with("code", err.code().to_string())
                        .with("message", err.to_string()),
                );
                ModelError::new(err.code(), err.to_string()).to_content()
            }
            ToolOutcome::Cancelled => {
                self.emit(ev(EventName::ToolInvocationCancelled));
                ModelError::new(
                    Code {
                        class: ErrorClass::Cancellation,
                        name: "ToolCancelled",
                    },
                    "the tool call was cancelled",
                )
                .to_content()
            }
        }
    }
}
