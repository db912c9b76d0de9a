//! One stage execution on the real runtime, on paused
//! time with the scripted provider; observed through the audit events and
//! the requests the provider received.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::Fixture;
use common::run::{Opts, run};
use serde_json::json;
use troupe::provider::Message;
use troupe::runtime::summary::RunStatus;

/// tokio fires a timer on the millisecond tick after its deadline, so on the
/// paused clock every sleep of a whole number of ms lasts one tick longer.
/// Exact, not a tolerance: each expected wait adds exactly one tick.
const TICK: Duration = Duration::from_millis(1);

/// A stage file with every knob exposed.
fn llm(
    id: &str,
    turn_cap: u32,
    attempts: u32,
    backoff: &str,
    resolution: &str,
    extra: &str,
    body: &str,
) -> String {
    format!(
        "---\nid: {id}\nname: Stage {id}\nallowedTools: [Echo]\ncompletionTool: done\ncompletionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: {{ type: string }}\nretryPolicy:\n  maxAttempts: {attempts}\n  backoff: {backoff}\nturnCap: {turn_cap}\nresolutionPolicy: {resolution}\n{extra}---\n{body}\n"
    )
}

fn one_stage(stage: &str, script: &str, pipeline_extra: &str) -> Fixture {
    let yaml = format!(
        "id: one\nentry: a\nctx:\n  task: {{ default: demo }}\nstages:\n  a: a.md\n{pipeline_extra}"
    );
    Fixture::new(&yaml, &[("a.md", stage), ("script.yaml", script)])
}

#[test]
fn acceptance_10_phases_in_order_each_pre_then_post() {
    let f = one_stage(
        &llm("a", 5, 1, "none", "fail", "", "x"),
        "stages:\n  a:\n    - complete: { summary: s }\n",
        "",
    );
    let out = run(f.path(), Opts::default());
    assert_eq!(out.report.status, RunStatus::Ok);
    let phases: Vec<String> = out
        .trace("a")
        .into_iter()
        .filter(|t| t.contains(':'))
        .collect();
    let expected: Vec<String> = [
        "Setup",
        "Init",
        "CheckGate",
        "Act",
        "Assert",
        "Exit",
        "Next",
    ]
    .iter()
    .flat_map(|p| [format!("pre:{p}"), format!("post:{p}")])
    .collect();
    assert_eq!(phases, expected);
    let trace = out.trace("a");
    assert_eq!(trace.first().map(String::as_str), Some("StageEntered"));
    let exited = trace.iter().position(|t| t == "StageExited").unwrap();
    assert!(
        trace[exited - 1] == "pre:Exit" && trace[exited + 1] == "post:Exit",
        "{trace:?}"
    );
}

#[test]
fn acceptance_11_schema_failure_returns_as_tool_result_then_valid_completion_ends_act() {
    let script =
        "stages:\n  a:\n    - complete: { summary: 42 }\n    - complete: { summary: fixed }\n";
    let out = run(
        one_stage(&llm("a", 5, 1, "none", "fail", "", "x"), script, "").path(),
        Opts::default(),
    );
    assert_eq!(out.report.status, RunStatus::Ok);
    let reqs = out.requests();
    assert_eq!(reqs.len(), 2);
    let last = reqs[1].messages.last().unwrap();
    match last {
        Message::Tool {
            tool_call_id,
            content,
        } => {
            assert_eq!(&**tool_call_id, "call_1_0");
            assert!(
                content.contains("Validation/CompletionSchemaMismatch")
                    && content.contains("/summary"),
                "{content}"
            );
        }
        other => panic!("expected the schema error as a tool result, got {other:?}"),
    }
    assert_eq!(
        out.report.results["a"].result().parsed.as_ref(),
        &json!({"summary": "fixed"})
    );
    assert_eq!(out.count("StageAssertOutcome"), 1);
}

fn rejected_batch(script: &str) {
    // turnCap 2: the rejected batch counts, so a plain-text second turn hits the cap.
    let out = run(
        one_stage(&llm("a", 2, 1, "none", "fail", "", "x"), script, "").path(),
        Opts::default(),
    );
    assert_eq!(
        out.count("ToolInvocationStarted"),
        0,
        "no call of a rejected batch runs"
    );
    assert_eq!(out.count("ToolInvocationProposed"), 0);
    assert_eq!(out.requests().len(), 2);
    let results = out.tool_results();
    assert!(
        !results.is_empty() && results.iter().all(|c| c.contains("CompletionNotSole")),
        "{results:?}"
    );
    let exited = &out.named("StageExited")[0];
    assert_eq!(exited["capHit"], true);
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
}

