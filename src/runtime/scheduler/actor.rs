//! The scheduler actor: a thin shell around the [`Planner`], which makes
//! every decision. It turns [`ToScheduler`] messages into planner events
//! and carries out the planner's commands — handing executions to the
//! [`Executor`], answering start requests, cancelling scopes, publishing
//! events — so all scheduling state stays in one synchronous state machine
//! and nothing is shared between actors.

use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use serde_json::{Map, Value};

use super::executor::{Executor, LocalExecutor};
use super::planner::{PlanCommand, PlanEvent, Planner};
use super::protocol::{RunFinished, Slot, ToScheduler, sibling_failed_reason};
use crate::error::HasCode;
use crate::runtime::cancel::{CancelScope, ScopeKey, TURN_CANCELLED};
use crate::runtime::interaction::InteractionHub;
use crate::runtime::spec::RunSpec;

/// The scheduler actor.
pub struct Scheduler {
    spec: RunSpec,
    owner: Recipient<RunFinished>,
    planner: Planner,
    executor: Option<Box<dyn Executor>>,
    hub: Option<Addr<InteractionHub>>,
    /// The run's end is waiting for the hub to settle.
    settling: bool,
    /// The run's end (its `WorkflowExit`, its report) held while the hub
    /// settles: carried out then, or by `Drop` if the scheduler is
    /// stopped first.
    held_end: Option<Vec<PlanCommand>>,
    /// The arbiters executions run on (`RunSettings::threads` > 1).
    arbiters: Vec<ArbiterHandle>,
    /// The scopes of the live executions, by turn and slot.
    live: super::FastMap<(u64, Slot), Live>,
    /// The current parallel group's scope, by session turn.
    group: Option<(u64, CancelScope)>,
    finished: bool,
    started_at: Instant,
    /// Emptied command buffers, for the next event's commands: every
    /// sibling's start and end is an event (two, nested, since a sibling's
    /// start is fed as it is spawned), and a buffer allocated for each
    /// was a good part of this thread's allocations.
    spare: Vec<Vec<PlanCommand>>,
    /// The same for the start requests of siblings granted at spawn.
    spare_asked: Vec<(u64, Slot)>,
    /// Handling a [`ToScheduler::Batch`]: what its letters start is
    /// started once all of them are handled, not after each.
    batching: bool,
}

/// How the scheduler reaches a live execution's scope to stop it alone.
enum Live {
    /// The execution holds its scope while it can run: the scheduler keeps
    /// only its key. A sibling's scope is then dropped on its arbiter, and
    /// with it the scope's place in the cancellation tree, which the
    /// scheduler's thread had to take apart (locking the parent's node,
    /// which other threads had just written) for every sibling.
    Held(ScopeKey),
    /// The scheduler keeps the scope (an executor that may drop its own).
    Kept(CancelScope),
}

impl Live {
    fn stop(&self) {
        match self {
            Live::Held(key) => key.stop(),
            Live::Kept(scope) => scope.stop(),
        }
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("run_id", &self.spec.run_id)
            .field("live", &self.live.len())
            .finish()
    }
}

impl Scheduler {
    pub fn new(
        spec: RunSpec,
        hub: Option<Addr<InteractionHub>>,
        owner: Recipient<RunFinished>,
        arbiters: Vec<ArbiterHandle>,
    ) -> Scheduler {
        let mut planner = Planner::new(
            Arc::clone(&spec.pipeline),
            spec.run_id.clone(),
            Arc::clone(&spec.fields),
            spec.cap,
        );
        planner.set_run_record(run_record(&spec));
        planner.restore(spec.restore.clone());
        Scheduler {
            spec,
            owner,
            planner,
            executor: None,
            hub,
            settling: false,
            held_end: None,
            arbiters,
            live: super::FastMap::default(),
            group: None,
            finished: false,
            started_at: Instant::now(),
            spare: Vec::new(),
            spare_asked: Vec::new(),
            batching: false,
        }
    }

