//! The store's writer: one thread, the only writer of executions' ends for
//! a run, and the run's [`Ledger`]. Records arrive on a channel; the
//! writer takes everything queued, writes it in one transaction and then
//! has every waiting execution answered, so a 100 000-wide fan-out commits
//! in batches (group commit), not once per sibling. A batch that cannot be
//! written (a full disk) is rolled back and every execution in it is told
//! so: none of them is recorded as exited.
//!
//! The answers (each execution's `StageExited` and its report to the
//! scheduler) run on a second thread, a batch at a time, while the writer
//! goes on to the next transaction: both threads are one per run, and
//! together they were the busiest of a wide run's such threads. A third,
//! the checkpointer (`store/checkpoint.rs`), keeps WAL checkpoints out of
//! the writer's commits.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::SystemTime;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::{Connection, params};

use super::checkpoint::Checkpointer;
use super::db::{exec_key, unix_ms};
use super::error::StoreError;
use super::schema;
use crate::runtime::ledger::{AfterCommit, CancelRecord, ExitRecord, Ledger, LedgerError};

/// Records taken into one transaction at most.
const MAX_BATCH: usize = 4096;

enum ToStore {
    Exit {
        record: Box<ExitRecord>,
        /// The result's `parsed` and `output` columns, serialized by the
        /// execution's thread rather than the writer's (one per run).
        columns: Box<ResultColumns>,
        then: Option<AfterCommit>,
    },
    Cancel(Box<CancelRecord>),
    /// Write what came before, then stop.
    Close,
}

/// The writer thread's handle. [`StoreWriter::finish`] (or dropping it)
/// ends the thread once everything sent before is written.
#[derive(Debug)]
pub struct StoreWriter {
    tx: Sender<ToStore>,
    thread: Option<JoinHandle<Result<u64, StoreError>>>,
    path: PathBuf,
}

/// The run's [`Ledger`]: hands records to the writer thread. Cheap to
/// clone; records sent after the writer finished are refused.
#[derive(Debug, Clone)]
pub struct StoreLedger {
    tx: Sender<ToStore>,
}

impl StoreLedger {
    /// Records handed to the writer and not yet taken into a transaction:
    /// how far the store is behind the run.
    pub fn queued(&self) -> usize {
        self.tx.len()
    }
}

impl StoreWriter {
    /// Opens the store at `path` for the writer and starts its thread.
    pub fn start(path: &Path) -> Result<StoreWriter, StoreError> {
        let conn = schema::open(path)?;
        // The writer checks that each batch's runs exist itself, once a
        // batch inside the batch's write transaction (`run_key`), instead
        // of SQLite checking the foreign key on every row: that check was
        // 5% of the writer's instructions. Deletes cascade as before: it
        // is the deleting connection's setting that cascades them.
        conn.execute_batch("PRAGMA foreign_keys = OFF")
            .map_err(|e| StoreError::sqlite(path, &e))?;
        let (tx, rx) = crossbeam_channel::unbounded();
        let thread_path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("troupe-store".into())
            .spawn(move || write(conn, &rx, &thread_path))
            .map_err(|e| StoreError::Io {
                path: path.to_owned(),
                detail: format!("cannot start the store's writer: {e}"),
            })?;
        Ok(StoreWriter {
            tx,
            thread: Some(thread),
            path: path.to_owned(),
        })
    }

    /// The ledger the run's executions write through.
    pub fn ledger(&self) -> StoreLedger {
        StoreLedger {
            tx: self.tx.clone(),
        }
    }

    /// Waits until everything sent so far is written; the records
    /// written, or the writer's last error.
    pub fn finish(mut self) -> Result<u64, StoreError> {
        let _ = self.tx.send(ToStore::Close);
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(StoreError::Io {
                path: self.path.clone(),
                detail: "the store's writer panicked".to_owned(),
            }),
            None => Ok(0),
        }
    }
}

