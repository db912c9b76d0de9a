//! The store and its runs: a run begins, resumes and ends; runs are
//! listed, found by id (or an unambiguous prefix) and deleted. A run's
//! executions are read in `records.rs`, and written by the store's writer
//! (`writer.rs`), in batches.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::error::StoreError;
use super::pack::unix_ms;
use super::rows::{Counts, RunRow};
use super::schema;

/// A listed run's counts, or why they cannot be read.
pub type Listed = Result<Counts, StoreError>;

/// The project's run store.
#[derive(Debug)]
pub struct Store {
    pub(super) conn: Connection,
    pub(super) path: PathBuf,
    /// Which of `executions` (the first schema's rows) and `packs` the
    /// file has: a store of the first schema, opened to be read, has only
    /// rows.
    pub(super) tables: Tables,
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Tables {
    pub(super) rows: bool,
    pub(super) packs: bool,
}

impl Tables {
    fn of(conn: &Connection, path: &Path) -> Result<Tables, StoreError> {
        let has = |name: &str| -> Result<bool, StoreError> {
            conn.query_row(
                "SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = ?1",
                [name],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n > 0)
            .map_err(|e| StoreError::sqlite(path, &e))
        };
        Ok(Tables {
            rows: has("executions")?,
            packs: has("packs")?,
        })
    }
}

const RUN_COLUMNS: &str = "id, pipeline_id, pipeline_dir, digest, ctx, cap, run_dir, status, \
                           reason, started_at, ended_at, summary, sessions";

/// The run's key in `packs`, from its id.
pub(super) const RUN_KEY: &str = "(SELECT key FROM runs WHERE id = ?1)";

fn json_column(text: Option<String>) -> Option<Value> {
    text.and_then(|t| serde_json::from_str(&t).ok())
}

fn run_row(r: &Row<'_>) -> rusqlite::Result<RunRow> {
    Ok(RunRow {
        id: r.get(0)?,
        pipeline_id: r.get(1)?,
        pipeline_dir: r.get(2)?,
        digest: r.get(3)?,
        ctx: json_column(r.get(4)?).unwrap_or(Value::Null),
        cap: r.get::<_, i64>(5)?.max(0) as u64,
        run_dir: r.get(6)?,
        status: r.get(7)?,
        reason: r.get(8)?,
        started_at: r.get(9)?,
        ended_at: r.get(10)?,
        summary: json_column(r.get(11)?),
        sessions: r.get::<_, i64>(12)?.max(0) as u64,
    })
}

impl Store {
    /// Opens (creating when absent) the store for reading and writing.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Store::from(schema::open(path)?, path)
    }

    /// [`Store::open`], waiting at most `busy` for another process's
    /// write before `Store/Locked`.
    pub fn open_waiting(path: &Path, busy: std::time::Duration) -> Result<Store, StoreError> {
        Store::from(schema::open_waiting(path, busy)?, path)
    }

