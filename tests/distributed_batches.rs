//! Tasks and reports that travel together on a real `nats-server`: a
//! message of the task queue holds the siblings the scheduler spawned
//! together, a worker takes from it only what its free slots can run and
//! puts the rest back on the queue, and a message is answered once, when
//! its last task is; a worker's reports go in batches, in order, framed
//! with their events' records for a coordinator that reads them.
//!
//! The server comes from `TROUPE_NATS_SERVER` or `nats-server` on PATH
//! (see `distributed.rs`). Nothing here sleeps to let something happen.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;
#[allow(dead_code)]
#[path = "distributed/harness.rs"]
mod harness;

use std::time::Duration;

use futures::StreamExt;
use harness::*;

/// Twelve siblings spawned at once over three workers of four slots,
/// each sibling waiting until all twelve have started: they can only
/// finish if no worker holds a task it has no slot for while another
/// worker has one free. Each worker runs four, each sibling once, and
/// the twelve tasks took fewer messages than tasks.
#[test]
fn a_worker_takes_what_its_slots_can_run_and_puts_the_rest_back() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    // Bounded, so that a broken build fails the assertions below rather
    // than hanging: all twelve started, or a minute passed.
    let fixture = pipeline(
        "for i in $(seq 3000); do [ \"$(wc -l < started)\" -ge 12 ] && break; sleep 0.02; done",
        None,
    );
    let project = Project::new();
    let workers = Worker::several(
        3,
        fixture.path(),
        &server.url(),
        project.root(),
        &["--max-siblings", "4"],
    );
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=12", "--parallel-cap", "12", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    let events = audit(&s);
    check_log(&events, 12);
    let per_worker = siblings_per_worker(&events);
    let names: Vec<&str> = workers.iter().map(|w| w.name.as_str()).collect();
    assert_eq!(
        per_worker,
        names.iter().map(|n| ((*n).to_owned(), 4)).collect(),
        "each worker ran what its slots could"
    );
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(
        started,
        (0..12).collect::<Vec<_>>(),
        "each sibling ran once"
    );
    assert_eq!(named(&events, "SiblingRedelivered").count(), 0);
    // Messages the task stream ever stored: the coordinator's and the
    // workers' put-backs. One a task would be twelve.
    let stored = task_messages(&server.url());
    assert!(stored < 12, "{stored} messages for 12 tasks");
    // What the put-backs recorded went with the run.
    nothing_left_on_the_server(&server.url(), s["runId"].as_str().unwrap());
}

/// A worker older than the coordinator reads one task a message; given
/// several it drops the message (`+TERM`), as anything it cannot read.
/// The coordinator hears of it (the consumer's advisory) and fails those
/// siblings with `Distributed/TaskUnreadable`: the run ends instead of
/// waiting for reports that cannot come.
#[test]
fn a_message_an_older_worker_cannot_read_fails_its_siblings_instead_of_waiting() {
    use async_nats::jetstream::AckKind;

    let Some(bin) = nats_server() else { return };
    let (failed, stand_in) = against_a_stand_in_worker(&bin, AckKind::Term);
    assert!(stand_in.unreadable > 0, "no message of several tasks came");
    for reason in failed {
        assert!(reason.starts_with("Distributed/TaskUnreadable"), "{reason}");
    }
}

/// A message no worker finishes: delivered as often as the consumer
/// allows (five times), each time handed back. The coordinator hears the
/// consumer's advisory and fails the message's siblings with
/// `Distributed/TaskAbandoned` rather than wait for them.
#[test]
fn a_message_delivered_as_often_as_allowed_fails_its_siblings() {
    use async_nats::jetstream::AckKind;

    let Some(bin) = nats_server() else { return };
    let (failed, stand_in) = against_a_stand_in_worker(&bin, AckKind::Nak(None));
    assert!(
        stand_in.answered >= 5,
        "delivered {} times",
        stand_in.answered
    );
    for reason in failed {
        assert!(reason.starts_with("Distributed/TaskAbandoned"), "{reason}");
    }
}

/// What a stand-in worker did: messages answered, and those among them
/// an older troupe could not read (several tasks).
struct StandIn {
    answered: usize,
    unreadable: usize,
}

