//! Reading a log's file, whole or as it grows, with the [`LogDecoder`]:
//! every fault is an [`AuditError`] naming the byte, never a panic, and
//! no reader here holds more than the decoder's bound of lines at once
//! (`cut_to_whole` holds the open segment's compressed bytes, at most
//! 16 MiB, and writes its lines again a piece at a time).

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use super::decode::{Hand, LogDecoder, LogEnd, check_header, header_len};
use super::error::{AuditError, Fault};
use super::head::Head;
use super::records::{Entries, HeadEntry};
use super::write::{Compressed, FORMAT};

/// Opens the log at `path` to read it (and, with `write`, to repair it):
/// only a regular file. Open does not wait (`O_NONBLOCK`) on a FIFO put in
/// the log's place, which would hold a reader until some writer came; it
/// and anything else that is not a file (a device, a folder) is refused
/// as the I/O error it is.
pub fn open_log(path: &Path, write: bool) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    let file = OpenOptions::new()
        .read(true)
        .write(write)
        .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
        .open(path)?;
    if !file.metadata()?.is_file() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "not a regular file (a FIFO, a device or a folder is in the log's place)",
        ));
    }
    // Reads of a regular file never wait anyway; cleared all the same.
    nix::fcntl::fcntl(
        &file,
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::empty()),
    )
    .map_err(io::Error::from)?;
    Ok(file)
}

/// The format of the compact log at `path`, from its header (and nothing
/// after it: a damaged first segment does not keep a reader from the
/// later ones).
pub fn format_of(path: &Path) -> Result<u32, AuditError> {
    let mut file = open_log(path, false).map_err(AuditError::io(path))?;
    let mut head = vec![0u8; 8];
    let cut_short = |offset: usize| AuditError::Corrupt {
        path: path.to_owned(),
        offset: offset as u64,
        reason: "the log's header is cut short".into(),
    };
    file.read_exact(&mut head).map_err(|_| cut_short(0))?;
    let need = header_len(&head).ok_or_else(|| Fault::Foreign.at(path))?;
    head.resize(need, 0);
    file.read_exact(&mut head[8..]).map_err(|_| cut_short(8))?;
    check_header(&head).map_err(|f| f.at(path))
}

/// The most bytes an open segment may take on disk: twice the most any
/// troupe put in one before compressing it (8 MiB of JSON lines, in the
/// first format; 1 MiB of records now, [`super::SEGMENT`]), which
/// compresses to a fraction of that: past it a tail is damage, not a
/// killed writer's open segment.
const MAX_OPEN: u64 = 16 << 20;

/// How many file bytes a read takes at once.
const CHUNK: usize = 1 << 16;

/// The whole lines of a log as one `Read`: every line of the closed
/// segments and of the complete blocks after them; a torn end is left out.
/// A fault is an `InvalidData` error carrying the [`AuditError`]'s text.
#[derive(Debug)]
pub struct DecodedReader {
    path: PathBuf,
    file: File,
    decoder: LogDecoder,
    ready: Vec<u8>,
    at: usize,
    chunk: Box<[u8]>,
    /// The part of `chunk` the decoder has not taken in yet.
    unread: std::ops::Range<usize>,
    done: bool,
}

impl DecodedReader {
    /// Opens the log at `path` (compact or plain, by its name).
    pub fn open(path: &Path) -> Result<DecodedReader, AuditError> {
        DecodedReader::with(path, LogDecoder::for_path(path))
    }

    fn with(path: &Path, decoder: LogDecoder) -> Result<DecodedReader, AuditError> {
        let file = open_log(path, false).map_err(AuditError::io(path))?;
        Ok(DecodedReader {
            path: path.to_owned(),
            file,
            decoder,
            ready: Vec::new(),
            at: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
            unread: 0..0,
            done: false,
        })
    }

    /// How the bytes read so far end (all of them, once `read` returned
    /// 0).
    pub fn end(&self) -> LogEnd {
        self.decoder.end()
    }

    /// The next whole lines decoded, or `None` at the log's end.
    pub(super) fn next_lines(&mut self) -> Result<Option<&[u8]>, AuditError> {
        self.fill()?;
        Ok((!self.ready.is_empty()).then_some(&self.ready[..]))
    }

