//! The run store through the library: a fresh store gets the schema and
//! reopens; a file that is not SQLite, a SQLite file of another program, a
//! schema from a newer troupe and a database another connection holds are
//! each refused with their typed error and left as they were; the writer
//! commits a burst of exits in a transaction or two and answers every
//! one; an exit never replaces a stored ok result but does replace a
//! failed or cancelled one; runs are found by id or prefix and deleted
//! with their executions.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, mpsc};
use std::time::{Duration, SystemTime};

use rusqlite::Connection;
use serde_json::{Value, json};
use troupe::error::HasCode;
use troupe::runtime::ledger::{CancelRecord, ExitRecord, Ledger, LedgerError};
use troupe::runtime::result::{Kept, StageResult, Usage, Verdict};
use troupe::store::schema::SCHEMA_VERSION;
use troupe::store::{RunRow, Store, StoreError, StoreLedger, StoreWriter, unix_ms};

/// A store path in a fresh temp dir (the file does not exist yet).
fn store_path() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(".troupe/troupe.db");
    (dir, path)
}

/// A store with run `r` begun, its writer started and the writer's ledger.
/// The store stays open while the test runs, so the write-ahead log stays
/// too: the last connection to close would fold it into the database.
fn writing() -> (tempfile::TempDir, PathBuf, Store, StoreWriter, StoreLedger) {
    let (dir, path) = store_path();
    let store = Store::open(&path).unwrap();
    store.begin_run(&run_row("r", 1)).unwrap();
    let writer = StoreWriter::start(&path).unwrap();
    let ledger = writer.ledger();
    (dir, path, store, writer, ledger)
}

/// Another connection holding the store's write lock until it rolls back
/// or is dropped: meanwhile the writer's records queue, and opening waits.
fn hold_lock(path: &Path) -> Connection {
    let holder = Connection::open(path).unwrap();
    holder.execute_batch("BEGIN IMMEDIATE").unwrap();
    holder
}

/// A run's exited executions read whole, through the rows `runs show`
/// reads: what the packed reading (`Store::kept_results`) must agree with.
fn whole_results(store: &Store, run_id: &str) -> Vec<Arc<StageResult>> {
    store
        .executions(run_id, None, None)
        .unwrap()
        .into_iter()
        .filter(|e| e.outcome == "exited")
        .map(|e| {
            let parsed = Arc::new(e.parsed.unwrap_or(Value::Null));
            let output = e.output.map_or_else(|| Arc::clone(&parsed), Arc::new);
            Arc::new(StageResult {
                stage_id: e.stage_id,
                stage_execution_id: e.stage_execution_id,
                verdict: e.verdict.as_deref().map_or(Verdict::Fail, Verdict::parse),
                reason: e.reason,
                parsed,
                output,
                cap_hit: e.cap_hit,
                attempt_count: e.attempts,
                usage: e.usage,
            })
        })
        .collect()
}

fn code(e: &StoreError) -> String {
    e.code().to_string()
}

fn run_row(id: &str, started_at: i64) -> RunRow {
    RunRow {
        id: id.to_owned(),
        pipeline_id: "fanout".to_owned(),
        pipeline_dir: "stages/fanout".to_owned(),
        digest: "sha256:00".to_owned(),
        ctx: json!({"width": 3}),
        cap: 4,
        run_dir: format!(".troupe/runs/{id}"),
        status: "running".to_owned(),
        reason: None,
        started_at,
        ended_at: None,
        summary: None,
        sessions: 1,
    }
}

fn exit(run: &str, index: usize, verdict: Verdict, parsed: Value) -> ExitRecord {
    let exec_id = format!("{run}/worker#{index}/1");
    let result = Arc::new(StageResult {
        stage_id: "worker".to_owned(),
        stage_execution_id: exec_id.clone(),
        verdict,
        reason: (verdict == Verdict::Fail).then(|| "Test/Failed: scripted".to_owned()),
        parsed: Arc::new(parsed.clone()),
        output: Arc::new(parsed),
        cap_hit: false,
        // Counts that differ from sibling to sibling, so a row written
        // with another's columns shows.
        attempt_count: 1 + (index % 3) as u32,
        usage: Usage {
            prompt_tokens: 10 + index as u64,
            completion_tokens: 2 * index as u64,
            requests: 1,
        },
    });
    ExitRecord {
        run_id: run.into(),
        stage_execution_id: exec_id.as_str().into(),
        stage_id: "worker".into(),
        index: Some(index),
        visit: 1,
        // Odd siblings packed, as executions hand them over; even ones
        // whole: the store keeps both the same.
        result: if index % 2 == 1 {
            Kept::packed(result, "worker".into(), exec_id.as_str().into())
        } else {
            Kept::Whole(result)
        },
        entered_at: SystemTime::now(),
        exited_at: SystemTime::now(),
    }
}

