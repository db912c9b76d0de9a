//! Builds a [`Timeline`] from an audit log, streaming: one line at a time
//! from a `BufRead`, each parsed by serde_json into a borrowed view of the
//! few fields the report needs (unknown keys and events are skipped).
//!
//! A torn last line (the process killed mid-write) is dropped; an
//! unparsable line before it is `Store/AuditCorrupt` with its line number.
//! Fields are read leniently: a field of an unexpected type reads as absent,
//! so an event this version does not know never stops a report.

use std::borrow::Cow;
use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::fmt;
use std::io::BufRead;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};

use super::error::ReportError;
use super::lines::{Stop, for_each_line};
use super::timeline::{
    ApprovalWait, ExecRef, Execution, Group, GroupRef, Item, Micros, Outcome, Retry, Role, RunInfo,
    RunStatus, StageRef, Timeline,
};
use super::timestamp::parse_micros;

/// The name an in-memory log is reported under (the CLI puts the path).
const UNNAMED: &str = "audit log";

impl Timeline {
    /// Reads an audit log (JSON lines) into a timeline.
    ///
    /// Errors: `Store/AuditCorrupt` naming the line, for a line before the
    /// last that is not a JSON object, an event without a valid `event` or
    /// RFC 3339 `ts`, a read error, or a log with no event at all.
    pub fn from_audit<R: BufRead>(reader: R) -> Result<Timeline, ReportError> {
        let mut builder = Builder::default();
        let mut line_no = 0u64;
        // An unparsable line: fatal once another line follows it.
        let mut torn: Option<(u64, String)> = None;
        let read = for_each_line(reader, |line| {
            line_no += 1;
            let text = line.trim_ascii();
            if text.is_empty() {
                return Ok(());
            }
            if let Some((line, reason)) = torn.take() {
                return Err(corrupt(line, reason));
            }
            if let Err(reason) = builder.read(text, line_no)? {
                torn = Some((line_no, reason));
            }
            Ok(())
        });
        match read {
            Ok(()) => builder.finish(line_no),
            Err(Stop::Line(e)) => Err(e),
            Err(Stop::Read(e)) => Err(corrupt(line_no + 1, format!("cannot read the log: {e}"))),
        }
    }
}

fn corrupt(line: u64, reason: String) -> ReportError {
    ReportError::AuditCorrupt {
        source_name: UNNAMED.to_owned(),
        line,
        reason,
    }
}

/// The fields of an audit line the report reads; every other key is
/// skipped by serde without being kept.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Line<'a> {
    #[serde(borrow)]
    ts: Option<Scalar<'a>>,
    #[serde(borrow)]
    event: Option<Scalar<'a>>,
    #[serde(borrow)]
    workflow_run_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    stage_execution_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    stage_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    pipeline: Option<Scalar<'a>>,
    parallel_cap: Option<Scalar<'a>>,
    #[serde(borrow)]
    status: Option<Scalar<'a>>,
    #[serde(borrow)]
    reason: Option<Scalar<'a>>,
    #[serde(borrow)]
    turn_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    compound_turn_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    execution: Option<Scalar<'a>>,
    #[serde(borrow, default)]
    stages: TextList<'a>,
    width: Option<Scalar<'a>>,
    cap: Option<Scalar<'a>>,
    #[serde(borrow)]
    join: Option<Scalar<'a>>,
    visit: Option<Scalar<'a>>,
    index: Option<Scalar<'a>>,
    #[serde(borrow)]
    verdict: Option<Scalar<'a>>,
    interaction_id: Option<Scalar<'a>>,
    #[serde(borrow)]
    outcome: Option<Scalar<'a>>,
    #[serde(borrow)]
    answer: Option<Scalar<'a>>,
    #[serde(borrow)]
    failed_sibling: Option<Scalar<'a>>,
}

/// A field's value: text, a non-negative whole number, or anything else.
enum Scalar<'a> {
    Text(Cow<'a, str>),
    Count(u64),
    Other,
}

fn text<'s>(v: &'s Option<Scalar<'_>>) -> Option<&'s str> {
    match v {
        Some(Scalar::Text(t)) => Some(t),
        _ => None,
    }
}

fn count(v: &Option<Scalar<'_>>) -> Option<u64> {
    match v {
        Some(Scalar::Count(n)) => Some(*n),
        _ => None,
    }
}

