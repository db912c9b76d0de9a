//! Fan-out core: schedules a group of units under a concurrency cap as a plain synchronous state machine.
//!
//! [`FanOut`] owns the scheduling decisions for one group of `total` units
//! (indices `0..total`): lazy feeding under a cap, the start handshake,
//! fail-fast, escalating cancellation and the join barrier. It has no runtime:
//! the driver feeds it [`FanOutEvent`]s and carries out the [`FanOutCommand`]s it
//! pushes onto an output vector.
//!
//! # Unit lifecycle
//!
//! ```text
//! waiting --Spawn--> spawned --StartRequested/Grant--> running --Finished--> done
//!                       |                                 |
//!                       +--Withdraw (group decided)       +--CancelUnit --Finished (late)--> done
//! ```
//!
//! * A slot is taken at `Spawn` and released when the unit finishes, or when a
//!   spawned-but-never-granted unit is withdrawn. Waiting units are only the
//!   range `next_unspawned..total`; memory is `O(cap)` whatever `total` is.
//! * A spawned unit must send `StartRequested` before doing any work. While the
//!   group is live the answer is `Grant`; once the group is decided (failed,
//!   cancelled) the answer is always `Deny`, so nothing starts after a cancel.
//! * When the group is decided, every running unit gets `CancelUnit` (it started,
//!   so it must be cancelled and will still report `Finished`), and every spawned
//!   but never granted unit gets `Withdraw` (it never started; it is done at once
//!   and its slot is free; if it still asks to start it gets `Deny`).
//!
//! # Errors versus ignored events
//!
//! Legitimate races are accepted, counted and otherwise ignored: `Finished` from
//! a unit that was cancelled or withdrawn ([`FanOut::late_finishes`]),
//! `StartRequested` from a withdrawn unit (answered with `Deny`), a `Cancel`
//! that does not escalate. Protocol violations (unknown unit, unit never spawned,
//! duplicate start, duplicate finish) return a [`FanOutError`]; on error the
//! state is unchanged and nothing is emitted.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, Hasher};

/// Why a group (and its running units) is being cancelled.
///
/// Reasons are ordered by strength and cancellation only escalates: a reason
/// that is not strictly stronger than the current one is ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CancelReason {
    /// Another unit of the same group failed (fail-fast).
    SiblingFailed,
    /// The user or an enclosing scope interrupted the work.
    Interrupted,
    /// The whole process is shutting down.
    Shutdown,
}

/// Monotonic cancellation level: remembers the strongest [`CancelReason`] seen.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Escalation {
    current: Option<CancelReason>,
}

impl Escalation {
    /// A level with no cancellation yet.
    #[must_use]
    pub const fn new() -> Self {
        Self { current: None }
    }

    /// The strongest reason seen so far, if any.
    #[must_use]
    pub const fn current(&self) -> Option<CancelReason> {
        self.current
    }

    /// Whether any cancellation has been recorded.
    #[must_use]
    pub const fn is_cancelled(&self) -> bool {
        self.current.is_some()
    }

    /// Records `reason`; returns `true` only when it is strictly stronger than
    /// the current level (and therefore must be acted upon).
    pub fn raise(&mut self, reason: CancelReason) -> bool {
        if self.current.is_some_and(|current| current >= reason) {
            return false;
        }
        self.current = Some(reason);
        true
    }
}

/// How a unit ended, as reported by the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum UnitOutcome {
    /// The unit completed its work.
    Ok,
    /// The unit decided not to do its work; counts as success for the join.
    Skipped,
    /// The unit failed; while the group is live this fails the group.
    Failed,
    /// The unit stopped on a cancellation the group has not decided: a
    /// sibling cancelled the group's token on its own way out (a
    /// shortcut for speed), and that sibling's own report, which decides
    /// the group, is still on its way. While any such unit is unexplained
    /// the group holds: nothing new is spawned. If every running unit has
    /// reported and no failure explains it, the first such unit fails the
    /// group (its actor ended without an outcome of its own).
    Cancelled,
}

/// Input to [`FanOut::handle`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOutEvent {
    /// A spawned unit asks for permission to start working.
    StartRequested {
        /// Index of the unit.
        unit: usize,
    },
    /// A unit ended (normally, or acknowledging a cancellation).
    Finished {
        /// Index of the unit.
        unit: usize,
        /// How it ended.
        outcome: UnitOutcome,
    },
    /// External cancellation of the whole group (escalates only).
    Cancel {
        /// Why.
        reason: CancelReason,
    },
}

