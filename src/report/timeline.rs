//! The timeline of one run, as `troupe report` draws it: the run, its
//! parallel groups and every stage execution with its wait, span, outcome,
//! retries and approval waits. Built from an audit log by `read`.
//!
//! Compact on purpose: a fan-out of 100 000 siblings is 100 000
//! `Execution`s, so each is a small plain struct (stage ids interned,
//! times as microseconds since the run started), and the rare extras
//! (retries, approval waits) live in side tables.

/// Microseconds since the run's first event.
pub type Micros = i64;

/// An index into [`Timeline::stages`].
pub type StageRef = u32;

/// An index into [`Timeline::groups`].
pub type GroupRef = u32;

/// An index into [`Timeline::executions`].
pub type ExecRef = u32;

/// How a stage execution ended. Ordered from best to worst: a bin of
/// siblings takes the colour of its worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// `StageExited` with verdict `ok`.
    Ok,
    /// `StageExited` with verdict `skipped`.
    Skipped,
    /// No end in the log: still running when the log stopped (a run
    /// killed with `kill -9`, or a log read while the run goes on).
    Unfinished,
    /// `StageCancelled`: stopped by fail-fast or Ctrl-C.
    Cancelled,
    /// `StageExited` with verdict `fail` (or one this version does not
    /// know).
    Failed,
}

impl Outcome {
    /// Every outcome, best first.
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Skipped,
        Outcome::Unfinished,
        Outcome::Cancelled,
        Outcome::Failed,
    ];

    /// The word the report uses (also the SVG class of the bar).
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Skipped => "skipped",
            Outcome::Unfinished => "unfinished",
            Outcome::Cancelled => "cancelled",
            Outcome::Failed => "failed",
        }
    }

    /// The position in [`Outcome::ALL`], for per-outcome counters.
    pub fn slot(self) -> usize {
        match self {
            Outcome::Ok => 0,
            Outcome::Skipped => 1,
            Outcome::Unfinished => 2,
            Outcome::Cancelled => 3,
            Outcome::Failed => 4,
        }
    }
}

/// How the run ended (`WorkflowExit`'s `status`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunStatus {
    Ok,
    Failed,
    Cancelled,
    /// No `WorkflowExit` in the log.
    Unfinished,
    /// A status this version does not know, as written.
    Other(String),
}

impl RunStatus {
    pub fn as_str(&self) -> &str {
        match self {
            RunStatus::Ok => "ok",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
            RunStatus::Unfinished => "unfinished",
            RunStatus::Other(s) => s,
        }
    }
}

/// The run as a whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunInfo {
    /// `workflowRunId`.
    pub id: String,
    /// `WorkflowStarted`'s `pipeline`, when the log has it.
    pub pipeline: Option<String>,
    /// The first event's `ts`, as written (time zero of the timeline).
    pub started_at: String,
    /// `WorkflowStarted`'s `parallelCap`.
    pub parallel_cap: Option<u32>,
    pub status: RunStatus,
    /// `WorkflowExit`'s `reason`.
    pub reason: Option<String>,
}

/// One parallel group: a compound session turn (`SessionTurnStart` with
/// `execution: parallel` … `SessionTurnEnd`), the join included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub turn_id: String,
    /// `stages` as written: `["worker[40]"]` for a map, `["test", "lint"]`
    /// for a static list.
    pub stages: Vec<String>,
    /// A `map` fan-out (siblings of one stage, named by index) rather
    /// than a static list of stages.
    pub map: bool,
    /// Siblings in the plan (`width`); those never started have no
    /// execution.
    pub width: u32,
    /// The most siblings allowed to run at once.
    pub cap: u32,
    pub join: Option<String>,
    pub started: Micros,
    /// `SessionTurnEnd`, if the log has it.
    pub ended: Option<Micros>,
    /// `ParallelSiblingFailure`'s `failedSibling`.
    pub failed_sibling: Option<String>,
    /// The siblings that were entered, by sibling index.
    pub siblings: Vec<ExecRef>,
}

impl Group {
    /// How the group is named in the report: `worker[40]`, `test + lint`.
    pub fn label(&self) -> String {
        self.stages.join(" + ")
    }

    /// Planned siblings that never started (fail-fast before their slot,
    /// or a log that stops early).
    pub fn never_started(&self) -> u64 {
        u64::from(self.width).saturating_sub(self.siblings.len() as u64)
    }
}

/// What an execution was to the run's turns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A turn of its own.
    Sequential,
    /// One of a parallel group's siblings.
    Sibling,
    /// Entered inside a parallel group's turn but not one of its siblings:
    /// the group's join.
    Join,
}

