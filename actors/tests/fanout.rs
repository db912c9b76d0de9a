//! Property tests for the fan-out core: random groups driven through random interleavings.

use proptest::prelude::*;
use troupe_actors::{
    CancelReason, FanOut, FanOutCommand, FanOutError, FanOutEvent, GroupState, UnitOutcome,
};

/// What the test driver knows about one unit, built only from emitted commands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Waiting,
    Spawned,
    Granted,
    Cancelling,
    Withdrawn,
    Done,
}

/// Independent model of the protocol, checking every command as it arrives.
#[derive(Debug)]
struct Model {
    total: usize,
    cap: usize,
    phase: Vec<Phase>,
    granted: Vec<bool>,
    own_finish: Vec<bool>,
    cancel_sent: Vec<bool>,
    next_spawn: usize,
    decided: bool,
    all_succeeded: usize,
    group_failed: Vec<usize>,
    group_cancelled: usize,
    own_ok_or_skipped: usize,
    cancel_sent_while_live: bool,
}

impl Model {
    fn new(total: usize, cap: usize) -> Self {
        Self {
            total,
            cap,
            phase: vec![Phase::Waiting; total],
            granted: vec![false; total],
            own_finish: vec![false; total],
            cancel_sent: vec![false; total],
            next_spawn: 0,
            decided: false,
            all_succeeded: 0,
            group_failed: Vec::new(),
            group_cancelled: 0,
            own_ok_or_skipped: 0,
            cancel_sent_while_live: false,
        }
    }

    fn apply(&mut self, commands: &[FanOutCommand]) {
        // (f) one step's cancellations and withdrawals go in index order.
        let mut last_stopped: Option<usize> = None;
        for &cmd in commands {
            if let FanOutCommand::CancelUnit { unit, .. } | FanOutCommand::Withdraw { unit } = cmd {
                assert!(
                    last_stopped.is_none_or(|last| unit > last),
                    "{unit} stopped after {last_stopped:?}"
                );
                last_stopped = Some(unit);
            }
            match cmd {
                FanOutCommand::Spawn { unit } => {
                    assert!(!self.decided, "Spawn after the group was decided");
                    // (e) strictly increasing index order, each at most once.
                    assert_eq!(unit, self.next_spawn, "spawn out of order");
                    assert_eq!(self.phase[unit], Phase::Waiting);
                    self.next_spawn += 1;
                    self.phase[unit] = Phase::Spawned;
                }
                FanOutCommand::Grant { unit } => {
                    assert!(!self.decided, "Grant after the group was decided");
                    assert_eq!(self.phase[unit], Phase::Spawned);
                    self.phase[unit] = Phase::Granted;
                    self.granted[unit] = true;
                }
                FanOutCommand::Deny { unit } => {
                    assert!(self.decided, "Deny while live");
                    assert_eq!(self.phase[unit], Phase::Withdrawn);
                }
                FanOutCommand::CancelUnit { unit, .. } => {
                    assert!(self.decided, "CancelUnit while live");
                    assert!(
                        matches!(self.phase[unit], Phase::Granted | Phase::Cancelling),
                        "CancelUnit for {unit} in {:?}",
                        self.phase[unit]
                    );
                    assert!(!self.own_finish[unit]);
                    self.phase[unit] = Phase::Cancelling;
                    self.cancel_sent[unit] = true;
                }
                FanOutCommand::Withdraw { unit } => {
                    assert!(self.decided, "Withdraw while live");
                    assert_eq!(self.phase[unit], Phase::Spawned);
                    self.phase[unit] = Phase::Withdrawn;
                }
                FanOutCommand::AllSucceeded => {
                    // (c) at most once, only when all finished Ok/Skipped, never after a failure.
                    assert_eq!(self.all_succeeded, 0);
                    assert!(!self.decided);
                    assert_eq!(self.own_ok_or_skipped, self.total);
                    self.all_succeeded += 1;
                }
                FanOutCommand::GroupFailed { unit } => {
                    assert!(!self.decided);
                    assert!(self.group_failed.is_empty());
                    self.group_failed.push(unit);
                    self.decided = true;
                }
                FanOutCommand::GroupCancelled { .. } => {
                    assert!(!self.decided);
                    assert_eq!(self.group_cancelled, 0);
                    self.group_cancelled += 1;
                    self.decided = true;
                }
            }
        }
    }

    fn count(&self, phases: &[Phase]) -> usize {
        self.phase.iter().filter(|p| phases.contains(p)).count()
    }

    /// Units the driver can still send events about, in index order.
    fn active(&self) -> Vec<usize> {
        (0..self.total)
            .filter(|&u| {
                matches!(
                    self.phase[u],
                    Phase::Spawned | Phase::Granted | Phase::Cancelling
                )
            })
            .collect()
    }

    fn withdrawn(&self) -> Vec<usize> {
        (0..self.total)
            .filter(|&u| self.phase[u] == Phase::Withdrawn)
            .collect()
    }

