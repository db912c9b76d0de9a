//! Records read for what a resume's scan needs of each event, not as
//! JSON lines.
//!
//! A resume scans the whole log for its last `seq` and for the executions
//! entered, exited and cancelled: six members of each event
//! ([`crate::auditlog::Head`]). Each record written out as its JSON line
//! and parsed back was four fifths of a resume's instructions
//! (BENCHMARKS.md, "Every core, twenty-second round"). A reader made
//! with [`RecordReader::heads`] hands out, for each event record, just
//! those six members, read from the record where a JSON parser would
//! have found them in its line:
//!
//! - a member named like one of them among the event's fields counts
//!   after the head, the last one given winning, and a value of another
//!   type than the member's reads as absent, as [`crate::auditlog::Head`]
//!   reads a line;
//! - an event with a field whose value is JSON text, or a relayed
//!   event's members, could hold anything a line can: it is handed out as
//!   its JSON line, which the scan parses;
//! - so is a record whose line could pass the longest a record may make:
//!   its line is made and measured as [`RecordReader::read`] does;
//! - a `LINE` record is handed out as its line.
//!
//! Whatever the JSON reader refuses, this refuses with the same reason,
//! and the lengths it reads are the same: [`RecordReader::read`] frames
//! both.

use std::borrow::Cow;

use super::*;
use crate::auditlog::Head;

/// An entry: an event's members, as [`write_entry`] writes them.
const E_HEAD: u8 = 1;
/// An entry: a line (a `LINE` record's text, which the scan parses as
/// JSON, or an event made into its line), its length as four
/// little-endian bytes.
const E_LINE: u8 = 2;

/// More than the members of a line's head other than its strings can
/// take: `{"seq":`, twenty digits, the timestamp, the keys, quotes and
/// commas.
const HEAD_BOUND: usize = 256;

/// What a member the scan reads holds so far.
#[derive(Debug, Clone, Copy)]
enum Slot {
    Absent,
    /// A string by number.
    Str(usize),
    /// A string written in place: its range in the record's bytes.
    Text(usize, usize),
    Num(u64),
}

/// A string that names no member the scan reads.
pub(super) const NO_SLOT: u8 = u8::MAX;

/// The member the scan reads a field named `key` as, in [`Slot`] order:
/// `seq`, `event`, `stageExecutionId`, `stageId`, `turnId`, `status`;
/// [`NO_SLOT`] for any other name. Found once, when the string is
/// defined, not at every field that names it.
pub(super) fn slot_number(key: &str) -> u8 {
    match key {
        "seq" => 0,
        "event" => 1,
        "stageExecutionId" => 2,
        "stageId" => 3,
        "turnId" => 4,
        // A `WorkflowExit`'s status, a `StageExited`'s verdict (see
        // `Head::status`).
        "status" | "verdict" => 5,
        _ => NO_SLOT,
    }
}

impl RecordReader {
    /// A reader that hands out each record as the entry the scan reads
    /// ([`Entries`]) instead of its JSON line.
    pub fn heads() -> RecordReader {
        RecordReader {
            heads: true,
            ..RecordReader::default()
        }
    }

    /// A `LINE` record's text, as an entry.
    pub(super) fn line_entry(out: &mut Vec<u8>, text: &[u8]) {
        out.push(E_LINE);
        out.extend_from_slice(&(text.len() as u32).to_le_bytes());
        out.extend_from_slice(text);
    }

