//! The scheduler core alone (`troupe_actors::FanOut`): a whole group driven
//! synchronously — every unit spawned, granted and finished ok — at
//! 1k / 10k / 100k units under caps 1 / 16 / 256. No runtime, no actors:
//! the floor under everything the runtime's scheduler does per sibling.

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use troupe_actors::{FanOut, FanOutCommand, FanOutEvent, UnitOutcome};

/// Drives a group to `AllSucceeded`; returns the number of commands seen.
fn drive(total: usize, cap: usize) -> usize {
    let mut group = FanOut::new(total, cap);
    let mut out = Vec::with_capacity(cap * 2);
    let mut batch = Vec::with_capacity(cap * 2);
    let mut seen = 0;
    group.start(&mut out);
    while !out.is_empty() {
        std::mem::swap(&mut out, &mut batch);
        for command in batch.drain(..) {
            seen += 1;
            let event = match command {
                FanOutCommand::Spawn { unit } => FanOutEvent::StartRequested { unit },
                FanOutCommand::Grant { unit } => FanOutEvent::Finished {
                    unit,
                    outcome: UnitOutcome::Ok,
                },
                _ => continue,
            };
            group
                .handle(event, &mut out)
                .expect("the driver follows the protocol");
        }
    }
    assert!(group.is_finished(), "the group ends");
    seen
}

fn scheduler_core(c: &mut Criterion) {
    let sizes: &[usize] = if std::env::var_os("CI").is_some() {
        &[1_000, 10_000]
    } else {
        &[1_000, 10_000, 100_000]
    };
    let mut group = c.benchmark_group("scheduler_core");
    for &total in sizes {
        group.throughput(Throughput::Elements(total as u64));
        for cap in [1, 16, 256] {
            group.bench_with_input(
                BenchmarkId::new(format!("cap{cap}"), total),
                &(total, cap),
                |b, &(total, cap)| b.iter(|| black_box(drive(total, cap))),
            );
        }
    }
    group.finish();
}

criterion_group!(benches, scheduler_core);
criterion_main!(benches);
