//! A model backend: the [`Provider`] trait a stage calls once per try,
//! what a provider is as the run's record shows it, and the notices it
//! raises about how it works.

use futures::future::BoxFuture;

use super::error::ProviderError;
use super::turn::{ModelRequest, ModelResponse};

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
