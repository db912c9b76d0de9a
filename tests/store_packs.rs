//! The store's packs from outside: a store an older troupe wrote (an
//! execution a row) reads as before, and its rows stay beneath the packs
//! a resume adds; a run's executions are read a pass at a time, in the
//! order stored, each record found again by its place; a damaged pack
//! is refused with `Store/Corrupt` and where it is damaged, by the
//! library's every reader and by `troupe runs show`, never half read and
//! never a panic; what a run used counts every record it stored.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[path = "store_support/first_schema.rs"]
mod first_schema;

use std::path::Path;
use std::sync::mpsc;
use std::time::SystemTime;

use common::project::Project;
use first_schema::first_schema_store;
use rusqlite::{Connection, params};
use serde_json::{Value, json};
use troupe::error::HasCode;
use troupe::provider::Usage;
use troupe::runtime::ledger::{CancelRecord, ExitRecord, Ledger};
use troupe::runtime::result::{Kept, StageResult, Verdict};
use troupe::store::schema::SCHEMA_VERSION;
use troupe::store::{Counts, RunRow, Store, StoreError, StoreWriter};

fn code(e: &StoreError) -> String {
    e.code().to_string()
}

/// The names of the store's tables.
fn tables(path: &Path) -> Vec<String> {
    Connection::open(path)
        .unwrap()
        .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap()
}

fn schema_version(path: &Path) -> String {
    Connection::open(path)
        .unwrap()
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .unwrap()
}

#[test]
fn a_store_of_the_first_schema_reads_as_before_and_a_resume_adds_packs_to_its_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    first_schema_store(&path);
    // A row of odd types, as another tool may have left one: read
    // leniently, not refused.
    Connection::open(&path)
        .unwrap()
        .execute(
            "INSERT INTO executions (run, exec, stage_id, sibling, visit, outcome, verdict, \
             attempts, prompt_tokens, completion_tokens, requests, ended_at, parsed) \
             VALUES (1, 'worker#6/1', 'worker', '6', 'two', 'exited', 'ok', 1.5, 'x', 0, 1, \
             2006.7, X'7B7D')",
            [],
        )
        .unwrap();

    // Read as it is: a reading command changes nothing in the file.
    let store = Store::open_read_only(&path).unwrap();
    assert_eq!(
        store.counts("old").unwrap(),
        Counts {
            ok: 4,
            failed: 1,
            skipped: 1,
            cancelled: 1
        }
    );
    let rows = store.executions("old", None, None).unwrap();
    let ids: Vec<&str> = rows.iter().map(|r| r.stage_execution_id.as_str()).collect();
    assert_eq!(
        ids,
        (0..7)
            .map(|i| format!("old/worker#{i}/1"))
            .collect::<Vec<_>>(),
        "in the order they ended"
    );
    assert_eq!(rows[0].parsed, Some(json!({"v": 0})));
    assert_eq!(rows[0].output, Some(json!("said 0")));
    assert_eq!(rows[0].usage.prompt_tokens, 10);
    assert_eq!(rows[0].entered_at, Some(1000));
    assert_eq!(rows[2].reason.as_deref(), Some("Test/Failed: no"));
    let cancelled = &rows[3];
    assert_eq!(cancelled.outcome, "cancelled");
    assert_eq!(cancelled.phase.as_deref(), Some("Execute"));
    assert_eq!(cancelled.turn, Some(2));
    assert_eq!(
        cancelled.tool_calls,
        Some(json!([{"callId": "c", "tool": "shell"}]))
    );
    assert_eq!(rows[4].parsed, None, "a column that is no JSON");
    let odd = &rows[6];
    assert_eq!(
        (odd.index, odd.visit, odd.attempts, odd.ended_at),
        (Some(6), 0, 1, 2006)
    );
    assert_eq!(odd.usage.prompt_tokens, 0);
    assert_eq!(odd.parsed, Some(json!({})));

    // What a resume restores from it.
    let kept = store.kept_results("old").unwrap();
    assert_eq!(kept.len(), 6, "every exited execution");
    assert_eq!(*kept["old/worker#4/1"].parsed(), Value::Null);
    let one = kept["old/worker#1/1"].result();
    assert!(
        std::sync::Arc::ptr_eq(&one.parsed, &one.output),
        "an empty output column is parsed"
    );
    assert_eq!(*kept["old/worker#0/1"].output(), json!("said 0"));
    assert_eq!(kept["old/worker#5/1"].verdict(), Verdict::Skipped);
    drop(store);
    assert_eq!(schema_version(&path), "1");
    assert_eq!(tables(&path), ["executions", "meta", "runs"]);

    // Opened to write (a resume): packs beside the rows, which stay.
    let store = Store::open(&path).unwrap();
    assert_eq!(schema_version(&path), SCHEMA_VERSION.to_string());
    assert_eq!(tables(&path), ["executions", "meta", "packs", "runs"]);
    assert_eq!(store.executions("old", None, None).unwrap(), rows);
    // The resume runs the failed and the cancelled sibling again; a replay
    // of sibling 0 leaves its stored ok result as it was.
    let writer = StoreWriter::start(&path).unwrap();
    let ledger = writer.ledger();
    for (i, v) in [(2, "again 2"), (3, "again 3"), (0, "replayed")] {
        stored_exit(&ledger, exit("old", i, json!({ "v": v })));
    }
    writer.finish().unwrap();
    assert_eq!(
        store.counts("old").unwrap(),
        Counts {
            ok: 6,
            failed: 0,
            skipped: 1,
            cancelled: 0
        }
    );
    let kept = store.kept_results("old").unwrap();
    assert_eq!(*kept["old/worker#0/1"].parsed(), json!({"v": 0}));
    assert_eq!(*kept["old/worker#2/1"].parsed(), json!({"v": "again 2"}));
    assert_eq!(*kept["old/worker#3/1"].parsed(), json!({"v": "again 3"}));
}

