//! The scheduler actor: owns all scheduling state of a run and talks to
//! stage actors only by messages. It walks the Next table; runs a sequential
//! stage as one session turn; runs a parallel group (static list or `map`)
//! as one compound turn through the `FanOut` core (cap, lazy feed, start
//! handshake, fail-fast, join barrier); enforces `maxVisits`.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;
use troupe_actors::{CancelReason, EventBus, FanOut, FanOutCommand, FanOutEvent, UnitOutcome};

use super::context::StageContext;
use super::events::{Event, EventName};
use super::ids::{RunId, stage_execution_id};
use super::result::{StageResult, Usage, Verdict};
use super::stage::{NextDecision, RunSettings, StageRun};
use super::stage_actor::{CancelStage, StageActor, StageOutcome, StageReport, StartRequest};
use super::summary::{GroupStats, RunReport, RunStatus, StageStats};
use crate::definition::{ParallelPlan, Pipeline, Siblings};
use crate::error::{HasCode, ValidationCode};
use crate::provider::Provider;

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
    pub cancel: CancellationToken,
}

/// Sent to the scheduler's owner when the run is over.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct RunFinished(pub RunReport);

/// Cancel the whole run (Ctrl-C).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct CancelRun;

/// A parallel group in flight.
struct Group {
    turn_id: String,
    plan: ParallelPlan,
    core: FanOut,
    /// Map items (shared), or the static sibling ids.
    items: Option<Arc<Vec<Value>>>,
    upstream_for_join: Arc<Vec<Arc<StageResult>>>,
    /// The state slot every sibling sees: taken once when the group starts,
    /// so siblings neither copy it nor see each other's results.
    slot: Arc<BTreeMap<String, Arc<StageResult>>>,
    visit: u32,
    addrs: HashMap<usize, Addr<StageActor>>,
    results: Vec<Option<Arc<StageResult>>>,
    joining: bool,
    failed: Option<(String, String)>,
    stats: GroupStats,
}

impl Group {
    fn sibling_id(&self, unit: usize) -> &str {
        match &self.plan.siblings {
            Siblings::Static(ids) => ids.get(unit).map_or("", String::as_str),
            Siblings::Map { stage, .. } => stage,
        }
    }
}

enum Current {
    Idle,
    Sequential {
        addr: Addr<StageActor>,
        turn_id: String,
        upstream: Arc<Vec<Arc<StageResult>>>,
    },
    Group(Box<Group>),
}

/// The scheduler actor.
pub struct Scheduler {
    spec: RunSpec,
    owner: Recipient<RunFinished>,
    results: BTreeMap<String, Arc<StageResult>>,
    visits: HashMap<String, u32>,
    turns: u64,
    current: Current,
    status: Option<RunStatus>,
    cancelled: bool,
    stats: BTreeMap<String, StageStats>,
    groups: Vec<GroupStats>,
    usage: Usage,
    started_at: Instant,
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("run_id", &self.spec.run_id)
            .finish()
    }
}

impl Scheduler {
    pub fn new(spec: RunSpec, owner: Recipient<RunFinished>) -> Scheduler {
        Scheduler {
            spec,
            owner,
            results: BTreeMap::new(),
            visits: HashMap::new(),
            turns: 0,
            current: Current::Idle,
            status: None,
            cancelled: false,
            stats: BTreeMap::new(),
            groups: Vec::new(),
            usage: Usage::default(),
            started_at: Instant::now(),
        }
    }

    fn event(&self, name: EventName) -> Event {
        Event::new(name, self.spec.run_id.as_str())
    }

    fn emit(&self, event: Event) {
        self.spec.bus.publish(event);
    }

    fn next_turn_id(&mut self) -> String {
        self.turns += 1;
        format!("{}/turn/{}", self.spec.run_id, self.turns)
    }

    /// Counts a visit; `Err` when `maxVisits` is exceeded.
    fn visit(&mut self, stage: &str) -> Result<u32, String> {
        let n = self.visits.entry(stage.to_owned()).or_insert(0);
        *n += 1;
        match self.spec.pipeline.max_visits {
            Some(max) if *n > max => Err(format!(
                "Session/MaxVisitsExceeded: stage `{stage}` entered {n} times; maxVisits is {max}"
            )),
            _ => Ok(*n),
        }
    }

