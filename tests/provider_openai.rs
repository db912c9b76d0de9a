//! The `openai` provider against a real HTTP server on loopback (axum, in
//! `common/fake_openai.rs`): streamed and plain replies, request shape,
//! typed errors, the concurrency limit, cancellation and the capability
//! check (`troupe run` end to end against the same server:
//! `provider_openai_cli.rs`).

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::requests::{hello, request};
use fake_openai::{FakeOpenAi, PROBE_TOOL, Received, Reply};
use serde_json::json;
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
            // An event past 8 MiB: refused, not asked for again (a plain
            // reply past its bound is not either).
            Reply::Events(vec!["x".repeat(9 << 20)]),
            "ExtensionHost/ResponseTooLarge",
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
        // Errors inside a 200: a gateway's error body, llama.cpp's
        // `event: error` before `[DONE]`, an error chunk with a 4xx code.
        (
            Reply::Raw {
                content_type: "application/json".into(),
                body: r#"{"object":"chat.completion","choices":null,"error":{"message":"upstream failed","code":502}}"#.into(),
            },
            "ProviderTransient/ServerError",
        ),
        (
            Reply::Raw {
                content_type: "application/json".into(),
                body: r#"{"error":{"message":"messages: bad role","code":400}}"#.into(),
            },
            "ExtensionHost/BadRequest",
        ),
        (
            Reply::Raw {
                content_type: "text/event-stream".into(),
                body: "event: error\ndata: {\"code\":400,\"message\":\"the request exceeds the available context size\",\"type\":\"exceed_context_size_error\"}\n\ndata: [DONE]\n\n".into(),
            },
            "ExtensionHost/ContextLengthExceeded",
        ),
        (
            Reply::Raw {
                content_type: "text/event-stream".into(),
                body: "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"cut\"}}]}\n\ndata: {\"error\":{\"message\":\"slow down\",\"code\":429}}\n\ndata: [DONE]\n\n".into(),
            },
            "ProviderTransient/RateLimited",
        ),
        (
            Reply::status(
                400,
                r#"{"error":{"code":400,"message":"the request exceeds the available context size","type":"exceed_context_size_error"}}"#,
            ),
            "ExtensionHost/ContextLengthExceeded",
        ),
        // A redirect is not followed: a POST would arrive as a GET with
        // no body, and without its key on another host.
        (
            Reply::Status {
                status: 301,
                headers: vec![("location".into(), "https://elsewhere.example/v1/chat/completions".into())],
                body: String::new(),
            },
            "ExtensionHost/Redirected",
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
    let port = common::closed_port();
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

/// An event with empty data (a proxy's heartbeat) carries nothing: the
/// stream around it is read as if it were not there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_event_in_a_stream_is_skipped() {
    let server = FakeOpenAi::start(|_| {
        Reply::Raw {
        content_type: "text/event-stream".into(),
        body: "data:\n\ndata: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":\"stop\"}]}\n\ndata:\n\ndata: [DONE]\n\n".into(),
    }
    });
    let p = provider(&server, |_| {});
    let reply = p.complete(hello()).await.unwrap();
    assert_eq!(reply.text.as_deref(), Some("hi"));
}

