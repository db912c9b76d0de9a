//! Checkpoints off the writer's thread.
//!
//! In WAL mode every commit appends pages to the `-wal` file, and now and
//! then those pages must be copied back into the database (a checkpoint)
//! so the WAL can start over. SQLite does that by default inside the
//! commit that takes the WAL past 1 000 pages, on the committing thread,
//! and a checkpoint syncs twice (the WAL, then the database). For the
//! store's one writer that meant a stall of several milliseconds every
//! few thousand rows, during which a whole batch of finished executions
//! waited for their answers while holding their slots: a 100 000-wide run
//! checkpointed about 19 times, and its commit latency's tail was these
//! stalls.
//!
//! Here the writer's connection gets a WAL hook in place of SQLite's own:
//! past the same 1 000 pages it only nudges a thread of its own, which
//! runs a *passive* checkpoint on a second connection. A passive
//! checkpoint never waits on the writer; it copies what no reader still
//! needs, up to the WAL's end as it was when the pass began. The WAL
//! starts over at the writer's next transaction only if nothing was
//! committed since then, so the thread runs a pass after every commit
//! while the WAL is long, and a short pass soon catches up. Should the WAL
//! still grow past a valve (sixteen times as many pages), the writer
//! checkpoints it itself, as SQLite would have. Durability is unchanged: a
//! commit is durable once it is in the WAL, checkpointed or not.

use std::path::Path;
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender};
use rusqlite::{Connection, OpenFlags};

use super::schema;

/// The WAL's sizes, in pages, at which the hook acts.
#[derive(Clone, Copy)]
struct Marks {
    /// Past this a checkpoint is asked of the thread.
    nudge: i32,
    /// Past this the writer checkpoints itself.
    most: i32,
}

/// The store's marks: SQLite's default auto-checkpoint (1 000 pages) for
/// the nudge, sixteen times that (64 MiB of 4 KiB pages) for the valve.
const MARKS: Marks = Marks {
    nudge: 1000,
    most: 16_000,
};

/// The checkpointing thread, owned by the writer's thread: it ends once
/// every connection holding its nudge (the writer's hook) is closed.
pub(super) struct Checkpointer {
    thread: JoinHandle<()>,
}

impl Checkpointer {
    /// Starts the thread and hands `writer` a WAL hook that nudges it.
    /// `None` (and SQLite's own checkpoints left in place) when it cannot
    /// start: checkpoints then run on the writer's thread, as before.
    pub(super) fn start(writer: &mut Connection, path: &Path) -> Option<Checkpointer> {
        let (nudge, nudges) = crossbeam_channel::bounded::<()>(1);
        let path = path.to_owned();
        let thread = std::thread::Builder::new()
            .name("troupe-checkpoint".into())
            .spawn(move || checkpoint(&path, &nudges))
            .ok()?;
        if writer.wal_hook(Some(hook(nudge, MARKS))).is_err() {
            // The nudge went with the refused hook: the thread ends.
            let _ = thread.join();
            return None;
        }
        Some(Checkpointer { thread })
    }

    /// Waits for the thread, once the writer's connection is closed.
    pub(super) fn join(self) {
        let _ = self.thread.join();
    }
}

/// The writer's WAL hook: called after each commit with the WAL's size in
/// pages. A nudge already waiting is enough, so it never blocks.
fn hook(
    nudge: Sender<()>,
    marks: Marks,
) -> impl FnMut(&mut rusqlite::hooks::Wal, i32) -> rusqlite::Result<()> {
    move |wal, pages| {
        if pages >= marks.most {
            // As SQLite's own hook would; what it could not copy stays.
            let _ = wal.checkpoint();
        } else if pages >= marks.nudge {
            let _ = nudge.try_send(());
        }
        Ok(())
    }
}

/// Checkpoints once per nudge. The connection is opened at the first: a
/// run whose WAL never grows that long (most runs) opens none, and the
/// writer's connection has already checked and migrated the file.
fn checkpoint(path: &Path, nudges: &Receiver<()>) {
    let mut conn = None;
    for () in nudges {
        if conn.is_none() {
            conn = Connection::open_with_flags(path, OpenFlags::SQLITE_OPEN_READ_WRITE)
                .and_then(|c| c.busy_timeout(schema::BUSY_TIMEOUT).map(|()| c))
                .ok();
        }
        // Not opened, busy (another process checkpointing) or an I/O error:
        // nothing is lost, the pages stay in the WAL and the next nudge
        // tries again.
        if let Some(conn) = &conn {
            let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The safety valve: with the checkpointing thread stalled (its nudges
    /// never taken), the writer's hook checkpoints the WAL itself once it
    /// passes its valve ([`Marks::most`]), so the WAL stops growing there. Without the
    /// valve it grows to all the pages written (the hook replaces
    /// SQLite's own checkpoints). The marks are a hundredth of the
    /// store's, so the test writes a few hundred KiB, not tens of MiB.
    #[test]
    fn the_writer_checkpoints_a_wal_past_the_most_pages_when_the_thread_lags() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("valve.db");
        let mut conn = Connection::open(&path).expect("open");
        // Small pages, so that the valve is reached with little written.
        conn.execute_batch(
            "PRAGMA page_size = 512; PRAGMA journal_mode = WAL; PRAGMA synchronous = OFF;
             CREATE TABLE t (x BLOB);",
        )
        .expect("set up");
        let (nudge, _stalled) = crossbeam_channel::bounded::<()>(1);
        let marks = Marks {
            nudge: MARKS.nudge / 100,
            most: MARKS.most / 100,
        };
        conn.wal_hook(Some(hook(nudge, marks))).expect("hook");
        let row = vec![7u8; 400];
        let frame = 512 + 24;
        let wal = dir.path().join("valve.db-wal");
        let mut largest = 0;
        // Twice the valve's pages, ten rows (about ten pages) a commit.
        for _ in 0..(2 * marks.most / 10) {
            let tx = conn.transaction().expect("begin");
            for _ in 0..10 {
                tx.execute("INSERT INTO t (x) VALUES (?1)", [&row])
                    .expect("insert");
            }
            tx.commit().expect("commit");
            largest = largest.max(std::fs::metadata(&wal).expect("the WAL").len());
        }
        let valve = u64::try_from(marks.most).expect("positive") * frame;
        assert!(
            largest > valve,
            "the WAL reached the valve ({largest} bytes)"
        );
        assert!(
            largest < valve + valve / 4,
            "the WAL grew to {largest} bytes, past the valve's {valve}"
        );
    }
}
