//! The whole log as JSON lines, its segments decoded on several threads
//! (`troupe runs export`). Writing a record back as its line is most of a
//! reader's work now that the log holds records (the writer's old cost,
//! paid once, when asked), and segments read on their own bytes: each
//! thread decodes a run of segments, and the lines are written in the
//! log's order, so the output is the one a single reader gives, byte for
//! byte, however many threads made it.

use std::collections::VecDeque;
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

use crossbeam_channel::{Receiver, Sender, TryRecvError, bounded, select};

use super::decode::{Hand, LogDecoder, LogEnd};
use super::error::AuditError;
use super::read::{DecodedReader, format_of};
use super::seek::segment_starts;

/// File bytes a thread decodes at once: whole segments, at least this
/// many (a formatter thread's segments are a few KiB each, and a zstd
/// decoder is made per job). A one-stream segment, 1 MiB of records, is
/// about 180 KiB on disk and 7.5 MiB of lines: a job is one of those.
pub(super) const JOB: u64 = 128 << 10;

/// The lines a job hands over at once, and how many may wait for the
/// writer: a job's usual lines (a 1 MiB segment's), however many a job's
/// bytes make (a crafted log's records can make gigabytes from a few
/// bytes). A job that has handed over its room waits; with less room, a
/// thread ahead would idle until the writer reaches its job. A piece
/// larger than [`LARGE_PIECE`] (it ends in a line of up to 256 MiB) is
/// handed over alone: its job waits until it is written.
pub(super) const PIECE: usize = 1 << 20;
const PIECES_WAITING: usize = 8;
const LARGE_PIECE: usize = 4 * PIECE;

/// Why an export stopped: the log could not be read (the lines before
/// the fault were written), or `out` could not be written.
#[derive(Debug)]
pub enum ExportError {
    Read(AuditError),
    Write(io::Error),
}

/// A run of whole segments, `[from, to)` in the file (`to` is `None` for
/// the log's end), and where its lines go.
struct Job {
    from: u64,
    to: Option<u64>,
    done: Sender<Decoded>,
}

/// What a job hands over: its lines, a [`PIECE`] at a time, then how its
/// bytes end, or the fault that stopped it.
enum Decoded {
    /// Lines, and for a large piece, where to say it was written.
    Lines(Vec<u8>, Option<Sender<()>>),
    End(Result<LogEnd, AuditError>),
}

/// Writes the whole lines of the compact or plain log at `path` into
/// `out`, decoding on up to `threads` threads. A torn end (a killed
/// process) is left out, as every reader leaves it; at a fault, the lines
/// before it are written and the fault returned.
pub fn export_lines(path: &Path, out: &mut dyn Write, threads: usize) -> Result<(), ExportError> {
    export_in_jobs(path, out, threads, JOB)
}

/// [`export_lines`] with jobs of `job` file bytes.
pub(super) fn export_in_jobs(
    path: &Path,
    out: &mut dyn Write,
    threads: usize,
    job: u64,
) -> Result<(), ExportError> {
    let starts = if super::is_plain(path) || threads < 2 {
        Vec::new()
    } else {
        segment_starts(path).map_err(ExportError::Read)?
    };
    if starts.len() < 2 {
        return export_in_one(path, out);
    }
    let format = format_of(path).map_err(ExportError::Read)?;
    in_jobs(path, &starts, format, out, threads, job, Hand::Lines)
        .map(|_| ())
        .map_err(|(e, _)| e)
}

