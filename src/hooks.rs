//! Hooks (SPEC §6): guard, transform and observer hooks at
//! `<TURN_STAGE>/pre|post` of the six message-loop stages. A hook is Rust
//! code (the [`Hook`] trait, for library users) or a command declared in
//! `pipeline.yaml` that reads the payload as JSON on stdin and answers JSON
//! on stdout.
//!
//! Order in a slot: guards (the first deny short-circuits), then transforms
//! (chained, each sees the previous one's payload), then observers (best
//! effort: a failure is audited, never fatal). A guard that crashes, hangs
//! or prints garbage denies (fail closed); a transform that does so is an
//! error of the thing it was transforming; neither ever hangs a run.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The six message-loop stages hooks attach to.
pub const TURN_STAGES: [&str; 6] = [
    "RECEIVE_INPUT",
    "COMPOSE_REQUEST",
    "SEND_REQUEST",
    "STREAM_RESPONSE",
    "TOOL_CALL",
    "RENDER",
];

/// Output read from a hook command, at most.
const MAX_OUTPUT: usize = 1 << 20;

/// What a hook may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HookKind {
    Guard,
    Transform,
    Observer,
}

impl HookKind {
    pub fn parse(s: &str) -> Option<HookKind> {
        match s {
            "guard" => Some(HookKind::Guard),
            "transform" => Some(HookKind::Transform),
            "observer" => Some(HookKind::Observer),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            HookKind::Guard => "guard",
            HookKind::Transform => "transform",
            HookKind::Observer => "observer",
        }
    }
}

/// `true` for `<TURN_STAGE>/pre` and `<TURN_STAGE>/post`.
pub fn is_slot(slot: &str) -> bool {
    slot.split_once('/')
        .is_some_and(|(stage, when)| TURN_STAGES.contains(&stage) && matches!(when, "pre" | "post"))
}

/// A hook command declared in `pipeline.yaml`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HookDef {
    pub name: String,
    pub at: String,
    pub kind: HookKind,
    /// Run with `sh -c` in the pipeline folder.
    pub command: String,
    #[serde(with = "duration_ms")]
    pub timeout: Duration,
    /// For `TOOL_CALL` slots: only calls of these tools (all when empty).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<String>,
}

mod duration_ms {
    use serde::Serializer;
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format!("{}ms", d.as_millis()))
    }
}

/// Why a hook gave no usable answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("hook `{hook}` could not start: {message}")]
    Spawn { hook: String, message: String },
    #[error("hook `{hook}` did not answer within {timeout:?}")]
    Timeout { hook: String, timeout: Duration },
    #[error("hook `{hook}` exited with {status}: {stderr}")]
    Exit {
        hook: String,
        status: String,
        stderr: String,
    },
    #[error("hook `{hook}` printed something that is not {expected}: {found}")]
    Garbage {
        hook: String,
        expected: &'static str,
        found: String,
    },
    #[error("hook `{hook}` failed: {message}")]
    Failed { hook: String, message: String },
}

impl HookError {
    /// The stable code of every hook error.
    pub const CODE: &'static str = "ExtensionHost/HookFailed";
}

/// A hook's reply. Guards answer `Allow`/`Deny`; transforms `Replace` (or
/// `Allow` to leave the payload as it is); observers' replies are ignored.
#[derive(Debug, Clone, PartialEq)]
pub enum HookReply {
    Allow,
    Deny { reason: String },
    Replace(Value),
}

/// A hook, in Rust or as a command.
pub trait Hook: Send + Sync + std::fmt::Debug {
    fn name(&self) -> &str;
    fn kind(&self) -> HookKind;
    /// For `TOOL_CALL` slots: whether the hook wants calls of `tool`.
    fn wants_tool(&self, _tool: &str) -> bool {
        true
    }
    fn call(
        &self,
        slot: &str,
        payload: Arc<Value>,
    ) -> BoxFuture<'static, Result<HookReply, HookError>>;
}

/// A hook command: payload on stdin, answer on stdout.
#[derive(Debug, Clone)]
pub struct CommandHook {
    pub def: HookDef,
    pub dir: PathBuf,
}

impl Hook for CommandHook {
    fn name(&self) -> &str {
        &self.def.name
    }

    fn kind(&self) -> HookKind {
        self.def.kind
    }

    fn wants_tool(&self, tool: &str) -> bool {
        self.def.tools.is_empty() || self.def.tools.iter().any(|t| t == tool)
    }

    fn call(
        &self,
        _slot: &str,
        payload: Arc<Value>,
    ) -> BoxFuture<'static, Result<HookReply, HookError>> {
        let hook = self.clone();
        async move { hook.run(&payload).await }.boxed()
    }
}

