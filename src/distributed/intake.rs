//! A worker's intake: what it decides about a task it was delivered,
//! before anything runs — refuse it (another copy of the pipeline, none
//! at all, a group context it cannot read), skip it (its group was
//! cancelled) or hand it to the worker's host to start — and the reports
//! that settle a task.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::lease::Lease;
use super::outbox::Outbox;
use super::stored_context::{self, Parts, Stored};
use super::wire::{GROUPS_BUCKET, GroupContext, Report, Task, cancelled_key, group_key};
use crate::definition::Pipeline;
use crate::provider::Provider;
use crate::runtime::stage::RunSettings;

/// A pipeline a worker serves, with the digest of its files.
#[derive(Debug, Clone)]
pub struct Served {
    pub pipeline: Arc<Pipeline>,
    pub digest: String,
    /// The model provider its siblings use.
    pub provider: Arc<dyn Provider>,
}

/// How a worker runs.
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Shown in reports (`worker`) and to the NATS server.
    pub name: String,
    /// By pipeline id.
    pub pipelines: HashMap<String, Served>,
    pub settings: Arc<RunSettings>,
    /// Most siblings this worker runs at once.
    pub max_siblings: usize,
    /// Print a JSON line on stdout for every task settled (`--task-log`).
    pub task_log: bool,
    /// How long the NATS server may stay unreachable before the worker
    /// gives up and exits (`--nats-lost-after`).
    pub lost_after: Duration,
}

/// How long a worker remembers a cancelled group.
pub const FORGET_AFTER: Duration = Duration::from_secs(600);

/// How long a worker keeps a group's context, and its executor for a run,
/// once no task of it is in flight and none started or ended: let go
/// when the next new group is asked for, the next task starts, or the
/// worker next looks (every `KEPT_IDLE`, busy or not). A context holds
/// the run's fields, a fan-out's items among them: a worker that served
/// run after run kept each for ten minutes (a 20 000-wide `fanout` run's,
/// 3 to 5 MB, BENCHMARKS.md "Every core, eighteenth round"). A context
/// let go is read from the bucket again if a task of its group comes
/// later.
pub const KEPT_IDLE: Duration = Duration::from_secs(30);

