//! What travels over NATS between a run's coordinator and the workers: the
//! stream, consumer and bucket names, the subjects, a sibling's task, and
//! the reports a worker (or the coordinator itself) sends back. Every
//! message is JSON. No message carries a provider's key or any other
//! secret: a task names the pipeline (and its digest) and the sibling's
//! ctx, nothing about how the worker reaches its model.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use crate::auditlog::json::RAW_VALUE;
use crate::runtime::events::Event;
use crate::runtime::result::{Kept, Usage};

mod write;

/// The work queue of sibling tasks (work-queue retention).
pub const TASKS_STREAM: &str = "TROUPE_TASKS";
/// The durable pull consumer every worker shares.
pub const WORKERS_CONSUMER: &str = "troupe-workers";
/// Reports from workers to coordinators (kept until acknowledged by the
/// run's coordinator, so a restarted coordinator finds them).
pub const REPORTS_STREAM: &str = "TROUPE_REPORTS";
/// Key-value bucket of cancelled groups, read by a worker before it starts
/// a task it was delivered.
pub const CANCELLED_BUCKET: &str = "TROUPE_CANCELLED";
/// The key-value bucket of group contexts ([`GroupContext`]): one key
/// per group, and for a context too big for one message its compressed
/// parts under keys of their own (see `stored_context`).
pub const GROUPS_BUCKET: &str = "TROUPE_GROUPS";

/// `troupe.task.<run>.<turn>`: a group's tasks (purged by this subject
/// when the group is cancelled).
pub fn task_subject(run_id: &str, turn: u64) -> String {
    format!("troupe.task.{run_id}.{turn}")
}

/// Every task of a run.
pub fn run_tasks_subject(run_id: &str) -> String {
    format!("troupe.task.{run_id}.>")
}

/// `troupe.report.<run>`: one subject per run, so a run's reports are
/// totally ordered.
pub fn report_subject(run_id: &str) -> String {
    format!("troupe.report.{run_id}")
}

/// The run's coordinator's durable consumer of its reports.
pub fn coordinator_consumer(run_id: &str) -> String {
    format!("coord-{run_id}")
}

/// `troupe.cancel.<run>` (core NATS, not stored): cancel a group's
/// siblings in flight.
pub fn cancel_subject(run_id: &str) -> String {
    format!("troupe.cancel.{run_id}")
}

/// Every run's cancel subject, for workers.
pub const CANCEL_ALL: &str = "troupe.cancel.>";

/// The cancelled-group key of `CANCELLED_BUCKET`.
pub fn cancelled_key(run_id: &str, turn: u64) -> String {
    group_key(run_id, turn)
}

/// `<run>.<turn>.requeued.<sequence>.<delivered>`: in [`GROUPS_BUCKET`],
/// the execution ids a worker put back on the queue from the message at
/// `sequence` of the task stream, at its `delivered`-th delivery (see
/// `intake::requeue`).
pub fn requeued_key(run_id: &str, turn: u64, sequence: u64, delivered: u64) -> String {
    format!("{run_id}.{turn}.requeued.{sequence}.{delivered}")
}

/// `<run>.<turn>`: a group's key in [`GROUPS_BUCKET`].
pub fn group_key(run_id: &str, turn: u64) -> String {
    format!("{run_id}.{turn}")
}

/// One sibling to run on a worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Task {
    pub run_id: String,
    /// The session turn of the sibling's group.
    pub turn: u64,
    pub unit: usize,
    pub stage_execution_id: String,
    pub stage_id: String,
    pub index: Option<usize>,
    pub visit: u32,
    pub item: Option<Value>,
    /// The pipeline the task belongs to, and a digest of its files: a
    /// worker whose copy differs refuses the task.
    pub pipeline_id: String,
    pub digest: String,
    /// The coordinator reads report batches compressed with zstd
    /// ([`outbox`](super::outbox)). Absent (`false`) from a coordinator
    /// that does not, which then gets them as plain JSON.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub zstd_reports: bool,
    /// The coordinator reads a sibling's events as the log's binary
    /// records, each report framed with its own ([`outbox`](super::outbox)).
    /// Absent (`false`) from a coordinator that does not, which then gets
    /// them as JSON lines inside the report.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub relay_records: bool,
}

