//! Approving one proposed tool call: its arguments must be a JSON object
//! and the tool must exist; a call in `allowedTools` is approved, any
//! other is put to the interactors, whose approval mints a one-shot grant
//! that this call consumes; TOOL_CALL/pre guards then have the last word.
//! Arguments a TOOL_CALL/pre transform rewrote are approved again by what
//! approved the call (a grant was for other arguments: it asks again).
//! A refused call's result is the typed error the model reads.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Value, json};

use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::mcp::allows;
use crate::definition::{StageDefinition, is_builtin};
use crate::error::{Code, ErrorClass};
use crate::provider::ToolCall;
use crate::runtime::events::{EventName, FieldValue};
use crate::runtime::hooks::{HookError, SlotOutcome};
use crate::runtime::interaction::{GrantDecision, GrantRequest, Raise, args_digest, args_summary};
use crate::tools::ModelError;

/// An approved call: the arguments it runs with, and whether a
/// TOOL_CALL/pre transform rewrote the proposed ones (the audit log then
/// records the rewritten ones as the call starts).
pub(super) struct Approved {
    pub args: Value,
    pub rewritten: bool,
}

/// What approved a call, which approves its rewritten arguments too.
enum Basis {
    /// `allowedTools`: the tool, whatever its arguments.
    Tool,
    /// The chat's mode, whose rules may read the arguments.
    Mode,
    /// A one-shot grant for arguments with this digest.
    Grant(String),
}

impl StageRun {
    /// A call its TOOL_CALL/pre transform stopped (it failed, or left no
    /// arguments): the call's end in the log, as a failure, since it was
    /// proposed and approved and will not run.
    pub(super) fn pre_hook_failed(&self, call: &ToolCall, message: &str) {
        self.emit(
            self.tool_event(EventName::ToolInvocationFailed, call)
                .with("code", HookError::CODE)
                .with("message", message),
        );
    }

