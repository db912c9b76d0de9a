//! A worker (`troupe worker`): serves the pipelines it was given by taking
//! sibling tasks from the shared work queue and running each on the same
//! stage actors as a local run, with its own provider and tools.
//!
//! A message of the queue holds one task or several of one group (see
//! `TASKS_PER_MESSAGE`); the worker takes as many as it has free slots,
//! holds the rest a moment for a slot when the queue is busy and no other
//! worker waits for a task, and puts back on the queue what still has
//! none (`taking`). For each task
//! it takes, the worker: refuses it when it has another copy of the
//! pipeline (the digests differ) or none at all; reports `Accepted`;
//! reads the group's cancelled mark (a worker that comes late starts
//! nothing of a cancelled group); runs the sibling; and reports how it
//! ended with the execution's audit events, in order. The message is
//! renewed every third of the lease while any of its tasks is here, so a
//! long agent is not delivered to another worker, and acknowledged once
//! every one of them is reported (`lease`). A cancel broadcast cancels
//! the group's siblings in flight strictly. On the first Ctrl-C or
//! SIGTERM it takes no new task and lets those in flight finish; a
//! message it never finishes is delivered to another worker once its
//! lease runs out, which runs only the tasks of it not reported.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use actix::prelude::*;
use futures::StreamExt;
use serde_json::Map;
use tokio::sync::{Semaphore, watch};
use troupe_actors::EventBus;

use super::collected::{Collected, collect_events};
use super::intake::{Buckets, Counted, FORGET_AFTER, KEPT_IDLE, Offer, log_task};
pub use super::intake::{Served, WorkerConfig};
use super::lease::Lease;
use super::nats::{Nats, NatsError};
use super::outbox::Outbox;
use super::taker::{Count, Start, Taker};
use super::taking::{Delivered, Expected, Held, still_to_run};
use super::wire::{CANCEL_ALL, Cancel, GroupContext, Report, Task, decode_tasks};
use crate::definition::StageKind;
use crate::runtime::cancel::CancelScope;
use crate::runtime::context::{SharedContext, StageContext};
use crate::runtime::events::Event;
use crate::runtime::ids::RunId;
use crate::runtime::scheduler::{
    ExecKey, Executor, LocalExecutor, Slot, Spawn, StageOutcome, ToScheduler,
};
use crate::runtime::spec::RunSpec;

/// What a worker did, when it stops.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WorkerSummary {
    pub finished: u64,
    pub cancelled: u64,
    pub refused: u64,
    pub not_started: u64,
}