/// Most tasks the coordinator puts in one message of the task queue.
///
/// A task costs the server four messages whatever it carries: the
/// publish, its ack, the delivery and the worker's ack. Siblings the
/// scheduler spawns together (a fan-out's start, the successors of a
/// batch of reports) therefore travel together, one message per group
/// and up to this many tasks, and a worker fetches its free slots over
/// this many tasks a message, so that eight workers still share a wide
/// start evenly. A message is leased, renewed and acknowledged as one:
/// the worker acknowledges it once every task in it is reported.
pub const TASKS_PER_MESSAGE: usize = 16;

/// The tasks of one message of the task queue: a JSON array, or a lone
/// object (one task travels as it always has, so an older worker still
/// reads it). An empty array is no message troupe writes.
pub fn decode_tasks(payload: &[u8]) -> Result<Vec<Task>, serde_json::Error> {
    let first = payload.iter().find(|b| !b.is_ascii_whitespace());
    if first == Some(&b'[') {
        let tasks: Vec<Task> = serde_json::from_slice(payload)?;
        if tasks.is_empty() {
            return Err(serde::de::Error::custom("a message of no tasks"));
        }
        Ok(tasks)
    } else {
        serde_json::from_slice(payload).map(|task| vec![task])
    }
}

/// A message of tasks' `Nats-Msg-Id`: the first task's execution id, with
/// the count when there are several, `@` who publishes it (`at`: the
/// coordinator's session, or the put-back a worker makes). JetStream
/// stores a message retried under the same id once.
pub fn message_id(tasks: &[Task], at: &str) -> String {
    let first = tasks.first().map_or("", |t| t.stage_execution_id.as_str());
    match tasks.len() {
        1 => format!("{first}@{at}"),
        n => format!("{first}+{n}@{at}"),
    }
}

/// The message of tasks already serialized one by one (each a JSON
/// object): the one as it is, several as an array.
pub fn encode_tasks(tasks: &[Vec<u8>]) -> Vec<u8> {
    if let [one] = tasks {
        return one.clone();
    }
    let len = tasks.iter().map(|t| t.len() + 1).sum::<usize>() + 1;
    let mut body = Vec::with_capacity(len);
    body.push(b'[');
    for (i, task) in tasks.iter().enumerate() {
        if i > 0 {
            body.push(b',');
        }
        body.extend_from_slice(task);
    }
    body.push(b']');
    body
}

/// What every sibling of a group shares, put once in [`GROUPS_BUCKET`]
/// before the group's first task: a fan-out over a long list would
/// otherwise carry the list (in the planning stage's result) in every
/// task, and workers would spend their time decoding it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupContext {
    /// The run's ctx fields.
    pub fields: Arc<Map<String, Value>>,
    /// The state slot as the group saw it when it started.
    pub slot: Arc<BTreeMap<String, Kept>>,
}

/// What a worker (or the coordinator) reports on a run's report subject:
/// a worker's message is a batch of them (framed with their events'
/// records, or a JSON array; see [`outbox`](super::outbox)), the
/// coordinator's barrier a single one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
// Adjacently tagged, the tag first: a reader decodes the body straight
// into its variant. (Internally tagged, serde buffers the whole report -
// an exited sibling's events and result - and decodes it twice; that was
// the coordinator's largest cost per sibling.)
#[serde(tag = "kind", content = "body", rename_all = "camelCase")]
pub enum Report {
    /// A worker took the task and is about to start it.
    #[serde(rename_all = "camelCase")]
    Accepted {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
    },
    /// The sibling ran to Exit; `events` are its audit events in order
    /// (the last its `StageExited`).
    #[serde(rename_all = "camelCase")]
    Exited {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        /// How many times the work queue delivered the task (above 1:
        /// a worker was lost and the sibling ran again from its start).
        delivered: u64,
        /// Written as a StageResult; read back packed, as the
        /// coordinator keeps it ([`Kept::read_packed`]).
        #[serde(deserialize_with = "Kept::read_packed")]
        result: Kept,
        /// Empty when the events travel as records beside the report;
        /// always written, since a coordinator older than records needs it.
        #[serde(default)]
        events: Vec<EventLine>,
    },
    /// The sibling was strictly cancelled (its `StageCancelled` is the
    /// last of `events`).
    #[serde(rename_all = "camelCase")]
    Cancelled {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        usage: Usage,
        #[serde(default)]
        events: Vec<EventLine>,
    },
    /// Delivered after its group was cancelled: never started.
    #[serde(rename_all = "camelCase")]
    NotStarted {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
    },
    /// The worker cannot run the task (another copy of the pipeline, an
    /// unknown pipeline, a group context it cannot read): `code` is
    /// `Distributed/PipelineMismatch` or `Distributed/GroupContextMissing`.
    #[serde(rename_all = "camelCase")]
    Refused {
        stage_execution_id: String,
        turn: u64,
        unit: usize,
        worker: String,
        code: String,
        message: String,
    },
    /// Published by the coordinator after it marked a group cancelled:
    /// every worker that started a sibling of the group before the mark
    /// had reported `Accepted` before this.
    #[serde(rename_all = "camelCase")]
    Barrier { turn: u64 },
}

