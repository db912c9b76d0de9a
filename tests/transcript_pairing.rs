//! Every tool call in a transcript is answered by its result, on every
//! path a stage can take: an accepted completion that Assert then retries,
//! a rejected batch, a denied call, a completion that fails its schema, a
//! turn cap, a transient failure retried. The fake server refuses any
//! request that breaks OpenAI's pairing rule (as OpenAI does, with HTTP
//! 400), so each scenario runs through the real `openai` provider against
//! it, and a property drives random sequences of turns, failures and
//! retries.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use common::Fixture;
use common::openai_rules::check_chat_request;
use fake_openai::{FakeOpenAi, Reply};
use proptest::prelude::*;
use serde_json::{Value, json};
use troupe::definition::{Backoff, load_pipeline};
use troupe::provider::openai::{OpenAiConfig, OpenAiProvider};
use troupe::runtime::launch::{resolve_fields, start_run};
use troupe::runtime::spec::RunSpec;
use troupe::runtime::stage::RunSettings;
use troupe::runtime::summary::{RunReport, RunStatus};

/// One LLM stage `a` (completion `submit_a {summary}`, `Echo` allowed)
/// whose assert is false until attempt `ok_from`.
fn pipeline(max_attempts: u32, turn_cap: u32, ok_from: u32) -> Fixture {
    let stage = format!(
        "---\nid: a\nname: Stage a\nallowedTools: [Echo]\ncompletionTool: submit_a\ncompletionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: {{ type: string }}\nretryPolicy:\n  maxAttempts: {max_attempts}\n  backoff: none\nturnCap: {turn_cap}\nresolutionPolicy: fail\n---\nDo the task.\n"
    );
    let yaml = format!(
        "id: demo\nentry: a\nstages:\n  a: a.md\nnext:\n  a: end\nassert:\n  a: [\"attempt >= {ok_from}\"]\n"
    );
    Fixture::new(&yaml, &[("a.md", &stage)])
}

/// Runs the fixture through the openai provider against `server`.
fn run(fixture: &Fixture, server: &FakeOpenAi, stream: bool) -> RunReport {
    let pipeline = Arc::new(load_pipeline(fixture.path()).unwrap());
    let mut config = OpenAiConfig::new(&server.base_url(), "TROUPE_TEST_NO_KEY").unwrap();
    config.model = Some("fake-model".to_owned());
    config.stream = stream;
    let provider = Arc::new(OpenAiProvider::new(config).unwrap());
    let fields = resolve_fields(&pipeline, &[], None).unwrap();
    let mut spec = RunSpec::new(Arc::clone(&pipeline), fields, provider, None);
    spec.settings = Arc::new(RunSettings {
        provider_backoff: Backoff::None,
        provider_jitter: false,
        ..RunSettings::default()
    });
    actix::System::new().block_on(async move {
        let (_session, done) = start_run(spec, Vec::new());
        done.await.unwrap()
    })
}

fn submit(summary: &str) -> Reply {
    Reply::call("submit_a", json!({ "summary": summary }))
}

#[test]
fn an_accepted_completion_is_answered_before_assert_retries_the_attempt() {
    let server = FakeOpenAi::start(|_| submit("done"));
    let report = run(&pipeline(2, 3, 2), &server, true);
    assert_eq!(report.status, RunStatus::Ok, "{report:?}");
    let chats = server.chats();
    assert_eq!(chats.len(), 2);
    let retry = chats[1].messages();
    // system, begin, assistant(submit_a), tool(accepted), user(retry)
    assert_eq!(retry[2]["tool_calls"][0]["function"]["name"], "submit_a");
    assert_eq!(retry[3]["role"], "tool");
    assert_eq!(retry[3]["tool_call_id"], retry[2]["tool_calls"][0]["id"]);
    assert!(
        retry[3]["content"]
            .as_str()
            .unwrap()
            .starts_with("accepted"),
        "{}",
        retry[3]
    );
    assert_eq!(retry[4]["role"], "user");
    assert!(server.violations().is_empty());
}

