//! `troupe run` driven as a user would: real binary, real audit file, real
//! signals.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read};
use std::process::{Command, Stdio};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

fn troupe() -> Command {
    Command::cargo_bin("troupe").unwrap()
}

fn stages(name: &str) -> String {
    format!("{}/stages/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn audit_lines(path: &str) -> Vec<Value> {
    troupe::auditlog::read_text(std::path::Path::new(path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn every_bundled_pipeline_runs_offline_to_its_end() {
    let runs = tempfile::tempdir().unwrap();
    let cases: [(&str, &[&str], &str); 4] = [
        (
            "code-review",
            &["--task", "rename the loader"],
            "Verdict: approve",
        ),
        ("ralph", &["--ctx", "goal=add a flag"], "ralph: ok"),
        ("fanout", &["--ctx", "width=40"], "worker[40]: 40 siblings"),
        (
            "triage",
            &["--ctx", "ticket=the app crashes"],
            "BUG (high): the app crashes",
        ),
    ];
    for (name, args, expect) in cases {
        let out = troupe()
            .args(["run", &stages(name), "--runs-dir"])
            .arg(runs.path().join("runs"))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{name}: {stdout}{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(stdout.contains(expect), "{name}: {stdout}");
    }
}

#[test]
fn json_report_and_audit_log_agree() {
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--ctx",
            "width=25",
            "--parallel-cap",
            "4",
            "--json",
            "--runs-dir",
        ])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "ok");
    assert_eq!(report["stages"]["worker"]["ok"], 25);
    assert_eq!(report["groups"][0]["cap"], 4);
    let audit = report["auditPath"].as_str().unwrap();
    assert!(audit.ends_with(&format!(
        "{}/audit.log.zst",
        report["runId"].as_str().unwrap()
    )));
    let lines = audit_lines(audit);
    assert_eq!(lines[0]["event"], "WorkflowStarted");
    assert_eq!(lines.last().unwrap()["event"], "WorkflowExit");
    // Strictly increasing; the numbers skipped belong to observer events
    // (Progress), which the audit log does not keep.
    let mut last = 0;
    for l in &lines {
        let keys: Vec<&String> = l.as_object().unwrap().keys().take(4).collect();
        assert_eq!(keys, ["seq", "ts", "event", "workflowRunId"]);
        let seq = l["seq"].as_u64().unwrap();
        assert!(seq > last, "seq {seq} after {last}");
        last = seq;
    }
    assert_eq!(lines[0]["seq"], 1);
}

#[test]
fn fail_sibling_exits_1_join_never_entered_others_cancelled() {
    // One thread: every sibling on the session's arbiter, cancelled
    // through the group's token. Four: siblings on four arbiters, each
    // woken through its arbiter's relay of the group's cancel.
    for threads in ["1", "4"] {
        fail_fast_with_threads(threads);
    }
}

fn fail_fast_with_threads(threads: &str) {
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--ctx",
            "width=300",
            "--parallel-cap",
            "32",
            "--latency",
            "5ms",
            "--fail-sibling",
            "worker#17",
            "--threads",
            threads,
            "--json",
            "--store",
        ])
        .arg(runs.path().join("troupe.db"))
        .arg("--runs-dir")
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["status"], "failed");
    assert_eq!(report["groups"][0]["failedSibling"], "worker#17");
    let lines = audit_lines(report["auditPath"].as_str().unwrap());
    assert!(
        !lines.iter().any(|l| l["stageId"] == "reduce"),
        "the join is never entered"
    );
    let entered = lines
        .iter()
        .filter(|l| l["event"] == "StageEntered" && l["stageId"] == "worker")
        .count();
    let exited = lines
        .iter()
        .filter(|l| l["event"] == "StageExited" && l["stageId"] == "worker")
        .count();
    let cancelled = lines
        .iter()
        .filter(|l| l["event"] == "StageCancelled")
        .count();
    assert!(cancelled > 0);
    assert_eq!(
        entered,
        exited + cancelled,
        "every other started sibling was cancelled"
    );
    // A cancellation is an execution's last word, wherever it was recorded
    // (by the execution's actor, its arbiter's relay or the failing
    // sibling): it follows its entry, nothing of it follows, and every
    // entered execution ends once, exited or cancelled.
    //
    // With the store on, a committed batch's reports reach the scheduler
    // as one message and what they free is started together: the log
    // still never shows more siblings running than the cap.
    let mut ends: HashMap<&str, usize> = HashMap::new();
    let mut cancelled_execs = HashSet::new();
    let (mut running, mut peak) = (0usize, 0usize);
    for l in &lines {
        let Some(exec) = l["stageExecutionId"].as_str() else {
            continue;
        };
        assert!(
            !cancelled_execs.contains(exec),
            "{exec} went on after it was cancelled: {l}"
        );
        let sibling = l["stageId"] == "worker";
        match l["event"].as_str() {
            Some("StageEntered") => {
                ends.entry(exec).or_default();
                if sibling {
                    running += 1;
                    peak = peak.max(running);
                }
            }
            Some(end @ ("StageCancelled" | "StageExited")) => {
                *ends.get_mut(exec).expect("ended unentered") += 1;
                if end == "StageCancelled" {
                    cancelled_execs.insert(exec);
                }
                if sibling {
                    running -= 1;
                }
            }
            _ => {}
        }
    }
    assert!(
        peak <= 32,
        "{peak} siblings ran at once, above the cap of 32"
    );
    assert!(peak > 1, "the siblings ran side by side ({peak} at most)");
    assert!(
        ends.values().all(|&n| n == 1),
        "an execution ended twice or never"
    );
    // Every sibling is accounted for: it ran, was cancelled, or never started.
    let g = &report["groups"][0];
    assert_eq!(g["cancelled"].as_u64().unwrap(), cancelled as u64);
    assert_eq!(
        exited as u64 + g["cancelled"].as_u64().unwrap() + g["neverStarted"].as_u64().unwrap(),
        300
    );
    // The store holds each cancellation as the log records it: where it
    // was, and why.
    let store = troupe::store::Store::open_read_only(&runs.path().join("troupe.db")).unwrap();
    let rows = store
        .executions(report["runId"].as_str().unwrap(), Some("worker"), None)
        .unwrap();
    let stored: Vec<_> = rows.iter().filter(|r| r.outcome == "cancelled").collect();
    assert_eq!(stored.len(), cancelled);
    for row in stored {
        let logged = lines
            .iter()
            .find(|l| {
                l["event"] == "StageCancelled"
                    && l["stageExecutionId"] == row.stage_execution_id.as_str()
            })
            .unwrap();
        assert_eq!(row.phase.as_deref(), logged["phase"].as_str());
        assert_eq!(row.reason.as_deref(), logged["reason"].as_str());
        assert_eq!(row.turn, logged["turn"].as_u64().map(|t| t as u32));
    }
}