/// A run of six siblings under cap 6 whose only worker is a stand-in on
/// the workers' shared consumer answering every message it is delivered
/// with `answer`, until the run is over. The run must end failed (exit
/// 1); the reasons its failed siblings give (at least one).
fn against_a_stand_in_worker(
    bin: &std::path::Path,
    answer: async_nats::jetstream::AckKind,
) -> (Vec<String>, StandIn) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    use troupe::distributed::wire::Task;

    let server = Server::start(bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let coordinator = Background::start(project.run(fixture.path(), &server.url()).args([
        "--ctx",
        "width=6",
        "--parallel-cap",
        "6",
        "--json",
    ]));
    let over = Arc::new(AtomicBool::new(false));
    let stand_in = {
        let (args, over) = (nats_args(&server.url()), Arc::clone(&over));
        std::thread::spawn(move || {
            actix::System::new().block_on(async move {
                let nats = args.connect("stand-in").await.unwrap();
                let consumer = nats.workers_consumer().await.unwrap();
                let mut did = StandIn {
                    answered: 0,
                    unreadable: 0,
                };
                while !over.load(Ordering::Acquire) {
                    let mut batch = consumer
                        .fetch()
                        .max_messages(16)
                        .expires(Duration::from_millis(200))
                        .messages()
                        .await
                        .unwrap();
                    while let Some(Ok(msg)) = batch.next().await {
                        if serde_json::from_slice::<Task>(&msg.payload).is_err() {
                            did.unreadable += 1;
                        }
                        msg.ack_with(answer).await.unwrap();
                        did.answered += 1;
                    }
                }
                did
            })
        })
    };
    let (status, out) = coordinator.finish();
    over.store(true, Ordering::Release);
    let did = stand_in.join().unwrap();
    assert_eq!(status.code(), Some(1), "{out}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    let failed: Vec<String> = named(&audit(&s), "StageExited")
        .filter(|e| is_sibling(e) && e["verdict"] == "fail")
        .map(|e| e["reason"].as_str().unwrap().to_owned())
        .collect();
    assert!(!failed.is_empty(), "no sibling failed");
    (failed, did)
}

/// Tasks 0..n of group 2 of `run-1`, as one message would hold them.
fn group_tasks(n: usize) -> Vec<troupe::distributed::wire::Task> {
    (0..n)
        .map(|unit| troupe::distributed::wire::Task {
            unit,
            stage_execution_id: format!("run-1/worker#{unit}/1"),
            ..sample_task(2)
        })
        .collect()
}

/// The answers published on `reply`, in order, each taken once a marker
/// published after it arrives (so none is missed and none is waited for).
struct Answers {
    client: async_nats::Client,
    reply: String,
    sub: async_nats::Subscriber,
    marks: usize,
}

impl Answers {
    async fn new(client: async_nats::Client, reply: &str) -> Answers {
        let sub = client.subscribe(reply.to_owned()).await.unwrap();
        client.flush().await.unwrap();
        Answers {
            client,
            reply: reply.to_owned(),
            sub,
            marks: 0,
        }
    }

    /// What was answered since the last call: a marker is published on
    /// the same connection after whatever the lease published, so it
    /// arrives after them.
    async fn since(&mut self) -> Vec<String> {
        self.marks += 1;
        let mark = format!("mark-{}", self.marks);
        self.client
            .publish(self.reply.clone(), mark.clone().into())
            .await
            .unwrap();
        let mut got = Vec::new();
        loop {
            let next = tokio::time::timeout(WAIT, self.sub.next()).await;
            let msg = next.expect("the marker arrives").unwrap();
            let text = String::from_utf8_lossy(&msg.payload).into_owned();
            if text == mark {
                return got;
            }
            got.push(text);
        }
    }
}

/// A message of three tasks is acknowledged once, after its third task is
/// settled; one task not reported hands the whole message back instead,
/// once the tasks that were reported are written down, so that its next
/// delivery runs only the others (with what was put back left out too);
/// settling past the last answers nothing more.
#[test]
fn a_message_is_answered_once_when_its_last_task_is_settled() {
    use troupe::distributed::lease::Lease;
    use troupe::distributed::taking::{Records, still_to_run};

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("lease test").await.unwrap();
        let groups = nats.groups().await.unwrap();
        // The lease is 30 s: no renewal comes within the test.
        assert!(nats.lease >= Duration::from_secs(30));
        let mut answers = Answers::new(nats.client.clone(), "lease.one").await;
        let lease = Lease::hold(&nats, "lease.one".into(), 1, 3, None);
        lease.settle("a", true).await;
        lease.settle("b", true).await;
        assert_eq!(answers.since().await, Vec::<String>::new(), "two of three");
        lease.settle("c", true).await;
        assert_eq!(answers.since().await, ["+ACK"]);
        lease.settle("c", true).await;
        lease.settle("c", false).await;
        assert_eq!(answers.since().await, Vec::<String>::new(), "once only");

        // A message of five tasks at stream sequence 7, its second
        // delivery: one put back, one not reported, three reported.
        let tasks = group_tasks(5);
        let id = |unit: usize| tasks[unit].stage_execution_id.clone();
        let key = Records::key(&tasks[0], "reported", 7, 2);
        let mut answers = Answers::new(nats.client.clone(), "lease.two").await;
        let lease = Lease::hold(&nats, "lease.two".into(), 2, 5, Some((groups.clone(), key)));
        let put_back = serde_json::to_vec(&[id(4)]).unwrap();
        groups
            .put(Records::key(&tasks[0], "requeued", 7, 2), put_back.into())
            .await
            .unwrap();
        lease.settle_many(1, true).await;
        lease.settle(&id(0), true).await;
        lease.settle(&id(1), false).await;
        lease.settle(&id(2), true).await;
        assert_eq!(answers.since().await, Vec::<String>::new(), "four of five");
        lease.settle(&id(3), true).await;
        let got = answers.since().await;
        assert_eq!(got.len(), 1, "{got:?}");
        // Handed back after its second delivery's wait, 2 s.
        assert!(got[0].starts_with("-NAK"), "{got:?}");
        assert!(got[0].contains("2000000000"), "{got:?}");
        // Its third delivery runs only the task not reported.
        let left = still_to_run(&groups, tasks.clone(), 7, 3).await;
        assert_eq!(left, [tasks[1].clone()]);
        // What the second delivery wrote is not for the second delivery.
        assert_eq!(still_to_run(&groups, tasks.clone(), 7, 2).await, tasks);
    });
}

