//! The scheduler's decision logic, driven as a plain state machine: events
//! in, commands out, no actors, no runtime, no clock. A property drives
//! random fan-outs with random report orders and checks the invariants on
//! the commands alone.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use common::{Fixture, stage_md};
use proptest::prelude::*;
use serde_json::{Value, json};
use troupe::definition::{Pipeline, load_pipeline};
use troupe::runtime::ids::RunId;
use troupe::runtime::result::{Kept, StageResult, Usage, Verdict};
use troupe::runtime::scheduler::Slot as Exec;
use troupe::runtime::scheduler::{ExecKey, PlanCommand, PlanEvent, Planner, StageOutcome};
use troupe::runtime::summary::RunStatus;

/// plan → map(worker over plan's items) → join → end, with `maxVisits`.
fn map_pipeline(max_visits: Option<u32>) -> (Fixture, Arc<Pipeline>) {
    let mv = max_visits.map_or(String::new(), |n| format!("maxVisits: {n}\n"));
    let yaml = format!(
        "id: p\nentry: plan\n{mv}stages:\n  plan: plan.md\n  worker: worker.md\n  join: join.md\nnext:\n  plan: {{ parallel: {{ map: worker, over: \"ctx.upstream[0].parsed.items\" }}, join: join }}\n  join: end\n"
    );
    let files = [
        ("plan.md".to_owned(), stage_md("plan", "", "plan")),
        ("worker.md".to_owned(), stage_md("worker", "", "w")),
        ("join.md".to_owned(), stage_md("join", "", "j")),
    ];
    let refs: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    let f = Fixture::new(&yaml, &refs);
    let p = Arc::new(load_pipeline(f.path()).unwrap());
    (f, p)
}

/// a → b → a … (a loop) to exercise `maxVisits`.
fn loop_pipeline(max_visits: u32) -> (Fixture, Arc<Pipeline>) {
    let yaml = format!(
        "id: l\nentry: a\nmaxVisits: {max_visits}\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\n  b: a\n"
    );
    let a = stage_md("a", "", "a");
    let b = stage_md("b", "", "b");
    let f = Fixture::new(&yaml, &[("a.md", &a), ("b.md", &b)]);
    let p = Arc::new(load_pipeline(f.path()).unwrap());
    (f, p)
}

/// Drives a planner and keeps what it said.
struct Driver {
    planner: Planner,
    log: Vec<PlanCommand>,
    /// The identity of the latest execution spawned in each slot.
    keys: std::collections::HashMap<Exec, ExecKey>,
    /// The next `StageExited` seq.
    seq: u64,
}

impl Driver {
    fn new(pipeline: Arc<Pipeline>, cap: usize) -> Driver {
        let planner = Planner::new(
            Arc::clone(&pipeline),
            RunId::new(),
            Arc::new(serde_json::Map::new()),
            cap,
        );
        let _ = pipeline;
        Driver {
            planner,
            log: Vec::new(),
            keys: std::collections::HashMap::new(),
            seq: 0,
        }
    }

    fn step(&mut self, event: PlanEvent) -> Vec<&PlanCommand> {
        let mut out = Vec::new();
        self.planner.handle(event, &mut out);
        let from = self.log.len();
        for c in &out {
            if let PlanCommand::Spawn(s) = c {
                self.keys.insert(s.exec.slot, s.exec.clone());
            }
        }
        self.log.extend(out);
        self.log[from..].iter().collect()
    }

    fn key(&self, unit: Option<usize>) -> ExecKey {
        let slot = match unit {
            Some(u) => Exec::Unit(u),
            None if self.keys.contains_key(&Exec::Join)
                && self.keys.get(&Exec::Join).map(|k| k.turn)
                    >= self.keys.get(&Exec::Sequential).map(|k| k.turn) =>
            {
                Exec::Join
            }
            None => Exec::Sequential,
        };
        self.keys[&slot].clone()
    }

    /// A sibling asks to start.
    fn request(&mut self, unit: usize) -> Vec<&PlanCommand> {
        let exec = self.key(Some(unit));
        self.step(PlanEvent::StartRequested {
            turn: exec.turn,
            slot: exec.slot,
        })
    }

    /// An execution reports.
    fn report(&mut self, unit: Option<usize>, outcome: StageOutcome) -> Vec<&PlanCommand> {
        let exec = self.key(unit);
        self.step(PlanEvent::Reported { exec, outcome })
    }

