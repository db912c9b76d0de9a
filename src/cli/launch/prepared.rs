//! A run in three steps, so that `troupe run` (one run, its own actor
//! system) and `troupe serve` (many runs in one) start runs the same way:
//! [`prepare`] checks everything that can be checked before the actor
//! system (flags, provider, sandbox, MCP servers, the store); [`Prepared::
//! drive`] runs the session on the current actor system; [`Driven::
//! conclude`] records how it ended in the store.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use actix::Addr;
use troupe_actors::EventBus;

use super::{Host, Launch, Refusal, Resumed, ScriptedKnobs, make_provider, provider_settings};
use crate::cli::limits::LimitArgs;
use crate::cli::options::RunOptions;
use crate::cli::output::{note_check, stored_summary};
use crate::cli::sandbox::shell_sandbox;
use crate::definition::{Backoff, Pipeline};
use crate::error::HasCode;
use crate::provider::Usage;
use crate::provider::openai::{CheckError, OpenAiProvider, ProviderStats};
use crate::runtime::ask::QuestionDesk;
use crate::runtime::audit::{Sink, continue_audit_log, formatters_here, start_audit_log};
use crate::runtime::events::Event;
use crate::runtime::ids::RunId;
use crate::runtime::interaction::{AnswerRules, InteractorSpec, RemoteDesk};
use crate::runtime::launch::start_run;
use crate::runtime::session::{Session, ToSession};
use crate::runtime::spec::RunSpec;
use crate::runtime::stage::RunSettings;
use crate::runtime::summary::{RunReport, RunStatus};
use crate::store::{RunLock, RunRow, Store, StoreError, StoreWriter, pipeline_digest, unix_ms};

/// A run whose every check before the actor system passed.
pub struct Prepared {
    pub run_id: String,
    pub pipeline: Arc<Pipeline>,
    pub run_dir: PathBuf,
    pub audit_path: PathBuf,
    /// The run's API interactor (`--remote`, and every run a server hosts).
    pub desk: Option<Arc<RemoteDesk>>,
    /// Human steps' questions open to API clients.
    pub questions: Option<Arc<QuestionDesk>>,
    /// The run's store writer, once it runs: what its control reads the
    /// store's lag from.
    store_probe: Arc<std::sync::OnceLock<crate::store::StoreLedger>>,
    spec: RunSpec,
    settings: RunSettings,
    openai: Option<(OpenAiProvider, bool)>,
    check_retries: u32,
    check_backoff: Backoff,
    limits: LimitArgs,
    store: Option<Store>,
    keeping: bool,
    resume: Option<Resumed>,
    /// What the run's budget counts as spent before it starts: a resumed
    /// run's earlier sessions, a chat's earlier turns.
    earlier: Usage,
    nats: crate::distributed::NatsArgs,
    /// The shells' sandbox and private temp folder: kept until the run
    /// is recorded as ended.
    shell: crate::cli::sandbox::ShellSetup,
    /// `--otlp`: where the run's trace goes.
    otlp: Option<crate::telemetry::OtlpConfig>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("run_id", &self.run_id)
            .finish()
    }
}

/// What a resume refused for its earlier sessions' spend can do.
const OVER_BUDGET_HINT: &str = "a resumed run's budget counts what its stored stages used in earlier sessions; resume with a larger --max-tokens or --max-cost to go on (a `troupe serve --pipelines` refuses those flags: resume with --local beside it, or raise the pipeline's provider.maxTokens or maxCost and resume with --force)";

