//! Reading report messages: batches as JSON, compressed, framed with
//! their events' records, and what damage or excess in each costs.

use super::*;

#[test]
fn a_message_is_a_batch_or_one_report() {
    let read = |payload: &[u8]| -> Vec<Option<Report>> {
        decode(payload).into_iter().map(Result::ok).collect()
    };
    let barrier = serde_json::to_vec(&Report::Barrier { turn: 3 }).expect("encodes");
    assert_eq!(read(&barrier), vec![Some(Report::Barrier { turn: 3 })]);
    let accepted = Report::Accepted {
        stage_execution_id: "r/w#1/1".to_owned(),
        turn: 2,
        unit: 1,
        worker: "w1".to_owned(),
    };
    let batch =
        serde_json::to_vec(&vec![accepted.clone(), Report::Barrier { turn: 2 }]).expect("encodes");
    assert_eq!(
        read(&batch),
        vec![Some(accepted.clone()), Some(Report::Barrier { turn: 2 })]
    );
    // One report nobody knows costs only itself.
    let mut mixed = b"[".to_vec();
    mixed.extend_from_slice(&serde_json::to_vec(&accepted).expect("encodes"));
    mixed.extend_from_slice(b",{\"kind\":\"fromTheFuture\",\"body\":{}},");
    mixed.extend_from_slice(&serde_json::to_vec(&Report::Barrier { turn: 4 }).expect("encodes"));
    mixed.push(b']');
    assert_eq!(
        read(&mixed),
        vec![Some(accepted), None, Some(Report::Barrier { turn: 4 })]
    );
    assert_eq!(read(b" ["), vec![None]);
    assert_eq!(read(b"{\"kind\":\"nope\"}"), vec![None]);
    assert_eq!(read(b""), vec![None]);
}

/// A compressed batch reads as its text does; one that is cut short,
/// damaged or expands past any batch a worker makes is one error, not
/// a panic and not a batch read in part.
#[test]
fn a_compressed_batch_reads_as_its_text_and_a_bad_one_is_one_error() {
    let reports: Vec<Report> = (0..40)
        .map(|n| Report::Accepted {
            stage_execution_id: format!("run-1/worker#{n}/1"),
            turn: 2,
            unit: n,
            worker: "w1".to_owned(),
        })
        .collect();
    let text = serde_json::to_vec(&reports).expect("encodes");
    assert!(text.len() >= COMPRESS_FROM);
    let packed = packer().unwrap().compress(&text).expect("compresses");
    assert!(
        packed.len() * 4 < text.len(),
        "{} of {}",
        packed.len(),
        text.len()
    );
    let read: Vec<Report> = decode(&packed).into_iter().map(Result::unwrap).collect();
    assert_eq!(read, reports);

    let error = |payload: &[u8]| -> String {
        let mut decoded = decode(payload);
        assert_eq!(decoded.len(), 1);
        decoded.pop().unwrap().unwrap_err().to_string()
    };
    let cut = error(&packed[..packed.len() - 3]);
    assert!(cut.contains("compressed report batch"), "{cut}");
    // Any byte changed past the frame's header: refused by the
    // checksum or the decoder, never read as other text.
    for at in 6..packed.len() {
        let mut damaged = packed.clone();
        damaged[at] ^= 0x5a;
        let decoded = decode(&damaged);
        assert!(
            decoded.iter().all(Result::is_err),
            "byte {at} changed: {decoded:?}"
        );
    }
    assert!(error(&ZSTD_MAGIC).contains("compressed report batch"));
    // Zeros compress to nearly nothing: a frame that expands past the
    // bound is refused, whether it says its size or not.
    let zeros = vec![0u8; usize::try_from(MAX_EXPANDED).unwrap() + 1];
    let bomb = zstd::bulk::compress(&zeros, LEVEL).expect("compresses");
    assert!(error(&bomb).contains("expands past 64 MiB"));
    let streamed = |text: &[u8]| {
        use std::io::Write;
        let mut encoder = zstd::stream::Encoder::new(Vec::new(), LEVEL).unwrap();
        encoder.write_all(text).unwrap();
        encoder.finish().unwrap()
    };
    let unsized_bomb = streamed(&zeros);
    assert_eq!(
        zstd::zstd_safe::get_frame_content_size(&unsized_bomb).unwrap(),
        None
    );
    assert!(error(&unsized_bomb).contains("expands past 64 MiB"));
    // A frame that does not say its size (another writer's stream)
    // still reads.
    let read: Vec<Report> = decode(&streamed(&text))
        .into_iter()
        .map(Result::unwrap)
        .collect();
    assert_eq!(read, reports);
}

