//! CEL expressions: compiled once at load, evaluated against JSON variables.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;

use cel::common::ast::{EntryExpr, Expr as Ast, IdedEntryExpr, IdedExpr};

use super::template::Segment;

/// A compiled CEL expression with its source text.
#[derive(Clone)]
pub struct Expr {
    source: String,
    program: Arc<cel::Program>,
    /// The expression as a plain path (`ctx.upstream[0].parsed.items`),
    /// when it is one: evaluated by walking the JSON. A fan-out's `over`
    /// is such a path, and handing CEL the whole context converted 10 000
    /// results to CEL values and back (BENCHMARKS.md).
    path: Option<Arc<Path>>,
}

/// A variable followed by field names and list indexes.
#[derive(Debug, PartialEq, Eq)]
struct Path {
    root: String,
    steps: Vec<Step>,
}

#[derive(Debug, PartialEq, Eq)]
enum Step {
    Field(String),
    Index(usize),
}

impl Path {
    /// Parses `ident ('.' ident | '[' digits ']')*` and nothing else.
    fn parse(source: &str) -> Option<Path> {
        fn ident(s: &str) -> Option<(&str, &str)> {
            let end = s
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(s.len());
            let (name, rest) = s.split_at(end);
            let first = name.chars().next()?;
            (first.is_ascii_alphabetic() || first == '_').then_some((name, rest))
        }
        let source = source.trim();
        let (root, mut rest) = ident(source)?;
        // CEL words that are not variables.
        if matches!(root, "true" | "false" | "null" | "in") {
            return None;
        }
        let mut steps = Vec::new();
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('.') {
                let (name, r) = ident(after)?;
                steps.push(Step::Field(name.to_owned()));
                rest = r;
            } else if let Some(after) = rest.strip_prefix('[') {
                let (digits, r) = after.split_once(']')?;
                if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                    return None;
                }
                steps.push(Step::Index(digits.parse().ok()?));
                rest = r;
            } else {
                return None;
            }
        }
        Some(Path {
            root: root.to_owned(),
            steps,
        })
    }

    /// The value at the path; `None` when any step misses (CEL then
    /// evaluates it, for its own error message).
    fn walk<'v>(&self, vars: &[(&str, &'v serde_json::Value)]) -> Option<&'v serde_json::Value> {
        let &(_, mut at) = vars.iter().find(|(name, _)| *name == self.root)?;
        for step in &self.steps {
            at = match step {
                Step::Field(name) => at.as_object()?.get(name)?,
                Step::Index(i) => at.as_array()?.get(*i)?,
            };
        }
        Some(at)
    }
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

/// Most operators, brackets, dots and commas an expression may hold. The
/// CEL parser and evaluator recurse once per operator of a chain (`1 + 1 +
/// …`, `a[0][0]…`) with no limit of their own: a chain of 2 000 overflowed
/// a 2 MiB thread stack, which aborts the process (catch_unwind cannot stop
/// it). Nesting (`size(size(…))`) the parser already limits to 96 levels.
const MAX_OPERATORS: usize = 256;

/// Operator characters (each of `==`, `&&` counts twice), commas and `in`s,
/// also inside string literals: an over-count, never an under-count.
/// Commas count so that list literals, which macros iterate, stay short.
fn operator_count(source: &str) -> usize {
    let symbols = source
        .bytes()
        .filter(|b| b"+-*/%<>=!&|?.,[({".contains(b))
        .count();
    let ins = source
        .split(|c: char| !(c.is_alphanumeric() || c == '_'))
        .filter(|word| *word == "in")
        .count();
    symbols + ins
}

/// Deepest nesting of macros (`all`, `exists`, `exists_one`, `map`,
/// `filter`) allowed. Each nested level multiplies the work by its list's
/// length: ten `[1, 2].map(x, …)` inside each other built 2^10 lists, twenty
/// took 43 s and 500 MB, and nothing in CEL stops an evaluation.
const MAX_MACRO_NESTING: usize = 3;

/// How deeply macros nest in `e`: a macro inside another's predicate or
/// transform, not one that feeds another its list (`a.map(…).filter(…)`).
/// The recursion is bounded by MAX_OPERATORS.
fn macro_nesting(e: &IdedExpr) -> usize {
    let most =
        |items: &mut dyn Iterator<Item = &IdedExpr>| items.map(macro_nesting).max().unwrap_or(0);
    match &e.expr {
        Ast::Unspecified | Ast::Ident(_) | Ast::Literal(_) => 0,
        Ast::Select(select) => macro_nesting(&select.operand),
        Ast::Call(call) => most(&mut call.target.as_deref().into_iter().chain(&call.args)),
        Ast::List(list) => most(&mut list.elements.iter()),
        Ast::Map(map) => most(&mut map.entries.iter().flat_map(entry_exprs)),
        Ast::Struct(structure) => most(&mut structure.entries.iter().flat_map(entry_exprs)),
        Ast::Comprehension(c) => {
            let body = most(&mut [&c.loop_cond, &c.loop_step, &c.result].into_iter());
            (body + 1).max(most(&mut [&c.iter_range, &c.accu_init].into_iter()))
        }
    }
}