/// Checks `launch` with `opts` and readies it: a refusal when anything
/// would stop it (nothing ran, nothing was recorded).
pub fn prepare(launch: Launch, opts: &RunOptions, host: &Host) -> Result<Prepared, Refusal> {
    let Launch {
        path,
        pipeline,
        fields,
        resume,
    } = launch;
    if let Some(events) = &opts.events
        && events != "-"
    {
        return Err(Refusal::invalid(&path, "--events takes `-` (stdout)"));
    }
    let root = crate::cli::options::project_root(&opts.root)
        .map_err(|why| Refusal::invalid(&path, why))?;
    let bad_selectors: Vec<String> = opts
        .fail_sibling
        .iter()
        .filter(|s| pipeline.stage(&s.stage).is_none())
        .map(|s| s.stage.clone())
        .collect();
    if !bad_selectors.is_empty() {
        return Err(Refusal::invalid(
            &path,
            format!(
                "--fail-sibling names unknown stage(s): {}",
                bad_selectors.join(", ")
            ),
        ));
    }
    let otlp = crate::telemetry::OtlpConfig::resolve(opts.otlp.as_deref(), opts.otlp_content)
        .map_err(|why| Refusal::invalid(&path, why))?;
    let mut settings = provider_settings(&opts.provider);
    let knobs = ScriptedKnobs {
        script: opts.script.as_deref(),
        latency: opts.latency,
        fail: &opts.fail_sibling,
    };
    let (provider, openai) = make_provider(
        &opts.provider,
        &knobs,
        &pipeline,
        &path,
        host.slots.as_deref(),
    )?;
    // A resumed run already over its budget is refused here, before its
    // MCP servers start or its provider is asked anything: the token
    // limit, and the cost limit when the model and its price are known
    // yet (the rest once the capability check has picked the model).
    let mut earlier = host.spent_before;
    if let Some(resume) = &resume {
        earlier.add(resume.spent);
    }
    if resume.is_some() || earlier != Usage::default() {
        let model = match &openai {
            Some((provider, _)) => provider.model().map(str::to_owned),
            None => Some("scripted".to_owned()),
        };
        if let Some(over) = opts
            .limits
            .already_over(&pipeline, model.as_deref(), earlier)
        {
            return Err(Refusal::typed(&over, over.to_string(), OVER_BUDGET_HINT));
        }
    }
    let mut files = Vec::new();
    for answers in &opts.answers {
        match AnswerRules::load(answers) {
            Ok(rules) => files.push(rules),
            Err(e) => return Err(Refusal::invalid(answers, format!("--answers {e}"))),
        }
    }
    let mut interactors = Vec::new();
    if opts.yolo {
        interactors.push(InteractorSpec::Yolo);
    }
    // Approvals are also put to the control API's clients, unless those
    // are not trusted with them.
    let remote = opts.remote || host.server;
    let desk = (remote && !host.untrusted_clients).then(|| Arc::new(RemoteDesk::default()));
    if let Some(desk) = &desk {
        interactors.push(InteractorSpec::Remote(Arc::clone(desk)));
    }
    let questions = remote.then(|| Arc::new(QuestionDesk::default()));
    if !host.server && !opts.headless && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        interactors.push(InteractorSpec::Terminal(Arc::new(
            crate::cli::prompter::StdinPrompter::default(),
        )));
    }
    // An answers file answers what its rules match; the rest it leaves to
    // a person (or --yolo) when there is one, rather than deny it at once
    // before they are asked. With files alone, no rule matching denies.
    let others = !interactors.is_empty();
    let files = files.into_iter().map(|mut rules| {
        rules.leave_unmatched = others;
        InteractorSpec::Scripted(Arc::new(rules))
    });
    let interactors: Vec<InteractorSpec> = files.chain(interactors).collect();
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
    // The store is opened before anything else can fail, so a store that
    // cannot be used is said at once; the run is recorded in it only once
    // the provider and the budget are settled (nothing ran otherwise).
    let store = match (&resume, opts.no_store) {
        (_, true) | (Some(_), false) => None,
        (None, false) => {
            Some(Store::open(&opts.store_path()).map_err(|e| super::store_refusal(&e))?)
        }
    };
    let shell = shell_sandbox(opts.no_sandbox, &opts.pass_env, &root);
    // A run for clients not trusted as the operator runs confined or not
    // at all: unconfined, its shells could write the operator's pipelines.
    if host.untrusted_clients && shell.sandbox.as_ref().is_none_or(|s| s.writes.is_none()) {
        let e = crate::tools::sandbox::SandboxError::Unavailable(
            "the shells' writes could not be confined for this run".to_owned(),
        );
        return Err(Refusal::typed(
            &e,
            e.to_string(),
            "this server's runs must be confined (`--pipelines`): see its log for why this one could not be",
        ));
    }
    settings.sandbox = shell.sandbox.clone();
    // `network: deny` anywhere must hold: checked on this kernel now.
    let deny_network = opts.network == "deny";
    crate::cli::sandbox::check_network_deny(
        &pipeline,
        deny_network,
        shell.sandbox.as_deref(),
        &root,
    )
    .map_err(|why| Refusal::invalid(&path, why))?;
    settings.deny_network = deny_network;
    // MCP servers start (and are listed and checked) before anything runs.
    settings.mcp = match &host.mcp {
        Some(pool) => Some(Arc::clone(pool)),
        None => crate::cli::mcp::start_servers(
            &pipeline,
            &root,
            shell.sandbox.clone(),
            Some(&run_dir),
            deny_network,
        )
        .map_err(|e| crate::cli::mcp::mcp_refusal(&e))?,
    };
    // Human steps ask the run's interactors (and the API's clients).
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
    settings.tool_mode.clone_from(&host.tool_mode);
    settings.root = root;
    settings.stage_timeout = opts.stage_timeout;
    settings.threads = opts
        .threads
        .map_or_else(super::default_threads, |n| n as usize);
    spec.max_run_time = opts.limits.max_run_time;
    Ok(Prepared {
        run_id: spec.run_id.to_string(),
        // A resumed run of an older troupe goes on in its plain log.
        audit_path: crate::auditlog::in_dir(&run_dir),
        run_dir,
        pipeline,
        desk,
        questions,
        store_probe: Arc::default(),
        check_retries: settings.provider_retries,
        check_backoff: settings.provider_backoff,
        spec,
        settings,
        openai,
        limits: opts.limits.clone(),
        store,
        keeping: !opts.no_store,
        resume,
        earlier,
        nats: opts.nats.clone(),
        shell,
        otlp,
    })
}

