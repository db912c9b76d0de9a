//! The runtime's event vocabulary: every event name and its class (audit
//! events are never dropped; observer events such as tokens and progress
//! may be), and the event itself with its typed fields. How an event is
//! written as a JSON line is `encode`'s.

use std::sync::Arc;
use std::time::SystemTime;

use serde_json::Value;
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
    /// `troupe chat`'s security mode decided a call (yolo, an allow rule)
    /// or passed it to the interactors (ask).
    ToolCallModeInvoked,
    InteractionRaised,
    InteractionAnswered,
    ProviderRequestStarted,
    ProviderRequestCompleted,
    ProviderRequestFailed,
    /// The provider changed how it works for the rest of the run (e.g. it
    /// stopped streaming to an endpoint whose streams end early).
    ProviderNotice,
    /// A sibling's task was delivered to a worker again (the one before
    /// was lost): it ran again from the start of its attempt.
    SiblingRedelivered,
    /// Observer: streamed model text.
    Token,
    /// Observer: fan-out progress counters.
    Progress,
}

impl EventName {
    /// Every name, in declaration order.
    pub const ALL: [EventName; 33] = [
        EventName::WorkflowStarted,
        EventName::WorkflowResumed,
        EventName::WorkflowExit,
        EventName::SessionTurnStart,
        EventName::SessionTurnEnd,
        EventName::StageEntered,
        EventName::StagePreFired,
        EventName::StagePostFired,
        EventName::StageCheckGateResult,
        EventName::StageAssertOutcome,
        EventName::StageGranted,
        EventName::StageCancelled,
        EventName::StageExited,
        EventName::StageInitFailed,
        EventName::ParallelSiblingFailure,
        EventName::HookInvoked,
        EventName::ToolInvocationProposed,
        EventName::ToolInvocationStarted,
        EventName::ToolInvocationSucceeded,
        EventName::ToolInvocationFailed,
        EventName::ToolInvocationCancelled,
        EventName::ToolCallApproved,
        EventName::ToolCallDenied,
        EventName::ToolCallModeInvoked,
        EventName::InteractionRaised,
        EventName::InteractionAnswered,
        EventName::ProviderRequestStarted,
        EventName::ProviderRequestCompleted,
        EventName::ProviderRequestFailed,
        EventName::ProviderNotice,
        EventName::SiblingRedelivered,
        EventName::Token,
        EventName::Progress,
    ];

