//! Executing a tool call: arguments checked against the tool's schema, the
//! root resolved, then the built-in implementation, under the call's
//! cancellation token, with typed errors the model can read.

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::blocking::blocking;
use super::env::ToolEnv;
use super::error::ToolError;
pub use super::mcp::ToolOutput;
use super::{args, bash, edit, read, search};

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
    execute_output(env, name, args, cancel)
        .await
        .map(|out| out.text)
}

/// [`execute`], keeping an MCP tool's structured result beside its text.
/// A name with `__` goes to the run's MCP servers.
pub async fn execute_output(
    env: &ToolEnv,
    name: &str,
    args: &Value,
    cancel: &CancellationToken,
) -> Result<ToolOutput, ToolError> {
    if crate::definition::mcp::split_tool_name(name).is_some() {
        return match &env.mcp {
            // Boxed, like `Bash` below: see there.
            Some(pool) => Box::pin(pool.call(name, args, cancel)).await,
            None => Err(ToolError::terminal(
                "UnknownTool",
                format!("there is no tool `{name}` (this run has no MCP servers)"),
            )),
        };
    }
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
                // Boxed: its state is kilobytes, and unboxed it sized
                // every call's future, an `Echo`'s too, which each tool
                // call copied into its actor's task a few times.
                Box::pin(bash::bash(
                    &root,
                    &limits,
                    &a,
                    env.sandbox.as_deref(),
                    env.deny_network,
                ))
                .await
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
        result = work => result.map(|text| ToolOutput { text, structured: None }),
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

    use super::*;
    use crate::error::HasCode;

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
