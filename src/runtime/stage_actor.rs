//! The stage-execution actor: one per stage execution, siblings included.
//! It asks the scheduler before starting (siblings only), runs the phases,
//! reports once, and on strict cancellation drops the in-flight work and
//! records `StageCancelled` with the turn and tool calls it was in. A panic
//! in the phases becomes the stage's `ExtensionHost/ActorPanicked` failure.

use std::cell::RefCell;
use std::panic::AssertUnwindSafe;
use std::rc::Rc;
use std::sync::Arc;

use actix::prelude::*;
use futures::FutureExt;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use troupe_actors::EventBus;

use super::cancel::{CancelScope, TURN_CANCELLED};
use super::events::{Event, EventName, FieldValue};
use super::interaction::{InteractionHub, WithdrawOwner};
use super::planner::{sibling_failed_reason, sibling_label};
use super::result::{StageResult, Usage, Verdict};
use super::stage::{Exited, NextDecision, Progress, StageRun};

/// How an execution ended, as reported to the scheduler.
#[derive(Debug)]
pub enum StageOutcome {
    /// Exit ran (verdict ok, fail or skipped).
    Exited(Exited),
    /// Strictly cancelled after it started: no Exit. `usage` is what its
    /// model requests had used by then.
    Cancelled { usage: Usage },
    /// Never started: the start request was refused or dropped.
    Withdrawn,
    /// Granted a start, but cancelled (fail-fast tripped, Ctrl-C) before it
    /// began: it never started, yet the planner had counted it running.
    CancelledBeforeStart,
}

/// Sent once by every stage actor when it ends.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StageReport {
    /// The unit index inside a parallel group, `None` for sequential/join.
    pub unit: Option<usize>,
    pub stage_id: Arc<str>,
    pub outcome: StageOutcome,
}

/// A sibling's request to start; the scheduler answers on `reply` or drops it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct StartRequest {
    pub unit: usize,
    pub reply: oneshot::Sender<()>,
}

/// Runs one stage execution.
pub struct StageActor {
    run: Option<StageRun>,
    unit: Option<usize>,
    /// For siblings: where to ask for permission to start.
    start_gate: Option<Arc<Recipient<StartRequest>>>,
    report: Arc<Recipient<StageReport>>,
    progress: Rc<RefCell<Progress>>,
    bus: EventBus<Event>,
    stage_id: Arc<str>,
    execution_id: Arc<str>,
    run_id: Arc<str>,
    /// The execution's own scope in the cancellation tree.
    scope: CancelScope,
    hub: Option<Arc<Addr<InteractionHub>>>,
    /// For siblings: the group's scope, which a failed sibling cancels so
    /// the others stop at once (the scheduler still decides the failure).
    group: Option<CancelScope>,
    /// For siblings: the index of a map sibling.
    index: Option<usize>,
    started: bool,
    /// `StageCancelled` is recorded (the teardown may still be pending).
    cancel_recorded: bool,
    reported: bool,
}

impl std::fmt::Debug for StageActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StageActor")
            .field("execution_id", &self.execution_id)
            .field("started", &self.started)
            .finish()
    }
}

impl StageActor {
    pub fn new(
        run: StageRun,
        unit: Option<usize>,
        start_gate: Option<Arc<Recipient<StartRequest>>>,
        report: Arc<Recipient<StageReport>>,
        scope: CancelScope,
        group: Option<CancelScope>,
    ) -> StageActor {
        StageActor {
            unit,
            group,
            scope,
            index: run.index,
            start_gate,
            report,
            progress: Rc::default(),
            bus: run.bus.clone(),
            stage_id: Arc::clone(&run.ctx.stage_id),
            execution_id: Arc::clone(&run.ctx.stage_execution_id),
            run_id: Arc::clone(&run.ctx.workflow_run_id),
            hub: run.hub.clone(),
            started: false,
            cancel_recorded: false,
            reported: false,
            run: Some(run),
        }
    }

    fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.run_id))
            .stage(Arc::clone(&self.stage_id), Arc::clone(&self.execution_id))
    }

    fn send_report(&mut self, outcome: StageOutcome) {
        if self.reported {
            return;
        }
        self.reported = true;
        self.report.do_send(StageReport {
            unit: self.unit,
            stage_id: Arc::clone(&self.stage_id),
            outcome,
        });
    }

    fn begin(&mut self, ctx: &mut Context<Self>) {
        let Some(run) = self.run.take() else { return };
        // Granted before the scheduler read the failure (or the Ctrl-C) that
        // has cancelled it since: it never starts, and nothing is logged.
        if self.scope.is_cancelled() {
            self.send_report(StageOutcome::CancelledBeforeStart);
            ctx.stop();
            return;
        }
        // Entered and started together: a cancel from here on is recorded
        // as StageCancelled of an execution the log shows as entered.
        run.enter();
        self.started = true;
        let progress = Rc::clone(&self.progress);
        let token = self.scope.token().clone();
        // Boxed so that a cancelled execution can be handed back alive and
        // dropped later (below), and so the wrappers around it move a
        // pointer, not the whole state machine.
        let mut execute = Box::pin(AssertUnwindSafe(run.execute(progress)).catch_unwind());
        // The token is checked first on every poll: once it is cancelled the
        // execution is never polled again, wherever it waits, and Exit never
        // runs. Exit itself has no await, so an execution that reached it
        // completes in the same poll and is never reported as both.
        let race = async move {
            let cancelled = token.cancelled_owned();
            let finished = {
                let mut cancelled = std::pin::pin!(cancelled);
                tokio::select! {
                    biased;
                    () = &mut cancelled => None,
                    result = &mut execute => Some(result),
                }
            };
            finished.ok_or(execute)
        };
        ctx.spawn(race.into_actor(self).map(|raced, act, ctx| match raced {
            Ok(result) => {
                let exited = match result {
                    Ok(exited) => exited,
                    Err(panic) => act.panicked(panic_message(&*panic)),
                };
                act.report_exited(exited);
                ctx.stop();
            }
            Err(execution) => {
                // Strictly cancelled through the token tree. Record it now,
                // then let every other execution woken by the same cancel
                // record its own before this one is torn down: dropping
                // what it held (transcript, request, tool call) and
                // stopping the actor cost more than the record, and done
                // inline they would delay the last sibling's record by
                // the teardown of all the others (BENCHMARKS.md). The
                // execution is never polled again either way.
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

    /// Records `StageCancelled` (and `ToolInvocationCancelled` for each call
    /// in flight) once, with the phase, attempt and turn it was in.
    fn record_cancelled(&mut self) {
        if std::mem::replace(&mut self.cancel_recorded, true) {
            return;
        }
        let progress = self.progress.borrow();
        let reason = match self.scope.reason() {
            Some(reason) => FieldValue::Shared(reason),
            None => FieldValue::Static(TURN_CANCELLED),
        };
        let mut calls = Vec::with_capacity(progress.tool_calls.len());
        for (id, name) in &progress.tool_calls {
            self.bus.publish(
                self.event(EventName::ToolInvocationCancelled)
                    .tool(Arc::clone(name))
                    .with("callId", Arc::clone(id)),
            );
            calls.push(json!({"callId": &**id, "tool": &**name}));
        }
        self.bus.publish(
            self.event(EventName::StageCancelled)
                .with("reason", reason)
                .with_static("phase", progress.phase)
                .with("attempt", progress.attempt)
                .with("turn", progress.turn)
                .with("toolCalls", calls)
                .with("usage", progress.usage),
        );
    }

    /// Reports a completed execution; a failed sibling first trips its
    /// group's fail-fast, so its siblings stop before the report is read.
    fn report_exited(&mut self, exited: Exited) {
        if exited.result.verdict == Verdict::Fail
            && let Some(group) = &self.group
        {
            group.cancel(sibling_failed_reason(&sibling_label(
                &self.stage_id,
                self.index,
            )));
        }
        self.send_report(StageOutcome::Exited(exited));
    }

    /// The report of a cancelled execution, with what it had used.
    fn cancelled(&self) -> StageOutcome {
        StageOutcome::Cancelled {
            usage: self.progress.borrow().usage,
        }
    }

    /// A panic in the phases: the stage fails with a typed reason; Exit is
    /// recorded so the run's record stays complete.
    fn panicked(&self, message: String) -> Exited {
        let reason = format!("ExtensionHost/ActorPanicked: {message}");
        self.bus.publish(
            self.event(EventName::StageExited)
                .with("verdict", "fail")
                .with("reason", reason.as_str())
                .with("capHit", false)
                .with("attemptCount", self.progress.borrow().attempt),
        );
        Exited {
            result: Arc::new(StageResult {
                stage_id: self.stage_id.to_string(),
                stage_execution_id: self.execution_id.to_string(),
                verdict: Verdict::Fail,
                reason: Some(reason),
                parsed: Arc::new(Value::Null),
                output: Arc::new(Value::Null),
                cap_hit: false,
                attempt_count: self.progress.borrow().attempt,
                usage: Usage::default(),
            }),
            next: NextDecision::End,
        }
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
        match (self.start_gate.take(), self.unit) {
            (Some(gate), Some(unit)) => {
                let (tx, rx) = oneshot::channel();
                gate.do_send(StartRequest { unit, reply: tx });
                ctx.spawn(rx.into_actor(self).map(|granted, act, ctx| match granted {
                    Ok(()) => act.begin(ctx),
                    Err(_) => {
                        act.send_report(StageOutcome::Withdrawn);
                        ctx.stop();
                    }
                }));
            }
            _ => self.begin(ctx),
        }
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        // Whatever is still running belongs to a cancelled execution, and
        // no one is to be asked about its tool calls any more.
        self.scope.token().cancel();
        // Only an execution that raised an interaction can have prompts out;
        // skipping the others keeps a 10 000-sibling cancel off the hub.
        if let Some(hub) = self.hub.as_ref().filter(|_| self.progress.borrow().raised) {
            hub.do_send(WithdrawOwner {
                stage_execution_id: self.execution_id.to_string(),
            });
        }
        if self.reported {
            return;
        }
        if self.started {
            // Usually recorded already, when the token fired; not when the
            // actor was stopped from outside (the system shutting down).
            self.record_cancelled();
            self.send_report(self.cancelled());
        } else {
            self.send_report(StageOutcome::Withdrawn);
        }
    }
}

impl Drop for StageActor {
    /// Last line of defence: an actor dropped without reporting (a panic in
    /// one of its handlers) still reports, so the run never hangs.
    fn drop(&mut self) {
        // Dropped between its cancellation record and its teardown (the
        // system shutting down in that turn): it ended cancelled, and its
        // record must not be followed by an Exit.
        if !self.reported && self.cancel_recorded {
            self.send_report(self.cancelled());
            return;
        }
        if !self.reported {
            self.scope.token().cancel();
            let exited = self.panicked("the stage actor ended without reporting".to_owned());
            self.report_exited(exited);
        }
    }
}