/// Lines that are no event troupe knows are skipped, and cost neither
/// their report nor the events beside them.
#[test]
fn a_line_that_is_no_event_reads_as_none_and_keeps_its_report() {
    let event = r#"{"seq":0,"ts":"2026-11-26T10:00:00.000001Z","event":"StageEntered","workflowRunId":"r"}"#;
    let odd = [
        "42",
        "\"text\"",
        "null",
        "[1,[2,{}]]",
        r#"{"event":"NoSuchEvent","workflowRunId":"r"}"#,
        r#"{"event":"StageEntered","workflowRunId":"r","x":1e999,"y":[{"z":true}]}"#,
        r#"{"event":"StageEntered","workflowRunId":"r","x":"\ud800"}"#,
        // What only a line read on its own can turn down.
        "1e999",
        r#""\ud800""#,
        r#"{"event":"StageEntered","workflowRunId":1}"#,
        r#"{"event":"StageEntered","workflowRunId":"r","\udc00":1}"#,
    ];
    let events = format!("[{event},{},{event}]", odd.join(","));
    let text = format!(
        r#"[{{"kind":"cancelled","body":{{"stageExecutionId":"r/w#1/1","turn":1,"unit":1,"worker":"w","usage":{},"events":{events}}}}}]"#,
        serde_json::to_string(&crate::runtime::result::Usage::default()).unwrap()
    );
    assert!(
        serde_json::from_str::<Vec<Report>>(&text).is_err(),
        "the one pass turns the last lines down"
    );
    let mut expected = vec![true];
    expected.extend(std::iter::repeat_n(false, odd.len()));
    expected.push(true);
    let read = |reports: Vec<Result<Report, serde_json::Error>>| -> Vec<bool> {
        let Some(Ok(Report::Cancelled { events, .. })) = reports.into_iter().next() else {
            panic!("a cancelled report");
        };
        events
            .into_iter()
            .map(|e| e.into_event().is_some())
            .collect()
    };
    assert_eq!(read(decode(text.as_bytes())), expected);
    // The same report framed, its events as lines inside its JSON (an
    // execution with more records than a batch carries): read alike.
    let mut framed = FRAMED.to_vec();
    frame(&mut framed, &text.as_bytes()[1..text.len() - 1], &[]);
    assert_eq!(read(decode(&framed)), expected);
}

/// A batch that is not UTF-8 everywhere (a stray byte in a member no
/// report reads) with a line only a line read on its own turns down:
/// both reports still read.
#[test]
fn a_stray_byte_and_an_odd_line_in_one_batch_cost_neither_report() {
    let usage = serde_json::to_string(&crate::runtime::result::Usage::default()).unwrap();
    let mut batch = b"[{\"kind\":\"accepted\",\"body\":{\"stageExecutionId\":\"r/w#1/1\",\"turn\":1,\"unit\":1,\"worker\":\"w\",\"note\":\"".to_vec();
    batch.push(0xff);
    batch.extend_from_slice(b"\"}},");
    batch.extend_from_slice(
        format!(
            r#"{{"kind":"cancelled","body":{{"stageExecutionId":"r/w#2/1","turn":1,"unit":2,"worker":"w","usage":{usage},"events":[1e999]}}}}]"#
        )
        .as_bytes(),
    );
    let reports = decode(&batch);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert!(
        matches!(reports[0], Ok(Report::Accepted { unit: 1, .. })),
        "{reports:?}"
    );
    let Ok(Report::Cancelled { events, .. }) = &reports[1] else {
        panic!("{reports:?}");
    };
    assert!(
        matches!(events[..], [super::super::wire::EventLine::Read(None)]),
        "{events:?}"
    );
}