/// Output of [`FanOut::start`] and [`FanOut::handle`], for the driver to carry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FanOutCommand {
    /// Create the unit; a slot is now taken. It must ask before working.
    Spawn {
        /// Index of the unit.
        unit: usize,
    },
    /// Answer to `StartRequested`: the unit may start working.
    Grant {
        /// Index of the unit.
        unit: usize,
    },
    /// Answer to `StartRequested` once the group is decided: the unit must end
    /// without starting (the driver can drop the reply channel).
    Deny {
        /// Index of the unit.
        unit: usize,
    },
    /// A running (granted) unit must be cancelled; it will still report `Finished`.
    CancelUnit {
        /// Index of the unit.
        unit: usize,
        /// Why; re-emitted with a stronger reason on escalation.
        reason: CancelReason,
    },
    /// A spawned but never granted unit is retired: it never started, its slot
    /// is already free and no `Finished` is expected from it.
    Withdraw {
        /// Index of the unit.
        unit: usize,
    },
    /// Every unit finished `Ok` or `Skipped`: the join may run. Emitted at most once.
    AllSucceeded,
    /// The first failure of a live group. Emitted at most once.
    GroupFailed {
        /// The unit whose failure decided the group.
        unit: usize,
    },
    /// External cancellation of a live group. Emitted at most once.
    GroupCancelled {
        /// The reason of the first cancellation.
        reason: CancelReason,
    },
}

/// Where the group as a whole stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupState {
    /// Still scheduling units.
    Live,
    /// Every unit finished `Ok` or `Skipped`.
    Succeeded,
    /// A unit failed while the group was live.
    Failed {
        /// The first unit that failed.
        unit: usize,
    },
    /// Cancelled from outside while live; `reason` is the strongest one so far.
    Cancelled {
        /// Strongest cancellation reason received.
        reason: CancelReason,
    },
}

/// A protocol violation reported by [`FanOut::handle`]; the state is unchanged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum FanOutError {
    /// The unit index is outside `0..total`.
    #[error("unit {unit} is out of range (the group has {total} units)")]
    UnknownUnit {
        /// Index received.
        unit: usize,
        /// Size of the group.
        total: usize,
    },
    /// The unit is still waiting for a slot; it was never spawned.
    #[error("unit {unit} has not been spawned")]
    NotSpawned {
        /// Index received.
        unit: usize,
    },
    /// `StartRequested` from a unit that already holds a grant.
    #[error("unit {unit} was already granted its start")]
    AlreadyGranted {
        /// Index received.
        unit: usize,
    },
    /// An event from a unit that has already finished.
    #[error("unit {unit} has already finished")]
    AlreadyFinished {
        /// Index received.
        unit: usize,
    },
}

/// State of a unit holding a slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    /// Spawned, has not been granted its start.
    Spawned,
    /// Granted; `cancel` is set once `CancelUnit` was emitted for it.
    Running { cancel: Option<CancelReason> },
}

/// The fan-out state machine for one group. See the module documentation.
#[derive(Debug, Clone)]
pub struct FanOut {
    total: usize,
    cap: usize,
    started: bool,
    next_unspawned: usize,
    /// Units holding a slot, by index (at most `cap` entries). Hashed: a
    /// B-tree's insert and remove were 8% of the scheduler's thread per
    /// sibling; the one walk in index order (cancelling) sorts.
    in_flight: HashMap<usize, Slot, BuildHasherDefault<UnitHasher>>,
    /// Units withdrawn at decision time (at most `cap` entries, once).
    withdrawn_units: BTreeSet<usize>,
    state: GroupState,
    escalation: Escalation,
    /// Units finished as [`UnitOutcome::Cancelled`] while the group was
    /// live, in report order: the group holds until one is explained.
    unexplained: Vec<usize>,
    /// Units finished before the group started (a resumed run's stored
    /// results): never spawned, counted as succeeded.
    done: BTreeSet<usize>,
    /// Of those, the ones the feed has not passed yet.
    done_ahead: usize,
    running: usize,
    peak_running: usize,
    cap_waits: usize,
    succeeded: usize,
    skipped: usize,
    failed: usize,
    cancelled: usize,
    withdrawn: usize,
    late_finishes: usize,
    denied: usize,
}

/// Hashes a unit's index: one multiplication (Fibonacci hashing), which
/// spreads consecutive indices over the table; nothing chooses them.
#[derive(Debug, Default, Clone, Copy)]
struct UnitHasher(u64);

