//! The scripted provider: offline and deterministic. Answers each turn from
//! `script.yaml`, or with a payload synthesized from the completion schema,
//! and serializes tool-call arguments to JSON text exactly as a real
//! provider's reply would carry them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;

use super::script::{Reply, Script, StageScript, Turn};
use super::selector::Selector;
use super::synth::synthesize;
use super::{Message, ModelRequest, ModelResponse, Provider, ProviderError, ToolCall, Usage};

/// Offline provider driven by a script.
#[derive(Debug, Default)]
pub struct ScriptedProvider {
    /// Shared with the requests in flight, which render their reply only
    /// once their latency has passed.
    script: Arc<Script>,
    /// `--latency`: overrides every turn's latency.
    latency: Option<Duration>,
    /// `--fail-sibling`: executions whose every request fails terminally.
    fail: Vec<Selector>,
    /// Requests seen per (execution, turn position), for `fail … times: N`.
    attempts: Mutex<HashMap<(String, usize), u32>>,
}

impl ScriptedProvider {
    pub fn new(script: Script) -> ScriptedProvider {
        ScriptedProvider {
            script: Arc::new(script),
            ..ScriptedProvider::default()
        }
    }

    pub fn with_latency(mut self, latency: Option<Duration>) -> Self {
        self.latency = latency;
        self
    }

    pub fn with_failures(mut self, fail: Vec<Selector>) -> Self {
        self.fail = fail;
        self
    }

    /// The answer and its latency, rendered at once.
    #[cfg(test)]
    fn answer(&self, req: &ModelRequest) -> (Result<ModelResponse, ProviderError>, Duration) {
        let (planned, latency) = self.plan(req);
        let result = match planned {
            ReplyPlan::Ready(result) => result,
            ReplyPlan::Render { position } => render(&self.script, req, position),
        };
        (result, latency)
    }

    /// Everything about a request's answer but the reply itself: injected
    /// failures (counted now, in request order) and the latency.
    fn plan(&self, req: &ModelRequest) -> (ReplyPlan, Duration) {
        let default_latency = self.latency.or(self.script.latency).unwrap_or_default();
        if self
            .fail
            .iter()
            .any(|s| s.matches(&req.stage_id, req.index))
        {
            let who = req.index.map_or_else(
                || req.stage_id.to_string(),
                |i| format!("{}#{i}", req.stage_id),
            );
            let err = ProviderError::Terminal {
                code: "ScriptedFailure",
                message: format!("injected failure of `{who}` (--fail-sibling)"),
            };
            return (ReplyPlan::Ready(Err(err)), default_latency);
        }
        let position = req.turns_so_far();
        let script = self.script.for_execution(&req.stage_id, req.index);
        let (turn, fails) = match script {
            Some(s) => locate(s, position),
            None => (None, Vec::new()),
        };
        let latency = self
            .latency
            .or(turn.and_then(|t| t.latency))
            .unwrap_or(default_latency);
        // Injected failures before this position's answer. Each `fail`
        // entry answers `times` requests (with its own latency); trailing
        // failures with no answer after them keep failing as the last one.
        if !fails.is_empty() {
            let key = (req.stage_execution_id.to_string(), position);
            let seen = {
                let mut attempts = self
                    .attempts
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                let n = attempts.entry(key).or_insert(0);
                *n += 1;
                *n
            };
            let mut budget = 0;
            let failing = fails
                .iter()
                .find(|f| {
                    budget += f.times;
                    seen <= budget
                })
                .or(if turn.is_none() { fails.last() } else { None });
            if let Some(f) = failing {
                let latency = self.latency.or(f.latency).unwrap_or(default_latency);
                let message = format!(
                    "{} (scripted, {} turn {})",
                    f.message,
                    req.stage_id,
                    position + 1
                );
                let err = if f.transient {
                    ProviderError::transient("ScriptedTransient", message)
                } else {
                    ProviderError::Terminal {
                        code: "ScriptedFailure",
                        message,
                    }
                };
                return (ReplyPlan::Ready(Err(err)), latency);
            }
        }
        (ReplyPlan::Render { position }, latency)
    }
}