fn cancel(run: &str, index: usize) -> CancelRecord {
    CancelRecord {
        run_id: run.into(),
        stage_execution_id: format!("{run}/worker#{index}/1").into(),
        stage_id: "worker".into(),
        index: Some(index),
        visit: 1,
        reason: "Session/Cancelled: the test".into(),
        phase: "Execute",
        attempt: 1,
        turn: 1,
        tool_calls: json!([]),
        usage: Usage::default(),
        entered_at: SystemTime::now(),
        cancelled_at: SystemTime::now(),
    }
}

/// Hands `record` to the ledger; the answer arrives once the writer has
/// committed it (or could not).
fn persist(ledger: &impl Ledger, record: ExitRecord) -> mpsc::Receiver<Result<(), LedgerError>> {
    let (tx, rx) = mpsc::channel();
    ledger.persist(
        record,
        Some(Box::new(move |answer| {
            let _ = tx.send(answer);
        })),
    );
    rx
}

/// The stored execution of sibling `index`: (outcome, verdict, parsed).
fn stored(store: &Store, run: &str, index: u64) -> (String, Option<String>, Option<Value>) {
    let rows = store.executions(run, Some("worker"), Some(index)).unwrap();
    assert_eq!(rows.len(), 1, "one row per execution");
    let row = rows.into_iter().next().unwrap();
    (row.outcome, row.verdict, row.parsed)
}

#[test]
fn a_fresh_store_gets_the_schema_and_reopens_with_its_runs() {
    let (_dir, path) = store_path();
    let store = Store::open(&path).unwrap();
    let run = run_row("run-1", 1_000);
    store.begin_run(&run).unwrap();
    drop(store);

    let raw = Connection::open(&path).unwrap();
    let meta = |key: &str| -> String {
        raw.query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .unwrap()
    };
    assert_eq!(meta("app"), "troupe");
    assert_eq!(meta("schema_version"), SCHEMA_VERSION.to_string());
    let mode: String = raw
        .query_row("PRAGMA journal_mode", [], |r| r.get(0))
        .unwrap();
    assert_eq!(mode, "wal");
    drop(raw);

    // Reopened (migrations find nothing to do), for writing and reading.
    let store = Store::open(&path).unwrap();
    assert_eq!(store.find_run("run-1").unwrap(), run);
    drop(store);
    let store = Store::open_read_only(&path).unwrap();
    let listed = store.list_runs(10).unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].0, run);
}

#[test]
fn a_file_that_is_not_sqlite_is_refused_as_corrupt_and_left_alone() {
    let (dir, _) = store_path();
    let path = dir.path().join("troupe.db");
    let text = "these are my notes, not a database\n".repeat(40);
    std::fs::write(&path, &text).unwrap();
    let e = Store::open(&path).unwrap_err();
    assert_eq!(code(&e), "Store/Corrupt", "{e}");
    assert!(e.to_string().contains("troupe.db"), "{e}");
    let e = Store::open_read_only(&path).unwrap_err();
    assert_eq!(code(&e), "Store/Corrupt", "{e}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), text);
}

#[test]
fn a_sqlite_file_of_another_program_is_refused_as_foreign_and_left_alone() {
    let (dir, _) = store_path();
    for (name, setup) in [
        (
            "notes.db",
            "CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT); INSERT INTO notes (body) VALUES ('x');",
        ),
        // A `meta` table is not enough: it must say it is troupe's.
        (
            "other-meta.db",
            "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT); INSERT INTO meta VALUES ('app', 'other');",
        ),
        // Nor one of other columns, or with a value that is not text.
        (
            "meta-columns.db",
            "CREATE TABLE meta (name TEXT, data BLOB); INSERT INTO meta VALUES ('app', x'00');",
        ),
        (
            "meta-blob.db",
            "CREATE TABLE meta (key TEXT, value BLOB); INSERT INTO meta VALUES ('app', x'00');",
        ),
    ] {
        let path = dir.path().join(name);
        Connection::open(&path)
            .unwrap()
            .execute_batch(setup)
            .unwrap();
        let e = Store::open(&path).unwrap_err();
        assert_eq!(code(&e), "Store/ForeignFile", "{name}: {e}");
        let e = Store::open_read_only(&path).unwrap_err();
        assert_eq!(code(&e), "Store/ForeignFile", "{name}: {e}");
        let raw = Connection::open(&path).unwrap();
        let tables: i64 = raw
            .query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(tables, 1, "{name}: troupe added tables to a foreign file");
        // Nor switched it to troupe's journal mode (a setting kept in the
        // file, which its program may not expect).
        let mode: String = raw
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "delete", "{name}: troupe changed the journal mode");
    }
}

