//! Event sinks on their own threads: the audit log (audit events only,
//! never dropped, as zstd-compressed binary records that read back as JSON
//! lines, see [`crate::auditlog`],
//! flushed within milliseconds and closed when the bus closes) and the `--events`
//! stream (every event; observer events may be dropped under load, which is
//! reported as `SubscriberLagged`).
//!
//! An audit log that cannot be written (disk full, its file removed or
//! replaced) is not a warning: the writer says so on the sink's failure
//! notice, naming what was lost, and the session ends the run with
//! `Session/AuditLost` rather than keep working without a record.

use std::fs::File;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{RecvTimeoutError, TryRecvError};
use tokio::sync::oneshot;

use troupe_actors::{Delivery, EventBus, Subscription};

use super::events::Event;
use crate::auditlog::records::RecordWriter;
use crate::auditlog::{self, Compressed, FORMAT_LINES, Frames};

mod compressing;
mod formatting;
use compressing::{Compressing, LostFrom};
use formatting::Formatters;
pub use formatting::{formatters_for, formatters_here};

/// Queue length of the audit subscriber; publishers wait when it is full.
const AUDIT_QUEUE: usize = 65_536;
/// Queue length of the `--events` subscriber.
const STREAM_QUEUE: usize = 8_192;

/// A sink thread; `finish` waits for it to drain and flush.
#[derive(Debug)]
pub struct Sink {
    handle: JoinHandle<io::Result<u64>>,
    pub path: Option<PathBuf>,
    /// Says why, when the sink stops writing before the bus closes.
    failure: Option<oneshot::Receiver<String>>,
}

impl Sink {
    /// Wraps a thread that drains a subscription.
    pub fn from_thread(handle: JoinHandle<io::Result<u64>>) -> Sink {
        Sink {
            handle,
            path: None,
            failure: None,
        }
    }

    /// The notice the audit writer sends when it can no longer write
    /// (`Session/AuditLost: …`); taken once, by whoever ends the run.
    pub fn take_failure_notice(&mut self) -> Option<oneshot::Receiver<String>> {
        self.failure.take()
    }

    /// Waits until the bus is closed and everything is written; returns the
    /// number of lines.
    pub fn finish(self) -> io::Result<u64> {
        self.handle
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("event sink thread panicked")))
    }
}

/// Starts the audit log writer at `path` (parent folders are created),
/// a new file, with `formatters` threads formatting its lines
/// ([`formatters_here`] the run's threads; 0: the writer formats).
pub fn start_audit_log(bus: &EventBus<Event>, path: &Path, formatters: usize) -> io::Result<Sink> {
    open_audit_log(bus, path, false, formatters)
}

/// Starts the audit log writer at `path`, appending to what is there (a
/// resumed run, after its log was repaired).
pub fn continue_audit_log(
    bus: &EventBus<Event>,
    path: &Path,
    formatters: usize,
) -> io::Result<Sink> {
    open_audit_log(bus, path, true, formatters)
}

