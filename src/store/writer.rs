//! The store's writer: one thread, the only writer of executions' ends for
//! a run, and the run's [`Ledger`]. Records arrive on a channel; the
//! writer takes everything queued, writes it in one transaction and then
//! has every waiting execution answered, so a 100 000-wide fan-out commits
//! in batches (group commit), not once per sibling. Each run's records of
//! a transaction go in as one row, a pack (`store/pack.rs`), encoded by
//! the executions themselves: the writer copies bytes and inserts a row
//! per transaction. A batch that cannot be written (a full disk) is
//! rolled back and every execution in it is told so: none of them is
//! recorded as exited.
//!
//! An execution's exit is handed over where it ends, on its arbiter, and
//! held there with the others that end in the same turn of that
//! arbiter's loop: the arbiter sends them in one message when the turn is
//! over (a task spawned with the first). The writer's thread and its
//! channel then see one message an arbiter turn, not one a sibling: on
//! many cores each message is memory another core wrote (the channel's
//! slot, the record's bytes, the run's id), which that thread reads at a
//! cache miss each, and the writer is one thread for the whole run.
//!
//! The answers (each execution's `StageExited` and its report to the
//! scheduler) run on a second thread, a batch at a time, while the writer
//! goes on to the next transaction: both threads are one per run, and
//! together they were the busiest of a wide run's such threads. A third,
//! the checkpointer (`store/checkpoint.rs`), keeps WAL checkpoints out of
//! the writer's commits.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::{Connection, params};

use super::checkpoint::Checkpointer;
use super::error::StoreError;
use super::{pack, schema};
use crate::runtime::ledger::{AfterCommit, CancelRecord, ExitRecord, Ledger, LedgerError};

/// Records taken into one transaction at most (a message with more is
/// taken whole).
const MAX_BATCH: u64 = 4096;

enum ToStore {
    /// Exits of one run: their pack records back to back, encoded by the
    /// executions' threads rather than the writer's (one per run), and
    /// what runs once they are committed, in order.
    Exits {
        run_id: Arc<str>,
        records: Vec<u8>,
        count: usize,
        thens: Vec<AfterCommit>,
    },
    Cancel {
        run_id: Arc<str>,
        record: Vec<u8>,
    },
    /// Write what came before, then stop.
    Close,
}

impl ToStore {
    /// The records the message carries.
    fn records(&self) -> u64 {
        match self {
            ToStore::Exits { count, .. } => *count as u64,
            ToStore::Cancel { .. } => 1,
            ToStore::Close => 0,
        }
    }
}

/// The writer thread's handle. [`StoreWriter::finish`] (or dropping it)
/// ends the thread once everything sent before is written.
#[derive(Debug)]
pub struct StoreWriter {
    outbox: Outbox,
    thread: Option<JoinHandle<Result<u64, StoreError>>>,
    path: PathBuf,
}

/// The run's [`Ledger`]: hands records to the writer thread. Cheap to
/// clone; records sent after the writer finished are refused.
#[derive(Debug, Clone)]
pub struct StoreLedger {
    outbox: Outbox,
}

impl StoreLedger {
    /// Records handed to the writer and not yet taken into a transaction:
    /// how far the store is behind the run (exits an arbiter holds until
    /// its turn ends are not counted).
    pub fn queued(&self) -> usize {
        self.outbox.queued.load(Ordering::Relaxed)
    }
}

/// The writer's channel, and a count of the records in it: a message
/// carries many.
#[derive(Debug, Clone)]
struct Outbox {
    tx: Sender<ToStore>,
    queued: Arc<AtomicUsize>,
}

impl Outbox {
    fn new(tx: Sender<ToStore>) -> Outbox {
        Outbox {
            tx,
            queued: Arc::default(),
        }
    }

    /// Hands `message` to the writer, or gives it back when the writer
    /// has stopped.
    fn send(&self, message: ToStore) -> Result<(), ToStore> {
        let records = message.records() as usize;
        self.queued.fetch_add(records, Ordering::Relaxed);
        self.tx.send(message).map_err(|refused| {
            self.queued.fetch_sub(records, Ordering::Relaxed);
            refused.0
        })
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
        let outbox = Outbox::new(tx);
        let queued = Arc::clone(&outbox.queued);
        let thread_path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("troupe-store".into())
            .spawn(move || write(conn, &rx, &queued, &thread_path))
            .map_err(|e| StoreError::Io {
                path: path.to_owned(),
                detail: format!("cannot start the store's writer: {e}"),
            })?;
        Ok(StoreWriter {
            outbox,
            thread: Some(thread),
            path: path.to_owned(),
        })
    }