impl Report {
    /// About how long the report's JSON is: its event lines, and room for
    /// the rest (a buffer made at this size is grown at most once or
    /// twice, where one grown from empty was copied as it doubled).
    pub fn size_hint(&self) -> usize {
        let lines = match self {
            Report::Exited { events, .. } | Report::Cancelled { events, .. } => events
                .iter()
                .map(|e| match e {
                    EventLine::Line(line) => line.as_str().len() + 1,
                    EventLine::Read(_) => 256,
                })
                .sum(),
            _ => 0,
        };
        lines + 512
    }

    /// The report's kind, as the task log (`--task-log`) names it.
    pub fn kind(&self) -> &'static str {
        match self {
            Report::Accepted { .. } => "accepted",
            Report::Exited { .. } => "exited",
            Report::Cancelled { .. } => "cancelled",
            Report::NotStarted { .. } => "notStarted",
            Report::Refused { .. } => "refused",
            Report::Barrier { .. } => "barrier",
        }
    }

    /// The execution a report is about (`None` for a barrier).
    pub fn execution(&self) -> Option<(&str, u64, usize)> {
        match self {
            Report::Accepted {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Exited {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Cancelled {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::NotStarted {
                stage_execution_id,
                turn,
                unit,
                ..
            }
            | Report::Refused {
                stage_execution_id,
                turn,
                unit,
                ..
            } => Some((stage_execution_id, *turn, *unit)),
            Report::Barrier { .. } => None,
        }
    }
}

/// One audit event of a worker's execution. To a coordinator that reads
/// relayed records (`Task::relay_records`), events travel beside their
/// report as records and are read into `Read` ([`outbox`](super::outbox)).
/// Otherwise each travels as its JSON line (`Line`, sent verbatim), and
/// the coordinator reads it back into an event (`Read`) in the same pass
/// that reads the report around it: each line is scanned once, and no
/// JSON value is built of it ([`Event::read_embedded`]). `Read(None)` is
/// an event or line troupe does not know, or what followed damage in
/// relayed records; relaying skips it.
///
/// [`Event::read_embedded`]: crate::runtime::events::Event::read_embedded
#[derive(Debug, Clone)]
pub enum EventLine {
    Line(Encoded),
    Read(Option<Event>),
}

/// JSON text the event encoder (or the log's record reader, which writes
/// the same) wrote: made only by [`EventLine::written`] and
/// [`EventLine::written_line`], so it is written into a report as it stands
/// without being checked again (one bad line would make the whole batch
/// of reports unreadable).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded(Box<str>);

impl Encoded {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl EventLine {
    /// The line `event` writes (its `seq` is the coordinator's to give),
    /// serialized as it stands, without parsing it again: a worker relays
    /// a dozen lines a sibling, and checking each with
    /// `RawValue::from_string` was half of relaying them (callgrind). The
    /// encoder's output is JSON by construction (its tests compare it
    /// byte for byte with serde_json's); debug builds, and so every test,
    /// check each line still.
    pub fn written(event: &Event) -> Option<EventLine> {
        let mut line = Vec::with_capacity(512);
        event.write_json(0, &mut line);
        String::from_utf8(line).ok().map(EventLine::written_line)
    }

    /// A line the event encoder wrote, or the log's record reader for a
    /// worker's event (the same bytes), serialized as it stands.
    pub fn written_line(text: String) -> EventLine {
        debug_assert!(
            serde_json::from_str::<&RawValue>(&text).is_ok(),
            "not JSON: {text}"
        );
        EventLine::Line(Encoded(text.into_boxed_str()))
    }

    /// The event, read back from its line if it still is one.
    pub fn into_event(self) -> Option<Event> {
        match self {
            EventLine::Line(line) => Event::from_line(line.as_str()),
            EventLine::Read(event) => event,
        }
    }
}

/// JSON text serde_json writes as it stands: serde_json's serializer
/// writes a struct of this name and field as the field's string, verbatim
/// (the protocol `RawValue`'s own `Serialize` uses; its unchecked
/// constructor is an `unsafe fn`, which this workspace denies). Given
/// only text the encoder wrote; `written_text_is_written_as_it_stands`
/// pins the protocol to the serde_json in use.
struct Written<'a>(&'a str);

impl Serialize for Written<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut raw = s.serialize_struct(RAW_VALUE, 1)?;
        raw.serialize_field(RAW_VALUE, self.0)?;
        raw.end()
    }
}

