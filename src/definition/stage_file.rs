//! One stage definition file (`*.md`): YAML frontmatter between `---` lines,
//! then the system-prompt template body.

use std::path::Path;

use super::duration::parse_duration;
use super::fields::{FieldReader, is_kebab, is_tool_name};
use super::model::{Backoff, ResolutionPolicy, RetryPolicy, StageDefinition};
use super::schema::Schema;
use super::template::{Template, line_col};
use super::tool_catalog::BUILTIN_NAMES;
use super::yaml::{self, Node, Value};
use crate::error::{Diagnostic, Pos, ValidationCode};

/// Largest `turnCap` / `maxAttempts` accepted: far above any sane budget,
/// low enough that a typo like `turnCap: 10000000000` is caught.
const MAX_COUNT: i64 = 100_000;

/// A parsed stage file and where its `id` is written.
#[derive(Debug)]
pub struct ParsedStage {
    pub definition: StageDefinition,
    pub id_pos: Pos,
}

/// Strips a UTF-8 BOM and turns CRLF / lone CR line ends into LF, so files
/// saved on Windows load the same as on Unix.
pub fn normalize_text(text: &str) -> String {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    text.replace("\r\n", "\n").replace('\r', "\n")
}

/// Splits `---` frontmatter from the body. Returns (yaml, body, body_line).
fn split_frontmatter(text: &str) -> Result<(&str, &str, u64), (Pos, String, &'static str)> {
    let first_end = text.find('\n').unwrap_or(text.len());
    if text[..first_end].trim_end() != "---" {
        return Err((
            Pos::new(1, 1),
            "missing frontmatter: a stage file must start with a `---` line".to_owned(),
            "put the eight required fields between two `---` lines at the top of the file",
        ));
    }
    let yaml_start = (first_end + 1).min(text.len());
    let mut offset = yaml_start;
    for (line_no, line) in (2u64..).zip(text[yaml_start..].split_inclusive('\n')) {
        let trimmed = line.trim_end();
        if trimmed == "---" || trimmed == "..." {
            let yaml = &text[yaml_start..offset];
            let body = &text[offset + line.len()..];
            return Ok((yaml, body, line_no + 1));
        }
        offset += line.len();
    }
    Err((
        Pos::new(1, 1),
        "unterminated frontmatter: no closing `---` line".to_owned(),
        "end the frontmatter with a line containing only `---`",
    ))
}

