//! Publishing siblings' tasks: those the scheduler spawned together go
//! as one message of their group ([`TASKS_PER_MESSAGE`]), serialized and
//! published on the run's other arbiters; and the advisory of a message
//! no worker finished.

use std::future::Future;
use std::sync::Arc;

use actix::ArbiterHandle;
use serde_json::Value;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use super::super::groups::Group;
use super::super::nats::{Nats, publish_tasks, retrying};
use super::super::taking::Records;
use super::super::wire::{TASKS_PER_MESSAGE, Task, decode_tasks};
use super::{Cmd, Coordinator, decoding, unreachable};
use crate::runtime::cancel::CancelScope;
use crate::runtime::scheduler::{ExecKey, Slot, StageOutcome, ToScheduler};

/// A sibling spawned, waiting for what else was spawned with it.
pub(super) struct Pending {
    pub(super) exec: ExecKey,
    pub(super) task: Task,
    /// Its own scope, under the group's.
    pub(super) own: CancelScope,
}

/// Tasks of one group to serialize and publish, and the server's acks to
/// wait for: after decoding (`decoding`), the largest part of what a
/// sibling cost the coordinator's loop (callgrind, 3 000 siblings over
/// three workers: about 11 000 of its 50 000 instructions a sibling,
/// 4 600 of them serializing the task). So it is done on another of the
/// run's arbiters, which a distributed run leaves idle. They go as few
/// messages as the server's message budget allows (one, nearly always).
pub(super) struct Queue {
    js: async_nats::jetstream::Context,
    session: Arc<str>,
    tasks: Vec<Task>,
    /// The server's message budget ([`Nats::message_budget`]).
    budget: usize,
    /// Retries stop once it fires: the sibling's own scope's token for a
    /// lone task, the group's for several.
    stop: CancellationToken,
}

/// What publishing a [`Queue`] came to: for each message, in the tasks'
/// order, how many tasks it holds and its stream sequence (or why the
/// server would not store it).
type Outcomes = Vec<(usize, Result<u64, String>)>;

impl Queue {
    /// Published on `helper`; here when there is none, or when it stopped
    /// before it answered (a message published twice keeps its
    /// `Nats-Msg-Id`, so the server stores it once).
    async fn on(self, helper: Option<ArbiterHandle>) -> Outcomes {
        let queue = Arc::new(self);
        decoding::on_helper(helper, move || {
            let queue = Arc::clone(&queue);
            async move { queue.publish().await }
        })
        .await
    }

    async fn publish(&self) -> Outcomes {
        let bodies: Result<Vec<Vec<u8>>, _> = self
            .tasks
            .iter()
            .map(|task| {
                let mut body = Vec::with_capacity(256);
                task.write_json(&mut body).map(|()| body)
            })
            .collect();
        let bodies = match bodies {
            Ok(bodies) => bodies,
            Err(e) => {
                return vec![(
                    self.tasks.len(),
                    Err(format!("Distributed/TaskInvalid: {e}")),
                )];
            }
        };
        let mut outcomes = Vec::with_capacity(1);
        for range in messages(&bodies, self.budget) {
            let outcome = self.publish_message(&self.tasks[range.clone()], &bodies[range.clone()]);
            outcomes.push((range.len(), outcome.await));
        }
        outcomes
    }

    /// One message: a lone task as its object, several as an array,
    /// under its id at this session.
    async fn publish_message(&self, tasks: &[Task], bodies: &[Vec<u8>]) -> Result<u64, String> {
        publish_tasks(&self.js, tasks, bodies, &self.session, Some(&self.stop))
            .await
            .map_err(|e| unreachable(&e))
    }
}