/// How the actor system's part of a run ended.
enum Outcome {
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
    /// A resumed run's earlier sessions already used its budget; nothing
    /// ran.
    Budget(crate::runtime::limits::BudgetExceeded),
}

/// The store side of a run: the store, the run's lock and its writer.
struct Kept {
    store: Store,
    _lock: RunLock,
    writer: StoreWriter,
    /// The store file's device and inode when the run began: a store
    /// deleted or replaced during the run goes on taking commits into the
    /// unlinked file (SQLite in WAL mode does not notice), which no later
    /// `troupe runs` or `resume` would see.
    file: Option<(u64, u64)>,
}

/// A run the actor system is done with, not yet recorded as ended.
#[allow(missing_debug_implementations)]
pub struct Driven {
    outcome: Outcome,
    kept: Option<Kept>,
    run_id: String,
    path: PathBuf,
    openai: Option<OpenAiProvider>,
    _shell: crate::cli::sandbox::ShellSetup,
    /// A run kept without a store still holds its folder's lock, so that
    /// `runs tail --follow` (and `rm`) can tell it is live.
    _unstored_lock: Option<RunLock>,
}

/// How a run ended, recorded.
#[allow(missing_debug_implementations)]
pub enum Concluded {
    /// It ran: its report (the store's warnings added), the provider's
    /// figures, the last `seq` its events used.
    Report {
        report: Box<RunReport>,
        stats: Option<ProviderStats>,
        last_seq: u64,
    },
    /// It could not start, or lost its report (`Session/RunAborted`).
    Aborted(String),
    /// Refused before anything ran.
    Refused(Refusal),
}

impl Prepared {
    /// Runs without the provider's capability check (a billed request):
    /// for a run started only to be recorded cancelled.
    pub fn skip_check(&mut self) {
        if let Some((_, skip)) = &mut self.openai {
            *skip = true;
        }
    }

