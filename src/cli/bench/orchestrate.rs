//! `troupe bench`'s orchestration: every run of the matrix in a child
//! process of its own (`--cell`), so the process-wide, only-growing peak
//! RSS (`VmHWM`) is that run's alone; the floor and the runtime children
//! alternate within one invocation so drift on a shared machine hits both
//! alike.

use std::io::IsTerminal;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::args::{BenchArgs, Matrix, invalid, parse_matrix};
use super::cell::{CellResult, CellRun};
use super::render::{Row, table, with_speedups};
use crate::bench::WORKER_TURNS;
use crate::bench::floor::{Floor, FloorSpec};
use crate::bench::matrix::show_latency;
use crate::bench::rss::peak_rss_kib;
use crate::bench::runner::{RunCell, RunnerError, Workload};
use crate::cli::Exit;
use crate::cli::validate::print_diagnostics;

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
    let (&[width], &[cap], &[latency], &[threads], &[store]) = (
        &m.widths[..],
        &m.caps[..],
        &m.latencies[..],
        &m.threads[..],
        &m.stores[..],
    ) else {
        return invalid(
            args,
            "--cell takes exactly one --width, --cap, --latency, --threads and --store",
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
                    say!("error: Session/RunAborted: {e}");
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
                threads,
                store,
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
                    say!("error: Session/RunAborted: {e}");
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
            tell!("{line}");
            Exit::Ok
        }
        Err(e) => {
            say!("error: Session/RunAborted: cannot serialize the cell: {e}");
            Exit::RunFailed
        }
    }
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn run_matrix(args: &BenchArgs, m: &Matrix, workload: &Workload) -> Exit {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            say!("error: Session/RunAborted: cannot find the troupe binary: {e}");
            return Exit::RunFailed;
        }
    };
    let runs = match tempfile::Builder::new().prefix("troupe-bench-").tempdir() {
        Ok(d) => d,
        Err(e) => {
            say!("error: Session/RunAborted: cannot create a runs folder: {e}");
            return Exit::RunFailed;
        }
    };
    let mut cells: Vec<(usize, usize, Duration, usize, bool)> = Vec::new();
    for &l in &m.latencies {
        for &w in &m.widths {
            for &c in &m.caps {
                for &t in &m.threads {
                    for &s in &m.stores {
                        cells.push((w, c, l, t, s));
                    }
                }
            }
        }
    }
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
    for &(width, cap, latency, threads, store) in &cells {
        let mut result = CellResult {
            width,
            cap,
            latency,
            threads,
            store,
            runtime: Vec::new(),
            floor: Vec::new(),
        };
        for rep in 0..m.repeat {
            // Alternate floor and runtime so machine drift hits both.
            for kind in ["floor", "runtime"] {
                if let Some(pb) = &bar {
                    pb.set_message(format!(
                        "width {width} cap {cap} latency {} threads {threads} store {} · {kind} {}/{}",
                        show_latency(latency),
                        if store { "on" } else { "off" },
                        rep + 1,
                        m.repeat
                    ));
                }
                // One folder per run, removed as soon as it is read unless
                // --keep-runs: a 100 000-sibling audit log is ~0.8 GB.
                let dir = runs.path().join(format!(
                    "w{width}-c{cap}-l{}us-t{threads}-s{}-{kind}-{}",
                    latency.as_micros(),
                    u8::from(store),
                    rep + 1
                ));
                let run = spawn_cell(
                    &exe,
                    args,
                    m,
                    kind,
                    (width, cap, latency, threads, store),
                    &dir,
                );
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
                        say!(
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
        say!("audit logs kept in {}", kept.display());
    }
    let mut rows: Vec<Row> = results.iter().map(|r| Row::from_runs(r, m)).collect();
    with_speedups(&mut rows);
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
            Ok(s) => tell!("{s}"),
            Err(e) => say!("error: cannot serialize the results: {e}"),
        }
    } else {
        tell!(@raw "{}", table(&workload.pipeline.id, m, &rows));
    }
    // A run that failed without --fail-sibling, or did not fail with it,
    // is a broken benchmark.
    if rows.iter().any(|r| !r.runtime_ok) {
        match &m.fail {
            None => say!("error: a runtime run did not end ok; see the table"),
            Some(f) => say!(
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
    (width, cap, latency, threads, store): (usize, usize, Duration, usize, bool),
    runs_dir: &Path,
) -> Result<CellRun, String> {
    let mut cmd = Command::new(exe);
    // The environment troupe was started with (a cell seals itself).
    cmd.env_clear().envs(crate::environ::vars_os());
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
        .args(["--threads", &threads.to_string()])
        .args(["--store", if store { "on" } else { "off" }])
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