impl Drop for StoreWriter {
    fn drop(&mut self) {
        let _ = self.tx.send(ToStore::Close);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// A result's JSON columns.
struct ResultColumns {
    parsed: String,
    /// `None` when `output` is `parsed` (stored once).
    output: Option<String>,
}

impl ResultColumns {
    fn of(result: &crate::runtime::result::Kept) -> ResultColumns {
        let (parsed, output) = result.json_columns();
        ResultColumns { parsed, output }
    }
}

impl Ledger for StoreLedger {
    fn persist(&self, record: ExitRecord, then: Option<AfterCommit>) {
        let columns = Box::new(ResultColumns::of(&record.result));
        if let Err(crossbeam_channel::SendError(ToStore::Exit {
            then: Some(then), ..
        })) = self.tx.send(ToStore::Exit {
            record: Box::new(record),
            columns,
            then,
        }) {
            then(Err(LedgerError(
                "the store's writer has stopped".to_owned(),
            )));
        }
    }

    fn cancelled(&self, record: CancelRecord) {
        let _ = self.tx.send(ToStore::Cancel(Box::new(record)));
    }
}

/// The writer's thread: checkpoints handed to a thread of their own
/// ([`Checkpointer`]), then the writer loop.
fn write(mut conn: Connection, rx: &Receiver<ToStore>, path: &Path) -> Result<u64, StoreError> {
    let checkpointer = Checkpointer::start(&mut conn, path);
    let written = write_answered(conn, rx, path);
    // The writer's connection, and with it the checkpointer's nudge, is
    // closed by now.
    if let Some(checkpointer) = checkpointer {
        checkpointer.join();
    }
    written
}

/// The writer loop: a blocking wait for the first record, then whatever
/// else is queued, one transaction, the answers.
fn write_answered(
    conn: Connection,
    rx: &Receiver<ToStore>,
    path: &Path,
) -> Result<u64, StoreError> {
    let (answer, answers) = crossbeam_channel::unbounded::<Answers>();
    let answering = std::thread::Builder::new()
        .name("troupe-answers".into())
        .spawn(move || {
            for (thens, outcome) in answers {
                answer_all(thens, &outcome);
            }
        });
    let Ok(answering) = answering else {
        // No second thread: the writer answers itself.
        return write_batches(conn, rx, path, |thens, outcome| {
            answer_all(thens, &outcome);
        });
    };
    let written = write_batches(conn, rx, path, |thens, outcome| {
        // The answering thread ends only once this sender is dropped.
        let _ = answer.send((thens, outcome));
    });
    drop(answer);
    // Every execution is answered before the writer is finished.
    let _ = answering.join();
    written
}

/// The executions waiting on one batch and its outcome.
type Answers = (Vec<AfterCommit>, Result<(), LedgerError>);

/// Answers every execution of a batch. One answer that panics must not
/// leave the others (and their executions) unanswered. The scheduler
/// hears of the whole batch in one message (`scheduler::post`).
fn answer_all(thens: Vec<AfterCommit>, outcome: &Result<(), LedgerError>) {
    crate::runtime::scheduler::post::gathered(|| {
        for then in thens {
            let _ =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| then(outcome.clone())));
        }
    });
}

fn write_batches(
    conn: Connection,
    rx: &Receiver<ToStore>,
    path: &Path,
    answer: impl Fn(Vec<AfterCommit>, Result<(), LedgerError>),
) -> Result<u64, StoreError> {
    let mut written = 0u64;
    let mut last_error = None;
    let mut batch = Vec::with_capacity(256);
    let mut keys = RunKeys::default();
    let mut statements = Prepared::new(&conn);
    let mut closing = false;
    while !closing {
        match rx.recv() {
            Ok(ToStore::Close) | Err(_) => break,
            Ok(first) => batch.push(first),
        }
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(ToStore::Close) => {
                    closing = true;
                    break;
                }
                Ok(more) => batch.push(more),
                Err(_) => break,
            }
        }
        let outcome = write_batch(&conn, &mut statements, &mut keys, &batch)
            .map_err(|e| StoreError::sqlite(path, &e));
        let outcome_of_batch = match &outcome {
            Ok(()) => {
                written += batch.len() as u64;
                Ok(())
            }
            Err(e) => {
                use crate::error::HasCode;
                Err(LedgerError(format!("{}: {e}", e.code())))
            }
        };
        let thens: Vec<AfterCommit> = batch
            .drain(..)
            .filter_map(|msg| match msg {
                ToStore::Exit { then, .. } => then,
                _ => None,
            })
            .collect();
        if !thens.is_empty() {
            answer(thens, outcome_of_batch);
        }
        if let Err(e) = outcome {
            last_error = Some(e);
        }
    }
    drop(statements);
    // Closed here, and the WAL hook with it: a close refused (busy) would
    // keep the hook's nudge alive, and the checkpointer, which ends once
    // the nudge is dropped, would never be joined.
    if let Err((mut conn, _)) = conn.close() {
        let _ = conn.wal_hook(None::<fn(&mut rusqlite::hooks::Wal, i32) -> rusqlite::Result<()>>);
    }
    match last_error {
        Some(e) => Err(e),
        None => Ok(written),
    }
}

