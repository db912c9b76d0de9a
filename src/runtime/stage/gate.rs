//! CheckGate: evaluates the stage's gate (`gates.<stage>`) and answers a
//! gate that does not say proceed by the stage's resolution policy:
//! re-check later, fail, or skip.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::Value;

use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::{Backoff, GateOutcome, ResolutionPolicy};
use crate::error::{HasCode, ValidationCode};
use crate::runtime::events::EventName;

impl StageRun {
    /// CheckGate: evaluates `gates.<stage>` (if any) and answers a gate
    /// that does not say proceed by `policy`: re-check later, fail, skip.
    pub(super) async fn check_gate(
        &self,
        policy: GatePolicy,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> GateResolution {
        let Some(gate) = self.kit.pipeline.gates.get(&self.stage.id) else {
            self.phase(whereabouts, "CheckGate", true);
            self.emit(
                self.event(EventName::StageCheckGateResult)
                    .with_static("outcome", "proceed")
                    .with("check", 1),
            );
            self.phase(whereabouts, "CheckGate", false);
            return GateResolution::Proceed;
        };
        let mut check = 1u32;
        loop {
            self.phase(whereabouts, "CheckGate", true);
            let ctx = self.ctx.to_expr_value(gate.when.source());
            let outcome = match gate.when.eval_bool(&[("ctx", &ctx)]) {
                Ok(true) => Ok("proceed"),
                Ok(false) => Ok(match gate.otherwise {
                    GateOutcome::Defer => "defer",
                    GateOutcome::Block => "block",
                }),
                Err(e) => Err(format!("{}: {e}", ValidationCode::ExpressionFailed.code())),
            };
            let mut ev = self
                .event(EventName::StageCheckGateResult)
                .with("check", check)
                .with(
                    "resolutionPolicy",
                    serde_json::to_value(policy.resolution).unwrap_or(Value::Null),
                );
            ev = match &outcome {
                Ok(o) => ev.with("outcome", *o),
                Err(e) => ev.with("outcome", "error").with("reason", e.as_str()),
            };
            self.emit(ev);
            self.phase(whereabouts, "CheckGate", false);
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => return GateResolution::Fail(e),
            };
            match (outcome, policy.resolution) {
                ("proceed", _) => return GateResolution::Proceed,
                (o, ResolutionPolicy::Skip) => {
                    return GateResolution::Skip(format!("CheckGate: {o}"));
                }
                (o, ResolutionPolicy::Fail) => {
                    return GateResolution::Fail(format!("CheckGate: {o}"));
                }
                ("block", ResolutionPolicy::RetryLater) => {
                    return GateResolution::Fail("CheckGate: block".to_owned());
                }
                (_, ResolutionPolicy::RetryLater) => {
                    if check >= policy.max_checks {
                        return GateResolution::Fail(format!(
                            "CheckGate: still deferred after {check} checks"
                        ));
                    }
                    let wait = policy.backoff.delay(check);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    check += 1;
                }
            }
        }
    }
}

/// How CheckGate resolved: go on to Act, or end the execution skipped or
/// failed (with the reason).
pub(super) enum GateResolution {
    Proceed,
    Skip(String),
    Fail(String),
}

/// How a stage answers a gate that does not say proceed.
#[derive(Debug, Clone, Copy)]
pub(super) struct GatePolicy {
    pub(super) resolution: ResolutionPolicy,
    /// Checks in all, for `retry-later`.
    pub(super) max_checks: u32,
    pub(super) backoff: Backoff,
}

/// Deterministic steps have no resolution or retry policy: a gate that
/// does not say proceed fails the step at once.
pub(super) const STEP_GATE: GatePolicy = GatePolicy {
    resolution: ResolutionPolicy::Fail,
    max_checks: 1,
    backoff: Backoff::None,
};