    /// Feeds one event to the planner and carries out its commands.
    /// Returns the units granted a start.
    fn step(&mut self, event: PlanEvent, ctx: &mut Context<Self>) -> Vec<usize> {
        let mut out = self.spare.pop().unwrap_or_default();
        self.planner.set_observed(self.spec.bus.has_observers());
        self.planner.handle(event, &mut out);
        self.carry_out(out, ctx)
    }

    fn carry_out(&mut self, mut buffer: Vec<PlanCommand>, ctx: &mut Context<Self>) -> Vec<usize> {
        let mut granted = Vec::new();
        // Siblings started by an executor that grants at spawn: their
        // start requests, fed to the planner once this batch is done.
        let mut asked = std::mem::take(&mut self.spare_asked);
        let mut commands = buffer.drain(..);
        while let Some(command) = commands.next() {
            match command {
                PlanCommand::Spawn(spawn) => {
                    let parent = match (&spawn.exec.slot, &self.group) {
                        (Slot::Unit(_), Some((turn, group))) if *turn == spawn.exec.turn => {
                            group.clone()
                        }
                        (Slot::Unit(_), _) => {
                            // The group's scope, made on its first spawn.
                            let group = self.spec.cancel.child();
                            self.group = Some((spawn.exec.turn, group.clone()));
                            group
                        }
                        _ => self.spec.cancel.clone(),
                    };
                    let group = spawn
                        .is_sibling()
                        .then(|| self.group.as_ref().map(|(_, g)| g.clone()))
                        .flatten();
                    let key = (spawn.exec.turn, spawn.exec.slot);
                    let executor = self.executor(ctx);
                    // Started together when this batch is carried out
                    // (or the letters' batch handled): one hand-over per
                    // arbiter, not one per execution.
                    executor.hold();
                    if spawn.is_sibling() {
                        asked.push((spawn.exec.turn, spawn.exec.slot));
                    }
                    let scope = executor.start(*spawn, &parent, group);
                    let live = if executor.executions_hold_their_scopes() {
                        Live::Held(scope.key())
                    } else {
                        Live::Kept(scope)
                    };
                    self.live.insert(key, live);
                }
                PlanCommand::Grant { unit } => granted.push(unit),
                // A started execution stops when its scope is cancelled;
                // one not yet granted is refused when it asks.
                PlanCommand::Cancel { turn, slot } => {
                    if let Some(scope) = self.live.get(&(turn, slot)) {
                        scope.stop();
                    }
                }
                PlanCommand::CancelGroup { sibling } => {
                    if let Some((_, group)) = &self.group {
                        group.cancel(sibling_failed_reason(&sibling));
                    }
                }
                // The run's end: the hub first handles what the executions
                // that just stopped sent it (their prompts' withdrawals),
                // so the log records them before the `WorkflowExit`.
                PlanCommand::Emit(event)
                    if event.name == crate::runtime::events::EventName::WorkflowExit
                        && self.hub.is_some()
                        && !self.settling =>
                {
                    self.settling = true;
                    self.held_end = Some(
                        std::iter::once(PlanCommand::Emit(event))
                            .chain(commands.by_ref())
                            .collect(),
                    );
                    if let Some(hub) = &self.hub {
                        ctx.wait(
                            hub.send(crate::runtime::interaction::Settle)
                                .into_actor(self)
                                .map(|_, act, ctx| {
                                    if let Some(rest) = act.held_end.take() {
                                        act.carry_out(rest, ctx);
                                    }
                                }),
                        );
                    }
                    break;
                }
                PlanCommand::Emit(event) => {
                    self.spec.bus.publish(event);
                }
                PlanCommand::Finish(mut report) => {
                    report.wall = self.started_at.elapsed();
                    report.budget = self.spec.settings.budget.as_ref().map(|b| b.report());
                    self.finished = true;
                    self.owner.do_send(RunFinished(*report));
                    ctx.stop();
                }
            }
        }
        drop(commands);
        self.spare.push(buffer);
        if !asked.is_empty() {
            // As a start request is answered: a budget tripped meanwhile
            // on another thread decides the run first, and the planner
            // refuses.
            self.check_budget(ctx);
            for (turn, slot) in asked.drain(..) {
                self.granted_at_spawn(turn, slot, ctx);
            }
        }
        self.spare_asked = asked;
        if !self.batching {
            self.start_held();
        }
        granted
    }