/// Returns once the connection to the NATS server has been down for
/// `after` without a break (looked at four times a second).
pub(super) async fn lost_server(client: &async_nats::Client, after: Duration) {
    let mut since: Option<tokio::time::Instant> = None;
    loop {
        if client.connection_state() == async_nats::connection::State::Connected {
            since = None;
        } else if since
            .get_or_insert_with(tokio::time::Instant::now)
            .elapsed()
            >= after
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The `--task-log` line of a settled task: what was reported and
/// whether the coordinator has it (`reported: false` — NATS would not
/// take the report — leaves the task to another delivery).
pub fn log_task(enabled: bool, worker: &str, run_id: &str, report: &Report, reported: bool) {
    if !enabled {
        return;
    }
    let Some((id, _, _)) = report.execution() else {
        return;
    };
    let mut line = serde_json::json!({
        "worker": worker,
        "run": run_id,
        "stageExecutionId": id,
        "report": report.kind(),
        "reported": reported,
    });
    match report {
        Report::Exited {
            result, delivered, ..
        } => {
            line["verdict"] = serde_json::to_value(result.verdict()).unwrap_or_default();
            line["delivered"] = Value::from(*delivered);
        }
        Report::Refused { code, .. } => line["code"] = Value::from(code.as_str()),
        _ => {}
    }
    // A line for whoever watches the worker: one its stdout cannot take
    // is lost, not the worker.
    use std::io::Write as _;
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// A group's context, read once however many tasks ask for it at once:
/// what they get, the context or why it could not be read.
type Context = Arc<tokio::sync::OnceCell<Result<Arc<GroupContext>, String>>>;

/// The buckets a worker reads before it starts a task, and the group
/// contexts it has read.
#[derive(Debug)]
pub struct Buckets {
    pub cancelled: async_nats::jetstream::kv::Store,
    pub groups: async_nats::jetstream::kv::Store,
    /// By group key, with when a task last asked for it or let go of it
    /// (forgotten after [`KEPT_IDLE`] when no task holds it).
    contexts: Mutex<HashMap<String, (Context, Instant)>>,
    /// Group contexts read from the bucket so far (a read's retries count
    /// once).
    loads: AtomicU64,
}

impl Buckets {
    pub fn new(
        cancelled: async_nats::jetstream::kv::Store,
        groups: async_nats::jetstream::kv::Store,
    ) -> Buckets {
        Buckets {
            cancelled,
            groups,
            contexts: Mutex::default(),
            loads: AtomicU64::new(0),
        }
    }

    /// How many times a group's context was read from the bucket (a read
    /// and its retries count once): what the tasks that ask at once share.
    pub fn loads(&self) -> u64 {
        self.loads.load(Ordering::Relaxed)
    }

    /// The context of the task's group: from memory, or read from the
    /// bucket (which the coordinator fills before it queues the group's
    /// first task; a replica may lag a moment behind, so a missing key is
    /// read again for a while before the task is refused). The fetches of
    /// a group's first tasks are accepted side by side: they wait for one
    /// read (a context in parts is several round trips and a
    /// decompression) and share its outcome, so one that joins a read
    /// under way waits only for what is left of its retries; after a
    /// failed read, the next to ask reads again.
    pub async fn context(&self, task: &Task) -> Result<Arc<GroupContext>, String> {
        self.context_at(task, Instant::now()).await
    }

    /// [`Buckets::context`] asked at `now`: a new group first lets go of
    /// the contexts no task holds that no task asked for or let go of in
    /// [`KEPT_IDLE`] (one being read is kept).
    pub async fn context_at(&self, task: &Task, now: Instant) -> Result<Arc<GroupContext>, String> {
        let key = group_key(&task.run_id, task.turn);
        let cell = {
            let mut known = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            if !known.contains_key(&key) {
                forget_idle(&mut known, now);
            }
            let (cell, used) = known
                .entry(key.clone())
                .or_insert_with(|| (Context::default(), now));
            *used = now;
            Arc::clone(cell)
        };
        let read = cell.get_or_init(|| self.load(&key)).await.clone();
        if read.is_err() {
            let mut known = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
            if known.get(&key).is_some_and(|(c, _)| Arc::ptr_eq(c, &cell)) {
                known.remove(&key);
            }
        }
        read
    }

    /// Lets go of the contexts idle at `now` (see [`Buckets::context_at`]):
    /// what an idle worker does every [`KEPT_IDLE`], so that it does not
    /// keep its last runs' until its next task.
    pub fn forget_idle(&self, now: Instant) {
        forget_idle(
            &mut self.contexts.lock().unwrap_or_else(|e| e.into_inner()),
            now,
        );
    }

    /// A task of the group let go of its context: the context is idle from
    /// now (if no other task holds it).
    pub fn touch(&self, task: &Task) {
        self.touch_at(task, Instant::now());
    }

    /// [`Buckets::touch`] at `now`.
    pub fn touch_at(&self, task: &Task, now: Instant) {
        let key = group_key(&task.run_id, task.turn);
        let mut known = self.contexts.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, used)) = known.get_mut(&key) {
            *used = now;
        }
    }

    /// Reads a group's context, again for a while when it is not there.
    async fn load(&self, key: &str) -> Result<Arc<GroupContext>, String> {
        self.loads.fetch_add(1, Ordering::Relaxed);
        let mut wait = Duration::from_millis(50);
        let mut last = String::from("no such key");
        for attempt in 1..=12 {
            match self.read(key).await? {
                Ok(context) => return Ok(Arc::new(context)),
                Err(why) => last = why,
            }
            if attempt < 12 {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(1));
            }
        }
        Err(format!(
            "the context of group {key} cannot be read from {GROUPS_BUCKET}: {last}"
        ))
    }
}