/// Runs the worker until `drain` says stop (then lets the siblings in
/// flight finish). Call inside an actix system.
pub async fn serve(
    nats: Nats,
    config: WorkerConfig,
    mut drain: watch::Receiver<bool>,
) -> Result<WorkerSummary, NatsError> {
    let (consumer, cancelled, groups) = nats.worker_topology().await?;
    let buckets = Arc::new(Buckets::new(cancelled, groups));
    let bus: EventBus<Event> = EventBus::new();
    let collected = Arc::new(Collected::default());
    let (seen_tx, seen) = watch::channel(0u64);
    let sub = bus.subscribe_audit("worker-reports", 1 << 16);
    {
        let collected = Arc::clone(&collected);
        let worker: Arc<str> = Arc::from(config.name.as_str());
        std::thread::Builder::new()
            .name("troupe-worker-events".into())
            .spawn(move || collect_events(&sub, &collected, &worker, &seen_tx))
            .map_err(|e| NatsError {
                code: "Worker",
                message: format!("cannot start the event collector: {e}"),
            })?;
    }
    let slots = Arc::new(Semaphore::new(config.max_siblings.max(1)));
    let arbiters: Vec<ArbiterHandle> = if config.settings.threads > 1 {
        (0..config.settings.threads)
            .map(|_| Arbiter::new().handle())
            .collect()
    } else {
        Vec::new()
    };
    let (idle_tx, mut idle) = watch::channel(0usize);
    let outbox = Outbox::start(nats.clone(), &config.name);
    let host = WorkerHost {
        outbox: outbox.clone(),
        buckets: Arc::clone(&buckets),
        config: config.clone(),
        bus: bus.clone(),
        collected,
        seen,
        in_flight: HashMap::new(),
        cancelled_groups: HashMap::new(),
        executors: HashMap::new(),
        arbiters: arbiters.clone(),
        in_flight_count: idle_tx,
        summary: Arc::default(),
    }
    .start();
    let summary = host.send(Summary).await.unwrap_or_default();

    // Cancels reach the siblings in flight.
    let cancels = nats
        .client
        .subscribe(CANCEL_ALL)
        .await
        .map_err(|e| NatsError {
            code: "Unreachable",
            message: format!("cannot subscribe to cancels: {e}"),
        })?;
    {
        let host = host.clone();
        actix::spawn(async move {
            let mut cancels = cancels;
            while let Some(msg) = cancels.next().await {
                if let Ok(cancel) = serde_json::from_slice::<Cancel>(&msg.payload) {
                    host.do_send(CancelGroup(cancel));
                }
            }
        });
    }

    // Take tasks while there is room and no drain.
    let mut accepting = tokio::task::JoinSet::new();
    let held = Arc::new(Held::default());
    let taker = Taker {
        nats: nats.clone(),
        consumer: consumer.clone(),
        config: config.clone(),
        buckets: Arc::clone(&buckets),
        outbox: outbox.clone(),
        starts: host.clone().recipient(),
        counts: host.clone().recipient(),
        slots: Arc::clone(&slots),
        held: Arc::clone(&held),
        drain: drain.clone(),
    };
    let mut expected = Expected::default();
    let serving = async {
        loop {
            if *drain.borrow() {
                break;
            }
            // Tasks held for a slot take the next ones first.
            tokio::select! {
                () = held.none() => {}
                _ = drain.changed() => continue,
            }
            let first = tokio::select! {
                permit = Arc::clone(&slots).acquire_owned() => match permit {
                    Ok(p) => p,
                    Err(_) => break,
                },
                _ = drain.changed() => continue,
            };
            let mut permits = vec![first];
            while permits.len() < config.max_siblings.max(1) {
                match Arc::clone(&slots).try_acquire_owned() {
                    Ok(p) => permits.push(p),
                    Err(_) => break,
                }
            }
            // As many messages as the free slots would take (`Expected`);
            // what a message brings past them is held or put back (`offers`).
            let wanted = expected.messages(permits.len());
            let batch = consumer
                .fetch()
                .max_messages(wanted)
                .expires(Duration::from_millis(500))
                .messages()
                .await;
            let mut batch = match batch {
                Ok(b) => b,
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    continue;
                }
            };
            // The fetch's messages first: the last one's count of what the
            // queue still holds says whether the cluster is busy.
            let mut fetched = Vec::new();
            while let Some(msg) = batch.next().await {
                let Ok(msg) = msg else { continue };
                let Some(reply) = msg.reply.clone() else {
                    continue;
                };
                let Ok(info) = msg
                    .info()
                    .map(|i| (i.delivered, i.stream_sequence, i.pending))
                else {
                    // Its delivery cannot be told (no JetStream reply subject):
                    // never deliver it again.
                    let _ = nats.client.publish(reply, "+TERM".into()).await;
                    continue;
                };
                match decode_tasks(&msg.payload) {
                    Ok(tasks) => fetched.push((tasks, reply, info)),
                    // Not tasks: never deliver it again.
                    Err(_) => drop(nats.client.publish(reply, "+TERM".into()).await),
                }
            }
            let busy = fetched
                .last()
                .is_some_and(|(_, _, (_, _, pending))| *pending > 0);
            let largest = fetched.iter().map(|(tasks, _, _)| tasks.len()).max();
            let mut offers_of_fetch = Vec::with_capacity(permits.len());
            for (tasks, reply, (delivered, sequence, _)) in fetched {
                let delivered = delivered.max(1) as u64;
                let message = Delivered {
                    tasks,
                    reply,
                    delivered,
                    sequence,
                    busy,
                };
                if delivered > 1 {
                    // Delivered again (a worker was lost): first what earlier
                    // deliveries put back on the queue or reported is left
                    // out, off this loop; the slots it may need go with it.
                    let n = message.tasks.len().min(permits.len());
                    let mut mine: Vec<_> = permits.drain(..n).collect();
                    let taker = taker.clone();
                    accepting.spawn_local(async move {
                        let groups = &taker.buckets.groups;
                        let tasks = still_to_run(groups, message.tasks, sequence, delivered).await;
                        if tasks.is_empty() {
                            let reply = message.reply;
                            let _ = taker.nats.client.publish(reply, "+ACK".into()).await;
                            return;
                        }
                        let message = Delivered { tasks, ..message };
                        let (offers, past) = taker.offers(message, &mut mine);
                        drop(mine);
                        taker.take(offers, past).await;
                    });
                    continue;
                }
                let (taken, past) = taker.offers(message, &mut permits);
                offers_of_fetch.extend(taken);
                if let Some(past) = past {
                    accepting.spawn_local(taker.clone().take(Vec::new(), Some(past)));
                }
            }
            expected.saw(largest.unwrap_or(0));
            // Slots the fetch did not fill are free again.
            drop(permits);
            // Accepting takes round trips to the server (the reports, the
            // cancelled marks): they are made for a group's tasks of the fetch
            // together, and off this loop, which goes on fetching. One call
            // per group: a group whose context is slow to read (its read is
            // retried for seconds) holds only its own tasks.
            let mut by_group: HashMap<(String, u64), Vec<Offer>> = HashMap::new();
            for offer in offers_of_fetch {
                let key = (offer.task.run_id.clone(), offer.task.turn);
                by_group.entry(key).or_default().push(offer);
            }
            for offers in by_group.into_values() {
                let taker = taker.clone();
                accepting.spawn_local(async move { taker.accept(offers).await });
            }
            while accepting.try_join_next().is_some() {}
        }
        // Tasks being accepted are started (or handed back) before the drain
        // counts what is in flight.
        while accepting.join_next().await.is_some() {}
        // Drain: the siblings in flight finish (or the lease hands them on).
        while *idle.borrow() > 0 {
            if idle.changed().await.is_err() {
                break;
            }
        }
    };
    // The client reconnects for as long as it takes, and the worker would
    // wait with it for ever, serving nothing (its slots held by siblings
    // whose reports cannot go out): past `lost_after` it gives up.
    let lost = tokio::select! {
        () = serving => false,
        () = super::intake::lost_server(&nats.client, config.lost_after) => true,
    };
    for arbiter in arbiters {
        arbiter.stop();
    }
    if lost {
        return Err(NatsError {
            code: "Unreachable",
            message: format!(
                "lost the NATS server for {} (--nats-lost-after); the siblings in flight here are handed on by their leases",
                crate::definition::duration::format_duration(config.lost_after)
            ),
        });
    }
    // The last reports' and tasks' acknowledgements out before the
    // connection's thread can stop.
    nats.flush().await;
    let summary = summary.lock().map(|s| *s).unwrap_or_default();
    Ok(summary)
}

