//! The stage-execution actor: one per stage execution, siblings included.
//! It begins as soon as it is started (the scheduler records a sibling's
//! start as it spawns it; its scope says whether it may), runs the phases,
//! records the execution's end in exactly one place — `StageExited` after
//! Exit, or `StageCancelled` after a strict cancel — and reports once. A
//! panic in the phases becomes the stage's `ExtensionHost/ActorPanicked`
//! failure, recorded and reported like any failed Exit.

use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;
use std::time::SystemTime;

use actix::prelude::*;
use futures::FutureExt;
use serde_json::Value;
use troupe_actors::EventBus;

use super::cancel::CancelScope;
use super::events::{Event, EventName, FieldValue};
use super::interaction::{InteractionHub, WithdrawOwner};
use super::ledger::{CancelRecord, ExitRecord, Ledger, LedgerError};
use super::result::{Kept, StageResult, Verdict};
use super::scheduler::post::post;
use super::scheduler::{
    ExecKey, Slot, StageOutcome, ToScheduler, next_of, sibling_failed_reason, sibling_label,
};
use super::stage::StageRun;
use crate::definition::{Pipeline, Stage};

mod roll;

use roll::Note;
pub use roll::{forget, record_under};

/// Runs one stage execution.
pub struct StageActor {
    run: Option<StageRun>,
    exec: ExecKey,
    scheduler: Arc<Recipient<ToScheduler>>,
    /// Its whereabouts, event ids and scope, and whether its end is
    /// recorded: shared with its thread's roll (see `roll`).
    note: Rc<Note>,
    /// Whether it enrols in its thread's roll when it starts.
    enrolling: bool,
    pipeline: Arc<Pipeline>,
    stage: Arc<Stage>,
    hub: Option<Arc<Addr<InteractionHub>>>,
    /// For siblings: the group's scope, which a failed sibling cancels so
    /// the others stop at once (the scheduler still decides the failure).
    group: Option<CancelScope>,
    /// For siblings: the index of a map sibling.
    index: Option<usize>,
    visit: u32,
    /// Where the execution's end is made durable before it is recorded.
    ledger: Option<Arc<dyn Ledger>>,
    entered_at: SystemTime,
    started: bool,
    reported: bool,
    /// A sibling's result is packed when it exits (see [`Kept`]), unless
    /// whoever receives it sends it on at once (a worker).
    pack: bool,
}

impl std::fmt::Debug for StageActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageActor")
            .field("execution_id", &self.exec.id)
            .field("started", &self.started)
            .finish()
    }
}

impl StageActor {
    pub fn new(
        run: StageRun,
        exec: ExecKey,
        scheduler: Arc<Recipient<ToScheduler>>,
        scope: CancelScope,
        group: Option<CancelScope>,
    ) -> StageActor {
        let ledger = run.kit.settings.ledger.clone();
        let note = Note::new(
            run.kit.bus.clone(),
            [
                Arc::clone(&run.ids.run),
                Arc::clone(&run.ids.stage),
                Arc::clone(&exec.id),
            ],
            scope,
            ledger.is_some(),
        );
        StageActor {
            exec,
            scheduler,
            group,
            note: Rc::new(note),
            enrolling: false,
            index: run.index,
            visit: run.visit,
            ledger,
            entered_at: SystemTime::UNIX_EPOCH,
            pipeline: Arc::clone(&run.kit.pipeline),
            stage: Arc::clone(&run.stage),
            hub: run.hub.clone(),
            started: false,
            reported: false,
            pack: true,
            run: Some(run),
        }
    }

    /// Hands a sibling's result over whole: for a worker, which writes it
    /// into its report at once, where packing would only encode it twice.
    pub fn keeping_results_whole(mut self) -> StageActor {
        self.pack = false;
        self
    }

    /// Enrols the execution, once started, in its thread's roll under its
    /// parent scope, so that a cancel of that scope is recorded at once
    /// (see `roll`): for a sibling whose parent scope someone records
    /// under (the local executor's relays and groups).
    pub fn enrolling(mut self) -> StageActor {
        self.enrolling = true;
        self
    }

    fn send_report(&mut self, outcome: StageOutcome) {
        if self.reported {
            return;
        }
        self.reported = true;
        self.scheduler.do_send(ToScheduler::Report {
            exec: self.exec.clone(),
            outcome,
        });
    }

