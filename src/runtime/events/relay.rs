//! A worker's events as it relays them to the coordinator: each
//! execution's events in the log's record format ([`Relaying`]), read back
//! into events with their fields as the values they were
//! ([`Event::read_relayed`]).
//!
//! As JSON lines, a sibling's events cost its worker about 42 000
//! instructions to write and the coordinator about 80 000 to read back,
//! more than a local sibling costs in all (callgrind, BENCHMARKS.md
//! "Every core, seventeenth round"). As records, each string an execution
//! names is written once, a number is a varint, and the coordinator
//! builds each event straight from them, making each string once a
//! thread rather than once an execution (`Interned`). The coordinator's
//! log then writes those events as its own records, so its lines are the
//! lines the worker's events make, byte for byte (tests below).

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use super::decode::{members_as_read, value_as_read};
use super::encode::HEAD_KEYS;
use super::vocabulary::{Event, EventName, FieldValue};
use crate::auditlog::json::{escaped_len, write_key, write_members};
use crate::auditlog::records::scan::{self, Record, Scan};
use crate::auditlog::records::{RecordReader, RecordWriter};
use crate::provider::Usage;

/// One execution's events, written as a worker collects them.
#[derive(Debug)]
pub struct Relaying {
    writer: RecordWriter,
    bytes: Vec<u8>,
}

impl Default for Relaying {
    fn default() -> Relaying {
        let mut writer = RecordWriter::for_one_execution();
        let mut bytes = Vec::with_capacity(1024);
        writer.begin(&mut bytes);
        Relaying { writer, bytes }
    }
}

impl Relaying {
    /// Writes one event (its `seq` is the coordinator's to give).
    pub fn push(&mut self, event: &Event) {
        event.write_record(0, &mut self.writer, &mut self.bytes);
    }

    /// The records written, for [`Event::read_relayed`].
    pub fn into_bytes(self) -> Vec<u8> {
        self.bytes
    }
}

/// Relayed records as the JSON lines they make (without newlines), for
/// a coordinator that reads events as lines: the lines
/// [`Event::write_json`] writes with `seq` 0. The records are the
/// worker's own ([`Relaying`]): one it cannot read (a bug) ends the lines
/// there, as a line the coordinator cannot read is skipped.
pub fn relayed_lines(bytes: &[u8]) -> Vec<String> {
    relayed_lines_within(bytes, usize::MAX).unwrap_or_default()
}

/// [`relayed_lines`], while they come to at most `within` bytes, each
/// counted with the comma that follows it in a report; `None` as soon as
/// they would come to more. An execution's records are a fraction of
/// the text they make, so lines that cannot go are not all made first.
pub fn relayed_lines_within(bytes: &[u8], within: usize) -> Option<Vec<String>> {
    let mut reader = RecordReader::default();
    let (mut at, mut text, mut lines, mut size) = (0, Vec::new(), Vec::new(), 0usize);
    while let Ok(Some(n)) = reader.read(&bytes[at..], &mut text) {
        at += n;
        if text.pop().is_some() {
            size = size.saturating_add(text.len() + 1);
            if size > within {
                return None;
            }
            match String::from_utf8(std::mem::take(&mut text)) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
    }
    debug_assert_eq!(at, bytes.len(), "the worker's own records");
    Some(lines)
}

/// The field keys the runtime gives the events it relays (sorted, for a
/// binary search): a relayed field's key is read back as one of these.
/// An event with a key not here keeps all its fields as their JSON text
/// ([`FieldValue::Relayed`]), as a line read back does: the same line is
/// written either way.
const KEYS: [&str; 65] = [
    "answer",
    "argsDigest",
    "argsSummary",
    "arguments",
    "attempt",
    "attemptCount",
    "by",
    "bytes",
    "callId",
    "cancelled",
    "cap",
    "capHit",
    "check",
    "code",
    "compoundTurnId",
    "ctx",
    "delivered",
    "done",
    "entry",
    "error",
    "execution",
    "failed",
    "failedSibling",
    "hook",
    "index",
    "interactionId",
    "interactors",
    "join",
    "kind",
    "mcpServer",
    "mcpTool",
    "message",
    "mode",
    "next",
    "outcome",
    "parallelCap",
    "phase",
    "pipeline",
    "prompt",
    "proposalId",
    "provider",
    "providerSlot",
    "reason",
    "resolutionPolicy",
    "retryAfterMs",
    "retrying",
    "rewritten",
    "rule",
    "running",
    "slot",
    "stages",
    "status",
    "storedResults",
    "text",
    "toolCalls",
    "try",
    "turn",
    "turnId",
    "usage",
    "verdict",
    "visit",
    "waitMs",
    "waiting",
    "width",
    "worker",
];

/// The most text the relayed records of one message may make, and about
/// the most memory reading them may take: a string is defined once and
/// referred to in a byte or two, so a few bytes could otherwise make
/// gigabytes of lines. A message of JSON lines was bounded by its size
/// (64 MiB expanded) in the same way. Text is counted as it is written,
/// escapes included, so no event's line passes what the log's reader
/// takes (256 MiB).
const RELAYED_MAX: usize = 64 << 20;

/// What each string defined or field read counts against
/// [`RELAYED_MAX`] beside its text: what reading it holds.
const OVERHEAD: usize = 64;

/// What each event read counts: the event and its place in the report.
const EVENT_OVERHEAD: usize = 256;

/// The last microsecond an audit timestamp can say (9999-12-31T23:59:59.999999Z).
const LAST_MICROS: u64 = 253_402_300_799_999_999;

/// What reading one message's relayed records has made so far, against
/// [`RELAYED_MAX`]: one for all the reports of a message
/// ([`Event::read_relayed_within`]).
#[derive(Debug, Default)]
pub struct RelayBudget {
    spent: usize,
}

impl RelayBudget {
    fn spend(&mut self, bytes: usize) -> Result<(), String> {
        self.spent = self.spent.saturating_add(bytes);
        if self.spent > RELAYED_MAX {
            return Err(format!(
                "relayed events past {} MiB of text",
                RELAYED_MAX >> 20
            ));
        }
        Ok(())
    }
}

fn known_key(key: &str) -> Option<&'static str> {
    KEYS.binary_search(&key).ok().map(|at| KEYS[at])
}