/// A try the server billed is charged: a reply with no choices, an error
/// inside a stream after its usage, a stream cut by a reset. A stream the
/// model finished is taken even when the connection drops before
/// `[DONE]`, and counts the server got wrong do not cost the turn.
#[tokio::test]
async fn failed_tries_keep_their_usage_and_finished_streams_are_taken() {
    use troupe::provider::Usage;
    let usage = |prompt, completion| Usage {
        prompt_tokens: prompt,
        completion_tokens: completion,
        requests: 1,
    };
    let call = r#"{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","function":{"name":"Echo","arguments":"{}"}}]},"finish_reason":"tool_calls"}]}"#;
    let usage_chunk = r#"{"choices":[],"usage":{"prompt_tokens":300,"completion_tokens":30}}"#;
    let plain = |body: &str| Reply::Raw {
        content_type: "application/json".into(),
        body: body.into(),
    };
    /// The usage taken, or the failure's code and the usage it carries.
    type Expected = Result<Usage, (&'static str, Option<Usage>)>;
    let cases: Vec<(Reply, Expected)> = vec![
        (
            Reply::EventsThenBreak(vec![call.into(), usage_chunk.into()]),
            Ok(usage(300, 30)),
        ),
        (
            Reply::EventsThenBreak(vec![call.into()]),
            Ok(Usage {
                requests: 1,
                ..Usage::default()
            }),
        ),
        (
            // The usage event cut short by the drop: the turn is taken
            // without it, not asked for (and billed) again.
            Reply::EventsThenCut(
                vec![call.into()],
                r#"data: {"choices":[],"usage":{"prompt_to"#.into(),
            ),
            Ok(Usage {
                requests: 1,
                ..Usage::default()
            }),
        ),
        (
            Reply::EventsThenBreak(vec![usage_chunk.into()]),
            Err(("ProviderTransient/ConnectionFailed", Some(usage(300, 30)))),
        ),
        (
            Reply::Events(vec![
                usage_chunk.into(),
                r#"{"error":{"message":"overloaded","code":503}}"#.into(),
            ]),
            Err(("ProviderTransient/ServerError", Some(usage(300, 30)))),
        ),
        (
            plain(r#"{"choices":[],"usage":{"prompt_tokens":1000,"completion_tokens":1000}}"#),
            Err(("ProviderTransient/EmptyChoices", Some(usage(1000, 1000)))),
        ),
        (
            plain(
                r#"{"error":{"message":"busy","code":503},"usage":{"prompt_tokens":7,"completion_tokens":0}}"#,
            ),
            Err(("ProviderTransient/ServerError", Some(usage(7, 0)))),
        ),
        (
            plain(r#"{"choices":[]}"#),
            Err(("ProviderTransient/EmptyChoices", None)),
        ),
    ];
    for (reply, expected) in cases {
        let described = format!("{reply:?}");
        let server = FakeOpenAi::start(move |_| reply.clone());
        let p = provider(&server, |_| {});
        let got = p.complete(hello()).await;
        match (&got, expected) {
            (Ok(response), Ok(usage)) => assert_eq!(response.usage, usage, "{described}"),
            (Err(e), Err((code, usage))) => {
                assert_eq!(e.code().to_string(), code, "{described}");
                assert_eq!(e.usage(), usage, "{described}");
            }
            _ => panic!("{described}: {}", self::code(&got)),
        }
        assert_eq!(server.chats().len(), 1, "one request: {described}");
    }
    // Counts a server got wrong read as the nearest count.
    for (counts, expected) in [
        (
            r#""prompt_tokens":-5,"completion_tokens":12.0"#,
            usage(0, 12),
        ),
        (
            r#""prompt_tokens":"12","completion_tokens":2.6"#,
            usage(12, 3),
        ),
        (
            r#""prompt_tokens":18446744073709551616,"completion_tokens":null"#,
            usage(u64::MAX, 0),
        ),
        (
            r#""prompt_tokens":{"cached":1},"completion_tokens":[1]"#,
            usage(0, 0),
        ),
    ] {
        let body = format!(
            r#"{{"choices":[{{"index":0,"message":{{"role":"assistant","content":"hi"}},"finish_reason":"stop"}}],"usage":{{{counts}}}}}"#
        );
        let server = FakeOpenAi::start(move |_| plain(&body));
        let p = provider(&server, |_| {});
        let got = p.complete(hello()).await;
        assert_eq!(got.map(|r| r.usage).ok(), Some(expected), "{counts}");
    }
}

/// An error a server reports inside a 200 during the capability check is
/// handled as the same error in the status: a rate limit is retried with
/// the same probe, an overload falls back to `tool_choice: auto`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_inside_a_200_during_the_check_is_handled_as_its_status() {
    for (code, second_choice) in [(429, "required"), (503, "auto")] {
        let probes = Arc::new(Mutex::new(0));
        let seen = Arc::clone(&probes);
        let server = FakeOpenAi::start_raw(move |_| {
            let mut n = seen.lock().unwrap();
            *n += 1;
            if *n == 1 {
                return Reply::Raw {
                    content_type: "application/json".into(),
                    body: format!(r#"{{"error":{{"message":"busy","code":{code}}}}}"#),
                };
            }
            Reply::call(PROBE_TOOL, json!({}))
        });
        let p = provider(&server, |_| {});
        let report = p.check(2, &backoff()).await;
        assert!(report.is_ok(), "{code}: {report:?}");
        let probes: Vec<Received> = server
            .received()
            .into_iter()
            .filter(Received::is_probe)
            .collect();
        assert_eq!(probes.len(), 2, "{code}");
        assert_eq!(probes[1].body["tool_choice"], second_choice, "{code}");
    }
}
