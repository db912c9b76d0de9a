//! The planner's parallel groups: evaluating a `map` list, entering a
//! group (one compound turn), driving it through the [`FanOut`] core (cap,
//! start handshake, fail-fast) and ending it (join or failure).

use super::*;

/// A parallel group in flight.
#[derive(Debug)]
pub(super) struct Group {
    pub(super) turn_id: String,
    pub(super) plan: ParallelPlan,
    pub(super) core: FanOut,
    /// Map items (shared), `None` for a static list.
    pub(super) items: Option<Arc<Vec<Value>>>,
    pub(super) upstream_for_join: Arc<Vec<Kept>>,
    /// The state slot every sibling sees: taken once when the group starts,
    /// so siblings neither copy it nor see each other's results.
    pub(super) slot: Arc<BTreeMap<String, Kept>>,
    /// A `map` group's visit, shared by its siblings (one stage).
    pub(super) visit: u32,
    /// A static group's siblings' visits, each its own stage's (one
    /// visit for all would give a sibling the id a later visit of its
    /// stage gets); empty for a `map` group.
    pub(super) visits: Vec<u32>,
    /// Each sibling's result as it was handed over: packed (see [`Kept`])
    /// by a local execution, by the coordinator's decoder for a worker's,
    /// as stored on a resume; whole only when nested too deep to pack.
    pub(super) results: Vec<Option<Kept>>,
    pub(super) joining: bool,
    /// Siblings that exited with verdict `fail`, as `(seq, unit)`: the
    /// one with the lowest `seq` is the failure the group is named by.
    pub(super) failures: Vec<(u64, usize)>,
    pub(super) stats: GroupStats,
}

impl Group {
    /// The visit of sibling `unit`'s stage.
    pub(super) fn visit_of(&self, unit: usize) -> u32 {
        self.visits.get(unit).copied().unwrap_or(self.visit)
    }

    pub(super) fn sibling_stage(&self, unit: usize) -> &str {
        match &self.plan.siblings {
            Siblings::Static(ids) => ids.get(unit).map_or("", String::as_str),
            Siblings::Map { stage, .. } => stage,
        }
    }

    pub(super) fn sibling_label(&self, unit: usize) -> String {
        let index = matches!(self.plan.siblings, Siblings::Map { .. }).then_some(unit);
        sibling_label(self.sibling_stage(unit), index)
    }
}

