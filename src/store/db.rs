//! The store's reads and its run-level writes: a run begins, resumes and
//! ends; runs are listed, found by id (or an unambiguous prefix), shown
//! with their executions and results, and deleted. Executions' ends are
//! written by the store's writer (`writer`), in batches.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use rusqlite::{Connection, OptionalExtension, Row, params};
use serde_json::Value;

use super::error::StoreError;
use super::repair::LostExit;
use super::rows::{Counts, ExecRow, RunRow};
use super::schema;
use crate::provider::Usage;
use crate::runtime::result::{Kept, Verdict};

/// Unix milliseconds of `t`.
pub fn unix_ms(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// The project's run store.
#[derive(Debug)]
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

const RUN_COLUMNS: &str = "id, pipeline_id, pipeline_dir, digest, ctx, cap, run_dir, status, \
                           reason, started_at, ended_at, summary, sessions";

const EXEC_COLUMNS: &str = "exec, stage_id, sibling, visit, outcome, verdict, reason, \
                            attempts, cap_hit, phase, turn, tool_calls, prompt_tokens, \
                            completion_tokens, requests, entered_at, ended_at, parsed, output";

/// The run's key in `executions`, from its id.
const RUN_KEY: &str = "(SELECT key FROM runs WHERE id = ?1)";

/// An execution's key within its run: its `stageExecutionId` without the
/// leading `<workflowRunId>/`, which every row of the run would repeat.
pub fn exec_key<'a>(run_id: &str, stage_execution_id: &'a str) -> &'a str {
    stage_execution_id
        .strip_prefix(run_id)
        .and_then(|rest| rest.strip_prefix('/'))
        .unwrap_or(stage_execution_id)
}

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

/// A count column: a negative one reads as 0.
fn count(r: &Row<'_>, i: usize) -> rusqlite::Result<u64> {
    Ok(r.get::<_, i64>(i)?.max(0) as u64)
}

/// A visit or attempt column, clamped into `u32`.
fn small(r: &Row<'_>, i: usize) -> rusqlite::Result<u32> {
    Ok(r.get::<_, i64>(i)?.clamp(0, i64::from(u32::MAX)) as u32)
}

/// The three usage columns, from `first` on.
fn usage(r: &Row<'_>, first: usize) -> rusqlite::Result<Usage> {
    Ok(Usage {
        prompt_tokens: count(r, first)?,
        completion_tokens: count(r, first + 1)?,
        requests: count(r, first + 2)?,
    })
}

fn exec_row(run_id: &str, r: &Row<'_>) -> rusqlite::Result<ExecRow> {
    Ok(ExecRow {
        stage_execution_id: format!("{run_id}/{}", r.get::<_, String>(0)?),
        stage_id: r.get(1)?,
        index: r.get::<_, Option<i64>>(2)?.map(|i| i.max(0) as u64),
        visit: small(r, 3)?,
        outcome: r.get(4)?,
        verdict: r.get(5)?,
        reason: r.get(6)?,
        attempts: small(r, 7)?,
        cap_hit: r.get::<_, i64>(8)? != 0,
        phase: r.get(9)?,
        turn: r
            .get::<_, Option<i64>>(10)?
            .map(|t| t.clamp(0, i64::from(u32::MAX)) as u32),
        tool_calls: json_column(r.get(11)?),
        usage: usage(r, 12)?,
        entered_at: r.get(15)?,
        ended_at: r.get(16)?,
        parsed: json_column(r.get(17)?),
        output: json_column(r.get(18)?),
    })
}