/// The segments from `starts` decoded in jobs of about `job` file bytes
/// on `threads` threads, written into `out` in the log's order: records
/// handed out as `hand` says. How the log ends, or why it stopped with
/// the offset of the job being written then.
pub(super) fn in_jobs(
    path: &Path,
    starts: &[u64],
    format: u32,
    out: &mut dyn Write,
    threads: usize,
    job: u64,
    hand: Hand,
) -> Result<LogEnd, (ExportError, u64)> {
    let jobs = runs_of(starts, job);
    let threads = threads.min(jobs.len());
    let (work, taken) = bounded::<Job>(threads);
    // Jobs handed out ahead of the one being written: enough to keep
    // every thread busy, few enough to bound what waits in memory.
    let ahead = threads + 1;
    // Written buffers go back to the threads: a job's lines are megabytes,
    // and a fresh buffer each time is that much memory zeroed again.
    let (give_back, spare) = bounded::<Vec<u8>>(ahead * PIECES_WAITING + threads);
    // Nothing is sent on it: dropped when the writing stops, it tells
    // the threads to skip what is queued and wakes a job waiting for its
    // large piece to be written.
    let (writing, stopped) = bounded::<()>(0);
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (taken, spare, stopped) = (taken.clone(), spare.clone(), stopped.clone());
            s.spawn(move || decode_jobs(path, (format, hand), &taken, &spare, &stopped));
        }
        drop(taken);
        // Each job's receiver, and where its bytes begin.
        let mut pending: VecDeque<(Receiver<Decoded>, u64)> = VecDeque::with_capacity(ahead);
        let mut next = jobs.into_iter().peekable();
        // How the last job's bytes end, the log's end: never assumed. A
        // resume cuts the log to it.
        let mut end = None;
        let outcome = loop {
            while pending.len() < ahead {
                let Some((from, to)) = next.next() else { break };
                let (done, decoded) = bounded(PIECES_WAITING);
                if work.send(Job { from, to, done }).is_err() {
                    break;
                }
                pending.push_back((decoded, from));
            }
            let Some((decoded, from)) = pending.front() else {
                break match end {
                    Some(end) if next.peek().is_none() => Ok(end),
                    _ => Err((
                        ExportError::Read(corrupt(
                            path,
                            0,
                            "the log's last segments were not read".to_owned(),
                        )),
                        0,
                    )),
                };
            };
            let from = *from;
            match decoded.recv() {
                Ok(Decoded::Lines(lines, written)) => {
                    if let Err(e) = out.write_all(&lines) {
                        break Err((ExportError::Write(e), from));
                    }
                    if let Some(written) = written {
                        let _ = written.send(());
                    }
                    // A buffer grown past a large piece is let go.
                    if lines.capacity() <= LARGE_PIECE {
                        let _ = give_back.try_send(lines);
                    }
                }
                Ok(Decoded::End(Ok(ended))) => {
                    pending.pop_front();
                    // The last job's is the log's.
                    if pending.is_empty() && next.peek().is_none() {
                        end = Some(ended);
                    }
                }
                Ok(Decoded::End(Err(fault))) => break Err((ExportError::Read(fault), from)),
                Err(_) => {
                    let reason = "a decoding thread stopped".to_owned();
                    break Err((ExportError::Read(corrupt(path, from, reason)), from));
                }
            }
        };
        // The threads end once no more work comes, and a job whose lines
        // have no reader any more stops.
        drop(writing);
        drop(work);
        drop(pending);
        outcome
    })
}

/// The whole lines of a log as one `Read`, decoded by [`export_lines`] on
/// a thread of its own (and up to `threads` beneath it) ahead of the
/// reader: for a reader of a whole log that does its own work on each
/// line (`troupe report`), which then no longer also writes every record
/// back as its line. Dropped early, it stops the decoding and waits for
/// its thread. A fault is an `InvalidData` error carrying the
/// [`AuditError`]'s text, as [`DecodedReader`]'s.
#[derive(Debug)]
pub struct OrderedReader {
    chunks: Option<Receiver<Vec<u8>>>,
    current: Vec<u8>,
    at: usize,
    thread: Option<std::thread::JoinHandle<Result<(), ExportError>>>,
}

impl OrderedReader {
    /// Starts decoding the log at `path` (compact or plain).
    pub fn open(path: &Path, threads: usize) -> Result<OrderedReader, AuditError> {
        super::read::open_log(path, false).map_err(AuditError::io(path))?;
        let (to, chunks) = bounded(2);
        let thread = std::thread::Builder::new()
            .name("troupe-log-reader".into())
            .spawn({
                let path = path.to_owned();
                move || export_lines(&path, &mut Chunks(to), threads)
            })
            .map_err(AuditError::io(path))?;
        Ok(OrderedReader {
            chunks: Some(chunks),
            current: Vec::new(),
            at: 0,
            thread: Some(thread),
        })
    }

    /// How the decoding ended, once every chunk was read.
    fn ended(&mut self) -> io::Result<()> {
        match self.thread.take().map(std::thread::JoinHandle::join) {
            None | Some(Ok(Ok(()))) => Ok(()),
            Some(Ok(Err(ExportError::Read(e)))) => Err(e.into_io()),
            Some(Ok(Err(ExportError::Write(e)))) => Err(e),
            Some(Err(_)) => Err(io::Error::other("the log's reading thread panicked")),
        }
    }
}

