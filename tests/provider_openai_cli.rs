//! `troupe run` end to end against a real OpenAI-compatible server on
//! loopback (`common/fake_openai.rs`), streaming and `--no-stream`: the
//! bundled pipelines, one flag for a local server, `--max-inflight` on a
//! wide fan-out, retries and terminal errors as the audit log records
//! them, tool errors back to the model, the key kept out of every output,
//! capability failures before the run starts, fail-fast dropping requests
//! in flight, and the pipeline's `provider:` block under the flags.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use common::{audit, audit_text, stages, text};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use fake_openai::{FakeOpenAi, Received, Reply, pipeline_responder};
use serde_json::{Value, json};
use troupe::provider::openai::{OpenAiConfig, OpenAiProvider};

// ---------------------------------------------------------------- helpers

fn troupe() -> Command {
    let mut cmd = Command::cargo_bin("troupe").unwrap();
    cmd.env_remove("OPENAI_API_KEY");
    cmd
}

// ------------------------------------------------- replies and request shape

fn run_cli(server: &FakeOpenAi, runs: &std::path::Path, pipeline: &str, extra: &[&str]) -> Output {
    troupe()
        .args([
            "run",
            pipeline,
            "--base-url",
            &server.base_url(),
            "--model",
            "m",
        ])
        .args(["--provider-backoff", "10ms", "--runs-dir"])
        .arg(runs.join("runs"))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn fanout_and_code_review_run_against_the_server_streaming_and_not() {
    for no_stream in [false, true] {
        let server = FakeOpenAi::start(pipeline_responder);
        let runs = tempfile::tempdir().unwrap();
        let mut extra = vec!["--ctx", "width=6", "--provider", "openai", "--json"];
        if no_stream {
            extra.push("--no-stream");
        }
        let out = run_cli(&server, runs.path(), &stages("fanout"), &extra);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["stages"]["worker"]["ok"], 6);
        // plan + 6 workers × 2 turns + reduce, each 5 completion tokens.
        assert_eq!(report["usage"]["requests"], 14);
        assert_eq!(report["usage"]["completionTokens"], 70);
        assert_eq!(report["provider"]["model"], "m");
        assert_eq!(report["provider"]["stream"], !no_stream);
        let chats = server.chats();
        assert_eq!(chats.len(), 14);
        assert!(chats.iter().all(|r| r.streamed() != no_stream));
        // A worker's second turn pairs the Echo result with its call.
        let second = chats
            .iter()
            .find(|r| r.completion_tool() == "submit_item" && r.turns_so_far() == 1)
            .unwrap();
        let m = second.messages();
        assert_eq!(m[2]["tool_calls"][0]["function"]["name"], "Echo");
        assert_eq!(m[3]["role"], "tool");
        assert_eq!(m[3]["tool_call_id"], m[2]["tool_calls"][0]["id"]);
        assert!(m[3]["content"].as_str().unwrap().starts_with("item "));
        assert_eq!(second.tool_names(), ["Echo", "submit_item"]);
        let events = audit(runs.path());
        let completed: Vec<&Value> = events
            .iter()
            .filter(|e| e["event"] == "ProviderRequestCompleted")
            .collect();
        assert_eq!(completed.len(), 14);
        assert!(
            completed
                .iter()
                .all(|e| e["usage"]["completionTokens"] == 5)
        );

        let server = FakeOpenAi::start(pipeline_responder);
        let runs = tempfile::tempdir().unwrap();
        let mut extra = vec!["--task", "rename the loader"];
        if no_stream {
            extra.push("--no-stream");
        }
        let out = run_cli(&server, runs.path(), &stages("code-review"), &extra);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("Verdict: approve"), "{stdout}");
        assert!(stdout.contains("provider openai: model m"), "{stdout}");
    }
}

#[test]
fn one_flag_points_troupe_at_a_local_server() {
    let server = FakeOpenAi::start(pipeline_responder);
    server.set_models(&["local-gguf"]);
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .args(["run", &stages("fanout"), "--ctx", "width=2"])
        .args(["--base-url", &server.base_url(), "--runs-dir"])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(
        server
            .chats()
            .iter()
            .all(|r| r.body["model"] == "local-gguf")
    );
    assert!(server.received().iter().any(|r| r.path == "/v1/models"));
}

