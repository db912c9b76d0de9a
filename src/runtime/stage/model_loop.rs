//! Act: the message loop. Each turn composes a request from the
//! transcript, sends it, appends the reply, and applies the completion
//! channel's rules (the completion call must be alone in its response and
//! match its schema); other calls go to the tools. Ends when a completion
//! is accepted, at the turn cap, or on a failure.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Value, json};

use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::{StageDefinition, ToolSpec};
use crate::error::{Code, ErrorClass, HasCode};
use crate::provider::{Message, ModelRequest, RequestObserver, TemplateScope, Usage};
use crate::runtime::observer::BusObserver;
use crate::runtime::transcript::Transcript;
use crate::tools::ModelError;

impl StageRun {
    /// Act: the message loop, one model turn per iteration, until a
    /// completion is accepted, the turn cap is reached or a step fails.
    pub(super) async fn act(
        &self,
        def: &StageDefinition,
        tools: &Arc<Vec<ToolSpec>>,
        transcript: &mut Transcript,
        usage: &mut Usage,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> ActOutcome {
        let mut turns = 0u32;
        loop {
            if turns >= def.turn_cap {
                return ActOutcome::CapHit;
            }
            turns += 1;
            whereabouts.borrow_mut().turn = turns;
            let composed = || {
                json!({
                    "turn": turns,
                    "messages": transcript.messages().len(),
                    "tools": tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                })
            };
            for slot in [
                "COMPOSE_REQUEST/pre",
                "COMPOSE_REQUEST/post",
                "SEND_REQUEST/pre",
            ] {
                if let Err((code, message)) = self.loop_hook(slot, composed, None).await {
                    return ActOutcome::Failed(code, message);
                }
            }
            let request = ModelRequest {
                stage_id: Arc::clone(&self.ids.stage),
                stage_execution_id: Arc::clone(&self.ctx.stage_execution_id),
                index: self.index,
                messages: transcript.shared(),
                tools: Arc::clone(tools),
                completion_tool: Arc::clone(&def.completion_tool),
                completion_schema: def.completion_schema.shared_document(),
                ctx: Arc::clone(&self.ctx) as Arc<dyn TemplateScope>,
                // Tokens and slot waits are observer events: skip them
                // when no one observes.
                observer: self.kit.bus.has_observers().then(|| {
                    Arc::new(BusObserver {
                        bus: self.kit.bus.clone(),
                        workflow_run_id: Arc::clone(&self.ids.run),
                        stage_id: Arc::clone(&self.ids.stage),
                        stage_execution_id: Arc::clone(&self.ctx.stage_execution_id),
                        turn: turns,
                    }) as Arc<dyn RequestObserver>
                }),
            };
            let mut response = match self.request(request, turns, usage, whereabouts).await {
                Ok(r) => r,
                Err(e) => return ActOutcome::Failed(e.code(), e.to_string()),
            };
            for slot in ["SEND_REQUEST/post", "STREAM_RESPONSE/pre"] {
                if let Err((code, message)) =
                    self.loop_hook(slot, || json!({"turn": turns}), None).await
                {
                    return ActOutcome::Failed(code, message);
                }
            }
            let streamed = || {
                json!({
                    "turn": turns,
                    "text": response.text,
                    "toolCalls": response.tool_calls.iter().map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments})).collect::<Vec<_>>(),
                })
            };
            match self
                .loop_hook("STREAM_RESPONSE/post", streamed, Some("text"))
                .await
            {
                Ok(Some(Value::String(text))) => response.text = Some(text),
                Ok(_) => {}
                Err((code, message)) => return ActOutcome::Failed(code, message),
            }
            // The response is used up here: its calls go to the transcript,
            // and one copy stays to run them.
            let cut_short = response.finish_reason.as_deref() == Some("length");
            let calls = std::mem::take(&mut response.tool_calls);
            transcript.push(Message::Assistant {
                content: response.text.take(),
                tool_calls: calls.clone(),
            });
            if calls.is_empty() {
                let content = if cut_short {
                    format!(
                        "Your reply was cut at the token limit (finish_reason `length`) before you called `{}`: call it now, with a shorter answer.",
                        def.completion_tool
                    )
                } else {
                    format!("Call `{}` when you are done.", def.completion_tool)
                };
                transcript.push(Message::User { content });
                continue;
            }
            let completions = calls
                .iter()
                .filter(|c| *c.name == *def.completion_tool)
                .count();
            if completions > 0 && calls.len() > 1 {
                let err = ModelError::new(
                    Code {
                        class: ErrorClass::Validation,
                        name: "CompletionNotSole",
                    },
                    format!(
                        "`{}` must be the only tool call in its response; no call of this response was run",
                        def.completion_tool
                    ),
                );
                for c in &calls {
                    transcript.push(Message::Tool {
                        tool_call_id: c.id.clone(),
                        content: err.to_content(),
                    });
                }
                continue;
            }
            if completions == 1 {
                let call = &calls[0];
                match parse_completion(def, &call.arguments) {
                    Ok(parsed) => {
                        // Every call in a transcript is answered, this one
                        // too: a retry (Assert, a failed RENDER guard)
                        // sends the transcript again, and a strict server
                        // refuses an assistant message whose `tool_calls`
                        // are not each followed by their result.
                        transcript.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content: COMPLETION_ACCEPTED.to_owned(),
                        });
                        // RENDER: guards may refuse the result; transforms
                        // cannot change it (it passed the schema).
                        for slot in ["RENDER/pre", "RENDER/post"] {
                            if let Err((code, message)) = self
                                .loop_hook(slot, || json!({"parsed": parsed}), None)
                                .await
                            {
                                return ActOutcome::Failed(code, message);
                            }
                        }
                        return ActOutcome::Completed(parsed);
                    }
                    Err(mut err) => {
                        if cut_short && err.code.ends_with("/CompletionNotJson") {
                            err.message.push_str(
                                " (your reply was cut at the token limit, finish_reason `length`: a shorter answer fits)",
                            );
                        }
                        transcript.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content: err.to_content(),
                        });
                        continue;
                    }
                }
            }
            let results = self.run_tools(def, &calls, whereabouts).await;
            for (call, content) in calls.iter().zip(results) {
                transcript.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                });
            }
        }
    }
}

/// How Act ended.
pub(super) enum ActOutcome {
    Completed(Value),
    CapHit,
    Failed(Code, String),
}

/// The result of an accepted completion call, as the model reads it when
/// the attempt is retried.
pub const COMPLETION_ACCEPTED: &str =
    "accepted: the result matches the schema; the stage checks it next";

/// Parses a completion call's arguments against the completion schema.
fn parse_completion(def: &StageDefinition, arguments: &str) -> Result<Value, ModelError> {
    let code = |name| Code {
        class: ErrorClass::Validation,
        name,
    };
    let value: Value = serde_json::from_str(arguments).map_err(|e| {
        ModelError::new(
            code("CompletionNotJson"),
            format!(
                "the arguments of `{}` are not valid JSON: {e}",
                def.completion_tool
            ),
        )
    })?;
    def.completion_schema.check(&value).map_err(|errors| {
        ModelError::new(
            code("CompletionSchemaMismatch"),
            format!(
                "the arguments of `{}` do not match its schema: {}",
                def.completion_tool,
                errors.join("; ")
            ),
        )
    })?;
    Ok(value)
}
