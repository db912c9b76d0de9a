//! Tool errors: why a tool call produced no result ([`ToolError`], with its
//! stable code), and the `{class, code, message}` a model reads in its
//! place ([`ModelError`]).

use serde::Serialize;

use crate::error::{Code, ErrorClass, HasCode};

/// Why a tool call produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("{message}")]
    Terminal { code: &'static str, message: String },
    #[error("{message}")]
    Transient { code: &'static str, message: String },
}

impl ToolError {
    pub fn terminal(code: &'static str, message: impl Into<String>) -> ToolError {
        ToolError::Terminal {
            code,
            message: message.into(),
        }
    }

    pub fn transient(code: &'static str, message: impl Into<String>) -> ToolError {
        ToolError::Transient {
            code,
            message: message.into(),
        }
    }

    /// `ToolTerminal/InvalidArguments`.
    pub fn invalid_args(message: impl Into<String>) -> ToolError {
        ToolError::terminal("InvalidArguments", message)
    }

    /// An I/O error on `what` (a root-relative path), typed by its kind.
    pub fn io(what: &str, err: &std::io::Error) -> ToolError {
        use std::io::ErrorKind;
        match err.kind() {
            ErrorKind::NotFound => {
                ToolError::terminal("NotFound", format!("{what}: no such file or directory"))
            }
            ErrorKind::PermissionDenied => {
                ToolError::terminal("PermissionDenied", format!("{what}: permission denied"))
            }
            _ => ToolError::terminal("IoError", format!("{what}: {err}")),
        }
    }

    /// `ToolTerminal/ToolCancelled`: the call was cancelled.
    pub(crate) fn cancelled() -> ToolError {
        ToolError::terminal("ToolCancelled", "the tool call was cancelled")
    }
}

impl HasCode for ToolError {
    fn code(&self) -> Code {
        match self {
            ToolError::Terminal { code, .. } => Code {
                class: ErrorClass::ToolTerminal,
                name: code,
            },
            ToolError::Transient { code, .. } => Code {
                class: ErrorClass::ToolTransient,
                name: code,
            },
        }
    }
}

/// The `{class, code, message}` a model sees for an error.
#[derive(Debug, Clone, Serialize)]
pub struct ModelError {
    pub class: &'static str,
    pub code: String,
    pub message: String,
}

impl ModelError {
    pub fn new(code: Code, message: impl Into<String>) -> ModelError {
        ModelError {
            class: code.class.as_str(),
            code: code.to_string(),
            message: message.into(),
        }
    }

    /// The JSON text placed in a tool result.
    pub fn to_content(&self) -> String {
        serde_json::json!({"error": self}).to_string()
    }
}