/// Takes one from the count of tasks in flight when dropped. Reports end
/// in any order, so the count is kept by steps, not set from a length
/// taken earlier.
struct CountDown(watch::Sender<usize>);

impl Drop for CountDown {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

/// A group was cancelled.
#[derive(Debug, Message)]
#[rtype(result = "()")]
struct CancelGroup(Cancel);

/// The summary cell, shared with `serve`.
#[derive(Debug, Message)]
#[rtype(result = "Arc<Mutex<WorkerSummary>>")]
struct Summary;

/// A sibling running here.
#[derive(Debug)]
struct InFlight {
    task: Task,
    /// The message it came in: renewed while it runs, answered once its
    /// tasks are reported.
    lease: Arc<Lease>,
    /// Other messages that brought the same execution while it ran (one
    /// put back whose record was lost): its report answers for them too.
    also: Vec<Arc<Lease>>,
    scope: CancelScope,
    /// Released when the sibling's report is out.
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
    /// Its group's context: held while it runs, so that the worker keeps
    /// it for the group's next task however long this one takes
    /// ([`Buckets::context`]).
    _group: Arc<GroupContext>,
}

/// The worker's stand-in for a scheduler: its stage actors ask it to
/// start (always yes: the coordinator decided) and report to it; it turns
/// reports into NATS messages.
struct WorkerHost {
    /// Where its reports go (batched).
    outbox: Outbox,
    config: WorkerConfig,
    bus: EventBus<Event>,
    collected: Arc<Collected>,
    /// The last `seq` the collector has taken.
    seen: watch::Receiver<u64>,
    in_flight: HashMap<Arc<str>, InFlight>,
    /// The group contexts read (told when a task lets go of one).
    buckets: Arc<Buckets>,
    /// Groups whose cancel was broadcast lately, with when: a task of one
    /// that passed the bucket check just before the mark was set starts
    /// cancelled. Kept for [`FORGET_AFTER`]; later deliveries see the
    /// bucket's mark.
    cancelled_groups: HashMap<(String, u64), (Instant, String)>,
    /// One local executor per run (its run id and pipeline), with when a
    /// sibling of it last started or ended; dropped [`KEPT_IDLE`] after
    /// that with none in flight, so a long-lived worker does not keep the
    /// runs it served.
    executors: HashMap<String, (LocalExecutor, Instant)>,
    arbiters: Vec<ArbiterHandle>,
    /// Tasks started and not yet reported (what a drain waits for).
    in_flight_count: watch::Sender<usize>,
    summary: Arc<Mutex<WorkerSummary>>,
}

impl Actor for WorkerHost {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        ctx.set_mailbox_capacity(4096);
        // An idle worker lets go of its last runs too.
        ctx.run_interval(KEPT_IDLE, |host, _| {
            let now = Instant::now();
            host.buckets.forget_idle(now);
            host.forget_idle_executors(now);
        });
        ctx.run_interval(MARK_CHECK, |host, ctx| host.check_marks(ctx));
    }
}

