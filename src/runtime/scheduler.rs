//! The scheduler actor: a thin shell around the [`Planner`]. It turns
//! messages from stage actors and the session into planner events and
//! carries out the planner's commands — starting stage-execution actors,
//! answering start requests, sending strict cancels, publishing events —
//! so all scheduling state stays in one synchronous state machine and
//! nothing is shared between actors.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use serde_json::{Map, Value};
use troupe_actors::EventBus;

use super::cancel::CancelScope;
use super::events::Event;
use super::ids::RunId;
use super::interaction::{InteractionHub, InteractorSpec};
use super::planner::{Exec, PlanCommand, PlanEvent, Planner, Spawn};
use super::stage::{RunSettings, StageRun};
use super::stage_actor::{StageActor, StageReport, StartRequest};
use super::summary::RunReport;
use crate::definition::{Pipeline, StageKind};
use crate::provider::Provider;
use crate::tools::{ToolSpec, stage_manifest};

/// What the scheduler needs to run a pipeline.
#[derive(Debug, Clone)]
pub struct RunSpec {
    pub pipeline: Arc<Pipeline>,
    pub run_id: RunId,
    pub fields: Arc<Map<String, Value>>,
    pub provider: Arc<dyn Provider>,
    pub bus: EventBus<Event>,
    pub settings: Arc<RunSettings>,
    /// Effective fan-out cap (CLI > pipeline.yaml > 8).
    pub cap: usize,
    /// The run's scope in the cancellation tree.
    pub cancel: CancelScope,
    /// Past it the run is cancelled and fails with
    /// `Session/RunTimeExceeded` (`--max-run-time`).
    pub max_run_time: Option<std::time::Duration>,
    /// Who may approve out-of-envelope tool calls; empty is headless.
    pub interactors: Vec<InteractorSpec>,
    /// How long an approval may wait for an answer (`None`: forever).
    pub approval_timeout: Option<std::time::Duration>,
    /// Hooks at the message-loop slots (the pipeline's, plus any a library
    /// user adds).
    pub hooks: Arc<crate::hooks::HookSet>,
}

/// Sent to the scheduler's owner when the run is over.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RunFinished(pub RunReport);

/// Cancel the whole run (Ctrl-C).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CancelRun;

/// A limit of the run was reached (`--max-run-time`, the budget): cancel
/// it strictly, like Ctrl-C, and end it as failed with `reason`
/// (`Class/Code: message`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct LimitReached {
    pub reason: String,
}

/// Where an execution asks to start, and where it reports.
type Links = (Arc<Recipient<StartRequest>>, Arc<Recipient<StageReport>>);