    /// Stops the run's MCP server processes until its first call needs
    /// them (each starts again then): a run queued for a place of
    /// `troupe serve --max-runs` holds no idle servers while it waits.
    pub fn park_servers(&self) {
        if let Some(pool) = &self.settings.mcp {
            pool.park();
        }
    }

    /// What a control server reaches of this run; a resumed run's knows
    /// the `seq` its log ended with before this session (after the repair).
    pub fn control(&self) -> crate::control::RunControl {
        crate::control::RunControl::new(
            &self.run_id,
            &self.pipeline.id,
            &self.audit_path,
            self.desk.clone(),
            self.questions.clone(),
        )
        .resumed_after(self.resume.as_ref().map_or(0, |r| r.last_seq))
        .with_store(Arc::clone(&self.store_probe))
    }

    /// Runs the session on the current actor system with the audit log
    /// and `sinks` (more of them, given the bus); `started` is handed the
    /// session once it runs (to cancel it).
    pub async fn drive(
        self,
        sinks: impl FnOnce(&EventBus<Event>, &RunSettings) -> Vec<Sink>,
        started: impl FnOnce(Addr<Session>),
    ) -> Driven {
        let Prepared {
            run_id,
            pipeline,
            run_dir,
            audit_path,
            mut spec,
            mut settings,
            openai,
            check_retries,
            check_backoff,
            limits,
            store,
            keeping,
            resume,
            earlier,
            nats,
            shell,
            otlp,
            store_probe,
            ..
        } = self;
        let path = pipeline.dir.clone();
        let mut driven = Driven {
            outcome: Outcome::Aborted(String::new()),
            kept: None,
            run_id,
            path,
            openai: openai.as_ref().map(|(p, _)| p.clone()),
            _shell: shell,
            _unstored_lock: None,
        };
        if let Some((provider, false)) = &openai {
            match provider.check(check_retries, &check_backoff).await {
                Ok(report) => note_check(provider, &report),
                Err(e) => {
                    driven.outcome = Outcome::Check(e);
                    return driven;
                }
            }
        }
        // The budget prices the model the run actually asks, which the
        // check may have just picked.
        let model = match &openai {
            Some((provider, _)) => provider.model().unwrap_or_default().to_owned(),
            None => "scripted".to_owned(),
        };
        match limits.budget(&pipeline, &model) {
            Ok(budget) => settings.budget = budget,
            Err(e) => {
                driven.outcome = Outcome::Invalid(e);
                return driven;
            }
        }
        // A budget bounds the whole run: a resumed one's meter starts at
        // what its earlier sessions' stored executions used (those
        // cancelled or in flight when it stopped included, as far as the
        // store has them), a chat turn's at what the turns before it
        // used. Nothing is stored or started yet, so a run already over
        // it stays resumable.
        if let Some(budget) = &settings.budget
            && let Err(over) = budget.carry_over(earlier)
        {
            driven.outcome = Outcome::Budget(over);
            return driven;
        }
        let resuming = resume.is_some();
        // The store, the run's lock, the writer: before anything runs.
        if keeping {
            match keep(store, &spec, &pipeline, &run_dir, resume) {
                Ok(kept) => driven.kept = Some(kept),
                Err(e) => {
                    driven.outcome = Outcome::Store(e);
                    return driven;
                }
            }
        } else {
            match RunLock::acquire(&run_dir, spec.run_id.as_str()) {
                Ok(lock) => driven._unstored_lock = Some(lock),
                Err(e) => {
                    driven.outcome = Outcome::Store(e);
                    return driven;
                }
            }
        }
        settings.ledger = driven
            .kept
            .as_ref()
            .map(|k| Arc::new(k.writer.ledger()) as Arc<dyn crate::runtime::ledger::Ledger>);
        if let Some(kept) = &driven.kept {
            let _ = store_probe.set(kept.writer.ledger());
        }
        let mut on_server = None; // across machines: siblings go to the workers' queue
        if nats.nats.is_some() {
            match remote_siblings(&nats, &spec, &pipeline, &settings).await {
                Ok(remote) => {
                    crate::distributed::mark_run(&audit_path, nats.nats.as_deref());
                    on_server = Some(remote.nats.clone());
                    spec.executor = Some(Arc::new(remote));
                }
                Err(e) => {
                    driven.outcome = Outcome::Nats(e);
                    return driven;
                }
            }
        }
        spec.settings = Arc::new(settings);
        let formatters = formatters_here(spec.settings.threads);
        let audit = if resuming {
            continue_audit_log(&spec.bus, &audit_path, formatters)
        } else {
            start_audit_log(&spec.bus, &audit_path, formatters)
        };
        let mut all = match audit {
            Ok(s) => vec![s],
            Err(e) => {
                driven.outcome = Outcome::Aborted(format!(
                    "cannot write the audit log {}: {e}",
                    audit_path.display()
                ));
                return driven;
            }
        };
        if let Some(config) = otlp {
            match crate::telemetry::start_otlp(&spec.bus, spec.run_id.as_str(), config) {
                Ok(sink) => all.push(sink),
                Err(e) => say!("warning: no OTLP export: {e}"),
            }
        }
        all.extend(sinks(&spec.bus, &spec.settings));
        let bus = spec.bus.clone();
        let run_id = spec.run_id.to_string();
        let (session, done) = start_run(spec, all);
        started(session);
        driven.outcome = match done.await {
            Ok(mut report) => {
                // A run that ended ok is never resumed: what it left on the
                // NATS server (every sibling's report, with its events) is
                // of no more use.
                if let Some(nats) = on_server
                    && report.status == RunStatus::Ok
                    && let Err(e) = nats.forget_run(&run_id).await
                {
                    report.warnings.push(format!(
                        "the NATS server keeps what the run left there until it expires \
                         in seven days ({}: {e})",
                        e.code()
                    ));
                }
                Outcome::Report(Box::new(report), bus.last_seq())
            }
            Err(_) => Outcome::Aborted("the run ended without a report".to_owned()),
        };
        driven
    }
}

