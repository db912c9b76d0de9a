//! The steps that reach out of the pipeline: `tool` (a built-in or MCP
//! tool called with templated arguments), `transform` (CEL values) and
//! `human` (a form a person fills). The other inline steps are read in
//! `pipeline_file.rs`.

use super::{EXPR_VARS, PipelineDoc, read_expr};
use crate::definition::duration::parse_positive_duration;
use crate::definition::fields::FieldReader;
use crate::definition::model::StageKind;
use crate::definition::template::Template;
use crate::definition::yaml::Node;
use crate::error::ValidationCode;

/// `{kind: tool, tool, args}`.
pub(super) fn read_tool(
    id: &str,
    node: &Node,
    r: &mut FieldReader<'_>,
    doc: &mut PipelineDoc,
) -> Option<StageKind> {
    let field = format!("stages.{id}");
    let f = |name: &str| format!("{field}.{name}");
    let tool = r.required(
        node,
        "tool",
        "a built-in tool or `<server>__<tool>` of an MCP server",
    )?;
    let name = r.string(tool, &f("tool"))?;
    doc.tool_steps.push((id.to_owned(), name.clone(), tool.pos));
    let args = match r.optional(node, "args") {
        None => serde_json::json!({}),
        Some(a) if a.as_map().is_some() => a.to_json(),
        Some(a) => {
            r.shape(
                a.pos,
                &f("args"),
                "`args` must be a mapping",
                "e.g. `args: { path: \"{{ctx.dir}}\" }`",
            );
            return None;
        }
    };
    if let Err(e) = check_arg_templates(&args) {
        r.report(
            ValidationCode::TemplateSyntax,
            node.pos,
            &f("args"),
            e,
            "close every `{{` with `}}`",
        );
        return None;
    }
    Some(StageKind::Tool { tool: name, args })
}

/// `{kind: human, prompt, fields, timeout, otherwise}`.
pub(super) fn read_human(node: &Node, r: &mut FieldReader<'_>, field: &str) -> Option<StageKind> {
    let f = |name: &str| format!("{field}.{name}");
    let prompt = r.required(
        node,
        "prompt",
        "a template, e.g. \"Approve the plan for {{ctx.task}}?\"",
    )?;
    let text = r.string(prompt, &f("prompt"))?;
    let prompt = match Template::parse(&text) {
        Ok(t) => t,
        Err(e) => {
            r.report(
                ValidationCode::TemplateSyntax,
                prompt.pos,
                &f("prompt"),
                e.message,
                "close every `{{` with `}}`",
            );
            return None;
        }
    };
    let fields_node = r.required(node, "fields", "the JSON Schema of the answer, e.g. `{type: object, required: [ok], properties: {ok: {type: boolean}}}`")?;
    let document = fields_node.to_json();
    if document.get("type").and_then(|t| t.as_str()) != Some("object") {
        r.shape(
            fields_node.pos,
            &f("fields"),
            "`fields` must be an object schema (`type: object`)",
            "a form has named fields: `{type: object, properties: {…}}`",
        );
        return None;
    }
    let fields = match crate::definition::schema::Schema::compile(document) {
        Ok(s) => s,
        Err(e) => {
            r.shape(
                fields_node.pos,
                &f("fields"),
                format!("`fields` is not a valid JSON Schema: {e}"),
                "",
            );
            return None;
        }
    };
    let timeout = match r.optional(node, "timeout") {
        None => None,
        Some(n) => match n.as_str().map(parse_positive_duration) {
            Some(Ok(d)) => Some(d),
            _ => {
                r.shape(
                    n.pos,
                    &f("timeout"),
                    "`timeout` must be a positive duration",
                    "e.g. `timeout: 24h`",
                );
                return None;
            }
        },
    };
    let otherwise = match r.optional(node, "otherwise").and_then(|n| n.as_str()) {
        None | Some("fail") => crate::definition::model::HumanOtherwise::Fail,
        Some("skip") => crate::definition::model::HumanOtherwise::Skip,
        Some(other) => {
            r.shape(
                node.pos,
                &f("otherwise"),
                format!("`otherwise: {other}` is not fail or skip"),
                "",
            );
            return None;
        }
    };
    Some(StageKind::Human {
        prompt,
        fields,
        timeout,
        otherwise,
    })
}

/// `{kind: transform, set: {name: CEL, …}}`.
pub(super) fn read_transform(
    node: &Node,
    r: &mut FieldReader<'_>,
    field: &str,
) -> Option<StageKind> {
    let f = |name: &str| format!("{field}.{name}");
    let set = r.required(node, "set", "a mapping of name to CEL expression, e.g. `set: { files: \"ctx.upstream[0].parsed.entries\" }`")?;
    let entries = r.map(set, &f("set"))?;
    let mut out = Vec::new();
    for (k, v) in entries {
        out.push((
            k.name.clone(),
            read_expr(r, v, &format!("{field}.set.{}", k.name), &EXPR_VARS)?,
        ));
    }
    Some(StageKind::Transform { set: out })
}

/// Every string inside a tool step's `args` must parse as a template.
fn check_arg_templates(v: &serde_json::Value) -> Result<(), String> {
    match v {
        serde_json::Value::String(s) => Template::parse(s).map(|_| ()).map_err(|e| e.message),
        serde_json::Value::Array(items) => items.iter().try_for_each(check_arg_templates),
        serde_json::Value::Object(map) => map.values().try_for_each(check_arg_templates),
        _ => Ok(()),
    }
}
