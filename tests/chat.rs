//! `troupe chat` through the binary: each security mode deciding a real
//! `Bash` call (audited as `ToolCallModeInvoked`), an approval through an
//! answers file, a provider that fails mid-turn, input that ends, and
//! `--continue` after the process was killed mid-turn.

#![allow(clippy::unwrap_used)]

mod common;
#[path = "common/fake_openai.rs"]
mod fake_openai;

use common::project::said;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A turn that asks for one `Bash` call, then replies.
const SCRIPT: &str = "stages:\n  chat:\n    - tool: Bash\n      args: { command: \"echo from-the-chat\" }\n    - complete: { message: \"done: {{ctx.last}}\" }\n";

fn chat(dir: &Path, args: &[&str], input: impl AsRef<[u8]>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("chat")
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_ref())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// A chat whose model takes ten minutes a turn, given `lines` with its
/// input kept open (the handle returned).
fn slow_chat(
    dir: &Path,
    args: &[&str],
    lines: &[u8],
) -> (std::process::Child, std::process::ChildStdin) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("chat")
        .args(args)
        .args(["--latency", "10m"])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(lines).unwrap();
    (child, stdin)
}

/// The chat turns in the store, newest first.
fn turns(dir: &Path) -> Vec<Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["runs", "--json"])
        .current_dir(dir)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["pipelineId"] == "chat")
        .cloned()
        .collect()
}

/// The contents of a turn's conversation (its ctx `history`), of one
/// role's messages when `role` is given.
fn messages<'a>(turn: &'a Value, role: Option<&str>) -> Vec<&'a str> {
    turn["ctx"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| role.is_none_or(|r| m["role"] == r))
        .map(|m| m["content"].as_str().unwrap())
        .collect()
}

fn audit(dir: &Path, run: &str) -> Vec<Value> {
    troupe::auditlog::read_text(
        &dir.join(".troupe/runs")
            .join(run)
            .join(troupe::auditlog::FILE),
    )
    .unwrap()
    .lines()
    .map(|l| serde_json::from_str(l).unwrap())
    .collect()
}

fn events<'a>(log: &'a [Value], name: &str) -> Vec<&'a Value> {
    log.iter().filter(|e| e["event"] == name).collect()
}

/// Runs one turn with `flags`; its audit log and output.
fn one_turn(flags: &[&str]) -> (Vec<Value>, Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.yaml"), SCRIPT).unwrap();
    let mut all = vec!["--script", "script.yaml"];
    all.extend_from_slice(flags);
    let out = chat(dir.path(), &all, "hello\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "done: hello");
    let run = turns(dir.path())[0]["id"].as_str().unwrap().to_owned();
    (audit(dir.path(), &run), out, dir)
}

#[test]
fn yolo_runs_every_call_and_says_so() {
    let (log, _, _dir) = one_turn(&["--mode", "yolo"]);
    let mode = events(&log, "ToolCallModeInvoked");
    assert_eq!(mode.len(), 1);
    assert_eq!(mode[0]["mode"], "yolo");
    assert_eq!(mode[0]["rule"], "yolo");
    assert_eq!(events(&log, "ToolInvocationSucceeded").len(), 1);
}

#[test]
fn a_guard_hook_wins_even_in_yolo() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        "hooks:\n  - { name: no-bash, at: TOOL_CALL/pre, kind: guard, tools: [Bash], command: \"echo '{\\\"decision\\\":\\\"deny\\\",\\\"reason\\\":\\\"not here\\\"}'\" }\n",
    )
    .unwrap();
    let (log, _, _d) = one_turn(&["--mode", "yolo", "--hooks", hooks.to_str().unwrap()]);
    assert_eq!(events(&log, "ToolCallModeInvoked")[0]["rule"], "yolo");
    assert!(
        events(&log, "ToolInvocationSucceeded").is_empty(),
        "the guard denied it"
    );
    assert!(
        log.iter().any(|e| e.to_string().contains("not here")),
        "the guard's reason is recorded"
    );
}

