//! Runtime events (SPEC §6): audit events that are never dropped and
//! observer events (tokens, progress) that may be. One JSON object per line
//! with `seq`, `ts`, `event`, `workflowRunId`, then `stageExecutionId`,
//! `stageId`, `tool` where they apply, then the event's own fields.

use std::cell::Cell;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value};
use troupe_actors::{BusEvent, EventClass};

use crate::provider::Usage;

/// Every event name the runtime emits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventName {
    WorkflowStarted,
    /// A new session of a run that did not finish: `troupe resume`.
    WorkflowResumed,
    WorkflowExit,
    SessionTurnStart,
    SessionTurnEnd,
    StageEntered,
    StagePreFired,
    StagePostFired,
    StageCheckGateResult,
    StageAssertOutcome,
    StageGranted,
    StageCancelled,
    StageExited,
    StageInitFailed,
    ParallelSiblingFailure,
    /// One hook run: slot, kind, outcome.
    HookInvoked,
    ToolInvocationProposed,
    ToolInvocationStarted,
    ToolInvocationSucceeded,
    ToolInvocationFailed,
    ToolInvocationCancelled,
    ToolCallApproved,
    ToolCallDenied,
    InteractionRaised,
    InteractionAnswered,
    ProviderRequestStarted,
    ProviderRequestCompleted,
    ProviderRequestFailed,
    /// The provider changed how it works for the rest of the run (e.g. it
    /// stopped streaming to an endpoint whose streams end early).
    ProviderNotice,
    /// Observer: streamed model text.
    Token,
    /// Observer: fan-out progress counters.
    Progress,
}

impl EventName {
    pub fn as_str(self) -> &'static str {
        match self {
            EventName::WorkflowStarted => "WorkflowStarted",
            EventName::WorkflowResumed => "WorkflowResumed",
            EventName::WorkflowExit => "WorkflowExit",
            EventName::SessionTurnStart => "SessionTurnStart",
            EventName::SessionTurnEnd => "SessionTurnEnd",
            EventName::StageEntered => "StageEntered",
            EventName::StagePreFired => "StagePreFired",
            EventName::StagePostFired => "StagePostFired",
            EventName::StageCheckGateResult => "StageCheckGateResult",
            EventName::StageAssertOutcome => "StageAssertOutcome",
            EventName::StageGranted => "StageGranted",
            EventName::StageCancelled => "StageCancelled",
            EventName::StageExited => "StageExited",
            EventName::StageInitFailed => "StageInitFailed",
            EventName::ParallelSiblingFailure => "ParallelSiblingFailure",
            EventName::HookInvoked => "HookInvoked",
            EventName::ToolInvocationProposed => "ToolInvocationProposed",
            EventName::ToolInvocationStarted => "ToolInvocationStarted",
            EventName::ToolInvocationSucceeded => "ToolInvocationSucceeded",
            EventName::ToolInvocationFailed => "ToolInvocationFailed",
            EventName::ToolInvocationCancelled => "ToolInvocationCancelled",
            EventName::ToolCallApproved => "ToolCallApproved",
            EventName::ToolCallDenied => "ToolCallDenied",
            EventName::InteractionRaised => "InteractionRaised",
            EventName::InteractionAnswered => "InteractionAnswered",
            EventName::ProviderRequestStarted => "ProviderRequestStarted",
            EventName::ProviderRequestCompleted => "ProviderRequestCompleted",
            EventName::ProviderRequestFailed => "ProviderRequestFailed",
            EventName::ProviderNotice => "ProviderNotice",
            EventName::Token => "Token",
            EventName::Progress => "Progress",
        }
    }

    pub fn class(self) -> EventClass {
        match self {
            // Phase markers are trace, not record: SPEC §6 does not list them
            // among the audit events, and a stage publishes fourteen of them.
            // They reach `--events` and in-process observers, never the log.
            EventName::Token
            | EventName::Progress
            | EventName::StagePreFired
            | EventName::StagePostFired => EventClass::Observer,
            EventName::WorkflowStarted
            | EventName::WorkflowResumed
            | EventName::WorkflowExit
            | EventName::SessionTurnStart
            | EventName::SessionTurnEnd
            | EventName::StageEntered
            | EventName::StageCheckGateResult
            | EventName::StageAssertOutcome
            | EventName::StageGranted
            | EventName::StageCancelled
            | EventName::StageExited
            | EventName::StageInitFailed
            | EventName::ParallelSiblingFailure
            | EventName::HookInvoked
            | EventName::ToolInvocationProposed
            | EventName::ToolInvocationStarted
            | EventName::ToolInvocationSucceeded
            | EventName::ToolInvocationFailed
            | EventName::ToolInvocationCancelled
            | EventName::ToolCallApproved
            | EventName::ToolCallDenied
            | EventName::InteractionRaised
            | EventName::InteractionAnswered
            | EventName::ProviderRequestStarted
            | EventName::ProviderRequestCompleted
            | EventName::ProviderRequestFailed
            | EventName::ProviderNotice => EventClass::Audit,
        }
    }
}

