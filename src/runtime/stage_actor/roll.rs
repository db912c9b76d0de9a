//! The roll: the siblings started on this thread, by the scope their
//! cancel comes through, so that a fail-fast records their
//! `StageCancelled` in one pass instead of one wake-up each.
//!
//! A group's cancel wakes each of its executions, and each recorded its
//! own cancellation when its actor was next polled: on a busy arbiter,
//! behind everything already queued there. With thousands of model answers
//! just in, the last record came tens of milliseconds after the failure
//! (BENCHMARKS.md, "Every core, eighth round"). So each started
//! sibling enrols a [`Note`] under its parent scope (its arbiter's relay,
//! or the group itself when the run has one thread), and whoever sees that
//! scope cancelled on this thread records every enrolled execution at
//! once: the relay's task once it has forwarded the cancel, and a failed
//! sibling right after its own `StageExited`. The actors, woken as before,
//! find their record made and only tear down.
//!
//! A record made here is the one the actor would make, and it is made
//! once: a [`Note`] is open until its execution exits (then nobody
//! records it cancelled) or is recorded cancelled (then it never exits:
//! the stage actor never polls an execution whose scope is cancelled,
//! by its marks or its token, and a roll records only executions whose
//! scope is). Both happen on the execution's own thread, so nothing
//! races. What the store keeps of the cancellation (sent with the
//! teardown, later) is taken from the record, so the two agree.

use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::SystemTime;

use troupe_actors::EventBus;

use crate::runtime::cancel::{CancelScope, ScopeKey, TURN_CANCELLED};
use crate::runtime::events::{Event, EventName, FieldValue};
use crate::runtime::scheduler::FastMap;
use crate::runtime::stage::Whereabouts;

/// Where an execution stands, as far as recording its end goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    Open,
    /// `StageCancelled` is recorded (the teardown may still be pending).
    Cancelled,
    /// Its exit is recorded or on its way: never to be recorded cancelled.
    Exited,
}

/// What the store's record of a cancellation takes from its record: the
/// reason may change later (a run cancelled, then its group by a failing
/// sibling), where the execution stood may not (it is never polled again).
pub(super) struct Recorded {
    pub at: SystemTime,
    pub reason: Arc<str>,
}

/// What recording an execution's cancellation needs, shared by its actor
/// and its thread's roll.
pub(super) struct Note {
    end: Cell<End>,
    /// The recorded cancellation, while the store's record of it is still
    /// to be sent (with the teardown); kept only with a store.
    recorded: RefCell<Option<Recorded>>,
    timed: bool,
    pub(super) whereabouts: Rc<RefCell<Whereabouts>>,
    pub(super) bus: EventBus<Event>,
    /// The ids its events carry: the execution's own copies (`EventIds`).
    pub(super) run_id: Arc<str>,
    pub(super) stage_id: Arc<str>,
    pub(super) exec_id: Arc<str>,
    /// The execution's own scope in the cancellation tree.
    pub(super) scope: CancelScope,
}

impl Note {
    pub(super) fn new(
        bus: EventBus<Event>,
        ids: [Arc<str>; 3],
        scope: CancelScope,
        timed: bool,
    ) -> Note {
        let [run_id, stage_id, exec_id] = ids;
        Note {
            end: Cell::new(End::Open),
            recorded: RefCell::new(None),
            timed,
            whereabouts: Rc::default(),
            bus,
            run_id,
            stage_id,
            exec_id,
            scope,
        }
    }

