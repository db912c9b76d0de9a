//! Runs a pipeline in-process on the real runtime for a benchmark: the
//! scripted provider (per-turn latency, injected failures), the audit log
//! on, and — when a sibling is made to fail — how long cancelling the rest
//! took, read back from the audit log.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;

use crate::definition::{Pipeline, load_pipeline};
use crate::error::Diagnostics;
use crate::provider::script::{SCRIPT_FILE, Script};
use crate::provider::scripted::ScriptedProvider;
use crate::provider::selector::Selector;
use crate::provider::{ModelRequest, ModelResponse, Provider, ProviderError};
use crate::runtime::audit::{formatters_here, start_audit_log};
use crate::runtime::events::parse_rfc3339;
use crate::runtime::launch::{resolve_fields, start_run};
use crate::runtime::spec::RunSpec;
use crate::runtime::stage::RunSettings;
use crate::runtime::summary::{RunReport, RunStatus};
use crate::store::{RunRow, Store, StoreWriter, unix_ms};

/// The ctx field a benchmark sets to the fan-out width.
pub const WIDTH_FIELD: &str = "width";

/// One runtime run of a benchmark cell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunCell {
    pub width: usize,
    pub cap: usize,
    /// Overrides every scripted turn's latency.
    pub latency: Duration,
    /// Executions made to fail (`--fail-sibling`).
    pub fail: Vec<Selector>,
    /// Every model request of a sibling not selected by `fail` waits this
    /// long before it is answered: keeps every sibling in flight when the
    /// selected one fails (the cancellation bench).
    pub hold: Option<Duration>,
    /// Threads the stage executions spread over (`--threads`).
    pub threads: usize,
    /// Keep a run store (a fresh one in the runs folder), as `troupe run`
    /// does by default.
    pub store: bool,
}

/// What one runtime run measured.
#[derive(Debug, Clone)]
pub struct RunMeasure {
    /// From starting the session to the report, after the audit log is
    /// flushed.
    pub wall: Duration,
    pub report: RunReport,
    /// From the failing sibling's `StageExited` (verdict fail) to the last
    /// `StageCancelled`, by the events' own timestamps; `None` when nothing
    /// failed or nothing had to be cancelled.
    pub cancel_latency: Option<Duration>,
    /// `StageCancelled` events in the audit log (counted only when a
    /// sibling was made to fail).
    pub cancelled: usize,
}

/// Why a benchmark run could not happen.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("the pipeline is invalid")]
    Invalid(Diagnostics),
    #[error("{0}")]
    Input(String),
    #[error("cannot write the audit log: {0}")]
    Io(#[from] std::io::Error),
    #[error("the run ended without a report")]
    NoReport,
}

/// A loaded pipeline and its script, ready to run many times.
#[derive(Debug, Clone)]
pub struct Workload {
    pub pipeline: Arc<Pipeline>,
    script: Script,
}

impl Workload {
    /// Loads the pipeline folder and its `script.yaml` (if any). The
    /// pipeline must declare a `width` ctx field.
    pub fn load(dir: &Path) -> Result<Workload, RunnerError> {
        let pipeline = Arc::new(load_pipeline(dir).map_err(RunnerError::Invalid)?);
        if !pipeline.ctx.iter().any(|f| f.name == WIDTH_FIELD) {
            return Err(RunnerError::Input(format!(
                "pipeline `{}` declares no ctx field `{WIDTH_FIELD}` for --width",
                pipeline.id
            )));
        }
        let script_path = pipeline.dir.join(SCRIPT_FILE);
        let script = if script_path.is_file() {
            Script::load(&script_path, &pipeline).map_err(RunnerError::Invalid)?
        } else {
            Script::default()
        };
        Ok(Workload { pipeline, script })
    }

    /// Checks that every `--fail-sibling` names a stage of the pipeline.
    pub fn check_selectors(&self, fail: &[Selector]) -> Result<(), RunnerError> {
        match fail
            .iter()
            .find(|s| self.pipeline.stage(&s.stage).is_none())
        {
            Some(s) => Err(RunnerError::Input(format!(
                "--fail-sibling names unknown stage `{}`",
                s.stage
            ))),
            None => Ok(()),
        }
    }