    /// An event record (its tag read) as an entry: its members, or its
    /// JSON line where those cannot be told without it.
    pub(super) fn event_entry(&mut self, r: &mut Cursor<'_>, out: &mut Vec<u8>) -> Read<()> {
        let begin = r.at;
        let mark = self.mark(out);
        if self.members(r, out)? {
            return Ok(());
        }
        // Read again as a line: forget what the first reading defined.
        self.undo(mark, out);
        r.at = begin;
        out.push(E_LINE);
        let at = out.len();
        out.extend_from_slice(&[0; 4]);
        self.event(r, out)?;
        out.pop(); // its newline
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_le_bytes());
        Ok(())
    }

    /// Writes the event's members as an entry; false, having written
    /// nothing, when its line must be made instead.
    fn members(&mut self, r: &mut Cursor<'_>, out: &mut Vec<u8>) -> Read<bool> {
        let (name, run, ids, fields) = self.event_head(r)?;
        let mut bound = HEAD_BOUND + self.json_bound(name) + self.json_bound(run);
        for id in ids.into_iter().flatten() {
            bound += self.json_bound(id);
        }
        if bound > self.longest_line() {
            return Ok(false);
        }
        let id = |n: Option<usize>| n.map_or(Slot::Absent, Slot::Str);
        let mut slots = [
            Slot::Num(self.seq),
            Slot::Str(name),
            id(ids[0]),
            id(ids[1]),
            Slot::Absent,
            Slot::Absent,
        ];
        for _ in 0..fields {
            let tag = r.byte()?;
            if tag == V_MEMBERS || tag == V_JSON {
                return Ok(false);
            }
            let key = self.string(r)?;
            // `,"key":` and the value.
            bound += self.json_bound(key) + 2;
            let value = match tag {
                V_STR => {
                    let value = self.string(r)?;
                    bound += self.json_bound(value);
                    Slot::Str(value)
                }
                V_TEXT => {
                    let text = r.text()?;
                    std::str::from_utf8(text).map_err(|_| bad("a string that is not UTF-8"))?;
                    bound += 6 * text.len() + 2;
                    Slot::Text(r.at - text.len(), r.at)
                }
                V_U64 => {
                    bound += 20;
                    Slot::Num(r.varint()?)
                }
                V_FALSE | V_TRUE => {
                    bound += 5;
                    Slot::Absent
                }
                V_USAGE => {
                    for _ in 0..3 {
                        r.varint()?;
                    }
                    bound += 128;
                    Slot::Absent
                }
                tag => return Err(Stop::Bad(format!("unknown value tag {tag}"))),
            };
            let i = usize::from(self.slots.get(key).copied().unwrap_or(NO_SLOT));
            if i < slots.len() {
                // `seq` reads only as a number, the others only as text.
                slots[i] = match (i == 0, value) {
                    (true, Slot::Num(n)) => Slot::Num(n),
                    (false, Slot::Str(_) | Slot::Text(..)) => value,
                    _ => Slot::Absent,
                };
            }
            if bound > self.longest_line() {
                return Ok(false);
            }
        }
        out.push(E_HEAD);
        match slots[0] {
            Slot::Num(n) => {
                out.push(1);
                write_varint(out, n);
            }
            _ => out.push(0),
        }
        for slot in &slots[1..] {
            let text: Option<&[u8]> = match *slot {
                Slot::Str(n) => Some(self.text(n).as_bytes()),
                Slot::Text(from, to) => Some(&r.bytes[from..to]),
                Slot::Absent | Slot::Num(_) => None,
            };
            match text {
                Some(text) => {
                    write_varint(out, text.len() as u64 + 1);
                    out.extend_from_slice(text);
                }
                None => out.push(0),
            }
        }
        Ok(true)
    }

    /// String `n` as it was defined.
    fn text(&self, n: usize) -> &str {
        let (from, to, quoted) = self.spans[n];
        if quoted {
            &self.arena[from + 1..to - 1]
        } else {
            &self.arena[from..to]
        }
    }

    /// At least the bytes string `n` takes in a line: exactly, quotes
    /// included, for one that needs no escaping; at most six a byte for
    /// one that does.
    fn json_bound(&self, n: usize) -> usize {
        let (from, to, quoted) = self.spans[n];
        if quoted {
            to - from
        } else {
            6 * (to - from) + 2
        }
    }
}

