//! `{{ ... }}` templates: parsed at load so bad placeholders fail
//! validation, rendered once at Init against a StageContext value.
//!
//! A placeholder is a path: `ctx.task`, `ctx.upstream[0].parsed.summary`,
//! `stage.name`. Strings insert raw; numbers, booleans, null, objects and
//! arrays insert as compact JSON. There are no conditionals or loops.

use std::fmt;

/// One step of a placeholder path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    Index(usize),
}

/// A `{{ path }}` placeholder and where it starts in the template source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placeholder {
    pub path: Vec<Segment>,
    /// Byte offset of the opening `{{` in the template source.
    pub offset: usize,
    /// The placeholder's text between the braces, trimmed.
    pub text: String,
}

impl Placeholder {
    /// The first segment: the namespace (`ctx`, `stage`, …).
    pub fn namespace(&self) -> &str {
        match self.path.first() {
            Some(Segment::Key(k)) => k,
            _ => "",
        }
    }

    /// The second segment when it is a key: the field within the namespace.
    pub fn field(&self) -> Option<&str> {
        match self.path.get(1) {
            Some(Segment::Key(k)) => Some(k),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Text(String),
    Slot(Placeholder),
}

/// A parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    parts: Vec<Part>,
}

impl serde::Serialize for Template {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.source)
    }
}

/// A syntax error in a template, at a byte offset of its source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateSyntaxError {
    pub offset: usize,
    pub message: String,
}

/// A placeholder with no value at render time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("placeholder `{{{{{placeholder}}}}}` has no value: {reason}")]
pub struct RenderError {
    pub placeholder: String,
    pub reason: String,
}