fn count_u32(v: &Option<Scalar<'_>>) -> Option<u32> {
    count(v).map(|n| u32::try_from(n).unwrap_or(u32::MAX))
}

impl<'de: 'a, 'a> Deserialize<'de> for Scalar<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ScalarVisitor(std::marker::PhantomData))
    }
}

struct ScalarVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for ScalarVisitor<'a> {
    type Value = Scalar<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
        Ok(Scalar::Text(Cow::Borrowed(v)))
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok(Scalar::Text(Cow::Owned(v.to_owned())))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok(Scalar::Text(Cow::Owned(v)))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Scalar::Count(v))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok(u64::try_from(v).map_or(Scalar::Other, Scalar::Count))
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Scalar::Other)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(Scalar::Other)
    }
}

/// `SessionTurnStart`'s `stages`: the text items of a list; anything else
/// reads as empty.
#[derive(Default)]
struct TextList<'a>(Vec<Cow<'a, str>>);

impl<'de: 'a, 'a> Deserialize<'de> for TextList<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(TextListVisitor(std::marker::PhantomData))
    }
}

struct TextListVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for TextListVisitor<'a> {
    type Value = TextList<'a>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element::<Scalar<'a>>()? {
            if let Scalar::Text(t) = item {
                items.push(t);
            }
        }
        Ok(TextList(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(TextList::default())
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(TextList::default())
    }
}

/// The events `Builder::apply` reads fields of (its match arms); every
/// other one counts only for its time.
const READ_EVENTS: [&str; 14] = [
    "WorkflowStarted",
    "WorkflowResumed",
    "WorkflowExit",
    "SessionTurnStart",
    "SessionTurnEnd",
    "ParallelSiblingFailure",
    "StageEntered",
    "StageExited",
    "StageCancelled",
    "StageAssertOutcome",
    "ProviderRequestStarted",
    "ProviderRequestFailed",
    "InteractionRaised",
    "InteractionAnswered",
];

/// `ts` and `event` read straight from the start of a line.
struct Head<'t> {
    ts: &'t str,
    event: &'t str,
}

/// Folds lines into a timeline.
#[derive(Default)]
struct Builder {
    run_id: Option<String>,
    pipeline: Option<String>,
    started_at: Option<String>,
    parallel_cap: Option<u32>,
    status: Option<RunStatus>,
    reason: Option<String>,
    /// Absolute time of the first event (µs since the epoch).
    t0: Option<i64>,
    last: Micros,
    stage_ids: HashMap<String, StageRef>,
    stages: Vec<String>,
    groups: Vec<Group>,
    /// The group whose turn is open: executions entered now may be its
    /// siblings.
    open_group: Option<GroupRef>,
    /// The group the latest `SessionTurnEnd` closed, while no turn has
    /// started since: a run cancelled in that turn ends it in the log, and
    /// its resume goes on in the same turn without starting it again.
    ended_last: Option<GroupRef>,
    group_by_turn: HashMap<String, GroupRef>,
    executions: Vec<Execution>,
    /// By `stageExecutionId` without the run id prefix.
    exec_ids: HashMap<Box<str>, ExecRef>,
    retries: Vec<Retry>,
    approvals: Vec<ApprovalWait>,
    approval_by_id: HashMap<u64, usize>,
    items: Vec<Item>,
}

