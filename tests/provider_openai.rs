//! The `openai` provider against a real HTTP server on loopback (axum, in
//! `common/fake_openai.rs`): streamed and plain replies, request shape,
//! typed errors, the concurrency limit, cancellation, the capability check,
//! and `troupe run` end to end in both streaming and `--no-stream` modes.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assert_cmd::cargo::CommandCargoExt;
use common::requests::{hello, request};
use fake_openai::{FakeOpenAi, PROBE_TOOL, Received, Reply, pipeline_responder};
use serde_json::{Value, json};
use troupe::definition::Backoff;
use troupe::error::HasCode;
use troupe::provider::openai::{OpenAiConfig, OpenAiProvider};
use troupe::provider::{Message, ToolCall};
use troupe::provider::{ModelResponse, Provider, ProviderError, RequestObserver};

// ---------------------------------------------------------------- helpers

fn provider(server: &FakeOpenAi, tune: impl FnOnce(&mut OpenAiConfig)) -> OpenAiProvider {
    let mut c = OpenAiConfig::new(&server.base_url(), "TROUPE_TEST_UNSET_KEY").unwrap();
    c.model = Some("m".into());
    c.request_timeout = Duration::from_secs(10);
    tune(&mut c);
    OpenAiProvider::new(c).unwrap()
}

/// Records observer signals.
#[derive(Debug, Default)]
struct Tokens {
    text: Mutex<Vec<String>>,
    waits: Mutex<Vec<bool>>,
}

impl RequestObserver for Tokens {
    fn token(&self, text: &str) {
        self.text.lock().unwrap().push(text.to_owned());
    }
    fn waiting_for_slot(&self, waiting: bool) {
        self.waits.lock().unwrap().push(waiting);
    }
}

fn code(result: &Result<ModelResponse, ProviderError>) -> String {
    match result {
        Ok(r) => format!("ok {r:?}"),
        Err(e) => e.code().to_string(),
    }
}

fn calls(r: &ModelResponse) -> Vec<(String, String, String)> {
    r.tool_calls
        .iter()
        .map(|c| {
            (
                c.id.to_string(),
                c.name.to_string(),
                c.arguments.to_string(),
            )
        })
        .collect()
}

fn troupe() -> Command {
    let mut cmd = Command::cargo_bin("troupe").unwrap();
    cmd.env_remove("OPENAI_API_KEY");
    cmd
}

