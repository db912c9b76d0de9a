//! `troupe bench`: runs a pipeline offline with the scripted provider over a
//! matrix of widths, caps and per-turn latencies, beside the plain-tokio
//! floor doing the same work, and prints wall time, per-sibling cost, the
//! ratios to the floor and to the ideal, peak RSS and (with
//! `--fail-sibling`) the cancellation latency.
//!
//! Every run happens in a child process of its own (`--cell`), so the
//! process-wide, only-growing peak RSS (`VmHWM`) is that run's alone; the
//! floor and the runtime children alternate within one `troupe bench`
//! invocation so drift on a shared machine hits both alike.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::json;

use super::Exit;
use super::validate::{print_diagnostics, reject};
use crate::bench::floor::{Floor, FloorSpec};
use crate::bench::matrix::{MAX_WIDTH, parse_counts, parse_latencies, show_latency};
use crate::bench::rss::peak_rss_kib;
use crate::bench::runner::{RunCell, RunnerError, Workload};
use crate::bench::{WORKER_TURNS, ideal_wall};
use crate::error::ValidationCode;
use crate::provider::scripted::Selector;

/// Options of `troupe bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The pipeline folder (it must declare a `width` ctx field, like
    /// stages/fanout).
    pub pipeline: PathBuf,
    /// Fan-out widths, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "100,1000,10000")]
    pub width: String,
    /// Parallel caps, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "16,256")]
    pub cap: String,
    /// Latency of every scripted model turn, comma-separated.
    #[arg(long, value_name = "LIST", default_value = "0ms,50ms")]
    pub latency: String,
    /// Runs per cell (the table shows the median).
    #[arg(long, value_name = "N", default_value = "5")]
    pub repeat: String,
    /// Make one sibling fail, e.g. worker#17, and report how long
    /// cancelling the siblings in flight takes. The index must be below
    /// every --width, or the run never fails and the bench says so.
    #[arg(long, value_name = "STAGE#INDEX")]
    pub fail_sibling: Option<String>,
    /// Print the results as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Keep the runs' audit logs (printed path) instead of removing them.
    #[arg(long)]
    pub keep_runs: bool,
    /// Internal: run one cell once in this process and print its figures.
    #[arg(long, hide = true, value_name = "runtime|floor")]
    pub cell: Option<String>,
    /// Internal: where a `--cell` run writes its audit log.
    #[arg(long, hide = true, value_name = "DIR")]
    pub runs_dir: Option<PathBuf>,
}

/// The validated matrix.
#[derive(Debug, Clone)]
struct Matrix {
    widths: Vec<usize>,
    caps: Vec<usize>,
    latencies: Vec<Duration>,
    repeat: usize,
    fail: Option<Selector>,
}

/// What one child run prints: one JSON object.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct CellRun {
    wall_us: u64,
    ok: bool,
    peak_rss_kib: Option<u64>,
    cancel_latency_us: Option<u64>,
    cancelled: usize,
}

/// A bad flag or flag value: reported like a pipeline's diagnostics (as
/// JSON with `--json`), exit 2.
fn invalid(args: &BenchArgs, message: &str) -> Exit {
    reject(
        &args.pipeline,
        ValidationCode::InputInvalid,
        message.to_owned(),
        args.json,
    )
}

fn parse_matrix(args: &BenchArgs) -> Result<Matrix, String> {
    let widths =
        parse_counts(&args.width, "width", MAX_WIDTH).map_err(|e| format!("--width {e}"))?;
    let caps = parse_counts(&args.cap, "cap", 1_000_000).map_err(|e| format!("--cap {e}"))?;
    let latencies = parse_latencies(&args.latency).map_err(|e| format!("--latency {e}"))?;
    let repeat = match args.repeat.trim().parse::<usize>() {
        Ok(n @ 1..=1000) => n,
        _ => {
            return Err(format!(
                "--repeat `{}` must be a whole number from 1 to 1000",
                args.repeat
            ));
        }
    };
    let fail = args
        .fail_sibling
        .as_deref()
        .map(Selector::parse)
        .transpose()
        .map_err(|e| format!("--fail-sibling {e}"))?;
    // The floor fails exactly one task, so the runtime must too.
    if let Some(f) = fail.as_ref().filter(|f| f.index.is_none()) {
        return Err(format!(
            "--fail-sibling `{f}` must name one sibling, as STAGE#N (e.g. worker#17)"
        ));
    }
    Ok(Matrix {
        widths,
        caps,
        latencies,
        repeat,
        fail,
    })
}

