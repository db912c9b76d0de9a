//! The values a server was given from troupe's environment (its `env:`
//! names, its `headersFromEnv:` variables), kept out of what troupe
//! records of it: a server may echo its environment in a tool's result,
//! an error or its stderr, and those reach the audit log, the store, the
//! summary and the model. Each value of [`SHORTEST`] characters or more
//! is replaced by `[redacted]` wherever it appears in them.

use std::sync::Arc;

use serde_json::Value;

use super::McpError;
use super::result::ToolOutput;
use crate::definition::mcp::{McpServerDef, McpTransport};
use crate::tools::ToolError;

/// Shorter values (a `1`, a `true`, a port) are too likely to be words of
/// the text to be taken for a secret.
const SHORTEST: usize = 8;

/// A server's secret values.
#[derive(Debug, Clone, Default)]
pub(super) struct Secrets(Arc<[String]>);

impl Secrets {
    /// The values of `def`'s variables, as troupe's environment has them.
    pub(super) fn of(def: &McpServerDef) -> Secrets {
        let names: Vec<&str> = match &def.transport {
            McpTransport::Stdio { env, .. } => env.iter().map(String::as_str).collect(),
            McpTransport::Http {
                headers_from_env, ..
            } => headers_from_env
                .iter()
                .map(|(_, var)| var.as_str())
                .collect(),
        };
        Secrets::from_values(names.into_iter().filter_map(crate::environ::var))
    }

    pub(super) fn from_values(values: impl Iterator<Item = String>) -> Secrets {
        let mut values: Vec<String> = values.filter(|v| v.len() >= SHORTEST).collect();
        // As a JSON string writes it too (a `"` or `\` escaped): a result
        // with only structured content is read as its JSON text.
        let escaped: Vec<String> = values
            .iter()
            .filter_map(|v| {
                let json = serde_json::to_string(v).ok()?;
                let inner = json.get(1..json.len() - 1)?.to_owned();
                (inner != *v).then_some(inner)
            })
            .collect();
        values.extend(escaped);
        // The longest first: one value that holds another is replaced whole.
        values.sort_by_key(|v| std::cmp::Reverse(v.len()));
        Secrets(values.into())
    }

    /// Where to cut `bytes` at `at` or before so that no value is split
    /// between the two parts (and missed in both): before the first value
    /// that begins within a value's length of `at` and runs past it, or
    /// could (the bytes end before it does). Never 0 for an `at` longer
    /// than every value.
    pub(super) fn cut_before(&self, bytes: &[u8], at: usize) -> usize {
        let mut cut = at.min(bytes.len());
        for secret in self.0.iter().map(String::as_bytes) {
            let from = at.saturating_sub(secret.len() - 1).max(1);
            for start in from..at.min(bytes.len()) {
                let here = &bytes[start..bytes.len().min(start + secret.len())];
                if start < cut && secret.starts_with(here) && start + secret.len() > at {
                    cut = start;
                    break;
                }
            }
        }
        cut
    }

    /// `text` with every value replaced.
    pub(super) fn text(&self, text: String) -> String {
        self.0.iter().fold(text, |text, secret| {
            if text.contains(secret.as_str()) {
                text.replace(secret.as_str(), "[redacted]")
            } else {
                text
            }
        })
    }

    /// A tool call's outcome with every value replaced: the text, every
    /// string of the structured content, an error's message.
    pub(super) fn outcome(
        &self,
        outcome: Result<ToolOutput, ToolError>,
    ) -> Result<ToolOutput, ToolError> {
        if self.0.is_empty() {
            return outcome;
        }
        match outcome {
            Ok(ToolOutput { text, structured }) => Ok(ToolOutput {
                text: self.text(text),
                structured: structured.map(|v| self.value(v)),
            }),
            Err(ToolError::Terminal { code, message }) => Err(ToolError::Terminal {
                code,
                message: self.text(message),
            }),
            Err(ToolError::Transient { code, message }) => Err(ToolError::Transient {
                code,
                message: self.text(message),
            }),
        }
    }

    /// An error of the server's start with every value replaced.
    pub(super) fn error(&self, error: McpError) -> McpError {
        McpError {
            code: error.code,
            message: self.text(error.message),
        }
    }

    fn value(&self, value: Value) -> Value {
        match value {
            Value::String(s) => Value::String(self.text(s)),
            Value::Array(items) => Value::Array(items.into_iter().map(|v| self.value(v)).collect()),
            Value::Object(map) => Value::Object(
                map.into_iter()
                    .map(|(k, v)| (self.text(k), self.value(v)))
                    .collect(),
            ),
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_value_is_replaced_wherever_the_server_put_it_and_a_short_one_is_left() {
        let secrets = Secrets::from_values(
            [
                "ghp_0123456789abcdef".to_owned(),
                "1".to_owned(),
                "ghp_0123456789abcdef-xl".to_owned(),
            ]
            .into_iter(),
        );
        let out = secrets.outcome(Ok(ToolOutput {
            text: "token ghp_0123456789abcdef-xl and ghp_0123456789abcdef, port 1".into(),
            structured: Some(
                json!({"env": {"ghp_0123456789abcdef": ["x ghp_0123456789abcdef y"]}}),
            ),
        }));
        let out = out.unwrap();
        assert_eq!(out.text, "token [redacted] and [redacted], port 1");
        assert_eq!(
            out.structured.unwrap(),
            json!({"env": {"[redacted]": ["x [redacted] y"]}})
        );
        let err = secrets.outcome(Err(ToolError::terminal(
            "ToolReportedError",
            "bad key ghp_0123456789abcdef",
        )));
        assert_eq!(err.unwrap_err().to_string(), "bad key [redacted]");
        let start = secrets.error(McpError::new(
            "InitializeFailed",
            "stderr: ghp_0123456789abcdef",
        ));
        assert_eq!(start.message, "stderr: [redacted]");
    }

    /// A value with a `"` or `\\` in it is also found as JSON writes it
    /// (structured content read as its JSON text).
    #[test]
    fn a_value_is_found_as_json_escapes_it_too() {
        let secret = r#"pa"ss\word-1234"#;
        let secrets = Secrets::from_values([secret.to_owned()].into_iter());
        let as_json = serde_json::to_string(&json!({"echo": secret})).unwrap();
        assert_eq!(secrets.text(as_json), r#"{"echo":"[redacted]"}"#);
        assert_eq!(secrets.text(format!("raw {secret}")), "raw [redacted]");
    }
}