/// Parses one stage file. Every problem becomes a diagnostic; `None` when
/// any was found.
pub fn parse_stage_file(
    file: &Path,
    raw_text: &str,
    is_tool: &dyn Fn(&str) -> bool,
    diags: &mut Vec<Diagnostic>,
) -> Option<ParsedStage> {
    let text = normalize_text(raw_text);
    let before = diags.len();
    let invalid = ValidationCode::StageDefinitionInvalid;
    let (yaml_text, body, body_line) = match split_frontmatter(&text) {
        Ok(parts) => parts,
        Err((pos, message, hint)) => {
            diags.push(
                Diagnostic::new(invalid, message)
                    .file(file)
                    .at(pos)
                    .field("frontmatter")
                    .hint(hint),
            );
            return None;
        }
    };
    let root = match yaml::parse(yaml_text) {
        Ok(node) => node,
        Err(err) => {
            diags.push(
                Diagnostic::new(
                    invalid,
                    format!("frontmatter is not valid YAML: {}", err.message),
                )
                .file(file)
                .at(err.pos.offset_lines(1))
                .field("frontmatter")
                .hint("indent with spaces, not tabs; quote strings containing `: ` or `#`"),
            );
            return None;
        }
    };
    let mut r = FieldReader::new(file, 1, invalid, diags);
    if root.as_map().is_none() {
        r.shape(
            root.pos,
            "frontmatter",
            format!(
                "frontmatter must be a mapping of fields, found {}",
                root.value.kind()
            ),
            "write `key: value` lines between the `---` lines",
        );
        return None;
    }

    let id_node = r.required(
        &root,
        "id",
        "a kebab-case id, unique in the pipeline, e.g. `id: plan`",
    );
    let id = id_node.and_then(|n| r.string(n, "id"));
    if let (Some(id), Some(node)) = (&id, id_node)
        && !is_kebab(id)
    {
        r.shape(
            node.pos,
            "id",
            format!("id `{id}` is not kebab-case"),
            "use lowercase letters, digits and single dashes, e.g. `build-a`",
        );
    }
    let name = r
        .required(&root, "name", "a human-readable label, e.g. `name: Plan`")
        .and_then(|n| r.string(n, "name"));

    let allowed_tools = r
        .required_list(&root, "allowedTools")
        .map(|tools| check_tools(&mut r, tools, is_tool));

    let completion_tool = r
        .required(
            &root,
            "completionTool",
            "the tool the model calls to finish, e.g. `completionTool: submit_plan`",
        )
        .and_then(|n| r.string(n, "completionTool").map(|s| (s, n.pos)));
    if let Some((tool, pos)) = &completion_tool {
        if !is_tool_name(tool) {
            r.shape(
                *pos,
                "completionTool",
                format!("`{tool}` is not a valid tool name"),
                "use letters, digits, `_` or `-` (at most 64)",
            );
        } else if is_tool(tool) {
            r.report(
                ValidationCode::CompletionToolCollision,
                *pos,
                "completionTool",
                format!("completion tool `{tool}` has the name of a registered tool"),
                "the completion channel is stage-local; pick a name no tool has, e.g. `submit_result`",
            );
        }
    }

    let completion_schema = r
        .required(
            &root,
            "completionSchema",
            "a JSON Schema for the completion payload, e.g. `{type: object, required: [summary]}`",
        )
        .and_then(|n| {
            compile_schema(
                &mut r,
                n,
                "completionSchema",
                ValidationCode::StageCompletionSchemaInvalid,
                true,
            )
        });
    let inputs_schema = match r.optional(&root, "inputsSchema") {
        Some(n) => compile_schema(
            &mut r,
            n,
            "inputsSchema",
            ValidationCode::StageInputsSchemaInvalid,
            false,
        )
        .map(Some),
        None => Some(None),
    };

    let retry_policy = r
        .required(
            &root,
            "retryPolicy",
            "e.g. `retryPolicy: {maxAttempts: 2, backoff: none}`",
        )
        .and_then(|n| parse_retry_policy(&mut r, n));
    let turn_cap = r
        .required(&root, "turnCap", "a positive integer, e.g. `turnCap: 20`")
        .and_then(|n| r.int(n, "turnCap", 1, MAX_COUNT));
    let resolution_policy = r
        .required(&root, "resolutionPolicy", "one of retry-later, fail, skip")
        .and_then(|n| parse_resolution(&mut r, n));

    let description = r
        .optional(&root, "description")
        .and_then(|n| r.string(n, "description"));
    let tags = match r.optional(&root, "tags") {
        Some(n) => r
            .string_list(n, "tags")
            .map(|t| t.into_iter().map(|(s, _)| s).collect()),
        None => Some(Vec::new()),
    };

    let network_deny = match r.optional(&root, "network") {
        None => Some(false),
        Some(n) => match n.as_str() {
            Some("deny") => Some(true),
            Some("allow") => Some(false),
            _ => {
                r.shape(
                    n.pos,
                    "network",
                    "`network` is `allow` or `deny`",
                    "`network: deny` blocks TCP for this stage's shells (Landlock ABI 4)",
                );
                None
            }
        },
    };

    let body_template = match Template::parse(body) {
        Ok(t) => Some(t),
        Err(err) => {
            let (line, column) = line_col(body, err.offset);
            let pos = Pos::new(line + body_line - 1, column);
            r.report_abs(
                ValidationCode::TemplateSyntax,
                pos,
                "body",
                err.message,
                "close every `{{` with `}}`",
            );
            None
        }
    };

    if diags.len() > before {
        return None;
    }
    let (Some(id), Some(id_node)) = (id, id_node) else {
        return None;
    };
    Some(ParsedStage {
        id_pos: id_node.pos.offset_lines(1),
        definition: StageDefinition {
            id,
            name: name?,
            description,
            allowed_tools: allowed_tools?,
            completion_tool: completion_tool?.0.into(),
            completion_schema: completion_schema?,
            inputs_schema: inputs_schema?,
            retry_policy: retry_policy?,
            turn_cap: u32::try_from(turn_cap?).ok()?,
            resolution_policy: resolution_policy?,
            tags: tags?,
            network_deny: network_deny?,
            body: body_template?,
            file: file.to_owned(),
            body_line,
        },
    })
}