    /// An Exit with the Next decision the pipeline's table gives.
    fn exit(
        &mut self,
        unit: Option<usize>,
        stage: &str,
        verdict: Verdict,
        parsed: Value,
    ) -> Vec<&PlanCommand> {
        let result = Arc::new(StageResult {
            stage_id: stage.into(),
            stage_execution_id: format!("{stage}/{unit:?}"),
            verdict,
            reason: (verdict == Verdict::Fail).then(|| "boom".to_owned()),
            parsed: Arc::new(parsed.clone()),
            output: Arc::new(parsed),
            cap_hit: false,
            attempt_count: 1,
            usage: Usage::default(),
        });
        // Siblings report their results packed, as their executions do.
        let result = match unit {
            Some(_) => Kept::packed(
                Arc::clone(&result),
                stage.into(),
                result.stage_execution_id.as_str().into(),
            ),
            None => Kept::Whole(result),
        };
        self.seq += 1;
        let seq = self.seq;
        self.report(unit, StageOutcome::Exited { result, seq })
    }

    fn cancelled(&mut self, unit: Option<usize>, _stage: &str) -> Vec<&PlanCommand> {
        self.report(
            unit,
            StageOutcome::Cancelled {
                usage: Default::default(),
            },
        )
    }

    fn status(&self) -> Option<&RunStatus> {
        self.planner.status()
    }
}

fn spawned(cmds: &[&PlanCommand]) -> Vec<(Exec, String)> {
    cmds.iter()
        .filter_map(|c| match c {
            PlanCommand::Spawn(s) => Some((s.exec.slot, s.stage.id.clone())),
            _ => None,
        })
        .collect()
}

fn granted(cmds: &[&PlanCommand]) -> Vec<usize> {
    cmds.iter()
        .filter_map(|c| match c {
            PlanCommand::Grant { unit } => Some(*unit),
            _ => None,
        })
        .collect()
}

fn cancels(cmds: &[&PlanCommand]) -> Vec<Exec> {
    cmds.iter()
        .filter_map(|c| match c {
            PlanCommand::Cancel { slot, .. } => Some(*slot),
            _ => None,
        })
        .collect()
}

fn emitted(cmds: &[&PlanCommand]) -> Vec<String> {
    cmds.iter()
        .filter_map(|c| match c {
            PlanCommand::Emit(e) => Some(e.name.as_str().to_owned()),
            _ => None,
        })
        .collect()
}

fn finished(cmds: &[&PlanCommand]) -> bool {
    cmds.iter().any(|c| matches!(c, PlanCommand::Finish(_)))
}

fn items(n: usize) -> Value {
    json!({"summary": "s", "items": (0..n).collect::<Vec<_>>()})
}

#[test]
fn start_enters_the_entry_stage_as_one_sequential_turn() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 4);
    let cmds = d.step(PlanEvent::Start);
    assert_eq!(emitted(&cmds), ["WorkflowStarted", "SessionTurnStart"]);
    assert_eq!(spawned(&cmds), [(Exec::Sequential, "plan".to_owned())]);
    // A second Start is ignored.
    assert!(d.step(PlanEvent::Start).is_empty());
}

#[test]
fn a_map_spawns_only_up_to_the_cap_and_feeds_the_rest_lazily() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let cmds = d.exit(None, "plan", Verdict::Ok, items(10));
    assert_eq!(
        spawned(&cmds),
        (0..3)
            .map(|u| (Exec::Unit(u), "worker".to_owned()))
            .collect::<Vec<_>>()
    );
    let spawn_ctx: Vec<Value> = cmds
        .iter()
        .filter_map(|c| match c {
            PlanCommand::Spawn(s) => s.ctx.item.clone(),
            _ => None,
        })
        .collect();
    assert_eq!(spawn_ctx, [json!(0), json!(1), json!(2)]);
    for u in 0..3 {
        assert_eq!(granted(&d.request(u)), [u]);
    }
    // One sibling ends: exactly one more is spawned, the next in order.
    let cmds = d.exit(Some(1), "worker", Verdict::Ok, json!({"summary": "ok"}));
    assert_eq!(spawned(&cmds), [(Exec::Unit(3), "worker".to_owned())]);
    assert!(emitted(&cmds).contains(&"Progress".to_owned()));
}

