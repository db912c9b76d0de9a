//! A model reply cut at every byte boundary, through the real HTTP client
//! against the fake server on loopback: a plain JSON completion and an SSE
//! stream, each valid in full and carrying two tool calls (one with a
//! multi-byte character in its arguments, so some cuts fall inside a UTF-8
//! character). Every prefix must give a typed provider error or — for a
//! stream whose end is already in the prefix — the same turn as the whole
//! reply (its usage unknown if the usage chunk was cut off); never a
//! panic, a hang or a different turn.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::requests::hello;
use fake_openai::{FakeOpenAi, Reply};
use troupe::error::HasCode;
use troupe::provider::openai::{OpenAiConfig, OpenAiProvider};
use troupe::provider::{ModelResponse, Provider, ProviderError};

const PLAIN: &str = concat!(
    r#"{"id":"c1","object":"chat.completion","created":1,"model":"m","choices":[{"index":0,"#,
    r#""message":{"role":"assistant","content":null,"tool_calls":["#,
    r#"{"id":"call_0","type":"function","function":{"name":"Echo","arguments":"{\"text\":\"héllo ✓\"}"}},"#,
    r#"{"id":"call_1","type":"function","function":{"name":"done","arguments":"{\"summary\":\"ok\"}"}}]},"#,
    r#""finish_reason":"tool_calls"}],"usage":{"prompt_tokens":20,"completion_tokens":5,"total_tokens":25}}"#
);

fn stream() -> String {
    let chunk = |choices: &str| {
        format!(
            "data: {{\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":{choices}}}\n\n"
        )
    };
    let mut s = String::new();
    s += &chunk(
        r#"[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"Echo","arguments":""}}]},"finish_reason":null}]"#,
    );
    s += &chunk(
        r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{\"text\":\"hé"}}]},"finish_reason":null}]"#,
    );
    s += &chunk(
        r#"[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"llo ✓\"}"}}]},"finish_reason":null}]"#,
    );
    s += &chunk(
        r#"[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"call_1","type":"function","function":{"name":"done","arguments":"{\"summary\":\"ok\"}"}}]},"finish_reason":null}]"#,
    );
    s += &chunk(r#"[{"index":0,"delta":{},"finish_reason":"tool_calls"}]"#);
    s += "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":20,\"completion_tokens\":5,\"total_tokens\":25}}\n\n";
    s += "data: [DONE]\n\n";
    s
}

/// Sends one request for every prefix of `body` (served as
/// `content_type`), from empty to whole; returns each outcome by length.
async fn every_prefix(
    body: &[u8],
    content_type: &str,
    stream: bool,
) -> Vec<(usize, Result<ModelResponse, ProviderError>)> {
    let cut = Arc::new(Mutex::new(0usize));
    let len = body.len();
    let body = body.to_vec();
    let served = Arc::clone(&cut);
    let content_type = content_type.to_owned();
    let server = FakeOpenAi::start(move |_| Reply::Bytes {
        content_type: content_type.clone(),
        body: body[..*served.lock().unwrap()].to_vec(),
    });
    let mut config = OpenAiConfig::new(&server.base_url(), "TROUPE_TEST_UNSET_KEY").unwrap();
    config.model = Some("m".into());
    config.stream = stream;
    // A bound, so a hang fails instead of blocking the suite.
    config.request_timeout = Duration::from_secs(10);
    let provider = OpenAiProvider::new(config).unwrap();
    let mut out = Vec::new();
    for n in 0..=len {
        *cut.lock().unwrap() = n;
        out.push((n, provider.complete(hello()).await));
    }
    out
}

fn check(outcomes: &[(usize, Result<ModelResponse, ProviderError>)], len: usize, what: &str) {
    let whole = match &outcomes[len].1 {
        Ok(r) => r.clone(),
        Err(e) => panic!("{what}: the whole reply failed: {}: {e}", e.code()),
    };
    assert_eq!(whole.tool_calls.len(), 2, "{what}");
    assert_eq!(&*whole.tool_calls[0].arguments, r#"{"text":"héllo ✓"}"#);
    for (n, outcome) in &outcomes[..len] {
        match outcome {
            // The same turn. A stream cut after its finishing chunk but
            // before the usage chunk is accepted (servers that never send
            // usage end so), with its usage unknown: zero tokens.
            Ok(r) => {
                assert_eq!(
                    (&r.text, &r.tool_calls),
                    (&whole.text, &whole.tool_calls),
                    "{what}: the first {n} bytes gave another turn than the whole reply"
                );
                assert!(
                    r.usage == whole.usage
                        || (r.usage.prompt_tokens, r.usage.completion_tokens) == (0, 0),
                    "{what}: the first {n} bytes: {:?}",
                    r.usage
                );
            }
            Err(e) => {
                let code = e.code().to_string();
                assert!(
                    code.starts_with("ProviderTransient/"),
                    "{what}: the first {n} bytes: {code}: {e}"
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_completion_cut_at_every_byte_is_a_typed_error() {
    let body = PLAIN.as_bytes();
    let outcomes = every_prefix(body, "application/json", false).await;
    check(&outcomes, body.len(), "plain");
    // A plain reply is whole or nothing: every proper prefix fails.
    assert!(
        outcomes[..body.len()].iter().all(|(_, o)| o.is_err()),
        "a cut JSON body was accepted"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_cut_at_every_byte_is_a_typed_error_or_the_same_turn() {
    let text = stream();
    let body = text.as_bytes();
    let outcomes = every_prefix(body, "text/event-stream", true).await;
    check(&outcomes, body.len(), "stream");
    // Cut before the finishing chunk, a stream can only fail.
    let finish = text.find("\"finish_reason\":\"tool_calls\"").unwrap();
    assert!(
        outcomes[..finish].iter().all(|(_, o)| o.is_err()),
        "a stream cut before its end was accepted"
    );
}
