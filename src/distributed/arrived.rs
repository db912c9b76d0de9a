//! Results that reached a run's report stream while no coordinator read
//! it (`troupe resume --nats` takes them first), and the store's record
//! of any result that came from a worker.

use std::sync::Arc;

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

/// Before a run's coordinator resumes: the results workers reported while
/// no coordinator was reading (exited `ok`/`skipped`, to be stored so the
/// resumed run does not run them again); every report is acknowledged and
/// the run's queued tasks are purged (the resumed run publishes again
/// only what has no stored result).
pub async fn take_arrived(
    nats: &Nats,
    run_id: &str,
) -> Result<Vec<(Kept, Vec<Value>)>, super::NatsError> {
    // A resume against a cluster still forming waits for it, as a run does.
    nats.run_topology().await?;
    let consumer = nats.coordinator_consumer(run_id).await?;
    let mut results = Vec::new();
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
            for report in outbox::decode(&msg.payload) {
                if let Ok(Report::Exited { result, events, .. }) = report
                    && result.verdict() != Verdict::Fail
                {
                    // As the worker wrote them (its seq, 0, is the
                    // coordinator's to give).
                    let lines = events
                        .into_iter()
                        .filter_map(|e| e.into_event().map(|event| event.to_json(0)))
                        .collect();
                    results.push((result, lines));
                }
            }
            let _ = msg.ack().await;
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
    Ok(results)
}