/// What one string of relayed records is read as: made once, then kept
/// for every event that refers to it, and in [`INTERNED`] for the next
/// execution that defines it again.
#[derive(Clone)]
struct Made {
    shared: Arc<str>,
    /// Its length written as a JSON string's body.
    escaped: usize,
    key: Option<&'static str>,
    name: Option<EventName>,
}

impl Made {
    fn of(text: &[u8]) -> Result<Made, String> {
        let text = std::str::from_utf8(text).map_err(|_| "a string that is not UTF-8")?;
        Ok(Made {
            shared: Arc::from(text),
            escaped: escaped_len(text),
            key: known_key(text),
            name: EventName::parse(text),
        })
    }
}

/// Strings longer than this are made anew each time they are defined:
/// the strings that repeat from one execution to the next (keys, event
/// names, the run's and the stage's ids, a tool's name) are short, and
/// hashing a long one costs what making it does.
const INTERNED_LEN: usize = 256;

/// At most this many strings are kept; the set starts again empty when
/// it is full. A sibling defines one or two strings no other does (its
/// execution's id) beside some forty its siblings share, so this holds
/// a few thousand siblings' worth before it starts again.
const INTERNED_MAX: usize = 4096;

/// The strings a thread has read from relayed records, by their text.
///
/// Every execution's records define their strings anew (a report may be
/// read in any message), so a coordinator meets the same forty keys,
/// names and ids once per sibling. Made once per thread instead, each is
/// hashed and compared rather than checked for escapes, searched for
/// among the runtime's keys and names and copied into a new allocation,
/// and the events share one allocation for it (BENCHMARKS.md, "Every
/// core, twentieth round").
///
/// A worker writes a stage's siblings alike, so a string's number in one
/// execution's records is mostly its number in the next's: each number's
/// last string is kept too, and bytes equal to it are found with one
/// comparison rather than a hash and a probe.
#[derive(Default)]
struct Interned {
    by_text: std::collections::HashMap<Box<[u8]>, Made, foldhash::fast::RandomState>,
    by_number: Vec<Option<Made>>,
}

/// Numbers past this are looked up by their text only.
const BY_NUMBER: usize = 1024;

impl Interned {
    /// Makes `text`, string `n` of its records; the same bytes as a string
    /// kept are the same UTF-8. Where it is kept under its number, the
    /// piece's table refers to it there rather than holding a copy (each
    /// copy of an `Arc` is an atomic increment, and a sibling defines
    /// some forty strings).
    fn make(&mut self, n: usize, text: &[u8]) -> Result<Slot, String> {
        if text.len() > INTERNED_LEN {
            return Made::of(text).map(Slot::Own);
        }
        if let Some(Some(made)) = self.by_number.get(n)
            && made.shared.as_bytes() == text
        {
            return Ok(Slot::Number);
        }
        let made = match self.by_text.get(text) {
            Some(made) => made.clone(),
            None => {
                if self.by_text.len() >= INTERNED_MAX {
                    self.by_text.clear();
                }
                let made = Made::of(text)?;
                self.by_text.insert(text.into(), made.clone());
                made
            }
        };
        if n >= BY_NUMBER {
            return Ok(Slot::Own(made));
        }
        if self.by_number.len() <= n {
            self.by_number.resize_with(n + 1, || None);
        }
        self.by_number[n] = Some(made);
        Ok(Slot::Number)
    }
}

