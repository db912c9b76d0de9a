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
    /// Woken when a cancel is asked for (a queued run stops waiting).
    cancel_wake: tokio::sync::Notify,
    /// Cancelled while queued: it never started.
    withdrawn: AtomicBool,
    /// Waiting for a place under `--max-runs`.
    queued: AtomicBool,
    /// Its session is over (a server may resume it).
    ended: AtomicBool,
    /// For a resumed run, the `seq` its log had before this session: an
    /// earlier session's `WorkflowExit` is not this one's end.
    base_seq: u64,
    /// The run's store writer, once it runs (a run kept in the store).
    store: Arc<OnceLock<crate::store::StoreLedger>>,
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
            cancel_wake: tokio::sync::Notify::new(),
            withdrawn: AtomicBool::new(false),
            queued: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            base_seq: 0,
            store: Arc::default(),
            refusal: OnceLock::new(),
            log: Mutex::new((Follower::new(audit_path), LogView::default())),
        }
    }

    /// A resumed run whose log ended at `seq` before this session.
    pub fn resumed_after(mut self, seq: u64) -> RunControl {
        self.base_seq = seq;
        self
    }

    /// Where the run's store writer will be, set when it starts.
    pub fn with_store(mut self, store: Arc<OnceLock<crate::store::StoreLedger>>) -> RunControl {
        self.store = store;
        self
    }

    /// Records waiting for the run's store writer (0 once the run ended,
    /// or for a run not kept in the store).
    pub fn store_queued(&self) -> usize {
        if self.has_ended() {
            return 0;
        }
        self.store
            .get()
            .map_or(0, crate::store::StoreLedger::queued)
    }

    /// See [`RunControl::resumed_after`]; 0 for a new run.
    pub fn base_seq(&self) -> u64 {
        self.base_seq
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
        self.cancel_wake.notify_waiters();
        if let Some(cancel) = self.canceller.get() {
            cancel();
        }
    }

    /// Resolves once a cancel is asked for.
    pub async fn cancel_requested(&self) {
        loop {
            let woken = self.cancel_wake.notified();
            if self.cancel_asked() {
                return;
            }
            woken.await;
        }
    }

    /// Whether it was cancelled while queued and never started.
    pub fn withdrawn(&self) -> bool {
        self.withdrawn.load(Ordering::SeqCst)
    }

    /// Cancelled while queued: the run ends without ever starting (no
    /// provider check, no store row, no log); its status is `cancelled`.
    pub fn withdraw(&self) {
        self.withdrawn.store(true, Ordering::SeqCst);
        self.end();
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
        tokio::task::spawn_blocking(move || this.view_now())
            .await
            .unwrap_or_default()
    }

    /// [`RunControl::view`], read on this thread (it blocks on the file).
    fn view_now(&self) -> LogView {
        let mut log = self.log.lock().unwrap_or_else(PoisonError::into_inner);
        let (follower, view) = &mut *log;
        view.read_on(follower);
        view.clone()
    }

    /// `queued`, `starting`, `running`, or how its last session ended.
    pub fn status(&self, view: &LogView) -> String {
        if self.queued.load(Ordering::SeqCst) {
            return "queued".to_owned();
        }
        // A resumed run's log ends with its last session's exit until
        // this session writes.
        if !self.has_written(view) {
            let before = if self.refusal.get().is_some() {
                "refused"
            } else if self.withdrawn.load(Ordering::SeqCst) {
                "cancelled"
            } else {
                "starting"
            };
            return before.to_owned();
        }
        match &view.status {
            Some(status) => status.clone(),
            // Its session is over and wrote no `WorkflowExit` (its
            // recording failed): not running, whatever the log says.
            None if self.has_ended() => "failed".to_owned(),
            None => "running".to_owned(),
        }
    }

    /// Why a run whose session ended without a `WorkflowExit` is failed.
    const LOST: &'static str = "Session/RunLost: the run's session ended without its WorkflowExit (its recording failed; see the server's log)";

    /// Whether this session has written to the log `view` read.
    fn has_written(&self, view: &LogView) -> bool {
        view.last_seq > self.base_seq
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
            "reason": view
                .reason
                .clone()
                .filter(|_| self.has_written(&view))
                .or_else(|| self.refusal().map(str::to_owned))
                .or_else(|| {
                    (self.has_ended() && self.has_written(&view) && view.status.is_none())
                        .then(|| Self::LOST.to_owned())
                })
                .or_else(|| {
                    self.withdrawn()
                        .then(|| "cancelled while it waited for a place, before it started".to_owned())
                }),
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

/// Ended runs a server keeps reachable through the API.
pub const KEEP_ENDED: usize = 1000;

/// The runs a server hosts.
pub struct Hosted {
    runs: RwLock<BTreeMap<String, Arc<RunControl>>>,
    /// Set on a server: runs can be submitted and resumed.
    pub submitter: Option<Arc<dyn Submitter>>,
    /// Stops taking submissions (the server is going down).
    closed: AtomicBool,
    /// Submissions past their check and not yet queued.
    admitting: std::sync::atomic::AtomicUsize,
    /// A server's dashboard: its sessions' gate and the TCP address it
    /// is served on (set once the listener is bound).
    dashboard: OnceLock<(Arc<super::auth::Auth>, std::net::SocketAddr)>,
    /// What the runs let go had counted (`/metrics`' counters must never
    /// go down), and those not yet added to it.
    pub(super) retired: Arc<Mutex<Retired>>,
}

/// What runs counted toward `/metrics`' `_total` series: requests and
/// tokens by model, cost, tool calls, audit events.
#[derive(Debug, Clone, Default)]
pub struct Counted {
    pub(super) models: BTreeMap<String, super::logview::Requests>,
    pub(super) cost: BTreeMap<String, f64>,
    pub(super) tools: BTreeMap<(String, &'static str), u64>,
    pub(super) events: u64,
}

impl Counted {
    /// Adds what `view`'s run counted.
    pub(super) fn count(&mut self, view: &LogView) {
        // By the model asked when each request was made, at the price in
        // force then: a resume that changes either leaves what came before
        // counted as it was.
        for (model, spent) in &view.by_model {
            self.models
                .entry(model.clone())
                .or_default()
                .add(&spent.requests);
            if let Some(cost) = spent.cost {
                *self.cost.entry(model.clone()).or_default() += cost;
            }
        }
        for (key, n) in &view.tools {
            *self.tools.entry(key.clone()).or_default() += n;
        }
        self.events += view.last_seq;
    }
}

/// The runs a server has let go (past its `KEEP_ENDED`): what they
/// counted stays in the `_total` series, which Prometheus reads as a
/// reset if they go down.
#[derive(Debug, Default)]
pub struct Retired {
    pub(super) counted: Counted,
    /// Let go, being counted (a scrape counts these itself meanwhile).
    pub(super) leaving: Vec<Arc<RunControl>>,
}

/// A submission being admitted: while it lives the server does not drain
/// its queue for the last time (see [`Hosted::admit`]).
#[derive(Debug)]
pub struct Admission<'h>(&'h Hosted);

impl Drop for Admission<'_> {
    fn drop(&mut self) {
        self.0.admitting.fetch_sub(1, Ordering::SeqCst);
    }
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
            admitting: std::sync::atomic::AtomicUsize::new(0),
            dashboard: OnceLock::new(),
            retired: Arc::default(),
        }
    }

    /// Where the dashboard is served, with its gate (the first TCP
    /// listener's; later calls are ignored).
    pub fn set_dashboard(&self, auth: Arc<super::auth::Auth>, addr: std::net::SocketAddr) {
        let _ = self.dashboard.set((auth, addr));
    }

    /// A new one-time login link to the dashboard (a URL), voiding the
    /// last one; `None` when this server serves no dashboard.
    pub fn fresh_login(&self) -> Option<std::io::Result<String>> {
        let (auth, addr) = self.dashboard.get()?;
        Some(
            auth.fresh_login()
                .map(|path| format!("http://{addr}{path}")),
        )
    }

    /// Hosts `run`. Ended runs beyond the newest [`KEEP_ENDED`] are let go
    /// (their folders and rows stay: `troupe runs`, `runs tail`), so a
    /// long-lived server's listing and scrapes cost what its recent runs
    /// cost, not every run it ever hosted.
    pub fn add(&self, run: Arc<RunControl>) {
        let mut runs = self.runs.write().unwrap_or_else(PoisonError::into_inner);
        runs.insert(run.run_id.clone(), run);
        let ended: Vec<String> = runs
            .iter()
            .filter(|(_, r)| r.has_ended())
            .map(|(id, _)| id.clone())
            .collect();
        // Ids are UUIDv7: in the order the runs were started.
        let gone: Vec<Arc<RunControl>> = ended
            .iter()
            .take(ended.len().saturating_sub(KEEP_ENDED))
            .filter_map(|id| runs.remove(id))
            .collect();
        drop(runs);
        if gone.is_empty() {
            return;
        }
        // Counted now, off the caller's thread where there is a runtime
        // (the rest of each log is read); a scrape meanwhile counts the
        // ones still `leaving` itself.
        let retired = Arc::clone(&self.retired);
        retired
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .leaving
            .extend(gone.iter().cloned());
        let count = move || {
            for run in gone {
                let view = run.view_now();
                let mut r = retired.lock().unwrap_or_else(PoisonError::into_inner);
                r.counted.count(&view);
                r.leaving.retain(|l| !Arc::ptr_eq(l, &run));
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => drop(rt.spawn_blocking(count)),
            Err(_) => count(),
        }
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

    /// Admits a submission unless the server is closing: the server, once
    /// closed, waits for every admission to end ([`Hosted::admitting`])
    /// before it takes the last jobs off its queue, so an accepted run is
    /// never dropped. (Counted before `closed` is read, and `close` sets
    /// `closed` before the count is read: one of the two sees the other.)
    pub fn admit(&self) -> Option<Admission<'_>> {
        self.admitting.fetch_add(1, Ordering::SeqCst);
        let admission = Admission(self);
        (!self.is_closed()).then_some(admission)
    }

    /// Submissions admitted and not yet queued.
    pub fn admitting(&self) -> usize {
        self.admitting.load(Ordering::SeqCst)
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(seq: u64, event: &str, extra: &str) -> String {
        format!(
            "{{\"seq\":{seq},\"ts\":\"2026-11-26T07:00:00Z\",\"event\":\"{event}\",\"workflowRunId\":\"r\"{extra}}}\n"
        )
    }

    /// A resumed run whose log still ends with its last session's exit
    /// is starting, not cancelled, until this session writes; its stream
    /// does not end at the old exit.
    #[actix::test]
    async fn a_resumed_run_is_not_its_last_sessions_exit() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(crate::auditlog::PLAIN_FILE);
        let old = format!(
            "{}{}",
            line(1, "WorkflowStarted", ""),
            line(2, "WorkflowExit", ",\"status\":\"cancelled\"")
        );
        std::fs::write(&path, &old).expect("write");
        let fresh = Arc::new(RunControl::new("r", "p", &path, None, None));
        assert_eq!(fresh.status(&fresh.view().await), "cancelled");
        let resumed = Arc::new(RunControl::new("r", "p", &path, None, None).resumed_after(2));
        assert_eq!(resumed.status(&resumed.view().await), "starting");
        let more = format!("{old}{}", line(3, "WorkflowResumed", ""));
        std::fs::write(&path, more).expect("write");
        assert_eq!(resumed.status(&resumed.view().await), "running");
    }

    /// A run whose session ended without writing its `WorkflowExit` is
    /// failed, with a reason, not running for good.
    #[actix::test]
    async fn a_run_whose_session_ended_without_its_exit_is_failed() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join(crate::auditlog::PLAIN_FILE);
        std::fs::write(&path, line(1, "WorkflowStarted", "")).expect("write");
        let run = Arc::new(RunControl::new("r", "p", &path, None, None));
        assert_eq!(run.status(&run.view().await), "running");
        run.end();
        let described = run.describe().await;
        assert_eq!(described["status"], "failed");
        assert!(
            described["reason"]
                .as_str()
                .is_some_and(|r| r.starts_with("Session/RunLost")),
            "{described}"
        );
    }

    #[test]
    fn a_closing_server_admits_no_submission_and_counts_those_it_did() {
        let hosted = Hosted::new(None);
        let first = hosted.admit().expect("open: admitted");
        assert_eq!(hosted.admitting(), 1);
        hosted.close();
        assert!(hosted.admit().is_none(), "closed: refused");
        assert_eq!(hosted.admitting(), 1, "the refused one is not counted");
        drop(first);
        assert_eq!(hosted.admitting(), 0);
    }

    #[test]
    fn only_the_newest_ended_runs_stay_hosted() {
        let hosted = Hosted::new(None);
        let path = std::path::Path::new("audit.jsonl.zst");
        for i in 0..KEEP_ENDED + 5 {
            let run = Arc::new(RunControl::new(
                &format!("run-{i:06}"),
                "p",
                path,
                None,
                None,
            ));
            run.end();
            hosted.add(run);
        }
        let live = Arc::new(RunControl::new("run-000000-live", "p", path, None, None));
        hosted.add(Arc::clone(&live));
        let ids = hosted.ids();
        assert_eq!(ids.len(), KEEP_ENDED + 1);
        assert!(
            ids.contains(&"run-000000-live".to_owned()),
            "a live run stays"
        );
        assert!(
            !ids.contains(&"run-000004".to_owned()),
            "the oldest ended go"
        );
        assert!(ids.contains(&"run-000005".to_owned()));
    }
}