impl Serialize for EventLine {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            EventLine::Line(line) => Written(line.as_str()).serialize(s),
            // Read back, written as the worker would (its seq is the
            // coordinator's to give): for tests and tools, never sent.
            EventLine::Read(Some(event)) => match EventLine::written(event) {
                Some(line) => line.serialize(s),
                None => Err(serde::ser::Error::custom("an event that is not UTF-8")),
            },
            EventLine::Read(None) => s.serialize_unit(),
        }
    }
}

impl<'de> Deserialize<'de> for EventLine {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if LINE_BY_LINE.with(Cell::get) {
            let line = Box::<RawValue>::deserialize(d)?;
            return Ok(EventLine::Read(Event::from_line(line.get())));
        }
        Event::read_embedded(d).map(EventLine::Read)
    }
}

thread_local! {
    /// Set by [`line_by_line`] while it reads.
    static LINE_BY_LINE: Cell<bool> = const { Cell::new(false) };
}

/// Runs `read` with each event line taken whole first and then read on
/// its own (two scans, as `Event::from_line`): for a report the one-pass
/// read refused, so that a line only `from_line` can turn down costs
/// only itself, not the report around it.
pub fn line_by_line<T>(read: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            LINE_BY_LINE.with(|flag| flag.set(self.0));
        }
    }
    let _restore = Restore(LINE_BY_LINE.with(|flag| flag.replace(true)));
    read()
}

impl PartialEq for EventLine {
    /// The same event, however each side holds it: the same line written
    /// (an event read from records keeps its fields as values, one read
    /// from a line as text; both write the line it was sent as).
    fn eq(&self, other: &Self) -> bool {
        /// The line an event read back writes (`seq` 0, as sent).
        fn line(event: &Option<Event>) -> Option<Vec<u8>> {
            event.as_ref().map(|e| {
                let mut out = Vec::new();
                e.write_json(0, &mut out);
                out
            })
        }
        match (self, other) {
            (EventLine::Line(a), EventLine::Line(b)) => a == b,
            (EventLine::Read(a), EventLine::Read(b)) => line(a) == line(b),
            (EventLine::Line(text), EventLine::Read(event))
            | (EventLine::Read(event), EventLine::Line(text)) => {
                line(&Event::from_line(text.as_str())) == line(event)
            }
        }
    }
}

