//! Properties over the fuzzed surfaces (fuzz/), small enough for CI: SSE
//! decoding ignores how the bytes are split, extract_json finds embedded
//! JSON and agrees with the plain scan, and no template, CEL, answers,
//! script, reply or pipeline text panics its parser.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

#[path = "common/extract_reference.rs"]
mod extract_reference;

use std::path::Path;
use std::sync::OnceLock;

use proptest::prelude::*;
use serde_json::{Value, json};
use troupe::definition::expr::Expr;
use troupe::definition::template::{Template, lookup};
use troupe::definition::{Pipeline, load_pipeline, load_pipeline_text};
use troupe::provider::openai::{Assembly, SseDecoder, SseError};
use troupe::provider::script::Script;
use troupe::runtime::extract::extract_json;
use troupe::runtime::interaction::AnswerRules;

fn bundled(name: &str) -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("stages")
        .join(name)
}

/// Decodes `chunks` in turn; the events, or the first error.
fn decode<'a>(chunks: impl IntoIterator<Item = &'a [u8]>) -> Result<Vec<String>, SseError> {
    let mut d = SseDecoder::new();
    let mut events = Vec::new();
    for chunk in chunks {
        events.extend(d.push(chunk)?);
    }
    events.extend(d.finish()?.map(|e| e.data));
    Ok(events)
}

/// `bytes` cut at the given fractions of its length.
fn split_at_cuts<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut at: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    at.sort_unstable();
    let mut pieces = Vec::new();
    let mut from = 0;
    for cut in at {
        pieces.push(&bytes[from..cut]);
        from = cut;
    }
    pieces.push(&bytes[from..]);
    pieces
}

/// One SSE line: data (with multi-byte characters), a comment, another
/// field, or a blank line ending an event; ended by LF, CRLF or CR.
fn sse_line() -> impl Strategy<Value = String> {
    let body = prop_oneof![
        "[a-z{}\":, é€😀\\[\\]]{0,12}".prop_map(|v| format!("data: {v}")),
        "[a-z]{0,6}".prop_map(|v| format!("data:{v}")),
        Just("data: [DONE]".to_owned()),
        "[a-z ]{0,8}".prop_map(|c| format!(": {c}")),
        "(event|id|retry): [a-z0-9]{0,4}",
        Just(String::new()),
    ];
    (body, prop_oneof![Just("\n"), Just("\r\n"), Just("\r")]).prop_map(|(b, end)| b + end)
}

/// Text with none of the characters that start or fence JSON.
fn prose() -> impl Strategy<Value = String> {
    "[a-zA-Z0-9 .,:;!?'\"\\n-]{0,40}"
}

/// A JSON value of modest size.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(Value::from),
        "[a-z{}\\[\\]\" \\\\]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            proptest::collection::btree_map("[a-z]{1,4}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn json_object() -> impl Strategy<Value = Value> {
    proptest::collection::btree_map("[a-z]{1,4}", json_value(), 0..4)
        .prop_map(|m| Value::Object(m.into_iter().collect()))
}

/// CEL pieces that splice into odd but plausible expressions.
const CEL_FRAGMENTS: [&str; 24] = [
    "ctx",
    ".upstream",
    "[0]",
    ".parsed",
    ".items",
    "size(",
    ")",
    " == ",
    " && ",
    " || ",
    "!",
    "\"a\"",
    "1",
    "2.5",
    "[",
    "]",
    "{",
    "}",
    ".map(x, x",
    ".filter(",
    " in ",
    "? ",
    ": ",
    "int(",
];

/// Answers-file pieces.
const ANSWER_FRAGMENTS: [&str; 12] = [
    "answers:\n",
    "  - ",
    "{ ",
    " }",
    "answer: ",
    "approve",
    "deny",
    "none",
    "tool: ",
    "delay: ",
    "20ms",
    "stage: ",
];