impl FieldReader<'_> {
    /// A required list of strings (`allowedTools: []` is fine).
    fn required_list(&mut self, map: &Node, key: &str) -> Option<Vec<(String, Pos)>> {
        let node = self.required(
            map,
            key,
            "a list of tool names, e.g. `allowedTools: [Read, Grep]` (may be empty: `[]`)",
        )?;
        self.string_list(node, key)
    }
}

fn check_tools(
    r: &mut FieldReader<'_>,
    tools: Vec<(String, Pos)>,
    is_tool: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(tools.len());
    for (tool, pos) in tools {
        if !is_tool(&tool) {
            let names = BUILTIN_NAMES;
            let hint = match names.iter().find(|n| n.eq_ignore_ascii_case(&tool)) {
                Some(name) => format!("did you mean `{name}`? tool names are case-sensitive"),
                None => format!("built-in tools: {}", names.join(", ")),
            };
            r.report(
                ValidationCode::UnknownTool,
                pos,
                "allowedTools",
                format!("unknown tool `{tool}`"),
                hint,
            );
        } else if !out.contains(&tool) {
            out.push(tool);
        }
    }
    out
}

fn compile_schema(
    r: &mut FieldReader<'_>,
    node: &Node,
    field: &str,
    code: ValidationCode,
    tool_args: bool,
) -> Option<Schema> {
    if !matches!(node.value, Value::Map(_) | Value::Bool(_)) {
        r.report(
            code,
            node.pos,
            field,
            format!(
                "`{field}` must be a JSON Schema mapping, found {}",
                node.value.kind()
            ),
            "e.g. `{type: object, properties: {summary: {type: string}}}`",
        );
        return None;
    }
    let mut document = node.to_json();
    // Sent as a tool's parameters, which OpenAI refuses without `type:
    // object` at the top; a payload is an object anyway, so a schema that
    // leaves the type out means the same with it.
    if tool_args
        && let serde_json::Value::Object(map) = &mut document
        && !map.contains_key("type")
    {
        map.insert("type".to_owned(), "object".into());
    }
    if tool_args
        && let Some(kind) = document.get("type")
        && kind != "object"
    {
        r.report(
            code,
            node.pos,
            field,
            format!("`{field}` must describe an object (found type {kind})"),
            "a completion payload is a tool call's arguments, which are always a JSON object",
        );
        return None;
    }
    match Schema::compile(document) {
        Ok(schema) => Some(schema),
        Err(err) => {
            r.report(
                code,
                node.pos,
                field,
                format!("`{field}` is not a valid JSON Schema: {err}"),
                "check keyword spellings and value types against draft 2020-12",
            );
            None
        }
    }
}

fn parse_retry_policy(r: &mut FieldReader<'_>, node: &Node) -> Option<RetryPolicy> {
    r.map(node, "retryPolicy")?;
    let max_attempts = r
        .required(node, "maxAttempts", "e.g. `maxAttempts: 2`")
        .and_then(|n| r.int(n, "retryPolicy.maxAttempts", 1, MAX_COUNT));
    let backoff = r
        .required(
            node,
            "backoff",
            "`none`, `{fixed: 2s}` or `{exponential: {initial: 500ms, max: 10s}}`",
        )
        .and_then(|n| parse_backoff(r, n));
    Some(RetryPolicy {
        max_attempts: u32::try_from(max_attempts?).ok()?,
        backoff: backoff?,
    })
}