/// Tasks serialized as `bodies`, split into runs of consecutive tasks,
/// each at most [`TASKS_PER_MESSAGE`] and within `budget` bytes as one
/// message (a task alone may pass it: the server then refuses it, and its
/// sibling fails).
fn messages(bodies: &[Vec<u8>], budget: usize) -> Vec<std::ops::Range<usize>> {
    let mut ranges = Vec::new();
    let mut start = 0;
    while start < bodies.len() {
        // The array's brackets, then each task after a comma.
        let mut end = start + 1;
        let mut size = bodies[start].len() + 2;
        while end < bodies.len() && end - start < TASKS_PER_MESSAGE {
            let grown = size + 1 + bodies[end].len();
            if grown > budget {
                break;
            }
            size = grown;
            end += 1;
        }
        ranges.push(start..end);
        start = end;
    }
    ranges
}

impl Coordinator {
    /// The commands that came while the last was handled, then the
    /// siblings among them published: the scheduler spawns siblings many
    /// at a time (a fan-out's start, the successors of a batch of
    /// reports), and those of one group go as one message
    /// ([`TASKS_PER_MESSAGE`]). Any other command publishes what waits
    /// first, so nothing is handled out of the order it was sent in.
    pub(super) async fn take_waiting(&mut self, rx: &mut mpsc::UnboundedReceiver<Cmd>) {
        /// Commands taken before this loop looks at its reports again.
        const AT_ONCE: usize = 4096;
        for _ in 0..AT_ONCE {
            match rx.try_recv() {
                Ok(Cmd::Sibling { spawn, group, own }) => self.sibling(*spawn, group, own),
                Ok(cmd) => {
                    self.flush();
                    self.command(cmd).await;
                }
                Err(_) => break,
            }
        }
        self.flush();
    }

    /// Queues the siblings waiting to be published, but those whose own
    /// scope or group was cancelled since their spawn (the scheduler
    /// cancels the group's scope the moment it decides, and stops the
    /// sibling's own if it refuses the start it recorded at spawn: a task
    /// is never queued after either). A group's tasks go together, up to
    /// [`TASKS_PER_MESSAGE`] a message. The acks are awaited off this
    /// loop, which goes on publishing and reading reports; a message
    /// JetStream will not take is retried (a cluster electing a leader)
    /// and fails its siblings only when that runs out.
    pub(super) fn flush(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        // A budget this loop's own reports tripped counts too: the
        // scheduler has not read it yet, and would refuse the starts.
        let tripped = self
            .spec
            .budget
            .as_ref()
            .is_some_and(|b| b.exceeded().is_some());
        let mut by_group: Vec<(u64, Vec<Pending>)> = Vec::new();
        for waiting in std::mem::take(&mut self.pending) {
            let turn = waiting.task.turn;
            let cancelled = tripped
                || waiting.own.is_cancelled()
                || self.groups.get(&turn).is_some_and(Group::is_cancelled);
            if cancelled {
                self.done(&waiting.exec, turn, waiting.task.unit);
                self.scheduler.do_send(ToScheduler::Report {
                    exec: waiting.exec,
                    outcome: StageOutcome::CancelledBeforeStart,
                });
                continue;
            }
            match by_group.iter_mut().find(|(t, _)| *t == turn) {
                Some((_, tasks)) => tasks.push(waiting),
                None => by_group.push((turn, vec![waiting])),
            }
        }
        for (turn, mut waiting) in by_group {
            while !waiting.is_empty() {
                let rest = waiting.split_off(waiting.len().min(TASKS_PER_MESSAGE));
                self.queue(turn, std::mem::replace(&mut waiting, rest));
            }
        }
    }