/// One event. The bus assigns `seq`; `ts` is taken at creation.
///
/// Ids are shared (`Arc<str>`): a stage execution publishes a dozen events
/// and a fan-out tens of thousands of executions, so cloning the run,
/// stage and execution ids into every event was a measurable part of the
/// per-sibling cost (BENCHMARKS.md). Field names are static.
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub name: EventName,
    pub ts: SystemTime,
    pub workflow_run_id: Arc<str>,
    pub stage_execution_id: Option<Arc<str>>,
    pub stage_id: Option<Arc<str>>,
    pub tool: Option<Arc<str>>,
    /// The event's own fields, in insertion order; a key set twice keeps
    /// its first position and its last value.
    fields: Vec<(&'static str, FieldValue)>,
}

/// An event field's value. Most of what the runtime records is a name it
/// knows statically (`"ok"`, `"Act"`, `"allowedTools"`), a string it
/// already shares, a count, or a stage's usage: those are kept as they are
/// and written straight to JSON, so building an event allocates no
/// strings or maps for them — a `serde_json::Value` would (BENCHMARKS.md).
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Static(&'static str),
    Shared(Arc<str>),
    Usage(Usage),
    Json(Value),
}

impl FieldValue {
    /// The value as JSON.
    pub fn to_value(&self) -> Value {
        match self {
            FieldValue::Static(s) => Value::from(*s),
            FieldValue::Shared(s) => Value::from(&**s),
            FieldValue::Usage(u) => serde_json::to_value(u).unwrap_or(Value::Null),
            FieldValue::Json(v) => v.clone(),
        }
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        match self {
            FieldValue::Static(s) => write_json_str(out, s),
            FieldValue::Shared(s) => write_json_str(out, s),
            // Writing a plain struct into a Vec cannot fail.
            FieldValue::Usage(u) => {
                let _ = serde_json::to_writer(&mut *out, u);
            }
            FieldValue::Json(v) => write_json_value(out, v),
        }
    }
}

impl From<&str> for FieldValue {
    fn from(s: &str) -> Self {
        FieldValue::Json(Value::from(s))
    }
}

impl From<Arc<str>> for FieldValue {
    fn from(s: Arc<str>) -> Self {
        FieldValue::Shared(s)
    }
}

impl From<Usage> for FieldValue {
    fn from(u: Usage) -> Self {
        FieldValue::Usage(u)
    }
}

impl From<Value> for FieldValue {
    fn from(v: Value) -> Self {
        FieldValue::Json(v)
    }
}

macro_rules! json_field_from {
    ($($t:ty),*) => {$(
        impl From<$t> for FieldValue {
            fn from(v: $t) -> Self {
                FieldValue::Json(Value::from(v))
            }
        }
    )*};
}
json_field_from!(String, bool, i32, u32, u64, usize, i64, Vec<Value>);

impl BusEvent for Event {
    fn class(&self) -> EventClass {
        self.name.class()
    }
}

impl Event {
    pub fn new(name: EventName, workflow_run_id: impl Into<Arc<str>>) -> Event {
        Event {
            name,
            ts: SystemTime::now(),
            workflow_run_id: workflow_run_id.into(),
            stage_execution_id: None,
            stage_id: None,
            tool: None,
            // Room for the most any audit event has (StageCancelled has
            // six): no event grows its list twice.
            fields: Vec::with_capacity(6),
        }
    }

    #[inline(always)]
    pub fn stage(
        mut self,
        stage_id: impl Into<Arc<str>>,
        stage_execution_id: impl Into<Arc<str>>,
    ) -> Event {
        self.stage_id = Some(stage_id.into());
        self.stage_execution_id = Some(stage_execution_id.into());
        self
    }

    #[inline(always)]
    pub fn tool(mut self, tool: impl Into<Arc<str>>) -> Event {
        self.tool = Some(tool.into());
        self
    }