fn open_audit_log(
    bus: &EventBus<Event>,
    path: &Path,
    append: bool,
    formatters: usize,
) -> io::Result<Sink> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let file = if append {
        std::fs::OpenOptions::new().append(true).open(path)?
    } else {
        File::create(path)?
    };
    let file = AuditFile::new(file, path)?;
    // A resumed run's log keeps its format: an older troupe's holds JSON
    // lines, and a reader takes a log's format from its header. A plain
    // log is JSON lines too.
    let format = if auditlog::is_plain(path) {
        FORMAT_LINES
    } else if append {
        auditlog::format_of(path).map_err(io::Error::other)?
    } else {
        auditlog::FORMAT
    };
    let records = format != FORMAT_LINES;
    let (notice, failure) = oneshot::channel();
    let shown = path.display().to_string();
    // Told by whichever thread finds the log failed first.
    let notice = Arc::new(Mutex::new(Some(notice)));
    let tell = move |why: String| {
        let sender = notice.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(sender) = sender {
            let _ = sender.send(format!("{AUDIT_LOST}: the audit log {shown}: {why}"));
        }
    };
    let on_failure = {
        let tell = tell.clone();
        move |e: &io::Error| tell(loss_text(e, 0, None))
    };
    let out = if auditlog::is_plain(path) {
        AuditOut::Plain(file)
    } else if formatters > 0 {
        // The formatters compress; the thread writes their segments.
        let log = if append {
            Frames::append(file)
        } else {
            Frames::create(file)
        };
        AuditOut::Compact(Compressing::start(log, 0, formatters, on_failure)?)
    } else {
        let log = if append {
            Compressed::append(file, format)?
        } else {
            Compressed::create(file)?
        };
        AuditOut::Compact(Compressing::start(log, BATCH + 4096, 0, on_failure)?)
    };
    let sub = bus.subscribe_audit("audit-log", AUDIT_QUEUE);
    let line = LineFormat::of(&sub, "");
    let formatters = match &out {
        AuditOut::Compact(log) if formatters > 0 => {
            let line = line.clone();
            Some(Formatters::start(
                formatters,
                log.spare(),
                records,
                Arc::new(move |delivery, encoder: &mut Encoder, out: &mut Vec<u8>| {
                    line.write(delivery, encoder, out)
                }),
            )?)
        }
        _ => None,
    };
    let handle = std::thread::Builder::new()
        .name("troupe-audit".into())
        .spawn(move || {
            let written = match (out, formatters) {
                (AuditOut::Compact(mut log), Some(formatters)) => {
                    let mut gathered = Gathered {
                        formatters,
                        log: &mut log,
                    };
                    let written = drain(&sub, &mut gathered, PACE);
                    // The formatters end once every batch handed on is
                    // formatted, before the log is closed.
                    drop(gathered);
                    written
                        .and_then(|n| log.finish().map_err(|e| lost_from(e, n, None)).map(|()| n))
                }
                (mut out, _) => {
                    let mut formatted = Formatted::new(&mut out, line, Encoder::new(records));
                    drain(&sub, &mut formatted, PACE)
                        .and_then(|n| out.finish().map_err(|e| lost_from(e, n, None)).map(|()| n))
                }
            };
            if let Err(e) = &written {
                tell(e.to_string());
            }
            written
        })?;
    Ok(Sink {
        handle,
        path: Some(path.to_owned()),
        failure: Some(failure),
    })
}

/// The code of a run whose audit log could not be written.
pub const AUDIT_LOST: &str = "Session/AuditLost";

/// The audit log's file, which checks on every flush that its path still
/// names it: a log removed or replaced mid-run goes on taking writes into
/// an unlinked file, and the record would be lost without a word.
struct AuditFile {
    file: File,
    path: PathBuf,
    /// `(device, inode)` of the file as opened.
    id: (u64, u64),
}

impl AuditFile {
    fn new(file: File, path: &Path) -> io::Result<AuditFile> {
        let meta = file.metadata()?;
        Ok(AuditFile {
            file,
            path: path.to_owned(),
            id: (meta.dev(), meta.ino()),
        })
    }
}

impl Write for AuditFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()?;
        let same = std::fs::metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.id);
        if !same {
            return Err(io::Error::new(
                io::ErrorKind::NotFound,
                "the file was removed or replaced while the run wrote it",
            ));
        }
        Ok(())
    }
}

/// The audit log's writer: compact (`audit.log.zst`, compressed on a
/// thread of its own), or plain when a resumed run's folder has an older
/// troupe's `audit.jsonl`.
enum AuditOut {
    Plain(AuditFile),
    Compact(Compressing),
}

impl AuditOut {
    /// Closes the open segment.
    fn finish(self) -> io::Result<()> {
        match self {
            AuditOut::Plain(mut file) => file.flush(),
            AuditOut::Compact(log) => log.finish(),
        }
    }
}

impl LineOut for AuditOut {
    fn note_lines(&mut self, lines: u64) {
        if let AuditOut::Compact(log) = self {
            log.note_lines(lines);
        }
    }
}

impl Write for AuditOut {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            AuditOut::Plain(file) => file.write(buf),
            AuditOut::Compact(log) => log.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            AuditOut::Plain(file) => file.flush(),
            AuditOut::Compact(log) => log.flush(),
        }
    }
}

