//! The scheduler's decisions as a plain synchronous state machine: events
//! in, commands out. It walks the Next table (one [`next_of`] step per
//! Exit), counts visits against `maxVisits`, evaluates `map` lists, drives
//! each parallel group through the [`FanOut`] core (cap, start handshake,
//! fail-fast, join barrier), and decides how the run ends. It owns the
//! state slot (`ctx.results`), because every read of it happens at one of
//! its decisions.
//!
//! Fail-fast is decided here, from the reports alone: a sibling that
//! failed may cancel its group's token on its way out (so the others stop
//! at once), but a sibling's `Cancelled` report never decides the group;
//! its failing sibling's `Exited` report does, and when several siblings
//! failed, the one whose `StageExited` came first (lowest `seq`) is named,
//! whatever order the reports arrive in.
//!
//! A resumed run hands it the stored results: an execution with a stored
//! `ok`/`skipped` result is not run again, the walk goes on from its
//! result, and events already in the audit log are not emitted twice.
//!
//! It never touches an actor, a clock or a channel: the scheduler actor
//! feeds it messages and carries out its commands, and unit tests drive it
//! directly.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use std::collections::HashSet;

use serde_json::{Map, Value, json};
use troupe_actors::{CancelReason, FanOut, FanOutCommand, FanOutEvent, GroupState, UnitOutcome};

mod contexts;
mod group;

use super::next::{NextDecision, next_of};
use super::protocol::{ExecKey, Slot, StageOutcome, sibling_label};
use crate::definition::{ParallelPlan, Pipeline, Siblings, Stage, StageKind};
use crate::error::{HasCode, ValidationCode};
use crate::runtime::context::{SharedContext, StageContext};
use crate::runtime::events::{Event, EventName};
use crate::runtime::ids::{RunId, stage_execution_id};
use crate::runtime::result::{Kept, StageResult, Usage, Verdict};
use crate::runtime::summary::{GroupStats, RunReport, RunStatus, StageStats};
use group::Group;