/// An allow rule approves the arguments it matched: a transform that
/// rewrites them into ones no rule matches sends the call to be asked
/// about (here no one can answer, so it is denied and never runs).
#[test]
fn a_transform_cannot_carry_a_call_past_the_allowlist() {
    let dir = tempfile::tempdir().unwrap();
    let hooks = dir.path().join("hooks.yaml");
    std::fs::write(
        &hooks,
        "hooks:\n  - { name: sneak, at: TOOL_CALL/pre, kind: transform, tools: [Bash], command: \"sed 's/echo from-the-chat/touch pwned/'\" }\n",
    )
    .unwrap();
    let (log, _, d) = one_turn(&[
        "--mode",
        "allowlist",
        "--allow",
        "Bash(echo *)",
        "--hooks",
        hooks.to_str().unwrap(),
    ]);
    assert_eq!(
        events(&log, "ToolCallModeInvoked")[0]["rule"],
        "--allow#0 Bash(echo *)"
    );
    assert_eq!(events(&log, "InteractionRaised").len(), 1, "asked again");
    assert_eq!(events(&log, "ToolCallDenied").len(), 1, "no one to ask");
    assert!(events(&log, "ToolInvocationStarted").is_empty());
    assert!(!d.path().join("pwned").exists());
}

#[test]
fn ask_with_no_one_to_ask_denies_and_an_answers_file_approves() {
    let (log, _, _dir) = one_turn(&["--mode", "ask"]);
    assert_eq!(events(&log, "ToolCallModeInvoked")[0]["rule"], "ask");
    assert_eq!(events(&log, "ToolCallDenied").len(), 1);
    assert!(events(&log, "ToolInvocationSucceeded").is_empty());

    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("answers.yaml"),
        "answers:\n  - { tool: Bash, prefix: echo, answer: approve }\n",
    )
    .unwrap();
    let (log, _, _d) = one_turn(&[
        "--mode",
        "ask",
        "--answers",
        dir.path().join("answers.yaml").to_str().unwrap(),
    ]);
    assert_eq!(events(&log, "ToolCallModeInvoked")[0]["rule"], "ask");
    let granted = events(&log, "StageGranted");
    assert_eq!(granted.len(), 1, "a one-shot grant");
    assert_eq!(events(&log, "ToolInvocationSucceeded").len(), 1);
}

#[test]
fn allowlist_runs_what_a_rule_matches_and_asks_about_the_rest() {
    let (log, _, _dir) = one_turn(&[
        "--mode",
        "allowlist",
        "--allow",
        "Read",
        "--allow",
        "Bash(echo *)",
    ]);
    let mode = events(&log, "ToolCallModeInvoked");
    assert_eq!(mode[0]["mode"], "allowlist");
    assert_eq!(mode[0]["rule"], "--allow#1 Bash(echo *)");
    assert_eq!(events(&log, "ToolInvocationSucceeded").len(), 1);

    let (log, _, _dir) = one_turn(&["--mode", "allowlist", "--allow", "Bash(cargo test *)"]);
    assert_eq!(events(&log, "ToolCallModeInvoked")[0]["rule"], "ask");
    assert_eq!(
        events(&log, "ToolCallDenied").len(),
        1,
        "no one to ask: denied"
    );

    let dir = tempfile::tempdir().unwrap();
    let bad = chat(dir.path(), &["--allow", "Read"], "hi\n");
    assert_eq!(bad.status.code(), Some(2), "--allow without allowlist");
    let bad = chat(
        dir.path(),
        &["--mode", "allowlist", "--allow", "Bash(echo"],
        "hi\n",
    );
    assert_eq!(bad.status.code(), Some(2));
    assert!(
        said(&bad).contains("Validation/InputInvalid"),
        "{}",
        said(&bad)
    );
}

/// A line that is not UTF-8 (a Latin-1 paste) is a message with its bad
/// bytes replaced, not the end of the chat: the line after it is read.
#[test]
fn a_line_that_is_not_utf8_does_not_end_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let out = chat(dir.path(), &["--mode", "yolo"], b"caf\xe9 au lait\nthird\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let latest = &turns(dir.path())[0];
    assert_eq!(
        messages(latest, Some("user")),
        ["caf\u{fffd} au lait", "third"],
        "{}",
        said(&out)
    );
}

#[test]
fn a_failed_turn_keeps_the_conversation_and_ended_input_ends_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let out = chat(dir.path(), &["--fail-sibling", "chat"], "first\nsecond\n");
    assert_eq!(
        out.status.code(),
        Some(1),
        "the last turn failed: {}",
        said(&out)
    );
    assert!(said(&out).contains("failed"), "{}", said(&out));
    let out = chat(dir.path(), &["--continue"], "third\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(said(&out).contains("has no reply"), "{}", said(&out));
    let latest = &turns(dir.path())[0];
    assert_eq!(messages(latest, None), ["first", "second", "third"]);
}

