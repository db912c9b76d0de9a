//! The scheduler's decisions as a plain synchronous state machine: events
//! in, commands out. It walks the Next table, counts visits against
//! `maxVisits`, evaluates `map` lists, drives each parallel group through the
//! [`FanOut`] core, starts the join only after every sibling is ok or
//! skipped, and decides how the run ends. It owns the state slot
//! (`ctx.results`), because every read of it happens at one of its
//! decisions.
//!
//! It never touches an actor, a clock or a channel: the scheduler actor
//! feeds it messages and carries out its commands, and unit tests drive it
//! directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Map, Value, json};
use troupe_actors::{CancelReason, FanOut, FanOutCommand, FanOutEvent, GroupState, UnitOutcome};

use super::context::StageContext;
use super::events::{Event, EventName};
use super::ids::{RunId, stage_execution_id};
use super::result::{StageResult, Usage, Verdict};
use super::stage::NextDecision;
use super::stage_actor::StageOutcome;
use super::summary::{GroupStats, RunReport, RunStatus, StageStats};
use crate::definition::{ParallelPlan, Pipeline, Siblings, Stage, StageKind};
use crate::error::{HasCode, ValidationCode};

/// Which execution of the current turn a command or report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exec {
    /// The one stage of a sequential turn.
    Sequential,
    /// Sibling `n` of the parallel group.
    Unit(usize),
    /// The join of the parallel group.
    Join,
}

/// What the planner is told.
#[derive(Debug)]
pub enum PlanEvent {
    /// The run starts at the pipeline's entry stage.
    Start,
    /// Sibling `unit` asks to start (the start handshake).
    StartRequested { unit: usize },
    /// An execution ended. `unit` is the sibling index, `None` for the
    /// sequential stage or the join.
    Reported {
        unit: Option<usize>,
        stage_id: Arc<str>,
        outcome: StageOutcome,
    },
    /// Cancel the run strictly (Ctrl-C).
    CancelRun,
    /// A limit of the run was reached (run time, budget): cancel it
    /// strictly, like Ctrl-C, and end it as failed with `reason`.
    LimitReached { reason: String },
}

/// An execution to start.
#[derive(Debug)]
pub struct Spawn {
    pub exec: Exec,
    /// Shared by every execution of the stage.
    pub stage: Arc<Stage>,
    pub ctx: Arc<StageContext>,
    pub index: Option<usize>,
    pub visit: u32,
    /// The session turn the execution belongs to; siblings of one group
    /// share it.
    pub turn: u64,
    /// Whether it is a sibling of a parallel group (its fail-fast name is
    /// [`sibling_label`] of its stage and index).
    pub sibling: bool,
}

/// A stage as its executions share it.
#[derive(Debug)]
struct Shared {
    stage: Arc<Stage>,
    id: Arc<str>,
    /// What `{{stage.name}}` shows: an LLM stage's `name`, else its id.
    name: Arc<str>,
}

fn shared_stages(pipeline: &Pipeline) -> HashMap<String, Shared> {
    pipeline
        .stages
        .iter()
        .map(|stage| {
            let name: Arc<str> = match &stage.kind {
                StageKind::Llm(def) => def.name.as_str().into(),
                _ => stage.id.as_str().into(),
            };
            let shared = Shared {
                stage: Arc::new(stage.clone()),
                id: stage.id.as_str().into(),
                name,
            };
            (stage.id.clone(), shared)
        })
        .collect()
}

/// The name fail-fast gives a sibling, as in `ParallelSiblingFailure`:
/// `worker#3` for a map sibling, the stage id for a static one (which has
/// no index). Derived where it is needed rather than stored per sibling.
pub fn sibling_label(stage_id: &str, index: Option<usize>) -> String {
    match index {
        Some(i) => format!("{stage_id}#{i}"),
        None => stage_id.to_owned(),
    }
}

pub use super::cancel::TURN_CANCELLED;

/// The `StageCancelled` reason of a sibling cancelled because `sibling`
/// (its label, e.g. `worker#3`) failed. The planner and the failing
/// sibling's `FailFast` trip both use it, so the record reads the same
/// whichever reached the execution first.
pub fn sibling_failed_reason(sibling: &str) -> String {
    format!("ExtensionHost/ParallelSiblingFailure: sibling {sibling} failed")
}

