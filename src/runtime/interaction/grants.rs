//! Grants: the `grantStageTool` request for one call outside a stage's
//! `allowedTools`, the hub's decision on it, and the one-shot tokens an
//! approval mints for exactly that call (tool and argument digest).

use std::collections::{HashMap, HashSet};

use serde_json::Value;
use sha2::{Digest, Sha256};

/// A `grantStageTool` interaction: may this out-of-envelope call run?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrantRequest {
    pub workflow_run_id: String,
    pub stage_execution_id: String,
    pub stage_id: String,
    pub attempt: u32,
    pub proposal_id: String,
    pub tool: String,
    /// SHA-256 of the key-sorted JSON arguments, hex.
    pub args_digest: String,
    /// The arguments, shortened for a prompt.
    pub args_summary: String,
}

#[cfg(test)]
impl GrantRequest {
    /// A request for `tool` with `args` from execution `r/s/1` of stage
    /// `s` in run `r`, its first attempt (the tests' sample).
    pub(crate) fn sample(proposal: &str, tool: &str, args: &Value) -> GrantRequest {
        GrantRequest {
            workflow_run_id: "r".into(),
            stage_execution_id: "r/s/1".into(),
            stage_id: "s".into(),
            attempt: 1,
            proposal_id: proposal.into(),
            tool: tool.into(),
            args_digest: args_digest(args),
            args_summary: args_summary(args),
        }
    }
}

/// The hub's decision on a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GrantDecision {
    Approved { by: String },
    Denied { reason: String },
}

/// SHA-256 of `value` serialized with object keys sorted, as hex.
pub fn args_digest(value: &Value) -> String {
    let mut canonical = String::new();
    write_canonical(value, &mut canonical);
    let digest = Sha256::digest(canonical.as_bytes());
    digest.iter().map(|b| format!("{b:02x}")).collect()
}

fn write_canonical(value: &Value, out: &mut String) {
    match value {
        Value::Object(map) => {
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            out.push('{');
            for (i, k) in keys.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(k.clone()).to_string());
                out.push(':');
                if let Some(v) = map.get(k) {
                    write_canonical(v, out);
                }
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, v) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_canonical(v, out);
            }
            out.push(']');
        }
        other => out.push_str(&other.to_string()),
    }
}

/// The arguments as one short line for a prompt.
pub fn args_summary(value: &Value) -> String {
    const MAX: usize = 200;
    let text = value.to_string();
    if text.chars().count() <= MAX {
        text
    } else {
        let cut: String = text.chars().take(MAX).collect();
        format!("{cut}…")
    }
}

/// Why a grant token could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GrantError {
    #[error("no grant was given for proposal `{0}`")]
    NoToken(String),
    #[error("the grant for proposal `{0}` was already used")]
    AlreadyConsumed(String),
    #[error("the grant for proposal `{0}` was for other arguments or another tool")]
    Mismatch(String),
}

/// One-shot grant tokens of one stage execution. A token is bound to
/// exactly one proposal (tool and argument digest); using it consumes it.
/// The ledger dies with the execution, and its tokens with it.
#[derive(Debug, Default)]
pub struct GrantLedger {
    tokens: HashMap<String, (String, String)>,
    consumed: HashSet<String>,
}

impl GrantLedger {
    /// Mints the token for an approved proposal.
    pub fn mint(&mut self, request: &GrantRequest) {
        self.tokens.insert(
            request.proposal_id.clone(),
            (request.tool.clone(), request.args_digest.clone()),
        );
    }

    /// Uses the token of `proposal_id` for `tool` with `digest`.
    pub fn consume(
        &mut self,
        proposal_id: &str,
        tool: &str,
        digest: &str,
    ) -> Result<(), GrantError> {
        if self.consumed.contains(proposal_id) {
            return Err(GrantError::AlreadyConsumed(proposal_id.to_owned()));
        }
        match self.tokens.get(proposal_id) {
            None => Err(GrantError::NoToken(proposal_id.to_owned())),
            Some((t, d)) if t != tool || d != digest => {
                Err(GrantError::Mismatch(proposal_id.to_owned()))
            }
            Some(_) => {
                self.tokens.remove(proposal_id);
                self.consumed.insert(proposal_id.to_owned());
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_digest_ignores_key_order_but_not_values() {
        let a = json!({"command": "ls", "timeout": 5, "env": {"b": 1, "a": 2}});
        let b = json!({"env": {"a": 2, "b": 1}, "timeout": 5, "command": "ls"});
        let c = json!({"command": "ls -la", "timeout": 5, "env": {"b": 1, "a": 2}});
        assert_eq!(args_digest(&a), args_digest(&b));
        assert_ne!(args_digest(&a), args_digest(&c));
        assert_eq!(args_digest(&a).len(), 64);
    }

    #[test]
    fn a_grant_is_used_once_for_exactly_its_proposal() {
        let args = json!({"command": "git status"});
        let req = GrantRequest::sample("p1", "Bash", &args);
        let mut ledger = GrantLedger::default();
        assert_eq!(
            ledger.consume("p1", "Bash", &req.args_digest),
            Err(GrantError::NoToken("p1".into()))
        );
        ledger.mint(&req);
        let other = args_digest(&json!({"command": "rm -rf /"}));
        assert_eq!(
            ledger.consume("p1", "Bash", &other),
            Err(GrantError::Mismatch("p1".into()))
        );
        assert_eq!(ledger.consume("p1", "Bash", &req.args_digest), Ok(()));
        assert_eq!(
            ledger.consume("p1", "Bash", &req.args_digest),
            Err(GrantError::AlreadyConsumed("p1".into()))
        );
    }
}