/// One stage execution (`stageExecutionId`), from its `StageEntered`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Execution {
    pub stage: StageRef,
    /// The parallel group whose turn it ran in (as a sibling or the join).
    pub group: Option<GroupRef>,
    pub role: Role,
    /// The sibling index: `index` of a `map` sibling, the position in the
    /// list of a static one.
    pub index: Option<u32>,
    pub visit: u32,
    pub entered: Micros,
    /// `StageExited` or `StageCancelled`; `None` when unfinished.
    pub ended: Option<Micros>,
    pub outcome: Outcome,
    /// `ProviderRequestStarted` events (every try counts).
    pub requests: u32,
    /// `ProviderRequestFailed` events.
    pub failed_requests: u32,
    /// `StageAssertOutcome` with verdict `retry`.
    pub retries: u32,
}

impl Execution {
    /// Where the bar ends: the execution's end, or the end of the log for
    /// an unfinished one.
    pub fn end_or(&self, log_end: Micros) -> Micros {
        self.ended.unwrap_or(log_end).max(self.entered)
    }

    /// How long it ran, when it ended.
    pub fn duration(&self) -> Option<Micros> {
        self.ended.map(|e| (e - self.entered).max(0))
    }
}

/// A `retry` verdict of `StageAssertOutcome`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    pub exec: ExecRef,
    pub at: Micros,
}

/// An approval wait: `InteractionRaised` to its `InteractionAnswered`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApprovalWait {
    pub exec: ExecRef,
    pub from: Micros,
    /// `None` while no answer is in the log.
    pub to: Option<Micros>,
    /// `InteractionAnswered`'s `outcome`/`answer`, e.g. `approve`,
    /// `timedOut`; `None` while open.
    pub outcome: Option<String>,
}

/// A top-level entry of the report, in order of first appearance.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Item {
    /// An execution that is no sibling: sequential, or a join.
    Execution(ExecRef),
    /// A parallel group and its siblings.
    Group(GroupRef),
}

/// Everything the report draws about one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timeline {
    pub run: RunInfo,
    /// Interned stage ids, in order of first appearance.
    pub stages: Vec<String>,
    pub groups: Vec<Group>,
    /// Every stage execution, in order of `StageEntered`.
    pub executions: Vec<Execution>,
    /// Retry markers, by execution, then in time order.
    pub retries: Vec<Retry>,
    /// Approval waits, by execution, then in time order.
    pub approvals: Vec<ApprovalWait>,
    /// Groups and non-sibling executions, in order of first appearance.
    pub items: Vec<Item>,
    /// `WorkflowExit`, or the last timestamp in the log.
    pub end: Micros,
}

impl Timeline {
    /// The stage id of an interned reference.
    pub fn stage_name(&self, stage: StageRef) -> &str {
        self.stages.get(stage as usize).map_or("?", String::as_str)
    }

    /// The execution of a reference (references come from this timeline).
    pub fn execution(&self, exec: ExecRef) -> Option<&Execution> {
        self.executions.get(exec as usize)
    }

    /// The retry markers of one execution.
    pub fn retries_of(&self, exec: ExecRef) -> &[Retry] {
        let start = self.retries.partition_point(|r| r.exec < exec);
        let end = self.retries.partition_point(|r| r.exec <= exec);
        &self.retries[start..end]
    }

    /// The approval waits of one execution.
    pub fn approvals_of(&self, exec: ExecRef) -> &[ApprovalWait] {
        let start = self.approvals.partition_point(|a| a.exec < exec);
        let end = self.approvals.partition_point(|a| a.exec <= exec);
        &self.approvals[start..end]
    }

    /// Wall time: from the first event to `WorkflowExit` (or the last event).
    pub fn wall(&self) -> Micros {
        self.end.max(0)
    }

    /// How a row names an execution: `plan`, `plan (visit 2)`, `worker #17`,
    /// `review (join)`.
    pub fn execution_label(&self, exec: &Execution) -> String {
        let name = self.stage_name(exec.stage);
        let mut label = match (exec.role, exec.index, exec.group) {
            (Role::Sibling, Some(i), Some(g))
                if self.groups.get(g as usize).is_some_and(|g| g.map) =>
            {
                format!("{name} #{i}")
            }
            _ => name.to_owned(),
        };
        if exec.visit > 1 {
            label.push_str(&format!(" (visit {})", exec.visit));
        }
        if exec.role == Role::Join {
            label.push_str(" (join)");
        }
        label
    }
}
