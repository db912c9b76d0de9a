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

use serde_json::Value;

use super::encode::HEAD_KEYS;
use super::vocabulary::{Event, EventName, FieldValue};
use crate::auditlog::json::{write_key, write_members};
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

/// The most text a piece of relayed records may make, and about the most
/// memory reading it may take: a string is defined once and referred to
/// in a byte or two, so a few bytes could otherwise make gigabytes of
/// lines. A worker's report of JSON lines was bounded by its message
/// (64 MiB expanded) in the same way.
const RELAYED_MAX: usize = 64 << 20;

/// What each string defined, field or event counts against
/// [`RELAYED_MAX`] beside its text: what reading it holds.
const OVERHEAD: usize = 64;

/// The last microsecond an audit timestamp can say (9999-12-31T23:59:59.999999Z).
const LAST_MICROS: u64 = 253_402_300_799_999_999;

/// What reading a piece of relayed records has made so far, against
/// [`RELAYED_MAX`].
#[derive(Default)]
struct Budget {
    spent: usize,
    /// Strings the scan had defined when last counted.
    defined: usize,
}

impl Budget {
    fn spend(&mut self, bytes: usize) -> Result<(), String> {
        self.spent = self.spent.saturating_add(bytes.saturating_add(OVERHEAD));
        if self.spent > RELAYED_MAX {
            return Err(format!(
                "relayed events past {} MiB of text",
                RELAYED_MAX >> 20
            ));
        }
        Ok(())
    }