/// How often a worker reads the cancelled marks of the groups it has
/// siblings of in flight: a cancel is broadcast once, and a worker that
/// was reconnecting then would otherwise run them to their end.
const MARK_CHECK: Duration = Duration::from_secs(5);

impl WorkerHost {
    /// Reads the cancelled mark of each group with a sibling in flight
    /// here and not yet cancelled; a mark found cancels them as the
    /// broadcast would have.
    fn check_marks(&mut self, ctx: &mut Context<Self>) {
        let mut groups: Vec<(String, u64)> = self
            .in_flight
            .values()
            .map(|f| (f.task.run_id.clone(), f.task.turn))
            .filter(|key| !self.cancelled_groups.contains_key(key))
            .collect();
        groups.sort_unstable();
        groups.dedup();
        if groups.is_empty() {
            return;
        }
        let buckets = Arc::clone(&self.buckets);
        let host = ctx.address();
        actix::spawn(async move {
            for (run_id, turn) in groups {
                let key = super::wire::cancelled_key(&run_id, turn);
                if let Ok(Some(reason)) = buckets.cancelled.get(key).await {
                    host.do_send(CancelGroup(Cancel {
                        run_id,
                        turn,
                        reason: String::from_utf8_lossy(&reason).into_owned(),
                    }));
                }
            }
        });
    }
}

/// Whether a cancel heard `at` counts for a task whose group's mark was
/// found absent at `checked`: only if it came after (the coordinator sets
/// the mark before it broadcasts the cancel, so one heard before a clear
/// read was an earlier session's). Without a read, it counts.
fn heard_since(at: Instant, checked: Option<Instant>) -> bool {
    checked.is_none_or(|checked| at >= checked)
}