/// What the planner is told.
#[derive(Debug)]
pub enum PlanEvent {
    /// The run starts at the pipeline's entry stage.
    Start,
    /// A sibling's start request, which the scheduler feeds as it spawns
    /// the sibling (the core's start handshake): the execution's turn and
    /// slot, without its ids (a stage's id is shared by every sibling, and
    /// each clone of it a write to a line the arbiters write too).
    StartRequested { turn: u64, slot: Slot },
    /// An execution ended.
    Reported {
        exec: ExecKey,
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
    /// Its identity: turn, slot and `stageExecutionId`.
    pub exec: ExecKey,
    /// Shared by every execution of the stage.
    pub stage: Arc<Stage>,
    pub ctx: Arc<StageContext>,
    pub index: Option<usize>,
    pub visit: u32,
}

impl Spawn {
    /// A sibling of a parallel group: its start is requested as it is
    /// spawned, and its group shares a cancellation scope.
    pub fn is_sibling(&self) -> bool {
        matches!(self.exec.slot, Slot::Unit(_))
    }
}

/// What a resumed run already has: the stored results of executions that
/// finished (by `stageExecutionId`) and the session turns the audit log
/// already shows as started or ended.
#[derive(Debug, Default, Clone)]
pub struct Restore {
    /// A new session of an earlier run: `WorkflowResumed` opens it
    /// instead of `WorkflowStarted`.
    pub resumed: bool,
    /// Packed as stored (see `Kept`), by the id each names its execution
    /// with; shared, since a run's spec and its scheduler each hold the
    /// restore, and a million stored results were copied twice.
    pub results: Arc<HashMap<Arc<str>, Kept>>,
    pub turns_started: HashSet<String>,
    pub turns_ended: HashSet<String>,
}

/// A stage as its executions share it.
#[derive(Debug)]
struct Shared {
    stage: Arc<Stage>,
    id: Arc<str>,
    /// What `{{stage.name}}` shows: an LLM stage's `name`, else its id.
    name: Arc<str>,
}

fn shared_stages(pipeline: &Pipeline) -> super::FastMap<String, Shared> {
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

pub use super::protocol::TURN_CANCELLED;

/// What the planner asks the scheduler actor to do.
#[derive(Debug)]
pub enum PlanCommand {
    /// Start a stage-execution actor. Siblings (`Slot::Unit`) must ask to
    /// start before they run.
    Spawn(Box<Spawn>),
    /// Let sibling `unit` of the current group start.
    Grant { unit: usize },
    /// Cancel an execution of turn `turn` strictly (ignored if it already
    /// ended). The scheduler cancels its scope.
    Cancel { turn: u64, slot: Slot },
    /// The current group failed because `sibling` (its label) failed:
    /// cancel the group's scope with that reason.
    CancelGroup { sibling: String },
    /// Publish an event.
    Emit(Event),
    /// The run is over. `wall` is left for the caller to fill in.
    Finish(Box<RunReport>),
}

#[derive(Debug)]
enum Current {
    Idle,
    Sequential {
        turn_id: String,
        upstream: Arc<Vec<Kept>>,
        stage: Arc<Stage>,
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
    results: BTreeMap<String, Kept>,
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
    stages: super::FastMap<String, Shared>,
    /// The upstream of a sibling: none, shared.
    no_upstream: Arc<Vec<Kept>>,
    /// The name of the sibling being spawned, kept between spawns: a copy
    /// made for each was an allocation per sibling on this thread.
    spawning: String,
    /// What a resumed run already has.
    restore: Restore,
    /// Every result of the run, in the order the executions ended
    /// (stored ones of a resumed run first).
    all_results: Vec<Kept>,
    /// The fan-out core's commands of the event being handled: one
    /// buffer kept, not one allocated for each sibling's start and end.
    fan_out: Vec<FanOutCommand>,
    /// The shared part of the last context made: the siblings of a
    /// fan-out take it whole (one reference count each), not piece by
    /// piece.
    last_shared: Option<Arc<SharedContext>>,
    /// A resumed run's stored results met as the walk reaches their
    /// stages, reported one after another rather than each inside the
    /// last (a loop resumed after thousands of turns would nest as deep).
    replay: std::collections::VecDeque<(ExecKey, StageOutcome)>,
    replaying: bool,
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
            spawning: String::new(),
            restore: Restore::default(),
            all_results: Vec::new(),
            fan_out: Vec::new(),
            last_shared: None,
            replay: std::collections::VecDeque::new(),
            replaying: false,
        }
    }

    /// Resumes a run: executions with a stored `ok` or `skipped` result
    /// are not run again, and turns the audit log already shows are not
    /// announced twice. Call before `Start`.
    pub fn restore(&mut self, restore: Restore) {
        self.restore = restore;
    }

    /// The stored result of an execution that need not run again.
    fn restored(&self, id: &str) -> Option<Kept> {
        self.restore
            .results
            .get(id)
            .filter(|r| r.verdict() != Verdict::Fail)
            .cloned()
    }

    /// `SessionTurnStart`, unless the audit log already has it.
    fn turn_start(&self, turn_id: &str, event: Event, out: &mut Out) {
        if !self.restore.turns_started.contains(turn_id) {
            out.push(PlanCommand::Emit(event));
        }
    }

    /// `SessionTurnEnd`, unless the audit log already has it.
    fn turn_end(&self, turn_id: &str, out: &mut Out) {
        if !self.restore.turns_ended.contains(turn_id) {
            out.push(PlanCommand::Emit(
                self.event(EventName::SessionTurnEnd)
                    .with("turnId", turn_id),
            ));
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
            PlanEvent::StartRequested { turn, slot } => self.start_requested(turn, slot, out),
            PlanEvent::Reported { exec, outcome } => self.reported(exec, outcome, out),
            PlanEvent::CancelRun => self.cancel_run(None, out),
            PlanEvent::LimitReached { reason } => self.cancel_run(Some(reason), out),
        }
    }

    /// Ends a run whose scheduler stopped unexpectedly: one not decided
    /// as failed; one decided whose report the scheduler lost before
    /// carrying it out (a panic in between) with that decision and what
    /// the planner still holds, so the session never waits for a report.
    /// (An end held while the hub settles is the scheduler's to send.)
    pub fn abandon(&mut self, reason: String, out: &mut Out) {
        match self.status.clone() {
            None => self.finish(RunStatus::Failed { reason }, out),
            Some(status) => out.push(PlanCommand::Finish(Box::new(self.report(status)))),
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

    /// A spawn command (or, in a resumed run, the stored result of an
    /// execution that finished before), or the run's failure when the
    /// stage is unknown (the loader rules that out; this keeps a bad plan
    /// from hanging).
    fn spawn(
        &mut self,
        slot: Slot,
        stage_id: &str,
        ctx: Arc<StageContext>,
        index: Option<usize>,
        visit: u32,
        out: &mut Out,
    ) {
        let Some(shared) = self.stages.get(stage_id) else {
            return self.finish(
                RunStatus::Failed {
                    reason: format!("internal: unknown stage `{stage_id}`"),
                },
                out,
            );
        };
        let exec = ExecKey {
            turn: self.turns,
            slot,
            id: Arc::clone(&ctx.stage_execution_id),
            stage: Arc::clone(&shared.id),
        };
        if let Some(result) = self.restored(&exec.id) {
            // Finished before the run was interrupted: its Exit is in the
            // store (and the log); the walk goes on from it.
            self.replay
                .push_back((exec, StageOutcome::Exited { result, seq: 0 }));
            if !self.replaying {
                self.replaying = true;
                while let Some((exec, outcome)) = self.replay.pop_front() {
                    self.reported(exec, outcome, out);
                }
                self.replaying = false;
            }
            return;
        }
        out.push(PlanCommand::Spawn(Box::new(Spawn {
            exec,
            stage: Arc::clone(&shared.stage),
            ctx,
            index,
            visit,
        })));
    }

    fn start(&mut self, out: &mut Out) {
        if self.turns > 0 {
            return;
        }
        let p = Arc::clone(&self.pipeline);
        let opening = if self.restore.resumed {
            EventName::WorkflowResumed
        } else {
            EventName::WorkflowStarted
        };
        let mut started = self
            .event(opening)
            .with("pipeline", p.id.as_str())
            .with("entry", p.entry.as_str())
            .with("parallelCap", self.cap)
            .with("ctx", Value::Object((*self.fields).clone()));
        for (key, value) in std::mem::take(&mut self.run_record) {
            started = started.with(key, value);
        }
        if self.restore.resumed {
            let stored = self
                .restore
                .results
                .values()
                .filter(|r| r.verdict() != Verdict::Fail)
                .count();
            started = started.with("storedResults", stored);
        }
        out.push(PlanCommand::Emit(started));
        self.enter_sequential(&p.entry, Arc::new(Vec::new()), out);
    }

    /// Starts a sequential stage as its own session turn.
    fn enter_sequential(&mut self, stage: &str, upstream: Arc<Vec<Kept>>, out: &mut Out) {
        let visit = match self.visit(stage) {
            Ok(v) => v,
            Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
        };
        let turn_id = self.next_turn_id();
        let start = self
            .event(EventName::SessionTurnStart)
            .with("turnId", turn_id.as_str())
            .with("stages", json!([stage]))
            .with("execution", "sequential");
        self.turn_start(&turn_id, start, out);
        let ctx = self.context(
            stage,
            None,
            visit,
            Arc::clone(&upstream),
            self.snapshot(),
            None,
        );
        let Some(shared) = self.stages.get(stage).map(|s| Arc::clone(&s.stage)) else {
            return self.finish(
                RunStatus::Failed {
                    reason: format!("internal: unknown stage `{stage}`"),
                },
                out,
            );
        };
        self.current = Current::Sequential {
            turn_id,
            upstream,
            stage: shared,
        };
        self.spawn(Slot::Sequential, stage, ctx, None, visit, out);
    }

    fn record(&mut self, result: &Kept) {
        let count = |s: &mut StageStats| {
            match result.verdict() {
                Verdict::Ok => s.ok += 1,
                Verdict::Fail => s.failed += 1,
                Verdict::Skipped => s.skipped += 1,
            }
            s.retries += u64::from(result.attempt_count().saturating_sub(1));
            s.cap_hits += u64::from(result.cap_hit());
        };
        // Once per sibling: the stage's id is copied only the first time
        // it is seen, not for every lookup.
        let stage = result.stage_id();
        match self.stats.get_mut(stage) {
            Some(s) => count(s),
            None => count(self.stats.entry(stage.to_owned()).or_default()),
        }
        self.usage.add(result.usage());
        match self.results.get_mut(stage) {
            Some(latest) => *latest = result.clone(),
            None => {
                self.results.insert(stage.to_owned(), result.clone());
            }
        }
        self.all_results.push(result.clone());
    }

    /// Walks one step of the Next table from a finished execution.
    fn follow(
        &mut self,
        stage: &Stage,
        result: Arc<StageResult>,
        upstream_of_result: Arc<Vec<Kept>>,
        out: &mut Out,
    ) {
        let next = next_of(&self.pipeline, stage, &result);
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
                    Arc::new(vec![Kept::Whole(result)])
                };
                self.enter_sequential(&id, upstream, out);
            }
            NextDecision::Parallel(plan) => {
                self.enter_group(plan, Arc::new(vec![Kept::Whole(result)]), out)
            }
        }
    }

