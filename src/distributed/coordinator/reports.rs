//! The coordinator's reading of its run's reports: a message's reports
//! settled one by one, each acknowledged message only once all of them
//! are, exited siblings' results stored before their events are relayed
//! and the scheduler told.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use super::super::arrived::{cancel_record, exit_record};
use super::super::groups::Unit;
use super::super::wire::{EventLine, Report};
use super::{Cmd, Coordinator, Incoming};
use crate::runtime::events::{Event, EventName};
use crate::runtime::result::{Kept, Usage, Verdict};
use crate::runtime::scheduler::post::post;
use crate::runtime::scheduler::{ExecKey, FastMap, StageOutcome, ToScheduler};
use actix::Recipient;
use async_nats::jetstream::message::Acker;
use troupe_actors::EventBus;

/// A report message's acknowledgement, sent once every report in it is
/// settled: held once while the message is read and once more for each
/// exited sibling in it whose result (its own, or a first copy's) is
/// being committed.
/// (Generic over the acker only for its tests.)
pub(super) struct Settling<A = Acker> {
    left: AtomicUsize,
    acker: Mutex<Option<A>>,
}

impl<A> Settling<A> {
    pub(super) fn new(acker: A) -> Arc<Settling<A>> {
        Arc::new(Settling {
            left: AtomicUsize::new(1),
            acker: Mutex::new(Some(acker)),
        })
    }

    pub(super) fn hold(&self) {
        self.left.fetch_add(1, Ordering::AcqRel);
    }

    /// One hold is over: the acker, when it was the last.
    pub(super) fn settle(&self) -> Option<A> {
        if self.left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return None;
        }
        self.acker.lock().unwrap_or_else(|e| e.into_inner()).take()
    }
}

/// `ExecKey` of a report, from the group's unit.
fn exec_of(units: &FastMap<usize, Unit>, unit: usize) -> Option<ExecKey> {
    units.get(&unit).and_then(|u| u.exec.clone())
}

impl Coordinator {
    /// A message of the run's report subject: a worker's batch of
    /// reports, or the coordinator's own barrier. It is acknowledged once
    /// every report in it is settled (an exited sibling's, once its result
    /// is committed), so a coordinator killed in between reads it again.
    pub(super) async fn reports(&mut self, mut message: Incoming<Acker>) {
        // Decoded on another arbiter (see `decoding`).
        let decoded = message.reports().await;
        let ack = Settling::new(message.acker);
        for report in decoded {
            match report {
                Ok(report) => self.report(report, &ack),
                // Not a report this troupe knows: nothing to do with it.
                Err(e) => say!(
                    "warning: run {}: a worker's report could not be read and was skipped: {e}",
                    self.spec.run_id
                ),
            }
        }
        self.settled(&ack).await;
    }

    /// Acknowledges a message whose last report was just settled.
    pub(super) async fn settled(&self, ack: &Settling) {
        if let Some(acker) = ack.settle() {
            let _ = acker.ack().await;
        }
    }

