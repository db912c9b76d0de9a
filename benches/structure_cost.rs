//! What the runtime's structure costs with none of the work: the lower
//! bound any runtime built to troupe's design pays on this machine.
//!
//! Per sibling it does only what troupe's design (ARCHITECTURE.md) requires of
//! the `fanout` worker, and nothing of the workload itself (no provider,
//! no templates, no JSON parsing, no schema):
//! - one actix actor for the stage execution, started by a coordinator
//!   actor when a slot under the cap frees (no actor before its slot);
//! - one actix actor for its one tool call, asked with a message and
//!   answering with one;
//! - the twelve audit events a worker records, built as the runtime builds
//!   them (`Event`, shared ids) and published on the real `EventBus` to
//!   the real audit writer, flushed before the clock stops;
//! - one report message back to the coordinator.
//!
//! `structure/N` beside `floor/N` (the plain-tokio floor doing the whole
//! workload) says how much of the 2× per-sibling target the structure
//! alone uses; `structure_no_audit/N` is the same with no audit subscriber
//! (the events are still built and published), which separates the actor
//! thread's share from the audit writer's. `cancel/N` holds N such executions in flight (cap = N), the
//! last one fails and cancels the others through a token; the time is from
//! the trip to the last `StageCancelled` built, the same span
//! `cancel_latency` measures for the runtime.

use std::cell::Cell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use serde_json::json;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;
use troupe::bench::floor::{Floor, FloorSpec};
use troupe::runtime::audit::start_audit_log;
use troupe::runtime::events::{Event, EventName};
use troupe_actors::EventBus;

/// The allocator of the `troupe` binary, so the bench measures what users run.
#[global_allocator]
static GLOBAL: troupe::allocator::Mimalloc = troupe::allocator::Mimalloc;

const CAP: usize = 256;

/// What every execution shares.
struct Shared {
    bus: EventBus<Event>,
    run_id: Arc<str>,
    stage_id: Arc<str>,
    tool: Arc<str>,
    /// Fail-fast: a child token per execution when set (the cancel shape).
    group: Option<CancellationToken>,
    /// When the last `StageCancelled` was built.
    last_cancelled: Cell<Option<Instant>>,
    tripped_at: Cell<Option<Instant>>,
}

#[derive(Message)]
#[rtype(result = "()")]
struct Done;

#[derive(Message)]
#[rtype(result = "usize")]
struct Call(String);

/// One tool call.
struct ToolActor;

impl Actor for ToolActor {
    type Context = Context<Self>;
}

impl Handler<Call> for ToolActor {
    type Result = usize;

    fn handle(&mut self, msg: Call, ctx: &mut Context<Self>) -> usize {
        ctx.stop();
        msg.0.len()
    }
}

/// One stage execution.
struct Unit {
    shared: Rc<Shared>,
    index: usize,
    exec: Arc<str>,
    coordinator: Recipient<Done>,
    fails: bool,
}

