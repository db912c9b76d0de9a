//! The compact audit log compressed on a thread of its own. The audit
//! thread is one per run and sets the pace of a wide run once the actors
//! are spread over cores; a third of its time was zstd (BENCHMARKS.md,
//! "Every core"). It now only formats lines: each batch it flushes is
//! handed to this writer's thread, which compresses it, ends the zstd
//! block and flushes the file, as the audit thread did before. A batch
//! is on disk within the time it takes to compress it; at most
//! [`IN_FLIGHT`] batches wait, and the audit thread waits when they do.
//!
//! With formatter threads (`formatting.rs`) the thread compresses
//! nothing: each formatter sends its batch as a whole compressed segment
//! through a slot, and this thread writes the segments in the order the
//! slots were handed over, which is `seq` order.

use std::io::{self, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::thread::JoinHandle;

use crossbeam_channel::{Receiver, Sender, bounded};

use crate::auditlog::{Compressed, Frames};

/// What the compressing thread writes next.
enum Batch {
    /// Lines (or records) the audit thread formatted, and how many.
    Lines(Vec<u8>, u64),
    /// A segment a formatter will send, its first line at `seq` `from`.
    Slot {
        from: u64,
        segment: Receiver<Segment>,
    },
}

/// A batch of lines as one compressed segment (a zstd frame).
pub(super) struct Segment {
    pub frame: Vec<u8>,
    pub lines: u64,
}

/// Where the thread writes: [`Compressed`] takes lines and compresses
/// them into its open segment; [`Frames`] takes whole segments.
pub(super) trait Segments: Send + 'static {
    /// Writes one batch and flushes it to disk.
    fn put(&mut self, batch: &[u8]) -> io::Result<()>;

    /// Ends the log.
    fn close(self) -> io::Result<()>;
}

impl<W: Write + Send + 'static> Segments for Compressed<W> {
    fn put(&mut self, batch: &[u8]) -> io::Result<()> {
        self.write_all(batch)?;
        self.flush()
    }

    fn close(self) -> io::Result<()> {
        self.finish().map(drop)
    }
}

impl<W: Write + Send + 'static> Segments for Frames<W> {
    fn put(&mut self, frame: &[u8]) -> io::Result<()> {
        self.write_frame(frame)
    }

    fn close(self) -> io::Result<()> {
        self.finish().map(drop)
    }
}

/// Batches handed over and not yet written, beyond one per formatter.
const IN_FLIGHT: usize = 4;

/// A [`Write`] whose `flush` hands what was written since the last one to
/// the compressing thread. An error of that thread is told at once to
/// `on_failure` (with the lines written before it: a run waiting on a
/// model must not wait for its next event to learn that its log is
/// gone), and comes back from a later `flush` (or `finish`), saying from
/// which `seq` events are lost.
pub(super) struct Compressing {
    to: Option<Sender<Batch>>,
    /// Buffers the thread is done with, for the next batches.
    spare: Receiver<Vec<u8>>,
    batch: Vec<u8>,
    /// Lines in `batch` ([`Compressing::note_lines`]).
    lines: u64,
    capacity: usize,
    thread: Option<JoinHandle<io::Result<()>>>,
}

impl Compressing {
    /// Starts the thread that writes into `log`.
    pub(super) fn start(
        log: impl Segments,
        capacity: usize,
        formatters: usize,
        on_failure: impl FnOnce(&io::Error) + Send + 'static,
    ) -> io::Result<Compressing> {
        let (to, batches) = bounded::<Batch>(IN_FLIGHT + formatters);
        let (give_back, spare) = bounded::<Vec<u8>>(IN_FLIGHT);
        let thread = std::thread::Builder::new()
            .name("troupe-zstd".into())
            .spawn(move || {
                let mut log = log;
                let mut lines = 0u64;
                // A panic in the compressor is a failed write too: the run
                // hears of it now, with the seq its loss starts at.
                let panicked = |_| io::Error::other("the audit log's compressor panicked");
                for batch in batches {
                    // The batch, its first line's seq and its line count.
                    let (mut batch, from, count) = match batch {
                        Batch::Lines(text, count) => {
                            let from = crate::auditlog::records::first_seq(&text);
                            (text, from, count)
                        }
                        Batch::Slot { from, segment } => match segment.recv() {
                            Ok(segment) => (segment.frame, Some(from), segment.lines),
                            Err(_) => {
                                let e = LostFrom::unformatted(from, lines);
                                on_failure(&e);
                                return Err(e);
                            }
                        },
                    };
                    let written = catch_unwind(AssertUnwindSafe(|| log.put(&batch)))
                        .unwrap_or_else(|p| Err(panicked(p)));
                    if let Err(e) = written {
                        let e = LostFrom::wrap(e, from, lines);
                        on_failure(&e);
                        return Err(e);
                    }
                    lines += count;
                    batch.clear();
                    let _ = give_back.try_send(batch);
                }
                catch_unwind(AssertUnwindSafe(|| log.close()))
                    .unwrap_or_else(|p| Err(panicked(p)))
                    .map_err(|e| LostFrom::closing(e, lines))
                    .inspect_err(|e| on_failure(e))
            })?;
        Ok(Compressing {
            to: Some(to),
            spare,
            batch: Vec::with_capacity(capacity),
            lines: 0,
            capacity,
            thread: Some(thread),
        })
    }