    fn start_requested(&mut self, turn: u64, slot: Slot, out: &mut Out) {
        let Slot::Unit(unit) = slot else {
            return;
        };
        if turn != self.turns {
            return;
        }
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let mut cmds = std::mem::take(&mut self.fan_out);
        // A protocol violation (a stale or duplicate request) is answered
        // by not granting it: the scheduler then stops the sibling's scope,
        // and it reports that it never started.
        if g.core
            .handle(FanOutEvent::StartRequested { unit }, &mut cmds)
            .is_ok()
        {
            let granted = cmds
                .iter()
                .any(|c| matches!(c, FanOutCommand::Grant { .. }));
            self.apply(&mut cmds, out);
            // Counts stay live: a sibling is running from its grant, not
            // only once the first one finishes.
            if granted {
                self.progress(out);
            }
        }
        cmds.clear();
        self.fan_out = cmds;
    }

    /// A sequential execution or a join ended: follow its Next, or end the
    /// run as cancelled when it did not complete.
    fn turn_ended(
        &mut self,
        stage: &Stage,
        outcome: StageOutcome,
        upstream: Arc<Vec<Kept>>,
        out: &mut Out,
    ) {
        match outcome {
            StageOutcome::Exited { result, .. } => {
                self.record(&result);
                self.follow(stage, result.result(), upstream, out);
            }
            StageOutcome::Cancelled { .. } | StageOutcome::CancelledBeforeStart => {
                let status = self.cancelled_status();
                self.finish(status, out)
            }
        }
    }

