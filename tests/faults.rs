//! Faults: parts of a run that fail — the provider at any turn (a reply
//! cut at any byte is `tests/reply_truncation.rs`), a tool past its timeout, a hook that crashes, hangs or
//! prints garbage, a Rust hook that panics, an interactor whose input goes
//! away mid-prompt, an audit log on a full disk or removed mid-run, a run
//! store deleted mid-run. Each
//! ends in its documented, typed outcome, never a panic or a hung run, and
//! (but where the audit log itself is what failed) with a complete audit
//! log: every entry closed once, `seq` strictly increasing, `WorkflowExit`
//! last.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use std::path::Path;
use std::process::Output;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::Fixture;
use common::project::{OBSERVER_EVENTS, assert_well_formed};
use common::run::{Opts, Outcome, run};
use fake_openai::{FakeOpenAi, Reply, pipeline_responder};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use troupe::definition::load_pipeline;
use troupe::provider::script::Script;
use troupe::provider::scripted::ScriptedProvider;
use troupe::provider::{ModelRequest, Provider};
use troupe::runtime::audit::{Sink, start_audit_log};
use troupe::runtime::hooks::{Hook, HookError, HookReply};
use troupe::runtime::interaction::{Answer, InteractorSpec, PromptView, Prompter};
use troupe::runtime::launch::{resolve_fields, start_run};
use troupe::runtime::spec::RunSpec;
use troupe::runtime::stage::RunSettings;
use troupe::runtime::summary::{RunReport, RunStatus};
use troupe_actors::Delivery;

// ---------------------------------------------------------------- helpers

/// A one-stage pipeline whose stage may use `allowed` and follows
/// `script`, with `hooks` (YAML list items, may be empty).
fn one_stage(allowed: &str, hooks: &str, script: &str) -> Fixture {
    let stage = format!(
        "---\nid: s\nname: Stage s\nallowedTools: [{allowed}]\ncompletionTool: done\ncompletionSchema:\n  type: object\n  properties: {{ n: {{ type: integer }} }}\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 8\nresolutionPolicy: fail\n---\nWork.\n"
    );
    let hooks = if hooks.is_empty() {
        String::new()
    } else {
        format!("hooks:\n{hooks}")
    };
    let yaml = format!("id: p\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n{hooks}");
    Fixture::new(&yaml, &[("s.md", &stage), ("script.yaml", script)])
}

/// The audit events of a run (observer events left out).
fn audited(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| !OBSERVER_EVENTS.iter().any(|n| e["event"] == *n))
        .cloned()
        .collect()
}

/// A complete audit log: well formed, `WorkflowExit` last.
fn assert_complete(log: &[Value]) {
    assert_well_formed(log);
    let last = log.last().expect("a log");
    assert_eq!(last["event"], "WorkflowExit", "the log ends with the run");
}

fn failure(report: &RunReport) -> String {
    match &report.status {
        RunStatus::Failed { reason } => reason.clone(),
        other => panic!("the run should have failed: {other:?}"),
    }
}

/// Hooks and Bash are real processes: the real clock.
fn real(root: &Path) -> Opts {
    Opts {
        real_time: true,
        root: Some(root.to_owned()),
        ..Opts::default()
    }
}

/// Runs the pipeline at `dir` (its `script.yaml` scripting the model) in
/// this process on the real clock, after `tune` had its say on the spec
/// and made the sinks; returns the report and every audit event published.
fn run_spec(dir: &Path, tune: impl FnOnce(&mut RunSpec) -> Vec<Sink>) -> (RunReport, Vec<Value>) {
    let pipeline = Arc::new(load_pipeline(dir).unwrap());
    let script = Script::load(&dir.join("script.yaml"), &pipeline).unwrap();
    let provider = Arc::new(ScriptedProvider::new(script));
    let fields = resolve_fields(&pipeline, &[], None).unwrap();
    let mut spec = RunSpec::new(pipeline, fields, provider, None);
    spec.settings = Arc::new(RunSettings {
        root: dir.to_owned(),
        ..RunSettings::default()
    });
    let published = spec.bus.subscribe_audit("test", 1 << 20);
    let sinks = tune(&mut spec);
    let report = actix::System::new().block_on(async move {
        let (_session, done) = start_run(spec, sinks);
        done.await.expect("the run reports")
    });
    let events = published
        .iter()
        .filter_map(|d| match d {
            Delivery::Event(env) => Some(env.event.to_json(env.seq)),
            Delivery::Lagged { .. } => None,
        })
        .collect();
    (report, events)
}

