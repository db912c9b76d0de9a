//! The log's decoder: fed the file's bytes in any pieces, it hands out
//! whole lines, a bounded amount at a time ([`LINES_AT_ONCE`]), and says
//! where the bytes stop being whole ([`LogEnd`]). It parses files troupe
//! did not necessarily write: every fault is an [`AuditFault`], never a
//! panic, and no file makes it hold more than a bound and a line.

use std::io;
use std::path::Path;

use zstd::stream::raw::{DParameter, Decoder, InBuffer, Operation, OutBuffer};

use super::blocks::Blocks;
use super::error::{AuditError, Fault};
use super::records::{MAX_RECORD, RecordReader};
use super::write::{FORMAT, FORMAT_LINES, HEADER_MAGIC, HEADER_TAG};

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
    /// zstd frames, given to the decoder a block at a time ([`Blocks`]).
    Frames(Box<Decoder<'static>>, Blocks),
    Plain,
}

/// What a decoder hands out of a log of records (a log of JSON lines
/// hands out its lines whatever this says).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Hand {
    /// Each record as its JSON line.
    Lines,
    /// The records themselves, each read whole first (to write them
    /// again).
    Raw,
    /// Each record as the entry a resume's scan reads
    /// ([`RecordReader::heads`]).
    Heads,
}

/// What a compact log's segments hold, by its format.
enum Content {
    /// JSON lines ([`FORMAT_LINES`]); `scanned` bytes at the front of
    /// those waiting are known to hold no newline (a long line arriving
    /// in pieces is searched once).
    Lines { scanned: usize },
    /// Binary records ([`FORMAT`]), handed out as the reader writes
    /// them (JSON lines, or a heads reader's entries), or as themselves
    /// when `raw` ([`Hand`]).
    Records {
        reader: Box<RecordReader>,
        raw: bool,
    },
}

impl Content {
    fn of(format: u32, hand: Hand) -> Content {
        if format == FORMAT_LINES {
            Content::Lines { scanned: 0 }
        } else {
            Content::Records {
                reader: Box::new(if hand == Hand::Heads {
                    RecordReader::heads()
                } else {
                    RecordReader::default()
                }),
                raw: hand == Hand::Raw,
            }
        }
    }
}

/// The decoded bytes one call of [`LogDecoder::feed`] hands out before it
/// stops, and the line that crosses the mark.
///
/// A record refers to its segment's strings, so a few bytes of records
/// can make a long line, and a small file many of them: a crafted log of
/// 499 bytes makes gigabytes. A reader that took a piece's lines whole
/// would hold them all. Stopped here, it holds this much and a line,
/// whatever the file.
pub const LINES_AT_ONCE: usize = 1 << 20;

/// Decodes a log fed in pieces; hands out whole lines, at most about
/// [`LINES_AT_ONCE`] bytes of them a call.
pub struct LogDecoder {
    stage: Stage,
    content: Content,
    /// Bytes taken in so far.
    fed: u64,
    /// See [`LogEnd::keep`].
    keep: u64,
    /// Decoded bytes not handed out yet: a line or record cut short, and
    /// whole records held back at the bound.
    partial: Vec<u8>,
    scratch: Box<[u8]>,
    /// zstd filled `scratch` the last time: it may have more output with
    /// no more input.
    flushing: bool,
    /// A segment ended after what `partial` holds: it is checked whole
    /// once that is handed out.
    segment_ended: bool,
    /// A fault found in bytes taken in, told once the lines decoded before
    /// it are handed out (and every call after).
    fault: Option<Fault>,
    /// The last call stopped at the bound: [`LogDecoder::more`].
    held: bool,
    /// What records go out as, once the header says the log holds them.
    hand: Hand,
}