impl Store {
    /// Opens (creating when absent) the store for reading and writing.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            conn: schema::open(path)?,
            path: path.to_owned(),
        })
    }

    /// [`Store::open`], waiting at most `busy` for another process's
    /// write before `Store/Locked`.
    pub fn open_waiting(path: &Path, busy: std::time::Duration) -> Result<Store, StoreError> {
        Ok(Store {
            conn: schema::open_waiting(path, busy)?,
            path: path.to_owned(),
        })
    }

    /// Opens an existing store for reading only.
    pub fn open_read_only(path: &Path) -> Result<Store, StoreError> {
        Ok(Store {
            conn: schema::open_read_only(path)?,
            path: path.to_owned(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn err(&self, e: &rusqlite::Error) -> StoreError {
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
        self.conn
            .execute(
                "UPDATE runs SET status = 'running', reason = NULL, ended_at = NULL, \
                 digest = ?2, sessions = sessions + 1 WHERE id = ?1",
                params![id, digest],
            )
            .map_err(|e| self.err(&e))?;
        Ok(())
    }

    /// Records how a session of the run ended.
    pub fn end_run(
        &self,
        id: &str,
        status: &str,
        reason: Option<&str>,
        summary: &Value,
    ) -> Result<(), StoreError> {
        self.conn
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
        Ok(())
    }

    /// The run with this id, or with the one id that starts with it.
    pub fn find_run(&self, id: &str) -> Result<RunRow, StoreError> {
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
            _ => Err(StoreError::AmbiguousRun {
                prefix: id.to_owned(),
                matches: matches
                    .iter()
                    .map(|r| r.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            }),
        }
    }

    /// The newest runs first, at most `limit`, with their counts.
    pub fn list_runs(&self, limit: usize) -> Result<Vec<(RunRow, Counts)>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {RUN_COLUMNS} FROM runs ORDER BY started_at DESC, id DESC LIMIT ?1"
            ))
            .map_err(|e| self.err(&e))?;
        let runs: Vec<RunRow> = stmt
            .query_map([i64::try_from(limit).unwrap_or(i64::MAX)], run_row)
            .map_err(|e| self.err(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(&e))?;
        runs.into_iter()
            .map(|run| {
                let counts = self.counts(&run.id)?;
                Ok((run, counts))
            })
            .collect()
    }

    /// Executions of a run by outcome.
    pub fn counts(&self, run_id: &str) -> Result<Counts, StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT outcome, verdict, count(*) FROM executions WHERE run = \
                 (SELECT key FROM runs WHERE id = ?1) GROUP BY outcome, verdict",
            )
            .map_err(|e| self.err(&e))?;
        let mut counts = Counts::default();
        let rows = stmt
            .query_map([run_id], |r| {
                Ok((
                    r.get::<_, String>(0)?,
                    r.get::<_, Option<String>>(1)?,
                    r.get::<_, i64>(2)?.max(0) as u64,
                ))
            })
            .map_err(|e| self.err(&e))?;
        for row in rows {
            let (outcome, verdict, n) = row.map_err(|e| self.err(&e))?;
            match (outcome.as_str(), verdict.as_deref()) {
                ("exited", Some("ok")) => counts.ok += n,
                ("exited", Some("skipped")) => counts.skipped += n,
                ("exited", _) => counts.failed += n,
                _ => counts.cancelled += n,
            }
        }
        Ok(counts)
    }

    /// A run's executions in the order they ended; only those of `stage`
    /// (and sibling `index`) when given.
    pub fn executions(
        &self,
        run_id: &str,
        stage: Option<&str>,
        index: Option<u64>,
    ) -> Result<Vec<ExecRow>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {EXEC_COLUMNS} FROM executions WHERE run = {RUN_KEY} \
                 AND (?2 IS NULL OR stage_id = ?2) AND (?3 IS NULL OR sibling = ?3) \
                 ORDER BY ended_at, exec"
            ))
            .map_err(|e| self.err(&e))?;
        let index = index.map(|i| i64::try_from(i).unwrap_or(i64::MAX));
        let rows = stmt
            .query_map(params![run_id, stage, index], |r| exec_row(run_id, r))
            .map_err(|e| self.err(&e))?
            .collect::<Result<_, _>>()
            .map_err(|e| self.err(&e))?;
        Ok(rows)
    }

    /// The results of a run's exited executions by `stageExecutionId`,
    /// for a resumed run (which runs the failed ones again): read a row at
    /// a time and kept packed as they were stored (`Kept::stored`), so a
    /// run with a million stored results resumes in the memory its
    /// results take packed, not as parsed values.
    pub fn kept_results(&self, run_id: &str) -> Result<HashMap<String, Kept>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT exec, stage_id, verdict, reason, attempts, cap_hit, prompt_tokens, \
                 completion_tokens, requests, parsed, output FROM executions \
                 WHERE run = {RUN_KEY} AND outcome = 'exited'"
            ))
            .map_err(|e| self.err(&e))?;
        let mut rows = stmt.query(params![run_id]).map_err(|e| self.err(&e))?;
        // One name per stage, shared by its executions' results.
        let mut stages: HashMap<String, Arc<str>> = HashMap::new();
        let mut kept = HashMap::new();
        while let Some(r) = rows.next().map_err(|e| self.err(&e))? {
            let mut row = || -> rusqlite::Result<(String, Kept)> {
                let id = format!("{run_id}/{}", r.get_ref(0)?.as_str()?);
                let stage = r.get_ref(1)?.as_str()?;
                let stage = match stages.get(stage) {
                    Some(s) => Arc::clone(s),
                    None => {
                        let s: Arc<str> = stage.into();
                        stages.insert(stage.to_owned(), Arc::clone(&s));
                        s
                    }
                };
                let verdict = r
                    .get::<_, Option<String>>(2)?
                    .as_deref()
                    .map_or(Verdict::Fail, Verdict::parse);
                let result = Kept::stored(
                    stage,
                    id.as_str().into(),
                    verdict,
                    r.get(3)?,
                    r.get::<_, i64>(5)? != 0,
                    small(r, 4)?,
                    usage(r, 6)?,
                    (r.get(9)?, r.get(10)?),
                );
                Ok((id, result))
            };
            let (id, result) = row().map_err(|e| self.err(&e))?;
            kept.insert(id, result);
        }
        Ok(kept)
    }

    /// Each of a run's exited executions whose `StageExited` the audit
    /// log lacks (`in_log` says which it has) as the log records it — a
    /// `StageEntered` and its `StageExited`, both marked `recovered` — for
    /// the log's repair. Rows the log has are skipped before they are
    /// read whole.
    pub fn exit_events(
        &self,
        run_id: &str,
        in_log: impl Fn(&str) -> bool,
    ) -> Result<Vec<LostExit>, StoreError> {
        let mut stmt = self
            .conn
            .prepare(&format!(
                "SELECT {EXEC_COLUMNS} FROM executions WHERE run = {RUN_KEY} \
                 AND outcome = 'exited' ORDER BY ended_at, exec"
            ))
            .map_err(|e| self.err(&e))?;
        let mut rows = stmt.query(params![run_id]).map_err(|e| self.err(&e))?;
        let mut lost = Vec::new();
        while let Some(r) = rows.next().map_err(|e| self.err(&e))? {
            let exec = r
                .get_ref(0)
                .and_then(|v| Ok(v.as_str()?))
                .map_err(|e| self.err(&e))?;
            if in_log(&format!("{run_id}/{exec}")) {
                continue;
            }
            let e = exec_row(run_id, r).map_err(|e| self.err(&e))?;
            lost.push(LostExit {
                lines: vec![entered_line(run_id, &e), exit_line(run_id, &e)],
                id: e.stage_execution_id,
            });
        }
        Ok(lost)
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

/// The `StageEntered` record of a stored execution, in the audit log's key
/// order.
fn entered_line(run_id: &str, e: &ExecRow) -> Value {
    let mut line = serde_json::Map::new();
    line.insert("seq".into(), 0.into());
    let at_ms = e.entered_at.unwrap_or(e.ended_at);
    let at = UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(at_ms).unwrap_or(0));
    line.insert("ts".into(), crate::runtime::events::rfc3339(at).into());
    line.insert("event".into(), "StageEntered".into());
    line.insert("workflowRunId".into(), run_id.into());
    line.insert(
        "stageExecutionId".into(),
        e.stage_execution_id.clone().into(),
    );
    line.insert("stageId".into(), e.stage_id.clone().into());
    line.insert("visit".into(), e.visit.into());
    if let Some(i) = e.index {
        line.insert("index".into(), i.into());
    }
    line.insert("recovered".into(), true.into());
    Value::Object(line)
}