#[test]
fn the_join_starts_only_after_every_sibling_is_ok_or_skipped() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 8);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, items(3));
    for u in 0..3 {
        d.request(u);
    }
    assert!(spawned(&d.exit(Some(2), "worker", Verdict::Ok, json!({}))).is_empty());
    assert!(spawned(&d.exit(Some(0), "worker", Verdict::Skipped, json!({}))).is_empty());
    let cmds = d.exit(Some(1), "worker", Verdict::Ok, json!({}));
    assert_eq!(spawned(&cmds), [(Exec::Join, "join".to_owned())]);
    let join_upstream = match cmds.iter().find(|c| matches!(c, PlanCommand::Spawn(_))) {
        Some(PlanCommand::Spawn(s)) => s.ctx.upstream.len(),
        _ => unreachable!(),
    };
    assert_eq!(
        join_upstream, 3,
        "the join sees every sibling in plan order"
    );
    let cmds = d.exit(None, "join", Verdict::Ok, json!({}));
    assert_eq!(emitted(&cmds), ["SessionTurnEnd", "WorkflowExit"]);
    assert!(finished(&cmds));
    assert_eq!(d.status(), Some(&RunStatus::Ok));
}

/// A map over ten items, cap 3: units 0 and 1 running, unit 2 spawned
/// and not yet started.
fn two_running_one_spawned() -> (Fixture, Driver) {
    let (f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, items(10));
    d.request(0);
    d.request(1);
    (f, d)
}

