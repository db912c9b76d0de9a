//! A run's executions as the store reads them: its records (the first
//! schema's rows, then its packs) folded into what stands for each
//! execution, for counting, printing a pass at a time, resuming and
//! repairing the audit log.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::UNIX_EPOCH;

use rusqlite::types::ValueRef;
use rusqlite::{OptionalExtension, params};
use serde_json::Value;

use super::db::{RUN_KEY, Store};
use super::error::StoreError;
use super::pack::{self, End, Fold, Stored};
use super::repair::LostExit;
use super::rows::{Counts, ExecRow};
use crate::provider::Usage;
use crate::runtime::result::{Kept, Verdict};

/// Where a stored record is: a row of the first schema (one per
/// execution), or a pack's record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    /// Its end time: rows print in the order of end time and id.
    Row {
        ended_at: i64,
    },
    Packed {
        seq: i64,
        at: u32,
    },
}

/// Which of a run's stored records stand, one per execution. See
/// [`Store::standing`].
#[derive(Debug, Clone, Default)]
pub struct Standing {
    /// Executions whose standing record is their row, by end time and
    /// id (as the first schema's reader sorted them).
    rows: Vec<(i64, Box<str>)>,
    /// The places of the others, ascending.
    packed: Vec<(i64, u32)>,
}

impl Standing {
    /// Executions selected.
    pub fn len(&self) -> usize {
        self.rows.len() + self.packed.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A first-schema row's columns, as [`row_record`] reads them.
const ROW_COLUMNS: &str = "exec, stage_id, sibling, visit, outcome, verdict, reason, attempts, \
    cap_hit, phase, turn, tool_calls, prompt_tokens, completion_tokens, requests, entered_at, \
    ended_at, parsed, output";

/// A row of the first schema's `executions` as a record, read leniently:
/// a column of another type than troupe wrote reads as absent (a number
/// as 0), text that is not UTF-8 as empty.
fn row_record<'r>(
    get: impl Fn(usize) -> rusqlite::Result<ValueRef<'r>>,
) -> rusqlite::Result<Stored<'r>> {
    let text = |i: usize| -> rusqlite::Result<Option<&'r str>> {
        Ok(match get(i)? {
            ValueRef::Text(t) | ValueRef::Blob(t) => Some(std::str::from_utf8(t).unwrap_or("")),
            _ => None,
        })
    };
    let number = |i: usize| -> rusqlite::Result<Option<i64>> {
        Ok(match get(i)? {
            ValueRef::Integer(n) => Some(n),
            ValueRef::Real(x) => Some(x as i64),
            ValueRef::Text(t) => std::str::from_utf8(t)
                .ok()
                .and_then(|t| t.trim().parse().ok()),
            _ => None,
        })
    };
    let count = |i: usize| -> rusqlite::Result<u64> { Ok(number(i)?.unwrap_or(0).max(0) as u64) };
    let small =
        |i: usize| -> rusqlite::Result<u32> { Ok(u32::try_from(count(i)?).unwrap_or(u32::MAX)) };
    let end = if text(4)? == Some("exited") {
        End::Exited {
            verdict: text(5)?.map_or(Verdict::Fail, Verdict::parse),
            cap_hit: count(8)? != 0,
            reason: text(6)?,
            parsed: text(17)?.unwrap_or("null"),
            output: text(18)?,
        }
    } else {
        End::Cancelled {
            reason: text(6)?.unwrap_or_default(),
            phase: text(9)?.unwrap_or_default(),
            turn: small(10)?,
            tool_calls: text(11)?.unwrap_or("[]"),
        }
    };
    Ok(Stored {
        exec: text(0)?.unwrap_or_default(),
        stage_id: text(1)?.unwrap_or_default(),
        index: number(2)?.map(|i| i.max(0) as u64),
        visit: small(3)?,
        attempts: small(7)?,
        usage: Usage {
            prompt_tokens: count(12)?,
            completion_tokens: count(13)?,
            requests: count(14)?,
        },
        entered_at: number(15)?,
        ended_at: number(16)?.unwrap_or(0),
        end,
    })
}

