//! The chat-completions wire format: the request body built from a stage's
//! transcript and tool manifest, and the reply — a plain JSON completion or
//! a stream of chunks — assembled into one `ModelResponse`.
//!
//! What the model produced is passed on as it is, even when it is wrong: a
//! tool call whose arguments are not JSON or that names no tool reaches the
//! stage, which answers the model with a typed tool error on the same
//! transcript. What the *server* got wrong — a body that is
//! not a completion, no choices — is a `ProviderTransient` error that the
//! stage retries.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::definition::ToolSpec;
use crate::provider::{
    Message, ModelRequest, ModelResponse, ProviderError, RequestObserver, ToolCall, Usage,
};

/// The request body of one model turn.
pub fn request_body(model: &str, request: &ModelRequest, stream: bool) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), Value::String(model.to_owned()));
    body.insert(
        "messages".into(),
        Value::Array(request.messages.iter().map(message).collect()),
    );
    body.insert(
        "tools".into(),
        Value::Array(request.tools.iter().map(tool).collect()),
    );
    if stream {
        body.insert("stream".into(), Value::Bool(true));
        body.insert("stream_options".into(), json!({"include_usage": true}));
    }
    Value::Object(body)
}

/// One transcript message in the API's shape; tool results pair with their
/// call by `tool_call_id`.
pub fn message(m: &Message) -> Value {
    match m {
        Message::System { content } => json!({"role": "system", "content": content}),
        Message::User { content } => json!({"role": "user", "content": content}),
        Message::Assistant {
            content,
            tool_calls,
        } => {
            let mut obj = Map::new();
            obj.insert("role".into(), "assistant".into());
            // `null` content is how the API spells "only tool calls".
            obj.insert(
                "content".into(),
                match content {
                    Some(c) => Value::String(c.clone()),
                    None if tool_calls.is_empty() => Value::String(String::new()),
                    None => Value::Null,
                },
            );
            if !tool_calls.is_empty() {
                obj.insert(
                    "tool_calls".into(),
                    tool_calls
                        .iter()
                        .map(|c| {
                            json!({
                                "id": c.id,
                                "type": "function",
                                "function": {"name": c.name, "arguments": c.arguments}
                            })
                        })
                        .collect(),
                );
            }
            Value::Object(obj)
        }
        Message::Tool {
            tool_call_id,
            content,
        } => json!({"role": "tool", "tool_call_id": tool_call_id, "content": content}),
    }
}

/// One tool of the manifest as a function tool.
pub fn tool(t: &ToolSpec) -> Value {
    json!({
        "type": "function",
        "function": {
            "name": t.name,
            "description": t.description,
            "parameters": t.parameters,
        }
    })
}

/// The `usage` object. Read leniently: a server that gets its counts
/// wrong (`-5`, `12.0`, `"12"`, a number past `u64`) must not cost the
/// model's turn, which the server has billed already. A count that is no
/// number at all reads as 0, a negative one as 0, a fractional one
/// rounded, one too large as the largest.
#[derive(Debug, Default, Deserialize)]
struct WireUsage {
    #[serde(default, deserialize_with = "count")]
    prompt_tokens: Option<u64>,
    #[serde(default, deserialize_with = "count")]
    completion_tokens: Option<u64>,
}

fn count<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    Ok(count_of(&Value::deserialize(d)?))
}

fn count_of(v: &Value) -> Option<u64> {
    let n = match v {
        Value::Number(n) => n,
        Value::String(s) => {
            return s
                .trim()
                .parse::<f64>()
                .ok()
                .and_then(|f| count_of(&f.into()));
        }
        _ => return None,
    };
    if let Some(u) = n.as_u64() {
        return Some(u);
    }
    // Negative, fractional, or past u64 (serde_json reads those as f64;
    // `as` saturates at both ends).
    n.as_f64()
        .filter(|f| f.is_finite())
        .map(|f| f.max(0.0).round() as u64)
}

/// `usage` as an object, or none when it is anything else.
fn usage_of<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<WireUsage>, D::Error> {
    Ok(Option::<Value>::deserialize(d)?.and_then(|v| WireUsage::deserialize(v).ok()))
}

/// The usage a reply reports, read as [`WireUsage`] reads it.
fn reported_usage(value: &Value) -> Option<Usage> {
    let wire = WireUsage::deserialize(value.get("usage")?).ok()?;
    Some(usage_from(&wire))
}

