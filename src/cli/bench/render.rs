//! `troupe bench`'s results: one row per cell (medians over the repeats,
//! ratios to the floor and to the ideal, RSS, cancel latency) and the
//! table people read.

use std::time::Duration;

use serde::Serialize;

use super::args::Matrix;
use super::cell::{CellResult, CellRun};
use crate::bench::ideal_wall;
use crate::bench::matrix::show_latency;

/// One table row: medians over the repeats.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Row {
    width: usize,
    cap: usize,
    latency_ms: f64,
    threads: usize,
    store: bool,
    pub(super) runtime_ok: bool,
    runtime_wall_ms: f64,
    runtime_walls_ms: Vec<f64>,
    floor_wall_ms: f64,
    floor_walls_ms: Vec<f64>,
    per_sibling_us: f64,
    floor_per_sibling_us: f64,
    ratio_to_floor: f64,
    /// `None` at zero latency (the ideal is then 0) and with
    /// `--fail-sibling` (the run stops early).
    ideal_ms: Option<f64>,
    ratio_to_ideal: Option<f64>,
    floor_ratio_to_ideal: Option<f64>,
    peak_rss_kib: Option<u64>,
    floor_peak_rss_kib: Option<u64>,
    rss_ratio_to_floor: Option<f64>,
    cancel_latency_ms: Option<f64>,
    floor_cancel_latency_ms: Option<f64>,
    cancelled: usize,
    /// With several `--threads`: the wall of the same cell (width, cap,
    /// latency, store) at the fewest threads measured over this one's,
    /// how much more throughput the added threads bought (set by
    /// [`with_speedups`]).
    speedup: Option<f64>,
}

/// Sets each row's [`Row::speedup`] against the row of the same cell at
/// the fewest threads, when the matrix measured more than one count.
pub(super) fn with_speedups(rows: &mut [Row]) {
    let same = |a: &Row, b: &Row| {
        (a.width, a.cap, a.store) == (b.width, b.cap, b.store) && a.latency_ms == b.latency_ms
    };
    let base: Vec<Option<f64>> = rows
        .iter()
        .map(|r| {
            let cell: Vec<&Row> = rows.iter().filter(|o| same(o, r)).collect();
            let fewest = cell.iter().min_by_key(|o| o.threads)?;
            cell.iter()
                .any(|o| o.threads != fewest.threads)
                .then_some(fewest.runtime_wall_ms)
        })
        .collect();
    for (row, base) in rows.iter_mut().zip(base) {
        row.speedup = base.map(|b| b / row.runtime_wall_ms.max(f64::MIN_POSITIVE));
    }
}

pub(super) fn median(values: &mut [f64]) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

fn ms(us: u64) -> f64 {
    us as f64 / 1000.0
}

impl Row {
    pub(super) fn from_runs(r: &CellResult, m: &Matrix) -> Row {
        let walls = |runs: &[CellRun]| runs.iter().map(|c| ms(c.wall_us)).collect::<Vec<_>>();
        let runtime_walls = walls(&r.runtime);
        let floor_walls = walls(&r.floor);
        let runtime_wall = median(&mut runtime_walls.clone());
        let floor_wall = median(&mut floor_walls.clone());
        let cancel = |runs: &[CellRun]| {
            let mut v: Vec<f64> = runs
                .iter()
                .filter_map(|c| c.cancel_latency_us.map(ms))
                .collect();
            (!v.is_empty()).then(|| median(&mut v))
        };
        let peak = |runs: &[CellRun]| runs.iter().filter_map(|c| c.peak_rss_kib).max();
        let ideal = ideal_wall(r.width, r.cap, r.latency);
        // A failing run stops early: its wall says nothing about the ideal.
        let ideal_ms =
            (!ideal.is_zero() && m.fail.is_none()).then_some(ideal.as_secs_f64() * 1000.0);
        let (peak_rss, floor_rss) = (peak(&r.runtime), peak(&r.floor));
        let width = r.width as f64;
        Row {
            width: r.width,
            cap: r.cap,
            latency_ms: r.latency.as_secs_f64() * 1000.0,
            threads: r.threads,
            store: r.store,
            // With --fail-sibling every run must have failed; a sibling
            // that never ran (an index beyond the width) measures nothing.
            runtime_ok: r.runtime.iter().all(|c| c.ok == m.fail.is_none()),
            runtime_wall_ms: runtime_wall,
            runtime_walls_ms: runtime_walls,
            floor_wall_ms: floor_wall,
            floor_walls_ms: floor_walls,
            per_sibling_us: runtime_wall * 1000.0 / width,
            floor_per_sibling_us: floor_wall * 1000.0 / width,
            ratio_to_floor: runtime_wall / floor_wall.max(f64::MIN_POSITIVE),
            ideal_ms,
            ratio_to_ideal: ideal_ms.map(|i| runtime_wall / i),
            floor_ratio_to_ideal: ideal_ms.map(|i| floor_wall / i),
            peak_rss_kib: peak_rss,
            floor_peak_rss_kib: floor_rss,
            rss_ratio_to_floor: peak_rss
                .zip(floor_rss)
                .map(|(a, b)| a as f64 / (b.max(1)) as f64),
            cancel_latency_ms: cancel(&r.runtime),
            floor_cancel_latency_ms: cancel(&r.floor),
            cancelled: r.runtime.iter().map(|c| c.cancelled).max().unwrap_or(0),
            speedup: None,
        }
    }
}