impl Buckets {
    /// One read of a group's context: `Ok(Err(why))` when it may yet be
    /// there (a missing key or part: a replica that lags), `Err` when
    /// what is stored is no context at all.
    async fn read(&self, key: &str) -> Result<Result<GroupContext, String>, String> {
        let bytes = match self.groups.get(key).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return Ok(Err("no such key".to_owned())),
            Err(e) => return Ok(Err(e.to_string())),
        };
        Ok(match stored_context::decode(&bytes)? {
            Stored::Whole(context) => Ok(context),
            Stored::Parts(parts) => self.parts(key, parts).await,
        })
    }

    /// A context stored in parts: each part (stored before the group's
    /// key, though a lagging replica may not have them yet), then the
    /// whole.
    async fn parts(&self, key: &str, parts: Parts) -> Result<GroupContext, String> {
        let mut read = Vec::with_capacity(parts.zstd_parts);
        for i in 0..parts.zstd_parts {
            let part = parts.key(key, i);
            match self.groups.get(part.as_str()).await {
                Ok(Some(bytes)) => read.push(bytes),
                Ok(None) => return Err(format!("part {i} of the group's context is missing")),
                Err(e) => {
                    return Err(format!(
                        "part {i} of the group's context cannot be read: {e}"
                    ));
                }
            }
        }
        parts.assemble(&read)
    }
}

/// Lets go of the contexts no task holds that no task asked for or let
/// go of in [`KEPT_IDLE`] (one being read is kept).
fn forget_idle(known: &mut HashMap<String, (Context, Instant)>, now: Instant) {
    known.retain(|_, (cell, used)| match cell.get() {
        None => true,
        Some(Ok(held)) if Arc::strong_count(held) > 1 => true,
        Some(_) => now.saturating_duration_since(*used) < KEPT_IDLE,
    });
}

/// A delivered task and what answering it needs.
#[derive(Debug)]
pub struct Offer {
    pub task: Task,
    /// The group's context, once read.
    pub context: Option<Arc<GroupContext>>,
    /// The message it came in (shared with the other tasks of it).
    pub lease: Arc<Lease>,
    /// Its slot among the worker's `max_siblings`.
    pub permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// When its group's cancelled mark was asked for and found absent: a
    /// cancel this worker heard before then is an earlier session's (a
    /// resume clears the marks), not this group's.
    pub checked: Option<std::time::Instant>,
}

/// Decides, for tasks taken together (a group's of one fetch, or those
/// held or delivered again), what to do with each: refuse it,
/// skip it (its group was cancelled) or start it. The tasks' `Accepted`
/// reports go out together (one batch, see [`Outbox`]) and each group's
/// cancelled mark is read once, after they are stored: a mark set before
/// that read is seen, and a coordinator's barrier published after the
/// mark comes after every one of them.
pub async fn accept_all(
    config: &WorkerConfig,
    buckets: &Buckets,
    outbox: &Outbox,
    offers: Vec<Offer>,
) -> Vec<Intake> {
    let mut served = Vec::with_capacity(offers.len());
    let mut refusals = Vec::new();
    for offer in offers {
        match mismatch(config, &offer.task) {
            Some(message) => refusals.push((offer, "Distributed/PipelineMismatch", message)),
            None => served.push(offer),
        }
    }
    let accepted = served.iter().map(|offer| {
        let t = &offer.task;
        let report = Report::Accepted {
            stage_execution_id: t.stage_execution_id.clone(),
            turn: t.turn,
            unit: t.unit,
            worker: config.name.clone(),
        };
        async move { outbox.send(t, &report).await }
    });
    let told = futures::future::join_all(accepted).await;
    let mut intakes = Vec::new();
    let mut accepted = Vec::with_capacity(served.len());
    for (offer, told) in served.into_iter().zip(told) {
        if told {
            accepted.push(offer);
        } else {
            // The coordinator cannot hear about it: leave it to another try.
            offer
                .lease
                .settle(&offer.task.stage_execution_id, false)
                .await;
            intakes.push(Intake::HandedBack);
        }
    }
    // Per group, after its `Accepted`s, and for all groups at once: one
    // read of its cancelled mark, then its context. A mark that cannot be
    // read leaves the group's tasks to another delivery: started blind,
    // one could start after the coordinator's barrier.
    let mut groups: HashMap<(&str, u64), &Task> = HashMap::new();
    for offer in &accepted {
        groups
            .entry((&offer.task.run_id, offer.task.turn))
            .or_insert(&offer.task);
    }
    let per_group = groups.into_values().map(|task| async move {
        let asked = std::time::Instant::now();
        let mark = buckets
            .cancelled
            .get(cancelled_key(&task.run_id, task.turn))
            .await;
        let found = match mark {
            Ok(Some(_)) => Found::Cancelled,
            Ok(None) => Found::Clear(buckets.context(task).await, asked),
            Err(_) => Found::Unknown,
        };
        ((task.run_id.clone(), task.turn), found)
    });
    // By group: a fetch's tasks nearly always share one (the worker's loop
    // hands each group its own call).
    let found: HashMap<(String, u64), Found> = futures::future::join_all(per_group)
        .await
        .into_iter()
        .collect();
    let mut skipped = Vec::new();
    for mut offer in accepted {
        let key = (offer.task.run_id.clone(), offer.task.turn);
        match found.get(&key) {
            Some(Found::Clear(Ok(context), asked)) => {
                offer.context = Some(Arc::clone(context));
                offer.checked = Some(*asked);
                intakes.push(Intake::Start(Box::new(offer)));
            }
            Some(Found::Clear(Err(message), _)) => {
                let message = message.clone();
                refusals.push((offer, "Distributed/GroupContextMissing", message));
            }
            Some(Found::Cancelled) => skipped.push(offer),
            Some(Found::Unknown) | None => {
                offer
                    .lease
                    .settle(&offer.task.stage_execution_id, false)
                    .await;
                intakes.push(Intake::HandedBack);
            }
        }
    }
    let settled = refusals
        .iter()
        .map(|(offer, code, message)| {
            let report = Report::Refused {
                stage_execution_id: offer.task.stage_execution_id.clone(),
                turn: offer.task.turn,
                unit: offer.task.unit,
                worker: config.name.clone(),
                code: (*code).to_owned(),
                message: message.clone(),
            };
            (offer, report, Counted::Refused)
        })
        .chain(skipped.iter().map(|offer| {
            let report = Report::NotStarted {
                stage_execution_id: offer.task.stage_execution_id.clone(),
                turn: offer.task.turn,
                unit: offer.task.unit,
                worker: config.name.clone(),
            };
            (offer, report, Counted::NotStarted)
        }))
        .map(|(offer, report, counted)| async move {
            settle(config, outbox, offer, &report).await;
            Intake::Settled(counted)
        });
    intakes.extend(futures::future::join_all(settled).await);
    intakes
}

