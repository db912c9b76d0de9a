//! Distributed runs through the real binary on a real `nats-server`
//! (JetStream): a coordinator (`troupe run --nats`) and workers
//! (`troupe worker`), each its own process.
//!
//! - Three workers give the same results as one process, under the cap.
//! - Fail-fast reaches every worker: the siblings in flight on both are
//!   cancelled (their shell processes gone), nothing past the cap starts,
//!   the join never runs.
//! - The coordinator killed with SIGKILL, then `troupe resume --nats`:
//!   no finished sibling runs again, the log's `seq` goes on unbroken.
//! - A worker whose copy of the pipeline differs refuses the task.
//! - A sibling working longer than its lease is kept alive by progress
//!   acks, not delivered to another worker.
//! - The run's token budget counts what the workers report and stops
//!   the run across machines.
//! - No server at the URL: a typed error, exit 2, nothing runs.
//! - A server that wants a user and password: the wrong password is a
//!   typed error, the right one (from the environment) runs, and the
//!   password is nowhere in the run's log.
//! - A group's context is read once by the tasks that ask at once, and
//!   let go once idle.
//!
//! Faults that take a part away mid-run (a worker, a server, the run's
//! reports) are in `distributed_faults.rs`; tasks and reports that
//! travel together in `distributed_batches.rs`.
//!
//! The server comes from `TROUPE_NATS_SERVER` or `nats-server` on PATH;
//! without one the tests say so and pass, unless `TROUPE_REQUIRE_NATS` is
//! set (CI installs one, see `.ci/run`), when they fail.
//!
//! Nothing here sleeps to let something happen: the tests wait on what
//! the processes print (the server's "ready", a worker's task log, the
//! coordinator's event stream) and on files the stages' shell commands
//! write, each wait bounded by [`WAIT`] so a bug fails instead of hanging.
//! The pipelines' shell commands poll for a release file; that is the
//! stage's work, not the test's timing.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
// Shared with `distributed_faults.rs`; each binary uses part of it.
#[allow(dead_code)]
#[path = "distributed/harness.rs"]
mod harness;
#[path = "distributed/resume.rs"]
mod resume;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::process::Stdio;
use std::time::{Duration, Instant};

use harness::*;
use resume::resume;
use serde_json::Value;