impl Template {
    /// Parses every placeholder; the first syntax error stops parsing.
    pub fn parse(source: &str) -> Result<Template, TemplateSyntaxError> {
        let mut parts = Vec::new();
        let mut rest = source;
        let mut consumed = 0;
        while let Some(open) = rest.find("{{") {
            if open > 0 {
                parts.push(Part::Text(rest[..open].to_owned()));
            }
            let offset = consumed + open;
            let after = &rest[open + 2..];
            let Some(close) = after.find("}}") else {
                return Err(TemplateSyntaxError {
                    offset,
                    message: "unclosed `{{`: every placeholder needs a closing `}}`".to_owned(),
                });
            };
            let inner = &after[..close];
            if inner.contains("{{") {
                return Err(TemplateSyntaxError {
                    offset,
                    message: "unclosed `{{` before another `{{`".to_owned(),
                });
            }
            let text = inner.trim();
            let path =
                parse_path(text).map_err(|message| TemplateSyntaxError { offset, message })?;
            parts.push(Part::Slot(Placeholder {
                path,
                offset,
                text: text.to_owned(),
            }));
            let advance = open + 2 + close + 2;
            consumed += advance;
            rest = &rest[advance..];
        }
        if !rest.is_empty() {
            parts.push(Part::Text(rest.to_owned()));
        }
        Ok(Template {
            source: source.to_owned(),
            parts,
        })
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn placeholders(&self) -> impl Iterator<Item = &Placeholder> {
        self.parts.iter().filter_map(|p| match p {
            Part::Slot(ph) => Some(ph),
            Part::Text(_) => None,
        })
    }

    /// Renders against a scope object such as `{"ctx": {...}, "stage": {...}}`.
    pub fn render(&self, scope: &serde_json::Value) -> Result<String, RenderError> {
        self.render_with(|path| lookup(scope, path).cloned())
    }

    /// Renders, asking `resolve` for each placeholder's value.
    pub fn render_with(
        &self,
        resolve: impl Fn(&[Segment]) -> Result<serde_json::Value, String>,
    ) -> Result<String, RenderError> {
        let mut out = String::with_capacity(self.source.len());
        for part in &self.parts {
            match part {
                Part::Text(t) => out.push_str(t),
                Part::Slot(ph) => {
                    let value = resolve(&ph.path).map_err(|reason| RenderError {
                        placeholder: ph.text.clone(),
                        reason,
                    })?;
                    match value {
                        serde_json::Value::String(s) => out.push_str(&s),
                        serde_json::Value::Number(n) => push_number(&mut out, &n),
                        other => out.push_str(&json_text(&other)),
                    }
                }
            }
        }
        Ok(out)
    }

    /// When the whole template is one placeholder, resolves it to its typed
    /// value (so `"{{ctx.index}}"` can yield a number); otherwise renders text.
    pub fn render_value(
        &self,
        resolve: impl Fn(&[Segment]) -> Result<serde_json::Value, String>,
    ) -> Result<serde_json::Value, RenderError> {
        if let [Part::Slot(ph)] = self.parts.as_slice() {
            return resolve(&ph.path).map_err(|reason| RenderError {
                placeholder: ph.text.clone(),
                reason,
            });
        }
        self.render_with(resolve).map(serde_json::Value::String)
    }
}

/// `n` as `Display` writes it: integers without `fmt`, which cost a fan-out
/// sibling's `"item {{ctx.item}}"` more than the rest of its rendering.
fn push_number(out: &mut String, n: &serde_json::Number) {
    use crate::auditlog::json::push_decimal;
    if let Some(u) = n.as_u64() {
        push_decimal(out, u);
    } else if let Some(i) = n.as_i64() {
        out.push('-');
        push_decimal(out, i.unsigned_abs());
    } else {
        use std::fmt::Write as _;
        // Writing to a `String` cannot fail.
        let _ = write!(out, "{n}");
    }
}

/// `value` as compact JSON text, as `Value`'s `Display` writes it. Written
/// into bytes, not through `fmt`: every write of `Display`'s goes through
/// a `Formatter`, which cost thousands of instructions a fan-out sibling
/// (a template's non-string values, the offline provider's completion,
/// a tool step's arguments).
pub fn json_text(value: &serde_json::Value) -> String {
    // A `Value` always serializes: its map keys are strings.
    serde_json::to_string(value).unwrap_or_default()
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

/// Looks a path up in a JSON value.
pub fn lookup<'v>(
    scope: &'v serde_json::Value,
    path: &[Segment],
) -> Result<&'v serde_json::Value, String> {
    let mut current = scope;
    let mut walked = String::new();
    for segment in path {
        current = match segment {
            Segment::Key(k) => {
                if !walked.is_empty() {
                    walked.push('.');
                }
                walked.push_str(k);
                current
                    .get(k.as_str())
                    .ok_or_else(|| format!("`{walked}` is not set"))?
            }
            Segment::Index(i) => {
                walked.push_str(&format!("[{i}]"));
                let len = current.as_array().map_or(0, Vec::len);
                current
                    .get(*i)
                    .ok_or_else(|| format!("`{walked}` is out of range (length {len})"))?
            }
        };
    }
    Ok(current)
}

/// `ident ( .ident | [digits] )*`
fn parse_path(text: &str) -> Result<Vec<Segment>, String> {
    if text.is_empty() {
        return Err("empty placeholder `{{}}`".to_owned());
    }
    let bad = || {
        format!(
            "malformed placeholder `{{{{{text}}}}}`: expected a path like ctx.task or ctx.upstream[0].parsed.summary"
        )
    };
    let mut segments = Vec::new();
    let bytes = text.as_bytes();
    let mut i = 0;
    let mut expect_key = true;
    while i < bytes.len() {
        match bytes[i] {
            b'.' if !expect_key && !segments.is_empty() => {
                expect_key = true;
                i += 1;
            }
            b'[' if !expect_key => {
                let end = text[i..].find(']').ok_or_else(bad)? + i;
                let index: usize = text[i + 1..end].trim().parse().map_err(|_| bad())?;
                segments.push(Segment::Index(index));
                i = end + 1;
            }
            c if expect_key && is_ident_byte(c) => {
                let start = i;
                while i < bytes.len() && is_ident_byte(bytes[i]) {
                    i += 1;
                }
                segments.push(Segment::Key(text[start..i].to_owned()));
                expect_key = false;
            }
            _ => return Err(bad()),
        }
    }
    if expect_key {
        return Err(bad());
    }
    Ok(segments)
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
}