/// A store whose version reads 0, below or not a number, with its tables
/// there, is damaged: not taken for one with no schema yet (which hid its
/// runs, and failed its migration with SQLite's words).
/// A store with one run whose `schema_version` is then set to `version`.
fn store_at_version(version: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let (dir, path) = store_path();
    Store::open(&path)
        .unwrap()
        .begin_run(&run_row("r", 1))
        .unwrap();
    Connection::open(&path)
        .unwrap()
        .execute(
            "UPDATE meta SET value = ?1 WHERE key = 'schema_version'",
            [version],
        )
        .unwrap();
    (dir, path)
}

#[test]
fn a_store_whose_version_is_below_one_is_corrupt() {
    for bad in ["0", "-1", "x"] {
        let (_dir, path) = store_at_version(bad);
        for e in [
            Store::open(&path).unwrap_err(),
            Store::open_read_only(&path).unwrap_err(),
        ] {
            assert_eq!(code(&e), "Store/Corrupt", "{bad}: {e}");
        }
    }
}

#[test]
fn a_store_of_a_newer_schema_is_refused() {
    let (_dir, path) = store_at_version("99");
    for e in [
        Store::open(&path).unwrap_err(),
        Store::open_read_only(&path).unwrap_err(),
    ] {
        assert_eq!(code(&e), "Store/NewerSchema", "{e}");
        assert_eq!(
            e,
            StoreError::NewerSchema {
                path: path.clone(),
                found: 99,
                supported: SCHEMA_VERSION,
            }
        );
    }
}

#[test]
fn a_store_another_connection_is_writing_is_refused_as_locked() {
    let (_dir, path) = store_path();
    drop(Store::open(&path).unwrap());
    let holder = hold_lock(&path);
    // Held for the whole wait: the outcome does not depend on timing.
    let e = Store::open_waiting(&path, Duration::from_millis(50)).unwrap_err();
    assert_eq!(code(&e), "Store/Locked", "{e}");
    // Readers are not blocked by a writer (WAL).
    assert!(
        Store::open_read_only(&path)
            .unwrap()
            .list_runs(1)
            .unwrap()
            .is_empty()
    );
    holder.execute_batch("ROLLBACK").unwrap();
    Store::open_waiting(&path, Duration::from_millis(50)).unwrap();
}

/// Transactions committed into the store's write-ahead log so far: its
/// frames that end a commit, until the first frame of an older log
/// generation (another salt).
fn wal_commits(db: &Path) -> usize {
    let Ok(wal) = std::fs::read(format!("{}-wal", db.display())) else {
        return 0;
    };
    if wal.len() < 32 {
        return 0;
    }
    let word = |b: &[u8]| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    let page = word(&wal[8..12]);
    let salt = &wal[16..24];
    let (mut at, mut commits) = (32, 0);
    while at + 24 + page <= wal.len() {
        let frame = &wal[at..at + 24];
        if &frame[8..16] != salt {
            break;
        }
        if word(&frame[4..8]) != 0 {
            commits += 1;
        }
        at += 24 + page;
    }
    commits
}

