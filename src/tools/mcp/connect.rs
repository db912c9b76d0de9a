//! One connection to one server: a stdio child (in a process group of its
//! own, under the shell sandbox unless its block says otherwise, stderr to
//! `mcp-<name>.log`, see `stderr_log`) or a Streamable HTTP session; `initialize`, then the
//! whole tool listing (every page). The connection kills the child's group
//! when dropped, and the reaper does after `kill -9`.

use std::io::Read;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use rmcp::model::{ClientConfig, Implementation};
use rmcp::service::{NotificationContext, RoleClient, RunningService};
use rmcp::{ClientHandler, ServiceExt};
use serde_json::Value;

use super::listing::{Listed, ListingCell};
use super::result::{ToolOutput, render_redacted};
use super::secrets::Secrets;
use super::watched::Watched;
use super::{McpError, McpStart};
use crate::definition::mcp::{McpServerDef, McpTransport};
use crate::tools::ToolError;
use crate::tools::process_group::GroupKill;

/// Answers the server's notifications: a changed tool list is fetched
/// again for later turns; elicitations are declined (no interactor here).
struct Handler {
    server: String,
    cell: Arc<ListingCell>,
    /// How long a listing may take (the server's start timeout).
    within: Duration,
    info: ClientConfig,
    elicitor: Arc<super::elicit::ElicitorSlot>,
    /// Its question's text is recorded (`InteractionRaised`): what the
    /// server was given stays out of it.
    secrets: Secrets,
    /// Calls in flight on the connection: a form asked while none is
    /// (the call that asked timed out, was cancelled or failed) is
    /// withdrawn, whether or not the server withdraws it.
    calls: Arc<tokio::sync::watch::Sender<usize>>,
}

impl ClientHandler for Handler {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    fn create_elicitation(
        &self,
        request: rmcp::model::ElicitRequestParams,
        context: rmcp::service::RequestContext<RoleClient>,
    ) -> impl Future<Output = Result<rmcp::model::ElicitResult, rmcp::ErrorData>> + Send + '_ {
        use super::elicit::{ElicitAnswer, ElicitRequest};
        use rmcp::model::{ElicitResult, ElicitationAction};
        let slot = Arc::clone(&self.elicitor);
        let server = self.server.clone();
        let secrets = self.secrets.clone();
        // Cancelled when the server withdraws its question
        // (`notifications/cancelled`, as when the call that asked was
        // cancelled) or the connection ends: the form leaves the terminal.
        let withdrawn = context.ct.clone();
        let mut calls = self.calls.subscribe();
        async move {
            let answer = match request {
                rmcp::model::ElicitRequestParams::FormElicitationParams {
                    message,
                    requested_schema,
                    ..
                } => match slot.get() {
                    Some(elicitor) => {
                        let schema = serde_json::to_value(&requested_schema).unwrap_or(Value::Null);
                        let asked = elicitor.elicit(ElicitRequest {
                            server,
                            message: secrets.text(message),
                            schema,
                        });
                        tokio::select! {
                            answer = asked => answer,
                            () = withdrawn.cancelled() => ElicitAnswer::Cancel,
                            _ = calls.wait_for(|n| *n == 0) => ElicitAnswer::Cancel,
                        }
                    }
                    None => ElicitAnswer::Decline,
                },
                // A URL to open in a browser: nothing here can.
                _ => ElicitAnswer::Decline,
            };
            Ok(match answer {
                ElicitAnswer::Accept(content) => {
                    ElicitResult::new(ElicitationAction::Accept).with_content(content)
                }
                ElicitAnswer::Decline => ElicitResult::new(ElicitationAction::Decline),
                ElicitAnswer::Cancel => ElicitResult::new(ElicitationAction::Cancel),
            })
        }
    }

    fn on_tool_list_changed(
        &self,
        context: NotificationContext<RoleClient>,
    ) -> impl Future<Output = ()> + Send + '_ {
        // Listed on a task of its own: this handler runs inside the
        // connection's loop, which must go on to read the answer.
        // One listing at a time: notifications that come meanwhile are
        // listed for once it is done, in one more listing.
        let peer = context.peer.clone();
        let cell = Arc::clone(&self.cell);
        let server = self.server.clone();
        let within = self.within;
        if cell.claim() {
            tokio::spawn(async move {
                loop {
                    while cell.is_stale() {
                        let ticket = cell.ticket();
                        match list(&server, &peer, within).await {
                            Ok(listed) => cell.replace(listed, ticket),
                            Err(_) => cell.keep_stale_listing(ticket),
                        }
                    }
                    cell.release();
                    // One that came as this let go is this one's to list.
                    if !(cell.is_stale() && cell.claim()) {
                        break;
                    }
                }
            });
        }
        std::future::ready(())
    }
}