    fn begin(&mut self, ctx: &mut Context<Self>) {
        let Some(run) = self.run.take() else { return };
        // Granted before the scheduler read the failure (or the Ctrl-C) that
        // has cancelled it since: it never starts, and nothing is logged.
        if self.note.scope.is_cancelled() {
            self.send_report(StageOutcome::CancelledBeforeStart);
            ctx.stop();
            return;
        }
        // Entered and started together: a cancel from here on is recorded
        // as StageCancelled of an execution the log shows as entered.
        run.enter();
        self.started = true;
        if self.ledger.is_some() {
            self.entered_at = SystemTime::now();
        }
        if self.enrolling {
            roll::enrol(&self.note);
        }
        let whereabouts = Rc::clone(&self.note.whereabouts);
        let scope = self.note.scope.clone();
        let (deferred, bus) = (Rc::clone(&run.deferred), run.kit.bus.clone());
        // Boxed so that a cancelled execution can be handed back alive and
        // dropped later (below), and so the wrappers around it move a
        // pointer, not the whole state machine.
        let mut execute = Box::pin(AssertUnwindSafe(run.execute(whereabouts)).catch_unwind());
        // The scope is checked first on every poll: once it or an ancestor
        // is cancelled the execution is never polled again, wherever it
        // waits, and Exit never runs. The token wakes it; the marks catch a
        // group cancel a relay has not forwarded yet (`cancel.rs`). The
        // execution ends in the same poll as its Assert, and the Exit that
        // follows has no await, so an execution is never both exited and
        // cancelled.
        let race = async move {
            let finished = {
                let mut cancelled = std::pin::pin!(scope.token().cancelled());
                std::future::poll_fn(|cx| {
                    if cancelled.as_mut().poll(cx).is_ready() || scope.is_marked() {
                        return std::task::Poll::Ready(None);
                    }
                    deferred
                        .polling(&bus, || execute.as_mut().poll(cx))
                        .map(Some)
                })
                .await
            };
            finished.ok_or(execute)
        };
        ctx.spawn(race.into_actor(self).map(|raced, act, ctx| match raced {
            Ok(result) => {
                let result = match result {
                    Ok(result) => result,
                    Err(panic) => act.panicked(panic_message(&*panic)),
                };
                act.exit(result, ctx);
            }
            Err(execution) => {
                // Strictly cancelled through the token tree. Record it now
                // (unless its thread's roll has: `roll`), then let every
                // other execution woken by the same cancel record its own
                // before this one is torn down: dropping what it held
                // (transcript, request, tool call) and stopping the actor
                // cost more than the record, and done inline they would
                // delay the last sibling's record by the teardown of all
                // the others (BENCHMARKS.md). The execution is never
                // polled again either way.
                act.record_cancelled();
                ctx.spawn(
                    async move {
                        tokio::task::yield_now().await;
                        drop(execution);
                    }
                    .into_actor(act)
                    .map(|(), _act, ctx| ctx.stop()),
                );
            }
        }));
    }

    /// Exit: the one place an execution's `StageExited` is recorded. A
    /// failed sibling first cancels its group's scope, so its siblings stop
    /// at once, and once its own exit is recorded records the cancellation
    /// of those enrolled on its thread (`roll`); the others' are recorded
    /// by their threads' relays. The scheduler decides the failure from
    /// the report. With a ledger, an `ok`/`skipped` result is made durable
    /// before its `StageExited` is published and the execution reported:
    /// both happen on the ledger's thread once the batch holding it is
    /// committed, so the actor hands the record over and stops. A failed
    /// result (run again on resume anyway) is recorded at once and written
    /// unwaited.
    fn exit(&mut self, result: Arc<StageResult>, ctx: &mut Context<Self>) {
        self.note.exiting();
        let failed_group = self
            .group
            .as_ref()
            .filter(|_| result.verdict == Verdict::Fail);
        if let Some(group) = failed_group {
            group.cancel(sibling_failed_reason(&sibling_label(
                &self.exec.stage,
                self.index,
            )));
        }
        let cancelled_here = failed_group
            .is_some()
            .then(|| self.note.scope.parent().map(CancelScope::key))
            .flatten();
        let verdict = result.verdict;
        let recorder = self.recorder(result);
        self.reported = true;
        match self.ledger.clone() {
            None => recorder.record(),
            Some(ledger) if verdict == Verdict::Fail => {
                ledger.persist(self.exit_record(&recorder.result), None);
                recorder.record();
            }
            Some(ledger) => ledger.persist(
                self.exit_record(&recorder.result),
                Some(Box::new(move |stored| match stored {
                    Ok(()) => recorder.record(),
                    Err(e) => recorder.not_stored(&e),
                })),
            ),
        }
        // A failure is recorded above, before the cancellations it causes.
        if let Some(scope) = cancelled_here {
            roll::record_under(&scope);
        }
        ctx.stop();
    }

