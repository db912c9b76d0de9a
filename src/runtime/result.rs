//! StageResult: what a finished stage execution hands to Next(),
//! the state slot and its successors.

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

mod compact;
mod kept;

pub use kept::{Kept, PackedResult};

/// A result's token counts: the provider's, summed over its requests.
pub use crate::provider::Usage;

/// Assert's verdict for a completed execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Ok,
    Fail,
    Skipped,
}

impl Verdict {
    /// Reads a stored verdict; anything but `ok` or `skipped` is `fail`
    /// (a resumed run then runs the execution again).
    pub fn parse(s: &str) -> Verdict {
        match s {
            "ok" => Verdict::Ok,
            "skipped" => Verdict::Skipped,
            _ => Verdict::Fail,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Fail => "fail",
            Verdict::Skipped => "skipped",
        }
    }
}

/// The result of one completed stage execution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StageResult {
    pub stage_id: String,
    pub stage_execution_id: String,
    pub verdict: Verdict,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    pub parsed: Arc<Value>,
    pub output: Arc<Value>,
    pub cap_hit: bool,
    pub attempt_count: u32,
    pub usage: Usage,
}

impl StageResult {
    /// The result as a JSON value, as templates and expressions see it.
    pub fn to_json(&self) -> Value {
        serde_json::to_value(self).unwrap_or(Value::Null)
    }

    /// A first try's `ok` result with no usage, whose `output` is
    /// `parsed` (one value, shared): what tests and benches build.
    pub fn ok(stage_id: &str, stage_execution_id: &str, parsed: Value) -> StageResult {
        let parsed = Arc::new(parsed);
        StageResult {
            stage_id: stage_id.into(),
            stage_execution_id: stage_execution_id.into(),
            verdict: Verdict::Ok,
            reason: None,
            output: Arc::clone(&parsed),
            parsed,
            cap_hit: false,
            attempt_count: 1,
            usage: Usage::default(),
        }
    }
}