/// One entry a heads reader handed out.
#[derive(Debug, Clone, PartialEq)]
pub enum HeadEntry<'a> {
    /// An event's members: `seq`, then `event`, `stageExecutionId`,
    /// `stageId`, `turnId`, `status` (each absent when the line would
    /// hold none of its type).
    Members(Option<u64>, [Option<&'a str>; 5]),
    /// A line (no newline), for the caller to parse as JSON.
    Line(&'a [u8]),
}

impl<'a> HeadEntry<'a> {
    /// The members the entry holds: read from the record, or from the
    /// line it handed out instead (`None` for a line that is not UTF-8
    /// or not a JSON object).
    pub fn head(self) -> Option<Head<'a>> {
        match self {
            HeadEntry::Members(seq, texts) => {
                let [event, exec, stage, turn, status] = texts.map(|t| t.map(Cow::Borrowed));
                Some(Head {
                    seq,
                    event,
                    stage_execution_id: exec,
                    stage_id: stage,
                    turn_id: turn,
                    status,
                })
            }
            HeadEntry::Line(line) => Head::of_line(line),
        }
    }
}

/// The entries in what a heads reader handed out.
#[derive(Debug)]
pub struct Entries<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl<'a> Entries<'a> {
    pub fn new(bytes: &'a [u8]) -> Entries<'a> {
        Entries { bytes, at: 0 }
    }

    fn entry(&mut self) -> Option<HeadEntry<'a>> {
        let mut r = Cursor {
            bytes: self.bytes,
            at: self.at,
        };
        let entry = match r.byte().ok()? {
            E_HEAD => {
                let seq = match r.byte().ok()? {
                    0 => None,
                    _ => Some(r.varint().ok()?),
                };
                let mut texts = [None; 5];
                for text in &mut texts {
                    let len = r.varint().ok()?;
                    if len > 0 {
                        let bytes = r.take(usize::try_from(len - 1).ok()?).ok()?;
                        *text = Some(std::str::from_utf8(bytes).ok()?);
                    }
                }
                HeadEntry::Members(seq, texts)
            }
            E_LINE => {
                let len = u32::from_le_bytes(r.take(4).ok()?.try_into().ok()?);
                HeadEntry::Line(r.take(len as usize).ok()?)
            }
            _ => return None,
        };
        self.at = r.at;
        Some(entry)
    }
}

/// Each entry, or `Err` once at bytes no heads reader wrote (a bug: the
/// entries never leave the process that made them).
impl<'a> Iterator for Entries<'a> {
    type Item = Result<HeadEntry<'a>, String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.at == self.bytes.len() {
            return None;
        }
        match self.entry() {
            Some(entry) => Some(Ok(entry)),
            None => {
                self.at = self.bytes.len();
                Some(Err(
                    "the scan's reader handed out an entry it cannot read back".to_owned(),
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use proptest::prelude::*;

    use super::super::tests::read_in_pieces_with;
    use super::*;

    /// What the scan reads of each record: its members, owned.
    type Read = Vec<Option<Head<'static>>>;

    fn owned(head: Option<Head<'_>>) -> Option<Head<'static>> {
        head.map(Head::into_owned)
    }

    /// A reader of lines or of heads whose lines may be `limit` bytes at
    /// most, or as long as a record's may.
    fn reader(heads: bool, limit: Option<usize>) -> RecordReader {
        RecordReader {
            heads,
            line_limit: limit,
            ..RecordReader::default()
        }
    }

    /// The records read as JSON lines and each line parsed, as the scan
    /// read every log before.
    fn as_lines_within(bytes: &[u8], cuts: &[usize], limit: Option<usize>) -> Result<Read, String> {
        let lines = read_in_pieces_with(reader(false, limit), bytes, cuts)?;
        Ok(lines
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| owned(Head::of_line(l)))
            .collect())
    }

    /// The records read as a heads reader's entries.
    fn as_heads_within(bytes: &[u8], cuts: &[usize], limit: Option<usize>) -> Result<Read, String> {
        let entries = read_in_pieces_with(reader(true, limit), bytes, cuts)?;
        Entries::new(&entries)
            .filter(|e| e.as_ref().map_or(true, |e| *e != HeadEntry::Line(b"")))
            .map(|e| e.map(|e| owned(e.head())))
            .collect()
    }

    fn as_lines(bytes: &[u8], cuts: &[usize]) -> Result<Read, String> {
        as_lines_within(bytes, cuts, None)
    }

    fn as_heads(bytes: &[u8], cuts: &[usize]) -> Result<Read, String> {
        as_heads_within(bytes, cuts, None)
    }

    #[derive(Debug, Clone)]
    enum Value {
        Static(&'static str),
        Shared(String),
        Text(String),
        U64(u64),
        Bool(bool),
        Usage([u64; 3]),
        Json(&'static str),
        Members(&'static str),
    }

    #[derive(Debug, Clone)]
    enum Record {
        Reset,
        Line(&'static str),
        Event {
            seq: u64,
            micros: u64,
            name: &'static str,
            ids: [Option<String>; 3],
            fields: Vec<(&'static str, Value)>,
        },
    }

    fn write(records: &[Record]) -> Vec<u8> {
        let mut w = RecordWriter::new();
        let mut out = Vec::new();
        let run: Arc<str> = Arc::from("r");
        for record in records {
            match record {
                Record::Reset => w.begin(&mut out),
                Record::Line(line) => w.line(&mut out, |o| o.extend_from_slice(line.as_bytes())),
                Record::Event {
                    seq,
                    micros,
                    name,
                    ids,
                    fields,
                } => {
                    let ids = ids.clone().map(|id| id.map(Arc::<str>::from));
                    w.event(
                        &mut out,
                        &EventHead {
                            seq: *seq,
                            micros: *micros,
                            name,
                            run: &run,
                            exec: ids[0].as_ref(),
                            stage: ids[1].as_ref(),
                            tool: ids[2].as_ref(),
                            fields: fields.len(),
                        },
                    );
                    for (key, value) in fields {
                        match value {
                            Value::Static(v) => w.field_static(&mut out, key, v),
                            Value::Shared(v) => w.field_shared(&mut out, key, &Arc::from(&**v)),
                            Value::Text(v) => w.field_text(&mut out, key, v),
                            Value::U64(n) => w.field_u64(&mut out, key, *n),
                            Value::Bool(b) => w.field_bool(&mut out, key, *b),
                            Value::Usage(u) => w.field_usage(&mut out, key, *u),
                            Value::Json(j) => {
                                w.field_json(&mut out, key, |o| o.extend_from_slice(j.as_bytes()));
                            }
                            Value::Members(m) => w.members(&mut out, m),
                        }
                    }
                }
            }
        }
        out
    }

    /// Short strings, some needing escapes (quotes, backslashes, control
    /// characters, non-ASCII), and now and then a long one.
    fn text() -> impl Strategy<Value = String> {
        prop_oneof![
            8 => "[a-z\"\\\\/#é\n\t\u{1}\u{7f}]{0,8}",
            1 => "[a-z\u{1}]{100,300}",
        ]
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            prop::sample::select(vec!["ok", "a\"b", "StageExited", "é\n"]).prop_map(Value::Static),
            text().prop_map(Value::Shared),
            text().prop_map(Value::Text),
            any::<u64>().prop_map(Value::U64),
            any::<bool>().prop_map(Value::Bool),
            any::<[u64; 3]>().prop_map(Value::Usage),
            prop::sample::select(vec![
                "\"t1\"",
                "5",
                "{\"a\":[1]}",
                "\"a\\\"b\"",
                "null",
                "-1",
                "not json",
                "a\nb",
            ])
            .prop_map(Value::Json),
            prop::sample::select(vec![
                "\"turnId\":\"t9\"",
                "\"event\":\"X\",\"seq\":3",
                "\"status\":5",
                "\"k\":1",
                "bad",
            ])
            .prop_map(Value::Members),
        ]
    }

    fn record() -> impl Strategy<Value = Record> {
        let key = prop::sample::select(vec![
            "seq",
            "event",
            "stageExecutionId",
            "stageId",
            "turnId",
            "status",
            "ts",
            "tool",
            "verdict",
            "n",
            "k\"ey",
            "t\tab",
        ]);
        let id = || prop::option::of(text());
        prop_oneof![
            1 => Just(Record::Reset),
            1 => prop::sample::select(vec![
                "{\"seq\":4,\"event\":\"SessionTurnStart\",\"turnId\":\"r/turn/1\"}",
                "{\"seq\":\"4\"}",
                "[1]",
                "",
                "{\"seq\":5,",
                "a\nb",
            ])
            .prop_map(Record::Line),
            6 => (
                any::<u64>(),
                any::<u64>(),
                prop::sample::select(vec!["StageEntered", "StageExited", "a\"b"]),
                [id(), id(), id()],
                prop::collection::vec((key, value()), 0..6),
            )
                .prop_map(|(seq, micros, name, ids, fields)| Record::Event {
                    seq,
                    micros,
                    name,
                    ids,
                    fields,
                }),
        ]
    }

    proptest! {
        /// Whatever records a log holds, the scan reads the same members
        /// of each from the records as from their lines, and refuses
        /// the same records for the same reason, however they arrive.
        #[test]
        fn the_members_read_from_records_are_those_their_lines_hold(
            records in prop::collection::vec(record(), 0..12),
            cuts in prop::collection::vec(any::<usize>(), 0..3),
        ) {
            let bytes = write(&records);
            prop_assert_eq!(as_heads(&bytes, &cuts), as_lines(&bytes, &cuts));
        }

        /// A log cut inside a record (a killed writer's torn end): both
        /// readings find the same damage in what is there, or none.
        #[test]
        fn a_record_cut_short_is_checked_alike(
            records in prop::collection::vec(record(), 1..8),
            cut in any::<usize>(),
        ) {
            let bytes = write(&records);
            let tail = &bytes[..cut % (bytes.len() + 1)];
            prop_assert_eq!(
                reader(true, None).check_cut_short(tail),
                reader(false, None).check_cut_short(tail)
            );
        }

        /// Bytes troupe did not write: the same reason or the same members.
        #[test]
        fn arbitrary_bytes_read_alike_either_way(
            bytes in prop::collection::vec(any::<u8>(), 0..200),
        ) {
            let cuts = [bytes.len() / 2];
            prop_assert_eq!(as_heads(&bytes, &cuts), as_lines(&bytes, &cuts));
        }
    }

    /// The members of a runtime event come from its record, not its line;
    /// a field named like one of them counts after the head; JSON text
    /// and relayed members are read from the line they make.
    #[test]
    fn an_event_is_read_from_its_record_unless_its_line_is_needed() {
        let event = |fields: Vec<(&'static str, Value)>| Record::Event {
            seq: 9,
            micros: 1,
            name: "SessionTurnStart",
            ids: [Some("r/w#1/1".to_owned()), Some("w".to_owned()), None],
            fields,
        };
        let bytes = write(&[
            Record::Reset,
            event(vec![("turnId", Value::Shared("r/turn/1".to_owned()))]),
            event(vec![
                ("event", Value::Static("StageExited")),
                ("seq", Value::U64(3)),
            ]),
            event(vec![
                ("stageId", Value::U64(3)),
                ("seq", Value::Static("ok")),
            ]),
            event(vec![("turnId", Value::Json("\"t\""))]),
        ]);
        let entries = read_in_pieces_with(RecordReader::heads(), &bytes, &[]).expect("read");
        let kinds: Vec<bool> = Entries::new(&entries)
            .map(|e| matches!(e, Ok(HeadEntry::Members(..))))
            .collect();
        assert_eq!(kinds, [true, true, true, false]);
        let read = as_heads(&bytes, &[]).expect("read");
        let head = |seq, [event, exec, stage, turn]: [Option<&'static str>; 4]| {
            let text = |t: Option<&'static str>| t.map(Cow::Borrowed);
            Some(Head {
                seq,
                event: text(event),
                stage_execution_id: text(exec),
                stage_id: text(stage),
                turn_id: text(turn),
                status: None,
            })
        };
        let (turn, exec) = (Some("SessionTurnStart"), Some("r/w#1/1"));
        assert_eq!(
            read,
            [
                head(Some(9), [turn, exec, Some("w"), Some("r/turn/1")]),
                head(Some(3), [Some("StageExited"), exec, Some("w"), None]),
                head(None, [turn, exec, None, None]),
                head(Some(9), [turn, exec, Some("w"), Some("t")]),
            ]
        );
        assert_eq!(Ok(read), as_lines(&bytes, &[]));
    }

    /// Near the longest line a record may make, whatever makes the line
    /// long (its head, text to escape, a key or a value to escape, usage),
    /// the members are read alike and a line past it is refused alike:
    /// the bound a heads reader keeps is never below the line's length.
    #[test]
    fn a_line_near_the_limit_is_read_alike_whatever_makes_it_long() {
        let limit = Some(1024);
        let event = |ids: [Option<String>; 3], fields: Vec<(&'static str, Value)>| Record::Event {
            seq: u64::MAX,
            micros: u64::MAX,
            name: "StageEntered",
            ids,
            fields,
        };
        let escaped = |n: usize| "\u{1}".repeat(n);
        let mut refused = 0;
        for n in 0..260 {
            let key: &'static str = Box::leak(escaped(n).into_boxed_str());
            let cases = [
                event([Some("x".repeat(4 * n)), None, None], vec![]),
                event(
                    [Some("x".repeat(4 * n)), None, None],
                    vec![("n", Value::U64(1))],
                ),
                event([Some(escaped(n)), Some("w".to_owned()), None], vec![]),
                event([None, None, None], vec![("k", Value::Text(escaped(n)))]),
                event([None, None, None], vec![("k", Value::Shared(escaped(n)))]),
                event([None, None, None], vec![(key, Value::Static("ok"))]),
                event(
                    [None, None, None],
                    vec![("u", Value::Usage([u64::MAX; 3])); n / 20],
                ),
            ];
            for case in cases {
                let bytes = write(&[Record::Reset, case]);
                let lines = as_lines_within(&bytes, &[], limit);
                refused += usize::from(lines.is_err());
                assert_eq!(as_heads_within(&bytes, &[], limit), lines, "n = {n}");
            }
        }
        assert!(refused > 0, "some lines pass the limit");
        // A head alone can make a line past it: five references to one
        // long string, with no field to check the line after.
        let head = write(&[
            Record::Reset,
            event([Some("x".repeat(2000)), None, None], vec![]),
        ]);
        let lines = as_lines_within(&head, &[], limit);
        assert!(
            lines.as_ref().is_err_and(|e| e.contains("passes")),
            "{lines:?}"
        );
        assert_eq!(as_heads_within(&head, &[], limit), lines);
    }

    /// A record whose line would pass the longest a record may make is
    /// refused as its line is, though the scan never makes its line.
    #[test]
    fn a_record_whose_line_passes_the_limit_is_refused_alike() {
        let long = "x".repeat(600);
        let bytes = write(&[
            Record::Reset,
            Record::Event {
                seq: 1,
                micros: 1,
                name: "StageEntered",
                ids: [Some(long.clone()), Some(long), None],
                fields: vec![("n", Value::U64(1))],
            },
        ]);
        let limited = |heads| RecordReader {
            heads,
            ..RecordReader::with_line_limit(1024)
        };
        let lines = read_in_pieces_with(limited(false), &bytes, &[]);
        assert!(
            lines.as_ref().is_err_and(|e| e.contains("passes")),
            "{lines:?}"
        );
        assert_eq!(read_in_pieces_with(limited(true), &bytes, &[]), lines);
    }
}
