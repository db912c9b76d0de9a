//! Relayed events read back as the events they were: every kind writes
//! the same line after the trip, and damage costs only what follows it.

use std::sync::Arc;

use proptest::prelude::*;

use super::super::record_tests::{an_event, every_kind};
use super::{KEYS, Relaying, relayed_lines, relayed_lines_within};
use crate::auditlog::records::{EventHead, RecordWriter};
use crate::runtime::events::{Event, EventName, FieldValue};

fn relayed(events: &[Event]) -> Vec<u8> {
    let mut relaying = Relaying::default();
    for e in events {
        relaying.push(e);
    }
    relaying.into_bytes()
}

fn line(e: &Event) -> String {
    let mut out = Vec::new();
    e.write_json(7, &mut out);
    String::from_utf8(out).expect("UTF-8")
}

/// What the coordinator wrote for `sent` when events travelled as JSON
/// lines: the line the worker wrote, read back (`None` if it read as no
/// event), written again.
fn as_lines_relayed_it(sent: &Event) -> Option<String> {
    let mut out = Vec::new();
    sent.write_json(0, &mut out);
    let read = Event::from_line(std::str::from_utf8(&out).expect("UTF-8"))?;
    Some(line(&read))
}

#[test]
fn the_keys_are_sorted_for_their_search_and_name_no_head_key() {
    assert!(KEYS.windows(2).all(|w| w[0] < w[1]), "{KEYS:?}");
    let head = crate::runtime::events::encode::HEAD_KEYS;
    assert!(KEYS.iter().all(|k| !head.contains(k)));
}

#[test]
fn every_kind_of_event_reads_back_as_the_event_that_writes_its_line() {
    let events = every_kind();
    let bytes = relayed(&events);
    let (back, fault) = Event::read_relayed(&bytes);
    assert_eq!(fault, None);
    assert_eq!(back.len(), events.len());
    for (sent, got) in events.iter().zip(&back) {
        assert_eq!(got.as_ref().map(line), as_lines_relayed_it(sent));
        let got = got.as_ref().expect("a known event");
        assert_eq!(got.ts, {
            // The log keeps microseconds.
            let micros = crate::auditlog::clock::micros_since_epoch(sent.ts);
            std::time::UNIX_EPOCH + std::time::Duration::from_micros(micros)
        });
    }
    // As lines, for a coordinator that reads lines: what the worker
    // wrote as JSON before (seq 0).
    let lines = relayed_lines(&bytes);
    let written: Vec<String> = events
        .iter()
        .map(|e| {
            let mut out = Vec::new();
            e.write_json(0, &mut out);
            String::from_utf8(out).expect("UTF-8")
        })
        .collect();
    assert_eq!(lines, written);
}

/// Lines within a budget, each counted with the comma after it: all of
/// them at exactly their size, none a byte short, and the making stops
/// at the line that passes it (the damaged tail here is never read: a
/// reader that made every line first would reach it).
#[test]
fn lines_within_a_budget_stop_at_the_line_that_passes_it() {
    let events = every_kind();
    let bytes = relayed(&events);
    let lines = relayed_lines(&bytes);
    let size: usize = lines.iter().map(|l| l.len() + 1).sum();
    assert_eq!(relayed_lines_within(&bytes, size), Some(lines.clone()));
    assert_eq!(relayed_lines_within(&bytes, size - 1), None);
    let mut damaged = relayed(&events[..2]);
    damaged.extend_from_slice(&[0xff; 16]);
    assert_eq!(relayed_lines_within(&damaged, lines[0].len() + 1), None);
}