/// 1-based line and column (in characters) of a byte offset in `text`.
pub fn line_col(text: &str, offset: usize) -> (u64, u64) {
    let offset = offset.min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() as u64 + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) as u64 + 1;
    (line, column)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn json_text_is_what_display_writes() {
        for value in [
            json!(null),
            json!(true),
            json!(-0.0),
            json!(1.5e300),
            json!(u64::MAX),
            json!(i64::MIN),
            json!("tab\t quote\" nul\u{0} é \u{1F600}"),
            json!({"b": [1, {"z": null, "a": "x"}], "a": {}, "": []}),
        ] {
            assert_eq!(json_text(&value), value.to_string());
            let t = Template::parse("<{{ctx.v}}>").unwrap();
            let rendered = t.render(&json!({"ctx": {"v": value}})).unwrap();
            let expected = match &value {
                serde_json::Value::String(s) => format!("<{s}>"),
                other => format!("<{other}>"),
            };
            assert_eq!(rendered, expected);
        }
    }

    fn scope() -> serde_json::Value {
        json!({
            "ctx": {
                "task": "refactor auth",
                "count": 3, "flag": true, "obj": {"a": [1, 2]}, "none": null,
                "upstream": [{"parsed": {"summary": "s0"}}, {"output": {"n": 1.5}}]
            },
            "stage": {"id": "plan", "name": "Plan"}
        })
    }

    #[test]
    fn strings_raw_everything_else_json() {
        let t = Template::parse(
            "T={{ctx.task}} C={{ctx.count}} F={{ctx.flag}} O={{ctx.obj}} N={{ctx.none}} S={{stage.name}}",
        )
        .unwrap();
        assert_eq!(
            t.render(&scope()).unwrap(),
            r#"T=refactor auth C=3 F=true O={"a":[1,2]} N=null S=Plan"#
        );
    }

    #[test]
    fn numbers_render_as_display_writes_them() {
        let t = Template::parse("n={{ctx.n}}.").unwrap();
        let numbers = [
            serde_json::json!(0),
            serde_json::json!(7),
            serde_json::json!(-1),
            serde_json::json!(i64::MIN),
            serde_json::json!(u64::MAX),
            serde_json::json!(1.5),
            serde_json::json!(-0.0),
            serde_json::json!(1e300),
        ];
        for n in numbers {
            let scope = serde_json::json!({"ctx": {"n": n}});
            assert_eq!(t.render(&scope).unwrap(), format!("n={n}."));
        }
    }

    #[test]
    fn upstream_indexing() {
        let t =
            Template::parse("{{ ctx.upstream[0].parsed.summary }}/{{ctx.upstream[1].output.n}}")
                .unwrap();
        assert_eq!(t.render(&scope()).unwrap(), "s0/1.5");
        let t = Template::parse("{{ctx.upstream[2].parsed}}").unwrap();
        let err = t.render(&scope()).unwrap_err();
        assert!(err.reason.contains("out of range"), "{err}");
    }

    #[test]
    fn unclosed_placeholder_is_a_syntax_error_with_offset() {
        let err = Template::parse("ab {{ctx.task").unwrap_err();
        assert_eq!(err.offset, 3);
        assert!(Template::parse("{{ctx.a {{ctx.b}}").is_err());
    }

    #[test]
    fn malformed_paths_are_rejected() {
        for bad in [
            "{{}}",
            "{{ctx.}}",
            "{{.x}}",
            "{{ctx..a}}",
            "{{ctx[x]}}",
            "{{a b}}",
            "{{ctx.a[}}",
        ] {
            assert!(Template::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn line_col_counts_characters() {
        assert_eq!(line_col("ab\ncdé{{", 7), (2, 4));
        assert_eq!(line_col("x", 0), (1, 1));
    }

    #[test]
    fn text_without_placeholders_round_trips() {
        let t = Template::parse("plain } { text").unwrap();
        assert_eq!(t.render(&json!({})).unwrap(), "plain } { text");
        assert_eq!(t.placeholders().count(), 0);
    }
}
