//! Human steps (`kind: human`), through the binary: a question answered by
//! an answers file, skipped or failed when no one answers (headless, or
//! past its timeout), and answered from a second process through the
//! control API, where an answer that breaks the step's fields is refused
//! and the question stays open.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// `ask` (a human step with `extra` keys) then `done` (a print step).
fn pipeline(extra: &str) -> common::Fixture {
    let yaml = format!(
        "id: human\nentry: ask\nctx:\n  task: {{ default: ship it }}\nstages:\n  ask:\n    kind: human\n    prompt: \"May we {{{{ctx.task}}}}?\"\n    fields: {{ type: object, required: [ok], properties: {{ ok: {{ type: boolean }}, note: {{ type: string }} }} }}\n{extra}  done: {{ kind: print, content: \"answered\" }}\nnext:\n  ask: done\n  done: end\n"
    );
    common::Fixture::new(&yaml, &[])
}

fn run(pipeline: &common::Fixture, runs: &std::path::Path, flags: &[&str]) -> (Output, Value) {
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(pipeline.path())
        .arg("--runs-dir")
        .arg(runs)
        .args(["--headless", "--no-store", "--json"])
        .args(flags)
        .output()
        .unwrap();
    let summary = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out, summary)
}

fn result<'a>(summary: &'a Value, stage: &str) -> &'a Value {
    summary["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stageId"] == stage)
        .unwrap()
}

#[test]
fn an_answers_rule_answers_and_no_one_means_skip_or_fail() {
    let dir = tempfile::tempdir().unwrap();
    let answers = dir.path().join("answers.yaml");
    std::fs::write(
        &answers,
        "answers:\n  - { human: ask, answer: approve, content: { ok: true, note: fine } }\n",
    )
    .unwrap();
    let p = pipeline("");
    let (out, summary) = run(&p, dir.path(), &["--answers", answers.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        result(&summary, "ask")["parsed"],
        serde_json::json!({"ok": true, "note": "fine"})
    );
    // Headless, no rule: the step fails (default) ...
    let (out, summary) = run(&p, dir.path(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let reason = summary["results"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.starts_with("Session/HumanUnanswered"), "{summary}");
    // ... or is skipped with `otherwise: skip`.
    let p = pipeline("    otherwise: skip\n");
    let (out, summary) = run(&p, dir.path(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(result(&summary, "ask")["verdict"], "skipped");
    // A rule whose content breaks the fields answers nothing.
    std::fs::write(
        &answers,
        "answers:\n  - { human: ask, answer: approve, content: { ok: maybe } }\n",
    )
    .unwrap();
    let (out, summary) = run(&p, dir.path(), &["--answers", answers.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(result(&summary, "ask")["verdict"], "skipped");
    // ... and says so.
    assert!(
        said(&out).contains("answers rule") && said(&out).contains("does not fit"),
        "{}",
        said(&out)
    );
    // A rule's `delay` holds its answer, as it holds an approval: past
    // the step's timeout, the step times out instead.
    std::fs::write(
        &answers,
        "answers:
  - { human: ask, answer: approve, delay: 5s, content: { ok: true } }
",
    )
    .unwrap();
    let p = pipeline(
        "    timeout: 300ms
",
    );
    let (out, summary) = run(&p, dir.path(), &["--answers", answers.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        summary.to_string().contains("no answer within 300ms"),
        "{summary}"
    );
}

#[test]
fn a_question_times_out_into_its_otherwise() {
    let dir = tempfile::tempdir().unwrap();
    let p = pipeline("    timeout: 300ms\n");
    // --remote: someone could answer, no one does.
    let (out, summary) = run(&p, dir.path(), &["--remote"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let reason = summary["results"][0]["reason"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    assert!(reason.contains("no answer within 300ms"), "{summary}");
}

#[test]
fn a_second_process_answers_and_a_wrong_answer_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    let p = pipeline("");
    let child = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(p.path())
        .arg("--runs-dir")
        .arg(&runs)
        .args(["--headless", "--no-store", "--json", "--remote"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let troupe = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(args)
            .args(["--runs-dir", runs.to_str().unwrap()])
            .output()
            .unwrap()
    };
    // Wait (bounded) until the run is up and its question is open.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (id, execution) = loop {
        assert!(Instant::now() < deadline, "the question never opened");
        if let Some(Ok(entry)) = std::fs::read_dir(&runs).ok().and_then(|mut d| d.next()) {
            let id = entry.file_name().to_string_lossy().into_owned();
            let out = troupe(&["pending", &id]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if let Some(line) = text.lines().find(|l| l.starts_with("question ")) {
                let execution = line.split_whitespace().nth(1).unwrap().to_owned();
                assert!(text.contains("May we ship it?"), "{text}");
                break (id, execution);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = troupe(&["answer", &id, &execution, "--field", "ok=perhaps"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("Control/AnswerInvalid"),
        "{}",
        said(&out)
    );
    let out = troupe(&[
        "answer",
        &id,
        &execution,
        "--field",
        "ok=true",
        "--field",
        "note=go",
        "--client",
        "Bob Ødegård",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        result(&summary, "ask")["parsed"],
        serde_json::json!({"ok": true, "note": "go"})
    );
    let audit = troupe::auditlog::read_text(&runs.join(&id).join(troupe::auditlog::FILE)).unwrap();
    let answered: Vec<Value> = audit
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["event"] == "InteractionAnswered")
        .collect();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0]["kind"], "question");
    assert_eq!(
        answered[0]["by"], "api: Bob Ødegård",
        "decoded as it was sent"
    );
}
