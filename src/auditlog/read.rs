//! Reading a log, whole or as it grows: a decoder fed the file's bytes in
//! any pieces, which hands out whole lines and says where the bytes stop
//! being whole. It parses files troupe did not necessarily write, so
//! every fault is an [`AuditError`] naming the byte, never a panic.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

use super::records::RecordReader;
use super::write::{Compressed, FORMAT, FORMAT_LINES, HEADER_MAGIC, HEADER_TAG};

/// Why a log cannot be read. Code `Store/AuditCorrupt` (`Store/Io` for a
/// file that cannot be read at all).
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    #[error("{}: not a troupe audit log (it does not begin with the log's header)", path.display())]
    Foreign { path: PathBuf },
    #[error(
        "{}: written by a newer troupe (log format {found}; this troupe reads format {FORMAT})",
        path.display()
    )]
    Newer { path: PathBuf, found: u32 },
    #[error("{}: at byte {offset}: {reason}", path.display())]
    Corrupt {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl AuditError {
    /// As the error of a `Read` of the log's lines: a file that cannot be
    /// read is its own error, anything else `InvalidData` with this
    /// error's text.
    pub fn into_io(self) -> io::Error {
        match self {
            AuditError::Io { source, .. } => source,
            other => io::Error::new(io::ErrorKind::InvalidData, other.to_string()),
        }
    }

    /// The stable code.
    pub fn code(&self) -> &'static str {
        match self {
            AuditError::Io { .. } => "Store/Io",
            _ => "Store/AuditCorrupt",
        }
    }

    pub(super) fn io(path: &Path) -> impl Fn(io::Error) -> AuditError + '_ {
        move |source| AuditError::Io {
            path: path.to_owned(),
            source,
        }
    }
}

/// What the decoder found wrong, before the path is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Fault {
    Foreign,
    Newer(u32),
    Corrupt { offset: u64, reason: String },
}

impl Fault {
    fn at(self, path: &Path) -> AuditError {
        let path = path.to_owned();
        match self {
            Fault::Foreign => AuditError::Foreign { path },
            Fault::Newer(found) => AuditError::Newer { path, found },
            Fault::Corrupt { offset, reason } => AuditError::Corrupt {
                path,
                offset,
                reason,
            },
        }
    }
}

/// The header's largest payload this troupe accepts (its own is 27 bytes).
const HEADER_MAX: usize = 256;

/// The largest zstd window a log may ask for (2^24 = 16 MiB; troupe's own
/// use 2 MiB): a foreign file cannot make a reader allocate more.
const WINDOW_LOG_MAX: u32 = 24;

/// How the fed bytes end, for appending after them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LogEnd {
    /// Bytes that stay when the log is appended to: through the last
    /// closed segment (the header, for none) or, for a plain log, through
    /// its last whole line. 0 when not even the header is whole.
    pub keep: u64,
    /// Bytes fed in all; more than `keep` when the log ends in an open
    /// segment or a torn line.
    pub fed: u64,
}

impl LogEnd {
    /// The log ends in an open segment or a torn line.
    pub fn unfinished(&self) -> bool {
        self.fed > self.keep
    }
}

enum Stage {
    /// Collecting the header's bytes.
    Header(Vec<u8>),
    Frames(Box<Decoder<'static>>),
    Plain,
}

/// What a compact log's segments hold, by its format.
enum Content {
    /// JSON lines ([`FORMAT_LINES`]).
    Lines,
    /// Binary records ([`FORMAT`]), handed out as JSON lines, or as the
    /// records themselves when `raw` (to write them again).
    Records {
        reader: Box<RecordReader>,
        raw: bool,
    },
}

impl Content {
    fn of(format: u32, raw: bool) -> Content {
        if format == FORMAT_LINES {
            Content::Lines
        } else {
            Content::Records {
                reader: Box::default(),
                raw,
            }
        }
    }
}

/// Decodes a log fed in pieces; hands out whole lines.
pub struct LogDecoder {
    stage: Stage,
    content: Content,
    /// Bytes fed so far.
    fed: u64,
    /// See [`LogEnd::keep`].
    keep: u64,
    /// Decoded bytes after the last newline handed out.
    partial: Vec<u8>,
    scratch: Box<[u8]>,
}

impl std::fmt::Debug for LogDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDecoder")
            .field("fed", &self.fed)
            .field("keep", &self.keep)
            .finish_non_exhaustive()
    }
}

