//! What every tool call runs against: the project root it is confined to,
//! the caps that bound its output and its work, and the shell sandbox.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::error::ToolError;
use super::sandbox::ShellSandbox;

/// Output and work caps of the built-in tools. The defaults suit a model's
/// context window; tests lower them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolLimits {
    /// `Read`: lines returned when the call gives no `limit`.
    pub read_default_lines: usize,
    /// `Read`: characters kept of one line; the rest is cut with a marker.
    pub read_line_chars: usize,
    /// `Read`: bytes of output at most, whatever `limit` says.
    pub read_output_bytes: usize,
    /// `Read`: bytes scanned past the window to count the file's lines.
    pub read_scan_bytes: u64,
    /// `Grep` / `Glob`: results when the call gives no `max_results`.
    pub search_default_results: usize,
    /// `Grep`: characters kept of a matching line.
    pub grep_line_chars: usize,
    /// `Grep`: files larger than this are skipped.
    pub grep_file_bytes: u64,
    /// `Edit`: files larger than this are refused.
    pub edit_file_bytes: u64,
    /// `Bash`: bytes kept of stdout, and of stderr, each.
    pub bash_output_bytes: usize,
    /// `Bash`: timeout when the call gives no `timeout_ms`.
    pub bash_default_timeout: Duration,
}

impl Default for ToolLimits {
    fn default() -> Self {
        ToolLimits {
            read_default_lines: 2000,
            read_line_chars: 2000,
            read_output_bytes: 256 * 1024,
            read_scan_bytes: 64 * 1024 * 1024,
            search_default_results: 200,
            grep_line_chars: 500,
            grep_file_bytes: 16 * 1024 * 1024,
            edit_file_bytes: 16 * 1024 * 1024,
            bash_output_bytes: 30_000,
            bash_default_timeout: Duration::from_secs(120),
        }
    }
}

/// The environment of a tool call: the project root, the caps and the
/// shell sandbox.
#[derive(Debug, Clone)]
pub struct ToolEnv {
    root: PathBuf,
    pub limits: ToolLimits,
    /// What `Bash` runs under; `None` (the default) runs it with troupe's
    /// whole environment and unconfined writes.
    pub sandbox: Option<Arc<ShellSandbox>>,
    /// The run's MCP servers: tools named `server__tool` are called there.
    pub mcp: Option<Arc<super::mcp::McpPool>>,
    /// `Bash` may open no TCP connection (`network: deny`).
    pub deny_network: bool,
}

impl ToolEnv {
    /// An environment confined to `root`, with default caps. The root is
    /// canonicalized on every call ([`ToolEnv::canonical_root`]), so a root
    /// that is renamed or removed mid-run gives a typed error, not a stale path.
    pub fn new(root: impl Into<PathBuf>) -> ToolEnv {
        ToolEnv {
            root: root.into(),
            limits: ToolLimits::default(),
            sandbox: None,
            mcp: None,
            deny_network: false,
        }
    }

    pub fn with_deny_network(mut self, deny: bool) -> ToolEnv {
        self.deny_network = deny;
        self
    }

    pub fn with_mcp(mut self, mcp: Option<Arc<super::mcp::McpPool>>) -> ToolEnv {
        self.mcp = mcp;
        self
    }

    pub fn with_sandbox(mut self, sandbox: Option<Arc<ShellSandbox>>) -> ToolEnv {
        self.sandbox = sandbox;
        self
    }

    pub fn with_limits(mut self, limits: ToolLimits) -> ToolEnv {
        self.limits = limits;
        self
    }

    /// The root as given.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root with every symlink resolved; it must be a directory.
    pub fn canonical_root(&self) -> Result<PathBuf, ToolError> {
        let unavailable = |why: String| {
            ToolError::terminal(
                "RootUnavailable",
                format!("the project root {} {why}", self.root.display()),
            )
        };
        let root = std::fs::canonicalize(&self.root)
            .map_err(|e| unavailable(format!("cannot be resolved: {e}")))?;
        if root.is_dir() {
            Ok(root)
        } else {
            Err(unavailable("is not a directory".to_owned()))
        }
    }
}
