//! A worker that holds a task for its own slot, end to end through
//! `troupe run --nats` and `troupe worker` on a real `nats-server`: the
//! held task goes to another worker as soon as that one waits for a task
//! the queue does not have (`taking::another_waits`, asked by the hold).
//! The hold and the look have tests of their own (`distributed_batches`,
//! `distributed::taking`); this one drives the worker's own wiring of
//! them.
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

use std::collections::BTreeMap;

use harness::*;

/// Twenty siblings under a cap of twenty, each waiting until all twenty
/// have started (for a minute or so at most). The coordinator publishes
/// them as two messages, sixteen and four, before any worker runs.
///
/// Worker `a`, with one slot, starts alone. It takes one task of the
/// first message; the queue still holds the second, so it holds one more
/// for its slot (all its room) and puts the other fourteen back. Its
/// slot frees only once all twenty have started, so the held task can
/// start only elsewhere. Worker `b` (nineteen slots) starts next, takes
/// the rest, and waits for one more task on an empty queue. `a`'s hold
/// sees it waiting and puts the task back, and `b` runs it.
///
/// A worker whose hold did not look would keep the task for a third of
/// the lease (200 s here): the siblings would give up waiting, and the
/// run would not end within the harness's wait.
#[test]
fn a_held_task_goes_to_the_worker_that_waits_for_one() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let url = server.url();
    let fixture = pipeline(
        "for i in $(seq 3000); do\n  if [ \"$(wc -l < started)\" -ge 20 ]; then echo all >> together; break; fi\n  sleep 0.02\ndone",
        None,
    );
    let project = Project::new();
    let lease = ["--nats-lease", "600s"];
    let run = Background::start(
        project
            .run(fixture.path(), &url)
            .args(["--ctx", "width=20", "--parallel-cap", "20", "--json"])
            .args(lease),
    );
    // Both messages stored before any worker fetches: the stream read on
    // one connection until it holds them.
    let args = nats_args(&url);
    actix::System::new().block_on(async move {
        let nats = args.connect("task count").await.unwrap();
        let mut tasks = nats.tasks().await.unwrap();
        let stored = tokio::time::timeout(WAIT, async {
            while tasks.info().await.unwrap().state.last_sequence < 2 {
                tokio::task::yield_now().await;
            }
        });
        assert!(stored.await.is_ok(), "the two task messages never came");
    });
    let one = ["--max-siblings", "1", lease[0], lease[1]];
    let _a = Worker::start(fixture.path(), &url, "a", project.root(), &one);
    project.wait_started(1);
    let nineteen = ["--max-siblings", "19", lease[0], lease[1]];
    let _b = Worker::start(fixture.path(), &url, "b", project.root(), &nineteen);
    let (status, out) = run.finish();
    assert!(status.success(), "{out}");
    let together = std::fs::read_to_string(project.root().join("together")).unwrap_or_default();
    assert_eq!(
        together.lines().count(),
        20,
        "every sibling saw all twenty started"
    );
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    let events = audit(&s);
    check_log(&events, 20);
    let per_worker = siblings_per_worker(&events);
    let expected = BTreeMap::from([("a".to_owned(), 1), ("b".to_owned(), 19)]);
    assert_eq!(per_worker, expected, "the held task ran on b");
}
