//! An execution's events are published together when its actor's poll
//! ends, not one by one (`Deferred` in `runtime/stage/run.rs`). Before it
//! hands work to a party that may record something itself, on this
//! thread or another, it publishes what it holds: these tests put such a
//! party in the run (the provider, a human step's asker) and check that
//! every event the execution made before the call is in the log when the
//! party is called.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use common::Fixture;
use common::run::{Opts, run};
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::{Value, json};
use troupe::runtime::ask::{Answer, Asker, Question};
use troupe::runtime::events::Event;
use troupe::runtime::limits::Budget;
use troupe::runtime::summary::RunStatus;
use troupe_actors::EventBus;

fn fanout() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout")
}

/// The `seq`s of the events named `name`, by execution, in log order.
fn seqs_by_execution(events: &[Value], name: &str) -> HashMap<String, Vec<u64>> {
    let mut by = HashMap::<String, Vec<u64>>::new();
    for e in events.iter().filter(|e| e["event"] == name) {
        by.entry(e["stageExecutionId"].as_str().unwrap().to_owned())
            .or_default()
            .push(e["seq"].as_u64().unwrap());
    }
    by
}

/// For each execution, whether every `ProviderRequestStarted` was in the
/// log when its request reached the provider.
fn requests_logged_before_the_provider(out: &common::run::Outcome) -> Vec<bool> {
    let started = seqs_by_execution(&out.events, "ProviderRequestStarted");
    let mut nth = HashMap::<&str, usize>::new();
    let calls = out.provider.called_after.lock().unwrap();
    calls
        .iter()
        .map(|(exec, last_seq)| {
            let n = nth.entry(exec).or_default();
            let seq = started[exec.as_str()][*n];
            *n += 1;
            seq <= *last_seq
        })
        .collect()
}

/// `stages/fanout` `width` wide, cap `cap`, observed or not (audit events
/// only) and under `budget` if any: for each request, whether its
/// `ProviderRequestStarted` was in the log when it reached the provider.
fn logged(width: u64, cap: usize, audit_only: bool, budget: Option<Arc<Budget>>) -> Vec<bool> {
    let out = run(
        &fanout(),
        Opts {
            fields: vec![("width", json!(width))],
            cap: Some(cap),
            audit_only,
            budget,
            ..Opts::default()
        },
    );
    assert!(
        matches!(out.report.status, RunStatus::Ok),
        "{:?}",
        out.report.status
    );
    let logged = requests_logged_before_the_provider(&out);
    assert_eq!(
        logged.len() as u64,
        2 * width + 2,
        "two turns for each worker, plan, reduce"
    );
    logged
}

#[test]
fn a_request_is_in_the_log_before_the_provider_is_called() {
    // Observed: the scripted provider answers at once, so a worker's turn
    // (its answer, the Echo call's proposal, approval and start) is one
    // poll, and the try must be published before the provider is called.
    let logged = logged(40, 8, false, None);
    assert!(logged.iter().all(|before| *before), "{logged:?}");
}

#[test]
fn unobserved_a_poll_holds_its_events_until_it_ends() {
    // No observer and no budget: nothing needs a request in the log before
    // the provider answers, and with the scripted provider answering at
    // once the try is published with the rest of its poll.
    let logged = logged(20, 4, true, None);
    assert!(logged.iter().all(|before| !before), "{logged:?}");
}

#[test]
fn under_a_budget_a_request_is_in_the_log_before_the_provider_is_called() {
    let budget = Arc::new(Budget::new(Some(1 << 40), None, None));
    let logged = logged(20, 4, true, Some(budget));
    assert!(logged.iter().all(|before| *before), "{logged:?}");
}

/// Answers every question, noting the last `seq` on the bus when asked.
#[derive(Debug)]
struct Noting {
    bus: EventBus<Event>,
    asked_after: Mutex<Vec<u64>>,
}

impl Asker for Noting {
    fn ask(&self, _question: Question) -> BoxFuture<'static, Option<Answer>> {
        self.asked_after.lock().unwrap().push(self.bus.last_seq());
        async {
            Some(Answer {
                content: json!({"ok": true}),
                by: "test".to_owned(),
            })
        }
        .boxed()
    }
}

#[test]
fn a_question_is_in_the_log_before_the_asker_is_called() {
    let fixture = Fixture::new(
        "id: human\nentry: ask\nstages:\n  ask:\n    kind: human\n    prompt: \"Ship it?\"\n    fields: { type: object, required: [ok], properties: { ok: { type: boolean } } }\n  done: { kind: print, content: \"answered\" }\nnext:\n  ask: done\n  done: end\n",
        &[],
    );
    let bus = EventBus::new();
    let asker = Arc::new(Noting {
        bus: bus.clone(),
        asked_after: Mutex::default(),
    });
    let out = run(
        fixture.path(),
        Opts {
            asker: Some(Arc::clone(&asker) as Arc<dyn Asker>),
            bus: Some(bus),
            ..Opts::default()
        },
    );
    assert!(
        matches!(out.report.status, RunStatus::Ok),
        "{:?}",
        out.report.status
    );
    let raised: Vec<u64> = out
        .named("InteractionRaised")
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .collect();
    let asked_after = asker.asked_after.lock().unwrap().clone();
    assert_eq!((raised.len(), asked_after.len()), (1, 1));
    assert!(
        raised[0] <= asked_after[0],
        "asked when the log ended at {}, before InteractionRaised ({})",
        asked_after[0],
        raised[0]
    );
}