    /// The state slot as it is now, shared by whoever reads it next.
    fn snapshot(&self) -> Arc<BTreeMap<String, Arc<StageResult>>> {
        Arc::new(self.results.clone())
    }

    fn context(
        &self,
        stage: &str,
        index: Option<usize>,
        visit: u32,
        upstream: Arc<Vec<Arc<StageResult>>>,
        slot: Arc<BTreeMap<String, Arc<StageResult>>>,
        item: Option<Value>,
    ) -> Arc<StageContext> {
        let name = match self.spec.pipeline.stage(stage).map(|s| &s.kind) {
            Some(crate::definition::StageKind::Llm(def)) => def.name.clone(),
            _ => stage.to_owned(),
        };
        Arc::new(StageContext {
            fields: Arc::clone(&self.spec.fields),
            upstream,
            results: slot,
            workflow_run_id: self.spec.run_id.to_string(),
            stage_execution_id: stage_execution_id(&self.spec.run_id, stage, index, visit),
            item,
            index,
            stage_id: stage.to_owned(),
            stage_name: name,
        })
    }

    fn stage_run(
        &self,
        stage: &str,
        ctx: Arc<StageContext>,
        index: Option<usize>,
        visit: u32,
    ) -> Option<StageRun> {
        let stage = self.spec.pipeline.stage(stage)?.clone();
        Some(StageRun {
            pipeline: Arc::clone(&self.spec.pipeline),
            stage,
            ctx,
            provider: Arc::clone(&self.spec.provider),
            bus: self.spec.bus.clone(),
            settings: Arc::clone(&self.spec.settings),
            index,
            visit,
            cancel: self.spec.cancel.child_token(),
        })
    }

    /// Starts a sequential stage as its own session turn.
    fn enter_sequential(
        &mut self,
        stage: &str,
        upstream: Arc<Vec<Arc<StageResult>>>,
        ctx: &mut Context<Self>,
    ) {
        let visit = match self.visit(stage) {
            Ok(v) => v,
            Err(reason) => return self.finish(RunStatus::Failed { reason }, ctx),
        };
        let turn_id = self.next_turn_id();
        self.emit(
            self.event(EventName::SessionTurnStart)
                .with("turnId", turn_id.as_str())
                .with("stages", json!([stage]))
                .with("execution", "sequential"),
        );
        let sctx = self.context(
            stage,
            None,
            visit,
            Arc::clone(&upstream),
            self.snapshot(),
            None,
        );
        let Some(run) = self.stage_run(stage, sctx, None, visit) else {
            return self.finish(
                RunStatus::Failed {
                    reason: format!("internal: unknown stage `{stage}`"),
                },
                ctx,
            );
        };
        let addr = StageActor::new(run, None, None, ctx.address().recipient()).start();
        self.current = Current::Sequential {
            addr,
            turn_id,
            upstream,
        };
    }