    /// Starts what the executor holds.
    fn start_held(&mut self) {
        if let Some(executor) = self.executor.as_mut() {
            executor.flush();
        }
    }

    /// The start request of a sibling that began without asking. Its group
    /// was live when the planner spawned it and nothing has been read
    /// since, so the planner grants it unless the budget tripped; if it
    /// does not, the sibling's scope is stopped, and it ends before it
    /// starts or, if it already has, cancelled.
    fn granted_at_spawn(&mut self, turn: u64, slot: Slot, ctx: &mut Context<Self>) {
        let Slot::Unit(unit) = slot else {
            return;
        };
        let key = (turn, slot);
        if !self
            .step(PlanEvent::StartRequested { turn, slot }, ctx)
            .contains(&unit)
            && let Some(scope) = self.live.get(&key)
        {
            scope.stop();
        }
    }

    /// The executor, made on first use (it needs the actor's address).
    fn executor(&mut self, ctx: &mut Context<Self>) -> &mut Box<dyn Executor> {
        let spec = &self.spec;
        let hub = &self.hub;
        let arbiters = &self.arbiters;
        self.executor.get_or_insert_with(|| {
            let local = LocalExecutor::new(
                spec.kit(),
                hub.clone(),
                ctx.address().recipient(),
                arbiters.clone(),
            );
            match &spec.executor {
                Some(factory) => factory.make(local, ctx.address().recipient()),
                None => Box::new(local),
            }
        })
    }

    /// Ends the run by its budget once the meter has tripped. A stage
    /// trips the meter before it reports, so the trip is decided before
    /// any report that follows it, whatever order the mailbox holds them
    /// in; the watcher spawned at start does the same when no report
    /// comes.
    fn check_budget(&mut self, ctx: &mut Context<Self>) {
        let over = self
            .spec
            .settings
            .budget
            .as_ref()
            .and_then(|b| b.exceeded());
        if let Some(over) = over {
            self.limit_reached(format!("{}: {over}", over.code()), ctx);
        }
    }

    /// A limit was reached: cancel the run strictly; it ends failed.
    fn limit_reached(&mut self, reason: String, ctx: &mut Context<Self>) {
        if self.finished || self.spec.cancel.is_cancelled() {
            return;
        }
        self.spec.cancel.cancel(reason.as_str());
        self.step(PlanEvent::LimitReached { reason }, ctx);
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped before it reported (a panic in a handler) still
    /// ends the run, so the session and the CLI never hang: with the end
    /// it held while the hub settled (its `WorkflowExit` and whole report),
    /// else as failed.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.spec.cancel.stop();
        let out = match self.held_end.take() {
            Some(held) => held,
            None => {
                let mut out = Vec::new();
                self.planner.abandon(
                    "ExtensionHost/ActorPanicked: the scheduler stopped unexpectedly".to_owned(),
                    &mut out,
                );
                out
            }
        };
        for command in out {
            match command {
                PlanCommand::Emit(event) => {
                    self.spec.bus.publish(event);
                }
                PlanCommand::Finish(mut report) => {
                    report.wall = self.started_at.elapsed();
                    report.budget = self.spec.settings.budget.as_ref().map(|b| b.report());
                    self.owner.do_send(RunFinished(*report));
                }
                _ => {}
            }
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Many siblings report at once; let the mailbox grow with the cap.
        ctx.set_mailbox_capacity(self.spec.cap.saturating_mul(4).max(64));
        self.started_at = Instant::now();
        // The budget's meter wakes the scheduler when it trips; the
        // scheduler decides what that does to the run.
        if let Some(budget) = &self.spec.settings.budget {
            let budget = Arc::clone(budget);
            ctx.spawn(async move { budget.tripped().await }.into_actor(self).map(
                |over, _act, ctx| {
                    ctx.notify(ToScheduler::LimitReached {
                        reason: format!("{}: {over}", over.code()),
                    });
                },
            ));
        }
        self.step(PlanEvent::Start, ctx);
    }

    fn stopped(&mut self, _ctx: &mut Context<Self>) {
        for arbiter in self.arbiters.drain(..) {
            arbiter.stop();
        }
    }
}

impl Handler<ToScheduler> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: ToScheduler, ctx: &mut Context<Self>) {
        match msg {
            ToScheduler::Report { exec, outcome } => {
                self.check_budget(ctx);
                self.live.remove(&(exec.turn, exec.slot));
                self.step(PlanEvent::Reported { exec, outcome }, ctx);
            }
            ToScheduler::CancelRun => {
                if self.finished {
                    return;
                }
                self.spec.cancel.cancel(TURN_CANCELLED);
                self.step(PlanEvent::CancelRun, ctx);
            }
            ToScheduler::LimitReached { reason } => self.limit_reached(reason, ctx),
            ToScheduler::Batch(letters) => {
                let nested = std::mem::replace(&mut self.batching, true);
                for letter in letters {
                    // As with letters of their own: none is read once the
                    // run is over, or while its end waits for the hub to
                    // settle (`ctx.wait` holds the mailbox back then; the
                    // rest of a batch would not be).
                    if self.finished || self.settling {
                        break;
                    }
                    self.handle(letter, ctx);
                }
                self.batching = nested;
                if !nested {
                    self.start_held();
                }
            }
        }
    }
}