/// What a busy worker was offered: a message of four tasks of one group
/// (`group_tasks`), delivered once as `sequence` while the queue held
/// more, against one free slot of `slots`, with `room` to hold.
struct Offered {
    buckets: std::sync::Arc<troupe::distributed::intake::Buckets>,
    groups: async_nats::jetstream::kv::Store,
    tasks: Vec<troupe::distributed::wire::Task>,
    taken: Vec<troupe::distributed::intake::Offer>,
    past: Option<troupe::distributed::taking::Past>,
    held: std::sync::Arc<troupe::distributed::taking::Held>,
}

async fn offered(
    nats: &troupe::distributed::nats::Nats,
    slots: &std::sync::Arc<tokio::sync::Semaphore>,
    sequence: u64,
    room: usize,
) -> Offered {
    use std::sync::Arc;
    use troupe::distributed::intake::Buckets;
    use troupe::distributed::taking::{Delivered, Held, offers};

    let (_consumer, cancelled, groups) = nats.worker_topology().await.unwrap();
    let buckets = Arc::new(Buckets::new(cancelled, groups.clone()));
    let tasks = group_tasks(4);
    let mut permits = vec![Arc::clone(slots).try_acquire_owned().unwrap()];
    let held = Arc::new(Held::default());
    let message = Delivered {
        tasks: tasks.clone(),
        reply: format!("offered.{sequence}").into(),
        delivered: 1,
        sequence,
        busy: true,
    };
    let (taken, past) = offers(nats, &buckets, message, &mut permits, &held, room);
    Offered {
        buckets,
        groups,
        tasks,
        taken,
        past,
        held,
    }
}