#[test]
fn the_wide_fanout_never_has_more_than_max_inflight_requests_in_flight() {
    let width = 40;
    // Each worker's first request waits at the server until 4 are in
    // flight: with a working limit exactly 4 overlap; without one, up to 40
    // would. Once all 40 have arrived, none can be left waiting for company.
    let server = FakeOpenAi::start(|r| {
        let reply = pipeline_responder(r);
        if r.completion_tool() == "submit_item" && r.turns_so_far() == 0 {
            Reply::WaitInFlight(4, Box::new(reply))
        } else {
            reply
        }
    });
    server.release_after(width);
    let runs = tempfile::tempdir().unwrap();
    let w = format!("width={width}");
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", &w, "--parallel-cap", "256", "--max-inflight", "4"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.counts().peak, 4);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("peak 4 in flight of 4 allowed"), "{stdout}");
}

#[test]
fn rate_limits_and_server_errors_are_retried_and_each_retry_is_audited() {
    let tries = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&tries);
    let server = FakeOpenAi::start(move |r| {
        if r.completion_tool() != "submit_items" {
            return pipeline_responder(r);
        }
        let mut n = seen.lock().unwrap();
        *n += 1;
        match *n {
            1 => Reply::Status {
                status: 429,
                headers: vec![("retry-after".into(), "1".into())],
                body: r#"{"error":{"message":"Rate limit reached"}}"#.into(),
            },
            2 => Reply::status(502, "bad gateway"),
            _ => pipeline_responder(r),
        }
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", "width=1"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let events = audit(runs.path());
    let plan = |name: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["event"] == name && e["stageId"] == "plan")
            .cloned()
            .collect()
    };
    let failed = plan("ProviderRequestFailed");
    assert_eq!(failed.len(), 2);
    assert_eq!(failed[0]["code"], "ProviderTransient/RateLimited");
    assert_eq!(failed[0]["retryAfterMs"], 1000);
    assert_eq!(
        failed[0]["waitMs"], 1000,
        "Retry-After beats the 10ms backoff"
    );
    assert_eq!(failed[1]["code"], "ProviderTransient/ServerError");
    let wait = failed[1]["waitMs"].as_u64().unwrap();
    assert!(
        (10..=20).contains(&wait),
        "backoff 20ms with jitter: {wait}"
    );
    assert!(failed.iter().all(|f| f["retrying"] == true));
    let tries: Vec<Value> = plan("ProviderRequestStarted")
        .iter()
        .map(|e| e["try"].clone())
        .collect();
    assert_eq!(tries, [json!(1), json!(2), json!(3)]);
    let plan_requests: Vec<Received> = server
        .chats()
        .into_iter()
        .filter(|r| r.completion_tool() == "submit_items")
        .collect();
    let gap = plan_requests[1].at - plan_requests[0].at;
    assert!(
        gap >= Duration::from_secs(1),
        "Retry-After honoured: {gap:?}"
    );
}