    /// The name of an event read back (a worker's events); `None` for a
    /// name this troupe does not emit. A search: a coordinator reads each
    /// name once an execution (`events::relay` keeps it with the string),
    /// and lines only from a worker older than records.
    pub fn parse(name: &str) -> Option<EventName> {
        EventName::ALL.into_iter().find(|n| n.as_str() == name)
    }

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
            EventName::ToolCallModeInvoked => "ToolCallModeInvoked",
            EventName::InteractionRaised => "InteractionRaised",
            EventName::InteractionAnswered => "InteractionAnswered",
            EventName::ProviderRequestStarted => "ProviderRequestStarted",
            EventName::ProviderRequestCompleted => "ProviderRequestCompleted",
            EventName::ProviderRequestFailed => "ProviderRequestFailed",
            EventName::ProviderNotice => "ProviderNotice",
            EventName::SiblingRedelivered => "SiblingRedelivered",
            EventName::Token => "Token",
            EventName::Progress => "Progress",
        }
    }

    pub fn class(self) -> EventClass {
        match self {
            // Phase markers are trace, not record: they are not audit events
            // (ARCHITECTURE.md, Events and audit), and a stage publishes
            // fourteen of them.
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
            | EventName::ToolCallModeInvoked
            | EventName::InteractionRaised
            | EventName::InteractionAnswered
            | EventName::ProviderRequestStarted
            | EventName::ProviderRequestCompleted
            | EventName::ProviderRequestFailed
            | EventName::ProviderNotice
            | EventName::SiblingRedelivered => EventClass::Audit,
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
    pub(super) fields: Vec<(&'static str, FieldValue)>,
}

/// An event field's value. Most of what the runtime records is a name it
/// knows statically (`"ok"`, `"Act"`, `"allowedTools"`), a string it
/// already shares, a count, or a stage's usage: those are kept as they are
/// and written straight to JSON, so building an event allocates no
/// strings or maps for them — a `serde_json::Value` would (BENCHMARKS.md).
/// Numbers and booleans are kept as they are; any other JSON value is
/// boxed: a `Value` inline (80 bytes with ordered maps) made every field
/// of every event that large, and an event's list of fields twice the
/// memory it needs.
#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Static(&'static str),
    Shared(Arc<str>),
    /// Text shared with what the event is about (a tool call's arguments)
    /// but seen once in the log: written as a string like `Shared`, kept
    /// in place in the log's records rather than numbered for reuse, so
    /// that large one-off texts do not fill a batch's table of strings.
    Text(Arc<str>),
    Usage(Usage),
    Number(serde_json::Number),
    Bool(bool),
    Json(Box<Value>),
    /// Tool calls in flight, as `(callId, tool)`: written as the list
    /// `[{"callId": …, "tool": …}]` (`StageCancelled`'s `toolCalls`)
    /// without a map built per call; none allocates nothing.
    Calls(Box<[(Arc<str>, Arc<str>)]>),
    /// The fields of an event relayed from a worker, as the members of
    /// the JSON object they were written in (its text without the
    /// braces), kept under the key `""` and written back verbatim: the
    /// coordinator relays thousands of events a second and never needs
    /// most of their fields as values ([`Event::from_line`]).
    Relayed(Box<str>),
}

impl FieldValue {
    /// The value as JSON (relayed members: the object they make).
    pub fn to_value(&self) -> Value {
        match self {
            FieldValue::Static(s) => Value::from(*s),
            FieldValue::Shared(s) | FieldValue::Text(s) => Value::from(&**s),
            FieldValue::Usage(u) => serde_json::to_value(u).unwrap_or(Value::Null),
            FieldValue::Number(n) => Value::Number(n.clone()),
            FieldValue::Bool(b) => Value::Bool(*b),
            FieldValue::Json(v) => (**v).clone(),
            FieldValue::Calls(calls) => FieldValue::calls_json(calls),
            FieldValue::Relayed(members) => Value::Object(relayed_fields(members)),
        }
    }

    /// Tool calls in flight (see [`FieldValue::Calls`]).
    pub fn calls(calls: &[(Arc<str>, Arc<str>)]) -> FieldValue {
        FieldValue::Calls(calls.into())
    }

    /// Tool calls in flight as the JSON value [`FieldValue::Calls`]
    /// writes (what a cancellation's store record keeps too).
    pub fn calls_json(calls: &[(Arc<str>, Arc<str>)]) -> Value {
        calls
            .iter()
            .map(|(id, tool)| serde_json::json!({"callId": &**id, "tool": &**tool}))
            .collect()
    }
}

/// The fields of a relayed event's members (an empty map for text that is
/// not JSON members, which [`Event::from_line`] never keeps).
pub(super) fn relayed_fields(members: &str) -> serde_json::Map<String, Value> {
    serde_json::from_str(&format!("{{{members}}}")).unwrap_or_default()
}

/// One field of a relayed event's members, as [`relayed_fields`] would
/// give it (the last of a key written twice), with the other members
/// skipped, not built: a coordinator's telemetry asks three or four
/// fields of every relayed event.
pub(super) fn relayed_field(members: &str, key: &str) -> Option<Value> {
    use serde::Deserializer as _;
    use serde::de::{Deserialize, IgnoredAny, MapAccess, Visitor};
    use std::borrow::Cow;

    /// A member's name, borrowed from the text unless it had escapes.
    struct Name<'de>(Cow<'de, str>);
    impl<'de> Deserialize<'de> for Name<'de> {
        fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            struct Text;
            impl<'de> Visitor<'de> for Text {
                type Value = Name<'de>;
                fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                    f.write_str("a member's name")
                }
                fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Name<'de>, E> {
                    Ok(Name(Cow::Borrowed(v)))
                }
                fn visit_str<E>(self, v: &str) -> Result<Name<'de>, E> {
                    Ok(Name(Cow::Owned(v.to_owned())))
                }
            }
            d.deserialize_str(Text)
        }
    }

    struct Find<'k>(&'k str);
    impl<'de> Visitor<'de> for Find<'_> {
        type Value = Option<Value>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a JSON object")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Value>, A::Error> {
            let mut found = None;
            while let Some(Name(name)) = map.next_key()? {
                if name == self.0 {
                    found = Some(map.next_value()?);
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }

    let text = format!("{{{members}}}");
    let mut reader = serde_json::Deserializer::from_str(&text);
    let found = reader.deserialize_map(Find(key)).ok()?;
    reader.end().ok()?;
    found
}

impl From<&str> for FieldValue {
    fn from(s: &str) -> Self {
        FieldValue::Json(Box::new(Value::from(s)))
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
        match v {
            Value::Number(n) => FieldValue::Number(n),
            Value::Bool(b) => FieldValue::Bool(b),
            other => FieldValue::Json(Box::new(other)),
        }
    }
}

macro_rules! number_field_from {
    ($($t:ty),*) => {$(
        impl From<$t> for FieldValue {
            fn from(v: $t) -> Self {
                FieldValue::Number(serde_json::Number::from(v))
            }
        }
    )*};
}
number_field_from!(i32, u32, u64, usize, i64);

impl From<bool> for FieldValue {
    fn from(b: bool) -> Self {
        FieldValue::Bool(b)
    }
}

impl From<String> for FieldValue {
    fn from(s: String) -> Self {
        FieldValue::Json(Box::new(Value::String(s)))
    }
}

impl From<Vec<Value>> for FieldValue {
    fn from(items: Vec<Value>) -> Self {
        FieldValue::Json(Box::new(Value::Array(items)))
    }
}

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

    /// A field's value as JSON: one of its own, or one of the fields it
    /// was relayed with.
    pub fn field(&self, key: &str) -> Option<Value> {
        if let Some(own) = self.field_value(key) {
            return Some(own.to_value());
        }
        match self.field_value("") {
            Some(FieldValue::Relayed(members)) => relayed_field(members, key),
            _ => None,
        }
    }

    /// A field's value as it is kept.
    pub fn field_value(&self, key: &str) -> Option<&FieldValue> {
        self.fields.iter().find(|(k, _)| *k == key).map(|(_, v)| v)
    }

    /// The event's own fields, in order.
    pub fn fields(&self) -> impl Iterator<Item = (&'static str, &FieldValue)> {
        self.fields.iter().map(|(k, v)| (*k, v))
    }
}
