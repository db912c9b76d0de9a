//! The hooks of a run by slot, and running one slot: guards first (the
//! first deny short-circuits), then transforms (chained, each sees the
//! previous one's payload), the guards again when a transform changed the
//! payload (they decide on what would run), then observers (best effort:
//! a failure is audited, never fatal).

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::Value;

use super::command::CommandHook;
use super::hook::{Hook, HookError, HookReply};
use crate::definition::hooks::{HookDef, HookKind};

/// What running a slot's hooks came to.
#[derive(Debug, Clone, PartialEq)]
pub enum SlotOutcome {
    /// Go on with this payload (rewritten by transforms, if any).
    Proceed(Value),
    /// A guard said no (or failed: guards fail closed).
    Denied { hook: String, reason: String },
    /// A transform failed; the payload cannot be trusted.
    Failed { hook: String, error: HookError },
}

/// One hook run, for the audit log.
#[derive(Debug, Clone)]
pub struct HookRun {
    pub hook: String,
    pub kind: HookKind,
    /// `allow`, `deny`, `transformed`, `ok` or `failed`.
    pub outcome: &'static str,
    pub error: Option<String>,
}

/// The hooks of a run, by slot.
#[derive(Debug, Clone, Default)]
pub struct HookSet {
    by_slot: HashMap<String, Vec<Arc<dyn Hook>>>,
}

impl HookSet {
    /// The command hooks declared in a pipeline.
    pub fn from_defs(defs: &[HookDef], dir: &std::path::Path) -> HookSet {
        let mut set = HookSet::default();
        for def in defs {
            set.add(
                &def.at,
                Arc::new(CommandHook::new(def.clone(), dir.to_owned())),
            );
        }
        set
    }

    /// Adds a hook at `slot` (e.g. `TOOL_CALL/pre`).
    pub fn add(&mut self, slot: &str, hook: Arc<dyn Hook>) {
        self.by_slot.entry(slot.to_owned()).or_default().push(hook);
    }

    /// Whether any hook listens at `slot` (for `tool`, at TOOL_CALL).
    pub fn has(&self, slot: &str, tool: Option<&str>) -> bool {
        self.by_slot
            .get(slot)
            .is_some_and(|hooks| hooks.iter().any(|h| tool.is_none_or(|t| h.wants_tool(t))))
    }

    /// Runs the slot's hooks in order: guards, transforms (then the guards
    /// again on a payload they changed), observers.
    /// `log` receives one entry per hook run.
    pub async fn run(
        &self,
        slot: &str,
        tool: Option<&str>,
        payload: Value,
        log: &mut Vec<HookRun>,
    ) -> SlotOutcome {
        let Some(hooks) = self.by_slot.get(slot) else {
            return SlotOutcome::Proceed(payload);
        };
        let wanted = |kind: HookKind| {
            hooks
                .iter()
                .filter(move |h| h.kind() == kind && tool.is_none_or(|t| h.wants_tool(t)))
        };
        let mut payload = Arc::new(payload);
        // The guards decide on what would run: once, and again on a
        // payload a transform rewrote (a transform must not carry a call
        // past a guard that would refuse what it became).
        if let Some(denied) = guard(wanted(HookKind::Guard), slot, &payload, log).await {
            return denied;
        }
        let mut transformed = false;
        for hook in wanted(HookKind::Transform) {
            // A transform answers with a payload, or leaves it: a deny (a
            // Rust hook of the wrong kind) is no answer of its, and fails
            // as garbage does, stopping what it transformed.
            let reply = hook
                .call(slot, Arc::clone(&payload))
                .await
                .and_then(|reply| match reply {
                    HookReply::Deny { .. } => Err(HookError::Garbage {
                        hook: hook.name().to_owned(),
                        expected: "a rewritten payload, or nothing (it is a transform)",
                        found: "a deny".to_owned(),
                    }),
                    reply => Ok(reply),
                });
            match reply {
                Ok(HookReply::Replace(mut v)) => {
                    // What a payload is about is not a transform's to
                    // change: the guards judge, and troupe runs, the call
                    // named, whatever a transform wrote there.
                    if let (Value::Object(new), Value::Object(old)) = (&mut v, &*payload) {
                        for key in ABOUT {
                            match old.get(key) {
                                Some(was) => new.insert(key.to_owned(), was.clone()),
                                None => new.remove(key),
                            };
                        }
                    }
                    log.push(HookRun {
                        hook: hook.name().to_owned(),
                        kind: HookKind::Transform,
                        outcome: "transformed",
                        error: None,
                    });
                    transformed |= *payload != v;
                    payload = Arc::new(v);
                }
                Ok(_) => log.push(HookRun {
                    hook: hook.name().to_owned(),
                    kind: HookKind::Transform,
                    outcome: "ok",
                    error: None,
                }),
                Err(error) => {
                    log.push(HookRun {
                        hook: hook.name().to_owned(),
                        kind: HookKind::Transform,
                        outcome: "failed",
                        error: Some(error.to_string()),
                    });
                    return SlotOutcome::Failed {
                        hook: hook.name().to_owned(),
                        error,
                    };
                }
            }
        }
        if transformed
            && let Some(denied) = guard(wanted(HookKind::Guard), slot, &payload, log).await
        {
            return denied;
        }
        for hook in wanted(HookKind::Observer) {
            let result = hook.call(slot, Arc::clone(&payload)).await;
            log.push(HookRun {
                hook: hook.name().to_owned(),
                kind: HookKind::Observer,
                outcome: if result.is_ok() { "ok" } else { "failed" },
                error: result.err().map(|e| e.to_string()),
            });
        }
        SlotOutcome::Proceed(Arc::unwrap_or_clone(payload))
    }
}