/// The `StageExited` record of an exited execution, in the audit log's key
/// order.
fn exit_line(run_id: &str, e: &ExecRow) -> Value {
    let mut line = serde_json::Map::new();
    line.insert("seq".into(), 0.into());
    let at = UNIX_EPOCH + std::time::Duration::from_millis(u64::try_from(e.ended_at).unwrap_or(0));
    line.insert("ts".into(), crate::runtime::events::rfc3339(at).into());
    line.insert("event".into(), "StageExited".into());
    line.insert("workflowRunId".into(), run_id.into());
    line.insert(
        "stageExecutionId".into(),
        e.stage_execution_id.clone().into(),
    );
    line.insert("stageId".into(), e.stage_id.clone().into());
    line.insert(
        "verdict".into(),
        e.verdict
            .clone()
            .unwrap_or_else(|| "fail".to_owned())
            .into(),
    );
    line.insert("capHit".into(), e.cap_hit.into());
    line.insert("attemptCount".into(), e.attempts.into());
    line.insert(
        "usage".into(),
        serde_json::to_value(e.usage).unwrap_or(Value::Null),
    );
    if let Some(r) = &e.reason {
        line.insert("reason".into(), r.clone().into());
    }
    line.insert("recovered".into(), true.into());
    Value::Object(line)
}