#[test]
fn a_burst_of_exits_is_committed_in_one_or_two_transactions() {
    const BURST: usize = 1000;
    let (_dir, path, store, writer, ledger) = writing();
    let before = wal_commits(&path);
    assert!(before > 0, "the schema and the run are in the log");

    // The test holds the write lock while the burst is handed over: the
    // writer takes at most the first record alone before it waits; all
    // the others are queued by the time it can commit, and go in one
    // more transaction.
    let holder = hold_lock(&path);
    let answers: Vec<_> = (0..BURST)
        .map(|i| persist(&ledger, exit("r", i, Verdict::Ok, json!({ "item": i }))))
        .collect();
    holder.execute_batch("ROLLBACK").unwrap();
    for (i, answer) in answers.iter().enumerate() {
        assert_eq!(answer.recv().unwrap(), Ok(()), "worker#{i}");
    }
    let commits = wal_commits(&path) - before;
    assert!(
        (1..=2).contains(&commits),
        "{BURST} exits took {commits} transactions"
    );

    let rows = store.executions("r", Some("worker"), None).unwrap();
    assert_eq!(rows.len(), BURST);
    assert!(rows.iter().all(|r| r.outcome == "exited"));
    // Rows share statements (several to one); each keeps its own columns.
    for row in &rows {
        let i = row.index.expect("a sibling");
        assert_eq!(row.stage_execution_id, format!("r/worker#{i}/1"));
        assert_eq!(row.stage_id, "worker");
        assert_eq!(row.attempts, 1 + (i % 3) as u32, "worker#{i}");
        assert_eq!(
            (row.usage.prompt_tokens, row.usage.completion_tokens),
            (10 + i, 2 * i),
            "worker#{i}"
        );
    }
    assert_eq!(store.counts("r").unwrap().ok, BURST as u64);
    assert_eq!(
        stored(&store, "r", 417).2,
        Some(json!({ "item": 417 })),
        "a result is stored as given"
    );
    assert_eq!(writer.finish(), Ok(BURST as u64));
}

/// A run deleted while its writer runs (`troupe runs delete` in another
/// process): its later records are refused, not stored as rows of no run,
/// and a run begun since (which gets the freed key) gets none of them.
#[test]
fn records_of_a_run_deleted_while_it_runs_are_refused_not_stored_under_another() {
    let (_dir, path, store, writer, ledger) = writing();
    let first = persist(&ledger, exit("r", 0, Verdict::Ok, json!({})));
    assert_eq!(first.recv().unwrap(), Ok(()));
    store.delete_run("r").unwrap();
    store.begin_run(&run_row("s", 2)).unwrap();
    let late = persist(&ledger, exit("r", 1, Verdict::Ok, json!({})));
    let refused = late.recv().unwrap().unwrap_err();
    assert!(refused.0.contains("no longer in the store"), "{refused:?}");
    ledger.cancelled(cancel("r", 2));
    assert!(writer.finish().is_err(), "the writer ends with the refusal");
    assert!(
        store.executions("s", None, None).unwrap().is_empty(),
        "the new run got the deleted one's records"
    );
    let rows: i64 = Connection::open(&path)
        .unwrap()
        .query_row("SELECT count(*) FROM packs", [], |r| r.get(0))
        .unwrap();
    assert_eq!(rows, 0, "packs of a deleted run");
}

#[test]
fn a_long_write_ahead_log_is_checkpointed_while_the_store_stays_open() {
    const EXITS: usize = 2000;
    let (_dir, path, store, writer, ledger) = writing();
    let before = std::fs::metadata(&path).unwrap().len();
    // 2 000 results of 4 KB: about 2 000 WAL pages, twice the point past
    // which the writer's hook asks for a checkpoint.
    let text = "x".repeat(4096);
    let answers: Vec<_> = (0..EXITS)
        .map(|i| {
            persist(
                &ledger,
                exit("r", i, Verdict::Ok, json!({ "text": text, "i": i })),
            )
        })
        .collect();
    for answer in &answers {
        assert_eq!(answer.recv().unwrap(), Ok(()));
    }
    assert_eq!(writer.finish(), Ok(EXITS as u64));
    let after = std::fs::metadata(&path).unwrap().len();
    assert!(
        after > before + 4 * 1024 * 1024,
        "the database grew from {before} to {after} bytes: the log was not checkpointed"
    );
    assert_eq!(store.counts("r").unwrap().ok, EXITS as u64);
}

#[test]
fn an_answer_that_panics_leaves_no_other_execution_unanswered() {
    let (_dir, path, _store, writer, ledger) = writing();
    // Queued while the writer waits for the lock `holder` takes: in one
    // batch or two, the panicking answer costs the other nothing (within
    // one batch: `answer_all`'s unit test).
    let holder = hold_lock(&path);
    ledger.persist(
        exit("r", 0, Verdict::Ok, json!({})),
        Some(Box::new(|_| panic!("an answer with a bug"))),
    );
    let second = persist(&ledger, exit("r", 1, Verdict::Ok, json!({})));
    holder.execute_batch("ROLLBACK").unwrap();
    assert_eq!(second.recv().unwrap(), Ok(()));
    // Later batches are answered too.
    let third = persist(&ledger, exit("r", 2, Verdict::Ok, json!({})));
    assert_eq!(third.recv().unwrap(), Ok(()));
    assert_eq!(writer.finish(), Ok(3));
}