/// What a report holds besides its result and its events, at most: the
/// kind, the ids, the worker's name, the counts, a framed batch's
/// lengths.
const REPORT_BESIDE_RESULT: usize = 4096;

impl WorkerHost {
    /// Whether the task's group had its cancel broadcast here lately,
    /// after `checked` (when its mark was found absent): one heard before
    /// was an earlier session's, whose marks a resume cleared.
    fn group_cancelled(&self, task: &Task, checked: Option<Instant>) -> Option<String> {
        self.cancelled_groups
            .get(&(task.run_id.clone(), task.turn))
            .filter(|(at, _)| heard_since(*at, checked))
            .map(|(_, reason)| reason.clone())
    }

    fn count(&self, f: impl FnOnce(&mut WorkerSummary)) {
        if let Ok(mut s) = self.summary.lock() {
            f(&mut s);
        }
    }

    /// Lets go of the executors of runs with no sibling in flight that
    /// none started or ended in [`KEPT_IDLE`].
    fn forget_idle_executors(&mut self, now: Instant) {
        let in_flight = &self.in_flight;
        self.executors.retain(|run, (_, used)| {
            now.saturating_duration_since(*used) < KEPT_IDLE
                || in_flight.values().any(|f| &f.task.run_id == run)
        });
    }

    fn executor(&mut self, task: &Task, ctx: &mut Context<Self>) -> Option<&mut LocalExecutor> {
        let now = Instant::now();
        self.forget_idle_executors(now);
        if !self.executors.contains_key(&task.run_id) {
            let served = self.config.pipelines.get(&task.pipeline_id)?;
            // The run's fields reach each sibling with its context; the
            // executor needs only the kit (a copy of the fields, a deep
            // one, was made here and dropped).
            let mut spec = RunSpec::new(
                Arc::clone(&served.pipeline),
                Map::new(),
                Arc::clone(&served.provider),
                None,
            );
            spec.run_id = RunId::existing(&task.run_id);
            spec.bus = self.bus.clone();
            spec.settings = Arc::clone(&self.config.settings);
            let local = LocalExecutor::new(
                spec.kit(),
                None,
                ctx.address().recipient(),
                self.arbiters.clone(),
            )
            .without_relays()
            .keeping_results_whole();
            self.executors.insert(task.run_id.clone(), (local, now));
        }
        self.executors.get_mut(&task.run_id).map(|(local, used)| {
            *used = now;
            local
        })
    }

    fn start(&mut self, offer: Offer, ctx: &mut Context<Self>) {
        let Offer {
            task,
            context: group,
            lease,
            permit,
            checked,
        } = offer;
        // Not startable (intake checks each before it offers one): the
        // message goes back to the queue once its other tasks are done.
        let unstartable = |lease: Arc<Lease>| {
            actix::spawn(async move { lease.settle("", false).await });
        };
        let Some(group) = group else {
            return unstartable(lease);
        };
        let Some(served) = self.config.pipelines.get(&task.pipeline_id).cloned() else {
            return unstartable(lease);
        };
        let Some(stage) = served.pipeline.stage(&task.stage_id).cloned() else {
            return unstartable(lease);
        };
        let name: Arc<str> = match &stage.kind {
            StageKind::Llm(def) => def.name.as_str().into(),
            _ => stage.id.as_str().into(),
        };
        if let Some(flight) = self.in_flight.get_mut(task.stage_execution_id.as_str()) {
            // Already running here, from another message (one put back
            // whose record was lost): that run's report answers for both,
            // as it comes (renewed until then).
            flight.also.push(lease);
            return;
        }
        let id: Arc<str> = Arc::from(task.stage_execution_id.as_str());
        let stage_id: Arc<str> = Arc::from(task.stage_id.as_str());
        let context = Arc::new(StageContext {
            shared: Arc::new(SharedContext {
                fields: Arc::clone(&group.fields),
                upstream: Arc::default(),
                results: Arc::clone(&group.slot),
                workflow_run_id: Arc::from(task.run_id.as_str()),
                stage_id: Arc::clone(&stage_id),
                stage_name: name,
            }),
            stage_execution_id: Arc::clone(&id),
            item: task.item.clone(),
            index: task.index,
        });
        let exec = ExecKey {
            turn: task.turn,
            slot: Slot::Unit(task.unit),
            id: Arc::clone(&id),
            stage: stage_id,
        };
        let spawn = Spawn {
            exec,
            stage: Arc::new(stage),
            ctx: context,
            index: task.index,
            visit: task.visit,
        };
        let scope = CancelScope::root();
        if let Some(reason) = self.group_cancelled(&task, checked) {
            // Starts as cancelled: reported as not started.
            scope.cancel(reason.as_str());
        }
        let in_flight = InFlight {
            task: task.clone(),
            lease,
            also: Vec::new(),
            scope: scope.clone(),
            _permit: permit,
            _group: Arc::clone(&group),
        };
        self.in_flight.insert(Arc::clone(&id), in_flight);
        self.in_flight_count.send_modify(|n| *n += 1);
        match self.executor(&task, ctx) {
            Some(local) => {
                local.start(spawn, &scope, None);
            }
            None => {
                if let Some(flight) = self.in_flight.remove(&id) {
                    unstartable(flight.lease);
                }
                self.in_flight_count
                    .send_modify(|n| *n = n.saturating_sub(1));
            }
        }
    }

