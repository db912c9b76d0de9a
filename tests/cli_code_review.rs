//! Issue 4's end-to-end check, through the `troupe` binary: the bundled
//! `code-review` pipeline against a scratch git repository, with real
//! `Grep`, `Read`, `Edit` and `Bash` calls from a script, an out-of-envelope
//! `Bash` approved once through `--answers` and asked again with other
//! arguments, the same run headless, and a guard hook that blocks `rm`.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

const SCRIPT: &str = r#"stages:
  plan:
    - { tool: Grep, args: { pattern: load_config } }
    - complete: { summary: "Rename load_config to load_settings.", steps: ["rename the function"] }
  execute:
    - { tool: Read, args: { path: src/config.rs } }
    - { tool: Edit, args: { path: src/config.rs, old_string: "fn load_config", new_string: "fn load_settings" } }
    - { tool: Bash, args: { command: "git status --short" } }
    - { tool: Bash, args: { command: "git diff --stat" } }
    - complete: { summary: "Renamed the function.", files: ["src/config.rs"] }
  test:
    - { tool: Bash, args: { command: "rm -rf src" } }
    - complete: { passed: true, notes: "nothing to run" }
  lint:
    - complete: { clean: true, findings: [] }
  review:
    - complete: { verdict: approve, summary: "Renamed as asked." }
"#;

const NO_RM: &str = "#!/bin/sh\nif grep -q '\"rm '; then echo '{\"decision\":\"deny\",\"reason\":\"no rm in reviews\"}'; fi\n";

/// A copy of `stages/code-review` with a guard hook, a scratch repo, the
/// script and an answers file.
struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let pipeline = dir.path().join("code-review");
        std::fs::create_dir(&pipeline).unwrap();
        let bundled = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/code-review");
        for entry in std::fs::read_dir(&bundled).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), pipeline.join(entry.file_name())).unwrap();
        }
        let yaml = std::fs::read_to_string(pipeline.join("pipeline.yaml")).unwrap();
        std::fs::write(
            pipeline.join("pipeline.yaml"),
            format!(
                "{yaml}hooks:\n  - {{ name: no-rm, at: TOOL_CALL/pre, kind: guard, command: sh no-rm.sh, tools: [Bash] }}\n"
            ),
        )
        .unwrap();
        std::fs::write(pipeline.join("no-rm.sh"), NO_RM).unwrap();
        std::fs::write(dir.path().join("script.yaml"), SCRIPT).unwrap();
        std::fs::write(
            dir.path().join("answers.yaml"),
            "answers:\n  - { tool: Bash, args: \"git status\", answer: approve }\n",
        )
        .unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join("src")).unwrap();
        std::fs::write(repo.join("src/config.rs"), "pub fn load_config() {}\n").unwrap();
        std::fs::write(
            repo.join("src/main.rs"),
            "fn main() {\n    config::load_config();\n}\n",
        )
        .unwrap();
        let git = |args: &[&str]| {
            let ok = Command::new("git")
                .args(args)
                .current_dir(&repo)
                .env("GIT_AUTHOR_NAME", "t")
                .env("GIT_AUTHOR_EMAIL", "t@example.invalid")
                .env("GIT_COMMITTER_NAME", "t")
                .env("GIT_COMMITTER_EMAIL", "t@example.invalid")
                .output()
                .unwrap()
                .status
                .success();
            assert!(ok, "git {args:?}");
        };
        git(&["init", "-q"]);
        git(&["add", "."]);
        git(&["commit", "-qm", "start"]);
        Setup { dir }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// Runs the pipeline; returns the exit code and the audit log.
    fn run(&self, extra: &[&str]) -> (Option<i32>, Vec<Value>) {
        let runs = self.path("runs");
        let out = Command::cargo_bin("troupe")
            .unwrap()
            .arg("run")
            .arg(self.path("code-review"))
            .args(["--task", "rename load_config", "--json", "--headless"])
            .arg("--script")
            .arg(self.path("script.yaml"))
            .arg("--root")
            .arg(self.path("repo"))
            .arg("--runs-dir")
            .arg(runs.join("runs"))
            .args(extra)
            .output()
            .unwrap();
        let report: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        let audit = troupe::auditlog::read_text(std::path::Path::new(
            report["auditPath"].as_str().unwrap(),
        ))
        .unwrap();
        let lines = audit
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (out.status.code(), lines)
    }
}

fn named<'a>(lines: &'a [Value], event: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["event"] == event).collect()
}

fn bash_commands(lines: &[Value], event: &str) -> Vec<String> {
    // Map callId -> command from the proposals, then list `event`'s commands.
    let proposals: Vec<(String, String)> = named(lines, "ToolInvocationProposed")
        .into_iter()
        .filter(|e| e["tool"] == "Bash")
        .map(|e| {
            let args: Value = serde_json::from_str(e["arguments"].as_str().unwrap()).unwrap();
            (
                format!("{}|{}", e["stageExecutionId"], e["callId"]),
                args["command"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    named(lines, event)
        .into_iter()
        .filter(|e| e["tool"] == "Bash")
        .filter_map(|e| {
            let key = format!("{}|{}", e["stageExecutionId"], e["callId"]);
            proposals
                .iter()
                .find(|(k, _)| *k == key)
                .map(|(_, c)| c.clone())
        })
        .collect()
}

#[test]
fn code_review_edits_a_real_repo_with_approvals_and_a_guard_hook() {
    let s = Setup::new();
    let answers = s.path("answers.yaml");
    let (code, lines) = s.run(&["--answers", answers.to_str().unwrap()]);
    assert_eq!(code, Some(0));
    // Real tools ran against the repo.
    assert_eq!(
        std::fs::read_to_string(s.path("repo/src/config.rs")).unwrap(),
        "pub fn load_settings() {}\n"
    );
    let succeeded: Vec<&str> = named(&lines, "ToolInvocationSucceeded")
        .iter()
        .map(|e| e["tool"].as_str().unwrap())
        .collect();
    assert_eq!(succeeded, ["Grep", "Read", "Edit", "Bash"]);
    // Out of envelope: `git status` approved once by the answers file,
    // `git diff` (other arguments) asked again and denied.
    let raised = named(&lines, "InteractionRaised");
    assert_eq!(raised.len(), 2);
    assert!(raised.iter().all(|e| e["stageId"] == "execute"));
    assert_eq!(named(&lines, "StageGranted").len(), 1);
    assert_eq!(
        bash_commands(&lines, "ToolInvocationSucceeded"),
        ["git status --short"]
    );
    let denied = bash_commands(&lines, "ToolCallDenied");
    assert_eq!(denied, ["git diff --stat", "rm -rf src"]);
    // The guard hook blocked rm in `test`, where Bash is allowed.
    let hook_deny = named(&lines, "ToolCallDenied")
        .into_iter()
        .find(|e| e["stageId"] == "test")
        .unwrap();
    assert_eq!(hook_deny["by"], "hook:no-rm");
    assert!(s.path("repo/src").is_dir(), "rm never ran");
}

#[test]
fn headless_the_out_of_envelope_call_is_denied_with_no_one_asked() {
    let s = Setup::new();
    let (code, lines) = s.run(&[]);
    assert_eq!(code, Some(0), "Act goes on after a denial");
    let answered = named(&lines, "InteractionAnswered");
    assert_eq!(answered.len(), 2);
    assert!(answered.iter().all(|e| e["outcome"] == "noInteractor"));
    assert_eq!(named(&lines, "StageGranted").len(), 0);
    assert_eq!(
        bash_commands(&lines, "ToolCallDenied"),
        ["git status --short", "git diff --stat", "rm -rf src"]
    );
}
