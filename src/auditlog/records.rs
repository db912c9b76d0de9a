//! The log's binary records (format 2): what a segment holds in place of
//! JSON lines. Formatting JSON (escape checks, digits, timestamps) and
//! compressing 3.4 KB of it was half the CPU a `fanout` sibling cost
//! (BENCHMARKS.md, "Every core, fourteenth round"); a record says the same
//! in about a seventh of the bytes, and the reader writes the JSON line back
//! with the same writer the runtime uses ([`super::json`]), byte for byte.
//!
//! A segment's content is a sequence of records, each starting with a tag:
//!
//! - `RESET`: forgets the strings and the running `seq` and `ts`. Every
//!   batch the writer flushes starts with one, so each batch (and so each
//!   segment, and the open segment a killed writer leaves) is read from
//!   its own bytes alone.
//! - `EVENT`: `seq` and `ts` (microseconds since 1970) as zigzag varint
//!   differences from the record before; a flags byte (which of
//!   `stageExecutionId`, `stageId`, `tool` follow); the event's name, its
//!   run, then those ids, as string references; the field count; each
//!   field as a value tag, its key (a string reference, except for a
//!   relayed event's members, which have none) and its value.
//! - `LINE`: a whole JSON line, kept as written (lines that are not one of
//!   the runtime's events as they stand: a lagging subscriber's notice, an
//!   event with a field named like a head key, lines a resume adds).
//!
//! A string reference is a varint: 0 defines a new string in place (its
//! length and UTF-8 bytes, numbered in order from 0 after the last
//! `RESET`); `n` refers to string `n - 1`. The writer numbers a string by
//! where it lives (a `&'static str` or an `Arc<str>` it holds until the
//! batch ends), so an id shared by a sibling's twelve events is written
//! once per batch and then costs a byte. A head's run, stage and tool,
//! which each execution or call holds a copy of its own of, are also
//! matched by content against the last one named there.
//!
//! Everything here reads files troupe did not necessarily write: a
//! record cut short asks for more bytes; anything else wrong is a reason
//! string the caller turns into `Store/AuditCorrupt` with its offset.

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::sync::Arc;

use super::json::{
    Checked, Head, JsonStr, clean, write_head, write_json_str, write_key, write_members,
    write_usage,
};

/// Forgets the strings, `seq` and `ts`.
const RESET: u8 = 1;
/// One event.
const EVENT: u8 = 2;
/// A whole JSON line.
const LINE: u8 = 3;

/// The event's `stageExecutionId` follows.
const HAS_EXEC: u8 = 1;
/// Its `stageId` follows.
const HAS_STAGE: u8 = 2;
/// Its `tool` follows.
const HAS_TOOL: u8 = 4;

/// A string, by reference.
const V_STR: u8 = 1;
/// A string written in place and not numbered (text seen once).
const V_TEXT: u8 = 2;
/// A non-negative integer.
const V_U64: u8 = 3;
const V_FALSE: u8 = 4;
const V_TRUE: u8 = 5;
/// A stage's usage: prompt tokens, completion tokens, requests.
const V_USAGE: u8 = 6;
/// Any other JSON value, as its compact text.
const V_JSON: u8 = 7;
/// A relayed event's members (no key): their JSON text.
const V_MEMBERS: u8 = 8;

/// The most fields a record may say it has: far past any event, and a
/// bound on what a damaged count makes the reader try.
const MAX_FIELDS: u64 = 1 << 16;

/// The longest a record may be, and the most its batch's strings may take
/// (256 MiB, far past any event troupe writes): past it a record is
/// damage, and a reader holds no more of a file troupe did not write.
pub const MAX_RECORD: usize = 256 << 20;

/// The longest text a record may say it holds.
const MAX_TEXT: u64 = MAX_RECORD as u64;

/// Whole JSON lines (each ending in a newline) as `LINE` records: what a
/// resume appends to a log of this format.
pub fn lines_as_records(lines: &[u8], out: &mut Vec<u8>) {
    for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        out.push(LINE);
        write_bytes(out, line);
    }
}

/// The `seq` of the first event in a batch of records (after its
/// `RESET`) or of JSON lines, for a failed write's message.
pub fn first_seq(batch: &[u8]) -> Option<u64> {
    if batch.first() == Some(&b'{') {
        return leading_seq(batch);
    }
    let mut r = Cursor {
        bytes: batch,
        at: 0,
    };
    loop {
        match r.byte().ok()? {
            RESET => continue,
            EVENT => return Some(unzigzag(r.varint().ok()?)),
            LINE => return leading_seq(r.text().ok()?),
            _ => return None,
        }
    }
}

