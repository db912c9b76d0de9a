//! Running a run from the command line, new (`troupe run`) or resumed
//! (`troupe resume`): `prepared` checks the options, picks and checks the
//! provider, opens the run store, its lock and its writer, starts the
//! audit log (new or continued) and runs the session; here the session
//! runs under the signal watcher with its own control socket, and the
//! summary is printed. `troupe serve` starts its runs through `prepared`
//! too.

mod prepared;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

pub use self::prepared::{Concluded, Driven, Prepared, cancel, prepare};
use super::Exit;
use super::options::RunOptions;
use super::output::print_report;
use super::provider::{ProviderArgs, ProviderSetup};
pub use super::refusal::Refusal;
use super::signals::EarlyInterrupts;
use crate::definition::{Backoff, Pipeline};
use crate::provider::Provider;
use crate::provider::openai::OpenAiProvider;
use crate::provider::script::{SCRIPT_FILE, Script};
use crate::provider::scripted::ScriptedProvider;
use crate::runtime::scheduler::Restore;
use crate::runtime::stage::RunSettings;
use crate::runtime::summary::RunStatus;
use crate::store::{RunLock, RunRow, Store, StoreError};

/// A run ready to start.
#[derive(Debug)]
pub struct Launch {
    /// The pipeline path as given (for diagnostics).
    pub path: PathBuf,
    pub pipeline: Arc<Pipeline>,
    pub fields: Map<String, Value>,
    /// Set when the run is an earlier one resumed.
    pub resume: Option<Resumed>,
}

/// What a resumed run brings: its row, what it already has, where its log
/// ends, and the store and lock it was checked against.
#[derive(Debug)]
pub struct Resumed {
    pub run: RunRow,
    pub restore: Restore,
    pub last_seq: u64,
    /// What the run's stored executions used in its earlier sessions
    /// (its budget's meter starts there).
    pub spent: crate::provider::Usage,
    pub store: Store,
    pub lock: RunLock,
    pub digest: String,
}

/// Where a run is hosted.
#[derive(Debug, Clone, Default)]
pub struct Host {
    /// Hosted by `troupe serve`: no terminal of its own, and approvals and
    /// questions always go to the API's clients.
    pub server: bool,
    /// Request slots shared by every run of this host, per endpoint.
    pub slots: Option<Arc<EndpointSlots>>,
    /// `troupe chat`'s security mode for tool calls.
    pub tool_mode: Option<Arc<crate::runtime::tool_mode::ToolMode>>,
    /// MCP servers already running for this host, used instead of
    /// starting the pipeline's own: a chat starts them once for all its
    /// turns.
    pub mcp: Option<Arc<crate::tools::mcp::McpPool>>,
    /// `troupe serve --pipelines`: the API's clients are not trusted as
    /// the operator, so approvals are not put to them (a call outside a
    /// stage's allowedTools is denied, unless an operator's `--answers`
    /// file approves it); human steps' questions still are.
    pub untrusted_clients: bool,
    /// What earlier runs sharing this run's budget used: a chat's earlier
    /// turns, each a run of its own. Its `--max-tokens` and `--max-cost`
    /// bound the conversation, counted as a resumed run's earlier sessions
    /// are.
    pub spent_before: crate::provider::Usage,
}

/// One request limiter per OpenAI-compatible endpoint, shared by the runs
/// of one `troupe serve`: five runs against one API share its
/// `--max-inflight` (the first run to reach an endpoint sets it).
#[derive(Debug, Default)]
pub struct EndpointSlots(
    std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Semaphore>>>,
);

impl EndpointSlots {
    fn slots(&self, base_url: &str, max_inflight: usize) -> Arc<tokio::sync::Semaphore> {
        let mut map = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        Arc::clone(
            map.entry(base_url.to_owned())
                .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(max_inflight.max(1)))),
        )
    }
}

/// A bad flag or flag value: reported like a pipeline's diagnostics (as
/// JSON with `--json`), exit 2.
pub fn input_invalid(path: &Path, message: String, json: bool) -> Exit {
    Refusal::invalid(path, message).print(json)
}

/// A store that cannot be used, as a refusal.
pub fn store_refusal(e: &StoreError) -> Refusal {
    Refusal::typed(e, e.to_string(), &e.hint())
}

/// A store that cannot be used: its typed error, exit 2.
pub fn store_failed(e: &StoreError, json: bool) -> Exit {
    store_refusal(e).print(json)
}

/// NATS that cannot be used (`--nats`), as a refusal.
pub fn nats_refusal(e: &crate::distributed::NatsError) -> Refusal {
    let hint = match e.code {
        "Unauthorized" => "check --nats-user/--nats-password-env or --nats-creds",
        "Unreachable" => {
            "is a nats-server with JetStream (-js) running there? See docs/distributed.md"
        }
        _ => "see docs/distributed.md",
    };
    Refusal::typed(e, e.to_string(), hint)
}

