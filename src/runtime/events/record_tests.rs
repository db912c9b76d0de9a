//! The runtime's events through the log's binary records: every kind of
//! event the runtime makes reads back as exactly the line
//! `Event::write_json` writes (`troupe runs export` promises it byte for
//! byte).

use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;

use super::{Event, EventName, FieldValue};
use crate::auditlog::records::{RecordWriter, read_in_pieces};
use crate::provider::Usage;

/// `events` as records in batches of `batch`, and as the JSON lines
/// `write_json` makes.
fn encoded(events: &[Event], batch: usize) -> (Vec<u8>, Vec<u8>) {
    let mut w = RecordWriter::new();
    let (mut records, mut lines) = (Vec::new(), Vec::new());
    for (i, e) in events.iter().enumerate() {
        if i % batch.max(1) == 0 {
            w.begin(&mut records);
        }
        let seq = 1 + i as u64 * 3;
        e.write_record(seq, &mut w, &mut records);
        e.write_json(seq, &mut lines);
        lines.push(b'\n');
    }
    (records, lines)
}

/// Every kind of field and head an event has.
pub(super) fn every_kind() -> Vec<Event> {
    let run: Arc<str> = Arc::from("01a2169c-ae47-74a5-8cb4-5df934e3f66c");
    let calls: Vec<(Arc<str>, Arc<str>)> = vec![
        ("c1".into(), "Echo".into()),
        ("c\"2\n".into(), "Bash".into()),
    ];
    let relayed = Event::from_line(
        r#"{"seq":4,"ts":"2026-11-26T07:00:00.000001Z","event":"ToolInvocationSucceeded","workflowRunId":"w","stageExecutionId":"w/x#1/1","stageId":"x","tool":"Echo","callId":"call_1_0","bytes":7,"nested":{"a":[1,2.5,null]}}"#,
    )
    .expect("a relayed event");
    vec![
        Event::new(EventName::WorkflowStarted, Arc::clone(&run)).with("pipeline", "p"),
        Event::new(EventName::StageExited, Arc::clone(&run))
            .stage("worker", format!("{run}/worker#1/1"))
            .with_static("verdict", "ok")
            .with("capHit", false)
            .with("done", true)
            .with("attemptCount", 1)
            .with(
                "usage",
                Usage {
                    prompt_tokens: 119,
                    completion_tokens: 17,
                    requests: u64::MAX,
                },
            ),
        Event::new(EventName::ToolInvocationProposed, Arc::clone(&run))
            .stage("worker", format!("{run}/worker#1/1"))
            .tool("Echo")
            .with("callId", Arc::<str>::from("call_1_0"))
            .with("arguments", "{\"text\":\"item 17\"}")
            .with(
                "nested",
                json!({"k\"ey": ["\u{0}", -3, 1.5e300, 0.1, u64::MAX, i64::MIN, true, {}], "": []}),
            )
            .with("negative", -12)
            .with("float", json!(2.5))
            .with("null", serde_json::Value::Null),
        // Escapes and non-ASCII in ids, keys of any kind, values.
        Event::new(EventName::ToolInvocationFailed, "r\"un\\")
            .stage("st\u{1}age", "exé/\n/1")
            .tool("To\tol")
            .with("message", "line 1\nline \"2\"\r\u{7f}\u{1f} — ünïcødé \\")
            .with("", "an empty key"),
        Event::new(EventName::StageCancelled, Arc::clone(&run))
            .with("toolCalls", FieldValue::calls(&calls))
            .with("none", FieldValue::calls(&[])),
        // Fields named like head keys: kept as the line.
        Event::new(EventName::StageExited, Arc::clone(&run))
            .with("tool", "from-field")
            .with("seq", 99)
            .with_static("verdict", "ok"),
        relayed.clone(),
        relayed.with("recovered", true),
        // A worker's pretty-printed value, relayed on one line.
        Event::from_line(
            "{\"event\":\"StageExited\",\"workflowRunId\":\"w\",\"x\":[1,\n 2],\r\n\"tool\":\"t\"}",
        )
        .expect("a relayed event")
        .with("seq", 3),
        Event::new(EventName::Progress, Arc::clone(&run))
            .with("members", FieldValue::Relayed("\"a\":1".into())),
    ]
}