pub(super) fn table(pipeline: &str, m: &Matrix, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "troupe bench {pipeline}: median of {} run(s) per cell, each run in its own process; floor = plain tokio",
        m.repeat
    );
    let with_cancel = m.fail.is_some();
    let with_speedup = rows.iter().any(|r| r.speedup.is_some());
    let _ = write!(
        out,
        "{:>7} {:>5} {:>7} {:>7} {:>5} {:>11} {:>11} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "width",
        "cap",
        "latency",
        "threads",
        "store",
        "wall ms",
        "floor ms",
        "µs/sib",
        "×floor",
        "×ideal",
        "RSS MiB",
        "RSS×floor"
    );
    if with_speedup {
        let _ = write!(out, " {:>8}", "speedup");
    }
    if with_cancel {
        let _ = write!(out, " {:>10} {:>9}", "cancel ms", "cancelled");
    }
    let _ = writeln!(out);
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_owned(), |v| format!("{v:.prec$}"));
    for r in rows {
        let _ = write!(
            out,
            "{:>7} {:>5} {:>7} {:>7} {:>5} {:>11.1} {:>11.1} {:>9.1} {:>8.2} {:>8} {:>9} {:>9}",
            r.width,
            r.cap,
            show_latency(Duration::from_secs_f64(r.latency_ms / 1000.0)),
            r.threads,
            if r.store { "on" } else { "off" },
            r.runtime_wall_ms,
            r.floor_wall_ms,
            r.per_sibling_us,
            r.ratio_to_floor,
            opt(r.ratio_to_ideal, 3),
            opt(r.peak_rss_kib.map(|k| k as f64 / 1024.0), 1),
            opt(r.rss_ratio_to_floor, 2),
        );
        if with_speedup {
            let _ = write!(out, " {:>8}", opt(r.speedup, 2));
        }
        if with_cancel {
            let _ = write!(
                out,
                " {:>10} {:>9}",
                opt(r.cancel_latency_ms, 2),
                r.cancelled
            );
        }
        if !r.runtime_ok {
            let _ = write!(
                out,
                "  {}",
                if m.fail.is_none() {
                    "(run FAILED)"
                } else {
                    "(never failed)"
                }
            );
        }
        let _ = writeln!(out);
    }
    if with_speedup {
        let _ = writeln!(
            out,
            "speedup: the same cell's wall at the fewest threads measured over this wall (its throughput against theirs)"
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(width: usize, threads: usize, store: bool, wall: f64) -> Row {
        Row {
            width,
            cap: 256,
            latency_ms: 0.0,
            threads,
            store,
            runtime_ok: true,
            runtime_wall_ms: wall,
            runtime_walls_ms: vec![wall],
            floor_wall_ms: 1.0,
            floor_walls_ms: vec![1.0],
            per_sibling_us: 0.0,
            floor_per_sibling_us: 0.0,
            ratio_to_floor: wall,
            ideal_ms: None,
            ratio_to_ideal: None,
            floor_ratio_to_ideal: None,
            peak_rss_kib: None,
            floor_peak_rss_kib: None,
            rss_ratio_to_floor: None,
            cancel_latency_ms: None,
            floor_cancel_latency_ms: None,
            cancelled: 0,
            speedup: None,
        }
    }

    /// Each cell against itself at the fewest threads measured, never
    /// against another width or store setting; a cell measured at one
    /// count has none, and the table shows the column only when one has.
    #[test]
    fn a_speedup_is_against_the_same_cell_at_the_fewest_threads() {
        let mut rows = vec![
            row(10_000, 2, true, 50.0),
            row(10_000, 1, true, 100.0),
            row(10_000, 8, true, 20.0),
            row(100, 1, true, 10.0),
            row(100, 2, true, 8.0),
            row(100, 2, false, 4.0),
        ];
        with_speedups(&mut rows);
        let got: Vec<Option<f64>> = rows.iter().map(|r| r.speedup).collect();
        assert_eq!(
            got,
            [Some(2.0), Some(1.0), Some(5.0), Some(1.0), Some(1.25), None]
        );
        let m = Matrix {
            widths: vec![100, 10_000],
            caps: vec![256],
            latencies: vec![Duration::ZERO],
            threads: vec![1, 2, 8],
            stores: vec![true, false],
            repeat: 1,
            fail: None,
        };
        assert!(table("fanout", &m, &rows).contains("speedup"));
        let mut one = vec![row(100, 2, true, 8.0), row(1_000, 2, true, 9.0)];
        with_speedups(&mut one);
        assert!(one.iter().all(|r| r.speedup.is_none()));
        assert!(!table("fanout", &m, &one).contains("speedup"));
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