/// The default `--threads`: [`threads_for`] this machine's cores.
pub fn default_threads() -> usize {
    threads_for(std::thread::available_parallelism().map_or(1, std::num::NonZero::get))
}

/// Arbiters for `cores`: one per core up to four. On more, the cores that
/// the run's own threads keep busy are left to them: the scheduler's, the
/// store writer and its answers, the audit writer with its compressor, and
/// the audit formatters ([`formatters_for`]). With one arbiter per core a
/// 16-core run had 25 busy threads, and it was slower with 16 arbiters
/// than with 8 (BENCHMARKS.md, "Every core, fifth round").
///
/// [`formatters_for`]: crate::runtime::audit::formatters_for
pub fn threads_for(cores: usize) -> usize {
    if cores <= 4 {
        return cores.max(1);
    }
    let own = crate::runtime::audit::formatters_for(cores) + 3;
    cores.saturating_sub(own).max(4)
}

/// Runs `launch` with `opts` in this process, on an actor system of its
/// own; the process exit code.
pub fn execute(launch: Launch, opts: &RunOptions, signals: Option<EarlyInterrupts>) -> Exit {
    let json = opts.json;
    // Watched from before the run's folder and store row are made: see
    // `EarlyInterrupts` (a resume installs it before its repair).
    let signals = signals.unwrap_or_else(|| EarlyInterrupts::install("cancelling the run"));
    let prepared = match prepare(launch, opts, &Host::default()) {
        Ok(p) => p,
        Err(refusal) => return refusal.print(json),
    };
    let stream_events = opts.events.is_some();
    // The first write the event stream could not make, if any.
    let stream_failed = Arc::new(std::sync::OnceLock::new());
    let first_signal = signals.first();
    // The run's control socket, kept past the actor system so that event
    // streams can read the log's end before it goes.
    let control_socket = prepared.run_dir.join(crate::control::SOCKET_NAME);
    let control = Arc::new(prepared.control());
    let reach = Arc::clone(&control);
    let run_id = prepared.run_id.clone();
    let system = actix::System::new();
    let mut server = None;
    let driven = system.block_on(async {
        let sinks = |bus: &troupe_actors::EventBus<_>, settings: &RunSettings| {
            let mut sinks = Vec::new();
            if stream_events {
                let out = Noting {
                    inner: std::io::stdout(),
                    failed: Arc::clone(&stream_failed),
                };
                match crate::runtime::audit::start_event_stream(bus, &run_id, out) {
                    Ok(s) => sinks.push(s),
                    Err(e) => say!("warning: cannot stream events: {e}"),
                }
            }
            if !stream_events && !json && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
                match super::progress::start_progress(bus, settings.mcp.clone()) {
                    Ok(s) => sinks.push(s),
                    Err(e) => say!("warning: no progress display: {e}"),
                }
            }
            sinks
        };
        let started = |session: actix::Addr<crate::runtime::session::Session>| {
            let for_signals = session.clone();
            reach.arm(move || cancel(&session));
            match crate::control::ControlServer::start(
                &control_socket,
                crate::control::Hosted::one(Arc::clone(&reach)),
            ) {
                Ok(s) => server = Some(s),
                Err(e) => say!(
                    "warning: the run cannot be reached from other processes: {}: {e}",
                    control_socket.display()
                ),
            }
            signals.arm(move || cancel(&for_signals));
        };
        prepared.drive(sinks, started).await
    });
    // Event streams end at the log's WorkflowExit; then the socket goes.
    drop(server);
    let (report, stats, last_seq) = match driven.conclude() {
        Concluded::Report {
            report,
            stats,
            last_seq,
        } => (report, stats, last_seq),
        Concluded::Aborted(e) => {
            say!("error: Session/RunAborted: {e}");
            return Exit::RunFailed;
        }
        Concluded::Refused(refusal) => return refusal.print(json),
    };
    // An event stream stdout stopped taking is a command whose output was
    // not delivered, as a report is (the run itself is in the store).
    let streamed = match stream_failed.get() {
        Some((kind, e)) => Err(std::io::Error::new(*kind, e.clone())),
        None => print_report(&report, stats.as_ref(), json, stream_events, last_seq),
    };
    if let Err(e) = streamed {
        // The run is in the store (`troupe runs show`) whatever became of
        // its report; the exit says the report was not delivered.
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Exit::ReaderGone;
        }
        say!(
            "error: cannot write the report of run {}: {e} (the store has it: `troupe runs show {}`)",
            report.run_id,
            report.run_id
        );
        return Exit::RunFailed;
    }
    // A failure asked for that never came: a selector past the fan-out's
    // width, or a stage that did not run (said, as `bench` refuses it).
    if report.status == RunStatus::Ok {
        for f in &opts.fail_sibling {
            say!(
                "warning: --fail-sibling {f}: the run ended ok, so it failed nothing (no execution matched it, or its failure was retried or skipped)"
            );
        }
    }
    match report.status {
        RunStatus::Ok => Exit::Ok,
        RunStatus::Failed { .. } => Exit::RunFailed,
        RunStatus::Cancelled => first_signal.exit(),
    }
}