/// Where a piece's string `n` is held: under its number in [`Interned`]
/// (which changes only when string `n` is made again, and with it the
/// piece's table), or by the table itself.
enum Slot {
    Number,
    Own(Made),
}

thread_local! {
    static INTERNED: std::cell::RefCell<Interned> = std::cell::RefCell::default();
}

/// The strings of a piece of records, as made so far: each with the text
/// it was made from, since a `RESET` numbers strings anew and a number's
/// new text lies elsewhere.
struct Strings<'i> {
    made: Vec<Option<((usize, usize), Slot)>>,
    interned: &'i mut Interned,
}

impl Strings<'_> {
    fn made(&mut self, scan: &Scan<'_>, n: usize) -> Result<&Made, String> {
        if self.made.len() < scan.strings() {
            // In steps, not one string at a time as they are defined.
            let room = scan.strings().next_power_of_two().max(64);
            self.made.resize_with(room, || None);
        }
        let text = scan.string(n);
        let from = (text.as_ptr() as usize, text.len());
        let slot = &mut self.made[n];
        if slot.as_ref().is_none_or(|(was, _)| *was != from) {
            *slot = Some((from, self.interned.make(n, text)?));
        }
        // `make` keeps a string under its number before it answers
        // `Slot::Number`, and the slot was filled just above: the errors
        // below would be a bug of this reader, and fail the message (as a
        // record it cannot read does) rather than the coordinator.
        match slot {
            Some((_, Slot::Own(made))) => Ok(made),
            Some((_, Slot::Number)) => match self.interned.by_number.get(n) {
                Some(Some(made)) => Ok(made),
                _ => Err(format!("string {n} was not kept under its number")),
            },
            None => Err(format!("string {n} was not made")),
        }
    }

    /// String `n` shared, and its length written (one look-up for both).
    fn shared(&mut self, scan: &Scan<'_>, n: usize) -> Result<(Arc<str>, usize), String> {
        let made = self.made(scan, n)?;
        Ok((Arc::clone(&made.shared), made.escaped))
    }
}

impl Event {
    /// The events a worker relayed ([`Relaying`]), in order: `None` for
    /// one that is no event this troupe knows (as a line read back), and
    /// the reason reading stopped, if it did before the end: what was read
    /// before the damage is kept.
    pub fn read_relayed(bytes: &[u8]) -> (Vec<Option<Event>>, Option<String>) {
        Event::read_relayed_within(bytes, &mut RelayBudget::default())
    }

    /// [`Event::read_relayed`] counting against `budget`, shared by the
    /// reports of one message.
    pub fn read_relayed_within(
        bytes: &[u8],
        budget: &mut RelayBudget,
    ) -> (Vec<Option<Event>>, Option<String>) {
        INTERNED.with_borrow_mut(|interned| read_relayed_with(bytes, budget, interned))
    }
}

fn read_relayed_with(
    bytes: &[u8],
    budget: &mut RelayBudget,
    interned: &mut Interned,
) -> (Vec<Option<Event>>, Option<String>) {
    let mut scan = Scan::new(bytes);
    let mut strings = Strings {
        made: Vec::new(),
        interned,
    };
    let mut events = Vec::new();
    let mut defined = 0;
    loop {
        let read = match scan.record() {
            Ok(None) => return (events, None),
            Ok(Some(Record::Line(line))) => budget
                .spend(line.len() + EVENT_OVERHEAD)
                .map(|()| Event::from_line(line)),
            Ok(Some(Record::Event(head))) => read_event(&mut scan, &mut strings, budget, &head),
            Err(why) => Err(why),
        };
        // What the strings defined meanwhile hold.
        let new = scan.definitions() - std::mem::replace(&mut defined, scan.definitions());
        match read.and_then(|event| budget.spend(new * OVERHEAD).map(|()| event)) {
            Ok(event) => events.push(event),
            Err(why) => return (events, Some(why)),
        }
    }
}

