//! The runs a control server hosts: one (`troupe run`'s own socket) or
//! many (`troupe serve`), each reached through its [`RunControl`]; and,
//! on a server, the [`Submitter`] that starts and resumes runs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};

use futures::future::BoxFuture;
use serde_json::{Value, json};

use super::logview::LogView;
use crate::auditlog::Follower;
use crate::runtime::ask::QuestionDesk;
use crate::runtime::interaction::RemoteDesk;

/// What the server reaches of one run.
pub struct RunControl {
    pub run_id: String,
    pub pipeline: String,
    pub audit_path: PathBuf,
    /// The run's API interactor, when it has one (`--remote`, or hosted).
    pub desk: Option<Arc<RemoteDesk>>,
    /// Human steps' questions open to API clients.
    pub questions: Option<Arc<QuestionDesk>>,
    /// Cancels the run strictly once it runs (the first Ctrl-C's path).
    canceller: OnceLock<Box<dyn Fn() + Send + Sync>>,
    /// A cancel asked for before the run started: done when it starts.
    cancel_asked: AtomicBool,
    /// Waiting for a place under `--max-runs`.
    queued: AtomicBool,
    /// Its session is over (a server may resume it).
    ended: AtomicBool,
    /// Why it never ran, when it was refused or aborted after it was
    /// accepted (a provider check, a held run lock): `Code: message`.
    refusal: OnceLock<String>,
    /// What the log said so far, read on from where it stopped.
    log: Mutex<(Follower, LogView)>,
}

impl std::fmt::Debug for RunControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunControl")
            .field("run_id", &self.run_id)
            .finish()
    }
}

impl RunControl {
    pub fn new(
        run_id: &str,
        pipeline: &str,
        audit_path: &Path,
        desk: Option<Arc<RemoteDesk>>,
        questions: Option<Arc<QuestionDesk>>,
    ) -> RunControl {
        RunControl {
            run_id: run_id.to_owned(),
            pipeline: pipeline.to_owned(),
            audit_path: audit_path.to_owned(),
            desk,
            questions,
            canceller: OnceLock::new(),
            cancel_asked: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            refusal: OnceLock::new(),
            log: Mutex::new((Follower::new(audit_path), LogView::default())),
        }
    }

    /// The run started: `cancel` cancels it. A cancel asked for while it
    /// waited is done now.
    pub fn arm(&self, cancel: impl Fn() + Send + Sync + 'static) {
        let _ = self.canceller.set(Box::new(cancel));
        self.queued.store(false, Ordering::SeqCst);
        if self.cancel_asked.load(Ordering::SeqCst) {
            self.cancel();
        }
    }

    /// Cancels the run strictly (or, not yet started, as soon as it does).
    pub fn cancel(&self) {
        self.cancel_asked.store(true, Ordering::SeqCst);
        if let Some(cancel) = self.canceller.get() {
            cancel();
        }
    }

    /// Whether a cancel was asked for.
    pub fn cancel_asked(&self) -> bool {
        self.cancel_asked.load(Ordering::SeqCst)
    }

    /// The run's session is over.
    pub fn end(&self) {
        self.queued.store(false, Ordering::SeqCst);
        self.ended.store(true, Ordering::SeqCst);
    }

    pub fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// It was accepted, then refused before it ran: `why` is
    /// `Code: message`. Ends it.
    pub fn refuse(&self, why: String) {
        let _ = self.refusal.set(why);
        self.end();
    }

    /// Why it was refused after it was accepted.
    pub fn refusal(&self) -> Option<&str> {
        self.refusal.get().map(String::as_str)
    }