/// What the planner asks the scheduler actor to do.
#[derive(Debug)]
pub enum PlanCommand {
    /// Start a stage-execution actor. Siblings (`Exec::Unit`) must ask to
    /// start before they run.
    Spawn(Box<Spawn>),
    /// Let sibling `unit` start.
    Grant { unit: usize },
    /// Cancel an execution strictly (ignored if it already ended). The
    /// scheduler cancels its token; the reason the execution records comes
    /// from its group's fail-fast, else it is [`TURN_CANCELLED`].
    Cancel { exec: Exec },
    /// Publish an event.
    Emit(Event),
    /// The run is over. `wall` is left for the caller to fill in.
    Finish(Box<RunReport>),
}

/// A parallel group in flight.
#[derive(Debug)]
struct Group {
    turn_id: String,
    plan: ParallelPlan,
    core: FanOut,
    /// Map items (shared), `None` for a static list.
    items: Option<Arc<Vec<Value>>>,
    upstream_for_join: Arc<Vec<Arc<StageResult>>>,
    /// The state slot every sibling sees: taken once when the group starts,
    /// so siblings neither copy it nor see each other's results.
    slot: Arc<BTreeMap<String, Arc<StageResult>>>,
    visit: u32,
    results: Vec<Option<Arc<StageResult>>>,
    joining: bool,
    failed: Option<(String, String)>,
    stats: GroupStats,
}

impl Group {
    fn sibling_stage(&self, unit: usize) -> &str {
        match &self.plan.siblings {
            Siblings::Static(ids) => ids.get(unit).map_or("", String::as_str),
            Siblings::Map { stage, .. } => stage,
        }
    }

    fn sibling_label(&self, unit: usize) -> String {
        let index = matches!(self.plan.siblings, Siblings::Map { .. }).then_some(unit);
        sibling_label(self.sibling_stage(unit), index)
    }
}

#[derive(Debug)]
enum Current {
    Idle,
    Sequential {
        turn_id: String,
        upstream: Arc<Vec<Arc<StageResult>>>,
    },
    Group(Box<Group>),
}

/// The scheduling state of one run.
#[derive(Debug)]
pub struct Planner {
    pipeline: Arc<Pipeline>,
    run_id: RunId,
    fields: Arc<Map<String, Value>>,
    cap: usize,
    results: BTreeMap<String, Arc<StageResult>>,
    visits: HashMap<String, u32>,
    turns: u64,
    current: Current,
    status: Option<RunStatus>,
    /// Set once the run is being cancelled: `None` for Ctrl-C (the run
    /// ends cancelled), the reason for a limit (the run ends failed).
    cancelled: Option<Option<String>>,
    /// Extra fields of `WorkflowStarted` (provider, limits).
    run_record: Vec<(&'static str, Value)>,
    stats: BTreeMap<String, StageStats>,
    groups: Vec<GroupStats>,
    usage: Usage,
    /// Whether anyone receives observer events; `Progress` is only built
    /// when someone does.
    observed: bool,
    /// Every stage, its id and its display name, shared by its executions
    /// instead of copied into each.
    stages: HashMap<String, Shared>,
    /// The upstream of a sibling: none, shared.
    no_upstream: Arc<Vec<Arc<StageResult>>>,
}

type Out = Vec<PlanCommand>;

impl Planner {
    pub fn new(
        pipeline: Arc<Pipeline>,
        run_id: RunId,
        fields: Arc<Map<String, Value>>,
        cap: usize,
    ) -> Planner {
        let stages = shared_stages(&pipeline);
        Planner {
            pipeline,
            run_id,
            fields,
            cap: cap.max(1),
            results: BTreeMap::new(),
            visits: HashMap::new(),
            turns: 0,
            current: Current::Idle,
            status: None,
            cancelled: None,
            run_record: Vec::new(),
            stats: BTreeMap::new(),
            groups: Vec::new(),
            usage: Usage::default(),
            observed: true,
            stages,
            no_upstream: Arc::default(),
        }
    }

