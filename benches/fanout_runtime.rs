//! The full `fanout` pipeline through the runtime (actors, events, the
//! audit log on) at N = 1k and 10k under cap 256, beside the plain-tokio
//! floor doing the same work in the same group: read the ratio of the two
//! lines, not the absolute times.
//!
//! Each iteration is one whole run; its time is the run's own wall clock
//! (session start to report, audit log flushed), so building the actor
//! system, the tokio runtime and the temp folder stays outside it.

use std::path::Path;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use troupe::bench::floor::{Floor, FloorSpec};
use troupe::bench::runner::{RunCell, Workload};

/// The allocator of the `troupe` binary, so the bench measures what users run.
#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

const CAP: usize = 256;

fn fanout_runtime(c: &mut Criterion) {
    let sizes: &[usize] = if std::env::var_os("CI").is_some() {
        &[100, 1_000]
    } else {
        &[1_000, 10_000]
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let workload = Workload::load(&dir).expect("stages/fanout loads");
    let floor = Floor::new().expect("the floor's schema compiles");
    let mut group = c.benchmark_group("fanout_runtime");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    for &width in sizes {
        group.throughput(Throughput::Elements(width as u64));
        group.bench_with_input(BenchmarkId::new("floor", width), &width, |b, &width| {
            b.iter_custom(|iters| {
                (0..iters)
                    .map(|_| {
                        let spec = FloorSpec {
                            width,
                            cap: CAP,
                            latency: Duration::ZERO,
                            fail: None,
                            hold: Duration::ZERO,
                        };
                        let r = floor.run_blocking(spec).expect("the floor runs");
                        assert_eq!(r.joined, width);
                        r.wall
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
                            cap: CAP,
                            latency: Duration::ZERO,
                            fail: Vec::new(),
                            hold: None,
                            threads: 1,
                            store: false,
                        };
                        let r = workload.run(&cell, runs.path()).expect("the run starts");
                        assert!(r.ok(), "the run ends ok");
                        r.wall
                    })
                    .sum()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, fanout_runtime);
criterion_main!(benches);