    /// The ledger the run's executions write through.
    pub fn ledger(&self) -> StoreLedger {
        StoreLedger {
            outbox: self.outbox.clone(),
        }
    }

    /// Waits until everything sent so far is written; the records
    /// written, or the writer's last error.
    pub fn finish(mut self) -> Result<u64, StoreError> {
        let _ = self.outbox.tx.send(ToStore::Close);
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
        let _ = self.outbox.tx.send(ToStore::Close);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Ledger for StoreLedger {
    fn persist(&self, record: ExitRecord, then: Option<AfterCommit>) {
        // A record nobody waits for (a failed execution's) is sent at once:
        // nothing holds the run open until an arbiter's turn ends, and the
        // run could finish, and its writer close, before it would be sent.
        let arbiter = then
            .is_some()
            .then(actix_rt::Arbiter::try_current)
            .flatten();
        let Some(arbiter) = arbiter else {
            // No arbiter's loop to wait for the end of: sent at once.
            send(
                &self.outbox,
                ToStore::Exits {
                    records: pack::encode_exit(&record),
                    run_id: record.run_id,
                    count: 1,
                    thens: then.into_iter().collect(),
                },
            );
            return;
        };
        let (earlier, first) = HELD.with(|held| {
            let mut held = held.borrow_mut();
            let earlier = match &held.to {
                Some((to, run))
                    if to.tx.same_channel(&self.outbox.tx) && **run == *record.run_id =>
                {
                    None
                }
                // Held for another store or run: sent first.
                _ => held.take(),
            };
            if held.to.is_none() {
                held.to = Some((self.outbox.clone(), Arc::clone(&record.run_id)));
            }
            let first = held.count == 0;
            // Encoded in place, after the records held before it.
            pack::encode_exit_into(&record, &mut held.records);
            held.count += 1;
            held.thens.extend(then);
            // A turn that ends many executions sends them in parts.
            let full = (held.records.len() >= HELD_BYTES)
                .then(|| held.take())
                .flatten();
            (earlier.into_iter().chain(full), first)
        });
        for (to, message) in earlier {
            send(&to, message);
        }
        if first && !arbiter.spawn(async { send_held() }) {
            // The arbiter is stopping: nothing would send them.
            send_held();
        }
    }

    fn cancelled(&self, record: CancelRecord) {
        let _ = self.outbox.send(ToStore::Cancel {
            record: pack::encode_cancel(&record),
            run_id: record.run_id,
        });
    }
}

/// Bytes of records an arbiter holds before it sends them without
/// waiting for its turn to end.
const HELD_BYTES: usize = 64 << 10;

thread_local! {
    /// The exits handed over on this thread (an arbiter) and not yet sent.
    static HELD: std::cell::RefCell<Held> = std::cell::RefCell::default();
}

/// Exits of one run held on one arbiter until its turn ends.
#[derive(Default)]
struct Held {
    to: Option<(Outbox, Arc<str>)>,
    records: Vec<u8>,
    count: usize,
    thens: Vec<AfterCommit>,
}

impl Held {
    /// What is held, as the message that sends it, and where to.
    fn take(&mut self) -> Option<(Outbox, ToStore)> {
        let (to, run_id) = self.to.take()?;
        let count = std::mem::take(&mut self.count);
        (count > 0).then(|| {
            let message = ToStore::Exits {
                run_id,
                records: std::mem::take(&mut self.records),
                count,
                thens: std::mem::take(&mut self.thens),
            };
            (to, message)
        })
    }
}

impl Drop for Held {
    /// A thread that ends holding exits (an arbiter stopped before its
    /// task ran) sends them still; no answer runs here, on a thread
    /// being torn down, when the writer has stopped.
    fn drop(&mut self) {
        if let Some((to, message)) = self.take() {
            let _ = to.send(message);
        }
    }
}

/// Sends what this thread holds (the task an arbiter runs at the end of
/// the turn that handed the first of them over).
fn send_held() {
    let held = HELD
        .try_with(|held| held.borrow_mut().take())
        .ok()
        .flatten();
    if let Some((to, message)) = held {
        send(&to, message);
    }
}

/// Hands `message` to the writer; when it has stopped, the executions
/// waiting on it are told so.
fn send(to: &Outbox, message: ToStore) {
    if let Err(ToStore::Exits { thens, .. }) = to.send(message) {
        for then in thens {
            then(Err(LedgerError(
                "the store's writer has stopped".to_owned(),
            )));
        }
    }
}

/// The writer's thread: checkpoints handed to a thread of their own
/// ([`Checkpointer`]), then the writer loop.
fn write(
    mut conn: Connection,
    rx: &Receiver<ToStore>,
    queued: &AtomicUsize,
    path: &Path,
) -> Result<u64, StoreError> {
    let checkpointer = Checkpointer::start(&mut conn, path);
    let written = write_answered(conn, rx, queued, path);
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
    queued: &AtomicUsize,
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
        return write_batches(conn, rx, queued, path, |thens, outcome| {
            answer_all(thens, &outcome);
        });
    };
    let written = write_batches(conn, rx, queued, path, |thens, outcome| {
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
    queued: &AtomicUsize,
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
        let mut records = batch.iter().map(ToStore::records).sum::<u64>();
        while records < MAX_BATCH {
            match rx.try_recv() {
                Ok(ToStore::Close) => {
                    closing = true;
                    break;
                }
                Ok(more) => {
                    records += more.records();
                    batch.push(more);
                }
                Err(_) => break,
            }
        }
        queued.fetch_sub(records as usize, Ordering::Relaxed);
        let outcome = write_batch(&conn, &mut statements, &mut keys, &batch)
            .map_err(|e| StoreError::sqlite(path, &e));
        let outcome_of_batch = match &outcome {
            Ok(()) => {
                written += records;
                Ok(())
            }
            Err(e) => {
                use crate::error::HasCode;
                Err(LedgerError(format!("{}: {e}", e.code())))
            }
        };
        let mut thens: Vec<AfterCommit> = Vec::new();
        for msg in batch.drain(..) {
            if let ToStore::Exits { thens: more, .. } = msg {
                if thens.is_empty() {
                    thens = more;
                } else {
                    thens.extend(more);
                }
            }
        }
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

/// The writer's statements, each prepared when first needed and kept for
/// the writer's life (through rusqlite's statement cache each use hashed
/// the statement's text to find it).
struct Prepared<'c> {
    conn: &'c Connection,
    pack: Option<rusqlite::Statement<'c>>,
    run: Option<rusqlite::Statement<'c>>,
}

impl<'c> Prepared<'c> {
    fn new(conn: &'c Connection) -> Prepared<'c> {
        Prepared {
            conn,
            pack: None,
            run: None,
        }
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

/// The run's key in `packs`, looked up once per run in each batch
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
) -> rusqlite::Result<usize> {
    if let Some(at) = keys.get(run_id) {
        return Ok(at);
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
    Ok(keys.insert(run_id, k))
}

/// The runs one batch has records of, each with its key and the pack
/// being filled for it. A batch nearly always holds the records of one
/// run, which share its id: a short list searched by pointer first costs
/// less than hashing the id for every record.
#[derive(Default)]
struct RunKeys(Vec<RunPack>);

struct RunPack {
    id: Arc<str>,
    key: i64,
    pack: Vec<u8>,
}

impl RunKeys {
    /// Where the run is in the list.
    fn get(&self, id: &Arc<str>) -> Option<usize> {
        self.0
            .iter()
            .position(|known| Arc::ptr_eq(&known.id, id) || *known.id == **id)
    }

    fn insert(&mut self, id: &Arc<str>, key: i64) -> usize {
        self.0.push(RunPack {
            id: Arc::clone(id),
            key,
            pack: Vec::new(),
        });
        self.0.len() - 1
    }

    fn clear(&mut self) {
        self.0.clear();
    }
}

/// Writes one batch: each run's records, in the order they came, as
/// packs of about [`pack::PACK_BYTES`].
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
    for msg in batch {
        let (run_id, record) = match msg {
            ToStore::Exits {
                run_id, records, ..
            } => (run_id, records),
            ToStore::Cancel { run_id, record } => (run_id, record),
            ToStore::Close => continue,
        };
        let at = run_key(statements.conn, &mut statements.run, keys, run_id)?;
        let run = &mut keys.0[at];
        if run.pack.len() + record.len() > pack::PACK_BYTES && run.pack.len() > 1 {
            insert_pack(statements, run.key, &run.pack)?;
            run.pack.clear();
        }
        if run.pack.is_empty() {
            pack::start(&mut run.pack);
        }
        run.pack.extend_from_slice(record);
    }
    for run in &keys.0 {
        if run.pack.len() > 1 {
            insert_pack(statements, run.key, &run.pack)?;
        }
    }
    tx.commit()
}

fn insert_pack(statements: &mut Prepared<'_>, run: i64, pack: &[u8]) -> rusqlite::Result<()> {
    prepared(
        statements.conn,
        &mut statements.pack,
        "INSERT INTO packs (run, body) VALUES (?1, ?2)",
    )?
    .execute(params![run, pack])?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    #[test]
    fn a_batch_finds_each_run_by_its_id_whichever_copy_of_it() {
        let mut keys = RunKeys::default();
        let first: Arc<str> = Arc::from("run-a");
        assert_eq!(keys.insert(&first, 7), 0);
        assert_eq!(keys.insert(&Arc::from("run-b"), 9), 1);
        assert_eq!(keys.get(&first), Some(0));
        // Another allocation of the same id is the same run.
        assert_eq!(keys.get(&Arc::from("run-a")), Some(0));
        assert_eq!(keys.get(&Arc::from("run-b")), Some(1));
        assert_eq!(keys.0[1].key, 9);
        assert_eq!(keys.get(&Arc::from("run-c")), None);
        keys.clear();
        assert_eq!(keys.get(&first), None);
    }

    fn exit(run: &str, index: usize) -> ExitRecord {
        pack::tests::exit_of(run, index, crate::runtime::result::Verdict::Ok)
    }

    /// The run, record count, answers and record bytes of an `Exits`.
    fn exits(message: ToStore) -> (String, usize, usize, Vec<u8>) {
        match message {
            ToStore::Exits {
                run_id,
                records,
                count,
                thens,
            } => (run_id.to_string(), count, thens.len(), records),
            _ => panic!("not exits"),
        }
    }

    #[test]
    fn exits_ended_in_one_turn_of_an_arbiter_go_to_the_writer_in_one_message() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ledger = StoreLedger {
            outbox: Outbox::new(tx),
        };
        actix_rt::System::new().block_on(async move {
            for i in 0..3 {
                ledger.persist(exit("r", i), Some(Box::new(|_| {})));
            }
            assert!(rx.is_empty(), "held until the arbiter's turn ends");
            assert_eq!(ledger.queued(), 0, "held records are not queued yet");
            // A record nobody waits for (a failed execution's) goes at once.
            ledger.persist(exit("r", 3), None);
            assert_eq!(ledger.queued(), 1);
            let (run, count, thens, _) = exits(rx.try_recv().unwrap());
            assert_eq!((run.as_str(), count, thens), ("r", 1, 0));
            assert!(rx.is_empty());
            // Another run's exit: what was held goes first, whole.
            ledger.persist(exit("r2", 9), Some(Box::new(|_| {})));
            let (run, count, thens, records) = exits(rx.try_recv().unwrap());
            assert_eq!((run.as_str(), count, thens), ("r", 3, 3));
            assert_eq!(ledger.queued(), 4, "records, not messages");
            let one: Vec<u8> = (0..3)
                .flat_map(|i| pack::encode_exit(&exit("r", i)))
                .collect();
            assert_eq!(records.len(), one.len(), "the records back to back");
            assert!(rx.is_empty());
            // The turn ends: the task the first exit spawned sends the rest.
            for _ in 0..1000 {
                if !rx.is_empty() {
                    break;
                }
                tokio::task::yield_now().await;
            }
            let (run, count, thens, _) = exits(rx.try_recv().unwrap());
            assert_eq!((run.as_str(), count, thens), ("r2", 1, 1));
            assert!(rx.is_empty(), "one message each");
        });
    }

    #[test]
    fn an_exit_off_any_arbiter_is_sent_at_once_and_held_ones_when_the_thread_ends() {
        let (tx, rx) = crossbeam_channel::unbounded();
        let ledger = StoreLedger {
            outbox: Outbox::new(tx.clone()),
        };
        ledger.persist(exit("r", 1), Some(Box::new(|_| {})));
        let (run, count, thens, _) = exits(rx.try_recv().unwrap());
        assert_eq!((run.as_str(), count, thens), ("r", 1, 1));
        // A thread that ends holding exits (its arbiter stopped before the
        // sending task ran) sends them as it ends.
        std::thread::spawn(move || {
            HELD.with(|held| {
                let mut held = held.borrow_mut();
                held.to = Some((Outbox::new(tx), Arc::from("r")));
                held.records.extend(pack::encode_exit(&exit("r", 2)));
                held.count = 1;
            });
        })
        .join()
        .unwrap();
        let (run, count, thens, _) = exits(rx.try_recv().unwrap());
        assert_eq!((run.as_str(), count, thens), ("r", 1, 0));
    }

    #[test]
    fn exits_handed_to_a_stopped_writer_are_told_so() {
        let (tx, rx) = crossbeam_channel::unbounded();
        drop(rx);
        let ledger = StoreLedger {
            outbox: Outbox::new(tx),
        };
        let (told, heard) = std::sync::mpsc::channel();
        actix_rt::System::new().block_on(async move {
            let told = told.clone();
            ledger.persist(
                exit("r", 1),
                Some(Box::new(move |outcome| {
                    let _ = told.send(outcome.is_err());
                })),
            );
            for _ in 0..1000 {
                tokio::task::yield_now().await;
            }
        });
        assert_eq!(heard.try_recv(), Ok(true));
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