/// The most pages a server's tool listing may take.
const MOST_PAGES: usize = 100;

/// The most tools a server may list.
const MOST_TOOLS: usize = 10_000;

/// The server's tools, page by page, within `within` in all. A listing
/// past [`MOST_PAGES`] or [`MOST_TOOLS`], or one that gives a cursor it
/// gave before (a server whose paging never ends), is refused: listed
/// without end, it would grow until memory ran out.
async fn list(
    server: &str,
    peer: &rmcp::Peer<RoleClient>,
    within: Duration,
) -> Result<Listed, McpError> {
    tokio::time::timeout(within, list_pages(server, peer))
        .await
        .map_err(|_| {
            McpError::new(
                "StartTimeout",
                format!("MCP server `{server}` did not list its tools in time"),
            )
        })?
}

async fn list_pages(server: &str, peer: &rmcp::Peer<RoleClient>) -> Result<Listed, McpError> {
    let failed = |why: String| {
        McpError::new(
            "ListFailed",
            format!("MCP server `{server}` did not list its tools: {why}"),
        )
    };
    let mut tools: Vec<Value> = Vec::new();
    let mut cursors = std::collections::HashSet::new();
    let mut cursor: Option<String> = None;
    for _ in 0..MOST_PAGES {
        let params = cursor.map(|c| serde_json::json!({ "cursor": c }));
        let page = super::raw::request(peer, "tools/list", params)
            .await
            .map_err(|e| failed(e.to_string()))?;
        // Each entry as the server wrote it: one the SDK's types would
        // refuse (a schema that is no object, a hint that is no boolean)
        // is left out by `Listed` alone, not the whole listing with it.
        let Some(entries) = page.get("tools").and_then(Value::as_array) else {
            return Err(failed("its answer has no `tools` list".to_owned()));
        };
        tools.extend(entries.iter().cloned());
        if tools.len() > MOST_TOOLS {
            return Err(failed(format!("it listed more than {MOST_TOOLS} tools")));
        }
        let next = match page.get("nextCursor") {
            None | Some(Value::Null) => None,
            Some(Value::String(c)) => Some(c.clone()),
            Some(other) => {
                return Err(failed(format!("its `nextCursor` is no string: {other}")));
            }
        };
        match next {
            None => return Ok(Listed::from_entries(server, &tools)),
            Some(next) if !cursors.insert(next.clone()) => {
                return Err(failed(format!(
                    "its listing came back to a page it gave before (cursor `{next}`)"
                )));
            }
            Some(next) => cursor = Some(next),
        }
    }
    Err(failed(format!(
        "its listing went on past {MOST_PAGES} pages"
    )))
}

/// A live connection to one server.
pub struct Connection {
    server: String,
    cell: Arc<ListingCell>,
    service: RunningService<RoleClient, Handler>,
    /// Set when the server went away, or when an HTTP server's stream
    /// could not be resumed (then its session may live on, but without
    /// the stream its notifications come on): the next call connects
    /// again.
    dead: Arc<AtomicBool>,
    /// How long a listing may take (the server's start timeout).
    within: Duration,
    /// What it was given from troupe's environment, kept out of what is
    /// recorded of it.
    secrets: Secrets,
    /// The stdio child's process group; killed when the connection goes.
    _group: Option<GroupKill>,
    /// Held while the listing is fetched again: calls that find it stale
    /// together list once, the others waiting for that one.
    refreshing: tokio::sync::Mutex<()>,
    /// Calls in flight (the handler's forms wait on it).
    calls: Arc<tokio::sync::watch::Sender<usize>>,
    /// The server sent a message too long to read, and the connection
    /// ended there.
    oversized: Arc<AtomicBool>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("server", &self.server)
            .finish()
    }
}