    /// Publishes tasks of group `turn`, once the group's context is
    /// stored, and tells this loop how it went.
    fn queue(&mut self, turn: u64, waiting: Vec<Pending>) {
        let group = self.groups.get(&turn);
        let context = group.and_then(|g| g.context.clone());
        // A lone task's retries stop with its own scope (under the
        // group's); several tasks' with the group's.
        let stop = match (&waiting[..], group.and_then(|g| g.scope.as_ref())) {
            ([one], _) => one.own.token().clone(),
            (_, Some(scope)) => scope.token().clone(),
            (_, None) => CancellationToken::new(),
        };
        let (execs, tasks): (Vec<ExecKey>, Vec<Task>) =
            waiting.into_iter().map(|p| (p.exec, p.task)).unzip();
        let queue = Queue {
            js: self.spec.nats.js.clone(),
            session: Arc::clone(&self.spec.session),
            budget: self.spec.nats.message_budget(),
            tasks,
            stop,
        };
        let helper = self.publishers.next().cloned();
        let tx = self.tx.clone();
        self.publishing += 1;
        actix::spawn(async move {
            let ready = match context {
                Some(ready) => ready.await,
                None => Err("the group has no context".to_owned()),
            };
            let outcomes = match ready {
                Ok(()) => queue.on(helper).await,
                Err(e) => vec![(queue.tasks.len(), Err(unreachable(&e)))],
            };
            let _ = tx.send(Cmd::Queued {
                turn,
                execs,
                outcomes,
            });
        });
    }

    /// The advisory of a message no worker will finish: delivered as
    /// often as the consumer allows, or `dropped` (terminated) by a
    /// worker that could not read it or, with a reason, by the server (a
    /// message removed while a worker held it). Its siblings that did not
    /// end fail, but those a worker put back on the queue from it (they
    /// travel on in another message) or reported; those of a cancelled
    /// group are its cancel's to settle.
    pub(super) fn abandoned(&mut self, payload: &[u8], dropped: bool) {
        let advisory = serde_json::from_slice::<Value>(payload).unwrap_or_default();
        let Some(seq) = advisory["stream_seq"].as_u64() else {
            return;
        };
        let deliveries = advisory["deliveries"].as_u64().unwrap_or(5);
        let reason = advisory["reason"].as_str().unwrap_or_default();
        let why = match (dropped, reason.is_empty()) {
            (false, _) => ABANDONED.to_owned(),
            (true, true) => UNREADABLE.to_owned(),
            (true, false) => removed_by_the_server(reason),
        };
        let lost = Lost {
            seq,
            deliveries,
            why,
        };
        match self.by_sequence.remove(&seq) {
            Some(execs) => self.fail_message(lost, siblings_of(execs)),
            None => self.find_message(lost),
        }
    }

    /// A message no worker will finish that this loop did not publish (a
    /// worker's put-back, or another run's) or whose `Queued` has not come
    /// yet: read what it holds, off this loop.
    fn find_message(&mut self, lost: Lost) {
        let (nats, tx, run) = (
            self.spec.nats.clone(),
            self.tx.clone(),
            self.spec.run_id.clone(),
        );
        actix::spawn(async move {
            match carried(&nats, &run, lost.seq).await {
                Some(siblings) => fail_unsettled(&nats, &run, &tx, lost, siblings).await,
                None => drop(tx.send(Cmd::Unknown(lost))),
            }
        });
    }

    /// A message no worker will finish that this loop has not heard was
    /// stored: failed when its `Queued` comes. Kept only while a publish
    /// is awaiting its answer (other runs' messages come here too).
    pub(super) fn unknown(&mut self, lost: Lost) {
        match self.by_sequence.remove(&lost.seq) {
            Some(execs) => self.fail_message(lost, siblings_of(execs)),
            // Bounded besides: every run's lost messages come here.
            None if self.publishing > 0 && self.unknown.len() < 10_000 => {
                drop(self.unknown.insert(lost.seq, lost));
            }
            None => {}
        }
    }

    /// JetStream stored the messages of group `turn` or would not (see
    /// `Cmd::Queued`): each stored one is known by its sequence, or failed
    /// at once if a worker gave it up before this loop heard it was
    /// stored; a message not stored fails its siblings, unless the
    /// group's cancel settles them.
    pub(super) fn queued(
        &mut self,
        turn: u64,
        execs: Vec<ExecKey>,
        outcomes: Vec<(usize, Result<u64, String>)>,
    ) {
        self.publishing = self.publishing.saturating_sub(1);
        let mut execs = execs.into_iter();
        for (count, outcome) in outcomes {
            let message: Vec<ExecKey> = execs.by_ref().take(count).collect();
            match outcome {
                Ok(sequence) => match self.unknown.remove(&sequence) {
                    Some(lost) => self.fail_message(lost, siblings_of(message)),
                    None => drop(self.by_sequence.insert(sequence, message)),
                },
                Err(_) if self.groups.get(&turn).is_some_and(Group::is_cancelled) => {}
                Err(reason) => {
                    for exec in message {
                        self.fail_unit(exec, reason.clone());
                    }
                }
            }
        }
        if self.publishing == 0 {
            // Nothing awaited: what is unknown is not this run's.
            self.unknown.clear();
        }
    }