/// What [`ScriptedProvider::plan`] settled.
#[derive(Debug)]
enum ReplyPlan {
    Ready(Result<ModelResponse, ProviderError>),
    /// Render the script's answer at this position.
    Render {
        position: usize,
    },
}

/// `call_{turn}_{i}`: a scripted tool call's id. Built by hand: through
/// `format!` it was 700 instructions a call, two calls a fan-out sibling.
fn call_id(turn: usize, i: usize) -> String {
    use crate::auditlog::json::push_decimal;
    let mut id = String::with_capacity(16);
    id.push_str("call_");
    push_decimal(&mut id, turn as u64);
    id.push('_');
    push_decimal(&mut id, i as u64);
    id
}

/// The script's reply at `position`, rendered against the request's
/// context: tool-call arguments serialized to JSON text as a real
/// provider's reply carries them. It runs after the latency, as a real
/// reply arrives after it, so a request cancelled while it waits never
/// builds one.
fn render(
    script: &Script,
    req: &ModelRequest,
    position: usize,
) -> Result<ModelResponse, ProviderError> {
    let turn = script
        .for_execution(&req.stage_id, req.index)
        .and_then(|s| locate(s, position).0);
    let resolve = |path: &[crate::definition::template::Segment]| req.ctx.resolve(path);
    let call = |i: usize, name: &str, arguments: String| ToolCall {
        id: call_id(position + 1, i).into(),
        name: name.into(),
        arguments: arguments.into(),
    };
    let mut response = ModelResponse::default();
    let rendered: Result<(), String> = (|| {
        match turn.map(|t| &t.reply) {
            None => response.tool_calls.push(call(
                0,
                &req.completion_tool,
                crate::definition::template::json_text(&synthesize(&req.completion_schema)),
            )),
            Some(Reply::Text(t)) => {
                response.text = Some(t.render_with(resolve).map_err(|e| e.to_string())?)
            }
            Some(Reply::Calls(calls)) => {
                response.tool_calls.reserve_exact(calls.len());
                for (i, c) in calls.iter().enumerate() {
                    response
                        .tool_calls
                        .push(call(i, &c.tool, c.args.render_json(&resolve)?));
                }
            }
            Some(Reply::Complete(payload)) => response.tool_calls.push(call(
                0,
                &req.completion_tool,
                payload.render_json(&resolve)?,
            )),
            Some(Reply::Fail { .. }) => {}
        }
        Ok(())
    })();
    if let Err(message) = rendered {
        return Err(ProviderError::Terminal {
            code: "ScriptTemplate",
            message: format!("script for `{}`: {message}", req.stage_id),
        });
    }
    response.usage = estimate_usage(&req.messages, &response);
    Ok(response)
}

/// An injected failure and how it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Fail<'s> {
    transient: bool,
    times: u32,
    message: &'s str,
    latency: Option<Duration>,
}

/// The answer at `position` and the injected failures that precede it.
/// `fail` entries do not take a turn of their own: they fail requests for
/// the next answer. With `repeat`, the last answer repeats forever.
fn locate(script: &StageScript, position: usize) -> (Option<&Turn>, Vec<Fail<'_>>) {
    let mut fails = Vec::new();
    let mut answers = 0;
    let mut last_answer = None;
    for turn in &script.turns {
        match &turn.reply {
            Reply::Fail {
                transient,
                times,
                message,
            } => fails.push(Fail {
                transient: *transient,
                times: *times,
                message,
                latency: turn.latency,
            }),
            _ => {
                if answers == position {
                    return (Some(turn), fails);
                }
                answers += 1;
                last_answer = Some(turn);
                fails.clear();
            }
        }
    }
    if !fails.is_empty() && answers == position {
        return (None, fails);
    }
    if script.repeat {
        return (last_answer, Vec::new());
    }
    (None, Vec::new())
}

