//! The threads a run has one of, each at full speed: what caps a wide
//! run however many arbiters it has (BENCHMARKS.md, "Every core").
//!
//! - `audit_log/formatters=N`: two threads publish the twelve audit
//!   events of each of 2 000 `fanout` siblings (shaped as a real run
//!   writes them, ~280 bytes a line) into a bus whose audit log writes a
//!   compact log to a temporary folder, with N formatter threads; timed
//!   until the log is closed. N = 0 is the writer formatting itself, as
//!   below four `--threads`.
//! - `store_writer`: one thread hands 2 000 exit records (a `fanout`
//!   result each) to the run store's writer, each waiting for its commit
//!   as a stage execution does; timed until the last answer.
//!
//! Read the throughput as siblings per second: a run cannot pass more
//! than the slowest of these allows.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use troupe::runtime::audit::start_audit_log;
use troupe::runtime::events::{Event, EventName};
use troupe::runtime::ledger::{ExitRecord, Ledger};
use troupe::runtime::result::{Kept, StageResult, Usage};
use troupe::store::{RunRow, Store, StoreWriter};
use troupe_actors::EventBus;

const SIBLINGS: usize = 2_000;
const RUN: &str = "01a2179f-ef98-73b0-bf93-8d2b5685b3c0";

fn usage(p: u64, c: u64, r: u64) -> Usage {
    Usage {
        prompt_tokens: p,
        completion_tokens: c,
        requests: r,
    }
}

/// The twelve audit events of sibling `i`, with the fields a `fanout`
/// run gives them.
fn sibling_events(run: &Arc<str>, i: usize) -> Vec<Event> {
    let exec: Arc<str> = Arc::from(format!("{run}/worker#{i}/1"));
    let stage: Arc<str> = Arc::from("worker");
    let ev = |name| Event::new(name, Arc::clone(run)).stage(Arc::clone(&stage), Arc::clone(&exec));
    let call = |name| {
        ev(name)
            .with_static("tool", "Echo")
            .with_static("callId", "call_1_0")
    };
    // A model turn: its request started and completed.
    let turn = |n: u32, spent: Usage| {
        [
            ev(EventName::ProviderRequestStarted)
                .with_static("provider", "scripted")
                .with("turn", n)
                .with("try", 1u32),
            ev(EventName::ProviderRequestCompleted)
                .with("turn", n)
                .with("toolCalls", 1u32)
                .with("usage", spent),
        ]
    };
    let [first_asked, first_answered] = turn(1, usage(56, 6, 1));
    let [second_asked, second_answered] = turn(2, usage(63, 11, 1));
    vec![
        ev(EventName::StageEntered)
            .with_static("kind", "llm")
            .with("visit", 1u32)
            .with("index", i),
        ev(EventName::StageCheckGateResult)
            .with_static("outcome", "proceed")
            .with("check", 1u32),
        first_asked,
        first_answered,
        call(EventName::ToolInvocationProposed)
            .with("arguments", format!("{{\"text\":\"item {i}\"}}").as_str()),
        call(EventName::ToolCallApproved).with_static("by", "allowedTools"),
        call(EventName::ToolInvocationStarted),
        call(EventName::ToolInvocationSucceeded).with("bytes", 7u32),
        second_asked,
        second_answered,
        ev(EventName::StageAssertOutcome)
            .with_static("verdict", "ok")
            .with("attempt", 1u32)
            .with("capHit", false),
        ev(EventName::StageExited)
            .with_static("verdict", "ok")
            .with("capHit", false)
            .with("attemptCount", 1u32)
            .with("usage", usage(119, 17, 2)),
    ]
}