    /// Everything recording this execution's exit needs, wherever it runs.
    /// A sibling's result is packed here, on the execution's own thread,
    /// before anyone keeps it (see [`Kept`]).
    fn recorder(&self, result: Arc<StageResult>) -> ExitRecorder {
        let mut event = self
            .note
            .event(EventName::StageExited)
            .with_static("verdict", result.verdict.as_str())
            .with("capHit", result.cap_hit)
            .with("attemptCount", result.attempt_count)
            .with("usage", result.usage);
        if let Some(r) = &result.reason {
            event = event.with("reason", r.as_str());
        }
        let next = self
            .note
            .bus
            .has_observers()
            .then(|| next_of(&self.pipeline, &self.stage, &result).describe());
        let result = match self.exec.slot {
            Slot::Unit(_) if self.pack => Kept::packed(
                result,
                Arc::clone(&self.exec.stage),
                Arc::clone(&self.exec.id),
            ),
            Slot::Unit(_) | Slot::Sequential | Slot::Join => Kept::Whole(result),
        };
        ExitRecorder {
            event,
            result,
            exec: self.exec.clone(),
            run_id: Arc::clone(&self.note.run_id),
            stage_id: Arc::clone(&self.note.stage_id),
            bus: self.note.bus.clone(),
            scheduler: Arc::clone(&self.scheduler),
            next,
        }
    }

    fn exit_record(&self, result: &Kept) -> ExitRecord {
        ExitRecord {
            run_id: Arc::clone(&self.note.run_id),
            stage_execution_id: Arc::clone(&self.exec.id),
            stage_id: Arc::clone(&self.note.stage_id),
            index: self.index,
            visit: self.visit,
            result: result.clone(),
            entered_at: self.entered_at,
            exited_at: SystemTime::now(),
        }
    }

    /// Records `StageCancelled` once (see [`Note::record_cancelled`]). The
    /// store's record of it is sent with the teardown
    /// ([`StageActor::store_cancelled`]): after a fail-fast every sibling
    /// records first, and this is the part each one waits behind.
    fn record_cancelled(&self) {
        self.note.record_cancelled();
    }

    /// Sends the store the record of a cancellation recorded earlier
    /// (best effort, as every cancellation record; once).
    fn store_cancelled(&self) {
        let (Some(ledger), Some(recorded)) = (&self.ledger, self.note.take_recorded()) else {
            return;
        };
        let whereabouts = self.note.whereabouts.borrow();
        ledger.cancelled(CancelRecord {
            run_id: Arc::clone(&self.note.run_id),
            stage_execution_id: Arc::clone(&self.exec.id),
            stage_id: Arc::clone(&self.note.stage_id),
            index: self.index,
            visit: self.visit,
            reason: recorded.reason,
            phase: whereabouts.phase,
            attempt: whereabouts.attempt,
            turn: whereabouts.turn,
            tool_calls: FieldValue::calls_json(&whereabouts.tool_calls),
            usage: whereabouts.usage,
            entered_at: self.entered_at,
            cancelled_at: recorded.at,
        });
    }

    /// The report of a cancelled execution, with what it had used.
    fn cancelled(&self) -> StageOutcome {
        StageOutcome::Cancelled {
            usage: self.note.whereabouts.borrow().usage,
        }
    }

    /// A panic in the phases: the stage fails with a typed reason.
    fn panicked(&self, message: String) -> Arc<StageResult> {
        let whereabouts = self.note.whereabouts.borrow();
        Arc::new(StageResult {
            stage_id: self.exec.stage.to_string(),
            stage_execution_id: self.exec.id.to_string(),
            verdict: Verdict::Fail,
            reason: Some(format!("ExtensionHost/ActorPanicked: {message}")),
            parsed: Arc::new(Value::Null),
            output: Arc::new(Value::Null),
            cap_hit: false,
            attempt_count: whereabouts.attempt,
            usage: whereabouts.usage,
        })
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic with a non-string payload".to_owned())
}

impl Actor for StageActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.begin(ctx);
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Whatever is still running belongs to a cancelled execution, and
        // no one is to be asked about its tool calls any more.
        self.note.scope.stop();
        // Only an execution that raised an interaction can have prompts out;
        // skipping the others keeps a 10 000-sibling cancel off the hub.
        if let Some(hub) = self
            .hub
            .as_ref()
            .filter(|_| self.note.whereabouts.borrow().raised)
        {
            hub.do_send(WithdrawOwner {
                stage_execution_id: self.exec.id.to_string(),
            });
        }
        // Reported, or its exit handed to the ledger (which records and
        // reports it once stored; if the process ends first, the store
        // knows whether it was, and a resumed run repairs the log).
        if self.reported {
            return;
        }
        if self.started {
            // Usually recorded already, when the token fired; not when the
            // actor was stopped from outside (the system shutting down).
            self.record_cancelled();
            self.store_cancelled();
            self.send_report(self.cancelled());
        } else {
            self.send_report(StageOutcome::CancelledBeforeStart);
        }
    }
}