fn usage_from(u: &WireUsage) -> Usage {
    Usage {
        prompt_tokens: u.prompt_tokens.unwrap_or(0),
        completion_tokens: u.completion_tokens.unwrap_or(0),
        requests: 1,
    }
}

/// A plain (non-streamed) completion.
#[derive(Debug, Deserialize)]
struct Completion {
    choices: Option<Vec<Choice>>,
    #[serde(default, deserialize_with = "usage_of")]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct Choice {
    index: Option<u64>,
    message: Option<WireMessage>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct WireMessage {
    content: Option<Value>,
    tool_calls: Option<Vec<WireCall>>,
}

/// A tool call, whole (`message.tool_calls`) or a fragment of one
/// (`delta.tool_calls`).
#[derive(Debug, Deserialize)]
struct WireCall {
    index: Option<usize>,
    id: Option<String>,
    function: Option<WireFunction>,
}

#[derive(Debug, Deserialize)]
struct WireFunction {
    name: Option<String>,
    /// A string by the spec; some servers send an object.
    arguments: Option<Value>,
}

/// One streamed chunk.
#[derive(Debug, Deserialize)]
struct Chunk {
    choices: Option<Vec<ChunkChoice>>,
    #[serde(default, deserialize_with = "usage_of")]
    usage: Option<WireUsage>,
}

#[derive(Debug, Deserialize)]
struct ChunkChoice {
    index: Option<u64>,
    delta: Option<Delta>,
    finish_reason: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Delta {
    content: Option<Value>,
    tool_calls: Option<Vec<WireCall>>,
}

/// A tool call being assembled.
#[derive(Debug, Default)]
struct PartialCall {
    id: String,
    name: String,
    arguments: String,
}

/// A reply being assembled, from one plain completion or many chunks.
#[derive(Debug, Default)]
pub struct Assembly {
    text: String,
    calls: BTreeMap<usize, PartialCall>,
    usage: Option<Usage>,
    finish_reason: Option<String>,
    saw_choice: bool,
    /// Every index below this one holds a call (calls are never removed):
    /// where the search for a free index resumes once `usize::MAX` is taken.
    free_from: usize,
}

fn malformed(what: impl std::fmt::Display) -> ProviderError {
    ProviderError::transient(
        "MalformedResponse",
        format!("the server's reply is not an OpenAI chat completion: {what}"),
    )
}

/// Text of a `content` value: a string, or an array of `{type: text, text}`
/// parts.
fn content_text(content: &Value) -> String {
    match content {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    }
}

fn arguments_text(arguments: &Value) -> String {
    match arguments {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

/// Fresh ids for calls a server sent without one (the tool result must
/// name the call it answers).
fn fresh_call_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    format!("call_troupe_{}", NEXT.fetch_add(1, Ordering::Relaxed))
}

impl Assembly {
    pub fn new() -> Assembly {
        Assembly::default()
    }

    /// A plain completion body.
    pub fn from_completion(body: &[u8]) -> Result<Assembly, ProviderError> {
        let value: Value = serde_json::from_slice(body).map_err(malformed)?;
        let usage = reported_usage(&value);
        // Gateways answer some failures with a 200 whose body is an error.
        if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
            return Err(super::errors::reported_error(err).billed(usage));
        }
        let completion: Completion =
            serde_json::from_value(value).map_err(|e| malformed(e).billed(usage))?;
        let mut a = Assembly::new();
        if let Some(u) = completion.usage {
            a.set_usage(&u);
        }
        let choice = completion
            .choices
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.index.unwrap_or(0) == 0);
        if let Some(choice) = choice {
            a.saw_choice = true;
            a.finish_reason = choice.finish_reason;
            if let Some(m) = choice.message {
                if let Some(c) = &m.content {
                    a.text = content_text(c);
                }
                for (i, call) in m.tool_calls.unwrap_or_default().into_iter().enumerate() {
                    a.add_fragment(i, call);
                }
            }
        }
        Ok(a)
    }