    /// Adds a field (a key set twice keeps its first position and its last
    /// value). Always inlined, with the work in [`Event::set`]: a
    /// by-value builder call that is not inlined moves the whole event
    /// in and out of every call, and those copies were half of building
    /// a `StageCancelled` in the cancel profile (BENCHMARKS.md).
    #[inline(always)]
    pub fn with(mut self, key: &'static str, value: impl Into<FieldValue>) -> Event {
        self.set(key, value.into());
        self
    }

    /// [`Event::with`] for a name known when the program is built: kept
    /// as the `&'static str` it is, where `with` would copy it into a
    /// fresh `String`.
    #[inline(always)]
    pub fn with_static(mut self, key: &'static str, value: &'static str) -> Event {
        self.set(key, FieldValue::Static(value));
        self
    }

    /// [`Event::with`] in place.
    pub fn set(&mut self, key: &'static str, value: FieldValue) {
        match self.fields.iter_mut().find(|(k, _)| *k == key) {
            Some((_, slot)) => *slot = value,
            None => self.fields.push((key, value)),
        }
    }

    /// A field's value as JSON.
    pub fn field(&self, key: &str) -> Option<Value> {
        self.field_value(key).map(FieldValue::to_value)
    }

    /// A field's value as it is kept.
    pub fn field_value(&self, key: &str) -> Option<&FieldValue> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The event's own fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &FieldValue)> {
        self.fields.iter().map(|(k, v)| (*k, v))
    }

    /// The JSON object of one audit line, keys in contract order.
    pub fn to_json(&self, seq: u64) -> Value {
        let mut obj = Map::with_capacity(self.fields.len() + 7);
        obj.insert("seq".into(), Value::from(seq));
        obj.insert("ts".into(), Value::String(rfc3339(self.ts)));
        obj.insert("event".into(), Value::String(self.name.as_str().to_owned()));
        obj.insert("workflowRunId".into(), Value::from(&*self.workflow_run_id));
        if let Some(v) = &self.stage_execution_id {
            obj.insert("stageExecutionId".into(), Value::from(&**v));
        }
        if let Some(v) = &self.stage_id {
            obj.insert("stageId".into(), Value::from(&**v));
        }
        if let Some(v) = &self.tool {
            obj.insert("tool".into(), Value::from(&**v));
        }
        for (k, v) in &self.fields {
            obj.insert((*k).to_owned(), v.to_value());
        }
        Value::Object(obj)
    }
}

/// The keys `to_json` puts first, in order.
const HEAD_KEYS: [&str; 7] = [
    "seq",
    "ts",
    "event",
    "workflowRunId",
    "stageExecutionId",
    "stageId",
    "tool",
];

impl Event {
    /// Appends the same JSON object as `to_json(seq)` (no newline), byte
    /// for byte, without building it first: no cloned strings, no map,
    /// and strings that need no escaping (ids, names, timestamps: nearly
    /// all of them) are copied whole. The audit writer calls this for
    /// every line of a run (BENCHMARKS.md).
    pub fn write_json(&self, seq: u64, out: &mut Vec<u8>) {
        if self.fields.iter().any(|(k, _)| HEAD_KEYS.contains(k)) {
            return self.write_json_with_clashes(seq, out);
        }
        // The usual line: the head keys, the event's name and the
        // timestamp are known not to need escaping, so they are copied
        // whole; the audit thread wrote 15 checked strings per line.
        let mut ts_buf = [0u8; RFC3339_LEN];
        out.extend_from_slice(b"{\"seq\":");
        write_u64(out, seq);
        out.extend_from_slice(b",\"ts\":\"");
        out.extend_from_slice(rfc3339_into(self.ts, &mut ts_buf).as_bytes());
        out.extend_from_slice(b"\",\"event\":\"");
        out.extend_from_slice(self.name.as_str().as_bytes());
        out.extend_from_slice(b"\",\"workflowRunId\":");
        write_json_str(out, &self.workflow_run_id);
        if let Some(v) = &self.stage_execution_id {
            out.extend_from_slice(b",\"stageExecutionId\":");
            write_json_str(out, v);
        }
        if let Some(v) = &self.stage_id {
            out.extend_from_slice(b",\"stageId\":");
            write_json_str(out, v);
        }
        if let Some(v) = &self.tool {
            out.extend_from_slice(b",\"tool\":");
            write_json_str(out, v);
        }
        for (k, v) in &self.fields {
            out.push(b',');
            write_json_str(out, k);
            out.push(b':');
            v.write_json(out);
        }
        out.push(b'}');
    }