    /// Spawns a parallel group (one compound turn).
    fn enter_group(
        &mut self,
        plan: ParallelPlan,
        upstream: Arc<Vec<Arc<StageResult>>>,
        ctx: &mut Context<Self>,
    ) {
        let (total, items, visit_stage) = match &plan.siblings {
            Siblings::Static(ids) => (ids.len(), None, None),
            Siblings::Map { stage, over } => {
                // `over` sees the ctx of the stage that led here.
                let sctx =
                    self.context(stage, None, 0, Arc::clone(&upstream), self.snapshot(), None);
                let value = sctx.to_expr_value(over.source());
                match over.eval(&[("ctx", &value)]) {
                    Ok(Value::Array(items)) => {
                        (items.len(), Some(Arc::new(items)), Some(stage.clone()))
                    }
                    Ok(other) => {
                        let reason = format!(
                            "{}: map over `{}` gave {}, not a list",
                            ValidationCode::ExpressionFailed.code(),
                            over.source(),
                            crate::definition::expr::json_kind(&other)
                        );
                        return self.finish(RunStatus::Failed { reason }, ctx);
                    }
                    Err(e) => {
                        return self.finish(
                            RunStatus::Failed {
                                reason: format!("{}: {e}", ValidationCode::ExpressionFailed.code()),
                            },
                            ctx,
                        );
                    }
                }
            }
        };
        let mut visit = 1;
        match &visit_stage {
            Some(stage) => match self.visit(stage) {
                Ok(v) => visit = v,
                Err(reason) => return self.finish(RunStatus::Failed { reason }, ctx),
            },
            None => {
                if let Siblings::Static(ids) = &plan.siblings {
                    for id in ids.clone() {
                        match self.visit(&id) {
                            Ok(v) => visit = visit.max(v),
                            Err(reason) => return self.finish(RunStatus::Failed { reason }, ctx),
                        }
                    }
                }
            }
        }
        let turn_id = self.next_turn_id();
        let stages: Vec<String> = match &plan.siblings {
            Siblings::Static(ids) => ids.clone(),
            Siblings::Map { stage, .. } => vec![format!("{stage}[{total}]")],
        };
        self.emit(
            self.event(EventName::SessionTurnStart)
                .with("turnId", turn_id.as_str())
                .with("stages", json!(stages))
                .with("execution", "parallel")
                .with("width", total)
                .with("cap", self.spec.cap)
                .with("join", json!(plan.join)),
        );
        let mut core = FanOut::new(total, self.spec.cap);
        let mut cmds = Vec::new();
        core.start(&mut cmds);
        let stats = GroupStats {
            turn_id: turn_id.clone(),
            stage: stages.join(", "),
            width: total,
            cap: self.spec.cap,
            ..GroupStats::default()
        };
        let group = Group {
            turn_id,
            plan,
            core,
            items,
            upstream_for_join: Arc::new(Vec::new()),
            slot: self.snapshot(),
            visit,
            addrs: HashMap::new(),
            results: vec![None; total],
            joining: false,
            failed: None,
            stats,
        };
        self.current = Current::Group(Box::new(group));
        self.apply(cmds, ctx);
    }

    /// Carries out fan-out commands.
    fn apply(&mut self, cmds: Vec<FanOutCommand>, ctx: &mut Context<Self>) {
        for cmd in cmds {
            match cmd {
                FanOutCommand::Spawn { unit } => self.spawn_unit(unit, ctx),
                // Grants and denials are answered where the request arrives.
                FanOutCommand::Grant { .. } | FanOutCommand::Deny { .. } => {}
                FanOutCommand::CancelUnit { unit, reason } => {
                    if let Current::Group(g) = &self.current
                        && let Some(addr) = g.addrs.get(&unit)
                    {
                        let reason = match reason {
                            CancelReason::SiblingFailed => format!(
                                "ExtensionHost/ParallelSiblingFailure: sibling {} failed",
                                g.failed.as_ref().map_or("?", |f| f.0.as_str())
                            ),
                            CancelReason::Interrupted | CancelReason::Shutdown => {
                                "Cancellation/TurnCancelled".to_owned()
                            }
                        };
                        addr.do_send(CancelStage { reason });
                    }
                }
                FanOutCommand::Withdraw { unit } => {
                    if let Current::Group(g) = &mut self.current {
                        g.stats.withdrawn += 1;
                        if let Some(addr) = g.addrs.remove(&unit) {
                            addr.do_send(CancelStage {
                                reason: "withdrawn before start".to_owned(),
                            });
                        }
                    }
                }
                FanOutCommand::AllSucceeded => self.group_succeeded(ctx),
                FanOutCommand::GroupFailed { unit } => {
                    if let Current::Group(g) = &mut self.current {
                        let sibling = match &g.plan.siblings {
                            Siblings::Static(ids) => ids.get(unit).cloned().unwrap_or_default(),
                            Siblings::Map { stage, .. } => format!("{stage}#{unit}"),
                        };
                        let reason = g
                            .results
                            .get(unit)
                            .and_then(|r| r.as_ref())
                            .and_then(|r| r.reason.clone())
                            .unwrap_or_default();
                        g.failed = Some((sibling.clone(), reason.clone()));
                        g.stats.failed_sibling = Some(sibling.clone());
                        let ev = Event::new(
                            EventName::ParallelSiblingFailure,
                            self.spec.run_id.as_str(),
                        )
                        .with("code", "ExtensionHost/ParallelSiblingFailure")
                        .with("failedSibling", sibling.as_str())
                        .with("compoundTurnId", g.turn_id.as_str())
                        .with("reason", reason.as_str());
                        self.spec.bus.publish(ev);
                    }
                }
                FanOutCommand::GroupCancelled { .. } => {}
            }
        }
        self.maybe_end_group(ctx);
    }