    /// One streamed chunk (the JSON of a `data:` line). Text deltas go to
    /// the observer as they arrive.
    pub fn apply_chunk(
        &mut self,
        data: &str,
        observer: Option<&dyn RequestObserver>,
    ) -> Result<(), ProviderError> {
        let value: Value = serde_json::from_str(data).map_err(malformed)?;
        if let Some(usage) = reported_usage(&value) {
            self.usage = Some(usage);
        }
        if let Some(err) = value.get("error").filter(|e| !e.is_null()) {
            // A failure reported inside the stream (e.g. overload mid-way).
            return Err(super::errors::reported_error(err).billed(self.usage));
        }
        let chunk: Chunk = serde_json::from_value(value).map_err(malformed)?;
        if let Some(u) = &chunk.usage {
            self.set_usage(u);
        }
        for choice in chunk.choices.unwrap_or_default() {
            if choice.index.unwrap_or(0) != 0 {
                continue;
            }
            self.saw_choice = true;
            if let Some(reason) = choice.finish_reason {
                self.finish_reason = Some(reason);
            }
            let Some(delta) = choice.delta else {
                continue;
            };
            if let Some(c) = &delta.content {
                let text = content_text(c);
                if !text.is_empty() {
                    if let Some(o) = observer {
                        o.token(&text);
                    }
                    self.text.push_str(&text);
                }
            }
            for (position, call) in delta.tool_calls.unwrap_or_default().into_iter().enumerate() {
                self.add_fragment(position, call);
            }
        }
        Ok(())
    }

    /// Adds a (fragment of a) tool call. Fragments join by `index`: the
    /// first carries id and name, later ones more `arguments`. A server that
    /// sends no index gets one by position, and a new id without an index
    /// starts a new call.
    fn add_fragment(&mut self, position: usize, call: WireCall) {
        let index = match call.index {
            Some(i) => i,
            None => match (&call.id, self.calls.get(&position)) {
                (Some(id), Some(existing))
                    if !id.is_empty() && !existing.id.is_empty() && existing.id != *id =>
                {
                    self.fresh_index()
                }
                _ => position,
            },
        };
        let partial = self.calls.entry(index).or_default();
        if let Some(id) = call.id.filter(|id| !id.is_empty())
            && partial.id.is_empty()
        {
            partial.id = id;
        }
        if let Some(f) = call.function {
            if let Some(name) = f.name.filter(|n| !n.is_empty())
                && partial.name.is_empty()
            {
                partial.name = name;
            }
            if let Some(args) = &f.arguments {
                partial.arguments.push_str(&arguments_text(args));
            }
        }
    }

    /// An index after every call's, or the lowest free one when a server
    /// already used `usize::MAX` (adding one there overflowed, and wrapped
    /// into call 0 in a release build, merging two calls). The search
    /// resumes where the last one stopped, so many such calls stay linear.
    fn fresh_index(&mut self) -> usize {
        match self.calls.keys().next_back() {
            None => 0,
            Some(&last) => match last.checked_add(1) {
                Some(next) => next,
                None => {
                    while self.calls.contains_key(&self.free_from) {
                        self.free_from += 1;
                    }
                    self.free_from
                }
            },
        }
    }

    fn set_usage(&mut self, u: &WireUsage) {
        self.usage = Some(usage_from(u));
    }

    /// The usage reported so far, if any.
    pub fn usage(&self) -> Option<Usage> {
        self.usage
    }

    /// Whether the model said it was done (a `finish_reason` arrived).
    pub fn finished(&self) -> bool {
        self.finish_reason.is_some()
    }

    /// The turn. No choice at all is an error; calls keep their index
    /// order; empty arguments read as `{}` (models send "" for calls with no
    /// parameters).
    pub fn into_response(self) -> Result<ModelResponse, ProviderError> {
        if !self.saw_choice {
            return Err(ProviderError::transient(
                "EmptyChoices",
                "the server's reply has no choices",
            )
            .billed(self.usage));
        }
        // Each call's result names it by id, so ids must be unique within
        // the turn: a missing id, or one a server repeats (some local
        // servers number every call `call_0`), gets a fresh one.
        let mut seen = std::collections::HashSet::new();
        let tool_calls = self
            .calls
            .into_values()
            .map(|c| ToolCall {
                id: if c.id.is_empty() || !seen.insert(c.id.clone()) {
                    fresh_call_id().into()
                } else {
                    c.id.into()
                },
                name: c.name.into(),
                arguments: if c.arguments.trim().is_empty() {
                    "{}".into()
                } else {
                    c.arguments.into()
                },
            })
            .collect();
        Ok(ModelResponse {
            text: (!self.text.is_empty()).then_some(self.text),
            tool_calls,
            usage: self.usage.unwrap_or(Usage {
                requests: 1,
                ..Usage::default()
            }),
            finish_reason: self.finish_reason,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn assistant_messages_carry_calls_and_null_content() {
        let m = Message::Assistant {
            content: None,
            tool_calls: vec![ToolCall {
                id: "c1".into(),
                name: "Echo".into(),
                arguments: "{\"text\":\"x\"}".into(),
            }],
        };
        assert_eq!(
            message(&m),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Echo", "arguments": "{\"text\":\"x\"}"}}
            ]})
        );
        let t = Message::Tool {
            tool_call_id: "c1".into(),
            content: "ok".into(),
        };
        assert_eq!(
            message(&t),
            json!({"role": "tool", "tool_call_id": "c1", "content": "ok"})
        );
    }