    pub(super) fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.run_id))
            .stage(Arc::clone(&self.stage_id), Arc::clone(&self.exec_id))
    }

    /// Whether `StageCancelled` is recorded.
    pub(super) fn cancel_recorded(&self) -> bool {
        self.end.get() == End::Cancelled
    }

    /// The execution exits: from now on nobody records it cancelled.
    pub(super) fn exiting(&self) {
        if self.end.get() == End::Open {
            self.end.set(End::Exited);
        }
    }

    /// The recorded cancellation, once (for the store's record).
    pub(super) fn take_recorded(&self) -> Option<Recorded> {
        self.recorded.take()
    }

    /// Records `StageCancelled` (and `ToolInvocationCancelled` for each call
    /// in flight) once, with the phase, attempt and turn it was in; nothing
    /// for an execution that exits.
    pub(super) fn record_cancelled(&self) {
        let mut events = Vec::new();
        self.cancelled_events(&mut events);
        self.bus.publish_all(&mut events);
    }

    /// What [`Note::record_cancelled`] publishes, pushed onto `events` for
    /// the caller to publish (before anything else is published on this
    /// thread); marks the cancellation recorded.
    fn cancelled_events(&self, events: &mut Vec<Event>) {
        if self.end.get() != End::Open {
            return;
        }
        self.end.set(End::Cancelled);
        let whereabouts = self.whereabouts.borrow();
        let reason = self.scope.reason();
        if self.timed {
            *self.recorded.borrow_mut() = Some(Recorded {
                at: SystemTime::now(),
                reason: reason.clone().unwrap_or_else(|| Arc::from(TURN_CANCELLED)),
            });
        }
        let reason = match reason {
            Some(reason) => FieldValue::Shared(reason),
            None => FieldValue::Static(TURN_CANCELLED),
        };
        for (id, name) in &whereabouts.tool_calls {
            events.push(
                crate::runtime::stage::tool_named(
                    self.event(EventName::ToolInvocationCancelled),
                    name,
                )
                .with("callId", Arc::clone(id)),
            );
        }
        if whereabouts.question {
            events.push(
                self.event(EventName::InteractionAnswered)
                    .with_static("kind", "question")
                    .with_static("outcome", "withdrawn"),
            );
        }
        events.push(
            self.event(EventName::StageCancelled)
                .with("reason", reason)
                .with_static("phase", whereabouts.phase)
                .with("attempt", whereabouts.attempt)
                .with("turn", whereabouts.turn)
                .with("toolCalls", FieldValue::calls(&whereabouts.tool_calls))
                .with("usage", whereabouts.usage),
        );
    }
}

/// The executions enrolled under one scope on this thread. Entries of
/// executions that have ended are dropped when the list has doubled since
/// the last sweep, so it follows the cap, not the width.
#[derive(Default)]
struct Roll {
    notes: Vec<Weak<Note>>,
    sweep_at: usize,
}

const FIRST_SWEEP: usize = 64;

thread_local! {
    /// By [`CancelScope::id`]: each roll keeps its scope's key, so no
    /// other scope can take the id while the roll is here.
    static ROLLS: RefCell<FastMap<usize, (ScopeKey, Roll)>> = RefCell::default();
}

/// Enrols a started execution under its parent scope on this thread.
pub(super) fn enrol(note: &Rc<Note>) {
    let Some(parent) = note.scope.parent() else {
        return;
    };
    let _ = ROLLS.try_with(|rolls| {
        let mut rolls = rolls.borrow_mut();
        let (_, roll) = match rolls.get_mut(&parent.id()) {
            Some(roll) => roll,
            None => {
                // A new scope: drop the lists of scopes gone meanwhile
                // (one per group or relay, so this is rare and short).
                rolls.retain(|_, (key, _)| key.is_live());
                rolls
                    .entry(parent.id())
                    .or_insert_with(|| (parent.key(), Roll::default()))
            }
        };
        if roll.notes.len() >= roll.sweep_at.max(FIRST_SWEEP) {
            roll.notes.retain(|n| n.strong_count() > 0);
            roll.sweep_at = roll.notes.len() * 2;
        }
        roll.notes.push(Rc::downgrade(note));
    });
}

/// Records the cancellation of every execution enrolled under the scope
/// on this thread that has not ended, and forgets them; nothing while the
/// scope is not cancelled.
pub fn record_under(scope: &ScopeKey) {
    if !scope.is_live() {
        return forget(scope);
    }
    if !scope.is_cancelled() {
        return;
    }
    let Some(roll) = take(scope) else {
        return;
    };
    // Published a batch at a time: one at a time, each publish handed the
    // audit log a parcel of one event (and as often as not woke its
    // thread), and with one thread 10 000 cancellations took 14 ms on 16
    // cores (BENCHMARKS.md, "Every core, twenty-ninth round").
    let mut events = Vec::with_capacity(RECORD_BATCH);
    let mut on: Option<EventBus<Event>> = None;
    for note in roll.notes.iter().filter_map(Weak::upgrade) {
        if !note.scope.is_cancelled() {
            continue;
        }
        // Every execution of a run publishes on its one bus; a roll that
        // held two would publish each one's batch on its own.
        if let Some(bus) = on.as_ref().filter(|bus| !bus.same(&note.bus)) {
            bus.publish_all(&mut events);
        }
        if !on.as_ref().is_some_and(|bus| bus.same(&note.bus)) {
            on = Some(note.bus.clone());
        }
        note.cancelled_events(&mut events);
        if events.len() >= RECORD_BATCH
            && let Some(bus) = &on
        {
            bus.publish_all(&mut events);
        }
    }
    if let Some(bus) = &on {
        bus.publish_all(&mut events);
    }
}

/// Events a roll publishes together: a parcel's worth for the audit log.
const RECORD_BATCH: usize = 256;

/// Forgets the executions enrolled under a scope that has gone.
pub fn forget(key: &ScopeKey) {
    drop(take(key));
}