impl std::fmt::Debug for LogDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogDecoder")
            .field("fed", &self.fed)
            .field("keep", &self.keep)
            .field("held", &self.held)
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

    /// For the log at `path`, handing out records as the entries a
    /// resume's scan reads ([`super::records::Entries`]) and lines as
    /// lines: [`LogDecoder::gives_heads`] says which a call handed out.
    pub fn heads_for_path(path: &Path) -> LogDecoder {
        LogDecoder {
            hand: Hand::Heads,
            ..LogDecoder::for_path(path)
        }
    }

    /// What was handed out is entries, not lines: the log holds records
    /// and the decoder hands them out as [`Hand::Heads`].
    pub fn gives_heads(&self) -> bool {
        self.hand == Hand::Heads && matches!(self.content, Content::Records { .. })
    }

    /// For the segments of a log in format `format` from byte `at` (one
    /// of [`super::segment_starts`]), its header read elsewhere; handing
    /// out records as `hand` says.
    pub(super) fn segments_at(at: u64, format: u32, hand: Hand) -> Result<LogDecoder, AuditFault> {
        let decoder = Box::new(frames().map_err(AuditFault)?);
        let mut decoder = LogDecoder::at(Stage::Frames(decoder, Blocks::default()));
        decoder.fed = at;
        decoder.keep = at;
        decoder.hand = hand;
        decoder.content = Content::of(format, hand);
        Ok(decoder)
    }

    fn at(stage: Stage) -> LogDecoder {
        LogDecoder {
            stage,
            content: Content::Lines { scanned: 0 },
            fed: 0,
            keep: 0,
            partial: Vec::new(),
            scratch: vec![0; 1 << 16].into_boxed_slice(),
            flushing: false,
            segment_ended: false,
            fault: None,
            held: false,
            hand: Hand::Lines,
        }
    }

    /// Takes in the file's next bytes and appends the whole lines they
    /// complete (each with its newline) to `lines`, until about
    /// [`LINES_AT_ONCE`] bytes were appended. Returns how many of `bytes`
    /// it took in: the caller feeds the rest, and calls again (with no
    /// new bytes, if need be) while [`LogDecoder::more`] says so.
    pub fn feed(&mut self, bytes: &[u8], lines: &mut Vec<u8>) -> Result<usize, AuditFault> {
        let until = lines.len().saturating_add(LINES_AT_ONCE);
        self.held = false;
        let header = self.header(bytes)?;
        let rest = &bytes[header..];
        let taken = match &mut self.stage {
            Stage::Header(_) => 0,
            Stage::Plain => {
                // A plain log's lines are its bytes: no more than fed.
                // Only the new bytes are searched: a long line arriving
                // in pieces is searched once.
                self.fed += rest.len() as u64;
                match rest.iter().rposition(|b| *b == b'\n') {
                    Some(last) => {
                        lines.extend_from_slice(&self.partial);
                        lines.extend_from_slice(&rest[..=last]);
                        self.partial.clear();
                        self.partial.extend_from_slice(&rest[last + 1..]);
                    }
                    None => self.partial.extend_from_slice(rest),
                }
                self.keep = self.fed - self.partial.len() as u64;
                rest.len()
            }
            Stage::Frames(..) => self.frames(rest, lines, until)?,
        };
        Ok(header + taken)
    }

    /// [`LogDecoder::feed`] until every byte is taken in, appending all
    /// the lines they make, however many: for tests, and for bytes whose
    /// lines the caller bounds itself.
    pub fn feed_all(&mut self, mut bytes: &[u8], lines: &mut Vec<u8>) -> Result<(), AuditFault> {
        loop {
            let taken = self.feed(bytes, lines)?;
            bytes = &bytes[taken..];
            if bytes.is_empty() && !self.more() {
                return Ok(());
            }
        }
    }

    /// The last call stopped at [`LINES_AT_ONCE`]: what it took in may
    /// make more lines (or a fault), handed out by the next call, with new
    /// bytes or none. A caller at the file's end calls until this is
    /// false before it calls [`LogDecoder::finish`].
    pub fn more(&self) -> bool {
        self.held
    }

    /// Takes the header's bytes from the front of `bytes` while it is
    /// being read; returns how many it took.
    fn header(&mut self, mut bytes: &[u8]) -> Result<usize, AuditFault> {
        let given = bytes.len();
        while let Stage::Header(head) = &mut self.stage {
            let need = if head.len() < 8 {
                8
            } else {
                header_len(head).ok_or(AuditFault(Fault::Foreign))?
            };
            if head.len() >= 8 && head.len() == need {
                let format = check_header(head).map_err(AuditFault)?;
                self.content = Content::of(format, self.hand);
                self.keep = need as u64;
                let decoder = Box::new(frames().map_err(AuditFault)?);
                self.stage = Stage::Frames(decoder, Blocks::default());
                break;
            }
            let take = (need - head.len()).min(bytes.len());
            if take == 0 {
                break;
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
        Ok(given - bytes.len())
    }

    /// Decodes zstd frames from `bytes`, handing out lines until `lines`
    /// reaches `until`; returns the bytes taken in.
    fn frames(
        &mut self,
        mut bytes: &[u8],
        lines: &mut Vec<u8>,
        until: usize,
    ) -> Result<usize, AuditFault> {
        let Stage::Frames(decoder, blocks) = &mut self.stage else {
            return Ok(0);
        };
        let given = bytes.len();
        let start = lines.len();
        loop {
            // What was decoded goes out first, as far as the bound, or as
            // far as a record that is wrong.
            match hand_out(&mut self.content, &mut self.partial, lines, until) {
                Ok(true) => {}
                Ok(false) => {
                    self.held = true;
                    return Ok(given - bytes.len());
                }
                Err(reason) => self.fault = Some(wrong_record(self.fed, &reason)),
            }
            if let Some(fault) = &self.fault {
                // A fault is told in a call of its own, after the lines
                // before it (a caller that stops at an error keeps them),
                // and again in every call after.
                if lines.len() > start {
                    self.held = true;
                    return Ok(given - bytes.len());
                }
                return Err(AuditFault(fault.clone()));
            }
            if self.segment_ended {
                // A segment ended (the decoder stops at a frame's end):
                // what it holds is checked and whole.
                self.segment_ended = false;
                if !self.partial.is_empty() {
                    self.fault = Some(Fault::Corrupt {
                        offset: self.fed,
                        reason: "a segment ends inside a line or record".into(),
                    });
                    continue;
                }
                if let Content::Records { reader, .. } = &mut self.content {
                    reader.reset();
                }
                self.keep = self.fed;
            }
            if bytes.is_empty() && !self.flushing {
                return Ok(given);
            }
            // Through the end of one block at a time, and nothing new while
            // zstd still holds output: a call that fails then loses only
            // what its own block made, which is damaged (see `blocks`).
            let offer = if self.flushing {
                0
            } else {
                blocks.offer(bytes)
            };
            let mut input = InBuffer::around(&bytes[..offer]);
            let mut output = OutBuffer::around(&mut self.scratch[..]);
            // On an error zstd does not say how far it read: the fault is
            // somewhere in what it was offered.
            let run = decoder.run(&mut input, &mut output);
            let (used, produced) = (input.pos(), output.pos());
            blocks.took(&bytes[..used]);
            self.partial.extend_from_slice(&self.scratch[..produced]);
            let hint = match run {
                Ok(hint) => hint,
                Err(e) => {
                    // The whole lines decoded before the fault go out
                    // before it.
                    self.flushing = false;
                    self.fault = Some(Fault::Corrupt {
                        offset: self.fed,
                        reason: format!(
                            "in the {offer} bytes from here, a compressed block cannot be decoded: {e}"
                        ),
                    });
                    continue;
                }
            };
            self.fed += used as u64;
            bytes = &bytes[used..];
            // zstd says 0 once a frame is decoded and all of it handed
            // out, even into an output just filled.
            self.segment_ended = hint == 0;
            self.flushing = hint != 0 && produced == self.scratch.len();
            if used == 0 && produced == 0 && hint != 0 && offer > 0 {
                // No progress with input left: cannot happen with a sane
                // decoder; do not spin.
                self.fault = Some(Fault::Corrupt {
                    offset: self.fed,
                    reason: "the decoder made no progress".into(),
                });
            }
        }
    }

    /// How the bytes end, at the end of the file: [`LogDecoder::end`], or
    /// the fault a record cut short there holds (see
    /// [`RecordReader::check_cut_short`]): a torn end a killed writer
    /// left reads as unfinished, damage as damage, however the bytes
    /// arrived. (A reader following a live log, whose end is not the
    /// file's, reads [`LogDecoder::end`].)
    pub fn finish(&mut self) -> Result<LogEnd, AuditFault> {
        if let Some(fault) = &self.fault {
            return Err(AuditFault(fault.clone()));
        }
        if let (Stage::Frames(..), Content::Records { reader, .. }) =
            (&self.stage, &mut self.content)
        {
            reader
                .check_cut_short(&self.partial)
                .map_err(|reason| AuditFault(wrong_record(self.fed, &reason)))?;
        }
        Ok(self.end())
    }

    /// How the bytes taken in so far end.
    pub fn end(&self) -> LogEnd {
        LogEnd {
            keep: self.keep,
            fed: self.fed,
        }
    }
}

/// Hands out the whole lines or records in `partial` as lines (records
/// as themselves when `raw`) until `lines` reaches `until`; the rest
/// stays for the next call (a record cut short is walked, not read, until
/// it is whole: [`RecordReader::read`]). Whether it handed out all it
/// could.
fn hand_out(
    content: &mut Content,
    partial: &mut Vec<u8>,
    lines: &mut Vec<u8>,
    until: usize,
) -> Result<bool, String> {
    let (reader, raw) = match content {
        Content::Lines { scanned } => return lines_out(partial, scanned, lines, until),
        Content::Records { reader, raw } => (reader, raw),
    };
    let mut at = 0;
    let mut unused = Vec::new();
    let mut drained = true;
    loop {
        if lines.len() >= until {
            drained = false;
            break;
        }
        let out = if *raw { &mut unused } else { &mut *lines };
        let n = match reader.read(&partial[at..], out) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(reason) => {
                // What went out stays out: a call after meets the fault
                // again, not the records before it.
                partial.drain(..at);
                return Err(reason);
            }
        };
        if *raw {
            unused.clear();
            lines.extend_from_slice(&partial[at..at + n]);
        }
        at += n;
    }
    partial.drain(..at);
    Ok(drained)
}

