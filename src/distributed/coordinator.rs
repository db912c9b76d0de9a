//! The coordinator's side of a distributed run (`troupe run --nats`): the
//! executor that sends fan-out siblings to the workers' queue instead of
//! the local pool. Everything else stays with the coordinator: the
//! scheduler (the cap, fail-fast, the join), sequential stages and joins,
//! the store and the audit log.
//!
//! - **Publishing.** The scheduler spawns a sibling only into a free
//!   slot of its group and counts it started as it spawns it (granted at
//!   spawn, as a local sibling is); its task is published on the group's
//!   subject, unless its scope (under the group's) was cancelled since,
//!   together with the group's other siblings spawned at the same time
//!   (`publishing`: up to `TASKS_PER_MESSAGE` tasks a message). The
//!   scheduler's cap therefore bounds the tasks of a group in the queue
//!   or on workers.
//! - **Reports.** Workers report on the run's report subject, in batches
//!   (one message, many reports: see `outbox`), read by the run's durable
//!   consumer in order. An exited sibling's result is stored first (the
//!   ledger), then its events — relayed from the worker as text, in order,
//!   the last its `StageExited` — are published into the run's log and the
//!   scheduler gets the report; only when every report of a message is
//!   settled is the message acknowledged, so a coordinator killed in
//!   between finds it again.
//!   Results are deduplicated by `stageExecutionId` (a task runs at least
//!   once: a lost worker's task is delivered again).
//! - **Cancelling a group** (fail-fast, Ctrl-C, a limit): the group is
//!   marked cancelled in a bucket workers read before they start a task,
//!   its queued tasks are purged, a cancel is broadcast (workers cancel
//!   the siblings in flight strictly and report them cancelled), and a
//!   barrier is published on the report subject. A worker reports
//!   `Accepted` before it reads the mark, so a sibling not accepted by the
//!   barrier never started: the scheduler is told so at once. Siblings
//!   accepted before it are waited for (at most two leases, for a worker
//!   that died holding one).

use std::sync::Arc;

use actix::prelude::*;
use async_nats::HeaderMap;
use futures::{FutureExt, StreamExt};
use serde_json::{Map, Value};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use troupe_actors::EventBus;

use super::groups::{Group, Unit};
use super::nats::{Nats, publish_acked};
use super::wire::{
    CANCELLED_BUCKET, Cancel, GROUPS_BUCKET, GroupContext, Report, Task, cancel_subject,
    cancelled_key, group_key, report_subject, task_subject,
};
use crate::runtime::cancel::{CancelScope, TURN_CANCELLED};
use crate::runtime::events::{Event, EventName};
use crate::runtime::ledger::Ledger;
use crate::runtime::limits::Budget;
use crate::runtime::result::{Kept, StageResult, Usage, Verdict};
use crate::runtime::scheduler::{
    ExecKey, Executor, ExecutorFactory, FastMap, FastSet, LocalExecutor, Slot, Spawn, StageOutcome,
    ToScheduler,
};

mod decoding;
mod publishing;
mod reports;

use decoding::{Helpers, Incoming};
use publishing::Pending;
use reports::Settling;

/// Makes a run's remote executor.
#[derive(Debug, Clone)]
pub struct RemoteSiblings {
    pub nats: Nats,
    pub run_id: String,
    pub pipeline_id: String,
    pub digest: String,
    pub fields: Arc<Map<String, Value>>,
    pub bus: EventBus<Event>,
    pub ledger: Option<Arc<dyn Ledger>>,
    /// The run's token and cost meter: the usage each sibling's worker
    /// reports is counted when the report arrives, so `--max-tokens` and
    /// `--max-cost` hold across machines (give or take what the siblings
    /// in flight spend before they report).
    pub budget: Option<Arc<Budget>>,
    /// This coordinator process's id. A message's `Nats-Msg-Id` is its
    /// first task's execution id (and the count) at this session: the
    /// server drops a retried publish as a duplicate, yet a resumed run
    /// may queue the same execution again (its first task was purged
    /// with the run's queue).
    pub session: Arc<str>,
    /// The results a resumed run found stored (by execution id): a
    /// report of an earlier session delivered again is not stored twice.
    pub restored: Arc<std::collections::HashMap<Arc<str>, crate::runtime::result::Kept>>,
}

