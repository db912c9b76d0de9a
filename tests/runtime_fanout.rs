//! Sequential runs, fan-outs, joins, fail-fast and cancellation on the real
//! runtime, plus invariants checked as properties over
//! random widths, caps, latencies and failure points.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::Fixture;
use common::run::{Opts, Outcome, run};
use proptest::prelude::*;
use serde_json::{Value, json};
use troupe::runtime::result::{Kept, Verdict};
use troupe::runtime::summary::RunStatus;

fn llm(id: &str, schema_props: &str, body: &str) -> String {
    format!(
        "---\nid: {id}\nname: Stage {id}\nallowedTools: [Echo]\ncompletionTool: done\ncompletionSchema:\n  type: object\n  properties: {{ {schema_props} }}\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 6\nresolutionPolicy: fail\n---\n{body}\n"
    )
}

/// Checks the invariants every run must keep, from its audit log alone.
fn check_invariants(out: &Outcome, cap: usize) {
    // seq strictly increasing from 1; the numbers the audit log skips
    // belong to observer events (Progress), which it does not keep.
    assert_eq!(out.events[0]["seq"], json!(1));
    for w in out.events.windows(2) {
        assert!(
            w[0]["seq"].as_u64() < w[1]["seq"].as_u64(),
            "seq must be strictly increasing: {} then {}",
            w[0]["seq"],
            w[1]["seq"]
        );
    }
    // Every started execution ends in exactly one of StageExited / StageCancelled.
    let mut open: HashSet<String> = HashSet::new();
    let mut ended: HashMap<String, usize> = HashMap::new();
    let mut running_siblings = 0usize;
    let mut peak = 0usize;
    let mut group_decided = false;
    for e in &out.events {
        let id = e["stageExecutionId"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let sibling = id.contains('#');
        match e["event"].as_str().unwrap() {
            "StageEntered" => {
                assert!(
                    !(sibling && group_decided),
                    "nothing starts after a cancel: {e}"
                );
                assert!(open.insert(id.clone()), "entered twice: {id}");
                if sibling {
                    running_siblings += 1;
                    peak = peak.max(running_siblings);
                }
            }
            "StageExited" | "StageCancelled" => {
                // Fail-fast takes effect at the failing sibling's Exit.
                if sibling && e["verdict"] == "fail" {
                    group_decided = true;
                }
                assert!(open.remove(&id), "ended without starting: {e}");
                *ended.entry(id.clone()).or_default() += 1;
                if sibling {
                    running_siblings -= 1;
                }
            }
            "ParallelSiblingFailure" => group_decided = true,
            "WorkflowExit" => assert!(
                open.is_empty(),
                "executions still open at WorkflowExit: {open:?}"
            ),
            _ => {}
        }
    }
    assert!(open.is_empty(), "every started execution ends: {open:?}");
    assert!(ended.values().all(|n| *n == 1), "exactly one end each");
    assert!(
        peak <= cap,
        "running siblings {peak} exceeded the cap {cap}"
    );
    assert_eq!(out.events.last().unwrap()["event"], "WorkflowExit");
}

#[test]
fn acceptance_21_sequential_chain_turns_and_upstream() {
    let yaml =
        "id: seq\nentry: a\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\nnext:\n  a: b\n  b: c\n";
    let script = "stages:\n  a:\n    - complete: { v: from-a }\n  b:\n    - complete: { v: \"{{ctx.upstream[0].parsed.v}}\" }\n  c:\n    - complete: { v: c }\n";
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &llm("a", "", "x")),
            ("b.md", &llm("b", "", "prior={{ctx.upstream[0].parsed.v}}")),
            ("c.md", &llm("c", "", "x")),
            ("script.yaml", script),
        ],
    );
    let out = run(f.path(), Opts::default());
    assert_eq!(out.report.status, RunStatus::Ok);
    assert_eq!(out.count("SessionTurnStart"), 3);
    assert_eq!(out.count("SessionTurnEnd"), 3);
    let seq_of = |stage: &str, event: &str, phase: Option<&str>| {
        out.events
            .iter()
            .find(|e| {
                e["stageId"] == stage
                    && e["event"] == event
                    && phase.is_none_or(|p| e["phase"] == p)
            })
            .unwrap()["seq"]
            .as_u64()
            .unwrap()
    };
    assert!(seq_of("a", "StageExited", None) < seq_of("b", "StagePreFired", Some("Setup")));
    assert_eq!(
        out.report.results["b"].result().parsed["v"],
        "from-a",
        "b saw a's StageResult as ctx.upstream[0]"
    );
    let reqs = out.requests();
    let b_prompt = format!("{:?}", reqs[1].messages[0]);
    assert!(b_prompt.contains("prior=from-a"), "{b_prompt}");
}