impl LogDecoder {
    /// For the compact log, from its first byte.
    pub fn compact() -> LogDecoder {
        LogDecoder::at(Stage::Header(Vec::new()))
    }

    /// For a plain JSON-lines log.
    pub fn plain() -> LogDecoder {
        LogDecoder::at(Stage::Plain)
    }

    /// For the log at `path`, by its name ([`super::is_plain`]).
    pub fn for_path(path: &Path) -> LogDecoder {
        if super::is_plain(path) {
            LogDecoder::plain()
        } else {
            LogDecoder::compact()
        }
    }

    /// For the segments of a log in format `format` from byte `at` (one
    /// of [`super::segment_starts`]), its header read elsewhere; handing
    /// out records as they are when `raw` (to write them again).
    pub(super) fn segments_at(at: u64, format: u32, raw: bool) -> Result<LogDecoder, AuditFault> {
        let mut decoder = LogDecoder::at(Stage::Frames(Box::new(frames().map_err(AuditFault)?)));
        decoder.fed = at;
        decoder.keep = at;
        decoder.content = Content::of(format, raw);
        Ok(decoder)
    }

    fn at(stage: Stage) -> LogDecoder {
        LogDecoder {
            stage,
            content: Content::Lines,
            fed: 0,
            keep: 0,
            partial: Vec::new(),
            scratch: vec![0; 1 << 16].into_boxed_slice(),
        }
    }

    /// Feeds the file's next bytes; appends the whole lines they complete
    /// (each with its newline) to `lines`.
    pub fn feed(&mut self, mut bytes: &[u8], lines: &mut Vec<u8>) -> Result<(), AuditFault> {
        while let Stage::Header(head) = &mut self.stage {
            let need = if head.len() < 8 {
                8
            } else {
                header_len(head).ok_or(AuditFault(Fault::Foreign))?
            };
            if head.len() >= 8 && head.len() == need {
                let format = check_header(head).map_err(AuditFault)?;
                self.content = Content::of(format, false);
                self.keep = need as u64;
                self.stage = Stage::Frames(Box::new(frames().map_err(AuditFault)?));
                break;
            }
            let take = (need - head.len()).min(bytes.len());
            if take == 0 {
                return Ok(());
            }
            head.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            self.fed += take as u64;
            let magic = HEADER_MAGIC.to_le_bytes();
            let known = head.len().min(4);
            if head[..known] != magic[..known] {
                return Err(AuditFault(Fault::Foreign));
            }
        }
        match &mut self.stage {
            Stage::Header(_) => Ok(()),
            Stage::Plain => {
                self.fed += bytes.len() as u64;
                self.partial.extend_from_slice(bytes);
                if let Some(last) = self.partial.iter().rposition(|b| *b == b'\n') {
                    lines.extend_from_slice(&self.partial[..=last]);
                    self.partial.drain(..=last);
                }
                self.keep = self.fed - self.partial.len() as u64;
                Ok(())
            }
            Stage::Frames(decoder) => {
                loop {
                    let mut input = InBuffer::around(bytes);
                    let mut output = OutBuffer::around(&mut self.scratch[..]);
                    // On an error zstd does not say how far it read: the
                    // fault is somewhere in the piece fed.
                    let piece = bytes.len();
                    let hint = match decoder.run(&mut input, &mut output) {
                        Ok(hint) => hint,
                        Err(e) => {
                            // The whole lines decoded before the fault are
                            // handed out with it.
                            let produced = output.pos();
                            let _ = take_decoded(
                                &mut self.content,
                                &mut self.partial,
                                &self.scratch[..produced],
                                lines,
                            );
                            return Err(AuditFault(Fault::Corrupt {
                                offset: self.fed,
                                reason: format!(
                                    "in the {piece} bytes from here, a compressed block cannot be decoded: {e}"
                                ),
                            }));
                        }
                    };
                    let (used, produced) = (input.pos(), output.pos());
                    self.fed += used as u64;
                    bytes = &bytes[used..];
                    let text = &self.scratch[..produced];
                    let full = produced == self.scratch.len();
                    // zstd says 0 once a frame is decoded and all of it
                    // handed out, even into an output just filled.
                    let ends = hint == 0;
                    take_decoded(&mut self.content, &mut self.partial, text, lines).map_err(
                        |reason| {
                            AuditFault(Fault::Corrupt {
                                offset: self.fed,
                                reason: format!("in the segment before this byte: {reason}"),
                            })
                        },
                    )?;
                    if ends {
                        // A segment ended (the decoder stops at a frame's
                        // end): what it holds is checked and whole.
                        if !self.partial.is_empty() {
                            return Err(AuditFault(Fault::Corrupt {
                                offset: self.fed,
                                reason: "a segment ends inside a line or record".into(),
                            }));
                        }
                        if let Content::Records { reader, .. } = &mut self.content {
                            reader.reset();
                        }
                        self.keep = self.fed;
                    }
                    if bytes.is_empty() && !full {
                        return Ok(());
                    }
                    if used == 0 && !full && hint != 0 {
                        // No progress with input left: cannot happen with
                        // a sane decoder; do not spin.
                        return Err(AuditFault(Fault::Corrupt {
                            offset: self.fed,
                            reason: "the decoder made no progress".into(),
                        }));
                    }
                }
            }
        }
    }