    /// [`Event::write_json`] for an event with a field named like a head
    /// key: it takes the head key's place when that key is written, and
    /// its own place in field order when it is not.
    fn write_json_with_clashes(&self, seq: u64, out: &mut Vec<u8>) {
        let mut ts_buf = [0u8; RFC3339_LEN];
        let ts = rfc3339_into(self.ts, &mut ts_buf);
        let heads: [Option<Head<'_>>; 7] = [
            Some(Head::Number(seq)),
            Some(Head::Text(ts)),
            Some(Head::Text(self.name.as_str())),
            Some(Head::Text(&self.workflow_run_id)),
            self.stage_execution_id.as_deref().map(Head::Text),
            self.stage_id.as_deref().map(Head::Text),
            self.tool.as_deref().map(Head::Text),
        ];
        out.push(b'{');
        let mut first = true;
        let mut key = |out: &mut Vec<u8>, k: &str| {
            if !std::mem::take(&mut first) {
                out.push(b',');
            }
            write_json_str(out, k);
            out.push(b':');
        };
        for (k, head) in HEAD_KEYS.iter().zip(&heads) {
            let Some(head) = head else { continue };
            key(out, k);
            // A field named like a head key replaces that key's value in
            // place (as the map insert in `to_json` does).
            match (self.field_value(k), head) {
                (Some(v), _) => v.write_json(out),
                (None, Head::Number(n)) => write_u64(out, *n),
                (None, Head::Text(t)) => write_json_str(out, t),
            }
        }
        for (k, v) in &self.fields {
            let written = HEAD_KEYS
                .iter()
                .zip(&heads)
                .any(|(h, head)| head.is_some() && h == k);
            if !written {
                key(out, k);
                v.write_json(out);
            }
        }
        out.push(b'}');
    }
}

/// The value of a head key.
enum Head<'a> {
    Number(u64),
    Text(&'a str),
}

/// `value` as compact JSON, as `serde_json::to_writer` writes it.
fn write_json_value(out: &mut Vec<u8>, value: &Value) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => match n.as_u64() {
            Some(n) => write_u64(out, n),
            // Negative and float numbers: serde_json's own formatting.
            None => out.extend_from_slice(n.to_string().as_bytes()),
        },
        Value::String(s) => write_json_str(out, s),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_value(out, item);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            out.push(b'{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_json_str(out, k);
                out.push(b':');
                write_json_value(out, v);
            }
            out.push(b'}');
        }
    }
}

/// A JSON string: copied whole when nothing in it needs escaping, else
/// escaped by serde_json (which escapes `"`, `\\` and bytes below 0x20).
fn write_json_str(out: &mut Vec<u8>, s: &str) {
    if needs_escape(s.as_bytes()) {
        // Writing into a Vec cannot fail, and a &str always serializes.
        let _ = serde_json::to_writer(&mut *out, s);
    } else {
        out.reserve(s.len() + 2);
        out.push(b'"');
        out.extend_from_slice(s.as_bytes());
        out.push(b'"');
    }
}

/// Whether any byte is `"`, `\\` or below 0x20, eight bytes at a time
/// (the classic has-zero-byte / has-less-than word tricks, exact as a
/// yes/no answer).
fn needs_escape(bytes: &[u8]) -> bool {
    const ONES: u64 = u64::from_ne_bytes([0x01; 8]);
    const HIGH: u64 = u64::from_ne_bytes([0x80; 8]);
    let has_zero = |v: u64| v.wrapping_sub(ONES) & !v & HIGH != 0;
    let word_needs = |v: u64| {
        v.wrapping_sub(ONES * 0x20) & !v & HIGH != 0
            || has_zero(v ^ (ONES * u64::from(b'"')))
            || has_zero(v ^ (ONES * u64::from(b'\\')))
    };
    let mut words = bytes.chunks_exact(8);
    for word in &mut words {
        let mut w = [0u8; 8];
        w.copy_from_slice(word);
        if word_needs(u64::from_ne_bytes(w)) {
            return true;
        }
    }
    // The tail as one word padded with spaces, which need no escaping.
    let rest = words.remainder();
    let mut w = [b' '; 8];
    w[..rest.len()].copy_from_slice(rest);
    !rest.is_empty() && word_needs(u64::from_ne_bytes(w))
}