impl CommandHook {
    async fn run(&self, payload: &Value) -> Result<HookReply, HookError> {
        let name = self.def.name.clone();
        let work = async {
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&self.def.command)
                .current_dir(&self.dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| HookError::Spawn {
                    hook: name.clone(),
                    message: e.to_string(),
                })?;
            let input = serde_json::to_vec(payload).unwrap_or_default();
            let mut stdin = child.stdin.take();
            let mut stdout = child.stdout.take();
            let mut stderr = child.stderr.take();
            // Write, read and wait together: a hook that does not read its
            // input, or writes a lot, cannot deadlock us.
            let write = async {
                if let Some(mut s) = stdin.take() {
                    // A hook may ignore its input and exit: a broken pipe is fine.
                    let _ = s.write_all(&input).await;
                }
            };
            let (_, out, err, status) = tokio::join!(
                write,
                read_capped(stdout.take()),
                read_capped(stderr.take()),
                child.wait()
            );
            let status = status.map_err(|e| HookError::Failed {
                hook: name.clone(),
                message: e.to_string(),
            })?;
            Ok::<_, HookError>((status, out, err))
        };
        let (status, out, err) = match tokio::time::timeout(self.def.timeout, work).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(HookError::Timeout {
                    hook: name,
                    timeout: self.def.timeout,
                });
            }
        };
        if !status.success() {
            let stderr = String::from_utf8_lossy(&err);
            return Err(HookError::Exit {
                hook: name,
                status: status.to_string(),
                stderr: stderr.trim().chars().take(300).collect(),
            });
        }
        let text = String::from_utf8_lossy(&out);
        let text = text.trim();
        let garbage = |expected: &'static str| HookError::Garbage {
            hook: self.def.name.clone(),
            expected,
            found: text.chars().take(120).collect(),
        };
        match self.def.kind {
            HookKind::Observer => Ok(HookReply::Allow),
            HookKind::Guard => {
                if text.is_empty() {
                    return Ok(HookReply::Allow);
                }
                let v: Value = serde_json::from_str(text)
                    .map_err(|_| garbage(r#"{"decision":"allow"|"deny","reason":…}"#))?;
                match v.get("decision").and_then(Value::as_str) {
                    Some("allow") => Ok(HookReply::Allow),
                    Some("deny") => Ok(HookReply::Deny {
                        reason: v
                            .get("reason")
                            .and_then(Value::as_str)
                            .unwrap_or("denied by a guard hook")
                            .to_owned(),
                    }),
                    _ => Err(garbage(r#"{"decision":"allow"|"deny","reason":…}"#)),
                }
            }
            HookKind::Transform => {
                if text.is_empty() {
                    return Ok(HookReply::Allow);
                }
                match serde_json::from_str::<Value>(text) {
                    Ok(v @ Value::Object(_)) => Ok(HookReply::Replace(v)),
                    _ => Err(garbage("the rewritten payload as a JSON object")),
                }
            }
        }
    }
}

/// Reads a pipe to its end, keeping at most [`MAX_OUTPUT`] bytes.
async fn read_capped<R: tokio::io::AsyncRead + Unpin>(pipe: Option<R>) -> Vec<u8> {
    let mut buf = Vec::new();
    if let Some(p) = pipe {
        let _ = p.take(MAX_OUTPUT as u64).read_to_end(&mut buf).await;
    }
    buf
}

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
                Arc::new(CommandHook {
                    def: def.clone(),
                    dir: dir.to_owned(),
                }),
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

    /// Runs the slot's hooks in order: guards, transforms, observers.
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
        for hook in wanted(HookKind::Guard) {
            let reply = hook.call(slot, Arc::clone(&payload)).await;
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
                return SlotOutcome::Denied {
                    hook: hook.name().to_owned(),
                    reason,
                };
            }
        }
        for hook in wanted(HookKind::Transform) {
            match hook.call(slot, Arc::clone(&payload)).await {
                Ok(HookReply::Replace(v)) => {
                    log.push(HookRun {
                        hook: hook.name().to_owned(),
                        kind: HookKind::Transform,
                        outcome: "transformed",
                        error: None,
                    });
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn hook(kind: HookKind, command: &str) -> CommandHook {
        CommandHook {
            def: HookDef {
                name: command.chars().take(20).collect(),
                at: "TOOL_CALL/pre".into(),
                kind,
                command: command.into(),
                timeout: Duration::from_secs(5),
                tools: vec![],
            },
            dir: std::env::temp_dir(),
        }
    }

    fn run(h: &CommandHook, payload: Value) -> Result<HookReply, HookError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(h.run(&payload))
    }

    #[test]
    fn slots_are_the_six_turn_stages_pre_and_post() {
        assert!(is_slot("TOOL_CALL/pre"));
        assert!(is_slot("RENDER/post"));
        assert!(!is_slot("TOOL_CALL"));
        assert!(!is_slot("TOOL_CALL/during"));
        assert!(!is_slot("ACT/pre"));
    }

    #[test]
    fn a_guard_reads_stdin_and_answers_on_stdout() {
        let g = hook(
            HookKind::Guard,
            r#"if grep -q '"rm '; then echo '{"decision":"deny","reason":"no rm"}'; else echo '{"decision":"allow"}'; fi"#,
        );
        assert_eq!(
            run(&g, json!({"arguments": {"command": "rm -rf x"}})).unwrap(),
            HookReply::Deny {
                reason: "no rm".into()
            }
        );
        assert_eq!(
            run(&g, json!({"arguments": {"command": "ls"}})).unwrap(),
            HookReply::Allow
        );
    }

    #[test]
    fn crashes_garbage_and_hangs_are_typed_errors() {
        let crash = hook(HookKind::Guard, "echo boom >&2; exit 3");
        match run(&crash, json!({})) {
            Err(HookError::Exit { stderr, .. }) => assert_eq!(stderr, "boom"),
            other => panic!("{other:?}"),
        }
        let garbage = hook(HookKind::Transform, "echo not json");
        assert!(matches!(
            run(&garbage, json!({})),
            Err(HookError::Garbage { .. })
        ));
        let mut hang = hook(HookKind::Guard, "sleep 30");
        hang.def.timeout = Duration::from_millis(100);
        assert!(matches!(
            run(&hang, json!({})),
            Err(HookError::Timeout { .. })
        ));
    }

    #[test]
    fn a_hook_that_ignores_a_large_input_does_not_deadlock() {
        let h = hook(HookKind::Observer, "exit 0");
        let big = json!({"x": "y".repeat(4 << 20)});
        assert_eq!(run(&h, big).unwrap(), HookReply::Allow);
    }
}