#[test]
fn an_exit_never_replaces_a_stored_ok_result_but_replaces_a_failed_or_cancelled_one() {
    let (_dir, _path, store, writer, ledger) = writing();
    let persist = |index, verdict, parsed| {
        persist(&ledger, exit("r", index, verdict, parsed))
            .recv()
            .unwrap()
            .unwrap();
    };

    // Sibling 0 exited ok; a later exit of the same execution (a replay)
    // and a later cancellation leave its result as it was.
    persist(0, Verdict::Ok, json!({"v": "first"}));
    persist(0, Verdict::Ok, json!({"v": "second"}));
    ledger.cancelled(cancel("r", 0));
    // Sibling 1 failed, then (resumed, the cause fixed) exited ok.
    persist(1, Verdict::Fail, json!(null));
    persist(1, Verdict::Ok, json!({"v": "fixed"}));
    // Sibling 2 was cancelled, then ran to its exit.
    ledger.cancelled(cancel("r", 2));
    persist(2, Verdict::Ok, json!({"v": "rerun"}));
    // Sibling 3 was only cancelled. The writer keeps the order records
    // arrive in, so once a later exit is stored the cancellation is too.
    ledger.cancelled(cancel("r", 3));
    persist(4, Verdict::Ok, json!({"v": "flush"}));

    let ok = |v: &str| {
        (
            "exited".to_owned(),
            Some("ok".to_owned()),
            Some(json!({ "v": v })),
        )
    };
    assert_eq!(stored(&store, "r", 0), ok("first"));
    assert_eq!(stored(&store, "r", 1), ok("fixed"));
    assert_eq!(stored(&store, "r", 2), ok("rerun"));
    assert_eq!(stored(&store, "r", 3), ("cancelled".to_owned(), None, None));

    // What a resume restores: the exited ones, with their results.
    let results = store.kept_results("r").unwrap();
    let first = &results["r/worker#0/1"];
    assert_eq!(*first.parsed(), json!({"v": "first"}));
    assert_eq!(first.verdict(), Verdict::Ok);
    assert_eq!(first.usage().prompt_tokens, 10);
    assert_eq!(results.len(), 4, "sibling 3 has no result");
    writer.finish().unwrap();
}

#[test]
fn the_same_rules_hold_for_records_written_in_one_transaction() {
    let (_dir, path, store, writer, ledger) = writing();
    // Queued while the lock is held, so records share transactions (how
    // they are split is the writer's); each is applied in the order it
    // came, as if alone.
    let holder = hold_lock(&path);
    let mut answers = vec![persist(&ledger, exit("r", 99, Verdict::Ok, json!({})))];
    for (index, verdict, v) in [
        (0, Verdict::Ok, "first"),
        (0, Verdict::Ok, "second"),
        (1, Verdict::Fail, "failed"),
        (1, Verdict::Ok, "fixed"),
    ] {
        answers.push(persist(
            &ledger,
            exit("r", index, verdict, json!({ "v": v })),
        ));
    }
    for index in 10..50 {
        answers.push(persist(
            &ledger,
            exit("r", index, Verdict::Ok, json!({ "v": index })),
        ));
    }
    ledger.cancelled(cancel("r", 0));
    ledger.cancelled(cancel("r", 3));
    answers.push(persist(
        &ledger,
        exit("r", 4, Verdict::Ok, json!({ "v": "last" })),
    ));
    holder.execute_batch("ROLLBACK").unwrap();
    for answer in &answers {
        assert_eq!(answer.recv().unwrap(), Ok(()));
    }
    let ok = |v: Value| {
        (
            "exited".to_owned(),
            Some("ok".to_owned()),
            Some(json!({ "v": v })),
        )
    };
    assert_eq!(stored(&store, "r", 0), ok(json!("first")));
    assert_eq!(stored(&store, "r", 1), ok(json!("fixed")));
    assert_eq!(stored(&store, "r", 3), ("cancelled".to_owned(), None, None));
    assert_eq!(stored(&store, "r", 4), ok(json!("last")));
    for index in 10..50u64 {
        assert_eq!(stored(&store, "r", index), ok(json!(index)));
    }
    assert_eq!(store.counts("r").unwrap().ok, 44);
    assert_eq!(writer.finish(), Ok(48));
}

