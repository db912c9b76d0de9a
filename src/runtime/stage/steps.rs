//! Deterministic steps (extract_json, print, if_else, switch): the same
//! phases and events as an LLM stage, no model. Their gate and asserts are
//! evaluated as an LLM stage's are, with one attempt.

use std::cell::RefCell;
use std::rc::Rc;

use serde_json::{Value, json};

use super::asserts::AssertOutcome;
use super::conclusion::Conclusion;
use super::gate::{GateResolution, STEP_GATE};
use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::StageKind;
use crate::definition::expr::{Expr, json_kind};
use crate::error::{HasCode, ValidationCode};
use crate::provider::Usage;
use crate::runtime::events::EventName;
use crate::runtime::extract::extract_json;
use crate::runtime::result::Verdict;

impl StageRun {
    /// Deterministic steps: the same phases and events, no model. Their
    /// gate and asserts are evaluated as an LLM stage's are, with one
    /// attempt: a gate that does not say proceed, or a false assert,
    /// fails the step.
    pub(super) async fn run_step(&self, whereabouts: &Rc<RefCell<Whereabouts>>) -> Conclusion {
        for phase in ["Setup", "Init"] {
            self.phase(whereabouts, phase, true);
            self.phase(whereabouts, phase, false);
        }
        whereabouts.borrow_mut().attempt = 1;
        match self.check_gate(STEP_GATE, whereabouts).await {
            GateResolution::Proceed => {}
            GateResolution::Skip(reason) => return Conclusion::early(Verdict::Skipped, reason),
            GateResolution::Fail(reason) => return Conclusion::early(Verdict::Fail, reason),
        }
        self.phase(whereabouts, "Act", true);
        let ctx = &self.ctx;
        let eval = |expr: &Expr| -> Result<Value, String> {
            ctx.eval(expr)
                .map_err(|e| format!("{}: {e}", ValidationCode::ExpressionFailed.code()))
        };
        let mut skipped = None;
        let outcome: Result<(Value, Option<Value>), String> = match &self.stage.kind {
            StageKind::ExtractJson { from } => eval(from).and_then(|v| match v {
                Value::String(text) => extract_json(&text)
                    .map(|j| (j, None))
                    .ok_or_else(|| "extract_json: no JSON found in the text".to_owned()),
                other => Err(format!(
                    "extract_json: `from` must yield a string, got {}",
                    json_kind(&other)
                )),
            }),
            StageKind::Print { content } => content
                .render_with(|p| ctx.resolve(p))
                .map(|text| (Value::Null, Some(json!({"text": text}))))
                .map_err(|e| format!("{}: {e}", ValidationCode::TemplateUnresolved.code())),
            StageKind::IfElse {
                condition,
                then,
                otherwise,
            } => eval(condition).and_then(|v| match v {
                Value::Bool(b) => {
                    let route = if b { then } else { otherwise };
                    Ok((json!({"condition": b}), Some(json!({"route": route}))))
                }
                other => Err(format!(
                    "if_else: condition must be a boolean, got {}",
                    json_kind(&other)
                )),
            }),
            StageKind::Switch { on, cases, default } => eval(on).and_then(|v| {
                let key = match &v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let route = cases
                    .iter()
                    .find(|(value, _)| *value == key)
                    .map(|(_, t)| t)
                    .or(default.as_ref());
                match route {
                    Some(route) => Ok((json!({"value": key}), Some(json!({"route": route})))),
                    None => Err(format!("switch: no case for `{key}` and no default")),
                }
            }),
            StageKind::Tool { tool, args } => self.run_tool_step(tool, args, whereabouts).await,
            StageKind::Transform { set } => self.run_transform(set),
            StageKind::Human {
                prompt,
                fields,
                timeout,
                otherwise,
            } => match self
                .run_human_step(prompt, fields, *timeout, whereabouts)
                .await
            {
                Ok(answer) => Ok((answer, None)),
                Err(reason) if *otherwise == crate::definition::HumanOtherwise::Skip => {
                    skipped = Some(reason.clone());
                    Err(reason)
                }
                Err(reason) => Err(reason),
            },
            StageKind::Llm(_) => Err("internal: an LLM stage reached the step runner".to_owned()),
        };
        self.phase(whereabouts, "Act", false);
        if let Some(reason) = skipped {
            // `otherwise: skip`: an unanswered question skips the step.
            return Conclusion {
                attempts: 1,
                ..Conclusion::early(Verdict::Skipped, reason)
            };
        }
        self.phase(whereabouts, "Assert", true);
        let (verdict, reason, parsed, output) = match outcome {
            Ok((parsed, output)) => match self.assert_payload(&parsed, 1) {
                AssertOutcome::Ok => (Verdict::Ok, None, parsed, output),
                // One attempt: a false assert fails the step.
                AssertOutcome::Retry(reason) | AssertOutcome::Fail(reason) => {
                    (Verdict::Fail, Some(reason), parsed, output)
                }
            },
            Err(reason) => (Verdict::Fail, Some(reason), Value::Null, None),
        };
        let mut ev = self
            .event(EventName::StageAssertOutcome)
            .with_static("verdict", verdict.as_str())
            .with("attempt", 1);
        if let Some(r) = &reason {
            ev = ev.with("reason", r.as_str());
        }
        self.emit(ev);
        self.phase(whereabouts, "Assert", false);
        Conclusion {
            verdict,
            reason,
            parsed,
            output,
            cap_hit: false,
            attempts: 1,
            usage: Usage::default(),
        }
    }
}
