//! `troupe report` at fan-out scale: a synthetic audit log of 100 000
//! siblings (10 000 when `CI` is set), built in memory outside the timed
//! loop, read into a timeline and drawn as SVG. Two log shapes: every
//! event a real run writes (twelve lines per sibling, ~3.3 KB), and only
//! the three lines per sibling the report reads most; plus the drawing
//! alone, from a timeline already read.

#[path = "../tests/report_support/synthetic.rs"]
mod synthetic;

use std::hint::black_box;

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use troupe::report::{SvgOptions, Timeline, render_svg};

fn report_timeline(c: &mut Criterion) {
    let width: usize = if std::env::var_os("CI").is_some() {
        10_000
    } else {
        100_000
    };
    let mut group = c.benchmark_group("report_timeline");
    group.sample_size(10);
    group.throughput(Throughput::Elements(width as u64));
    for (shape, every_event) in [("every_event", true), ("lean", false)] {
        let log = synthetic::fanout_log(width, 256, every_event);
        group.bench_with_input(
            BenchmarkId::new(format!("parse_render_{shape}"), width),
            &log,
            |b, log| {
                b.iter(|| {
                    let t = Timeline::from_audit(log.as_bytes()).expect("the synthetic log reads");
                    black_box(render_svg(&t, &SvgOptions::default()).len())
                })
            },
        );
    }
    let t = Timeline::from_audit(synthetic::fanout_log(width, 256, false).as_bytes())
        .expect("the synthetic log reads");
    group.bench_with_input(BenchmarkId::new("render", width), &t, |b, t| {
        b.iter(|| black_box(render_svg(t, &SvgOptions::default()).len()))
    });
    group.finish();
}

criterion_group!(benches, report_timeline);
criterion_main!(benches);
