//! Distributed runs that lose a part mid-run, through the real binary on
//! a real `nats-server` (JetStream), each process its own:
//!
//! - A worker killed with SIGKILL: its siblings run again elsewhere once
//!   their lease runs out, and each still exits once in the log.
//! - A three-server cluster losing a server mid-fan-out still finishes.
//! - The run's reports can no longer be read (its consumer deleted under
//!   it): the run ends failed with `Distributed/Unreachable` instead of
//!   waiting for reports that cannot come.
//!
//! The harness, and how the tests wait without sleeping, are those of
//! `distributed.rs`.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
// Shared with `distributed.rs`; this binary uses part of it.
#[allow(dead_code)]
#[path = "distributed/harness.rs"]
mod harness;

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;

use futures::TryStreamExt;
use harness::*;
use serde_json::Value;

#[test]
fn a_killed_workers_siblings_run_again_on_another_and_exit_once() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("while [ ! -e go ]; do sleep 0.02; done", None);
    let project = Project::new();
    let lease = ["--max-siblings", "2", "--nats-lease", "2s"];
    let mut doomed = Worker::start(
        fixture.path(),
        &server.url(),
        "doomed",
        project.root(),
        &lease,
    );
    let _survivor = Worker::start(
        fixture.path(),
        &server.url(),
        "survivor",
        project.root(),
        &lease,
    );
    let coordinator = Background::start(project.run(fixture.path(), &server.url()).args([
        "--ctx",
        "width=10",
        "--json",
        "--nats-lease",
        "2s",
    ]));
    // Four in flight, two on each worker; one dies holding two.
    project.wait_started(4);
    doomed.process.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = doomed.process.wait();
    project.release();
    let (status, out) = coordinator.finish();
    assert!(status.success(), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    let events = audit(&s);
    check_log(&events, 4);
    let exited: Vec<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exited.len(), 10);
    assert_eq!(exited.iter().collect::<BTreeSet<_>>().len(), 10);
    let redelivered: BTreeSet<String> = named(&events, "SiblingRedelivered").map(label).collect();
    assert_eq!(redelivered.len(), 2, "{redelivered:?}");
    // The two the dead worker held started twice, the rest once.
    let mut runs: HashMap<u64, usize> = HashMap::new();
    for item in project.started() {
        *runs.entry(item).or_default() += 1;
    }
    let twice: BTreeSet<String> = runs
        .iter()
        .filter(|(_, n)| **n == 2)
        .map(|(i, _)| format!("worker#{i}/1"))
        .collect();
    assert_eq!(twice, redelivered);
    assert!(
        runs.values().all(|n| *n <= 2) && runs.len() == 10,
        "{runs:?}"
    );
}