/// A message of four tasks to a worker with one free slot: one task
/// takes it; with other messages in the queue (the cluster is busy) the
/// other three are held for this worker's slots: one gets the slot that
/// frees, and when the worker drains the two still waiting go back on
/// the queue as one message, their ids written down for the message's
/// next delivery.
#[test]
fn a_busy_worker_holds_what_its_slots_cannot_take_and_puts_it_back_on_a_drain() {
    use std::sync::Arc;
    use troupe::distributed::taking::{Records, still_to_run};
    use troupe::distributed::wire::{Task, decode_tasks, task_subject};

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("hold test").await.unwrap();
        // Two slots: one free, one the test holds.
        let slots = Arc::new(tokio::sync::Semaphore::new(2));
        let busy = Arc::clone(&slots).try_acquire_owned().unwrap();
        let Offered {
            buckets,
            groups,
            tasks,
            taken,
            past,
            held,
        } = offered(&nats, &slots, 41, 16).await;
        assert_eq!(taken.len(), 1);
        assert!(taken[0].permit.is_some());
        assert_eq!(held.count(), 3, "three held for a slot");
        // The slot the test held frees; once one held task has it, the
        // worker drains, and the two still waiting go back at once.
        drop(busy);
        let (drain, drained) = tokio::sync::watch::channel(false);
        let accepted = std::rc::Rc::new(std::cell::RefCell::new(Vec::new()));
        let accept = |offers: Vec<troupe::distributed::intake::Offer>| {
            let accepted = std::rc::Rc::clone(&accepted);
            async move { accepted.borrow_mut().extend(offers) }
        };
        let nobody = || async { false };
        let hold = past
            .unwrap()
            .hold(&nats, &buckets, &slots, drained, accept, nobody);
        let drain_once_one_has_a_slot = async {
            while held.count() > 2 {
                tokio::task::yield_now().await;
            }
            drain.send(true).unwrap();
        };
        futures::join!(hold, drain_once_one_has_a_slot);
        let more = std::mem::take(&mut *accepted.borrow_mut());
        assert_eq!(more.len(), 1, "one got the slot that freed");
        assert!(more[0].permit.is_some());
        assert_eq!(held.count(), 0, "none held after the drain");

        // They went back as one message on their group's subject.
        let stream = nats.tasks().await.unwrap();
        let last = stream
            .get_last_raw_message_by_subject(&task_subject("run-1", 2))
            .await
            .unwrap();
        let put_back = decode_tasks(&last.payload).unwrap();
        let ids = |ts: &[Task]| ts.iter().map(|t| t.unit).collect::<Vec<_>>();
        let offered: Vec<usize> = taken.iter().chain(&more).map(|o| o.task.unit).collect();
        let mut all = offered.clone();
        all.extend(ids(&put_back));
        all.sort_unstable();
        assert_eq!(
            all,
            [0, 1, 2, 3],
            "each task once: {offered:?} {:?}",
            ids(&put_back)
        );
        assert_eq!(put_back.len(), 2);
        // Written down: the message's next delivery runs only the others.
        let left = still_to_run(&groups, tasks.clone(), 41, 2).await;
        assert_eq!(ids(&left), offered);
        let key = Records::key(&tasks[0], "requeued-held", 41, 1);
        assert!(groups.get(key).await.unwrap().is_some());
    });
}

/// A busy worker holds what its one free slot cannot take, and looks
/// whether another worker waits for a task: no at the first look, yes at
/// the second. The three held then go back on the queue as one message,
/// without waiting for this worker's slot (none frees), and are written
/// down for the message's next delivery. A hold that did not look would
/// wait a third of the lease (10 s by default) and put them back with
/// no look made; one that did not end at the second look would make
/// more. (When the looks fall due is `taking`'s own tests'.)
#[test]
fn a_held_task_goes_back_at_once_when_another_worker_waits() {
    use std::cell::Cell;
    use std::sync::Arc;
    use troupe::distributed::taking::{Records, still_to_run};
    use troupe::distributed::wire::{decode_tasks, task_subject};

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("look test").await.unwrap();
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let o = offered(&nats, &slots, 45, 16).await;
        assert_eq!((o.taken.len(), o.held.count()), (1, 3));
        let (_drain, drained) = tokio::sync::watch::channel(false);
        let accept = |_: Vec<troupe::distributed::intake::Offer>| async {
            panic!("no slot freed");
        };
        let looks = Cell::new(0);
        let elsewhere = || {
            looks.set(looks.get() + 1);
            let now = looks.get();
            async move { now >= 2 }
        };
        let past = o.past.unwrap();
        past.hold(&nats, &o.buckets, &slots, drained, accept, elsewhere)
            .await;
        assert_eq!(looks.get(), 2, "no at the first look, yes at the second");
        assert_eq!(o.held.count(), 0, "nothing held any more");
        let stream = nats.tasks().await.unwrap();
        let last = stream
            .get_last_raw_message_by_subject(&task_subject("run-1", 2))
            .await
            .unwrap();
        let back: Vec<usize> = decode_tasks(&last.payload)
            .unwrap()
            .iter()
            .map(|t| t.unit)
            .collect();
        let mut all = back.clone();
        all.push(o.taken[0].task.unit);
        all.sort_unstable();
        assert_eq!(all, [0, 1, 2, 3], "each task once: back {back:?}");
        let key = Records::key(&o.tasks[0], "requeued-held", 45, 1);
        assert!(o.groups.get(key).await.unwrap().is_some());
        let left = still_to_run(&o.groups, o.tasks.clone(), 45, 2).await;
        let units: Vec<usize> = left.iter().map(|t| t.unit).collect();
        assert_eq!(units, [o.taken[0].task.unit]);
    });
}

