//! The `tool` and `transform` steps: a tool called with templated
//! arguments and no model (`parsed` is the structured result, or
//! `{text}`), and named values computed with CEL (`parsed` is their
//! object). A tool step's call is a tool call like a model's: its own
//! tool-call actor, its audit events, the `TOOL_CALL/pre` guards, strict
//! cancellation; no approval is asked (the pipeline's author chose it).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::expr::Expr;
use crate::definition::template::{Template, json_text};
use crate::error::{HasCode, ValidationCode};
use crate::provider::ToolCall;
use crate::runtime::events::{EventName, FieldValue};
use crate::runtime::hooks::{HookError, SlotOutcome};
use crate::runtime::tool_call::ToolOutcome;

/// A step's call whose server exited is made again this many times.
const STEP_RESTARTS: usize = 1;
const SERVER_EXITED: &str = "ToolTransient/ServerExited";

impl StageRun {
    /// Runs a `tool` step; `Err` is the step's failure reason.
    pub(super) async fn run_tool_step(
        &self,
        tool: &str,
        args: &Value,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<(Value, Option<Value>), String> {
        let ctx = &self.ctx;
        let args = render_args(args, &|t: &Template| {
            t.render_value(|p| ctx.resolve(p))
                .map_err(|e| format!("{}: {e}", ValidationCode::TemplateUnresolved.code()))
        })?;
        let call = ToolCall {
            id: Arc::from("step"),
            name: Arc::from(tool),
            arguments: json_text(&args).into(),
        };
        self.emit(
            self.tool_event(EventName::ToolInvocationProposed, &call)
                .with("arguments", FieldValue::Text(Arc::clone(&call.arguments))),
        );
        self.emit(
            self.tool_event(EventName::ToolCallApproved, &call)
                .with_static("by", "toolStep"),
        );
        let fields = json!({"tool": tool, "callId": "step", "arguments": args});
        let proposed = args;
        let hook_failed = |message: String| {
            self.pre_hook_failed(&call, &message);
            format!("{}: {message}", HookError::CODE)
        };
        let args = match Box::pin(self.hook("TOOL_CALL/pre", Some(tool), fields)).await {
            SlotOutcome::Proceed(payload) => match payload.get("arguments") {
                Some(v @ Value::Object(_)) => v.clone(),
                _ => {
                    return Err(hook_failed(
                        "a transform hook at TOOL_CALL/pre left no `arguments` object".to_owned(),
                    ));
                }
            },
            SlotOutcome::Denied { hook, reason } => {
                self.emit(
                    self.tool_event(EventName::ToolCallDenied, &call)
                        .with("by", format!("hook:{hook}"))
                        .with("reason", reason.as_str()),
                );
                return Err(format!(
                    "ExtensionHost/HookDenied: guard hook `{hook}` denied the step's call: {reason}"
                ));
            }
            SlotOutcome::Failed { hook, error } => {
                return Err(hook_failed(format!(
                    "transform hook `{hook}` failed: {error}"
                )));
            }
        };
        let ev = |name: EventName| self.tool_event(name, &call);
        let started = ev(EventName::ToolInvocationStarted);
        self.emit(if args == proposed {
            started
        } else {
            started.with("arguments", args.to_string())
        });
        // Kept only when a post hook will want to see them.
        let posted = self
            .kit
            .hooks
            .has("TOOL_CALL/post", Some(tool))
            .then(|| args.clone());
        // In flight: a cancel records it cancelled (`ToolInvocationCancelled`
        // before `StageCancelled`), as a model's call is.
        whereabouts.borrow_mut().tool_calls = vec![(Arc::clone(&call.id), Arc::clone(&call.name))];
        // A server that exited under the call is started again by the
        // next one: the step asks once more (a model would be told and
        // call again; a step has no model to).
        let mut outcome = self.call_on_actor(&call.name, args.clone()).await;
        for _ in 0..STEP_RESTARTS {
            let ToolOutcome::Failed(err) = &outcome else {
                break;
            };
            if err.code().to_string() != SERVER_EXITED {
                break;
            }
            self.emit(
                ev(EventName::ToolInvocationFailed)
                    .with("code", SERVER_EXITED)
                    .with("message", err.to_string())
                    .with("retrying", true),
            );
            self.emit(ev(EventName::ToolInvocationStarted));
            outcome = self.call_on_actor(&call.name, args.clone()).await;
        }
        drop(args);
        whereabouts.borrow_mut().tool_calls.clear();
        match outcome {
            ToolOutcome::Succeeded(out) => {
                self.emit(ev(EventName::ToolInvocationSucceeded).with("bytes", out.text.len()));
                let Some(args) = posted else {
                    let parsed = out.structured.unwrap_or_else(|| json!({"text": out.text}));
                    return Ok((parsed, None));
                };
                // TOOL_CALL/post sees a step's result as it sees a model's
                // call's: a guard withholds it, a transform rewrites it
                // (the step's result is then the rewritten text alone, not
                // structured content the transform never saw).
                let fields =
                    json!({"tool": tool, "callId": "step", "arguments": args, "result": out.text});
                match Box::pin(self.hook("TOOL_CALL/post", Some(tool), fields)).await {
                    SlotOutcome::Proceed(payload) => match payload.get("result") {
                        Some(Value::String(r)) if *r == out.text => {
                            let parsed = out.structured.unwrap_or_else(|| json!({"text": out.text}));
                            Ok((parsed, None))
                        }
                        Some(Value::String(r)) => Ok((json!({ "text": r }), None)),
                        _ => Err("ExtensionHost/HookFailed: a transform hook at TOOL_CALL/post left no `result` text, so the step's result was withheld".to_owned()),
                    },
                    SlotOutcome::Denied { hook, reason } => Err(format!(
                        "ExtensionHost/HookDenied: guard hook `{hook}` withheld the step's result: {reason}"
                    )),
                    SlotOutcome::Failed { hook, error } => Err(format!(
                        "ExtensionHost/HookFailed: transform hook `{hook}` failed on the step's result: {error}"
                    )),
                }
            }
            ToolOutcome::Failed(err) => {
                self.emit(
                    ev(EventName::ToolInvocationFailed)
                        .with("code", err.code().to_string())
                        .with("message", err.to_string()),
                );
                Err(format!("{}: {err}", err.code()))
            }
            ToolOutcome::Cancelled => {
                self.emit(ev(EventName::ToolInvocationCancelled));
                Err("Cancellation/ToolCancelled: the step's call was cancelled".to_owned())
            }
        }
    }

    /// Runs a `transform` step: each expression over `ctx`.
    pub(super) fn run_transform(
        &self,
        set: &[(String, Expr)],
    ) -> Result<(Value, Option<Value>), String> {
        let mut out = Map::new();
        for (name, expr) in set {
            let v = self.ctx.eval(expr).map_err(|e| {
                format!("{}: `{name}`: {e}", ValidationCode::ExpressionFailed.code())
            })?;
            out.insert(name.clone(), v);
        }
        Ok((Value::Object(out), None))
    }
}

/// Renders every string of `args` as a template.
fn render_args(
    args: &Value,
    render: &dyn Fn(&Template) -> Result<Value, String>,
) -> Result<Value, String> {
    Ok(match args {
        Value::String(s) => match Template::parse(s) {
            Ok(t) => render(&t)?,
            Err(e) => {
                return Err(format!(
                    "{}: {}",
                    ValidationCode::TemplateSyntax.code(),
                    e.message
                ));
            }
        },
        Value::Array(items) => Value::Array(
            items
                .iter()
                .map(|v| render_args(v, render))
                .collect::<Result<_, _>>()?,
        ),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), render_args(v, render)?)))
                .collect::<Result<_, String>>()?,
        ),
        other => other.clone(),
    })
}