    /// Runs once in a fresh actix system on this thread, writing the audit
    /// log under `runs_dir`.
    pub fn run(&self, cell: &RunCell, runs_dir: &Path) -> Result<RunMeasure, RunnerError> {
        let pairs = [(WIDTH_FIELD.to_owned(), Value::from(cell.width))];
        let fields = resolve_fields(&self.pipeline, &pairs, None)
            .map_err(|d| RunnerError::Invalid(Diagnostics(d)))?;
        let provider = ScriptedProvider::new(self.script.clone())
            .with_latency(Some(cell.latency))
            .with_failures(cell.fail.clone());
        let provider: Arc<dyn Provider> = match cell.hold {
            Some(hold) => Arc::new(Held {
                inner: provider,
                hold,
                fail: cell.fail.clone(),
            }),
            None => Arc::new(provider),
        };
        let mut spec = RunSpec::new(Arc::clone(&self.pipeline), fields, provider, Some(cell.cap));
        let run_dir = runs_dir.join(spec.run_id.as_str());
        let audit_path = run_dir.join(crate::auditlog::FILE);
        let sink_path = audit_path.clone();
        let writer = if cell.store {
            Some(open_store(&spec, &self.pipeline, runs_dir, &run_dir)?)
        } else {
            None
        };
        spec.settings = Arc::new(RunSettings {
            threads: cell.threads.max(1),
            ledger: writer
                .as_ref()
                .map(|w| Arc::new(w.ledger()) as Arc<dyn crate::runtime::ledger::Ledger>),
            ..RunSettings::default()
        });
        let system = actix::System::new();
        let measured = system.block_on(async move {
            let sink = start_audit_log(&spec.bus, &sink_path, formatters_here(cell.threads))?;
            let start = Instant::now();
            let (_session, done) = start_run(spec, vec![sink]);
            let report = done.await.map_err(|_| RunnerError::NoReport)?;
            // Everything the store was sent is written, as `troupe run`
            // waits for it too.
            if let Some(writer) = writer {
                writer
                    .finish()
                    .map_err(|e| RunnerError::Input(e.to_string()))?;
            }
            Ok::<_, RunnerError>((start.elapsed(), report))
        });
        let (wall, report) = measured?;
        let probed = if cell.fail.is_empty() {
            Probed::default()
        } else {
            Probed::read(&audit_path)?
        };
        Ok(RunMeasure {
            wall,
            report,
            cancel_latency: probed.latency(),
            cancelled: probed.cancelled,
        })
    }
}

/// A fresh run store in `runs_dir` with this run recorded, and its writer.
fn open_store(
    spec: &RunSpec,
    pipeline: &Pipeline,
    runs_dir: &Path,
    run_dir: &Path,
) -> Result<StoreWriter, RunnerError> {
    let err = |e: crate::store::StoreError| RunnerError::Input(e.to_string());
    let path = runs_dir.join("troupe.db");
    let store = Store::open(&path).map_err(err)?;
    store
        .begin_run(&RunRow {
            id: spec.run_id.to_string(),
            pipeline_id: pipeline.id.clone(),
            pipeline_dir: pipeline.dir.display().to_string(),
            digest: String::new(),
            ctx: Value::Object((*spec.fields).clone()),
            cap: spec.cap as u64,
            run_dir: std::path::absolute(run_dir)
                .unwrap_or_else(|_| run_dir.to_owned())
                .display()
                .to_string(),
            status: "running".to_owned(),
            reason: None,
            started_at: unix_ms(SystemTime::now()),
            ended_at: None,
            summary: None,
            sessions: 1,
        })
        .map_err(err)?;
    StoreWriter::start(&path).map_err(err)
}

impl RunMeasure {
    pub fn ok(&self) -> bool {
        matches!(self.report.status, RunStatus::Ok)
    }
}

/// What the audit log of a run with a failing sibling shows.
#[derive(Debug, Default, Clone, Copy)]
struct Probed {
    failed_at: Option<SystemTime>,
    last_cancelled: Option<SystemTime>,
    cancelled: usize,
}

impl Probed {
    /// Reads the timestamps the cancel latency needs back from the audit
    /// log, after the run: a live subscriber would be one more thread and
    /// one more delivery per event inside the measurement.
    fn read(audit_path: &Path) -> Result<Probed, RunnerError> {
        let file = crate::auditlog::DecodedReader::open(audit_path)
            .map_err(|e| RunnerError::Input(e.to_string()))?;
        let mut seen = Probed::default();
        for line in BufReader::new(file).lines() {
            let line = line?;
            let exited = line.contains(r#""event":"StageExited""#);
            if !exited && !line.contains(r#""event":"StageCancelled""#) {
                continue;
            }
            let event: Value = serde_json::from_str(&line)
                .map_err(|e| RunnerError::Input(format!("{}: {e}", audit_path.display())))?;
            let ts = event["ts"]
                .as_str()
                .and_then(parse_rfc3339)
                .ok_or_else(|| {
                    RunnerError::Input(format!(
                        "{}: a line without a valid ts",
                        audit_path.display()
                    ))
                })?;
            if !exited {
                seen.cancelled += 1;
                seen.last_cancelled = seen.last_cancelled.max(Some(ts));
            } else if seen.failed_at.is_none() && event["verdict"] == "fail" {
                seen.failed_at = Some(ts);
            }
        }
        Ok(seen)
    }

    fn latency(&self) -> Option<Duration> {
        let (from, to) = (self.failed_at?, self.last_cancelled?);
        Some(to.duration_since(from).unwrap_or_default())
    }
}

/// The scripted provider, with siblings that are not made to fail held in
/// flight for `hold` before every answer.
#[derive(Debug)]
struct Held {
    inner: ScriptedProvider,
    hold: Duration,
    fail: Vec<Selector>,
}

impl Provider for Held {
    fn name(&self) -> &'static str {
        "scripted-held"
    }

    fn complete(
        &self,
        request: ModelRequest,
    ) -> futures::future::BoxFuture<'static, Result<ModelResponse, ProviderError>> {
        use futures::FutureExt;
        let failing = self
            .fail
            .iter()
            .any(|s| s.matches(&request.stage_id, request.index));
        let hold = (request.index.is_some() && !failing).then_some(self.hold);
        let answer = self.inner.complete(request);
        async move {
            if let Some(hold) = hold {
                tokio::time::sleep(hold).await;
            }
            answer.await
        }
        .boxed()
    }
}
