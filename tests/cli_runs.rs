//! Browsing the run store through the real binary: `troupe run --json`
//! carries every StageResult; `troupe runs` lists runs (text and JSON)
//! with their state as people read it (`interrupted` when no process holds
//! a `running` run); `runs show` has the per-stage table and the results,
//! one sibling's with `--stage`; `runs export` is the audit log's whole
//! lines (also of a run kept with `--no-store`); `runs rm` and `runs gc`
//! delete rows and folders, never those of a run a process holds.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::project::{Project, bundled, said};
use serde_json::{Value, json};
use troupe::store::RunLock;

fn stdout(project: &Project, args: &[&str]) -> String {
    let out = project.output(args);
    assert_eq!(
        out.status.code(),
        Some(0),
        "troupe {args:?}: {}",
        said(&out)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// The `code` of a refusal printed with `--json`, exit 2: the last JSON
/// value on standard output (an export writes the lines before damage
/// first).
fn refusal(project: &Project, args: &[&str]) -> String {
    let out = project.output(args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "troupe {args:?}: {}",
        said(&out)
    );
    let values = serde_json::Deserializer::from_slice(&out.stdout).into_iter::<Value>();
    let v = values.last().expect("a refusal").unwrap();
    v["code"].as_str().unwrap().to_owned()
}

/// Changes a run's row behind troupe's back (its age, its status).
fn set(project: &Project, run_id: &str, assignment: &str) {
    let db = rusqlite::Connection::open(project.path().join(".troupe/troupe.db")).unwrap();
    let n = db
        .execute(
            &format!("UPDATE runs SET {assignment} WHERE id = ?1"),
            [run_id],
        )
        .unwrap();
    assert_eq!(n, 1);
}

#[test]
fn run_json_carries_every_stage_result() {
    let project = Project::new();
    let report = project.fanout(4);
    let run_id = report["runId"].as_str().unwrap();
    let results = report["results"].as_array().unwrap();
    // One per StageExited of the log, with its verdict.
    let log = project.audit(run_id);
    let exited: Vec<&Value> = log.iter().filter(|e| e["event"] == "StageExited").collect();
    assert_eq!(results.len(), exited.len());
    assert_eq!(results.len(), 6, "plan, four workers, reduce");
    for e in exited {
        let r = results
            .iter()
            .find(|r| r["stageExecutionId"] == e["stageExecutionId"])
            .unwrap_or_else(|| panic!("no result for {e}"));
        assert_eq!(r["verdict"], e["verdict"]);
        assert_eq!(r["stageId"], e["stageId"]);
    }
    let worker = |i: u32| {
        results
            .iter()
            .find(|r| r["stageExecutionId"] == format!("{run_id}/worker#{i}/1"))
            .unwrap()
    };
    assert_eq!(worker(2)["parsed"], json!({"item": 2, "summary": "done 2"}));
    let plan = results.iter().find(|r| r["stageId"] == "plan").unwrap();
    assert_eq!(plan["parsed"], json!({"items": [0, 1, 2, 3]}));
}

#[test]
fn runs_lists_shows_and_exports_a_run() {
    let project = Project::new();
    // Nothing yet.
    assert!(stdout(&project, &["runs"]).starts_with("no runs yet"));
    assert_eq!(project.json(&["runs", "--json"]), json!({"runs": []}));
    // A store another process has created but not yet given its schema
    // (SQLite makes the file first) is no store yet, not a broken one.
    let db = project.path().join(".troupe/troupe.db");
    std::fs::create_dir_all(db.parent().unwrap()).unwrap();
    std::fs::write(&db, b"").unwrap();
    assert!(stdout(&project, &["runs"]).starts_with("no runs yet"));
    assert_eq!(project.json(&["runs", "--json"]), json!({"runs": []}));
    std::fs::remove_file(&db).unwrap();

    let report = project.fanout(4);
    let run_id = report["runId"].as_str().unwrap();

    // The list, as text: one row with the run's figures.
    let text = stdout(&project, &["runs"]);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 1, "{text}");
    let cells: Vec<&str> = rows[0].split_whitespace().collect();
    assert_eq!(cells[..3], [run_id, "fanout", "ok"], "{text}");
    assert_eq!(
        cells[cells.len() - 3..],
        ["6", "0", "0"],
        "ok failed cancelled: {text}"
    );
    // And as JSON.
    let listed = project.listed(run_id);
    assert_eq!(listed["pipelineId"], "fanout");
    assert_eq!(listed["state"], "ok");
    assert_eq!(listed["ctx"], json!({"width": 4}));
    assert_eq!(listed["sessions"], 1);
    assert_eq!(
        listed["counts"],
        json!({"ok": 6, "failed": 0, "skipped": 0, "cancelled": 0})
    );

    // One run, as text: the per-stage table and every result.
    let shown = stdout(&project, &["runs", "show", run_id]);
    assert!(
        shown.starts_with(&format!("run {run_id} of fanout: ok\n")),
        "{shown}"
    );
    let table_row = |stage: &str| -> Vec<String> {
        shown
            .lines()
            .find(|l| l.split_whitespace().next() == Some(stage))
            .unwrap_or_else(|| panic!("no row for {stage}: {shown}"))
            .split_whitespace()
            .map(str::to_owned)
            .collect()
    };
    // stage ok fail skipped cancelled retries capHits ...
    assert_eq!(table_row("worker")[1..7], ["4", "0", "0", "0", "0", "0"]);
    assert_eq!(table_row("plan")[1..3], ["1", "0"]);
    assert_eq!(table_row("reduce")[1..3], ["1", "0"]);
    let results: Vec<&str> = shown
        .split("\nresults:\n")
        .nth(1)
        .unwrap_or_else(|| panic!("no results: {shown}"))
        .lines()
        .collect();
    assert_eq!(results.len(), 6, "{shown}");
    assert!(
        results.contains(&r#"  worker#3         ok      {"item":3,"summary":"done 3"}"#),
        "{shown}"
    );

    // One sibling only.
    let one = stdout(&project, &["runs", "show", run_id, "--stage", "worker#3"]);
    let results: Vec<&str> = one.split("\nresults:\n").nth(1).unwrap().lines().collect();
    assert_eq!(
        results,
        [r#"  worker#3         ok      {"item":3,"summary":"done 3"}"#]
    );
    let one = project.json(&["runs", "show", run_id, "--stage", "worker#3", "--json"]);
    let execs = one["executions"].as_array().unwrap();
    assert_eq!(execs.len(), 1);
    assert_eq!(execs[0]["stageExecutionId"], format!("{run_id}/worker#3/1"));
    assert_eq!(execs[0]["index"], 3);

    // As JSON: every execution with its parsed result, the stage figures.
    let all = project.json(&["runs", "show", run_id, "--json"]);
    assert_eq!(all["state"], "ok");
    assert_eq!(all["run"]["id"], run_id);
    assert_eq!(all["stages"]["worker"]["ok"], 4);
    let execs = all["executions"].as_array().unwrap();
    assert_eq!(execs.len(), 6);
    for (r, e) in report["results"].as_array().unwrap().iter().map(|r| {
        let e = execs
            .iter()
            .find(|e| e["stageExecutionId"] == r["stageExecutionId"])
            .unwrap();
        (r, e)
    }) {
        assert_eq!(e["parsed"], r["parsed"], "{}", r["stageExecutionId"]);
        assert_eq!(e["verdict"], r["verdict"]);
        assert_eq!(e["outcome"], "exited");
    }
    let workers = project.json(&["runs", "show", run_id, "--stage", "worker", "--json"]);
    assert_eq!(workers["executions"].as_array().unwrap().len(), 4);

    // Export: the audit log's whole lines; a torn last line is not one.
    let audit = project.audit_path(run_id);
    let log = project.audit_text(run_id);
    assert_eq!(stdout(&project, &["runs", "export", run_id]), log);
    // The stock zstd reads every frame (it skips the header); the lines
    // are troupe's to write back from the records.
    zstd::decode_all(&std::fs::read(&audit).unwrap()[..]).unwrap();
    common::project::write_killed_log(&audit, &log, "{\"seq\":99999,\"ts\":\"2026-");
    assert_eq!(stdout(&project, &["runs", "export", run_id]), log);
    let file = project.path().join("exported.jsonl");
    stdout(
        &project,
        &["runs", "export", run_id, "--output", file.to_str().unwrap()],
    );
    assert_eq!(std::fs::read_to_string(file).unwrap(), log);
    // A repair that did not finish set the last segment aside: said.
    let aside = troupe::auditlog::saved_tail_path(&audit);
    std::fs::write(&aside, b"x").unwrap();
    let out = project.output(&["runs", "export", run_id]);
    assert!(said(&out).contains("set aside"), "{}", said(&out));
    std::fs::remove_file(&aside).unwrap();

    assert_eq!(
        refusal(&project, &["runs", "show", "no-such-run", "--json"]),
        "Store/RunNotFound"
    );
}

#[test]
fn rm_and_gc_delete_rows_and_folders_but_never_a_held_run() {
    let project = Project::new();
    let ids: Vec<String> = (0..3)
        .map(|_| project.fanout(2)["runId"].as_str().unwrap().to_owned())
        .collect();
    let (old, removed, held) = (&ids[0], &ids[1], &ids[2]);
    let exists = |id: &str| project.run_dir(id).is_dir();
    let listed = |project: &Project| -> Vec<String> {
        project.json(&["runs", "--json"])["runs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["id"].as_str().unwrap().to_owned())
            .collect()
    };
    // Two runs started long ago; one of them a process still holds.
    set(&project, old, "started_at = 1000");
    set(&project, held, "started_at = 1000, status = 'running'");
    let lock = RunLock::acquire(&project.run_dir(held), held).unwrap();
    assert_eq!(project.listed(held)["state"], "running");

    // A dry run deletes nothing.
    let dry = stdout(&project, &["runs", "gc", "--older-than", "1d", "--dry-run"]);
    assert_eq!(dry, format!("would remove {old}\n"));
    assert!(exists(old));
    assert_eq!(listed(&project).len(), 3);
    let dry = project.json(&["runs", "gc", "--older-than", "1d", "--dry-run", "--json"]);
    assert_eq!(dry, json!({"wouldRemove": [old]}));
    // An age of nothing would take every run not running: refused.
    let zero = project.output(&["runs", "gc", "--older-than", "0d"]);
    assert_eq!(zero.status.code(), Some(2), "{}", said(&zero));
    assert_eq!(listed(&project).len(), 3);

    let gc = project.json(&["runs", "gc", "--older-than", "1d", "--json"]);
    assert_eq!(gc, json!({"removed": [old]}));
    assert!(!exists(old), "gc removed the run's folder");
    assert_eq!(
        refusal(&project, &["runs", "show", old, "--json"]),
        "Store/RunNotFound"
    );

    let rm = stdout(&project, &["runs", "rm", removed]);
    assert_eq!(rm, format!("removed {removed}\n"));
    assert!(!exists(removed));
    assert_eq!(listed(&project), std::slice::from_ref(held));
    assert_eq!(
        refusal(&project, &["runs", "rm", "no-such-run", "--json"]),
        "Store/RunNotFound"
    );

    // The held run: neither removed nor collected while held, also when
    // asked from another folder (the row's folder is absolute).
    assert_eq!(
        refusal(&project, &["runs", "rm", held, "--json"]),
        "Store/RunBusy"
    );
    // One JSON document: the refusal, with nothing removed before it.
    let out = project.output(&["runs", "rm", held, "--json"]);
    let documents = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .count();
    assert_eq!(documents, 1, "{}", said(&out));
    let elsewhere = project.path().join("sub");
    std::fs::create_dir(&elsewhere).unwrap();
    let out = project
        .troupe()
        .current_dir(&elsewhere)
        .args([
            "runs",
            "rm",
            held,
            "--json",
            "--store",
            "../.troupe/troupe.db",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Store/RunBusy"));
    assert!(exists(held));
    assert_eq!(
        project.json(&["runs", "gc", "--older-than", "1d", "--json"]),
        json!({"removed": []})
    );
    assert!(exists(held));
    // Released (as when its process dies), it reads as interrupted, and
    // can go.
    drop(lock);
    assert_eq!(project.listed(held)["state"], "interrupted");
    // A row naming a folder that is not a run's (damaged, or edited by
    // hand) is refused rather than followed.
    let folder = project.run_dir(held).display().to_string();
    set(
        &project,
        held,
        &format!("run_dir = '{}'", project.path().join("sub").display()),
    );
    assert_eq!(
        refusal(&project, &["runs", "rm", held, "--json"]),
        "Store/NotARunFolder"
    );
    assert!(elsewhere.is_dir());
    // Nor does a resume follow it, writing its log and lock there.
    let before: Vec<_> = std::fs::read_dir(project.path().join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        refusal(&project, &["resume", held, "--json"]),
        "Store/NotARunFolder"
    );
    let after: Vec<_> = std::fs::read_dir(project.path().join("sub"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(before, after, "nothing written into the folder");
    set(&project, held, &format!("run_dir = '{folder}'"));
    stdout(&project, &["runs", "rm", held]);
    assert!(!exists(held));
    assert!(listed(&project).is_empty());
}

/// `runs tail`: the last lines of a finished run's log; with `--follow`
/// on a live run, every line it writes until its `WorkflowExit`, then an
/// exit of its own (the run's process is gone).
#[test]
fn runs_tail_prints_the_last_lines_and_follows_a_live_run_to_its_end() {
    let project = Project::new();
    let done = project.fanout(6);
    let id = done["runId"].as_str().unwrap();
    let log = project.audit_text(id);
    let last3: Vec<&str> = log.lines().rev().take(3).collect::<Vec<_>>();
    let tail = stdout(&project, &["runs", "tail", id, "-n", "3"]);
    assert_eq!(
        tail.lines().collect::<Vec<_>>(),
        last3.into_iter().rev().collect::<Vec<_>>()
    );
    assert!(tail.trim_end().ends_with("\"status\":\"ok\"}"), "{tail}");
    // Following a run that ended prints nothing more and returns.
    assert_eq!(stdout(&project, &["runs", "tail", id, "-n", "0", "-f"]), "");

    follow_live(&project, &[]);
    // A run kept without a store is followed as well: it holds its
    // folder's lock all the same.
    follow_live(&project, &["--no-store"]);
}

/// Follows a live fan-out's log with `runs tail -f` to its end.
fn follow_live(project: &Project, extra: &[&str]) {
    let fanout = bundled("fanout");
    let mut args = vec![
        "run",
        fanout.to_str().unwrap(),
        "--ctx",
        "width=24",
        "--parallel-cap",
        "2",
        "--latency",
        "20ms",
        "--events",
        "-",
    ];
    args.extend_from_slice(extra);
    let mut live = project.spawn(&args);
    live.until(|e| e["event"] == "StageExited");
    let run_id = live.run_id();
    // The run's stream is read to its end meanwhile, so it never waits on
    // a full pipe.
    let run = std::thread::spawn(move || live.finish());
    let followed = stdout(project, &["runs", "tail", &run_id, "-n", "100000", "-f"]);
    let finished = run.join().unwrap();
    assert_eq!(finished.code, Some(0), "{}", finished.stderr);
    assert_eq!(
        followed,
        project.audit_text(&run_id),
        "every line, in order"
    );
    assert!(followed.lines().last().unwrap().contains("WorkflowExit"));
}

/// A log of several segments (over 8 MiB of lines): `runs tail` decodes
/// from the last segments that hold the lines asked for, and gives the
/// same lines as the whole log, whether they fit in the last segment or
/// reach back across several.
#[test]
fn runs_tail_of_a_log_of_many_segments_gives_the_logs_last_lines() {
    let project = Project::new();
    let done = project.fanout(4000);
    let id = done["runId"].as_str().unwrap();
    let log = project.audit_text(id);
    let all: Vec<&str> = log.lines().collect();
    let path = project.audit_path(id);
    let segments = troupe::auditlog::segment_starts(&path).unwrap();
    assert!(segments.len() >= 2, "{segments:?}");
    for n in [1, 5, 30_000, all.len() - 1, all.len() + 10] {
        let tail = stdout(&project, &["runs", "tail", id, "-n", &n.to_string()]);
        let want = &all[all.len() - n.min(all.len())..];
        assert_eq!(tail.lines().collect::<Vec<_>>(), want, "-n {n}");
    }
}

/// A run kept with `--no-store` has its audit log and no row: `runs
/// export` and `runs tail` find it in `--runs-dir` by its exact id, and a
/// name that is no run there is still the store's refusal.
#[test]
fn export_and_tail_read_a_run_kept_without_a_store() {
    let project = Project::new();
    let fanout = bundled("fanout");
    let report = project.json(&[
        "run",
        fanout.to_str().unwrap(),
        "--ctx",
        "width=3",
        "--no-store",
        "--json",
    ]);
    assert_eq!(report["status"], "ok", "{report}");
    assert!(!project.path().join(".troupe/troupe.db").exists());
    let id = report["runId"].as_str().unwrap();
    let log = project.audit_text(id);
    assert_eq!(stdout(&project, &["runs", "export", id]), log);
    let last = log.lines().last().unwrap();
    assert_eq!(
        stdout(&project, &["runs", "tail", id, "-n", "1"]).trim_end(),
        last
    );
    for not_a_run in [&id[..8], "../runs", "elsewhere"] {
        let out = project.output(&["runs", "export", not_a_run]);
        assert_eq!(out.status.code(), Some(2), "{not_a_run}: {}", said(&out));
    }
}

/// A compact log troupe cannot read is a typed `Store/AuditCorrupt`
/// (exit 2) for `runs export`, `runs tail` and `report`, saying which
/// kind: a foreign file, a newer format, a damaged segment (its checksum).
#[test]
fn a_foreign_newer_or_damaged_compact_log_is_a_typed_error() {
    let project = Project::new();
    let done = project.fanout(4);
    let id = done["runId"].as_str().unwrap();
    let audit = project.audit_path(id);
    let good = std::fs::read(&audit).unwrap();
    let said_of = |args: &[&str]| {
        let out = project.output(args);
        assert_eq!(
            out.status.code(),
            Some(2),
            "troupe {args:?}: {}",
            said(&out)
        );
        said(&out)
    };
    let mut newer = troupe::auditlog::header();
    let at = newer.len() - 2;
    newer[at] = b'9';
    newer.extend_from_slice(&good[troupe::auditlog::header().len()..]);
    let mut damaged = good.clone();
    // The last byte is the closed segment's checksum: the lines decode
    // (an export writes them, zstd being given a block at a time), the
    // check fails.
    *damaged.last_mut().unwrap() ^= 0xff;
    for (bytes, says) in [
        (b"{\"seq\":1}\n".to_vec(), "not a troupe audit log"),
        (newer, "written by a newer troupe (log format 9"),
        (damaged, "at byte"),
    ] {
        std::fs::write(&audit, &bytes).unwrap();
        assert_eq!(
            refusal(&project, &["runs", "export", id, "--json"]),
            "Store/AuditCorrupt"
        );
        let text = said_of(&["runs", "export", id]);
        assert!(text.contains(says), "{text}");
        let tail = said_of(&["runs", "tail", id]);
        assert!(tail.contains("Store/AuditCorrupt"), "{tail}");
        let svg = project.path().join("run.svg");
        let report = said_of(&["report", id, "--svg", svg.to_str().unwrap()]);
        assert!(report.contains("Store/AuditCorrupt"), "{report}");
        assert!(!svg.exists(), "nothing drawn");
    }
    // A FIFO in the log's place is refused, not waited on for a writer
    // that never comes (every reader hung there).
    std::fs::remove_file(&audit).unwrap();
    nix::unistd::mkfifo(&audit, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let svg = project.path().join("run.svg");
    for args in [
        vec!["runs", "export", id],
        vec!["runs", "tail", id],
        vec!["report", id, "--svg", svg.to_str().unwrap()],
    ] {
        let text = said_of(&args);
        assert!(text.contains("not a regular file"), "{args:?}: {text}");
    }
}

/// A failure's reason may quote a tool's output (a `Bash` timeout quotes
/// what the command printed): `runs show` prints it without the control
/// sequences in it, which could set the clipboard or rewrite the screen.
#[test]
fn runs_show_prints_no_control_sequence_a_tool_printed() {
    let project = Project::new();
    let dir = project.path().join("p");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(
        dir.join("pipeline.yaml"),
        "id: esc\nentry: s\nstages:\n  s: { kind: tool, tool: Bash, args: { command: \"printf 'x\\\\033]52;c;aGk=\\\\007y'; sleep 30\", timeout_ms: 300 } }\nnext:\n  s: end\n",
    )
    .unwrap();
    let out = project.output(&["run", "p", "--headless", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let id = v["runId"].as_str().unwrap();
    let shown = stdout(&project, &["runs", "show", id]);
    assert!(shown.contains("x\u{FFFD}]52;c;aGk=\u{FFFD}y"), "{shown}");
    assert!(
        !shown.contains('\u{1b}') && !shown.contains('\u{7}'),
        "{shown:?}"
    );
}

/// Cleaning up, resuming or continuing a chat where nothing ever ran
/// makes no store: the run is not found, `gc` finds nothing old enough,
/// and no `.troupe` is left.
#[test]
fn rm_and_gc_where_nothing_ran_make_no_store() {
    let project = Project::new();
    assert_eq!(
        refusal(&project, &["runs", "rm", "abc", "--json"]),
        "Store/RunNotFound"
    );
    assert_eq!(
        project.json(&["runs", "gc", "--older-than", "7d", "--dry-run", "--json"]),
        json!({"wouldRemove": []})
    );
    assert_eq!(
        project.json(&["runs", "gc", "--older-than", "7d", "--json"]),
        json!({"removed": []})
    );
    // Nor does a resume or a chat with nothing to continue.
    assert_eq!(
        refusal(&project, &["resume", "abc", "--json"]),
        "Store/RunNotFound"
    );
    let out = project.output(&["chat", "--continue"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("Store/RunNotFound"), "{}", said(&out));
    assert!(!project.path().join(".troupe").exists());
}

/// `runs show --stage` of a stage the run does not have says so (exit 2,
/// with the stages it has), rather than an empty table.
#[test]
fn runs_show_of_a_stage_the_run_lacks_is_refused() {
    let project = Project::new();
    let done = project.fanout(3);
    let id = done["runId"].as_str().unwrap();
    assert_eq!(
        refusal(
            &project,
            &["runs", "show", id, "--stage", "nosuch", "--json"]
        ),
        "Validation/UnknownStage"
    );
    let out = project.output(&["runs", "show", id, "--stage", "nosuch"]);
    assert!(
        said(&out).contains("plan, worker, reduce"),
        "{}",
        said(&out)
    );
    stdout(&project, &["runs", "show", id, "--stage", "worker"]);
}

/// A store in a folder this user cannot write (another user's project, a
/// read-only mount) is still listed and shown: SQLite's WAL mode wants a
/// `-shm` file even to read, so it is read as a file no one writes. Run as
/// `nobody` (through `setpriv`) where this test runs as root.
#[test]
fn a_store_this_user_cannot_write_is_still_read() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let setpriv = std::path::Path::new("/usr/bin/setpriv");
    // `/proc/self` belongs to this process's user.
    let root = std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0);
    if !root || !setpriv.exists() {
        eprintln!("note: skipped: needs root and setpriv to read as another user");
        return;
    }
    let project = Project::new();
    let done = project.fanout(3);
    let id = done["runId"].as_str().unwrap();
    std::fs::set_permissions(project.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let status = std::process::Command::new("chmod")
        .args(["-R", "a-w,a+rX"])
        .arg(project.path().join(".troupe"))
        .status()
        .unwrap();
    assert!(status.success());
    let as_nobody = |args: &[&str]| {
        std::process::Command::new(setpriv)
            .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(env!("CARGO_BIN_EXE_troupe"))
            .args(args)
            .current_dir(project.path())
            .output()
            .unwrap()
    };
    let listed = as_nobody(&["runs", "--json"]);
    if String::from_utf8_lossy(&listed.stderr).contains("Permission denied")
        && listed.stdout.is_empty()
    {
        eprintln!("note: skipped: nobody cannot reach the binary here");
        return;
    }
    assert_eq!(listed.status.code(), Some(0), "{}", said(&listed));
    assert!(String::from_utf8_lossy(&listed.stdout).contains(id));
    let shown = as_nobody(&["runs", "show", id, "--json"]);
    assert_eq!(shown.status.code(), Some(0), "{}", said(&shown));
}

/// A run the store keeps whose audit log was deleted: export, tail (with
/// or without `--follow`) and report say the log is gone
/// (`Store/LogMissing`), not that the run ended empty, was killed, or
/// was never there.
#[test]
fn a_run_whose_log_is_gone_says_so() {
    let project = Project::new();
    let done = project.fanout(3);
    let id = done["runId"].as_str().unwrap();
    std::fs::remove_file(project.audit_path(id)).unwrap();
    let svg = project.path().join("r.svg");
    for args in [
        vec!["runs", "export", id],
        vec!["runs", "tail", id],
        vec!["runs", "tail", id, "--follow"],
        vec!["report", id, "--svg", svg.to_str().unwrap()],
    ] {
        let out = project.output(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
        assert!(
            said(&out).contains("Store/LogMissing"),
            "{args:?}: {}",
            said(&out)
        );
    }
}
