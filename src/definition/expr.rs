//! CEL expressions: compiled once at load, evaluated against JSON variables.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

/// A compiled CEL expression with its source text.
#[derive(Clone)]
pub struct Expr {
    source: String,
    program: Arc<cel::Program>,
}

impl fmt::Debug for Expr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Expr").field(&self.source).finish()
    }
}

impl serde::Serialize for Expr {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

/// Why an expression failed to evaluate.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{source_text}`: {message}")]
pub struct ExprError {
    pub source_text: String,
    pub message: String,
}

impl Expr {
    /// Compiles `source`; on failure returns a one-line message. The parser is
    /// third-party code fed user input, so a panic in it is caught and
    /// reported as a parse error.
    pub fn compile(source: &str) -> Result<Expr, String> {
        if source.trim().is_empty() {
            return Err("empty expression".to_owned());
        }
        let compiled = catch_unwind(AssertUnwindSafe(|| cel::Program::compile(source)));
        match compiled {
            Ok(Ok(program)) => Ok(Expr {
                source: source.to_owned(),
                program: Arc::new(program),
            }),
            Ok(Err(err)) => Err(compact_parse_error(&err.to_string())),
            Err(_) => Err("the expression parser failed on this input".to_owned()),
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The top-level variables the expression reads.
    pub fn variables(&self) -> Vec<String> {
        self.program
            .references()
            .variables()
            .into_iter()
            .map(str::to_owned)
            .collect()
    }

    /// Evaluates with the given variables bound; the result comes back as JSON.
    pub fn eval(
        &self,
        vars: &[(&str, &serde_json::Value)],
    ) -> Result<serde_json::Value, ExprError> {
        let fail = |message: String| ExprError {
            source_text: self.source.clone(),
            message,
        };
        let mut context = cel::Context::default();
        for (name, value) in vars {
            context
                .add_variable(*name, *value)
                .map_err(|e| fail(format!("cannot bind `{name}`: {e}")))?;
        }
        let result = catch_unwind(AssertUnwindSafe(|| self.program.execute(&context)))
            .map_err(|_| fail("the expression evaluator failed".to_owned()))?
            .map_err(|e| fail(e.to_string()))?;
        result
            .json()
            .map_err(|e| fail(format!("result is not representable as JSON: {e}")))
    }

    /// Evaluates and requires a boolean.
    pub fn eval_bool(&self, vars: &[(&str, &serde_json::Value)]) -> Result<bool, ExprError> {
        match self.eval(vars)? {
            serde_json::Value::Bool(b) => Ok(b),
            other => Err(ExprError {
                source_text: self.source.clone(),
                message: format!("expected a boolean, got {}", json_kind(&other)),
            }),
        }
    }
}

/// The name of a JSON value's type, for messages.
pub fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Number(_) => "number",
        serde_json::Value::String(_) => "string",
        serde_json::Value::Array(_) => "list",
        serde_json::Value::Object(_) => "map",
    }
}

/// cel's parse errors span several lines with a caret; keep the message.
fn compact_parse_error(message: &str) -> String {
    let first = message.lines().next().unwrap_or("syntax error").trim();
    let first = first.strip_prefix("ERROR: ").unwrap_or(first);
    let first = first.strip_prefix("<input>:").unwrap_or(first);
    first.to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn evaluates_against_json() {
        let e = Expr::compile("size(parsed.steps) > 0").unwrap();
        assert!(e.eval_bool(&[("parsed", &json!({"steps": [1]}))]).unwrap());
        assert!(!e.eval_bool(&[("parsed", &json!({"steps": []}))]).unwrap());
    }

    #[test]
    fn missing_key_is_an_error_not_a_panic() {
        let e = Expr::compile("parsed.nope == 1").unwrap();
        let err = e.eval(&[("parsed", &json!({}))]).unwrap_err();
        assert!(err.message.contains("nope"), "{}", err.message);
    }

    #[test]
    fn parse_errors_are_one_line() {
        let err = Expr::compile("size(x) >").unwrap_err();
        assert!(!err.contains('\n'));
        assert!(Expr::compile("  ").is_err());
    }

    #[test]
    fn reports_variables() {
        let e = Expr::compile("ctx.upstream[0].parsed.items").unwrap();
        assert_eq!(e.variables(), vec!["ctx".to_owned()]);
    }
}
