//! How an execution concluded: the fields of its StageResult, assembled
//! by the phases before Exit builds the result.

use serde_json::Value;

use crate::provider::Usage;
use crate::runtime::result::Verdict;

/// The fields of a StageResult, assembled before Exit.
pub(super) struct Conclusion {
    pub(super) verdict: Verdict,
    pub(super) reason: Option<String>,
    pub(super) parsed: Value,
    pub(super) output: Option<Value>,
    pub(super) cap_hit: bool,
    pub(super) attempts: u32,
    pub(super) usage: Usage,
}

impl Conclusion {
    /// An execution that ended before Act produced anything.
    pub(super) fn early(verdict: Verdict, reason: String) -> Conclusion {
        Conclusion {
            verdict,
            reason: Some(reason),
            parsed: Value::Null,
            output: None,
            cap_hit: false,
            attempts: 0,
            usage: Usage::default(),
        }
    }
}