/// The scheduler actor.
pub struct Scheduler {
    spec: RunSpec,
    /// Shared by every execution: cloning an `Addr` allocates (actix gives
    /// each sender its own parking slot), an `Arc` clone does not.
    hub: Option<Arc<Addr<InteractionHub>>>,
    owner: Recipient<RunFinished>,
    /// Where executions ask to start and report, made once: an actix
    /// `Addr` or `Recipient` allocates on every clone, an `Arc` does not.
    links: Option<Links>,
    planner: Planner,
    /// The cancellation scopes of the current turn's live executions.
    live: HashMap<Exec, CancelScope>,
    /// The current parallel group's scope, by session turn.
    group: Option<(u64, CancelScope)>,
    /// Each LLM stage's tool manifest, built on its first execution.
    manifests: HashMap<String, Arc<Vec<ToolSpec>>>,
    finished: bool,
    started_at: Instant,
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
    ) -> Scheduler {
        let mut planner = Planner::new(
            Arc::clone(&spec.pipeline),
            spec.run_id.clone(),
            Arc::clone(&spec.fields),
            spec.cap,
        );
        planner.set_run_record(run_record(&spec));
        Scheduler {
            spec,
            hub: hub.map(Arc::new),
            owner,
            links: None,
            planner,
            live: HashMap::new(),
            group: None,
            manifests: HashMap::new(),
            finished: false,
            started_at: Instant::now(),
        }
    }

    /// Feeds one event to the planner and carries out its commands.
    /// Returns the units granted a start.
    fn step(&mut self, event: PlanEvent, ctx: &mut Context<Self>) -> Vec<usize> {
        let mut out = Vec::new();
        self.planner.set_observed(self.spec.bus.has_observers());
        self.planner.handle(event, &mut out);
        self.carry_out(out, ctx)
    }

    fn carry_out(&mut self, commands: Vec<PlanCommand>, ctx: &mut Context<Self>) -> Vec<usize> {
        let mut granted = Vec::new();
        for command in commands {
            match command {
                PlanCommand::Spawn(spawn) => self.spawn(*spawn, ctx),
                PlanCommand::Grant { unit } => granted.push(unit),
                // Usually a no-op: fail-fast was tripped by the failing
                // sibling and Ctrl-C cancels the run's token before the
                // planner hears of either. A started execution stops when
                // its token is cancelled; one not yet granted is refused
                // when it asks.
                PlanCommand::Cancel { exec } => {
                    if let Some(scope) = self.live.get(&exec) {
                        scope.token().cancel();
                    }
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
        granted
    }

    fn spawn(&mut self, spawn: Spawn, ctx: &mut Context<Self>) {
        let Spawn {
            exec,
            stage,
            ctx: stage_ctx,
            index,
            visit,
            turn,
            sibling,
        } = spawn;
        // Siblings share their group's scope, made on the group's first
        // spawn.
        let group = sibling.then(|| match &self.group {
            Some((t, group)) if *t == turn => group.clone(),
            _ => {
                let group = self.spec.cancel.child();
                self.group = Some((turn, group.clone()));
                group
            }
        });
        let scope = match &group {
            Some(group) => group.child(),
            None => self.spec.cancel.child(),
        };
        let tools = match (&stage.kind, self.manifests.get(&stage.id)) {
            (StageKind::Llm(_), Some(tools)) => Arc::clone(tools),
            (StageKind::Llm(def), None) => {
                let tools = Arc::new(stage_manifest(def));
                self.manifests.insert(stage.id.clone(), Arc::clone(&tools));
                tools
            }
            _ => Arc::default(),
        };
        let run = StageRun {
            pipeline: Arc::clone(&self.spec.pipeline),
            stage,
            ctx: stage_ctx,
            provider: Arc::clone(&self.spec.provider),
            bus: self.spec.bus.clone(),
            settings: Arc::clone(&self.spec.settings),
            index,
            visit,
            cancel: scope.token().clone(),
            hub: self.hub.clone(),
            hooks: Arc::clone(&self.spec.hooks),
            tools,
        };
        let (gate, report) = self
            .links
            .get_or_insert_with(|| {
                let me = ctx.address();
                (Arc::new(me.clone().recipient()), Arc::new(me.recipient()))
            })
            .clone();
        match exec {
            Exec::Unit(unit) => {
                StageActor::new(run, Some(unit), Some(gate), report, scope.clone(), group)
            }
            Exec::Sequential | Exec::Join => {
                StageActor::new(run, None, None, report, scope.clone(), None)
            }
        }
        .start();
        self.live.insert(exec, scope);
    }

    /// Ends the run by its budget once the meter has tripped (the watcher
    /// spawned at start does the same when no report comes).
    fn check_budget(&mut self, ctx: &mut Context<Self>) {
        let over = self
            .spec
            .settings
            .budget
            .as_ref()
            .and_then(|b| b.exceeded());
        if let Some(over) = over {
            use crate::error::HasCode;
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

    fn exec_of(&self, unit: Option<usize>) -> Exec {
        match unit {
            Some(u) => Exec::Unit(u),
            None if self.live.contains_key(&Exec::Join) => Exec::Join,
            None => Exec::Sequential,
        }
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped before it reported (a panic in a handler) still
    /// ends the run as failed, so the session and the CLI never hang.
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        self.spec.cancel.token().cancel();
        let mut out = Vec::new();
        self.planner.abandon(
            "ExtensionHost/ActorPanicked: the scheduler stopped unexpectedly".to_owned(),
            &mut out,
        );
        for command in out {
            match command {
                PlanCommand::Emit(event) => {
                    self.spec.bus.publish(event);
                }
                PlanCommand::Finish(mut report) => {
                    report.wall = self.started_at.elapsed();
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
                    use crate::error::HasCode;
                    ctx.notify(LimitReached {
                        reason: format!("{}: {over}", over.code()),
                    });
                },
            ));
        }
        self.step(PlanEvent::Start, ctx);
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
    }
    vec![
        (
            "provider",
            serde_json::to_value(spec.provider.info()).unwrap_or(Value::Null),
        ),
        ("limits", Value::Object(limits)),
        (
            "shellSandbox",
            crate::tools::sandbox::mode(spec.settings.sandbox.as_deref()).into(),
        ),
    ]
}

impl Handler<StartRequest> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: StartRequest, ctx: &mut Context<Self>) {
        self.check_budget(ctx);
        let granted = self.step(PlanEvent::StartRequested { unit: msg.unit }, ctx);
        if granted.contains(&msg.unit) {
            let _ = msg.reply.send(());
        }
        // Otherwise dropping the reply withdraws the unit.
    }
}

impl Handler<StageReport> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: StageReport, ctx: &mut Context<Self>) {
        // A stage trips the budget before it reports: the trip is decided
        // first, whichever message the mailbox delivers first.
        self.check_budget(ctx);
        let exec = self.exec_of(msg.unit);
        self.live.remove(&exec);
        self.step(
            PlanEvent::Reported {
                unit: msg.unit,
                stage_id: msg.stage_id,
                outcome: msg.outcome,
            },
            ctx,
        );
    }
}

impl Handler<CancelRun> for Scheduler {
    type Result = ();

    fn handle(&mut self, _msg: CancelRun, ctx: &mut Context<Self>) {
        if self.finished {
            return;
        }
        self.spec.cancel.cancel(super::cancel::TURN_CANCELLED);
        self.step(PlanEvent::CancelRun, ctx);
    }
}

impl Handler<LimitReached> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: LimitReached, ctx: &mut Context<Self>) {
        self.limit_reached(msg.reason, ctx);
    }
}
