//! A worker's event collector: the audit events of its executions in
//! flight, written down as they are published, for the report each
//! execution ends with.

use std::sync::{Arc, Mutex};

use tokio::sync::watch;
use troupe_actors::{Delivery, Published, Subscription};

use super::outbox::MAX_FRAMED_RECORDS;
use super::wire::EventLine;
use crate::runtime::events::{Event, EventName, Relaying, relayed_lines_within};
use crate::runtime::scheduler::FastMap;

/// Events of the executions in flight, by `stageExecutionId`, collected
/// from the worker's bus on a thread of their own, each execution's
/// written as the records relayed in its report.
#[derive(Debug, Default)]
pub(super) struct Collected {
    events: Mutex<FastMap<Arc<str>, Relaying>>,
}

impl Collected {
    /// The records of an execution's events (its entry let go), as its
    /// report carries them: beside it for a coordinator that reads
    /// records, else as the JSON lines they make, inside it.
    ///
    /// An execution with more records than a framed batch carries
    /// ([`MAX_FRAMED_RECORDS`]) goes as lines either way, if they come to
    /// at most what `lines_within` says (what a message's budget leaves
    /// beside the rest of the report; asked only then). A coordinator
    /// bounds what a message's records make (64 MiB of text, counted with
    /// what reading them holds), and enough tiny events of one execution
    /// could pass it, their last ones dropped; lines carry what they make.
    /// Lines that would not fit in a message stay records: a report the
    /// server refuses would lose the execution's outcome too.
    pub(super) fn take(
        &self,
        id: &str,
        as_records: bool,
        lines_within: impl FnOnce() -> usize,
    ) -> (Vec<EventLine>, Vec<u8>) {
        let relaying = self
            .events
            .lock()
            .map(|mut m| m.remove(id))
            .unwrap_or_default();
        let records = relaying.map(Relaying::into_bytes).unwrap_or_default();
        if as_records && records.len() <= MAX_FRAMED_RECORDS {
            return (Vec::new(), records);
        }
        // Each written in the report as the JSON it is, after a comma.
        let within = if as_records {
            lines_within()
        } else {
            usize::MAX
        };
        let Some(lines) = relayed_lines_within(&records, within) else {
            return (Vec::new(), records);
        };
        let lines = lines.into_iter().map(EventLine::written_line).collect();
        (lines, Vec::new())
    }

    /// Writes `events` down, each under its execution: one lock for all.
    fn add(&self, events: impl Iterator<Item = Published<Event>>, worker: &Arc<str>) {
        let mut by_execution = self.events.lock().unwrap_or_else(|e| e.into_inner());
        for event in events {
            let Some(id) = &event.stage_execution_id else {
                continue;
            };
            let relaying = by_execution.entry(Arc::clone(id)).or_default();
            if event.name == EventName::StageEntered {
                relaying.push(&(*event).clone().with("worker", Arc::clone(worker)));
            } else {
                relaying.push(&event);
            }
        }
    }
}