#[test]
fn the_fake_server_refuses_an_unanswered_tool_call_as_openai_does() {
    let unanswered = json!({
        "model": "m",
        "messages": [
            {"role": "system", "content": "s"},
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "submit_a", "arguments": "{}"}}]},
            {"role": "user", "content": "retry"}
        ]
    });
    let v = check_chat_request(&unanswered).unwrap_err();
    assert!(
        v.message.contains("did not have response messages: c1"),
        "{v:?}"
    );
    let stray = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "u"}, {"role": "tool", "tool_call_id": "x", "content": "r"}]
    });
    assert!(
        check_chat_request(&stray)
            .unwrap_err()
            .message
            .contains("must be a response")
    );
    let twice = json!({
        "model": "m",
        "messages": [
            {"role": "assistant", "content": null, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "r"},
            {"role": "tool", "tool_call_id": "c1", "content": "r"}
        ]
    });
    assert!(
        check_chat_request(&twice).is_err(),
        "a call is answered once"
    );
    let options = json!({"model": "m", "stream_options": {"include_usage": true},
                         "messages": [{"role": "user", "content": "u"}]});
    assert!(check_chat_request(&options).is_err());

    // And the server answers such a request with OpenAI's 400.
    let server = FakeOpenAi::start(|_| Reply::Text("unreachable".into()));
    server.expect_violations();
    let status = post_status(&server.base_url(), &unanswered);
    assert_eq!(status, 400);
    assert_eq!(server.violations().len(), 1);
}

/// POSTs `body` to the server's chat endpoint; the status code.
fn post_status(base: &str, body: &Value) -> u16 {
    let url = format!("{base}/chat/completions");
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(async move {
            reqwest::Client::new()
                .post(url)
                .json(body)
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        })
}

/// One scripted model turn of a scenario.
#[derive(Debug, Clone)]
enum Turn {
    Text,
    Echo,
    /// Outside `allowedTools` and no interactor: denied.
    Read,
    TwoEchoes,
    Submit,
    /// Fails the completion schema.
    BadSubmit,
    /// The completion together with another call: the batch is rejected.
    SubmitWithEcho,
    TwoSubmits,
    /// HTTP 500, retried by the stage.
    ServerError,
}

fn reply(turn: &Turn) -> Reply {
    let echo = || ("Echo".to_owned(), json!({"text": "hi"}).to_string());
    let sub = || ("submit_a".to_owned(), json!({"summary": "s"}).to_string());
    match turn {
        Turn::Text => Reply::Text("thinking".into()),
        Turn::Echo => Reply::Calls(vec![echo()]),
        Turn::Read => Reply::call("Read", json!({"path": "x"})),
        Turn::TwoEchoes => Reply::Calls(vec![echo(), echo()]),
        Turn::Submit => Reply::Calls(vec![sub()]),
        Turn::BadSubmit => Reply::call("submit_a", json!({"summary": 3})),
        Turn::SubmitWithEcho => Reply::Calls(vec![sub(), echo()]),
        Turn::TwoSubmits => Reply::Calls(vec![sub(), sub()]),
        Turn::ServerError => Reply::status(500, r#"{"error":{"message":"overloaded"}}"#),
    }
}

fn turn() -> impl Strategy<Value = Turn> {
    prop_oneof![
        Just(Turn::Text),
        Just(Turn::Echo),
        Just(Turn::Read),
        Just(Turn::TwoEchoes),
        Just(Turn::Submit),
        Just(Turn::BadSubmit),
        Just(Turn::SubmitWithEcho),
        Just(Turn::TwoSubmits),
        Just(Turn::ServerError),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    /// Whatever the model does, whatever fails and is retried, every
    /// request the stage sends pairs each tool call with its result: the
    /// strict server refuses nothing, and the run ends.
    #[test]
    fn every_request_of_any_turn_sequence_pairs_each_call_with_its_result(
        turns in prop::collection::vec(turn(), 0..10),
        max_attempts in 1u32..4,
        turn_cap in 1u32..4,
        ok_from in 1u32..4,
        stream in any::<bool>(),
    ) {
        let queue = Arc::new(Mutex::new(VecDeque::from(turns)));
        let server = {
            let queue = Arc::clone(&queue);
            FakeOpenAi::start(move |_| match queue.lock().unwrap().pop_front() {
                Some(t) => reply(&t),
                None => submit("done"),
            })
        };
        let report = run(&pipeline(max_attempts, turn_cap, ok_from), &server, stream);
        prop_assert!(
            server.violations().is_empty(),
            "refused: {:#?}", server.violations()
        );
        for chat in server.chats() {
            prop_assert!(check_chat_request(&chat.body).is_ok());
        }
        let ended = matches!(report.status, RunStatus::Ok | RunStatus::Failed { .. });
        prop_assert!(ended, "{:?}", report.status);
        // Only a model that never completes in time, or a retry budget
        // spent, fails the stage; never a refused request.
        if let RunStatus::Failed { reason } = &report.status {
            prop_assert!(!reason.contains("BadRequest"), "{reason}");
        }
    }
}
