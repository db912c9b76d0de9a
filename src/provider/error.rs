//! Why a model request failed, typed: worth retrying, not worth it, or
//! beyond what the provider or model can do; each with its stable code.

use std::time::Duration;

use super::turn::Usage;
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
        /// What the server said this try used before it failed (a reply
        /// with no choices, an error inside a stream after its usage):
        /// the server bills it, so the run's usage and budget count it.
        usage: Option<Usage>,
    },
    /// Not worth retrying.
    #[error("{message}")]
    Terminal { code: &'static str, message: String },
    /// The provider or model cannot do what troupe needs.
    #[error("{message}")]
    Capability { code: &'static str, message: String },
}

impl ProviderError {
    /// A transient failure with no usage reported.
    pub fn transient(code: &'static str, message: impl Into<String>) -> ProviderError {
        ProviderError::Transient {
            code,
            message: message.into(),
            retry_after: None,
            usage: None,
        }
    }

    /// The same failure, with the usage the server reported for the try
    /// (kept on a transient failure; the other kinds end the stage and
    /// keep none).
    #[must_use]
    pub fn billed(mut self, spent: Option<Usage>) -> ProviderError {
        if let ProviderError::Transient { usage, .. } = &mut self
            && spent.is_some()
        {
            *usage = spent;
        }
        self
    }

    /// The usage the server reported for the failed try, if any.
    pub fn usage(&self) -> Option<Usage> {
        match self {
            ProviderError::Transient { usage, .. } => *usage,
            _ => None,
        }
    }
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
