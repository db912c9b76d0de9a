//! The rules OpenAI's `/v1/chat/completions` enforces on a request body,
//! as a strict server applies them: a test double that accepts what
//! OpenAI rejects would hide bugs. The fake server checks every request
//! against them, and the transcript properties check every request a
//! stage makes.
//!
//! Checked: the body's shape (`model`, non-empty `messages`), each
//! message's role and content, the tool-call pairing rule (an assistant
//! message with `tool_calls` must be followed by one `tool` message per
//! call id before anything else, and a `tool` message must answer a call
//! of the assistant message just before it), unique call ids within a
//! message, the function tools' names and parameters, `tool_choice`, and
//! `stream_options` only with `stream: true`.

#![allow(dead_code)]

use std::collections::BTreeSet;

use serde_json::Value;

/// Why a strict server refuses a request (HTTP 400).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// Where, as OpenAI names it (`messages.[3].role`).
    pub param: String,
    pub message: String,
}

impl Violation {
    fn new(param: impl Into<String>, message: impl Into<String>) -> Violation {
        Violation {
            param: param.into(),
            message: message.into(),
        }
    }

    /// The 400 body OpenAI sends.
    pub fn body(&self) -> Value {
        serde_json::json!({"error": {
            "message": self.message,
            "type": "invalid_request_error",
            "param": self.param,
            "code": null,
        }})
    }
}

fn is_function_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Checks a chat-completion request body; the first rule it breaks.
pub fn check_chat_request(body: &Value) -> Result<(), Violation> {
    let Some(obj) = body.as_object() else {
        return Err(Violation::new("", "the body must be a JSON object"));
    };
    match obj.get("model") {
        Some(Value::String(m)) if !m.is_empty() => {}
        _ => {
            return Err(Violation::new(
                "model",
                "you must provide a model parameter",
            ));
        }
    }
    let tools = check_tools(obj.get("tools"))?;
    check_tool_choice(obj.get("tool_choice"), &tools)?;
    if obj.contains_key("stream_options") && obj.get("stream") != Some(&Value::Bool(true)) {
        return Err(Violation::new(
            "stream_options",
            "The 'stream_options' parameter is only allowed when 'stream' is enabled.",
        ));
    }
    let messages = match obj.get("messages") {
        Some(Value::Array(m)) if !m.is_empty() => m,
        Some(Value::Array(_)) => {
            return Err(Violation::new(
                "messages",
                "'messages' must contain at least one message",
            ));
        }
        _ => {
            return Err(Violation::new(
                "messages",
                "'messages' is a required property",
            ));
        }
    };
    check_messages(messages)
}

fn check_tools(tools: Option<&Value>) -> Result<BTreeSet<String>, Violation> {
    let mut names = BTreeSet::new();
    let Some(tools) = tools else {
        return Ok(names);
    };
    let Some(list) = tools.as_array() else {
        return Err(Violation::new("tools", "'tools' must be an array"));
    };
    for (i, t) in list.iter().enumerate() {
        let param = format!("tools[{i}]");
        if t["type"] != "function" {
            return Err(Violation::new(
                format!("{param}.type"),
                "tool type must be 'function'",
            ));
        }
        let name = t["function"]["name"].as_str().unwrap_or("");
        if !is_function_name(name) {
            return Err(Violation::new(
                format!("{param}.function.name"),
                format!(
                    "Invalid 'tools[{i}].function.name': string does not match pattern '^[a-zA-Z0-9_-]{{1,64}}$'"
                ),
            ));
        }
        if let Some(p) = t["function"].get("parameters") {
            if !p.is_object() {
                return Err(Violation::new(
                    format!("{param}.function.parameters"),
                    "parameters must be a JSON Schema object",
                ));
            }
            // OpenAI: `Invalid schema for function '…': schema must be a
            // JSON Schema of 'type: "object"', got 'type: "None"'.`
            if p["type"] != "object" {
                return Err(Violation::new(
                    format!("{param}.function.parameters"),
                    format!(
                        "Invalid schema for function '{name}': schema must be a JSON Schema of 'type: \"object\"', got 'type: \"{}\"'.",
                        p["type"].as_str().unwrap_or("None")
                    ),
                ));
            }
        }
        if !names.insert(name.to_owned()) {
            return Err(Violation::new(
                format!("{param}.function.name"),
                format!("duplicate function name '{name}'"),
            ));
        }
    }
    Ok(names)
}