/// `none` | `{fixed: <duration>}` | `{exponential: {initial, max}}`.
pub fn parse_backoff(r: &mut FieldReader<'_>, node: &Node) -> Option<Backoff> {
    let hint = "`none`, `{fixed: 2s}` or `{exponential: {initial: 500ms, max: 10s}}`";
    let duration =
        |r: &mut FieldReader<'_>, n: &Node, field: &str| -> Option<std::time::Duration> {
            let text = r.string(n, field)?;
            parse_duration(&text)
                .map_err(|e| r.shape(n.pos, field, e, ""))
                .ok()
        };
    match &node.value {
        Value::Str(s) if s == "none" => Some(Backoff::None),
        Value::Map(entries) if entries.len() == 1 => {
            let (key, value) = &entries[0];
            match key.name.as_str() {
                "fixed" => duration(r, value, "backoff.fixed").map(Backoff::Fixed),
                "exponential" => {
                    r.map(value, "backoff.exponential")?;
                    let initial = r
                        .required(value, "initial", "e.g. `initial: 500ms`")
                        .and_then(|n| duration(r, n, "backoff.exponential.initial"));
                    let max = r
                        .required(value, "max", "e.g. `max: 10s`")
                        .and_then(|n| duration(r, n, "backoff.exponential.max"));
                    let (initial, max) = (initial?, max?);
                    if max < initial {
                        r.shape(
                            value.pos,
                            "backoff.exponential.max",
                            "`max` is below `initial`",
                            "",
                        );
                        return None;
                    }
                    Some(Backoff::Exponential { initial, max })
                }
                other => {
                    r.shape(
                        key.pos,
                        "backoff",
                        format!("unknown backoff `{other}`"),
                        hint,
                    );
                    None
                }
            }
        }
        _ => {
            r.shape(node.pos, "backoff", "invalid backoff", hint);
            None
        }
    }
}

fn parse_resolution(r: &mut FieldReader<'_>, node: &Node) -> Option<ResolutionPolicy> {
    match node.as_str() {
        Some("retry-later") => Some(ResolutionPolicy::RetryLater),
        Some("fail") => Some(ResolutionPolicy::Fail),
        Some("skip") => Some(ResolutionPolicy::Skip),
        _ => {
            r.shape(
                node.pos,
                "resolutionPolicy",
                "`resolutionPolicy` must be one of retry-later, fail, skip",
                "",
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "---\nid: plan\nname: Plan\nallowedTools: [Read, Grep]\ncompletionTool: submit_plan\ncompletionSchema:\n  type: object\n  required: [summary]\n  properties:\n    summary: { type: string }\nretryPolicy:\n  maxAttempts: 2\n  backoff: none\nturnCap: 20\nresolutionPolicy: retry-later\nfavouriteColour: blue\n---\nTask: {{ctx.task}}\n";

    fn parse(text: &str) -> (Option<ParsedStage>, Vec<Diagnostic>) {
        let mut diags = Vec::new();
        let tool = |n: &str| crate::definition::is_builtin(n);
        let parsed = parse_stage_file(Path::new("plan.md"), text, &tool, &mut diags);
        (parsed, diags)
    }

    #[test]
    fn parses_a_good_file_and_ignores_unknown_keys() {
        let (parsed, diags) = parse(GOOD);
        assert!(diags.is_empty(), "{diags:?}");
        let d = parsed.unwrap().definition;
        assert_eq!(d.id, "plan");
        assert_eq!(d.allowed_tools, vec!["Read", "Grep"]);
        assert_eq!(d.turn_cap, 20);
        assert_eq!(d.body_line, 18);
        assert_eq!(d.body.placeholders().count(), 1);
    }

    #[test]
    fn crlf_and_bom_load_like_lf() {
        let windows = format!("\u{feff}{}", GOOD.replace('\n', "\r\n"));
        let (parsed, diags) = parse(&windows);
        assert!(diags.is_empty(), "{diags:?}");
        assert_eq!(
            parsed.unwrap().definition.body.source(),
            "Task: {{ctx.task}}\n"
        );
    }

    #[test]
    fn frontmatter_problems() {
        let (_, d) = parse("no frontmatter here\n");
        assert_eq!(d[0].field.as_deref(), Some("frontmatter"));
        let (_, d) = parse("---\nid: plan\n");
        assert!(d[0].message.contains("unterminated"));
        let (_, d) = parse("---\nid: plan\n\tname: x\n---\n");
        // The scanner reports where the scalar broken by the tab began.
        assert!(d[0].message.contains("tab"), "{d:?}");
        assert_eq!(d[0].line, Some(2), "{d:?}");
        let (_, d) = parse("---\n- a\n- b\n---\n");
        assert!(d[0].message.contains("mapping"));
    }

    #[test]
    fn unclosed_placeholder_points_into_the_body() {
        let text = GOOD.replace("Task: {{ctx.task}}", "line one\nTask: {{ctx.task");
        let (_, d) = parse(&text);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].code, ValidationCode::TemplateSyntax);
        assert_eq!((d[0].line, d[0].column), (Some(19), Some(7)));
    }
}