    fn reported(&mut self, exec: ExecKey, outcome: StageOutcome, out: &mut Out) {
        if exec.turn != self.turns {
            // A report of an earlier turn: nothing of it is live.
            return;
        }
        if let StageOutcome::Cancelled { usage } = &outcome {
            self.usage.add(*usage);
            match self.stats.get_mut(&*exec.stage) {
                Some(stats) => stats.cancelled += 1,
                None => {
                    let stats = self.stats.entry(exec.stage.to_string()).or_default();
                    stats.cancelled += 1;
                }
            }
        }
        match (
            std::mem::replace(&mut self.current, Current::Idle),
            exec.slot,
        ) {
            (
                Current::Sequential {
                    turn_id,
                    upstream,
                    stage,
                },
                Slot::Sequential,
            ) => {
                self.turn_end(&turn_id, out);
                self.turn_ended(&stage, outcome, upstream, out);
            }
            (Current::Group(g), Slot::Join) if g.joining => {
                // The join ended: the compound turn ends after its Exit.
                let join_upstream = Arc::clone(&g.upstream_for_join);
                let join = g
                    .plan
                    .join
                    .as_deref()
                    .and_then(|j| self.stages.get(j))
                    .map(|s| Arc::clone(&s.stage));
                self.current = Current::Group(g);
                self.end_group_turn(out);
                match join {
                    Some(stage) => self.turn_ended(&stage, outcome, join_upstream, out),
                    None => self.finish(
                        RunStatus::Failed {
                            reason: "internal: the join has no stage".to_owned(),
                        },
                        out,
                    ),
                }
            }
            (Current::Group(mut g), Slot::Unit(unit)) if unit < g.results.len() => {
                let outcome = match outcome {
                    StageOutcome::Exited { result, seq } => {
                        let verdict = result.verdict();
                        self.record(&result);
                        g.results[unit] = Some(result);
                        match verdict {
                            Verdict::Ok => UnitOutcome::Ok,
                            Verdict::Skipped => UnitOutcome::Skipped,
                            // A failure after the run was cancelled (Ctrl-C,
                            // a budget, --max-run-time) is one of the group's
                            // ends, not what the run ends with: the cancel is.
                            Verdict::Fail if self.cancelled.is_some() => UnitOutcome::Failed,
                            Verdict::Fail => {
                                g.failures.push((seq, unit));
                                UnitOutcome::Failed
                            }
                        }
                    }
                    // Stopped by a cancellation: never the group's failure
                    // by itself (see the module documentation).
                    StageOutcome::Cancelled { .. } => {
                        g.stats.cancelled += 1;
                        // Withdrawn when the group was decided, its start
                        // never granted, yet it had begun (a sibling begins
                        // as it is spawned): it did start.
                        if g.core.was_withdrawn(unit) {
                            g.stats.withdrawn = g.stats.withdrawn.saturating_sub(1);
                        }
                        UnitOutcome::Cancelled
                    }
                    // It never started, so the summary counts it as never
                    // started: here, unless the core withdrew it when the
                    // group was decided (counted then). A sibling's start
                    // is fed as it is spawned, so a decision in between
                    // (a budget tripped on another thread) withdraws it
                    // and then it reports this.
                    StageOutcome::CancelledBeforeStart => {
                        if !g.core.was_withdrawn(unit) {
                            g.stats.withdrawn += 1;
                        }
                        UnitOutcome::Cancelled
                    }
                };
                let mut cmds = std::mem::take(&mut self.fan_out);
                let _ = g
                    .core
                    .handle(FanOutEvent::Finished { unit, outcome }, &mut cmds);
                self.current = Current::Group(g);
                self.apply(&mut cmds, out);
                self.fan_out = cmds;
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
                turn: self.turns,
                slot: Slot::Sequential,
            }),
            Current::Group(g) if g.joining => out.push(PlanCommand::Cancel {
                turn: self.turns,
                slot: Slot::Join,
            }),
            Current::Group(g) => {
                let mut cmds = Vec::new();
                let _ = g.core.handle(
                    FanOutEvent::Cancel {
                        reason: CancelReason::Interrupted,
                    },
                    &mut cmds,
                );
                self.apply(&mut cmds, out);
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
        out.push(PlanCommand::Finish(Box::new(self.report(status))));
    }

    /// The run's report, taking what the planner holds for it.
    fn report(&mut self, status: RunStatus) -> RunReport {
        RunReport {
            run_id: self.run_id.to_string(),
            pipeline: self.pipeline.id.clone(),
            status,
            stages: self.stats_in_pipeline_order(),
            groups: std::mem::take(&mut self.groups),
            usage: self.usage,
            wall: Duration::ZERO,
            budget: None,
            audit_path: None,
            warnings: Vec::new(),
            results: std::mem::take(&mut self.results),
            all_results: std::mem::take(&mut self.all_results),
        }
    }
}