    fn spawn_unit(&mut self, unit: usize, ctx: &mut Context<Self>) {
        let Current::Group(g) = &self.current else {
            return;
        };
        let stage = g.sibling_id(unit).to_owned();
        let (index, item) = match &g.items {
            Some(items) => (Some(unit), items.get(unit).cloned()),
            None => (None, None),
        };
        let visit = g.visit;
        let slot = Arc::clone(&g.slot);
        let sctx = self.context(&stage, index, visit, Arc::new(Vec::new()), slot, item);
        let Some(run) = self.stage_run(&stage, sctx, index, visit) else {
            return;
        };
        let me = ctx.address();
        let addr = StageActor::new(
            run,
            Some(unit),
            Some(me.clone().recipient()),
            me.recipient(),
        )
        .start();
        if let Current::Group(g) = &mut self.current {
            g.addrs.insert(unit, addr);
        }
    }

    fn group_succeeded(&mut self, ctx: &mut Context<Self>) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let upstream: Vec<Arc<StageResult>> = g.results.iter().flatten().cloned().collect();
        g.upstream_for_join = Arc::new(upstream);
        match g.plan.join.clone() {
            Some(join) => {
                g.joining = true;
                let upstream = Arc::clone(&g.upstream_for_join);
                let visit = match self.visit(&join) {
                    Ok(v) => v,
                    Err(reason) => return self.finish(RunStatus::Failed { reason }, ctx),
                };
                let sctx = self.context(&join, None, visit, upstream, self.snapshot(), None);
                let Some(run) = self.stage_run(&join, sctx, None, visit) else {
                    return;
                };
                let addr = StageActor::new(run, None, None, ctx.address().recipient()).start();
                if let Current::Group(g) = &mut self.current {
                    g.addrs.insert(usize::MAX, addr);
                }
            }
            None => {
                // No join: the run ends after the siblings.
                self.end_group_turn();
                self.finish(RunStatus::Ok, ctx);
            }
        }
    }

    fn end_group_turn(&mut self) {
        if let Current::Group(g) = std::mem::replace(&mut self.current, Current::Idle) {
            let mut stats = g.stats;
            stats.peak_running = g.core.peak_running();
            stats.cap_waits = g.core.cap_waits();
            self.emit(
                self.event(EventName::SessionTurnEnd)
                    .with("turnId", g.turn_id.as_str()),
            );
            self.groups.push(stats);
        }
    }

    /// Ends a failed or cancelled group once every started unit reported.
    fn maybe_end_group(&mut self, ctx: &mut Context<Self>) {
        let Current::Group(g) = &self.current else {
            return;
        };
        if g.joining
            || !g.core.is_finished()
            || matches!(g.core.state(), troupe_actors::GroupState::Succeeded)
        {
            return;
        }
        let failed = g.failed.clone();
        self.end_group_turn();
        match failed {
            Some((sibling, reason)) => self.finish(
                RunStatus::Failed {
                    reason: format!(
                        "ExtensionHost/ParallelSiblingFailure: sibling `{sibling}` failed: {reason}"
                    ),
                },
                ctx,
            ),
            None => self.finish(RunStatus::Cancelled, ctx),
        }
    }

    fn record(&mut self, result: &Arc<StageResult>) {
        let s = self.stats.entry(result.stage_id.clone()).or_default();
        match result.verdict {
            Verdict::Ok => s.ok += 1,
            Verdict::Fail => s.failed += 1,
            Verdict::Skipped => s.skipped += 1,
        }
        s.retries += u64::from(result.attempt_count.saturating_sub(1));
        s.cap_hits += u64::from(result.cap_hit);
        self.usage.add(result.usage);
        self.results
            .insert(result.stage_id.clone(), Arc::clone(result));
    }

    /// Applies a finished stage's Next() decision.
    fn follow(
        &mut self,
        next: NextDecision,
        result: Arc<StageResult>,
        upstream_of_result: Arc<Vec<Arc<StageResult>>>,
        ctx: &mut Context<Self>,
    ) {
        if self.cancelled {
            return self.finish(RunStatus::Cancelled, ctx);
        }
        if result.verdict == Verdict::Fail {
            let reason = format!(
                "stage `{}` failed: {}",
                result.stage_id,
                result.reason.clone().unwrap_or_default()
            );
            return self.finish(RunStatus::Failed { reason }, ctx);
        }
        match next {
            NextDecision::End => self.finish(RunStatus::Ok, ctx),
            NextDecision::Stage { id, transparent } => {
                let upstream = if transparent {
                    upstream_of_result
                } else {
                    Arc::new(vec![result])
                };
                self.enter_sequential(&id, upstream, ctx);
            }
            NextDecision::Parallel(plan) => self.enter_group(plan, Arc::new(vec![result]), ctx),
        }
    }

    fn finish(&mut self, status: RunStatus, ctx: &mut Context<Self>) {
        if self.status.is_some() {
            return;
        }
        let (label, reason) = match &status {
            RunStatus::Ok => ("ok", None),
            RunStatus::Failed { reason } => ("failed", Some(reason.clone())),
            RunStatus::Cancelled => ("cancelled", Some("Cancellation/TurnCancelled".to_owned())),
        };
        let mut ev = self.event(EventName::WorkflowExit).with("status", label);
        if let Some(r) = &reason {
            ev = ev.with("reason", r.as_str());
        }
        self.emit(ev);
        self.status = Some(status.clone());
        let report = RunReport {
            run_id: self.spec.run_id.to_string(),
            pipeline: self.spec.pipeline.id.clone(),
            status,
            stages: std::mem::take(&mut self.stats),
            groups: std::mem::take(&mut self.groups),
            usage: self.usage,
            wall: self.started_at.elapsed(),
            audit_path: None,
            results: self.results.clone(),
        };
        self.owner.do_send(RunFinished(report));
        ctx.stop();
    }
}