#[test]
fn acceptance_12_completion_batched_with_another_call_is_rejected_whole() {
    rejected_batch(
        "stages:\n  a:\n    - calls: [ { tool: Echo, args: { text: hi } }, { tool: done, args: { summary: s } } ]\n    - text: still thinking\n",
    );
}

#[test]
fn acceptance_13_two_completion_calls_are_rejected() {
    rejected_batch(
        "stages:\n  a:\n    - calls: [ { tool: done, args: { summary: a } }, { tool: done, args: { summary: b } } ]\n    - text: still thinking\n",
    );
}

#[test]
fn acceptance_14_plain_text_gets_a_steering_message_and_counts() {
    let script = "stages:\n  a:\n    - text: let me think\n    - complete: { summary: s }\n";
    let out = run(
        one_stage(&llm("a", 5, 1, "none", "fail", "", "x"), script, "").path(),
        Opts::default(),
    );
    let reqs = out.requests();
    assert_eq!(reqs.len(), 2);
    match reqs[1].messages.last().unwrap() {
        Message::User { content } => assert_eq!(content, "Call `done` when you are done."),
        other => panic!("{other:?}"),
    }
    // With turnCap 1 the same text turn exhausts the cap.
    let out = run(
        one_stage(&llm("a", 1, 1, "none", "fail", "", "x"), script, "").path(),
        Opts::default(),
    );
    assert_eq!(out.requests().len(), 1);
    assert_eq!(out.named("StageExited")[0]["capHit"], true);
}

#[test]
fn acceptance_15_turn_cap_ends_act_after_exactly_n_turns_last_tools_finish_unsent() {
    let script = "stages:\n  a:\n    turns:\n      - tool: Echo\n        args: { text: again }\n    repeat: true\n";
    let out = run(
        one_stage(&llm("a", 2, 1, "none", "fail", "", "x"), script, "").path(),
        Opts::default(),
    );
    assert_eq!(
        out.count("ProviderRequestStarted"),
        2,
        "exactly turnCap model turns"
    );
    assert_eq!(
        out.count("ToolInvocationSucceeded"),
        2,
        "the last turn's call still finishes"
    );
    let assert = &out.named("StageAssertOutcome")[0];
    assert_eq!(assert["capHit"], true);
    let exited = &out.named("StageExited")[0];
    assert_eq!(exited["capHit"], true);
    assert!(
        exited["reason"]
            .as_str()
            .unwrap()
            .starts_with("RetryExhausted"),
        "{exited}"
    );
    assert_eq!(
        out.count("StageCancelled"),
        0,
        "a cap hit is not a cancellation"
    );
}

#[test]
fn acceptance_16_retry_reenters_act_in_the_same_transcript_then_retry_exhausted() {
    let script =
        "stages:\n  a:\n    - complete: { summary: first }\n    - complete: { summary: second }\n";
    let f = one_stage(
        &llm("a", 5, 2, "none", "fail", "", "x"),
        script,
        "assert:\n  a: [\"parsed.summary == 'never'\"]\n",
    );
    let out = run(f.path(), Opts::default());
    let reqs = out.requests();
    assert_eq!(reqs.len(), 2, "Act ran twice");
    // Same transcript: the second attempt starts from everything the first had.
    assert_eq!(
        &reqs[1].messages[..reqs[0].messages.len()],
        &reqs[0].messages[..]
    );
    let retry_msg = reqs[1].messages.last().unwrap();
    match retry_msg {
        Message::User { content } => assert!(
            content.contains("attempt 2 of 2") && content.contains("parsed.summary == 'never'"),
            "{content}"
        ),
        other => panic!("{other:?}"),
    }
    let verdicts: Vec<&str> = out
        .named("StageAssertOutcome")
        .iter()
        .map(|e| e["verdict"].as_str().unwrap())
        .collect();
    assert_eq!(verdicts, ["retry", "fail"]);
    let exited = &out.named("StageExited")[0];
    assert_eq!(exited["verdict"], "fail");
    assert_eq!(exited["attemptCount"], 2);
    assert!(
        exited["reason"]
            .as_str()
            .unwrap()
            .starts_with("RetryExhausted")
    );
}

