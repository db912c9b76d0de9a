//! The `openai` provider: any OpenAI-compatible
//! `/v1/chat/completions` endpoint — hosted APIs, llama.cpp's server,
//! Ollama, vLLM, LM Studio.
//!
//! - `config`: base URL, model, API key (from the environment, never
//!   printed), streaming, the concurrency limit and timeouts.
//! - `wire`: the request body (transcript + tool manifest) and the reply,
//!   streamed or plain, assembled into one `ModelResponse`.
//! - `sse`: server-sent events from a byte stream.
//! - `errors`: HTTP statuses, `Retry-After` and transport failures to typed
//!   `ProviderError`s with the server's message and no secret in them.
//! - `client`: one `reqwest::Client` per provider, the semaphore, one HTTP
//!   request per `complete` call (the stage retries transient errors).
//! - `probe`: the capability check at run start.

mod client;
mod config;
mod errors;
mod probe;
mod sse;
mod wire;

pub use client::{OpenAiProvider, ProviderStats};
pub use config::{
    DEFAULT_API_KEY_ENV, DEFAULT_BASE_URL, DEFAULT_MAX_INFLIGHT, DEFAULT_REQUEST_TIMEOUT,
    OpenAiConfig, Secret,
};
pub use errors::{parse_http_date, parse_retry_after};
pub use probe::{CheckError, CheckReport, PROBE_TOOL};
pub use sse::{SseDecoder, SseError, SseEvent};
pub use wire::Assembly;
pub use wire::tool as function_tool;