/// The fields of a payload that say what it is about: whose call, in which
/// stage, execution and run. A guard may judge by them (`rm` only in the
/// stage `admin`), so a transform's rewrite of them is undone before the
/// guards decide again: they are restored as troupe wrote them (or
/// removed, where it wrote none).
const ABOUT: [&str; 7] = [
    "tool",
    "callId",
    "slot",
    "turn",
    "workflowRunId",
    "stageId",
    "stageExecutionId",
];

/// Runs `guards` on `payload` in order, each one's run into `log`: the
/// first deny (or failure, which denies) as the slot's outcome.
async fn guard<'h>(
    guards: impl Iterator<Item = &'h Arc<dyn Hook>>,
    slot: &str,
    payload: &Arc<Value>,
    log: &mut Vec<HookRun>,
) -> Option<SlotOutcome> {
    for hook in guards {
        // A guard allows or denies: a rewritten payload (a Rust hook of
        // the wrong kind) is no answer of its, and denies as garbage does.
        let reply = hook
            .call(slot, Arc::clone(payload))
            .await
            .and_then(|reply| match reply {
                HookReply::Replace(_) => Err(HookError::Garbage {
                    hook: hook.name().to_owned(),
                    expected: "allow or deny (it is a guard)",
                    found: "a rewritten payload".to_owned(),
                }),
                reply => Ok(reply),
            });
        let (outcome, denied, error) = match reply {
            Ok(HookReply::Deny { reason }) => ("deny", Some(reason), None),
            Ok(_) => ("allow", None, None),
            Err(e) => (
                "failed",
                Some(format!("{}: {e}", HookError::CODE)),
                Some(e.to_string()),
            ),
        };
        log.push(HookRun {
            hook: hook.name().to_owned(),
            kind: HookKind::Guard,
            outcome,
            error,
        });
        if let Some(reason) = denied {
            return Some(SlotOutcome::Denied {
                hook: hook.name().to_owned(),
                reason,
            });
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use futures::future::BoxFuture;

    /// A Rust hook of `kind` that always answers `reply`.
    #[derive(Debug)]
    struct Says(HookKind, HookReply);

    impl Hook for Says {
        fn name(&self) -> &str {
            "says"
        }
        fn kind(&self) -> HookKind {
            self.0
        }
        fn call(&self, _: &str, _: Arc<Value>) -> BoxFuture<'static, Result<HookReply, HookError>> {
            std::future::ready(Ok(self.1.clone())).boxed()
        }
    }

    /// A guard that answers with a payload denies (fails closed); a
    /// transform that answers with a deny fails: neither is taken for an
    /// allow or a no-change.
    #[tokio::test]
    async fn a_reply_of_the_wrong_kind_is_garbage() {
        let slot = "TOOL_CALL/pre";
        let mut guard = HookSet::default();
        guard.add(
            slot,
            Arc::new(Says(HookKind::Guard, HookReply::Replace(Value::Null))),
        );
        let mut log = Vec::new();
        let outcome = guard.run(slot, None, serde_json::json!({}), &mut log).await;
        assert!(matches!(outcome, SlotOutcome::Denied { .. }), "{outcome:?}");
        assert_eq!(log[0].outcome, "failed");
        let mut transform = HookSet::default();
        transform.add(
            slot,
            Arc::new(Says(
                HookKind::Transform,
                HookReply::Deny {
                    reason: "no".to_owned(),
                },
            )),
        );
        let mut log = Vec::new();
        let outcome = transform
            .run(slot, None, serde_json::json!({}), &mut log)
            .await;
        assert!(
            matches!(
                outcome,
                SlotOutcome::Failed {
                    error: HookError::Garbage { .. },
                    ..
                }
            ),
            "{outcome:?}"
        );
    }
}