/// The `seq` a JSON line begins with (`{"seq":N`).
pub(crate) fn leading_seq(line: &[u8]) -> Option<u64> {
    line.strip_prefix(b"{\"seq\":").and_then(|rest| {
        let end = rest.iter().position(|b| !b.is_ascii_digit())?;
        std::str::from_utf8(&rest[..end]).ok()?.parse().ok()
    })
}

/// What a reader held and had written before a read ([`RecordReader::mark`]).
struct Mark {
    arena: usize,
    spans: usize,
    defined: usize,
    seq: u64,
    micros: u64,
    out: usize,
}

/// Reads records back as JSON lines, or as the entries a resume's scan
/// reads ([`RecordReader::heads`]).
#[derive(Debug, Default)]
pub struct RecordReader {
    /// The strings defined since the last `RESET`, one after another:
    /// between quotes, those that need no escaping (checked once, when
    /// they are defined: [`Checked`]).
    arena: String,
    /// Where each string lies in `arena`, and whether it is quoted there.
    spans: Vec<(usize, usize, bool)>,
    /// The bytes of text those strings were defined with (what the bound
    /// on strings between two `RESET`s counts).
    defined: usize,
    seq: u64,
    micros: u64,
    /// Records read through ([`RecordReader::attempts`]).
    attempts: u64,
    /// The longest line a record may make, when not [`MAX_RECORD`].
    line_limit: Option<usize>,
    /// The record the next read begins was found cut short.
    cut_short: bool,
    /// Hands out each record as the entry a resume's scan reads, not as
    /// its JSON line ([`RecordReader::heads`]).
    heads: bool,
    /// With `heads`, beside each string of `spans`: which member the scan
    /// reads a field of that name as, if any (`heads::NO_SLOT`).
    slots: Vec<u8>,
}

/// Why a record was not read: it is cut short, or it is wrong.
enum Stop {
    More,
    Bad(String),
}

type Read<T> = Result<T, Stop>;

impl RecordReader {
    /// A reader whose records may make lines of at most `bytes`.
    #[cfg(test)]
    pub(crate) fn with_line_limit(bytes: usize) -> RecordReader {
        RecordReader {
            line_limit: Some(bytes),
            ..RecordReader::default()
        }
    }

    fn longest_line(&self) -> usize {
        self.line_limit.unwrap_or(MAX_RECORD)
    }

    /// Forgets the strings, `seq` and `ts` (a segment ended).
    pub fn reset(&mut self) {
        self.cut_short = false;
        self.arena.clear();
        self.spans.clear();
        self.slots.clear();
        self.defined = 0;
        self.seq = 0;
        self.micros = 0;
    }

