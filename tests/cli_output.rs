//! What `troupe run` prints: one stream per purpose (`--events -` keeps
//! stdout pure JSON lines, `--json` with it adds one `Summary` line), the
//! summary in pipeline order, short runs in milliseconds, every model
//! request counted.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::{stages, text};
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;
use common::Fixture;
use serde_json::Value;

fn troupe(args: &[&str], runs: &std::path::Path) -> Output {
    Command::cargo_bin("troupe")
        .unwrap()
        .args(args)
        .arg("--runs-dir")
        .arg(runs.join("runs"))
        .output()
        .unwrap()
}

#[test]
fn events_with_json_keep_stdout_json_lines_and_end_with_one_summary_line() {
    let runs = tempfile::tempdir().unwrap();
    let out = troupe(
        &[
            "run",
            &stages("fanout"),
            "--ctx",
            "width=5",
            "--events",
            "-",
            "--json",
        ],
        runs.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON line: {l}: {e}")))
        .collect();
    let summary = lines.last().unwrap();
    assert_eq!(summary["event"], "Summary");
    assert_eq!(summary["status"], "ok");
    assert_eq!(summary["stages"]["worker"]["ok"], 5);
    let run_id = lines[0]["workflowRunId"].as_str().unwrap();
    assert_eq!(summary["workflowRunId"], run_id);
    for line in &lines {
        let keys: Vec<&str> = line
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .take(4)
            .collect();
        assert_eq!(keys, ["seq", "ts", "event", "workflowRunId"], "{line}");
    }
    let seqs: Vec<u64> = lines.iter().map(|l| l["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(lines.iter().filter(|l| l["event"] == "Summary").count(), 1);
}

#[test]
fn the_summary_lists_stages_in_pipeline_order_and_short_runs_in_milliseconds() {
    let runs = tempfile::tempdir().unwrap();
    let out = troupe(
        &["run", &stages("code-review"), "--task", "rename the loader"],
        runs.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let stdout = String::from_utf8_lossy(&out.stdout);
    let order: Vec<&str> = stdout
        .lines()
        .skip_while(|l| !l.starts_with("stage "))
        .skip(1)
        .take_while(|l| !l.starts_with("fan-out") && !l.starts_with("model requests"))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let pipeline =
        troupe::definition::load_pipeline(std::path::Path::new(&stages("code-review"))).unwrap();
    let declared: Vec<&str> = pipeline
        .stages
        .iter()
        .map(|s| s.id.as_str())
        .filter(|id| order.contains(id))
        .collect();
    assert_eq!(order, declared, "{stdout}");
    assert!(order.len() >= 5, "{stdout}");
    let wall = stdout
        .lines()
        .find_map(|l| l.strip_prefix("wall time "))
        .unwrap();
    assert!(
        wall.ends_with("ms") && !wall.starts_with("0.000"),
        "a short run prints milliseconds: {wall}"
    );
}

#[test]
fn failed_scripted_requests_count_as_model_requests() {
    let yaml = "id: flaky\nentry: a\nstages:\n  a: a.md\n";
    let script =
        "stages:\n  a:\n    - { fail: transient, times: 2 }\n    - complete: { summary: done }\n";
    let f = Fixture::new(
        yaml,
        &[
            ("a.md", &common::stage_md("a", "", "Work.")),
            ("script.yaml", script),
        ],
    );
    let runs = tempfile::tempdir().unwrap();
    let out = troupe(
        &[
            "run",
            f.path().to_str().unwrap(),
            "--json",
            "--provider-backoff",
            "1ms",
        ],
        runs.path(),
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        report["usage"]["requests"], 3,
        "two failed tries and one answer"
    );
}

/// `troupe <args> --runs-dir <runs>/runs` with its stdout to a full disk
/// (`/dev/full`) and, again, to a pipe whose reader is gone before the
/// command starts: the two ways a command's output cannot be written.
fn unwritable(args: &[&str], runs: &std::path::Path) -> [Output; 2] {
    let start = |stdout: std::process::Stdio| {
        Command::cargo_bin("troupe")
            .unwrap()
            .args(args)
            .arg("--runs-dir")
            .arg(runs.join("runs"))
            .stdout(stdout)
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let on_full = start(full.into()).wait_with_output().unwrap();
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let gone = start(writer.into()).wait_with_output().unwrap();
    [on_full, gone]
}

/// A report that cannot be written is not a run that ended ok: a full
/// disk fails the command (exit 1, naming where the run is kept), and a
/// reader that went away ends it as SIGPIPE would (141), never a panic.
#[test]
fn a_report_that_cannot_be_written_is_said_and_exits_so() {
    let runs = tempfile::tempdir().unwrap();
    let fanout = stages("fanout");
    let [full, gone] = unwritable(&["run", &fanout, "--ctx", "width=3", "--json"], runs.path());
    let said = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(1), "{said}");
    assert!(
        said.contains("cannot write the report") && said.contains("troupe runs show"),
        "{said}"
    );
    assert!(!said.contains("panicked"), "{said}");
    let said = String::from_utf8_lossy(&gone.stderr);
    assert_eq!(gone.status.code(), Some(141), "{said}");
    assert!(!said.contains("panicked"), "{said}");
    // So does an event stream (`--events -`) stdout stopped taking.
    for extra in [&[][..], &["--json"][..]] {
        let mut args = vec!["run", &fanout, "--ctx", "width=100", "--events", "-"];
        args.extend_from_slice(extra);
        let [full, gone] = unwritable(&args, runs.path());
        let said = String::from_utf8_lossy(&full.stderr);
        assert_eq!(full.status.code(), Some(1), "{extra:?}: {said}");
        assert!(said.contains("cannot write"), "{said}");
        assert_eq!(gone.status.code(), Some(141), "{extra:?}: {}", text(&gone));
    }
}

/// `troupe watch` of a run whose stdout cannot be written stops and says
/// so (141 for a reader that went away, 1 for a full disk) instead of
/// going on, or ending with the run's own status; `runs export` and
/// `runs tail` end at 141 too.
#[test]
fn a_watch_whose_stdout_cannot_be_written_stops_and_says_so() {
    let runs = tempfile::tempdir().unwrap();
    let fanout = stages("fanout");
    let report = troupe(
        &["run", &fanout, "--ctx", "width=20", "--json"],
        runs.path(),
    );
    assert_eq!(report.status.code(), Some(0), "{}", text(&report));
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let id = report["runId"].as_str().unwrap();
    let [full, gone] = unwritable(&["watch", id, "--events", "-"], runs.path());
    let said = String::from_utf8_lossy(&full.stderr);
    assert_eq!(full.status.code(), Some(1), "{said}");
    assert!(said.contains("cannot write"), "{said}");
    assert_eq!(gone.status.code(), Some(141), "{}", text(&gone));
    for verb in ["export", "tail"] {
        let [_, gone] = unwritable(&["runs", verb, id], runs.path());
        assert_eq!(
            gone.status.code(),
            Some(141),
            "runs {verb}: {}",
            text(&gone)
        );
    }
}

/// Every command that prints to stdout ends as a command whose output
/// cannot be written ends (the error said, or 141), never with the
/// panic `println!` makes (101): the store's listings, a run shown, the
/// cleanup's plan, a report's "wrote" line.
#[test]
fn listings_and_reports_whose_stdout_cannot_be_written_exit_so() {
    let runs = tempfile::tempdir().unwrap();
    let report = troupe(
        &["run", &stages("fanout"), "--ctx", "width=3", "--json"],
        runs.path(),
    );
    assert_eq!(report.status.code(), Some(0), "{}", text(&report));
    let report: Value = serde_json::from_slice(&report.stdout).unwrap();
    let id = report["runId"].as_str().unwrap();
    let svg = runs.path().join("r.svg");
    let svg = svg.to_str().unwrap();
    for args in [
        vec!["runs"],
        vec!["runs", "--json"],
        vec!["runs", "show", id],
        vec!["runs", "show", id, "--json"],
        vec!["runs", "gc", "--older-than", "7d", "--dry-run", "--json"],
        vec!["report", id, "--svg", svg],
        vec!["report", id, "--svg", svg, "--json"],
    ] {
        let [full, gone] = unwritable(&args, runs.path());
        let said = String::from_utf8_lossy(&full.stderr);
        // 2 where the command's own store error says it (`runs show`).
        assert!(
            matches!(full.status.code(), Some(1 | 2)),
            "{args:?}: {:?} {said}",
            full.status
        );
        assert!(said.contains("Store/WriteFailed"), "{args:?}: {said}");
        assert!(!said.contains("panicked"), "{args:?}: {said}");
        assert_eq!(gone.status.code(), Some(141), "{args:?}: {}", text(&gone));
    }
}
