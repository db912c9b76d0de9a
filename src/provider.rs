//! Model providers: the request a stage sends, the turn it gets back, and
//! typed provider errors. `scripted` is the offline, deterministic default;
//! `openai` talks to any OpenAI-compatible `/v1/chat/completions` endpoint.

pub mod openai;
pub mod script;
pub mod scripted;
pub mod synth;

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use crate::definition::ToolSpec;
use crate::error::{Code, ErrorClass, HasCode};
use crate::runtime::context::StageContext;
use crate::runtime::result::Usage;
use crate::runtime::transcript::{Message, ToolCall};

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
    /// The stage's context, for providers that template replies (scripted).
    pub ctx: Arc<StageContext>,
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
}

/// Why a model request failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProviderError {
    /// Worth retrying (rate limit, 5xx, connection reset).
    #[error("{message}")]
    Transient {
        code: &'static str,
        message: String,
        retry_after: Option<Duration>,
    },
    /// Not worth retrying.
    #[error("{message}")]
    Terminal { code: &'static str, message: String },
    /// The provider or model cannot do what troupe needs.
    #[error("{message}")]
    Capability { code: &'static str, message: String },
}

impl HasCode for ProviderError {
    fn code(&self) -> Code {
        match self {
            ProviderError::Transient { code, .. } => Code {
                class: ErrorClass::ProviderTransient,
                name: code,
            },
            // Terminal provider failures have no class of their own in the
            // contract; they end the stage as an extension-host error.
            ProviderError::Terminal { code, .. } => Code {
                class: ErrorClass::ExtensionHost,
                name: code,
            },
            ProviderError::Capability { code, .. } => Code {
                class: ErrorClass::ProviderCapability,
                name: code,
            },
        }
    }
}

/// What a provider is, as the run's record shows it (`WorkflowStarted`):
/// never a key.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderInfo {
    pub name: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
}

/// Something a provider changed about how it works for the rest of the
/// run (e.g. it stopped streaming to an endpoint whose streams end early).
/// The stage records each as a `ProviderNotice` audit event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProviderNotice {
    /// A stable name, e.g. `StreamingDisabled`.
    pub code: &'static str,
    pub message: String,
}

/// A model backend.
pub trait Provider: Send + Sync + std::fmt::Debug {
    /// Recorded in every `ProviderRequestStarted`.
    fn name(&self) -> &'static str;

    /// The provider, model and endpoint, for `WorkflowStarted`.
    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: self.name(),
            ..ProviderInfo::default()
        }
    }

    /// Notices raised since the last call, each handed out once.
    fn take_notices(&self) -> Vec<ProviderNotice> {
        Vec::new()
    }

    fn complete(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<ModelResponse, ProviderError>>;
}
