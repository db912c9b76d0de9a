//! Runs a pipeline in-process on the real runtime, on paused tokio time,
//! with a provider that records every request and every dropped request.

use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use troupe::definition::load_pipeline;
use troupe::provider::script::Script;
use troupe::provider::scripted::ScriptedProvider;
use troupe::provider::selector::Selector;
use troupe::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use troupe::runtime::events::{Event, EventName};
use troupe::runtime::interaction::InteractorSpec;
use troupe::runtime::launch::{resolve_fields, start_run};
use troupe::runtime::session::ToSession;
use troupe::runtime::spec::RunSpec;
use troupe::runtime::summary::RunReport;
use troupe_actors::{Delivery, EventBus};

/// Wraps the scripted provider: records requests, counts requests whose
/// future was dropped before it answered (strict cancellation).
#[derive(Debug)]
pub struct Recording {
    inner: ScriptedProvider,
    /// Panic inside the request future of this stage (a crashing provider).
    panic_in: Option<String>,
    pub requests: Mutex<Vec<ModelRequest>>,
    pub dropped: Arc<AtomicUsize>,
    /// The run's bus, to place each drop among the events.
    bus: OnceLock<EventBus<Event>>,
    /// For every dropped request: the seq of the last event published
    /// before the drop.
    pub dropped_after: Arc<Mutex<Vec<u64>>>,
    /// For every request, in the order they came: its execution and the
    /// seq of the last event published when the provider was called.
    pub called_after: Mutex<Vec<(String, u64)>>,
}

struct DropGuard {
    dropped: Arc<AtomicUsize>,
    answered: bool,
    bus: Option<EventBus<Event>>,
    dropped_after: Arc<Mutex<Vec<u64>>>,
}
impl Drop for DropGuard {
    fn drop(&mut self) {
        if !self.answered {
            self.dropped.fetch_add(1, Ordering::SeqCst);
            if let Some(bus) = &self.bus {
                self.dropped_after.lock().unwrap().push(bus.last_seq());
            }
        }
    }
}

impl Provider for Recording {
    fn name(&self) -> &'static str {
        "recording"
    }
    fn complete(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<ModelResponse, ProviderError>> {
        self.requests.lock().unwrap().push(request.clone());
        if let Some(bus) = self.bus.get() {
            self.called_after
                .lock()
                .unwrap()
                .push((request.stage_execution_id.to_string(), bus.last_seq()));
        }
        let panic_here = self.panic_in.as_deref() == Some(&*request.stage_id);
        let inner = self.inner.complete(request);
        let guard = DropGuard {
            dropped: Arc::clone(&self.dropped),
            answered: false,
            bus: self.bus.get().cloned(),
            dropped_after: Arc::clone(&self.dropped_after),
        };
        async move {
            // Bind the whole guard: capturing only one field would drop it here.
            let mut guard = guard;
            assert!(!panic_here, "provider exploded");
            let out = inner.await;
            guard.answered = true;
            out
        }
        .boxed()
    }
}

/// What a run left behind.
#[derive(Debug)]
pub struct Outcome {
    pub report: RunReport,
    /// Every audit event and phase marker (`StagePreFired`/`StagePostFired`)
    /// as its JSON line, in seq order; tokens and progress are left out.
    pub events: Vec<Value>,
    pub provider: Arc<Recording>,
    /// Paused-clock time the run took.
    pub elapsed: Duration,
}

impl Outcome {
    pub fn named(&self, name: &str) -> Vec<&Value> {
        self.events.iter().filter(|e| e["event"] == name).collect()
    }

    pub fn count(&self, name: &str) -> usize {
        self.named(name).len()
    }

    /// Events of one stage id.
    pub fn of_stage(&self, stage: &str) -> Vec<&Value> {
        self.events
            .iter()
            .filter(|e| e["stageId"] == stage)
            .collect()
    }

    /// `event[/phase]` names in order, for one stage id.
    pub fn trace(&self, stage: &str) -> Vec<String> {
        self.of_stage(stage)
            .into_iter()
            .map(|e| match e["phase"].as_str() {
                Some(p) => format!(
                    "{}:{p}",
                    if e["event"] == "StagePreFired" {
                        "pre"
                    } else {
                        "post"
                    }
                ),
                None => e["event"].as_str().unwrap_or("").to_owned(),
            })
            .collect()
    }

    pub fn requests(&self) -> Vec<ModelRequest> {
        self.provider.requests.lock().unwrap().clone()
    }

    /// The tool results the model saw in its last request, in order.
    pub fn tool_results(&self) -> Vec<String> {
        let requests = self.requests();
        let Some(last) = requests.last() else {
            return Vec::new();
        };
        last.messages
            .iter()
            .filter_map(|m| match m {
                troupe::provider::Message::Tool { content, .. } => Some(content.clone()),
                _ => None,
            })
            .collect()
    }
}