#[test]
fn three_workers_give_the_results_one_process_gives_under_the_cap() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let workers = Worker::several(
        3,
        fixture.path(),
        &server.url(),
        project.root(),
        &["--max-siblings", "2"],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=24", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let remote = summary(&out);
    let events = audit(&remote);
    check_log(&events, 4);
    let ran_on: BTreeSet<&str> = named(&events, "StageEntered")
        .filter_map(|e| e["worker"].as_str())
        .collect();
    assert!(!ran_on.is_empty());
    assert!(
        ran_on
            .iter()
            .all(|w| workers.iter().any(|worker| worker.name == *w))
    );
    assert_eq!(
        named(&events, "StageEntered")
            .filter(|e| is_sibling(e))
            .count(),
        24
    );

    // The same pipeline in one process.
    let local_project = Project::new();
    let out = troupe()
        .arg("run")
        .arg(fixture.path())
        .args(["--ctx", "width=24", "--json", "--runs-dir"])
        .arg(local_project.runs())
        .arg("--root")
        .arg(local_project.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let local = summary(&out);
    assert_eq!(remote["stages"], local["stages"]);
    nothing_left_on_the_server(&server.url(), remote["runId"].as_str().unwrap());
    assert_eq!(
        results(&project, remote["runId"].as_str().unwrap()),
        results(&local_project, local["runId"].as_str().unwrap())
    );
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(
        started,
        (0..24).collect::<Vec<_>>(),
        "each sibling ran once"
    );

    // SIGTERM drains a worker: with nothing in flight it exits at once,
    // saying what it ran; together they ran every sibling.
    let mut finished = 0;
    for mut worker in workers {
        worker.process.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(worker.process.wait().success(), "{}", worker.name);
        let line = worker
            .stderr
            .find(|l| l.contains("siblings finished"), "its summary");
        finished += line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{line}"));
    }
    assert_eq!(finished, 24);
}

#[test]
fn a_failed_sibling_cancels_the_siblings_in_flight_on_every_worker() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let project = Project::new();
    // In the command line of every shell the siblings start.
    let marker = format!("troupe-test-{}", project.root().display());
    let fixture = pipeline(
        &format!("while true; do sleep 0.05; done # {marker}"),
        Some((
            3,
            "until [ \"$(wc -l < started)\" -ge 4 ]; do sleep 0.02; done",
        )),
    );
    // Two workers of two: the cap's four siblings are two on each.
    let mut workers = Worker::several(
        2,
        fixture.path(),
        &server.url(),
        project.root(),
        &["--max-siblings", "2"],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=40", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["status"], "failed");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("ParallelSiblingFailure") && reason.contains("worker#3"),
        "{reason}"
    );
    let events = audit(&s);
    check_log(&events, 4);
    // Exactly the cap's four started; the other three were cancelled.
    let entered: BTreeMap<String, String> = named(&events, "StageEntered")
        .filter(|e| is_sibling(e))
        .map(|e| (label(e), e["worker"].as_str().unwrap().to_owned()))
        .collect();
    let expected: BTreeSet<String> = (0..4).map(|i| format!("worker#{i}/1")).collect();
    assert_eq!(entered.keys().cloned().collect::<BTreeSet<_>>(), expected);
    let cancelled: BTreeSet<String> = named(&events, "StageCancelled").map(label).collect();
    assert_eq!(cancelled, (0..3).map(|i| format!("worker#{i}/1")).collect());
    // The store has them as a local run's: with the phase they were in,
    // why, and what they had used.
    let run_id = s["runId"].as_str().unwrap();
    let shown = troupe()
        .args(["runs", "show", run_id, "--json", "--runs-dir"])
        .arg(project.runs())
        .output()
        .unwrap();
    assert!(shown.status.success(), "{shown:?}");
    let shown: Value = serde_json::from_slice(&shown.stdout).unwrap();
    let stored: BTreeSet<String> = shown["executions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["outcome"] == "cancelled")
        .map(|e| {
            assert_eq!(e["phase"], "Act", "{e}");
            assert!(
                e["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("ParallelSiblingFailure")),
                "{e}"
            );
            assert!(e["usage"]["requests"].as_u64().unwrap() >= 1, "{e}");
            assert!(e["turn"].as_u64().unwrap() >= 1, "{e}");
            // Each was in its Bash call, which the record names.
            assert!(
                e["toolCalls"]
                    .as_array()
                    .is_some_and(|calls| calls.iter().any(|c| c["tool"] == "Bash")),
                "{e}"
            );
            let entered = e["enteredAt"].as_u64().expect("when it entered");
            assert!(entered <= e["endedAt"].as_u64().unwrap(), "{e}");
            label(e)
        })
        .collect();
    assert_eq!(stored, cancelled, "{shown}");
    let on: BTreeSet<&String> = entered.values().collect();
    assert_eq!(on.len(), 2, "the siblings ran on both workers: {entered:?}");
    assert!(
        named(&events, "StageEntered").all(|e| label(e) != "reduce/1"),
        "the join ran after a failure"
    );
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(started, vec![0, 1, 2, 3], "a sibling past the cap started");
    // A failed run may be resumed: its report consumer and its reports
    // stay on the server.
    kept_on_the_server(&server.url(), s["runId"].as_str().unwrap());
    // Each worker reported its cancelled siblings, and their shell
    // processes are gone.
    for w in &mut workers {
        for (id, on) in &entered {
            if on == &w.name && id != "worker#3/1" {
                let line = w.reported(&format!("/{id}"));
                assert_eq!(line["report"], "cancelled", "{line}");
            }
        }
    }
    let deadline = Instant::now() + WAIT;
    while !processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "shell processes of cancelled siblings outlived them: {:?}",
            processes_with(&marker)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_coordinator_resumes_without_running_a_finished_sibling_again() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    // Items below 6 finish at once; the rest wait for `go`.
    let fixture = pipeline(
        "if [ {{ctx.item}} -ge 6 ]; then while [ ! -e go ]; do sleep 0.02; done; fi",
        None,
    );
    let project = Project::new();
    let mut workers = Worker::several(
        2,
        fixture.path(),
        &server.url(),
        project.root(),
        &["--max-siblings", "2"],
    );
    let mut child = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=16", "--events", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stream = Lines::of(child.stdout.take().unwrap(), "coordinator");
    let mut coordinator = Owned { child };
    // Six siblings exited (stored: an exit is published after its
    // commit) and four wait on the workers.
    let mut run_id = String::new();
    for _ in 0..6 {
        let line = stream.wait_for(
            |l| {
                let e: Value = serde_json::from_str(l).unwrap_or_default();
                e["event"] == "StageExited" && is_sibling(&e)
            },
            "of a sibling's exit",
        );
        let e: Value = serde_json::from_str(&line).unwrap();
        run_id = e["workflowRunId"].as_str().unwrap().to_owned();
    }
    project.wait_started(10);
    coordinator.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = coordinator.wait();
    // The four finish with no coordinator; their reports wait in
    // JetStream for the resumed one.
    project.release();
    for w in &mut workers {
        // Each worker held two of the four: wait for both reports.
        let held = |l: &str| {
            let v: Value = serde_json::from_str(l).unwrap_or_default();
            v["report"] == "exited"
                && v["reported"] == true
                && v["stageExecutionId"]
                    .as_str()
                    .and_then(|id| id.split_once("worker#"))
                    .and_then(|(_, rest)| rest.split('/').next()?.parse::<u64>().ok())
                    .is_some_and(|item| item >= 6)
        };
        w.tasks.wait_for(held, "reporting a held sibling");
        w.tasks.wait_for(held, "reporting the other held sibling");
    }
    // Without --nats it is refused: it would run here what workers finished.
    let here = resume(&project, &run_id, None);
    let said = String::from_utf8_lossy(&here.stdout);
    assert!(
        here.status.code() == Some(2) && said.contains("DistributedRun"),
        "{here:?}"
    );
    let out = resume(&project, &run_id, Some(&server.url()));
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["status"], "ok");
    let events = audit(&s);
    // The resumed log repaired the killed session's tail and went on.
    check_log_allowing_lost(&events);
    let mut per_item: HashMap<u64, usize> = HashMap::new();
    for item in project.started() {
        *per_item.entry(item).or_default() += 1;
    }
    assert_eq!(per_item.len(), 16, "{per_item:?}");
    assert!(
        per_item.values().all(|n| *n == 1),
        "a finished sibling ran again after the resume: {per_item:?}"
    );
    let exits: Vec<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exits.len(), 16, "{exits:?}");
    assert_eq!(exits.iter().collect::<BTreeSet<_>>().len(), 16);
}