/// An event of the runtime's own keys comes back with its fields as
/// values, not text: the coordinator's telemetry reads them without
/// parsing, and its log writes them as records of their own.
#[test]
fn the_runtimes_own_fields_come_back_as_values() {
    let exited = &every_kind()[1];
    let (back, _) = Event::read_relayed(&relayed(std::slice::from_ref(exited)));
    let back = back[0].clone().expect("an event");
    let keys: Vec<&str> = back.fields().map(|(k, _)| k).collect();
    assert_eq!(keys, ["verdict", "capHit", "done", "attemptCount", "usage"]);
    assert_eq!(back.field("verdict"), Some(serde_json::json!("ok")));
    assert!(matches!(
        back.field_value("usage"),
        Some(FieldValue::Usage(u)) if u.requests == u64::MAX
    ));
    // One id, shared by the events that name it.
    let two = [exited.clone(), exited.clone()];
    let (back, _) = Event::read_relayed(&relayed(&two));
    let ids: Vec<&Arc<str>> = back
        .iter()
        .map(|e| e.as_ref().unwrap().stage_execution_id.as_ref().unwrap())
        .collect();
    assert!(Arc::ptr_eq(ids[0], ids[1]));
    // A key the runtime does not give: every field kept as text, in order.
    let odd = Event::new(EventName::StageExited, "r")
        .with_static("verdict", "ok")
        .with("fromTheFuture", 3)
        .with("attempt", 1);
    let (back, _) = Event::read_relayed(&relayed(std::slice::from_ref(&odd)));
    let back = back[0].clone().unwrap();
    assert!(matches!(back.field_value(""), Some(FieldValue::Relayed(_))));
    assert_eq!(back.field("fromTheFuture"), Some(serde_json::json!(3)));
    assert_eq!(line(&back), line(&odd));
}

/// What a field writer writes after an event's head.
type Fields<'a> = &'a dyn Fn(&mut RecordWriter, &mut Vec<u8>);

/// Records of events of run `r`, each its name, its field count and what
/// writes its fields: the bytes a worker that wrote them would relay.
fn written(events: &[(&'static str, usize, Fields<'_>)]) -> Vec<u8> {
    written_at(5, events)
}

/// [`written`] with the events' timestamp.
fn written_at(micros: u64, events: &[(&'static str, usize, Fields<'_>)]) -> Vec<u8> {
    let run: Arc<str> = Arc::from("r");
    let mut w = RecordWriter::for_one_execution();
    let mut bytes = Vec::new();
    w.begin(&mut bytes);
    for (name, fields, write) in events {
        let head = EventHead {
            seq: 0,
            micros,
            name,
            run: &run,
            exec: None,
            stage: None,
            tool: None,
            fields: *fields,
        };
        w.event(&mut bytes, &head);
        write(&mut w, &mut bytes);
    }
    bytes
}