/// How to run.
#[derive(Debug, Default, Clone)]
pub struct Opts {
    pub fields: Vec<(&'static str, Value)>,
    pub cap: Option<usize>,
    pub fail: Vec<&'static str>,
    /// Cancel the run (as the first Ctrl-C does) after this much paused time.
    pub cancel_after: Option<Duration>,
    /// Make the provider panic for this stage.
    pub panic_in: Option<&'static str>,
    /// Who answers approvals (empty: headless).
    pub interactors: Vec<InteractorSpec>,
    pub approval_timeout: Option<Duration>,
    /// The project root tools work in (default: the current directory).
    pub root: Option<std::path::PathBuf>,
    /// Run on the real clock: needed when real processes run (hooks, Bash),
    /// because a paused clock jumps ahead while they work and their
    /// timeouts would fire at once.
    pub real_time: bool,
    /// `--stage-timeout`.
    pub stage_timeout: Option<Duration>,
    /// `--max-run-time`.
    pub max_run_time: Option<Duration>,
    /// `--max-tokens` / `--max-cost` with a price.
    pub budget: Option<Arc<troupe::runtime::limits::Budget>>,
    /// Every scripted turn takes this long (paused time).
    pub latency: Option<Duration>,
    /// Who answers human steps.
    pub asker: Option<Arc<dyn troupe::runtime::ask::Asker>>,
    /// The run's bus, made by the test (to hand to a party it puts in the
    /// run); a fresh one by default.
    pub bus: Option<EventBus<Event>>,
    /// Subscribe to audit events only, so that no one observes (as a
    /// headless run or a worker): no phase markers in `events`.
    pub audit_only: bool,
}

/// Loads the pipeline at `dir` (with its script.yaml, if any) and runs it.
pub fn run(dir: &Path, opts: Opts) -> Outcome {
    let pipeline =
        Arc::new(load_pipeline(dir).unwrap_or_else(|e| panic!("fixture invalid: {:#?}", e.0)));
    let script_path = dir.join("script.yaml");
    let script = if script_path.is_file() {
        Script::load(&script_path, &pipeline)
            .unwrap_or_else(|e| panic!("script invalid: {:#?}", e.0))
    } else {
        Script::default()
    };
    let fail = opts
        .fail
        .iter()
        .map(|s| Selector::parse(s).unwrap())
        .collect();
    let provider = Arc::new(Recording {
        inner: ScriptedProvider::new(script)
            .with_failures(fail)
            .with_latency(opts.latency),
        panic_in: opts.panic_in.map(str::to_owned),
        requests: Mutex::new(Vec::new()),
        dropped: Arc::new(AtomicUsize::new(0)),
        bus: OnceLock::new(),
        dropped_after: Arc::default(),
        called_after: Mutex::default(),
    });
    let pairs: Vec<(String, Value)> = opts
        .fields
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    let fields = resolve_fields(&pipeline, &pairs, None)
        .unwrap_or_else(|errors| panic!("bad ctx fields for the fixture: {errors:#?}"));
    let mut spec = RunSpec::new(Arc::clone(&pipeline), fields, provider.clone(), opts.cap);
    if let Some(bus) = &opts.bus {
        spec.bus = bus.clone();
    }
    // The session closes the bus when the run ends, so this handle does
    // not keep it open.
    let _ = provider.bus.set(spec.bus.clone());
    spec.interactors = opts.interactors.clone();
    spec.approval_timeout = opts.approval_timeout;
    let mut settings = troupe::runtime::stage::RunSettings::default();
    if let Some(root) = &opts.root {
        settings.root = root.clone();
    }
    settings.stage_timeout = opts.stage_timeout;
    settings.budget = opts.budget.clone();
    settings.asker = opts.asker.clone();
    spec.settings = Arc::new(settings);
    spec.max_run_time = opts.max_run_time;
    // Every event, so the phase markers (observer-class) are seen too; the
    // queue is big enough that nothing is dropped.
    let audit = if opts.audit_only {
        spec.bus.subscribe_audit("test", 1 << 22)
    } else {
        spec.bus.subscribe("test", 1 << 22)
    };
    let system = actix::System::new();
    let (report, elapsed) = system.block_on(async move {
        if !opts.real_time {
            tokio::time::pause();
            // Timers fire on whole milliseconds; start on a tick so waits
            // of whole milliseconds measure exactly.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let start = tokio::time::Instant::now();
        let (session, done) = start_run(spec, Vec::new());
        if let Some(after) = opts.cancel_after {
            actix::spawn(async move {
                tokio::time::sleep(after).await;
                session.do_send(ToSession::Cancel);
            });
        }
        let report = done.await.expect("run reports");
        (report, start.elapsed())
    });
    let events = audit
        .iter()
        .filter_map(|d| match d {
            Delivery::Event(env)
                if !matches!(env.event.name, EventName::Token | EventName::Progress) =>
            {
                Some(env.event.to_json(env.seq))
            }
            Delivery::Event(_) => None,
            Delivery::Lagged { dropped, .. } => panic!("the test subscriber lagged by {dropped}"),
        })
        .collect();
    Outcome {
        report,
        events,
        provider,
        elapsed,
    }
}