/// About four characters a token: deterministic, close enough for summaries.
fn estimate_usage(messages: &[Message], response: &ModelResponse) -> Usage {
    let prompt: usize = messages
        .iter()
        .map(|m| match m {
            Message::System { content }
            | Message::User { content }
            | Message::Tool { content, .. } => content.len(),
            Message::Assistant {
                content,
                tool_calls,
            } => {
                content.as_ref().map_or(0, String::len)
                    + tool_calls
                        .iter()
                        .map(|c| c.name.len() + c.arguments.len())
                        .sum::<usize>()
            }
        })
        .sum();
    let completion = response.text.as_ref().map_or(0, String::len)
        + response
            .tool_calls
            .iter()
            .map(|c| c.name.len() + c.arguments.len())
            .sum::<usize>();
    Usage {
        prompt_tokens: prompt.div_ceil(4) as u64,
        completion_tokens: completion.div_ceil(4) as u64,
        requests: 1,
    }
}

impl Provider for ScriptedProvider {
    fn name(&self) -> &'static str {
        "scripted"
    }

    fn complete(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<ModelResponse, ProviderError>> {
        let (planned, latency) = self.plan(&request);
        let script = Arc::clone(&self.script);
        async move {
            if !latency.is_zero() {
                tokio::time::sleep(latency).await;
            }
            match planned {
                ReplyPlan::Ready(result) => result,
                ReplyPlan::Render { position } => render(&script, &request, position),
            }
        }
        .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn call_ids_read_as_format_wrote_them() {
        for (turn, i) in [(1, 0), (9, 10), (10, 9), (123, 4567), (usize::MAX, 0)] {
            assert_eq!(call_id(turn, i), format!("call_{turn}_{i}"));
        }
    }

    #[test]
    fn a_fail_entry_answers_with_its_own_latency_then_the_next_turn() {
        let script = "stages:\n  a:\n    - { fail: transient, times: 2, latency: 30ms }\n    - { text: hi, latency: 5ms }\n  b:\n    - { fail: terminal, latency: 40ms }\n";
        let dir = tempfile::tempdir().unwrap();
        let yaml = "id: p\nentry: a\nstages:\n  a: a.md\n  b: b.md\n";
        std::fs::write(dir.path().join("pipeline.yaml"), yaml).unwrap();
        for id in ["a", "b"] {
            let md = format!(
                "---\nid: {id}\nname: {id}\nallowedTools: []\ncompletionTool: done\ncompletionSchema: {{ type: object }}\nretryPolicy: {{ maxAttempts: 1, backoff: none }}\nturnCap: 3\nresolutionPolicy: fail\n---\nx\n"
            );
            std::fs::write(dir.path().join(format!("{id}.md")), md).unwrap();
        }
        std::fs::write(dir.path().join("script.yaml"), script).unwrap();
        let pipeline = crate::definition::load_pipeline(dir.path()).unwrap();
        let provider = ScriptedProvider::new(
            Script::load(&dir.path().join("script.yaml"), &pipeline).unwrap(),
        );
        let answers: Vec<(bool, Duration)> = (0..3)
            .map(|_| {
                let (r, l) = provider.answer(&request("a"));
                (r.is_ok(), l)
            })
            .collect();
        let ms = Duration::from_millis;
        assert_eq!(answers, [(false, ms(30)), (false, ms(30)), (true, ms(5))]);
        for _ in 0..3 {
            let (r, l) = provider.answer(&request("b"));
            assert!(matches!(r, Err(ProviderError::Terminal { .. })));
            assert_eq!(l, ms(40), "a trailing failure keeps its own latency");
        }
    }

    /// A scope these tests never render against.
    #[derive(Debug)]
    struct NoScope;

    impl crate::provider::TemplateScope for NoScope {
        fn resolve(
            &self,
            _path: &[crate::definition::template::Segment],
        ) -> Result<serde_json::Value, String> {
            Err("no placeholders here".to_owned())
        }
    }

    fn request(stage: &str) -> ModelRequest {
        ModelRequest {
            stage_id: stage.into(),
            stage_execution_id: format!("r/{stage}/1").into(),
            index: None,
            messages: std::sync::Arc::default(),
            tools: std::sync::Arc::new(Vec::new()),
            completion_tool: "done".into(),
            completion_schema: std::sync::Arc::new(serde_json::json!({"type": "object"})),
            ctx: std::sync::Arc::new(NoScope),
            observer: None,
        }
    }
}