impl Unit {
    fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.shared.run_id))
            .stage(Arc::clone(&self.shared.stage_id), Arc::clone(&self.exec))
    }

    fn publish(&self, event: Event) {
        self.shared.bus.publish(event);
    }

    fn tool_event(&self, name: EventName) -> Event {
        self.event(name)
            .tool(Arc::clone(&self.shared.tool))
            .with("callId", "call_1_0")
    }

    fn request(&self, turn: u32) {
        self.publish(
            self.event(EventName::ProviderRequestStarted)
                .with("provider", "scripted")
                .with("turn", turn)
                .with("try", 1),
        );
        self.publish(
            self.event(EventName::ProviderRequestCompleted)
                .with("turn", turn)
                .with("toolCalls", 1)
                .with(
                    "usage",
                    json!({"promptTokens": 55, "completionTokens": 6, "requests": 1}),
                ),
        );
    }

    fn finish(&mut self, ctx: &mut Context<Self>) {
        self.request(2);
        let verdict = if self.fails { "fail" } else { "ok" };
        self.publish(
            self.event(EventName::StageAssertOutcome)
                .with("verdict", verdict)
                .with("attempt", 1)
                .with("capHit", false),
        );
        self.publish(
            self.event(EventName::StageExited)
                .with("verdict", verdict)
                .with("capHit", false)
                .with("attemptCount", 1)
                .with(
                    "usage",
                    json!({"promptTokens": 117, "completionTokens": 16, "requests": 2}),
                ),
        );
        if self.fails
            && let Some(group) = &self.shared.group
        {
            self.shared.tripped_at.set(Some(Instant::now()));
            group.cancel();
        }
        self.coordinator.do_send(Done);
        ctx.stop();
    }

    fn cancelled(&mut self, ctx: &mut Context<Self>) {
        self.publish(
            self.event(EventName::StageCancelled)
                .with("reason", "sibling worker#N failed")
                .with("phase", "act")
                .with("attempt", 1)
                .with("turn", 1)
                .with("toolCalls", json!([])),
        );
        self.shared.last_cancelled.set(Some(Instant::now()));
        self.coordinator.do_send(Done);
        ctx.stop();
    }
}

impl Actor for Unit {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        self.publish(
            self.event(EventName::StageEntered)
                .with("kind", "llm")
                .with("visit", 1)
                .with("index", self.index),
        );
        self.publish(
            self.event(EventName::StageCheckGateResult)
                .with("outcome", "proceed")
                .with("check", 1),
        );
        if let Some(group) = self.shared.group.as_ref().filter(|_| !self.fails) {
            // Held in flight, its first model request unanswered, until the
            // group is cancelled.
            self.publish(
                self.event(EventName::ProviderRequestStarted)
                    .with("provider", "scripted")
                    .with("turn", 1)
                    .with("try", 1),
            );
            let token = group.child_token();
            let held = async move {
                tokio::select! {
                    biased;
                    () = token.cancelled_owned() => {}
                    () = tokio::time::sleep(Duration::from_secs(60)) => {}
                }
            };
            ctx.spawn(held.into_actor(self).map(|(), act, ctx| act.cancelled(ctx)));
            return;
        }
        self.request(1);
        let arguments = format!(r#"{{"text":"item {}"}}"#, self.index);
        self.publish(
            self.tool_event(EventName::ToolInvocationProposed)
                .with("arguments", arguments.as_str()),
        );
        self.publish(
            self.tool_event(EventName::ToolCallApproved)
                .with("by", "allowedTools"),
        );
        self.publish(self.tool_event(EventName::ToolInvocationStarted));
        let call = ToolActor.start().send(Call(arguments));
        ctx.spawn(call.into_actor(self).map(|bytes, act, ctx| {
            act.publish(
                act.tool_event(EventName::ToolInvocationSucceeded)
                    .with("bytes", bytes.unwrap_or(0)),
            );
            act.finish(ctx);
        }));
    }
}

/// Starts executions under the cap and counts their reports.
struct Coordinator {
    shared: Rc<Shared>,
    width: usize,
    cap: usize,
    next: usize,
    done: usize,
    finished: Option<oneshot::Sender<()>>,
}

impl Coordinator {
    fn start_next(&mut self, ctx: &mut Context<Self>) {
        let index = self.next;
        self.next += 1;
        Unit {
            shared: Rc::clone(&self.shared),
            index,
            exec: format!("{}/worker#{index}/1", self.shared.run_id).into(),
            coordinator: ctx.address().recipient(),
            fails: self.shared.group.is_some() && index + 1 == self.width,
        }
        .start();
    }
}

impl Actor for Coordinator {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        while self.next < self.width.min(self.cap) {
            self.start_next(ctx);
        }
    }
}

impl Handler<Done> for Coordinator {
    type Result = ();

