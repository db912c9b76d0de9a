//! MCP servers as tool sources: one connection per server per run (one
//! child process for a stdio server, one session for an HTTP one), shared
//! by every stage execution and multiplexed, at most `maxInflight` calls in
//! flight each. A pool is started before any stage runs, lists every
//! server's tools and stops its servers when dropped.
//!
//! The connections live on the pool's own small runtime, so the servers'
//! I/O never waits behind the actors; a call awaits its answer from any
//! thread. A dropped call (strict cancel) sends the protocol's
//! `notifications/cancelled`. A server that exits is started again, with
//! backoff, by the next call; the calls it had in flight fail as
//! `ToolTransient`.

mod connect;
mod elicit;
mod http;
mod listing;
mod raw;
mod result;
mod secrets;
mod stderr_log;
mod stdio;
mod watched;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio_util::sync::CancellationToken;

use super::error::ToolError;
use super::sandbox::ShellSandbox;
use crate::definition::ToolSpec;
use crate::definition::mcp::{McpServerDef, allows, split_tool_name, tool_name};
use crate::error::{Code, HasCode};
pub use connect::{Connection, writes_path};
pub use elicit::{ElicitAnswer, ElicitRequest, Elicitor, ElicitorSlot};
pub use listing::{Listed, Listing, ListingCell, McpTool};
pub use result::ToolOutput;

/// Why a pool could not start: a typed error the CLI turns into exit 2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct McpError {
    pub code: &'static str,
    pub message: String,
}

impl McpError {
    pub fn new(code: &'static str, message: impl Into<String>) -> McpError {
        McpError {
            code,
            message: message.into(),
        }
    }
}

impl HasCode for McpError {
    fn code(&self) -> Code {
        Code {
            class: crate::error::ErrorClass::Mcp,
            name: self.code,
        }
    }
}

/// What the servers of a run start with.
#[derive(Debug, Clone)]
pub struct McpStart {
    /// The project root: a stdio server's working folder.
    pub root: PathBuf,
    /// The run's shell sandbox: stdio servers run under it unless their
    /// block says `sandbox: false`. `None`: no sandbox for anything.
    pub sandbox: Option<Arc<ShellSandbox>>,
    /// Where `mcp-<name>.log` (a stdio server's stderr) goes; `None`
    /// discards it.
    pub log_dir: Option<PathBuf>,
    /// How long a server may take to start and answer `initialize` and
    /// its tool listing.
    pub start_timeout: Duration,
    /// `--network deny`: every sandboxed server runs without TCP.
    pub deny_network: bool,
    /// Who answers the servers' elicitations (set once the run's
    /// interactors exist; empty: declined).
    pub elicitor: Arc<ElicitorSlot>,
}

/// Every MCP server of a run.
pub struct McpPool {
    servers: BTreeMap<String, Arc<Server>>,
    elicitor: Arc<ElicitorSlot>,
    /// Owns the servers' I/O tasks; shut down after them.
    rt: Option<tokio::runtime::Runtime>,
}