fn pipelines() -> &'static [Pipeline] {
    static PIPELINES: OnceLock<Vec<Pipeline>> = OnceLock::new();
    PIPELINES.get_or_init(|| {
        ["code-review", "fanout", "triage"]
            .iter()
            .map(|p| load_pipeline(&bundled(p)).unwrap())
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn sse_events_do_not_depend_on_how_the_bytes_are_split(
        lines in proptest::collection::vec(sse_line(), 0..16),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        let stream = lines.concat();
        let bytes = stream.as_bytes();
        prop_assert_eq!(decode([bytes]), decode(split_at_cuts(bytes, &cuts)));
    }

    #[test]
    fn sse_split_invariance_holds_for_arbitrary_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        cuts in proptest::collection::vec(any::<usize>(), 0..12),
    ) {
        prop_assert_eq!(decode([bytes.as_slice()]), decode(split_at_cuts(&bytes, &cuts)));
    }

    #[test]
    fn extract_json_agrees_with_the_plain_scan(text in "[a-z{}\\[\\]\":,` \\\\\\n0-9]{0,200}") {
        prop_assert_eq!(extract_json(&text), extract_reference::extract_json(&text));
    }

    #[test]
    fn extract_json_finds_an_object_embedded_in_prose(
        before in prose(), object in json_object(), after in prose(), pretty in any::<bool>(),
    ) {
        let json = if pretty {
            serde_json::to_string_pretty(&object).unwrap()
        } else {
            serde_json::to_string(&object).unwrap()
        };
        let text = format!("{before}{json}{after}");
        prop_assert_eq!(extract_json(&text), Some(object));
    }

    #[test]
    fn extract_json_finds_a_fenced_value(before in prose(), value in json_value(), after in prose()) {
        let text = format!("{before}\n```json\n{value}\n```\n{after}");
        prop_assert_eq!(extract_json(&text), Some(value));
    }

    #[test]
    fn template_parse_and_render_never_panic(text in "[a-z.{}\\[\\]0-9 _-]{0,60}|\\PC{0,60}") {
        if let Ok(t) = Template::parse(&text) {
            let scope = json!({"ctx": {"a": [1, {"b": "x"}]}, "stage": {"id": "s"}});
            let _ = t.render(&scope);
            let _ = t.render_value(|p| lookup(&scope, p).cloned());
        }
    }

    #[test]
    fn templates_render_text_and_values_in_order(
        parts in proptest::collection::vec(("[a-z }]{0,6}", 0usize..3), 0..6),
    ) {
        let scope = json!({"ctx": {"s": "str", "n": 7, "o": {"k": [1]}}});
        let names = ["s", "n", "o"];
        let rendered = ["str", "7", "{\"k\":[1]}"];
        let source: String = parts.iter().map(|(t, i)| format!("{t}{{{{ctx.{}}}}}", names[*i])).collect();
        let expected: String = parts.iter().map(|(t, i)| format!("{t}{}", rendered[*i])).collect();
        prop_assert_eq!(Template::parse(&source).unwrap().render(&scope).unwrap(), expected);
    }

    #[test]
    fn cel_compile_and_eval_never_panic_on_arbitrary_text(source in "\\PC{0,40}") {
        eval_cel(&source);
    }

    #[test]
    fn cel_compile_and_eval_never_panic_on_spliced_fragments(
        picks in proptest::collection::vec(0usize..CEL_FRAGMENTS.len(), 1..12),
    ) {
        let source: String = picks.iter().map(|i| CEL_FRAGMENTS[*i]).collect();
        eval_cel(&source);
    }

    #[test]
    fn tool_call_arguments_reassemble_from_any_fragments(
        arguments in "\\PC{0,40}",
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let mut at: Vec<usize> = cuts.iter().map(|c| c % (arguments.len() + 1)).collect();
        at.retain(|c| arguments.is_char_boundary(*c));
        at.sort_unstable();
        let mut a = Assembly::new();
        let first = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
            {"index": 0, "id": "c1", "type": "function", "function": {"name": "Echo", "arguments": ""}}
        ]}}]});
        a.apply_chunk(&first.to_string(), None).unwrap();
        let mut from = 0;
        for cut in at.into_iter().chain([arguments.len()]) {
            let chunk = json!({"choices": [{"index": 0, "delta": {"tool_calls": [
                {"index": 0, "function": {"arguments": &arguments[from..cut]}}
            ]}}]});
            a.apply_chunk(&chunk.to_string(), None).unwrap();
            from = cut;
        }
        let calls = a.into_response().unwrap().tool_calls;
        prop_assert_eq!(calls.len(), 1);
        let expected = if arguments.trim().is_empty() { "{}" } else { arguments.as_str() };
        prop_assert_eq!(&*calls[0].arguments, expected);
    }

    #[test]
    fn reply_assembly_never_panics(body in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = Assembly::from_completion(&body).and_then(Assembly::into_response);
        let mut a = Assembly::new();
        for line in String::from_utf8_lossy(&body).lines() {
            if a.apply_chunk(line, None).is_err() {
                break;
            }
        }
        let _ = a.into_response();
    }

    #[test]
    fn answers_parsing_never_panics(
        picks in proptest::collection::vec((0usize..ANSWER_FRAGMENTS.len(), "[a-z \\n:{}-]{0,4}"), 0..16),
        noise in "\\PC{0,40}",
    ) {
        let text: String = picks.iter().map(|(i, f)| format!("{}{f}", ANSWER_FRAGMENTS[*i])).collect();
        let _ = AnswerRules::parse("a.yaml", &text);
        let _ = AnswerRules::parse("a.yaml", &noise);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn script_parsing_never_panics_on_mutated_scripts(
        which in 0usize..3, cut in any::<usize>(), insert in "[\\PC\\n]{0,8}",
    ) {
        let names = ["code-review", "fanout", "triage"];
        let good = std::fs::read_to_string(bundled(names[which]).join("script.yaml")).unwrap();
        let text = splice(&good, cut, &insert);
        for pipeline in pipelines() {
            let _ = Script::parse_str(Path::new("script.yaml"), &text, pipeline);
        }
    }

    #[test]
    fn pipeline_text_never_panics_the_loader(
        which in 0usize..3, cut in any::<usize>(), insert in "[\\PC\\n]{0,8}",
    ) {
        let names = ["code-review", "fanout", "triage"];
        let dir = bundled(names[which]);
        let good = std::fs::read_to_string(dir.join("pipeline.yaml")).unwrap();
        let text = splice(&good, cut, &insert);
        let file = dir.join("pipeline.yaml");
        match load_pipeline_text(&dir, &file, &text, &troupe::definition::is_builtin) {
            Ok(p) => prop_assert!(p.stage(&p.entry).is_some()),
            Err(d) => prop_assert!(!d.0.is_empty()),
        }
    }
}