/// Hands `record` to the writer and waits until it is committed.
fn stored_exit(ledger: &impl Ledger, record: ExitRecord) {
    let (tx, rx) = mpsc::channel();
    ledger.persist(
        record,
        Some(Box::new(move |answer| {
            let _ = tx.send(answer);
        })),
    );
    rx.recv().unwrap().unwrap();
}

/// Sibling `i` of `run` exited ok with `parsed`.
fn exit(run: &str, i: usize, parsed: Value) -> ExitRecord {
    let id = format!("{run}/worker#{i}/1");
    ExitRecord {
        run_id: run.into(),
        stage_execution_id: id.as_str().into(),
        stage_id: "worker".into(),
        index: Some(i),
        visit: 1,
        result: Kept::Whole(std::sync::Arc::new(StageResult::ok("worker", &id, parsed))),
        entered_at: SystemTime::now(),
        exited_at: SystemTime::now(),
    }
}

/// A store with run `r` and `n` exits stored by the writer.
fn stored_run(path: &Path, n: usize) -> Store {
    let store = Store::open(path).unwrap();
    store
        .begin_run(&RunRow {
            id: "r".to_owned(),
            pipeline_id: "fanout".to_owned(),
            pipeline_dir: "stages/fanout".to_owned(),
            digest: "sha256:00".to_owned(),
            ctx: json!({}),
            cap: 4,
            run_dir: ".troupe/runs/r".to_owned(),
            status: "running".to_owned(),
            reason: None,
            started_at: 1,
            ended_at: None,
            summary: None,
            sessions: 1,
        })
        .unwrap();
    let writer = StoreWriter::start(path).unwrap();
    let ledger = writer.ledger();
    for i in 0..n {
        stored_exit(&ledger, exit("r", i, json!({ "item": i })));
    }
    writer.finish().unwrap();
    store
}