    fn handle(&mut self, _: Done, ctx: &mut Context<Self>) {
        self.done += 1;
        if self.next < self.width {
            self.start_next(ctx);
        }
        if self.done == self.width {
            if let Some(finished) = self.finished.take() {
                let _ = finished.send(());
            }
            ctx.stop();
        }
    }
}

/// What one structure run measured.
struct Measured {
    /// Start to every report in and the audit log flushed.
    wall: Duration,
    /// The trip to the last `StageCancelled` (the cancel shape).
    cancel: Option<Duration>,
}

/// One run in a fresh actix system, the audit log in a temp folder unless
/// `audit` is false (the events are still built and published, to no
/// subscriber).
fn run(width: usize, cap: usize, cancel: bool, audit: bool) -> Measured {
    let dir = tempfile::tempdir().expect("a temp folder");
    let bus = EventBus::new();
    let sink = audit.then(|| {
        start_audit_log(&bus, &dir.path().join(troupe::auditlog::FILE), 0).expect("the audit log")
    });
    let shared = Rc::new(Shared {
        bus: bus.clone(),
        run_id: "01a2023b-5c20-7666-99dc-52370a7be689".into(),
        stage_id: "worker".into(),
        tool: "Echo".into(),
        group: cancel.then(CancellationToken::new),
        last_cancelled: Cell::new(None),
        tripped_at: Cell::new(None),
    });
    let system = actix::System::new();
    let start = system.block_on({
        let shared = Rc::clone(&shared);
        async move {
            let (tx, rx) = oneshot::channel();
            let start = Instant::now();
            Coordinator {
                shared,
                width,
                cap,
                next: 0,
                done: 0,
                finished: Some(tx),
            }
            .start();
            rx.await.expect("the coordinator finishes");
            start
        }
    });
    bus.close();
    if let Some(sink) = sink {
        let lines = sink.finish().expect("the audit log is written");
        // Twelve lines a worker; a held one that is cancelled writes four.
        let expected = if cancel {
            (width - 1) * 4 + 12
        } else {
            width * 12
        };
        assert_eq!(lines, expected as u64);
    }
    let wall = start.elapsed();
    let cancel = match (shared.tripped_at.get(), shared.last_cancelled.get()) {
        (Some(from), Some(to)) => Some(to.saturating_duration_since(from)),
        _ => None,
    };
    Measured { wall, cancel }
}

fn structure_cost(c: &mut Criterion) {
    let width: usize = if std::env::var_os("CI").is_some() {
        1_000
    } else {
        10_000
    };
    let floor = Floor::new().expect("the floor's schema compiles");
    let mut group = c.benchmark_group("structure_cost");
    group.sample_size(10);
    group.measurement_time(Duration::from_secs(10));
    group.throughput(Throughput::Elements(width as u64));
    group.bench_with_input(BenchmarkId::new("floor", width), &width, |b, &width| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    let spec = FloorSpec {
                        width,
                        cap: CAP,
                        latency: Duration::ZERO,
                        fail: None,
                        hold: Duration::ZERO,
                    };
                    floor.run_blocking(spec).expect("the floor runs").wall
                })
                .sum()
        });
    });
    group.bench_with_input(BenchmarkId::new("structure", width), &width, |b, &width| {
        b.iter_custom(|iters| (0..iters).map(|_| run(width, CAP, false, true).wall).sum());
    });
    group.bench_with_input(
        BenchmarkId::new("structure_no_audit", width),
        &width,
        |b, &width| {
            b.iter_custom(|iters| (0..iters).map(|_| run(width, CAP, false, false).wall).sum());
        },
    );
    group.bench_with_input(BenchmarkId::new("cancel", width), &width, |b, &width| {
        b.iter_custom(|iters| {
            (0..iters)
                .map(|_| {
                    run(width, width, true, true)
                        .cancel
                        .expect("siblings were cancelled")
                })
                .sum()
        });
    });
    group.finish();
}

criterion_group!(benches, structure_cost);
criterion_main!(benches);
