//! One model turn: the request a stage sends (its transcript, tool
//! manifest and completion channel), the response it gets back, the
//! tokens it used, and where a provider reports signals of a request in
//! flight.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::message::{Message, ToolCall};
use super::scope::TemplateScope;
use crate::definition::ToolSpec;

/// One model turn's request.
#[derive(Debug, Clone)]
pub struct ModelRequest {
    /// Shared with the execution: a request is cloned for every retry and
    /// a sibling makes several, so the ids are not copied each time.
    pub stage_id: Arc<str>,
    pub stage_execution_id: Arc<str>,
    /// Index of the sibling for map/static fan-outs.
    pub index: Option<usize>,
    /// The stage's transcript, shared with it (not copied per turn).
    pub messages: Arc<Vec<Message>>,
    pub tools: Arc<Vec<ToolSpec>>,
    pub completion_tool: Arc<str>,
    pub completion_schema: Arc<serde_json::Value>,
    /// The execution's context as reply templates see it (`ctx.*`,
    /// `stage.*`), for providers that template replies (scripted).
    pub ctx: Arc<dyn TemplateScope>,
    /// Where a provider reports observer-class signals of this request
    /// (streamed text, waiting for a slot); `None` when nobody listens.
    pub observer: Option<Arc<dyn RequestObserver>>,
}

/// Observer-class signals of one request in flight. Best effort and
/// projection only: nothing authoritative flows through it, and a provider
/// that streams nothing never calls it.
pub trait RequestObserver: Send + Sync + std::fmt::Debug {
    /// A streamed text delta of the model's reply.
    fn token(&self, text: &str);
    /// The request waits for a slot of the provider's concurrency limit
    /// (`true`), or got one after waiting (`false`).
    fn waiting_for_slot(&self, waiting: bool);
}

impl ModelRequest {
    /// Model turns already taken in this execution (assistant messages).
    pub fn turns_so_far(&self) -> usize {
        self.messages
            .iter()
            .filter(|m| matches!(m, Message::Assistant { .. }))
            .count()
    }
}

/// One model turn's response.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ModelResponse {
    pub text: Option<String>,
    pub tool_calls: Vec<ToolCall>,
    pub usage: Usage,
    /// Why the model stopped, as the server said (`stop`, `tool_calls`,
    /// `length`: cut at its token limit), when it said.
    pub finish_reason: Option<String>,
}

/// Token counts reported by a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    pub prompt_tokens: u64,
    pub completion_tokens: u64,
    pub requests: u64,
}

impl Usage {
    /// Adds `other`, saturating: counts a server or a damaged store made
    /// huge stay at the largest number rather than wrap to small ones.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens = self.prompt_tokens.saturating_add(other.prompt_tokens);
        self.completion_tokens = self
            .completion_tokens
            .saturating_add(other.completion_tokens);
        self.requests = self.requests.saturating_add(other.requests);
    }
}