#[test]
fn a_cluster_that_loses_a_server_mid_fan_out_finishes_the_run() {
    let Some(bin) = nats_server() else { return };
    let mut servers = Server::cluster(&bin);
    let urls = servers
        .iter()
        .map(Server::url)
        .collect::<Vec<_>>()
        .join(",");
    let fixture = pipeline("while [ ! -e go ]; do sleep 0.02; done", None);
    let project = Project::new();
    let mut workers = Worker::several(
        2,
        fixture.path(),
        &urls,
        project.root(),
        &["--max-siblings", "2", "--nats-replicas", "3"],
    );
    let mut child = project
        .run(fixture.path(), &urls)
        .args(["--ctx", "width=12", "--json", "--nats-replicas", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = Lines::of(child.stdout.take().unwrap(), "coordinator");
    let mut stderr = Lines::of(child.stderr.take().unwrap(), "coordinator's stderr");
    let mut coordinator = Owned { child };
    project.wait_started_or(4, || {
        let mut text = stderr.so_far();
        for w in &mut workers {
            text += &format!("\n{}\n{}", w.tasks.so_far(), w.stderr.so_far());
        }
        for s in &mut servers {
            text += &format!("\n{}", s.log.so_far());
        }
        text
    });
    // One of three gone: the streams keep a quorum of two.
    servers[0].process.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = servers[0].process.wait();
    project.release();
    let status = coordinator.wait();
    let mut stdout = stdout;
    let out = stdout.rest().join("\n");
    assert!(status.success(), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    let events = audit(&s);
    check_log(&events, 4);
    let exits: BTreeSet<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exits.len(), 12);
}

/// The run's report consumer deleted under a running fan-out: the
/// coordinator will hear from no worker again. The run ends, failed with
/// `Distributed/Unreachable`, rather than waiting for reports that cannot
/// come: the siblings whose tasks went out are counted cancelled, and any
/// the scheduler spawns after are counted never started.
#[test]
fn a_run_whose_reports_can_no_longer_be_read_ends_instead_of_waiting() {
    let Some(bin) = nats_server() else { return };
    let held = Held::start(&bin, 8);
    let (server, project, coordinator) = (&held.server, &held.project, held.coordinator);
    // Two in flight on the worker, held there until `go`.
    project.wait_started(2);
    let url = server.url();
    actix::System::new().block_on(async move {
        let nats = nats_args(&url).connect("fault test").await.unwrap();
        let reports = nats.reports().await.unwrap();
        let names: Vec<String> = reports.consumer_names().try_collect().await.unwrap();
        assert_eq!(names.len(), 1, "the run's one report consumer: {names:?}");
        for name in names {
            reports.delete_consumer(&name).await.unwrap();
        }
    });
    let (status, out) = coordinator.finish();
    project.release();
    assert_eq!(status.code(), Some(1), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(s["status"], "failed");
    let reason = s["reason"].as_str().unwrap();
    assert!(reason.contains("Distributed/Unreachable"), "{reason}");
    let events = audit(&s);
    assert!(
        named(&events, "StageEntered").all(|e| label(e) != "reduce/1"),
        "the join ran"
    );
    assert!(project.started().len() <= 2, "{:?}", project.started());
}

/// A group's cancel is broadcast once; a worker that missed it (it was
/// reconnecting) still finds the group's cancelled mark, which it reads
/// again while siblings of the group run there: they are cancelled, and
/// the run ends rather than waiting on them. (Here the mark is put with
/// no broadcast at all.)
#[test]
fn a_worker_that_missed_a_cancel_finds_the_groups_mark() {
    let Some(bin) = nats_server() else { return };
    let held = Held::start(&bin, 4);
    let (server, project, coordinator) = (&held.server, &held.project, held.coordinator);
    // Two in flight on the worker, held there until `go` (never made).
    project.wait_started(2);
    let run_id = std::fs::read_dir(project.runs())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|name| !name.starts_with('.'))
        .unwrap();
    let url = server.url();
    actix::System::new().block_on(async move {
        let nats = nats_args(&url).connect("fault test").await.unwrap();
        let marks = nats.cancelled().await.unwrap();
        // The fan-out's turn is one of the first few.
        for turn in 0..5 {
            let key = troupe::distributed::wire::cancelled_key(&run_id, turn);
            marks
                .put(key, "cancelled by the test".into())
                .await
                .unwrap();
        }
    });
    let (status, out) = coordinator.finish();
    assert_ne!(status.code(), Some(0), "{out}");
    assert_eq!(project.started().len(), 2, "{:?}", project.started());
}

/// A fan-out `width` wide whose siblings wait for `go` (never made unless
/// the test makes it), cap 2, on one worker with two slots.
struct Held {
    server: Server,
    project: Project,
    _fixture: common::Fixture,
    _worker: Worker,
    coordinator: Background,
}

impl Held {
    fn start(bin: &std::path::Path, width: usize) -> Held {
        let server = Server::start(bin);
        let fixture = pipeline("while [ ! -e go ]; do sleep 0.02; done", None);
        let project = Project::new();
        let worker = Worker::start(
            fixture.path(),
            &server.url(),
            "w",
            project.root(),
            &["--max-siblings", "2"],
        );
        let width = format!("width={width}");
        let coordinator = Background::start(project.run(fixture.path(), &server.url()).args([
            "--ctx",
            &width,
            "--parallel-cap",
            "2",
            "--json",
        ]));
        Held {
            server,
            project,
            _fixture: fixture,
            _worker: worker,
            coordinator,
        }
    }
}

/// A worker whose NATS server is gone for good gives up after
/// `--nats-lost-after` and exits 2 (`Distributed/Unreachable`), instead
/// of reconnecting for ever while serving nothing.
#[test]
fn a_worker_that_lost_its_server_exits_2() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let mut worker = Worker::start(
        fixture.path(),
        &server.url(),
        "alone",
        project.root(),
        &["--nats-lost-after", "2s"],
    );
    // Serving (a run's siblings went through it), then the server goes.
    let (status, out) = Background::start(
        project
            .run(fixture.path(), &server.url())
            .args(["--ctx", "width=2", "--json"]),
    )
    .finish();
    assert_eq!(status.code(), Some(0), "{out}");
    drop(server);
    let status = worker.process.wait();
    assert_eq!(status.code(), Some(2), "{}", worker.stderr.so_far());
    let said = worker.stderr.wait_for(
        |l| l.contains("Distributed/Unreachable"),
        "saying why it exits",
    );
    assert!(said.contains("lost the NATS server"), "{said}");
}

/// `troupe worker --json` prints a start-up failure to reach NATS as the
/// JSON error every other start-up error is, on stdout.
#[test]
fn a_worker_that_cannot_reach_nats_says_so_in_json() {
    let fixture = pipeline("true", None);
    let project = Project::new();
    let url = format!("nats://127.0.0.1:{}", free_port());
    let out = troupe()
        .arg("worker")
        .arg(fixture.path())
        .args(["--nats", &url, "--json", "--root"])
        .arg(project.root())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    });
    assert_eq!(v["code"], "Distributed/Unreachable", "{v}");
}
