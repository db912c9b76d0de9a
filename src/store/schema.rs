//! Opening the store file: SQLite in WAL mode (concurrent runs in one
//! project read while one writes, and a committed transaction survives
//! the process being killed), a busy timeout (two troupe processes take
//! turns writing), and the schema, created or migrated to this troupe's
//! version. A file that is not SQLite, a SQLite file of another program
//! and a schema from a newer troupe are refused with typed errors.

use std::path::Path;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags, OptionalExtension};

use super::error::StoreError;

/// The schema version this troupe writes.
pub const SCHEMA_VERSION: i64 = 2;

/// How long a write waits for another process's before `Store/Locked`.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Migrations, in order: `MIGRATIONS[i]` takes schema `i` to `i + 1`.
const MIGRATIONS: [&str; 2] = [V1, V2];

/// Runs, and an execution's end a row.
const V1: &str = r#"
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE runs (
    key          INTEGER PRIMARY KEY,
    id           TEXT NOT NULL UNIQUE,
    pipeline_id  TEXT NOT NULL,
    pipeline_dir TEXT NOT NULL,
    digest       TEXT NOT NULL,
    ctx          TEXT NOT NULL,
    cap          INTEGER NOT NULL,
    run_dir      TEXT NOT NULL,
    status       TEXT NOT NULL,
    reason       TEXT,
    started_at   INTEGER NOT NULL,
    ended_at     INTEGER,
    summary      TEXT,
    sessions     INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX runs_started ON runs (started_at);
CREATE TABLE executions (
    run               INTEGER NOT NULL REFERENCES runs (key) ON DELETE CASCADE,
    exec              TEXT NOT NULL,
    stage_id          TEXT NOT NULL,
    sibling           INTEGER,
    visit             INTEGER NOT NULL,
    outcome           TEXT NOT NULL,
    verdict           TEXT,
    reason            TEXT,
    attempts          INTEGER NOT NULL,
    cap_hit           INTEGER NOT NULL DEFAULT 0,
    phase             TEXT,
    turn              INTEGER,
    tool_calls        TEXT,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    requests          INTEGER NOT NULL,
    entered_at        INTEGER,
    ended_at          INTEGER NOT NULL,
    parsed            TEXT,
    output            TEXT,
    PRIMARY KEY (run, exec)
) WITHOUT ROWID;
"#;

/// Executions' ends in packs (`store/pack.rs`), a row per run and
/// transaction of the writer, in the order written (`seq`). The first
/// schema's `executions` stays as it was: its rows are what stood for
/// each execution written before packs, and readers read them first. So
/// this step moves nothing, cannot fail on an odd old row, and leaves the
/// table to an older troupe still running a run in the same store.
const V2: &str = r#"
CREATE TABLE packs (
    seq  INTEGER PRIMARY KEY,
    run  INTEGER NOT NULL REFERENCES runs (key) ON DELETE CASCADE,
    body BLOB NOT NULL
);
CREATE INDEX packs_run ON packs (run);
"#;

/// Opens (creating when absent) the store at `path` for reading and
/// writing, with the schema at [`SCHEMA_VERSION`].
pub fn open(path: &Path) -> Result<Connection, StoreError> {
    open_waiting(path, BUSY_TIMEOUT)
}

/// [`open`], waiting at most `busy` for another process's write before
/// `Store/Locked` (tests wait less than [`BUSY_TIMEOUT`]).
pub fn open_waiting(path: &Path, busy: Duration) -> Result<Connection, StoreError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| StoreError::Io {
            path: path.to_owned(),
            detail: e.to_string(),
        })?;
    }
    let conn = Connection::open(path).map_err(|e| StoreError::sqlite(path, &e))?;
    conn.busy_timeout(busy)
        .map_err(|e| StoreError::sqlite(path, &e))?;
    // A file that is not a troupe store (or is a newer troupe's) is
    // refused before anything is written to it: WAL mode is a setting
    // kept in the file, which another program may not expect.
    check_version(&conn, path)?;
    configure(&conn, path)?;
    migrate(&conn, path)?;
    Ok(conn)
}

/// Opens an existing store read-only (listing, showing, exporting).
pub fn open_read_only(path: &Path) -> Result<Connection, StoreError> {
    open_if_made(path)?.ok_or_else(|| StoreError::NoStore {
        path: path.to_owned(),
    })
}