    /// Decodes until some lines are ready or the file ends. The lines
    /// before a fault come first (the decoder tells a fault in a call of
    /// its own); the fault with the next call.
    fn fill(&mut self) -> Result<(), AuditError> {
        self.ready.clear();
        self.at = 0;
        while self.ready.is_empty() && !self.done {
            if self.unread.is_empty() && !self.decoder.more() {
                let n = self
                    .file
                    .read(&mut self.chunk)
                    .map_err(AuditError::io(&self.path))?;
                if n == 0 {
                    self.done = true;
                    self.decoder.finish().map_err(|f| f.at(&self.path))?;
                    break;
                }
                self.unread = 0..n;
            }
            match self
                .decoder
                .feed(&self.chunk[self.unread.clone()], &mut self.ready)
            {
                Ok(taken) => self.unread.start += taken,
                Err(fault) => {
                    self.done = true;
                    return Err(fault.at(&self.path));
                }
            }
        }
        Ok(())
    }
}

impl Read for DecodedReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.at == self.ready.len() {
            self.fill().map_err(AuditError::into_io)?;
        }
        let n = buf.len().min(self.ready.len() - self.at);
        buf[..n].copy_from_slice(&self.ready[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Follows a log as it grows: each call reads what was appended since the
/// last one (the file is opened anew each time, so a follower holds no
/// descriptor between polls). A log a resume's repair rewrote under it
/// (cut back to its last whole segment, the open one written again) is
/// read again from where the follower began, leaving out the lines it
/// already gave (by their `seq`).
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    decoder: LogDecoder,
    /// Bytes read from the file that the decoder has not taken in yet
    /// (it stopped at its bound).
    unread: Vec<u8>,
    /// Where it began: 0, or a segment's start.
    start: u64,
    /// The `seq` of the last line it gave.
    last_seq: u64,
    /// Lines up to this `seq` were given before a restart: left out.
    skip_through: u64,
    /// The `last_seq` it last restarted at (a log damaged there for good
    /// is an error, not a loop).
    restarted_at: Option<u64>,
    /// The first bytes of the open segment (or torn line) it is reading,
    /// and where they begin: a repair cuts that segment and writes its
    /// whole lines again, which shows there even when the file has grown
    /// past where the follower was by its next look.
    probe: Option<(u64, Vec<u8>)>,
}

/// Bytes of an open segment's start a follower compares.
const PROBE: u64 = 64;

impl Follower {
    pub fn new(path: &Path) -> Follower {
        Follower {
            path: path.to_owned(),
            decoder: LogDecoder::for_path(path),
            unread: Vec::new(),
            start: 0,
            last_seq: 0,
            skip_through: 0,
            restarted_at: None,
            probe: None,
        }
    }

    /// A follower of the compact log at `path` from the segment that
    /// begins at byte `at` (see [`super::segment_starts`]; the header
    /// before it was checked there).
    pub fn at_segment(path: &Path, at: u64) -> Result<Follower, AuditError> {
        let format = format_of(path)?;
        Ok(Follower {
            path: path.to_owned(),
            decoder: LogDecoder::segments_at(at, format, Hand::Lines).map_err(|f| f.at(path))?,
            unread: Vec::new(),
            start: at,
            last_seq: 0,
            skip_through: 0,
            restarted_at: None,
            probe: None,
        })
    }

    /// Reads up to `max` new bytes of the file; appends whole lines they
    /// complete to `lines` (at most about [`super::LINES_AT_ONCE`] bytes of
    /// them). Returns the bytes read, or `max` when some read before wait
    /// to be decoded: less than `max` says the follower has caught up with
    /// the file, 0 that nothing was appended (or the file is not there
    /// yet).
    pub fn read_more(&mut self, max: usize, lines: &mut Vec<u8>) -> Result<usize, AuditError> {
        let from = lines.len();
        // Opened once a poll, shared by the probe and the read; not when
        // neither needs it (the decoder still holds bytes, no probe).
        let waiting = !self.unread.is_empty() || self.decoder.more();
        let mut file = if self.probe.is_some() || !waiting {
            match open_log(&self.path, false) {
                Ok(f) => Some(f),
                Err(e) if e.kind() == io::ErrorKind::NotFound => None,
                Err(e) => return Err(AuditError::io(&self.path)(e)),
            }
        } else {
            None
        };
        // A file cut back below the probe reads fewer bytes there: one
        // check covers a cut and a rewrite.
        let rewritten = self.probe.as_ref().is_some_and(|(at, seen)| {
            file.as_ref()
                .and_then(|f| bytes_at(f, *at, seen.len() as u64))
                .as_ref()
                != Some(seen)
        });
        let first = if rewritten {
            Err(AuditError::Corrupt {
                path: self.path.clone(),
                offset: self.decoder.end().fed,
                reason: "the log was cut back or written again under its reader".to_owned(),
            })
        } else {
            self.read_on(max, lines, file.as_ref())
        };
        // Read again from where it began, once at a given `seq`: a log
        // damaged there for good is the error it is.
        let read = match first {
            Err(AuditError::Corrupt { .. }) if self.restarted_at != Some(self.last_seq) => {
                lines.truncate(from);
                self.restart()?;
                if file.is_none() {
                    file = open_log(&self.path, false).ok();
                }
                self.read_on(max, lines, file.as_ref())
            }
            other => other,
        }?;
        self.given(from, lines);
        let end = self.decoder.end();
        self.probe = end.unfinished().then(|| {
            let at = end.keep;
            match self.probe.take() {
                Some((seen_at, seen)) if seen_at == at && seen.len() as u64 == PROBE => (at, seen),
                _ => (
                    at,
                    file.as_ref()
                        .and_then(|f| bytes_at(f, at, PROBE.min(end.fed - at)))
                        .unwrap_or_default(),
                ),
            }
        });
        Ok(read)
    }

    /// Starts again from where it began, leaving out what it gave.
    fn restart(&mut self) -> Result<(), AuditError> {
        let mut again = if self.start == 0 {
            Follower::new(&self.path)
        } else {
            Follower::at_segment(&self.path, self.start)?
        };
        again.start = self.start;
        again.last_seq = self.last_seq;
        again.skip_through = self.last_seq;
        again.restarted_at = Some(self.last_seq);
        *self = again;
        Ok(())
    }

    /// Leaves out the lines from `from` on that were given before a
    /// restart, and notes the last `seq` given.
    fn given(&mut self, from: usize, lines: &mut Vec<u8>) {
        if self.skip_through > 0 {
            let fresh: Vec<u8> = lines[from..]
                .split_inclusive(|b| *b == b'\n')
                .filter(|line| {
                    super::records::leading_seq(line).is_none_or(|seq| seq > self.skip_through)
                })
                .flatten()
                .copied()
                .collect();
            lines.truncate(from);
            lines.extend_from_slice(&fresh);
        }
        let last = lines[from..]
            .split(|b| *b == b'\n')
            .rev()
            .find_map(super::records::leading_seq);
        if let Some(seq) = last {
            self.last_seq = seq;
            if seq > self.skip_through {
                self.skip_through = 0;
            }
        }
    }

    fn read_on(
        &mut self,
        max: usize,
        lines: &mut Vec<u8>,
        file: Option<&File>,
    ) -> Result<usize, AuditError> {
        let waiting = !self.unread.is_empty() || self.decoder.more();
        let mut read = max;
        if !waiting {
            let Some(mut file) = file else {
                return Ok(0);
            };
            file.seek(SeekFrom::Start(self.decoder.end().fed))
                .map_err(AuditError::io(&self.path))?;
            file.take(max as u64)
                .read_to_end(&mut self.unread)
                .map_err(AuditError::io(&self.path))?;
            read = self.unread.len();
        }
        let taken = self
            .decoder
            .feed(&self.unread, lines)
            .map_err(|f| f.at(&self.path))?;
        self.unread.drain(..taken);
        if !self.unread.is_empty() || self.decoder.more() {
            read = max;
        }
        Ok(read)
    }
}

/// Up to `len` bytes of `file` at `at` (fewer at its end).
fn bytes_at(mut file: &File, at: u64, len: u64) -> Option<Vec<u8>> {
    file.seek(SeekFrom::Start(at)).ok()?;
    let mut bytes = Vec::new();
    file.take(len).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

/// Reads the whole log at `path` for its end, passing its whole lines to
/// `each` (one call per decoded batch of lines).
pub fn scan_end(
    path: &Path,
    mut each: impl FnMut(&[u8]) -> Result<(), String>,
) -> Result<LogEnd, AuditError> {
    let mut reader = DecodedReader::open(path)?;
    loop {
        reader.fill()?;
        if reader.ready.is_empty() {
            return Ok(reader.end());
        }
        each(&reader.ready).map_err(|reason| AuditError::Corrupt {
            path: path.to_owned(),
            offset: reader.decoder.end().fed,
            reason,
        })?;
    }
}

/// [`super::scan_heads`] on one thread, from the first byte.
pub(super) fn scan_in_one(
    path: &Path,
    each: &mut dyn FnMut(Option<Head<'_>>) -> Result<(), String>,
) -> Result<LogEnd, AuditError> {
    let mut reader = DecodedReader::with(path, LogDecoder::heads_for_path(path))?;
    loop {
        reader.fill()?;
        if reader.ready.is_empty() {
            return Ok(reader.end());
        }
        heads_of(&reader.ready, reader.decoder.gives_heads(), each).map_err(|reason| {
            AuditError::Corrupt {
                path: path.to_owned(),
                offset: reader.decoder.end().fed,
                reason,
            }
        })?;
    }
}

/// Passes what a resume's scan reads of each line or entry in `chunk`
/// (whole ones, as a decoder hands them out) to `each`, in order:
/// `entries` when a heads reader made them ([`Entries`]), else lines.
pub(super) fn heads_of(
    chunk: &[u8],
    entries: bool,
    each: &mut dyn FnMut(Option<Head<'_>>) -> Result<(), String>,
) -> Result<(), String> {
    if entries {
        for entry in Entries::new(chunk) {
            let entry = entry?;
            // An empty `LINE` record makes an empty line, which a reader
            // of lines passes over.
            if entry != HeadEntry::Line(b"") {
                each(entry.head())?;
            }
        }
    } else {
        for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            each(Head::of_line(line))?;
        }
    }
    Ok(())
}

/// Makes the log at `path` end whole, so that it can be appended to: a
/// torn line is cut from a plain log; in a compact one, the open segment
/// (a process killed while writing it) is cut and its whole lines written
/// again as a closed segment, and a torn header is written anew. Returns
/// whether anything was cut or rewritten.
pub fn cut_to_whole(path: &Path, end: LogEnd) -> Result<bool, AuditError> {
    if !end.unfinished() && (end.keep > 0 || super::is_plain(path)) {
        return Ok(false);
    }
    if !super::is_plain(path) && end.fed - end.keep > MAX_OPEN {
        // A killed writer leaves one open segment, a fraction of
        // SEGMENT once compressed. This much is damage that reads like
        // a torn end (a block's length flipped, say): cutting it would
        // take whatever follows with it.
        return Err(AuditError::Corrupt {
            path: path.to_owned(),
            offset: end.keep,
            reason: format!(
                "the last {} bytes do not end a segment, more than an open segment can hold: the log looks damaged, not cut short by a killed process, so it is not cut",
                end.fed - end.keep
            ),
        });
    }
    let io = AuditError::io(path);
    // A log with no whole header gets this troupe's.
    let mut format = FORMAT;
    // The open segment's bytes, and whether they hold any whole record.
    let mut open = None;
    if !super::is_plain(path) && end.keep > 0 {
        format = format_of(path)?;
        let mut file = open_log(path, false).map_err(&io)?;
        file.seek(SeekFrom::Start(end.keep)).map_err(&io)?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).map_err(&io)?;
        // Read through once before the file is touched: a fault leaves
        // it as it was.
        let mut carries = false;
        open_segment(path, end.keep, format, &tail, |piece| {
            carries |= !piece.is_empty();
            Ok(())
        })?;
        open = Some((tail, carries));
    }
    // Kept aside first: a kill between the cut and the rewrite would
    // otherwise lose the open segment's whole lines, which `tail` had
    // already shown ([`undo_interrupted_cut`] puts them back).
    let saved = match &open {
        Some((tail, true)) => Some(save_tail(path, end.keep, tail)?),
        _ => None,
    };
    let mut file = open_log(path, true).map_err(&io)?;
    file.set_len(end.keep).map_err(&io)?;
    file.seek(SeekFrom::End(0)).map_err(&io)?;
    if !super::is_plain(path) {
        // No whole header: nothing after it was read either.
        if end.keep == 0 {
            file.write_all(&super::header()).map_err(&io)?;
        }
        if let Some((tail, true)) = open {
            // Its whole lines (or records, as they are), a piece at a
            // time: a few bytes of records may decode to gigabytes.
            let mut log = Compressed::append(file, format).map_err(&io)?;
            open_segment(path, end.keep, format, &tail, |piece| {
                log.write_all(piece).map_err(&io)
            })?;
            file = log.finish().map_err(&io)?;
        }
    }
    file.sync_data().map_err(&io)?;
    if let Some(saved) = saved {
        std::fs::remove_file(&saved).map_err(AuditError::io(&saved))?;
    }
    Ok(true)
}

/// Where a repair keeps the open segment it is rewriting, until the
/// rewrite is durable.
pub fn saved_tail_path(path: &Path) -> std::path::PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".repair");
    std::path::PathBuf::from(name)
}