    /// An execution ended: report it with its events, then acknowledge
    /// its task.
    fn report(&mut self, exec: ExecKey, outcome: StageOutcome) {
        let Some(flight) = self.in_flight.remove(&exec.id) else {
            return;
        };
        // Idle from now, if nothing else holds them: what KEPT_IDLE
        // counts from (a sibling may run far longer).
        self.buckets.touch(&flight.task);
        if let Some((_, used)) = self.executors.get_mut(&flight.task.run_id) {
            *used = Instant::now();
        }
        // The lease is renewed until the report is stored: it may wait in
        // the outbox behind a batch being retried.
        let lease = flight.lease;
        let also = flight.also;
        let until = self.bus.last_seq();
        let mut seen = self.seen.clone();
        let collected = Arc::clone(&self.collected);
        let outbox = self.outbox.clone();
        let worker = self.config.name.clone();
        let name = worker.clone();
        let task_log = self.config.task_log;
        let summary = Arc::clone(&self.summary);
        let t = flight.task;
        let delivered = lease.delivered();
        let permit = flight._permit;
        // Counted down only when the task ends, however it ends: a drain
        // waits for the report too, and a task that panicked would
        // otherwise hold it up for good.
        let counted_down = CountDown(self.in_flight_count.clone());
        let fut = async move {
            let _counted_down = counted_down;
            // Every event the execution published before it reported.
            let _ = seen.wait_for(|s| *s >= until).await;
            // What lines may take of a message: its budget less the rest
            // of the report (its result, its ids), asked only for an
            // execution with more records than a batch carries.
            let within = || {
                let result = match &outcome {
                    StageOutcome::Exited { result, .. } => {
                        let mut json = Vec::new();
                        result
                            .write_json(&mut json)
                            .map_or(usize::MAX, |()| json.len())
                    }
                    _ => 0,
                };
                outbox
                    .message_budget()
                    .saturating_sub(result.saturating_add(REPORT_BESIDE_RESULT))
            };
            let (events, records) = collected.take(&exec.id, t.relay_records, within);
            let (report, counted): (Report, fn(&mut WorkerSummary)) = match outcome {
                StageOutcome::Exited { result, .. } => (
                    Report::Exited {
                        stage_execution_id: t.stage_execution_id.clone(),
                        turn: t.turn,
                        unit: t.unit,
                        worker,
                        delivered,
                        result,
                        events,
                    },
                    |s| s.finished += 1,
                ),
                StageOutcome::Cancelled { usage } => (
                    Report::Cancelled {
                        stage_execution_id: t.stage_execution_id.clone(),
                        turn: t.turn,
                        unit: t.unit,
                        worker,
                        usage,
                        events,
                    },
                    |s| s.cancelled += 1,
                ),
                StageOutcome::CancelledBeforeStart => (
                    Report::NotStarted {
                        stage_execution_id: t.stage_execution_id.clone(),
                        turn: t.turn,
                        unit: t.unit,
                        worker,
                    },
                    |s| s.not_started += 1,
                ),
            };
            let reported = outbox.send_relayed(&t, &report, records).await;
            // The slot is free once the report is out.
            drop(permit);
            // Not reported: its message goes back to the queue for another
            // worker, once NATS is likely to take the report.
            for lease in std::iter::once(&lease).chain(&also) {
                lease.settle(&t.stage_execution_id, reported).await;
            }
            log_task(task_log, &name, &t.run_id, &report, reported);
            if let Ok(mut s) = summary.lock() {
                counted(&mut s);
            }
        };
        // A task of its own, not a future of this actor's context: actix
        // polls every future a context holds each time the actor wakes,
        // and with hundreds of reports waiting on the outbox that was
        // some 70 polls a sibling (callgrind). It uses nothing of the
        // actor's, ends once the outbox answered and the leases are
        // settled, and a drain waits for it through `counted_down`.
        actix::spawn(fut);
    }
}