/// `yaml` with an LLM stage file for each of `stages` and `script`.
fn llm_pipeline(yaml: &str, stages: &[&str], script: &str) -> Fixture {
    let files: Vec<(String, String)> = stages
        .iter()
        .map(|s| (format!("{s}.md"), llm(s, "", "x")))
        .collect();
    let mut all: Vec<(&str, &str)> = files
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    all.push(("script.yaml", script));
    Fixture::new(yaml, &all)
}

#[test]
fn acceptance_22_static_fan_out_is_one_compound_turn_join_sees_plan_order() {
    let yaml = "id: fan\nentry: a\nstages:\n  a: a.md\n  x: x.md\n  y: y.md\n  z: z.md\n  j: j.md\nnext:\n  a: { parallel: [z, x, y], join: j }\n";
    let script = "stages:\n  x:\n    - { complete: { v: x }, latency: 30ms }\n  y:\n    - { complete: { v: y }, latency: 10ms }\n  z:\n    - { complete: { v: z }, latency: 20ms }\n  j:\n    - complete: { seen: \"{{ctx.upstream}}\" }\n";
    let out = run(
        llm_pipeline(yaml, &["a", "x", "y", "z", "j"], script).path(),
        Opts::default(),
    );
    assert_eq!(out.report.status, RunStatus::Ok);
    assert_eq!(
        out.count("SessionTurnStart"),
        2,
        "entry turn + one compound turn"
    );
    let compound = out.named("SessionTurnStart")[1]["turnId"].clone();
    let ends: Vec<&Value> = out
        .named("SessionTurnEnd")
        .into_iter()
        .filter(|e| e["turnId"] == compound)
        .collect();
    assert_eq!(ends.len(), 1);
    let join_exit = out
        .of_stage("j")
        .into_iter()
        .find(|e| e["event"] == "StageExited")
        .unwrap()["seq"]
        .as_u64()
        .unwrap();
    assert!(
        ends[0]["seq"].as_u64().unwrap() > join_exit,
        "the compound turn ends after the join's Exit"
    );
    let join = out.report.results["j"].result();
    let seen: Vec<&str> = join.parsed["seen"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["parsed"]["v"].as_str().unwrap())
        .collect();
    assert_eq!(seen, ["z", "x", "y"], "plan order, not finish order");
    // The run keeps its siblings' results packed (their JSON as text, see
    // `Kept`) and its sequential stages' and join's whole; every one of
    // them reads back the same.
    for kept in &out.report.all_results {
        let sibling = ["x", "y", "z"].contains(&kept.stage_id());
        assert_eq!(
            matches!(kept, Kept::Packed(_)),
            sibling,
            "{} kept packed only as a sibling",
            kept.stage_id()
        );
    }
    let packed = out.report.all_results.iter().find(|k| k.stage_id() == "x");
    let x = packed.unwrap().result();
    assert_eq!((x.verdict, &*x.parsed), (Verdict::Ok, &json!({"v": "x"})));
    check_invariants(&out, 8);
}

fn map_fixture(width: usize, cap: usize, worker_script: &str) -> Fixture {
    let yaml = format!(
        "id: map\nentry: plan\nparallelCap: {cap}\nctx:\n  width: {{ default: {width} }}\nstages:\n  plan: plan.md\n  worker: worker.md\n  join: join.md\nnext:\n  plan: {{ parallel: {{ map: worker, over: \"ctx.upstream[0].parsed.items\" }}, join: join }}\n"
    );
    let script = format!(
        "stages:\n  plan:\n    - complete: {{ items: {{ $range: \"{{{{ctx.width}}}}\" }} }}\n{worker_script}  join:\n    - complete: {{ seen: \"{{{{ctx.upstream}}}}\" }}\n"
    );
    Fixture::new(
        &yaml,
        &[
            ("plan.md", &llm("plan", "", "x")),
            (
                "worker.md",
                &llm("worker", "", "item {{ctx.item}} at {{ctx.index}}"),
            ),
            ("join.md", &llm("join", "", "x")),
            ("script.yaml", &script),
        ],
    )
}