impl Builder {
    /// Folds one non-blank line in. `Ok(Err(reason))`: the line is not an
    /// audit event (fatal unless it is the last); `Err`: the log is
    /// corrupt.
    fn read(&mut self, text: &[u8], line_no: u64) -> Result<Result<(), String>, ReportError> {
        if let Some(head) = self.skippable(text) {
            // Only its time counts; the line must still be JSON.
            if std::str::from_utf8(text).is_err() {
                return Ok(Err("not an audit event: not UTF-8".to_owned()));
            }
            if let Err(e) = serde_json::from_slice::<IgnoredAny>(text) {
                return Ok(Err(format!("not an audit event: {e}")));
            }
            self.time(head.ts, head.event, line_no)?;
            return Ok(Ok(()));
        }
        match serde_json::from_slice::<Line<'_>>(text) {
            Ok(line) => self.apply(&line, line_no).map(Ok),
            Err(e) => Ok(Err(format!("not an audit event: {e}"))),
        }
    }

    /// The head of a line the report reads nothing from but its time: an
    /// event it does not draw, in the form troupe writes
    /// (`{"seq":N,"ts":"…","event":"Name",…`), once the run id is known.
    /// Such lines are most of a fan-out's log (tool calls, gates, model
    /// replies); skipping their fields without matching them halves the
    /// cost of reading them.
    fn skippable<'t>(&self, text: &'t [u8]) -> Option<Head<'t>> {
        self.run_id.as_ref()?;
        let rest = text.strip_prefix(b"{\"seq\":")?;
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let rest = rest[digits..].strip_prefix(b",\"ts\":\"")?;
        let ts_len = rest.iter().position(|&b| b == b'"')?;
        let (ts, rest) = rest.split_at(ts_len);
        let rest = rest.strip_prefix(b"\",\"event\":\"")?;
        let name_len = rest.iter().position(|&b| b == b'"')?;
        let event = std::str::from_utf8(&rest[..name_len]).ok()?;
        if digits == 0 || READ_EVENTS.contains(&event) || ts.contains(&b'\\') {
            return None;
        }
        Some(Head {
            ts: std::str::from_utf8(ts).ok()?,
            event,
        })
    }

    fn apply(&mut self, line: &Line<'_>, line_no: u64) -> Result<(), ReportError> {
        let Some(event) = text(&line.event) else {
            return Err(corrupt(line_no, "no `event` name".to_owned()));
        };
        let Some(ts) = text(&line.ts) else {
            return Err(corrupt(line_no, format!("`{event}` has no `ts`")));
        };
        let t = self.time(ts, event, line_no)?;
        if self.run_id.is_none() {
            self.run_id = text(&line.workflow_run_id).map(str::to_owned);
        }
        match event {
            "WorkflowStarted" => {
                self.pipeline = text(&line.pipeline).map(str::to_owned);
                self.parallel_cap = count_u32(&line.parallel_cap);
            }
            "WorkflowExit" => {
                self.status = Some(match text(&line.status) {
                    Some("ok") => RunStatus::Ok,
                    Some("failed") => RunStatus::Failed,
                    Some("cancelled") => RunStatus::Cancelled,
                    Some(other) => RunStatus::Other(other.to_owned()),
                    None => RunStatus::Other("?".to_owned()),
                });
                self.reason = text(&line.reason).map(str::to_owned);
            }
            "SessionTurnStart" => self.turn_start(line, t),
            "SessionTurnEnd" => {
                if let Some(g) = text(&line.turn_id).and_then(|id| self.group_by_turn.get(id)) {
                    let g = *g;
                    if let Some(group) = self.groups.get_mut(g as usize) {
                        group.ended.get_or_insert(t);
                    }
                    if self.open_group == Some(g) {
                        self.open_group = None;
                    }
                    self.ended_last = Some(g);
                }
            }
            // The turn the run was cancelled in goes on: its executions
            // after the resume are its own (its siblings, its join).
            "WorkflowResumed" if self.open_group.is_none() => {
                self.open_group = self.ended_last.take();
            }
            "ParallelSiblingFailure" => {
                let turn = text(&line.compound_turn_id).or(text(&line.turn_id));
                if let Some(&g) = turn.and_then(|id| self.group_by_turn.get(id))
                    && let Some(group) = self.groups.get_mut(g as usize)
                {
                    group.failed_sibling = text(&line.failed_sibling).map(str::to_owned);
                }
            }
            "StageEntered" => self.entered(line, t),
            "StageExited" => {
                let outcome = match text(&line.verdict) {
                    Some("ok") => Outcome::Ok,
                    Some("skipped") => Outcome::Skipped,
                    _ => Outcome::Failed,
                };
                self.ended(line, t, outcome);
            }
            "StageCancelled" => self.ended(line, t, Outcome::Cancelled),
            "StageAssertOutcome" => {
                if text(&line.verdict) == Some("retry")
                    && let Some(exec) = self.exec_of(line)
                {
                    self.retries.push(Retry { exec, at: t });
                    if let Some(e) = self.executions.get_mut(exec as usize) {
                        e.retries += 1;
                    }
                }
            }
            "ProviderRequestStarted" | "ProviderRequestFailed" => {
                if let Some(exec) = self.exec_of(line)
                    && let Some(e) = self.executions.get_mut(exec as usize)
                {
                    if event == "ProviderRequestStarted" {
                        e.requests += 1;
                    } else {
                        e.failed_requests += 1;
                    }
                }
            }
            "InteractionRaised" => {
                if let Some(exec) = self.exec_of(line) {
                    if let Some(id) = count(&line.interaction_id) {
                        self.approval_by_id.insert(id, self.approvals.len());
                    }
                    self.approvals.push(ApprovalWait {
                        exec,
                        from: t,
                        to: None,
                        outcome: None,
                    });
                }
            }
            "InteractionAnswered" => self.answered(line, t),
            _ => {}
        }
        Ok(())
    }

    /// An event's time since the first event; the first one sets time zero.
    fn time(&mut self, ts: &str, event: &str, line_no: u64) -> Result<Micros, ReportError> {
        let Some(abs) = parse_micros(ts) else {
            return Err(corrupt(
                line_no,
                format!("`ts` {ts:?} of `{event}` is not an RFC 3339 timestamp"),
            ));
        };
        let t0 = *self.t0.get_or_insert(abs);
        if self.started_at.is_none() {
            self.started_at = Some(ts.to_owned());
        }
        let t = abs - t0;
        self.last = self.last.max(t);
        Ok(t)
    }

    fn turn_start(&mut self, line: &Line<'_>, t: Micros) {
        self.open_group = None;
        self.ended_last = None;
        if text(&line.execution) != Some("parallel") {
            return;
        }
        let stages: Vec<String> = line.stages.0.iter().map(|s| s.to_string()).collect();
        let map = stages.len() == 1 && is_map_label(&stages[0]);
        let Ok(g) = GroupRef::try_from(self.groups.len()) else {
            return;
        };
        let turn_id = text(&line.turn_id).unwrap_or_default().to_owned();
        self.groups.push(Group {
            turn_id: turn_id.clone(),
            stages,
            map,
            width: count_u32(&line.width).unwrap_or(0),
            cap: count_u32(&line.cap).unwrap_or(0),
            join: text(&line.join).map(str::to_owned),
            started: t,
            ended: None,
            failed_sibling: None,
            siblings: Vec::new(),
        });
        // The width is known up front: room for the siblings at once, not
        // by doubling (bounded, as a corrupt log may claim any width).
        let room = count(&line.width).map_or(0, |w| w.min(1 << 20) as usize);
        self.executions.reserve(room);
        self.exec_ids.reserve(room);
        self.group_by_turn.insert(turn_id, g);
        self.open_group = Some(g);
        self.items.push(Item::Group(g));
    }

    fn entered(&mut self, line: &Line<'_>, t: Micros) {
        let Some(id) = text(&line.stage_execution_id) else {
            return;
        };
        let Ok(exec) = ExecRef::try_from(self.executions.len()) else {
            return;
        };
        // One hash per new execution. The same execution entered again
        // after it ended ran again — a resumed run re-running what the
        // stopped process left open, a sibling delivered to a second
        // worker — and is drawn from its last entry, with the end that
        // counted; a second entry while it runs is ignored.
        match self.exec_ids.entry(self.key(id).into()) {
            Entry::Occupied(known) => {
                if let Some(e) = self.executions.get_mut(*known.get() as usize)
                    && e.ended.is_some()
                {
                    e.entered = t;
                    e.ended = None;
                    e.outcome = Outcome::Unfinished;
                }
                return;
            }
            Entry::Vacant(slot) => {
                slot.insert(exec);
            }
        }
        let stage_name = text(&line.stage_id).unwrap_or("?");
        let stage = self.intern(stage_name);
        let index = count_u32(&line.index);
        // A sibling of the open group: a `map` sibling carries its index; a
        // static one is one of the group's stages (its position is its
        // index). Anything else entered in the turn is the join.
        let sibling = self.open_group.and_then(|g| {
            let group = self.groups.get_mut(g as usize)?;
            let index = match index {
                Some(i) => {
                    group.map = true;
                    i
                }
                None => {
                    let pos = group.stages.iter().position(|s| s == stage_name)?;
                    u32::try_from(pos).ok()?
                }
            };
            group.siblings.push(exec);
            Some((g, index))
        });
        // An execution of a group that ended in an earlier session (see
        // `ended_last`): the group has not ended after all.
        if let Some(group) = self
            .open_group
            .and_then(|g| self.groups.get_mut(g as usize))
        {
            group.ended = None;
        }
        let role = match (sibling, self.open_group) {
            (Some(_), _) => Role::Sibling,
            (None, Some(_)) => Role::Join,
            (None, None) => Role::Sequential,
        };
        self.executions.push(Execution {
            stage,
            group: sibling.map(|(g, _)| g).or(self.open_group),
            role,
            index: sibling.map(|(_, i)| i).or(index),
            visit: count_u32(&line.visit).unwrap_or(1),
            entered: t,
            ended: None,
            outcome: Outcome::Unfinished,
            requests: 0,
            failed_requests: 0,
            retries: 0,
        });
        if sibling.is_none() {
            self.items.push(Item::Execution(exec));
        }
    }

    fn ended(&mut self, line: &Line<'_>, t: Micros, outcome: Outcome) {
        if let Some(exec) = self.exec_of(line)
            && let Some(e) = self.executions.get_mut(exec as usize)
            && e.ended.is_none()
        {
            e.ended = Some(t);
            e.outcome = outcome;
        }
    }

    fn answered(&mut self, line: &Line<'_>, t: Micros) {
        let outcome = text(&line.outcome);
        if outcome == Some("late") {
            return; // after the decision: the wait was over already
        }
        let slot = match count(&line.interaction_id) {
            Some(id) => self.approval_by_id.remove(&id),
            None => self.exec_of(line).and_then(|exec| {
                self.approvals
                    .iter()
                    .rposition(|a| a.exec == exec && a.to.is_none())
            }),
        };
        if let Some(wait) = slot.and_then(|i| self.approvals.get_mut(i))
            && wait.to.is_none()
        {
            wait.to = Some(t);
            wait.outcome = text(&line.answer).or(outcome).map(str::to_owned);
        }
    }

    /// The execution a line belongs to, if it was entered.
    fn exec_of(&self, line: &Line<'_>) -> Option<ExecRef> {
        let id = text(&line.stage_execution_id)?;
        self.exec_ids.get(self.key(id)).copied()
    }

    /// `stageExecutionId` without the run id it starts with: 100 000 keys
    /// need not each repeat it.
    fn key<'s>(&self, id: &'s str) -> &'s str {
        match &self.run_id {
            Some(run) => id.strip_prefix(run.as_str()).unwrap_or(id),
            None => id,
        }
    }

    fn intern(&mut self, stage: &str) -> StageRef {
        if let Some(&s) = self.stage_ids.get(stage) {
            return s;
        }
        let s = StageRef::try_from(self.stages.len()).unwrap_or(StageRef::MAX);
        self.stages.push(stage.to_owned());
        self.stage_ids.insert(stage.to_owned(), s);
        s
    }

    fn finish(mut self, lines: u64) -> Result<Timeline, ReportError> {
        let Some(started_at) = self.started_at else {
            return Err(corrupt(
                lines.max(1),
                "the log holds no event (an empty file?)".to_owned(),
            ));
        };
        let executions = &self.executions;
        for group in &mut self.groups {
            group
                .siblings
                .sort_by_key(|&e| executions.get(e as usize).and_then(|e| e.index));
        }
        // Stable: each execution's markers stay in time order.
        self.retries.sort_by_key(|r| r.exec);
        self.approvals.sort_by_key(|a| a.exec);
        Ok(Timeline {
            run: RunInfo {
                id: self.run_id.unwrap_or_default(),
                pipeline: self.pipeline,
                started_at,
                parallel_cap: self.parallel_cap,
                status: self.status.unwrap_or(RunStatus::Unfinished),
                reason: self.reason,
            },
            stages: self.stages,
            groups: self.groups,
            executions: self.executions,
            retries: self.retries,
            approvals: self.approvals,
            items: self.items,
            end: self.last,
        })
    }
}

/// `worker[40]`: how the planner names a `map` group's one entry.
fn is_map_label(s: &str) -> bool {
    s.strip_suffix(']')
        .and_then(|s| s.rsplit_once('['))
        .is_some_and(|(name, n)| {
            !name.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
        })
}