fn stages(name: &str) -> String {
    format!("{}/stages/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn text(out: &Output) -> String {
    format!(
        "status {:?}\n--- stdout\n{}\n--- stderr\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The audit lines of the only run under `runs`.
/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn audit(runs: &std::path::Path) -> Vec<Value> {
    audit_text(runs)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn audit_text(runs: &std::path::Path) -> String {
    let run = std::fs::read_dir(runs.join("runs"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    troupe::auditlog::read_text(&run.path().join(troupe::auditlog::FILE)).unwrap()
}

// ------------------------------------------------- replies and request shape

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_fragments_of_interleaved_calls_assemble_into_one_turn() {
    let server = FakeOpenAi::start(|_| {
        Reply::Calls(vec![
            ("Echo".into(), r#"{"text":"hello, wörld — ünïcode"}"#.into()),
            ("done".into(), r#"{"summary":"all fine"}"#.into()),
        ])
    });
    let r = provider(&server, |_| {}).complete(hello()).await.unwrap();
    assert_eq!(
        calls(&r),
        [
            (
                "call_0".into(),
                "Echo".into(),
                r#"{"text":"hello, wörld — ünïcode"}"#.into()
            ),
            (
                "call_1".into(),
                "done".into(),
                r#"{"summary":"all fine"}"#.into()
            ),
        ]
    );
    assert_eq!(r.text, None);
    // 2 messages × 10 prompt tokens, 5 completion tokens (the fake's rule).
    assert_eq!(
        (
            r.usage.prompt_tokens,
            r.usage.completion_tokens,
            r.usage.requests
        ),
        (20, 5, 1)
    );
    let sent = server.chats();
    assert!(sent[0].streamed());
    assert_eq!(
        sent[0].body["stream_options"],
        json!({"include_usage": true})
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn text_deltas_reach_the_observer_as_tokens() {
    let server = FakeOpenAi::start(|_| Reply::Text("The quick brown fox".into()));
    let tokens = Arc::new(Tokens::default());
    let mut req = hello();
    req.observer = Some(tokens.clone());
    let r = provider(&server, |_| {}).complete(req).await.unwrap();
    assert_eq!(r.text.as_deref(), Some("The quick brown fox"));
    let seen = tokens.text.lock().unwrap().clone();
    assert_eq!(seen.concat(), "The quick brown fox");
    assert!(seen.len() >= 5, "one token event per fragment: {seen:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_json_and_no_stream_give_the_same_turn_as_a_stream() {
    let reply = Reply::Calls(vec![
        ("Echo".into(), r#"{"text":"x"}"#.into()),
        ("Read".into(), r#"{"path":"a.rs"}"#.into()),
    ]);
    let r1 = reply.clone();
    let streamed = FakeOpenAi::start(move |_| r1.clone());
    let r2 = reply.clone();
    let fallback = FakeOpenAi::start(move |_| Reply::PlainJson(Box::new(r2.clone())));
    let plain = FakeOpenAi::start(move |_| reply.clone());

    let a = provider(&streamed, |_| {}).complete(hello()).await.unwrap();
    let b = provider(&fallback, |_| {}).complete(hello()).await.unwrap();
    let c = provider(&plain, |c| c.stream = false)
        .complete(hello())
        .await
        .unwrap();
    assert_eq!(a, b, "a JSON answer to a streamed request");
    assert_eq!(a, c, "--no-stream");
    assert!(fallback.chats()[0].streamed());
    assert!(!plain.chats()[0].streamed());
    assert!(plain.chats()[0].body.get("stream_options").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_carry_the_transcript_with_paired_tool_results_and_the_manifest() {
    let server = FakeOpenAi::start(|_| Reply::Text("ok".into()));
    let messages = vec![
        Message::System {
            content: "sys".into(),
        },
        Message::User {
            content: "go".into(),
        },
        Message::Assistant {
            content: Some("let me look".into()),
            tool_calls: vec![
                ToolCall {
                    id: "c1".into(),
                    name: "Echo".into(),
                    arguments: r#"{"text":"a"}"#.into(),
                },
                ToolCall {
                    id: "c2".into(),
                    name: "Echo".into(),
                    arguments: r#"{"text":"b"}"#.into(),
                },
            ],
        },
        Message::Tool {
            tool_call_id: "c1".into(),
            content: "a".into(),
        },
        Message::Tool {
            tool_call_id: "c2".into(),
            content: "b".into(),
        },
        Message::Assistant {
            content: None,
            tool_calls: vec![],
        },
        Message::User {
            content: "Call `done` when you are done.".into(),
        },
    ];
    provider(&server, |c| c.model = Some("my-model".into()))
        .complete(request(messages))
        .await
        .unwrap();
    let body = &server.chats()[0].body;
    assert_eq!(body["model"], "my-model");
    assert_eq!(
        body["messages"],
        json!([
            {"role": "system", "content": "sys"},
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": "let me look", "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "Echo", "arguments": "{\"text\":\"a\"}"}},
                {"id": "c2", "type": "function", "function": {"name": "Echo", "arguments": "{\"text\":\"b\"}"}}
            ]},
            {"role": "tool", "tool_call_id": "c1", "content": "a"},
            {"role": "tool", "tool_call_id": "c2", "content": "b"},
            {"role": "assistant", "content": ""},
            {"role": "user", "content": "Call `done` when you are done."}
        ])
    );
    let tools = body["tools"].as_array().unwrap();
    assert_eq!(tools.len(), 2);
    assert_eq!(tools[0]["type"], "function");
    assert_eq!(tools[0]["function"]["name"], "Echo");
    assert_eq!(
        tools[0]["function"]["parameters"]["required"],
        json!(["text"])
    );
    assert_eq!(tools[1]["function"]["name"], "done");
    assert_eq!(tools[1]["function"]["description"], "Finish.");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_arguments_and_unknown_tools_pass_through_to_the_stage() {
    let server = FakeOpenAi::start(|_| {
        Reply::Calls(vec![
            ("NoSuchTool".into(), "{}".into()),
            ("Echo".into(), "{not json".into()),
            ("done".into(), String::new()),
        ])
    });
    let r = provider(&server, |_| {}).complete(hello()).await.unwrap();
    let got: Vec<(String, String)> = r
        .tool_calls
        .iter()
        .map(|c| (c.name.to_string(), c.arguments.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            ("NoSuchTool".into(), "{}".into()),
            ("Echo".into(), "{not json".into()),
            ("done".into(), "{}".into()),
        ],
        "passed on as the model sent them (empty arguments read as {{}})"
    );
}

// ------------------------------------------------------------------ errors

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_failure_is_a_typed_error() {
    let cases: Vec<(Reply, &str)> = vec![
        (
            Reply::Status {
                status: 429,
                headers: vec![("retry-after".into(), "7".into())],
                body: r#"{"error":{"message":"slow down"}}"#.into(),
            },
            "ProviderTransient/RateLimited",
        ),
        (Reply::status(500, "boom"), "ProviderTransient/ServerError"),
        (Reply::status(503, ""), "ProviderTransient/ServerError"),
        (
            Reply::status(401, r#"{"error":{"message":"Incorrect API key"}}"#),
            "ExtensionHost/Unauthorized",
        ),
        (
            Reply::status(400, r#"{"error":{"message":"messages[3] is invalid"}}"#),
            "ExtensionHost/BadRequest",
        ),
        (
            Reply::Raw {
                content_type: "application/json".into(),
                body: r#"{"choices": [{"message": "#.into(),
            },
            "ProviderTransient/MalformedResponse",
        ),
        (
            Reply::Raw {
                content_type: "application/json".into(),
                body: r#"{"choices": []}"#.into(),
            },
            "ProviderTransient/EmptyChoices",
        ),
        (
            Reply::Events(vec!["{not json".into()]),
            "ProviderTransient/MalformedResponse",
        ),
        (
            Reply::Events(vec![
                r#"{"choices":[{"index":0,"delta":{"content":"half"}}]}"#.into(),
            ]),
            "ProviderTransient/StreamIncomplete",
        ),
        (
            // The same truncated stream under another content type.
            Reply::Raw {
                content_type: "text/plain".into(),
                body: "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"half\"}}]}\n\n"
                    .into(),
            },
            "ProviderTransient/StreamIncomplete",
        ),
        (Reply::BreakMidStream, "ProviderTransient/ConnectionFailed"),
        (Reply::Hang, "ProviderTransient/Timeout"),
        (Reply::StreamThenHang, "ProviderTransient/Timeout"),
        // A body that keeps coming, a byte at a time, is bounded as a
        // whole: ten seconds of it, each byte well within the timeout.
        (
            Reply::Trickle(Box::new(Reply::Text("a reply that takes its time".into()))),
            "ProviderTransient/Timeout",
        ),
    ];
    for (reply, expected) in cases {
        let shown = format!("{reply:?}");
        let server = FakeOpenAi::start(move |_| reply.clone());
        let p = provider(&server, |c| c.request_timeout = Duration::from_millis(300));
        let result = p.complete(hello()).await;
        assert_eq!(code(&result), expected, "{shown}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_carry_retry_after_and_the_servers_message() {
    let server = FakeOpenAi::start(|_| Reply::Status {
        status: 429,
        headers: vec![("retry-after".into(), "7".into())],
        body: r#"{"error":{"message":"Rate limit reached for requests"}}"#.into(),
    });
    match provider(&server, |_| {}).complete(hello()).await {
        Err(ProviderError::Transient {
            retry_after,
            message,
            ..
        }) => {
            assert_eq!(retry_after, Some(Duration::from_secs(7)));
            assert!(message.contains("Rate limit reached"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let server = FakeOpenAi::start(|_| Reply::status(401, r#"{"error":{"message":"bad key"}}"#));
    let err = provider(&server, |c| c.api_key_env = "MY_KEY_VAR".into())
        .complete(hello())
        .await
        .unwrap_err();
    let m = err.to_string();
    assert!(m.contains("bad key") && m.contains("$MY_KEY_VAR"), "{m}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_endpoint_is_a_transient_connection_failure() {
    let port = closed_port();
    let mut c = OpenAiConfig::new(&format!("http://127.0.0.1:{port}/v1"), "X_UNSET").unwrap();
    c.model = Some("m".into());
    let result = OpenAiProvider::new(c).unwrap().complete(hello()).await;
    assert_eq!(code(&result), "ProviderTransient/ConnectionFailed");
}

// ------------------------------------------- concurrency and cancellation

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_most_max_inflight_requests_reach_the_server_at_once() {
    // Each request is held until 3 are in flight (or all 12 arrived): with a
    // working limit exactly 3 overlap; without one, all 12 would.
    let server = FakeOpenAi::start(|_| Reply::WaitInFlight(3, Box::new(Reply::Text("ok".into()))));
    server.release_after(12);
    let p = provider(&server, |c| c.max_inflight = 3);
    let observers: Vec<Arc<Tokens>> = (0..12).map(|_| Arc::new(Tokens::default())).collect();
    let futures = observers.iter().map(|o| {
        let mut req = hello();
        req.observer = Some(o.clone());
        p.complete(req)
    });
    let results = futures::future::join_all(futures).await;
    assert!(results.iter().all(Result::is_ok));
    assert_eq!(server.counts().peak, 3);
    let stats = p.stats();
    assert_eq!((stats.peak_in_flight, stats.requests), (3, 12));
    assert!(stats.waited_for_slot >= 9, "{stats:?}");
    let waits: usize = observers
        .iter()
        .map(|o| o.waits.lock().unwrap().iter().filter(|w| **w).count())
        .sum();
    assert_eq!(waits as u64, stats.waited_for_slot, "each wait is observed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_a_request_closes_its_connection() {
    for reply in [Reply::Hang, Reply::StreamThenHang] {
        let shown = format!("{reply:?}");
        let server = FakeOpenAi::start(move |_| reply.clone());
        let p = provider(&server, |_| {});
        let task = tokio::spawn(p.complete(hello()));
        server
            .until("the request to arrive", |c| c.in_flight == 1)
            .await;
        task.abort();
        let c = server
            .until("the server to see the client go away", |c| c.dropped == 1)
            .await;
        assert_eq!((c.in_flight, c.completed), (0, 0), "{shown}");
    }
}

// ------------------------------------------------------ capability check

fn backoff() -> Backoff {
    Backoff::Fixed(Duration::from_millis(5))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_picks_the_only_listed_model_and_probes_tool_calling() {
    let server = FakeOpenAi::start(|_| Reply::Text("unused".into()));
    server.set_models(&["qwen2.5-7b"]);
    let p = provider(&server, |c| c.model = None);
    let report = p.check(2, &backoff()).await.unwrap();
    assert_eq!(report.model, "qwen2.5-7b");
    assert!(report.model_from_list);
    assert_eq!(p.model(), Some("qwen2.5-7b"));
    let probe = server
        .received()
        .into_iter()
        .find(Received::is_probe)
        .unwrap();
    assert_eq!(probe.body["model"], "qwen2.5-7b");
    assert_eq!(probe.body["tool_choice"], "required");
    assert_eq!(probe.body["stream"], false);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_fails_with_a_code_that_says_what_is_wrong() {
    let run = |responder: fn(&Received) -> Reply, models: &'static [&'static str]| async move {
        let server = FakeOpenAi::start_raw(responder);
        server.set_models(models);
        let p = provider(&server, |c| {
            c.model = None;
            c.request_timeout = Duration::from_millis(300);
        });
        let e = p.check(1, &backoff()).await.unwrap_err();
        (e.code().to_string(), e.message, e.hint)
    };
    let (code, message, hint) = run(|_| Reply::Text("I cannot call tools.".into()), &["m"]).await;
    assert_eq!(code, "ProviderCapability/ToolCallingRequired");
    assert!(message.contains("I cannot call tools."), "{message}");
    assert!(hint.contains("--jinja"), "{hint}");

    let (code, message, _) = run(
        |_| {
            Reply::status(
                400,
                r#"{"error":{"message":"this model does not support tools"}}"#,
            )
        },
        &["m"],
    )
    .await;
    assert_eq!(code, "ProviderCapability/ToolCallingRequired");
    assert!(message.contains("does not support tools"), "{message}");

    let (code, _, hint) = run(|_| Reply::status(401, "{}"), &["m"]).await;
    assert_eq!(code, "ProviderCapability/AuthenticationFailed");
    assert!(hint.contains("TROUPE_TEST_UNSET_KEY"), "{hint}");

    let (code, message, _) = run(|_| Reply::Text("x".into()), &["a", "b", "c"]).await;
    assert_eq!(code, "ProviderCapability/ModelRequired");
    assert!(message.contains("a, b, c"), "{message}");

    let (code, _, _) = run(|_| Reply::status(503, ""), &["m"]).await;
    assert_eq!(code, "ProviderCapability/EndpointUnavailable");

    let (code, _, _) = run(|_| Reply::Hang, &["m"]).await;
    assert_eq!(code, "ProviderCapability/EndpointUnreachable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_rejects_a_forced_tool_choice_is_probed_again_with_auto() {
    // Older vLLM: `tool_choice` must be "auto" or "none" (HTTP 400).
    let server = FakeOpenAi::start_raw(|r| {
        if r.body["tool_choice"] == "required" {
            Reply::status(
                400,
                r#"{"object":"error","message":"tool_choice must be 'auto' or 'none'","type":"BadRequestError","code":400}"#,
            )
        } else {
            Reply::call(PROBE_TOOL, json!({}))
        }
    });
    let p = provider(&server, |_| {});
    let report = p.check(0, &backoff()).await.unwrap();
    let probes = server.received();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[1].body["tool_choice"], "auto");
    assert_eq!(report.tool_choice, "auto");
    assert!(
        report
            .forced_choice_refused
            .as_deref()
            .is_some_and(|r| r.contains("tool_choice must be")),
        "{report:?}"
    );
}

// ---------------------------------------------------------- end to end

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
    let port = closed_port();
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