    /// How the bytes fed so far end.
    pub fn end(&self) -> LogEnd {
        LogEnd {
            keep: self.keep,
            fed: self.fed,
        }
    }
}

/// Takes a segment's decoded bytes: whole lines (or records) into `lines`,
/// the rest kept in `partial` for the next bytes (a record cut short is
/// walked, not read, until it is whole: [`RecordReader::read`]).
fn take_decoded(
    content: &mut Content,
    partial: &mut Vec<u8>,
    text: &[u8],
    lines: &mut Vec<u8>,
) -> Result<(), String> {
    match content {
        Content::Lines => {
            match text.iter().rposition(|b| *b == b'\n') {
                Some(last) => {
                    lines.extend_from_slice(partial);
                    lines.extend_from_slice(&text[..=last]);
                    partial.clear();
                    partial.extend_from_slice(&text[last + 1..]);
                }
                None => partial.extend_from_slice(text),
            }
            Ok(())
        }
        Content::Records { reader, raw } => {
            partial.extend_from_slice(text);
            let mut at = 0;
            let mut unused = Vec::new();
            let out = if *raw { &mut unused } else { &mut *lines };
            while let Some(n) = reader.read(&partial[at..], out)? {
                if *raw {
                    out.clear();
                }
                at += n;
            }
            if *raw {
                lines.extend_from_slice(&partial[..at]);
            }
            partial.drain(..at);
            Ok(())
        }
    }
}

/// A decoding fault, before the path is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFault(pub(super) Fault);

impl AuditFault {
    /// The typed error, for the log at `path`.
    pub fn at(self, path: &Path) -> AuditError {
        self.0.at(path)
    }
}

impl std::fmt::Display for AuditFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.clone().at(Path::new("audit log")))
    }
}

fn frames() -> Result<Decoder<'static>, Fault> {
    let broken = |e: io::Error| Fault::Corrupt {
        offset: 0,
        reason: format!("no zstd decoder: {e}"),
    };
    let mut decoder = Decoder::new().map_err(broken)?;
    decoder
        .set_parameter(DParameter::WindowLogMax(WINDOW_LOG_MAX))
        .map_err(broken)?;
    Ok(decoder)
}

