//! `script.yaml`: canned model turns for the scripted provider.
//!
//! ```yaml
//! latency: 20ms                 # optional, every turn
//! stages:
//!   plan:
//!     - complete: { items: { $range: "{{ctx.width}}" } }
//!   worker:
//!     - tool: Echo
//!       args: { text: "item {{ctx.item}}" }
//!     - complete: { item: "{{ctx.item}}", summary: "done {{ctx.item}}" }
//!   "worker#17":                # sibling 17 only
//!     - fail: terminal
//!   review:
//!     turns: [ { text: "thinking" } ]
//!     repeat: true              # never completes
//! ```
//!
//! A turn is one of `text`, `tool` + `args`, `calls: [{tool, args}]`,
//! `complete: <payload>` or `fail: transient|terminal` (with `times`), plus an
//! optional `latency`. Strings may hold `{{ctx.*}}` placeholders; a string
//! that is exactly one placeholder keeps the value's type. `{$range: N}`
//! becomes the list `[0, 1, …, N-1]` (at most 10 000 000 elements in all
//! the ranges of a turn). When a stage's turns run out, the provider
//! completes with a payload synthesized from the schema.

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use super::selector::Selector;
use crate::definition::duration::parse_duration;
use crate::definition::fields::FieldReader;
use crate::definition::template::{Segment, Template, line_col};
use crate::definition::yaml::{self, Node};
use crate::definition::{Pipeline, StageKind};
use crate::error::{Diagnostic, Diagnostics, Pos, ValidationCode};

/// The file name looked up in a pipeline folder.
pub const SCRIPT_FILE: &str = "script.yaml";

/// A parsed script.
#[derive(Debug, Clone, Default)]
pub struct Script {
    pub latency: Option<Duration>,
    /// By stage name. Hashed with foldhash rather than SipHash: each
    /// model request of each execution looks its stage up twice, and the
    /// names are the pipeline author's own.
    stages: HashMap<String, StageScript, foldhash::fast::RandomState>,
    /// Whether any key names one sibling (`stage#index`): without one, a
    /// sibling's lookup skips building that key.
    indexed: bool,
}

#[derive(Debug, Clone, Default)]
pub struct StageScript {
    pub turns: Vec<Turn>,
    /// Repeat the last turn forever once the list is used up.
    pub repeat: bool,
}

#[derive(Debug, Clone)]
pub struct Turn {
    pub reply: Reply,
    pub latency: Option<Duration>,
}

#[derive(Debug, Clone)]
pub enum Reply {
    Text(Template),
    Calls(Vec<CallSpec>),
    Complete(ValueTemplate),
    Fail {
        transient: bool,
        times: u32,
        message: String,
    },
}

#[derive(Debug, Clone)]
pub struct CallSpec {
    pub tool: String,
    pub args: ValueTemplate,
}

/// A JSON value whose strings may hold placeholders.
#[derive(Debug, Clone)]
pub enum ValueTemplate {
    Literal(Value),
    Str(Template),
    Array(Vec<ValueTemplate>),
    Object(Vec<(String, ValueTemplate)>),
    Range(Box<ValueTemplate>),
}

/// Most elements the `$range`s of one rendered value may produce together.
/// Per range alone, eight ranges in a 100-byte script took 2.4 GB.
pub const MAX_RANGE_ELEMENTS: u64 = 10_000_000;

impl ValueTemplate {
    /// Renders with `resolve` answering placeholders.
    pub fn render(
        &self,
        resolve: &dyn Fn(&[Segment]) -> Result<Value, String>,
    ) -> Result<Value, String> {
        let mut range_left = MAX_RANGE_ELEMENTS;
        self.render_within(resolve, &mut range_left)
    }