/// A string is defined once and referred to in a byte or two: records of
/// a few megabytes that would make gigabytes of lines are refused once
/// they pass 64 MiB of text, before anything that large is built.
#[test]
fn records_that_expand_past_the_bound_are_refused() {
    let big: Arc<str> = Arc::from("x".repeat(1 << 20));
    let many = |w: &mut RecordWriter, b: &mut Vec<u8>| {
        for _ in 0..1000 {
            w.field_shared(b, "arguments", &big);
        }
    };
    let bytes = written(&[
        ("StageExited", 1, &|w, b| w.field_shared(b, "verdict", &big)),
        ("StageEntered", 1000, &many),
    ]);
    assert!(bytes.len() < (2 << 20), "{} bytes", bytes.len());
    let (back, fault) = Event::read_relayed(&bytes);
    assert_eq!(back.len(), 1);
    assert!(fault.unwrap().contains("past 64 MiB"));
    // Fields of nothing: each counts what reading it holds.
    let empties = |w: &mut RecordWriter, b: &mut Vec<u8>| {
        for _ in 0..60_000 {
            w.field_text(b, "text", "");
        }
    };
    let event: (&str, usize, Fields<'_>) = ("StageEntered", 60_000, &empties);
    let (back, fault) = Event::read_relayed(&written(&[event; 20]));
    assert!(back.len() < 20);
    assert!(fault.unwrap().contains("past 64 MiB"));
}

#[test]
fn an_event_this_troupe_does_not_know_reads_as_none_and_keeps_the_rest() {
    let bytes = written(&[
        ("FromTheFuture", 1, &|w, b| w.field_u64(b, "attempt", 1)),
        ("StageExited", 1, &|w, b| w.field_static(b, "verdict", "ok")),
    ]);
    let (back, fault) = Event::read_relayed(&bytes);
    assert_eq!(fault, None);
    assert!(back[0].is_none());
    assert_eq!(back[1].as_ref().unwrap().name, EventName::StageExited);
}

/// Members that are not JSON members (or that a line read back would
/// not have: numbers out of range, lone surrogates, head keys, a line
/// break), a JSON value that is not JSON, a field named like a head key,
/// a timestamp past the year 9999: refused where they stand (the
/// coordinator's log writes them as they stand), with the events before
/// them kept.
#[test]
fn text_written_out_as_it_stands_is_checked() {
    let damaged = |write: Fields<'_>| {
        let bytes = written(&[("StageExited", 0, &|_, _| {}), ("StageExited", 1, write)]);
        let (back, fault) = Event::read_relayed(&bytes);
        assert_eq!(
            back.len(),
            1,
            "the event before is kept: {back:?} {fault:?}"
        );
        fault.expect("a fault")
    };
    for members in [
        "\"x\":1e999",
        "\"\\ud800\":1",
        "\"x\":\"\\udc00\"",
        "\"a\":1,\"seq\":5",
        "\"event\":\"StageEntered\"",
    ] {
        let why = damaged(&|w, b| w.members(b, members));
        assert!(
            why.contains("no readable value")
                || why.contains("no JSON members")
                || why.contains("head key"),
            "{members}: {why}"
        );
    }
    // A JSON value that is no value, or one no reader can read.
    for json in ["{\"a\":", "1e999", "[\"\\ud800\"]", "1 2"] {
        let why = damaged(&|w, b| w.field_json(b, "x", |o| o.extend(json.as_bytes())));
        assert!(
            why.contains("no JSON value") || why.contains("no reader"),
            "{json}: {why}"
        );
    }
    let why = damaged(&|w, b| w.field_u64(b, "seq", 18_446_744_073_709_551_615));
    assert!(why.contains("head key `seq`"), "{why}");
    let why = damaged(&|w, b| w.field_static(b, "workflowRunId", "forged"));
    assert!(why.contains("head key"), "{why}");
    let (back, fault) = Event::read_relayed(&written_at(
        253_402_300_800_000_000,
        &[("StageExited", 0, &|_, _| {})],
    ));
    assert!(back.is_empty());
    assert!(fault.unwrap().contains("9999"));
    let why = damaged(&|w, b| w.members(b, "\"a\":1}, {\"b\":2"));
    assert!(why.contains("no JSON members"), "{why}");
    // Members and values as a line read back keeps them: a line break
    // between tokens is a space, and nesting has no bound but the text's.
    let deep = format!("{}{}", "[".repeat(500), "]".repeat(500));
    let bytes = written(&[("StageExited", 2, &|w, b| {
        w.members(b, "\"a\":\r\n[1,\n2]");
        w.field_json(b, "deep", |o| o.extend(deep.as_bytes()));
    })]);
    let (back, fault) = Event::read_relayed(&bytes);
    assert_eq!(fault, None);
    let line = line(back[0].as_ref().unwrap());
    assert!(
        line.ends_with(&format!(",\"a\":[1, 2],\"deep\":{deep}}}")),
        "{line}"
    );
    // Members that are members pass, as text.
    let bytes = written(&[("StageExited", 1, &|w, b| w.members(b, "\"a\":1,\"b\":[2]"))]);
    let (back, fault) = Event::read_relayed(&bytes);
    assert_eq!(fault, None);
    assert_eq!(
        back[0].as_ref().unwrap().field("b"),
        Some(serde_json::json!([2]))
    );
}

