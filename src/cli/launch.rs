//! Running a run from the command line, new (`troupe run`) or resumed
//! (`troupe resume`): checks the options, picks and checks the provider,
//! opens the run store, its lock and its writer, starts the audit log (new
//! or continued), runs the session under the signal watcher, then records
//! how the session ended in the store and prints the summary.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use troupe_actors::EventBus;

use super::Exit;
use super::options::RunOptions;
use super::output::{note_check, print_check_error, print_report, stored_summary};
use super::prompter::StdinPrompter;
use super::provider::{ProviderArgs, ProviderSetup};
use super::sandbox::shell_sandbox;
use super::signals::{FirstSignal, Interrupts};
use super::validate::{print_diagnostics, reject};
use crate::definition::{Backoff, Pipeline};
use crate::error::{HasCode, ValidationCode};
use crate::provider::Provider;
use crate::provider::openai::{CheckError, OpenAiProvider};
use crate::provider::script::{SCRIPT_FILE, Script};
use crate::provider::scripted::ScriptedProvider;
use crate::runtime::audit::{continue_audit_log, start_audit_log, start_event_stream};
use crate::runtime::ids::RunId;
use crate::runtime::interaction::{AnswerRules, InteractorSpec};
use crate::runtime::launch::start_run;
use crate::runtime::scheduler::Restore;
use crate::runtime::session::ToSession;
use crate::runtime::spec::RunSpec;
use crate::runtime::stage::RunSettings;
use crate::runtime::summary::{RunReport, RunStatus};
use crate::store::{RunLock, RunRow, Store, StoreError, StoreWriter, pipeline_digest, unix_ms};

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
    pub store: Store,
    pub lock: RunLock,
    pub digest: String,
}

/// How the actor system's part of a run ended.
enum LaunchOutcome {
    /// The report, and the last `seq` the run's events used.
    Report(Box<RunReport>, u64),
    /// The run could not start or lost its report.
    Aborted(String),
    /// The provider failed its capability check; nothing ran.
    Check(CheckError),
    /// A flag turned out wrong once the provider was known (a budget
    /// without a price for the model); nothing ran.
    Invalid(String),
    /// The run could not be recorded in the store; nothing ran.
    Store(StoreError),
    /// `--nats`: the server could not be used; nothing ran.
    Nats(crate::distributed::NatsError),
}

/// A bad flag or flag value: reported like a pipeline's diagnostics (as
/// JSON with `--json`), exit 2.
pub fn input_invalid(path: &Path, message: String, json: bool) -> Exit {
    reject(path, ValidationCode::InputInvalid, message, json)
}

/// A store that cannot be used: its typed error, exit 2.
pub fn store_failed(e: &StoreError, json: bool) -> Exit {
    super::output::typed_failure(&e.code().to_string(), &e.to_string(), &e.hint(), json)
}

/// NATS that cannot be used (`--nats`): its typed error, exit 2.
pub fn nats_failed(e: &crate::distributed::NatsError, json: bool) -> Exit {
    let hint = match e.code {
        "Unauthorized" => "check --nats-user/--nats-password-env or --nats-creds",
        "Unreachable" => {
            "is a nats-server with JetStream (-js) running there? See docs/distributed.md"
        }
        _ => "see docs/distributed.md",
    };
    super::output::typed_failure(&e.code().to_string(), &e.to_string(), hint, json)
}

/// One thread per core (at least one).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The store side of a run: the store, the run's lock and its writer.
struct Kept {
    store: Store,
    _lock: RunLock,
    writer: StoreWriter,
}