    /// Tells the planner whether observer events (`Progress`) have anyone
    /// to receive them. Without observers it does not build them: one per
    /// finished sibling is a visible cost in a wide fan-out.
    pub fn set_observed(&mut self, observed: bool) {
        self.observed = observed;
    }

    /// Fields `WorkflowStarted` records besides the pipeline, its entry,
    /// cap and ctx: the provider and the run's limits.
    pub fn set_run_record(&mut self, record: Vec<(&'static str, Value)>) {
        self.run_record = record;
    }

    /// The run's status once it is decided.
    pub fn status(&self) -> Option<&RunStatus> {
        self.status.as_ref()
    }

    /// Processes one event, pushing the commands to carry out onto `out`.
    pub fn handle(&mut self, event: PlanEvent, out: &mut Out) {
        if self.status.is_some() {
            return;
        }
        match event {
            PlanEvent::Start => self.start(out),
            PlanEvent::StartRequested { unit } => self.start_requested(unit, out),
            PlanEvent::Reported {
                unit,
                stage_id,
                outcome,
            } => self.reported(unit, stage_id, outcome, out),
            PlanEvent::CancelRun => self.cancel_run(None, out),
            PlanEvent::LimitReached { reason } => self.cancel_run(Some(reason), out),
        }
    }

    /// Ends a run that was not decided (its scheduler stopped
    /// unexpectedly) as failed; does nothing once the run was decided.
    pub fn abandon(&mut self, reason: String, out: &mut Out) {
        if self.status.is_none() {
            self.finish(RunStatus::Failed { reason }, out);
        }
    }

    fn event(&self, name: EventName) -> Event {
        Event::new(name, self.run_id.as_str())
    }

    fn next_turn_id(&mut self) -> String {
        self.turns += 1;
        format!("{}/turn/{}", self.run_id, self.turns)
    }

    /// Counts a visit; `Err` when `maxVisits` is exceeded.
    fn visit(&mut self, stage: &str) -> Result<u32, String> {
        let n = self.visits.entry(stage.to_owned()).or_insert(0);
        *n += 1;
        let max = self.pipeline.effective_max_visits();
        if *n > max {
            let set = if self.pipeline.max_visits.is_some() {
                ""
            } else {
                " (the default; set `maxVisits` in pipeline.yaml to allow more)"
            };
            return Err(format!(
                "Session/MaxVisitsExceeded: stage `{stage}` entered {n} times; maxVisits is {max}{set}"
            ));
        }
        Ok(*n)
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
        let (stage_id, name) = match self.stages.get(stage) {
            Some(shared) => (Arc::clone(&shared.id), Arc::clone(&shared.name)),
            None => (stage.into(), stage.into()),
        };
        Arc::new(StageContext {
            fields: Arc::clone(&self.fields),
            upstream,
            results: slot,
            workflow_run_id: self.run_id.shared(),
            stage_execution_id: stage_execution_id(&self.run_id, stage, index, visit).into(),
            item,
            index,
            stage_id,
            stage_name: name,
        })
    }

    /// A spawn command, or the run's failure when the stage is unknown
    /// (the loader rules that out; this keeps a bad plan from hanging).
    fn spawn(
        &mut self,
        exec: Exec,
        stage_id: &str,
        ctx: Arc<StageContext>,
        index: Option<usize>,
        visit: u32,
        out: &mut Out,
    ) {
        match self.stages.get(stage_id) {
            Some(shared) => {
                let sibling = matches!((&exec, &self.current), (Exec::Unit(_), Current::Group(_)));
                out.push(PlanCommand::Spawn(Box::new(Spawn {
                    exec,
                    stage: Arc::clone(&shared.stage),
                    ctx,
                    index,
                    visit,
                    turn: self.turns,
                    sibling,
                })));
            }
            None => self.finish(
                RunStatus::Failed {
                    reason: format!("internal: unknown stage `{stage_id}`"),
                },
                out,
            ),
        }
    }

    fn start(&mut self, out: &mut Out) {
        if self.turns > 0 {
            return;
        }
        let p = Arc::clone(&self.pipeline);
        let mut started = self
            .event(EventName::WorkflowStarted)
            .with("pipeline", p.id.as_str())
            .with("entry", p.entry.as_str())
            .with("parallelCap", self.cap)
            .with("ctx", Value::Object((*self.fields).clone()));
        for (key, value) in std::mem::take(&mut self.run_record) {
            started = started.with(key, value);
        }
        out.push(PlanCommand::Emit(started));
        self.enter_sequential(&p.entry, Arc::new(Vec::new()), out);
    }

    /// Starts a sequential stage as its own session turn.
    fn enter_sequential(
        &mut self,
        stage: &str,
        upstream: Arc<Vec<Arc<StageResult>>>,
        out: &mut Out,
    ) {
        let visit = match self.visit(stage) {
            Ok(v) => v,
            Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
        };
        let turn_id = self.next_turn_id();
        out.push(PlanCommand::Emit(
            self.event(EventName::SessionTurnStart)
                .with("turnId", turn_id.as_str())
                .with("stages", json!([stage]))
                .with("execution", "sequential"),
        ));
        let ctx = self.context(
            stage,
            None,
            visit,
            Arc::clone(&upstream),
            self.snapshot(),
            None,
        );
        self.current = Current::Sequential { turn_id, upstream };
        self.spawn(Exec::Sequential, stage, ctx, None, visit, out);
    }

    /// Evaluates a `map` list in the context of the stage that led here.
    fn map_items(
        &self,
        stage: &str,
        over: &crate::definition::expr::Expr,
        upstream: &Arc<Vec<Arc<StageResult>>>,
    ) -> Result<Vec<Value>, String> {
        let sctx = self.context(stage, None, 0, Arc::clone(upstream), self.snapshot(), None);
        let value = sctx.to_expr_value(over.source());
        match over.eval(&[("ctx", &value)]) {
            Ok(Value::Array(items)) => Ok(items),
            Ok(other) => Err(format!(
                "{}: map over `{}` gave {}, not a list",
                ValidationCode::ExpressionFailed.code(),
                over.source(),
                crate::definition::expr::json_kind(&other)
            )),
            Err(e) => Err(format!("{}: {e}", ValidationCode::ExpressionFailed.code())),
        }
    }

    /// Spawns a parallel group (one compound turn).
    fn enter_group(
        &mut self,
        plan: ParallelPlan,
        upstream: Arc<Vec<Arc<StageResult>>>,
        out: &mut Out,
    ) {
        let (total, items, visit) = match &plan.siblings {
            Siblings::Map { stage, over } => {
                let items = match self.map_items(stage, over, &upstream) {
                    Ok(items) => items,
                    Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                };
                let visit = match self.visit(stage) {
                    Ok(v) => v,
                    Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                };
                (items.len(), Some(Arc::new(items)), visit)
            }
            Siblings::Static(ids) => {
                let mut visit = 1;
                for id in ids {
                    match self.visit(id) {
                        Ok(v) => visit = visit.max(v),
                        Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                    }
                }
                (ids.len(), None, visit)
            }
        };
        let turn_id = self.next_turn_id();
        let cap = plan.effective_cap(self.cap);
        let stages: Vec<String> = match &plan.siblings {
            Siblings::Static(ids) => ids.clone(),
            Siblings::Map { stage, .. } => vec![format!("{stage}[{total}]")],
        };
        out.push(PlanCommand::Emit(
            self.event(EventName::SessionTurnStart)
                .with("turnId", turn_id.as_str())
                .with("stages", json!(stages))
                .with("execution", "parallel")
                .with("width", total)
                .with("cap", cap)
                .with("join", json!(plan.join)),
        ));
        let mut core = FanOut::new(total, cap);
        let mut cmds = Vec::new();
        core.start(&mut cmds);
        let stats = GroupStats {
            turn_id: turn_id.clone(),
            stage: stages.join(", "),
            width: total,
            cap,
            ..GroupStats::default()
        };
        self.current = Current::Group(Box::new(Group {
            turn_id,
            plan,
            core,
            items,
            upstream_for_join: Arc::new(Vec::new()),
            slot: self.snapshot(),
            visit,
            results: vec![None; total],
            joining: false,
            failed: None,
            stats,
        }));
        self.apply(cmds, out);
    }

    /// Turns fan-out commands into plan commands.
    fn apply(&mut self, cmds: Vec<FanOutCommand>, out: &mut Out) {
        for cmd in cmds {
            match cmd {
                FanOutCommand::Spawn { unit } => self.spawn_unit(unit, out),
                FanOutCommand::Grant { unit } => out.push(PlanCommand::Grant { unit }),
                // A denied request is answered by not granting it.
                FanOutCommand::Deny { .. } => {}
                FanOutCommand::CancelUnit { unit, .. } => out.push(PlanCommand::Cancel {
                    exec: Exec::Unit(unit),
                }),
                FanOutCommand::Withdraw { unit } => {
                    if let Current::Group(g) = &mut self.current {
                        g.stats.withdrawn += 1;
                    }
                    out.push(PlanCommand::Cancel {
                        exec: Exec::Unit(unit),
                    });
                }
                FanOutCommand::AllSucceeded => self.group_succeeded(out),
                FanOutCommand::GroupFailed { unit } => self.group_failed(unit, out),
                FanOutCommand::GroupCancelled { .. } => {}
            }
        }
        self.maybe_end_group(out);
    }

    fn spawn_unit(&mut self, unit: usize, out: &mut Out) {
        let Current::Group(g) = &self.current else {
            return;
        };
        let stage = g.sibling_stage(unit).to_owned();
        let (index, item) = match &g.items {
            Some(items) => (Some(unit), items.get(unit).cloned()),
            None => (None, None),
        };
        let visit = g.visit;
        let slot = Arc::clone(&g.slot);
        let no_upstream = Arc::clone(&self.no_upstream);
        let ctx = self.context(&stage, index, visit, no_upstream, slot, item);
        self.spawn(Exec::Unit(unit), &stage, ctx, index, visit, out);
    }

    fn group_failed(&mut self, unit: usize, out: &mut Out) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let sibling = g.sibling_label(unit);
        let reason = g
            .results
            .get(unit)
            .and_then(|r| r.as_ref())
            .and_then(|r| r.reason.clone())
            .unwrap_or_else(|| "cancelled".to_owned());
        g.failed = Some((sibling.clone(), reason.clone()));
        g.stats.failed_sibling = Some(sibling.clone());
        let ev = Event::new(EventName::ParallelSiblingFailure, self.run_id.as_str())
            .with("code", "ExtensionHost/ParallelSiblingFailure")
            .with("failedSibling", sibling.as_str())
            .with("compoundTurnId", g.turn_id.as_str())
            .with("reason", reason.as_str());
        out.push(PlanCommand::Emit(ev));
    }