    /// Hands over what is left and waits for the thread to close the open
    /// segment.
    pub(super) fn finish(mut self) -> io::Result<()> {
        self.flush()?;
        self.to = None;
        self.join()
    }

    /// The thread's end: its error, if it had one.
    fn join(&mut self) -> io::Result<()> {
        match self.thread.take().map(JoinHandle::join) {
            Some(Ok(result)) => result,
            Some(Err(_)) => Err(io::Error::other(
                "the audit log's compressing thread panicked",
            )),
            None => Err(io::Error::other("the audit log's compressing thread ended")),
        }
    }
}

impl Write for Compressing {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.batch.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let next = self
            .spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(self.capacity));
        let batch = std::mem::replace(&mut self.batch, next);
        let lines = std::mem::take(&mut self.lines);
        let handed = self
            .to
            .as_ref()
            .is_some_and(|to| to.send(Batch::Lines(batch, lines)).is_ok());
        if handed {
            return Ok(());
        }
        Err(self.stopped())
    }
}

impl Compressing {
    /// The batch written since the last flush holds `lines` lines (a
    /// failed write says how many were on disk before it).
    pub(super) fn note_lines(&mut self, lines: u64) {
        self.lines += lines;
    }

    /// Hands over a slot for the lines of a batch whose first event is
    /// `from`: the returned sender is the formatter's. Waits while the
    /// thread's queue is full ([`IN_FLIGHT`] batches beyond one per
    /// formatter).
    pub(super) fn slot(&mut self, from: u64) -> io::Result<Sender<Segment>> {
        let (filled, segment) = bounded(1);
        let handed = self
            .to
            .as_ref()
            .is_some_and(|to| to.send(Batch::Slot { from, segment }).is_ok());
        if handed {
            return Ok(filled);
        }
        Err(self.stopped())
    }

    /// Buffers the thread is done with, for formatters to fill again.
    pub(super) fn spare(&self) -> Receiver<Vec<u8>> {
        self.spare.clone()
    }

    /// The thread stopped before the run's end: why.
    fn stopped(&mut self) -> io::Error {
        self.to = None;
        match self.join() {
            Err(e) => e,
            Ok(()) => io::Error::other("the audit log's compressing thread ended early"),
        }
    }
}

/// A write error of the compressing thread, with the `seq` of the first
/// line of the batch it could not write (the lines before it are on
/// disk, that one and every later one are not) and how many lines it had
/// written.
#[derive(Debug)]
pub(super) struct LostFrom {
    pub seq: Option<u64>,
    pub lines: u64,
    source: io::Error,
}

impl LostFrom {
    fn wrap(source: io::Error, seq: Option<u64>, lines: u64) -> io::Error {
        io::Error::new(source.kind(), LostFrom { seq, lines, source })
    }

    /// A formatter gave no lines for the batch from `seq` (it panicked):
    /// that batch and every later one are lost.
    fn unformatted(seq: u64, lines: u64) -> io::Error {
        io::Error::other(LostFrom {
            seq: Some(seq),
            lines,
            source: io::Error::other("the audit log's formatter panicked"),
        })
    }

    /// Closing the last segment failed: every line was handed over, the
    /// segment's end (its checksum) is what is missing.
    fn closing(source: io::Error, lines: u64) -> io::Error {
        io::Error::new(
            source.kind(),
            LostFrom {
                seq: None,
                lines,
                source,
            },
        )
    }

    /// What a compressing thread's error says of its loss.
    pub(super) fn of(e: &io::Error) -> Option<&LostFrom> {
        e.get_ref()
            .and_then(|inner| inner.downcast_ref::<LostFrom>())
    }

    /// The `seq` a compressing thread's error says its loss began at.
    #[cfg(test)]
    fn seq_of(e: &io::Error) -> Option<u64> {
        LostFrom::of(e).and_then(|lost| lost.seq)
    }
}

impl std::fmt::Display for LostFrom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.source.fmt(f)
    }
}