/// The columns an exit writes, with `outcome` fixed to `'exited'`.
const EXIT_COLUMNS: &str = "INSERT INTO executions (run, exec, stage_id, sibling, visit, \
    outcome, verdict, reason, attempts, cap_hit, prompt_tokens, completion_tokens, requests, \
    entered_at, ended_at, parsed, output) VALUES ";
const EXIT_ROW: &str = "(?, ?, ?, ?, ?, 'exited', ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)";
/// The parameters of one row of [`EXIT_ROW`].
const EXIT_PARAMS: usize = 16;
const EXIT_CONFLICT: &str = " ON CONFLICT (run, exec) DO UPDATE SET outcome = 'exited', \
    verdict = excluded.verdict, \
    reason = excluded.reason, attempts = excluded.attempts, cap_hit = excluded.cap_hit, \
    phase = NULL, turn = NULL, tool_calls = NULL, prompt_tokens = excluded.prompt_tokens, \
    completion_tokens = excluded.completion_tokens, requests = excluded.requests, \
    entered_at = excluded.entered_at, ended_at = excluded.ended_at, parsed = excluded.parsed, \
    output = excluded.output \
    WHERE executions.outcome <> 'exited' OR executions.verdict = 'fail'";

/// Rows one exit statement writes, largest first: a run of exits is
/// written by as few statements as these sizes allow, which spares each
/// row a statement's own cost (its start and halt, its reset, its
/// cursors): 7% of the writer's instructions in a 5 000-wide run.
/// SQLite upserts the rows of a multi-row `VALUES` one after another, as
/// if each had its own statement, so the conflict rule holds row by row.
const EXIT_ROWS: [usize; 6] = [32, 16, 8, 4, 2, 1];

/// The exit statements' text, one per size of [`EXIT_ROWS`], made once
/// per writer.
struct ExitStatements([String; EXIT_ROWS.len()]);

impl ExitStatements {
    fn new() -> ExitStatements {
        ExitStatements(EXIT_ROWS.map(|rows| {
            format!(
                "{EXIT_COLUMNS}{}{EXIT_CONFLICT}",
                [EXIT_ROW].repeat(rows).join(", ")
            )
        }))
    }

    /// Which of [`EXIT_ROWS`] is the largest statement for `left` rows.
    fn for_rows(left: usize) -> usize {
        EXIT_ROWS
            .iter()
            .position(|&rows| rows <= left)
            .unwrap_or(EXIT_ROWS.len() - 1)
    }
}

/// The writer's statements, each prepared when first needed and kept for
/// the writer's life. Through rusqlite's statement cache, each use hashed
/// the statement's text (2 KB for 32 rows) to find it and cleared its
/// bindings to put it back: 3% of the writer's time on 16 cores.
struct Prepared<'c> {
    conn: &'c Connection,
    texts: ExitStatements,
    exits: [Option<rusqlite::Statement<'c>>; EXIT_ROWS.len()],
    cancel: Option<rusqlite::Statement<'c>>,
    run: Option<rusqlite::Statement<'c>>,
}

impl<'c> Prepared<'c> {
    fn new(conn: &'c Connection) -> Prepared<'c> {
        Prepared {
            conn,
            texts: ExitStatements::new(),
            exits: Default::default(),
            cancel: None,
            run: None,
        }
    }

    fn cancel(&mut self) -> rusqlite::Result<&mut rusqlite::Statement<'c>> {
        prepared(self.conn, &mut self.cancel, UPSERT_CANCEL)
    }
}

/// The statement in `slot`, prepared there first if it is not yet.
fn prepared<'s, 'c>(
    conn: &'c Connection,
    slot: &'s mut Option<rusqlite::Statement<'c>>,
    sql: &str,
) -> rusqlite::Result<&'s mut rusqlite::Statement<'c>> {
    let statement = match slot.take() {
        Some(statement) => statement,
        None => conn.prepare(sql)?,
    };
    Ok(slot.insert(statement))
}

