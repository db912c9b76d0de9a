//! Soak: the bundled `fanout` pipeline run again and again in one process,
//! on one actix system, with its audit log written to a file each time —
//! as a long-lived `troupe worker` or a library user runs many runs. After
//! a warm-up, memory must not grow with the number of runs, and every run
//! must give back what it took: its threads (the audit writer's, the
//! arbiters') and its file descriptors (the audit log), and every run must
//! end with its executions all ended.
//!
//! `soak_small` runs in the normal suite; `soak_thousand` (1 000 runs of
//! 200 siblings) is ignored by default: `cargo test --test soak -- --ignored`.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use troupe::definition::{Pipeline, load_pipeline};
use troupe::provider::Provider;
use troupe::provider::script::Script;
use troupe::provider::scripted::ScriptedProvider;
use troupe::runtime::audit::start_audit_log;
use troupe::runtime::launch::start_run;
use troupe::runtime::spec::RunSpec;
use troupe::runtime::summary::RunStatus;

fn fanout() -> (Arc<Pipeline>, Arc<dyn Provider>) {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let pipeline = Arc::new(load_pipeline(&dir).unwrap());
    let script = Script::load(&dir.join("script.yaml"), &pipeline).unwrap();
    let provider: Arc<dyn Provider> = Arc::new(ScriptedProvider::new(script));
    (pipeline, provider)
}

/// What this process holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Held {
    rss_kib: u64,
    threads: usize,
    fds: usize,
}

fn held() -> Held {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let rss_kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let count = |dir: &str| std::fs::read_dir(dir).unwrap().count();
    Held {
        rss_kib,
        threads: count("/proc/self/task"),
        fds: count("/proc/self/fd"),
    }
}

/// Runs `fanout` `runs` times, `width` siblings each, on one actix system;
/// returns what the process held after `warm_up` runs and at the end.
fn soak(runs: usize, warm_up: usize, width: u64) -> (Held, Held) {
    let (pipeline, provider) = fanout();
    let logs = tempfile::tempdir().unwrap();
    let system = actix::System::new();
    let threads = held().threads;
    let mut after_warm_up = None;
    for i in 0..runs {
        if i == warm_up {
            after_warm_up = Some(settled(threads));
        }
        let report = system.block_on(one_run(&pipeline, &provider, logs.path(), width));
        assert_eq!(report, RunStatus::Ok, "run {i}");
    }
    (after_warm_up.unwrap(), settled(threads))
}

async fn one_run(
    pipeline: &Arc<Pipeline>,
    provider: &Arc<dyn Provider>,
    logs: &Path,
    width: u64,
) -> RunStatus {
    let mut fields = Map::new();
    fields.insert("width".to_owned(), Value::from(width));
    let mut spec = RunSpec::new(Arc::clone(pipeline), fields, Arc::clone(provider), Some(16));
    let log = logs.join("audit.jsonl");
    let sink = start_audit_log(&spec.bus, &log).unwrap();
    spec.settings = Arc::new(troupe::runtime::stage::RunSettings {
        threads: 2,
        ..Default::default()
    });
    let (_session, done) = start_run(spec, vec![sink]);
    let report = done.await.unwrap();
    // The log is whole: every execution entered has ended, and the run's
    // last line is its exit.
    let text = std::fs::read_to_string(&log).unwrap();
    let entered = text.matches("\"event\":\"StageEntered\"").count();
    let ended = text.matches("\"event\":\"StageExited\"").count()
        + text.matches("\"event\":\"StageCancelled\"").count();
    assert_eq!(entered, ended);
    assert_eq!(entered as u64, width + 2);
    assert!(
        text.lines()
            .last()
            .unwrap()
            .contains("\"event\":\"WorkflowExit\"")
    );
    std::fs::remove_file(&log).unwrap();
    report.status
}

/// What the process holds once the last run's arbiter threads, stopped
/// when the run ended, are gone (they exit on their own, just after the
/// report): waits until no more than `threads` run, for up to ten seconds,
/// then returns what is there (and the check fails).
fn settled(threads: usize) -> Held {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        let now = held();
        if now.threads <= threads || std::time::Instant::now() > deadline {
            return now;
        }
        std::thread::yield_now();
    }
}

fn check(warm: Held, end: Held, runs: usize, max_growth_kib: u64) {
    assert_eq!(end.threads, warm.threads, "threads left behind");
    assert_eq!(end.fds, warm.fds, "file descriptors left behind");
    let growth = end.rss_kib.saturating_sub(warm.rss_kib);
    assert!(
        growth <= max_growth_kib,
        "resident memory grew by {growth} KiB over {runs} runs ({warm:?} → {end:?})"
    );
}

#[test]
fn soak_small() {
    // 80 runs after 20 to warm up: a leak of even 100 KiB a run (one
    // event queue, one run's results) would show as 8 MiB.
    let (warm, end) = soak(100, 20, 50);
    check(warm, end, 80, 4 * 1024);
}

#[test]
#[ignore = "a thousand runs: cargo test --release --test soak -- --ignored"]
fn soak_thousand() {
    let (warm, end) = soak(1_000, 50, 200);
    check(warm, end, 950, 8 * 1024);
}