    /// Reads the record that `bytes` begins with, appending its JSON line
    /// (with its newline) to `out`, or a heads reader's entry
    /// ([`RecordReader::heads`]); its length, or `None` when `bytes` ends
    /// inside it (nothing is appended or remembered then).
    pub fn read(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<Option<usize>, String> {
        // A record found cut short is walked first (its frame only, its
        // text skipped) until it is whole: a long record arriving in many
        // pieces has its text checked and written once, not once a piece.
        // Every other record is read at once: most are whole.
        if bytes.is_empty() {
            return Ok(None);
        }
        let whole = if self.cut_short {
            match record_len(bytes) {
                Ok(n) => Some(n),
                Err(Stop::More) => return too_long(bytes).map_or(Ok(None), Err),
                Err(Stop::Bad(reason)) => return Err(reason),
            }
        } else {
            None
        };
        self.attempts += 1;
        let mark = self.mark(out);
        let mut r = Cursor {
            bytes: &bytes[..whole.unwrap_or(bytes.len())],
            at: 0,
        };
        let read = match (self.record(&mut r, out), whole) {
            (Ok(()), Some(n)) if r.at != n => Err(bad("a record's frame and contents disagree")),
            (Err(Stop::More), Some(_)) => Err(bad("a record's frame and contents disagree")),
            (read, _) => read,
        };
        let Err(stop) = read else {
            self.cut_short = false;
            return Ok(Some(r.at));
        };
        self.undo(mark, out);
        match stop {
            Stop::More => {
                self.cut_short = true;
                too_long(bytes).map_or(Ok(None), Err)
            }
            Stop::Bad(reason) => Err(reason),
        }
    }

    /// At the end of a log's bytes, what is left of them (`bytes`, a record
    /// cut short there): whatever a read of it finds wrong before it runs
    /// out. A killed writer leaves a prefix of a record as written, which
    /// holds nothing wrong; a string that is not UTF-8, say, is damage.
    /// [`RecordReader::read`] finds it only if the bytes that first
    /// reached the record held it (after that it walks the record's
    /// frame alone): read here, it is found however the bytes arrived.
    /// Forgets what it read.
    pub fn check_cut_short(&mut self, bytes: &[u8]) -> Result<(), String> {
        // Only a lone record cut short (a whole one is read as ever).
        if !matches!(record_len(bytes), Err(Stop::More)) {
            return Ok(());
        }
        let mut out = Vec::new();
        let mark = self.mark(&out);
        let read = self.record(&mut Cursor { bytes, at: 0 }, &mut out);
        self.undo(mark, &mut out);
        match read {
            Err(Stop::Bad(reason)) => Err(reason),
            _ => Ok(()),
        }
    }

    /// Where a read begins, for [`RecordReader::undo`].
    fn mark(&self, out: &[u8]) -> Mark {
        Mark {
            arena: self.arena.len(),
            spans: self.spans.len(),
            defined: self.defined,
            seq: self.seq,
            micros: self.micros,
            out: out.len(),
        }
    }

    /// Forgets what a read since `mark` defined and wrote: it did not end
    /// in a whole record.
    fn undo(&mut self, mark: Mark, out: &mut Vec<u8>) {
        self.arena.truncate(mark.arena);
        self.spans.truncate(mark.spans);
        self.slots.truncate(mark.spans);
        (self.defined, self.seq, self.micros) = (mark.defined, mark.seq, mark.micros);
        out.truncate(mark.out);
    }

    /// Records read through so far, their text checked and written (whole,
    /// cut short the first time, or bad): what a reader's cost grows with.
    /// (A heads reader reads a record that must go out as its line twice,
    /// and counts it once.)
    pub fn attempts(&self) -> u64 {
        self.attempts
    }

    fn record(&mut self, r: &mut Cursor<'_>, out: &mut Vec<u8>) -> Read<()> {
        match r.byte()? {
            RESET => {
                self.reset();
                Ok(())
            }
            LINE => {
                let text = r.text()?;
                if text.contains(&b'\n') {
                    return Err(bad("a line record holds a newline"));
                }
                if self.heads {
                    RecordReader::line_entry(out, text);
                } else {
                    out.extend_from_slice(text);
                    out.push(b'\n');
                }
                Ok(())
            }
            EVENT if self.heads => self.event_entry(r, out),
            EVENT => self.event(r, out),
            tag => Err(Stop::Bad(format!("unknown record tag {tag}"))),
        }
    }

    /// An event record's head, its tag read: `seq` and `ts` taken in,
    /// the name's, the run's and the ids' string numbers, and how many
    /// fields follow.
    fn event_head(&mut self, r: &mut Cursor<'_>) -> Read<(usize, usize, [Option<usize>; 3], u64)> {
        self.seq = self.seq.wrapping_add(unzigzag(r.varint()?));
        self.micros = self.micros.wrapping_add(unzigzag(r.varint()?));
        let flags = r.byte()?;
        if flags & !(HAS_EXEC | HAS_STAGE | HAS_TOOL) != 0 {
            return Err(Stop::Bad(format!("unknown event flags {flags:#x}")));
        }
        let name = self.string(r)?;
        let run = self.string(r)?;
        let mut ids = [None; 3];
        for (i, flag) in [HAS_EXEC, HAS_STAGE, HAS_TOOL].into_iter().enumerate() {
            if flags & flag != 0 {
                ids[i] = Some(self.string(r)?);
            }
        }
        let fields = r.varint()?;
        if fields > MAX_FIELDS {
            return Err(Stop::Bad(format!("an event with {fields} fields")));
        }
        Ok((name, run, ids, fields))
    }

    fn event(&mut self, r: &mut Cursor<'_>, out: &mut Vec<u8>) -> Read<()> {
        let start = out.len();
        let (name, run, ids, fields) = self.event_head(r)?;
        let text = |n: Option<usize>| n.map(|n| self.checked(n));
        write_head(
            out,
            &Head {
                seq: self.seq,
                micros: self.micros,
                name: self.checked(name),
                run: self.checked(run),
                exec: text(ids[0]),
                stage: text(ids[1]),
                tool: text(ids[2]),
            },
        );
        // A string is written each time it is referred to: a record of a
        // few bytes may make a line of any length (its head too: five
        // references to one long string), and one line is held whole.
        self.within_line(out.len() - start)?;
        for _ in 0..fields {
            self.field(r, out)?;
            self.within_line(out.len() - start)?;
        }
        out.extend_from_slice(b"}\n");
        Ok(())
    }

    /// Refuses a line of `len` bytes so far past the longest a record may
    /// make.
    fn within_line(&self, len: usize) -> Read<()> {
        if len > self.longest_line() {
            return Err(Stop::Bad(format!(
                "a record whose line passes {} MiB",
                self.longest_line() >> 20
            )));
        }
        Ok(())
    }

    fn field(&mut self, r: &mut Cursor<'_>, out: &mut Vec<u8>) -> Read<()> {
        let tag = r.byte()?;
        if tag == V_MEMBERS {
            let members = r.text()?;
            if members.contains(&b'\n') {
                return Err(bad("a relayed event's members hold a newline"));
            }
            write_members(out, members);
            return Ok(());
        }
        let key = self.string(r)?;
        write_key(out, self.checked(key));
        match tag {
            V_STR => {
                let value = self.string(r)?;
                self.checked(value).write_to(out);
            }
            V_TEXT => {
                let text = std::str::from_utf8(r.text()?)
                    .map_err(|_| bad("a string that is not UTF-8"))?;
                write_json_str(out, text);
            }
            V_U64 => super::json::write_u64(out, r.varint()?),
            V_FALSE => out.extend_from_slice(b"false"),
            V_TRUE => out.extend_from_slice(b"true"),
            V_USAGE => {
                let (p, c, q) = (r.varint()?, r.varint()?, r.varint()?);
                write_usage(out, p, c, q);
            }
            V_JSON => {
                let text = r.text()?;
                if text.is_empty() || text.contains(&b'\n') {
                    return Err(bad("a JSON value that is empty or holds a newline"));
                }
                out.extend_from_slice(text);
            }
            tag => return Err(Stop::Bad(format!("unknown value tag {tag}"))),
        }
        Ok(())
    }

    /// A string reference: the number of the string, defining it first
    /// when the reference is a definition.
    fn string(&mut self, r: &mut Cursor<'_>) -> Read<usize> {
        match r.varint()? {
            0 => {
                let text = std::str::from_utf8(r.text()?)
                    .map_err(|_| bad("a string that is not UTF-8"))?;
                define(&mut self.defined, text.len())?;
                let start = self.arena.len();
                let quoted = clean(text);
                if quoted {
                    self.arena.push('"');
                    self.arena.push_str(text);
                    self.arena.push('"');
                } else {
                    self.arena.push_str(text);
                }
                self.spans.push((start, self.arena.len(), quoted));
                if self.heads {
                    self.slots.push(heads::slot_number(text));
                }
                Ok(self.spans.len() - 1)
            }
            n => referred(n, self.spans.len()),
        }
    }

    /// String `n`, checked for escapes.
    fn checked(&self, n: usize) -> Checked<'_> {
        let (from, to, quoted) = self.spans[n];
        if quoted {
            Checked::Quoted(&self.arena.as_bytes()[from..to])
        } else {
            Checked::Escaped(&self.arena[from..to])
        }
    }
}