impl Driven {
    /// The model an OpenAI-compatible provider asked (the one its
    /// capability check picked, when none was given), once it is known.
    pub fn model(&self) -> Option<String> {
        self.openai
            .as_ref()
            .and_then(|p| p.model().map(str::to_owned))
    }

    /// Records how the run ended in the store (the writer drained first).
    pub fn conclude(self) -> Concluded {
        let Driven {
            outcome,
            kept,
            run_id,
            path,
            openai,
            _shell,
            _unstored_lock,
        } = self;
        let (mut report, last_seq) = match outcome {
            Outcome::Report(r, seq) => (r, seq),
            Outcome::Aborted(e) => {
                failed_in_store(kept, &run_id, &format!("Session/RunAborted: {e}"));
                return Concluded::Aborted(e);
            }
            Outcome::Check(e) => {
                return Concluded::Refused(Refusal::typed(&e, e.message.clone(), &e.hint));
            }
            Outcome::Invalid(message) => {
                return Concluded::Refused(Refusal::invalid(&path, message));
            }
            Outcome::Store(e) => return Concluded::Refused(super::store_refusal(&e)),
            Outcome::Budget(over) => {
                return Concluded::Refused(Refusal::typed(
                    &over,
                    over.to_string(),
                    OVER_BUDGET_HINT,
                ));
            }
            Outcome::Nats(e) => {
                failed_in_store(kept, &run_id, &format!("{}: {e}", e.code()));
                return Concluded::Refused(super::nats_refusal(&e));
            }
        };
        let stats = openai.as_ref().map(OpenAiProvider::stats);
        if let Some(kept) = kept {
            let summary = stored_summary(&mut report, stats.as_ref());
            let (label, reason) = match &report.status {
                RunStatus::Ok => ("ok", None),
                RunStatus::Failed { reason } => ("failed", Some(reason.as_str())),
                RunStatus::Cancelled => ("cancelled", Some(crate::runtime::cancel::TURN_CANCELLED)),
            };
            if let Some((code, warning)) = end_in_store(kept, &run_id, label, reason, &summary) {
                // The store could not record the run's last results or how
                // it ended: whatever its work did, the run did not end ok
                // (its row still reads running, so it shows interrupted).
                if report.status == RunStatus::Ok {
                    report.status = RunStatus::Failed {
                        reason: format!(
                            "{code}: the run store could not record how the run ended (see the warning)"
                        ),
                    };
                }
                report.warnings.push(warning);
            }
        }
        Concluded::Report {
            report,
            stats,
            last_seq,
        }
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
                // Absolute too: `resume` and a server load it from
                // wherever they run.
                pipeline_dir: std::path::absolute(&pipeline.dir)
                    .unwrap_or_else(|_| pipeline.dir.clone())
                    .display()
                    .to_string(),
                digest,
                ctx: serde_json::Value::Object((*spec.fields).clone()),
                cap: spec.cap as u64,
                // Absolute, so that `runs`, `rm` and `resume` find it
                // (and its lock) from any folder.
                run_dir: std::path::absolute(run_dir)
                    .unwrap_or_else(|_| run_dir.to_owned())
                    .display()
                    .to_string(),
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
    let writer = match StoreWriter::start(store.path()) {
        Ok(writer) => writer,
        Err(e) => {
            // Recorded (or resumed) as running, it never ran: said so,
            // rather than left to read as a run killed mid-way.
            let reason = format!(
                "{}: the store's writer could not start: {e}",
                crate::error::HasCode::code(&e)
            );
            let _ = store.end_run(
                spec.run_id.as_str(),
                "failed",
                Some(&reason),
                &serde_json::Value::Null,
            );
            return Err(e);
        }
    };
    let file = file_identity(store.path());
    Ok(Kept {
        store,
        _lock: lock,
        writer,
        file,
    })
}

/// A file's device and inode, when it can be looked at.
fn file_identity(path: &Path) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

/// Records a run that stopped before its report as failed, when it is
/// kept.
fn failed_in_store(kept: Option<Kept>, run_id: &str, reason: &str) {
    if let Some(kept) = kept {
        end_in_store(
            kept,
            run_id,
            "failed",
            Some(reason),
            &serde_json::Value::Null,
        );
    }
}

/// Waits for the writer, then records how the session ended; a warning
/// when the store could not take it.
/// Drains the writer and records how the run ended; when either fails,
/// the first failure's code and what went wrong.
fn end_in_store(
    kept: Kept,
    run_id: &str,
    status: &str,
    reason: Option<&str>,
    summary: &serde_json::Value,
) -> Option<(String, String)> {
    let Kept {
        store,
        _lock,
        writer,
        file,
    } = kept;
    let mut failures = Vec::new();
    if file.is_some() && file_identity(store.path()) != file {
        failures.push((
            "Store/WriteFailed".to_owned(),
            format!(
                "{} was deleted or replaced during the run: what the run stored went into the old file, which nothing will read",
                store.path().display()
            ),
        ));
    }
    if let Err(e) = writer.finish() {
        failures.push((e.code().to_string(), e.to_string()));
    }
    // Results that were not stored: the row must not read ok, or a
    // resume would call the run finished and never run them again.
    let lost = failures
        .first()
        .map(|(code, _)| format!("{code}: the run's last results could not be stored"));
    let (status, reason) = match &lost {
        Some(lost) => ("failed", Some(lost.as_str())),
        None => (status, reason),
    };
    if let Err(e) = store.end_run(run_id, status, reason, summary) {
        failures.push((e.code().to_string(), e.to_string()));
    }
    let code = failures.first()?.0.clone();
    let said: Vec<String> = failures
        .iter()
        .map(|(code, message)| format!("{code}: {message}"))
        .collect();
    Some((code, format!("the run store: {}", said.join("; "))))
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
    nats.run_topology().await?;
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
        session: uuid::Uuid::now_v7().simple().to_string().into(),
        restored: Arc::clone(&spec.restore.results),
    })
}

/// Cancels the session (the control API's and the signals' path).
pub fn cancel(session: &Addr<Session>) {
    session.do_send(ToSession::Cancel);
}
