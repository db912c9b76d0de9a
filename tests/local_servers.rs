//! `troupe run` against the local servers people run, modelled by the fake
//! server's quirks: llama-cpp-python (no forced tool choice, empty streams
//! when tools are offered) and Ollama (whole tool calls, finish reason
//! "stop"); and what the run records about its provider.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use common::{audit, stages, text};
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;
use fake_openai::{FakeOpenAi, Quirk, pipeline_responder};
use serde_json::Value;

/// `troupe run stages/fanout --ctx width=4 --base-url <server>` (no
/// `--model`: the server lists one), plus `extra`.
fn run_fanout(server: &FakeOpenAi, runs: &std::path::Path, extra: &[&str]) -> Output {
    Command::cargo_bin("troupe")
        .unwrap()
        .env("OPENAI_API_KEY", "sk-local-secret")
        .args(["run", &stages("fanout"), "--ctx", "width=4"])
        .args(["--base-url", &server.base_url()])
        .args(["--provider-backoff", "1ms", "--runs-dir"])
        .arg(runs.join("runs"))
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn llama_cpp_python_is_probed_with_auto_and_loses_streaming_after_two_empty_streams() {
    let server = FakeOpenAi::start_raw(|r| {
        if r.is_probe() {
            fake_openai::Reply::call(fake_openai::PROBE_TOOL, serde_json::json!({}))
        } else {
            pipeline_responder(r)
        }
    });
    server.set_quirk(Quirk::LlamaCppPython);
    let runs = tempfile::tempdir().unwrap();
    let out = run_fanout(&server, runs.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("cannot force a tool call") && stderr.contains("\"auto\""),
        "{stderr}"
    );
    assert_eq!(
        stderr.matches("for the rest of this run").count(),
        1,
        "said once: {stderr}"
    );

    // The forced probe was refused (500), the auto probe passed.
    let probes: Vec<_> = server
        .received()
        .into_iter()
        .filter(|r| r.is_probe())
        .collect();
    assert_eq!(probes.len(), 2);
    assert_eq!(probes[0].body["tool_choice"], "required");
    assert_eq!(probes[1].body["tool_choice"], "auto");

    // Exactly two streamed requests (both ended empty), then plain ones.
    let chats = server.chats();
    let streamed = chats.iter().filter(|r| r.streamed()).count();
    assert_eq!(
        streamed,
        2,
        "{:?}",
        chats.iter().map(|r| r.streamed()).collect::<Vec<_>>()
    );
    assert!(chats.iter().skip(2).all(|r| !r.streamed()));

    let events = audit(runs.path());
    let notices: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "ProviderNotice")
        .collect();
    assert_eq!(notices.len(), 1, "{notices:#?}");
    assert_eq!(notices[0]["code"], "StreamingDisabled");
    let incomplete = events
        .iter()
        .filter(|e| e["code"] == "ProviderTransient/StreamIncomplete")
        .count();
    assert_eq!(incomplete, 2);
}

#[test]
fn ollama_whole_tool_calls_with_finish_reason_stop_run_as_any_turn() {
    let server = FakeOpenAi::start(pipeline_responder);
    server.set_quirk(Quirk::Ollama);
    let runs = tempfile::tempdir().unwrap();
    let out = run_fanout(&server, runs.path(), &["--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["stages"]["worker"]["ok"], 4);
}

#[test]
fn workflow_started_records_the_provider_model_and_endpoint_never_the_key() {
    let server = FakeOpenAi::start(pipeline_responder);
    let runs = tempfile::tempdir().unwrap();
    let out = run_fanout(&server, runs.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let events = audit(runs.path());
    let started = &events[0];
    assert_eq!(started["event"], "WorkflowStarted");
    assert_eq!(started["provider"]["name"], "openai");
    assert_eq!(started["provider"]["model"], "fake-model");
    assert_eq!(started["provider"]["baseUrl"], server.base_url());
    assert_eq!(started["provider"]["stream"], true);
    assert_eq!(started["limits"]["maxVisits"], 25);
    let log = events
        .iter()
        .map(Value::to_string)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!log.contains("sk-local-secret"));

    // The scripted provider is named too.
    let runs = tempfile::tempdir().unwrap();
    let out = Command::cargo_bin("troupe")
        .unwrap()
        .args(["run", &stages("fanout"), "--ctx", "width=2", "--runs-dir"])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    assert_eq!(audit(runs.path())[0]["provider"]["name"], "scripted");
}