/// A writer that keeps the first error it met (its kind and words).
struct Noting<W> {
    inner: W,
    failed: Arc<std::sync::OnceLock<(std::io::ErrorKind, String)>>,
}

impl<W: std::io::Write> Noting<W> {
    fn note<T>(&self, done: std::io::Result<T>) -> std::io::Result<T> {
        if let Err(e) = &done {
            let _ = self.failed.set((e.kind(), e.to_string()));
        }
        done
    }
}

impl<W: std::io::Write> std::io::Write for Noting<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let done = self.inner.write(buf);
        self.note(done)
    }

    fn write_all(&mut self, buf: &[u8]) -> std::io::Result<()> {
        let done = self.inner.write_all(buf);
        self.note(done)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let done = self.inner.flush();
        self.note(done)
    }
}

/// The scripted provider's knobs (`--script`, `--latency`,
/// `--fail-sibling`).
#[derive(Debug, Clone, Copy)]
pub struct ScriptedKnobs<'a> {
    pub script: Option<&'a Path>,
    pub latency: Option<std::time::Duration>,
    pub fail: &'a [crate::provider::selector::Selector],
}

/// The retry knobs of `--provider-retries` and `--provider-backoff` on
/// default settings.
pub fn provider_settings(args: &ProviderArgs) -> RunSettings {
    let mut settings = RunSettings::default();
    if let Some(n) = args.provider_retries {
        settings.provider_retries = n;
    }
    if let Some(d) = args.provider_backoff {
        settings.provider_backoff = Backoff::Exponential {
            initial: d,
            max: d.max(std::time::Duration::from_secs(10)),
        };
    }
    settings
}

/// A chosen provider, and (openai) the provider again with whether to
/// check it before the run.
pub type Chosen = (Arc<dyn Provider>, Option<(OpenAiProvider, bool)>);

/// The provider the flags (and the pipeline's block) choose: scripted,
/// with its knobs, or an openai one not yet checked (with whether to
/// check it). A bad flag is reported and its exit returned.
pub fn make_provider(
    args: &ProviderArgs,
    knobs: &ScriptedKnobs<'_>,
    pipeline: &Pipeline,
    path: &Path,
    slots: Option<&EndpointSlots>,
) -> Result<Chosen, Refusal> {
    let setup = args
        .resolve(pipeline)
        .map_err(|e| Refusal::invalid(path, e))?;
    match setup {
        ProviderSetup::Scripted => {
            let script_path = knobs.script.map(Path::to_owned).or_else(|| {
                let p = pipeline.dir.join(SCRIPT_FILE);
                p.is_file().then_some(p)
            });
            let script = match &script_path {
                Some(p) => match Script::load(p, pipeline) {
                    Ok(s) => s,
                    Err(diags) => {
                        return Err(Refusal::Diagnostics {
                            path: p.clone(),
                            diags,
                        });
                    }
                },
                None => Script::default(),
            };
            let provider = ScriptedProvider::new(script)
                .with_latency(knobs.latency)
                .with_failures(knobs.fail.to_vec());
            Ok((Arc::new(provider), None))
        }
        ProviderSetup::Openai { config, skip_check } => {
            let scripted_only = [
                (knobs.script.is_some(), "--script"),
                (knobs.latency.is_some(), "--latency"),
                (!knobs.fail.is_empty(), "--fail-sibling"),
            ];
            if let Some((_, flag)) = scripted_only.iter().find(|(set, _)| *set) {
                return Err(Refusal::invalid(
                    path,
                    format!("{flag} is for the scripted provider, not openai"),
                ));
            }
            let made = match slots {
                Some(shared) => {
                    let slots = shared.slots(config.base_url.as_str(), config.max_inflight);
                    OpenAiProvider::sharing(*config, slots)
                }
                None => OpenAiProvider::new(*config),
            };
            match made {
                Ok(p) => {
                    // Said once, when it happens; the audit log gets a
                    // `ProviderNotice` too.
                    p.on_notice(|n| say!("note: {}", n.message));
                    Ok((Arc::new(p.clone()), Some((p, skip_check))))
                }
                Err(e) => Err(Refusal::invalid(path, e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::threads_for;

    #[test]
    fn arbiters_leave_the_runs_own_threads_their_cores_on_big_machines() {
        let by_cores: Vec<(usize, usize)> = [0, 1, 2, 4, 5, 8, 12, 16, 32, 64]
            .into_iter()
            .map(|c| (c, threads_for(c)))
            .collect();
        assert_eq!(
            by_cores,
            [
                (0, 1),
                (1, 1),
                (2, 2),
                (4, 4),
                (5, 4),
                (8, 4),
                (12, 6),
                (16, 9),
                (32, 25),
                (64, 57)
            ]
        );
    }
}