/// What a hold asks the server, with one unacknowledged message allowed
/// the workers at a time: no other worker waits while no pull request is
/// open; none waits for what the queue lacks while the other worker's
/// fetch waits behind that limit with a message still queued (a task put
/// back would wait there too); one does once its fetch waits on an empty
/// queue. The server takes a request in its own time, so each state is
/// awaited (ten seconds at most) before it is asked about.
#[test]
fn another_worker_waits_while_its_fetch_is_open_on_an_empty_queue() {
    use futures::StreamExt;
    use troupe::distributed::taking::another_waits;
    use troupe::distributed::wire::task_subject;

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let mut args = nats_args(&server.url());
    args.nats_max_pending = 1;
    actix::System::new().block_on(async move {
        let nats = args.connect("waits test").await.unwrap();
        let (consumer, _, _) = nats.worker_topology().await.unwrap();
        assert!(!another_waits(&consumer).await, "no fetch open");
        let other = args.connect("the other worker").await.unwrap();
        let (theirs, _, _) = other.worker_topology().await.unwrap();
        let until = |what: &'static str,
                     info: fn(&async_nats::jetstream::consumer::Info) -> bool| {
            let consumer = consumer.clone();
            async move {
                let seen = tokio::time::timeout(Duration::from_secs(10), async {
                    while !consumer.get_info().await.is_ok_and(|i| info(&i)) {
                        tokio::task::yield_now().await;
                    }
                })
                .await;
                assert!(seen.is_ok(), "never seen: {what}");
            }
        };
        for n in 0..2 {
            let subject = task_subject("run-w", 1);
            let ack = nats.js.publish(subject, format!("[{n}]").into()).await;
            ack.unwrap().await.unwrap();
        }
        let fetch = |n: usize| {
            theirs
                .fetch()
                .max_messages(n)
                .expires(Duration::from_secs(60))
                .messages()
        };
        let mut first = fetch(1).await.unwrap();
        let taken = first.next().await.unwrap().unwrap();
        // At the limit: the next fetch waits, the second message queued.
        let mut second = fetch(1).await.unwrap();
        until("a fetch waiting behind the limit", |i| {
            i.num_waiting > 0 && i.num_pending == 1
        })
        .await;
        assert!(!another_waits(&consumer).await, "a message still queued");
        // Acknowledged: the waiting fetch takes the second message.
        taken.ack().await.unwrap();
        second.next().await.unwrap().unwrap().ack().await.unwrap();
        let _open = fetch(4).await.unwrap();
        until("a fetch waiting on the empty queue", |i| {
            i.num_waiting > 0 && i.num_pending == 0 && i.num_ack_pending == 0
        })
        .await;
        assert!(another_waits(&consumer).await, "the other worker waits");
    });
}