impl Drop for Scheduler {
    /// A scheduler dropped before it reported (a panic in a handler) still
    /// ends the run as failed, so the session and the CLI never hang.
    fn drop(&mut self) {
        if self.status.is_none() {
            self.spec.cancel.cancel();
            let reason =
                "ExtensionHost/ActorPanicked: the scheduler stopped unexpectedly".to_owned();
            self.emit(
                self.event(EventName::WorkflowExit)
                    .with("status", "failed")
                    .with("reason", reason.as_str()),
            );
            let report = RunReport {
                run_id: self.spec.run_id.to_string(),
                pipeline: self.spec.pipeline.id.clone(),
                status: RunStatus::Failed { reason },
                stages: std::mem::take(&mut self.stats),
                groups: std::mem::take(&mut self.groups),
                usage: self.usage,
                wall: self.started_at.elapsed(),
                audit_path: None,
                results: std::mem::take(&mut self.results),
            };
            self.owner.do_send(RunFinished(report));
        }
    }
}

impl Actor for Scheduler {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Context<Self>) {
        // Many siblings report at once; let the mailbox grow with the cap.
        ctx.set_mailbox_capacity(self.spec.cap.saturating_mul(4).max(64));
        self.started_at = Instant::now();
        let p = &self.spec.pipeline;
        self.emit(
            self.event(EventName::WorkflowStarted)
                .with("pipeline", p.id.as_str())
                .with("entry", p.entry.as_str())
                .with("parallelCap", self.spec.cap)
                .with("ctx", Value::Object((*self.spec.fields).clone())),
        );
        let entry = p.entry.clone();
        self.enter_sequential(&entry, Arc::new(Vec::new()), ctx);
    }
}

