//! Safe by default: the loop guard's default, `--max-run-time`, and the
//! token and cost budgets. Past a limit the run is cancelled strictly,
//! like Ctrl-C (no new model request starts, running stages get
//! `StageCancelled`), and ends failed with a typed reason.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::text;
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use common::Fixture;
use common::run::{Opts, Outcome, run};
use serde_json::{Value, json};
use troupe::definition::Price;
use troupe::runtime::limits::Budget;
use troupe::runtime::summary::RunStatus;

fn fanout() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout")
}

fn failed_reason(o: &Outcome) -> String {
    match &o.report.status {
        RunStatus::Failed { reason } => reason.clone(),
        other => panic!("expected a failed run, got {other:?}"),
    }
}

/// After a limit, nothing starts: no execution enters and no model
/// request starts once the first `StageCancelled` is recorded, and the
/// run ends failed.
fn nothing_starts_after_the_cancel(o: &Outcome) {
    let first_cancel = o
        .events
        .iter()
        .position(|e| e["event"] == "StageCancelled")
        .unwrap_or(o.events.len());
    for e in &o.events[first_cancel..] {
        assert!(
            e["event"] != "StageEntered" && e["event"] != "ProviderRequestStarted",
            "started after the cancel: {e}"
        );
    }
    let last = o.events.last().unwrap();
    assert_eq!(last["event"], "WorkflowExit");
    assert_eq!(last["status"], "failed");
}

#[test]
fn a_loop_without_max_visits_stops_at_the_default_guard() {
    let stage = |id: &str| common::stage_md(id, "", "Work.");
    let yaml = "id: looping\nentry: plan\nstages:\n  plan: plan.md\n  review: review.md\nnext:\n  plan: review\n  review: plan\n";
    let f = Fixture::new(
        yaml,
        &[("plan.md", &stage("plan")), ("review.md", &stage("review"))],
    );
    let o = run(f.path(), Opts::default());
    let reason = failed_reason(&o);
    assert!(
        reason.starts_with("Session/MaxVisitsExceeded")
            && reason.contains("maxVisits is 25 (the default"),
        "{reason}"
    );
    let entered = o
        .named("StageEntered")
        .iter()
        .filter(|e| e["stageId"] == "plan")
        .count();
    assert_eq!(entered, 25);
}

#[test]
fn past_max_run_time_the_run_is_cancelled_strictly_and_fails() {
    let o = run(
        &fanout(),
        Opts {
            fields: vec![("width", json!(20))],
            cap: Some(4),
            latency: Some(Duration::from_secs(1)),
            max_run_time: Some(Duration::from_millis(2_500)),
            ..Opts::default()
        },
    );
    let reason = failed_reason(&o);
    assert!(reason.starts_with("Session/RunTimeExceeded"), "{reason}");
    // Ended at its limit, long before the ~12 s its turns would take.
    assert!(
        o.elapsed >= Duration::from_millis(2_500) && o.elapsed < Duration::from_secs(3),
        "{:?}",
        o.elapsed
    );
    let cancelled = o.named("StageCancelled");
    assert_eq!(cancelled.len(), 4, "the four running siblings");
    assert!(
        cancelled.iter().all(|e| e["reason"]
            .as_str()
            .unwrap()
            .starts_with("Session/RunTimeExceeded")),
        "{cancelled:#?}"
    );
    assert_eq!(
        o.provider.dropped.load(std::sync::atomic::Ordering::SeqCst),
        4
    );
    nothing_starts_after_the_cancel(&o);
}