    fn check_against(&self, fan: &FanOut) {
        // (a) running and spawned-unfinished never exceed the cap.
        assert!(fan.running() <= self.cap);
        assert!(fan.in_flight() <= self.cap);
        assert_eq!(
            fan.running(),
            self.count(&[Phase::Granted, Phase::Cancelling])
        );
        assert_eq!(fan.spawned_not_started(), self.count(&[Phase::Spawned]));
        assert_eq!(fan.cancelling(), self.count(&[Phase::Cancelling]));
        assert_eq!(fan.waiting(), self.total - self.next_spawn);
        if self.decided {
            assert_eq!(self.count(&[Phase::Spawned, Phase::Granted]), 0);
        }
    }
}

fn outcome_for(action: u32, fail_permille: u32) -> UnitOutcome {
    if (action / 64) % 1000 < fail_permille {
        UnitOutcome::Failed
    } else if action.is_multiple_of(2) {
        UnitOutcome::Ok
    } else {
        UnitOutcome::Skipped
    }
}

fn reason_strategy() -> impl Strategy<Value = CancelReason> {
    prop_oneof![
        Just(CancelReason::SiblingFailed),
        Just(CancelReason::Interrupted),
        Just(CancelReason::Shutdown),
    ]
}

/// Sends one event, checks the reply against the model and the invariants.
fn send(fan: &mut FanOut, model: &mut Model, event: FanOutEvent) -> Vec<FanOutCommand> {
    let live_before = !model.decided && model.all_succeeded == 0;
    let mut out = Vec::new();
    fan.handle(event, &mut out)
        .unwrap_or_else(|e| panic!("{event:?} rejected: {e}"));
    match event {
        FanOutEvent::StartRequested { unit } => match model.phase[unit] {
            Phase::Spawned => assert_eq!(out, vec![FanOutCommand::Grant { unit }]),
            Phase::Withdrawn => assert_eq!(out, vec![FanOutCommand::Deny { unit }]),
            other => panic!("driver sent StartRequested in {other:?}"),
        },
        FanOutEvent::Finished { unit, outcome } => {
            let phase = model.phase[unit];
            if matches!(phase, Phase::Spawned | Phase::Granted) {
                assert!(live_before, "unit {unit} in {phase:?} after decision");
                model.own_finish[unit] = model.granted[unit];
                model.phase[unit] = Phase::Done;
                match outcome {
                    // Held groups are covered by the unit tests of the core.
                    UnitOutcome::Cancelled => unreachable!("not generated"),
                    UnitOutcome::Failed => {
                        assert_eq!(out.first(), Some(&FanOutCommand::GroupFailed { unit }));
                    }
                    UnitOutcome::Ok | UnitOutcome::Skipped => {
                        model.own_ok_or_skipped += 1;
                        let expected = if model.own_ok_or_skipped == model.total {
                            vec![FanOutCommand::AllSucceeded]
                        } else if model.next_spawn < model.total {
                            vec![FanOutCommand::Spawn {
                                unit: model.next_spawn,
                            }]
                        } else {
                            vec![]
                        };
                        assert_eq!(out, expected);
                    }
                }
            } else {
                assert!(out.is_empty(), "late finish emitted {out:?}");
                if phase == Phase::Cancelling {
                    model.phase[unit] = Phase::Done;
                }
            }
        }
        FanOutEvent::Cancel { .. } => {
            if live_before {
                model.cancel_sent_while_live = true;
            }
        }
    }
    model.apply(&out);
    model.check_against(fan);
    out
}

#[derive(Debug, Clone)]
struct Scenario {
    total: usize,
    cap: usize,
    fail_permille: u32,
    steps: Vec<(u32, u32)>,
    cancels: Vec<(usize, CancelReason)>,
}

fn scenario() -> impl Strategy<Value = Scenario> {
    (
        0usize..300,
        1usize..20,
        prop_oneof![Just(0u32), 0u32..40],
        prop::collection::vec((any::<u32>(), any::<u32>()), 0..900),
        prop::collection::vec((0usize..900, reason_strategy()), 0..3),
    )
        .prop_map(|(total, cap, fail_permille, steps, cancels)| Scenario {
            total,
            cap,
            fail_permille,
            steps,
            cancels,
        })
}

