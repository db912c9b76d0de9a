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
use crate::runtime::ledger::ExitRecord;
use crate::runtime::result::{Kept, Verdict};

/// The store's record of a result that came from a worker.
pub fn exit_record(run_id: &str, result: &Kept) -> ExitRecord {
    let (stage_id, index) = match result.stage_execution_id().rsplit('/').nth(1) {
        Some(label) => match label.split_once('#') {
            Some((s, i)) => (s.to_owned(), i.parse().ok()),
            None => (label.to_owned(), None),
        },
        None => (result.stage_id().to_owned(), None),
    };
    let visit = result
        .stage_execution_id()
        .rsplit('/')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
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
    Ok(Arrived {
        results,
        unreadable,
        ackers,
    })
}