impl Read for OrderedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.at == self.current.len() {
            match self.chunks.as_ref().and_then(|c| c.recv().ok()) {
                Some(chunk) => (self.current, self.at) = (chunk, 0),
                None => {
                    self.chunks = None;
                    self.ended()?;
                    return Ok(0);
                }
            }
        }
        let n = buf.len().min(self.current.len() - self.at);
        buf[..n].copy_from_slice(&self.current[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

impl Drop for OrderedReader {
    fn drop(&mut self) {
        // Its next chunk finds no reader, and the export stops.
        self.chunks = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// [`export_lines`]'s output as chunks on a channel.
struct Chunks(Sender<Vec<u8>>);

impl Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        self.0
            .send(buf.to_vec())
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "the reader stopped"))?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// One reader, from the first byte (a plain log, one segment, one thread).
fn export_in_one(path: &Path, out: &mut dyn Write) -> Result<(), ExportError> {
    let mut reader = DecodedReader::open(path).map_err(ExportError::Read)?;
    while let Some(lines) = reader.next_lines().map_err(ExportError::Read)? {
        out.write_all(lines).map_err(ExportError::Write)?;
    }
    Ok(())
}

/// The segments grouped into jobs of about `job` file bytes each; the
/// last job runs to the log's end.
fn runs_of(starts: &[u64], job: u64) -> Vec<(u64, Option<u64>)> {
    let mut jobs = Vec::new();
    let mut from = starts[0];
    for &start in &starts[1..] {
        if start - from >= job {
            jobs.push((from, Some(start)));
            from = start;
        }
    }
    jobs.push((from, None));
    jobs
}

/// A thread's loop: each job's bytes, decoded from its first segment into
/// a buffer from `spare` when there is one. A panic is the job's fault.
fn decode_jobs(
    path: &Path,
    (format, hand): (u32, Hand),
    jobs: &Receiver<Job>,
    spare: &Receiver<Vec<u8>>,
    stopped: &Receiver<()>,
) {
    let writer_stopped = || matches!(stopped.try_recv(), Err(TryRecvError::Disconnected));
    let mut bytes = vec![0u8; READ];
    // A piece and the feed that crosses it (LINES_AT_ONCE and a line).
    let buffer = || {
        let mut lines = spare
            .try_recv()
            .unwrap_or_else(|_| Vec::with_capacity(2 * PIECE));
        lines.clear();
        lines
    };
    for job in jobs {
        if writer_stopped() {
            continue;
        }
        let mut lines = buffer();
        // A piece goes to the writer; false once it has stopped reading.
        let mut hand_over = |lines: &mut Vec<u8>| {
            let piece = std::mem::replace(lines, buffer());
            if piece.len() <= LARGE_PIECE {
                return job.done.send(Decoded::Lines(piece, None)).is_ok();
            }
            let (written, wait) = bounded(1);
            if job.done.send(Decoded::Lines(piece, Some(written))).is_err() {
                return false;
            }
            // Until it is written, or the writer stops: a channel whose
            // reader is gone keeps what it holds while this job can still
            // send, so the answer alone might never come.
            select! {
                recv(wait) -> written => written.is_ok(),
                recv(stopped) -> _ => false,
            }
        };
        let ended = catch_unwind(AssertUnwindSafe(|| {
            let span = (job.from, job.to);
            decode(
                path,
                (format, hand),
                span,
                &mut bytes,
                &mut lines,
                &mut hand_over,
            )
        }))
        .unwrap_or_else(|_| Err(corrupt(path, job.from, "decoding panicked".into())));
        if !lines.is_empty() && !hand_over(&mut lines) {
            continue;
        }
        let _ = job.done.send(Decoded::End(ended));
    }
}

/// File bytes a thread reads at once.
const READ: usize = 1 << 16;

/// Decodes the file's bytes `from..to` into `lines`, [`READ`] bytes at a
/// time (the last job runs to the end of a log whose segment walk stopped
/// at damage: it is not read whole first), passing them to `hand_over`
/// each time they reach a [`PIECE`]; stops early, quietly, once it
/// returns false. A job before the last must end where a segment does,
/// all of its bytes read: a file cut short while it is read loses no line
/// silently. How the bytes end (the last job's: the log's). Records go
/// out as `hand` says.
fn decode(
    path: &Path,
    (format, hand): (u32, Hand),
    (from, to): (u64, Option<u64>),
    bytes: &mut [u8],
    lines: &mut Vec<u8>,
    hand_over: &mut dyn FnMut(&mut Vec<u8>) -> bool,
) -> Result<LogEnd, AuditError> {
    let mut file = super::read::open_log(path, false).map_err(AuditError::io(path))?;
    file.seek(SeekFrom::Start(from))
        .map_err(AuditError::io(path))?;
    let mut decoder = LogDecoder::segments_at(from, format, hand).map_err(|f| f.at(path))?;
    let mut left = to.map(|to| to - from);
    loop {
        let want = left.map_or(bytes.len(), |left| bytes.len().min(left as usize));
        if want == 0 {
            break;
        }
        let n = match file.read(&mut bytes[..want]) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(AuditError::io(path)(e)),
        };
        left = left.map(|left| left - n as u64);
        let mut unread = &bytes[..n];
        loop {
            let taken = decoder.feed(unread, lines).map_err(|f| f.at(path))?;
            unread = &unread[taken..];
            if lines.len() >= PIECE && !hand_over(lines) {
                return Ok(decoder.end());
            }
            if unread.is_empty() && !decoder.more() {
                break;
            }
        }
    }
    let end = decoder.finish().map_err(|f| f.at(path))?;
    match to {
        Some(to) if end.keep != to => Err(corrupt(
            path,
            end.fed,
            format!("the segments before byte {to} do not end whole"),
        )),
        _ => Ok(end),
    }
}

fn corrupt(path: &Path, offset: u64, reason: String) -> AuditError {
    AuditError::Corrupt {
        path: path.to_owned(),
        offset,
        reason,
    }
}