fn check_tool_choice(choice: Option<&Value>, tools: &BTreeSet<String>) -> Result<(), Violation> {
    match choice {
        None => Ok(()),
        Some(Value::String(s)) if s == "none" => Ok(()),
        Some(Value::String(s)) if s == "auto" || s == "required" => {
            if tools.is_empty() {
                Err(Violation::new(
                    "tool_choice",
                    "Invalid value for 'tool_choice': 'tool_choice' is only allowed when 'tools' are specified.",
                ))
            } else {
                Ok(())
            }
        }
        Some(v) if v["type"] == "function" => match v["function"]["name"].as_str() {
            Some(n) if tools.contains(n) => Ok(()),
            _ => Err(Violation::new(
                "tool_choice",
                "tool_choice names a function that is not in 'tools'",
            )),
        },
        Some(other) => Err(Violation::new(
            "tool_choice",
            format!("Invalid value for 'tool_choice': {other}"),
        )),
    }
}

fn check_messages(messages: &[Value]) -> Result<(), Violation> {
    // Call ids of the last assistant message still waiting for a result.
    let mut pending: Vec<String> = Vec::new();
    // Call ids of that message that may still be answered.
    let mut answerable: BTreeSet<String> = BTreeSet::new();
    for (i, m) in messages.iter().enumerate() {
        let param = format!("messages.[{i}]");
        let role = m["role"].as_str().unwrap_or("");
        if role != "tool" && !pending.is_empty() {
            return Err(Violation::new(
                format!("{param}.role"),
                format!(
                    "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                    pending.join(", ")
                ),
            ));
        }
        match role {
            "system" | "developer" | "user" => {
                if !m["content"].is_string() && !m["content"].is_array() {
                    return Err(Violation::new(
                        format!("{param}.content"),
                        format!("Invalid type for '{param}.content': expected a string"),
                    ));
                }
                answerable.clear();
            }
            "assistant" => {
                let calls = m.get("tool_calls").and_then(Value::as_array);
                let has_calls = calls.is_some_and(|c| !c.is_empty());
                match m.get("content") {
                    Some(Value::String(_)) | Some(Value::Array(_)) => {}
                    Some(Value::Null) | None if has_calls => {}
                    _ => {
                        return Err(Violation::new(
                            format!("{param}.content"),
                            "Invalid value for 'content': expected a string, got null.",
                        ));
                    }
                }
                answerable.clear();
                if let Some(calls) = calls {
                    if calls.is_empty() {
                        return Err(Violation::new(
                            format!("{param}.tool_calls"),
                            "Invalid 'tool_calls': empty array. Expected an array with minimum length 1",
                        ));
                    }
                    for (j, c) in calls.iter().enumerate() {
                        let cparam = format!("{param}.tool_calls.[{j}]");
                        let id = c["id"].as_str().unwrap_or("");
                        if id.is_empty() {
                            return Err(Violation::new(
                                format!("{cparam}.id"),
                                "tool call id missing",
                            ));
                        }
                        if c["type"] != "function"
                            || !c["function"]["name"].is_string()
                            || !c["function"]["arguments"].is_string()
                        {
                            return Err(Violation::new(
                                cparam,
                                "a tool call needs type 'function', a function name and arguments as a string",
                            ));
                        }
                        if !answerable.insert(id.to_owned()) {
                            return Err(Violation::new(
                                format!("{cparam}.id"),
                                format!(
                                    "Duplicate value for 'tool_call_id' of {id} in message[{i}]."
                                ),
                            ));
                        }
                        pending.push(id.to_owned());
                    }
                }
            }
            "tool" => {
                let id = m["tool_call_id"].as_str().unwrap_or("");
                if !m["content"].is_string() && !m["content"].is_array() {
                    return Err(Violation::new(
                        format!("{param}.content"),
                        "a tool message needs content",
                    ));
                }
                if !answerable.remove(id) {
                    return Err(Violation::new(
                        format!("{param}.role"),
                        "Invalid parameter: messages with role 'tool' must be a response to a preceeding message with 'tool_calls'.",
                    ));
                }
                pending.retain(|p| p != id);
            }
            other => {
                return Err(Violation::new(
                    format!("{param}.role"),
                    format!(
                        "Invalid value: '{other}'. Supported values are: 'system', 'assistant', 'user', 'tool', 'developer'."
                    ),
                ));
            }
        }
    }
    if !pending.is_empty() {
        return Err(Violation::new(
            format!("messages.[{}].role", messages.len()),
            format!(
                "An assistant message with 'tool_calls' must be followed by tool messages responding to each 'tool_call_id'. The following tool_call_ids did not have response messages: {}",
                pending.join(", ")
            ),
        ));
    }
    Ok(())
}