/// A stored record as `runs show` prints it.
pub fn exec_row(run_id: &str, r: &Stored<'_>) -> ExecRow {
    let json = |text: &str| serde_json::from_str(text).ok();
    let mut row = ExecRow {
        stage_execution_id: format!("{run_id}/{}", r.exec),
        stage_id: r.stage_id.to_owned(),
        index: r.index,
        visit: r.visit,
        outcome: String::new(),
        verdict: None,
        reason: None,
        attempts: r.attempts,
        cap_hit: false,
        phase: None,
        turn: None,
        tool_calls: None,
        usage: r.usage,
        entered_at: r.entered_at,
        ended_at: r.ended_at,
        parsed: None,
        output: None,
    };
    match r.end {
        End::Exited {
            verdict,
            cap_hit,
            reason,
            parsed,
            output,
        } => {
            row.outcome = "exited".to_owned();
            row.verdict = Some(verdict.as_str().to_owned());
            row.reason = reason.map(str::to_owned);
            row.cap_hit = cap_hit;
            row.parsed = json(parsed);
            row.output = output.and_then(json);
        }
        End::Cancelled {
            reason,
            phase,
            turn,
            tool_calls,
        } => {
            row.outcome = "cancelled".to_owned();
            row.reason = Some(reason.to_owned());
            row.phase = Some(phase.to_owned());
            row.turn = Some(turn);
            row.tool_calls = json(tool_calls);
        }
    }
    row
}