/// `runs show` reads a run's executions a pass at a time: which records
/// stand, then each pass in the order they were stored (not sorted by
/// time). No read transaction spans the passes (it would hold a running
/// run's checkpoints back), so each record is found again by its place:
/// records stored after the first pass are not passed on, one deleted
/// since is skipped, and the others are the same records every pass.
#[test]
fn executions_are_read_in_passes_in_the_order_stored_each_found_by_its_place() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    let store = stored_run(&path, 0);
    let writer = StoreWriter::start(&path).unwrap();
    let ledger = writer.ledger();
    let persist = |i: usize, ended_ms: u64| {
        let mut record = exit("r", i, json!({ "item": i }));
        record.exited_at = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(ended_ms);
        stored_exit(&ledger, record);
    };
    // Stored in index order, each ending (by its clock) before the last.
    for i in 0..5 {
        persist(i, 10_000 - i as u64);
    }
    let ids = |rows: &[troupe::store::ExecRow]| -> Vec<String> {
        rows.iter().map(|r| r.stage_execution_id.clone()).collect()
    };
    let want: Vec<String> = (0..5).map(|i| format!("r/worker#{i}/1")).collect();
    assert_eq!(ids(&store.executions("r", None, None).unwrap()), want);

    let reader = Store::open_read_only(&path).unwrap();
    let standing = reader.standing("r", None, None).unwrap();
    assert_eq!(standing.len(), 5);
    let pass = || {
        let mut seen = Vec::new();
        reader
            .each_standing("r", &standing, |r| {
                seen.push(r.exec.to_owned());
                true
            })
            .unwrap();
        seen
    };
    let first = pass();
    // The run goes on: a new sibling, and sibling 1 recorded again; and
    // another process deletes the run's first pack (`runs rm` would take
    // them all).
    persist(5, 20_000);
    persist(1, 20_001);
    Connection::open(&path)
        .unwrap()
        .execute(
            "DELETE FROM packs WHERE seq = (SELECT min(seq) FROM packs)",
            [],
        )
        .unwrap();
    assert_eq!(
        first,
        (0..5).map(|i| format!("worker#{i}/1")).collect::<Vec<_>>()
    );
    assert_eq!(
        pass(),
        (1..5).map(|i| format!("worker#{i}/1")).collect::<Vec<_>>(),
        "sibling 0's pack gone; nothing stored since"
    );
    // A pass stops when it is told to.
    let mut told = 0;
    reader
        .each_standing("r", &standing, |_| {
            told += 1;
            told < 2
        })
        .unwrap();
    assert_eq!(told, 2);
    assert_eq!(
        reader.executions("r", None, None).unwrap().len(),
        5,
        "read again: sibling 0's pack gone, sibling 5 added"
    );
    writer.finish().unwrap();
}

/// What `runs show` prints may wait on its reader (stdout into `less`)
/// for as long as the reader likes: meanwhile no read may stay open on
/// the store, or a running run's checkpoints could not get past it.
#[test]
fn no_read_stays_open_on_the_store_while_a_pass_waits_on_its_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    // 40 commits, 40 packs: more than a pass reads at once.
    drop(stored_run(&path, 40));
    // And rows of the first schema, of another run.
    let raw = Connection::open(&path).unwrap();
    raw.execute_batch(
        "INSERT INTO runs (key, id, pipeline_id, pipeline_dir, digest, ctx, cap, run_dir, \
         status, started_at) VALUES (99, 'old', 'fanout', '.', 'sha256:00', '{}', 4, '.', \
         'failed', 1);
         INSERT INTO executions (run, exec, stage_id, visit, outcome, verdict, attempts, \
         prompt_tokens, completion_tokens, requests, ended_at, parsed) VALUES \
         (99, 'worker#0/1', 'worker', 1, 'exited', 'ok', 1, 0, 0, 1, 5, '{}'), \
         (99, 'worker#1/1', 'worker', 1, 'exited', 'ok', 1, 0, 0, 1, 4, '{}');",
    )
    .unwrap();
    let reader = Store::open_read_only(&path).unwrap();
    let checkpoint_blocked = || -> i64 {
        // Something in the log to copy back, then a checkpoint that must
        // get past every reader to truncate it.
        raw.execute("UPDATE runs SET reason = 'x' WHERE key = 99", [])
            .unwrap();
        raw.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| r.get(0))
            .unwrap()
    };
    for run in ["r", "old"] {
        let standing = reader.standing(run, None, None).unwrap();
        let mut seen = Vec::new();
        reader
            .each_standing(run, &standing, |r| {
                seen.push((r.exec.to_owned(), checkpoint_blocked()));
                true
            })
            .unwrap();
        assert_eq!(seen.len(), standing.len(), "{run}");
        assert!(
            seen.iter().all(|(_, blocked)| *blocked == 0),
            "{run}: {seen:?}"
        );
    }
    let order: Vec<String> = reader
        .executions("old", None, None)
        .unwrap()
        .into_iter()
        .map(|e| e.stage_execution_id)
        .collect();
    assert_eq!(
        order,
        ["old/worker#1/1", "old/worker#0/1"],
        "rows by end time"
    );
}