    fn render_within(
        &self,
        resolve: &dyn Fn(&[Segment]) -> Result<Value, String>,
        range_left: &mut u64,
    ) -> Result<Value, String> {
        Ok(match self {
            ValueTemplate::Literal(v) => v.clone(),
            ValueTemplate::Str(t) => t.render_value(resolve).map_err(|e| e.to_string())?,
            ValueTemplate::Array(items) => Value::Array(
                items
                    .iter()
                    .map(|i| i.render_within(resolve, range_left))
                    .collect::<Result<_, _>>()?,
            ),
            ValueTemplate::Object(entries) => {
                let mut map = serde_json::Map::with_capacity(entries.len());
                for (k, v) in entries {
                    map.insert(k.clone(), v.render_within(resolve, range_left)?);
                }
                Value::Object(map)
            }
            ValueTemplate::Range(n) => {
                let count = range_count(n, resolve, range_left)?;
                Value::Array((0..count).map(Value::from).collect())
            }
        })
    }
}

/// Whether two of an object's keys are the same string.
fn repeats_a_key(entries: &[(String, ValueTemplate)]) -> bool {
    entries
        .iter()
        .enumerate()
        .any(|(i, (k, _))| entries[..i].iter().any(|(earlier, _)| earlier == k))
}

/// How many elements the `$range` of `n` makes, taken from `range_left`.
fn range_count(
    n: &ValueTemplate,
    resolve: &dyn Fn(&[Segment]) -> Result<Value, String>,
    range_left: &mut u64,
) -> Result<u64, String> {
    let n = n.render_within(resolve, range_left)?;
    let count = match &n {
        Value::Number(x) => x.as_u64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
    .ok_or_else(|| format!("$range needs a non-negative integer, got {n}"))?;
    if count > *range_left {
        return Err(format!(
            "$range of {count} is over the limit of 10 000 000 elements in one turn"
        ));
    }
    *range_left -= count;
    Ok(count)
}

impl ValueTemplate {
    /// The rendered value as compact JSON text: what `serde_json::to_string`
    /// writes of [`ValueTemplate::render`]'s value, byte for byte and with
    /// the same errors, written without building the value. A tool call's
    /// arguments are text on the wire; building their object first (an
    /// ordered map, its keys hashed and copied, then dropped) was most of
    /// the offline provider's cost, a tenth of a fan-out sibling's on its
    /// arbiter.
    pub fn render_json(
        &self,
        resolve: &dyn Fn(&[Segment]) -> Result<Value, String>,
    ) -> Result<String, String> {
        let mut out = Vec::with_capacity(64);
        let mut range_left = MAX_RANGE_ELEMENTS;
        self.write_json(resolve, &mut out, &mut range_left)?;
        // Only whole strings and ASCII punctuation were written.
        String::from_utf8(out).map_err(|e| e.to_string())
    }

    fn write_json(
        &self,
        resolve: &dyn Fn(&[Segment]) -> Result<Value, String>,
        out: &mut Vec<u8>,
        range_left: &mut u64,
    ) -> Result<(), String> {
        use crate::auditlog::json::{write_json_str, write_u64};
        // Writing into a Vec cannot fail, and a `Value` always serializes.
        let value = |out: &mut Vec<u8>, v: &Value| {
            let _ = serde_json::to_writer(out, v);
        };
        match self {
            ValueTemplate::Literal(v) => value(out, v),
            // A lone placeholder keeps its value's type; text is a string.
            ValueTemplate::Str(t) => match t.render_value(resolve).map_err(|e| e.to_string())? {
                Value::String(s) => write_json_str(out, &s),
                v => value(out, &v),
            },
            ValueTemplate::Array(items) => {
                out.push(b'[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    item.write_json(resolve, out, range_left)?;
                }
                out.push(b']');
            }
            ValueTemplate::Object(entries) if repeats_a_key(entries) => {
                // Keys the YAML reader told apart can read the same once
                // made strings (`1` and `"1"`): the object keeps the first
                // place and the last value, so it is built as `render` does.
                value(out, &self.render_within(resolve, range_left)?);
            }
            ValueTemplate::Object(entries) => {
                out.push(b'{');
                for (i, (k, v)) in entries.iter().enumerate() {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_json_str(out, k);
                    out.push(b':');
                    v.write_json(resolve, out, range_left)?;
                }
                out.push(b'}');
            }
            ValueTemplate::Range(n) => {
                let count = range_count(n, resolve, range_left)?;
                out.push(b'[');
                for i in 0..count {
                    if i > 0 {
                        out.push(b',');
                    }
                    write_u64(out, i);
                }
                out.push(b']');
            }
        }
        Ok(())
    }
}

impl Script {
    /// The turns for an execution: `stage#index` first, then `stage`.
    pub fn for_execution(&self, stage: &str, index: Option<usize>) -> Option<&StageScript> {
        index
            .filter(|_| self.indexed)
            .and_then(|i| self.stages.get(&format!("{stage}#{i}")))
            .or_else(|| self.stages.get(stage))
    }

    /// Loads `file`, checking its stage keys against the pipeline.
    pub fn load(file: &Path, pipeline: &Pipeline) -> Result<Script, Diagnostics> {
        let one = |message: String| {
            Diagnostics(vec![
                Diagnostic::new(ValidationCode::ScriptInvalid, message).file(file),
            ])
        };
        let text =
            std::fs::read_to_string(file).map_err(|e| one(format!("cannot read script: {e}")))?;
        Script::parse_str(file, &text, pipeline)
    }

    /// Parses script text (`file` names it in diagnostics), checking its
    /// stage keys against the pipeline.
    pub fn parse_str(file: &Path, text: &str, pipeline: &Pipeline) -> Result<Script, Diagnostics> {
        if text.len() > 16 * 1024 * 1024 {
            return Err(Diagnostics(vec![
                Diagnostic::new(ValidationCode::ScriptInvalid, "script is over 16 MiB").file(file),
            ]));
        }
        let root = yaml::parse(text).map_err(|e| {
            Diagnostics(vec![
                Diagnostic::new(
                    ValidationCode::ScriptInvalid,
                    format!("not valid YAML: {}", e.message),
                )
                .file(file)
                .at(e.pos),
            ])
        })?;
        let mut diags = Vec::new();
        let script = {
            let mut r = FieldReader::new(file, 0, ValidationCode::ScriptInvalid, &mut diags);
            read_script(&root, &mut r, pipeline)
        };
        if diags.is_empty() {
            Ok(script)
        } else {
            Err(Diagnostics(diags))
        }
    }
}

fn read_script(root: &Node, r: &mut FieldReader<'_>, pipeline: &Pipeline) -> Script {
    let mut script = Script::default();
    if root.as_map().is_none() {
        if root.value != yaml::Value::Null {
            r.shape(
                root.pos,
                "",
                "a script must be a mapping with `stages:`",
                "",
            );
        }
        return script;
    }
    script.latency = r
        .optional(root, "latency")
        .and_then(|n| duration(r, n, "latency"));
    let Some(stages) = r.optional(root, "stages") else {
        return script;
    };
    let Some(entries) = r.map(stages, "stages") else {
        return script;
    };
    for (key, value) in entries {
        let is_llm = Selector::parse(&key.name).is_ok_and(|sel| {
            pipeline
                .stage(&sel.stage)
                .is_some_and(|s| matches!(s.kind, StageKind::Llm(_)))
        });
        if !is_llm {
            r.shape(
                key.pos,
                &format!("stages.{}", key.name),
                format!(
                    "`{}` is not an LLM stage of pipeline `{}`",
                    key.name, pipeline.id
                ),
                "keys are LLM stage ids, or `id#N` for sibling N of a fan-out",
            );
            continue;
        }
        let field = format!("stages.{}", key.name);
        let (list, repeat) = match value.as_map() {
            Some(_) => {
                let repeat = r
                    .optional(value, "repeat")
                    .and_then(|n| r.bool(n, &format!("{field}.repeat")))
                    .unwrap_or(false);
                (r.required(value, "turns", "a list of turns"), repeat)
            }
            None => (Some(value), false),
        };
        let Some(list) = list else { continue };
        let Some(items) = list.as_seq() else {
            r.shape(list.pos, &field, "a stage's script is a list of turns", "");
            continue;
        };
        let turns: Vec<Turn> = items
            .iter()
            .enumerate()
            .filter_map(|(i, t)| read_turn(t, &format!("{field}[{i}]"), r))
            .collect();
        if turns.len() == items.len() {
            script.indexed |= key.name.contains('#');
            script
                .stages
                .insert(key.name.clone(), StageScript { turns, repeat });
        }
    }
    script
}

fn duration(r: &mut FieldReader<'_>, n: &Node, field: &str) -> Option<Duration> {
    let text = r.string(n, field)?;
    parse_duration(&text)
        .map_err(|e| r.shape(n.pos, field, e, ""))
        .ok()
}

fn read_turn(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<Turn> {
    if node.as_map().is_none() {
        r.shape(
            node.pos,
            field,
            "a turn is a mapping: text, tool + args, calls, complete or fail",
            "",
        );
        return None;
    }
    let latency = match r.optional(node, "latency") {
        Some(n) => Some(duration(r, n, &format!("{field}.latency"))?),
        None => None,
    };
    let kinds: Vec<&str> = ["text", "tool", "calls", "complete", "fail"]
        .into_iter()
        .filter(|k| node.get(k).is_some())
        .collect();
    if kinds.len() != 1 {
        r.shape(
            node.pos,
            field,
            format!(
                "a turn needs exactly one of text, tool, calls, complete, fail (found {})",
                kinds.len()
            ),
            "",
        );
        return None;
    }
    let reply = match kinds[0] {
        "text" => {
            let n = node.get("text")?;
            let s = r.string(n, &format!("{field}.text"))?;
            Reply::Text(template(r, n.pos, &s, field)?)
        }
        "tool" => {
            let n = node.get("tool")?;
            let tool = r.string(n, &format!("{field}.tool"))?;
            let args = node.get("args").map_or(
                Some(ValueTemplate::Literal(Value::Object(Default::default()))),
                |a| value_template(a, field, r),
            )?;
            Reply::Calls(vec![CallSpec { tool, args }])
        }
        "calls" => {
            let n = node.get("calls")?;
            let Some(items) = n.as_seq() else {
                r.shape(
                    n.pos,
                    &format!("{field}.calls"),
                    "`calls` is a list of {tool, args}",
                    "",
                );
                return None;
            };
            let mut calls = Vec::new();
            for item in items {
                let tool = r
                    .required(item, "tool", "a tool name")
                    .and_then(|t| r.string(t, &format!("{field}.calls.tool")))?;
                let args = item.get("args").map_or(
                    Some(ValueTemplate::Literal(Value::Object(Default::default()))),
                    |a| value_template(a, field, r),
                )?;
                calls.push(CallSpec { tool, args });
            }
            Reply::Calls(calls)
        }
        "complete" => Reply::Complete(value_template(node.get("complete")?, field, r)?),
        _ => {
            let n = node.get("fail")?;
            let transient = match n.as_str() {
                Some("transient") => true,
                Some("terminal") => false,
                _ => {
                    r.shape(
                        n.pos,
                        &format!("{field}.fail"),
                        "`fail` is `transient` or `terminal`",
                        "",
                    );
                    return None;
                }
            };
            let times = match r.optional(node, "times") {
                Some(t) => u32::try_from(r.int(t, &format!("{field}.times"), 1, 1000)?).ok()?,
                None => 1,
            };
            let message = r
                .optional(node, "message")
                .and_then(|m| r.string(m, &format!("{field}.message")))
                .unwrap_or_else(|| "injected failure".to_owned());
            Reply::Fail {
                transient,
                times,
                message,
            }
        }
    };
    Some(Turn { reply, latency })
}

fn template(r: &mut FieldReader<'_>, pos: Pos, text: &str, field: &str) -> Option<Template> {
    match Template::parse(text) {
        Ok(t) => Some(t),
        Err(e) => {
            let (_, col) = line_col(text, e.offset);
            r.report(
                ValidationCode::ScriptInvalid,
                Pos::new(pos.line, pos.column + col - 1),
                field,
                e.message,
                "",
            );
            None
        }
    }
}

fn value_template(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<ValueTemplate> {
    use crate::definition::yaml::Value as Y;
    Some(match &node.value {
        Y::Str(s) if s.contains("{{") => ValueTemplate::Str(template(r, node.pos, s, field)?),
        Y::Seq(items) => ValueTemplate::Array(
            items
                .iter()
                .map(|i| value_template(i, field, r))
                .collect::<Option<_>>()?,
        ),
        Y::Map(entries) if entries.len() == 1 && entries[0].0.name == "$range" => {
            ValueTemplate::Range(Box::new(value_template(&entries[0].1, field, r)?))
        }
        Y::Map(entries) => ValueTemplate::Object(
            entries
                .iter()
                .map(|(k, v)| value_template(v, field, r).map(|t| (k.name.clone(), t)))
                .collect::<Option<_>>()?,
        ),
        _ => ValueTemplate::Literal(node.to_json()),
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::ValueTemplate;
    use crate::definition::template::{Segment, Template, json_text, lookup};

    fn scope() -> Value {
        json!({"ctx": {
            "item": 7, "neg": -3, "big": u64::MAX, "f": 1.5, "n": " 3 ",
            "name": "a\"b\\c\n\u{1}é", "obj": {"k": [1, "x", null, true]},
        }})
    }

    fn resolve(path: &[Segment]) -> Result<Value, String> {
        lookup(&scope(), path).cloned()
    }

    fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            Just("{{ctx.item}}"),
            Just("{{ctx.neg}}"),
            Just("{{ctx.big}}"),
            Just("{{ctx.f}}"),
            Just("{{ctx.name}}"),
            Just("{{ctx.obj}}"),
            Just("{{ctx.missing}}"),
            Just("plain"),
            Just(" \"q\" \\ "),
            Just("\t\u{7f}ü"),
        ];
        prop::collection::vec(piece, 1..4).prop_map(|p| p.concat())
    }

    fn template() -> impl Strategy<Value = ValueTemplate> {
        let leaf = prop_oneof![
            text().prop_map(|t| ValueTemplate::Str(Template::parse(&t).unwrap())),
            any::<i64>().prop_map(|n| ValueTemplate::Literal(json!(n))),
            "[a-z\"\\\\\n]{0,6}".prop_map(|s| ValueTemplate::Literal(json!(s))),
            Just(ValueTemplate::Literal(
                json!({"a": [1.25, null], "b\n": "c"})
            )),
            prop_oneof![
                Just("{{ctx.item}}"),
                Just("{{ctx.n}}"),
                Just("{{ctx.neg}}"),
                Just("{{ctx.name}}")
            ]
            .prop_map(|t| ValueTemplate::Range(Box::new(ValueTemplate::Str(
                Template::parse(t).unwrap()
            )))),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(ValueTemplate::Array),
                // Keys from a small alphabet, so that some repeat.
                prop::collection::vec(("[ab\"é]{1,2}", inner), 0..4)
                    .prop_map(ValueTemplate::Object),
            ]
        })
    }

    proptest! {
        /// Written straight to text, a template reads as the value it
        /// renders, serialized: the same bytes, or the same error.
        #[test]
        fn render_json_writes_what_render_serializes(t in template()) {
            let direct = t.render_json(&resolve);
            let through_value = t.render(&resolve).map(|v| json_text(&v));
            prop_assert_eq!(direct, through_value);
        }
    }

    #[test]
    fn ranges_share_one_budget_in_both_renderings() {
        let t = ValueTemplate::Array(vec![
            ValueTemplate::Range(Box::new(ValueTemplate::Literal(json!(3)))),
            ValueTemplate::Range(Box::new(ValueTemplate::Literal(json!(9_999_998)))),
        ]);
        let err = t.render_json(&resolve).unwrap_err();
        assert!(err.contains("over the limit"), "{err}");
        assert_eq!(Err(err), t.render(&resolve).map(|v| json_text(&v)));
    }
}