#[test]
fn invalid_input_exits_2() {
    let out = troupe()
        .args(["run", &stages("code-review")])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ctx field `task` is required"));
    let out = troupe()
        .args(["run", &stages("fanout"), "--ctx", "nope=1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("declares no ctx field `nope`"));
    // A sibling past the width fails nothing: the run ends ok and says so.
    let out = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--ctx",
            "width=3",
            "--fail-sibling",
            "worker#7",
        ])
        .args(["--runs-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--fail-sibling worker#7: the run ended ok"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = troupe()
        .args(["run", &stages("fanout"), "--fail-sibling", "ghost#1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Validation/InputInvalid") && err.contains("unknown stage(s): ghost"),
        "{err}"
    );
    let out = troupe()
        .args(["run", &stages("fanout"), "--parallel-cap", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--parallel-cap") && err.contains("0"), "{err}");
    let out = troupe()
        .args(["run", &stages("fanout"), "--latency", "fast"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--latency") && err.contains("fast"), "{err}");
    let out = troupe()
        .args([
            "run",
            &format!("{}/tests/fixtures/three-errors", env!("CARGO_MANIFEST_DIR")),
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("3 problems found"), "{err}");
}

#[test]
fn bad_script_is_a_validation_error() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("script.yaml");
    std::fs::write(
        &script,
        "stages:\n  nosuch:\n    - text: hi\n  worker:\n    - { text: a, complete: {} }\n",
    )
    .unwrap();
    let out = troupe()
        .args(["run", &stages("fanout"), "--script"])
        .arg(&script)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("Validation/ScriptInvalid")
            && stderr.contains("nosuch")
            && stderr.contains("exactly one of"),
        "{stderr}"
    );
}

#[test]
fn events_stream_to_stdout_as_json_lines() {
    let runs = tempfile::tempdir().unwrap();
    let out = troupe()
        .args([
            "run",
            &stages("triage"),
            "--ctx",
            "ticket=x",
            "--events",
            "-",
            "--runs-dir",
        ])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.first().unwrap()["event"], "WorkflowStarted");
    assert_eq!(lines.last().unwrap()["event"], "WorkflowExit");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("triage: ok"),
        "the summary moves to stderr"
    );
}

#[cfg(unix)]
#[test]
fn first_interrupt_cancels_the_run_with_exit_130_and_a_flushed_audit_log() {
    let runs = tempfile::tempdir().unwrap();
    // The plan answers at once; every worker's model turn takes a minute.
    let script = runs.path().join("slow-workers.yaml");
    std::fs::write(
        &script,
        "stages:\n  plan:\n    - complete: { items: { $range: \"{{ctx.width}}\" } }\n  worker:\n    - { tool: Echo, args: { text: hi }, latency: 60s }\n",
    )
    .unwrap();
    let mut child = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--ctx",
            "width=1000",
            "--parallel-cap",
            "8",
            "--events",
            "-",
            "--script",
        ])
        .arg(&script)
        .arg("--runs-dir")
        .arg(runs.path().join("runs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait, event by event, until eight workers are in flight.
    let mut reader = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut run_id = String::new();
    let mut requests = 0;
    while requests < 8 {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended early"
        );
        let v: Value = serde_json::from_str(&line).unwrap();
        run_id = v["workflowRunId"].as_str().unwrap().to_owned();
        if v["event"] == "ProviderRequestStarted" && v["stageId"] == "worker" {
            requests += 1;
        }
    }
    let status = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let rest: Vec<Value> = reader
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .collect();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130));
    assert_eq!(
        rest.iter()
            .filter(|v| v["event"] == "StageCancelled")
            .count(),
        8
    );
    let audit = audit_lines(
        runs.path()
            .join("runs")
            .join(&run_id)
            .join(troupe::auditlog::FILE)
            .to_str()
            .unwrap(),
    );
    let last = audit.last().unwrap();
    assert_eq!(last["event"], "WorkflowExit");
    assert_eq!(last["status"], "cancelled");
}