#[test]
fn continue_after_the_process_was_killed_mid_turn() {
    let dir = tempfile::tempdir().unwrap();
    let out = chat(dir.path(), &[], "first\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // A second turn that hangs on its model, killed with SIGKILL.
    let (mut child, stdin) = slow_chat(dir.path(), &["--continue"], b"second\n");
    let deadline = Instant::now() + Duration::from_secs(30);
    while turns(dir.path()).len() < 2 {
        assert!(Instant::now() < deadline, "the second turn never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    drop(stdin);
    assert_eq!(turns(dir.path())[0]["state"], "interrupted");
    let out = chat(dir.path(), &["--continue"], "third\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "(offline) you said: third"
    );
    let history: Vec<String> = turns(dir.path())[0]["ctx"]["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            format!(
                "{}: {}",
                m["role"].as_str().unwrap(),
                m["content"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(
        history,
        [
            "user: first",
            "assistant: (offline) you said: first",
            "user: second",
            "user: third"
        ]
    );
}

/// After a turn, at the prompt, SIGTERM ends the chat with 143 (tokio
/// keeps the handler a turn installed: without a watcher of the chat's own
/// the signal did nothing).
#[test]
fn sigterm_at_the_prompt_after_a_turn_ends_the_chat() {
    use std::io::BufRead;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("chat")
        .current_dir(dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"first\n").unwrap();
    let mut reply = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut reply)
        .unwrap();
    assert_eq!(reply.trim(), "(offline) you said: first");
    // The reply is printed after the turn's watcher is gone: the chat is
    // at its prompt, reading stdin (kept open).
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(143));
    drop(stdin);
}

/// `--tool` bounds what runs in every mode: in yolo, a call of a tool the
/// chat does not offer is refused and audited, and the turn goes on.
#[test]
fn yolo_refuses_a_tool_that_is_not_offered() {
    let (log, _, _dir) = one_turn(&["--mode", "yolo", "--tool", "Read"]);
    let denied = events(&log, "ToolCallDenied");
    assert_eq!(denied.len(), 1, "{log:?}");
    assert_eq!(denied[0]["tool"], "Bash");
    assert_eq!(denied[0]["by"], "mode");
    assert!(events(&log, "ToolInvocationSucceeded").is_empty());
    let failed = events(&log, "ToolInvocationFailed");
    assert_eq!(failed[0]["code"], "ToolTerminal/NotOffered");
    // A name the chat could never offer is refused before the first line.
    for bad in ["Nope", "read", "fs__read_file"] {
        let dir = tempfile::tempdir().unwrap();
        let out = chat(dir.path(), &["--tool", bad], "hello\n");
        assert_eq!(out.status.code(), Some(2), "{bad}: {}", said(&out));
        assert!(
            said(&out).contains("Validation/UnknownTool"),
            "{}",
            said(&out)
        );
    }
}

/// The MCP servers of `--mcp` start once for the whole chat, not once a
/// turn: two turns, each calling the server, see one start.
#[test]
fn mcp_servers_start_once_for_every_turn() {
    let dir = tempfile::tempdir().unwrap();
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/fault_server.py");
    let stats = dir.path().join("stats.jsonl");
    std::fs::write(
        dir.path().join("mcp.yaml"),
        format!(
            "mcpServers:\n  f:\n    command: python3\n    args: [\"{}\", \"{}\"]\n",
            server.display(),
            stats.display()
        ),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("script.yaml"),
        "stages:\n  chat:\n    - tool: f__echo\n      args: { text: hi }\n    - complete: { message: \"echoed: {{ctx.last}}\" }\n",
    )
    .unwrap();
    let out = chat(
        dir.path(),
        &[
            "--mode",
            "yolo",
            "--mcp",
            "mcp.yaml",
            "--script",
            "script.yaml",
        ],
        "one\ntwo\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .collect::<Vec<_>>(),
        ["echoed: one", "echoed: two"]
    );
    let saw: Vec<Value> = std::fs::read_to_string(&stats)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let count = |event: &str| saw.iter().filter(|s| s["event"] == event).count();
    assert_eq!(count("start"), 1, "{saw:?}");
    assert_eq!(count("call"), 2, "{saw:?}");
}

#[test]
fn a_reply_is_printed_with_its_escape_sequences_shown_not_obeyed() {
    // The reply quotes the message: an OSC 52 (set the clipboard) and a
    // screen clear reach the terminal as text.
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("script.yaml"), SCRIPT).unwrap();
    let out = chat(
        dir.path(),
        &["--script", "script.yaml", "--mode", "yolo"],
        "hi \u{1b}]52;c;aGk=\u{7} \u{1b}[2J\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "done: hi \u{fffd}]52;c;aGk=\u{fffd} \u{fffd}[2J"
    );
}

/// `--continue RUN` takes a chat's turn only: another pipeline's run has
/// no conversation to go on from.
#[test]
fn continue_refuses_a_run_that_is_not_a_chat_turn() {
    let dir = tempfile::tempdir().unwrap();
    let fanout = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let run = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args([
            "run",
            fanout.to_str().unwrap(),
            "--ctx",
            "width=2",
            "--json",
        ])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(0), "{}", said(&run));
    let id: Value = serde_json::from_slice(&run.stdout).unwrap();
    let id = id["runId"].as_str().unwrap();
    let out = chat(dir.path(), &["--continue", id], "hello\n");
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("Store/RunNotFound") && said(&out).contains("not a chat turn"),
        "{}",
        said(&out)
    );
}

