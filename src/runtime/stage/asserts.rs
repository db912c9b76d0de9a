//! Assert: the pipeline's assert expressions for a stage, evaluated on a
//! completed payload: ok, retry (an assert is false) or fail (an
//! expression could not be evaluated).

use serde_json::Value;

use super::run::StageRun;
use crate::error::{HasCode, ValidationCode};

impl StageRun {
    pub(super) fn assert_payload(&self, parsed: &Value, attempt: u32) -> AssertOutcome {
        let Some(exprs) = self.kit.pipeline.asserts.get(&self.stage.id) else {
            return AssertOutcome::Ok;
        };
        for expr in exprs {
            let ctx = self.ctx.to_expr_value(expr.source());
            let vars = [
                ("ctx", &ctx),
                ("parsed", parsed),
                ("capHit", &Value::Bool(false)),
                ("attempt", &Value::from(attempt)),
            ];
            match expr.eval_bool(&vars) {
                Ok(true) => {}
                Ok(false) => {
                    return AssertOutcome::Retry(format!("assert `{}` is false", expr.source()));
                }
                Err(e) => {
                    return AssertOutcome::Fail(format!(
                        "{}: {e}",
                        ValidationCode::ExpressionFailed.code()
                    ));
                }
            }
        }
        AssertOutcome::Ok
    }
}

/// Assert's outcome for one attempt, as `StageAssertOutcome` records it:
/// ok, retry (with the reason) or fail.
pub(super) enum AssertOutcome {
    Ok,
    Retry(String),
    Fail(String),
}