/// The header's length from its first eight bytes, once they are there
/// and hold the magic and a sane payload size.
fn header_len(head: &[u8]) -> Option<usize> {
    let magic = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    let size = u32::from_le_bytes(head.get(4..8)?.try_into().ok()?) as usize;
    (magic == HEADER_MAGIC && size <= HEADER_MAX).then_some(8 + size)
}

/// The header's format version.
fn check_header(head: &[u8]) -> Result<u32, Fault> {
    let payload = &head[8..];
    let version = payload
        .strip_prefix(HEADER_TAG)
        .and_then(|v| v.strip_suffix(b"\n"))
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse::<u32>().ok())
        .ok_or(Fault::Foreign)?;
    if version > FORMAT {
        return Err(Fault::Newer(version));
    }
    if version == 0 {
        return Err(Fault::Foreign);
    }
    Ok(version)
}

/// The format of the compact log at `path`, from its header (and nothing
/// after it: a damaged first segment does not keep a reader from the
/// later ones).
pub fn format_of(path: &Path) -> Result<u32, AuditError> {
    let mut file = File::open(path).map_err(AuditError::io(path))?;
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
    done: bool,
    /// A fault found after some lines of the same piece: told once those
    /// lines were taken.
    fault: Option<AuditError>,
}

impl DecodedReader {
    /// Opens the log at `path` (compact or plain, by its name).
    pub fn open(path: &Path) -> Result<DecodedReader, AuditError> {
        let file = File::open(path).map_err(AuditError::io(path))?;
        Ok(DecodedReader {
            path: path.to_owned(),
            file,
            decoder: LogDecoder::for_path(path),
            ready: Vec::new(),
            at: 0,
            chunk: vec![0; CHUNK].into_boxed_slice(),
            done: false,
            fault: None,
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

    /// Decodes until some lines are ready or the file ends.
    /// The lines a piece gave before a fault come first; the fault with
    /// the next call.
    fn fill(&mut self) -> Result<(), AuditError> {
        self.ready.clear();
        self.at = 0;
        if let Some(fault) = self.fault.take() {
            self.done = true;
            return Err(fault);
        }
        while self.ready.is_empty() && !self.done {
            let n = self
                .file
                .read(&mut self.chunk)
                .map_err(AuditError::io(&self.path))?;
            if n == 0 {
                self.done = true;
                break;
            }
            if let Err(fault) = self.decoder.feed(&self.chunk[..n], &mut self.ready) {
                let fault = fault.at(&self.path);
                if self.ready.is_empty() {
                    self.done = true;
                    return Err(fault);
                }
                self.fault = Some(fault);
                break;
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
/// descriptor between polls).
#[derive(Debug)]
pub struct Follower {
    path: PathBuf,
    decoder: LogDecoder,
}

impl Follower {
    pub fn new(path: &Path) -> Follower {
        Follower {
            path: path.to_owned(),
            decoder: LogDecoder::for_path(path),
        }
    }

    /// A follower of the compact log at `path` from the segment that
    /// begins at byte `at` (see [`super::segment_starts`]; the header
    /// before it was checked there).
    pub fn at_segment(path: &Path, at: u64) -> Result<Follower, AuditError> {
        let format = format_of(path)?;
        Ok(Follower {
            path: path.to_owned(),
            decoder: LogDecoder::segments_at(at, format, false).map_err(|f| f.at(path))?,
        })
    }

    /// Reads up to `max` new bytes of the file; appends the whole lines
    /// they complete to `lines`. Returns the bytes read: 0 when nothing
    /// was appended (or the file is not there yet).
    pub fn read_more(&mut self, max: usize, lines: &mut Vec<u8>) -> Result<usize, AuditError> {
        let mut file = match File::open(&self.path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(AuditError::io(&self.path)(e)),
        };
        file.seek(SeekFrom::Start(self.decoder.fed))
            .map_err(AuditError::io(&self.path))?;
        let mut buf = Vec::new();
        file.take(max as u64)
            .read_to_end(&mut buf)
            .map_err(AuditError::io(&self.path))?;
        self.decoder
            .feed(&buf, lines)
            .map_err(|f| f.at(&self.path))?;
        Ok(buf.len())
    }
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
            offset: reader.decoder.fed,
            reason,
        })?;
    }
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
    let mut carried = Vec::new();
    // A log with no whole header gets this troupe's.
    let mut format = FORMAT;
    if !super::is_plain(path) && end.keep > 0 {
        // The open segment's whole lines (or records, as they are),
        // decoded again from its start.
        format = format_of(path)?;
        let mut file = File::open(path).map_err(&io)?;
        file.seek(SeekFrom::Start(end.keep)).map_err(&io)?;
        let mut tail = Vec::new();
        file.read_to_end(&mut tail).map_err(&io)?;
        let mut decoder =
            LogDecoder::segments_at(end.keep, format, true).map_err(|f| f.at(path))?;
        decoder.feed(&tail, &mut carried).map_err(|f| f.at(path))?;
    }
    let mut file = OpenOptions::new().write(true).open(path).map_err(&io)?;
    file.set_len(end.keep).map_err(&io)?;
    file.seek(SeekFrom::End(0)).map_err(&io)?;
    if !super::is_plain(path) {
        // No whole header: nothing after it was read either.
        if end.keep == 0 {
            file.write_all(&super::header()).map_err(&io)?;
        }
        if !carried.is_empty() {
            let mut log = Compressed::append(file, format).map_err(&io)?;
            log.write_all(&carried).map_err(&io)?;
            file = log.finish().map_err(&io)?;
        }
    }
    file.sync_data().map_err(&io)?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record of 4 MiB decoded 4 KiB at a time (as zstd hands a long
    /// record over): its frame is walked at each piece, its text read
    /// twice (once found cut short, once whole), not once a piece: a
    /// crafted log of long records costs linear work.
    #[test]
    fn a_long_record_arriving_in_pieces_is_read_whole_once() {
        let line = format!("{{\"seq\":1,\"pad\":\"{}\"}}\n", "x".repeat(4 << 20));
        let mut record = Vec::new();
        super::super::records::lines_as_records(line.as_bytes(), &mut record);
        let mut content = Content::of(FORMAT, false);
        let (mut partial, mut lines) = (Vec::new(), Vec::new());
        for piece in record.chunks(4096) {
            take_decoded(&mut content, &mut partial, piece, &mut lines).expect("records");
        }
        assert_eq!(lines, line.as_bytes());
        assert!(partial.is_empty());
        let Content::Records { reader, .. } = &content else {
            panic!("records");
        };
        assert_eq!(reader.attempts(), 2);
    }

    /// A record is handed out with the byte that makes it whole: a killed
    /// writer's last whole record, or a live log's, never waits for more.
    #[test]
    fn every_whole_record_is_handed_out_at_once() {
        let mut record = Vec::new();
        super::super::records::lines_as_records(b"{\"seq\":1}\n{\"seq\":2}\n", &mut record);
        let mut content = Content::of(FORMAT, false);
        let (mut partial, mut lines) = (Vec::new(), Vec::new());
        // The first record (a tag, a length, 9 bytes) one byte short.
        let first = 2 + 9;
        let mut take = |bytes: &[u8], lines: &mut Vec<u8>| {
            take_decoded(&mut content, &mut partial, bytes, lines).expect("records");
        };
        take(&record[..first - 1], &mut lines);
        assert!(lines.is_empty());
        take(&record[first - 1..first], &mut lines);
        assert_eq!(lines, b"{\"seq\":1}\n");
        take(&record[first..], &mut lines);
        assert_eq!(lines, b"{\"seq\":1}\n{\"seq\":2}\n");
    }
}
