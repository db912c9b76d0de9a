//! Hook slots of the message loop: runs the hooks at a slot on a payload
//! (adding the execution's ids), audits each hook run, and turns a deny
//! or a failed transform into the error that ends Act.

use serde_json::Value;

use super::run::StageRun;
use crate::error::{Code, ErrorClass};
use crate::runtime::events::EventName;
use crate::runtime::hooks::{HookError, SlotOutcome};

impl StageRun {
    /// Runs the hooks of `slot` on `payload` (the common fields are added
    /// here) and audits every hook run. Without hooks at the slot it costs
    /// nothing and returns the payload as it was.
    pub(super) async fn hook(&self, slot: &str, tool: Option<&str>, fields: Value) -> SlotOutcome {
        if !self.kit.hooks.has(slot, tool) {
            return SlotOutcome::Proceed(fields);
        }
        // A hook is a process that may act on the run (through its control
        // socket) before this poll ends: what led to it is in the log first.
        self.flush();
        let mut payload = serde_json::Map::new();
        payload.insert("slot".into(), Value::from(slot));
        payload.insert(
            "workflowRunId".into(),
            Value::from(&*self.ctx.workflow_run_id),
        );
        payload.insert("stageId".into(), Value::from(self.stage.id.as_str()));
        payload.insert(
            "stageExecutionId".into(),
            Value::from(&*self.ctx.stage_execution_id),
        );
        if let Value::Object(extra) = fields {
            payload.extend(extra);
        }
        let mut log = Vec::new();
        let outcome = self
            .kit
            .hooks
            .run(slot, tool, Value::Object(payload), &mut log)
            .await;
        for run in log {
            let mut ev = self
                .event(EventName::HookInvoked)
                .with("slot", slot)
                .with("hook", run.hook.as_str())
                .with("kind", run.kind.as_str())
                .with("outcome", run.outcome);
            if let Some(t) = tool {
                ev = ev.tool(t);
            }
            if let Some(e) = run.error {
                ev = ev.with("code", HookError::CODE).with("error", e);
            }
            self.emit(ev);
        }
        outcome
    }

    /// A slot of the model loop where a guard deny or a failed transform
    /// ends Act; transforms may only rewrite `field` (if any).
    /// The payload is built only when a hook is configured at the slot;
    /// `Ok(None)` means nothing was rewritten.
    pub(super) async fn loop_hook(
        &self,
        slot: &str,
        fields: impl FnOnce() -> Value,
        field: Option<&str>,
    ) -> Result<Option<Value>, (Code, String)> {
        if !self.kit.hooks.has(slot, None) {
            return Ok(None);
        }
        // Boxed: only a slot with hooks gets here, and the hook machinery
        // inline made every slot's future (7+ awaits a turn) 664 bytes
        // to build and move; boxed, 88.
        let fields = fields();
        let was_null = field.is_some_and(|f| fields.get(f).is_some_and(Value::is_null));
        match Box::pin(self.hook(slot, None, fields)).await {
            // The field a transform may change must come back as text (or
            // as nothing, where it was nothing): a transform that dropped
            // or retyped it fails closed rather than leaving it as it was.
            SlotOutcome::Proceed(v) => match field.map(|f| (f, v.get(f))) {
                None => Ok(None),
                Some((_, Some(text @ Value::String(_)))) => Ok(Some(text.clone())),
                Some((_, Some(Value::Null))) if was_null => Ok(None),
                Some((f, got)) => Err((
                    Code {
                        class: ErrorClass::ExtensionHost,
                        name: "HookFailed",
                    },
                    format!(
                        "a transform hook at {slot} left `{f}` {}, not text",
                        got.map_or("out", |v| crate::definition::expr::json_kind(v))
                    ),
                )),
            },
            SlotOutcome::Denied { hook, reason } => Err((
                Code {
                    class: ErrorClass::ExtensionHost,
                    name: "HookDenied",
                },
                format!("guard hook `{hook}` at {slot} denied: {reason}"),
            )),
            SlotOutcome::Failed { error, .. } => Err((
                Code {
                    class: ErrorClass::ExtensionHost,
                    name: "HookFailed",
                },
                error.to_string(),
            )),
        }
    }
}