    #[test]
    fn interleaved_fragments_assemble_by_index() {
        let chunks = [
            r#"{"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"content":"lo"}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"Echo","arguments":""}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"Read","arguments":"{\"pa"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"text\":"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":"th\":\"x\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"\"hi\"}"}}]}}]}"#,
            r#"{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}"#,
            r#"{"choices":[],"usage":{"prompt_tokens":12,"completion_tokens":5,"total_tokens":17}}"#,
        ];
        let mut a = Assembly::new();
        for c in chunks {
            a.apply_chunk(c, None).unwrap();
        }
        assert!(a.finished());
        let r = a.into_response().unwrap();
        assert_eq!(r.text.as_deref(), Some("Hello"));
        let calls: Vec<(&str, &str, &str)> = r
            .tool_calls
            .iter()
            .map(|c| (&*c.id, &*c.name, &*c.arguments))
            .collect();
        assert_eq!(
            calls,
            [
                ("a", "Echo", "{\"text\":\"hi\"}"),
                ("b", "Read", "{\"path\":\"x\"}")
            ]
        );
        assert_eq!(
            r.usage,
            Usage {
                prompt_tokens: 12,
                completion_tokens: 5,
                requests: 1
            }
        );
    }

    #[test]
    fn plain_completions_yield_the_same_turn() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"a","type":"function","function":{"name":"Echo","arguments":{"text":"hi"}}},
            {"type":"function","function":{"name":"done","arguments":""}}]},"finish_reason":"tool_calls"}],
            "usage":{"prompt_tokens":3,"completion_tokens":4}}"#;
        let r = Assembly::from_completion(body)
            .unwrap()
            .into_response()
            .unwrap();
        assert_eq!(r.text, None);
        assert_eq!(&*r.tool_calls[0].arguments, "{\"text\":\"hi\"}");
        assert_eq!(
            &*r.tool_calls[1].arguments, "{}",
            "empty arguments read as {{}}"
        );
        assert!(r.tool_calls[1].id.starts_with("call_troupe_"));
        assert_eq!(r.usage.completion_tokens, 4);
    }

    #[test]
    fn a_repeated_call_id_gets_a_fresh_one_so_each_result_names_one_call() {
        let body = br#"{"choices":[{"index":0,"message":{"role":"assistant","content":null,"tool_calls":[
            {"id":"call_0","type":"function","function":{"name":"Echo","arguments":"{}"}},
            {"id":"call_0","type":"function","function":{"name":"Read","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#;
        let r = Assembly::from_completion(body)
            .unwrap()
            .into_response()
            .unwrap();
        assert_eq!(&*r.tool_calls[0].id, "call_0");
        assert!(r.tool_calls[1].id.starts_with("call_troupe_"));
    }

    #[test]
    fn server_faults_are_typed() {
        let code = |r: Result<ModelResponse, ProviderError>| match r {
            Err(ProviderError::Transient { code, .. }) => code,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            code(Assembly::from_completion(b"{\"choices\": [").and_then(Assembly::into_response)),
            "MalformedResponse"
        );
        assert_eq!(
            code(Assembly::from_completion(b"{\"choices\": []}").and_then(Assembly::into_response)),
            "EmptyChoices"
        );
        assert_eq!(
            code(Assembly::from_completion(b"[1,2]").and_then(Assembly::into_response)),
            "MalformedResponse"
        );
        let mut a = Assembly::new();
        assert!(matches!(
            a.apply_chunk(r#"{"error":{"message":"overloaded"}}"#, None),
            Err(ProviderError::Transient {
                code: "ServerError",
                ..
            })
        ));
    }
}
