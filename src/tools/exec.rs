//! Executing a tool call: arguments checked against the tool's schema, the
//! root resolved, then the built-in implementation, under the call's
//! cancellation token, with typed errors the model can read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::env::ToolEnv;
use super::{args, bash, edit, read, search};
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

    fn cancelled() -> ToolError {
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

/// Runs built-in tool `name` with parsed `args` inside `env`'s root.
/// Arguments are checked against the tool's schema first. Cancellation drops
/// the work in progress: blocking walks stop at their next check, a `Bash`
/// process group is killed, an `Edit`/`Write` either lands whole or not at
/// all.
pub async fn execute(
    env: &ToolEnv,
    name: &str,
    args: &Value,
    cancel: &CancellationToken,
) -> Result<String, ToolError> {
    let work = async {
        args::check(name, args)?;
        if name == "Echo" {
            return echo(args);
        }
        let root = env.canonical_root()?;
        let limits = env.limits.clone();
        match name {
            "Read" => {
                let a: read::ReadArgs = args::parse(name, args)?;
                blocking(move |stop| read::read(&root, &limits, &a, stop)).await
            }
            "Grep" => {
                let a: search::GrepArgs = args::parse(name, args)?;
                blocking(move |stop| search::grep(&root, &limits, &a, stop)).await
            }
            "Glob" => {
                let a: search::GlobArgs = args::parse(name, args)?;
                blocking(move |stop| search::glob(&root, &limits, &a, stop)).await
            }
            "Edit" => {
                let a: edit::EditArgs = args::parse(name, args)?;
                blocking(move |stop| edit::edit(&root, &limits, &a, stop)).await
            }
            "Write" => {
                let a: edit::WriteArgs = args::parse(name, args)?;
                blocking(move |stop| edit::write(&root, &a, stop)).await
            }
            "Bash" => {
                let a: bash::BashArgs = args::parse(name, args)?;
                bash::bash(&root, &limits, &a, env.sandbox.as_deref()).await
            }
            other => Err(ToolError::terminal(
                "ToolUnavailable",
                format!("tool `{other}` has no implementation in this build"),
            )),
        }
    };
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(ToolError::cancelled()),
        result = work => result,
    }
}

/// Tells blocking work that its caller is gone (cancelled or dropped).
#[derive(Debug, Clone)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A flag that is already raised, for tests of the blocking tools.
    #[cfg(test)]
    pub(crate) fn raised() -> Stop {
        Stop(Arc::new(AtomicBool::new(true)))
    }

    /// `Err(ToolCancelled)` once the caller is gone; call it in every loop.
    pub fn check(&self) -> Result<(), ToolError> {
        if self.0.load(Ordering::Relaxed) {
            Err(ToolError::cancelled())
        } else {
            Ok(())
        }
    }
}

/// Sets the stop flag when the awaiting future is dropped.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// Runs blocking file-system work on tokio's blocking pool. Dropping the
/// returned future (strict cancel) raises the stop flag, so walks end at
/// their next check instead of running on unowned.
async fn blocking<F>(work: F) -> Result<String, ToolError>
where
    F: FnOnce(&Stop) -> Result<String, ToolError> + Send + 'static,
{
    let flag = Arc::new(AtomicBool::new(false));
    let _stop_on_drop = StopOnDrop(Arc::clone(&flag));
    let stop = Stop(flag);
    match tokio::task::spawn_blocking(move || work(&stop)).await {
        Ok(result) => result,
        Err(e) if e.is_panic() => Err(ToolError::terminal(
            "ToolPanicked",
            "the tool crashed while working",
        )),
        Err(_) => Err(ToolError::cancelled()),
    }
}

fn echo(args: &Value) -> Result<String, ToolError> {
    match args.get("text") {
        Some(Value::String(s)) => Ok(s.clone()),
        _ => Err(ToolError::invalid_args("Echo needs `text`: a string")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn dropping_blocking_work_raises_its_stop_flag() {
        let (started_tx, started_rx) = tokio::sync::oneshot::channel();
        let (stopped_tx, stopped_rx) = std::sync::mpsc::channel();
        let call = tokio::spawn(blocking(move |stop| {
            let _ = started_tx.send(());
            while stop.check().is_ok() {
                std::thread::yield_now();
            }
            let _ = stopped_tx.send(());
            Ok(String::new())
        }));
        started_rx.await.unwrap();
        call.abort();
        assert!(call.await.unwrap_err().is_cancelled());
        stopped_rx.recv_timeout(Duration::from_secs(10)).unwrap();
    }

    #[tokio::test]
    async fn a_cancelled_token_ends_the_call() {
        let env = ToolEnv::new(".");
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err = execute(
            &env,
            "Bash",
            &serde_json::json!({"command": "sleep 30"}),
            &cancel,
        )
        .await
        .unwrap_err();
        assert_eq!(err.code().to_string(), "ToolTerminal/ToolCancelled");
    }
}