impl Handler<StartRequest> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: StartRequest, ctx: &mut Context<Self>) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let mut cmds = Vec::new();
        if g.core
            .handle(FanOutEvent::StartRequested { unit: msg.unit }, &mut cmds)
            .is_err()
        {
            return; // dropping the reply withdraws the unit
        }
        if cmds
            .iter()
            .any(|c| matches!(c, FanOutCommand::Grant { unit } if *unit == msg.unit))
        {
            let _ = msg.reply.send(());
        }
        self.apply(cmds, ctx);
    }
}

impl Handler<StageReport> for Scheduler {
    type Result = ();

    fn handle(&mut self, msg: StageReport, ctx: &mut Context<Self>) {
        let StageReport {
            unit,
            stage_id,
            outcome,
        } = msg;
        if let StageOutcome::Cancelled = &outcome {
            self.stats.entry(stage_id.clone()).or_default().cancelled += 1;
        }
        match std::mem::replace(&mut self.current, Current::Idle) {
            Current::Sequential {
                turn_id, upstream, ..
            } => {
                self.emit(
                    self.event(EventName::SessionTurnEnd)
                        .with("turnId", turn_id.as_str()),
                );
                match outcome {
                    StageOutcome::Exited(exited) => {
                        self.record(&exited.result);
                        self.follow(exited.next, exited.result, upstream, ctx);
                    }
                    StageOutcome::Cancelled | StageOutcome::Withdrawn => {
                        self.finish(RunStatus::Cancelled, ctx)
                    }
                }
            }
            Current::Group(g) if unit.is_none() && g.joining => {
                // The join ended: the compound turn ends after its Exit.
                let join_upstream = Arc::clone(&g.upstream_for_join);
                self.current = Current::Group(g);
                self.end_group_turn();
                match outcome {
                    StageOutcome::Exited(exited) => {
                        self.record(&exited.result);
                        self.follow(exited.next, exited.result, join_upstream, ctx);
                    }
                    StageOutcome::Cancelled | StageOutcome::Withdrawn => {
                        self.finish(RunStatus::Cancelled, ctx)
                    }
                }
            }
            Current::Group(mut g) => {
                let Some(unit) = unit else {
                    self.current = Current::Group(g);
                    return;
                };
                g.addrs.remove(&unit);
                let outcome = match outcome {
                    StageOutcome::Exited(exited) => {
                        let verdict = exited.result.verdict;
                        self.record(&exited.result);
                        if let Some(slot) = g.results.get_mut(unit) {
                            *slot = Some(exited.result);
                        }
                        match verdict {
                            Verdict::Ok => UnitOutcome::Ok,
                            Verdict::Skipped => UnitOutcome::Skipped,
                            Verdict::Fail => UnitOutcome::Failed,
                        }
                    }
                    StageOutcome::Cancelled => {
                        g.stats.cancelled += 1;
                        UnitOutcome::Failed
                    }
                    StageOutcome::Withdrawn => {
                        self.current = Current::Group(g);
                        self.maybe_end_group(ctx);
                        return;
                    }
                };
                let mut cmds = Vec::new();
                let _ = g
                    .core
                    .handle(FanOutEvent::Finished { unit, outcome }, &mut cmds);
                self.current = Current::Group(g);
                self.apply(cmds, ctx);
            }
            Current::Idle => {}
        }
    }
}

impl Handler<CancelRun> for Scheduler {
    type Result = ();

    fn handle(&mut self, _msg: CancelRun, ctx: &mut Context<Self>) {
        if self.cancelled || self.status.is_some() {
            return;
        }
        self.cancelled = true;
        self.spec.cancel.cancel();
        match &mut self.current {
            Current::Idle => self.finish(RunStatus::Cancelled, ctx),
            Current::Sequential { addr, .. } => addr.do_send(CancelStage {
                reason: "Cancellation/TurnCancelled".to_owned(),
            }),
            Current::Group(g) => {
                if g.joining {
                    for addr in g.addrs.values() {
                        addr.do_send(CancelStage {
                            reason: "Cancellation/TurnCancelled".to_owned(),
                        });
                    }
                    return;
                }
                let mut cmds = Vec::new();
                let _ = g.core.handle(
                    FanOutEvent::Cancel {
                        reason: CancelReason::Interrupted,
                    },
                    &mut cmds,
                );
                self.apply(cmds, ctx);
            }
        }
    }
}