/// Streams every event of run `run_id` as JSON lines to `out` (e.g.
/// stdout).
pub fn start_event_stream<W: Write + Send + 'static>(
    bus: &EventBus<Event>,
    run_id: &str,
    out: W,
) -> io::Result<Sink> {
    let sub = bus.subscribe("events-stream", STREAM_QUEUE);
    let run_id = run_id.to_owned();
    let handle = std::thread::Builder::new()
        .name("troupe-events".into())
        .spawn(move || {
            let mut out = Stream(out);
            write_lines(sub, &mut out, PACE, &run_id)
        })?;
    Ok(Sink::from_thread(handle))
}

/// The longest a written line waits in the buffer before it is flushed: a
/// burst becomes one `write` instead of one per line (the kernel's share of
/// the audit thread was a quarter of it), while a reader tailing the file —
/// or a process killed outright — misses at most this much.
const FLUSH_LINGER: Duration = Duration::from_millis(5);

/// Lines are written in batches of about this many bytes (or sooner, see
/// [`FLUSH_LINGER`]).
const BATCH: usize = 64 * 1024;

/// How a sink waits for events.
///
/// While events keep coming, an empty queue is looked at again after
/// `poll` instead of being waited on: a writer parked on the channel must
/// be woken by the publisher that fills it, a futex call on the actor
/// thread for nearly every event when the writer keeps up (BENCHMARKS.md).
/// A sleeping writer is never woken; it finds a burst when it looks again.
/// After `idle_polls` empty looks in a row the writer blocks on the channel
/// until the next event, so an idle run (a model thinking for a minute)
/// costs nothing.
#[derive(Debug, Clone, Copy)]
struct Pace {
    poll: Duration,
    idle_polls: u32,
}

/// 200 µs between looks, blocking after about 5 ms with nothing to write.
const PACE: Pace = Pace {
    poll: Duration::from_micros(200),
    idle_polls: 25,
};

/// Writes what `sub` receives as JSON lines into `out`.
fn write_lines<W: LineOut>(
    sub: Subscription<Event>,
    out: &mut W,
    pace: Pace,
    run_id: &str,
) -> io::Result<u64> {
    let line = LineFormat::of(&sub, run_id);
    drain(&sub, &mut Formatted::new(out, line, Encoder::Lines), pace)
}

/// Where [`Formatted`] writes: a [`Write`] told how many lines each
/// flushed batch holds (binary records cannot be counted by their
/// newlines, and a failed write says how many lines it lost).
pub(super) trait LineOut: Write {
    /// The batch written since the last flush holds `lines` lines.
    fn note_lines(&mut self, _lines: u64) {}
}

/// A stream of JSON lines (`--events`), which counts nothing.
struct Stream<W>(W);

impl<W: Write> Write for Stream<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.0.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

impl<W: Write> LineOut for Stream<W> {}

/// How the log's lines are written: as JSON lines (the `--events` stream,
/// a plain log, an older troupe's compact log) or as binary records,
/// numbering strings batch by batch.
pub(super) enum Encoder {
    Lines,
    Records(Box<RecordWriter>),
}

impl Encoder {
    pub(super) fn new(records: bool) -> Encoder {
        if records {
            Encoder::Records(Box::default())
        } else {
            Encoder::Lines
        }
    }

    /// Starts a batch (a record batch forgets the last one's strings).
    pub(super) fn begin(&mut self, out: &mut Vec<u8>) {
        if let Encoder::Records(w) = self {
            w.begin(out);
        }
    }
}

/// How one delivery becomes a line. A `SubscriberLagged` diagnostic
/// (observer events dropped for a slow reader) gets the head keys every
/// line has: the seq of the last event it stands for, the time it was
/// written and the run's id.
#[derive(Clone)]
struct LineFormat {
    subscriber: Arc<str>,
    run_id: Arc<str>,
}

impl LineFormat {
    fn of(sub: &Subscription<Event>, run_id: &str) -> LineFormat {
        LineFormat {
            subscriber: Arc::from(sub.name()),
            run_id: Arc::from(run_id),
        }
    }