    fn group_succeeded(&mut self, out: &mut Out) {
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
                    Err(reason) => {
                        self.end_group_turn(out);
                        return self.finish(RunStatus::Failed { reason }, out);
                    }
                };
                let ctx = self.context(&join, None, visit, upstream, self.snapshot(), None);
                self.spawn(Exec::Join, &join, ctx, None, visit, out);
            }
            None => {
                // No join: the run ends after the siblings.
                self.end_group_turn(out);
                self.finish(RunStatus::Ok, out);
            }
        }
    }

    /// A coarse progress snapshot of the group (observer class: may be
    /// dropped under load; the next one corrects it).
    fn progress(&self, out: &mut Out) {
        let Current::Group(g) = &self.current else {
            return;
        };
        if !self.observed {
            return;
        }
        let c = &g.core;
        let done = c.succeeded() + c.skipped() + c.failed();
        out.push(PlanCommand::Emit(
            self.event(EventName::Progress)
                .with("turnId", g.turn_id.as_str())
                .with("width", g.stats.width)
                .with("done", done)
                .with("running", c.running())
                .with("waiting", c.waiting() + c.spawned_not_started())
                .with("failed", c.failed())
                .with("cancelled", g.stats.cancelled),
        ));
    }

    fn end_group_turn(&mut self, out: &mut Out) {
        if let Current::Group(g) = std::mem::replace(&mut self.current, Current::Idle) {
            let mut stats = g.stats;
            stats.peak_running = g.core.peak_running();
            stats.cap_waits = g.core.cap_waits();
            stats.never_started = stats.withdrawn + g.core.waiting();
            out.push(PlanCommand::Emit(
                self.event(EventName::SessionTurnEnd)
                    .with("turnId", g.turn_id.as_str()),
            ));
            self.groups.push(stats);
        }
    }

    /// Ends a failed or cancelled group once every started unit reported.
    fn maybe_end_group(&mut self, out: &mut Out) {
        let Current::Group(g) = &self.current else {
            return;
        };
        if g.joining || !g.core.is_finished() || g.core.state() == GroupState::Succeeded {
            return;
        }
        let failed = g.failed.clone();
        self.end_group_turn(out);
        match failed {
            Some((sibling, reason)) => self.finish(
                RunStatus::Failed {
                    reason: format!(
                        "ExtensionHost/ParallelSiblingFailure: sibling `{sibling}` failed: {reason}"
                    ),
                },
                out,
            ),
            None => {
                let status = self.cancelled_status();
                self.finish(status, out)
            }
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
        out: &mut Out,
    ) {
        if self.cancelled.is_some() {
            let status = self.cancelled_status();
            return self.finish(status, out);
        }
        if result.verdict == Verdict::Fail {
            let reason = format!(
                "stage `{}` failed: {}",
                result.stage_id,
                result.reason.clone().unwrap_or_default()
            );
            return self.finish(RunStatus::Failed { reason }, out);
        }
        match next {
            NextDecision::End => self.finish(RunStatus::Ok, out),
            NextDecision::Stage { id, transparent } => {
                let upstream = if transparent {
                    upstream_of_result
                } else {
                    Arc::new(vec![result])
                };
                self.enter_sequential(&id, upstream, out);
            }
            NextDecision::Parallel(plan) => self.enter_group(plan, Arc::new(vec![result]), out),
        }
    }

    fn start_requested(&mut self, unit: usize, out: &mut Out) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let mut cmds = Vec::new();
        // A protocol violation (a stale or duplicate request) is answered
        // by not granting it: the requester then reports Withdrawn.
        if g.core
            .handle(FanOutEvent::StartRequested { unit }, &mut cmds)
            .is_ok()
        {
            let granted = cmds
                .iter()
                .any(|c| matches!(c, FanOutCommand::Grant { .. }));
            self.apply(cmds, out);
            // Counts stay live: a sibling is running from its grant, not
            // only once the first one finishes.
            if granted {
                self.progress(out);
            }
        }
    }

    /// A sequential execution or a join ended: follow its Next, or end the
    /// run as cancelled when it did not complete.
    fn turn_ended(
        &mut self,
        outcome: StageOutcome,
        upstream: Arc<Vec<Arc<StageResult>>>,
        out: &mut Out,
    ) {
        match outcome {
            StageOutcome::Exited(exited) => {
                self.record(&exited.result);
                self.follow(exited.next, exited.result, upstream, out);
            }
            StageOutcome::Cancelled { .. }
            | StageOutcome::CancelledBeforeStart
            | StageOutcome::Withdrawn => {
                let status = self.cancelled_status();
                self.finish(status, out)
            }
        }
    }

    fn reported(
        &mut self,
        unit: Option<usize>,
        stage_id: Arc<str>,
        outcome: StageOutcome,
        out: &mut Out,
    ) {
        if let StageOutcome::Cancelled { usage } = &outcome {
            self.usage.add(*usage);
            match self.stats.get_mut(&*stage_id) {
                Some(stats) => stats.cancelled += 1,
                None => {
                    let stats = self.stats.entry(stage_id.to_string()).or_default();
                    stats.cancelled += 1;
                }
            }
        }
        match (std::mem::replace(&mut self.current, Current::Idle), unit) {
            (Current::Sequential { turn_id, upstream }, None) => {
                out.push(PlanCommand::Emit(
                    self.event(EventName::SessionTurnEnd)
                        .with("turnId", turn_id.as_str()),
                ));
                self.turn_ended(outcome, upstream, out);
            }
            (Current::Group(g), None) if g.joining => {
                // The join ended: the compound turn ends after its Exit.
                let join_upstream = Arc::clone(&g.upstream_for_join);
                self.current = Current::Group(g);
                self.end_group_turn(out);
                self.turn_ended(outcome, join_upstream, out);
            }
            (Current::Group(mut g), Some(unit)) if unit < g.results.len() => {
                let outcome = match outcome {
                    StageOutcome::Exited(exited) => {
                        let verdict = exited.result.verdict;
                        self.record(&exited.result);
                        g.results[unit] = Some(exited.result);
                        match verdict {
                            Verdict::Ok => UnitOutcome::Ok,
                            Verdict::Skipped => UnitOutcome::Skipped,
                            Verdict::Fail => UnitOutcome::Failed,
                        }
                    }
                    StageOutcome::Cancelled { .. } => {
                        g.stats.cancelled += 1;
                        UnitOutcome::Failed
                    }
                    // Granted, so the core counts it running; it never
                    // started, so the summary counts it as never started.
                    StageOutcome::CancelledBeforeStart => {
                        g.stats.withdrawn += 1;
                        UnitOutcome::Failed
                    }
                    StageOutcome::Withdrawn => {
                        self.current = Current::Group(g);
                        self.maybe_end_group(out);
                        return;
                    }
                };
                let mut cmds = Vec::new();
                let _ = g
                    .core
                    .handle(FanOutEvent::Finished { unit, outcome }, &mut cmds);
                self.current = Current::Group(g);
                self.apply(cmds, out);
                self.progress(out);
            }
            // A report that belongs to no execution of this turn.
            (other, _) => self.current = other,
        }
    }

    /// How a run that is being cancelled ends: cancelled after Ctrl-C,
    /// failed with the limit's reason after a limit.
    fn cancelled_status(&self) -> RunStatus {
        match &self.cancelled {
            Some(Some(reason)) => RunStatus::Failed {
                reason: reason.clone(),
            },
            _ => RunStatus::Cancelled,
        }
    }

    /// Cancels the run strictly: `limit` is `None` for Ctrl-C, else the
    /// reason the run then fails with.
    fn cancel_run(&mut self, limit: Option<String>, out: &mut Out) {
        if self.cancelled.is_some() {
            return;
        }
        self.cancelled = Some(limit);
        match &mut self.current {
            Current::Idle => {
                let status = self.cancelled_status();
                self.finish(status, out)
            }
            Current::Sequential { .. } => out.push(PlanCommand::Cancel {
                exec: Exec::Sequential,
            }),
            Current::Group(g) if g.joining => out.push(PlanCommand::Cancel { exec: Exec::Join }),
            Current::Group(g) => {
                let mut cmds = Vec::new();
                let _ = g.core.handle(
                    FanOutEvent::Cancel {
                        reason: CancelReason::Interrupted,
                    },
                    &mut cmds,
                );
                self.apply(cmds, out);
            }
        }
    }

    /// The per-stage counts in the order the pipeline declares its stages.
    fn stats_in_pipeline_order(&mut self) -> Vec<(String, StageStats)> {
        let mut stats = std::mem::take(&mut self.stats);
        let mut ordered: Vec<(String, StageStats)> = self
            .pipeline
            .stages
            .iter()
            .filter_map(|s| stats.remove_entry(&s.id))
            .collect();
        ordered.extend(stats);
        ordered
    }

    fn finish(&mut self, status: RunStatus, out: &mut Out) {
        if self.status.is_some() {
            return;
        }
        let (label, reason) = match &status {
            RunStatus::Ok => ("ok", None),
            RunStatus::Failed { reason } => ("failed", Some(reason.clone())),
            RunStatus::Cancelled => ("cancelled", Some(TURN_CANCELLED.to_owned())),
        };
        let mut ev = self.event(EventName::WorkflowExit).with("status", label);
        if let Some(r) = &reason {
            ev = ev.with("reason", r.as_str());
        }
        out.push(PlanCommand::Emit(ev));
        self.status = Some(status.clone());
        out.push(PlanCommand::Finish(Box::new(RunReport {
            run_id: self.run_id.to_string(),
            pipeline: self.pipeline.id.clone(),
            status,
            stages: self.stats_in_pipeline_order(),
            groups: std::mem::take(&mut self.groups),
            usage: self.usage,
            wall: Duration::ZERO,
            budget: None,
            audit_path: None,
            results: std::mem::take(&mut self.results),
        })));
    }
}