/// Decimal digits of `n`, without `fmt`.
fn write_u64(out: &mut Vec<u8>, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&buf[i..]);
}

/// RFC 3339 UTC with microseconds, e.g. `2026-11-22T03:05:31.123456Z`.
pub fn rfc3339(ts: SystemTime) -> String {
    let mut buf = [0u8; RFC3339_LEN];
    rfc3339_into(ts, &mut buf).to_owned()
}

/// The length of every [`rfc3339`] timestamp (years 0–9999).
const RFC3339_LEN: usize = 27;

/// Writes the [`rfc3339`] text into `buf` without allocating or going
/// through `fmt` (the audit writer formats one per line).
fn rfc3339_into(ts: SystemTime, buf: &mut [u8; RFC3339_LEN]) -> &str {
    fn digits(out: &mut [u8], mut n: u64) {
        for b in out.iter_mut().rev() {
            *b = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    thread_local! {
        /// The date and time of day of the last second formatted on this
        /// thread: an audit writer formats thousands of lines a second,
        /// and the calendar arithmetic was most of a timestamp's cost.
        static LAST_SECOND: Cell<Option<(u64, [u8; 19])>> = const { Cell::new(None) };
    }
    let d = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs();
    let head = LAST_SECOND.with(|last| match last.get() {
        Some((s, head)) if s == secs => head,
        _ => {
            let days = i64::try_from(secs / 86_400).unwrap_or(0);
            let rem = secs % 86_400;
            let (y, m, day) = civil_from_days(days);
            let mut head = *b"0000-00-00T00:00:00";
            digits(&mut head[0..4], y.clamp(0, 9999) as u64);
            digits(&mut head[5..7], u64::from(m));
            digits(&mut head[8..10], u64::from(day));
            digits(&mut head[11..13], rem / 3600);
            digits(&mut head[14..16], (rem % 3600) / 60);
            digits(&mut head[17..19], rem % 60);
            last.set(Some((secs, head)));
            head
        }
    });
    *buf = *b"0000-00-00T00:00:00.000000Z";
    buf[..19].copy_from_slice(&head);
    digits(&mut buf[20..26], u64::from(d.subsec_micros()));
    // Only ASCII digits and separators were written.
    std::str::from_utf8(buf).unwrap_or("1970-01-01T00:00:00.000000Z")
}

/// Reads back an [`rfc3339`] timestamp (the audit log's `ts`); `None` for
/// any other shape.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    if b.len() != RFC3339_LEN || &text[RFC3339_LEN - 1..] != "Z" {
        return None;
    }
    let num = |range: std::ops::Range<usize>| -> Option<u64> {
        let part = text.get(range)?;
        part.bytes()
            .all(|c| c.is_ascii_digit())
            .then(|| part.parse().ok())?
    };
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ];
    if separators.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, min, s, micros) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..26)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y as i64, m as u32, d as u32)).ok()?;
    let secs = days * 86_400 + h * 3600 + min * 60 + s;
    Some(
        UNIX_EPOCH
            + std::time::Duration::from_secs(secs)
            + std::time::Duration::from_micros(micros),
    )
}