/// A cancel broadcast: the group `turn` of run `run_id` is cancelled.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Cancel {
    pub run_id: String,
    pub turn: u64,
    pub reason: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_as_tagged_json() {
        let report = Report::NotStarted {
            stage_execution_id: "r/w#1/1".to_owned(),
            turn: 2,
            unit: 1,
            worker: "host-1".to_owned(),
        };
        let text = serde_json::to_string(&report).expect("serializes");
        assert!(text.contains("\"kind\":\"notStarted\""), "{text}");
        let back: Report = serde_json::from_str(&text).expect("parses");
        assert_eq!(back, report);
        assert_eq!(back.execution(), Some(("r/w#1/1", 2, 1)));
    }

    /// A report's events are read in the pass that reads the report: each
    /// equals the event read back from its line alone, and writes the
    /// same audit line.
    #[test]
    fn events_read_with_their_report_are_the_events_of_their_lines() {
        use crate::runtime::events::EventName;
        let cancelled = Event::new(EventName::StageCancelled, "run-1")
            .stage("worker", "run-1/worker#3/1")
            .with_static("phase", "Act")
            .with("reason", "a \"quoted\" reason")
            .with("out", serde_json::json!({"k": [1.5, null, "\u{1}"]}));
        let EventLine::Line(line) = EventLine::written(&cancelled).unwrap() else {
            panic!("a written line");
        };
        let mut written = Vec::new();
        cancelled.write_json(0, &mut written);
        assert_eq!(
            line.as_str().as_bytes(),
            written,
            "the encoder's line, as it stands"
        );
        let report = Report::Cancelled {
            stage_execution_id: "run-1/worker#3/1".to_owned(),
            turn: 1,
            unit: 3,
            worker: "w1".to_owned(),
            usage: Usage::default(),
            events: vec![EventLine::Line(line.clone())],
        };
        let text = serde_json::to_vec(&vec![report.clone()]).unwrap();
        let back: Vec<Report> = serde_json::from_slice(&text).unwrap();
        assert_eq!(back, vec![report], "Line and Read compare by their event");
        let Report::Cancelled { events, .. } = back.into_iter().next().unwrap() else {
            panic!("a cancelled report");
        };
        let read = events.into_iter().next().unwrap().into_event().unwrap();
        let alone = Event::from_line(line.as_str()).unwrap();
        let (mut a, mut b) = (Vec::new(), Vec::new());
        read.write_json(7, &mut a);
        alone.write_json(7, &mut b);
        assert_eq!(String::from_utf8(a).unwrap(), String::from_utf8(b).unwrap());
    }

    fn task(unit: usize) -> Task {
        Task {
            run_id: "run-1".to_owned(),
            turn: 2,
            unit,
            stage_execution_id: format!("run-1/worker#{unit}/1"),
            stage_id: "worker".to_owned(),
            index: Some(unit),
            visit: 1,
            item: Some(serde_json::json!({"n": unit, "text": "a [bracket]"})),
            pipeline_id: "p".to_owned(),
            digest: "d".to_owned(),
            zstd_reports: true,
            relay_records: true,
        }
    }

    /// A lone task travels as its object, as an older coordinator sent it
    /// and an older worker reads it; several as an array, read back in
    /// order. An empty array, or anything else, is no message of tasks.
    #[test]
    fn a_lone_task_travels_as_its_object_several_as_an_array() {
        let one = serde_json::to_vec(&task(1)).unwrap();
        assert_eq!(encode_tasks(std::slice::from_ref(&one)), one);
        assert_eq!(decode_tasks(&one).unwrap(), vec![task(1)]);
        let older: Task = serde_json::from_slice(&encode_tasks(&[one])).unwrap();
        assert_eq!(older, task(1), "what an older worker reads");

        let bodies: Vec<Vec<u8>> = (0..3)
            .map(|u| serde_json::to_vec(&task(u)).unwrap())
            .collect();
        let body = encode_tasks(&bodies);
        assert_eq!(body.first(), Some(&b'['));
        assert_eq!(
            decode_tasks(&body).unwrap(),
            (0..3).map(task).collect::<Vec<_>>()
        );
        let mut spaced = b" \n".to_vec();
        spaced.extend_from_slice(&body);
        assert_eq!(decode_tasks(&spaced).unwrap().len(), 3);

        for bad in [&b"[]"[..], b" [ ] ", b"{}", b"[{}]", b"not json", b""] {
            assert!(
                decode_tasks(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }

    /// The raw-value protocol `Written` relies on, checked against the
    /// serde_json in use: text written as it stands, inside a larger
    /// text too.
    #[test]
    fn written_text_is_written_as_it_stands() {
        let text = r#"{"a":[1,2.5,"x\"y"],"b":{}}"#;
        assert_eq!(serde_json::to_string(&Written(text)).unwrap(), text);
        let around = serde_json::to_string(&vec![Written(text), Written("null")]).unwrap();
        assert_eq!(around, format!("[{text},null]"));
    }
}