/// An event's fields as read so far: the values it keeps under the
/// runtime's keys until a field it cannot keep so (a key the runtime does
/// not give, a value it would not hold as it was sent, a relayed event's
/// members); from then on all of them as the JSON members they make, in
/// order, each after a comma as in a line.
enum Fields {
    Kept(Vec<(&'static str, FieldValue)>),
    Members(Vec<u8>),
}

impl Fields {
    /// The members' text, the fields kept so far written into it first.
    fn members(&mut self) -> &mut Vec<u8> {
        if let Fields::Kept(kept) = self {
            let mut text = Vec::new();
            for (key, value) in kept.drain(..) {
                write_key(&mut text, key);
                value.write_json(&mut text);
            }
            *self = Fields::Members(text);
        }
        match self {
            Fields::Members(text) => text,
            Fields::Kept(_) => unreachable!("made members just above"),
        }
    }
}

/// One event's fields after its head; `None` for an event name this
/// troupe does not know (its fields read and dropped).
fn read_event(
    scan: &mut Scan<'_>,
    strings: &mut Strings<'_>,
    budget: &mut RelayBudget,
    head: &scan::EventRecord,
) -> Result<Option<Event>, String> {
    // The head's strings, made at once: each is counted as written.
    let name = strings.made(scan, head.name)?.name;
    let mut text = EVENT_OVERHEAD + scan.string(head.name).len();
    let (run, escaped) = strings.shared(scan, head.run)?;
    text += escaped;
    let mut ids = [None, None, None];
    for (id, n) in ids.iter_mut().zip([head.exec, head.stage, head.tool]) {
        if let Some(n) = n {
            let (shared, escaped) = strings.shared(scan, n)?;
            text += escaped;
            *id = Some(shared);
        }
    }
    let [exec, stage, tool] = ids;
    budget.spend(text)?;
    let mut fields = Fields::Kept(Vec::with_capacity(head.fields.min(16)));
    for _ in 0..head.fields {
        let field = scan.field()?;
        let Some(k) = field.key else {
            let scan::Value::Members(members) = field.value else {
                return Err("a field without a key that is no members".to_owned());
            };
            budget.spend(OVERHEAD + members.len())?;
            let members = members_as_read(members)
                .map_err(|why| format!("a relayed event's members: {why}"))?;
            write_members(fields.members(), members.as_bytes());
            continue;
        };
        let key = strings.made(scan, k)?;
        let (known, key_len) = (key.key, key.escaped);
        // A worker writes an event with a field named like a head key as
        // its line (no head key is in `KEYS`).
        if known.is_none() && HEAD_KEYS.contains(&&*key.shared) {
            return Err(format!(
                "a relayed event's field is named like its head key `{}`",
                key.shared
            ));
        }
        let (value, value_len) = match field.value {
            scan::Value::Str(n) => {
                let (shared, escaped) = strings.shared(scan, n)?;
                (Ok(FieldValue::Shared(shared)), escaped)
            }
            scan::Value::Text(s) => (Ok(FieldValue::Text(Arc::from(s))), escaped_len(s)),
            // A keyed value is never members: the scan reads those only
            // without a key.
            scan::Value::Json(s) | scan::Value::Members(s) => (Err(s), s.len()),
            scan::Value::U64(n) => (Ok(FieldValue::Number(n.into())), 20),
            scan::Value::Bool(b) => (Ok(FieldValue::Bool(b)), 5),
            scan::Value::Usage([prompt_tokens, completion_tokens, requests]) => {
                let usage = Usage {
                    prompt_tokens,
                    completion_tokens,
                    requests,
                };
                (Ok(FieldValue::Usage(usage)), 80)
            }
        };
        budget.spend(OVERHEAD + key_len + value_len)?;
        match (&mut fields, known, value) {
            (Fields::Kept(kept), Some(key), Ok(value)) => kept.push((key, value)),
            (_, _, Ok(value)) => {
                let text = fields.members();
                write_key(text, &*strings.made(scan, k)?.shared);
                value.write_json(text);
            }
            (_, _, Err(json)) => {
                let json =
                    value_as_read(json).map_err(|why| format!("a relayed field's value: {why}"))?;
                let text = fields.members();
                write_key(text, &*strings.made(scan, k)?.shared);
                text.extend_from_slice(&json);
            }
        }
    }
    let Some(name) = name else {
        return Ok(None);
    };
    if head.micros > LAST_MICROS {
        return Err("a timestamp past the year 9999".to_owned());
    }
    let ts = UNIX_EPOCH
        .checked_add(Duration::from_micros(head.micros))
        .ok_or("a timestamp past any clock")?;
    let fields = match fields {
        Fields::Kept(kept) => kept,
        // Kept as the JSON members they make under `""`, the first comma
        // left out.
        Fields::Members(text) => {
            let start = usize::from(text.first() == Some(&b','));
            let text = std::str::from_utf8(&text[start..]).map_err(|e| e.to_string())?;
            vec![("", FieldValue::Relayed(text.into()))]
        }
    };
    Ok(Some(Event {
        name,
        ts,
        workflow_run_id: run,
        stage_execution_id: exec,
        stage_id: stage,
        tool,
        fields,
    }))
}

#[cfg(test)]
mod tests;