/// The second Ctrl-C exits at once even when the run cannot finish: here
/// the `--events` reader never reads, so every publisher is blocked on the
/// full stream and the first press alone could never end the run.
#[test]
fn second_ctrl_c_exits_at_once_even_when_the_run_is_stuck() {
    let runs = tempfile::tempdir().unwrap();
    let mut child = troupe()
        .args([
            "run",
            &stages("fanout"),
            "--ctx",
            "width=20000",
            "--parallel-cap",
            "256",
            "--events",
            "-",
            "--runs-dir",
        ])
        .arg(runs.path().join("runs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The Ctrl-C handler is installed before the run starts, so the first
    // streamed event means it is in place. Then stop reading (but keep the
    // pipe open): the stream fills and every publisher blocks.
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut first = String::new();
    assert!(
        stdout.read_line(&mut first).unwrap() > 0,
        "no event streamed"
    );
    assert!(first.contains("WorkflowStarted"), "{first}");
    let interrupt = |pid: u32| {
        assert!(
            Command::new("kill")
                .args(["-INT", &pid.to_string()])
                .status()
                .unwrap()
                .success()
        );
    };
    let pid = child.id();
    interrupt(pid);
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("cancelling the run") {
        line.clear();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "no first notice");
    }
    interrupt(pid);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let mut rest = String::new();
    stderr.read_to_string(&mut rest).unwrap();
    assert!(rest.contains("exiting at once"), "{rest}");
}
