//! How a worker takes the messages of the task queue, each holding one
//! task or several of one group ([`TASKS_PER_MESSAGE`]): how many
//! messages it asks for, which tasks of a message it runs at once, holds
//! for a slot or puts back on the queue, and what it writes down so that
//! a message delivered again (its worker lost) runs only what is left.

use std::collections::HashSet;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_nats::jetstream::kv;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};

use super::intake::{Buckets, Offer};
use super::lease::Lease;
use super::nats::{Nats, publish_tasks};
use super::wire::{TASKS_PER_MESSAGE, Task};

/// One message the worker was delivered.
#[derive(Debug)]
pub struct Delivered {
    pub tasks: Vec<Task>,
    pub reply: async_nats::Subject,
    pub delivered: u64,
    /// Its sequence in the task stream.
    pub sequence: u64,
    /// The queue held more messages once the worker's fetch was served:
    /// the cluster is busy (see [`offers`]).
    pub busy: bool,
}

/// How many messages to ask for: the free slots over the tasks a message
/// is expected to hold. A message holds up to [`TASKS_PER_MESSAGE`]
/// tasks; asked for a message a slot, one worker could take a wide
/// start's whole queue and the others none of it, while asking for a
/// sixteenth as many would take one message of a lone task a round trip
/// when tasks trickle. So the expectation starts at the most, jumps to
/// the largest message seen, and halves towards what comes.
#[derive(Debug)]
pub struct Expected(usize);

impl Default for Expected {
    fn default() -> Self {
        Expected(TASKS_PER_MESSAGE)
    }
}

impl Expected {
    /// Messages to ask for with `free` slots: what they take at the
    /// expected size, but never more than three past what they take
    /// were every message full, so that a wide start published after a
    /// run of lone tasks is not one worker's alone.
    pub fn messages(&self, free: usize) -> usize {
        (free / self.0.max(1))
            .min(free / TASKS_PER_MESSAGE + 3)
            .max(1)
    }

    /// A fetch brought messages of at most `largest` tasks; none (0): the
    /// queue was empty, and what comes next may be a wide start.
    pub fn saw(&mut self, largest: usize) {
        self.0 = match largest {
            0 => TASKS_PER_MESSAGE,
            n => n.max(self.0.div_ceil(2)).min(TASKS_PER_MESSAGE),
        };
    }
}

/// The tasks a worker holds for a slot: while any is, it fetches nothing,
/// so that those get the next free slots.
#[derive(Debug, Default)]
pub struct Held {
    count: AtomicUsize,
    none: Notify,
}