impl std::error::Error for LostFrom {}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that takes `room` bytes, then fails.
    struct Room {
        room: usize,
        written: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
    }

    impl Write for Room {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.len() > self.room {
                return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
            }
            self.room -= buf.len();
            self.written.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    fn lines(from: u64, to: u64) -> Vec<u8> {
        let mut out = Vec::new();
        for seq in from..to {
            out.extend_from_slice(format!("{{\"seq\":{seq},\"event\":\"X\"}}\n").as_bytes());
        }
        out
    }

    #[test]
    fn what_is_handed_over_is_the_log_in_order_and_closed_at_finish() {
        let written = std::sync::Arc::default();
        let file = Room {
            room: usize::MAX,
            written: std::sync::Arc::clone(&written),
        };
        let mut log = Compressing::start(
            Compressed::create_in(file, crate::auditlog::FORMAT_LINES).unwrap(),
            1024,
            0,
            |_| {},
        )
        .unwrap();
        let mut expected = Vec::new();
        for batch in 0..50 {
            let text = lines(batch * 10, batch * 10 + 10);
            log.write_all(&text).unwrap();
            log.flush().unwrap();
            expected.extend_from_slice(&text);
        }
        log.finish().unwrap();
        let bytes = written.lock().unwrap().clone();
        let mut decoded = Vec::new();
        let mut decoder = crate::auditlog::LogDecoder::compact();
        decoder.feed_all(&bytes, &mut decoded).unwrap();
        assert_eq!(decoded, expected);
        assert!(!decoder.end().unfinished(), "the segment is closed");
    }

    #[test]
    fn a_failed_write_says_from_which_seq_events_are_lost() {
        let written = std::sync::Arc::default();
        let file = Room {
            room: 0,
            written: std::sync::Arc::clone(&written),
        };
        let (told, heard) = std::sync::mpsc::channel();
        let mut log = Compressing::start(Compressed::create(file).unwrap(), 1024, 0, move |e| {
            let _ = told.send((LostFrom::seq_of(e), LostFrom::of(e).map(|l| l.lines)));
        })
        .unwrap();
        log.write_all(&lines(7, 9)).unwrap();
        // Told at once, before anything else is written.
        log.flush().unwrap();
        assert_eq!(heard.recv().unwrap(), (Some(7), Some(0)));
        // The first flush hands the batch over; a later one (or finish)
        // brings the thread's error back.
        let mut error = None;
        for _ in 0..IN_FLIGHT + 2 {
            if error.is_some() {
                break;
            }
            log.write_all(&lines(9, 10)).unwrap();
            error = log.flush().err();
        }
        let error = error.unwrap_or_else(|| log.finish().unwrap_err());
        assert_eq!(LostFrom::seq_of(&error), Some(7), "{error}");
        assert_eq!(error.kind(), io::ErrorKind::StorageFull);
        assert!(error.to_string().contains("disk full"), "{error}");
    }

    #[test]
    fn a_failed_write_says_how_many_lines_the_batches_before_it_put_on_disk() {
        /// Takes one flush, then fails.
        struct FlushesOnce(bool);
        impl Write for FlushesOnce {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                Ok(buf.len())
            }
            fn flush(&mut self) -> io::Result<()> {
                if std::mem::replace(&mut self.0, true) {
                    return Err(io::Error::new(io::ErrorKind::StorageFull, "disk full"));
                }
                Ok(())
            }
        }
        let (told, heard) = std::sync::mpsc::channel();
        let log = Compressed::create_in(FlushesOnce(false), crate::auditlog::FORMAT_LINES).unwrap();
        let mut log = Compressing::start(log, 1024, 0, move |e| {
            let _ = told.send((LostFrom::seq_of(e), LostFrom::of(e).map(|l| l.lines)));
        })
        .unwrap();
        log.write_all(&lines(1, 4)).unwrap();
        log.note_lines(3);
        log.flush().unwrap();
        log.write_all(&lines(4, 6)).unwrap();
        log.note_lines(2);
        let _ = log.flush();
        assert_eq!(heard.recv().unwrap(), (Some(4), Some(3)));
        let _ = log.finish();
    }

    #[test]
    fn a_panic_in_the_compressor_is_a_failure_told_at_once() {
        struct Panics;
        impl Write for Panics {
            fn write(&mut self, _: &[u8]) -> io::Result<usize> {
                panic!("a compressor bug");
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let (told, heard) = std::sync::mpsc::channel();
        let mut log = Compressing::start(Compressed::create(Panics).unwrap(), 1024, 0, move |e| {
            let _ = told.send((LostFrom::seq_of(e), e.to_string()));
        })
        .unwrap();
        log.write_all(&lines(3, 5)).unwrap();
        log.flush().unwrap();
        let (seq, text) = heard.recv().unwrap();
        assert_eq!(seq, Some(3));
        assert!(text.contains("panicked"), "{text}");
        assert!(log.finish().is_err());
    }
}