#[test]
fn acceptance_17_fixed_backoff_delays_the_retry_by_exactly_two_seconds() {
    let script =
        "stages:\n  a:\n    - complete: { summary: first }\n    - complete: { summary: ok }\n";
    let f = one_stage(
        &llm("a", 5, 2, "{ fixed: 2s }", "fail", "", "x"),
        script,
        "assert:\n  a: [\"attempt > 1\"]\n",
    );
    let out = run(f.path(), Opts::default());
    assert_eq!(out.report.status, RunStatus::Ok);
    assert_eq!(
        out.elapsed,
        Duration::from_secs(2) + TICK,
        "the only wait in the run is the backoff"
    );
}

#[test]
fn acceptance_18_templates_render_typed_values_once_across_retries() {
    let body = "task={{ctx.task}} n={{ctx.n}} flag={{ctx.flag}} obj={{ctx.obj}} name={{stage.name}} id={{stage.id}}";
    let yaml = "id: one\nentry: a\nctx:\n  task: { default: demo }\n  n: { default: 3 }\n  flag: { default: true }\n  obj: { default: { k: [1, 2] } }\nstages:\n  a: a.md\nassert:\n  a: [\"attempt > 1\"]\n";
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &llm("a", 5, 2, "none", "fail", "", body)),
            (
                "script.yaml",
                "stages:\n  a:\n    - complete: { summary: x }\n    - complete: { summary: y }\n",
            ),
        ],
    );
    let out = run(f.path(), Opts::default());
    let reqs = out.requests();
    assert_eq!(reqs.len(), 2);
    let system = |i: usize| match &reqs[i].messages[0] {
        Message::System { content } => content.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        system(0),
        "task=demo n=3 flag=true obj={\"k\":[1,2]} name=Stage a id=a\n"
    );
    assert_eq!(system(1), system(0));
    assert_eq!(
        reqs[1]
            .messages
            .iter()
            .filter(|m| matches!(m, Message::System { .. }))
            .count(),
        1,
        "rendered once, not re-sent"
    );
}

#[test]
fn acceptance_19_inputs_schema_rejecting_the_predecessor_is_stage_init_failed() {
    let yaml = "id: two\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\n";
    let b = llm(
        "b",
        5,
        1,
        "none",
        "fail",
        "inputsSchema:\n  type: object\n  required: [parsed]\n  properties:\n    parsed: { required: [count] }\n",
        "x",
    );
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &llm("a", 5, 1, "none", "fail", "", "x")),
            ("b.md", &b),
        ],
    );
    let out = run(f.path(), Opts::default());
    let init = out.named("StageInitFailed");
    assert_eq!(init.len(), 1);
    assert_eq!(init[0]["stageId"], "b");
    assert_eq!(init[0]["code"], "Validation/StageInputsInvalid");
    assert!(
        init[0]["message"]
            .as_str()
            .unwrap()
            .contains("inputsSchema")
    );
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    assert_eq!(
        out.of_stage("b")
            .iter()
            .filter(|e| e["event"] == "ProviderRequestStarted")
            .count(),
        0,
        "no model turn after a failed Setup"
    );
}

