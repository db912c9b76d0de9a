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
    group.finish();
}

criterion_group!(benches, bus_throughput);
criterion_main!(benches);