const UPSERT_CANCEL: &str = "INSERT INTO executions (run, exec, stage_id, sibling, visit, \
    outcome, reason, attempts, phase, turn, tool_calls, prompt_tokens, completion_tokens, \
    requests, entered_at, ended_at) \
    VALUES (?1, ?2, ?3, ?4, ?5, 'cancelled', ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15) \
    ON CONFLICT (run, exec) DO UPDATE SET outcome = 'cancelled', verdict = NULL, \
    reason = excluded.reason, attempts = excluded.attempts, cap_hit = 0, phase = excluded.phase, \
    turn = excluded.turn, tool_calls = excluded.tool_calls, \
    prompt_tokens = excluded.prompt_tokens, completion_tokens = excluded.completion_tokens, \
    requests = excluded.requests, entered_at = excluded.entered_at, ended_at = excluded.ended_at, \
    parsed = NULL, output = NULL \
    WHERE executions.outcome <> 'exited' OR executions.verdict = 'fail'";

fn ms(t: SystemTime) -> Option<i64> {
    (t > SystemTime::UNIX_EPOCH).then(|| unix_ms(t))
}

fn index(i: Option<usize>) -> Option<i64> {
    i.map(|i| i64::try_from(i).unwrap_or(i64::MAX))
}

fn count(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// The run's key in `executions`, looked up once per run in each batch
/// (`keys` is emptied between batches). The lookup is the batch's
/// foreign-key check: it runs inside the batch's write transaction, so
/// the run cannot be deleted before the batch commits. A key kept from an
/// earlier batch could name another run by now: a run deleted meanwhile
/// (`troupe runs delete` in another process) frees its key for the next
/// run begun.
fn run_key<'c>(
    conn: &'c Connection,
    lookup: &mut Option<rusqlite::Statement<'c>>,
    keys: &mut RunKeys,
    run_id: &Arc<str>,
) -> rusqlite::Result<i64> {
    if let Some(k) = keys.get(run_id) {
        return Ok(k);
    }
    let k = prepared(conn, lookup, "SELECT key FROM runs WHERE id = ?1")?
        .query_row([&**run_id], |r| r.get(0))
        .map_err(|e| match e {
            rusqlite::Error::QueryReturnedNoRows => rusqlite::Error::SqliteFailure(
                rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT_FOREIGNKEY),
                Some(format!(
                    "run {run_id} is no longer in the store (deleted while it ran?)"
                )),
            ),
            other => other,
        })?;
    keys.insert(run_id, k);
    Ok(k)
}

/// The run keys one batch has looked up. A batch nearly always holds the
/// records of one run, which share its id: a short list searched by
/// pointer first costs less than hashing the id for every row (SipHash of
/// the id was 2% of the writer's time on 16 cores).
#[derive(Default)]
struct RunKeys(Vec<(Arc<str>, i64)>);

impl RunKeys {
    fn get(&self, id: &Arc<str>) -> Option<i64> {
        self.0
            .iter()
            .find(|(known, _)| Arc::ptr_eq(known, id) || **known == **id)
            .map(|&(_, key)| key)
    }

