//! A resumed run's planner: stored results restored, not run again.

use super::*;

#[test]
fn a_restored_run_skips_finished_executions_and_runs_the_rest() {
    use troupe::runtime::scheduler::Restore;
    let (_f, p) = map_pipeline(None);
    let run = RunId::new();
    let mut d = Driver::new(Arc::clone(&p), 2);
    d.planner = Planner::new(p, run.clone(), Arc::new(serde_json::Map::new()), 2);
    let result =
        |stage: &str, id: String, parsed: Value| Arc::new(StageResult::ok(stage, &id, parsed));
    let mut restore = Restore::default();
    for (id, r) in [
        (
            format!("{run}/plan/1"),
            result("plan", format!("{run}/plan/1"), items(5)),
        ),
        (
            format!("{run}/worker#0/1"),
            result("worker", format!("{run}/worker#0/1"), json!({"n": 0})),
        ),
        (
            format!("{run}/worker#3/1"),
            result("worker", format!("{run}/worker#3/1"), json!({"n": 3})),
        ),
    ] {
        // As a resume reads them from the store: packed.
        let kept = Kept::packed(
            Arc::clone(&r),
            r.stage_id.as_str().into(),
            id.as_str().into(),
        );
        Arc::make_mut(&mut restore.results).insert(id.as_str().into(), kept);
    }
    restore.turns_started.insert(format!("{run}/turn/1"));
    restore.turns_ended.insert(format!("{run}/turn/1"));
    restore.turns_started.insert(format!("{run}/turn/2"));
    d.planner.restore(restore);
    let cmds = d.step(PlanEvent::Start);
    // The plan is restored, the group resumes with siblings 1 and 2 (cap
    // 2; 0 and 3 are done); nothing already in the log is emitted again.
    assert_eq!(
        spawned(&cmds),
        [
            (Exec::Unit(1), "worker".to_owned()),
            (Exec::Unit(2), "worker".to_owned())
        ]
    );
    assert!(
        !emitted(&cmds)
            .iter()
            .any(|e| e == "SessionTurnStart" || e == "SessionTurnEnd"),
        "{:?}",
        emitted(&cmds)
    );
    // The siblings run again see the state as the group started, as in a
    // fresh run: the plan's result, no sibling's.
    for c in &cmds {
        if let PlanCommand::Spawn(s) = c {
            let seen: Vec<&String> = s.ctx.results.keys().collect();
            assert_eq!(seen, ["plan"], "{:?}", s.exec.slot);
        }
    }
    d.request(1);
    d.request(2);
    let cmds = d.exit(Some(1), "worker", Verdict::Ok, json!({"n": 1}));
    assert_eq!(
        spawned(&cmds),
        [(Exec::Unit(4), "worker".to_owned())],
        "the freed slot skips done sibling 3"
    );
    d.request(4);
    d.exit(Some(2), "worker", Verdict::Ok, json!({"n": 2}));
    let cmds = d.exit(Some(4), "worker", Verdict::Ok, json!({"n": 4}));
    let join = cmds
        .iter()
        .find_map(|c| match c {
            PlanCommand::Spawn(s) if s.exec.slot == Exec::Join => Some(s),
            _ => None,
        })
        .expect("the join starts once every sibling is done");
    let seen: Vec<Value> = join
        .ctx
        .upstream
        .iter()
        .map(|r| r.result().parsed["n"].clone())
        .collect();
    assert_eq!(
        seen,
        [json!(0), json!(1), json!(2), json!(3), json!(4)],
        "plan order"
    );
}

/// A loop resumed after many turns replays its stored results one after
/// another, not each inside the last: twenty thousand of them would
/// overflow a thread's stack if nested.
#[test]
fn a_loop_resumed_after_many_turns_replays_without_nesting() {
    use troupe::runtime::scheduler::Restore;
    let (_f, p) = loop_pipeline(1_000_000);
    let run = RunId::new();
    let mut d = Driver::new(Arc::clone(&p), 2);
    d.planner = Planner::new(p, run.clone(), Arc::new(serde_json::Map::new()), 2);
    let mut restore = Restore::default();
    let turns = 10_000;
    for visit in 1..=turns {
        for stage in ["a", "b"] {
            let id = format!("{run}/{stage}/{visit}");
            let r = Arc::new(StageResult::ok(stage, &id, json!({"summary": "s"})));
            let kept = Kept::packed(Arc::clone(&r), stage.into(), id.as_str().into());
            Arc::make_mut(&mut restore.results).insert(id.as_str().into(), kept);
        }
    }
    for turn in 1..=2 * turns {
        restore.turns_started.insert(format!("{run}/turn/{turn}"));
        restore.turns_ended.insert(format!("{run}/turn/{turn}"));
    }
    d.planner.restore(restore);
    let cmds = d.step(PlanEvent::Start);
    let spawned = spawned(&cmds);
    assert_eq!(spawned.len(), 1, "{spawned:?}");
    assert_eq!(spawned[0].1, "a");
    let next = cmds.iter().find_map(|c| match c {
        PlanCommand::Spawn(s) => Some(s.exec.id.to_string()),
        _ => None,
    });
    assert_eq!(next, Some(format!("{run}/a/{}", turns + 1)));
}