/// What a group's reads found.
enum Found {
    /// Not cancelled when asked at that instant: its context, or why it
    /// cannot be read.
    Clear(Result<Arc<GroupContext>, String>, std::time::Instant),
    Cancelled,
    /// The mark could not be read.
    Unknown,
}

/// Why this worker cannot run the task: it serves no such pipeline, or
/// another copy of it.
fn mismatch(config: &WorkerConfig, t: &Task) -> Option<String> {
    match config.pipelines.get(&t.pipeline_id) {
        None => Some(format!(
            "this worker does not serve pipeline `{}` (it serves {})",
            t.pipeline_id,
            config
                .pipelines
                .keys()
                .cloned()
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Some(s) if s.digest != t.digest => Some(format!(
            "this worker's copy of pipeline `{}` differs from the run's ({} here, {} in the run)",
            t.pipeline_id, s.digest, t.digest
        )),
        Some(_) => None,
    }
}

/// Sends the report that settles a task without running it, then
/// settles the task in its message (acknowledged once every task of the
/// message is reported; a report not stored hands the message back).
async fn settle(config: &WorkerConfig, outbox: &Outbox, offer: &Offer, report: &Report) {
    let run_id = &offer.task.run_id;
    let reported = outbox.send(&offer.task, report).await;
    offer
        .lease
        .settle(&offer.task.stage_execution_id, reported)
        .await;
    log_task(config.task_log, &config.name, run_id, report, reported);
}

/// What became of a delivered task.
#[derive(Debug)]
pub enum Intake {
    /// To run: the worker's host starts it.
    Start(Box<Offer>),
    /// Answered without running (refused, or its group was cancelled).
    Settled(Counted),
    /// To be given back to the queue (its message is, once its other
    /// tasks are reported): the coordinator could not be told, or the
    /// group's cancelled mark could not be read.
    HandedBack,
}

#[derive(Debug, Clone, Copy)]
pub enum Counted {
    Refused,
    NotStarted,
}