    /// The siblings of a lost message left to fail (see
    /// [`fail_message`](Coordinator::fail_message)): each that is still
    /// its unit's execution (a resumed run's message of an earlier session
    /// names another) and not of a cancelled group, whose cancel settles
    /// it.
    pub(super) fn fail_siblings(&mut self, lost: Lost, siblings: Vec<Sibling>) {
        for (turn, unit, id) in siblings {
            let Some(group) = self.groups.get(&turn).filter(|g| !g.is_cancelled()) else {
                continue;
            };
            let exec = group
                .units
                .get(&unit)
                .and_then(|u| u.exec.clone())
                .filter(|exec| *exec.id == *id);
            if let Some(exec) = exec {
                self.fail_unit(exec, lost.why.clone());
            }
        }
    }

    /// The siblings of a message no worker will finish fail, but those a
    /// worker put back on the queue from it or reported (read off this
    /// loop); `Cmd::Abandoned` then fails what is left.
    pub(super) fn fail_message(&mut self, lost: Lost, siblings: Vec<Sibling>) {
        let (nats, tx, run) = (
            self.spec.nats.clone(),
            self.tx.clone(),
            self.spec.run_id.clone(),
        );
        actix::spawn(async move { fail_unsettled(&nats, &run, &tx, lost, siblings).await });
    }
}

/// Tells the loop to fail `siblings` of a lost message, but those a worker
/// wrote down as put back or reported.
async fn fail_unsettled(
    nats: &Nats,
    run: &str,
    tx: &mpsc::UnboundedSender<Cmd>,
    lost: Lost,
    mut siblings: Vec<Sibling>,
) {
    if let Some(&(turn, _, _)) = siblings.first() {
        let settled = settled(nats, run, turn, &lost).await;
        siblings.retain(|(_, _, id)| !settled.contains(id));
    }
    if !siblings.is_empty() {
        let _ = tx.send(Cmd::Abandoned(lost, siblings));
    }
}

/// A sibling whose task the server removed while a worker held it (its
/// stream's limits, an operator), with the server's reason.
fn removed_by_the_server(reason: &str) -> String {
    format!(
        "Distributed/TaskDropped: the server removed the task's message while a worker held it ({reason})"
    )
}

/// A sibling whose task no worker finished.
const ABANDONED: &str = "Distributed/TaskAbandoned: the task was delivered to workers as often as allowed and none finished it";

/// A sibling whose task a worker could not read and dropped: a troupe
/// older than this coordinator reads one task a message, not several.
const UNREADABLE: &str = "Distributed/TaskUnreadable: a worker could not read the message the task was in and dropped it (a worker older than this coordinator cannot read several tasks in one message: run the same troupe on the coordinator and the workers)";

/// A message no worker will finish: its stream sequence, how often it
/// was delivered, and why its siblings fail.
#[derive(Debug)]
pub(super) struct Lost {
    seq: u64,
    deliveries: u64,
    why: String,
}

/// The siblings of a message this loop published.
fn siblings_of(execs: Vec<ExecKey>) -> Vec<Sibling> {
    execs
        .into_iter()
        .filter_map(|e| match e.slot {
            Slot::Unit(unit) => Some((e.turn, unit, e.id.to_string())),
            _ => None,
        })
        .collect()
}

/// How long the coordinator keeps trying to read what a lost message
/// held or what was written down of it, through NATS failing (which is
/// often why the message was lost).
const READ_PATIENCE: std::time::Duration = std::time::Duration::from_secs(60);