impl Held {
    /// How many tasks wait for a slot.
    pub fn count(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    /// Waits until no task does.
    pub async fn none(&self) {
        loop {
            let notified = self.none.notified();
            if self.count() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// One task counted in [`Held`] until it is dropped (it got its slot, or
/// was settled without running).
#[derive(Debug)]
pub struct Waiting(Arc<Held>);

impl Waiting {
    fn new(held: &Arc<Held>) -> Waiting {
        held.count.fetch_add(1, Ordering::AcqRel);
        Waiting(Arc::clone(held))
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.0.count.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.none.notify_waiters();
        }
    }
}

/// What a worker writes down of a message it was delivered, in the
/// groups bucket (the run's keys there go with the run): the tasks it put
/// back on the queue at once (`requeued`) and after holding them for a
/// slot (`requeued-held`: one message may be put back twice, and each
/// writes its own key), and those it reported (`reported`, see
/// [`Lease`]), each key per delivery. Its next delivery runs none of them.
#[derive(Debug)]
pub struct Records;

impl Records {
    /// The kinds of record, each a key per delivery.
    const KINDS: [&'static str; 3] = ["requeued", "requeued-held", "reported"];

    /// `<run>.<turn>.<kind>.<sequence>.<delivered>` for a message of
    /// `task`'s group.
    pub fn key(task: &Task, kind: &str, sequence: u64, delivered: u64) -> String {
        Records::key_in(&task.run_id, task.turn, kind, sequence, delivered)
    }

    fn key_in(run: &str, turn: u64, kind: &str, sequence: u64, delivered: u64) -> String {
        format!("{run}.{turn}.{kind}.{sequence}.{delivered}")
    }

    /// `<run>.carries.<sequence>`: the siblings (group, unit, execution
    /// id) of the message a worker put back on the queue at `sequence`,
    /// for a coordinator that hears it was dropped once the stream no
    /// longer holds it.
    pub fn carries(run: &str, sequence: u64) -> String {
        format!("{run}.carries.{sequence}")
    }

    /// The ids written down for the message at `sequence` (of group
    /// `turn` of run `run`) at its deliveries before `delivered`. A key
    /// that cannot be read counts as none (its tasks may run twice): for
    /// a worker, which then runs a task again at worst.
    pub async fn settled(
        groups: &kv::Store,
        run: &str,
        turn: u64,
        sequence: u64,
        delivered: u64,
    ) -> HashSet<String> {
        Records::read(groups, run, turn, sequence, delivered, false)
            .await
            .unwrap_or_default()
    }

    /// As [`settled`](Records::settled), but `Err` when a key could not
    /// be read (a missing key is none): for a coordinator about to fail
    /// what is not written down, which reads again rather than fail a
    /// sibling that lives on.
    pub async fn settled_strictly(
        groups: &kv::Store,
        run: &str,
        turn: u64,
        sequence: u64,
        delivered: u64,
    ) -> Result<HashSet<String>, ()> {
        Records::read(groups, run, turn, sequence, delivered, true).await
    }

    async fn read(
        groups: &kv::Store,
        run: &str,
        turn: u64,
        sequence: u64,
        delivered: u64,
        strictly: bool,
    ) -> Result<HashSet<String>, ()> {
        let keys: Vec<String> = (1..delivered)
            .flat_map(|d| Records::KINDS.map(|kind| Records::key_in(run, turn, kind, sequence, d)))
            .collect();
        let reads = keys.iter().map(|key| groups.get(key.as_str()));
        let mut ids = HashSet::new();
        for read in futures::future::join_all(reads).await {
            match read {
                Ok(Some(record)) => {
                    if let Ok(written) = serde_json::from_slice::<Vec<String>>(&record) {
                        ids.extend(written);
                    }
                }
                Ok(None) => {}
                Err(_) if strictly => return Err(()),
                Err(_) => {}
            }
        }
        Ok(ids)
    }
}

/// When a hold asks again whether another worker waits for a task, after
/// its first look (at once): each the time since the last answer,
/// doubling, so that a hold in a busy cluster asks a handful of times in
/// its first half second, not once a millisecond; then every 256 ms (the
/// last) until the hold ends, since a worker may go idle at any time in
/// a hold of seconds (model turns take seconds).
const LOOKS: [std::time::Duration; 8] = {
    let ms = std::time::Duration::from_millis;
    [
        ms(2),
        ms(4),
        ms(8),
        ms(16),
        ms(32),
        ms(64),
        ms(128),
        ms(256),
    ]
};

/// Whether another worker waits for a task the queue does not have: a
/// pull request of theirs is open at the server (a worker with free slots
/// and an empty queue keeps one open until its fetch expires), no message
/// waits to be delivered, and the consumer's limit of unacknowledged
/// messages is not reached. Where messages wait, or the limit is reached,
/// the request waits behind the limit, and a task put back would wait
/// with it. A worker holding tasks asks this of the workers' shared
/// consumer; its own fetch is not open meanwhile, since the fetch loop
/// waits while any task is held (but for a redelivered message's tasks,
/// which are held only once what earlier deliveries did is read: a look
/// may then see this worker's own fetch, and the tasks go back on the
/// queue, most likely to it). Not known (the server did not answer):
/// false, and the hold goes on.
pub async fn another_waits(consumer: &async_nats::jetstream::consumer::PullConsumer) -> bool {
    consumer.get_info().await.is_ok_and(|info| {
        idle_elsewhere(
            info.num_waiting,
            info.num_pending,
            info.num_ack_pending,
            info.config.max_ack_pending,
        )
    })
}

/// [`another_waits`]'s reading of a consumer's state: requests waiting,
/// messages waiting to be delivered, messages delivered and not yet
/// acknowledged, and the most of those the consumer allows (0 or less:
/// no limit).
fn idle_elsewhere(waiting: usize, pending: u64, ack_pending: usize, max_ack_pending: i64) -> bool {
    let under_limit =
        max_ack_pending <= 0 || i64::try_from(ack_pending).is_ok_and(|acks| acks < max_ack_pending);
    waiting > 0 && pending == 0 && under_limit
}

/// A hold's looks for another worker waiting for a task ([`LOOKS`]).
struct Looks {
    /// When the next is due.
    due: tokio::time::Instant,
    after: std::slice::Iter<'static, std::time::Duration>,
}

impl Looks {
    /// The first is due at once.
    fn new() -> Looks {
        Looks {
            due: tokio::time::Instant::now(),
            after: LOOKS.iter(),
        }
    }

    /// A slot of `slots` for a held task, looking meanwhile whether
    /// another worker waits (`elsewhere`). None: the deadline passed, the
    /// worker drains (or its drain's sender is gone), the slots were
    /// closed, or another worker waits. A look the server is slow to
    /// answer holds up nothing: a slot that frees meanwhile is taken.
    async fn slot<G: Future<Output = bool>>(
        &mut self,
        slots: &Arc<Semaphore>,
        deadline: tokio::time::Instant,
        drain: &mut tokio::sync::watch::Receiver<bool>,
        elsewhere: &impl Fn() -> G,
    ) -> Option<OwnedSemaphorePermit> {
        use futures::future::{Fuse, FusedFuture, FutureExt};
        let acquire = tokio::time::timeout_at(deadline, Arc::clone(slots).acquire_owned());
        let mut acquire = std::pin::pin!(acquire);
        let mut asking = std::pin::pin!(Fuse::terminated());
        loop {
            let due = self.due;
            tokio::select! {
                biased;
                slot = &mut acquire => return slot.ok().and_then(Result::ok),
                _ = drain.changed() => return None,
                seen = &mut asking => {
                    if seen {
                        return None;
                    }
                    let after = self.after.next().unwrap_or(&LOOKS[LOOKS.len() - 1]);
                    self.due = tokio::time::Instant::now() + *after;
                }
                () = tokio::time::sleep_until(due), if asking.is_terminated() => {
                    asking.set(elsewhere().fuse());
                }
            }
        }
    }
}

/// The tasks of a message past its free slots (see [`offers`]).
#[derive(Debug)]
pub struct Past {
    tasks: Vec<Task>,
    lease: Arc<Lease>,
    sequence: u64,
    /// One for each task held for a slot (none: put back at once).
    waiting: Vec<Waiting>,
}

impl Past {
    /// Holds the tasks counted as held for a slot of `slots`, for a third
    /// of the lease at most (renewed meanwhile), handing them to `accept`
    /// as soon as they have one (those that get one together, together:
    /// accepting reads the group's cancelled mark once a call); puts back
    /// on the queue at once those not held (past the room), and after the
    /// hold those that got no slot ([`requeue`]). Returns once all of it is
    /// done. The queue held other messages when they came, so the cluster
    /// is busy and they would wait anyway; put back, each would cost the
    /// server a message and a key more every time a slot frees, one sibling
    /// at a time.
    ///
    /// But a queue that holds messages is not always a busy cluster: when a
    /// wave of siblings ends together, the coordinator publishes the next
    /// wave at once, and the queue holds it for the moment other workers
    /// take to fetch it. A task held then waits for one of this worker's
    /// siblings to end (a whole model turn, or two) while another worker
    /// has a slot free. So the hold asks whether another worker waits for
    /// a task the queue does not have (`elsewhere`, [`another_waits`]) at
    /// once, again after about 2, 6, 14… ms, and every 256 ms from half a
    /// second on ([`LOOKS`]); if one does, what is still held goes back on
    /// the queue for it. A drain (`drain` set) puts
    /// back at once what has no slot. Call inside a Tokio `LocalSet`: what
    /// it starts runs there.
    pub async fn hold<F, G>(
        self,
        nats: &Nats,
        buckets: &Arc<Buckets>,
        slots: &Arc<Semaphore>,
        mut drain: tokio::sync::watch::Receiver<bool>,
        accept: impl Fn(Vec<Offer>) -> F,
        elsewhere: impl Fn() -> G,
    ) where
        F: Future<Output = ()> + 'static,
        G: Future<Output = bool>,
    {
        let Past {
            mut tasks,
            lease,
            sequence,
            mut waiting,
        } = self;
        let put_back = |tasks: Vec<Task>, kind: &'static str| {
            let (nats, buckets, lease) = (nats.clone(), Arc::clone(buckets), Arc::clone(&lease));
            tokio::task::spawn_local(async move {
                requeue(&nats, &buckets, &lease, tasks, sequence, kind).await;
            })
        };
        let mut started = Vec::new();
        let unheld = tasks.split_off(waiting.len().min(tasks.len()));
        if !unheld.is_empty() {
            started.push(put_back(unheld, "requeued"));
        }
        let mut tasks = tasks.into_iter();
        let deadline = tokio::time::Instant::now() + nats.lease / 3;
        let mut looks = Looks::new();
        while let Some(held) = waiting.pop() {
            if *drain.borrow() {
                break;
            }
            let wait = looks.slot(slots, deadline, &mut drain, &elsewhere);
            let Some(permit) = wait.await else {
                break;
            };
            // This slot, and any others free now for the tasks held.
            let mut slots_now = vec![(permit, held)];
            while let Some(held) = waiting.pop() {
                let Ok(more) = Arc::clone(slots).try_acquire_owned() else {
                    waiting.push(held);
                    break;
                };
                slots_now.push((more, held));
            }
            let offers: Vec<Offer> = slots_now
                .into_iter()
                .zip(tasks.by_ref())
                .map(|((permit, _held), task)| Offer {
                    task,
                    context: None,
                    lease: Arc::clone(&lease),
                    permit: Some(permit),
                    checked: None,
                })
                .collect();
            started.push(tokio::task::spawn_local(accept(offers)));
        }
        drop(waiting);
        let rest: Vec<Task> = tasks.collect();
        if !rest.is_empty() {
            started.push(put_back(rest, "requeued-held"));
        }
        for one in started {
            let _ = one.await;
        }
    }
}

/// What to do with a delivered message: its tasks as offers, one for each
/// free slot taken from `permits`, and those past them ([`Past`]): held
/// for a slot when the queue held other messages too (up to `room` of
/// them; the fetch loop takes no slot while any is held), put back on the
/// queue otherwise. Call inside a Tokio `LocalSet` (the lease's renewals
/// run on it).
pub fn offers(
    nats: &Nats,
    buckets: &Arc<Buckets>,
    message: Delivered,
    permits: &mut Vec<OwnedSemaphorePermit>,
    held: &Arc<Held>,
    room: usize,
) -> (Vec<Offer>, Option<Past>) {
    let Delivered {
        mut tasks,
        reply,
        delivered,
        sequence,
        busy,
    } = message;
    let record = tasks.first().map(|first| {
        let key = Records::key(first, "reported", sequence, delivered);
        (buckets.groups.clone(), key)
    });
    let lease = Lease::hold(nats, reply, delivered, tasks.len(), record);
    let past = tasks.split_off(tasks.len().min(permits.len()));
    let offers = tasks
        .into_iter()
        .map(|task| Offer {
            task,
            context: None,
            lease: Arc::clone(&lease),
            permit: permits.pop(),
            checked: None,
        })
        .collect();
    if past.is_empty() {
        return (offers, None);
    }
    let hold = if busy { past.len().min(room) } else { 0 };
    let waiting = (0..hold).map(|_| Waiting::new(held)).collect();
    let past = Past {
        tasks: past,
        lease,
        sequence,
        waiting,
    };
    (offers, Some(past))
}

/// How long a put-back's records are tried again: a few tries, backing
/// off, before the lease is settled without them.
const RECORD_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Tasks of a delivered message that this worker will not run, put back
/// on the queue as a message of their own for any worker to take. A
/// worker asks for as many messages as its free slots would take (see
/// [`Expected`]), so this is the last message of a fetch, when fewer
/// slots were free than it holds and the queue had nothing else.
///
/// What the new message carries is written down under its own sequence
/// ([`Records::carries`]), for a coordinator told it was dropped. Their
/// ids are then written down under `kind` ([`Records`]): should this worker die
/// holding the message, its next delivery leaves them to the message they
/// now travel in instead of running them twice. (Written after the
/// publish: a record of tasks that were never put back would lose them; a
/// publish without its record only runs them twice, as a lost worker's
/// own tasks are.) They count as settled in `lease` once the server stored
/// them; if it would not, the whole message goes back to the queue once
/// its other tasks are reported. The new message's `Nats-Msg-Id` names
/// the one they came in and its delivery, so a retried publish is stored
/// once.
pub async fn requeue(
    nats: &Nats,
    buckets: &Buckets,
    lease: &Lease,
    tasks: Vec<Task>,
    sequence: u64,
    kind: &str,
) {
    let Some(first) = tasks.first() else {
        return;
    };
    let bodies: Result<Vec<Vec<u8>>, _> = tasks.iter().map(serde_json::to_vec).collect();
    let stored = match bodies {
        Ok(bodies) => {
            let at = format!("requeued.{sequence}.{}", lease.delivered());
            publish_tasks(&nats.js, &tasks, &bodies, &at, None)
                .await
                .ok()
        }
        Err(_) => None,
    };
    if let Some(new) = stored {
        let carried: Vec<(u64, usize, &str)> = tasks
            .iter()
            .map(|t| (t.turn, t.unit, t.stage_execution_id.as_str()))
            .collect();
        let ids: Vec<&str> = tasks
            .iter()
            .map(|t| t.stage_execution_id.as_str())
            .collect();
        let records = [
            (
                Records::carries(&first.run_id, new),
                serde_json::to_vec(&carried),
            ),
            (
                Records::key(first, kind, sequence, lease.delivered()),
                serde_json::to_vec(&ids),
            ),
        ];
        for (key, record) in records {
            let Ok(record) = record.map(bytes::Bytes::from) else {
                continue;
            };
            let put = || buckets.groups.put(key.as_str(), record.clone());
            let _ = super::nats::retrying(RECORD_PATIENCE, |_| true, put).await;
        }
    }
    lease.settle_many(tasks.len(), stored.is_some()).await;
}

/// The tasks of a message delivered again (`delivered` above 1) less
/// those an earlier delivery put back on the queue or reported.
pub async fn still_to_run(
    groups: &kv::Store,
    tasks: Vec<Task>,
    sequence: u64,
    delivered: u64,
) -> Vec<Task> {
    let Some(first) = tasks.first() else {
        return tasks;
    };
    let settled = Records::settled(groups, &first.run_id, first.turn, sequence, delivered).await;
    tasks
        .into_iter()
        .filter(|t| !settled.contains(&t.stage_execution_id))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;
    use std::time::Duration;

    /// Another worker waits for a task only with a request open, nothing
    /// queued, and room under the limit of unacknowledged messages (none
    /// set: room).
    #[test]
    fn another_worker_waits_only_where_a_task_put_back_would_reach_it() {
        assert!(idle_elsewhere(1, 0, 0, 10));
        assert!(idle_elsewhere(3, 0, 9, 10));
        assert!(idle_elsewhere(1, 0, 500, -1), "no limit");
        assert!(idle_elsewhere(1, 0, 500, 0), "no limit");
        assert!(!idle_elsewhere(0, 0, 0, 10), "no request open");
        assert!(!idle_elsewhere(1, 1, 0, 10), "a message queued");
        assert!(!idle_elsewhere(1, 0, 10, 10), "at the limit");
        assert!(!idle_elsewhere(1, 0, 11, 10), "past it");
    }

    /// Waits for [`Looks::slot`] with `slots`, a look that counts its
    /// calls into `looks` and answers `answer(call)` (never, with None),
    /// and `drain`; what it answered and the time that passed (paused).
    async fn slot_with(
        slots: &Arc<Semaphore>,
        looks: &Cell<usize>,
        answer: impl Fn(usize) -> Option<bool>,
        drain: &mut tokio::sync::watch::Receiver<bool>,
    ) -> (Option<OwnedSemaphorePermit>, Duration) {
        let start = tokio::time::Instant::now();
        let deadline = start + Duration::from_secs(3600);
        let elsewhere = || {
            looks.set(looks.get() + 1);
            let said = answer(looks.get());
            async move {
                match said {
                    Some(said) => said,
                    None => std::future::pending().await,
                }
            }
        };
        let got = Looks::new().slot(slots, deadline, drain, &elsewhere).await;
        (got, start.elapsed())
    }

    /// A hold goes on looking past the doubling: every 256 ms once at
    /// it, here until the thirteenth look finds a worker waiting (no slot
    /// frees). Then no slot is taken.
    #[tokio::test(start_paused = true)]
    async fn a_hold_looks_until_it_ends_not_only_at_first() {
        let slots = Arc::new(Semaphore::new(0));
        let looks = Cell::new(0);
        let (_drain, mut drained) = tokio::sync::watch::channel(false);
        let (got, waited) = slot_with(&slots, &looks, |n| Some(n >= 13), &mut drained).await;
        assert!(got.is_none());
        assert_eq!(looks.get(), 13);
        // At once, then 2 + 4 + … + 256 ms, then four more of 256.
        assert_eq!(waited, Duration::from_millis(510 + 4 * 256));
        assert_eq!(slots.available_permits(), 0);
    }

    /// A look the server does not answer holds up nothing: the slot that
    /// frees while it is out is taken; and a drain while it is out ends
    /// the wait.
    #[tokio::test(start_paused = true)]
    async fn a_look_that_is_out_neither_delays_a_slot_nor_a_drain() {
        let slots = Arc::new(Semaphore::new(0));
        let looks = Cell::new(0);
        let (drain, mut drained) = tokio::sync::watch::channel(false);
        let free_once_asked = async {
            while looks.get() == 0 {
                tokio::task::yield_now().await;
            }
            slots.add_permits(1);
        };
        let ((got, waited), ()) = tokio::join!(
            slot_with(&slots, &looks, |_| None, &mut drained),
            free_once_asked
        );
        assert!(got.is_some(), "the slot that freed");
        assert_eq!((looks.get(), waited), (1, Duration::ZERO));

        let looks = Cell::new(0);
        let drain_once_asked = async {
            while looks.get() == 0 {
                tokio::task::yield_now().await;
            }
            drain.send(true).unwrap();
        };
        let ((got, _), ()) = tokio::join!(
            slot_with(&slots, &looks, |_| None, &mut drained),
            drain_once_asked
        );
        assert!(got.is_none(), "drained");
        assert_eq!(
            slots.available_permits(),
            0,
            "the freed slot was taken before"
        );
    }

    /// A wide start's sixteen-task messages spread: a worker asks for its
    /// free slots over sixteen. When lone tasks come, the expectation
    /// halves towards one a fetch at a time, and jumps back at once (and
    /// after an empty queue).
    #[test]
    fn a_worker_asks_for_what_its_free_slots_would_take() {
        let mut expected = Expected::default();
        assert_eq!(expected.messages(94), 5);
        assert_eq!(expected.messages(3), 1, "at least one");
        let mut asked = Vec::new();
        for _ in 0..5 {
            expected.saw(1);
            asked.push(expected.messages(16));
        }
        assert_eq!(
            asked,
            [2, 4, 4, 4, 4],
            "at most three past a full message's"
        );
        assert_eq!(expected.messages(94), 8, "94 / 16 + 3, not 94");
        expected.saw(0);
        assert_eq!(expected.messages(94), 5, "after an empty queue, the most");
        expected.saw(16);
        assert_eq!(expected.messages(94), 5);
        expected.saw(40);
        assert_eq!(
            expected.messages(32),
            2,
            "never past the most a message holds"
        );
    }

    /// A held task counts until it is dropped; waiting for none returns
    /// once the last is.
    #[tokio::test(start_paused = true)]
    async fn a_worker_fetches_again_once_no_task_waits_for_a_slot() {
        let held = Arc::new(Held::default());
        held.none().await;
        let a = Waiting::new(&held);
        let b = Waiting::new(&held);
        assert_eq!(held.count(), 2);
        let mut none = Box::pin(held.none());
        assert!(futures::poll!(&mut none).is_pending());
        drop(a);
        assert!(futures::poll!(&mut none).is_pending());
        drop(b);
        assert!(futures::poll!(&mut none).is_ready());
        assert_eq!(held.count(), 0);
    }
}
