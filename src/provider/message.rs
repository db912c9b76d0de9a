//! The messages a model reads and writes: a transcript's entries and the
//! tool calls a model proposes.

use std::sync::Arc;

use serde::Serialize;

/// A tool call proposed by a model. `arguments` is the raw JSON text the
/// model produced; it is parsed (and may fail to parse) by the stage. The
/// id and name are shared with the call's audit events and its
/// cancellation record instead of copied into each; so is the arguments'
/// text, which the transcript, the call's `ToolInvocationProposed` event
/// and the call itself each hold.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ToolCall {
    pub id: Arc<str>,
    pub name: Arc<str>,
    pub arguments: Arc<str>,
}

/// One message of a transcript.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "lowercase")]
pub enum Message {
    System {
        content: String,
    },
    User {
        content: String,
    },
    Assistant {
        #[serde(skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(skip_serializing_if = "Vec::is_empty")]
        tool_calls: Vec<ToolCall>,
    },
    Tool {
        tool_call_id: Arc<str>,
        content: String,
    },
}