    /// The log read on from where the last look stopped, as far as it is
    /// written now.
    pub async fn view(self: &Arc<Self>) -> LogView {
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut log = this.log.lock().unwrap_or_else(PoisonError::into_inner);
            let (follower, view) = &mut *log;
            view.read_on(follower);
            view.clone()
        })
        .await
        .unwrap_or_default()
    }

    /// `queued`, `starting`, `running`, or how its last session ended.
    pub fn status(&self, view: &LogView) -> String {
        if self.queued.load(Ordering::SeqCst) {
            return "queued".to_owned();
        }
        if self.refusal.get().is_some() && view.last_seq == 0 {
            return "refused".to_owned();
        }
        view.status.clone().unwrap_or_else(|| {
            if view.last_seq == 0 {
                "starting".to_owned()
            } else {
                "running".to_owned()
            }
        })
    }

    /// Approvals and questions waiting for an API answer.
    pub async fn waiting(&self) -> (usize, usize) {
        let pending = match self.desk.as_ref().and_then(|d| d.get()) {
            Some(addr) => addr
                .send(crate::runtime::interaction::ListPending)
                .await
                .map(|p| p.len())
                .unwrap_or(0),
            None => 0,
        };
        let questions = self.questions.as_ref().map_or(0, |q| q.list().len());
        (pending, questions)
    }

    /// Marks the run as waiting for a place under `--max-runs`.
    pub fn set_queued(&self) {
        self.queued.store(true, Ordering::SeqCst);
    }

    /// The run as `GET /v1/runs/{id}` describes it: status, last `seq`,
    /// executions by state, pending answers. The log is read on from
    /// where the last call stopped, so polling a wide run costs what it
    /// wrote since.
    pub async fn describe(self: &Arc<Self>) -> Value {
        let view = self.view().await;
        let status = self.status(&view);
        let (pending, questions) = self.waiting().await;
        json!({
            "runId": self.run_id,
            "pipeline": self.pipeline,
            "status": status,
            "reason": view.reason.clone().or_else(|| self.refusal().map(str::to_owned)),
            "lastSeq": view.last_seq,
            "executions": view.totals(),
            "pending": pending,
            "questions": questions,
            "remoteAnswers": self.desk.is_some(),
            "auditPath": self.audit_path.display().to_string(),
        })
    }
}

/// A run to start or resume, as a client sent it.
#[derive(Debug, Clone)]
pub struct Submission {
    /// `troupe run`'s arguments (`<pipeline> [options]`), or for a resume
    /// `troupe resume`'s options.
    pub args: Vec<String>,
    /// The client's working folder: relative paths in `args` are its.
    pub cwd: Option<PathBuf>,
    /// Who submitted it (a name, never a secret).
    pub client: String,
}

/// A refusal: the HTTP status and the typed error body.
pub type Refused = (u16, Value);

/// Starts runs on a server (`troupe serve` implements it).
pub trait Submitter: Send + Sync {
    /// Starts a new run; its id.
    fn submit(&self, submission: Submission) -> BoxFuture<'static, Result<String, Refused>>;
    /// Continues run `run` (an id or its start) inside the server; its id.
    fn resume(
        &self,
        run: String,
        submission: Submission,
    ) -> BoxFuture<'static, Result<String, Refused>>;
}

/// The runs a server hosts.
pub struct Hosted {
    runs: RwLock<BTreeMap<String, Arc<RunControl>>>,
    /// Set on a server: runs can be submitted and resumed.
    pub submitter: Option<Arc<dyn Submitter>>,
    /// Stops taking submissions (the server is going down).
    closed: AtomicBool,
}

impl std::fmt::Debug for Hosted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hosted").field("runs", &self.ids()).finish()
    }
}

impl Hosted {
    /// One run, served from its own socket.
    pub fn one(run: Arc<RunControl>) -> Arc<Hosted> {
        let hosted = Arc::new(Hosted::new(None));
        hosted.add(run);
        hosted
    }

    /// A registry (empty at first); with a submitter, a server's.
    pub fn new(submitter: Option<Arc<dyn Submitter>>) -> Hosted {
        Hosted {
            runs: RwLock::new(BTreeMap::new()),
            submitter,
            closed: AtomicBool::new(false),
        }
    }

    pub fn add(&self, run: Arc<RunControl>) {
        self.runs
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(run.run_id.clone(), run);
    }

    /// The run with id `id`, or the one run whose id starts with it.
    pub fn get(&self, id: &str) -> Result<Arc<RunControl>, (u16, &'static str, String)> {
        let runs = self.runs.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(run) = runs.get(id) {
            return Ok(Arc::clone(run));
        }
        let found: Vec<&Arc<RunControl>> = runs
            .range(id.to_owned()..)
            .take_while(|(k, _)| k.starts_with(id))
            .map(|(_, v)| v)
            .collect();
        match found.as_slice() {
            [one] if !id.is_empty() => Ok(Arc::clone(one)),
            [] | [_] => Err((
                404,
                "Control/RunNotFound",
                format!("this server hosts no run {id}"),
            )),
            many => Err((
                400,
                "Control/AmbiguousRun",
                format!("{} runs start with {id}: give more of the id", many.len()),
            )),
        }
    }

    /// Every hosted run, oldest first (ids are time-ordered).
    pub fn all(&self) -> Vec<Arc<RunControl>> {
        self.runs
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    pub fn ids(&self) -> Vec<String> {
        self.all().iter().map(|r| r.run_id.clone()).collect()
    }

    /// Stops taking submissions.
    pub fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}
