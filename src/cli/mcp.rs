//! Starting a pipeline's MCP servers for `run`, `resume`, `worker`,
//! `validate --connect` and `show`: every server started or reached and
//! listed, every `allowedTools` entry of a server checked against its
//! listing, before any stage runs. A failure is the server's typed
//! `Mcp/*` error with a hint, exit 2.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use super::Exit;
use crate::definition::{Pipeline, StageKind};
use crate::tools::mcp::{McpError, McpPool, McpStart};
use crate::tools::sandbox::ShellSandbox;

/// How long a server may take to start, initialize and list its tools.
/// `npx` fetching a package on first use is the slow case.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Starts the servers `pipeline` declares; `None` when it declares none.
pub fn start_servers(
    pipeline: &Pipeline,
    root: &Path,
    sandbox: Option<Arc<ShellSandbox>>,
    log_dir: Option<&Path>,
    deny_network: bool,
) -> Result<Option<Arc<McpPool>>, McpError> {
    if pipeline.mcp_servers.is_empty() {
        return Ok(None);
    }
    if let Some(dir) = log_dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            McpError::new(
                "LogUnwritable",
                format!(
                    "cannot make {} for the MCP servers' logs: {e}",
                    dir.display()
                ),
            )
        })?;
    }
    for def in &pipeline.mcp_servers {
        if let crate::definition::mcp::McpTransport::Stdio { env, .. } = &def.transport {
            for name in env.iter().filter(|n| crate::environ::var(n).is_none()) {
                say!(
                    "warning: MCP server `{}`: `{name}` (in its env:) is not set in troupe's environment; the server starts without it",
                    def.name
                );
            }
        }
        if let crate::definition::mcp::McpTransport::Stdio { sandbox: false, .. } = def.transport {
            say!(
                "note: MCP server `{}` runs without the sandbox (`sandbox: false`): it may write anywhere troupe may",
                def.name
            );
        }
    }
    let start = McpStart {
        root: root.to_owned(),
        sandbox,
        log_dir: log_dir.map(Path::to_owned),
        start_timeout: START_TIMEOUT,
        deny_network,
        elicitor: Arc::default(),
    };
    let pool = McpPool::start(&pipeline.mcp_servers, &start)?;
    for (server, tool, why) in pool.unusable_tools() {
        say!(
            "warning: MCP server `{server}`: tool `{tool}` is not offered ({}: {})",
            why.code,
            why.message
        );
    }
    for stage in &pipeline.stages {
        match &stage.kind {
            StageKind::Llm(def) => pool.check_allowed(&stage.id, &def.allowed_tools)?,
            // A tool step's MCP tool is checked now, not when the step is
            // reached after the stages before it ran.
            StageKind::Tool { tool, .. } => {
                if crate::definition::mcp::split_tool_name(tool).is_some_and(|(_, t)| t == "*") {
                    return Err(McpError::new(
                        "UnknownTool",
                        format!(
                            "stage `{}` is a tool step of `{tool}`, which names no one tool",
                            stage.id
                        ),
                    ));
                }
                pool.check_allowed(&stage.id, std::slice::from_ref(tool))?;
            }
            _ => {}
        }
    }
    Ok(Some(pool))
}

/// An MCP server that could not be used: its typed error, exit 2.
pub fn mcp_failed(e: &McpError, json: bool) -> Exit {
    mcp_refusal(e).print(json)
}

/// An MCP server that could not be used, as a refusal.
pub fn mcp_refusal(e: &McpError) -> super::Refusal {
    let hint = match e.code {
        "ServerNotFound" => "is the command installed and on PATH?",
        "UnknownTool" | "UnknownServer" => "`troupe validate --connect` lists every server's tools",
        "MissingSecret" => "set the variable the block names, in troupe's environment",
        "StartTimeout" | "InitializeFailed" => {
            "run the server's command by hand to see it start; a sandboxed server may write only inside --root (sandbox: false lifts that)"
        }
        _ => "see docs/mcp.md",
    };
    super::Refusal::typed(e, e.to_string(), hint)
}