/// The strings one execution's records define come back as the ones
/// another execution's defined before: one allocation, made once per
/// thread (`Interned`), whatever each execution numbered them.
#[test]
fn strings_repeated_across_executions_are_made_once() {
    let verdict = |bytes: &[u8]| {
        let (back, fault) = Event::read_relayed(bytes);
        assert_eq!(fault, None);
        match back.last().unwrap().as_ref().unwrap().fields.as_slice() {
            [("verdict", FieldValue::Shared(ok))] => Arc::clone(ok),
            other => panic!("{other:?}"),
        }
    };
    let first = verdict(&written(&[("StageExited", 1, &|w, b| {
        w.field_static(b, "verdict", "interned-verdict")
    })]));
    // Numbered differently: another string is defined first.
    let second = verdict(&written(&[
        ("StageEntered", 1, &|w, b| {
            w.field_static(b, "outcome", "proceed")
        }),
        ("StageExited", 1, &|w, b| {
            w.field_static(b, "verdict", "interned-verdict")
        }),
    ]));
    assert_eq!(&*first, "interned-verdict");
    assert!(Arc::ptr_eq(&first, &second));
}

/// Past what the thread keeps, it starts again: every event still reads
/// back as its line, the strings it shares among them too.
#[test]
fn more_strings_than_are_kept_read_back_alike() {
    let mut events = Vec::new();
    for i in 0..super::INTERNED_MAX + 100 {
        let mut event = Event::new(EventName::StageExited, Arc::from("run"));
        event.stage_execution_id = Some(Arc::from(format!("run/worker#{i}/1")));
        event.stage_id = Some(Arc::from("worker"));
        event.set("verdict", FieldValue::Shared(Arc::from("ok")));
        events.push(event);
    }
    for chunk in events.chunks(1000) {
        let (back, fault) = Event::read_relayed(&relayed(chunk));
        assert_eq!(fault, None);
        let lines: Vec<_> = back.iter().map(|e| e.as_ref().map(line)).collect();
        let sent: Vec<_> = chunk.iter().map(as_lines_relayed_it).collect();
        assert_eq!(lines, sent);
    }
}

/// A defined string that is not UTF-8 is refused, with the events before
/// it kept, however often valid strings were read before it.
#[test]
fn a_string_that_is_not_utf8_is_refused() {
    let bytes = written(&[
        ("StageExited", 1, &|w, b| w.field_static(b, "verdict", "ok")),
        ("StageExited", 1, &|w, b| {
            w.field_static(b, "verdict", "z\u{e9}z")
        }),
    ]);
    let _ = Event::read_relayed(&bytes);
    let at = bytes
        .windows(4)
        .position(|w| w == "z\u{e9}z".as_bytes())
        .expect("the string's bytes");
    let mut damaged = bytes.clone();
    // A continuation byte with no lead: the same length, not UTF-8.
    damaged[at + 1] = 0x80;
    let (back, fault) = Event::read_relayed(&damaged);
    assert_eq!(back.len(), 1);
    assert!(fault.unwrap().contains("not UTF-8"));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    /// Any events: the same lines after the trip. Cut anywhere, the
    /// events whole before the cut read back as they were; changed
    /// anywhere, no panic.
    #[test]
    fn any_events_make_the_same_lines_and_damage_costs_only_what_follows(
        events in proptest::collection::vec(an_event(), 1..12),
        cut in any::<prop::sample::Index>(),
        flip in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let bytes = relayed(&events);
        let (back, fault) = Event::read_relayed(&bytes);
        prop_assert_eq!(fault, None);
        let lines: Vec<Option<String>> = back.iter().map(|e| e.as_ref().map(line)).collect();
        let sent: Vec<Option<String>> = events.iter().map(as_lines_relayed_it).collect();
        prop_assert_eq!(&lines, &sent);

        let at = cut.index(bytes.len());
        let (short, fault) = Event::read_relayed(&bytes[..at]);
        // Cut between records, nothing is wrong: fewer events.
        prop_assert!(short.len() < events.len() || at == bytes.len());
        prop_assert!(fault.is_none() || short.len() < events.len());
        for (got, want) in short.iter().zip(&sent) {
            prop_assert_eq!(&got.as_ref().map(line), want);
        }

        let mut changed = bytes.clone();
        changed[flip.index(bytes.len())] ^= xor;
        let _ = Event::read_relayed(&changed);
    }
}