    /// The authority stack for one proposed call: the arguments
    /// must be a JSON object and the tool must exist; a call in
    /// `allowedTools` is approved; any other raises a `grantStageTool`
    /// interaction whose approval mints a one-shot token that this call
    /// consumes. `Err` holds the typed result the model gets instead.
    pub(super) async fn approve(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        index: usize,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<Approved, String> {
        let (args, basis) = self.authorize(def, call, index, whereabouts).await?;
        if !self.kit.hooks.has("TOOL_CALL/pre", Some(&call.name)) {
            return Ok(Approved {
                args,
                rewritten: false,
            });
        }
        // Guard hooks run on every approved call and win in any mode;
        // transforms then may rewrite the arguments.
        let fields = json!({"tool": call.name, "callId": call.id, "arguments": args});
        let hook_failed = |message: String| {
            self.pre_hook_failed(call, &message);
            tool_terminal("HookFailed", message)
        };
        match Box::pin(self.hook("TOOL_CALL/pre", Some(&call.name), fields)).await {
            SlotOutcome::Proceed(payload) => match payload.get("arguments") {
                Some(v) if *v == args => Ok(Approved {
                    args,
                    rewritten: false,
                }),
                Some(v @ Value::Object(_)) => {
                    let args = v.clone();
                    self.reapprove(def, call, index, whereabouts, &args, basis)
                        .await?;
                    Ok(Approved {
                        args,
                        rewritten: true,
                    })
                }
                _ => Err(hook_failed(
                    "a transform hook at TOOL_CALL/pre left no `arguments` object, so the call was not run".to_owned(),
                )),
            },
            SlotOutcome::Denied { hook, reason } => {
                self.emit(
                    self.tool_event(EventName::ToolCallDenied, call)
                        .with("by", format!("hook:{hook}"))
                        .with("reason", reason.as_str()),
                );
                Err(tool_terminal(
                    "HookDenied",
                    format!("guard hook `{hook}` denied this call: {reason}"),
                ))
            }
            SlotOutcome::Failed { hook, error } => Err(hook_failed(format!(
                "transform hook `{hook}` failed, so the call was not run: {error}"
            ))),
        }
    }

    /// Approves arguments a transform rewrote by what approved the call:
    /// `allowedTools` names the tool whatever its arguments; the chat's
    /// mode decides again (a rule that no longer matches asks); a grant
    /// was for the proposed arguments, so the person is asked about these.
    async fn reapprove(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        index: usize,
        whereabouts: &Rc<RefCell<Whereabouts>>,
        args: &Value,
        basis: Basis,
    ) -> Result<(), String> {
        let proposal = || {
            format!(
                "{}#a{}t{}c{index}r",
                self.ctx.stage_execution_id,
                whereabouts.borrow().attempt,
                whereabouts.borrow().turn
            )
        };
        match basis {
            Basis::Tool => Ok(()),
            Basis::Grant(digest) if digest == args_digest(args) => Ok(()),
            Basis::Grant(_) => self.grant(def, call, args, proposal(), whereabouts).await,
            Basis::Mode => {
                let Some(mode) = &self.kit.settings.tool_mode else {
                    return Ok(());
                };
                match mode.decide(&call.name, args) {
                    crate::runtime::tool_mode::Verdict::Run(rule) => {
                        self.emit(
                            self.tool_event(EventName::ToolCallApproved, call)
                                .with_static("by", "mode")
                                .with("rule", rule)
                                .with_static("rewritten", "TOOL_CALL/pre"),
                        );
                        Ok(())
                    }
                    crate::runtime::tool_mode::Verdict::Ask => {
                        self.grant(def, call, args, proposal(), whereabouts).await
                    }
                }
            }
        }
    }

    /// The SM decision for one call: allowedTools, or a one-shot grant.
    async fn authorize(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        index: usize,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<(Value, Basis), String> {
        self.emit(
            self.tool_event(EventName::ToolInvocationProposed, call)
                .with("arguments", FieldValue::Text(Arc::clone(&call.arguments))),
        );
        let failed = |name: &'static str, message: String| {
            self.emit(
                self.tool_event(EventName::ToolInvocationFailed, call)
                    .with("code", format!("ToolTerminal/{name}")),
            );
            tool_terminal(name, message)
        };
        let args: Value = match serde_json::from_str(&call.arguments) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                return Err(failed(
                    "InvalidArguments",
                    "tool arguments must be a JSON object".to_owned(),
                ));
            }
        };
        let known = is_builtin(&call.name)
            || self
                .kit
                .settings
                .mcp
                .as_ref()
                .is_some_and(|pool| pool.knows(&call.name));
        if !known {
            return Err(failed(
                "UnknownTool",
                format!("there is no tool `{}`", call.name),
            ));
        }
        if let Some(mode) = &self.kit.settings.tool_mode {
            // A model may name a tool it was not shown (a prompt-injected
            // one will): the chat's tool list bounds every mode, yolo too.
            if !mode.offers(&call.name) {
                self.emit(
                    self.tool_event(EventName::ToolCallDenied, call)
                        .with_static("by", "mode")
                        .with("reason", "not offered"),
                );
                return Err(failed(
                    "NotOffered",
                    format!(
                        "`{}` is not among the tools this chat offers ({})",
                        call.name,
                        mode.offered.join(", ")
                    ),
                ));
            }
            let verdict = mode.decide(&call.name, &args);
            let rule = match &verdict {
                crate::runtime::tool_mode::Verdict::Run(rule) => rule.as_str(),
                crate::runtime::tool_mode::Verdict::Ask => "ask",
            };
            self.emit(
                self.tool_event(EventName::ToolCallModeInvoked, call)
                    .with_static("mode", mode.mode.as_str())
                    .with("rule", rule),
            );
            if let crate::runtime::tool_mode::Verdict::Run(_) = verdict {
                self.emit(
                    self.tool_event(EventName::ToolCallApproved, call)
                        .with_static("by", "mode")
                        .with("rule", rule),
                );
                return Ok((args, Basis::Mode));
            }
        } else if def.allowed_tools.iter().any(|t| allows(t, &call.name)) {
            self.emit(
                self.tool_event(EventName::ToolCallApproved, call)
                    .with_static("by", "allowedTools"),
            );
            return Ok((args, Basis::Tool));
        }
        let proposal = {
            let p = whereabouts.borrow();
            format!(
                "{}#a{}t{}c{index}",
                self.ctx.stage_execution_id, p.attempt, p.turn
            )
        };
        self.grant(def, call, &args, proposal, whereabouts).await?;
        let digest = args_digest(&args);
        Ok((args, Basis::Grant(digest)))
    }

    /// Puts `args` for `call` to the interactors as proposal `proposal_id`;
    /// an approval mints the one-shot token this consumes.
    async fn grant(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        args: &Value,
        proposal_id: String,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<(), String> {
        let (attempt, ledger) = {
            let mut p = whereabouts.borrow_mut();
            (p.attempt, Rc::clone(p.grants.get_or_insert_default()))
        };
        let request = GrantRequest {
            workflow_run_id: self.ctx.workflow_run_id.to_string(),
            stage_execution_id: self.ctx.stage_execution_id.to_string(),
            stage_id: self.stage.id.clone(),
            attempt,
            proposal_id,
            tool: call.name.to_string(),
            args_digest: args_digest(args),
            args_summary: args_summary(args),
        };
        let decision = match &self.hub {
            Some(hub) => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                whereabouts.borrow_mut().raised = true;
                // The hub records the interaction on its own thread.
                self.flush();
                hub.do_send(Raise {
                    request: request.clone(),
                    args_json: args.to_string(),
                    reply,
                });
                answer.await.unwrap_or(GrantDecision::Denied {
                    reason: "the interaction hub is gone".to_owned(),
                })
            }
            None => GrantDecision::Denied {
                reason: "no interactor can approve it (headless)".to_owned(),
            },
        };
        let deny = |reason: String| {
            self.emit(
                self.tool_event(EventName::ToolCallDenied, call)
                    .with("proposalId", request.proposal_id.as_str())
                    .with("reason", reason.as_str()),
            );
            tool_terminal(
                "GrantDenied",
                format!(
                    "`{}` is outside this stage's allowedTools and was not granted ({reason}); continue with the allowed tools: {}",
                    call.name,
                    def.allowed_tools.join(", ")
                ),
            )
        };
        match decision {
            GrantDecision::Denied { reason } => Err(deny(reason)),
            GrantDecision::Approved { by } => {
                let mut ledger = ledger.borrow_mut();
                ledger.mint(&request);
                self.emit(
                    self.event(EventName::StageGranted)
                        .tool(Arc::clone(&call.name))
                        .with("proposalId", request.proposal_id.as_str())
                        .with("argsDigest", request.args_digest.as_str())
                        .with("by", by.as_str()),
                );
                match ledger.consume(&request.proposal_id, &call.name, &request.args_digest) {
                    Ok(()) => {
                        self.emit(
                            self.tool_event(EventName::ToolCallApproved, call)
                                .with("by", "grant")
                                .with("proposalId", request.proposal_id.as_str()),
                        );
                        Ok(())
                    }
                    Err(e) => Err(deny(e.to_string())),
                }
            }
        }
    }
}

/// The `{class, code, message}` result of a `ToolTerminal/<name>` error, as
/// the model reads it.
pub(super) fn tool_terminal(name: &'static str, message: impl Into<String>) -> String {
    ModelError::new(
        Code {
            class: ErrorClass::ToolTerminal,
            name,
        },
        message,
    )
    .to_content()
}