/// [`open_read_only`], or `None` when there is no store yet: no file, or
/// one whose first schema another process has not yet committed (SQLite
/// creates the file before the schema's transaction ends, and a reader
/// between the two sees an empty database, not a store without tables).
pub fn open_if_made(path: &Path) -> Result<Option<Connection>, StoreError> {
    if !path.exists() {
        return Ok(None);
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| StoreError::sqlite(path, &e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| StoreError::sqlite(path, &e))?;
    // A store in a folder this user cannot write (another user's project,
    // a read-only mount): SQLite's WAL mode wants its `-shm` file even to
    // read, and refuses. Read as a file no one writes (`immutable`): on a
    // read-only mount that is so; in another user's live project a read
    // may miss (or, rarely, see half of) a commit made meanwhile, which a
    // listing can bear and a refusal could not.
    let conn = match conn.query_row("SELECT count(*) FROM sqlite_master", [], |_| Ok(())) {
        Err(e)
            if matches!(
                e.sqlite_error_code(),
                Some(rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::CannotOpen)
            ) =>
        {
            drop(conn);
            let immutable = Connection::open_with_flags(
                format!("file:{}?immutable=1", uri_path(path)),
                OpenFlags::SQLITE_OPEN_READ_ONLY
                    | OpenFlags::SQLITE_OPEN_NO_MUTEX
                    | OpenFlags::SQLITE_OPEN_URI,
            )
            .map_err(|e| StoreError::sqlite(path, &e))?;
            immutable
                .busy_timeout(BUSY_TIMEOUT)
                .map_err(|e| StoreError::sqlite(path, &e))?;
            immutable
        }
        _ => conn,
    };
    Ok((check_version(&conn, path)? > 0).then_some(conn))
}

/// `path` as a `file:` URI's path: `%`, `?` and `#` (and anything not
/// printable ASCII) percent-encoded.
fn uri_path(path: &Path) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_graphic() && !matches!(b, b'%' | b'?' | b'#') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

fn configure(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e: rusqlite::Error| StoreError::sqlite(path, &e);
    // WAL: readers never block the writer and a commit is one append;
    // NORMAL sync: a committed transaction survives a killed process (it
    // is in the OS's cache), and only a power loss can lose the last
    // commits — whose executions a resumed run then runs again.
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(err)?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(StoreError::Io {
            path: path.to_owned(),
            detail: format!("the file system does not allow WAL mode (got {mode})"),
        });
    }
    conn.execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
        .map_err(err)
}

/// The schema version the file has: 0 for an empty database.
fn version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let err = |e: rusqlite::Error| StoreError::sqlite(path, &e);
    let tables: i64 = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table'",
            [],
            |r| r.get(0),
        )
        .map_err(err)?;
    if tables == 0 {
        return Ok(0);
    }
    let has_meta: bool = conn
        .query_row(
            "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'meta'",
            [],
            |r| r.get::<_, i64>(0),
        )
        .map_err(err)?
        > 0;
    if !has_meta {
        return Err(StoreError::Foreign {
            path: path.to_owned(),
        });
    }
    // Another program's `meta` table, without troupe's columns (or with
    // a value that is not text), is a foreign file too.
    let foreign = || StoreError::Foreign {
        path: path.to_owned(),
    };
    let app: Option<String> = conn
        .query_row("SELECT value FROM meta WHERE key = 'app'", [], |r| r.get(0))
        .optional()
        .map_err(|e| match &e {
            rusqlite::Error::InvalidColumnType(..) => foreign(),
            rusqlite::Error::SqliteFailure(_, Some(msg))
            | rusqlite::Error::SqlInputError { msg, .. }
                if msg.starts_with("no such column") =>
            {
                foreign()
            }
            _ => err(e),
        })?;
    if app.as_deref() != Some("troupe") {
        return Err(StoreError::Foreign {
            path: path.to_owned(),
        });
    }
    let version: Option<String> = conn
        .query_row(
            "SELECT value FROM meta WHERE key = 'schema_version'",
            [],
            |r| r.get(0),
        )
        .optional()
        .map_err(err)?;
    // Tables and troupe's mark with a version below 1 is no store troupe
    // made: read as 0 it passed for one with no schema yet (its runs
    // hidden, then a migration failing on tables already there).
    match version.map(|v| v.parse::<i64>()) {
        Some(Ok(v)) if v >= 1 => Ok(v),
        Some(_) => Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: "its schema version is not a number of 1 or more".to_owned(),
        }),
        None => Err(StoreError::Corrupt {
            path: path.to_owned(),
            detail: "its schema version is missing".to_owned(),
        }),
    }
}

fn check_version(conn: &Connection, path: &Path) -> Result<i64, StoreError> {
    let found = version(conn, path)?;
    if found > SCHEMA_VERSION {
        return Err(StoreError::NewerSchema {
            path: path.to_owned(),
            found,
            supported: SCHEMA_VERSION,
        });
    }
    Ok(found)
}

/// Brings the schema to [`SCHEMA_VERSION`], one migration per step, each
/// in its own transaction (a second process migrating at the same time
/// waits, then finds the work done).
fn migrate(conn: &Connection, path: &Path) -> Result<(), StoreError> {
    let err = |e: rusqlite::Error| StoreError::sqlite(path, &e);
    loop {
        conn.execute_batch("BEGIN IMMEDIATE").map_err(err)?;
        let step = (|| {
            let found = check_version(conn, path)?;
            if found >= SCHEMA_VERSION {
                return Ok(false);
            }
            let migration = MIGRATIONS[usize::try_from(found).unwrap_or(0)];
            conn.execute_batch(migration).map_err(err)?;
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('app', 'troupe')
                 ON CONFLICT (key) DO NOTHING",
                [],
            )
            .map_err(err)?;
            conn.execute(
                "INSERT INTO meta (key, value) VALUES ('schema_version', ?1)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                [(found + 1).to_string()],
            )
            .map_err(err)?;
            Ok(true)
        })();
        match step {
            Ok(more) => {
                conn.execute_batch("COMMIT").map_err(err)?;
                if !more {
                    return Ok(());
                }
            }
            Err(e) => {
                let _ = conn.execute_batch("ROLLBACK");
                return Err(e);
            }
        }
    }
}