/// Stores of schema 2 written before the first schema's table was kept
/// (6011cd6 dropped it) read the same.
/// A resumed run's budget starts at what every stored record used: the
/// results it keeps, a try run again since and a cancelled execution
/// alike, read in the pass that finds the results.
#[test]
fn what_a_run_used_counts_every_record_it_stored() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    let store = stored_run(&path, 0);
    let used = |p: u64, c: u64| Usage {
        prompt_tokens: p,
        completion_tokens: c,
        requests: 1,
    };
    let with = |mut record: ExitRecord, usage: Usage, verdict: Verdict| {
        let Kept::Whole(r) = &mut record.result else {
            unreachable!("exit() makes a whole result")
        };
        let r = std::sync::Arc::make_mut(r);
        r.usage = usage;
        r.verdict = verdict;
        record
    };
    let writer = StoreWriter::start(&path).unwrap();
    let ledger = writer.ledger();
    stored_exit(
        &ledger,
        with(exit("r", 0, json!(0)), used(10, 1), Verdict::Ok),
    );
    // Sibling 1 failed, then ran again (in a later session) and passed.
    stored_exit(
        &ledger,
        with(exit("r", 1, json!(1)), used(20, 2), Verdict::Fail),
    );
    stored_exit(
        &ledger,
        with(exit("r", 1, json!("again")), used(40, 4), Verdict::Ok),
    );
    let now = SystemTime::now();
    ledger.cancelled(CancelRecord {
        run_id: "r".into(),
        stage_execution_id: "r/worker#2/1".into(),
        stage_id: "worker".into(),
        index: Some(2),
        visit: 1,
        reason: "Cancellation/FailFast".into(),
        phase: "Act",
        attempt: 1,
        turn: 1,
        tool_calls: json!([]),
        usage: used(80, 8),
        entered_at: now,
        cancelled_at: now,
    });
    writer.finish().unwrap();

    let (kept, spent) = store.resumable("r").unwrap();
    assert_eq!(kept.len(), 2, "the cancelled execution has no result");
    assert_eq!(*kept["r/worker#1/1"].parsed(), json!("again"));
    assert_eq!(
        spent,
        Usage {
            prompt_tokens: 150,
            completion_tokens: 15,
            requests: 4,
        }
    );
}

#[test]
fn a_store_with_packs_and_no_rows_table_reads_its_packs() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    drop(stored_run(&path, 3));
    Connection::open(&path)
        .unwrap()
        .execute_batch("DROP TABLE executions")
        .unwrap();
    for store in [
        Store::open_read_only(&path).unwrap(),
        Store::open(&path).unwrap(),
    ] {
        assert_eq!(store.counts("r").unwrap().ok, 3);
        assert_eq!(store.kept_results("r").unwrap().len(), 3);
    }
}