/// Runs `launch` with `opts`; the process exit code.
pub fn execute(launch: Launch, opts: &RunOptions) -> Exit {
    let Launch {
        path,
        pipeline,
        fields,
        resume,
    } = launch;
    let json = opts.json;
    if let Some(events) = &opts.events
        && events != "-"
    {
        return input_invalid(&path, "--events takes `-` (stdout)".to_owned(), json);
    }
    let root = match std::fs::canonicalize(&opts.root) {
        Ok(r) if r.is_dir() => r,
        Ok(_) | Err(_) => {
            return input_invalid(
                &path,
                format!("--root {} is not a directory", opts.root.display()),
                json,
            );
        }
    };
    let bad_selectors: Vec<String> = opts
        .fail_sibling
        .iter()
        .filter(|s| pipeline.stage(&s.stage).is_none())
        .map(|s| s.stage.clone())
        .collect();
    if !bad_selectors.is_empty() {
        return input_invalid(
            &path,
            format!(
                "--fail-sibling names unknown stage(s): {}",
                bad_selectors.join(", ")
            ),
            json,
        );
    }
    let settings = provider_settings(&opts.provider);
    let knobs = ScriptedKnobs {
        script: opts.script.as_deref(),
        latency: opts.latency,
        fail: &opts.fail_sibling,
    };
    let (provider, openai) = match make_provider(&opts.provider, &knobs, &pipeline, &path, json) {
        Ok(p) => p,
        Err(exit) => return exit,
    };
    let mut settings = settings;
    let mut interactors = Vec::new();
    for answers in &opts.answers {
        match AnswerRules::load(answers) {
            Ok(rules) => interactors.push(InteractorSpec::Scripted(Arc::new(rules))),
            Err(e) => return input_invalid(answers, format!("--answers {e}"), json),
        }
    }
    if opts.yolo {
        interactors.push(InteractorSpec::Yolo);
    }
    // `--remote`: approvals are also put to the control API's clients.
    let desk = opts
        .remote
        .then(|| Arc::new(crate::runtime::interaction::RemoteDesk::default()));
    if let Some(desk) = &desk {
        interactors.push(InteractorSpec::Remote(Arc::clone(desk)));
    }
    let questions = opts
        .remote
        .then(|| Arc::new(crate::runtime::ask::QuestionDesk::default()));
    if !opts.headless && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        interactors.push(InteractorSpec::Terminal(Arc::new(StdinPrompter)));
    }
    let cap = opts
        .parallel_cap
        .map(|c| c as usize)
        .or_else(|| resume.as_ref().map(|r| r.run.cap as usize));
    let mut spec = RunSpec::new(Arc::clone(&pipeline), fields, provider, cap);
    spec.interactors = interactors;
    spec.approval_timeout = opts.approval_timeout;
    let run_dir = match &resume {
        Some(r) => {
            spec.run_id = RunId::existing(&r.run.id);
            spec.bus = EventBus::continuing_after(r.last_seq);
            spec.restore = r.restore.clone();
            PathBuf::from(&r.run.run_dir)
        }
        None => opts.runs_dir.join(spec.run_id.as_str()),
    };
    let audit_path = run_dir.join("audit.jsonl");
    let resuming = resume.is_some();
    let run_id = spec.run_id.to_string();

    // The store is opened before anything else can fail, so a store that
    // cannot be used is said at once; the run is recorded in it only once
    // the provider and the budget are settled (nothing ran otherwise).
    let store = match (&resume, opts.no_store) {
        (_, true) => None,
        (Some(_), false) => None,
        (None, false) => match Store::open(&opts.store_path()) {
            Ok(store) => Some(store),
            Err(e) => return store_failed(&e, json),
        },
    };
    let keeping = !opts.no_store;

    let check_retries = settings.provider_retries;
    let check_backoff = settings.provider_backoff;
    let shell = shell_sandbox(opts.no_sandbox, &opts.pass_env, &root);
    settings.sandbox = shell.sandbox.clone();
    // `network: deny` anywhere must hold: checked on this kernel now.
    let deny_network = opts.network == "deny";
    if let Err(why) =
        super::sandbox::check_network_deny(&pipeline, deny_network, shell.sandbox.as_deref(), &root)
    {
        return input_invalid(&path, why, json);
    }
    settings.deny_network = deny_network;
    // MCP servers start (and are listed and checked) before anything runs.
    match super::mcp::start_servers(
        &pipeline,
        &root,
        shell.sandbox.clone(),
        Some(&run_dir),
        deny_network,
    ) {
        Ok(pool) => settings.mcp = pool,
        Err(e) => return super::mcp::mcp_failed(&e, json),
    }
    // Human steps ask the run's interactors (and, with --remote, the API).
    settings.asker = Some(Arc::new(crate::runtime::ask::RunAsker::new(
        &spec.interactors,
        questions.clone(),
    )));
    // The servers' questions go to the run's interactors.
    if let Some(pool) = &settings.mcp {
        pool.set_elicitor(Arc::new(crate::runtime::elicit::RunElicitor::new(
            &spec.interactors,
            spec.bus.clone(),
            spec.run_id.as_str(),
        )));
    }
    settings.root = root;
    settings.stage_timeout = opts.stage_timeout;
    settings.threads = opts.threads.map_or_else(default_threads, |n| n as usize);
    spec.max_run_time = opts.limits.max_run_time;

    let stream_events = opts.events.is_some();
    let check = openai.clone();
    let limits = opts.limits.clone();
    let run_pipeline = Arc::clone(&pipeline);
    let first_signal = FirstSignal::default();
    let watched = first_signal.clone();
    let kept_pipeline = Arc::clone(&pipeline);
    let nats_args = opts.nats.clone();
    let kept_dir = run_dir.clone();
    // The run's control socket, kept past the actor system so that event
    // streams can read the log's end before it goes.
    let control_slot: Arc<std::sync::Mutex<Option<crate::control::ControlServer>>> = Arc::default();
    let control_put = Arc::clone(&control_slot);
    let control_socket = run_dir.join(crate::control::SOCKET_NAME);
    let control_audit = audit_path.clone();
    let system = actix::System::new();
    let (ended, kept) = system.block_on(async move {
        if let Some((provider, false)) = &check {
            match provider.check(check_retries, &check_backoff).await {
                Ok(report) => note_check(provider, &report),
                Err(e) => return (LaunchOutcome::Check(e), None),
            }
        }
        // The budget prices the model the run actually asks, which the
        // check may have just picked.
        let model = match &check {
            Some((provider, _)) => provider.model().unwrap_or_default().to_owned(),
            None => "scripted".to_owned(),
        };
        match limits.budget(&run_pipeline, &model) {
            Ok(budget) => settings.budget = budget,
            Err(e) => return (LaunchOutcome::Invalid(e), None),
        }
        // The store, the run's lock, the writer: before anything runs.
        let kept = if keeping {
            match keep(store, &spec, &kept_pipeline, &kept_dir, resume) {
                Ok(kept) => Some(kept),
                Err(e) => return (LaunchOutcome::Store(e), None),
            }
        } else {
            None
        };
        settings.ledger = kept
            .as_ref()
            .map(|k| Arc::new(k.writer.ledger()) as Arc<dyn crate::runtime::ledger::Ledger>);
        // Across machines: fan-out siblings go to the workers' queue.
        if nats_args.nats.is_some() {
            let remote = remote_siblings(&nats_args, &spec, &kept_pipeline, &settings).await;
            match remote {
                Ok(remote) => spec.executor = Some(Arc::new(remote)),
                Err(e) => return (LaunchOutcome::Nats(e), kept),
            }
        }
        spec.settings = Arc::new(settings);
        let mut sinks = Vec::new();
        let audit = if resuming {
            continue_audit_log(&spec.bus, &audit_path)
        } else {
            start_audit_log(&spec.bus, &audit_path)
        };
        match audit {
            Ok(s) => sinks.push(s),
            Err(e) => {
                let why = format!("cannot write the audit log {}: {e}", audit_path.display());
                return (LaunchOutcome::Aborted(why), kept);
            }
        }
        if stream_events {
            match start_event_stream(&spec.bus, spec.run_id.as_str(), std::io::stdout()) {
                Ok(s) => sinks.push(s),
                Err(e) => {
                    return (
                        LaunchOutcome::Aborted(format!("cannot stream events: {e}")),
                        kept,
                    );
                }
            }
        }
        if !stream_events && !json && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            match super::progress::start_progress(&spec.bus, spec.settings.mcp.clone()) {
                Ok(s) => sinks.push(s),
                Err(e) => eprintln!("warning: no progress display: {e}"),
            }
        }
        let bus = spec.bus.clone();
        let control_run = (spec.run_id.to_string(), spec.pipeline.id.clone());
        let (session, done) = start_run(spec, sinks);
        let reach = session.clone();
        match crate::control::ControlServer::start(
            &control_socket,
            crate::control::RunControl {
                run_id: control_run.0,
                pipeline: control_run.1,
                audit_path: control_audit,
                cancel: Arc::new(move || reach.do_send(ToSession::Cancel)),
                desk,
                questions,
            },
        ) {
            Ok(server) => {
                if let Ok(mut slot) = control_put.lock() {
                    *slot = Some(server);
                }
            }
            Err(e) => eprintln!(
                "warning: the run cannot be reached from other processes: {}: {e}",
                control_socket.display()
            ),
        }
        let _interrupts = Interrupts::watch(watched, "cancelling the run", move || {
            session.do_send(ToSession::Cancel)
        });
        let ended = match done.await {
            Ok(report) => LaunchOutcome::Report(Box::new(report), bus.last_seq()),
            Err(_) => LaunchOutcome::Aborted("the run ended without a report".to_owned()),
        };
        (ended, kept)
    });
    // Event streams end at the log's WorkflowExit; then the socket goes.
    drop(control_slot.lock().ok().and_then(|mut s| s.take()));
    let (mut report, last_seq) = match ended {
        LaunchOutcome::Report(r, seq) => (*r, seq),
        LaunchOutcome::Aborted(e) => {
            eprintln!("error: Session/RunAborted: {e}");
            if let Some(kept) = kept {
                let reason = format!("Session/RunAborted: {e}");
                end_in_store(kept, &run_id, "failed", Some(&reason), &Value::Null);
            }
            return Exit::RunFailed;
        }
        LaunchOutcome::Check(e) => {
            print_check_error(&e, json);
            return Exit::Invalid;
        }
        LaunchOutcome::Invalid(message) => return input_invalid(&path, message, json),
        LaunchOutcome::Store(e) => return store_failed(&e, json),
        LaunchOutcome::Nats(e) => {
            if let Some(kept) = kept {
                let reason = format!("{}: {e}", e.code());
                end_in_store(kept, &run_id, "failed", Some(&reason), &Value::Null);
            }
            return nats_failed(&e, json);
        }
    };
    let stats = openai.as_ref().map(|(p, _)| p.stats());
    if let Some(kept) = kept {
        let (label, reason) = match &report.status {
            RunStatus::Ok => ("ok", None),
            RunStatus::Failed { reason } => ("failed", Some(reason.as_str())),
            RunStatus::Cancelled => ("cancelled", Some(crate::runtime::cancel::TURN_CANCELLED)),
        };
        let summary = stored_summary(&report, stats.as_ref());
        if let Some(warning) = end_in_store(kept, &run_id, label, reason, &summary) {
            report.warnings.push(warning);
        }
    }
    print_report(&report, stats.as_ref(), json, stream_events, last_seq);
    match report.status {
        RunStatus::Ok => Exit::Ok,
        RunStatus::Failed { .. } => Exit::RunFailed,
        RunStatus::Cancelled => first_signal.exit(),
    }
}