    fn insert(&mut self, id: &Arc<str>, key: i64) {
        self.0.push((Arc::clone(id), key));
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

fn write_batch(
    conn: &Connection,
    statements: &mut Prepared<'_>,
    keys: &mut RunKeys,
    batch: &[ToStore],
) -> rusqlite::Result<()> {
    // IMMEDIATE: the write lock is taken (waiting out another process's
    // write) before the batch reads the run's key. A deferred transaction
    // that has read cannot wait for the lock: SQLite answers BUSY at once,
    // and the batch would fail with Store/Locked while another troupe is
    // writing.
    // (Begun on a shared borrow of the connection, which the writer's
    // kept statements hold too; the writer runs one transaction at a time.)
    let tx = rusqlite::Transaction::new_unchecked(conn, rusqlite::TransactionBehavior::Immediate)?;
    keys.clear();
    {
        // Exits in a row go in together; a cancellation keeps its place.
        let mut exits = Vec::with_capacity(batch.len());
        for msg in batch {
            match msg {
                ToStore::Exit {
                    record, columns, ..
                } => exits.push((&**record, &**columns)),
                ToStore::Close => {}
                ToStore::Cancel(r) => {
                    write_exits(keys, statements, &exits)?;
                    exits.clear();
                    let run = run_key(statements.conn, &mut statements.run, keys, &r.run_id)?;
                    statements.cancel()?.execute(params![
                        run,
                        exec_key(&r.run_id, &r.stage_execution_id),
                        &*r.stage_id,
                        index(r.index),
                        r.visit,
                        &*r.reason,
                        r.attempt,
                        r.phase,
                        r.turn,
                        r.tool_calls.to_string(),
                        count(r.usage.prompt_tokens),
                        count(r.usage.completion_tokens),
                        count(r.usage.requests),
                        ms(r.entered_at),
                        unix_ms(r.cancelled_at),
                    ])?;
                }
            }
        }
        write_exits(keys, statements, &exits)?;
    }
    tx.commit()
}

/// Writes a run of exits, as many rows a statement as [`EXIT_ROWS`] allows.
fn write_exits(
    keys: &mut RunKeys,
    statements: &mut Prepared<'_>,
    exits: &[(&ExitRecord, &ResultColumns)],
) -> rusqlite::Result<()> {
    let mut left = exits;
    while !left.is_empty() {
        let at = ExitStatements::for_rows(left.len());
        let (these, rest) = left.split_at(EXIT_ROWS[at]);
        let Prepared {
            conn,
            texts,
            exits,
            run: lookup,
            ..
        } = statements;
        let statement = prepared(conn, &mut exits[at], &texts.0[at])?;
        for (row, (r, columns)) in these.iter().enumerate() {
            let result = &r.result;
            let run = run_key(conn, lookup, keys, &r.run_id)?;
            // Bound one by one, each with its own type: through a
            // `[&dyn ToSql]` list every row cost the writer a thousand
            // instructions more.
            let first = row * EXIT_PARAMS + 1;
            let mut bind = Binder {
                statement,
                next: first,
            };
            bind.one(run)?;
            bind.one(exec_key(&r.run_id, &r.stage_execution_id))?;
            bind.one(&*r.stage_id)?;
            bind.one(index(r.index))?;
            bind.one(r.visit)?;
            bind.one(result.verdict().as_str())?;
            bind.one(result.reason())?;
            bind.one(result.attempt_count())?;
            bind.one(result.cap_hit())?;
            bind.one(count(result.usage().prompt_tokens))?;
            bind.one(count(result.usage().completion_tokens))?;
            bind.one(count(result.usage().requests))?;
            bind.one(ms(r.entered_at))?;
            bind.one(unix_ms(r.exited_at))?;
            bind.one(&columns.parsed)?;
            bind.one(&columns.output)?;
            debug_assert_eq!(bind.next, first + EXIT_PARAMS);
        }
        statement.raw_execute()?;
        left = rest;
    }
    Ok(())
}

/// Binds a statement's parameters in order.
struct Binder<'s, 'c> {
    statement: &'s mut rusqlite::Statement<'c>,
    next: usize,
}

impl Binder<'_, '_> {
    fn one(&mut self, value: impl rusqlite::ToSql) -> rusqlite::Result<()> {
        self.statement.raw_bind_parameter(self.next, value)?;
        self.next += 1;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_batch_finds_each_run_key_by_its_id_whichever_copy_of_it() {
        let mut keys = RunKeys::default();
        let first: Arc<str> = Arc::from("run-a");
        keys.insert(&first, 7);
        keys.insert(&Arc::from("run-b"), 9);
        assert_eq!(keys.get(&first), Some(7));
        // Another allocation of the same id is the same run.
        assert_eq!(keys.get(&Arc::from("run-a")), Some(7));
        assert_eq!(keys.get(&Arc::from("run-b")), Some(9));
        assert_eq!(keys.get(&Arc::from("run-c")), None);
        keys.clear();
        assert_eq!(keys.get(&first), None);
    }

    #[test]
    fn one_answer_that_panics_leaves_the_rest_of_its_batch_answered() {
        let heard = Arc::new(Mutex::new(Vec::new()));
        let hear = |n: u32| -> AfterCommit {
            let heard = Arc::clone(&heard);
            Box::new(move |outcome| heard.lock().unwrap().push((n, outcome.is_ok())))
        };
        let thens: Vec<AfterCommit> = vec![
            hear(1),
            Box::new(|_| panic!("an answer with a bug")),
            hear(3),
        ];
        answer_all(thens, &Ok(()));
        assert_eq!(*heard.lock().unwrap(), [(1, true), (3, true)]);
    }
}