/// A message put back twice on one delivery (what the hold has no room
/// for at once, what it held at the drain) writes both down: its next
/// delivery runs only the task this worker took. One record per message
/// and delivery kept only the last put-back's ids, and the next delivery
/// ran the first's tasks again beside the message they travel in.
#[test]
fn a_message_put_back_twice_on_one_delivery_writes_both_down() {
    use std::sync::Arc;
    use troupe::distributed::taking::still_to_run;

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("put back twice").await.unwrap();
        // One slot free, none to free: the hold keeps one task, with room
        // for one, and the other two go back at once.
        let slots = Arc::new(tokio::sync::Semaphore::new(1));
        let put = offered(&nats, &slots, 43, 1).await;
        assert_eq!(put.taken.len(), 1);
        assert_eq!(put.held.count(), 1, "one held for a slot");
        // A drain before any slot frees: the held one goes back too.
        let (_drain, drained) = tokio::sync::watch::channel(true);
        let accept = |_: Vec<troupe::distributed::intake::Offer>| async {
            panic!("no slot freed");
        };
        let (past, buckets) = (put.past.unwrap(), &put.buckets);
        past.hold(&nats, buckets, &slots, drained, accept, || async { false })
            .await;
        let left = still_to_run(&put.groups, put.tasks.clone(), 43, 2).await;
        let units: Vec<usize> = left.iter().map(|t| t.unit).collect();
        assert_eq!(
            units,
            [put.taken[0].task.unit],
            "only the task taken runs again"
        );
    });
}

/// A worker's reports sent at the same moment travel as one message, in
/// the order they were sent; a report too heavy to share a message goes
/// alone, and what follows it starts the next batch. (Deterministic: the
/// sends are queued before the outbox's task can run, on one thread.)
#[test]
fn reports_sent_together_travel_as_one_message_in_order() {
    use troupe::distributed::outbox::{self, Outbox};
    use troupe::distributed::wire::{Report, Task};

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    let accepted = |unit: usize| Report::Accepted {
        stage_execution_id: format!("run-1/worker#{unit}/1"),
        turn: 2,
        unit,
        worker: "w1".to_owned(),
    };
    let heavy = Report::Refused {
        stage_execution_id: "run-1/worker#100/1".to_owned(),
        turn: 2,
        unit: 100,
        worker: "w1".to_owned(),
        code: "Distributed/PipelineMismatch".to_owned(),
        message: "x".repeat(600 * 1024),
    };
    let mut sent: Vec<Report> = (0..100).map(accepted).collect();
    sent.push(heavy);
    sent.push(accepted(101));
    let messages = actix::System::new().block_on(async move {
        let nats = args.connect("outbox test").await.unwrap();
        let stream = nats.reports().await.unwrap();
        let outbox = Outbox::start(nats.clone(), "w1");
        // From a coordinator that reads compressed batches.
        let task = sample_task(2);
        let stored = futures::future::join_all(sent.iter().map(|r| outbox.send(&task, r))).await;
        assert!(stored.iter().all(|s| *s), "{stored:?}");
        // From an older coordinator, whose tasks do not say it: plain.
        let older = Task {
            zstd_reports: false,
            relay_records: false,
            ..task
        };
        let more: Vec<Report> = (200..220).map(accepted).collect();
        let stored = futures::future::join_all(more.iter().map(|r| outbox.send(&older, r))).await;
        assert!(stored.iter().all(|s| *s), "{stored:?}");
        sent.extend(more);
        let mut messages = Vec::new();
        for payload in report_payloads(&stream, "run-1").await {
            let reports: Result<Vec<Report>, _> = outbox::decode(&payload).into_iter().collect();
            let zstd = payload.starts_with(&[0x28, 0xB5, 0x2F, 0xFD]);
            messages.push((reports.unwrap(), zstd, payload.len()));
        }
        (messages, sent)
    });
    let (messages, sent) = messages;
    let sizes: Vec<usize> = messages.iter().map(|m| m.0.len()).collect();
    assert_eq!(sizes, vec![100, 1, 1, 20], "batches");
    // The two large batches went compressed (the 600 KiB one in a few
    // KiB); the lone small report as it is, and the older coordinator's
    // batch as JSON.
    let zstd: Vec<bool> = messages.iter().map(|m| m.1).collect();
    assert_eq!(zstd, vec![true, true, false, false], "compressed");
    assert!(messages[1].2 < 4096, "{} bytes", messages[1].2);
    let reports: Vec<Report> = messages.into_iter().flat_map(|m| m.0).collect();
    assert_eq!(reports, sent, "every report, in order");
}