fn entry_exprs(entry: &IdedEntryExpr) -> Vec<&IdedExpr> {
    match &entry.expr {
        EntryExpr::StructField(field) => vec![&field.value],
        EntryExpr::MapEntry(pair) => vec![&pair.key, &pair.value],
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
        let operators = operator_count(source);
        if operators > MAX_OPERATORS {
            return Err(format!(
                "too long: {operators} operators, brackets, dots and commas, at most {MAX_OPERATORS}"
            ));
        }
        let compiled = catch_unwind(AssertUnwindSafe(|| cel::Program::compile(source)));
        match compiled {
            Ok(Ok(program)) if macro_nesting(program.expression()) > MAX_MACRO_NESTING => {
                Err(format!(
                    "macros (all, exists, map, filter) nest deeper than {MAX_MACRO_NESTING} levels"
                ))
            }
            Ok(Ok(program)) => Ok(Expr {
                source: source.to_owned(),
                program: Arc::new(program),
                path: Path::parse(source).map(Arc::new),
            }),
            Ok(Err(err)) => Err(compact_parse_error(&err.to_string())),
            Err(_) => Err("the expression parser failed on this input".to_owned()),
        }
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// The expression as a placeholder path (`ctx.upstream[0].parsed.items`
    /// as `ctx`, `upstream`, `[0]`, …) when it is a plain path rooted at
    /// `root`: what a context can read without building the whole value
    /// CEL would be handed.
    pub fn path_under(&self, root: &str) -> Option<Vec<Segment>> {
        let path = self.path.as_ref().filter(|p| p.root == root)?;
        let mut segments = Vec::with_capacity(path.steps.len() + 1);
        segments.push(Segment::Key(path.root.clone()));
        segments.extend(path.steps.iter().map(|step| match step {
            Step::Field(name) => Segment::Key(name.clone()),
            Step::Index(i) => Segment::Index(*i),
        }));
        Some(segments)
    }

    /// The top-level variables the expression reads.
    pub fn variables(&self) -> Vec<String> {
        let bound = self.macro_variables();
        self.program
            .references()
            .variables()
            .into_iter()
            .filter(|v| !bound.iter().any(|b| b == v))
            .map(str::to_owned)
            .collect()
    }

    /// Names a comprehension macro binds (`items.filter(x, …)`,
    /// `map`, `all`, `exists`, `exists_one`): not variables the
    /// expression reads from outside.
    fn macro_variables(&self) -> Vec<String> {
        let mut out = Vec::new();
        for m in ["filter", "map", "all", "exists", "exists_one"] {
            let open = format!(".{m}(");
            let mut rest = self.source.as_str();
            while let Some(at) = rest.find(&open) {
                rest = &rest[at + open.len()..];
                let name: String = rest
                    .trim_start()
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                let after = rest.trim_start()[name.len()..].trim_start();
                if !name.is_empty() && after.starts_with(',') {
                    out.push(name);
                }
            }
        }
        out
    }

    /// Evaluates with the given variables bound; the result comes back as JSON.
    pub fn eval(
        &self,
        vars: &[(&str, &serde_json::Value)],
    ) -> Result<serde_json::Value, ExprError> {
        if let Some(found) = self.path.as_ref().and_then(|p| p.walk(vars)) {
            return Ok(found.clone());
        }
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
    fn plain_paths_walk_the_json_and_agree_with_cel() {
        let ctx = json!({"upstream": [{"parsed": {"items": [1, "two", {"x": 3.5}], "n": null}}]});
        for source in [
            "ctx.upstream[0].parsed.items",
            "ctx.upstream[0].parsed.items[2].x",
            "ctx.upstream[0].parsed.n",
            " ctx.upstream ",
        ] {
            let e = Expr::compile(source).unwrap();
            assert!(e.path.is_some(), "{source} is a plain path");
            let walked = e.eval(&[("ctx", &ctx)]).unwrap();
            let by_cel = Expr {
                path: None,
                ..e.clone()
            }
            .eval(&[("ctx", &ctx)])
            .unwrap();
            assert_eq!(walked, by_cel, "{source}");
        }
        // A miss falls through to CEL and its error.
        for source in ["ctx.nope", "ctx.upstream[7]", "ctx.upstream.parsed"] {
            let e = Expr::compile(source).unwrap();
            assert!(e.eval(&[("ctx", &ctx)]).is_err(), "{source}");
        }
        // Anything but a plain path is CEL's.
        for source in [
            "ctx.a + 1",
            "size(ctx)",
            "ctx['a']",
            "ctx[-1]",
            "true",
            "ctx.a.b()",
        ] {
            assert_eq!(Path::parse(source), None, "{source}");
        }
    }

    #[test]
    fn reports_variables() {
        let e = Expr::compile("ctx.upstream[0].parsed.items").unwrap();
        assert_eq!(e.variables(), vec!["ctx".to_owned()]);
    }
}
