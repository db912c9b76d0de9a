//! Assert: the pipeline's assert expressions for a stage, evaluated on a
//! completed payload: ok, retry (an assert is false) or fail (an
//! expression could not be evaluated).

use serde_json::Value;

use super::run::StageRun;
use crate::error::{HasCode, ValidationCode};

impl StageRun {
    pub(super) fn assert_payload(&self, parsed: &Value, attempt: u32) -> Decision {
        let Some(exprs) = self.pipeline.asserts.get(&self.stage.id) else {
            return Decision::Ok;
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
                    return Decision::Retry(format!("assert `{}` is false", expr.source()));
                }
                Err(e) => {
                    return Decision::Fail(format!(
                        "{}: {e}",
                        ValidationCode::ExpressionFailed.code()
                    ));
                }
            }
        }
        Decision::Ok
    }
}

/// How Assert decided.
pub(super) enum Decision {
    Ok,
    Retry(String),
    Fail(String),
}