/// Counts a string's definition into the bytes of text defined since the
/// last `RESET`, which may not pass [`MAX_RECORD`].
fn define(defined: &mut usize, len: usize) -> Read<()> {
    if *defined + len > MAX_RECORD {
        return Err(Stop::Bad(format!(
            "strings past {} MiB without a RESET",
            MAX_RECORD >> 20
        )));
    }
    *defined += len;
    Ok(())
}

/// The string a reference `n` (not 0) names, of `count` defined.
fn referred(n: u64, count: usize) -> Read<usize> {
    let n = usize::try_from(n - 1).unwrap_or(usize::MAX);
    if n >= count {
        return Err(Stop::Bad(format!(
            "a reference to string {n}, of {count} defined"
        )));
    }
    Ok(n)
}

/// A record cut short that is already longer than any record may be.
fn too_long(bytes: &[u8]) -> Option<String> {
    (bytes.len() > MAX_RECORD).then(|| format!("a record longer than {} MiB", MAX_RECORD >> 20))
}

/// The length of the record `bytes` begins with, from its frame alone
/// (tags, counts, lengths): what [`RecordReader::read`] reads, without
/// checking or writing its text. [`Stop::More`] while it is cut short.
fn record_len(bytes: &[u8]) -> Read<usize> {
    let mut r = Cursor { bytes, at: 0 };
    let string = |r: &mut Cursor<'_>| -> Read<()> {
        if r.varint()? == 0 {
            r.text()?;
        }
        Ok(())
    };
    match r.byte()? {
        RESET => {}
        LINE => {
            r.text()?;
        }
        EVENT => {
            r.varint()?;
            r.varint()?;
            let flags = r.byte()?;
            if flags & !(HAS_EXEC | HAS_STAGE | HAS_TOOL) != 0 {
                return Err(Stop::Bad(format!("unknown event flags {flags:#x}")));
            }
            string(&mut r)?;
            string(&mut r)?;
            for flag in [HAS_EXEC, HAS_STAGE, HAS_TOOL] {
                if flags & flag != 0 {
                    string(&mut r)?;
                }
            }
            let fields = r.varint()?;
            if fields > MAX_FIELDS {
                return Err(Stop::Bad(format!("an event with {fields} fields")));
            }
            for _ in 0..fields {
                match r.byte()? {
                    V_MEMBERS => {
                        r.text()?;
                        continue;
                    }
                    tag => {
                        string(&mut r)?;
                        match tag {
                            V_STR => string(&mut r)?,
                            V_TEXT | V_JSON => {
                                r.text()?;
                            }
                            V_U64 => {
                                r.varint()?;
                            }
                            V_USAGE => {
                                for _ in 0..3 {
                                    r.varint()?;
                                }
                            }
                            V_FALSE | V_TRUE => {}
                            tag => return Err(Stop::Bad(format!("unknown value tag {tag}"))),
                        }
                    }
                }
            }
        }
        tag => return Err(Stop::Bad(format!("unknown record tag {tag}"))),
    }
    Ok(r.at)
}