#[test]
fn the_first_failure_cancels_running_siblings_and_nothing_starts_after_it() {
    let (_f, mut d) = two_running_one_spawned();
    // Unit 2 was spawned but has not asked yet.
    let cmds = d.exit(Some(0), "worker", Verdict::Fail, json!({}));
    assert!(spawned(&cmds).is_empty(), "no new sibling after a failure");
    assert_eq!(cancels(&cmds), [Exec::Unit(1), Exec::Unit(2)]);
    assert!(
        cmds.iter()
            .any(|c| matches!(c, PlanCommand::CancelGroup { sibling } if sibling == "worker#0")),
        "the group's scope is cancelled with the failed sibling's name"
    );
    // The late start request is not granted.
    assert!(granted(&d.request(2)).is_empty());
    // Unit 2 was withdrawn (it never started), so the group is decided
    // once the one running sibling reports its cancel; the failure is
    // recorded when the group ends.
    let cmds = d.cancelled(Some(1), "worker");
    assert!(
        finished(&cmds),
        "the run ends once every started unit reported"
    );
    assert!(emitted(&cmds).contains(&"ParallelSiblingFailure".to_owned()));
    assert!(
        d.report(Some(2), StageOutcome::CancelledBeforeStart)
            .is_empty()
    );
    match d.status() {
        Some(RunStatus::Failed { reason }) => {
            assert!(
                reason.starts_with("ExtensionHost/ParallelSiblingFailure"),
                "{reason}"
            );
            assert!(reason.contains("worker#0"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        !d.log
            .iter()
            .any(|c| matches!(c, PlanCommand::Spawn(s) if s.exec.slot == Exec::Join))
    );
}

/// A sibling that fails after the run was cancelled (Ctrl-C here; a
/// budget or --max-run-time alike) does not turn the cancel into a
/// sibling failure: the run ends as the cancel says.
#[test]
fn a_failure_after_the_run_was_cancelled_is_not_what_the_run_ends_with() {
    let (_f, mut d) = two_running_one_spawned();
    let cmds = d.step(PlanEvent::CancelRun);
    assert_eq!(
        cancels(&cmds),
        [Exec::Unit(0), Exec::Unit(1), Exec::Unit(2)]
    );
    d.exit(Some(0), "worker", Verdict::Fail, json!({}));
    d.cancelled(Some(1), "worker");
    let cmds = d.report(Some(2), StageOutcome::CancelledBeforeStart);
    assert!(!emitted(&cmds).contains(&"ParallelSiblingFailure".to_owned()));
    assert_eq!(d.status(), Some(&RunStatus::Cancelled));
}

/// A limit decides the group between a sibling's spawn and its start
/// request (which the scheduler feeds right after the spawn): the core
/// withdraws it, and it then reports it never started, or that it was
/// cancelled if it had begun. Each sibling is counted once: exited,
/// cancelled or never started.
#[test]
fn a_sibling_withdrawn_at_its_spawn_is_counted_once() {
    for begun in [false, true] {
        let (_f, mut d) = two_running_one_spawned();
        // Unit 2 is spawned; the limit is read before its request.
        let cmds = d.step(PlanEvent::LimitReached {
            reason: "Budget/TokensExceeded: over".to_owned(),
        });
        assert_eq!(cancels(&cmds).len(), 3, "two running, one withdrawn");
        assert!(granted(&d.request(2)).is_empty());
        // Unit 2 reports while the two running ones hold the group open.
        if begun {
            d.cancelled(Some(2), "worker");
        } else {
            d.report(Some(2), StageOutcome::CancelledBeforeStart);
        }
        d.cancelled(Some(0), "worker");
        let cmds = d.cancelled(Some(1), "worker");
        let report = cmds
            .iter()
            .find_map(|c| match c {
                PlanCommand::Finish(report) => Some(report),
                _ => None,
            })
            .expect("the run ends once every sibling reported");
        let g = &report.groups[0];
        let (cancelled, never) = if begun { (3, 7) } else { (2, 8) };
        assert_eq!(
            (g.cancelled, g.never_started),
            (cancelled, never),
            "begun: {begun}, {g:?}"
        );
    }
}

#[test]
fn cancel_run_reaches_the_sequential_stage_then_ends_cancelled() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let cmds = d.step(PlanEvent::CancelRun);
    assert_eq!(cancels(&cmds), [Exec::Sequential]);
    assert!(
        d.step(PlanEvent::CancelRun).is_empty(),
        "a second cancel adds nothing"
    );
    let cmds = d.cancelled(None, "plan");
    assert!(finished(&cmds));
    assert_eq!(d.status(), Some(&RunStatus::Cancelled));
    // Reports after the end change nothing.
    assert!(d.exit(None, "plan", Verdict::Ok, items(1)).is_empty());
}

/// A scheduler that stops after the run was decided but before its report
/// went out (it was waiting for the hub to settle) still reports, with
/// the decision; one that stops before fails the run.
#[test]
fn an_abandoned_run_reports_what_was_decided_or_fails() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    d.step(PlanEvent::CancelRun);
    d.cancelled(None, "plan");
    assert_eq!(d.status(), Some(&RunStatus::Cancelled));
    let mut out = Vec::new();
    d.planner.abandon("stopped".to_owned(), &mut out);
    let report = out.iter().find_map(|c| match c {
        PlanCommand::Finish(report) => Some(report),
        _ => None,
    });
    assert_eq!(report.map(|r| &r.status), Some(&RunStatus::Cancelled));

    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let mut out = Vec::new();
    d.planner.abandon("stopped".to_owned(), &mut out);
    assert!(out.iter().any(
        |c| matches!(c, PlanCommand::Finish(r) if matches!(&r.status, RunStatus::Failed { reason } if reason == "stopped"))
    ));
}

#[test]
fn cancel_run_during_the_join_cancels_the_join() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, items(1));
    d.request(0);
    d.exit(Some(0), "worker", Verdict::Ok, json!({}));
    let cmds = d.step(PlanEvent::CancelRun);
    assert_eq!(cancels(&cmds), [Exec::Join]);
    assert!(finished(&d.cancelled(None, "join")));
    assert_eq!(d.status(), Some(&RunStatus::Cancelled));
}

#[test]
fn an_empty_map_goes_straight_to_the_join() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let cmds = d.exit(None, "plan", Verdict::Ok, items(0));
    assert_eq!(spawned(&cmds), [(Exec::Join, "join".to_owned())]);
}