    /// Appends the delivery's line (with its newline) or record.
    fn write(
        &self,
        delivery: Delivery<Event>,
        encoder: &mut Encoder,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        match (delivery, encoder) {
            (Delivery::Event(env), Encoder::Lines) => {
                env.event.write_json(env.seq, out);
                out.push(b'\n');
            }
            (Delivery::Event(env), Encoder::Records(w)) => {
                env.event.write_record(env.seq, w, out);
            }
            (Delivery::Lagged { dropped, last_seq }, encoder) => {
                let notice = serde_json::json!({
                    "seq": last_seq,
                    "ts": super::events::rfc3339(std::time::SystemTime::now()),
                    "event": "SubscriberLagged",
                    "workflowRunId": &*self.run_id,
                    "subscriber": &*self.subscriber,
                    "dropped": dropped,
                });
                match encoder {
                    Encoder::Lines => {
                        serde_json::to_writer(&mut *out, &notice)?;
                        out.push(b'\n');
                    }
                    // Writing a `Value` into a `Vec` cannot fail.
                    Encoder::Records(w) => w.line(out, |o| {
                        let _ = serde_json::to_writer(o, &notice);
                    }),
                }
            }
        }
        Ok(())
    }
}

/// Where [`drain`] puts what it takes: lines formatted at once into a
/// writer, or events gathered for the formatter threads.
trait Lines {
    /// Takes the delivery at `seq`; true when a batch is due by size.
    fn take(&mut self, seq: u64, delivery: Delivery<Event>) -> io::Result<bool>;

    /// Writes (or hands on) what was taken; `lines` so far, these
    /// included, for a failure's text.
    fn write_out(&mut self, lines: u64) -> io::Result<()>;
}

/// Lines formatted by the writer thread itself.
struct Formatted<'a, W> {
    out: &'a mut W,
    line: LineFormat,
    encoder: Encoder,
    /// Lines in `pending`.
    lines: u64,
    /// Lines formatted but not yet written; formatted in place, so each
    /// line is copied once, by the `write`.
    pending: Vec<u8>,
    /// The seq of the first pending line: what a failed write loses from.
    from: Option<u64>,
}

impl<'a, W: LineOut> Formatted<'a, W> {
    fn new(out: &'a mut W, line: LineFormat, encoder: Encoder) -> Self {
        Formatted {
            out,
            line,
            encoder,
            lines: 0,
            pending: Vec::with_capacity(BATCH + 4096),
            from: None,
        }
    }
}

impl<W: LineOut> Lines for Formatted<'_, W> {
    fn take(&mut self, seq: u64, delivery: Delivery<Event>) -> io::Result<bool> {
        if self.pending.is_empty() {
            self.encoder.begin(&mut self.pending);
        }
        self.from.get_or_insert(seq);
        self.line
            .write(delivery, &mut self.encoder, &mut self.pending)?;
        self.lines += 1;
        Ok(self.pending.len() >= BATCH)
    }

    /// Writes and flushes the pending lines. A failure says from which
    /// seq on events are missing: the pending ones and every later one
    /// (the writer stops, and the bus drops a subscriber that stopped
    /// reading).
    fn write_out(&mut self, lines: u64) -> io::Result<()> {
        let from = self.from.take();
        self.out.note_lines(std::mem::take(&mut self.lines));
        let written = self
            .out
            .write_all(&self.pending)
            .and_then(|()| self.out.flush());
        self.pending.clear();
        written.map_err(|e| lost_from(e, lines, from))
    }
}

/// Events gathered for the formatter threads, their lines written by the
/// compressing thread in the order the batches were handed on.
struct Gathered<'a> {
    formatters: Formatters,
    log: &'a mut Compressing,
}

impl Lines for Gathered<'_> {
    fn take(&mut self, seq: u64, delivery: Delivery<Event>) -> io::Result<bool> {
        Ok(self.formatters.push(seq, delivery))
    }

    fn write_out(&mut self, lines: u64) -> io::Result<()> {
        self.formatters
            .hand_on(self.log)
            .map_err(|e| lost_from(e, lines, None))
    }
}