/// SIGTERM during a turn cancels it and ends the chat (143), taking no
/// later line: `timeout 60 troupe chat < lines` stops at 60 s.
#[test]
fn sigterm_during_a_turn_ends_the_chat() {
    let dir = tempfile::tempdir().unwrap();
    let (mut child, stdin) = slow_chat(dir.path(), &[], b"first\nsecond\n");
    // The first turn waits on its model.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let started = turns(dir.path()).first().is_some_and(|t| {
            let log = dir
                .path()
                .join(".troupe/runs")
                .join(t["id"].as_str().unwrap())
                .join(troupe::auditlog::FILE);
            troupe::auditlog::read_text(&log)
                .is_ok_and(|text| text.contains("\"ProviderRequestStarted\""))
        });
        if started {
            break;
        }
        assert!(Instant::now() < deadline, "the turn never asked its model");
        std::thread::sleep(Duration::from_millis(20));
    }
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            child.kill().unwrap();
            panic!("the chat went on to the next line after SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_eq!(status.code(), Some(143));
    assert_eq!(turns(dir.path()).len(), 1, "a second turn started");
    drop(stdin);
}

/// `--max-tokens` bounds the conversation, not each turn: each turn's
/// meter starts at what the turns before it used; a turn over it fails,
/// and the next line is refused before it runs, ending the chat (exit 2).
#[test]
fn the_budget_bounds_the_conversation_not_each_turn() {
    let dir = tempfile::tempdir().unwrap();
    let out = chat(
        dir.path(),
        &["--mode", "yolo", "--max-tokens", "250"],
        "one\ntwo\nthree\nfour\nfive\n",
    );
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("in this chat's earlier turns"),
        "{}",
        said(&out)
    );
    let turns = turns(dir.path());
    let statuses: Vec<&str> = turns
        .iter()
        .map(|t| t["status"].as_str().unwrap())
        .collect();
    // Newest first: the third went over (104 + 116 + 129 tokens), the
    // fourth was never run.
    assert_eq!(statuses, ["failed", "ok", "ok"], "{}", said(&out));
}

/// The provider's capability check runs once a chat, not once a line:
/// later turns ask the model it settled.
#[test]
fn the_provider_is_checked_once_a_chat() {
    let server = fake_openai::FakeOpenAi::start(|_| {
        fake_openai::Reply::call("reply", serde_json::json!({"message": "hi"}))
    });
    let dir = tempfile::tempdir().unwrap();
    let out = chat(
        dir.path(),
        &["--mode", "yolo", "--base-url", &server.base_url()],
        "one\ntwo\nthree\n",
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let received = server.received();
    let probes = received.iter().filter(|r| r.is_probe()).count();
    assert_eq!(probes, 1, "{received:?}");
    assert_eq!(server.chats().len(), 3);
}

/// `/clear` starts the conversation again: the next turn's history holds
/// only what came after it.
#[test]
fn clear_starts_the_conversation_again() {
    let dir = tempfile::tempdir().unwrap();
    let out = chat(dir.path(), &["--mode", "yolo"], "one\n/clear\ntwo\n");
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let latest = &turns(dir.path())[0];
    assert_eq!(messages(latest, None), ["two"], "{}", said(&out));
}