    /// Opens an existing store for reading only.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        Store::from(schema::open_read_only(path)?, path)
    }

    /// Opens a store for reading only, or `None` when there is none yet
    /// (no file, or one still being created by another process).
    pub fn open_if_made(path: &Path) -> Result<Option<Store>, StoreError> {
        schema::open_if_made(path)?
            .map(|conn| Store::from(conn, path))
            .transpose()
    }

    fn from(conn: Connection, path: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            tables: Tables::of(&conn, path)?,
            conn,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(super) fn err(&self, e: &rusqlite::Error) -> StoreError {
        StoreError::sqlite(&self.path, e)
    }

    /// Records a new run, `running`.
    pub fn begin_run(&self, run: &RunRow) -> Result<(), StoreError> {
        self.conn
            .execute(
                &format!(
                    "INSERT INTO runs ({RUN_COLUMNS}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)"
                ),
                params![
                    run.id,
                    run.pipeline_id,
                    run.pipeline_dir,
                    run.digest,
                    run.ctx.to_string(),
                    i64::try_from(run.cap).unwrap_or(i64::MAX),
                    run.run_dir,
                    "running",
                    Option::<String>::None,
                    run.started_at,
                    Option::<i64>::None,
                    Option::<String>::None,
                    1,
                ],
            )
            .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Marks a run `running` again for a new session (a resume).
    pub fn resume_run(&self, id: &str, digest: &str) -> Result<(), StoreError> {
        let changed = self
            .conn
            .execute(
                "UPDATE runs SET status = 'running', reason = NULL, ended_at = NULL, \
                 digest = ?2, sessions = sessions + 1 WHERE id = ?1",
                params![id, digest],
            )
            .map_err(|e| self.err(&e))?;
        self.changed_one(changed, id)
    }

    /// An update of run `id` that changed no row: the run is gone (a
    /// `runs rm` meanwhile), said rather than taken as done.
    fn changed_one(&self, changed: usize, id: &str) -> Result<(), StoreError> {
        if changed == 1 {
            Ok(())
        } else {
            Err(StoreError::RunNotFound {
                id: id.to_owned(),
                path: self.path.clone(),
            })
        }
    }

    /// Records how a session of the run ended.
    pub fn end_run(
        &self,
        id: &str,
        status: &str,
        reason: Option<&str>,
        summary: &Value,
    ) -> Result<(), StoreError> {
        let changed = self
            .conn
            .execute(
                "UPDATE runs SET status = ?2, reason = ?3, ended_at = ?4, summary = ?5 WHERE id = ?1",
                params![
                    id,
                    status,
                    reason,
                    unix_ms(SystemTime::now()),
                    summary.to_string()
                ],
            )
            .map_err(|e| self.err(&e))?;
        self.changed_one(changed, id)
    }

    /// The run with this id, or with the one id that starts with it.
    pub fn find_run(&self, id: &str) -> Result<RunRow, StoreError> {
        // An empty prefix would match every run.
        if id.is_empty() {
            return Err(StoreError::RunNotFound {
                id: String::new(),
                path: self.path.clone(),
            });
        }
        let exact = self
            .conn
            .query_row(
                &format!("SELECT {RUN_COLUMNS} FROM runs WHERE id = ?1"),
                [id],
                run_row,
            )
            .optional()
            .map_err(|e| self.err(&e))?;
        if let Some(run) = exact {
            return Ok(run);
        }
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE substr(id, 1, length(?1)) = ?1 LIMIT 6"
            ))
            .map_err(|e| self.err(&e))?;
        let matches: Vec<RunRow> = stmt
            .query_map([id], run_row)
            .map_err(|e| self.err(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(&e))?;
        match matches.len() {
            1 => Ok(matches.into_iter().next().expect("one match")),
            0 => Err(StoreError::RunNotFound {
                id: id.to_owned(),
                path: self.path.clone(),
            }),
            // Six are read: five are named, and a sixth says there are
            // more.
            n => Err(StoreError::AmbiguousRun {
                prefix: id.to_owned(),
                matches: {
                    let mut named = matches
                        .iter()
                        .take(5)
                        .map(|r| r.id.as_str())
                        .collect::<Vec<_>>()
                        .join(", ");
                    if n > 5 {
                        named.push_str(", and more");
                    }
                    named
                },
            }),
        }
    }

    /// The newest runs first, at most `limit`.
    pub fn runs(&self, limit: usize) -> Result<Vec<RunRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, id DESC LIMIT ?1"
            ))
            .map_err(|e| self.err(&e))?;
        stmt.query_map([i64::try_from(limit).unwrap_or(i64::MAX)], run_row)
            .map_err(|e| self.err(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(&e))
    }

    /// The newest runs first, at most `limit`, with their counts: reading
    /// them means reading each run's records, so a run whose records
    /// cannot be read (a damaged pack) is listed with why.
    pub fn list_runs(&self, limit: usize) -> Result<Vec<(RunRow, Listed)>, StoreError> {
        Ok(self
            .runs(limit)?
            .into_iter()
            .map(|run| {
                let counts = self.counts(&run.id);
                (run, counts)
            })
            .collect())
    }

    /// Deletes a run and its executions (its folder is the caller's).
    pub fn delete_run(&self, id: &str) -> Result<(), StoreError> {
        self.conn
            .execute("DELETE FROM runs WHERE id = ?1", [id])
            .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Runs that started before `before_ms` (Unix milliseconds).
    pub fn runs_started_before(&self, before_ms: i64) -> Result<Vec<RunRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs WHERE started_at < ?1 ORDER BY started_at"
            ))
            .map_err(|e| self.err(&e))?;
        let rows = stmt
            .query_map([before_ms], run_row)
            .map_err(|e| self.err(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(&e))?;
        Ok(rows)
    }
}