/// Takes what `sub` receives into `lines` until the bus closes; the
/// number of lines.
fn drain(sub: &Subscription<Event>, into: &mut impl Lines, pace: Pace) -> io::Result<u64> {
    let mut lines = 0u64;
    // When the oldest pending line must be written by.
    let mut flush_by: Option<Instant> = None;
    let mut idle = 0u32;
    loop {
        // What is queued is taken without reading the clock; the clock and
        // the deadline matter only when the queue runs dry.
        let delivery = match sub.poll() {
            Ok(d) => d,
            Err(TryRecvError::Disconnected) => break,
            Err(TryRecvError::Empty) if idle < pace.idle_polls => {
                idle += 1;
                if flush_by.is_some_and(|deadline| Instant::now() >= deadline) {
                    into.write_out(lines)?;
                    flush_by = None;
                }
                std::thread::sleep(pace.poll);
                continue;
            }
            Err(TryRecvError::Empty) => {
                let next = match flush_by {
                    Some(deadline) => sub.recv_deadline(deadline),
                    None => sub.recv().ok_or(RecvTimeoutError::Disconnected),
                };
                match next {
                    Ok(d) => d,
                    Err(RecvTimeoutError::Timeout) => {
                        into.write_out(lines)?;
                        flush_by = None;
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            }
        };
        idle = 0;
        let seq = match &delivery {
            Delivery::Event(env) => env.seq,
            Delivery::Lagged { last_seq, .. } => *last_seq,
        };
        let full = into.take(seq, delivery)?;
        lines += 1;
        let due = match flush_by {
            None => {
                flush_by = Some(Instant::now() + FLUSH_LINGER);
                false
            }
            // Under a steady stream the queue is never empty: look at the
            // clock every 64 lines.
            Some(deadline) => lines.is_multiple_of(64) && Instant::now() >= deadline,
        };
        if due || full {
            into.write_out(lines)?;
            flush_by = None;
        }
    }
    into.write_out(lines)?;
    Ok(lines)
}

/// A failed write's error, saying how many lines went with a removed file
/// and from which `seq` on events are missing: `from` (the batch being
/// written), unless the error is the compressing thread's, which comes a
/// batch or more late and says itself where its loss began.
fn lost_from(e: io::Error, lines: u64, from: Option<u64>) -> io::Error {
    io::Error::new(e.kind(), loss_text(&e, lines, from))
}

/// [`lost_from`]'s text; a compressing thread's error brings its own
/// `seq` and its own count of the lines on disk.
fn loss_text(e: &io::Error, lines: u64, from: Option<u64>) -> String {
    let (from, lines) = match LostFrom::of(e) {
        Some(lost) => (lost.seq.or(from), lost.lines),
        None => (from, lines),
    };
    let mut text = e.to_string();
    if e.kind() == io::ErrorKind::NotFound {
        text.push_str(&format!(
            "; the {lines} lines written to it are gone with it"
        ));
    }
    if let Some(seq) = from {
        text.push_str(&format!(
            "; every event from seq {seq} on is missing from it"
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::runtime::events::EventName;

    /// Publishes `n` events from another thread while the writer runs
    /// with `pace`, then closes the bus; returns what was written.
    fn written(pace: Pace, n: u64) -> (u64, Vec<u64>) {
        let bus: EventBus<Event> = EventBus::new();
        let sub = bus.subscribe_audit("audit-log", 16);
        let writer = std::thread::spawn(move || {
            let mut out = Stream(Vec::new());
            let lines = write_lines(sub, &mut out, pace, "run").expect("writes to memory");
            (lines, out.0)
        });
        let run: Arc<str> = Arc::from("run");
        for i in 0..n {
            bus.publish(Event::new(EventName::StageEntered, Arc::clone(&run)).with("visit", i));
        }
        bus.close();
        let (lines, out) = writer.join().expect("the writer ends when the bus closes");
        let visits = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let v: serde_json::Value = serde_json::from_slice(l).expect("a JSON line");
                v["visit"].as_u64().expect("visit")
            })
            .collect();
        (lines, visits)
    }

    #[test]
    fn a_lagged_reader_gets_a_diagnostic_line_with_every_head_key() {
        let bus: EventBus<Event> = EventBus::new();
        let sub = bus.subscribe("events-stream", 2);
        let run: Arc<str> = Arc::from("run-1");
        // Nobody reads yet: the third and fourth observer events are dropped.
        for _ in 0..4 {
            bus.publish(Event::new(EventName::Progress, Arc::clone(&run)));
        }
        let writer = std::thread::spawn(move || {
            let mut out = Stream(Vec::new());
            write_lines(sub, &mut out, PACE, "run-1").expect("writes to memory");
            out.0
        });
        bus.publish(Event::new(EventName::StageEntered, Arc::clone(&run)));
        bus.close();
        let out = writer.join().expect("the writer ends");
        let lines: Vec<serde_json::Value> = out
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| serde_json::from_slice(l).expect("a JSON line"))
            .collect();
        let lagged = lines
            .iter()
            .find(|l| l["event"] == "SubscriberLagged")
            .expect("a lag line");
        assert_eq!(
            lagged["seq"], 4,
            "it stands where the last dropped event was"
        );
        assert_eq!(lagged["workflowRunId"], "run-1");
        assert_eq!(lagged["dropped"], 2);
        assert!(lagged["ts"].as_str().is_some_and(|t| t.ends_with('Z')));
        let keys: Vec<&str> = lagged
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .take(4)
            .collect();
        assert_eq!(keys, ["seq", "ts", "event", "workflowRunId"]);
        let seqs: Vec<u64> = lines
            .iter()
            .map(|l| l["seq"].as_u64().expect("seq"))
            .collect();
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    }

    #[test]
    fn a_log_formatted_on_several_threads_has_every_event_once_in_seq_order() {
        let dir = tempfile::tempdir().expect("a temporary folder");
        let path = dir.path().join(auditlog::FILE);
        let bus: EventBus<Event> = EventBus::new();
        let sink = start_audit_log(&bus, &path, 3).expect("the writer starts");
        let run: Arc<str> = Arc::from("run");
        // Two publishers, so batches mix their events.
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    for i in 0..5_000u64 {
                        bus.publish(
                            Event::new(EventName::StageEntered, Arc::clone(&run)).with("visit", i),
                        );
                    }
                });
            }
        });
        bus.close();
        assert_eq!(sink.finish().expect("written"), 10_000);
        let text = auditlog::read_text(&path).expect("a readable log");
        let seqs: Vec<u64> = text
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).expect("a JSON line");
                v["seq"].as_u64().expect("seq")
            })
            .collect();
        assert_eq!(seqs, (1..=10_000).collect::<Vec<_>>());
    }

    #[test]
    fn a_resumed_older_log_goes_on_in_json_lines_as_its_header_says() {
        for formatters in [0, 2] {
            let dir = tempfile::tempdir().expect("a temporary folder");
            let path = dir.path().join(auditlog::LINES_FILE);
            // An older troupe's log: format 1, its segments JSON lines.
            let first = b"{\"seq\":1,\"event\":\"WorkflowStarted\",\"workflowRunId\":\"run\"}\n";
            let file = File::create(&path).expect("the log");
            let mut log = Compressed::create_in(file, FORMAT_LINES).expect("a log");
            log.write_lines(first).expect("a line");
            log.finish().expect("closed");
            let bus: EventBus<Event> = EventBus::new();
            let sink = continue_audit_log(&bus, &path, formatters).expect("the writer starts");
            let run: Arc<str> = Arc::from("run");
            for i in 0..3u64 {
                bus.publish(Event::new(EventName::StageEntered, Arc::clone(&run)).with("visit", i));
            }
            bus.close();
            assert_eq!(sink.finish().expect("written"), 3);
            // What was appended is JSON lines too: the stock zstd prints
            // every line of the file, as troupe reads it.
            let stock = zstd::decode_all(&std::fs::read(&path).expect("read")[..]).expect("frames");
            let stock = String::from_utf8(stock).expect("lines");
            assert_eq!(
                stock,
                auditlog::read_text(&path).expect("a log"),
                "{formatters}"
            );
            assert_eq!(stock.lines().count(), 4, "{stock}");
            assert!(stock.starts_with(std::str::from_utf8(first).unwrap()));
        }
    }

    #[test]
    fn every_event_is_written_in_order_whether_the_writer_sleeps_or_blocks() {
        let all: Vec<u64> = (0..500).collect();
        // Never blocks: looks again after a sleep, even when idle.
        let polling = Pace {
            poll: Duration::from_micros(50),
            idle_polls: u32::MAX,
        };
        // Blocks on the channel as soon as the queue is empty.
        let blocking = Pace {
            poll: Duration::from_micros(50),
            idle_polls: 0,
        };
        // A queue of 16 also makes the publisher wait for the writer.
        for pace in [polling, blocking, PACE] {
            assert_eq!(written(pace, 500), (500, all.clone()), "{pace:?}");
        }
    }
}