#[test]
fn a_map_over_something_that_is_not_a_list_fails_the_run_with_a_code() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let cmds = d.exit(None, "plan", Verdict::Ok, json!({"items": "nope"}));
    assert!(finished(&cmds));
    match d.status() {
        Some(RunStatus::Failed { reason }) => {
            assert!(
                reason.starts_with("Validation/ExpressionFailed"),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn max_visits_ends_a_loop_with_a_session_error() {
    let (_f, p) = loop_pipeline(2);
    let mut d = Driver::new(p, 1);
    d.step(PlanEvent::Start);
    let mut entered = vec!["a".to_owned()];
    for stage in ["a", "b", "a", "b"] {
        let cmds = d.exit(None, stage, Verdict::Ok, json!({"summary": "x"}));
        entered.extend(spawned(&cmds).into_iter().map(|(_, s)| s));
        if finished(&cmds) {
            break;
        }
    }
    assert_eq!(entered, ["a", "b", "a", "b"]);
    match d.status() {
        Some(RunStatus::Failed { reason }) => {
            assert!(reason.starts_with("Session/MaxVisitsExceeded"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_failed_sequential_stage_ends_the_run_failed() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 3);
    d.step(PlanEvent::Start);
    let cmds = d.exit(None, "plan", Verdict::Fail, json!({}));
    assert!(spawned(&cmds).is_empty());
    assert!(matches!(d.status(), Some(RunStatus::Failed { .. })));
}

/// What a simulated sibling is doing.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Sim {
    Spawned,
    Running,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Random widths, caps, failure points, cancel points and report
    /// orders: running never exceeds the cap, nothing is granted after a
    /// failure or cancel, the join only after every sibling is ok, every
    /// cancel is for a live execution, and the run always ends.
    #[test]
    fn planner_invariants(
        width in 0usize..40,
        cap in 1usize..8,
        fail_at in proptest::option::of(0usize..40),
        cancel_after in proptest::option::of(0usize..60),
        choices in proptest::collection::vec(any::<u16>(), 400),
    ) {
        let (_f, p) = map_pipeline(None);
        let mut d = Driver::new(p, cap);
        d.step(PlanEvent::Start);
        d.exit(None, "plan", Verdict::Ok, items(width));
        let mut live: std::collections::BTreeMap<usize, Sim> = d
            .log
            .iter()
            .filter_map(|c| match c { PlanCommand::Spawn(s) => match s.exec.slot { Exec::Unit(u) => Some((u, Sim::Spawned)), _ => None }, _ => None })
            .collect();
        let mut ok: BTreeSet<usize> = BTreeSet::new();
        let mut exited = 0usize;
        let mut ended: HashSet<usize> = HashSet::new();
        let mut stopped = false;
        let mut join_live = d.log.iter().any(|c| matches!(c, PlanCommand::Spawn(s) if s.exec.slot == Exec::Join));
        let mut steps = 0usize;
        let mut choice = choices.into_iter().cycle();
        while d.status().is_none() {
            steps += 1;
            prop_assert!(steps < 2000, "the run did not end");
            if cancel_after == Some(steps) {
                let cmds = d.step(PlanEvent::CancelRun);
                for exec in cancels(&cmds) {
                    if let Exec::Unit(u) = exec { prop_assert!(live.contains_key(&u)); }
                }
                stopped = true;
                continue;
            }
            if join_live {
                d.exit(None, "join", Verdict::Ok, json!({}));
                continue;
            }
            let Some(&unit) = live.keys().nth(usize::from(choice.next().unwrap()) % live.len().max(1)) else {
                // The run has not ended, no join is live and nothing is.
                prop_assert!(false, "stuck with nothing live");
                break;
            };
            let before = d.log.len();
            match live[&unit] {
                Sim::Spawned => {
                    let cmds = d.request(unit);
                    if granted(&cmds).contains(&unit) {
                        prop_assert!(!stopped, "granted after a failure or cancel");
                        live.insert(unit, Sim::Running);
                    } else {
                        // Not granted: the scheduler stops its scope, and
                        // it reports that it never started.
                        live.remove(&unit);
                        ended.insert(unit);
                        d.report(Some(unit), StageOutcome::CancelledBeforeStart);
                    }
                }
                Sim::Running => {
                    live.remove(&unit);
                    ended.insert(unit);
                    if fail_at == Some(unit) {
                        exited += 1;
                        d.exit(Some(unit), "worker", Verdict::Fail, json!({}));
                        stopped = true;
                    } else if stopped {
                        d.cancelled(Some(unit), "worker");
                    } else {
                        exited += 1;
                        ok.insert(unit);
                        d.exit(Some(unit), "worker", Verdict::Ok, json!({}));
                    }
                }
            }
            for c in &d.log[before..] {
                match c {
                    PlanCommand::Spawn(s) => match s.exec.slot {
                        Exec::Unit(u) => {
                            prop_assert!(!stopped, "spawned after a failure or cancel");
                            prop_assert!(!ended.contains(&u) && !live.contains_key(&u));
                            live.insert(u, Sim::Spawned);
                        }
                        Exec::Join => {
                            prop_assert_eq!(ok.len(), width, "join before every sibling was ok");
                            join_live = true;
                        }
                        Exec::Sequential => {}
                    },
                    PlanCommand::Cancel { slot: Exec::Unit(u), .. } => {
                        prop_assert!(live.contains_key(u), "cancel for a unit that is not live");
                    }
                    _ => {}
                }
            }
            let running = live.values().filter(|s| **s == Sim::Running).count();
            prop_assert!(running <= cap, "running {} > cap {}", running, cap);
            prop_assert!(live.len() <= cap);
        }
        // Each sibling is counted once in the summary: it exited, was
        // cancelled, or never started.
        let group = d.log.iter().find_map(|c| match c {
            PlanCommand::Finish(report) => report.groups.first(),
            _ => None,
        });
        if let Some(g) = group {
            prop_assert_eq!(exited + g.cancelled + g.never_started, width, "{:?}", g);
        }
        let status = d.status().cloned();
        prop_assert!(status.is_some());
        let status = status.unwrap_or(RunStatus::Cancelled);
        let failed = fail_at.is_some_and(|f| ended.contains(&f) && !ok.contains(&f));
        match status {
            RunStatus::Ok => prop_assert!(!stopped && ok.len() == width),
            RunStatus::Failed { .. } => prop_assert!(failed),
            RunStatus::Cancelled => prop_assert!(cancel_after.is_some()),
        }
    }
}

#[test]
fn progress_counts_a_sibling_as_running_from_its_grant() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 2);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, json!({"items": [1, 2, 3, 4, 5]}));
    let cmds = d.request(0);
    let progress: Vec<&troupe::runtime::events::Event> = cmds
        .iter()
        .filter_map(|c| match c {
            PlanCommand::Emit(e) if e.name == troupe::runtime::events::EventName::Progress => {
                Some(e)
            }
            _ => None,
        })
        .collect();
    assert_eq!(progress.len(), 1, "a grant updates the counts");
    let p = progress[0].to_json(0);
    assert_eq!(p["running"], 1);
    assert_eq!(p["done"], 0);
    assert_eq!(
        p["waiting"], 4,
        "one spawned not started, three never spawned"
    );
}

#[test]
fn a_cancelled_report_before_the_failure_never_names_the_wrong_sibling() {
    // Sibling 3 failed and cancelled its group's token on its way out;
    // sibling 1's cancellation reaches the scheduler first.
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 4);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, items(8));
    for u in 0..4 {
        d.request(u);
    }
    let cmds = d.cancelled(Some(1), "worker");
    assert!(spawned(&cmds).is_empty(), "held: no sibling starts");
    assert!(!emitted(&cmds).contains(&"ParallelSiblingFailure".to_owned()));
    d.exit(Some(3), "worker", Verdict::Fail, json!({}));
    d.cancelled(Some(0), "worker");
    let cmds = d.cancelled(Some(2), "worker");
    assert!(finished(&cmds));
    let failure = d
        .log
        .iter()
        .find_map(|c| match c {
            PlanCommand::Emit(e) if e.name.as_str() == "ParallelSiblingFailure" => {
                Some(e.to_json(0))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(failure["failedSibling"], "worker#3");
}

#[test]
fn of_two_failed_siblings_the_one_that_exited_first_is_named_whatever_the_report_order() {
    let (_f, p) = map_pipeline(None);
    let mut d = Driver::new(p, 4);
    d.step(PlanEvent::Start);
    d.exit(None, "plan", Verdict::Ok, items(4));
    for u in 0..4 {
        d.request(u);
    }
    // Sibling 2's StageExited has seq 10, sibling 1's seq 11, but sibling
    // 1's report is read first.
    d.seq = 10;
    d.exit(Some(1), "worker", Verdict::Fail, json!({}));
    d.seq = 8;
    d.exit(Some(2), "worker", Verdict::Fail, json!({}));
    d.cancelled(Some(0), "worker");
    d.cancelled(Some(3), "worker");
    let failure = d
        .log
        .iter()
        .find_map(|c| match c {
            PlanCommand::Emit(e) if e.name.as_str() == "ParallelSiblingFailure" => {
                Some(e.to_json(0))
            }
            _ => None,
        })
        .unwrap();
    assert_eq!(failure["failedSibling"], "worker#2");
}

#[path = "planner/resume.rs"]
mod resume;