// ------------------------------------------------------ the provider fails

/// `troupe run` of `stages/fanout` (one worker) against `server`, in
/// project folder `project`.
fn run_fanout(server: &FakeOpenAi, project: &Path) -> (Output, Vec<Value>) {
    let runs = project.join(".troupe/runs");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .current_dir(project)
        .env_remove("OPENAI_API_KEY")
        .args([
            "run",
            &common::project::bundled("fanout").display().to_string(),
        ])
        .args(["--base-url", &server.base_url(), "--model", "m"])
        .args([
            "--provider-backoff",
            "1ms",
            "--ctx",
            "width=1",
            "--runs-dir",
        ])
        .arg(&runs)
        .output()
        .unwrap();
    let run = std::fs::read_dir(&runs).unwrap().next().unwrap().unwrap();
    let log = troupe::auditlog::read_text(&run.path().join(troupe::auditlog::FILE)).unwrap();
    let log = log
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (out, log)
}

/// A server that answers as the pipeline wants, but with `fault` to the
/// `turn`-th chat request (from 0, the capability probe not counted).
fn failing_at(turn: usize, fault: Reply) -> FakeOpenAi {
    let n = AtomicUsize::new(0);
    FakeOpenAi::start(move |r| {
        if n.fetch_add(1, Ordering::SeqCst) == turn {
            fault.clone()
        } else {
            pipeline_responder(r)
        }
    })
}

