//! `troupe::report` as a library: the timeline read from audit logs
//! (hand-written fixture, synthetic 100 000-sibling fan-out, torn and
//! corrupt logs), binning, the concurrency sweep, XML escaping, and the
//! SVG/HTML snapshots of the fixture.
//!
//! Snapshots: `tests/fixtures/report/run-1.svg` and `run-1.html` are the
//! exact bytes expected from `tests/fixtures/report/runs/run-1/audit.jsonl`.
//! After an intended change to the drawing, regenerate them with
//! `UPDATE_SNAPSHOTS=1 cargo test --test report` and review the diff (open
//! the SVG in a browser).

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

#[path = "report_support/synthetic.rs"]
mod synthetic;

use std::path::PathBuf;

use troupe::error::HasCode;
use troupe::report::{
    Concurrency, Outcome, ReportError, Role, Row, RowBudget, RunStatus, SvgOptions, Timeline,
    render_html, render_svg, rows, stage_summaries,
};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report")
}

fn fixture_log() -> String {
    std::fs::read_to_string(fixture_dir().join("runs/run-1/audit.jsonl")).unwrap()
}

fn timeline(log: &str) -> Timeline {
    Timeline::from_audit(log.as_bytes()).unwrap()
}

/// Compares with the committed file, or rewrites it with UPDATE_SNAPSHOTS=1.
fn snapshot(name: &str, actual: &str) {
    let path = fixture_dir().join(name);
    if std::env::var_os("UPDATE_SNAPSHOTS").is_some() {
        std::fs::write(&path, actual).unwrap();
        return;
    }
    let expected = std::fs::read_to_string(&path).unwrap_or_default();
    if expected != actual {
        let line = expected
            .lines()
            .zip(actual.lines())
            .position(|(a, b)| a != b)
            .unwrap_or_else(|| expected.lines().count().min(actual.lines().count()));
        panic!(
            "{name} differs from the snapshot at line {}:\n expected: {:?}\n   actual: {:?}\n\
             (UPDATE_SNAPSHOTS=1 cargo test --test report rewrites it)",
            line + 1,
            expected.lines().nth(line),
            actual.lines().nth(line)
        );
    }
}

#[test]
fn fixture_svg_and_html_match_their_snapshots() {
    let t = timeline(&fixture_log());
    let svg = render_svg(&t, &SvgOptions::default());
    snapshot("run-1.svg", &svg);
    snapshot("run-1.html", &render_html(&t, &SvgOptions::default()));
    // Same input, same bytes.
    assert_eq!(
        svg,
        render_svg(&timeline(&fixture_log()), &SvgOptions::default())
    );
}

#[test]
fn fixture_timeline_has_every_execution_wait_retry_and_approval() {
    let t = timeline(&fixture_log());
    assert_eq!(t.run.id, "run-1");
    assert_eq!(t.run.pipeline.as_deref(), Some("review & ship"));
    assert_eq!(t.run.status, RunStatus::Failed);
    assert_eq!(t.run.parallel_cap, Some(2));
    assert_eq!(t.end, 91_200);
    let labels: Vec<String> = t
        .executions
        .iter()
        .map(|e| format!("{}={}", t.execution_label(e), e.outcome.as_str()))
        .collect();
    assert_eq!(
        labels,
        [
            "plan=ok",
            "test=ok",
            "lint=ok",
            "docs=skipped",
            "review (join)=ok",
            "fix #0=cancelled",
            "fix #1=failed",
            "fix #2=cancelled"
        ]
    );
    // The static group: three siblings by list position, the join apart.
    let g = &t.groups[0];
    assert_eq!((g.width, g.cap, g.join.as_deref()), (3, 2, Some("review")));
    assert!(!g.map);
    let sib: Vec<Option<u32>> = g
        .siblings
        .iter()
        .map(|&e| t.executions[e as usize].index)
        .collect();
    assert_eq!(sib, [Some(0), Some(1), Some(2)]);
    assert_eq!((g.started, g.ended), (12_000, Some(81_000)));
    let review = &t.executions[4];
    assert_eq!(review.role, Role::Join, "the join is no sibling");
    assert_eq!(review.group, Some(0));
    // docs waited for a cap slot from the group's start to its entry.
    let docs = &t.executions[3];
    assert_eq!(docs.entered - g.started, 20_500);
    // lint: one retry, two model requests.
    let lint = &t.executions[2];
    assert_eq!((lint.retries, lint.requests), (1, 2));
    assert_eq!(
        t.retries_of(2).iter().map(|r| r.at).collect::<Vec<_>>(),
        [21_000]
    );
    // test: one approval wait, 26 ms to 50 ms, approved.
    let waits = t.approvals_of(1);
    assert_eq!(waits.len(), 1);
    assert_eq!((waits[0].from, waits[0].to), (26_000, Some(50_000)));
    assert_eq!(waits[0].outcome.as_deref(), Some("approve"));
    // The failing map group: one failed, two cancelled, one never started.
    let fix = &t.groups[1];
    assert!(fix.map);
    assert_eq!(fix.never_started(), 1);
    assert_eq!(fix.failed_sibling.as_deref(), Some("fix#1"));
    assert_eq!(t.executions[6].failed_requests, 1);
    // The unknown event with odd field types changed nothing.
    assert_eq!(t.executions.len(), 8);

    let summary = stage_summaries(&t);
    let fix = summary.iter().find(|s| s.stage == "fix").unwrap();
    assert_eq!(
        (
            fix.executions(),
            fix.count(Outcome::Cancelled),
            fix.count(Outcome::Failed)
        ),
        (3, 2, 1)
    );
    assert_eq!(fix.requests, 3);
    let plan = summary.iter().find(|s| s.stage == "plan").unwrap();
    assert_eq!((plan.median, plan.max), (Some(10_800), Some(10_800)));
}