impl Hasher for UnitHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
    }

    fn write_usize(&mut self, i: usize) {
        self.0 = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl FanOut {
    /// A group of `total` units run at most `cap` at a time. A `cap` of 0 is
    /// treated as 1 (see [`FanOut::cap`]). Nothing happens until [`FanOut::start`].
    #[must_use]
    pub fn new(total: usize, cap: usize) -> Self {
        Self {
            total,
            cap: cap.max(1),
            started: false,
            next_unspawned: 0,
            in_flight: HashMap::default(),
            withdrawn_units: BTreeSet::new(),
            state: GroupState::Live,
            escalation: Escalation::new(),
            unexplained: Vec::new(),
            done: BTreeSet::new(),
            done_ahead: 0,
            running: 0,
            peak_running: 0,
            cap_waits: 0,
            succeeded: 0,
            skipped: 0,
            failed: 0,
            cancelled: 0,
            withdrawn: 0,
            late_finishes: 0,
            denied: 0,
        }
    }

    /// A group of which the units in `done` already finished `Ok` (a
    /// resumed run): they are never spawned and count as succeeded, so
    /// the cap is spent on the others only.
    #[must_use]
    pub fn with_done(total: usize, cap: usize, done: impl IntoIterator<Item = usize>) -> Self {
        let mut fan = Self::new(total, cap);
        fan.done = done.into_iter().filter(|u| *u < total).collect();
        fan.succeeded = fan.done.len();
        fan.done_ahead = fan.done.len();
        fan
    }

    /// Spawns the first `min(cap, total)` units in index order, or emits
    /// `AllSucceeded` at once for an empty group. Calling it again, or after the
    /// group was cancelled, emits nothing.
    pub fn start(&mut self, out: &mut Vec<FanOutCommand>) {
        if self.started {
            return;
        }
        self.started = true;
        if self.state != GroupState::Live {
            return;
        }
        if self.total == self.succeeded {
            self.state = GroupState::Succeeded;
            out.push(FanOutCommand::AllSucceeded);
            return;
        }
        self.feed(out, false);
    }

    /// Processes one event, pushing the resulting commands onto `out`.
    ///
    /// # Errors
    ///
    /// Returns a [`FanOutError`] for protocol violations; the state is then
    /// unchanged and nothing is pushed. Races with cancellation are not errors.
    pub fn handle(
        &mut self,
        event: FanOutEvent,
        out: &mut Vec<FanOutCommand>,
    ) -> Result<(), FanOutError> {
        match event {
            FanOutEvent::StartRequested { unit } => self.on_start_requested(unit, out),
            FanOutEvent::Finished { unit, outcome } => self.on_finished(unit, outcome, out),
            FanOutEvent::Cancel { reason } => {
                self.on_cancel(reason, out);
                Ok(())
            }
        }
    }

    fn check_spawned(&self, unit: usize) -> Result<(), FanOutError> {
        if unit >= self.total {
            return Err(FanOutError::UnknownUnit {
                unit,
                total: self.total,
            });
        }
        if unit >= self.next_unspawned {
            return Err(FanOutError::NotSpawned { unit });
        }
        Ok(())
    }

    fn on_start_requested(
        &mut self,
        unit: usize,
        out: &mut Vec<FanOutCommand>,
    ) -> Result<(), FanOutError> {
        self.check_spawned(unit)?;
        let live = self.state == GroupState::Live;
        match self.in_flight.get_mut(&unit) {
            Some(slot @ Slot::Spawned) if live => {
                *slot = Slot::Running { cancel: None };
                self.running += 1;
                self.peak_running = self.peak_running.max(self.running);
                out.push(FanOutCommand::Grant { unit });
            }
            // Unreachable in practice: deciding the group withdraws every
            // spawned unit. Denying keeps the "never start after a cancel" rule.
            Some(Slot::Spawned) => {
                self.denied += 1;
                out.push(FanOutCommand::Deny { unit });
            }
            Some(Slot::Running { .. }) => return Err(FanOutError::AlreadyGranted { unit }),
            None if self.withdrawn_units.contains(&unit) => {
                self.denied += 1;
                out.push(FanOutCommand::Deny { unit });
            }
            None => return Err(FanOutError::AlreadyFinished { unit }),
        }
        Ok(())
    }

    fn on_finished(
        &mut self,
        unit: usize,
        outcome: UnitOutcome,
        out: &mut Vec<FanOutCommand>,
    ) -> Result<(), FanOutError> {
        self.check_spawned(unit)?;
        let Some(slot) = self.in_flight.remove(&unit) else {
            if self.withdrawn_units.contains(&unit) {
                self.late_finishes += 1;
                return Ok(());
            }
            return Err(FanOutError::AlreadyFinished { unit });
        };
        if let Slot::Running { cancel } = slot {
            self.running -= 1;
            if cancel.is_some() {
                // Acknowledges (or races with) its cancellation: no effect on the group.
                self.late_finishes += 1;
                return Ok(());
            }
        }
        if self.state != GroupState::Live {
            // Defensive: deciding the group cancels or withdraws every unit.
            self.late_finishes += 1;
            return Ok(());
        }
        match outcome {
            UnitOutcome::Ok => self.succeeded += 1,
            UnitOutcome::Skipped => self.skipped += 1,
            UnitOutcome::Cancelled => self.unexplained.push(unit),
            UnitOutcome::Failed => {
                self.failed += 1;
                self.state = GroupState::Failed { unit };
                self.escalation.raise(CancelReason::SiblingFailed);
                out.push(FanOutCommand::GroupFailed { unit });
                self.cancel_in_flight(CancelReason::SiblingFailed, out);
                return Ok(());
            }
        }
        if let Some(&first) = self.unexplained.first() {
            // Held: a sibling's report will explain the cancellation. If
            // none can come any more, the first cancelled unit is the
            // group's failure.
            if self.running == 0 {
                self.failed += 1;
                self.state = GroupState::Failed { unit: first };
                self.escalation.raise(CancelReason::SiblingFailed);
                out.push(FanOutCommand::GroupFailed { unit: first });
                self.cancel_in_flight(CancelReason::SiblingFailed, out);
            }
        } else if self.succeeded + self.skipped == self.total {
            self.state = GroupState::Succeeded;
            out.push(FanOutCommand::AllSucceeded);
        } else {
            self.feed(out, true);
        }
        Ok(())
    }

    fn on_cancel(&mut self, reason: CancelReason, out: &mut Vec<FanOutCommand>) {
        if !self.escalation.raise(reason) {
            return;
        }
        match self.state {
            GroupState::Live => {
                self.state = GroupState::Cancelled { reason };
                out.push(FanOutCommand::GroupCancelled { reason });
            }
            GroupState::Cancelled { .. } => self.state = GroupState::Cancelled { reason },
            // The group is already decided as failed: only escalate running units.
            GroupState::Failed { .. } => {}
            // Nothing is running any more; the success stands.
            GroupState::Succeeded => return,
        }
        self.cancel_in_flight(reason, out);
    }

    /// Cancels every running unit (or escalates its cancel) and withdraws every
    /// spawned-but-never-granted unit, in index order.
    fn cancel_in_flight(&mut self, reason: CancelReason, out: &mut Vec<FanOutCommand>) {
        let mut withdrawn = Vec::new();
        let mut units: Vec<usize> = self.in_flight.keys().copied().collect();
        units.sort_unstable();
        for unit in units {
            let Some(slot) = self.in_flight.get_mut(&unit) else {
                continue;
            };
            match slot {
                Slot::Spawned => {
                    withdrawn.push(unit);
                    out.push(FanOutCommand::Withdraw { unit });
                }
                Slot::Running { cancel } => {
                    if cancel.is_none() {
                        self.cancelled += 1;
                    }
                    if *cancel < Some(reason) {
                        *cancel = Some(reason);
                        out.push(FanOutCommand::CancelUnit { unit, reason });
                    }
                }
            }
        }
        for unit in withdrawn {
            self.in_flight.remove(&unit);
            self.withdrawn_units.insert(unit);
            self.withdrawn += 1;
        }
    }

    /// Spawns waiting units while a slot is free and the group is live.
    fn feed(&mut self, out: &mut Vec<FanOutCommand>, after_wait: bool) {
        while self.state == GroupState::Live
            && self.unexplained.is_empty()
            && self.in_flight.len() < self.cap
            && self.next_unspawned < self.total
        {
            let unit = self.next_unspawned;
            self.next_unspawned += 1;
            if self.done.contains(&unit) {
                self.done_ahead -= 1;
                continue;
            }
            self.in_flight.insert(unit, Slot::Spawned);
            if after_wait {
                self.cap_waits += 1;
            }
            out.push(FanOutCommand::Spawn { unit });
        }
    }

    /// Number of units in the group.
    #[must_use]
    pub const fn total(&self) -> usize {
        self.total
    }

    /// Effective concurrency cap (at least 1).
    #[must_use]
    pub const fn cap(&self) -> usize {
        self.cap
    }

    /// Where the group stands.
    #[must_use]
    pub const fn state(&self) -> GroupState {
        self.state
    }

    /// Strongest cancellation reason recorded so far (`SiblingFailed` after a failure).
    #[must_use]
    pub const fn cancel_level(&self) -> Option<CancelReason> {
        self.escalation.current()
    }

    /// Granted and not yet finished (including units being cancelled).
    #[must_use]
    pub const fn running(&self) -> usize {
        self.running
    }

    /// Running units that were told to cancel and have not reported `Finished` yet.
    #[must_use]
    pub fn cancelling(&self) -> usize {
        self.in_flight
            .values()
            .filter(|slot| matches!(slot, Slot::Running { cancel: Some(_) }))
            .count()
    }

    /// Spawned but not yet granted.
    #[must_use]
    pub fn spawned_not_started(&self) -> usize {
        self.in_flight.len() - self.running
    }

    /// Units holding a slot: spawned and not finished (never more than the cap).
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    /// Units never spawned (and not done before the group started). Once
    /// the group is decided they never will be.
    #[must_use]
    pub const fn waiting(&self) -> usize {
        self.total - self.next_unspawned - self.done_ahead
    }

    /// Units that finished before the group started (a resumed run).
    #[must_use]
    pub fn done_before(&self) -> usize {
        self.done.len()
    }

    /// Units that finished `Ok` while the group was live.
    #[must_use]
    pub const fn succeeded(&self) -> usize {
        self.succeeded
    }

    /// Units that finished `Skipped` while the group was live.
    #[must_use]
    pub const fn skipped(&self) -> usize {
        self.skipped
    }

    /// Units whose own failure was counted (0 or 1: the first failure decides the group).
    #[must_use]
    pub const fn failed(&self) -> usize {
        self.failed
    }

    /// Running units that were sent `CancelUnit` (each counted once).
    #[must_use]
    pub const fn cancelled(&self) -> usize {
        self.cancelled
    }

    /// Spawned-but-never-granted units that were sent `Withdraw`.
    #[must_use]
    pub const fn withdrawn(&self) -> usize {
        self.withdrawn
    }

    /// Whether `unit` was sent `Withdraw` (its start was never granted).
    #[must_use]
    pub fn was_withdrawn(&self, unit: usize) -> bool {
        self.withdrawn_units.contains(&unit)
    }

    /// `Finished` events accepted from cancelled or withdrawn units and ignored.
    #[must_use]
    pub const fn late_finishes(&self) -> usize {
        self.late_finishes
    }

    /// `StartRequested` events answered with `Deny`.
    #[must_use]
    pub const fn denied(&self) -> usize {
        self.denied
    }

    /// Highest number of simultaneously running units seen.
    #[must_use]
    pub const fn peak_running(&self) -> usize {
        self.peak_running
    }

    /// Units that had to wait for a slot and were spawned later (not by `start`).
    /// Units still waiting are reported by [`FanOut::waiting`].
    #[must_use]
    pub const fn cap_waits(&self) -> usize {
        self.cap_waits
    }

    /// `true` once the group is decided and no unit holds a slot: the driver can
    /// end the compound turn.
    #[must_use]
    pub fn is_finished(&self) -> bool {
        self.state != GroupState::Live && self.in_flight.is_empty()
    }
}

#[cfg(test)]
mod held_and_done_tests {
    use super::*;

    fn started(total: usize, cap: usize) -> (FanOut, Vec<FanOutCommand>) {
        let mut fan = FanOut::new(total, cap);
        let mut out = Vec::new();
        fan.start(&mut out);
        for u in 0..cap.min(total) {
            fan.handle(FanOutEvent::StartRequested { unit: u }, &mut out)
                .expect("spawned");
        }
        (fan, out)
    }

    fn finish(fan: &mut FanOut, unit: usize, outcome: UnitOutcome) -> Vec<FanOutCommand> {
        let mut out = Vec::new();
        fan.handle(FanOutEvent::Finished { unit, outcome }, &mut out)
            .expect("a valid finish");
        out
    }

    #[test]
    fn a_cancelled_report_before_the_failure_holds_the_group_and_the_failure_decides() {
        let (mut fan, _) = started(10, 3);
        // Sibling 2 failed and cancelled the group's token; sibling 0's
        // cancellation reaches the core first.
        assert!(
            finish(&mut fan, 0, UnitOutcome::Cancelled).is_empty(),
            "held: no spawn"
        );
        assert_eq!(fan.state(), GroupState::Live);
        let out = finish(&mut fan, 2, UnitOutcome::Failed);
        assert_eq!(out[0], FanOutCommand::GroupFailed { unit: 2 });
        assert_eq!(fan.state(), GroupState::Failed { unit: 2 });
        assert!(
            out.iter()
                .all(|c| !matches!(c, FanOutCommand::Spawn { .. })),
            "{out:?}"
        );
    }

    #[test]
    fn an_unexplained_cancellation_fails_the_group_once_nothing_runs() {
        let (mut fan, _) = started(5, 2);
        assert!(finish(&mut fan, 1, UnitOutcome::Cancelled).is_empty());
        let out = finish(&mut fan, 0, UnitOutcome::Ok);
        assert_eq!(out[0], FanOutCommand::GroupFailed { unit: 1 });
    }

    #[test]
    fn done_units_are_never_spawned_and_count_as_succeeded() {
        let mut fan = FanOut::with_done(6, 2, [0, 2, 3]);
        let mut out = Vec::new();
        fan.start(&mut out);
        assert_eq!(
            out,
            [
                FanOutCommand::Spawn { unit: 1 },
                FanOutCommand::Spawn { unit: 4 }
            ]
        );
        assert_eq!(fan.waiting(), 1, "unit 5");
        for u in [1, 4] {
            fan.handle(FanOutEvent::StartRequested { unit: u }, &mut out)
                .expect("spawned");
        }
        assert_eq!(
            finish(&mut fan, 1, UnitOutcome::Ok),
            [FanOutCommand::Spawn { unit: 5 }]
        );
        fan.handle(FanOutEvent::StartRequested { unit: 5 }, &mut out)
            .expect("spawned");
        assert!(finish(&mut fan, 4, UnitOutcome::Ok).is_empty());
        assert_eq!(
            finish(&mut fan, 5, UnitOutcome::Ok),
            [FanOutCommand::AllSucceeded]
        );
        let mut all_done = FanOut::with_done(2, 1, [0, 1]);
        let mut out = Vec::new();
        all_done.start(&mut out);
        assert_eq!(out, [FanOutCommand::AllSucceeded]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use FanOutCommand as C;
    use FanOutEvent as E;

    fn started(total: usize, cap: usize) -> (FanOut, Vec<FanOutCommand>) {
        let mut fan = FanOut::new(total, cap);
        let mut out = Vec::new();
        fan.start(&mut out);
        (fan, out)
    }

    fn step(fan: &mut FanOut, event: FanOutEvent) -> Vec<FanOutCommand> {
        let mut out = Vec::new();
        fan.handle(event, &mut out).unwrap();
        out
    }

    fn grant(fan: &mut FanOut, unit: usize) {
        assert_eq!(
            step(fan, E::StartRequested { unit }),
            vec![C::Grant { unit }]
        );
    }

    fn finish(fan: &mut FanOut, unit: usize, outcome: UnitOutcome) -> Vec<FanOutCommand> {
        step(fan, E::Finished { unit, outcome })
    }

    #[test]
    fn start_spawns_first_cap_units_in_order() {
        let (fan, out) = started(10, 3);
        assert_eq!(
            out,
            vec![
                C::Spawn { unit: 0 },
                C::Spawn { unit: 1 },
                C::Spawn { unit: 2 }
            ]
        );
        assert_eq!(fan.waiting(), 7);
        assert_eq!(fan.spawned_not_started(), 3);
        assert_eq!(fan.running(), 0);
        assert_eq!(fan.state(), GroupState::Live);
        assert!(!fan.is_finished());
    }

    #[test]
    fn start_with_cap_above_total_spawns_all() {
        let (fan, out) = started(2, 8);
        assert_eq!(out, vec![C::Spawn { unit: 0 }, C::Spawn { unit: 1 }]);
        assert_eq!(fan.waiting(), 0);
    }

    #[test]
    fn start_twice_emits_nothing_the_second_time() {
        let (mut fan, _) = started(4, 2);
        let mut out = Vec::new();
        fan.start(&mut out);
        assert!(out.is_empty());
        assert_eq!(fan.in_flight(), 2);
    }

    #[test]
    fn cap_zero_is_treated_as_one() {
        let (fan, out) = started(3, 0);
        assert_eq!(fan.cap(), 1);
        assert_eq!(out, vec![C::Spawn { unit: 0 }]);
    }

    #[test]
    fn empty_group_succeeds_on_start() {
        let (fan, out) = started(0, 4);
        assert_eq!(out, vec![C::AllSucceeded]);
        assert_eq!(fan.state(), GroupState::Succeeded);
        assert!(fan.is_finished());
    }

    #[test]
    fn finishing_feeds_the_next_waiting_unit() {
        let (mut fan, _) = started(3, 1);
        grant(&mut fan, 0);
        assert_eq!(fan.running(), 1);
        assert_eq!(
            finish(&mut fan, 0, UnitOutcome::Ok),
            vec![C::Spawn { unit: 1 }]
        );
        assert_eq!(fan.cap_waits(), 1);
        assert_eq!(fan.waiting(), 1);
        grant(&mut fan, 1);
        assert_eq!(
            finish(&mut fan, 1, UnitOutcome::Skipped),
            vec![C::Spawn { unit: 2 }]
        );
        assert_eq!(fan.cap_waits(), 2);
    }

    #[test]
    fn all_succeeded_is_emitted_once_when_every_unit_is_ok_or_skipped() {
        let (mut fan, _) = started(3, 3);
        for unit in 0..3 {
            grant(&mut fan, unit);
        }
        assert!(finish(&mut fan, 1, UnitOutcome::Ok).is_empty());
        assert!(finish(&mut fan, 0, UnitOutcome::Skipped).is_empty());
        assert_eq!(finish(&mut fan, 2, UnitOutcome::Ok), vec![C::AllSucceeded]);
        assert_eq!(fan.state(), GroupState::Succeeded);
        assert_eq!((fan.succeeded(), fan.skipped()), (2, 1));
        assert_eq!(fan.peak_running(), 3);
        assert!(fan.is_finished());
        let mut out = Vec::new();
        assert_eq!(
            fan.handle(
                E::Finished {
                    unit: 2,
                    outcome: UnitOutcome::Ok
                },
                &mut out
            ),
            Err(FanOutError::AlreadyFinished { unit: 2 })
        );
        assert!(out.is_empty());
    }

    #[test]
    fn large_group_stays_under_cap_with_lazy_feed() {
        let total = 100_000;
        let cap = 4;
        let (mut fan, mut pending) = started(total, cap);
        let mut running = std::collections::VecDeque::new();
        let mut all_succeeded = 0;
        let mut spawned = 0;
        loop {
            while let Some(cmd) = pending.pop() {
                match cmd {
                    C::Spawn { unit } => {
                        spawned += 1;
                        assert!(fan.in_flight() <= cap);
                        grant(&mut fan, unit);
                        running.push_back(unit);
                        assert!(fan.running() <= cap);
                    }
                    C::AllSucceeded => all_succeeded += 1,
                    other => panic!("unexpected {other:?}"),
                }
            }
            assert_eq!(fan.waiting() + spawned, total);
            let Some(unit) = running.pop_front() else {
                break;
            };
            pending = finish(&mut fan, unit, UnitOutcome::Ok);
        }
        assert_eq!(spawned, total);
        assert_eq!(all_succeeded, 1);
        assert_eq!(fan.succeeded(), total);
        assert_eq!(fan.cap_waits(), total - cap);
        assert_eq!(fan.peak_running(), cap);
        assert!(fan.is_finished());
    }

    #[test]
    fn first_failure_cancels_running_and_withdraws_spawned() {
        let (mut fan, _) = started(10, 4);
        grant(&mut fan, 0);
        grant(&mut fan, 2);
        grant(&mut fan, 3);
        let out = finish(&mut fan, 2, UnitOutcome::Failed);
        assert_eq!(
            out,
            vec![
                C::GroupFailed { unit: 2 },
                C::CancelUnit {
                    unit: 0,
                    reason: CancelReason::SiblingFailed
                },
                C::Withdraw { unit: 1 },
                C::CancelUnit {
                    unit: 3,
                    reason: CancelReason::SiblingFailed
                },
            ]
        );
        assert_eq!(fan.state(), GroupState::Failed { unit: 2 });
        assert_eq!(fan.cancel_level(), Some(CancelReason::SiblingFailed));
        assert_eq!((fan.failed(), fan.cancelled(), fan.withdrawn()), (1, 2, 1));
        assert_eq!(fan.running(), 2);
        assert_eq!(fan.cancelling(), 2);
        assert_eq!(fan.spawned_not_started(), 0);
        assert_eq!(fan.waiting(), 6);
        assert!(!fan.is_finished());
    }

    #[test]
    fn withdrawn_unit_is_denied_and_nothing_is_spawned_after_failure() {
        let (mut fan, _) = started(5, 2);
        grant(&mut fan, 0);
        finish(&mut fan, 0, UnitOutcome::Failed);
        assert_eq!(
            step(&mut fan, E::StartRequested { unit: 1 }),
            vec![C::Deny { unit: 1 }]
        );
        assert_eq!(fan.denied(), 1);
        assert!(fan.is_finished());
        assert_eq!(fan.waiting(), 3);
        // A stray Finished from the withdrawn unit is a late finish, not an error.
        assert!(finish(&mut fan, 1, UnitOutcome::Ok).is_empty());
        assert_eq!(fan.late_finishes(), 1);
    }

    #[test]
    fn late_finishes_of_cancelled_units_are_counted_and_ignored() {
        let (mut fan, _) = started(6, 3);
        for unit in 0..3 {
            grant(&mut fan, unit);
        }
        finish(&mut fan, 1, UnitOutcome::Failed);
        assert!(finish(&mut fan, 0, UnitOutcome::Failed).is_empty());
        assert!(!fan.is_finished());
        assert!(finish(&mut fan, 2, UnitOutcome::Ok).is_empty());
        assert_eq!(fan.late_finishes(), 2);
        assert_eq!((fan.failed(), fan.succeeded()), (1, 0));
        assert_eq!(fan.state(), GroupState::Failed { unit: 1 });
        assert_eq!(fan.running(), 0);
        assert!(fan.is_finished());
    }

    #[test]
    fn failure_of_a_never_granted_unit_fails_the_group() {
        let (mut fan, _) = started(3, 2);
        assert_eq!(
            finish(&mut fan, 1, UnitOutcome::Failed),
            vec![C::GroupFailed { unit: 1 }, C::Withdraw { unit: 0 }]
        );
        assert!(fan.is_finished());
    }

    #[test]
    fn external_cancel_is_announced_once_and_stops_everything() {
        let (mut fan, _) = started(8, 3);
        grant(&mut fan, 1);
        let out = step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::Interrupted,
            },
        );
        assert_eq!(
            out,
            vec![
                C::GroupCancelled {
                    reason: CancelReason::Interrupted
                },
                C::Withdraw { unit: 0 },
                C::CancelUnit {
                    unit: 1,
                    reason: CancelReason::Interrupted
                },
                C::Withdraw { unit: 2 },
            ]
        );
        assert!(
            step(
                &mut fan,
                E::Cancel {
                    reason: CancelReason::Interrupted
                }
            )
            .is_empty()
        );
        assert_eq!(
            step(&mut fan, E::StartRequested { unit: 2 }),
            vec![C::Deny { unit: 2 }]
        );
        assert!(finish(&mut fan, 1, UnitOutcome::Ok).is_empty());
        assert_eq!(
            fan.state(),
            GroupState::Cancelled {
                reason: CancelReason::Interrupted
            }
        );
        assert_eq!(fan.succeeded(), 0);
        assert!(fan.is_finished());
    }

    #[test]
    fn cancel_escalates_only_to_stronger_reasons() {
        let (mut fan, _) = started(4, 4);
        grant(&mut fan, 0);
        grant(&mut fan, 1);
        step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::Interrupted,
            },
        );
        assert!(finish(&mut fan, 0, UnitOutcome::Ok).is_empty());
        let weaker = step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::SiblingFailed,
            },
        );
        assert!(weaker.is_empty());
        let stronger = step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::Shutdown,
            },
        );
        assert_eq!(
            stronger,
            vec![C::CancelUnit {
                unit: 1,
                reason: CancelReason::Shutdown
            }]
        );
        assert_eq!(
            fan.state(),
            GroupState::Cancelled {
                reason: CancelReason::Shutdown
            }
        );
        assert_eq!(fan.cancelled(), 2);
    }

    #[test]
    fn interrupt_after_failure_escalates_without_announcing_a_cancel() {
        let (mut fan, _) = started(3, 3);
        grant(&mut fan, 0);
        grant(&mut fan, 1);
        finish(&mut fan, 0, UnitOutcome::Failed);
        let out = step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::Interrupted,
            },
        );
        assert_eq!(
            out,
            vec![C::CancelUnit {
                unit: 1,
                reason: CancelReason::Interrupted
            }]
        );
        assert_eq!(fan.state(), GroupState::Failed { unit: 0 });
        assert_eq!(fan.cancelled(), 1);
    }

    #[test]
    fn cancel_after_success_changes_nothing() {
        let (mut fan, _) = started(1, 1);
        grant(&mut fan, 0);
        finish(&mut fan, 0, UnitOutcome::Ok);
        assert!(
            step(
                &mut fan,
                E::Cancel {
                    reason: CancelReason::Shutdown
                }
            )
            .is_empty()
        );
        assert_eq!(fan.state(), GroupState::Succeeded);
    }

    #[test]
    fn cancel_before_start_spawns_nothing() {
        let mut fan = FanOut::new(5, 2);
        let out = step(
            &mut fan,
            E::Cancel {
                reason: CancelReason::Interrupted,
            },
        );
        assert_eq!(
            out,
            vec![C::GroupCancelled {
                reason: CancelReason::Interrupted
            }]
        );
        let mut out = Vec::new();
        fan.start(&mut out);
        assert!(out.is_empty());
        assert_eq!(fan.waiting(), 5);
        assert!(fan.is_finished());
    }

    #[test]
    fn protocol_violations_are_typed_errors_and_change_nothing() {
        let (mut fan, _) = started(4, 2);
        grant(&mut fan, 0);
        let cases = [
            (
                E::StartRequested { unit: 9 },
                FanOutError::UnknownUnit { unit: 9, total: 4 },
            ),
            (
                E::Finished {
                    unit: 4,
                    outcome: UnitOutcome::Ok,
                },
                FanOutError::UnknownUnit { unit: 4, total: 4 },
            ),
            (
                E::StartRequested { unit: 3 },
                FanOutError::NotSpawned { unit: 3 },
            ),
            (
                E::Finished {
                    unit: 2,
                    outcome: UnitOutcome::Failed,
                },
                FanOutError::NotSpawned { unit: 2 },
            ),
            (
                E::StartRequested { unit: 0 },
                FanOutError::AlreadyGranted { unit: 0 },
            ),
        ];
        for (event, expected) in cases {
            let mut out = Vec::new();
            assert_eq!(fan.handle(event, &mut out), Err(expected));
            assert!(out.is_empty());
        }
        assert_eq!(fan.state(), GroupState::Live);
        assert_eq!((fan.running(), fan.spawned_not_started()), (1, 1));
        finish(&mut fan, 0, UnitOutcome::Ok);
        let mut out = Vec::new();
        assert_eq!(
            fan.handle(E::StartRequested { unit: 0 }, &mut out),
            Err(FanOutError::AlreadyFinished { unit: 0 })
        );
        assert_eq!(
            fan.handle(
                E::Finished {
                    unit: 0,
                    outcome: UnitOutcome::Failed
                },
                &mut out
            ),
            Err(FanOutError::AlreadyFinished { unit: 0 })
        );
        assert!(out.is_empty());
        assert_eq!(fan.state(), GroupState::Live);
        assert_eq!(fan.succeeded(), 1);
    }

    #[test]
    fn escalation_only_rises() {
        let mut level = Escalation::new();
        assert!(!level.is_cancelled());
        assert!(level.raise(CancelReason::SiblingFailed));
        assert!(!level.raise(CancelReason::SiblingFailed));
        assert!(level.raise(CancelReason::Shutdown));
        assert!(!level.raise(CancelReason::Interrupted));
        assert_eq!(level.current(), Some(CancelReason::Shutdown));
        assert!(CancelReason::SiblingFailed < CancelReason::Interrupted);
        assert!(CancelReason::Interrupted < CancelReason::Shutdown);
    }
}