/// Writes the open segment's bytes and where they began beside the log,
/// durably, under their final name only once whole.
pub(super) fn save_tail(
    path: &Path,
    keep: u64,
    tail: &[u8],
) -> Result<std::path::PathBuf, AuditError> {
    let saved = saved_tail_path(path);
    let mut partial = saved.as_os_str().to_owned();
    partial.push(".part");
    let partial = std::path::PathBuf::from(partial);
    let io = AuditError::io(&partial);
    let mut file = File::create(&partial).map_err(&io)?;
    file.write_all(&keep.to_le_bytes()).map_err(&io)?;
    file.write_all(tail).map_err(&io)?;
    file.sync_all().map_err(&io)?;
    std::fs::rename(&partial, &saved).map_err(&io)?;
    if let Some(dir) = saved.parent().filter(|d| !d.as_os_str().is_empty()) {
        File::open(dir).and_then(|d| d.sync_all()).map_err(&io)?;
    }
    Ok(saved)
}

/// Puts back the open segment a repair killed midway had set aside
/// ([`cut_to_whole`]): the log is as the killed writer left it again, to
/// be repaired anew. Returns whether there was one.
pub fn undo_interrupted_cut(path: &Path) -> Result<bool, AuditError> {
    let saved = saved_tail_path(path);
    let mut partial = saved.as_os_str().to_owned();
    partial.push(".part");
    // Not whole when the kill came: the log was not touched yet.
    let _ = std::fs::remove_file(std::path::PathBuf::from(partial));
    let bytes = match std::fs::read(&saved) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(AuditError::io(&saved)(e)),
    };
    let Some((keep, tail)) = bytes.split_first_chunk::<8>() else {
        return Err(AuditError::Corrupt {
            path: saved,
            offset: 0,
            reason: "a repair's saved segment is too short to be one".to_owned(),
        });
    };
    let keep = u64::from_le_bytes(*keep);
    let io = AuditError::io(path);
    let mut file = open_log(path, true).map_err(&io)?;
    file.set_len(keep).map_err(&io)?;
    file.seek(SeekFrom::End(0)).map_err(&io)?;
    file.write_all(tail).map_err(&io)?;
    file.sync_data().map_err(&io)?;
    std::fs::remove_file(&saved).map_err(AuditError::io(&saved))?;
    Ok(true)
}

/// The whole lines (or records, as they are) of the open segment whose
/// bytes `tail` begin at byte `at`, passed to `each` a bounded piece at a
/// time.
fn open_segment(
    path: &Path,
    at: u64,
    format: u32,
    tail: &[u8],
    mut each: impl FnMut(&[u8]) -> Result<(), AuditError>,
) -> Result<(), AuditError> {
    let mut decoder = LogDecoder::segments_at(at, format, Hand::Raw).map_err(|f| f.at(path))?;
    let (mut rest, mut piece) = (tail, Vec::new());
    while !rest.is_empty() || decoder.more() {
        let taken = decoder.feed(rest, &mut piece).map_err(|f| f.at(path))?;
        rest = &rest[taken..];
        each(&piece)?;
        piece.clear();
    }
    Ok(())
}
