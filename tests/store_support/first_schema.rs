//! A store of the first schema (an execution a row), as troupe wrote it
//! before packs: shared by the store's tests.

use std::path::Path;

use rusqlite::{Connection, params};

/// The schema troupe wrote before packs (version 1), as it wrote it.
pub const FIRST_SCHEMA: &str = r#"
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE runs (
    key INTEGER PRIMARY KEY, id TEXT NOT NULL UNIQUE, pipeline_id TEXT NOT NULL,
    pipeline_dir TEXT NOT NULL, digest TEXT NOT NULL, ctx TEXT NOT NULL,
    cap INTEGER NOT NULL, run_dir TEXT NOT NULL, status TEXT NOT NULL, reason TEXT,
    started_at INTEGER NOT NULL, ended_at INTEGER, summary TEXT,
    sessions INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX runs_started ON runs (started_at);
CREATE TABLE executions (
    run INTEGER NOT NULL REFERENCES runs (key) ON DELETE CASCADE,
    exec TEXT NOT NULL, stage_id TEXT NOT NULL, sibling INTEGER, visit INTEGER NOT NULL,
    outcome TEXT NOT NULL, verdict TEXT, reason TEXT, attempts INTEGER NOT NULL,
    cap_hit INTEGER NOT NULL DEFAULT 0, phase TEXT, turn INTEGER, tool_calls TEXT,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL,
    requests INTEGER NOT NULL, entered_at INTEGER, ended_at INTEGER NOT NULL,
    parsed TEXT, output TEXT,
    PRIMARY KEY (run, exec)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('app', 'troupe'), ('schema_version', '1');
INSERT INTO runs (key, id, pipeline_id, pipeline_dir, digest, ctx, cap, run_dir, status,
                  started_at)
    VALUES (1, 'old', 'fanout', 'stages/fanout', 'sha256:00', '{}', 4, '.troupe/runs/old',
            'failed', 1000);
"#;

/// A first-schema store at `path` with run `old` and its executions:
/// two ok, one failed, one cancelled, one whose `parsed` is no JSON and
/// one whose `output` was left empty (parsed stood for it).
pub fn first_schema_store(path: &Path) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let db = Connection::open(path).unwrap();
    db.execute_batch(FIRST_SCHEMA).unwrap();
    let mut insert = db
        .prepare(
            "INSERT INTO executions (run, exec, stage_id, sibling, visit, outcome, verdict, \
             reason, attempts, cap_hit, phase, turn, tool_calls, prompt_tokens, \
             completion_tokens, requests, entered_at, ended_at, parsed, output) \
             VALUES (1, ?1, 'worker', ?2, 1, ?3, ?4, ?5, 1, 0, ?6, ?7, ?8, 10, 2, 1, 1000, \
             ?9, ?10, ?11)",
        )
        .unwrap();
    type Row<'a> = (
        &'a str,
        i64,
        &'a str,
        Option<&'a str>,
        Option<&'a str>,
        Option<&'a str>,
        Option<i64>,
        Option<&'a str>,
        i64,
        Option<&'a str>,
        Option<&'a str>,
    );
    let rows: [Row<'_>; 6] = [
        (
            "worker#0/1",
            0,
            "exited",
            Some("ok"),
            None,
            None,
            None,
            None,
            2000,
            Some(r#"{"v":0}"#),
            Some(r#""said 0""#),
        ),
        (
            "worker#1/1",
            1,
            "exited",
            Some("ok"),
            None,
            None,
            None,
            None,
            2001,
            Some(r#"{"v":1}"#),
            None,
        ),
        (
            "worker#2/1",
            2,
            "exited",
            Some("fail"),
            Some("Test/Failed: no"),
            None,
            None,
            None,
            2002,
            Some("null"),
            None,
        ),
        (
            "worker#3/1",
            3,
            "cancelled",
            None,
            Some("Session/Cancelled: a sibling failed"),
            Some("Execute"),
            Some(2),
            Some(r#"[{"callId":"c","tool":"shell"}]"#),
            2003,
            None,
            None,
        ),
        (
            "worker#4/1",
            4,
            "exited",
            Some("ok"),
            None,
            None,
            None,
            None,
            2004,
            Some("{no json"),
            None,
        ),
        (
            "worker#5/1",
            5,
            "exited",
            Some("skipped"),
            None,
            None,
            None,
            None,
            2005,
            Some("{}"),
            None,
        ),
    ];
    for r in rows {
        insert
            .execute(params![
                r.0, r.1, r.2, r.3, r.4, r.5, r.6, r.7, r.8, r.9, r.10
            ])
            .unwrap();
    }
}
