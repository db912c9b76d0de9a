//! The terminal's prompts through the binary on a real pseudo-terminal
//! (driven by Python's `pty`): which typed line answers which question.
//! A line answers only a prompt or form shown before it was typed: not
//! one typed ahead of every prompt, not one typed for an approval that
//! was withdrawn meanwhile.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::Project;
use serde_json::Value;

/// Runs `args` on a pseudo-terminal: each step waits for its text to
/// appear (after the previous step's), then types its line ("" waits for
/// nothing). Prints everything the terminal showed, exits as the command
/// did.
const DRIVER: &str = r#"
import json, os, pty, select, sys, time
steps = json.loads(sys.argv[1])
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[2], sys.argv[2:])
shown = b""
at = 0
def more():
    global shown
    r, _, _ = select.select([fd], [], [], 1)
    if not r:
        return True
    try:
        got = os.read(fd, 65536)
    except OSError:
        got = b""
    shown += got
    return bool(got)
for wait, line in steps:
    deadline = time.time() + 120
    while shown.find(wait.encode(), at) < 0:
        if not more() or time.time() > deadline:
            sys.stdout.write(shown.decode(errors="replace"))
            sys.stdout.write("\n[driver] never saw %r\n" % wait)
            os.kill(pid, 9)
            sys.exit(97)
    at = shown.find(wait.encode(), at) + len(wait)
    os.write(fd, line.encode())
while more():
    pass
_, status = os.waitpid(pid, 0)
sys.stdout.write(shown.decode(errors="replace"))
sys.exit(os.waitstatus_to_exitcode(status))
"#;

/// A stage that calls `Write` (not allowed: asked at the terminal), then
/// runs `command`; then a human step asking yes or no.
fn project(command: &str) -> Project {
    let p = Project::new();
    let dir = p.path().join("p");
    std::fs::create_dir_all(dir.join("root")).unwrap();
    std::fs::write(
        dir.join("pipeline.yaml"),
        "id: p\nentry: work\nstages:\n  work: work.md\n  confirm:\n    kind: human\n    prompt: \"Ship to production?\"\n    fields: { type: object, required: [ok], properties: { ok: { type: boolean } } }\nnext:\n  work: confirm\n  confirm: end\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("work.md"),
        "---\nid: work\nname: Work\nallowedTools: [Bash]\ncompletionTool: submit\ncompletionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: { type: string }\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 6\nresolutionPolicy: fail\n---\nDo the work.\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("script.yaml"),
        format!(
            "stages:\n  work:\n    - tool: Write\n      args: {{ path: \"out.txt\", content: \"hello\" }}\n    - tool: Bash\n      args: {{ command: \"{command}\" }}\n    - complete: {{ summary: \"done\" }}\n"
        ),
    )
    .unwrap();
    p
}

/// Runs the pipeline on a terminal through `steps`; what the terminal
/// showed, and the human step's answer as stored.
fn on_terminal(p: &Project, extra: &[&str], steps: Value) -> (String, Value) {
    let out = std::process::Command::new("python3")
        .arg("-c")
        .arg(DRIVER)
        .arg(steps.to_string())
        .arg(env!("CARGO_BIN_EXE_troupe"))
        .args(["run", "p", "--root", "p/root"])
        .args(extra)
        .current_dir(p.path())
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{shown}");
    let runs = p.troupe().args(["runs", "--json"]).output().unwrap();
    let runs: Value = serde_json::from_slice(&runs.stdout).unwrap();
    let id = runs["runs"][0]["id"].as_str().unwrap().to_owned();
    let shown_run = p
        .troupe()
        .args(["runs", "show", &id, "--stage", "confirm", "--json"])
        .output()
        .unwrap();
    let run: Value = serde_json::from_slice(&shown_run.stdout).unwrap();
    (shown, run)
}

/// A `y` typed before troupe asked anything (typed ahead, or pasted) does
/// not approve the first call it asks about: it was not typed for it.
#[test]
fn a_line_typed_ahead_answers_no_prompt() {
    let p = project("true");
    let (shown, run) = on_terminal(
        &p,
        &[],
        serde_json::json!([
            ["", "y\n"],
            ["allow this one call?", "n\n"],
            ["ok (boolean", "y\n"],
        ]),
    );
    assert!(
        !p.path().join("p/root/out.txt").exists(),
        "the typed-ahead y approved the Write: {shown}"
    );
    let text = run.to_string();
    assert!(text.contains("\"ok\":true"), "{text}");
}

/// A `y` typed for an approval that was withdrawn as it was typed (its
/// timeout decided it) does not answer the next question, which the person
/// has not seen yet: that waits for a line of its own.
#[test]
fn a_line_meant_for_a_withdrawn_approval_answers_no_form() {
    let p = project("sleep 2");
    let (shown, run) = on_terminal(
        &p,
        &["--approval-timeout", "1s"],
        serde_json::json!([["no longer needed", "y\n"], ["ok (boolean", "n\n"],]),
    );
    assert!(!p.path().join("p/root/out.txt").exists(), "{shown}");
    let text = run.to_string();
    assert!(
        text.contains("\"ok\":false"),
        "the withdrawn approval's y answered the form: {text}\n{shown}"
    );
}