/// Tries `read` until it answers `Ok`, for at most [`READ_PATIENCE`];
/// `None` then.
async fn patiently<T, Fut>(read: impl FnMut() -> Fut) -> Option<T>
where
    Fut: Future<Output = Result<T, ()>>,
{
    retrying(READ_PATIENCE, |()| true, read).await.ok()
}

/// The ids a worker wrote down of the message (put back or reported) at
/// its deliveries so far; read patiently, every key of them, and none if
/// they cannot be read at all.
async fn settled(
    nats: &Nats,
    run: &str,
    turn: u64,
    lost: &Lost,
) -> std::collections::HashSet<String> {
    let read = patiently(|| async {
        let groups = nats.groups().await.map_err(|_| ())?;
        Records::settled_strictly(&groups, run, turn, lost.seq, lost.deliveries + 1).await
    });
    read.await.unwrap_or_default()
}

/// The siblings of run `run` in a message this loop did not publish (a
/// worker's put-back, or another run's): from the stream while it holds
/// the message (one past its deliveries stays: only an ack takes a message
/// off a work queue), else from what the worker that put them back wrote
/// down (`taking::Records::carries`). Read patiently through NATS
/// failing; `None`: nothing is known of it.
async fn carried(nats: &Nats, run: &str, seq: u64) -> Option<Vec<Sibling>> {
    use async_nats::jetstream::stream::RawMessageErrorKind;
    let in_stream = patiently(|| async {
        let stream = nats.tasks().await.map_err(|_| ())?;
        match stream.get_raw_message(seq).await {
            Ok(message) => Ok(decode_tasks(&message.payload).ok()),
            Err(e) if e.kind() == RawMessageErrorKind::NoMessageFound => Ok(None),
            Err(_) => Err(()),
        }
    })
    .await?;
    if let Some(tasks) = in_stream {
        return Some(
            tasks
                .into_iter()
                .filter(|t| t.run_id == run)
                .map(|t| (t.turn, t.unit, t.stage_execution_id))
                .collect(),
        );
    }
    // The worker writes the key just after its put-back is stored: one
    // not there yet is read again for a few seconds.
    let mut missing_for = 0;
    let record = patiently(|| {
        missing_for += 1;
        let first_tries = missing_for <= 6;
        async move {
            let groups = nats.groups().await.map_err(|_| ())?;
            match groups.get(Records::carries(run, seq)).await {
                Ok(None) if first_tries => Err(()),
                Ok(found) => Ok(found),
                Err(_) => Err(()),
            }
        }
    })
    .await??;
    serde_json::from_slice(&record).ok()
}

/// A sibling of a message no worker will finish: its group, unit and
/// execution id.
pub(super) type Sibling = (u64, usize, String);

#[cfg(test)]
mod tests {
    use super::*;

    /// Consecutive tasks, at most `TASKS_PER_MESSAGE` a message and
    /// within the budget (the array's brackets and commas counted); a
    /// task alone over the budget is a message of its own.
    #[test]
    fn tasks_are_split_into_messages_by_count_and_by_bytes() {
        let bodies =
            |sizes: &[usize]| -> Vec<Vec<u8>> { sizes.iter().map(|n| vec![b'x'; *n]).collect() };
        assert_eq!(
            messages(&bodies(&[10; 40]), 1 << 20),
            [0..16, 16..32, 32..40]
        );
        let one = messages(&bodies(&[10]), 1 << 20);
        assert_eq!((one.len(), one[0].clone()), (1, 0..1));
        assert!(messages(&[], 1 << 20).is_empty());
        // Three of 10 make 34 bytes as an array: "[", 10, ",", 10, ",", 10, "]".
        assert_eq!(messages(&bodies(&[10, 10, 10, 10]), 34), [0..3, 3..4]);
        assert_eq!(messages(&bodies(&[10, 10, 10, 10]), 33), [0..2, 2..4]);
        assert_eq!(messages(&bodies(&[5, 100, 5, 5]), 50), [0..1, 1..2, 2..4]);
    }
}