impl StageRun {
    /// Runs a `human` step: the rendered prompt and the form go to the
    /// run's asker; `Err` says why no answer came (the step then fails or
    /// is skipped, as its `otherwise` says).
    pub(super) async fn run_human_step(
        &self,
        prompt: &Template,
        fields: &crate::definition::schema::Schema,
        timeout: Option<std::time::Duration>,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Result<Value, String> {
        use crate::runtime::ask::Question;
        let text = prompt
            .render_with(|p| self.ctx.resolve(p))
            .map_err(|e| format!("{}: {e}", ValidationCode::TemplateUnresolved.code()))?;
        self.emit(
            self.event(EventName::InteractionRaised)
                .with("kind", "question")
                .with("prompt", text.as_str()),
        );
        // Open until answered here; a cancel meanwhile records it
        // withdrawn (see `Whereabouts::question`).
        whereabouts.borrow_mut().question = true;
        let unanswered = |outcome: &'static str, why: String| {
            whereabouts.borrow_mut().question = false;
            self.emit(
                self.event(EventName::InteractionAnswered)
                    .with("kind", "question")
                    .with("outcome", outcome),
            );
            Err(format!("Session/HumanUnanswered: {why}"))
        };
        let Some(asker) = self.kit.settings.asker.clone() else {
            return unanswered(
                "noInteractor",
                "no one to ask (headless, and no answers rule for this step)".to_owned(),
            );
        };
        // The asker may record what it does on another thread.
        self.flush();
        let ask = asker.ask(Question {
            stage_id: self.stage.id.clone(),
            stage_execution_id: self.ctx.stage_execution_id.to_string(),
            prompt: text,
            fields: fields.clone(),
        });
        let answer = match timeout {
            Some(limit) => match tokio::time::timeout(limit, ask).await {
                Ok(answer) => answer,
                Err(_) => {
                    return unanswered(
                        "timedOut",
                        format!(
                            "no answer within {}",
                            crate::definition::duration::format_duration(limit)
                        ),
                    );
                }
            },
            None => ask.await,
        };
        match answer {
            Some(answer) => {
                whereabouts.borrow_mut().question = false;
                self.emit(
                    self.event(EventName::InteractionAnswered)
                        .with("kind", "question")
                        .with("outcome", "answered")
                        .with("by", answer.by.as_str()),
                );
                Ok(answer.content)
            }
            None => unanswered(
                "noInteractor",
                "no one could answer (headless, or the terminal's input ended)".to_owned(),
            ),
        }
    }
}