    fn report(&mut self, report: Report, ack: &Arc<Settling>) {
        if let Report::Barrier { turn } = report {
            self.barrier(turn);
            return;
        }
        let Some((id, turn, unit)) = report.execution() else {
            return;
        };
        let known = self
            .groups
            .get(&turn)
            .and_then(|g| exec_of(&g.units, unit))
            .filter(|e| &*e.id == id);
        let resolved = self.resolved.contains(id);
        match report {
            Report::Accepted { .. } => {
                if let Some(u) = self
                    .groups
                    .get_mut(&turn)
                    .and_then(|g| g.units.get_mut(&unit))
                {
                    u.accepted = true;
                }
            }
            Report::Exited {
                stage_execution_id,
                result,
                events,
                delivered,
                worker,
                ..
            } => {
                if resolved {
                    // Another copy (a report delivered again, its message
                    // held past the ack wait by a slow store): acknowledged
                    // with the first one's commit, not before it.
                    if let Some(waiting) = self.committing.get_mut(&stage_execution_id) {
                        ack.hold();
                        waiting.push(Arc::clone(ack));
                    }
                    return;
                }
                let Some(exec) = known else {
                    // A sibling of another session (before a resume): store
                    // it all the same, a resumed run will find it; unless
                    // this one found it stored already (a message of the
                    // killed session's delivered again), so that it and
                    // what it used count once.
                    let stored = self
                        .spec
                        .restored
                        .get(result.stage_execution_id())
                        .is_some_and(|kept| kept.verdict() != Verdict::Fail);
                    if let Some(ledger) = &self.spec.ledger
                        && result.verdict() != Verdict::Fail
                        && !stored
                    {
                        ledger.persist(exit_record(&self.spec.run_id, &result), None);
                    }
                    return;
                };
                self.done(&exec, turn, unit);
                self.charge(result.usage());
                if delivered > 1 {
                    self.spec.bus.publish(
                        Event::new(EventName::SiblingRedelivered, self.spec.run_id.as_str())
                            .stage(Arc::clone(&exec.stage), Arc::clone(&exec.id))
                            .with("delivered", delivered)
                            .with("worker", worker),
                    );
                }
                match (&self.spec.ledger, result.verdict()) {
                    (Some(ledger), Verdict::Ok | Verdict::Skipped) => {
                        let tx = self.tx.clone();
                        let scheduler = self.scheduler.clone();
                        let bus = self.spec.bus.clone();
                        let stored = result.clone();
                        // This message and any copy delivered meanwhile
                        // are settled once the commit is done.
                        ack.hold();
                        self.committing
                            .insert(stage_execution_id, vec![Arc::clone(ack)]);
                        ledger.persist(
                            exit_record(&self.spec.run_id, &result),
                            Some(Box::new(move |outcome| {
                                // A result that could not be stored is not
                                // recorded (nor its message acknowledged):
                                // the run stops with the store's error and
                                // a resume runs it again.
                                if let Err(e) = outcome {
                                    let _ = tx.send(Cmd::Committed(Arc::clone(&exec.id), false));
                                    post(
                                        &scheduler,
                                        ToScheduler::LimitReached {
                                            reason: format!(
                                                "Store/WriteFailed: the result could not be stored: {e}"
                                            ),
                                        },
                                    );
                                    post(
                                        &scheduler,
                                        ToScheduler::Report {
                                            exec,
                                            outcome: StageOutcome::Cancelled {
                                                usage: stored.usage(),
                                            },
                                        },
                                    );
                                    return;
                                }
                                // Recorded here, on the store's answering
                                // thread, as a local sibling's exit is:
                                // relaying a sibling's events was the
                                // largest part left of what it cost the
                                // loop. The loop then settles the message.
                                let id = Arc::clone(&exec.id);
                                record_exit(&bus, &scheduler, exec, stored, events);
                                let _ = tx.send(Cmd::Committed(id, true));
                            })),
                        );
                    }
                    (ledger, _) => {
                        if let Some(ledger) = ledger {
                            ledger.persist(exit_record(&self.spec.run_id, &result), None);
                        }
                        record_exit(&self.spec.bus, &self.scheduler, exec, result, events);
                    }
                }
            }
            Report::Cancelled { usage, events, .. } => {
                if let Some(exec) = known.filter(|_| !resolved) {
                    self.done(&exec, turn, unit);
                    self.charge(usage);
                    let mut events: Vec<Event> = events
                        .into_iter()
                        .filter_map(EventLine::into_event)
                        .collect();
                    // Stored as a local cancellation is (best effort).
                    if let Some(ledger) = &self.spec.ledger
                        && let Some(record) =
                            cancel_record(&self.spec.run_id, &exec.id, &events, usage)
                    {
                        ledger.cancelled(record);
                    }
                    let _ = self.spec.bus.publish_all(&mut events);
                    self.scheduler.do_send(ToScheduler::Report {
                        exec,
                        outcome: StageOutcome::Cancelled { usage },
                    });
                }
            }
            Report::NotStarted { .. } => {
                if let Some(exec) = known.filter(|_| !resolved) {
                    self.done(&exec, turn, unit);
                    self.scheduler.do_send(ToScheduler::Report {
                        exec,
                        outcome: StageOutcome::CancelledBeforeStart,
                    });
                }
            }
            Report::Refused {
                code,
                message,
                worker,
                ..
            } => {
                if let Some(exec) = known.filter(|_| !resolved) {
                    self.fail_unit(exec, format!("{code}: worker {worker}: {message}"));
                }
            }
            Report::Barrier { .. } => {}
        }
    }

    /// Counts what a sibling spent on its worker against the run's
    /// budget, before the scheduler hears of the sibling: the scheduler
    /// checks the meter before it handles a report, so a report that
    /// takes the run over its budget stops it like a local one.
    pub(super) fn charge(&self, usage: Usage) {
        if let Some(budget) = &self.spec.budget {
            budget.record(usage);
        }
    }
}

/// Publishes a sibling's events, as its worker made them, on the run's
/// bus, in order and together (one draw of numbers, one hold of the bus:
/// `EventBus::publish_all`); the last one's `seq`, 0 if none was.
fn relay(bus: &EventBus<Event>, events: Vec<EventLine>) -> u64 {
    let mut events: Vec<Event> = events
        .into_iter()
        .filter_map(EventLine::into_event)
        .collect();
    bus.publish_all(&mut events).unwrap_or(0)
}

/// An exited sibling's events into the log, then its report to the
/// scheduler: in that order, so the log shows it exited before anything
/// its report lets start.
fn record_exit(
    bus: &EventBus<Event>,
    scheduler: &Recipient<ToScheduler>,
    exec: ExecKey,
    result: Kept,
    events: Vec<EventLine>,
) {
    let seq = relay(bus, events);
    // On the store's answering thread, gathered with the batch's other
    // reports (`scheduler::post`).
    post(
        scheduler,
        ToScheduler::Report {
            exec,
            outcome: StageOutcome::Exited { result, seq },
        },
    );
}

#[cfg(test)]
mod tests {
    use super::Settling;

    /// A message with two exits, the first stored slowly, and a copy of
    /// the first delivered in a second message meanwhile: neither message
    /// is acknowledged before every commit it waits on is done, and each
    /// exactly once.
    #[test]
    fn a_message_is_acknowledged_once_after_its_last_commit() {
        let first = Settling::new("first");
        let copy = Settling::new("copy");
        // Reading the first message: both exits are being committed.
        first.hold();
        first.hold();
        assert_eq!(first.settle(), None, "read, two commits outstanding");
        // The copy arrives while the slow commit is outstanding: it waits
        // with it (the coordinator's `committing` list).
        copy.hold();
        assert_eq!(copy.settle(), None, "read, its first's commit outstanding");
        // The fast commit.
        assert_eq!(first.settle(), None);
        // The slow commit settles both messages.
        assert_eq!(first.settle(), Some("first"));
        assert_eq!(copy.settle(), Some("copy"));
        // Nothing is acknowledged twice.
        assert_eq!(first.settle(), None);
    }
}