fn bad(reason: &str) -> Stop {
    Stop::Bad(reason.to_owned())
}

/// Bytes being read; running out is [`Stop::More`].
struct Cursor<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Cursor<'a> {
    fn byte(&mut self) -> Read<u8> {
        let b = *self.bytes.get(self.at).ok_or(Stop::More)?;
        self.at += 1;
        Ok(b)
    }

    fn take(&mut self, n: usize) -> Read<&'a [u8]> {
        let end = self.at.checked_add(n).ok_or(Stop::More)?;
        let taken = self.bytes.get(self.at..end).ok_or(Stop::More)?;
        self.at = end;
        Ok(taken)
    }

    /// A length, then that many bytes.
    fn text(&mut self) -> Read<&'a [u8]> {
        let len = self.varint()?;
        if len > MAX_TEXT {
            return Err(Stop::Bad(format!("a text of {len} bytes")));
        }
        self.take(len as usize)
    }

    /// An unsigned LEB128 varint of at most ten bytes.
    #[inline]
    fn varint(&mut self) -> Read<u64> {
        // Most are one byte: string numbers, counts, tags' lengths.
        match self.bytes.get(self.at) {
            Some(&b) if b < 0x80 => {
                self.at += 1;
                Ok(u64::from(b))
            }
            _ => self.long_varint(),
        }
    }

    fn long_varint(&mut self) -> Read<u64> {
        let mut n = 0u64;
        for i in 0..10 {
            let b = self.byte()?;
            if i == 9 && b > 1 {
                return Err(bad("a number past 64 bits"));
            }
            n |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(n);
            }
        }
        Err(bad("a number past 64 bits"))
    }
}

fn write_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn write_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    write_varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A difference of two `u64`s (taken wrapping) as a small unsigned
/// number when it is small either way.
fn zigzag(d: u64) -> u64 {
    let d = d as i64;
    ((d << 1) ^ (d >> 63)) as u64
}

fn unzigzag(z: u64) -> u64 {
    ((z >> 1) as i64 ^ -((z & 1) as i64)) as u64
}

mod heads;
pub mod scan;
mod writer;

pub use heads::{Entries, HeadEntry};
pub use writer::{EventHead, RecordWriter};

#[cfg(test)]
pub(super) mod tests;
#[cfg(test)]
pub(crate) use tests::read_in_pieces;