impl Handler<ToScheduler> for WorkerHost {
    type Result = ();

    fn handle(&mut self, msg: ToScheduler, _: &mut Context<Self>) {
        self.letter(msg);
    }
}

impl WorkerHost {
    /// What the executions tell the scheduler, told the worker instead:
    /// only their ends matter here.
    fn letter(&mut self, msg: ToScheduler) {
        match msg {
            ToScheduler::Report { exec, outcome } => self.report(exec, outcome),
            ToScheduler::Batch(letters) => {
                for letter in letters {
                    self.letter(letter);
                }
            }
            ToScheduler::CancelRun | ToScheduler::LimitReached { .. } => {}
        }
    }
}

impl Handler<Start> for WorkerHost {
    type Result = ();

    fn handle(&mut self, msg: Start, ctx: &mut Context<Self>) {
        self.start(msg.0, ctx);
    }
}

impl Handler<CancelGroup> for WorkerHost {
    type Result = ();

    fn handle(&mut self, msg: CancelGroup, _ctx: &mut Context<Self>) {
        let c = msg.0;
        let now = Instant::now();
        self.cancelled_groups
            .retain(|_, (at, _)| now.duration_since(*at) < FORGET_AFTER);
        self.cancelled_groups
            .insert((c.run_id.clone(), c.turn), (now, c.reason.clone()));
        for flight in self.in_flight.values() {
            if flight.task.run_id == c.run_id && flight.task.turn == c.turn {
                flight.scope.cancel(c.reason.as_str());
            }
        }
    }
}

impl Handler<Count> for WorkerHost {
    type Result = ();

    fn handle(&mut self, msg: Count, _ctx: &mut Context<Self>) {
        self.count(|s| match msg.0 {
            Counted::Refused => s.refused += 1,
            Counted::NotStarted => s.not_started += 1,
        });
    }
}

impl Handler<Summary> for WorkerHost {
    type Result = MessageResult<Summary>;

    fn handle(&mut self, _msg: Summary, _ctx: &mut Context<Self>) -> Self::Result {
        MessageResult(Arc::clone(&self.summary))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A cancel heard before the group's mark was read absent is an
    /// earlier session's (its marks cleared by a resume); one heard after
    /// is this group's; with no read, every cancel heard counts.
    #[test]
    fn a_cancel_heard_before_a_clear_read_is_an_earlier_sessions() {
        let heard = Instant::now();
        let read = heard + Duration::from_millis(5);
        assert!(!heard_since(heard, Some(read)));
        assert!(heard_since(read, Some(read)));
        assert!(heard_since(read + Duration::from_millis(1), Some(read)));
        assert!(heard_since(heard, None));
    }
}