/// Opens the store for a run: a new run is recorded (and its lock
/// taken); a resumed one already holds both.
fn keep(
    store: Option<Store>,
    spec: &RunSpec,
    pipeline: &Pipeline,
    run_dir: &Path,
    resume: Option<Resumed>,
) -> Result<Kept, StoreError> {
    let (store, lock) = match (resume, store) {
        (Some(r), _) => {
            r.store.resume_run(&r.run.id, &r.digest)?;
            (r.store, r.lock)
        }
        (None, None) => {
            return Err(StoreError::Io {
                path: run_dir.to_owned(),
                detail: "internal: no store to record the run in".to_owned(),
            });
        }
        (None, Some(store)) => {
            let lock = RunLock::acquire(run_dir, spec.run_id.as_str())?;
            let digest = pipeline_digest(pipeline).map_err(|detail| StoreError::Io {
                path: pipeline.dir.clone(),
                detail,
            })?;
            store.begin_run(&RunRow {
                id: spec.run_id.to_string(),
                pipeline_id: pipeline.id.clone(),
                pipeline_dir: pipeline.dir.display().to_string(),
                digest,
                ctx: Value::Object((*spec.fields).clone()),
                cap: spec.cap as u64,
                run_dir: run_dir.display().to_string(),
                status: "running".to_owned(),
                reason: None,
                started_at: unix_ms(std::time::SystemTime::now()),
                ended_at: None,
                summary: None,
                sessions: 1,
            })?;
            (store, lock)
        }
    };
    let writer = StoreWriter::start(store.path())?;
    Ok(Kept {
        store,
        _lock: lock,
        writer,
    })
}