#[test]
fn a_damaged_pack_is_refused_with_where_by_every_reader() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    let store = stored_run(&path, 3);
    assert_eq!(store.counts("r").unwrap().ok, 3);
    let raw = Connection::open(&path).unwrap();
    let first: i64 = raw
        .query_row("SELECT min(seq) FROM packs", [], |r| r.get(0))
        .unwrap();

    for (damage, detail) in [
        // Cut short, as a torn write would leave it.
        (
            "UPDATE packs SET body = substr(body, 1, length(body) - 3) WHERE seq = ?1",
            "runs past the pack's end",
        ),
        // Written by a later troupe's format.
        (
            "UPDATE packs SET body = X'09' || substr(body, 2) WHERE seq = ?1",
            "format 9",
        ),
        // Not bytes at all.
        ("UPDATE packs SET body = 7 WHERE seq = ?1", "holds Integer"),
        // Not a pack at all.
        (
            "UPDATE packs SET body = CAST('hello' AS BLOB) WHERE seq = ?1",
            "format 104",
        ),
    ] {
        let before: Vec<u8> = raw
            .query_row("SELECT body FROM packs WHERE seq = ?1", [first], |r| {
                r.get(0)
            })
            .unwrap();
        raw.execute(damage, [first]).unwrap();
        let errors = [
            store.counts("r").unwrap_err(),
            store.executions("r", None, None).unwrap_err(),
            store.kept_results("r").unwrap_err(),
            store.exit_events("r", |_| false).unwrap_err(),
        ];
        for e in errors {
            assert_eq!(code(&e), "Store/Corrupt", "{e}");
            let said = e.to_string();
            assert!(
                said.contains(&format!("pack {first} of run r is damaged at byte")),
                "{said}"
            );
            assert!(said.contains(detail), "{said}");
        }
        raw.execute(
            "UPDATE packs SET body = ?2 WHERE seq = ?1",
            params![first, before],
        )
        .unwrap();
        assert_eq!(store.counts("r").unwrap().ok, 3, "mended");
    }
}

#[test]
fn runs_show_refuses_a_run_whose_pack_is_damaged_and_runs_lists_it_with_why() {
    let project = Project::new();
    let run = |width| project.fanout(width)["runId"].as_str().unwrap().to_owned();
    let damaged = run(3);
    let sound = run(2);
    let shown = project.json(&["runs", "show", &damaged, "--json"]);
    assert_eq!(shown["executions"].as_array().unwrap().len(), 5, "{shown}");

    let db = Connection::open(project.path().join(".troupe/troupe.db")).unwrap();
    db.execute(
        "UPDATE packs SET body = substr(body, 1, length(body) - 1) \
         WHERE run = (SELECT key FROM runs WHERE id = ?1)",
        [&damaged],
    )
    .unwrap();
    let out = project.output(&["runs", "show", &damaged, "--json"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let refusal: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(refusal["code"], "Store/Corrupt", "{refusal}");
    let message = refusal["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("of run {damaged} is damaged at byte")),
        "{refusal}"
    );

    // The list still lists both: the damaged run with why, not counts.
    let listed = project.json(&["runs", "--json"]);
    let runs = listed["runs"].as_array().unwrap();
    let of = |id: &str| runs.iter().find(|r| r["id"] == id).unwrap().clone();
    assert_eq!(of(&damaged)["counts"], Value::Null, "{listed}");
    assert_eq!(of(&damaged)["error"]["code"], "Store/Corrupt", "{listed}");
    assert_eq!(of(&sound)["counts"]["ok"], 4, "{listed}");
    assert!(of(&sound).get("error").is_none(), "{listed}");
    let out = project.output(&["runs"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    let line = table.lines().find(|l| l.starts_with(&damaged)).unwrap();
    assert!(line.ends_with("?"), "{table}");
    let warned = String::from_utf8(out.stderr).unwrap();
    assert!(
        warned.contains(&format!("warning: run {damaged}: Store/Corrupt")),
        "{warned}"
    );
}

/// A reader that stops reading (`runs show … | head`) ends `runs show`
/// as it ends every listing: status 141, as if by SIGPIPE, no panic.
#[test]
fn runs_show_ends_quietly_when_its_reader_goes_away() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let project = Project::new();
    let report = project.fanout(2000);
    let run_id = report["runId"].as_str().unwrap();
    for args in [
        vec!["runs", "show", run_id, "--json"],
        vec!["runs", "show", run_id],
    ] {
        let mut child = project
            .troupe()
            .args(&args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut head = [0u8; 64];
        child.stdout.take().unwrap().read_exact(&mut head).unwrap();
        // The pipe's read end is closed here, far from the output's end.
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            (out.status.code(), out.status.signal()),
            (Some(141), None),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.stderr.is_empty(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}