fn drive(s: &Scenario) {
    let mut fan = FanOut::new(s.total, s.cap);
    let mut model = Model::new(s.total, s.cap);
    let mut out = Vec::new();
    fan.start(&mut out);
    let expected_start: Vec<_> = if s.total == 0 {
        vec![FanOutCommand::AllSucceeded]
    } else {
        (0..s.total.min(s.cap))
            .map(|unit| FanOutCommand::Spawn { unit })
            .collect()
    };
    assert_eq!(out, expected_start);
    model.apply(&out);
    model.check_against(&fan);

    for (i, &(selector, action)) in s.steps.iter().enumerate() {
        for &(at, reason) in &s.cancels {
            if at == i {
                send(&mut fan, &mut model, FanOutEvent::Cancel { reason });
            }
        }
        let withdrawn = model.withdrawn();
        if action % 16 == 15 && !withdrawn.is_empty() {
            let unit = withdrawn[selector as usize % withdrawn.len()];
            send(&mut fan, &mut model, FanOutEvent::StartRequested { unit });
            continue;
        }
        let active = model.active();
        let Some(&unit) = active.get(selector as usize % active.len().max(1)) else {
            break;
        };
        let event = match model.phase[unit] {
            Phase::Spawned if action % 32 != 0 => FanOutEvent::StartRequested { unit },
            _ => FanOutEvent::Finished {
                unit,
                outcome: outcome_for(action, s.fail_permille),
            },
        };
        send(&mut fan, &mut model, event);
    }

    // Drain: every unit asks to start and finishes Ok; cancelled units acknowledge.
    let mut budget = 3 * s.total + 10;
    while let Some(&unit) = model.active().first() {
        assert!(budget > 0, "drive does not terminate");
        budget -= 1;
        let event = if model.phase[unit] == Phase::Spawned {
            FanOutEvent::StartRequested { unit }
        } else {
            FanOutEvent::Finished {
                unit,
                outcome: UnitOutcome::Ok,
            }
        };
        send(&mut fan, &mut model, event);
    }

    // (f) the drive terminates with the group finished.
    assert!(fan.is_finished());
    assert_eq!(fan.in_flight(), 0);
    // (d) every granted unit ends by exactly one of its own Finished or a CancelUnit.
    for unit in 0..s.total {
        if model.granted[unit] {
            assert!(
                model.own_finish[unit] ^ model.cancel_sent[unit],
                "unit {unit}: own_finish={} cancel={}",
                model.own_finish[unit],
                model.cancel_sent[unit]
            );
        } else {
            assert!(!model.cancel_sent[unit]);
        }
    }
    let failed = !model.group_failed.is_empty();
    match fan.state() {
        GroupState::Succeeded => {
            assert_eq!(model.all_succeeded, 1);
            assert_eq!(fan.succeeded() + fan.skipped(), s.total);
        }
        GroupState::Failed { unit } => {
            assert_eq!(model.group_failed, vec![unit]);
            assert_eq!(fan.failed(), 1);
            assert_eq!(model.all_succeeded, 0);
        }
        GroupState::Cancelled { reason } => {
            assert_eq!(model.group_cancelled, 1);
            assert!(model.cancel_sent_while_live);
            let strongest = s.cancels.iter().map(|&(_, r)| r).max();
            assert!(Some(reason) <= strongest);
            assert_eq!(model.all_succeeded, 0);
        }
        GroupState::Live => panic!("group still live after the drive"),
    }
    if !failed && !model.cancel_sent_while_live {
        assert_eq!(fan.state(), GroupState::Succeeded);
    }
    assert_eq!(fan.succeeded() + fan.skipped(), model.own_ok_or_skipped);
    assert_eq!(
        fan.cancelled(),
        model.cancel_sent.iter().filter(|&&c| c).count()
    );
    assert_eq!(
        fan.succeeded()
            + fan.skipped()
            + fan.failed()
            + fan.cancelled()
            + fan.withdrawn()
            + fan.waiting(),
        s.total,
        "every unit is accounted for exactly once"
    );
    assert_eq!(
        fan.cap_waits(),
        model.next_spawn.saturating_sub(s.total.min(s.cap))
    );
    assert!(fan.peak_running() <= s.cap);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn random_interleavings_respect_the_protocol(s in scenario()) {
        drive(&s);
    }

    #[test]
    fn arbitrary_events_never_panic_or_break_the_cap(
        total in 0usize..40,
        cap in 0usize..6,
        events in prop::collection::vec((0u8..3, 0usize..45, any::<u8>(), reason_strategy()), 0..300),
    ) {
        let mut fan = FanOut::new(total, cap);
        let mut out = Vec::new();
        fan.start(&mut out);
        let mut decided = false;
        for (kind, unit, pick, reason) in events {
            let event = match kind {
                0 => FanOutEvent::StartRequested { unit },
                1 => FanOutEvent::Finished {
                    unit,
                    outcome: match pick % 3 {
                        0 => UnitOutcome::Ok,
                        1 => UnitOutcome::Skipped,
                        _ => UnitOutcome::Failed,
                    },
                },
                _ => FanOutEvent::Cancel { reason },
            };
            out.clear();
            match fan.handle(event, &mut out) {
                Ok(()) => {}
                Err(FanOutError::UnknownUnit { unit: u, total: t }) => {
                    prop_assert_eq!(t, total);
                    prop_assert!(u >= total);
                    prop_assert!(out.is_empty());
                }
                Err(_) => prop_assert!(out.is_empty()),
            }
            for cmd in &out {
                if decided {
                    prop_assert!(
                        !matches!(cmd, FanOutCommand::Grant { .. } | FanOutCommand::Spawn { .. }),
                        "{:?} after decision", cmd
                    );
                }
                if matches!(
                    cmd,
                    FanOutCommand::GroupFailed { .. } | FanOutCommand::GroupCancelled { .. }
                ) {
                    decided = true;
                }
            }
            prop_assert!(fan.running() <= fan.cap());
            prop_assert!(fan.in_flight() <= fan.cap());
        }
    }
}
