//! The `troupe validate` and `troupe show` commands, driven as a user would.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use assert_cmd::Command;
use common::stages;

fn troupe() -> Command {
    Command::cargo_bin("troupe").expect("binary")
}

#[test]
fn validate_accepts_every_bundled_pipeline() {
    for (name, n) in [
        ("code-review", 6),
        ("ralph", 6),
        ("fanout", 3),
        ("triage", 7),
    ] {
        let out = troupe().args(["validate", &stages(name)]).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            format!("ok: {name} ({n} stages)\n")
        );
    }
}

#[test]
fn validate_reports_every_error_and_exits_2() {
    let fixture = format!("{}/tests/fixtures/three-errors", env!("CARGO_MANIFEST_DIR"));
    let out = troupe().args(["validate", &fixture]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("plan.md:8:10: Validation/StageDefinitionInvalid"),
        "{stderr}"
    );
    assert!(
        stderr.contains("pipeline.yaml:9:43: Validation/StageJoinDangling"),
        "{stderr}"
    );
    assert!(
        stderr.contains("work.md:11:9: Validation/StageCtxUnresolved"),
        "{stderr}"
    );
    assert!(stderr.contains("3 problems found"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn validate_json_lists_codes_and_locations() {
    let fixture = format!("{}/tests/fixtures/three-errors", env!("CARGO_MANIFEST_DIR"));
    let out = troupe()
        .args(["validate", "--json", &fixture])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 3);
    // The shape of every `--json` error, the first problem at the top.
    assert_eq!(v["status"], "error");
    assert_eq!(v["code"], errors[0]["code"]);
    assert_eq!(v["message"], errors[0]["message"]);
    assert_eq!(errors[1]["code"], "Validation/StageJoinDangling");
    assert_eq!(errors[1]["line"], 9);
    assert_eq!(errors[1]["field"], "next.plan.join");
    let ok = troupe()
        .args(["validate", "--json", &stages("fanout")])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&ok.stdout).unwrap();
    assert_eq!(
        v,
        serde_json::json!({"ok": true, "id": "fanout", "stages": 3})
    );
}

#[test]
fn validate_missing_folder_exits_2() {
    let out = troupe()
        .args(["validate", "no/such/pipeline"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("Validation/PipelineUnreadable"));
}

#[test]
fn show_prints_the_graph() {
    let out = troupe()
        .args(["show", &stages("code-review")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pipeline code-review — Code review"),
        "{text}"
    );
    assert!(text.contains("parallelCap 4"), "{text}");
    assert!(
        text.contains("execute  → parallel [test, lint] (cap 4) → join review"),
        "{text}"
    );
    assert!(
        text.contains("assert plan: size(parsed.steps) > 0"),
        "{text}"
    );
    let out = troupe().args(["show", &stages("fanout")]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("map worker over `ctx.upstream[0].parsed.items` (cap 16) → join reduce"),
        "{text}"
    );
}

#[test]
fn show_one_stage_with_its_manifest() {
    let out = troupe()
        .args(["show", &stages("code-review"), "review"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("allowedTools      []"), "{text}");
    assert!(
        text.contains("- submit_review  (completion channel)"),
        "{text}"
    );
    assert!(
        text.contains("| Test result: {{ctx.upstream[0].parsed}}"),
        "{text}"
    );
    let out = troupe()
        .args(["show", "--json", &stages("code-review"), "plan"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let names: Vec<&str> = v["toolManifest"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["function"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["Read", "Grep", "Glob", "submit_plan"]);
    assert_eq!(v["turnCap"], 20);
    assert_eq!(v["kind"], "llm");
}

#[test]
fn show_unknown_stage_exits_2() {
    let out = troupe()
        .args(["show", &stages("fanout"), "nope"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("stages: plan, worker, reduce"));
}

#[test]
fn help_teaches_exit_codes() {
    let out = troupe().arg("--help").output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    for line in [
        "129  cancelled by SIGHUP",
        "130  interrupted",
        "143  cancelled by SIGTERM",
    ] {
        assert!(text.contains(line), "{line}: {text}");
    }
    assert!(
        text.contains("troupe validate stages/code-review"),
        "{text}"
    );
}

#[test]
fn bad_flags_exit_2() {
    let out = troupe()
        .args(["validate", "--frobnicate"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
