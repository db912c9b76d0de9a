//! Results that reached a run's report stream while no coordinator read
//! it (`troupe resume --nats` takes them first), and the store's record
//! of any result that came from a worker.

use std::sync::Arc;

use async_nats::jetstream::message::Acker;
use futures::StreamExt;
use serde_json::Value;

use super::nats::Nats;
use super::outbox;
use super::wire::Report;
use crate::provider::Usage;
use crate::runtime::events::{Event, EventName};
use crate::runtime::ledger::{CancelRecord, ExitRecord};
use crate::runtime::result::{Kept, Verdict};

/// A worker's execution's stage, sibling index and visit, read from its
/// id (`<run>/<stage>[#<index>]/<visit>`); `stage` when the id has none.
fn place(stage_execution_id: &str, stage: &str) -> (String, Option<usize>, u32) {
    let (stage_id, index) = match stage_execution_id.rsplit('/').nth(1) {
        Some(label) => match label.split_once('#') {
            Some((s, i)) => (s.to_owned(), i.parse().ok()),
            None => (label.to_owned(), None),
        },
        None => (stage.to_owned(), None),
    };
    let visit = stage_execution_id
        .rsplit('/')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    (stage_id, index, visit)
}

/// The store's record of a sibling a worker cancelled, read from the
/// events it relayed (its `StageCancelled`, the last, and its
/// `StageEntered`), as a local cancellation is stored: so `troupe runs
/// show` lists it with its phase and open tool calls, and a resumed run's
/// budget counts what it used. `None` without a `StageCancelled`.
pub fn cancel_record(
    run_id: &str,
    stage_execution_id: &str,
    events: &[Event],
    usage: Usage,
) -> Option<CancelRecord> {
    let cancelled = events
        .iter()
        .rev()
        .find(|e| e.name == EventName::StageCancelled)?;
    let entered_at = events
        .iter()
        .find(|e| e.name == EventName::StageEntered)
        .map_or(cancelled.ts, |e| e.ts);
    let text = |key: &str| match cancelled.field(key) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };
    let number = |key: &str| {
        cancelled
            .field(key)
            .and_then(|v| v.as_u64())
            .and_then(|n| u32::try_from(n).ok())
    };
    let stage = cancelled.stage_id.as_deref().unwrap_or_default();
    let (stage_id, index, visit) = place(stage_execution_id, stage);
    Some(CancelRecord {
        run_id: Arc::from(run_id),
        stage_execution_id: Arc::from(stage_execution_id),
        stage_id: Arc::from(stage_id.as_str()),
        index,
        visit,
        reason: Arc::from(text("reason").unwrap_or_default()),
        phase: text("phase").map_or("", |p| static_phase(&p)),
        attempt: number("attempt").unwrap_or(1),
        turn: number("turn").unwrap_or(0),
        tool_calls: cancelled
            .field("toolCalls")
            .unwrap_or_else(|| Value::Array(Vec::new())),
        usage,
        entered_at,
        cancelled_at: cancelled.ts,
    })
}

/// A phase's name as the stage actor records it (the record keeps a
/// `&'static str`); a name troupe does not use reads as empty.
fn static_phase(name: &str) -> &'static str {
    const PHASES: [&str; 8] = [
        "Setup",
        "Init",
        "CheckGate",
        "Act",
        "Assert",
        "Execute",
        "Exit",
        "Next",
    ];
    PHASES.into_iter().find(|p| *p == name).unwrap_or("")
}

/// The store's record of a result that came from a worker.
pub fn exit_record(run_id: &str, result: &Kept) -> ExitRecord {
    let (stage_id, index, visit) = place(result.stage_execution_id(), result.stage_id());
    let now = std::time::SystemTime::now();
    ExitRecord {
        run_id: Arc::from(run_id),
        stage_execution_id: Arc::from(result.stage_execution_id()),
        stage_id: Arc::from(stage_id.as_str()),
        index,
        visit,
        result: result.clone(),
        entered_at: std::time::SystemTime::UNIX_EPOCH,
        exited_at: now,
    }
}

/// What [`take_arrived`] read: the results, each with the events its
/// worker recorded, and the acknowledgements of the messages that held
/// them, to send once the results are stored ([`Arrived::acknowledge`]):
/// a resume that fails to store them (or is killed first) finds them on
/// the stream again.
pub struct Arrived {
    pub results: Vec<(Kept, Vec<Value>)>,
    /// Reports that could not be read (skipped; a sibling so reported
    /// runs again in the resumed run).
    pub unreadable: usize,
    ackers: Vec<Acker>,
}

impl std::fmt::Debug for Arrived {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Arrived")
            .field("results", &self.results.len())
            .field("unreadable", &self.unreadable)
            .field("messages", &self.ackers.len())
            .finish()
    }
}

impl Arrived {
    /// Acknowledges every message read: call once its results are stored.
    /// Each is confirmed by the server (a double ack), so that once this
    /// returns the messages are no longer pending.
    pub async fn acknowledge(self) {
        futures::future::join_all(self.ackers.iter().map(|a| a.double_ack())).await;
    }
}