#[test]
fn a_worker_with_another_copy_of_the_pipeline_refuses_its_tasks() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    // The worker's copy: same id, one prompt changed.
    let theirs = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture.path()).unwrap().flatten() {
        std::fs::copy(entry.path(), theirs.path().join(entry.file_name())).unwrap();
    }
    let worker_md = theirs.path().join("worker.md");
    let changed = std::fs::read_to_string(&worker_md)
        .unwrap()
        .replace("Work on", "Toil on");
    std::fs::write(&worker_md, changed).unwrap();
    let mut worker = Worker::start(theirs.path(), &server.url(), "stale", project.root(), &[]);
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=3", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = summary(&out);
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("Distributed/PipelineMismatch") && reason.contains("stale"),
        "{reason}"
    );
    let line = worker.reported("");
    assert_eq!(line["report"], "refused");
    assert_eq!(line["code"], "Distributed/PipelineMismatch");
    assert!(project.started().is_empty(), "a refused task ran");
}

#[test]
fn a_server_with_a_password_refuses_the_wrong_one_and_never_sees_it_logged() {
    let Some(bin) = nats_server() else { return };
    let password = "s3cret-troupe-test-password";
    let extra = [
        "--user".to_owned(),
        "troupe".to_owned(),
        "--pass".to_owned(),
        password.to_owned(),
    ];
    let server = Server::spawn(&bin, &extra, "Server is ready");
    let fixture = pipeline("true", None);
    let project = Project::new();
    let auth = [
        "--nats-user",
        "troupe",
        "--nats-password-env",
        "TROUPE_TEST_NATS_PASSWORD",
    ];

    // The wrong password: a typed error, exit 2, nothing served.
    let out = troupe()
        .env("TROUPE_TEST_NATS_PASSWORD", "wrong")
        .arg("worker")
        .arg(fixture.path())
        .args(["--nats", &server.url()])
        .args(auth)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Distributed/Unauthorized"), "{stderr}");
    assert!(
        !stderr.contains("wrong"),
        "the password is not echoed: {stderr}"
    );

    // The right one, from the environment, on both sides.
    let _worker = Worker::start_with_env(
        fixture.path(),
        &server.url(),
        "authorized",
        project.root(),
        &auth,
        &[("TROUPE_TEST_NATS_PASSWORD", password)],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .env("TROUPE_TEST_NATS_PASSWORD", password)
        .args(auth)
        .args(["--ctx", "width=3", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    let events = audit(&s);
    check_log(&events, 4);
    let log = troupe::auditlog::read_text(std::path::Path::new(s["auditPath"].as_str().unwrap()))
        .unwrap();
    assert!(!log.contains(password));
    assert!(!String::from_utf8_lossy(&out.stderr).contains(password));
}

#[test]
fn no_server_at_the_url_is_a_typed_error_before_anything_runs() {
    let fixture = pipeline("true", None);
    let project = Project::new();
    let url = format!("nats://127.0.0.1:{}", free_port());
    let out = project
        .run(fixture.path(), &url)
        .args(["--ctx", "width=2", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let s: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["code"], "Distributed/Unreachable", "{s}");
    assert!(s["hint"].as_str().unwrap().contains("nats-server"), "{s}");
    assert!(
        project.started().is_empty(),
        "no sibling ran: {:?}",
        project.started()
    );
}

#[test]
fn a_sibling_that_outlives_its_lease_is_kept_alive_not_delivered_again() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    // Each sibling's work takes three leases; its worker's progress acks
    // (every third of the lease) keep the task its own.
    let fixture = pipeline("sleep 3", None);
    let project = Project::new();
    let lease = ["--max-siblings", "2", "--nats-lease", "1s"];
    let mut worker = Worker::start(
        fixture.path(),
        &server.url(),
        "slow",
        project.root(),
        &lease,
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=2", "--json", "--nats-lease", "1s"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let events = audit(&summary(&out));
    check_log(&events, 4);
    assert_eq!(named(&events, "SiblingRedelivered").count(), 0);
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(started, [0, 1], "each sibling ran once");
    for suffix in ["#0/1", "#1/1"] {
        let line = worker.reported(suffix);
        assert_eq!(line["report"], "exited", "{line}");
        assert_eq!(line["delivered"], 1, "{line}");
    }
}

#[test]
fn the_runs_token_budget_counts_what_workers_spend_and_stops_the_run() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let _worker = Worker::start(
        fixture.path(),
        &server.url(),
        "metered",
        project.root(),
        &["--max-siblings", "2"],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=60", "--parallel-cap", "2", "--json"])
        .args(["--max-tokens", "1500"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = summary(&out);
    let reason = s["reason"].as_str().unwrap();
    assert!(reason.contains("Budget/TokensExceeded"), "{reason}");
    let events = audit(&s);
    check_log(&events, 2);
    // Stopped by what the worker reported, long before the 60th sibling.
    let started = project.started();
    assert!(started.len() < 60, "{} siblings started", started.len());
    assert_eq!(
        named(&events, "StageEntered")
            .filter(|e| e["stageId"] == "reduce")
            .count(),
        0,
        "the join never runs"
    );
}

/// `--otlp` on a distributed run: the siblings the workers ran continue
/// the run's trace, under the coordinator's turn, with their tool calls
/// under them.
#[test]
fn distributed_siblings_continue_the_runs_trace() {
    use common::otlp::{Collector, attr, receiver};
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let _workers = Worker::several(2, fixture.path(), &server.url(), project.root(), &[]);
    let collector = receiver(Collector::Accepts);
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=6", "--json", "--otlp"])
        .arg(format!("http://{}", collector.addr))
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let run_id = summary(&out)["runId"].as_str().unwrap().to_owned();
    let trace = uuid::Uuid::parse_str(&run_id).unwrap().as_bytes().to_vec();
    let spans = collector.spans.lock().unwrap().clone();
    assert!(spans.iter().all(|s| s.trace_id == trace), "one trace");
    let by_id: HashMap<Vec<u8>, &opentelemetry_proto::tonic::trace::v1::Span> =
        spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    let siblings: Vec<_> = spans.iter().filter(|s| s.name == "stage worker").collect();
    assert_eq!(siblings.len(), 6);
    for s in &siblings {
        let parent = by_id[&s.parent_span_id];
        assert!(parent.name.starts_with("turn "), "{}", parent.name);
        assert_eq!(attr(s, "troupe.verdict").as_deref(), Some("ok"));
    }
    let calls: Vec<_> = spans
        .iter()
        .filter(|s| s.name == "execute_tool Bash")
        .collect();
    assert_eq!(calls.len(), 6, "each worker's Bash call, relayed");
    for c in &calls {
        assert_eq!(by_id[&c.parent_span_id].name, "stage worker");
    }
}

#[test]
fn a_group_context_past_the_servers_message_limit_is_stored_in_parts() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    // The plan's result carries 1.5 MB besides its items: the group's
    // context (its state slot holds that result) is past the server's
    // 1 MiB limit on a message. Letters that do not repeat, so that even
    // compressed it takes more than one part.
    let script = fixture.path().join("script.yaml");
    let text = std::fs::read_to_string(&script).unwrap();
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let pad: String = (0..1_500_000)
        .map(|_| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1);
            char::from(b"abcdefghijklmnopqrstuvwxyz0123456789"[(state >> 33) as usize % 36])
        })
        .collect();
    let padded = text.replacen(
        "$range: \"{{ctx.width}}\" } }",
        &format!("$range: \"{{{{ctx.width}}}}\" }}, pad: \"{pad}\" }}"),
        1,
    );
    assert_ne!(
        padded, text,
        "the plan's script line is where the test expects it"
    );
    std::fs::write(&script, padded).unwrap();
    let project = Project::new();
    let _workers = Worker::several(2, fixture.path(), &server.url(), project.root(), &[]);
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=6", "--json"])
        .output()
        .unwrap();
    let remote = summary(&out);
    // (The summary holds the 1.5 MB twice: only its verdict is shown.)
    assert!(out.status.success(), "{}", remote["reason"]);
    assert_eq!(remote["stages"]["worker"]["ok"], 6, "{}", remote["stages"]);
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(started, (0..6).collect::<Vec<_>>(), "each sibling ran once");
    // The parts went into the bucket, more than one of them, and went
    // with the rest once the run ended ok. The server is this test's
    // own: everything the bucket ever stored is this group's key and its
    // parts.
    let args = nats_args(&server.url());
    let (parts, left) = actix::System::new().block_on(async move {
        use troupe::distributed::wire::GROUPS_BUCKET;
        let nats = args.connect("parts test").await.unwrap();
        nats.groups().await.unwrap();
        let mut bucket = nats
            .js
            .get_stream(format!("KV_{GROUPS_BUCKET}"))
            .await
            .unwrap();
        let state = bucket.info().await.unwrap().state.clone();
        (state.last_sequence - 1, state.messages)
    });
    assert_eq!(left, 0, "the run's contexts are gone");
    assert!(parts >= 2, "{parts} parts stored");
}

#[test]
fn a_groups_context_is_read_once_by_the_tasks_that_ask_for_it_at_once() {
    use std::sync::Arc;
    use troupe::distributed::intake::Buckets;
    use troupe::distributed::stored_context;
    use troupe::distributed::wire::{GroupContext, group_key};

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("context test").await.unwrap();
        let (_consumer, cancelled, groups) = nats.worker_topology().await.unwrap();
        let buckets = Buckets::new(cancelled, groups.clone());
        let task = sample_task;
        // In parts (a small part size): each read is several round trips.
        let mut fields = serde_json::Map::new();
        let long: String = (0..200_000)
            .map(|i| char::from(b'a' + (i * 7 % 26) as u8))
            .collect();
        fields.insert("long".into(), Value::String(long));
        let context = GroupContext {
            fields: Arc::new(fields),
            slot: Arc::default(),
        };
        // A group's whole context, as the coordinator stores a small one.
        let whole = |turn| {
            let (groups, value) = (groups.clone(), serde_json::to_vec(&context).unwrap());
            async move { groups.put(group_key("run-1", turn), value.into()).await }
        };
        let stored = stored_context::encode(&group_key("run-1", 1), &context, 1).unwrap();
        assert!(stored.len() > 1, "stored in parts");
        for (key, value) in stored {
            groups.put(key, value.into()).await.unwrap();
        }
        // Eight tasks of the group accepted side by side get one read.
        let first = task(1);
        let read = futures::future::join_all((0..8).map(|_| buckets.context(&first))).await;
        let read: Vec<Arc<GroupContext>> = read.into_iter().map(Result::unwrap).collect();
        assert_eq!(*read[0], context);
        assert!(
            read.iter().all(|c| Arc::ptr_eq(c, &read[0])),
            "each task read the context again"
        );
        assert_eq!(buckets.loads(), 1, "one read for eight");
        // A later task has it from memory; another group is read anew.
        assert!(Arc::ptr_eq(
            &buckets.context(&first).await.unwrap(),
            &read[0]
        ));
        whole(2).await.unwrap();
        let other = buckets.context(&task(2)).await.unwrap();
        assert!(!Arc::ptr_eq(&other, &read[0]));
        assert_eq!(*other, context);
        assert_eq!(buckets.loads(), 2, "the first group from memory");
        // What is stored is no context: refused, and once it is mended
        // the next to ask reads again. (That callers who overlap a failing
        // read share it is not checked here: whether they overlap depends
        // on when the server answers.)
        groups
            .put(group_key("run-1", 3), "not a context".into())
            .await
            .unwrap();
        let third = task(3);
        assert!(buckets.context(&third).await.is_err());
        assert_eq!(buckets.loads(), 3);
        whole(3).await.unwrap();
        assert_eq!(*buckets.context(&third).await.unwrap(), context);
        assert_eq!(buckets.loads(), 4, "read again after the refusal");

        // A new group asked for once the others were idle for KEPT_IDLE
        // lets go of those no task holds: the first group is read again.
        // The second, held (as by a task in flight), is kept.
        use troupe::distributed::intake::KEPT_IDLE;
        let now = std::time::Instant::now();
        whole(4).await.unwrap();
        drop(read);
        let held = buckets.context_at(&first, now).await.unwrap();
        assert_eq!(buckets.loads(), 4, "still kept");
        drop(held);
        let later = now + KEPT_IDLE + Duration::from_secs(1);
        buckets.context_at(&task(4), later).await.unwrap();
        assert_eq!(buckets.loads(), 5);
        let again = buckets.context_at(&first, later).await.unwrap();
        assert_eq!(*again, context);
        assert_eq!(buckets.loads(), 6, "let go and read again");
        let kept = buckets.context_at(&task(2), later).await.unwrap();
        assert!(Arc::ptr_eq(&kept, &other), "held by a task: kept");
        assert_eq!(buckets.loads(), 6);

        // A task that lets go of its context (as one reports) makes it
        // idle from then, not from when it was asked for: a sibling that
        // ran longer than KEPT_IDLE does not cost the next one a read.
        whole(5).await.unwrap();
        whole(6).await.unwrap();
        let asked = std::time::Instant::now();
        drop(buckets.context_at(&task(5), asked).await.unwrap());
        assert_eq!(buckets.loads(), 7);
        let let_go = asked + KEPT_IDLE * 2;
        buckets.touch_at(&task(5), let_go);
        let soon = let_go + KEPT_IDLE / 2;
        buckets.context_at(&task(6), soon).await.unwrap();
        assert_eq!(buckets.loads(), 8);
        buckets.context_at(&task(5), soon).await.unwrap();
        assert_eq!(buckets.loads(), 8, "let go of lately: kept");
        // An idle worker's look lets go of the same, with no new group.
        buckets.forget_idle(soon + KEPT_IDLE);
        buckets
            .context_at(&task(5), soon + KEPT_IDLE)
            .await
            .unwrap();
        assert_eq!(buckets.loads(), 9, "let go while idle, read again");
    });
}

/// Fail-fast leaves the group's cancelled mark on the server; `troupe
/// resume` clears it, so the resumed group (same turn) runs and the run
/// finishes. (A worker that heard the cancel discounts it too:
/// `worker::tests`.)
#[test]
fn a_fan_out_cancelled_by_fail_fast_runs_again_on_resume() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let failing = Worker::start(
        fixture.path(),
        &server.url(),
        "w1",
        project.root(),
        &["--max-siblings", "2", "--fail-sibling", "worker#3"],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=8", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let run_id = summary(&out)["runId"].as_str().unwrap().to_owned();
    drop(failing);
    let _fresh = Worker::start(
        fixture.path(),
        &server.url(),
        "w3",
        project.root(),
        &["--max-siblings", "2"],
    );
    let out = resume(&project, &run_id, Some(&server.url()));
    assert!(out.status.success(), "{out:?}");
    assert_eq!(summary(&out)["status"], "ok");
}