#[test]
fn runs_are_found_by_id_or_prefix_and_deleted_with_their_executions() {
    let (_dir, path) = store_path();
    let store = Store::open(&path).unwrap();
    let now = unix_ms(SystemTime::now());
    store.begin_run(&run_row("abc-1", now - 60_000)).unwrap();
    store.begin_run(&run_row("abc-2", now)).unwrap();
    let writer = StoreWriter::start(&path).unwrap();
    for run in ["abc-1", "abc-2"] {
        persist(&writer.ledger(), exit(run, 0, Verdict::Ok, json!(1)))
            .recv()
            .unwrap()
            .unwrap();
    }
    writer.finish().unwrap();

    assert_eq!(store.find_run("abc-2").unwrap().id, "abc-2");
    assert_eq!(store.find_run("abc-1").unwrap().id, "abc-1");
    assert_eq!(
        code(&store.find_run("abc").unwrap_err()),
        "Store/AmbiguousRun"
    );
    assert_eq!(
        code(&store.find_run("zzz").unwrap_err()),
        "Store/RunNotFound"
    );

    let old: Vec<String> = store
        .runs_started_before(now - 1_000)
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(old, ["abc-1"]);

    store.delete_run("abc-1").unwrap();
    assert_eq!(
        code(&store.find_run("abc-1").unwrap_err()),
        "Store/RunNotFound"
    );
    assert!(store.executions("abc-1", None, None).unwrap().is_empty());
    assert_eq!(store.find_run("abc").unwrap().id, "abc-2");
    assert_eq!(store.executions("abc-2", None, None).unwrap().len(), 1);
    // The deleted run's executions are gone from the file, not hidden.
    let left: Vec<String> = Connection::open(&path)
        .unwrap()
        .prepare("SELECT runs.id FROM packs JOIN runs ON runs.key = packs.run")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(left, ["abc-2"], "the one pack left is the other run's");
}

#[test]
fn a_resume_reads_stored_results_packed_and_only_the_exits_its_log_lacks() {
    let (_dir, _path, store, writer, ledger) = writing();
    for i in 0..6 {
        let verdict = if i == 4 { Verdict::Fail } else { Verdict::Ok };
        let parsed = json!({ "item": i, "x": [0.9146155235219107, -0.0, "é\u{2028}"] });
        assert_eq!(
            persist(&ledger, exit("r", i, verdict, parsed))
                .recv()
                .unwrap(),
            Ok(())
        );
    }
    ledger.cancelled(cancel("r", 6));
    assert_eq!(writer.finish(), Ok(7));

    let kept = store.kept_results("r").unwrap();
    let whole = whole_results(&store, "r");
    assert_eq!(kept.len(), 6, "every exited execution, the failed one too");
    assert_eq!(whole.len(), kept.len());
    for result in &whole {
        let k = &kept[result.stage_execution_id.as_str()];
        assert!(matches!(k, Kept::Packed(_)));
        assert_eq!(*k.result(), **result, "{}", result.stage_execution_id);
    }
    // Packed by its execution, sibling 1's output (the same as its
    // parsed value) was stored once, and is read back shared.
    let one = kept["r/worker#1/1"].result();
    assert!(
        Arc::ptr_eq(&one.parsed, &one.output),
        "an output that is parsed is read back as parsed"
    );

    let in_log = ["r/worker#0/1", "r/worker#3/1", "r/worker#5/1"];
    let lost = store.exit_events("r", |id| in_log.contains(&id)).unwrap();
    let ids: Vec<&str> = lost.iter().map(|l| l.id.as_str()).collect();
    // Exited and standing, not in the log: the failed one (#4) is run
    // again, and its old exit must not close the entry a later session
    // may have left open.
    assert_eq!(ids.len(), 2, "exited, not in the log: {ids:?}");
    for id in ["r/worker#1/1", "r/worker#2/1"] {
        assert!(ids.contains(&id), "{id} in {ids:?}");
    }
    for l in &lost {
        let events: Vec<&str> = l
            .lines
            .iter()
            .map(|v| v["event"].as_str().unwrap())
            .collect();
        assert_eq!(events, ["StageEntered", "StageExited"]);
    }
}