/// Before a run's coordinator resumes: the results workers reported while
/// no coordinator was reading (exited `ok`/`skipped`, to be stored so the
/// resumed run does not run them again; acknowledged once they are, see
/// [`Arrived`]), and the run's queued tasks purged (the resumed run
/// publishes again only what has no stored result).
pub async fn take_arrived(nats: &Nats, run_id: &str) -> Result<Arrived, super::NatsError> {
    // A resume against a cluster still forming waits for it, as a run does.
    nats.run_topology().await?;
    let consumer = nats.coordinator_consumer(run_id).await?;
    let mut results = Vec::new();
    let (mut ackers, mut unreadable) = (Vec::new(), 0);
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(1000)
            .expires(std::time::Duration::from_millis(300))
            .messages()
            .await
            .map_err(|e| super::NatsError {
                code: "JetStream",
                message: format!("cannot read the run's reports: {e}"),
            })?;
        let mut got = 0;
        while let Some(Ok(msg)) = batch.next().await {
            got += 1;
            let (msg, acker) = msg.split();
            for report in outbox::decode(&msg.payload) {
                match report {
                    Ok(Report::Exited { result, events, .. })
                        if result.verdict() != Verdict::Fail =>
                    {
                        // As the worker wrote them (its seq, 0, is the
                        // coordinator's to give).
                        let lines = events
                            .into_iter()
                            .filter_map(|e| e.into_event().map(|event| event.to_json(0)))
                            .collect();
                        results.push((result, lines));
                    }
                    Ok(_) => {}
                    Err(_) => unreadable += 1,
                }
            }
            ackers.push(acker);
        }
        if got == 0 {
            break;
        }
    }
    if let Ok(tasks) = nats.tasks().await {
        let _ = tasks
            .purge()
            .filter(super::wire::run_tasks_subject(run_id))
            .await;
    }
    // The new session's groups have the old one's turns: a cancelled mark
    // left from it would have every worker skip their siblings. The bucket
    // may not exist (no group was ever cancelled): nothing to clear.
    if nats.cancelled().await.is_ok() {
        nats.clear_cancelled(run_id).await?;
    }
    Ok(Arrived {
        results,
        unreadable,
        ackers,
    })
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use super::*;
    use crate::distributed::wire::EventLine;
    use crate::runtime::events::FieldValue;

    fn event(name: EventName, at: u64) -> Event {
        let mut e = Event::new(name, "r").stage("worker", "r/worker#7/2");
        e.ts = UNIX_EPOCH + Duration::from_secs(at);
        e
    }

    /// `events` as the coordinator has them: written by the worker into a
    /// cancelled report, and the report read back off the wire.
    fn relayed(events: &[Event]) -> Vec<Event> {
        let report = Report::Cancelled {
            stage_execution_id: "r/worker#7/2".to_owned(),
            turn: 1,
            unit: 7,
            worker: "w1".to_owned(),
            usage: Usage::default(),
            events: events.iter().filter_map(EventLine::written).collect(),
        };
        let text = serde_json::to_vec(&vec![report]).expect("written");
        let back: Vec<Report> = serde_json::from_slice(&text).expect("read");
        let Some(Report::Cancelled { events, .. }) = back.into_iter().next() else {
            panic!("a cancelled report");
        };
        events
            .into_iter()
            .filter_map(EventLine::into_event)
            .collect()
    }

    #[test]
    fn a_workers_cancelled_sibling_is_stored_from_its_relayed_events() {
        let used = Usage {
            prompt_tokens: 5,
            completion_tokens: 1,
            requests: 1,
        };
        let calls = [(Arc::<str>::from("call_1"), Arc::<str>::from("Bash"))];
        let cancelled = event(EventName::StageCancelled, 9)
            .with("reason", Arc::<str>::from("Cancellation/FailFast"))
            .with_static("phase", "Act")
            .with("attempt", 2u64)
            .with("turn", 3u64)
            .with("toolCalls", FieldValue::calls(&calls));
        let events = relayed(&[event(EventName::StageEntered, 4), cancelled]);
        let record = cancel_record("r", "r/worker#7/2", &events, used).expect("a record");
        assert_eq!(&*record.stage_id, "worker");
        assert_eq!((record.index, record.visit), (Some(7), 2));
        assert_eq!(&*record.reason, "Cancellation/FailFast");
        assert_eq!((record.phase, record.attempt, record.turn), ("Act", 2, 3));
        assert_eq!(record.tool_calls, FieldValue::calls_json(&calls));
        assert_eq!(record.usage, used);
        assert_eq!(record.entered_at, UNIX_EPOCH + Duration::from_secs(4));
        assert_eq!(record.cancelled_at, UNIX_EPOCH + Duration::from_secs(9));

        let odd = relayed(&[event(EventName::StageCancelled, 9).with_static("phase", "Dancing")]);
        let record = cancel_record("r", "r/worker#7/2", &odd, used).expect("a record");
        assert_eq!(record.phase, "", "a phase troupe does not use");
        assert_eq!(record.entered_at, record.cancelled_at);
        let entered = relayed(&[event(EventName::StageEntered, 4)]);
        assert!(
            cancel_record("r", "r/worker#7/2", &entered, used).is_none(),
            "no StageCancelled, no record"
        );
    }
}