#[test]
fn acceptance_23_map_of_50_under_cap_4() {
    let worker = "  worker:\n    - { tool: Echo, args: { text: \"item {{ctx.item}}\" }, latency: 10ms }\n    - { complete: { item: \"{{ctx.item}}\", index: \"{{ctx.index}}\" }, latency: 5ms }\n";
    let out = run(map_fixture(50, 4, worker).path(), Opts::default());
    assert_eq!(out.report.status, RunStatus::Ok);
    check_invariants(&out, 4);
    let peak = out.report.groups[0].peak_running;
    assert_eq!(peak, 4, "the cap is reached and never exceeded");
    let seen = out.report.results["join"].result().parsed["seen"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(seen.len(), 50);
    for (i, r) in seen.iter().enumerate() {
        assert_eq!(r["parsed"]["item"], json!(i), "list order");
        assert_eq!(r["parsed"]["index"], json!(i));
        assert!(
            r["stageExecutionId"]
                .as_str()
                .unwrap()
                .ends_with(&format!("/worker#{i}/1"))
        );
    }
    // Lazy feed: 50 siblings at 15ms each under cap 4 take ceil(50/4) rounds.
    assert_eq!(out.report.groups[0].cap_waits, 46);
}

#[test]
fn a_fan_out_with_its_own_cap_never_runs_more_siblings_than_it() {
    let worker = "  worker:\n    - { complete: { item: \"{{ctx.item}}\" }, latency: 10ms }\n";
    let f = map_fixture(20, 8, worker);
    let yaml = std::fs::read_to_string(f.file("pipeline.yaml")).unwrap();
    std::fs::write(
        f.file("pipeline.yaml"),
        yaml.replace("join: join }", "join: join, cap: 3 }"),
    )
    .unwrap();
    let out = run(f.path(), Opts::default());
    assert_eq!(out.report.status, RunStatus::Ok);
    check_invariants(&out, 3);
    assert_eq!(out.report.groups[0].cap, 3);
    assert_eq!(out.report.groups[0].peak_running, 3);
    let turn = &out.named("SessionTurnStart")[1];
    assert_eq!(turn["cap"], 3);
}

#[test]
fn acceptance_24_fail_fast_cancels_running_siblings_and_drops_their_requests() {
    // Sibling 2's model turn fails after 10 ms, while the others wait 100 ms on theirs.
    let worker = "  worker:\n    - { tool: Echo, args: { text: \"item {{ctx.item}}\" }, latency: 100ms }\n    - complete: { ok: true }\n  \"worker#2\":\n    - { fail: terminal, message: sibling two broke, latency: 10ms }\n";
    let f = map_fixture(5, 5, worker);
    let out = run(f.path(), Opts::default());
    match &out.report.status {
        RunStatus::Failed { reason } => assert!(
            reason.contains("ExtensionHost/ParallelSiblingFailure") && reason.contains("worker#2"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    let failure = out.named("ParallelSiblingFailure");
    assert_eq!(failure.len(), 1);
    assert_eq!(failure[0]["failedSibling"], "worker#2");
    let cancelled: Vec<String> = out
        .named("StageCancelled")
        .iter()
        .map(|e| {
            e["stageExecutionId"]
                .as_str()
                .unwrap()
                .rsplit('/')
                .nth(1)
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(cancelled.len(), 4, "{cancelled:?}");
    for e in out.named("StageCancelled") {
        assert_eq!(e["phase"], "Act");
        assert_eq!(e["turn"], 1);
        assert!(
            e["reason"]
                .as_str()
                .unwrap()
                .contains("ParallelSiblingFailure")
        );
    }
    let exited: Vec<&Value> = out
        .named("StageExited")
        .into_iter()
        .filter(|e| e["stageId"] == "worker")
        .collect();
    assert_eq!(exited.len(), 1, "only the failed sibling exits");
    assert!(out.of_stage("join").is_empty(), "the join is never entered");
    assert_eq!(
        out.provider.dropped.load(Ordering::SeqCst),
        4,
        "the four in-flight model requests were dropped"
    );
    check_invariants(&out, 5);
}

#[test]
fn fail_fast_records_every_cancellation_before_it_tears_any_sibling_down() {
    // Twenty siblings hold a model request for 100 ms; worker#7 fails at
    // 10 ms. Every other sibling's StageCancelled must be published before
    // any of their in-flight requests is dropped: the record is the cheap
    // part of a cancellation, and the teardown of thousands of siblings
    // must not delay the last record (BENCHMARKS.md, cancel latency).
    let worker = "  worker:\n    - { tool: Echo, args: { text: hi }, latency: 100ms }\n    - complete: { ok: true }\n  \"worker#7\":\n    - { fail: terminal, latency: 10ms }\n";
    let out = run(map_fixture(20, 20, worker).path(), Opts::default());
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    let cancels: Vec<u64> = out
        .named("StageCancelled")
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(cancels.len(), 19);
    let last_cancel = *cancels.iter().max().unwrap();
    let dropped_after = out.provider.dropped_after.lock().unwrap().clone();
    assert_eq!(dropped_after.len(), 19, "every held request is dropped");
    for seq in dropped_after {
        assert!(
            seq >= last_cancel,
            "a request was dropped after event {seq}, before the last StageCancelled ({last_cancel})"
        );
    }
    check_invariants(&out, 20);
}

#[test]
fn fail_fast_stops_siblings_at_the_failing_exit_not_when_the_report_is_read() {
    // Fifty siblings whose first turns all end at the same instant; the
    // middle one fails there. Whatever order the others are woken in, none
    // that runs after the failing Exit may do anything but be cancelled:
    // no tool call, no further request, no Exit.
    let worker = "  worker:\n    - { tool: Echo, args: { text: hi }, latency: 10ms }\n    - { complete: { ok: true }, latency: 10ms }\n  \"worker#25\":\n    - { fail: terminal, latency: 10ms }\n";
    let out = run(map_fixture(50, 50, worker).path(), Opts::default());
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    let failed_exit = out
        .named("StageExited")
        .into_iter()
        .find(|e| e["verdict"] == "fail")
        .expect("the failing sibling exits");
    let failed_exec = failed_exit["stageExecutionId"].as_str().unwrap();
    let fail_seq = failed_exit["seq"].as_u64().unwrap();
    let after: Vec<&Value> = out
        .events
        .iter()
        .filter(|e| e["seq"].as_u64().unwrap() > fail_seq)
        .filter(|e| e["stageId"] == "worker" && e["stageExecutionId"] != failed_exec)
        .collect();
    for e in &after {
        assert!(
            ["StageCancelled", "ToolInvocationCancelled"].contains(&e["event"].as_str().unwrap()),
            "a sibling went on after the failing Exit: {e}"
        );
    }
    let cancelled = out.count("StageCancelled");
    let exited_ok = out
        .named("StageExited")
        .iter()
        .filter(|e| e["stageId"] == "worker" && e["verdict"] == "ok")
        .count();
    assert_eq!(
        cancelled + exited_ok,
        49,
        "every other sibling ends exactly once"
    );
    assert!(cancelled > 0);
    for e in out.named("StageCancelled") {
        assert_eq!(
            e["reason"],
            "ExtensionHost/ParallelSiblingFailure: sibling worker#25 failed"
        );
    }
    check_invariants(&out, 50);
}

#[test]
fn acceptance_25_siblings_waiting_for_a_slot_never_start_after_failure() {
    let worker = "  worker:\n    - { complete: { ok: true }, latency: 50ms }\n  \"worker#0\":\n    - { fail: terminal }\n";
    let out = run(map_fixture(5, 2, worker).path(), Opts::default());
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    let entered: Vec<&str> = out
        .named("StageEntered")
        .iter()
        .filter_map(|e| e["index"].as_u64())
        .map(|i| if i < 2 { "running" } else { "waiting" })
        .collect();
    // Sibling 1 was granted its slot together with sibling 0, but sibling 0
    // fails on its first poll, before sibling 1 begins: it never starts
    // either. Siblings 2..5 were waiting for a slot and never started.
    assert_eq!(entered, ["running"]);
    assert_eq!(out.count("StageCancelled"), 0);
    let group = &out.report.groups[0];
    assert_eq!((group.cancelled, group.never_started), (0, 4), "{group:?}");
    check_invariants(&out, 2);
}

#[test]
fn acceptance_26_interrupt_during_fan_out_cancels_every_running_stage() {
    let worker = "  worker:\n    - { tool: Echo, args: { text: hi }, latency: 1s }\n    - complete: { ok: true }\n";
    let out = run(
        map_fixture(6, 3, worker).path(),
        Opts {
            cancel_after: Some(Duration::from_millis(500)),
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Cancelled);
    assert_eq!(out.count("StageCancelled"), 3, "the three running siblings");
    assert!(
        out.named("StageCancelled")
            .iter()
            .all(|e| e["reason"] == "Cancellation/TurnCancelled")
    );
    let last = out.events.last().unwrap();
    assert_eq!(last["event"], "WorkflowExit");
    assert_eq!(last["status"], "cancelled");
    assert_eq!(out.provider.dropped.load(Ordering::SeqCst), 3);
    check_invariants(&out, 3);
}

#[test]
fn acceptance_27_max_visits_stops_a_loop() {
    let yaml = "id: loop\nentry: plan\nmaxVisits: 3\nstages:\n  plan: plan.md\n  review: review.md\n  again: { kind: if_else, condition: \"true\", then: plan, else: review }\nnext:\n  plan: review\n  review: again\n";
    let f = Fixture::new(
        yaml,
        &[
            ("plan.md", &llm("plan", "", "x")),
            ("review.md", &llm("review", "", "x")),
        ],
    );
    let out = run(f.path(), Opts::default());
    match &out.report.status {
        RunStatus::Failed { reason } => assert!(
            reason.contains("Session/MaxVisitsExceeded")
                && reason.contains("`plan` entered 4 times"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        out.of_stage("plan")
            .iter()
            .filter(|e| e["event"] == "StageEntered")
            .count(),
        3
    );
}

#[test]
fn acceptance_28_deterministic_steps() {
    let yaml = "id: steps\nentry: talk\nctx:\n  go: { default: yes }\nstages:\n  talk: talk.md\n  extract: { kind: extract_json, from: \"ctx.upstream[0].parsed.text\" }\n  route: { kind: switch, on: \"ctx.upstream[0].parsed[1].category\", cases: { bug: bug-out }, default: other-out }\n  bug-out: { kind: print, content: \"bug {{ctx.upstream[0].parsed[0].score}}\" }\n  other-out: { kind: print, content: \"other\" }\nnext:\n  talk: extract\n  extract: route\n";
    let talk = |category: &str| {
        format!(
            "stages:\n  talk:\n    - complete:\n        text: \"Score:\\n```json\\n{{\\\"score\\\": 8}}\\n```\\nand {{\\\"category\\\": \\\"{category}\\\"}} done\"\n"
        )
    };
    for (category, printed, route) in [("bug", "bug 8", "bug-out"), ("idea", "other", "other-out")]
    {
        let f = Fixture::new(
            yaml,
            &[
                ("talk.md", &llm("talk", "", "x")),
                ("script.yaml", &talk(category)),
            ],
        );
        let out = run(f.path(), Opts::default());
        assert_eq!(out.report.status, RunStatus::Ok, "{:?}", out.report.status);
        assert_eq!(
            out.report.results["extract"].result().parsed.as_ref(),
            &json!([{"score": 8}, {"category": category}]),
            "a fence and a raw object become an array of two"
        );
        assert_eq!(
            out.report.results[route].result().output["text"],
            printed,
            "print after switch reads the step before it"
        );
        for step in ["extract", "route", route] {
            let phases = out
                .trace(step)
                .iter()
                .filter(|t| t.starts_with("pre:"))
                .count();
            assert_eq!(phases, 7, "{step} emits the same phase events as any stage");
        }
    }
    // if_else both ways.
    let yaml = "id: ifelse\nentry: pick\nctx:\n  flag: { default: true }\nstages:\n  pick: { kind: if_else, condition: \"ctx.flag\", then: yes-out, else: no-out }\n  yes-out: { kind: print, content: \"yes\" }\n  no-out: { kind: print, content: \"no\" }\n";
    for (flag, stage) in [(true, "yes-out"), (false, "no-out")] {
        let out = run(
            Fixture::new(yaml, &[]).path(),
            Opts {
                fields: vec![("flag", json!(flag))],
                ..Opts::default()
            },
        );
        assert_eq!(out.report.status, RunStatus::Ok);
        assert!(
            out.report.results.contains_key(stage) && out.report.results.len() == 2,
            "{:?}",
            out.report.results.keys()
        );
    }
}

#[test]
fn a_panic_in_a_sibling_is_its_typed_failure_and_the_run_ends() {
    let worker = "  worker:\n    - { complete: { ok: true }, latency: 20ms }\n";
    let out = run(
        map_fixture(4, 4, worker).path(),
        Opts {
            panic_in: Some("worker"),
            ..Opts::default()
        },
    );
    match &out.report.status {
        RunStatus::Failed { reason } => assert!(
            reason.contains("ExtensionHost/ActorPanicked") && reason.contains("provider exploded"),
            "{reason}"
        ),
        other => panic!("{other:?}"),
    }
    let exited: Vec<&Value> = out
        .named("StageExited")
        .into_iter()
        .filter(|e| e["stageId"] == "worker")
        .collect();
    assert!(!exited.is_empty());
    assert!(exited.iter().all(|e| {
        e["reason"]
            .as_str()
            .unwrap()
            .starts_with("ExtensionHost/ActorPanicked")
    }));
    check_invariants(&out, 4);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Random widths, caps, per-sibling latencies and failure points.
    #[test]
    fn fan_out_invariants_hold(width in 0usize..30, cap in 1usize..7, fail_at in proptest::option::of(0usize..30), latencies in proptest::collection::vec(0u64..40, 30), interrupt in proptest::option::of(1u64..120)) {
        let mut worker = String::from("  worker:\n    - { tool: Echo, args: { text: x }, latency: 7ms }\n    - { complete: { ok: true }, latency: 3ms }\n");
        for (i, ms) in latencies.iter().enumerate().take(width) {
            if Some(i) == fail_at {
                worker.push_str(&format!("  \"worker#{i}\":\n    - {{ fail: terminal, latency: {ms}ms }}\n"));
            } else {
                worker.push_str(&format!("  \"worker#{i}\":\n    - {{ tool: Echo, args: {{ text: x }}, latency: {ms}ms }}\n    - {{ complete: {{ ok: true }}, latency: {}ms }}\n", ms / 2));
            }
        }
        let out = run(map_fixture(width, cap, &worker).path(), Opts { cancel_after: interrupt.map(Duration::from_millis), ..Opts::default() });
        check_invariants(&out, cap);
        let failed = fail_at.is_some_and(|f| f < width);
        let join_entered = out.of_stage("join").iter().any(|e| e["event"] == "StageEntered");
        match &out.report.status {
            RunStatus::Ok => {
                prop_assert!(!failed);
                prop_assert!(join_entered);
                let ok = out.named("StageExited").iter().filter(|e| e["stageId"] == "worker" && e["verdict"] == "ok").count();
                prop_assert_eq!(ok, width, "the join runs only after every sibling is ok");
                let join_seq = out.of_stage("join")[0]["seq"].as_u64().unwrap();
                let last_sibling = out.named("StageExited").iter().filter(|e| e["stageId"] == "worker").map(|e| e["seq"].as_u64().unwrap()).max().unwrap_or(0);
                prop_assert!(join_seq > last_sibling);
            }
            RunStatus::Failed { .. } => {
                prop_assert!(failed);
                prop_assert!(!join_entered, "the join never runs after a failure");
            }
            RunStatus::Cancelled => prop_assert!(interrupt.is_some()),
        }
    }
}

/// A static group's siblings each take their own stage's visit: a stage
/// entered once before the group and once after it gets three distinct
/// execution ids, not the group's shared one twice.
#[test]
fn static_siblings_number_their_own_visits() {
    let yaml = "id: visits\nentry: b\nstages:\n  a: a.md\n  b: b.md\n  c: c.md\n  j: j.md\nnext:\n  b: c\n  c: { parallel: [a, b], join: j }\n  j: a\n";
    let script = "stages:\n  a:\n    - complete: { v: a }\n  b:\n    - complete: { v: b }\n  c:\n    - complete: { v: c }\n  j:\n    - complete: { v: j }\n";
    let out = run(
        llm_pipeline(yaml, &["a", "b", "c", "j"], script).path(),
        Opts::default(),
    );
    assert_eq!(out.report.status, RunStatus::Ok);
    let mut ids: Vec<String> = out
        .named("StageEntered")
        .iter()
        .map(|e| e["stageExecutionId"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 6, "{ids:?}");
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 6, "an id given twice: {ids:?}");
}