#[test]
fn a_terminal_error_fails_the_stage_with_the_servers_message() {
    let server = FakeOpenAi::start(|r| {
        if r.completion_tool() == "submit_items" {
            Reply::status(
                400,
                r#"{"error":{"message":"Invalid schema for function"}}"#,
            )
        } else {
            pipeline_responder(r)
        }
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", "width=1"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("ExtensionHost/BadRequest") && stdout.contains("Invalid schema"),
        "{stdout}"
    );
    assert_eq!(server.chats().len(), 1, "terminal errors are not retried");
}

#[test]
fn tool_errors_go_back_to_the_model_on_the_same_transcript() {
    let stage = common::stage_md("a", "", "Do it.").replace("[Read]", "[Echo]");
    let fx = common::Fixture::new(
        "id: t\nentry: a\nstages:\n  a: a.md\nnext:\n  a: end\n",
        &[("a.md", &stage)],
    );
    let server = FakeOpenAi::start(|r| match r.turns_so_far() {
        0 => Reply::Calls(vec![
            ("NoSuchTool".into(), "{}".into()),
            ("Echo".into(), "{not json".into()),
        ]),
        _ => Reply::call("submit_a", json!({"summary": "done"})),
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(&server, runs.path(), fx.path().to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let second = &server.chats()[1];
    let results: Vec<String> = second
        .messages()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(results.len(), 2);
    assert!(
        results[0].contains("ToolTerminal/UnknownTool"),
        "{results:?}"
    );
    assert!(
        results[1].contains("ToolTerminal/InvalidArguments"),
        "{results:?}"
    );
}

#[test]
fn the_api_key_never_appears_in_output_events_or_the_audit_log() {
    const KEY: &str = "sk-troupe-SECRET-4242";
    // A careless server that echoes the Authorization header in its errors.
    let server = FakeOpenAi::start(|r| {
        if r.completion_tool() == "submit_item" && r.turns_so_far() == 1 {
            let auth = r.authorization.clone().unwrap_or_default();
            Reply::status(
                400,
                &json!({"error": {"message": format!("rejected {auth}")}}).to_string(),
            )
        } else {
            pipeline_responder(r)
        }
    });
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .env("TROUPE_TEST_KEY", KEY)
        .args(["run", &stages("fanout"), "--ctx", "width=2"])
        .args(["--base-url", &server.base_url(), "--model", "m"])
        .args([
            "--api-key-env",
            "TROUPE_TEST_KEY",
            "--events",
            "-",
            "--runs-dir",
        ])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        server
            .chats()
            .iter()
            .all(|r| r.authorization.as_deref() == Some(&format!("Bearer {KEY}")[..])),
        "the key is sent to the server"
    );
    let all = format!("{}{}", text(&out), audit_text(runs.path()));
    assert!(all.contains("rejected Bearer [redacted]"), "{all}");
    assert!(!all.contains("SECRET-4242"), "the key leaked:\n{all}");

    // The same at the capability check.
    let echo = FakeOpenAi::start_raw(|r| {
        Reply::status(
            401,
            &json!({"error": {"message": format!("bad {}", r.authorization.clone().unwrap_or_default())}})
                .to_string(),
        )
    });
    let out = troupe()
        .env("TROUPE_TEST_KEY", KEY)
        .args(["run", &stages("fanout"), "--base-url", &echo.base_url()])
        .args(["--model", "m", "--api-key-env", "TROUPE_TEST_KEY"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let all = text(&out);
    assert!(
        all.contains("ProviderCapability/AuthenticationFailed"),
        "{all}"
    );
    assert!(!all.contains("SECRET-4242"), "the key leaked:\n{all}");
}

#[test]
fn capability_failures_stop_the_run_before_it_starts_with_exit_2() {
    let port = common::closed_port();
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .args(["run", &stages("fanout"), "--model", "m", "--base-url"])
        .arg(format!("http://127.0.0.1:{port}/v1"))
        .arg("--runs-dir")
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ProviderCapability/EndpointUnreachable") && stderr.contains("hint:"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(runs.path().join("runs"))
            .map(|d| d.count())
            .unwrap_or(0),
        0,
        "nothing ran"
    );

    let server = FakeOpenAi::start_raw(|_| Reply::Text("Sure! Here is the answer.".into()));
    let out = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--model",
            "m",
            "--json",
            "--base-url",
        ])
        .arg(server.base_url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["code"], "ProviderCapability/ToolCallingRequired");

    // --skip-check goes straight to the run.
    let server = FakeOpenAi::start_raw(pipeline_responder);
    let out = troupe()
        .args(["run", &stages("fanout"), "--ctx", "width=1", "--model", "m"])
        .args([
            "--skip-check",
            "--base-url",
            &server.base_url(),
            "--runs-dir",
        ])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert!(!server.received().iter().any(Received::is_probe));
}

#[test]
fn fail_fast_drops_the_siblings_in_flight_requests() {
    // worker 0 fails once the other two are waiting at the server; fail-fast
    // must drop their requests, and the server sees both clients go away
    // while the run is still alive (the in-process run keeps the provider).
    let server = FakeOpenAi::start(|r| {
        if r.completion_tool() != "submit_item" {
            return pipeline_responder(r);
        }
        if r.system_prompt().contains("work item 0 ") {
            Reply::WaitInFlight(3, Box::new(Reply::status(400, "no")))
        } else {
            Reply::Hang
        }
    });
    let pipeline = Arc::new(
        troupe::definition::load_pipeline(std::path::Path::new(&stages("fanout"))).unwrap(),
    );
    let mut config = OpenAiConfig::new(&server.base_url(), "X_UNSET").unwrap();
    config.model = Some("m".into());
    let provider = OpenAiProvider::new(config).unwrap();
    let mut fields = serde_json::Map::new();
    fields.insert("width".into(), json!(3));
    let spec = troupe::runtime::spec::RunSpec::new(pipeline, fields, Arc::new(provider), None);
    let system = actix::System::new();
    let (report, counts) = system.block_on(async {
        let (_session, done) = troupe::runtime::launch::start_run(spec, Vec::new());
        let report = done.await.unwrap();
        let counts = server
            .until("both cancelled requests to be dropped", |c| c.dropped == 2)
            .await;
        (report, counts)
    });
    assert!(
        matches!(
            report.status,
            troupe::runtime::summary::RunStatus::Failed { .. }
        ),
        "{:?}",
        report.status
    );
    assert_eq!(report.stage("worker").unwrap().cancelled, 2);
    assert_eq!(counts.in_flight, 0);
}

#[test]
fn the_pipeline_provider_block_is_read_and_flags_win() {
    let server = FakeOpenAi::start(pipeline_responder);
    let stage = common::stage_md("a", "", "Do it.");
    let yaml = format!(
        "id: t\nentry: a\nstages:\n  a: a.md\nnext:\n  a: end\nprovider:\n  kind: openai\n  baseUrl: {}\n  model: from-file\n  stream: false\n  maxInflight: 2\n  requestTimeout: 30s\n",
        server.base_url()
    );
    let fx = common::Fixture::new(&yaml, &[("a.md", &stage)]);
    let runs = tempfile::tempdir().unwrap();
    let run = |extra: &[&str]| {
        troupe()
            .args(["run", fx.path().to_str().unwrap(), "--runs-dir"])
            .arg(runs.path().join("runs"))
            .args(extra)
            .output()
            .unwrap()
    };
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let chat = server.chats().pop().unwrap();
    assert_eq!(chat.body["model"], "from-file");
    assert!(!chat.streamed(), "stream: false from the file");
    let out = run(&["--model", "from-flag"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.chats().pop().unwrap().body["model"], "from-flag");
    let out = run(&["--provider", "scripted"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(server.chats().len(), 2, "scripted asks no server");

    let bad = common::Fixture::new(
        "id: t\nentry: a\nstages:\n  a: a.md\nprovider:\n  kind: openai\n  modle: x\n  apiKey: sk-1\n  maxInflight: 0\n",
        &[("a.md", &stage)],
    );
    let out = troupe()
        .args(["validate", bad.path().to_str().unwrap(), "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    for field in ["provider.modle", "provider.apiKey", "provider.maxInflight"] {
        assert!(stdout.contains(field), "{field}: {stdout}");
    }
    assert!(stdout.contains("Validation/PipelineInvalid"), "{stdout}");
}

/// What the server bills is what the run counts: a failed try's tokens
/// go to the budget (here tripping it on the first try), a try the
/// stage's timeout cuts off counts as a request and its end is recorded,
/// and a server that reports no usage is named once.
#[test]
fn failed_and_cut_off_tries_count_and_unreported_usage_is_said() {
    let billed_empty = || Reply::Raw {
        content_type: "application/json".into(),
        body: r#"{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1000}}"#.into(),
    };
    let server = FakeOpenAi::start(move |r| match r.completion_tool().as_str() {
        "submit_items" => billed_empty(),
        _ => pipeline_responder(r),
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", "width=1", "--max-tokens", "500", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["usage"]["promptTokens"], 1000, "{report}");
    assert!(
        report["reason"]
            .as_str()
            .is_some_and(|r| r.starts_with("Budget/TokensExceeded")),
        "{report}"
    );
    let events = audit(runs.path());
    let tries = events
        .iter()
        .filter(|e| e["event"] == "ProviderRequestStarted")
        .count();
    assert_eq!(tries, 1, "no try after the one that spent the budget");
    // The failed try's event says what it was billed.
    let failed = events
        .iter()
        .find(|e| e["event"] == "ProviderRequestFailed");
    assert_eq!(
        failed.map(|e| &e["usage"]["promptTokens"]),
        Some(&json!(1000))
    );

    // The worker's request hangs past --stage-timeout; its replies carry
    // no usage (the plan's either: the responder drops it).
    let server = FakeOpenAi::start(|r| {
        if r.is_probe() {
            return pipeline_responder(r);
        }
        if r.completion_tool() == "submit_item" {
            return Reply::Hang;
        }
        match pipeline_responder(r) {
            reply @ (Reply::Calls(_) | Reply::Text(_)) => {
                let mut body = fake_openai::completion(&reply, "m", (0, 0));
                body.as_object_mut().unwrap().remove("usage");
                Reply::Raw {
                    content_type: "application/json".into(),
                    body: body.to_string(),
                }
            }
            other => other,
        }
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", "width=1", "--stage-timeout", "1s", "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    let events = audit(runs.path());
    let of = |name: &str, stage: &str| -> Vec<Value> {
        events
            .iter()
            .filter(|e| e["event"] == name && e["stageId"] == stage)
            .cloned()
            .collect()
    };
    let failed = of("ProviderRequestFailed", "worker");
    assert_eq!(failed.len(), 1, "{failed:?}");
    assert_eq!(failed[0]["code"], "Session/StageTimeout");
    let exited = of("StageExited", "worker");
    assert_eq!(exited[0]["usage"]["requests"], 1, "{exited:?}");
    let notices = of("ProviderNotice", "plan");
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert_eq!(notices[0]["code"], "UsageUnreported");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("reports no token usage"),
        "{}",
        text(&out)
    );
}

/// A reply the server cut at the model's token limit (`finish_reason:
/// length`) is said as such: in the audit log, and to the model, whose
/// cut-off completion call is otherwise only \"not valid JSON\".
#[test]
fn a_reply_cut_at_the_token_limit_is_said_to_the_log_and_the_model() {
    let tries = Arc::new(Mutex::new(0));
    let seen = Arc::clone(&tries);
    let server = FakeOpenAi::start(move |r| {
        if r.completion_tool() != "submit_items" {
            return pipeline_responder(r);
        }
        let mut n = seen.lock().unwrap();
        *n += 1;
        if *n > 1 {
            return pipeline_responder(r);
        }
        Reply::Raw {
            content_type: "application/json".into(),
            body: json!({
                "choices": [{"index": 0, "finish_reason": "length", "message": {
                    "role": "assistant", "content": null,
                    "tool_calls": [{"id": "c1", "type": "function", "function": {
                        "name": "submit_items", "arguments": "{\"items\": [1, 2"}}]}}],
                "usage": {"prompt_tokens": 10, "completion_tokens": 4096}
            })
            .to_string(),
        }
    });
    let runs = tempfile::tempdir().unwrap();
    let out = run_cli(
        &server,
        runs.path(),
        &stages("fanout"),
        &["--ctx", "width=1", "--no-stream"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let cut = audit(runs.path())
        .into_iter()
        .filter(|e| e["event"] == "ProviderRequestCompleted" && e["finishReason"] == "length")
        .count();
    assert_eq!(cut, 1);
    let second = server
        .chats()
        .into_iter()
        .filter(|r| r.completion_tool() == "submit_items")
        .nth(1)
        .unwrap();
    let told = second.messages().last().unwrap()["content"].to_string();
    assert!(told.contains("token limit"), "{told}");
}
