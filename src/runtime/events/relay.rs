//! A worker's events as it relays them to the coordinator: each
//! execution's events in the log's record format ([`Relaying`]), read back
//! into events with their fields as the values they were
//! ([`Event::read_relayed`]).
//!
//! As JSON lines, a sibling's events cost its worker about 42 000
//! instructions to write and the coordinator about 80 000 to read back,
//! more than a local sibling costs in all (callgrind, BENCHMARKS.md
//! "Every core, seventeenth round"). As records, each string an execution
//! names is written and checked once, a number is a varint, and the
//! coordinator builds each event straight from them. The coordinator's
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
    let mut reader = RecordReader::default();
    let (mut at, mut text, mut lines) = (0, Vec::new(), Vec::new());
    while let Ok(Some(n)) = reader.read(&bytes[at..], &mut text) {
        at += n;
        if text.pop().is_some() {
            match String::from_utf8(std::mem::take(&mut text)) {
                Ok(line) => lines.push(line),
                Err(_) => break,
            }
        }
    }
    debug_assert_eq!(at, bytes.len(), "the worker's own records");
    lines
}

/// The field keys the runtime gives the events it relays (sorted, for a
/// binary search): a relayed field's key is read back as one of these.
/// An event with a key not here keeps all its fields as their JSON text
/// ([`FieldValue::Relayed`]), as a line read back does: the same line is
/// written either way.
const KEYS: [&str; 64] = [
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

/// What one string of a piece of records was read as, made once for all
/// the events that refer to it. `from` is the text it was made from: a
/// `RESET` numbers strings anew, and a number's new text lies elsewhere.
#[derive(Default)]
struct Made {
    from: (usize, usize),
    /// Its length written as a JSON string's body.
    escaped: Option<usize>,
    shared: Option<Arc<str>>,
    key: Option<Option<&'static str>>,
    name: Option<Option<EventName>>,
}

/// The strings of a piece of records, as made so far.
#[derive(Default)]
struct Strings(Vec<Made>);

impl Strings {
    fn made<'s>(&'s mut self, scan: &Scan<'_>, n: usize) -> &'s mut Made {
        if self.0.len() < scan.strings() {
            self.0.resize_with(scan.strings(), Made::default);
        }
        let text = scan.string(n);
        let from = (text.as_ptr() as usize, text.len());
        let made = &mut self.0[n];
        if made.from != from {
            *made = Made {
                from,
                ..Made::default()
            };
        }
        made
    }

    /// String `n` shared, and its length written (one look-up for both).
    fn shared(&mut self, scan: &Scan<'_>, n: usize) -> (Arc<str>, usize) {
        let text = scan.string(n);
        let made = self.made(scan, n);
        let escaped = *made.escaped.get_or_insert_with(|| escaped_len(text));
        let shared = Arc::clone(made.shared.get_or_insert_with(|| Arc::from(text)));
        (shared, escaped)
    }

    /// String `n` as one of the runtime's keys, and its length written.
    fn key(&mut self, scan: &Scan<'_>, n: usize) -> (Option<&'static str>, usize) {
        let text = scan.string(n);
        let made = self.made(scan, n);
        let escaped = *made.escaped.get_or_insert_with(|| escaped_len(text));
        (*made.key.get_or_insert_with(|| known_key(text)), escaped)
    }

    fn name(&mut self, scan: &Scan<'_>, n: usize) -> Option<EventName> {
        *self
            .made(scan, n)
            .name
            .get_or_insert_with(|| EventName::parse(scan.string(n)))
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
        let mut scan = Scan::new(bytes);
        let mut strings = Strings::default();
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
}

/// A field as read: a value an event keeps, or JSON text (a value the
/// runtime would not hold as it was sent, or a relayed event's members)
/// that only the event's members as text can keep.
enum Read {
    Value(usize, Option<&'static str>, FieldValue),
    /// A key's number and its value's JSON text.
    Json(usize, Vec<u8>),
    Members(String),
}

/// One event's fields after its head; `None` for an event name this
/// troupe does not know (its fields read and dropped).
fn read_event(
    scan: &mut Scan<'_>,
    strings: &mut Strings,
    budget: &mut RelayBudget,
    head: &scan::EventRecord,
) -> Result<Option<Event>, String> {
    // The head's strings, made at once: each is counted as written.
    let mut text = EVENT_OVERHEAD + scan.string(head.name).len();
    let mut id = |n: usize| {
        let (shared, escaped) = strings.shared(scan, n);
        text += escaped;
        shared
    };
    let run = id(head.run);
    let [exec, stage, tool] = [head.exec, head.stage, head.tool].map(|n| n.map(&mut id));
    budget.spend(text)?;
    let mut read = Vec::with_capacity(head.fields.min(16));
    let mut all_known = true;
    for _ in 0..head.fields {
        let field = scan.field()?;
        let Some(k) = field.key else {
            let scan::Value::Members(members) = field.value else {
                return Err("a field without a key that is no members".to_owned());
            };
            budget.spend(OVERHEAD + members.len())?;
            let members = members_as_read(members)
                .map_err(|why| format!("a relayed event's members: {why}"))?;
            all_known = false;
            read.push(Read::Members(members));
            continue;
        };
        let (known, key_len) = strings.key(scan, k);
        // A worker writes an event with a field named like a head key as
        // its line (no head key is in `KEYS`).
        if known.is_none() && HEAD_KEYS.contains(&scan.string(k)) {
            return Err(format!(
                "a relayed event's field is named like its head key `{}`",
                scan.string(k)
            ));
        }
        let (value, value_len) = match field.value {
            scan::Value::Str(n) => {
                let (shared, escaped) = strings.shared(scan, n);
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
        read.push(match value {
            Ok(value) => {
                all_known &= known.is_some();
                Read::Value(k, known, value)
            }
            Err(json) => {
                all_known = false;
                let text =
                    value_as_read(json).map_err(|why| format!("a relayed field's value: {why}"))?;
                Read::Json(k, text)
            }
        });
    }
    let Some(name) = strings.name(scan, head.name) else {
        return Ok(None);
    };
    if head.micros > LAST_MICROS {
        return Err("a timestamp past the year 9999".to_owned());
    }
    let ts = UNIX_EPOCH
        .checked_add(Duration::from_micros(head.micros))
        .ok_or("a timestamp past any clock")?;
    let fields = if all_known {
        read.into_iter()
            .filter_map(|field| match field {
                Read::Value(_, Some(key), value) => Some((key, value)),
                _ => None,
            })
            .collect()
    } else {
        // Kept as the JSON members they make, in order, under `""`: each
        // after a comma, as in a line, the first comma left out.
        let mut text = Vec::new();
        for field in &read {
            match field {
                Read::Value(k, _, value) => {
                    write_key(&mut text, scan.string(*k));
                    value.write_json(&mut text);
                }
                Read::Json(k, json) => {
                    write_key(&mut text, scan.string(*k));
                    text.extend_from_slice(json);
                }
                Read::Members(members) => write_members(&mut text, members.as_bytes()),
            }
        }
        let start = usize::from(text.first() == Some(&b','));
        let text = std::str::from_utf8(&text[start..]).map_err(|e| e.to_string())?;
        vec![("", FieldValue::Relayed(text.into()))]
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