impl Connection {
    /// Starts or reaches `def`, initializes and lists its tools into
    /// `cell`.
    pub async fn open(
        def: &McpServerDef,
        start: &McpStart,
        cell: Arc<ListingCell>,
    ) -> Result<Arc<Connection>, McpError> {
        // A start that failed may quote the server's stderr.
        Connection::open_unredacted(def, start, cell)
            .await
            .map_err(|e| Secrets::of(def).error(e))
    }

    async fn open_unredacted(
        def: &McpServerDef,
        start: &McpStart,
        cell: Arc<ListingCell>,
    ) -> Result<Arc<Connection>, McpError> {
        let start_timeout = def.start_timeout.unwrap_or(start.start_timeout);
        let mut capabilities = rmcp::model::ClientCapabilities::default();
        capabilities.elicitation = Some(
            rmcp::model::ElicitationCapability::new()
                .with_form(rmcp::model::FormElicitationCapability::default()),
        );
        let calls = Arc::new(tokio::sync::watch::Sender::new(0usize));
        let handler = Handler {
            server: def.name.clone(),
            cell: Arc::clone(&cell),
            info: ClientConfig::new(
                capabilities,
                Implementation::new("troupe", env!("CARGO_PKG_VERSION")),
            ),
            elicitor: Arc::clone(&start.elicitor),
            within: start_timeout,
            secrets: Secrets::of(def),
            calls: Arc::clone(&calls),
        };
        // Set by a stdio server's transport when it meets a message too
        // long to read (`stdio.rs`).
        let oversized = Arc::new(AtomicBool::new(false));
        let dead = Arc::new(AtomicBool::new(false));
        let (service, group, log) = match &def.transport {
            McpTransport::Stdio {
                command,
                args,
                env,
                sandbox,
                writes,
                deny_network,
            } => {
                let deny = *deny_network || start.deny_network;
                let confined =
                    *sandbox && start.sandbox.as_ref().is_some_and(|s| s.writes.is_some());
                if deny && !confined {
                    return Err(McpError::new(
                        "NetworkDenyUnavailable",
                        format!(
                            "MCP server `{}` must run with `network: deny`, which needs the sandbox with Landlock (this server or run has none)",
                            def.name
                        ),
                    ));
                }
                // A command that is not there is said as such, sandboxed
                // or not: under the sandbox it would otherwise be the
                // sandbox's own start that failed (`InitializeFailed`).
                if !findable(command, &start.root) {
                    return Err(McpError::new(
                        "ServerNotFound",
                        format!(
                            "cannot start MCP server `{}` (`{command}`): no such program (not on PATH)",
                            def.name
                        ),
                    ));
                }
                // The scrubbed environment and the server's `env:` names,
                // with or without the sandbox: a server says what it
                // needs, and `--no-sandbox` (which hands shells every
                // variable) lifts only its write confinement.
                let (mut cmd, own_session) = match start.sandbox.as_deref() {
                    Some(sb) if *sandbox => {
                        let extra = writable(&def.name, writes)?;
                        let cmd = sb.program_command(command, args, env, &start.root, &extra, deny);
                        (cmd, sb.starts_session())
                    }
                    _ => {
                        let mut c = tokio::process::Command::new(command);
                        c.args(args).env_clear().envs(crate::environ::scrubbed(env));
                        (c, false)
                    }
                };
                if !own_session {
                    cmd.process_group(0);
                }
                cmd.current_dir(&start.root).kill_on_drop(true);
                let (stderr, log) = match &start.log_dir {
                    Some(dir) => {
                        let path = dir.join(format!("mcp-{}.log", def.name));
                        match super::stderr_log::open(&path) {
                            Ok(f) => (Stdio::piped(), Some((path, f))),
                            Err(e) => {
                                use std::io::Write as _;
                                let _ = writeln!(
                                    std::io::stderr(),
                                    "warning: MCP server `{}`: cannot write its log {}: {e}; its stderr is dropped",
                                    def.name,
                                    path.display()
                                );
                                (Stdio::null(), None)
                            }
                        }
                    }
                    None => (Stdio::null(), None),
                };
                let (child, piped) = super::stdio::StdioServer::spawn(
                    cmd,
                    stderr,
                    Arc::clone(&oversized),
                )
                .map_err(|e| {
                    McpError::new(
                        "ServerNotFound",
                        format!("cannot start MCP server `{}` (`{command}`): {e}", def.name),
                    )
                })?;
                // Read to its end: the task ends when the server's group
                // (which the connection kills) lets go of the pipe.
                let log = log.map(|(path, file)| {
                    let keeper = piped.map(|piped| {
                        tokio::spawn(super::stderr_log::keep(
                            piped,
                            path.clone(),
                            file,
                            super::stderr_log::LOG_CAP,
                            Secrets::of(def),
                        ))
                    });
                    (path, keeper)
                });
                let group = GroupKill::lasting(child.id());
                let watched = Watched {
                    inner: child,
                    cell: Arc::clone(&cell),
                };
                let served = tokio::time::timeout(start_timeout, handler.serve(watched)).await;
                (served, Some(group), log)
            }
            McpTransport::Http {
                url,
                headers_from_env,
            } => {
                let transport =
                    super::http::transport(&def.name, url, headers_from_env, Arc::clone(&dead))?;
                let watched = Watched {
                    inner: transport,
                    cell: Arc::clone(&cell),
                };
                let served = tokio::time::timeout(start_timeout, handler.serve(watched)).await;
                (served, None, None)
            }
        };
        let service = match service {
            Err(_) => {
                return Err(McpError::new(
                    "StartTimeout",
                    format!(
                        "MCP server `{}` did not answer `initialize` within {}{}",
                        def.name,
                        crate::definition::duration::format_duration(start_timeout),
                        last_words(group, log).await
                    ),
                ));
            }
            Ok(Err(e)) => {
                return Err(McpError::new(
                    "InitializeFailed",
                    format!(
                        "MCP server `{}` did not initialize: {}{}",
                        def.name,
                        super::http::initialize_failure(&e),
                        last_words(group, log).await
                    ),
                ));
            }
            Ok(Ok(service)) => service,
        };
        let ticket = cell.ticket();
        let listed = list(&def.name, service.peer(), start_timeout).await?;
        cell.replace(listed, ticket);
        // A server must speak a version of the protocol troupe knows.
        let version = service
            .peer_info()
            .map(|info| info.protocol_version.clone());
        if let Some(v) = version
            && !rmcp::model::ProtocolVersion::KNOWN_VERSIONS.contains(&v)
        {
            return Err(McpError::new(
                "ProtocolVersion",
                format!(
                    "MCP server `{}` speaks protocol version {v}, which troupe does not know (it knows {})",
                    def.name,
                    rmcp::model::ProtocolVersion::KNOWN_VERSIONS
                        .iter()
                        .map(ToString::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        Ok(Arc::new(Connection {
            cell: Arc::clone(&cell),
            server: def.name.clone(),
            service,
            dead,
            within: start_timeout,
            secrets: Secrets::of(def),
            _group: group,
            refreshing: tokio::sync::Mutex::new(()),
            calls,
            oversized,
        }))
    }

    /// Waits (at most `within`) for a `ping` to come back: the server has
    /// then read everything sent before it, cancel notifications included,
    /// since it reads its input in order.
    pub async fn flush(&self, within: std::time::Duration) {
        if !self.is_alive() {
            return;
        }
        let ping: rmcp::model::ClientRequest = rmcp::model::PingRequest {
            method: Default::default(),
            extensions: Default::default(),
        }
        .into();
        let _ = tokio::time::timeout(within, self.service.peer().send_request(ping)).await;
    }

    /// False once the server closed the connection or exited.
    pub fn is_alive(&self) -> bool {
        !self.dead.load(Ordering::Relaxed) && !self.service.is_closed()
    }

    /// One `tools/call`. Dropping the future cancels the request on the
    /// server (`notifications/cancelled`).
    pub async fn call(&self, tool: &str, args: &Value) -> Result<ToolOutput, ToolError> {
        /// Counts a call in flight until it ends or is dropped.
        struct InFlight<'a>(&'a tokio::sync::watch::Sender<usize>);
        impl Drop for InFlight<'_> {
            fn drop(&mut self) {
                self.0.send_modify(|n| *n = n.saturating_sub(1));
            }
        }
        self.calls.send_modify(|n| *n += 1);
        let _in_flight = InFlight(&self.calls);
        let outcome = self.call_unredacted(tool, args).await;
        self.secrets.outcome(outcome)
    }

    /// Fetches the listing again when the server said it changed: run
    /// after a call's answer and before the call returns, so that the next
    /// turn sees the new tools, under its own bound (the call's timeout
    /// covers the call alone). A listing that fails keeps the old one and
    /// is said once; the next change asks again.
    pub async fn refresh_if_stale(&self) {
        if !self.cell.is_stale() {
            return;
        }
        let _one = self.refreshing.lock().await;
        // Another call listed while this one waited.
        if !self.cell.is_stale() {
            return;
        }
        let ticket = self.cell.ticket();
        match list(&self.server, self.service.peer(), self.within).await {
            Ok(listed) => self.cell.replace(listed, ticket),
            Err(e) => {
                self.cell.keep_stale_listing(ticket);
                use std::io::Write as _;
                let _ = writeln!(
                    std::io::stderr(),
                    "warning: MCP server `{}` said its tools changed, but listing them again failed ({}: {}); its earlier listing stays",
                    self.server,
                    e.code,
                    e.message
                );
            }
        }
    }

    async fn call_unredacted(&self, tool: &str, args: &Value) -> Result<ToolOutput, ToolError> {
        let answer = super::raw::call(self.service.peer(), tool, args).await;
        match answer {
            // A task or a request for input instead of the call's result:
            // nothing troupe takes (the SDK's own call refused them too).
            Ok(result) if not_complete(&result).is_some() => Err(ToolError::terminal(
                "McpError",
                format!(
                    "MCP server `{}` answered `{tool}` with a {} result, which troupe does not take (only a call's complete result)",
                    self.server,
                    not_complete(&result).unwrap_or_default()
                ),
            )),
            Ok(result) => {
                render_redacted(&self.server, tool, &result, &|text| self.secrets.text(text))
            }
            Err(rmcp::ServiceError::McpError(e)) => Err(ToolError::terminal(
                "McpError",
                format!(
                    "MCP server `{}` refused `{tool}`: {} (code {})",
                    self.server, e.message, e.code.0
                ),
            )),
            Err(
                e @ (rmcp::ServiceError::TransportClosed | rmcp::ServiceError::TransportSend(_)),
            ) => {
                self.dead.store(true, Ordering::Relaxed);
                let oversized = self.oversized.load(Ordering::Relaxed);
                // Whose answer was too long is not known when several
                // calls were in flight: then each is told the connection
                // ended, and why, as for a server that exited.
                if oversized && *self.calls.borrow() <= 1 {
                    return Err(ToolError::terminal(
                        "ResultTooLarge",
                        format!(
                            "MCP server `{}` answered `{tool}` with a message over 16 MiB, more than troupe reads (results are cut to 256 KiB anyway); the connection was closed, and the server starts again at the next call",
                            self.server
                        ),
                    ));
                }
                let why = if oversized {
                    " (it sent a message over 16 MiB, more than troupe reads, which ended the connection)"
                } else {
                    ""
                };
                Err(ToolError::transient(
                    "ServerExited",
                    format!(
                        "MCP server `{}` went away during `{tool}`: {e}{why}",
                        self.server
                    ),
                ))
            }
            Err(e) => Err(ToolError::terminal(
                "McpError",
                format!("MCP server `{}` failed `{tool}`: {e}", self.server),
            )),
        }
    }
}

/// The folder a server's `writes:` entry names: `~/` is the home folder.
pub fn writes_path(entry: &str) -> Result<std::path::PathBuf, String> {
    match entry.strip_prefix("~/") {
        Some(rest) => match crate::environ::var("HOME").map(std::path::PathBuf::from) {
            Some(home) if home.is_absolute() => Ok(home.join(rest)),
            // Joined to nothing it would be relative again: made here,
            // granted elsewhere.
            _ => Err(format!(
                "`{entry}` names a folder under HOME, and HOME is not set to an absolute path"
            )),
        },
        None => Ok(std::path::PathBuf::from(entry)),
    }
}

/// The extra folders a sandboxed server may write: `~/` expanded, made if
/// missing (Landlock grants a folder that exists).
fn writable(server: &str, writes: &[String]) -> Result<Vec<std::path::PathBuf>, McpError> {
    writes
        .iter()
        .map(|w| {
            let path = writes_path(w).map_err(|why| {
                McpError::new(
                    "WritesUnusable",
                    format!("MCP server `{server}`: cannot use `{w}` as a writable folder: {why}"),
                )
            })?;
            std::fs::create_dir_all(&path).map_err(|e| {
                McpError::new(
                    "WritesUnusable",
                    format!("MCP server `{server}`: cannot use `{w}` as a writable folder: {e}"),
                )
            })?;
            Ok(path)
        })
        .collect()
}

/// Whether `command` names a file that can be run: a path (relative to
/// `root`, where the server starts), or a name found on `PATH`. Without a
/// `PATH` the start itself decides.
fn findable(command: &str, root: &std::path::Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let runnable = |p: &std::path::Path| {
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    };
    if command.contains('/') {
        return runnable(&root.join(command));
    }
    match crate::environ::var("PATH") {
        Some(path) => path
            .split(':')
            .filter(|d| !d.is_empty())
            .any(|d| runnable(&std::path::Path::new(d).join(command))),
        None => true,
    }
}

/// What a stdio server that failed to start wrote last, for its error:
/// its group killed first, then what it wrote let into the log (at most a
/// second), then the log's tail.
async fn last_words(
    group: Option<GroupKill>,
    log: Option<(std::path::PathBuf, Option<tokio::task::JoinHandle<()>>)>,
) -> String {
    drop(group);
    let Some((path, keeper)) = log else {
        return String::new();
    };
    if let Some(keeper) = keeper {
        let _ = tokio::time::timeout(Duration::from_secs(1), keeper).await;
    }
    log_tail(&path)
}

/// The last lines a stdio server wrote to its log, for an error message.
fn log_tail(path: &std::path::Path) -> String {
    use std::io::Seek;
    // Its last 64 KiB, read as text whatever the server wrote: a log of
    // gigabytes is not read whole, and bytes that are not UTF-8 do not
    // cost the tail.
    const TAIL: u64 = 64 * 1024;
    let mut bytes = Vec::new();
    if let Ok(mut f) = std::fs::File::open(path) {
        let len = f.metadata().map_or(0, |m| m.len());
        let _ = f.seek(std::io::SeekFrom::Start(len.saturating_sub(TAIL)));
        let _ = f.take(TAIL).read_to_end(&mut bytes);
    }
    let text = String::from_utf8_lossy(&bytes);
    let lines: Vec<&str> = text.lines().rev().take(5).collect();
    if lines.is_empty() {
        return String::new();
    }
    let tail: Vec<&str> = lines.into_iter().rev().collect();
    format!(" (its stderr, {}: {})", path.display(), tail.join(" | "))
}

/// The kind of a `tools/call` answer that is not a call's complete result
/// (a task, a request for input), if it is one.
fn not_complete(result: &Value) -> Option<String> {
    result
        .get("resultType")
        .and_then(Value::as_str)
        .filter(|kind| *kind != "complete")
        .map(|kind| format!("{kind:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_log_tail_is_the_last_lines_of_a_long_log_whatever_its_bytes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("mcp-x.log");
        let mut log = Vec::new();
        for i in 0..20_000 {
            log.extend_from_slice(format!("line {i}\n").as_bytes());
        }
        log.extend_from_slice(b"\xff\xfe not text \xc3\n");
        log.extend_from_slice(b"the last line\n");
        std::fs::write(&path, &log).expect("write");
        let tail = log_tail(&path);
        assert!(
            tail.contains("line 19999 | \u{fffd}\u{fffd} not text \u{fffd} | the last line"),
            "{tail}"
        );
        assert!(!tail.contains("line 0 "), "{tail}");
        assert_eq!(log_tail(&dir.path().join("none.log")), "");
    }
}