/// Publishes every sibling's events from two threads into an audit log
/// with `formatters`; the time until the log is closed.
fn audit_log(formatters: usize) -> Duration {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let bus: EventBus<Event> = EventBus::new();
    let sink = start_audit_log(&bus, &dir.path().join(troupe::auditlog::FILE), formatters)
        .expect("the audit log starts");
    let run: Arc<str> = Arc::from(RUN);
    // Made before the clock starts: the actors make them in a run.
    let events: Vec<Vec<Event>> = (0..2)
        .map(|half| {
            (half * SIBLINGS / 2..(half + 1) * SIBLINGS / 2)
                .flat_map(|i| sibling_events(&run, i))
                .collect()
        })
        .collect();
    let start = Instant::now();
    std::thread::scope(|s| {
        for half in events {
            let bus = bus.clone();
            s.spawn(move || {
                for e in half {
                    bus.publish(e);
                }
            });
        }
    });
    bus.close();
    sink.finish().expect("the log is written");
    start.elapsed()
}

fn exit_record(i: usize) -> ExitRecord {
    let exec = format!("{RUN}/worker#{i}/1");
    let parsed = json!({ "item": i, "echo": format!("item {i}") });
    let id: Arc<str> = exec.as_str().into();
    // Packed, as a sibling's execution hands it over.
    let result = Arc::new(StageResult {
        usage: usage(119, 17, 2),
        ..StageResult::ok("worker", &exec, parsed)
    });
    ExitRecord {
        run_id: RUN.into(),
        stage_execution_id: Arc::clone(&id),
        stage_id: "worker".into(),
        index: Some(i),
        visit: 1,
        result: Kept::packed(result, "worker".into(), id),
        entered_at: SystemTime::now(),
        exited_at: SystemTime::now(),
    }
}

/// Hands every sibling's exit to a fresh store's writer; the time until
/// the last commit is answered.
fn store_writer() -> Duration {
    let dir = tempfile::tempdir().expect("a temporary folder");
    let path = dir.path().join("troupe.db");
    let store = Store::open(&path).expect("the store opens");
    store
        .begin_run(&RunRow {
            id: RUN.to_owned(),
            pipeline_id: "fanout".to_owned(),
            pipeline_dir: "stages/fanout".to_owned(),
            digest: "sha256:00".to_owned(),
            ctx: json!({ "width": SIBLINGS }),
            cap: 256,
            run_dir: format!(".troupe/runs/{RUN}"),
            status: "running".to_owned(),
            reason: None,
            started_at: 0,
            ended_at: None,
            summary: None,
            sessions: 1,
        })
        .expect("the run is recorded");
    let writer = StoreWriter::start(&path).expect("the writer starts");
    let ledger = writer.ledger();
    let records: Vec<ExitRecord> = (0..SIBLINGS).map(exit_record).collect();
    let answered = Arc::new(AtomicUsize::new(0));
    let (done, all_answered) = crossbeam_channel::bounded::<()>(1);
    let start = Instant::now();
    for record in records {
        let answered = Arc::clone(&answered);
        let done = done.clone();
        ledger.persist(
            record,
            Some(Box::new(move |stored| {
                stored.expect("committed");
                if answered.fetch_add(1, Ordering::Relaxed) + 1 == SIBLINGS {
                    let _ = done.send(());
                }
            })),
        );
    }
    all_answered.recv().expect("every exit is answered");
    let took = start.elapsed();
    writer.finish().expect("the writer ends");
    took
}

fn one_per_run(c: &mut Criterion) {
    let mut group = c.benchmark_group("one_per_run");
    group.sample_size(10);
    group.throughput(Throughput::Elements(SIBLINGS as u64));
    for formatters in [0, 2, 4] {
        group.bench_with_input(
            BenchmarkId::new("audit_log", format!("formatters={formatters}")),
            &formatters,
            |b, &n| b.iter_custom(|iters| (0..iters).map(|_| audit_log(n)).sum()),
        );
    }
    group.bench_function("store_writer", |b| {
        b.iter_custom(|iters| (0..iters).map(|_| store_writer()).sum())
    });
    group.finish();
}

criterion_group!(benches, one_per_run);
criterion_main!(benches);