fn take(key: &ScopeKey) -> Option<Roll> {
    // Out of the map before anything is recorded: publishing must not
    // find the map borrowed.
    ROLLS
        .try_with(|rolls| rolls.borrow_mut().remove(&key.id()))
        .ok()
        .flatten()
        .map(|(_, roll)| roll)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn note(bus: &EventBus<Event>, scope: CancelScope, n: usize) -> Rc<Note> {
        let id = |s: String| Arc::<str>::from(s);
        Rc::new(Note::new(
            bus.clone(),
            [id("run".into()), id("w".into()), id(format!("run/w#{n}/1"))],
            scope,
            false,
        ))
    }

    fn cancelled_ids(rx: &troupe_actors::Subscription<Event>) -> Vec<String> {
        std::iter::from_fn(|| rx.try_recv())
            .filter_map(|d| match d {
                troupe_actors::Delivery::Event(env) => Some(env.event),
                troupe_actors::Delivery::Lagged { .. } => None,
            })
            .filter(|e| e.name == EventName::StageCancelled)
            .map(|e| e.stage_execution_id.as_deref().unwrap_or("").to_owned())
            .collect()
    }

    #[test]
    fn a_cancelled_scope_records_each_open_execution_under_it_once() {
        let bus = EventBus::new();
        let rx = bus.subscribe_audit("test", 1 << 10);
        let group = CancelScope::root();
        let other = CancelScope::root();
        let notes: Vec<_> = (0..3).map(|n| note(&bus, group.child(), n)).collect();
        let elsewhere = note(&bus, other.child(), 9);
        for n in notes.iter().chain([&elsewhere]) {
            enrol(n);
        }
        notes[1].exiting();
        record_under(&group.key());
        assert!(cancelled_ids(&rx).is_empty(), "not cancelled: nothing");
        group.cancel("sibling failed");
        // Its actor was polled first and recorded it.
        notes[0].record_cancelled();
        assert_eq!(cancelled_ids(&rx), ["run/w#0/1"]);
        record_under(&group.key());
        assert_eq!(cancelled_ids(&rx), ["run/w#2/1"], "each once, none exited");
        notes[2].record_cancelled();
        assert!(cancelled_ids(&rx).is_empty(), "the actor finds it recorded");
        assert!(notes[0].cancel_recorded() && !notes[1].cancel_recorded());
        assert!(!elsewhere.cancel_recorded(), "another scope's roll");
        other.cancel("x");
        forget(&other.key());
        record_under(&other.key());
        assert!(
            cancelled_ids(&rx).is_empty(),
            "a forgotten roll records nothing"
        );
    }

    #[test]
    fn a_roll_records_in_batches_in_its_order_each_on_its_own_bus() {
        let (bus, other_bus) = (EventBus::new(), EventBus::new());
        let (rx, other_rx) = (
            bus.subscribe_audit("test", 1 << 12),
            other_bus.subscribe_audit("test", 1 << 12),
        );
        let group = CancelScope::root();
        // More than a batch, with an execution of another bus among them
        // (a roll holds one run's, but nothing here assumes it).
        let width = 2 * RECORD_BATCH + 7;
        let notes: Vec<_> = (0..width)
            .map(|n| {
                let on = if n == RECORD_BATCH / 2 {
                    &other_bus
                } else {
                    &bus
                };
                note(on, group.child(), n)
            })
            .collect();
        for n in &notes {
            enrol(n);
        }
        notes[3].exiting();
        group.cancel("sibling failed");
        record_under(&group.key());
        let expected: Vec<String> = (0..width)
            .filter(|n| *n != 3 && *n != RECORD_BATCH / 2)
            .map(|n| format!("run/w#{n}/1"))
            .collect();
        assert_eq!(cancelled_ids(&rx), expected);
        assert_eq!(
            cancelled_ids(&other_rx),
            [format!("run/w#{}/1", RECORD_BATCH / 2)]
        );
        assert!(
            notes
                .iter()
                .enumerate()
                .all(|(n, note)| note.cancel_recorded() == (n != 3))
        );
    }

    #[test]
    fn ended_executions_leave_the_roll() {
        let bus = EventBus::new();
        let group = CancelScope::root();
        let live: Vec<_> = (0..10).map(|n| note(&bus, group.child(), n)).collect();
        for n in 0..10_000 {
            enrol(&note(&bus, group.child(), n));
        }
        for n in &live {
            enrol(n);
        }
        let held = ROLLS.with_borrow(|r| r[&group.id()].1.notes.len());
        assert!(
            held <= 2 * FIRST_SWEEP,
            "{held} entries for 10 live executions"
        );
    }
}