impl std::fmt::Debug for McpPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpPool")
            .field("servers", &self.servers.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// One server: its definition, its connection, its listing and its slots.
#[derive(Debug)]
pub struct Server {
    pub def: McpServerDef,
    start: McpStart,
    conn: tokio::sync::Mutex<Option<Arc<Connection>>>,
    listing: Arc<ListingCell>,
    slots: tokio::sync::Semaphore,
    waiting: AtomicUsize,
    /// Restarts that failed in a row: the next one waits longer.
    failed_restarts: AtomicUsize,
    /// When the last restart failed, and why: a call that waited for it
    /// fails with it rather than trying its own (calls queued behind one
    /// server's restart would each wait a whole restart in turn).
    last_failure: std::sync::Mutex<Option<(tokio::time::Instant, String)>>,
    handle: tokio::runtime::Handle,
}

impl McpPool {
    /// Starts (or connects to) every server in `defs` and lists its tools.
    /// A server that cannot start, answer or list stops everything with a
    /// typed error naming it; the servers already started are stopped.
    pub fn start(defs: &[McpServerDef], start: &McpStart) -> Result<Arc<McpPool>, McpError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("troupe-mcp")
            .enable_all()
            .build()
            .map_err(|e| McpError::new("RuntimeFailed", format!("cannot start MCP I/O: {e}")))?;
        let mut pool = McpPool {
            servers: BTreeMap::new(),
            elicitor: Arc::clone(&start.elicitor),
            rt: None,
        };
        let handle = rt.handle().clone();
        // `block_on` on a thread of its own: the caller may be inside a
        // runtime already.
        let connected = std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    rt.block_on(async {
                        let mut all = Vec::new();
                        for def in defs {
                            let server = Arc::new(Server {
                                def: def.clone(),
                                start: start.clone(),
                                conn: tokio::sync::Mutex::new(None),
                                listing: Arc::default(),
                                slots: tokio::sync::Semaphore::new(def.max_inflight),
                                waiting: AtomicUsize::new(0),
                                failed_restarts: AtomicUsize::new(0),
                                last_failure: std::sync::Mutex::new(None),
                                handle: handle.clone(),
                            });
                            let conn = Connection::open(
                                &server.def,
                                &server.start,
                                Arc::clone(&server.listing),
                            )
                            .await?;
                            *server.conn.lock().await = Some(conn);
                            all.push(server);
                        }
                        Ok::<_, McpError>(all)
                    })
                })
                .join()
                .unwrap_or_else(|_| Err(McpError::new("Crashed", "starting MCP servers crashed")))
        });
        pool.rt = Some(rt);
        for server in connected? {
            pool.servers.insert(server.def.name.clone(), server);
        }
        Ok(Arc::new(pool))
    }

    /// Sets who answers the servers' elicitations (each run that uses the
    /// pool sets its own).
    pub fn set_elicitor(&self, elicitor: Arc<dyn Elicitor>) {
        self.elicitor.set(elicitor);
    }

    /// The servers, by name.
    pub fn servers(&self) -> impl Iterator<Item = &Arc<Server>> {
        self.servers.values()
    }

    /// Whether `name` (`server__tool`) is a tool some server lists now.
    pub fn knows(&self, name: &str) -> bool {
        self.find(name).is_some()
    }

    fn find(&self, name: &str) -> Option<(Arc<Server>, Arc<McpTool>)> {
        let (server, tool) = split_tool_name(name)?;
        let server = self.servers.get(server)?;
        let found = server.listing().get(tool)?;
        Some((Arc::clone(server), found))
    }

    /// Every listed tool troupe cannot offer, by server, with why.
    pub fn unusable_tools(&self) -> Vec<(String, String, McpError)> {
        self.servers
            .iter()
            .flat_map(|(name, s)| {
                s.listing()
                    .unusable_tools()
                    .map(|(tool, why)| (name.clone(), tool.clone(), why.clone()))
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// Checks `allowedTools` entries of MCP servers against the listings:
    /// each must name a listed tool, or be a wildcard of a running server.
    /// The error names the server and the closest names.
    pub fn check_allowed(&self, stage: &str, entries: &[String]) -> Result<(), McpError> {
        for entry in entries {
            let Some((server, tool)) = split_tool_name(entry) else {
                continue;
            };
            let Some(s) = self.servers.get(server) else {
                return Err(McpError::new(
                    "UnknownServer",
                    format!(
                        "stage `{stage}` allows `{entry}`, but the pipeline has no MCP server `{server}`"
                    ),
                ));
            };
            if tool == "*" {
                continue;
            }
            let listing = s.listing();
            if let Some(why) = listing.unusable(tool) {
                return Err(McpError::new(
                    why.code,
                    format!(
                        "stage `{stage}` allows `{entry}`, which troupe cannot offer: {}",
                        why.message
                    ),
                ));
            }
            if listing.get(tool).is_none() {
                let names = listing.names();
                let close = crate::definition::fields::did_you_mean(
                    tool,
                    &names.iter().map(String::as_str).collect::<Vec<_>>(),
                )
                .map(|n| format!("; did you mean `{}`?", tool_name(server, n)))
                .unwrap_or_default();
                return Err(McpError::new(
                    "UnknownTool",
                    format!(
                        "stage `{stage}` allows `{entry}`, but MCP server `{server}` lists no tool `{tool}`{close} (it lists: {})",
                        names.join(", ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The specs of every listed tool an `allowedTools` list allows, in
    /// the list's order, named `server__tool`, with the servers' own
    /// schemas.
    pub fn specs(&self, allowed: &[String]) -> Vec<ToolSpec> {
        let mut out: Vec<ToolSpec> = Vec::new();
        for entry in allowed {
            let Some((server, _)) = split_tool_name(entry) else {
                continue;
            };
            let Some(s) = self.servers.get(server) else {
                continue;
            };
            for tool in s.listing().tools() {
                let name = tool_name(server, &tool.name);
                if allows(entry, &name) && !out.iter().any(|t| t.name == name) {
                    out.push(tool.spec(&name));
                }
            }
        }
        out
    }

    /// A number that changes whenever a listing does
    /// (`notifications/tools/list_changed`): manifests built before are
    /// stale.
    pub fn generation(&self) -> u64 {
        self.servers.values().map(|s| s.listing().generation).sum()
    }

    /// Calls `name` (`server__tool`) with `args`, under `cancel`.
    pub async fn call(
        &self,
        name: &str,
        args: &Value,
        cancel: &CancellationToken,
    ) -> Result<ToolOutput, ToolError> {
        let Some((server, tool)) = self.find(name) else {
            return Err(ToolError::terminal(
                "UnknownTool",
                format!("there is no tool `{name}`"),
            ));
        };
        tool.check_args(args)?;
        tokio::select! {
            biased;
            () = cancel.cancelled() => Err(ToolError::cancelled()),
            r = server.call(&tool.name, args) => r,
        }
    }

    /// Ends every server's connection (a stdio server's process group
    /// with it) while no call uses it; the next call starts it again.
    /// Its listing stays.
    pub fn park(&self) {
        for server in self.servers.values() {
            if let Ok(mut conn) = server.conn.try_lock() {
                conn.take();
            }
        }
    }

    /// Calls waiting for a free slot, over every server.
    pub fn waiting(&self) -> usize {
        self.servers
            .values()
            .map(|s| s.waiting.load(Ordering::Relaxed))
            .sum()
    }
}

impl Drop for McpPool {
    fn drop(&mut self) {
        // Let each server read what was sent last (the cancels of a
        // fail-fast), then kill every server's process group (the
        // connections' guards), and let the runtime go without blocking:
        // a pool may be dropped on an async thread.
        if let Some(rt) = &self.rt {
            let conns: Vec<Arc<Connection>> = self
                .servers
                .values()
                .filter_map(|s| s.conn.try_lock().ok().and_then(|c| c.clone()))
                .collect();
            std::thread::scope(|scope| {
                scope.spawn(|| {
                    rt.block_on(futures::future::join_all(
                        conns.iter().map(|c| c.flush(Duration::from_secs(1))),
                    ))
                });
            });
        }
        for server in self.servers.values() {
            if let Ok(mut conn) = server.conn.try_lock() {
                conn.take();
            }
        }
        self.servers.clear();
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Server {
    /// The tools the server listed last (kept while it restarts).
    pub fn listing(&self) -> Arc<Listing> {
        self.listing.get()
    }

    async fn connection(&self) -> Result<Arc<Connection>, ToolError> {
        let asked = tokio::time::Instant::now();
        let mut conn = self.conn.lock().await;
        if let Some(c) = conn.as_ref()
            && c.is_alive()
        {
            return Ok(Arc::clone(c));
        }
        let failed_meanwhile = self.last_failure.lock().ok().and_then(|f| {
            f.as_ref()
                .filter(|(at, _)| *at >= asked)
                .map(|(_, e)| e.clone())
        });
        if let Some(why) = failed_meanwhile {
            return Err(ToolError::transient("ServerUnavailable", why));
        }
        // Gone: start it again, waiting longer the more restarts failed
        // in a row.
        let n = self.failed_restarts.load(Ordering::Relaxed);
        let wait = Duration::from_millis(100u64.saturating_mul(1 << n.min(6)));
        tokio::time::sleep(wait.min(Duration::from_secs(5))).await;
        let def = self.def.clone();
        let start = self.start.clone();
        let cell = Arc::clone(&self.listing);
        let opened = self
            .handle
            .spawn(async move { Connection::open(&def, &start, cell).await })
            .await
            .map_err(|_| {
                ToolError::transient("ServerUnavailable", "restarting the MCP server crashed")
            })?;
        match opened {
            Ok(c) => {
                self.failed_restarts.store(0, Ordering::Relaxed);
                *conn = Some(Arc::clone(&c));
                Ok(c)
            }
            Err(e) => {
                self.failed_restarts.fetch_add(1, Ordering::Relaxed);
                *conn = None;
                let why = format!(
                    "MCP server `{}` is down and did not restart: {e}",
                    self.def.name
                );
                if let Ok(mut last) = self.last_failure.lock() {
                    *last = Some((tokio::time::Instant::now(), why.clone()));
                }
                Err(ToolError::transient("ServerUnavailable", why))
            }
        }
    }

    async fn call(&self, tool: &str, args: &Value) -> Result<ToolOutput, ToolError> {
        /// Counts a call among the waiting until it has a slot, or is
        /// dropped (cancelled) while waiting.
        struct Waiting<'a>(&'a std::sync::atomic::AtomicUsize);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.waiting.fetch_add(1, Ordering::Relaxed);
        let waiting = Waiting(&self.waiting);
        let slot = self.slots.acquire().await;
        drop(waiting);
        let _slot =
            slot.map_err(|_| ToolError::transient("ServerUnavailable", "the MCP pool is closed"))?;
        let conn = self.connection().await?;
        match tokio::time::timeout(self.def.timeout, conn.call(tool, args)).await {
            Ok(r) => {
                conn.refresh_if_stale().await;
                r
            }
            // Dropping the call sent the server its cancel notification.
            Err(_) => Err(ToolError::transient(
                "Timeout",
                format!(
                    "MCP tool `{}` of `{}` did not answer within {}",
                    tool,
                    self.def.name,
                    crate::definition::duration::format_duration(self.def.timeout)
                ),
            )),
        }
    }
}