#[test]
fn a_provider_error_at_any_turn_is_retried_or_fails_the_run_typed() {
    let clean = FakeOpenAi::start(pipeline_responder);
    let runs = tempfile::tempdir().unwrap();
    let (out, log) = run_fanout(&clean, runs.path());
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_complete(&log);
    let turns = clean.chats().len();
    assert_eq!(turns, 4, "plan, two worker turns, reduce");
    for turn in 0..turns {
        // Transient: retried, and the run goes on as if nothing happened.
        let server = failing_at(turn, Reply::status(503, "overloaded"));
        let runs = tempfile::tempdir().unwrap();
        let (out, log) = run_fanout(&server, runs.path());
        assert_eq!(out.status.code(), Some(0), "turn {turn}: {out:?}");
        assert_complete(&log);
        let failed: Vec<&Value> = log
            .iter()
            .filter(|e| e["event"] == "ProviderRequestFailed")
            .collect();
        assert_eq!(failed.len(), 1, "turn {turn}");
        assert_eq!(failed[0]["code"], "ProviderTransient/ServerError");
        assert_eq!(failed[0]["retrying"], true);
        assert_eq!(server.chats().len(), turns + 1, "turn {turn}: one retry");

        // Terminal: not retried; the stage and the run fail with the code.
        let server = failing_at(
            turn,
            Reply::status(400, r#"{"error":{"message":"no such thing"}}"#),
        );
        let runs = tempfile::tempdir().unwrap();
        let (out, log) = run_fanout(&server, runs.path());
        assert_eq!(out.status.code(), Some(1), "turn {turn}: {out:?}");
        assert_complete(&log);
        let exit = log.last().unwrap();
        let reason = exit.to_string();
        assert!(
            reason.contains("ExtensionHost/BadRequest") && reason.contains("no such thing"),
            "turn {turn}: {exit}"
        );
        assert_eq!(server.chats().len(), turn + 1, "turn {turn}: nothing after");
    }
}

// ------------------------------------------------------ tools and hooks

#[test]
fn a_bash_call_past_its_timeout_is_a_typed_error_and_act_goes_on() {
    let f = one_stage(
        "Bash",
        "",
        "stages:\n  s:\n    - { tool: Bash, args: { command: \"sleep 30\", timeout_ms: 200 } }\n    - complete: { n: 1 }\n",
    );
    let out = run(f.path(), real(f.path()));
    assert_eq!(
        out.report.status,
        RunStatus::Ok,
        "the model reads the error"
    );
    let results = out.tool_results();
    assert!(results[0].contains("ToolTransient/Timeout"), "{results:?}");
    let failed = out.named("ToolInvocationFailed");
    assert_eq!(failed.len(), 1);
    assert_complete(&audited(&out.events));
}

/// (hook, what its `HookInvoked` error says, whether the call still ran)
const BROKEN_HOOKS: [(&str, &str, bool); 6] = [
    (
        "{ name: h, at: TOOL_CALL/pre, kind: guard, command: \"kill -KILL $$\" }",
        "exited with signal: 9",
        false,
    ),
    (
        "{ name: h, at: TOOL_CALL/pre, kind: guard, command: \"exec sleep 30\", timeout: 300ms }",
        "did not answer within",
        false,
    ),
    (
        "{ name: h, at: TOOL_CALL/pre, kind: transform, command: \"kill -SEGV $$\" }",
        "exited with signal: 11",
        false,
    ),
    (
        "{ name: h, at: TOOL_CALL/pre, kind: transform, command: \"echo '{not json'\" }",
        "printed something that is not",
        false,
    ),
    (
        "{ name: h, at: TOOL_CALL/pre, kind: transform, command: \"exec sleep 30\", timeout: 300ms }",
        "did not answer within",
        false,
    ),
    (
        "{ name: h, at: TOOL_CALL/pre, kind: observer, command: \"exec sleep 30\", timeout: 300ms }",
        "did not answer within",
        true,
    ),
];

#[test]
fn a_hook_that_crashes_hangs_or_prints_garbage_is_a_typed_failure_and_the_run_ends() {
    for (hook, error, ran) in BROKEN_HOOKS {
        let f = one_stage(
            "Echo",
            &format!("  - {hook}\n"),
            "stages:\n  s:\n    - { tool: Echo, args: { text: hi } }\n    - complete: { n: 1 }\n",
        );
        let out = run(f.path(), real(f.path()));
        assert_eq!(out.report.status, RunStatus::Ok, "{hook}: Act goes on");
        let hooks = out.named("HookInvoked");
        assert_eq!(hooks.len(), 1, "{hook}");
        assert_eq!(hooks[0]["outcome"], "failed", "{hook}");
        assert_eq!(hooks[0]["code"], "ExtensionHost/HookFailed", "{hook}");
        let said = hooks[0]["error"].as_str().unwrap();
        assert!(said.contains(error), "{hook}: {said}");
        assert_eq!(
            out.count("ToolInvocationSucceeded"),
            usize::from(ran),
            "{hook}"
        );
        if !ran {
            let result = &out.tool_results()[0];
            assert!(result.contains("HookFailed"), "{hook}: {result}");
        }
        assert_complete(&audited(&out.events));
    }
}

/// A hook in Rust (the library seam for hooks) that panics while a tool
/// call is on its way: the nearest a tool call can come to panicking, as
/// no built-in tool can be made to.
#[derive(Debug)]
struct Panicking;

impl Hook for Panicking {
    fn name(&self) -> &str {
        "panicking"
    }
    fn kind(&self) -> troupe::definition::hooks::HookKind {
        troupe::definition::hooks::HookKind::Guard
    }
    fn call(
        &self,
        _slot: &str,
        _payload: Arc<Value>,
    ) -> BoxFuture<'static, Result<HookReply, HookError>> {
        async { panic!("the hook exploded") }.boxed()
    }
}

#[test]
fn a_panic_during_a_tool_call_is_the_stages_typed_failure_and_the_run_ends() {
    let f = one_stage(
        "Echo",
        "",
        "stages:\n  s:\n    - { tool: Echo, args: { text: hi } }\n    - complete: { n: 1 }\n",
    );
    let (report, events) = run_spec(f.path(), |spec| {
        let mut hooks = (*spec.hooks).clone();
        hooks.add("TOOL_CALL/pre", Arc::new(Panicking));
        spec.hooks = Arc::new(hooks);
        Vec::new()
    });
    let reason = failure(&report);
    assert!(
        reason.contains("ExtensionHost/ActorPanicked") && reason.contains("the hook exploded"),
        "{reason}"
    );
    assert_complete(&events);
    let exits: Vec<&Value> = events
        .iter()
        .filter(|e| e["event"] == "StageExited")
        .collect();
    assert_eq!(exits.len(), 1);
    assert_eq!(exits[0]["verdict"], "fail");
}

// ------------------------------------------------ an interactor goes away

/// A person's terminal whose input closes while a prompt is showing: the
/// answer is read from a channel whose other end goes away (as stdin
/// reaching its end does for the CLI's prompter).
struct ClosingInput {
    asked: AtomicUsize,
}

