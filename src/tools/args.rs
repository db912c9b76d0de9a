//! Tool arguments checked against the tool's JSON Schema before the tool
//! runs, then read into the tool's typed argument struct. Each schema is
//! compiled once per process.

use std::collections::HashMap;
use std::sync::LazyLock;

use serde::de::DeserializeOwned;
use serde_json::Value;

use super::error::ToolError;
use crate::definition::builtin_tools;

/// Errors listed in one message, at most.
const MAX_ERRORS: usize = 5;
/// Characters of one schema error message, at most (a message may quote a
/// value).
const MAX_ERROR_CHARS: usize = 200;

/// By tool name, hashed with foldhash: SipHash of the name was a sixth of
/// an `Echo` call's check.
static VALIDATORS: LazyLock<HashMap<String, jsonschema::Validator, foldhash::fast::RandomState>> =
    LazyLock::new(|| {
        builtin_tools()
            .into_iter()
            // A catalog schema that does not compile leaves its tool out; the
            // catalog's unit test proves every one compiles.
            .filter_map(|t| Some((t.name, jsonschema::validator_for(&t.parameters).ok()?)))
            .collect()
    });

/// Compiles every built-in tool's schema now, if that has not happened
/// yet: a run calls this before it starts, so its first tool call does
/// not pay for all of them (~2-3 ms) in the middle of the run.
pub fn prepare() {
    LazyLock::force(&VALIDATORS);
}

/// Checks `args` against the schema of built-in tool `name`. The message
/// names every offending field (`/offset: …`), at most five.
pub fn check(name: &str, args: &Value) -> Result<(), ToolError> {
    let Some(validator) = VALIDATORS.get(name) else {
        return Err(ToolError::terminal(
            "ToolUnavailable",
            format!("tool `{name}` has no implementation in this build"),
        ));
    };
    if validator.is_valid(args) {
        return Ok(());
    }
    let errors: Vec<String> = validator
        .iter_errors(args)
        .take(MAX_ERRORS)
        .map(|e| {
            let path = e.instance_path().to_string();
            let field = if path.is_empty() {
                "/".to_owned()
            } else {
                path
            };
            let mut text = e.to_string();
            if let Some((cut, _)) = text.char_indices().nth(MAX_ERROR_CHARS) {
                text.truncate(cut);
                text.push('…');
            }
            format!("{field}: {text}")
        })
        .collect();
    Err(ToolError::invalid_args(format!(
        "invalid arguments for `{name}`: {}",
        errors.join("; ")
    )))
}

/// Reads checked arguments into `T`.
pub fn parse<T: DeserializeOwned>(name: &str, args: &Value) -> Result<T, ToolError> {
    T::deserialize(args)
        .map_err(|e| ToolError::invalid_args(format!("invalid arguments for `{name}`: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn message(r: Result<(), ToolError>) -> String {
        match r {
            Err(ToolError::Terminal {
                code: "InvalidArguments",
                message,
            }) => message,
            other => panic!("expected InvalidArguments, got {other:?}"),
        }
    }

    #[test]
    fn every_builtin_has_a_validator() {
        for t in builtin_tools() {
            assert!(VALIDATORS.contains_key(&t.name), "{}", t.name);
        }
    }

    #[test]
    fn errors_name_the_field() {
        let m = message(check("Read", &json!({"path": "a", "offset": 0})));
        assert!(m.contains("/offset"), "{m}");
        let m = message(check("Read", &json!({})));
        assert!(m.contains("path"), "{m}");
        let m = message(check(
            "Edit",
            &json!({"path": "a", "old_string": 1, "new_string": "b"}),
        ));
        assert!(m.contains("/old_string"), "{m}");
        let m = message(check("Bash", &json!({"command": "ls", "shell": "zsh"})));
        assert!(m.contains("shell"), "{m}");
        assert!(check("Glob", &json!({"pattern": "*.rs"})).is_ok());
    }

    #[test]
    fn long_values_are_cut() {
        let big = "x".repeat(10_000);
        let m = message(check("Read", &json!({"path": "a", "limit": big})));
        assert!(m.len() < 1000, "{}", m.len());
    }
}
