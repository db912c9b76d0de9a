//! `troupe report` driven as a user would: a real run of `stages/fanout`
//! written to a temp runs folder, then the real binary drawing it; and the
//! typed errors (unknown run, corrupt log, nothing to write).

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::process::{Command, Output};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::Value;

fn troupe() -> Command {
    Command::cargo_bin("troupe").unwrap()
}

fn stages(name: &str) -> String {
    format!("{}/stages/{name}", env!("CARGO_MANIFEST_DIR"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `stages/fanout` into `runs` and returns the run id.
fn run_fanout(runs: &Path, extra: &[&str]) -> (String, Output) {
    let out = troupe()
        .args(["run", &stages("fanout"), "--json", "--runs-dir"])
        .arg(runs)
        // The store in the run's own temp dir, not beside it.
        .arg("--store")
        .arg(runs.join("troupe.db"))
        .args(extra)
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    (report["runId"].as_str().unwrap().to_owned(), out)
}

fn report(runs: &Path, args: &[&str]) -> Output {
    troupe()
        .arg("report")
        .args(args)
        .arg("--runs-dir")
        .arg(runs)
        .output()
        .unwrap()
}

#[test]
fn a_fanout_run_is_drawn_as_svg_and_self_contained_html() {
    let runs = tempfile::tempdir().unwrap();
    let (id, run) = run_fanout(runs.path(), &["--ctx", "width=12", "--parallel-cap", "4"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let out_dir = tempfile::tempdir().unwrap();
    let svg_path = out_dir.path().join("x.svg");
    let html_path = out_dir.path().join("x.html");
    let out = report(
        runs.path(),
        &[
            &id,
            "--svg",
            svg_path.to_str().unwrap(),
            "--html",
            html_path.to_str().unwrap(),
        ],
    );
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    // One line per file written.
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].starts_with(&format!("wrote {}", svg_path.display())));
    assert!(lines[1].starts_with(&format!("wrote {}", html_path.display())));

    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
    assert_eq!(svg.matches("class=\"row sibling\"").count(), 12);
    assert_eq!(svg.matches("class=\"row group\"").count(), 1);
    assert_eq!(svg.matches("class=\"row exec\"").count(), 2, "plan, reduce");
    assert!(svg.contains("reduce (join)"));
    assert_eq!(svg.matches("class=\"cap\"").count(), 1);
    assert!(svg.contains(">cap 4<"));
    assert!(svg.contains(">worker[12] · cap 4<"));
    assert!(svg.contains(&format!("run {id} · ok")));

    let html = std::fs::read_to_string(&html_path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>"));
    assert!(
        html.contains("<svg class=\"troupe-timeline\""),
        "SVG inline"
    );
    assert_eq!(html.matches("class=\"row sibling\"").count(), 12);
    assert!(
        html.contains("<td>worker</td><td>12</td><td>12</td>"),
        "per-stage table"
    );
    for outside in ["http", "src=", "href=", "url(//", "@import"] {
        assert!(!html.contains(outside), "HTML refers to {outside}");
    }
}

#[test]
fn a_failed_run_shows_its_cancelled_siblings_and_json_lists_what_was_written() {
    let runs = tempfile::tempdir().unwrap();
    let (id, run) = run_fanout(
        runs.path(),
        &[
            "--ctx",
            "width=20",
            "--parallel-cap",
            "4",
            "--latency",
            "5ms",
            "--fail-sibling",
            "worker#2",
        ],
    );
    assert_eq!(run.status.code(), Some(1), "{}", text(&run.stderr));
    let out_dir = tempfile::tempdir().unwrap();
    let svg_path = out_dir.path().join("failed.svg");
    let out = report(
        runs.path(),
        &[&id, "--svg", svg_path.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["ok"], true);
    assert_eq!(json["written"][0]["format"], "svg");
    let svg = std::fs::read_to_string(&svg_path).unwrap();
    assert_eq!(json["written"][0]["bytes"].as_u64(), Some(svg.len() as u64));
    assert!(svg.contains(&format!("run {id} · failed")));
    // worker#2 failed; the others that had a slot were cancelled; the rest
    // never started and have no row.
    assert_eq!(
        svg.matches("class=\"failed\"").count(),
        1 + 1,
        "legend + one bar"
    );
    let rows = svg.matches("class=\"row sibling\"").count();
    // Bars are 12 high (the legend's swatches 10).
    let bars = |class: &str| {
        svg.matches(&format!("height=\"12\" class=\"{class}\""))
            .count()
    };
    let (cancelled, ok_siblings) = (bars("cancelled"), bars("ok") - 1);
    assert!(cancelled >= 1, "{svg}");
    assert_eq!(rows, 1 + cancelled + ok_siblings, "{svg}");
    assert!(svg.contains(&format!("{} never started", 20 - rows)));
}

#[test]
fn the_fixture_run_is_read_from_any_runs_dir() {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/runs");
    let out_dir = tempfile::tempdir().unwrap();
    let html = out_dir.path().join("r.html");
    let out = report(&runs, &["run-1", "--html", html.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.contains("<title>troupe report · review &amp; ship · run-1</title>"));
}

#[test]
fn an_unknown_run_exits_2_with_run_not_found() {
    let runs = tempfile::tempdir().unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let svg = out_dir.path().join("x.svg");
    let out = report(
        runs.path(),
        &["no-such-run", "--svg", svg.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("error: Store/RunNotFound: no run `no-such-run` in"),
        "{stderr}"
    );
    assert!(
        stderr.contains(&runs.path().display().to_string()),
        "{stderr}"
    );
    assert!(stderr.contains("see .troupe/runs"), "{stderr}");
    assert!(!svg.exists());
    // A path is no run id.
    let out = report(runs.path(), &["../etc", "--svg", "x.svg", "--json"]);
    assert_eq!(out.status.code(), Some(2));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["errors"][0]["code"], "Store/RunNotFound");
    assert_eq!(
        (&json["status"], &json["code"]),
        (&"error".into(), &"Store/RunNotFound".into())
    );
}

#[test]
fn a_prefix_of_two_runs_is_ambiguous_not_unknown() {
    let runs = tempfile::tempdir().unwrap();
    let (first, _) = run_fanout(runs.path(), &["--ctx", "width=2"]);
    let (second, _) = run_fanout(runs.path(), &["--ctx", "width=2"]);
    let common = first
        .chars()
        .zip(second.chars())
        .take_while(|(a, b)| a == b)
        .count();
    assert!(common > 0, "{first} {second}");
    let store = runs.path().join("troupe.db");
    let svg = runs.path().join("x.svg");
    let out = report(
        runs.path(),
        &[
            &first[..common],
            "--svg",
            svg.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    let json: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["errors"][0]["code"], "Store/AmbiguousRun", "{json}");
    assert!(!svg.exists());
    // One more character names one of them.
    let out = report(
        runs.path(),
        &[
            &second[..=common],
            "--svg",
            svg.to_str().unwrap(),
            "--store",
            store.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_corrupt_log_exits_2_naming_the_line() {
    let runs = tempfile::tempdir().unwrap();
    let dir = runs.path().join("broken");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(
        dir.join("audit.jsonl"),
        "{\"seq\":1,\"ts\":\"2026-01-02T03:04:05Z\",\"event\":\"WorkflowStarted\",\"workflowRunId\":\"broken\"}\n\
         not json at all\n\
         {\"seq\":3,\"ts\":\"2026-01-02T03:04:06Z\",\"event\":\"WorkflowExit\",\"workflowRunId\":\"broken\",\"status\":\"ok\"}\n",
    )
    .unwrap();
    let out_dir = tempfile::tempdir().unwrap();
    let svg = out_dir.path().join("b.svg");
    let out = report(runs.path(), &["broken", "--svg", svg.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(stderr.contains("error: Store/AuditCorrupt: "), "{stderr}");
    assert!(
        stderr.contains("audit.jsonl:2: not an audit event"),
        "{stderr}"
    );
    assert!(!svg.exists(), "nothing written");
}

#[test]
fn nothing_to_write_and_an_unwritable_file_exit_2() {
    let runs = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/runs");
    let out = report(&runs, &["run-1"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains("Validation/InputInvalid: nothing to write"),
        "{stderr}"
    );
    let out_dir = tempfile::tempdir().unwrap();
    let nowhere = out_dir.path().join("missing-dir/x.svg");
    let out = report(&runs, &["run-1", "--svg", nowhere.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("Store/WriteFailed: cannot write"));
}

/// A report or an export pointed into the run's own folder (its log, by
/// name or through a link) is refused and the log left whole: it used to
/// be truncated (export) or replaced by the report, exit 0.
#[test]
fn an_output_inside_the_run_folder_is_refused_and_the_log_kept() {
    let runs = tempfile::tempdir().unwrap();
    let (id, run) = run_fanout(runs.path(), &["--ctx", "width=3"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let log = runs.path().join(&id).join(troupe::auditlog::FILE);
    let before = std::fs::read(&log).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let link = elsewhere.path().join("looks-harmless.html");
    std::os::unix::fs::symlink(&log, &link).unwrap();
    for target in [&log, &link, &runs.path().join(&id).join("new.svg")] {
        for flag in ["--svg", "--html"] {
            let out = report(runs.path(), &[&id, flag, target.to_str().unwrap()]);
            assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
            assert!(
                text(&out.stderr).contains("Store/OutputInRunFolder"),
                "{}",
                text(&out.stderr)
            );
        }
        let out = troupe()
            .args(["runs", "export", &id, "--output"])
            .arg(target)
            .arg("--runs-dir")
            .arg(runs.path())
            .arg("--store")
            .arg(runs.path().join("troupe.db"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("Store/OutputInRunFolder"),
            "{}",
            text(&out.stderr)
        );
    }
    assert_eq!(std::fs::read(&log).unwrap(), before, "the log is untouched");
    assert!(!runs.path().join(&id).join("new.svg").exists());
}

#[test]
fn help_teaches_with_examples() {
    let out = troupe().args(["report", "--help"]).output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = text(&out.stdout);
    for needle in [
        "Examples:",
        "--svg run.svg",
        "--rows",
        "--runs-dir",
        "Store/RunNotFound",
    ] {
        assert!(help.contains(needle), "{needle}: {help}");
    }
    let top = text(&troupe().arg("--help").output().unwrap().stdout);
    assert!(top.contains("report"), "{top}");
}

#[test]
fn graph_draws_the_pipeline_above_the_timeline() {
    let runs = tempfile::tempdir().unwrap();
    let (id, run) = run_fanout(runs.path(), &["--ctx", "width=3"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let html = runs.path().join("r.html");
    let out = report(
        runs.path(),
        &[
            &id,
            "--html",
            html.to_str().unwrap(),
            "--graph",
            "--store",
            runs.path().join("troupe.db").to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let page = std::fs::read_to_string(&html).unwrap();
    let graph = &page[page.find("<h2>Pipeline</h2>").expect("a pipeline section")..];
    let graph = &graph[..graph.find("</svg>").unwrap()];
    for stage in ["plan", "worker", "reduce", "start", "end"] {
        assert!(
            graph.contains(&format!(">{stage}</text>")),
            "{stage} is drawn"
        );
    }
    assert!(
        graph.contains("map over ctx.upstream[0].parsed.items"),
        "the fan-out's label"
    );
    assert!(graph.contains("stroke-dasharray"), "the join is dashed");
    // Without --html there is nowhere to draw it.
    let out = report(runs.path(), &[&id, "--svg", "x.svg", "--graph"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A report replaces the file it names whole (written beside it, then
/// renamed), keeping that file's mode, the link that names it, and any
/// path that is no regular file (`/dev/null`) as it is.
#[test]
fn a_report_replaces_its_file_keeping_mode_and_links() {
    use std::os::unix::fs::{FileTypeExt, PermissionsExt};
    let runs = tempfile::tempdir().unwrap();
    let (id, run) = run_fanout(runs.path(), &["--ctx", "width=3"]);
    assert_eq!(run.status.code(), Some(0), "{}", text(&run.stderr));
    let out_dir = tempfile::tempdir().unwrap();
    let real = out_dir.path().join("real.svg");
    std::fs::write(&real, "old").unwrap();
    std::fs::set_permissions(&real, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = out_dir.path().join("link.svg");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let out = report(
        runs.path(),
        &[&id, "--svg", link.to_str().unwrap(), "--html", "/dev/null"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link stays a link"
    );
    assert!(std::fs::read_to_string(&real).unwrap().starts_with("<svg"));
    let mode = std::fs::metadata(&real).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "its mode kept");
    assert!(
        std::fs::metadata("/dev/null")
            .unwrap()
            .file_type()
            .is_char_device()
            || !std::path::Path::new("/dev/null").exists(),
        "/dev/null written in place"
    );
    let left: Vec<_> = std::fs::read_dir(out_dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "no temp file left: {left:?}");
}
