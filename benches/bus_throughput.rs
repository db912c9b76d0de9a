//! Event-bus publish throughput: audit and observer events alternating,
//! one audit subscriber draining as fast as it can (like the audit log),
//! with and without a slow observer subscriber (one event per 100 µs, a
//! small queue). A slow observer must not slow the publisher: its events
//! are dropped and reported as lag, never waited for.

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

/// Publishes `count` events; returns the time publishing took.
fn publish(count: usize, slow: bool) -> Duration {
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
        let name = if i % 2 == 0 {
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
    let count: usize = if std::env::var_os("CI").is_some() {
        10_000
    } else {
        100_000
    };
    let mut group = c.benchmark_group("bus_throughput");
    group.sample_size(10);
    group.throughput(Throughput::Elements(count as u64));
    for slow in [false, true] {
        let label = if slow {
            "with_slow_subscriber"
        } else {
            "fast_only"
        };
        group.bench_with_input(BenchmarkId::new(label, count), &slow, |b, &slow| {
            b.iter_custom(|iters| (0..iters).map(|_| publish(count, slow)).sum());
        });
    }
    group.finish();
}

criterion_group!(benches, bus_throughput);
criterion_main!(benches);
