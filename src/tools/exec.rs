//! Executing a tool call: the built-in implementations behind one entry
//! point, with typed errors the model can read.

use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::error::{Code, ErrorClass, HasCode};

/// Why a tool call produced no result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolError {
    #[error("{message}")]
    Terminal { code: &'static str, message: String },
    #[error("{message}")]
    Transient { code: &'static str, message: String },
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

/// Runs built-in tool `name` with parsed `args`. Cancellation drops the
/// work in progress.
pub async fn execute(
    name: &str,
    args: &Value,
    cancel: &CancellationToken,
) -> Result<String, ToolError> {
    let work = async {
        match name {
            "Echo" => echo(args),
            other => Err(ToolError::Terminal {
                code: "ToolUnavailable",
                message: format!("tool `{other}` has no implementation in this build"),
            }),
        }
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(ToolError::Terminal { code: "ToolCancelled", message: "the tool call was cancelled".to_owned() }),
        result = work => result,
    }
}

fn echo(args: &Value) -> Result<String, ToolError> {
    match args.get("text") {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ToolError::Terminal {
            code: "InvalidArguments",
            message: "Echo needs `text`: a string".to_owned(),
        }),
    }
}