/// [`hand_out`] for JSON lines: a line longer than a record may make is
/// refused (a few KiB of zstd can expand to gigabytes with no newline).
fn lines_out(
    partial: &mut Vec<u8>,
    scanned: &mut usize,
    lines: &mut Vec<u8>,
    until: usize,
) -> Result<bool, String> {
    let mut at = 0;
    let drained = loop {
        if lines.len() >= until {
            break false;
        }
        let Some(newline) = partial[*scanned..].iter().position(|b| *b == b'\n') else {
            *scanned = partial.len();
            break true;
        };
        let end = *scanned + newline + 1;
        lines.extend_from_slice(&partial[at..end]);
        (at, *scanned) = (end, end);
    };
    partial.drain(..at);
    *scanned -= at;
    // Drained, what waits is one line's start.
    if drained && partial.len() > MAX_RECORD {
        return Err(format!("a line longer than {} MiB", MAX_RECORD >> 20));
    }
    Ok(drained)
}

/// A line or record that is wrong, found in the segment's bytes before
/// `offset`.
fn wrong_record(offset: u64, reason: &str) -> Fault {
    Fault::Corrupt {
        offset,
        reason: format!("in the segment before this byte: {reason}"),
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
pub(super) fn header_len(head: &[u8]) -> Option<usize> {
    let magic = u32::from_le_bytes(head.get(..4)?.try_into().ok()?);
    let size = u32::from_le_bytes(head.get(4..8)?.try_into().ok()?) as usize;
    (magic == HEADER_MAGIC && size <= HEADER_MAX).then_some(8 + size)
}

/// The header's format version.
pub(super) fn check_header(head: &[u8]) -> Result<u32, Fault> {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Decoded bytes taken, and every whole record handed out.
    fn take(content: &mut Content, partial: &mut Vec<u8>, text: &[u8], lines: &mut Vec<u8>) {
        partial.extend_from_slice(text);
        assert!(hand_out(content, partial, lines, usize::MAX).expect("records"));
    }

    /// JSON lines go out a bound at a time, the line crossing it with
    /// them; a line arriving in pieces is searched once, piece by piece.
    #[test]
    fn json_lines_go_out_a_bound_at_a_time() {
        let mut content = Content::of(FORMAT_LINES, Hand::Lines);
        let text = format!("{}\n", "x".repeat(99)).repeat(30_000);
        let mut partial = text.as_bytes().to_vec();
        let mut lines = Vec::new();
        let mut handed = Vec::new();
        loop {
            let before = lines.len();
            let until = before + LINES_AT_ONCE;
            let drained = hand_out(&mut content, &mut partial, &mut lines, until).expect("lines");
            handed.push((lines.len() - before, drained));
            if drained {
                break;
            }
        }
        let full = LINES_AT_ONCE.div_ceil(100) * 100;
        assert_eq!(
            handed,
            [(full, false), (full, false), (3_000_000 - 2 * full, true)]
        );
        assert_eq!(lines, text.as_bytes());
        lines.clear();
        for _ in 0..3 {
            take(&mut content, &mut partial, &[b'y'; 1000], &mut lines);
            let Content::Lines { scanned } = content else {
                panic!("lines");
            };
            assert_eq!(scanned, partial.len());
        }
        take(&mut content, &mut partial, b"y\n{", &mut lines);
        assert_eq!(lines.len(), 3002);
        assert_eq!(partial, b"{");
        assert!(matches!(content, Content::Lines { scanned: 1 }));
    }

    /// A JSON line longer than any record makes is refused once it is
    /// that long, not held until its newline comes.
    #[test]
    fn a_json_line_past_the_longest_a_record_makes_is_refused() {
        let (mut lines, mut scanned) = (Vec::new(), 0);
        let mut partial = vec![b'x'; MAX_RECORD];
        assert_eq!(
            lines_out(&mut partial, &mut scanned, &mut lines, usize::MAX),
            Ok(true)
        );
        partial.push(b'x');
        let refused = lines_out(&mut partial, &mut scanned, &mut lines, usize::MAX);
        assert_eq!(refused, Err("a line longer than 256 MiB".to_owned()));
        assert!(lines.is_empty());
    }

    /// A record of 4 MiB decoded 4 KiB at a time (as zstd hands a long
    /// record over): its frame is walked at each piece, its text read
    /// twice (once found cut short, once whole), not once a piece: a
    /// crafted log of long records costs linear work.
    #[test]
    fn a_long_record_arriving_in_pieces_is_read_whole_once() {
        let line = format!("{{\"seq\":1,\"pad\":\"{}\"}}\n", "x".repeat(4 << 20));
        let mut record = Vec::new();
        super::super::records::lines_as_records(line.as_bytes(), &mut record);
        let mut content = Content::of(FORMAT, Hand::Lines);
        let (mut partial, mut lines) = (Vec::new(), Vec::new());
        for piece in record.chunks(4096) {
            take(&mut content, &mut partial, piece, &mut lines);
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
        let mut content = Content::of(FORMAT, Hand::Lines);
        let (mut partial, mut lines) = (Vec::new(), Vec::new());
        // The first record (a tag, a length, 9 bytes) one byte short.
        let first = 2 + 9;
        let mut feed = |bytes: &[u8], lines: &mut Vec<u8>| {
            take(&mut content, &mut partial, bytes, lines);
        };
        feed(&record[..first - 1], &mut lines);
        assert!(lines.is_empty());
        feed(&record[first - 1..first], &mut lines);
        assert_eq!(lines, b"{\"seq\":1}\n");
        feed(&record[first..], &mut lines);
        assert_eq!(lines, b"{\"seq\":1}\n{\"seq\":2}\n");
    }
}