pub fn run(args: BenchArgs) -> Exit {
    let matrix = match parse_matrix(&args) {
        Ok(m) => m,
        Err(e) => return invalid(&args, &e),
    };
    let workload = match Workload::load(&args.pipeline) {
        Ok(w) => w,
        Err(RunnerError::Invalid(diags)) => {
            print_diagnostics(&args.pipeline, &diags, args.json);
            return Exit::Invalid;
        }
        Err(e) => return invalid(&args, &e.to_string()),
    };
    if let Err(e) = workload.check_selectors(matrix.fail.as_slice()) {
        return invalid(&args, &e.to_string());
    }
    match args.cell.as_deref() {
        None => run_matrix(&args, &matrix, &workload),
        Some(kind) => run_cell(kind, &args, &matrix, &workload),
    }
}

/// `--cell`: one run in this process, figures as one JSON line on stdout.
fn run_cell(kind: &str, args: &BenchArgs, m: &Matrix, workload: &Workload) -> Exit {
    let (&[width], &[cap], &[latency]) = (&m.widths[..], &m.caps[..], &m.latencies[..]) else {
        return invalid(
            args,
            "--cell takes exactly one --width, --cap and --latency",
        );
    };
    let out = match kind {
        "floor" => {
            let spec = FloorSpec {
                width,
                cap,
                latency,
                fail: m.fail.as_ref().and_then(|s| s.index),
                hold: Duration::ZERO,
            };
            match Floor::new().and_then(|f| f.run_blocking(spec)) {
                Ok(r) => CellRun {
                    wall_us: micros(r.wall),
                    ok: r.joined == width,
                    peak_rss_kib: peak_rss_kib(),
                    cancel_latency_us: r.cancel_latency.map(micros),
                    cancelled: 0,
                },
                Err(e) => {
                    eprintln!("error: Session/RunAborted: {e}");
                    return Exit::RunFailed;
                }
            }
        }
        "runtime" => {
            let Some(dir) = &args.runs_dir else {
                return invalid(args, "--cell runtime needs --runs-dir");
            };
            let cell = RunCell {
                width,
                cap,
                latency,
                fail: m.fail.iter().cloned().collect(),
                hold: None,
            };
            match workload.run(&cell, dir) {
                Ok(r) => CellRun {
                    wall_us: micros(r.wall),
                    ok: r.ok(),
                    peak_rss_kib: peak_rss_kib(),
                    cancel_latency_us: r.cancel_latency.map(micros),
                    cancelled: r.cancelled,
                },
                Err(e) => {
                    eprintln!("error: Session/RunAborted: {e}");
                    return Exit::RunFailed;
                }
            }
        }
        other => {
            return invalid(
                args,
                &format!("--cell `{other}`: expected runtime or floor"),
            );
        }
    };
    match serde_json::to_string(&out) {
        Ok(line) => {
            println!("{line}");
            Exit::Ok
        }
        Err(e) => {
            eprintln!("error: Session/RunAborted: cannot serialize the cell: {e}");
            Exit::RunFailed
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// One cell's runs, runtime and floor.
#[derive(Debug, Clone)]
struct CellResult {
    width: usize,
    cap: usize,
    latency: Duration,
    runtime: Vec<CellRun>,
    floor: Vec<CellRun>,
}

fn run_matrix(args: &BenchArgs, m: &Matrix, workload: &Workload) -> Exit {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            eprintln!("error: Session/RunAborted: cannot find the troupe binary: {e}");
            return Exit::RunFailed;
        }
    };
    let runs = match tempfile::Builder::new().prefix("troupe-bench-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("error: Session/RunAborted: cannot create a runs folder: {e}");
            return Exit::RunFailed;
        }
    };
    let cells: Vec<(usize, usize, Duration)> = m
        .latencies
        .iter()
        .flat_map(|&l| {
            m.widths
                .iter()
                .flat_map(move |&w| m.caps.iter().map(move |&c| (w, c, l)))
        })
        .collect();
    let total = (cells.len() * m.repeat * 2) as u64;
    let bar = std::io::stderr().is_terminal().then(|| {
        let pb = indicatif::ProgressBar::with_draw_target(
            Some(total),
            indicatif::ProgressDrawTarget::stderr(),
        );
        let style = indicatif::ProgressStyle::with_template(
            "bench [{bar:30}] {pos}/{len} runs · {msg} ({elapsed})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
        .progress_chars("=> ");
        pb.set_style(style);
        pb
    });
    let mut results = Vec::new();
    for &(width, cap, latency) in &cells {
        let mut result = CellResult {
            width,
            cap,
            latency,
            runtime: Vec::new(),
            floor: Vec::new(),
        };
        for rep in 0..m.repeat {
            // Alternate floor and runtime so machine drift hits both.
            for kind in ["floor", "runtime"] {
                if let Some(pb) = &bar {
                    pb.set_message(format!(
                        "width {width} cap {cap} latency {} · {kind} {}/{}",
                        show_latency(latency),
                        rep + 1,
                        m.repeat
                    ));
                }
                // One folder per run, removed as soon as it is read unless
                // --keep-runs: a 100 000-sibling audit log is ~0.8 GB.
                let dir = runs.path().join(format!(
                    "w{width}-c{cap}-l{}us-{kind}-{}",
                    latency.as_micros(),
                    rep + 1
                ));
                let run = spawn_cell(&exe, args, m, kind, (width, cap, latency), &dir);
                if !args.keep_runs {
                    let _ = std::fs::remove_dir_all(&dir);
                }
                match run {
                    Ok(r) if kind == "floor" => result.floor.push(r),
                    Ok(r) => result.runtime.push(r),
                    Err(e) => {
                        if let Some(pb) = &bar {
                            pb.abandon();
                        }
                        eprintln!(
                            "error: Session/RunAborted: width {width} cap {cap} latency {}: {kind} run: {e}",
                            show_latency(latency)
                        );
                        return Exit::RunFailed;
                    }
                }
                if let Some(pb) = &bar {
                    pb.inc(1);
                }
            }
        }
        results.push(result);
    }
    if let Some(pb) = &bar {
        pb.finish_and_clear();
    }
    if args.keep_runs {
        let kept = runs.keep();
        eprintln!("audit logs kept in {}", kept.display());
    }
    let rows: Vec<Row> = results.iter().map(|r| Row::from_runs(r, m)).collect();
    if args.json {
        let value = json!({
            "pipeline": workload.pipeline.id,
            "repeat": m.repeat,
            "failSibling": args.fail_sibling,
            "workerTurns": WORKER_TURNS,
            "cpus": std::thread::available_parallelism().map(usize::from).unwrap_or(1),
            "cells": rows,
        });
        match serde_json::to_string_pretty(&value) {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: cannot serialize the results: {e}"),
        }
    } else {
        print!("{}", table(&workload.pipeline.id, m, &rows));
    }
    // A run that failed without --fail-sibling, or did not fail with it,
    // is a broken benchmark.
    if rows.iter().any(|r| !r.runtime_ok) {
        match &m.fail {
            None => eprintln!("error: a runtime run did not end ok; see the table"),
            Some(f) => eprintln!(
                "error: a runtime run ended ok: `{f}` never failed (is its index below every --width?)"
            ),
        }
        return Exit::RunFailed;
    }
    Exit::Ok
}

/// Runs `troupe bench --cell` for one run and reads its figures.
fn spawn_cell(
    exe: &Path,
    args: &BenchArgs,
    m: &Matrix,
    kind: &str,
    (width, cap, latency): (usize, usize, Duration),
    runs_dir: &Path,
) -> Result<CellRun, String> {
    let mut cmd = Command::new(exe);
    cmd.arg("bench")
        .arg(&args.pipeline)
        .args(["--cell", kind])
        .args(["--width", &width.to_string()])
        .args(["--cap", &cap.to_string()])
        .args([
            "--latency",
            &format!("{}ms", latency.as_micros() as f64 / 1000.0),
        ])
        .args(["--repeat", "1"])
        .arg("--runs-dir")
        .arg(runs_dir);
    if let Some(f) = &m.fail {
        cmd.args(["--fail-sibling", &f.to_string()]);
    }
    let out = cmd
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot start {}: {e}", exe.display()))?;
    if !out.status.success() {
        return Err(format!(
            "exited with {}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().last().unwrap_or("");
    serde_json::from_str(line).map_err(|e| format!("unreadable figures `{line}`: {e}"))
}

/// One table row: medians over the repeats.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
struct Row {
    width: usize,
    cap: usize,
    latency_ms: f64,
    runtime_ok: bool,
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
}

fn median(values: &mut [f64]) -> f64 {
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
    fn from_runs(r: &CellResult, m: &Matrix) -> Row {
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
        }
    }
}

fn table(pipeline: &str, m: &Matrix, rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "troupe bench {pipeline}: median of {} run(s) per cell, each run in its own process; floor = plain tokio",
        m.repeat
    );
    let with_cancel = m.fail.is_some();
    let _ = write!(
        out,
        "{:>7} {:>5} {:>7} {:>11} {:>11} {:>9} {:>8} {:>8} {:>9} {:>9}",
        "width",
        "cap",
        "latency",
        "wall ms",
        "floor ms",
        "µs/sib",
        "×floor",
        "×ideal",
        "RSS MiB",
        "RSS×floor"
    );
    if with_cancel {
        let _ = write!(out, " {:>10} {:>9}", "cancel ms", "cancelled");
    }
    let _ = writeln!(out);
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_owned(), |v| format!("{v:.prec$}"));
    for r in rows {
        let _ = write!(
            out,
            "{:>7} {:>5} {:>7} {:>11.1} {:>11.1} {:>9.1} {:>8.2} {:>8} {:>9} {:>9}",
            r.width,
            r.cap,
            show_latency(Duration::from_secs_f64(r.latency_ms / 1000.0)),
            r.runtime_wall_ms,
            r.floor_wall_ms,
            r.per_sibling_us,
            r.ratio_to_floor,
            opt(r.ratio_to_ideal, 3),
            opt(r.peak_rss_kib.map(|k| k as f64 / 1024.0), 1),
            opt(r.rss_ratio_to_floor, 2),
        );
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
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(width: &str, cap: &str, latency: &str, repeat: &str) -> BenchArgs {
        BenchArgs {
            pipeline: PathBuf::from("stages/fanout"),
            width: width.to_owned(),
            cap: cap.to_owned(),
            latency: latency.to_owned(),
            repeat: repeat.to_owned(),
            fail_sibling: None,
            json: false,
            keep_runs: false,
            cell: None,
            runs_dir: None,
        }
    }

    #[test]
    fn the_matrix_parses_every_list() {
        let m = parse_matrix(&args("100,1000,10000", "16,256", "0ms,50ms", "5")).unwrap();
        assert_eq!(m.widths, vec![100, 1000, 10_000]);
        assert_eq!(m.caps, vec![16, 256]);
        assert_eq!(m.latencies, vec![Duration::ZERO, Duration::from_millis(50)]);
        assert_eq!(m.repeat, 5);
    }

    #[test]
    fn bad_matrix_flags_name_the_flag() {
        for (a, flag) in [
            (args("0", "16", "0ms", "1"), "--width"),
            (args("10", "x", "0ms", "1"), "--cap"),
            (args("10", "16", "50", "1"), "--latency"),
            (args("10", "16", "0ms", "0"), "--repeat"),
        ] {
            let e = parse_matrix(&a).unwrap_err();
            assert!(e.starts_with(flag), "{e}");
        }
    }

    #[test]
    fn medians_of_odd_and_even_counts() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 2.0, 3.0]), 2.5);
    }
}
