//! What a hook is to the runtime: the [`Hook`] trait (implemented by
//! command hooks, and by library users for hooks in Rust), its reply and
//! its typed errors.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::Value;

use crate::definition::hooks::HookKind;

/// Why a hook gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("hook `{hook}` could not start: {message}")]
    Spawn { hook: String, message: String },
    #[error("hook `{hook}` did not answer within {timeout:?}")]
    Timeout { hook: String, timeout: Duration },
    #[error("hook `{hook}` exited with {status}: {stderr}")]
    Exit {
        hook: String,
        status: String,
        stderr: String,
    },
    #[error("hook `{hook}` printed something that is not {expected}: {found}")]
    Garbage {
        hook: String,
        expected: &'static str,
        found: String,
    },
    #[error("hook `{hook}` failed: {message}")]
    Failed { hook: String, message: String },
}

impl HookError {
    /// The stable code of every hook error.
    pub const CODE: &'static str = "ExtensionHost/HookFailed";
}

/// A hook's reply. Guards answer `Allow`/`Deny`; transforms `Replace` (or
/// `Allow` to leave the payload as it is); observers' replies are ignored.
#[derive(Debug, Clone, PartialEq)]
pub enum HookReply {
    Allow,
    Deny { reason: String },
    Replace(Value),
}

/// A hook, in Rust or as a command.
pub trait Hook: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn kind(&self) -> HookKind;
    /// For `TOOL_CALL` slots: whether the hook wants calls of `tool`.
    fn wants_tool(&self, _tool: &str) -> bool {
        true
    }
    fn call(
        &self,
        slot: &str,
        payload: Arc<Value>,
    ) -> BoxFuture<'static, Result<HookReply, HookError>>;
}