/// Tokens used by completed requests, in the order they completed.
fn completed_tokens(o: &Outcome) -> Vec<(usize, u64)> {
    o.events
        .iter()
        .enumerate()
        .filter(|(_, e)| e["event"] == "ProviderRequestCompleted")
        .map(|(i, e)| {
            let u = &e["usage"];
            (
                i,
                u["promptTokens"].as_u64().unwrap() + u["completionTokens"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn a_response_that_crosses_the_token_budget_stops_every_new_request() {
    let max = 3_000;
    let o = run(
        &fanout(),
        Opts {
            fields: vec![("width", json!(200))],
            cap: Some(8),
            latency: Some(Duration::from_millis(10)),
            budget: Some(Arc::new(Budget::new(Some(max), None, None))),
            ..Opts::default()
        },
    );
    let reason = failed_reason(&o);
    assert!(reason.starts_with("Budget/TokensExceeded"), "{reason}");
    let budget = o.report.budget.clone().unwrap();
    assert!(budget.spent_tokens > max, "{budget:?}");
    assert_eq!(budget.max_tokens, Some(max));
    assert_eq!(budget.exceeded.as_deref(), Some("Budget/TokensExceeded"));
    // The completion that took the total over the budget: no request
    // starts after it.
    let mut total = 0;
    let crossing = completed_tokens(&o)
        .into_iter()
        .find(|(_, t)| {
            total += t;
            total > max
        })
        .map(|(i, _)| i)
        .unwrap();
    assert!(
        o.events[crossing..]
            .iter()
            .all(|e| e["event"] != "ProviderRequestStarted"),
        "a request started after the budget was spent"
    );
    nothing_starts_after_the_cancel(&o);
    assert_eq!(
        o.report.usage.prompt_tokens + o.report.usage.completion_tokens,
        budget.spent_tokens,
        "the summary counts the cancelled stages' usage too"
    );
}

#[test]
fn a_cost_budget_prices_tokens_per_million_and_stops_the_run() {
    let price = Price {
        input: 10.0,
        output: 30.0,
    };
    let o = run(
        &fanout(),
        Opts {
            fields: vec![("width", json!(200))],
            cap: Some(8),
            latency: Some(Duration::from_millis(10)),
            budget: Some(Arc::new(Budget::new(None, Some(0.02), Some(price)))),
            ..Opts::default()
        },
    );
    let reason = failed_reason(&o);
    assert!(reason.starts_with("Budget/CostExceeded"), "{reason}");
    let budget = o.report.budget.clone().unwrap();
    assert!(budget.spent_cost.unwrap() > 0.02, "{budget:?}");
    nothing_starts_after_the_cancel(&o);
}

fn troupe(args: &[&str]) -> Output {
    Command::cargo_bin("troupe")
        .unwrap()
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn the_cli_reports_spent_against_the_budget_and_fails_the_run() {
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = runs.path().join("runs").to_string_lossy().into_owned();
    let dir = fanout();
    let args = [
        "run",
        dir.to_str().unwrap(),
        "--ctx",
        "width=100",
        "--max-tokens",
        "2000",
        "--price",
        "1,2",
        "--runs-dir",
        &runs_dir,
    ];
    let out = troupe(&args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("Budget/TokensExceeded"), "{stdout}");
    assert!(stdout.contains("of 2000 tokens"), "{stdout}");

    let mut json_args = args.to_vec();
    json_args.push("--json");
    let out = troupe(&json_args);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["budget"]["maxTokens"], 2000);
    assert!(report["budget"]["spentTokens"].as_u64().unwrap() > 2000);
    assert!(report["budget"]["spentCost"].as_f64().unwrap() > 0.0);
    assert_eq!(report["budget"]["exceeded"], "Budget/TokensExceeded");
}

#[test]
fn a_cost_budget_without_a_price_is_refused_before_anything_runs() {
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = runs.path().join("runs").to_string_lossy().into_owned();
    let dir = fanout();
    let out = troupe(&[
        "run",
        dir.to_str().unwrap(),
        "--max-cost",
        "1.50",
        "--runs-dir",
        &runs_dir,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Validation/InputInvalid") && stderr.contains("--price"),
        "{stderr}"
    );
    assert!(
        std::fs::read_dir(runs.path().join("runs")).map_or(true, |mut d| d.next().is_none()),
        "nothing ran"
    );
}

#[test]
fn the_pipeline_provider_block_sets_a_budget_and_show_prints_the_loop_guard() {
    let yaml = "id: budgeted\nentry: a\nstages:\n  a: a.md\nprovider:\n  maxTokens: 10\n  prices:\n    scripted: { input: 1, output: 1 }\n";
    let f = Fixture::new(yaml, &[("a.md", &common::stage_md("a", "", "Work."))]);
    let runs = tempfile::tempdir().unwrap();
    let runs_dir = runs.path().join("runs").to_string_lossy().into_owned();
    let out = troupe(&[
        "run",
        f.path().to_str().unwrap(),
        "--json",
        "--runs-dir",
        &runs_dir,
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["budget"]["maxTokens"], 10);
    assert!(report["budget"]["spentCost"].is_number());

    let out = troupe(&["show", f.path().to_str().unwrap()]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("maxVisits   25 (default)"), "{stdout}");
}