#[test]
fn acceptance_20_check_gate_policies() {
    let yaml = |policy_stage: &str| {
        format!(
            "id: gate\nentry: a\nctx:\n  open: {{ default: false }}\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\ngates:\n  a: {{ when: \"ctx.open\", otherwise: defer }}\n{policy_stage}"
        )
    };
    // retry-later: re-checked per backoff up to maxAttempts, then fail.
    let f = Fixture::new(
        &yaml(""),
        &[
            (
                "a.md",
                &llm("a", 5, 3, "{ fixed: 1s }", "retry-later", "", "x"),
            ),
            ("b.md", &llm("b", 5, 1, "none", "fail", "", "x")),
        ],
    );
    let out = run(f.path(), Opts::default());
    let checks: Vec<&str> = out
        .named("StageCheckGateResult")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(checks, ["defer", "defer", "defer"]);
    assert_eq!(
        out.elapsed,
        Duration::from_secs(2) + 2 * TICK,
        "two backoff waits between three checks"
    );
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    assert!(out.of_stage("b").is_empty());
    // skip: verdict skipped, the next stage runs.
    let f = Fixture::new(
        &yaml(""),
        &[
            ("a.md", &llm("a", 5, 3, "none", "skip", "", "x")),
            ("b.md", &llm("b", 5, 1, "none", "fail", "", "x")),
        ],
    );
    let out = run(f.path(), Opts::default());
    assert_eq!(out.named("StageExited")[0]["verdict"], "skipped");
    assert_eq!(out.report.status, RunStatus::Ok);
    assert_eq!(out.named("StageExited")[1]["stageId"], "b");
    // fail: the run fails.
    let f = Fixture::new(
        &yaml(""),
        &[
            ("a.md", &llm("a", 5, 3, "none", "fail", "", "x")),
            ("b.md", &llm("b", 5, 1, "none", "fail", "", "x")),
        ],
    );
    let out = run(f.path(), Opts::default());
    assert_eq!(out.count("StageCheckGateResult"), 1);
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    // An open gate proceeds.
    let f = Fixture::new(
        &yaml(""),
        &[
            ("a.md", &llm("a", 5, 3, "none", "fail", "", "x")),
            ("b.md", &llm("b", 5, 1, "none", "fail", "", "x")),
        ],
    );
    let out = run(
        f.path(),
        Opts {
            fields: vec![("open", json!(true))],
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Ok);
}

/// `--stage-timeout` bounds a whole execution: a model that never answers
/// fails the stage with `Session/StageTimeout` after exactly the limit,
/// and the run ends instead of waiting.
#[test]
fn a_stage_timeout_fails_a_stage_that_takes_too_long() {
    let f = common::Fixture::linear(&[(
        "script.yaml",
        "stages:\n  a:\n    - { tool: Read, args: { path: nothing-here.txt } }\n    - { text: thinking, latency: 1h }\n",
    )]);
    let out = common::run::run(
        f.path(),
        common::run::Opts {
            fields: vec![("task", serde_json::json!("t"))],
            stage_timeout: Some(std::time::Duration::from_secs(30)),
            ..common::run::Opts::default()
        },
    );
    match &out.report.status {
        troupe::runtime::summary::RunStatus::Failed { reason } => {
            assert!(reason.contains("Session/StageTimeout"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Whole milliseconds: the limit plus tokio's one-tick timer rounding.
    assert!(out.elapsed >= std::time::Duration::from_secs(30));
    assert!(out.elapsed < std::time::Duration::from_secs(31));
    assert_eq!(out.count("StageExited"), 1);
    // The request that came back before the limit is counted, and so is
    // the one the limit cut off, whose end the log records.
    assert_eq!(out.report.usage.requests, 2, "{:?}", out.report.usage);
    assert_eq!(out.count("ProviderRequestFailed"), 1);
    assert!(out.report.usage.prompt_tokens > 0);
}

/// A tool call still running when `--stage-timeout` fires is killed and
/// ends in the log (`ToolInvocationCancelled`), as under a cancel.
#[test]
fn a_stage_timeout_ends_the_tool_call_in_flight() {
    let a = common::stage_md("a", "", "Task: {{ctx.task}}")
        .replace("allowedTools: [Read]", "allowedTools: [Bash]");
    let f = common::Fixture::linear(&[
        ("a.md", &a),
        (
            "script.yaml",
            "stages:\n  a:\n    - { tool: Bash, args: { command: \"sleep 600\" } }\n",
        ),
    ]);
    let out = common::run::run(
        f.path(),
        common::run::Opts {
            fields: vec![("task", serde_json::json!("t"))],
            stage_timeout: Some(std::time::Duration::from_secs(30)),
            root: Some(f.path().to_owned()),
            ..common::run::Opts::default()
        },
    );
    assert!(
        matches!(
            out.report.status,
            troupe::runtime::summary::RunStatus::Failed { .. }
        ),
        "{:?} {:?} {:?}",
        out.report.status,
        out.tool_results(),
        out.events
            .iter()
            .map(|e| e["event"].as_str().unwrap_or("").to_owned())
            .collect::<Vec<_>>()
    );
    assert_eq!(out.count("ToolInvocationStarted"), 1);
    assert_eq!(out.count("ToolInvocationCancelled"), 1);
}

#[test]
fn gates_and_asserts_on_deterministic_steps_are_evaluated() {
    let yaml = "id: steps\nentry: talk\nctx:\n  open: { default: false }\nstages:\n  talk: talk.md\n  extract: { kind: extract_json, from: \"ctx.upstream[0].parsed.text\" }\n  report: { kind: print, content: \"score {{ctx.upstream[0].parsed.score}}\" }\nnext:\n  talk: extract\n  extract: report\nassert:\n  extract: [\"parsed.score > 5\"]\ngates:\n  report: { when: \"ctx.open\", otherwise: block }\n";
    let script = |score: u32| {
        format!(
            "stages:\n  talk:\n    - complete: {{ summary: s, text: \"{{\\\"score\\\": {score}}}\" }}\n"
        )
    };
    let fixture = |score| {
        Fixture::new(
            yaml,
            &[
                ("talk.md", &llm("talk", 5, 1, "none", "fail", "", "x")),
                ("script.yaml", &script(score)),
            ],
        )
    };
    // A false assert fails the step (one attempt, no retry).
    let out = run(fixture(2).path(), Opts::default());
    match &out.report.status {
        RunStatus::Failed { reason } => assert!(reason.contains("parsed.score > 5"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let asserted = out.named("StageAssertOutcome");
    let extract = asserted.iter().find(|e| e["stageId"] == "extract").unwrap();
    assert_eq!(extract["verdict"], "fail");
    // A gate that does not say proceed fails the step, audited.
    let out = run(fixture(9).path(), Opts::default());
    match &out.report.status {
        RunStatus::Failed { reason } => assert!(reason.contains("CheckGate: block"), "{reason}"),
        other => panic!("{other:?}"),
    }
    let gate = out
        .named("StageCheckGateResult")
        .into_iter()
        .find(|e| e["stageId"] == "report")
        .unwrap();
    assert_eq!(gate["outcome"], "block");
    // Both pass: the run goes through.
    let out = run(
        fixture(9).path(),
        Opts {
            fields: vec![("open", serde_json::json!(true))],
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Ok, "{:?}", out.report.status);
    assert_eq!(
        out.report.results["report"].result().output["text"],
        "score 9"
    );
}

/// An asker no one answers for.
#[derive(Debug)]
struct NoOne;

impl troupe::runtime::ask::Asker for NoOne {
    fn ask(
        &self,
        _: troupe::runtime::ask::Question,
    ) -> futures::future::BoxFuture<'static, Option<troupe::runtime::ask::Answer>> {
        Box::pin(futures::future::pending())
    }
}

/// What a cancelled step had open ends before its `StageCancelled`: a
/// human step's question is withdrawn (`InteractionAnswered`), as an
/// approval is; a tool step's call is cancelled (`ToolInvocationCancelled`),
/// as a model's call is.
#[test]
fn a_cancelled_step_ends_what_it_had_open() {
    let human = Fixture::new(
        "id: p\nentry: ask\nstages:\n  ask:\n    kind: human\n    prompt: \"Ship?\"\n    fields: { type: object, required: [ok], properties: { ok: { type: boolean } } }\nnext:\n  ask: end\n",
        &[],
    );
    let out = run(
        human.path(),
        Opts {
            asker: Some(std::sync::Arc::new(NoOne)),
            cancel_after: Some(Duration::from_secs(1)),
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Cancelled);
    let names = events_of(&out, "ask");
    let raised = names
        .iter()
        .position(|n| *n == "InteractionRaised")
        .unwrap();
    assert_eq!(
        &names[raised..],
        ["InteractionRaised", "InteractionAnswered", "StageCancelled"],
        "{names:?}"
    );
    let answered = out.named("InteractionAnswered");
    assert_eq!(answered[0]["outcome"], "withdrawn");
    assert_eq!(answered[0]["kind"], "question");

    let tool = Fixture::new(
        "id: p\nentry: t\nstages:\n  t: { kind: tool, tool: Bash, args: { command: \"sleep 600\" } }\nnext:\n  t: end\n",
        &[],
    );
    // Paused time: the cancel comes once the run is idle, the call in
    // flight (as a stage timeout does in
    // `a_stage_timeout_ends_the_tool_call_in_flight`).
    let out = run(
        tool.path(),
        Opts {
            cancel_after: Some(Duration::from_secs(1)),
            root: Some(tool.path().to_owned()),
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Cancelled);
    // The call started has its end, before the execution's.
    let names = events_of(&out, "t");
    let started = names
        .iter()
        .position(|n| *n == "ToolInvocationStarted")
        .unwrap_or_else(|| panic!("the call never started: {names:?}"));
    assert_eq!(
        &names[started..],
        [
            "ToolInvocationStarted",
            "ToolInvocationCancelled",
            "StageCancelled"
        ],
        "{names:?}"
    );
}

/// The names of stage `stage`'s events, in order.
fn events_of<'a>(out: &'a common::run::Outcome, stage: &str) -> Vec<&'a str> {
    out.events
        .iter()
        .filter(|e| e["stageId"] == stage)
        .map(|e| e["event"].as_str().unwrap())
        .collect()
}
