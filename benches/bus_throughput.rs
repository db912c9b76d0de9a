//! Event-bus publish throughput, one audit subscriber draining as fast as
//! it can (like the audit log writer):
//!
//! - `fast_only`: audit and observer events alternating, no other
//!   subscriber;
//! - `slow_observer`: observer events only, plus a slow subscriber (one
//!   event per 100 µs, a queue of 1024): its overflow is dropped and
//!   reported as lag, so the publisher must not slow down;
//! - `slow_audit`: audit events with that slow subscriber: audit events
//!   are never dropped, for any subscriber, so publishing runs at the slow
//!   subscriber's pace once its queue is full (ARCHITECTURE.md, Events and
//!   audit). Fewer events, so the bench ends; read it as time per event.
//! - `publishers/N`: audit events from N threads at once into one bus
//!   with the audit subscriber only, the arbiters' case on a big machine:
//!   every event passes one deliverer at a time, and on 16 cores the bus
//!   was a third of the arbiters' time (BENCHMARKS.md, tenth round). On
//!   2 cores only the 1 and 2 cells mean much; run the others where the
//!   cores are.

use std::hint::black_box;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use troupe::runtime::events::{Event, EventName};
use troupe_actors::{EventBus, Subscription};

fn drain(sub: Subscription<Event>, pause: Option<Duration>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let mut n = 0;
        for d in sub.iter() {
            black_box(&d);
            n += 1;
            if let Some(p) = pause {
                std::thread::sleep(p);
            }
        }
        n
    })
}

#[derive(Debug, Clone, Copy)]
enum Mix {
    Alternating,
    ObserverOnly,
    AuditOnly,
}

/// Publishes `count` events; returns the time publishing took.
fn publish(count: usize, mix: Mix, slow: bool) -> Duration {
    let bus = EventBus::new();
    let mut drains = vec![drain(bus.subscribe_audit("audit", 65_536), None)];
    if slow {
        drains.push(drain(
            bus.subscribe("slow", 1_024),
            Some(Duration::from_micros(100)),
        ));
    }
    let start = Instant::now();
    for i in 0..count {
        let audit = match mix {
            Mix::Alternating => i % 2 == 0,
            Mix::ObserverOnly => false,
            Mix::AuditOnly => true,
        };
        let name = if audit {
            EventName::StageEntered
        } else {
            EventName::Progress
        };
        let ev = Event::new(name, "run-1").stage("worker", "exec-1");
        black_box(bus.publish(ev));
    }
    let took = start.elapsed();
    bus.close();
    for d in drains {
        black_box(d.join().expect("drain thread"));
    }
    took
}

/// Publishes `count` audit events from `threads` threads at once (their
/// share each, started together); returns the time until the subscriber
/// has taken the last of them (a publish may return with its event
/// handed off, not yet delivered).
fn publish_from(threads: usize, count: usize) -> Duration {
    let bus = EventBus::new();
    let drain = drain(bus.subscribe_audit("audit", 65_536), None);
    let start = std::sync::Arc::new(std::sync::Barrier::new(threads + 1));
    let publishers: Vec<_> = (0..threads)
        .map(|_| {
            let (bus, start) = (bus.clone(), std::sync::Arc::clone(&start));
            std::thread::spawn(move || {
                start.wait();
                for _ in 0..count / threads {
                    let ev = Event::new(EventName::StageEntered, "run-1").stage("worker", "exec-1");
                    black_box(bus.publish(ev));
                }
            })
        })
        .collect();
    start.wait();
    let began = Instant::now();
    for p in publishers {
        p.join().expect("publisher thread");
    }
    bus.close();
    black_box(drain.join().expect("drain thread"));
    began.elapsed()
}

fn bus_throughput(c: &mut Criterion) {
    let ci = std::env::var_os("CI").is_some();
    let count: usize = if ci { 10_000 } else { 100_000 };
    let mut group = c.benchmark_group("bus_throughput");
    group.sample_size(10);
    for (label, mix, slow, n) in [
        ("fast_only", Mix::Alternating, false, count),
        ("slow_observer", Mix::ObserverOnly, true, count),
        ("slow_audit", Mix::AuditOnly, true, 2_048),
    ] {
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::new(label, n), &n, |b, &n| {
            b.iter_custom(|iters| (0..iters).map(|_| publish(n, mix, slow)).sum());
        });
    }
    group.throughput(Throughput::Elements(count as u64));
    for threads in [1, 2, 8, 16] {
        group.bench_with_input(
            BenchmarkId::new("publishers", threads),
            &threads,
            |b, &threads| {
                b.iter_custom(|iters| (0..iters).map(|_| publish_from(threads, count)).sum());
            },
        );
    }
    group.finish();
}

criterion_group!(benches, bus_throughput);
criterion_main!(benches);