impl Drop for StageActor {
    /// Last line of defence: an actor dropped without reporting (a panic in
    /// one of its handlers) still reports, so the run never hangs.
    fn drop(&mut self) {
        if self.reported {
            return;
        }
        // Dropped between its cancellation record and its teardown (the
        // system shutting down meanwhile): it ended cancelled, and its
        // record must not be followed by an Exit.
        if self.note.cancel_recorded() {
            self.store_cancelled();
            self.send_report(self.cancelled());
            return;
        }
        self.note.scope.stop();
        self.note.exiting();
        // A failure: recorded at once (a resumed run runs it again).
        let result = self.panicked("the stage actor ended without reporting".to_owned());
        let recorder = self.recorder(result);
        if let Some(ledger) = &self.ledger {
            ledger.persist(self.exit_record(&recorder.result), None);
        }
        self.reported = true;
        recorder.record();
    }
}

/// Records an execution's exit: `StageExited`, the observer markers that
/// follow it, the report. It runs on the stage actor, or on the ledger's
/// thread once the result is stored.
struct ExitRecorder {
    /// `StageExited`, moved into the bus, not copied: this runs on the
    /// store's answering thread, once per sibling.
    event: Event,
    result: Kept,
    exec: ExecKey,
    run_id: Arc<str>,
    stage_id: Arc<str>,
    bus: EventBus<Event>,
    scheduler: Arc<Recipient<ToScheduler>>,
    /// The Next decision as the `Next` marker describes it, when someone
    /// observes.
    next: Option<Value>,
}

impl ExitRecorder {
    fn marker(&self, name: EventName, phase: &'static str) -> Event {
        Event::new(name, Arc::clone(&self.run_id))
            .stage(Arc::clone(&self.stage_id), Arc::clone(&self.exec.id))
            .with_static("phase", phase)
    }

    /// Publishes `StageExited` and reports the execution.
    fn record(self) {
        let markers = self.next.as_ref().map(|next| {
            [
                self.marker(EventName::StagePostFired, "Exit"),
                self.marker(EventName::StagePreFired, "Next"),
                self.marker(EventName::StagePostFired, "Next")
                    .with("next", next.clone()),
            ]
        });
        let seq = self.bus.publish(self.event).unwrap_or(0);
        for marker in markers.into_iter().flatten() {
            self.bus.publish(marker);
        }
        // Gathered with the batch's other reports when this runs on the
        // store's answering thread (`scheduler::post`).
        post(
            &self.scheduler,
            ToScheduler::Report {
                exec: self.exec,
                outcome: StageOutcome::Exited {
                    result: self.result,
                    seq,
                },
            },
        );
    }

    /// The result could not be made durable, so it is not recorded as
    /// exited (a resumed run runs the execution again): it ends cancelled,
    /// and the run is stopped with the store's error — the limit first, so
    /// the scheduler reads it before the report.
    fn not_stored(self, error: &LedgerError) {
        let reason = format!("Store/WriteFailed: the result could not be stored: {error}");
        self.bus.publish(
            Event::new(EventName::StageCancelled, Arc::clone(&self.run_id))
                .stage(Arc::clone(&self.stage_id), Arc::clone(&self.exec.id))
                .with("reason", reason.as_str())
                .with_static("phase", "Exit")
                .with("attempt", self.result.attempt_count())
                .with("turn", 0u32)
                .with("toolCalls", Vec::<Value>::new())
                .with("usage", self.result.usage()),
        );
        post(&self.scheduler, ToScheduler::LimitReached { reason });
        post(
            &self.scheduler,
            ToScheduler::Report {
                exec: self.exec,
                outcome: StageOutcome::Cancelled {
                    usage: self.result.usage(),
                },
            },
        );
    }
}