/// A framed batch: each report with its events' records. Events come
/// back as the lines a JSON batch gave; a report nobody knows costs
/// only itself; compressed it reads the same; cut anywhere, what is
/// whole before the cut is read and the rest is one error, never a
/// panic; damaged records keep their report and the events before.
#[test]
fn a_framed_batch_reads_its_reports_with_their_events() {
    use crate::runtime::events::{EventName, Relaying};
    let run = "01a2169c-ae47-74a5-8cb4-5df934e3f66c";
    let exec = format!("{run}/worker#3/1");
    let events = [
        Event::new(EventName::StageEntered, run)
            .stage("worker", exec.as_str())
            .with("worker", "w1"),
        Event::new(EventName::StageCancelled, run)
            .stage("worker", exec.as_str())
            .with("reason", "a sibling failed"),
    ];
    let mut relaying = Relaying::default();
    for e in &events {
        relaying.push(e);
    }
    let records = relaying.into_bytes();
    let cancelled = Report::Cancelled {
        stage_execution_id: exec.clone(),
        turn: 1,
        unit: 3,
        worker: "w1".to_owned(),
        usage: crate::runtime::result::Usage::default(),
        events: Vec::new(),
    };
    let accepted = Report::Accepted {
        stage_execution_id: exec.clone(),
        turn: 1,
        unit: 3,
        worker: "w1".to_owned(),
    };
    let json = |r: &Report| serde_json::to_vec(r).unwrap();
    // `events` is written when empty: a coordinator older than
    // records requires it.
    assert!(
        String::from_utf8(json(&cancelled))
            .unwrap()
            .contains(r#""events":[]"#)
    );
    let mut body = FRAMED.to_vec();
    frame(&mut body, &json(&accepted), &[]);
    frame(
        &mut body,
        br#"{"kind":"fromTheFuture","body":{}}"#,
        &records,
    );
    frame(&mut body, &json(&cancelled), &records);
    let ends: Vec<usize> = {
        // Where each report's frame ends.
        let mut at = FRAMED.len();
        let mut ends = Vec::new();
        for _ in 0..3 {
            for _ in 0..2 {
                let len = read_len(&body, &mut at).unwrap();
                at += len;
            }
            ends.push(at);
        }
        ends
    };
    assert_eq!(*ends.last().unwrap(), body.len());
    let check = |reports: Vec<Result<Report, serde_json::Error>>| {
        assert_eq!(reports.len(), 3, "{reports:?}");
        assert_eq!(reports[0].as_ref().unwrap(), &accepted);
        assert!(reports[1].is_err());
        let Ok(Report::Cancelled { events: got, .. }) = &reports[2] else {
            panic!("{reports:?}");
        };
        let lines = |e: &Event| {
            let mut out = Vec::new();
            e.write_json(1, &mut out);
            out
        };
        let got: Vec<Vec<u8>> = got
            .iter()
            .map(|e| lines(&e.clone().into_event().unwrap()))
            .collect();
        let sent: Vec<Vec<u8>> = events.iter().map(lines).collect();
        assert_eq!(got, sent);
    };
    check(decode(&body));
    check(decode(&packer().unwrap().compress(&body).unwrap()));

    // An execution whose events go as lines inside the report's JSON (too
    // many records for a batch: `Collected::take`), none beside it.
    let as_lines = Report::Cancelled {
        stage_execution_id: exec.clone(),
        turn: 1,
        unit: 3,
        worker: "w1".to_owned(),
        usage: crate::runtime::result::Usage::default(),
        events: events
            .iter()
            .map(|e| EventLine::written(e).unwrap())
            .collect(),
    };
    let mut inside = FRAMED.to_vec();
    frame(&mut inside, &json(&accepted), &[]);
    frame(&mut inside, br#"{"kind":"fromTheFuture","body":{}}"#, &[]);
    frame(&mut inside, &json(&as_lines), &[]);
    check(decode(&inside));

    for cut in FRAMED.len()..body.len() {
        let reports = decode(&body[..cut]);
        let whole = ends.iter().filter(|end| **end <= cut).count();
        let at_an_end = cut == FRAMED.len() || ends.contains(&cut);
        assert_eq!(
            reports.len(),
            whole + usize::from(!at_an_end),
            "cut at {cut}"
        );
        if !at_an_end {
            let why = reports.last().unwrap().as_ref().unwrap_err().to_string();
            assert!(why.contains("cut short or damaged"), "{why}");
        }
    }

    // The records cut short: the report and its first event kept.
    let mut damaged = FRAMED.to_vec();
    frame(
        &mut damaged,
        &json(&cancelled),
        &records[..records.len() - 2],
    );
    let reports = decode(&damaged);
    let Ok(Report::Cancelled { events: got, .. }) = &reports[0] else {
        panic!("{reports:?}");
    };
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got[0].clone().into_event().is_some());
    assert!(matches!(got[1], EventLine::Read(None)));
}

/// What the records of one message may make is bounded for the
/// message, not for each report: three reports of 30 MiB of text
/// each pass 64 MiB in the third, which keeps its events before.
/// A batch of more frames than a worker sends is refused past them.
#[test]
fn a_framed_batch_is_bounded_as_a_whole() {
    use crate::runtime::events::{EventName, FieldValue, Relaying};
    use std::sync::Arc;
    let big: Arc<str> = Arc::from("x".repeat(1 << 20));
    let mut relaying = Relaying::default();
    for _ in 0..30 {
        relaying.push(
            &Event::new(EventName::ToolInvocationStarted, "r")
                .stage("worker", "r/worker#1/1")
                .with("arguments", FieldValue::Shared(Arc::clone(&big))),
        );
    }
    let records = relaying.into_bytes();
    assert!(records.len() < (2 << 20));
    let cancelled = serde_json::to_vec(&Report::Cancelled {
        stage_execution_id: "r/worker#1/1".to_owned(),
        turn: 1,
        unit: 1,
        worker: "w1".to_owned(),
        usage: crate::runtime::result::Usage::default(),
        events: Vec::new(),
    })
    .unwrap();
    let mut body = FRAMED.to_vec();
    for _ in 0..3 {
        frame(&mut body, &cancelled, &records);
    }
    let kept: Vec<usize> = decode(&body)
        .into_iter()
        .map(|r| match r {
            Ok(Report::Cancelled { events, .. }) => events
                .iter()
                .filter(|e| matches!(e, EventLine::Read(Some(_))))
                .count(),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(kept[..2], [30, 30]);
    assert!(kept[2] < 10, "{kept:?}");

    let accepted = serde_json::to_vec(&Report::Accepted {
        stage_execution_id: "r/worker#1/1".to_owned(),
        turn: 1,
        unit: 1,
        worker: "w1".to_owned(),
    })
    .unwrap();
    let mut body = FRAMED.to_vec();
    for _ in 0..=MAX_REPORTS {
        frame(&mut body, &accepted, &[]);
    }
    let reports = decode(&body);
    assert_eq!(reports.len(), MAX_REPORTS + 1);
    assert!(reports[..MAX_REPORTS].iter().all(Result::is_ok));
    assert!(reports[MAX_REPORTS].is_err());
}

/// An exited report holding a result nested deeper than the reader
/// allows: a model's answer can be.
fn exited_deep(unit: usize, depth: usize) -> Vec<u8> {
    let exec = format!("r/w#{unit}/1");
    let result = crate::runtime::result::StageResult::ok("w", &exec, serde_json::json!(1));
    let result = serde_json::to_string(&result).unwrap().replace(
        "\"parsed\":1",
        &format!("\"parsed\":{}1{}", "[".repeat(depth), "]".repeat(depth)),
    );
    format!(
        r#"{{"kind":"exited","body":{{"stageExecutionId":"{exec}","turn":1,"unit":{unit},"worker":"w","delivered":1,"result":{result},"events":[]}}}}"#
    )
    .into_bytes()
}

/// A sibling's last report that cannot be read, with its ids readable,
/// settles it as refused (`ReportUnreadable`, its reason the reader's),
/// so the run does not wait for a report that came and was skipped:
/// alone, in a batch, framed. Any other report that cannot be read is
/// still only skipped.
#[test]
fn a_last_report_that_cannot_be_read_refuses_its_sibling() {
    let refused = |report: &Result<Report, serde_json::Error>, unit: usize| match report {
        Ok(Report::Refused {
            stage_execution_id,
            turn: 1,
            unit: u,
            worker,
            code,
            message,
        }) => {
            assert_eq!(stage_execution_id, &format!("r/w#{unit}/1"));
            assert_eq!((*u, worker.as_str()), (unit, "w"));
            assert_eq!(code, REPORT_UNREADABLE);
            assert!(message.contains("recursion limit"), "{message}");
        }
        other => panic!("{other:?}"),
    };
    // Nested as deep as the reader allows, it reads.
    assert!(matches!(
        decode(&exited_deep(1, 100))[..],
        [Ok(Report::Exited { unit: 1, .. })]
    ));
    let deep = exited_deep(2, 126);
    refused(&decode(&deep)[0], 2);
    let accepted = Report::Accepted {
        stage_execution_id: "r/w#3/1".to_owned(),
        turn: 1,
        unit: 3,
        worker: "w".to_owned(),
    };
    let mut batch = b"[".to_vec();
    batch.extend_from_slice(&serde_json::to_vec(&accepted).unwrap());
    batch.push(b',');
    batch.extend_from_slice(&deep);
    batch.push(b']');
    let reports = decode(&batch);
    assert_eq!(reports[0].as_ref().unwrap(), &accepted);
    refused(&reports[1], 2);
    let mut framed = FRAMED.to_vec();
    frame(&mut framed, &serde_json::to_vec(&accepted).unwrap(), &[]);
    frame(&mut framed, &deep, &[]);
    let reports = decode(&framed);
    assert_eq!(reports.len(), 2, "{reports:?}");
    assert_eq!(reports[0].as_ref().unwrap(), &accepted);
    refused(&reports[1], 2);
    // A report of a kind this troupe does not know, with ids, or a last
    // one whose ids cannot be read: skipped.
    let unknown = br#"{"kind":"fromTheFuture","body":{"stageExecutionId":"r/w#4/1","turn":1,"unit":4,"worker":"w"}}"#;
    assert!(decode(unknown)[0].is_err());
    let no_ids =
        br#"{"kind":"exited","body":{"turn":1,"unit":4,"worker":"w","delivered":1,"result":7}}"#;
    assert!(decode(no_ids)[0].is_err());
}
