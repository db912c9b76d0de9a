//! Fail-fast latency: 10k siblings in flight (cap = width, every other
//! sibling's model request held for a minute), the last one fails at once;
//! the time measured is from its `StageExited` (verdict fail) to the last
//! `StageCancelled`, by the events' own timestamps. The floor line is the
//! same shape on plain tokio: from the failing task's error to every other
//! task aborted and joined.

use std::path::Path;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, criterion_group, criterion_main};
use troupe::bench::floor::{Floor, FloorSpec};
use troupe::bench::runner::{RunCell, Workload};
use troupe::provider::selector::Selector;

/// The allocator of the `troupe` binary, so the bench measures what users run.
#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

const HOLD: Duration = Duration::from_secs(60);

fn cancel_latency(c: &mut Criterion) {
    let width: usize = if std::env::var_os("CI").is_some() {
        1_000
    } else {
        10_000
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let workload = Workload::load(&dir).expect("stages/fanout loads");
    let floor = Floor::new().expect("the floor's schema compiles");
    let last = width - 1;
    let mut group = c.benchmark_group("cancel_latency");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.bench_with_input(BenchmarkId::new("floor", width), &width, |b, &width| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let spec = FloorSpec {
                        width,
                        cap: width,
                        latency: Duration::ZERO,
                        fail: Some(last),
                        hold: HOLD,
                    };
                    let r = floor.run_blocking(spec).expect("the floor runs");
                    r.cancel_latency.expect("the floor cancelled")
                })
                .sum()
        });
    });
    group.bench_with_input(BenchmarkId::new("runtime", width), &width, |b, &width| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let runs = tempfile::tempdir().expect("a temp folder");
                    let cell = RunCell {
                        width,
                        cap: width,
                        latency: Duration::ZERO,
                        fail: vec![Selector::parse(&format!("worker#{last}")).expect("selector")],
                        hold: Some(HOLD),
                        threads: 1,
                        store: false,
                    };
                    let r = workload.run(&cell, runs.path()).expect("the run starts");
                    assert!(!r.ok(), "the run fails");
                    assert!(
                        r.cancelled + 1 >= width,
                        "only {} of {width} siblings were in flight",
                        r.cancelled
                    );
                    r.cancel_latency.expect("siblings were cancelled")
                })
                .sum()
        });
    });
    group.finish();
}

criterion_group!(benches, cancel_latency);
criterion_main!(benches);
