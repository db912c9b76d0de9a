//! Model providers: the request a stage sends, the turn it gets back, and
//! typed provider errors. `scripted` is the offline, deterministic default;
//! `openai` talks to any OpenAI-compatible `/v1/chat/completions` endpoint.
//! Nothing here knows the runtime: a request carries what a provider may
//! read, templates included ([`TemplateScope`]).

mod backend;
mod error;
mod message;
mod scope;
mod turn;

pub mod openai;
pub mod script;
pub mod scripted;
pub mod selector;
pub mod synth;

pub use backend::{Provider, ProviderInfo, ProviderNotice};
pub use error::ProviderError;
pub use message::{Message, ToolCall};
pub use scope::TemplateScope;
pub use turn::{ModelRequest, ModelResponse, RequestObserver, Usage};