impl Store {
    /// A run's rows of the first schema, as records, in no order (a row
    /// was what stood for its execution).
    fn each_row(&self, run_id: &str, mut each: impl FnMut(&Stored<'_>)) -> Result<(), StoreError> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT {ROW_COLUMNS} FROM executions WHERE run = {RUN_KEY}"
            ))
            .map_err(|e| self.err(&e))?;
        let mut rows = stmt.query([run_id]).map_err(|e| self.err(&e))?;
        while let Some(r) = rows.next().map_err(|e| self.err(&e))? {
            each(&row_record(|i| r.get_ref(i)).map_err(|e| self.err(&e))?);
        }
        Ok(())
    }

    /// The row of one execution (`exec`, without the run's id), read
    /// whole and let go of before `each` sees it: a reader that waits
    /// (stdout into `less`) must not hold a read open on the store.
    fn one_row(
        &self,
        run_id: &str,
        exec: &str,
        each: impl FnOnce(&Stored<'_>) -> bool,
    ) -> Result<bool, StoreError> {
        // By its key; a key another tool stored as a BLOB (read as its
        // text) is found by its text, through a scan of the run's rows.
        let by = |key: &str| -> Result<Option<Vec<rusqlite::types::Value>>, StoreError> {
            self.conn
                .prepare_cached(&format!(
                    "SELECT {ROW_COLUMNS} FROM executions WHERE run = {RUN_KEY} AND {key} = ?2"
                ))
                .and_then(|mut stmt| {
                    stmt.query_row(params![run_id, exec], |r| {
                        (0..r.as_ref().column_count()).map(|i| r.get(i)).collect()
                    })
                    .optional()
                })
                .map_err(|e| self.err(&e))
        };
        let values = match by("exec")? {
            Some(values) => Some(values),
            None => by("CAST(exec AS TEXT)")?,
        };
        let Some(values) = values else {
            // Deleted since.
            return Ok(true);
        };
        let record = row_record(|i| Ok(values.get(i).map_or(ValueRef::Null, ValueRef::from)))
            .map_err(|e| self.err(&e))?;
        Ok(each(&record))
    }

    /// The records of a run's packs from pack `from` on, in the order
    /// stored, with their places, until `each` says stop. Packs are read
    /// a few at a time and copied out, so no read stays open on the
    /// store while `each` runs.
    fn each_packed(
        &self,
        run_id: &str,
        from: i64,
        mut each: impl FnMut(Place, &Stored<'_>) -> bool,
    ) -> Result<(), StoreError> {
        /// Packs read at once: most are kilobytes, none much over
        /// [`pack::PACK_BYTES`] unless one record is.
        const AT_ONCE: i64 = 32;
        let mut from = from;
        loop {
            let packs: Vec<(i64, Result<Vec<u8>, String>)> = self
                .conn
                .prepare_cached(&format!(
                    "SELECT seq, body FROM packs WHERE run = {RUN_KEY} AND seq >= ?2 \
                     ORDER BY seq LIMIT ?3"
                ))
                .and_then(|mut stmt| {
                    stmt.query_map(params![run_id, from, AT_ONCE], |r| {
                        let body = match r.get_ref(1)? {
                            ValueRef::Blob(bytes) | ValueRef::Text(bytes) => Ok(bytes.to_vec()),
                            other => Err(format!(
                                "at byte 0: it holds {:?}, not bytes",
                                other.data_type()
                            )),
                        };
                        Ok((r.get(0)?, body))
                    })?
                    .collect()
                })
                .map_err(|e| self.err(&e))?;
            let Some(&(last, _)) = packs.last() else {
                return Ok(());
            };
            for (seq, body) in &packs {
                let corrupt = |detail: String| StoreError::Corrupt {
                    path: self.path.clone(),
                    detail: format!("pack {seq} of run {run_id} is damaged {detail}"),
                };
                let body = body.as_ref().map_err(|d| corrupt(d.clone()))?;
                for (at, record) in pack::records(body).enumerate() {
                    let record = record.map_err(|damage| corrupt(damage.to_string()))?;
                    let at = u32::try_from(at).unwrap_or(u32::MAX);
                    if !each(Place::Packed { seq: *seq, at }, &record) {
                        return Ok(());
                    }
                }
            }
            if (packs.len() as i64) < AT_ONCE {
                return Ok(());
            }
            let Some(next) = last.checked_add(1) else {
                return Ok(());
            };
            from = next;
        }
    }

    /// Every record of a run in the order it was stored, with its place:
    /// the run's rows of the first schema (written before packs, each
    /// what stood for its execution), then its packs.
    fn each_stored(
        &self,
        run_id: &str,
        mut each: impl FnMut(Place, &Stored<'_>),
    ) -> Result<(), StoreError> {
        if self.tables.rows {
            self.each_row(run_id, |r| {
                each(
                    Place::Row {
                        ended_at: r.ended_at,
                    },
                    r,
                );
            })?;
        }
        if self.tables.packs {
            self.each_packed(run_id, i64::MIN, |place, r| {
                each(place, r);
                true
            })?;
        }
        Ok(())
    }

    /// What stands for each of a run's executions that `wanted` selects
    /// (by its identity: the same for every record of an execution), as
    /// `keep` makes it.
    fn folded<T>(
        &self,
        run_id: &str,
        wanted: impl Fn(&Stored<'_>) -> bool,
        keep: impl Fn(&Stored<'_>) -> T,
    ) -> Result<impl Iterator<Item = (Box<str>, T)>, StoreError> {
        let mut fold = Fold::default();
        self.each_stored(run_id, |_, record| {
            if wanted(record) {
                fold.add(record, &keep);
            }
        })?;
        Ok(fold.into_standing())
    }

    /// Executions of a run by outcome.
    ///
    /// A run whose every execution has one record (a run of one session,
    /// as most are) is counted record by record, remembering only a hash
    /// of each execution's key; the first hash seen twice (an execution
    /// recorded again, or two keys that hash alike) sends the count to
    /// the fold, which keeps each key. Listing a million-wide run took
    /// 134 MB and 0.5–0.6 s through the fold alone.
    pub fn counts(&self, run_id: &str) -> Result<Counts, StoreError> {
        let keys = foldhash::fast::RandomState::default();
        let mut seen: HashSet<u64, foldhash::fast::RandomState> = HashSet::default();
        let mut counts = Counts::default();
        let mut once = true;
        self.each_stored(run_id, |_, r| {
            once = once && seen.insert(keys.hash_one(r.exec));
            counts.count(r.verdict());
        })?;
        if once {
            return Ok(counts);
        }
        self.folded_counts(run_id)
    }

    /// [`Store::counts`] through the fold.
    fn folded_counts(&self, run_id: &str) -> Result<Counts, StoreError> {
        let mut counts = Counts::default();
        for (_, end) in self.folded(run_id, |_| true, |r| r.verdict())? {
            counts.count(end);
        }
        Ok(counts)
    }

    /// A run's executions in the order their ends were stored; only those
    /// of `stage` (and sibling `index`) when given. Read whole: a command
    /// that prints a run's executions reads them a pass at a time instead
    /// ([`Store::standing`], [`Store::each_standing`]).
    pub fn executions(
        &self,
        run_id: &str,
        stage: Option<&str>,
        index: Option<u64>,
    ) -> Result<Vec<ExecRow>, StoreError> {
        let standing = self.standing(run_id, stage, index)?;
        let mut rows = Vec::with_capacity(standing.len());
        self.each_standing(run_id, &standing, |r| {
            rows.push(exec_row(run_id, r));
            true
        })?;
        Ok(rows)
    }

    /// Which of a run's stored records stand, one per execution selected
    /// (of `stage`, and sibling `index`, when given): what
    /// [`Store::each_standing`] passes on. It holds a place per
    /// execution, so a million-wide run is printed a pass at a time in a
    /// few hundred megabytes (read whole, its executions took gigabytes).
    /// No transaction spans the passes, so none keeps a long read open
    /// against a running run's checkpoints: records stored after this
    /// reading are not passed on, and one deleted since is skipped.
    pub fn standing(
        &self,
        run_id: &str,
        stage: Option<&str>,
        index: Option<u64>,
    ) -> Result<Standing, StoreError> {
        let mut fold = Fold::default();
        self.each_stored(run_id, |place, r| {
            if stage.is_none_or(|s| r.stage_id == s) && index.is_none_or(|i| r.index == Some(i)) {
                fold.add(r, |_| place);
            }
        })?;
        let mut standing = Standing::default();
        for (exec, place) in fold.into_standing() {
            match place {
                Place::Row { ended_at } => standing.rows.push((ended_at, exec)),
                Place::Packed { seq, at } => standing.packed.push((seq, at)),
            }
        }
        standing.rows.sort_unstable();
        standing.packed.sort_unstable();
        Ok(standing)
    }

    /// Each standing record of `standing`, in the order stored (the first
    /// schema's rows by end time and id), until `each` says stop.
    pub fn each_standing(
        &self,
        run_id: &str,
        standing: &Standing,
        mut each: impl FnMut(&Stored<'_>) -> bool,
    ) -> Result<(), StoreError> {
        for (_, exec) in &standing.rows {
            if !self.one_row(run_id, exec, &mut each)? {
                return Ok(());
            }
        }
        let Some(&(first, _)) = standing.packed.first() else {
            return Ok(());
        };
        let mut next = standing.packed.iter().peekable();
        self.each_packed(run_id, first, |place, r| {
            let Place::Packed { seq, at } = place else {
                return true;
            };
            // Places passed without a record were deleted since.
            while next.next_if(|&&p| p < (seq, at)).is_some() {}
            if next.next_if_eq(&&(seq, at)).is_some() && !each(r) {
                return false;
            }
            next.peek().is_some()
        })
    }

    /// The results of a run's exited executions by `stageExecutionId`,
    /// for a resumed run (which runs the failed ones again), kept packed
    /// as they were stored (`Kept::stored`), so a run with a million
    /// stored results resumes in the memory its results take packed, not
    /// as parsed values.
    ///
    /// Each is found by the same `Arc` its result names the execution
    /// with: a second copy of a million ids was a tenth of a resume's
    /// memory.
    pub fn kept_results(&self, run_id: &str) -> Result<HashMap<Arc<str>, Kept>, StoreError> {
        Ok(self.resumable(run_id)?.0)
    }

    /// [`Store::kept_results`], and the model usage of every record the
    /// run has stored, read in the same pass: each execution's every end,
    /// the cancelled and the superseded (a failed try run again) too. A
    /// resumed run's budget starts there.
    pub fn resumable(&self, run_id: &str) -> Result<(HashMap<Arc<str>, Kept>, Usage), StoreError> {
        // One name per stage, shared by its executions' results.
        let stages: RefCell<HashMap<String, Arc<str>, foldhash::fast::RandomState>> =
            RefCell::default();
        let spent = std::cell::Cell::new(Usage::default());
        let kept = self.folded(
            run_id,
            |r| {
                let mut sum = spent.get();
                sum.add(r.usage);
                spent.set(sum);
                true
            },
            |r| {
                let End::Exited {
                    verdict,
                    cap_hit,
                    reason,
                    parsed,
                    output,
                } = r.end
                else {
                    return None;
                };
                let mut stages = stages.borrow_mut();
                let stage = match stages.get(r.stage_id) {
                    Some(s) => Arc::clone(s),
                    None => {
                        let s: Arc<str> = r.stage_id.into();
                        stages.insert(r.stage_id.to_owned(), Arc::clone(&s));
                        s
                    }
                };
                // Built by hand: `format!` was a third of a result's reading.
                let mut id = String::with_capacity(run_id.len() + 1 + r.exec.len());
                id.push_str(run_id);
                id.push('/');
                id.push_str(r.exec);
                let id: Arc<str> = id.into();
                let kept = Kept::stored(
                    stage,
                    Arc::clone(&id),
                    verdict,
                    reason.map(str::to_owned),
                    cap_hit,
                    r.attempts,
                    r.usage,
                    (Some(parsed.to_owned()), output.map(str::to_owned)),
                );
                Some((id, kept))
            },
        )?;
        Ok((kept.filter_map(|(_, kept)| kept).collect(), spent.get()))
    }

    /// Each of a run's exited executions whose `StageExited` the audit
    /// log lacks (`in_log` says which it has) as the log records it — a
    /// `StageEntered` and its `StageExited`, both marked `recovered` — for
    /// the log's repair, in the order they ended. Executions the log has
    /// are skipped before they are read whole.
    pub fn exit_events(
        &self,
        run_id: &str,
        in_log: impl Fn(&str) -> bool,
    ) -> Result<Vec<LostExit>, StoreError> {
        let mut lost: Vec<ExecRow> = self
            .folded(
                run_id,
                |r| !in_log(&format!("{run_id}/{}", r.exec)),
                // Only an exit that stands (not `fail`): a failed one is
                // run again, and its old exit must not close a newer
                // entry the log has open.
                |r| r.stays().then(|| exec_row(run_id, r)),
            )?
            .filter_map(|(_, row)| row)
            .collect();
        lost.sort_by(|a, b| {
            (a.ended_at, &a.stage_execution_id).cmp(&(b.ended_at, &b.stage_execution_id))
        });
        Ok(lost
            .into_iter()
            .map(|e| LostExit {
                lines: vec![entered_line(run_id, &e), exit_line(run_id, &e)],
                id: e.stage_execution_id,
            })
            .collect())
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