impl ExecutorFactory for RemoteSiblings {
    fn make(&self, local: LocalExecutor, scheduler: Recipient<ToScheduler>) -> Box<dyn Executor> {
        let (tx, rx) = mpsc::unbounded_channel();
        let shutdown = CancellationToken::new();
        // Off the scheduler's thread where the run has another: there the
        // scheduler and the session are the busiest thread of a
        // distributed run, and decoding and relaying the workers' reports
        // is as much again (BENCHMARKS.md). The run's
        // arbiters are otherwise idle in a distributed run, since its
        // siblings run on the workers. (The loop is made where it runs:
        // what it keeps of a group is not `Send`.)
        let stopped = scheduler.clone();
        let helpers = Helpers::new(local.other_arbiters());
        let start = {
            let (spec, tx, stop) = (self.clone(), tx.clone(), shutdown.clone());
            move || {
                let coordinator = Coordinator {
                    spec,
                    scheduler,
                    tx,
                    groups: FastMap::default(),
                    resolved: FastSet::default(),
                    committing: FastMap::default(),
                    by_sequence: FastMap::default(),
                    pending: Vec::new(),
                    unknown: FastMap::default(),
                    publishing: 0,
                    publishers: helpers.clone(),
                };
                actix::spawn(coordinator.run(rx, helpers, stop));
            }
        };
        match local.arbiter() {
            Some(arbiter) => {
                if !arbiter.spawn_fn(start) {
                    stopped.do_send(ToScheduler::LimitReached {
                        reason: "Distributed/Unreachable: the run's arbiter stopped before its coordinator could start".to_owned(),
                    });
                }
            }
            None => start(),
        }
        Box::new(RemoteExecutor {
            local,
            tx,
            shutdown,
            scheduler: stopped,
        })
    }
}

/// Siblings to the workers, everything else to the local pool.
struct RemoteExecutor {
    local: LocalExecutor,
    tx: mpsc::UnboundedSender<Cmd>,
    shutdown: CancellationToken,
    scheduler: Recipient<ToScheduler>,
}

impl std::fmt::Debug for RemoteExecutor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteExecutor").finish()
    }
}

