//! The Next() walk (one step of it): where a finished execution leads,
//! decided from its stage and its StageResult only, never from transcript
//! text. The scheduler's core calls it for every Exit; a stage uses it only
//! to describe its `Next` phase marker.

use serde_json::Value;

use crate::definition::{Next, ParallelPlan, Pipeline, Stage};
use crate::runtime::result::{StageResult, Verdict};

/// Where a finished execution leads.
#[derive(Debug, Clone)]
pub enum NextDecision {
    /// The run ends (a terminal stage, or a failed one).
    End,
    /// Continue with a stage. `transparent` when a router chose it: the
    /// target then sees the router's own upstream.
    Stage { id: String, transparent: bool },
    /// A parallel group (one compound turn).
    Parallel(ParallelPlan),
}

impl NextDecision {
    /// The decision as the `Next` phase marker describes it.
    pub fn describe(&self) -> Value {
        match self {
            NextDecision::End => serde_json::json!({"stages": [], "execution": "sequential"}),
            NextDecision::Stage { id, .. } => {
                serde_json::json!({"stages": [id], "execution": "sequential"})
            }
            NextDecision::Parallel(plan) => {
                serde_json::json!({"execution": "parallel", "join": plan.join})
            }
        }
    }
}

/// Next() of `stage` after `result`: a failed execution ends the walk
/// (the scheduler decides what that means for the run); a router goes
/// where its `output.route` says; any other stage follows its `next`
/// entry, and a stage without one is terminal.
pub fn next_of(pipeline: &Pipeline, stage: &Stage, result: &StageResult) -> NextDecision {
    if result.verdict == Verdict::Fail {
        return NextDecision::End;
    }
    if stage.kind.is_router() {
        return match result.output.get("route").and_then(Value::as_str) {
            Some(id) => NextDecision::Stage {
                id: id.to_owned(),
                transparent: true,
            },
            None => NextDecision::End,
        };
    }
    match pipeline.next_of(&stage.id) {
        None | Some(Next::End) => NextDecision::End,
        Some(Next::Stage(id)) => NextDecision::Stage {
            id: id.clone(),
            transparent: false,
        },
        Some(Next::Parallel(plan)) => NextDecision::Parallel(plan.clone()),
    }
}