/// (year, month, day) to days since 1970-01-01: the inverse of
/// [`civil_from_days`] (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_318_731_123_456);
        assert_eq!(rfc3339(t), "2026-11-22T03:38:51.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn rfc3339_formats_each_instant_whatever_this_thread_formatted_before() {
        // The seconds part is cached per thread: the same second, the
        // next one, a day boundary and a step back must each be right.
        let at = |micros: u64| rfc3339(UNIX_EPOCH + Duration::from_micros(micros));
        let midnight = 1_795_392_000_000_000; // 2026-11-23T00:00:00
        let cases = [
            (midnight - 1_000_001, "2026-11-22T23:59:58.999999Z"),
            (midnight - 1, "2026-11-22T23:59:59.999999Z"),
            (midnight - 999_999, "2026-11-22T23:59:59.000001Z"),
            (midnight, "2026-11-23T00:00:00.000000Z"),
            (midnight + 5, "2026-11-23T00:00:00.000005Z"),
            (midnight - 1, "2026-11-22T23:59:59.999999Z"),
            (0, "1970-01-01T00:00:00.000000Z"),
        ];
        for (micros, want) in cases {
            assert_eq!(at(micros), want, "{micros}");
        }
    }

    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        for micros in [
            0,
            951_782_400_000_001,
            1_795_318_731_123_456,
            4_102_444_799_999_999,
        ] {
            let t = UNIX_EPOCH + Duration::from_micros(micros);
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t), "{}", rfc3339(t));
        }
        for bad in [
            "",
            "2026-11-22T03:38:51Z",
            "2026-13-22T03:38:51.123456Z",
            "2026-11-22 03:38:51.123456Z",
            "2026-11-22T03:38:51.12345xZ",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    #[test]
    fn needs_escape_finds_every_byte_that_needs_it_at_every_offset() {
        for len in 0..20 {
            let clean = "a".repeat(len);
            assert!(!needs_escape(clean.as_bytes()), "{len}");
            assert!(!needs_escape("é ~\u{7f}ü !#[]{}".as_bytes()));
            for at in 0..len {
                for bad in (0u8..0x20).chain([b'"', b'\\']) {
                    let mut bytes = clean.clone().into_bytes();
                    bytes[at] = bad;
                    assert!(needs_escape(&bytes), "byte {bad:#x} at {at} of {len}");
                }
                // Next to the bad bytes, but fine.
                for fine in [0x20u8, 0x21, 0x23, 0x5b, 0x5d, 0x7f, 0x80, 0xff] {
                    let mut bytes = clean.clone().into_bytes();
                    bytes[at] = fine;
                    assert!(!needs_escape(&bytes), "byte {fine:#x} at {at} of {len}");
                }
            }
        }
    }

    #[test]
    fn write_json_matches_to_json_byte_for_byte() {
        let plain = Event::new(EventName::WorkflowStarted, "run").with("pipeline", "p");
        let full = Event::new(EventName::ToolInvocationStarted, "run")
            .stage("worker", "run/worker#1/1")
            .tool("Echo")
            .with("callId", "c\"1")
            .with(
                "arguments",
                serde_json::json!({"text": "item 1", "n": [1, 2.5, null]}),
            );
        // Fields named like head keys: in place when the head key is
        // written, in field order when it is not.
        let clash = Event::new(EventName::StageExited, "run")
            .with("tool", "from-field")
            .with("seq", 99)
            .with("verdict", "ok");
        // Everything that must be escaped, in keys, values and ids, and
        // numbers serde_json formats itself.
        let awkward = Event::new(EventName::ToolInvocationFailed, "r\"un\\")
            .stage("st\u{1}age", "exé/\n/1")
            .tool("To\tol")
            .with("message", "line 1\nline \"2\"\r\u{7f}\u{1f} — ünïcødé, and a long tail past sixteen bytes \\")
            .with(
                "nested",
                serde_json::json!({"k\"ey": ["\u{0}", -3, 1.5e300, 0.1, u64::MAX, i64::MIN, true, {}], "": []}),
            );
        // Values kept without a JSON value: static names, shared strings
        // (escaped like any other), usage counts.
        let typed = Event::new(EventName::StageExited, "run")
            .with_static("verdict", "ok")
            .with("reason", Arc::<str>::from("sibling \"w#1\"\n failed"))
            .with(
                "usage",
                Usage {
                    prompt_tokens: 12,
                    completion_tokens: 3,
                    requests: 2,
                },
            );
        assert_eq!(typed.field("verdict"), Some(serde_json::json!("ok")));
        assert_eq!(
            typed.field("usage"),
            Some(serde_json::json!({"promptTokens": 12, "completionTokens": 3, "requests": 2}))
        );
        for (i, e) in [plain, full, clash, awkward, typed].iter().enumerate() {
            let mut fast = Vec::new();
            e.write_json(i as u64 + 1, &mut fast);
            let slow = serde_json::to_vec(&e.to_json(i as u64 + 1)).unwrap();
            assert_eq!(
                String::from_utf8(fast).unwrap(),
                String::from_utf8(slow).unwrap()
            );
        }
    }

    #[test]
    fn json_keys_in_contract_order() {
        let e = Event::new(EventName::ToolInvocationStarted, "run")
            .stage("worker", "run/worker#1/1")
            .tool("Echo")
            .with("callId", "c1");
        let v = e.to_json(7);
        let keys: Vec<&String> = v.as_object().unwrap().keys().collect();
        assert_eq!(
            keys,
            [
                "seq",
                "ts",
                "event",
                "workflowRunId",
                "stageExecutionId",
                "stageId",
                "tool",
                "callId"
            ]
        );
    }
}