/// Reports whose events travel as records go framed, and a framed batch
/// carries at most `MAX_FRAMED_RECORDS` of records (a report with more
/// goes alone): the coordinator bounds what one message's records make.
#[test]
fn framed_batches_carry_a_bounded_share_of_records() {
    use troupe::distributed::outbox::{self, MAX_FRAMED_RECORDS, Outbox};
    use troupe::distributed::wire::Report;
    use troupe::runtime::events::{Event, EventName, FieldValue, Relaying};

    let Some(bin) = nats_server() else { return };
    // Messages of up to 8 MiB: what bounds a batch here is its records.
    let conf = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(conf.path(), "max_payload: 8388608\n").unwrap();
    let server = Server::spawn(
        &bin,
        &["-c".into(), conf.path().display().to_string()],
        "Server is ready",
    );
    let args = nats_args(&server.url());
    let counts = actix::System::new().block_on(async move {
        let nats = args.connect("framed test").await.unwrap();
        assert!(nats.message_budget() > 4 * MAX_FRAMED_RECORDS);
        let stream = nats.reports().await.unwrap();
        let outbox = Outbox::start(nats.clone(), "w1");
        let task = sample_task(2);
        // Each report's records a little over a third of the share.
        let text: std::sync::Arc<str> = "y".repeat(MAX_FRAMED_RECORDS / 3 + 1).into();
        let records = || {
            let mut relaying = Relaying::default();
            relaying.push(
                &Event::new(EventName::StageCancelled, "run-1")
                    .stage("worker", "run-1/worker#0/1")
                    .with("reason", FieldValue::Text(std::sync::Arc::clone(&text))),
            );
            relaying.into_bytes()
        };
        let report = Report::Cancelled {
            stage_execution_id: "run-1/worker#0/1".to_owned(),
            turn: 2,
            unit: 0,
            worker: "w1".to_owned(),
            usage: Default::default(),
            events: Vec::new(),
        };
        let stored = futures::future::join_all(
            (0..5).map(|_| outbox.send_relayed(&task, &report, records())),
        )
        .await;
        assert!(stored.iter().all(|s| *s), "{stored:?}");
        let mut counts = Vec::new();
        for payload in report_payloads(&stream, "run-1").await {
            let reports: Vec<Report> = outbox::decode(&payload)
                .into_iter()
                .map(Result::unwrap)
                .collect();
            for r in &reports {
                let Report::Cancelled { events, .. } = r else {
                    panic!("{r:?}");
                };
                assert_eq!(events.len(), 1, "its event, read from its records");
            }
            counts.push(reports.len());
        }
        counts
    });
    // Five reports of a third of the share each: at most two a message.
    assert_eq!(counts.iter().sum::<usize>(), 5, "{counts:?}");
    assert!(counts.iter().all(|n| *n <= 2), "{counts:?}");
}

#[test]
fn reports_read_before_a_resume_are_acknowledged_only_once_stored() {
    use troupe::distributed::arrived::take_arrived;
    use troupe::distributed::wire::report_subject;

    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let args = nats_args(&server.url());
    actix::System::new().block_on(async move {
        let nats = args.connect("arrived test").await.unwrap();
        nats.run_topology().await.unwrap();
        let run = "01a2169c-ae47-74a5-8cb4-5df934e3f66c";
        let exec = format!("{run}/worker#1/1");
        let result = serde_json::json!({"stageId": "worker", "stageExecutionId": exec,
            "verdict": "ok", "parsed": 1, "output": 1, "capHit": false, "attemptCount": 1,
            "usage": {"promptTokens": 0, "completionTokens": 0, "requests": 0}});
        let report = serde_json::json!([{"kind": "exited", "body": {"stageExecutionId": exec,
            "turn": 1, "unit": 1, "worker": "w", "delivered": 1, "result": result}}]);
        let sent = nats
            .js
            .publish(report_subject(run), report.to_string().into())
            .await
            .unwrap();
        sent.await.unwrap();
        let arrived = take_arrived(&nats, run).await.unwrap();
        assert_eq!(arrived.results.len(), 1, "{arrived:?}");
        assert_eq!(arrived.unreadable, 0);
        // Read, not yet acknowledged: a resume that fails to store the
        // result finds it again.
        let mut consumer = nats.coordinator_consumer(run).await.unwrap();
        assert_eq!(consumer.info().await.unwrap().num_ack_pending, 1);
        // Confirmed by the server when it returns.
        arrived.acknowledge().await;
        assert_eq!(consumer.info().await.unwrap().num_ack_pending, 0);
    });
}