#[test]
fn every_kind_of_event_reads_back_as_its_json_line_byte_for_byte() {
    let events = every_kind();
    for batch in [1, 2, 4, events.len()] {
        let (records, lines) = encoded(&events, batch);
        let one = read_in_pieces(&records, &[]).expect("records");
        assert_eq!(
            String::from_utf8_lossy(&one),
            String::from_utf8_lossy(&lines),
            "batches of {batch}"
        );
        // Byte by byte, as a slow reader gets them.
        let every: Vec<usize> = (0..records.len()).collect();
        assert_eq!(read_in_pieces(&records, &every).expect("records"), lines);
        assert!(records.len() < lines.len(), "{batch}");
    }
}

/// Any text, control characters and non-ASCII included.
fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9#/-]{0,40}",
        any::<String>(),
        "[\"\\\\\\n\\t\\x00-\\x1fé—]{0,6}",
    ]
}

fn field_value() -> impl Strategy<Value = FieldValue> {
    prop_oneof![
        text().prop_map(|s| FieldValue::Shared(Arc::from(s))),
        text().prop_map(|s| FieldValue::Text(Arc::from(s))),
        text().prop_map(FieldValue::from),
        prop_oneof![Just("ok"), Just("llm"), Just("")].prop_map(FieldValue::Static),
        any::<u64>().prop_map(FieldValue::from),
        any::<i64>().prop_map(FieldValue::from),
        any::<f64>()
            .prop_filter("finite", |f| f.is_finite())
            .prop_map(|f| FieldValue::from(json!(f))),
        any::<bool>().prop_map(FieldValue::Bool),
        (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(p, c, r)| FieldValue::Usage(Usage {
            prompt_tokens: p,
            completion_tokens: c,
            requests: r,
        })),
        proptest::collection::vec((text(), text()), 0..3).prop_map(|calls| {
            let calls: Vec<(Arc<str>, Arc<str>)> = calls
                .into_iter()
                .map(|(a, b)| (Arc::from(a), Arc::from(b)))
                .collect();
            FieldValue::calls(&calls)
        }),
        proptest::collection::vec(text(), 0..3).prop_map(|v| FieldValue::from(json!(v))),
    ]
}

pub(super) fn an_event() -> impl Strategy<Value = Event> {
    let keys = prop_oneof![
        Just("verdict"),
        Just("usage"),
        Just("callId"),
        Just("k\"ey"),
        Just(""),
        Just("tool"),
        Just("seq"),
    ];
    (
        text(),
        proptest::option::of((text(), text())),
        proptest::option::of(text()),
        proptest::collection::vec((keys, field_value()), 0..6),
        0u64..4_000_000_000_000_000,
    )
        .prop_map(|(run, stage, tool, fields, micros)| {
            let mut e = Event::new(EventName::ToolInvocationStarted, run);
            e.ts = std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros);
            if let Some((stage, exec)) = stage {
                e = e.stage(stage, exec);
            }
            if let Some(tool) = tool {
                e = e.tool(tool);
            }
            for (k, v) in fields {
                e.set(k, v);
            }
            e
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any event, in batches of any size, read in pieces of any size:
    /// exactly the lines `write_json` writes.
    #[test]
    fn any_events_read_back_as_their_json_lines(
        events in proptest::collection::vec(an_event(), 1..20),
        batch in 1usize..8,
        cuts in proptest::collection::vec(any::<usize>(), 0..6),
    ) {
        let (records, lines) = encoded(&events, batch);
        let back = read_in_pieces(&records, &cuts).expect("records");
        prop_assert_eq!(String::from_utf8_lossy(&back), String::from_utf8_lossy(&lines));
    }
}

#[test]
fn text_fields_are_written_in_place_and_shared_ones_numbered() {
    let run: Arc<str> = Arc::from("r");
    let text: Arc<str> = Arc::from("{\"path\":\"a-long-enough-argument-text\"}");
    let twice = |value: FieldValue| {
        let event = Event::new(EventName::ToolInvocationProposed, Arc::clone(&run))
            .with("arguments", value);
        let (records, lines) = encoded(&[event.clone(), event], 2);
        assert_eq!(read_in_pieces(&records, &[]).unwrap(), lines);
        records
            .windows(text.len())
            .filter(|w| *w == text.as_bytes())
            .count()
    };
    // Seen once, the arguments of a call: in each record that holds them.
    assert_eq!(twice(FieldValue::Text(Arc::clone(&text))), 2);
    // Shared: defined once a batch, then referred to by number.
    assert_eq!(twice(FieldValue::Shared(Arc::clone(&text))), 1);
}