/// What `WorkflowStarted` records besides the pipeline: the provider
/// (never its key), the run's limits and how `Bash` is confined.
fn run_record(spec: &RunSpec) -> Vec<(&'static str, Value)> {
    let mut limits = Map::new();
    limits.insert(
        "maxVisits".to_owned(),
        spec.pipeline.effective_max_visits().into(),
    );
    if let Some(d) = spec.max_run_time {
        limits.insert(
            "maxRunTime".to_owned(),
            crate::definition::duration::format_duration(d).into(),
        );
    }
    if let Some(budget) = &spec.settings.budget {
        let report = budget.report();
        if let Some(t) = report.max_tokens {
            limits.insert("maxTokens".to_owned(), t.into());
        }
        if let Some(c) = report.max_cost {
            limits.insert("maxCost".to_owned(), c.into());
        }
        if let Some(p) = budget.price() {
            limits.insert(
                "price".to_owned(),
                serde_json::json!({"input": p.input, "output": p.output}),
            );
        }
    }
    let mut fields = vec![
        (
            "provider",
            serde_json::to_value(spec.provider.info()).unwrap_or(Value::Null),
        ),
        ("limits", Value::Object(limits)),
        (
            "shellSandbox",
            crate::tools::sandbox::mode(spec.settings.sandbox.as_deref()).into(),
        ),
    ];
    if spec.settings.deny_network {
        fields.push(("network", "deny".into()));
    }
    if !spec.pipeline.mcp_servers.is_empty() {
        fields.push(("mcpServers", mcp_servers(spec)));
    }
    fields
}

/// The MCP servers of the run as `WorkflowStarted` records them: name,
/// transport and whether a stdio server runs in the shell sandbox (no
/// command line, URL or header: those may name secrets).
fn mcp_servers(spec: &RunSpec) -> Value {
    use crate::definition::mcp::McpTransport;
    let shell = crate::tools::sandbox::mode(spec.settings.sandbox.as_deref());
    Value::Array(
        spec.pipeline
            .mcp_servers
            .iter()
            .map(|s| match &s.transport {
                McpTransport::Stdio { sandbox, .. } => serde_json::json!({
                    "name": s.name,
                    "transport": "stdio",
                    "sandbox": if *sandbox { shell } else { "off" },
                }),
                McpTransport::Http { .. } => {
                    serde_json::json!({"name": s.name, "transport": "http"})
                }
            })
            .collect(),
    )
}