impl Planner {
    /// Evaluates a `map` list in the context of the stage that led here.
    pub(super) fn map_items(
        &self,
        stage: &str,
        over: &crate::definition::expr::Expr,
        upstream: &Arc<Vec<Kept>>,
    ) -> Result<Vec<Value>, String> {
        let sctx = StageContext {
            shared: self.shared_context(stage, Arc::clone(upstream), self.snapshot()),
            stage_execution_id: stage_execution_id(&self.run_id, stage, None, 0).into(),
            item: None,
            index: None,
        };
        match sctx.eval(over) {
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
    pub(super) fn enter_group(
        &mut self,
        plan: ParallelPlan,
        upstream: Arc<Vec<Kept>>,
        out: &mut Out,
    ) {
        let (total, items, visit, visits) = match &plan.siblings {
            Siblings::Map { stage, over } => {
                let items = match self.map_items(stage, over, &upstream) {
                    Ok(items) => items,
                    Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                };
                let visit = match self.visit(stage) {
                    Ok(v) => v,
                    Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                };
                (items.len(), Some(Arc::new(items)), visit, Vec::new())
            }
            Siblings::Static(ids) => {
                let mut visits = Vec::with_capacity(ids.len());
                for id in ids {
                    match self.visit(id) {
                        Ok(v) => visits.push(v),
                        Err(reason) => return self.finish(RunStatus::Failed { reason }, out),
                    }
                }
                (ids.len(), None, 1, visits)
            }
        };
        let turn_id = self.next_turn_id();
        let cap = plan.effective_cap(self.cap);
        let stages: Vec<String> = match &plan.siblings {
            Siblings::Static(ids) => ids.clone(),
            Siblings::Map { stage, .. } => vec![format!("{stage}[{total}]")],
        };
        let start = self
            .event(EventName::SessionTurnStart)
            .with("turnId", turn_id.as_str())
            .with("stages", json!(stages))
            .with("execution", "parallel")
            .with("width", total)
            .with("cap", cap)
            .with("join", json!(plan.join));
        self.turn_start(&turn_id, start, out);
        // What the siblings read as `ctx.results`: the state as the group
        // starts, before a resumed run's restored siblings are recorded
        // below (in a fresh run no sibling sees another's result).
        let slot = self.snapshot();
        // A resumed run's siblings that finished before are not run again.
        let mut done = Vec::new();
        let mut results = vec![None; total];
        if !self.restore.results.is_empty() {
            for (unit, slot) in results.iter_mut().enumerate() {
                let (stage, index, visit) = match &plan.siblings {
                    Siblings::Static(ids) => (ids[unit].as_str(), None, visits[unit]),
                    Siblings::Map { stage, .. } => (stage.as_str(), Some(unit), visit),
                };
                let id = stage_execution_id(&self.run_id, stage, index, visit);
                if let Some(result) = self.restored(&id) {
                    self.record(&result);
                    *slot = Some(result);
                    done.push(unit);
                }
            }
        }
        let mut core = FanOut::with_done(total, cap, done);
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
            slot,
            visit,
            visits,
            results,
            joining: false,
            failures: Vec::new(),
            stats,
        }));
        self.apply(&mut cmds, out);
    }

    /// Turns fan-out commands into plan commands.
    /// Takes every command out of `cmds` (left empty, for reuse).
    pub(super) fn apply(&mut self, cmds: &mut Vec<FanOutCommand>, out: &mut Out) {
        for cmd in cmds.drain(..) {
            match cmd {
                FanOutCommand::Spawn { unit } => self.spawn_unit(unit, out),
                FanOutCommand::Grant { unit } => out.push(PlanCommand::Grant { unit }),
                // A denied request is answered by not granting it.
                FanOutCommand::Deny { .. } => {}
                FanOutCommand::CancelUnit { unit, .. } => out.push(PlanCommand::Cancel {
                    turn: self.turns,
                    slot: Slot::Unit(unit),
                }),
                FanOutCommand::Withdraw { unit } => {
                    if let Current::Group(g) = &mut self.current {
                        g.stats.withdrawn += 1;
                    }
                    out.push(PlanCommand::Cancel {
                        turn: self.turns,
                        slot: Slot::Unit(unit),
                    });
                }
                FanOutCommand::AllSucceeded => self.group_succeeded(out),
                FanOutCommand::GroupFailed { unit } => self.group_failed(unit, out),
                FanOutCommand::GroupCancelled { .. } => {}
            }
        }
        self.maybe_end_group(out);
    }

    pub(super) fn spawn_unit(&mut self, unit: usize, out: &mut Out) {
        let Current::Group(g) = &self.current else {
            return;
        };
        let mut stage = std::mem::take(&mut self.spawning);
        stage.clear();
        stage.push_str(g.sibling_stage(unit));
        let (index, item) = match &g.items {
            Some(items) => (Some(unit), items.get(unit).cloned()),
            None => (None, None),
        };
        let visit = g.visit_of(unit);
        let slot = Arc::clone(&g.slot);
        let no_upstream = Arc::clone(&self.no_upstream);
        let ctx = self.context(&stage, index, visit, no_upstream, slot, item);
        self.spawn(Slot::Unit(unit), &stage, ctx, index, visit, out);
        self.spawning = stage;
    }

    /// The group failed: the scheduler cancels its scope (siblings the
    /// fan-out core told to cancel are cancelled one by one too). Which
    /// sibling the group is named by is settled when it ends.
    pub(super) fn group_failed(&mut self, unit: usize, out: &mut Out) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let first = g.failures.iter().min().map_or(unit, |(_, u)| *u);
        out.push(PlanCommand::CancelGroup {
            sibling: g.sibling_label(first),
        });
    }

    /// The failed sibling the group is named by: the one whose Exit came
    /// first; an actor that ended without an outcome (no Exit at all) only
    /// when no sibling failed.
    pub(super) fn failed_sibling(g: &Group) -> Option<(String, String)> {
        let unit = match (g.failures.iter().min(), g.core.state()) {
            (Some((_, unit)), _) => *unit,
            (None, GroupState::Failed { unit }) => unit,
            (None, _) => return None,
        };
        let reason = g
            .results
            .get(unit)
            .and_then(|r| r.as_ref())
            .and_then(|r| r.reason().map(str::to_owned))
            .unwrap_or_else(|| "its stage actor ended without an outcome".to_owned());
        Some((g.sibling_label(unit), reason))
    }

    pub(super) fn group_succeeded(&mut self, out: &mut Out) {
        let Current::Group(g) = &mut self.current else {
            return;
        };
        let upstream: Vec<Kept> = g.results.iter().flatten().cloned().collect();
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
                self.spawn(Slot::Join, &join, ctx, None, visit, out);
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
    pub(super) fn progress(&self, out: &mut Out) {
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

    pub(super) fn end_group_turn(&mut self, out: &mut Out) {
        if let Current::Group(g) = std::mem::replace(&mut self.current, Current::Idle) {
            let mut stats = g.stats;
            stats.peak_running = g.core.peak_running();
            stats.cap_waits = g.core.cap_waits();
            stats.never_started = stats.withdrawn + g.core.waiting();
            stats.restored = g.core.done_before();
            self.turn_end(&g.turn_id, out);
            self.groups.push(stats);
        }
    }

    /// Ends a failed or cancelled group once every started unit reported.
    pub(super) fn maybe_end_group(&mut self, out: &mut Out) {
        let Current::Group(g) = &self.current else {
            return;
        };
        if g.joining || !g.core.is_finished() || g.core.state() == GroupState::Succeeded {
            return;
        }
        let failed = Self::failed_sibling(g);
        if let Some((sibling, reason)) = &failed {
            out.push(PlanCommand::Emit(
                Event::new(EventName::ParallelSiblingFailure, self.run_id.as_str())
                    .with("code", "ExtensionHost/ParallelSiblingFailure")
                    .with("failedSibling", sibling.as_str())
                    .with("compoundTurnId", g.turn_id.as_str())
                    .with("reason", reason.as_str()),
            ));
        }
        let failed_label = failed.as_ref().map(|(s, _)| s.clone());
        if let Current::Group(g) = &mut self.current {
            g.stats.failed_sibling = failed_label;
        }
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
}