impl Prompter for ClosingInput {
    fn ask(&self, _view: &PromptView) -> Option<Answer> {
        self.asked.fetch_add(1, Ordering::SeqCst);
        let (person, input) = std::sync::mpsc::channel::<Answer>();
        drop(person);
        input.recv().ok()
    }
    fn withdrawn(&self, _view: &PromptView) {}
}

#[test]
fn an_interactor_whose_input_closes_mid_prompt_denies_and_the_run_ends() {
    let f = one_stage(
        "Read",
        "",
        "stages:\n  s:\n    - { tool: Echo, args: { text: one } }\n    - { tool: Echo, args: { text: two } }\n    - complete: { n: 1 }\n",
    );
    let prompter = Arc::new(ClosingInput {
        asked: AtomicUsize::new(0),
    });
    let out: Outcome = run(
        f.path(),
        Opts {
            interactors: vec![InteractorSpec::Terminal(prompter.clone())],
            ..Opts::default()
        },
    );
    assert_eq!(out.report.status, RunStatus::Ok, "Act goes on");
    assert_eq!(
        prompter.asked.load(Ordering::SeqCst),
        2,
        "each call was asked"
    );
    let answered: Vec<&str> = out
        .named("InteractionAnswered")
        .iter()
        .map(|e| e["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(answered, ["abandoned", "abandoned"]);
    assert_eq!(out.count("ToolCallDenied"), 2);
    assert_eq!(out.count("ToolInvocationStarted"), 0);
    assert!(
        out.tool_results()[0].contains("went away"),
        "{:?}",
        out.tool_results()
    );
    assert_complete(&audited(&out.events));
}

// ------------------------------------------------------ the audit log fails

const THREE_TURNS: &str = "stages:\n  s:\n    - { tool: Echo, args: { text: one } }\n    - { tool: Echo, args: { text: two } }\n    - complete: { n: 1 }\n";

/// A three-turn stage whose audit log path is `/dev/full`: every write
/// fails with "No space left on device".
fn log_on_a_full_disk() -> (Fixture, std::path::PathBuf) {
    let f = one_stage("Echo", "", THREE_TURNS);
    let path = f.path().join("run/audit.log.zst");
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink("/dev/full", &path).unwrap();
    (f, path)
}

#[test]
fn an_audit_log_on_a_full_disk_fails_the_run_and_says_what_was_lost() {
    // Formatted by the writer thread, and by formatter threads.
    for formatters in [0, 2] {
        let (f, path) = log_on_a_full_disk();
        let (report, events) = run_spec(f.path(), |spec| {
            vec![start_audit_log(&spec.bus, &path, formatters).unwrap()]
        });
        let reason = failure(&report);
        assert!(reason.starts_with("Session/AuditLost: "), "{reason}");
        assert!(reason.contains("audit.log.zst"), "names the log: {reason}");
        assert!(reason.contains("No space left on device"), "{reason}");
        assert!(
            reason.contains("every event from seq ") && reason.contains(" on is missing from it"),
            "says what was lost: {reason}"
        );
        // Everything the run did was still published, and it ended.
        assert_complete(&events);
    }
}

#[test]
fn an_audit_log_removed_mid_run_fails_the_run_and_says_what_was_lost() {
    // Formatted by the writer thread, and by formatter threads.
    for formatters in [0, 2] {
        let f = one_stage(
            "Bash",
            "",
            "stages:\n  s:\n    - { tool: Bash, args: { command: \"rm run/audit.log.zst\" } }\n    - { tool: Bash, args: { command: \"echo after\" } }\n    - complete: { n: 1 }\n",
        );
        let path = f.path().join("run/audit.log.zst");
        let (report, events) = run_spec(f.path(), |spec| {
            vec![start_audit_log(&spec.bus, &path, formatters).unwrap()]
        });
        assert!(!path.exists(), "the command removed the log");
        let reason = failure(&report);
        assert!(reason.starts_with("Session/AuditLost: "), "{reason}");
        assert!(reason.contains("removed or replaced"), "{reason}");
        assert!(reason.contains("lines written to it are gone"), "{reason}");
        assert_complete(&events);
    }
}

#[test]
fn an_audit_log_that_fails_stops_the_run_before_its_next_step() {
    // Formatted by the writer thread, and by formatter threads.
    for formatters in [0, 2] {
        // The writer fails on its first flush, long before the model's
        // second reply: the run is cancelled instead of working unrecorded.
        let (f, path) = log_on_a_full_disk();
        let (report, events) = run_spec(f.path(), |spec| {
            spec.provider = Arc::new(Silent);
            vec![start_audit_log(&spec.bus, &path, formatters).unwrap()]
        });
        assert!(failure(&report).starts_with("Session/AuditLost"));
        assert!(
            events.iter().any(|e| e["event"] == "StageCancelled"),
            "the stage was cancelled while it waited for the model"
        );
        assert_eq!(
            events
                .iter()
                .filter(|e| e["event"] == "ProviderRequestCompleted")
                .count(),
            0
        );
        assert_complete(&events);
    }
}

/// A provider whose replies never come: the run can end only by being
/// stopped.
#[derive(Debug)]
struct Silent;

impl Provider for Silent {
    fn name(&self) -> &'static str {
        "silent"
    }
    fn complete(
        &self,
        _request: ModelRequest,
    ) -> BoxFuture<'static, Result<troupe::provider::ModelResponse, troupe::provider::ProviderError>>
    {
        std::future::pending().boxed()
    }
}

/// A sink slow to finish (a span exporter waiting on a collector) holds
/// up its own run's report, not the thread it ran on: `troupe serve`
/// hosts every run's session there, and another run goes on meanwhile.
#[test]
fn a_sink_slow_to_finish_holds_up_no_other_run_on_its_thread() {
    use std::sync::atomic::AtomicBool;
    let f = one_stage("Read", "", "stages:\n  s:\n    - complete: { n: 1 }\n");
    let spec = |dir: &Path| {
        let pipeline = Arc::new(load_pipeline(dir).unwrap());
        let script = Script::load(&dir.join("script.yaml"), &pipeline).unwrap();
        let fields = resolve_fields(&pipeline, &[], None).unwrap();
        RunSpec::new(
            pipeline,
            fields,
            Arc::new(ScriptedProvider::new(script)),
            None,
        )
    };
    let released = Arc::new(AtomicBool::new(false));
    let (release, held) = std::sync::mpsc::channel::<()>();
    // The first run's sink finishes once released: by the test, or (were
    // the thread blocked in it) by a watchdog, so that a regression fails
    // rather than hangs.
    let slow = {
        let released = Arc::clone(&released);
        Sink::from_thread(std::thread::spawn(move || {
            let _ = held.recv_timeout(std::time::Duration::from_secs(20));
            released.store(true, Ordering::SeqCst);
            Ok(0)
        }))
    };
    let (first, second) = (spec(f.path()), spec(f.path()));
    let events = first.bus.subscribe_audit("test", 1 << 16);
    let (one, other_first) = actix::System::new().block_on(async move {
        let (_a, first_done) = start_run(first, vec![slow]);
        // The first run ends (its report then waits on the sink) before
        // the second starts.
        loop {
            match events.try_recv() {
                Some(Delivery::Event(e)) if e.event.name.as_str() == "WorkflowExit" => break,
                Some(_) => {}
                None => tokio::task::yield_now().await,
            }
        }
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        let (_b, second_done) = start_run(second, Vec::new());
        let other = second_done.await.expect("the second run reports");
        let other_first = !released.load(Ordering::SeqCst);
        assert_eq!(other.status, RunStatus::Ok);
        let _ = release.send(());
        (
            first_done.await.expect("the first run reports"),
            other_first,
        )
    });
    assert_eq!(one.status, RunStatus::Ok);
    assert!(
        other_first,
        "the second run waited for the first run's sink"
    );
}

/// A run store deleted during the run: SQLite goes on committing into the
/// unlinked file, which nothing would read again, so the run fails with
/// the store's code (exit 1) instead of ending ok with its record lost.
#[test]
fn a_store_deleted_during_the_run_fails_the_run() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("kept/troupe.db");
    let remove = format!("rm -f '{0}' '{0}-wal' '{0}-shm'", store.display());
    let f = one_stage(
        "Bash",
        "",
        &format!(
            "stages:\n  s:\n    - {{ tool: Bash, args: {{ command: \"{remove}\" }} }}\n    - complete: {{ n: 1 }}\n"
        ),
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(f.path())
        .args(["--json", "--headless", "--no-sandbox", "--root"])
        .arg(f.path())
        .arg("--store")
        .arg(&store)
        .arg("--runs-dir")
        .arg(dir.path().join("runs"))
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{said}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let reason = report["reason"].as_str().unwrap_or_default();
    assert!(reason.starts_with("Store/WriteFailed"), "{report}");
    assert!(
        said.contains("deleted or replaced during the run"),
        "{said}"
    );
}