/// The event collector's thread: each execution's events as the records
/// relayed in its report, by `stageExecutionId`, and in `seen` the `seq`
/// of the last event collected (a report waits for its own). A
/// `StageEntered` says which worker ran it; `seq` is the coordinator's to
/// give.
///
/// What is queued is taken together, up to a bound: one lock of the map
/// and one wake of the reports waiting on `seen` for all of it (a watch
/// send wakes every waiter: it was a tenth of this thread's work when made
/// for each event).
pub(super) fn collect_events(
    sub: &Subscription<Event>,
    collected: &Collected,
    worker: &Arc<str>,
    seen: &watch::Sender<u64>,
) {
    const TOGETHER: usize = 64;
    let mut taken: Vec<Published<Event>> = Vec::with_capacity(TOGETHER);
    while let Some(first) = sub.recv() {
        let mut last = None;
        let mut next = Some(first);
        while let Some(delivery) = next {
            if let Delivery::Event(env) = delivery {
                if env.event.stage_execution_id.is_some() {
                    taken.push(env.event);
                }
                last = Some(env.seq);
            }
            if taken.len() >= TOGETHER {
                break;
            }
            next = sub.try_recv();
        }
        if !taken.is_empty() {
            collected.add(taken.drain(..), worker);
        }
        if let Some(seq) = last {
            let _ = seen.send(seq);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An execution's events, taken as records and as lines, say the same:
    /// the lines are what the worker wrote before it relayed records, its
    /// `StageEntered` names the worker, and other executions' events and
    /// events of no execution stay out.
    #[test]
    fn an_executions_events_are_taken_as_records_or_as_its_lines() {
        let worker: Arc<str> = Arc::from("w1");
        let mine = "r/worker#1/1";
        let event = |name, exec: &str| Published::new(Event::new(name, "r").stage("worker", exec));
        let events = [
            event(EventName::StageEntered, mine),
            event(EventName::StageEntered, "r/worker#2/1"),
            Published::new(Event::new(EventName::WorkflowStarted, "r")),
            Published::new(
                (*event(EventName::StageExited, mine))
                    .clone()
                    .with_static("verdict", "ok"),
            ),
        ];
        // The lines the worker wrote before it relayed records (an event
        // read from records equals the line it writes).
        let expected: Vec<EventLine> = [
            (*events[0]).clone().with("worker", "w1"),
            (*events[3]).clone(),
        ]
        .iter()
        .map(|e| EventLine::written(e).unwrap())
        .collect();
        for as_records in [false, true] {
            let collected = Collected::default();
            collected.add(events.iter().cloned(), &worker);
            let (lines, records) = collected.take(mine, as_records, || usize::MAX);
            let got: Vec<EventLine> = if as_records {
                assert!(lines.is_empty());
                let (read, fault) = Event::read_relayed(&records);
                assert_eq!(fault, None);
                read.into_iter().map(EventLine::Read).collect()
            } else {
                assert!(records.is_empty());
                lines
            };
            assert_eq!(got, expected, "as records: {as_records}");
            let (lines, records) = collected.take(mine, as_records, || usize::MAX);
            assert!(lines.is_empty() && records.is_empty(), "taken once");
            assert!(
                !collected
                    .take("r/worker#2/1", true, || usize::MAX)
                    .1
                    .is_empty()
            );
        }
    }

    /// An execution whose records pass what a framed batch carries goes
    /// as its lines, even to a coordinator that reads records, when they
    /// fit in a message: every one of its events reaches the log. Lines
    /// that would not fit stay records.
    #[test]
    fn an_execution_with_more_records_than_a_batch_carries_goes_as_lines() {
        let worker: Arc<str> = Arc::from("w1");
        let mine = "r/worker#1/1";
        let events: Vec<Published<Event>> = (0..100_000u64)
            .map(|n| {
                let event =
                    Event::new(EventName::ToolInvocationSucceeded, "r").stage("worker", mine);
                Published::new(event.with("n", n))
            })
            .collect();
        let collected = Collected::default();
        collected.add(events.iter().cloned(), &worker);
        let lines = |collected: &Collected, as_records| {
            let (lines, records) = collected.take(mine, as_records, || usize::MAX);
            assert!(records.is_empty(), "as records: {as_records}");
            lines
        };
        let big = lines(&collected, true);
        assert_eq!(big.len(), events.len());
        collected.add(events.iter().cloned(), &worker);
        assert_eq!(big, lines(&collected, false));
        // Lines past the message's budget: records, as they were.
        let size: usize = big
            .iter()
            .map(|l| serde_json::to_string(l).unwrap().len() + 1)
            .sum();
        for (within, as_lines) in [(size, true), (size - 1, false)] {
            collected.add(events.iter().cloned(), &worker);
            let (lines, records) = collected.take(mine, true, || within);
            assert_eq!(lines.len() == events.len(), as_lines, "within {within}");
            assert_eq!(records.is_empty(), as_lines, "within {within}");
        }
        // Under the bound, records as before, and the report's size is not
        // asked for (the worker serializes its result to say it).
        collected.add(events[..10].iter().cloned(), &worker);
        let (few, records) = collected.take(mine, true, || unreachable!("asked"));
        assert!(few.is_empty() && !records.is_empty());
    }
}