    /// Counts the strings defined since the last count.
    fn definitions(&mut self, scan: &Scan<'_>) -> Result<(), String> {
        let now = scan.definitions();
        let new = now - self.defined;
        self.defined = now;
        self.spend(new.saturating_mul(OVERHEAD))
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

    fn shared(&mut self, scan: &Scan<'_>, n: usize) -> Arc<str> {
        let made = self.made(scan, n);
        Arc::clone(made.shared.get_or_insert_with(|| Arc::from(scan.string(n))))
    }

    fn key(&mut self, scan: &Scan<'_>, n: usize) -> Option<&'static str> {
        *self
            .made(scan, n)
            .key
            .get_or_insert_with(|| known_key(scan.string(n)))
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
        let mut scan = Scan::new(bytes);
        let mut strings = Strings::default();
        let mut budget = Budget::default();
        let mut events = Vec::new();
        loop {
            let read = match scan.record() {
                Ok(None) => return (events, None),
                Ok(Some(Record::Line(line))) => {
                    budget.spend(line.len()).map(|()| Event::from_line(line))
                }
                Ok(Some(Record::Event(head))) => {
                    read_event(&mut scan, &mut strings, &mut budget, &head)
                }
                Err(why) => Err(why),
            };
            match read.and_then(|event| budget.definitions(&scan).map(|()| event)) {
                Ok(event) => events.push(event),
                Err(why) => return (events, Some(why)),
            }
        }
    }
}

/// One event's fields after its head; `None` for an event name this
/// troupe does not know (its fields read and dropped).
fn read_event(
    scan: &mut Scan<'_>,
    strings: &mut Strings,
    budget: &mut Budget,
    head: &scan::EventRecord,
) -> Result<Option<Event>, String> {
    let ids = [
        Some(head.name),
        Some(head.run),
        head.exec,
        head.stage,
        head.tool,
    ];
    budget.spend(
        ids.into_iter()
            .flatten()
            .map(|n| scan.string(n).len())
            .sum(),
    )?;
    // Each field with its key's number and the key as the runtime names
    // it; members (no key) as their text.
    let mut read = Vec::with_capacity(head.fields.min(16));
    let mut all_known = true;
    for _ in 0..head.fields {
        let field = scan.field()?;
        budget.spend(text_len(scan, &field))?;
        read.push(match field.key {
            Some(k) => {
                let known = strings.key(scan, k);
                // A worker writes an event with a field named like a head
                // key as its line (no head key is in `KEYS`).
                if known.is_none() && HEAD_KEYS.contains(&scan.string(k)) {
                    return Err(format!(
                        "a relayed event's field is named like its head key `{}`",
                        scan.string(k)
                    ));
                }
                all_known &= known.is_some();
                Ok((k, known, field_value(scan, strings, field.value)?))
            }
            None => {
                all_known = false;
                Err(members(field.value)?)
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
            .filter_map(|field| field.ok().and_then(|(_, key, value)| Some((key?, value))))
            .collect()
    } else {
        // Kept as the JSON members they make, in order, under `""`.
        // Each after a comma, as in a line; the first comma dropped.
        let mut text = Vec::new();
        for field in &read {
            match field {
                Ok((k, _, value)) => {
                    write_key(&mut text, scan.string(*k));
                    value.write_json(&mut text);
                }
                Err(members) => write_members(&mut text, members.as_bytes()),
            }
        }
        let text =
            String::from_utf8(text.split_off(text.len().min(1))).map_err(|e| e.to_string())?;
        vec![("", FieldValue::Relayed(text.into_boxed_str()))]
    };
    Ok(Some(Event {
        name,
        ts,
        workflow_run_id: strings.shared(scan, head.run),
        stage_execution_id: head.exec.map(|n| strings.shared(scan, n)),
        stage_id: head.stage.map(|n| strings.shared(scan, n)),
        tool: head.tool.map(|n| strings.shared(scan, n)),
        fields,
    }))
}

/// A field's value as an event keeps it; JSON text and members are
/// checked here, since they are written out as they stand.
fn field_value(
    scan: &Scan<'_>,
    strings: &mut Strings,
    value: scan::Value<'_>,
) -> Result<FieldValue, String> {
    Ok(match value {
        scan::Value::Str(n) => FieldValue::Shared(strings.shared(scan, n)),
        scan::Value::Text(text) => FieldValue::Text(Arc::from(text)),
        scan::Value::U64(n) => FieldValue::Number(n.into()),
        scan::Value::Bool(b) => FieldValue::Bool(b),
        scan::Value::Usage([prompt_tokens, completion_tokens, requests]) => {
            FieldValue::Usage(Usage {
                prompt_tokens,
                completion_tokens,
                requests,
            })
        }
        scan::Value::Json(text) => match serde_json::from_str::<Value>(text) {
            Ok(Value::Number(n)) => FieldValue::Number(n),
            Ok(value) => FieldValue::Json(Box::new(value)),
            Err(e) => return Err(format!("a field's JSON value cannot be read: {e}")),
        },
        scan::Value::Members(_) => return Err("members under a key".to_owned()),
    })
}

/// The text a field makes in a line (its key and value, about), counted
/// against [`RELAYED_MAX`].
fn text_len(scan: &Scan<'_>, field: &scan::Field<'_>) -> usize {
    let key = field.key.map_or(0, |k| scan.string(k).len());
    key + match field.value {
        scan::Value::Str(n) => scan.string(n).len(),
        scan::Value::Text(text) | scan::Value::Json(text) | scan::Value::Members(text) => {
            text.len()
        }
        scan::Value::U64(_) | scan::Value::Bool(_) => 20,
        scan::Value::Usage(_) => 80,
    }
}

/// A relayed event's members (a field without a key, which a worker
/// writes only for an event it was itself relayed), checked as a line
/// read back would have them: JSON members in full (numbers in range, no
/// lone surrogates), none named like a head key, on one line. They are
/// kept as they stand, which is how the coordinator's log writes them.
fn members(value: scan::Value<'_>) -> Result<&str, String> {
    let scan::Value::Members(text) = value else {
        return Err("a field without a key that is no members".to_owned());
    };
    if text.contains(['\n', '\r']) {
        return Err("a relayed event's members are not on one line".to_owned());
    }
    let object: serde_json::Map<String, Value> = serde_json::from_str(&format!("{{{text}}}"))
        .map_err(|e| format!("a relayed event's members are no JSON members: {e}"))?;
    if let Some(key) = object.keys().find(|k| HEAD_KEYS.contains(&k.as_str())) {
        return Err(format!(
            "a relayed event's members name its head key `{key}`"
        ));
    }
    // Whitespace alone is no members (and would break the line).
    Ok(if object.is_empty() { "" } else { text })
}

#[cfg(test)]
mod tests;