impl Drop for RemoteExecutor {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl Executor for RemoteExecutor {
    fn start(
        &mut self,
        spawn: Spawn,
        parent: &CancelScope,
        group: Option<CancelScope>,
    ) -> CancelScope {
        if !spawn.is_sibling() {
            return self.local.start(spawn, parent, group);
        }
        // The sibling's own scope, which the scheduler stops if it refuses
        // the start it records at spawn (a budget tripped meanwhile).
        let own = parent.child();
        let sent = self.tx.send(Cmd::Sibling {
            spawn: Box::new(spawn),
            group,
            own: own.clone(),
        });
        // No loop to take it (it could not start): the sibling never
        // starts, and the scheduler, which counts it running, hears so.
        if let Err(mpsc::error::SendError(Cmd::Sibling { spawn, .. })) = sent {
            self.scheduler.do_send(ToScheduler::Report {
                exec: spawn.exec,
                outcome: StageOutcome::CancelledBeforeStart,
            });
        }
        own
    }
}

/// How long a coordinator whose run is over waits for the commits still
/// being answered before it stops (see `Coordinator::finish`).
const SETTLE_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// What the coordinator loop is told.
enum Cmd {
    /// The scheduler spawned a sibling.
    Sibling {
        spawn: Box<Spawn>,
        group: Option<CancelScope>,
        /// Its own scope, under the group's.
        own: CancelScope,
    },
    /// JetStream stored the tasks of group `turn` (`Ok` with each
    /// message's stream sequence) or would not, however often asked
    /// (`Err` with their units' failure): `outcomes` takes `execs` in
    /// order, so many to each message.
    Queued {
        turn: u64,
        execs: Vec<ExecKey>,
        outcomes: Vec<(usize, Result<u64, String>)>,
    },
    /// The group's scope was cancelled.
    GroupCancelled { turn: u64, reason: String },
    /// An exited sibling's result is committed (`true`) and recorded, or
    /// could not be (`false`): settle the messages that waited on it, or
    /// leave them unacknowledged for a resume to read again.
    Committed(Arc<str>, bool),
    /// The cancelled group's wait for siblings accepted before the barrier
    /// is over: whatever did not report was lost with its worker.
    GiveUp { turn: u64 },
    /// A message no worker will finish and its siblings that fail (those
    /// a worker put back on the queue or reported left out).
    Abandoned(publishing::Lost, Vec<publishing::Sibling>),
    /// A message no worker will finish that could not be read: one this
    /// loop published (its `Queued` may not have come yet), or nothing
    /// known.
    Unknown(publishing::Lost),
}

struct Coordinator {
    spec: RemoteSiblings,
    scheduler: Recipient<ToScheduler>,
    tx: mpsc::UnboundedSender<Cmd>,
    groups: FastMap<u64, Group>,
    /// Executions whose end was recorded (a task runs at least once).
    resolved: FastSet<String>,
    /// Exited siblings whose result is being committed, with the report
    /// message it came in and those of any copies that came meanwhile.
    committing: FastMap<String, Vec<Arc<Settling>>>,
    /// The task stream's sequence of each published message and the
    /// siblings it holds, for the advisory of a message no worker
    /// finished.
    by_sequence: FastMap<u64, Vec<ExecKey>>,
    /// Siblings spawned and not yet published: those the scheduler
    /// spawned together are published together (`take_waiting`).
    pending: Vec<Pending>,
    /// Messages no worker will finish that were not known when the
    /// advisory came, by stream sequence; kept while `publishing`.
    unknown: FastMap<u64, publishing::Lost>,
    /// Publishes awaiting their `Queued`.
    publishing: usize,
    /// Where tasks are serialized and published, off this loop's thread.
    publishers: Helpers,
}

/// A task the server would not store, as its unit's failure.
pub(super) fn unreachable(error: &str) -> String {
    format!("Distributed/Unreachable: the task could not be queued: {error}")
}

impl Coordinator {
    async fn run(
        mut self,
        mut rx: mpsc::UnboundedReceiver<Cmd>,
        decoders: Helpers,
        shutdown: CancellationToken,
    ) {
        let consumer = match self.spec.nats.coordinator_consumer(&self.spec.run_id).await {
            Ok(c) => c,
            Err(e) => return self.abort(format!("{e}"), &mut rx, &shutdown).await,
        };
        let reports = match consumer.messages().await {
            Ok(m) => m,
            Err(e) => {
                let why = format!("cannot read the run's reports: {e}");
                return self.abort(why, &mut rx, &shutdown).await;
            }
        };
        // Messages are read and decoded ahead of this loop (see
        // `decoding`); the reader stops once this loop drops `incoming`.
        let (ahead, mut incoming) = mpsc::channel(decoding::READ_AHEAD);
        actix::spawn(decoding::read_ahead(
            reports,
            |message: async_nats::jetstream::Message| {
                let (message, acker) = message.split();
                (message.payload, acker)
            },
            decoders,
            ahead,
        ));
        // The workers' consumer's advisories of a message it will not
        // deliver again: delivered as often as allowed, or dropped by a
        // worker that could not read it (`+TERM`).
        let subscribe = |kind: &str| {
            let subject = format!(
                "$JS.EVENT.ADVISORY.CONSUMER.{kind}.{}.{}",
                super::wire::TASKS_STREAM,
                super::wire::WORKERS_CONSUMER
            );
            self.spec.nats.client.subscribe(subject)
        };
        let lost = subscribe("MAX_DELIVERIES").await.ok();
        let dropped = subscribe("MSG_TERMINATED").await.ok();
        let mut advisories = futures::stream::select(
            futures::stream::iter(lost).flatten(),
            futures::stream::iter(dropped).flatten(),
        );
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return self.finish(&mut rx).await,
                cmd = rx.recv() => match cmd {
                    Some(cmd) => {
                        self.command(cmd).await;
                        self.take_waiting(&mut rx).await;
                    }
                    None => return,
                },
                message = incoming.recv() => match message {
                    Some(message) => self.reports(message).await,
                    None if shutdown.is_cancelled() => return self.finish(&mut rx).await,
                    None => {
                        let why = "the run's report stream ended".to_owned();
                        return self.abort(why, &mut rx, &shutdown).await;
                    }
                },
                Some(advisory) = advisories.next() => {
                    let dropped = advisory.subject.contains(".MSG_TERMINATED.");
                    self.abandoned(&advisory.payload, dropped);
                }
            }
        }
    }

    /// The run is over. Exits whose commit is still being answered are
    /// recorded already, and their last one may be what ended the run:
    /// their messages are settled first (for at most
    /// [`SETTLE_PATIENCE`]; one left unacknowledged would be read again
    /// by a resume), then the connection is flushed.
    async fn finish(&mut self, rx: &mut mpsc::UnboundedReceiver<Cmd>) {
        let deadline = tokio::time::Instant::now() + SETTLE_PATIENCE;
        while !self.committing.is_empty() {
            match tokio::time::timeout_at(deadline, rx.recv()).await {
                Ok(Some(Cmd::Committed(id, stored))) => self.committed(&id, stored).await,
                // Nothing else matters once the run is over.
                Ok(Some(_)) => {}
                Ok(None) | Err(_) => break,
            }
        }
        self.spec.nats.flush().await;
    }

    /// The message an exit came in, and the copies delivered since, once
    /// its commit is answered: acknowledged if it was stored.
    async fn committed(&mut self, id: &str, stored: bool) {
        let messages = self.committing.remove(id).unwrap_or_default();
        if stored {
            for message in messages {
                self.settled(&message).await;
            }
        }
    }

    /// NATS failed under the run: it cannot go on. The scheduler is told
    /// (it cancels the run), and the loop stays until the run is over to
    /// answer for its siblings, which the scheduler counts running from
    /// their spawn: those whose tasks went out will not be heard from
    /// (cancelled), those spawned since never start. Without the answers
    /// the run would wait for reports that cannot come.
    async fn abort(
        mut self,
        why: String,
        rx: &mut mpsc::UnboundedReceiver<Cmd>,
        shutdown: &CancellationToken,
    ) {
        self.scheduler.do_send(ToScheduler::LimitReached {
            reason: format!("Distributed/Unreachable: {why}"),
        });
        let lost = self
            .groups
            .values_mut()
            .flat_map(Group::take_unsettled)
            .collect();
        self.report_lost(lost);
        loop {
            tokio::select! {
                () = shutdown.cancelled() => return,
                cmd = rx.recv() => match cmd {
                    Some(Cmd::Sibling { spawn, .. }) => {
                        self.scheduler.do_send(ToScheduler::Report {
                            exec: spawn.exec,
                            outcome: StageOutcome::CancelledBeforeStart,
                        });
                    }
                    Some(_) => {}
                    None => return,
                },
            }
        }
    }

    /// Siblings that will not be heard from, as cancelled: nothing of what
    /// they spent is known here. Resolved: a report that comes after all
    /// (a worker that missed the cancel ran it to the end) is a second
    /// word on an execution that already ended, and is not taken.
    fn report_lost(&mut self, lost: Vec<ExecKey>) {
        for exec in lost {
            self.resolved.insert(exec.id.to_string());
            self.scheduler.do_send(ToScheduler::Report {
                exec,
                outcome: StageOutcome::Cancelled {
                    usage: Usage::default(),
                },
            });
        }
    }

    async fn command(&mut self, cmd: Cmd) {
        match cmd {
            Cmd::Sibling { spawn, group, own } => self.sibling(*spawn, group, own),
            Cmd::Queued {
                turn,
                execs,
                outcomes,
            } => self.queued(turn, execs, outcomes),
            // Boxed: its future (the mark's put, some 12 KB) would make
            // this one as large, and this one is made and moved for every
            // command the loop takes (about 1 700 instructions of memcpy a
            // sibling on the loop's thread, callgrind).
            Cmd::GroupCancelled { turn, reason } => {
                Box::pin(self.cancel_group(turn, reason)).await;
            }
            Cmd::Committed(id, stored) => self.committed(&id, stored).await,
            Cmd::Unknown(lost) => self.unknown(lost),
            Cmd::Abandoned(lost, siblings) => self.fail_siblings(lost, siblings),
            Cmd::GiveUp { turn } => {
                let lost = self
                    .groups
                    .get_mut(&turn)
                    .map(Group::take_unsettled)
                    .unwrap_or_default();
                self.report_lost(lost);
            }
        }
    }

    /// A sibling to send, its start recorded by the scheduler as it spawned
    /// it: publish it. (Asking the scheduler on its behalf was three hops
    /// on every sibling's way: the ask to the scheduler, its grant back to
    /// this arbiter, the grant into the loop, each behind whatever that
    /// thread had queued.)
    fn sibling(&mut self, spawn: Spawn, group: Option<CancelScope>, own: CancelScope) {
        let turn = spawn.exec.turn;
        let unit = match spawn.exec.slot {
            Slot::Unit(u) => u,
            _ => return,
        };
        let new_group = !self.groups.contains_key(&turn);
        let g = self.groups.entry(turn).or_default();
        g.units.insert(
            unit,
            Unit {
                exec: Some(spawn.exec.clone()),
                ..Unit::default()
            },
        );
        if new_group {
            let context = GroupContext {
                fields: Arc::clone(&self.spec.fields),
                slot: Arc::clone(&spawn.ctx.results),
            };
            let js = self.spec.nats.js.clone();
            let part = self.spec.nats.message_budget();
            let key = group_key(&self.spec.run_id, turn);
            let stop = group.as_ref().map(|g| g.token().clone());
            let put = async move {
                // One value, or parts and then the key (`stored_context`).
                for (key, body) in super::stored_context::encode(&key, &context, part)? {
                    let subject = format!("$KV.{GROUPS_BUCKET}.{key}");
                    publish_acked(&js, subject, HeaderMap::new(), body.into(), stop.as_ref())
                        .await
                        .map_err(|e| format!("the group's context could not be stored: {e}"))?;
                }
                Ok(())
            };
            g.context = Some(put.boxed_local().shared());
        }
        if new_group && let Some(group) = group {
            g.scope = Some(group.clone());
            let tx = self.tx.clone();
            actix::spawn(async move {
                group.token().cancelled().await;
                let reason = group
                    .reason()
                    .map_or_else(|| TURN_CANCELLED.to_owned(), |r| r.to_string());
                let _ = tx.send(Cmd::GroupCancelled { turn, reason });
            });
        }
        let task = Task {
            run_id: self.spec.run_id.clone(),
            turn,
            unit,
            stage_execution_id: spawn.exec.id.to_string(),
            stage_id: spawn.exec.stage.to_string(),
            index: spawn.index,
            visit: spawn.visit,
            item: spawn.ctx.item.clone(),
            pipeline_id: self.spec.pipeline_id.clone(),
            digest: self.spec.digest.clone(),
            zstd_reports: true,
            relay_records: true,
        };
        self.pending.push(Pending {
            exec: spawn.exec,
            task,
            own,
        });
    }

    fn done(&mut self, exec: &ExecKey, turn: u64, unit: usize) -> bool {
        let first = self.resolved.insert(exec.id.to_string());
        if let Some(u) = self
            .groups
            .get_mut(&turn)
            .and_then(|g| g.units.get_mut(&unit))
        {
            u.done = true;
        }
        first
    }

    /// A sibling that cannot run here or there: it fails (with a
    /// `StageEntered`/`StageExited` pair, so the log stays whole).
    fn fail_unit(&mut self, exec: ExecKey, reason: String) {
        let Slot::Unit(unit) = exec.slot else {
            return;
        };
        if !self.done(&exec, exec.turn, unit) {
            return;
        }
        let result = Kept::Whole(Arc::new(StageResult {
            stage_id: exec.stage.to_string(),
            stage_execution_id: exec.id.to_string(),
            verdict: Verdict::Fail,
            reason: Some(reason.clone()),
            parsed: Arc::new(Value::Null),
            output: Arc::new(Value::Null),
            cap_hit: false,
            attempt_count: 0,
            usage: Usage::default(),
        }));
        let run: Arc<str> = Arc::from(self.spec.run_id.as_str());
        let event = |name| {
            Event::new(name, Arc::clone(&run)).stage(Arc::clone(&exec.stage), Arc::clone(&exec.id))
        };
        self.spec
            .bus
            .publish(event(EventName::StageEntered).with_static("kind", "llm"));
        let seq = self
            .spec
            .bus
            .publish(
                event(EventName::StageExited)
                    .with_static("verdict", "fail")
                    .with("capHit", false)
                    .with("attemptCount", 0u32)
                    .with("usage", Usage::default())
                    .with("reason", reason.as_str()),
            )
            .unwrap_or(0);
        self.scheduler.do_send(ToScheduler::Report {
            exec,
            outcome: StageOutcome::Exited { result, seq },
        });
    }

    async fn cancel_group(&mut self, turn: u64, reason: String) {
        let Some(g) = self.groups.get_mut(&turn) else {
            return;
        };
        if std::mem::replace(&mut g.cancelled, true) {
            return;
        }
        let run = self.spec.run_id.clone();
        // The mark first: a worker that reads it starts nothing of the group.
        if self.spec.nats.cancelled().await.is_ok() {
            // The bucket's put, retried through a leader election.
            let _ = publish_acked(
                &self.spec.nats.js,
                format!("$KV.{CANCELLED_BUCKET}.{}", cancelled_key(&run, turn)),
                HeaderMap::new(),
                reason.clone().into_bytes().into(),
                None,
            )
            .await;
        }
        if let Ok(tasks) = self.spec.nats.tasks().await {
            let _ = tasks.purge().filter(task_subject(&run, turn)).await;
        }
        let cancel = Cancel {
            run_id: run.clone(),
            turn,
            reason,
        };
        if let Ok(body) = serde_json::to_vec(&cancel) {
            let _ = self
                .spec
                .nats
                .client
                .publish(cancel_subject(&run), body.into())
                .await;
        }
        let barrier = serde_json::to_vec(&Report::Barrier { turn }).unwrap_or_default();
        let published = publish_acked(
            &self.spec.nats.js,
            report_subject(&run),
            HeaderMap::new(),
            barrier.into(),
            None,
        )
        .await
        .is_ok();
        if !published {
            // No barrier can come: treat it as passed.
            self.barrier(turn);
        }
        let tx = self.tx.clone();
        let wait = self.spec.nats.lease * 2;
        actix::spawn(async move {
            tokio::time::sleep(wait).await;
            let _ = tx.send(Cmd::GiveUp { turn });
        });
    }

    /// The barrier of a cancelled group: siblings not accepted by now
    /// never started.
    fn barrier(&mut self, turn: u64) {
        let Some(g) = self.groups.get_mut(&turn) else {
            return;
        };
        g.barrier = true;
        for exec in g.take_unaccepted() {
            self.resolved.insert(exec.id.to_string());
            self.scheduler.do_send(ToScheduler::Report {
                exec,
                outcome: StageOutcome::CancelledBeforeStart,
            });
        }
    }
}