/// `text` with `insert` at a char boundary near `cut`.
fn splice(text: &str, cut: usize, insert: &str) -> String {
    let cut = cut % (text.len() + 1);
    let cut = (0..=cut)
        .rev()
        .find(|i| text.is_char_boundary(*i))
        .unwrap_or(0);
    format!("{}{insert}{}", &text[..cut], &text[cut..])
}

fn eval_cel(source: &str) {
    if let Ok(e) = Expr::compile(source) {
        let ctx = json!({"upstream": [{"parsed": {"items": [1, 2], "v": "a"}}], "index": 0});
        let parsed = json!({"steps": ["a"]});
        let _ = e.variables();
        let _ = e.eval(&[("ctx", &ctx), ("parsed", &parsed)]);
    }
}

/// The control API's request decoding (the `control_request` fuzz target's
/// property, in CI): any method, path, header and body through the real
/// router of a server that takes submissions. A refusal is always a typed
/// JSON error; nothing panics.
mod control_requests {
    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::Request;
    use proptest::prelude::*;
    use serde_json::Value;
    use tower::ServiceExt;
    use troupe::control::server::router;
    use troupe::control::{Hosted, RunControl, Submission, Submitter};

    /// A server whose every submission is refused as a bad one.
    struct Refusing;

    impl Submitter for Refusing {
        fn submit(
            &self,
            s: Submission,
        ) -> futures::future::BoxFuture<'static, Result<String, (u16, Value)>> {
            let said = s.args.len();
            Box::pin(async move {
                Err((
                    422,
                    serde_json::json!({"error": {"code": "Control/BadArgs", "message": format!("{said} args")}}),
                ))
            })
        }
        fn resume(
            &self,
            _: String,
            s: Submission,
        ) -> futures::future::BoxFuture<'static, Result<String, (u16, Value)>> {
            self.submit(s)
        }
    }

    fn paths() -> impl Strategy<Value = String> {
        let known = prop_oneof![
            Just("/v1/runs"),
            Just("/v1/runs/r"),
            Just("/v1/runs/r/events"),
            Just("/v1/runs/r/pending/"),
            Just("/v1/runs/r/questions/"),
            Just("/v1/runs/r/cancel"),
            Just("/v1/runs/r/resume"),
            Just("/v1/runs/r/timeline.svg"),
            Just("/"),
        ];
        (known, "[a-zA-Z0-9%?=&#/._-]{0,24}").prop_map(|(k, tail)| format!("{k}{tail}"))
    }

    fn bodies() -> impl Strategy<Value = Vec<u8>> {
        prop_oneof![
            proptest::collection::vec(any::<u8>(), 0..256),
            "[a-z{}\\[\\]\":, 0-9/]{0,64}".prop_map(String::into_bytes),
            Just(br#"{"args": ["p", "--ctx", "a=1"], "cwd": "/tmp"}"#.to_vec()),
            Just(br#"{"args": "p", "cwd": "relative"}"#.to_vec()),
            Just(vec![b'{'; 70 * 1024]),
        ]
    }

    /// A server with one run, `r`, that takes questions and refuses
    /// every submission.
    fn hosting_r(dir: &std::path::Path) -> Arc<Hosted> {
        let hosted = Arc::new(Hosted::new(Some(Arc::new(Refusing))));
        hosted.add(Arc::new(RunControl::new(
            "r",
            "p",
            &dir.join("audit.jsonl"),
            None,
            Some(Arc::new(troupe::runtime::ask::QuestionDesk::default())),
        )));
        hosted
    }

    /// A body over the bound is refused as `Control/BodyTooLarge` on
    /// every route that reads one, before anything else is asked of it
    /// (the approval route of a run without `--remote` included).
    #[test]
    fn an_oversized_body_is_refused_on_every_route_that_reads_one() {
        let dir = tempfile::tempdir().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        for path in [
            "/v1/runs",
            "/v1/runs/r/pending/p1",
            "/v1/runs/r/questions/r%2Fs%2F1",
        ] {
            let request = Request::builder()
                .method("POST")
                .uri(path)
                .body(Body::from(vec![b'{'; 70 * 1024]))
                .unwrap();
            let (status, v) = rt.block_on(async {
                let response = router(hosting_r(dir.path()))
                    .oneshot(request)
                    .await
                    .unwrap();
                let status = response.status();
                let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
                    .await
                    .unwrap();
                (status, serde_json::from_slice::<Value>(&bytes).unwrap())
            });
            assert_eq!(status.as_u16(), 413, "{path}: {v}");
            assert_eq!(v["error"]["code"], "Control/BodyTooLarge", "{path}: {v}");
        }
    }

    /// A body that never finishes is refused as `Control/RequestTimeout`
    /// after its 30 s, and the connection is closed after the answer
    /// (paused time: the deadline passes at once).
    #[tokio::test(start_paused = true)]
    async fn a_body_that_never_finishes_is_refused_in_time() {
        let dir = tempfile::tempdir().unwrap();
        let never = futures::stream::pending::<Result<axum::body::Bytes, std::io::Error>>();
        let request = Request::builder()
            .method("POST")
            .uri("/v1/runs/r/cancel")
            .body(Body::from_stream(never))
            .unwrap();
        let response = router(hosting_r(dir.path()))
            .oneshot(request)
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 408);
        assert_eq!(response.headers()["connection"], "close");
        let bytes = axum::body::to_bytes(response.into_body(), 1 << 20)
            .await
            .unwrap();
        let v: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(v["error"]["code"], "Control/RequestTimeout", "{v}");
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn every_refusal_is_a_typed_error(
            method in prop_oneof![Just("GET"), Just("POST"), Just("PUT"), Just("DELETE")],
            path in paths(),
            event_id in proptest::option::of("[0-9a-z]{0,8}"),
            body in bodies(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let hosted = hosting_r(dir.path());
            let mut request = Request::builder().method(method).uri(&path);
            if let Some(id) = &event_id {
                request = request.header("last-event-id", id.as_str());
            }
            let Ok(request) = request.body(Body::from(body)) else {
                return Ok(());
            };
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            let (status, typed, bytes) = rt.block_on(async {
                let response = tokio::time::timeout(
                    std::time::Duration::from_secs(10),
                    router(hosted).oneshot(request),
                )
                .await
                .expect("the router answers")
                .unwrap();
                let status = response.status();
                let typed = response
                    .headers()
                    .get("content-type")
                    .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
                // An event stream of a run with no log yet never ends: its
                // head is enough.
                let bytes = if status.is_success() {
                    Vec::new()
                } else {
                    axum::body::to_bytes(response.into_body(), 1 << 20).await.unwrap().to_vec()
                };
                (status, typed, bytes)
            });
            if status.is_client_error() || status.is_server_error() {
                prop_assert!(typed, "{} {}: {} untyped", method, path, status);
                let v: Value = serde_json::from_slice(&bytes).unwrap();
                let code = v["error"]["code"].as_str().unwrap_or_default();
                prop_assert!(code.starts_with("Control/"), "{} {}: {}", method, path, v);
                // And says why: no refusal has an empty message.
                let message = v["error"]["message"].as_str().unwrap_or_default();
                prop_assert!(!message.trim().is_empty(), "{} {}: {}", method, path, v);
            }
        }
    }
}

/// A worker's event line read inside its report (`EventLine`'s
/// deserialization, the coordinator's one pass) gives what reading the
/// line alone gives: the same event, or none.
mod relayed_lines {
    use super::*;
    use troupe::distributed::outbox;
    use troupe::distributed::wire::Report;
    use troupe::runtime::events::Event;

    fn values() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("1".to_owned()),
            Just("-2.5e3".to_owned()),
            Just("1e999".to_owned()),
            Just("null".to_owned()),
            Just(r#""\ud800""#.to_owned()),
            Just(r#"{"k\"ey":[true,{"x":"\u0001"}]}"#.to_owned()),
            "\"[a-z é\\\\\"]{0,8}\"".prop_map(|s| s),
            any::<i64>().prop_map(|n| n.to_string()),
        ]
    }

    fn lines() -> impl Strategy<Value = String> {
        let head = prop_oneof![
            Just(r#""event":"StageEntered","workflowRunId":"r""#.to_owned()),
            Just(r#""seq":4,"ts":"2026-11-26T10:00:00.000001Z","event":"StageExited","workflowRunId":"r","stageId":"w","stageExecutionId":"r/w#1/1""#.to_owned()),
            Just(r#""event":"NoSuchEvent","workflowRunId":"r""#.to_owned()),
            Just(r#""workflowRunId":"r""#.to_owned()),
        ];
        let fields = proptest::collection::vec(("[a-zA-Z\"\\\\]{0,6}", values()), 0..5);
        prop_oneof![
            4 => (head, fields).prop_map(|(head, fields)| {
                let mut line = format!("{{{head}");
                for (key, value) in fields {
                    line.push(',');
                    line.push_str(&serde_json::to_string(&key).unwrap());
                    line.push(':');
                    line.push_str(&value);
                }
                line.push('}');
                line
            }),
            1 => values(),
            1 => "[\\[\\]{}\":,a-z0-9 ]{0,24}".prop_map(|s| s),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn a_line_read_in_its_report_is_the_line_read_alone(line in lines()) {
            // A line without a readable timestamp is stamped when it is
            // read: such stamps (from this test's run on) are compared as
            // one; a timestamp the line gave is compared as it is.
            let before = std::time::SystemTime::now();
            let stamped = |event: Option<Event>| {
                event.map(|mut e| {
                    if e.ts >= before {
                        e.ts = std::time::UNIX_EPOCH;
                    }
                    e
                })
            };
            let alone = stamped(Event::from_line(&line));
            // In a report, as the coordinator reads a worker's batch.
            let batch = format!(
                r#"[{{"kind":"cancelled","body":{{"stageExecutionId":"r/w#1/1","turn":1,"unit":1,"worker":"w","usage":{},"events":[{line}]}}}}]"#,
                serde_json::to_string(&troupe::runtime::result::Usage::default()).unwrap()
            );
            let one_value = serde_json::from_str::<&serde_json::value::RawValue>(&line).is_ok();
            match outbox::decode(batch.as_bytes()).into_iter().next() {
                Some(Ok(Report::Cancelled { events, .. })) if events.len() == 1 => {
                    let read = stamped(events.into_iter().next().unwrap().into_event());
                    prop_assert_eq!(read, alone);
                }
                // Whatever is one JSON value keeps its report.
                _ => prop_assert!(!one_value && alone.is_none(), "{}", line),
            }
        }
    }
}
