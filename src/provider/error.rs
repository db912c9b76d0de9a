//! Why a model request failed, typed: worth retrying, not worth it, or
//! beyond what the provider or model can do; each with its stable code.

use std::time::Duration;

use crate::error::{Code, ErrorClass, HasCode};

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