/// Waits for the writer, then records how the session ended; a warning
/// when the store could not take it.
fn end_in_store(
    kept: Kept,
    run_id: &str,
    status: &str,
    reason: Option<&str>,
    summary: &Value,
) -> Option<String> {
    let Kept {
        store,
        _lock,
        writer,
    } = kept;
    let mut warnings = Vec::new();
    if let Err(e) = writer.finish() {
        warnings.push(format!("{}: {e}", e.code()));
    }
    if let Err(e) = store.end_run(run_id, status, reason, summary) {
        warnings.push(format!("{}: {e}", e.code()));
    }
    (!warnings.is_empty()).then(|| format!("the run store: {}", warnings.join("; ")))
}

/// The executor that sends the run's fan-out siblings to the workers.
async fn remote_siblings(
    args: &crate::distributed::NatsArgs,
    spec: &RunSpec,
    pipeline: &Pipeline,
    settings: &RunSettings,
) -> Result<crate::distributed::RemoteSiblings, crate::distributed::NatsError> {
    let nats = args.connect(&format!("troupe run {}", spec.run_id)).await?;
    // The topology first, so a misconfigured server fails here, not
    // halfway through a fan-out.
    nats.tasks().await?;
    nats.reports().await?;
    nats.cancelled().await?;
    nats.groups().await?;
    let digest = pipeline_digest(pipeline).map_err(|message| crate::distributed::NatsError {
        code: "PipelineUnreadable",
        message,
    })?;
    Ok(crate::distributed::RemoteSiblings {
        nats,
        run_id: spec.run_id.to_string(),
        pipeline_id: pipeline.id.clone(),
        digest,
        fields: Arc::clone(&spec.fields),
        bus: spec.bus.clone(),
        ledger: settings.ledger.clone(),
        budget: settings.budget.clone(),
        session: uuid::Uuid::now_v7().simple().to_string(),
    })
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
    json: bool,
) -> Result<Chosen, Exit> {
    let setup = args
        .resolve(pipeline)
        .map_err(|e| input_invalid(path, e, json))?;
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
                        print_diagnostics(p, &diags, json);
                        return Err(Exit::Invalid);
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
                return Err(input_invalid(
                    path,
                    format!("{flag} is for the scripted provider, not openai"),
                    json,
                ));
            }
            match OpenAiProvider::new(*config) {
                Ok(p) => {
                    // Said once, when it happens; the audit log gets a
                    // `ProviderNotice` too.
                    p.on_notice(|n| eprintln!("note: {}", n.message));
                    Ok((Arc::new(p.clone()), Some((p, skip_check))))
                }
                Err(e) => Err(input_invalid(path, e.to_string(), json)),
            }
        }
    }
}