#[test]
fn a_torn_last_line_is_dropped() {
    let log = fixture_log();
    let whole = timeline(&log);
    // Killed mid-write: half of a line, no newline.
    let torn = format!("{log}{{\"seq\":54,\"ts\":\"2026-01-02T03:04:05.0950");
    assert_eq!(timeline(&torn), whole);
    // Trailing blank lines change nothing either.
    assert_eq!(timeline(&format!("{torn}\n\n")), whole);
}

#[test]
fn a_malformed_line_in_the_middle_names_its_line() {
    let log = fixture_log();
    let mut lines: Vec<&str> = log.lines().collect();
    lines[6] = "{\"seq\":7,\"ts\":\"2026-01-02T03:04:05.011000Z\",\"event\":\"StageEx";
    let err = Timeline::from_audit(lines.join("\n").as_bytes()).unwrap_err();
    assert_eq!(err.code().to_string(), "Store/AuditCorrupt");
    match &err {
        ReportError::AuditCorrupt { line, .. } => assert_eq!(*line, 7),
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().contains(":7:"), "{err}");

    // A line that parses but has a bad timestamp is corrupt too.
    let bad_ts = log.replacen("2026-01-02T03:04:05.000100Z", "yesterday", 1);
    match Timeline::from_audit(bad_ts.as_bytes()).unwrap_err() {
        ReportError::AuditCorrupt { line, reason, .. } => {
            assert_eq!(line, 2);
            assert!(reason.contains("yesterday"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // So is an empty log, and bytes that are not UTF-8.
    assert!(matches!(
        Timeline::from_audit(&b""[..]),
        Err(ReportError::AuditCorrupt { .. })
    ));
    let mut bytes = log.into_bytes();
    bytes.splice(40..40, [0xff, 0xfe]);
    assert!(matches!(
        Timeline::from_audit(&bytes[..]),
        Err(ReportError::AuditCorrupt { line: 1, .. })
    ));
}

#[test]
fn a_killed_run_draws_unfinished_executions_to_the_last_timestamp() {
    let log = fixture_log();
    // Cut after lint's retry (line 15): no WorkflowExit, test and lint open.
    let cut: String = log.lines().take(15).map(|l| format!("{l}\n")).collect();
    let t = timeline(&cut);
    assert_eq!(t.run.status, RunStatus::Unfinished);
    assert_eq!(t.end, 21_000);
    let open: Vec<&str> = t
        .executions
        .iter()
        .filter(|e| e.outcome == Outcome::Unfinished)
        .map(|e| t.stage_name(e.stage))
        .collect();
    assert_eq!(open, ["test", "lint"]);
    assert_eq!(t.executions[1].end_or(t.end), 21_000);
    assert_eq!(t.groups[0].ended, None);
    let svg = render_svg(&t, &SvgOptions::default());
    assert_eq!(
        svg.matches("class=\"unfinished\"").count(),
        1 + 2,
        "legend + 2 bars"
    );
}

#[test]
fn stage_ids_and_names_are_escaped_for_xml() {
    let log = r#"{"seq":1,"ts":"2026-01-02T03:04:05Z","event":"WorkflowStarted","workflowRunId":"r<1>","pipeline":"a<&\"b'"}
{"seq":2,"ts":"2026-01-02T03:04:05.1Z","event":"SessionTurnStart","workflowRunId":"r<1>","turnId":"t&1","stages":["x<&\"y[2]"],"execution":"parallel","width":2,"cap":1}
{"seq":3,"ts":"2026-01-02T03:04:05.2Z","event":"StageEntered","workflowRunId":"r<1>","stageExecutionId":"r<1>/x<&\"y#0/1","stageId":"x<&\"y","visit":1,"index":0}
{"seq":4,"ts":"2026-01-02T03:04:05.3Z","event":"StageExited","workflowRunId":"r<1>","stageExecutionId":"r<1>/x<&\"y#0/1","stageId":"x<&\"y","verdict":"fail","reason":"<script>&\u0001"}
{"seq":5,"ts":"2026-01-02T03:04:05.4Z","event":"WorkflowExit","workflowRunId":"r<1>","status":"failed","reason":"</svg><b>&amp"}
"#;
    let t = timeline(log);
    assert_eq!(t.stage_name(0), "x<&\"y");
    for doc in [
        render_svg(&t, &SvgOptions::default()),
        render_html(&t, &SvgOptions::default()),
    ] {
        assert!(doc.contains("a&lt;&amp;&quot;b&#39;"), "pipeline escaped");
        assert!(doc.contains("x&lt;&amp;&quot;y #0"), "stage id escaped");
        assert!(
            doc.contains("&lt;/svg&gt;&lt;b&gt;&amp;amp"),
            "reason escaped"
        );
        assert!(!doc.contains("x<&"), "no raw stage id");
        assert!(!doc.contains('\u{1}'), "no control character");
        assert_well_formed_text(&doc);
    }
}

/// Every `&` starts an entity, and every `<` starts a tag or comment.
fn assert_well_formed_text(doc: &str) {
    for (i, _) in doc.match_indices('&') {
        let rest = &doc[i..];
        assert!(
            ["&amp;", "&lt;", "&gt;", "&quot;", "&#39;"]
                .iter()
                .any(|e| rest.starts_with(e)),
            "bare & at {i}: {}",
            &rest[..rest.len().min(20)]
        );
    }
    for (i, _) in doc.match_indices('<') {
        let next = doc[i + 1..].chars().next().unwrap();
        assert!(
            next.is_ascii_alphabetic() || next == '/' || next == '!',
            "bare < at {i}"
        );
    }
}

#[test]
fn the_synthetic_log_reads_the_same_with_every_event() {
    let lean = timeline(&synthetic::fanout_log(3_000, 16, false));
    let full = timeline(&synthetic::fanout_log(3_000, 16, true));
    let outcomes = |t: &Timeline| {
        t.executions
            .iter()
            .map(|e| (e.entered, e.ended, e.outcome, e.retries))
            .collect::<Vec<_>>()
    };
    assert_eq!(outcomes(&lean), outcomes(&full));
    assert_eq!(full.executions[2].requests, 2);
}

#[test]
fn a_100k_fanout_is_binned_within_the_row_budget_and_counts_add_up() {
    let width = 100_000;
    let t = timeline(&synthetic::fanout_log(width, 256, false));
    assert_eq!(t.executions.len(), width + 2);
    let group = &t.groups[0];
    assert_eq!(group.siblings.len(), width);
    for per_group in [100, 7, 1] {
        let budget = RowBudget {
            per_group,
            ..RowBudget::default()
        };
        let rows = rows(&t, budget);
        let bins: Vec<_> = rows
            .iter()
            .filter_map(|r| match r {
                Row::Bin(b) => Some(b),
                _ => None,
            })
            .collect();
        assert!(
            !bins.is_empty() && bins.len() <= per_group,
            "{}",
            bins.len()
        );
        assert_eq!(bins.iter().map(|b| b.size()).sum::<usize>(), width);
        let mut counts = [0u64; 5];
        for b in &bins {
            for (c, n) in counts.iter_mut().zip(b.counts) {
                *c += n;
            }
            assert_eq!(b.counts.iter().sum::<u64>(), b.size() as u64);
            // Consecutive indices, in order.
            assert_eq!(u64::from(b.max_index - b.min_index) + 1, b.size() as u64);
        }
        assert_eq!(bins[0].min_index, 0);
        assert_eq!(bins.last().unwrap().max_index as usize, width - 1);
        let cancelled = (0..width).filter(|i| i % 1009 == 1008).count() as u64;
        assert_eq!(counts[Outcome::Cancelled.slot()], cancelled);
        assert_eq!(counts[Outcome::Ok.slot()], width as u64 - cancelled);
        assert_eq!(
            bins.iter().map(|b| b.retries).sum::<u64>(),
            (0..width).filter(|i| i % 997 == 996).count() as u64
        );
        // A bin with a cancelled sibling takes its colour.
        assert!(bins.iter().any(|b| b.worst == Outcome::Cancelled));
    }
    // The picture stays small: bounded rows, the strip bounded by pixels.
    let svg = render_svg(&t, &SvgOptions::default());
    assert!(svg.matches("class=\"row bin\"").count() <= 100);
    assert_eq!(svg.matches("class=\"row sibling\"").count(), 0);
    assert!(svg.len() < 200_000, "{} bytes", svg.len());
    assert!(
        svg.contains(">worker #0–#999 · 1000 (1000 ok)<"),
        "bin label"
    );
    assert!(svg.contains(">worker #1000–#1999 · 1000 (999 ok, 1 cancelled)<"));
    let c = Concurrency::of(&t);
    assert_eq!(c.peak, 256);
}

#[test]
fn the_concurrency_sweep_is_exact() {
    // Intervals [entered, end) in ms; "x" never ends (unfinished).
    let spans: [(i64, Option<i64>); 7] = [
        (0, Some(10)),
        (2, Some(5)),
        (5, Some(8)), // starts as the one before ends: no overlap
        (3, Some(4)),
        (3, Some(9)),
        (12, None),
        (13, Some(14)),
    ];
    let mut log = String::from(
        "{\"ts\":\"2026-01-02T03:04:05Z\",\"event\":\"WorkflowStarted\",\"workflowRunId\":\"r\"}\n",
    );
    let at = |ms: i64| format!("2026-01-02T03:04:05.{:03}Z", ms);
    for (i, (from, to)) in spans.iter().enumerate() {
        log.push_str(&format!(
            "{{\"ts\":\"{}\",\"event\":\"StageEntered\",\"workflowRunId\":\"r\",\"stageExecutionId\":\"r/s{i}/1\",\"stageId\":\"s{i}\"}}\n",
            at(*from)
        ));
        if let Some(to) = to {
            log.push_str(&format!(
                "{{\"ts\":\"{}\",\"event\":\"StageExited\",\"workflowRunId\":\"r\",\"stageExecutionId\":\"r/s{i}/1\",\"verdict\":\"ok\"}}\n",
                at(*to)
            ));
        }
    }
    let t = timeline(&log);
    assert_eq!(t.end, 14_000);
    let c = Concurrency::of(&t);
    // By brute force at every microsecond.
    let running = |us: i64| {
        spans
            .iter()
            .filter(|(f, to)| f * 1000 <= us && us < to.map_or(t.end, |e| e * 1000))
            .count() as u32
    };
    let truth = (0..t.end).map(running).max().unwrap();
    assert_eq!(truth, 4);
    assert_eq!(c.peak, truth);
    for us in 0..t.end {
        let stepped = c
            .steps
            .iter()
            .take_while(|(from, _)| *from <= us)
            .last()
            .map_or(0, |s| s.1);
        assert_eq!(stepped, running(us), "at {us}µs");
    }
    // Columns keep each slice's maximum: one column per ms here.
    assert_eq!(
        c.columns(0, 14_000, 14),
        [1, 1, 2, 4, 3, 3, 3, 3, 2, 1, 0, 0, 1, 2]
    );
    // Wider columns never lose the peak.
    assert_eq!(c.columns(0, 14_000, 1), [4]);
    assert_eq!(c.columns(0, 14_000, 3).iter().max(), Some(&4));
}

#[test]
fn an_execution_run_again_after_a_resume_is_drawn_from_its_last_entry_with_its_last_end() {
    let line = |seq: u32, ms: u32, event: &str, extra: &str| {
        format!(
            "{{\"seq\":{seq},\"ts\":\"2026-11-23T10:00:00.{ms:03}Z\",\"event\":\"{event}\",\"workflowRunId\":\"r\",\"stageExecutionId\":\"r/plan/1\",\"stageId\":\"plan\"{extra}}}\n"
        )
    };
    let mut log = String::new();
    log += "{\"seq\":1,\"ts\":\"2026-11-23T10:00:00.000Z\",\"event\":\"WorkflowStarted\",\"workflowRunId\":\"r\",\"pipeline\":\"p\",\"entry\":\"plan\",\"parallelCap\":2}\n";
    log += &line(2, 10, "StageEntered", ",\"kind\":\"llm\",\"visit\":1");
    // The process died; the repair closed it; the resumed run ran it again.
    log += &line(3, 100, "StageCancelled", ",\"recovered\":true");
    log += "{\"seq\":4,\"ts\":\"2026-11-23T10:00:00.500Z\",\"event\":\"WorkflowResumed\",\"workflowRunId\":\"r\"}\n";
    log += &line(5, 600, "StageEntered", ",\"kind\":\"llm\",\"visit\":1");
    log += &line(6, 650, "StageEntered", ",\"kind\":\"llm\",\"visit\":1");
    log += &line(7, 900, "StageExited", ",\"verdict\":\"ok\"");
    let t = timeline(&log);
    assert_eq!(t.executions.len(), 1);
    let e = &t.executions[0];
    assert_eq!(e.outcome, Outcome::Ok, "the end that counted");
    assert_eq!((e.entered, e.ended), (600_000, Some(900_000)));
}

/// A run cancelled in a fan-out ends the turn in the log; its resume goes
/// on in that turn without starting it again. The siblings and the join
/// of the resumed session are the group's, not rows of their own.
#[test]
fn a_fan_out_cancelled_and_resumed_is_one_group_with_every_sibling() {
    let mut log = String::new();
    let mut seq = 0;
    let mut push = |ms: u32, event: &str, extra: &str| {
        seq += 1;
        log += &format!(
            "{{\"seq\":{seq},\"ts\":\"2026-11-23T10:00:00.{ms:03}Z\",\"event\":\"{event}\",\"workflowRunId\":\"r\"{extra}}}\n"
        );
    };
    let sibling = |i: u32| {
        format!(",\"stageExecutionId\":\"r/worker#{i}/1\",\"stageId\":\"worker\",\"index\":{i}")
    };
    push(
        0,
        "WorkflowStarted",
        ",\"pipeline\":\"p\",\"entry\":\"plan\",\"parallelCap\":2",
    );
    push(
        1,
        "SessionTurnStart",
        ",\"turnId\":\"r/turn/1\",\"stages\":[\"worker[4]\"],\"execution\":\"parallel\",\"width\":4,\"cap\":2,\"join\":\"reduce\"",
    );
    push(2, "StageEntered", &sibling(0));
    push(3, "StageEntered", &sibling(1));
    push(
        4,
        "StageExited",
        &format!("{},\"verdict\":\"ok\"", sibling(0)),
    );
    push(5, "StageCancelled", &sibling(1));
    push(6, "SessionTurnEnd", ",\"turnId\":\"r/turn/1\"");
    push(7, "WorkflowExit", ",\"status\":\"cancelled\"");
    push(100, "WorkflowResumed", "");
    for (i, ms) in [(1, 110), (2, 120), (3, 130)] {
        push(ms, "StageEntered", &sibling(i));
        push(
            ms + 5,
            "StageExited",
            &format!("{},\"verdict\":\"ok\"", sibling(i)),
        );
    }
    push(
        200,
        "StageEntered",
        ",\"stageExecutionId\":\"r/reduce/1\",\"stageId\":\"reduce\"",
    );
    push(
        210,
        "StageExited",
        ",\"stageExecutionId\":\"r/reduce/1\",\"stageId\":\"reduce\",\"verdict\":\"ok\"",
    );
    push(220, "WorkflowExit", ",\"status\":\"ok\"");
    let t = timeline(&log);
    assert_eq!(t.groups.len(), 1);
    let g = &t.groups[0];
    assert_eq!(g.siblings.len(), 4, "every sibling is the group's");
    assert!(
        g.siblings
            .iter()
            .all(|&s| t.executions[s as usize].outcome == Outcome::Ok)
    );
    assert!(!g.label().contains("never started"), "{}", g.label());
    let reduce = t
        .executions
        .iter()
        .find(|e| t.stage_name(e.stage) == "reduce")
        .unwrap();
    assert_eq!(reduce.role, Role::Join);
    assert!(g.ended.is_none_or(|end| end >= 135_000), "{:?}", g.ended);
}
