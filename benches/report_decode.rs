//! What a coordinator spends reading one message of a worker's reports
//! (criterion): a framed batch of 64 exited fan-out siblings, each report's
//! JSON beside its twelve events as the log's records, as a worker sends
//! it (before compression). Natively, where `benches/callgrind_distributed.sh`
//! counts instructions under valgrind (which slows the run fifty-fold and
//! so changes how reports batch up). How it was used: BENCHMARKS.md,
//! "Every core, twentieth round".

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use troupe::auditlog::records::scan::write_len;
use troupe::distributed::outbox::{FRAMED, decode};
use troupe::distributed::wire::Report;
use troupe::provider::Usage;
use troupe::runtime::events::{Event, EventName, FieldValue, Relaying};
use troupe::runtime::result::{Kept, StageResult};

const RUN: &str = "01a21ec6-ca4a-74c7-b285-9c47a6a1ce74";

/// A fan-out sibling's events, as `stages/fanout` makes them.
fn events(i: usize) -> Vec<Event> {
    let run: Arc<str> = Arc::from(RUN);
    let exec: Arc<str> = Arc::from(format!("{RUN}/worker#{i}/1"));
    let stage: Arc<str> = Arc::from("worker");
    let event = |name, fields: Vec<(&'static str, FieldValue)>| {
        let mut e = Event::new(name, Arc::clone(&run));
        e.stage_execution_id = Some(Arc::clone(&exec));
        e.stage_id = Some(Arc::clone(&stage));
        for (k, v) in fields {
            e.set(k, v);
        }
        e
    };
    let n = |n: u64| FieldValue::Number(n.into());
    let s = |s: &'static str| FieldValue::Static(s);
    let usage = |p, c| {
        FieldValue::Usage(Usage {
            prompt_tokens: p,
            completion_tokens: c,
            requests: 1,
        })
    };
    let call = |name| {
        let mut e = event(name, vec![("callId", s("call_1_0"))]);
        e.tool = Some(Arc::from("Echo"));
        e
    };
    let mut proposed = call(EventName::ToolInvocationProposed);
    proposed.set(
        "arguments",
        FieldValue::Text(Arc::from(format!("{{\"text\":\"item {i}\"}}"))),
    );
    let mut approved = call(EventName::ToolCallApproved);
    approved.set("by", s("allowedTools"));
    let mut succeeded = call(EventName::ToolInvocationSucceeded);
    succeeded.set("bytes", n(6));
    vec![
        event(
            EventName::StageEntered,
            vec![("kind", s("llm")), ("visit", n(1)), ("index", n(i as u64))],
        ),
        event(
            EventName::StageCheckGateResult,
            vec![("outcome", s("proceed")), ("check", n(1))],
        ),
        event(
            EventName::ProviderRequestStarted,
            vec![("provider", s("scripted")), ("turn", n(1)), ("try", n(1))],
        ),
        event(
            EventName::ProviderRequestCompleted,
            vec![("turn", n(1)), ("toolCalls", n(1)), ("usage", usage(55, 6))],
        ),
        proposed,
        approved,
        call(EventName::ToolInvocationStarted),
        succeeded,
        event(
            EventName::ProviderRequestStarted,
            vec![("provider", s("scripted")), ("turn", n(2)), ("try", n(1))],
        ),
        event(
            EventName::ProviderRequestCompleted,
            vec![
                ("turn", n(2)),
                ("toolCalls", n(1)),
                ("usage", usage(62, 10)),
            ],
        ),
        event(
            EventName::StageAssertOutcome,
            vec![
                ("verdict", s("ok")),
                ("attempt", n(1)),
                ("capHit", FieldValue::Bool(false)),
            ],
        ),
        event(
            EventName::StageExited,
            vec![("verdict", s("ok")), ("next", s("reduce"))],
        ),
    ]
}

/// One exited sibling's report, as its worker frames it.
fn framed(body: &mut Vec<u8>, i: usize) {
    let exec = format!("{RUN}/worker#{i}/1");
    let parsed = json!({"item": i.to_string(), "summary": format!("done {i}")});
    let result = StageResult {
        usage: Usage {
            prompt_tokens: 117,
            completion_tokens: 16,
            requests: 2,
        },
        ..StageResult::ok("worker", &exec, parsed)
    };
    let report = Report::Exited {
        stage_execution_id: exec,
        turn: 2,
        unit: i,
        worker: "w1".into(),
        delivered: 1,
        result: Kept::Whole(Arc::new(result)),
        events: Vec::new(),
    };
    let json = serde_json::to_vec(&report).expect("a report serializes");
    let mut relaying = Relaying::default();
    for e in events(i) {
        relaying.push(&e);
    }
    let records = relaying.into_bytes();
    write_len(body, json.len());
    body.extend_from_slice(&json);
    write_len(body, records.len());
    body.extend_from_slice(&records);
}

fn report_decode(c: &mut Criterion) {
    const REPORTS: usize = 64;
    let mut group = c.benchmark_group("report_decode");
    group.throughput(Throughput::Elements(REPORTS as u64));
    // Batches of other siblings each time round, as a run's messages are:
    // more siblings than a decoding thread keeps strings for, so that an
    // execution's own ids are new to it as they are in a run.
    let batches: Vec<Vec<u8>> = (0..160)
        .map(|b| {
            let mut body = FRAMED.to_vec();
            for i in 0..REPORTS {
                framed(&mut body, b * REPORTS + i);
            }
            body
        })
        .collect();
    let mut next = 0;
    group.bench_function("framed_64_exited", |bench| {
        bench.iter(|| {
            next = (next + 1) % batches.len();
            let reports = decode(black_box(&batches[next]));
            assert!(reports.iter().all(Result::is_ok));
            reports
        })
    });
    group.finish();
}

criterion_group!(benches, report_decode);
criterion_main!(benches);
