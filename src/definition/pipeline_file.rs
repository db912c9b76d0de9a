//! `pipeline.yaml`: the state machine's header, stage table,
//! Next() table, asserts and gates, read into located parts that the loader
//! cross-checks once every stage file is known.

mod blocks;
mod mcp_block;
mod steps;

use super::duration::parse_positive_duration;
use super::expr::Expr;
use super::fields::{FieldReader, is_kebab};
use super::hooks::{HookDef, HookKind, TURN_STAGES, is_slot};
use super::mcp::McpServerDef;
use super::model::{
    CtxField, FORBIDDEN_CTX, Gate, GateOutcome, Next, ParallelPlan, ProviderBlock, ProviderKind,
    RESERVED_CTX, Siblings, StageKind,
};
use super::template::Template;
use super::yaml::{Node, Value};
use crate::error::{Pos, ValidationCode};
use blocks::{read_hooks, read_provider};
use mcp_block::read_mcp_servers;
use std::collections::BTreeMap;

/// Variables every expression sees.
pub const EXPR_VARS: [&str; 1] = ["ctx"];
/// Variables an `assert` expression sees.
pub const ASSERT_VARS: [&str; 4] = ["ctx", "parsed", "capHit", "attempt"];

/// Where a stage comes from.
#[derive(Debug)]
pub enum StageSource {
    /// A `*.md` file relative to the pipeline folder.
    File { rel: String, pos: Pos },
    /// An inline deterministic step.
    Inline(StageKind),
}

#[derive(Debug)]
pub struct StageEntry {
    pub id: String,
    pub key_pos: Pos,
    pub source: StageSource,
}

/// A reference to a stage id somewhere in pipeline.yaml.
#[derive(Debug)]
pub struct StageRef {
    pub id: String,
    pub pos: Pos,
    pub field: String,
}

/// A `join` with the siblings it must not be one of.
#[derive(Debug)]
pub struct JoinRef {
    pub join: String,
    pub pos: Pos,
    pub siblings: Vec<String>,
    pub field: String,
}

/// pipeline.yaml read into located parts.
#[derive(Debug, Default)]
pub struct PipelineDoc {
    pub id: Option<String>,
    pub name: Option<String>,
    pub entry: Option<String>,
    pub parallel_cap: Option<usize>,
    pub max_visits: Option<u32>,
    pub ctx: Vec<CtxField>,
    pub stages: Vec<StageEntry>,
    /// Every id under `stages:`, including ones whose definition is invalid
    /// (so a broken step is not also reported as an unknown stage).
    pub declared: Vec<String>,
    pub next: BTreeMap<String, Next>,
    pub asserts: BTreeMap<String, Vec<Expr>>,
    pub gates: BTreeMap<String, Gate>,
    pub refs: Vec<StageRef>,
    pub joins: Vec<JoinRef>,
    /// Stages named as a `map` target: only they may read ctx.item/ctx.index.
    pub map_targets: Vec<String>,
    /// Stages named in a `next` key, with the key's position.
    pub next_keys: Vec<StageRef>,
    /// `print` templates with the position of their `content` value.
    pub print_templates: Vec<(String, Pos)>,
    pub hooks: Vec<HookDef>,
    pub provider: Option<ProviderBlock>,
    pub mcp_servers: Vec<McpServerDef>,
    /// `tool` steps: (stage, tool, position), checked once the servers
    /// are known.
    pub tool_steps: Vec<(String, String, Pos)>,
}

/// The keys pipeline.yaml takes at its top level.
const ROOT_KEYS: [&str; 13] = [
    "id",
    "name",
    "entry",
    "parallelCap",
    "maxVisits",
    "ctx",
    "stages",
    "next",
    "assert",
    "gates",
    "hooks",
    "provider",
    "mcpServers",
];

/// Reads pipeline.yaml's root node. Problems go to the reader's diagnostics.
pub fn read_pipeline(root: &Node, r: &mut FieldReader<'_>) -> PipelineDoc {
    let mut doc = PipelineDoc::default();
    if root.as_map().is_none() {
        r.shape(
            root.pos,
            "",
            format!(
                "pipeline.yaml must be a mapping, found {}",
                root.value.kind()
            ),
            "start with `id:`, `entry:`, `stages:` and `next:`",
        );
        return doc;
    }
    r.known_keys(root, "", &ROOT_KEYS);
    if let Some(n) = r.required(
        root,
        "id",
        "a kebab-case pipeline id, e.g. `id: code-review`",
    ) {
        doc.id = r.string(n, "id");
        if let Some(id) = &doc.id
            && !is_kebab(id)
        {
            r.shape(
                n.pos,
                "id",
                format!("pipeline id `{id}` is not kebab-case"),
                "use lowercase letters, digits and single dashes",
            );
        }
    }
    doc.name = r.optional(root, "name").and_then(|n| r.string(n, "name"));
    if let Some(n) = r.required(root, "entry", "the first stage, e.g. `entry: plan`") {
        doc.entry = stage_ref(r, n, "entry", &mut doc);
    }
    if let Some(n) = r.optional(root, "parallelCap") {
        doc.parallel_cap = r
            .int(n, "parallelCap", 1, 1_000_000)
            .and_then(|v| usize::try_from(v).ok());
    }
    if let Some(n) = r.optional(root, "maxVisits") {
        doc.max_visits = r
            .int(n, "maxVisits", 1, 1_000_000)
            .and_then(|v| u32::try_from(v).ok());
    }
    if let Some(n) = r.optional(root, "ctx") {
        read_ctx(n, r, &mut doc);
    }
    if let Some(n) = r.required(
        root,
        "stages",
        "a mapping of stage id to a stage file or an inline step",
    ) {
        read_stages(n, r, &mut doc);
    }
    if let Some(n) = r.optional(root, "next") {
        read_next(n, r, &mut doc);
    }
    if let Some(n) = r.optional(root, "assert") {
        read_asserts(n, r, &mut doc);
    }
    if let Some(n) = r.optional(root, "gates") {
        read_gates(n, r, &mut doc);
    }
    if let Some(n) = r.optional(root, "hooks") {
        read_hooks(n, r, &mut doc);
    }
    if let Some(n) = r.optional(root, "provider") {
        doc.provider = read_provider(n, r);
    }
    if let Some(n) = r.optional(root, "mcpServers") {
        read_mcp_servers(n, r, &mut doc);
    }
    doc
}

/// Default time a hook command may take.
const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn text_or_kind(n: &Node) -> String {
    n.as_str()
        .map_or_else(|| n.value.kind().to_owned(), str::to_owned)
}

fn read_ctx(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "ctx") else {
        return;
    };
    for (key, value) in entries {
        let field = format!("ctx.{}", key.name);
        if RESERVED_CTX.contains(&key.name.as_str()) || FORBIDDEN_CTX.contains(&key.name.as_str()) {
            r.shape(
                key.pos,
                &field,
                format!("`{}` is a reserved ctx name", key.name),
                format!(
                    "reserved: {}; pick another name",
                    RESERVED_CTX
                        .iter()
                        .chain(&FORBIDDEN_CTX)
                        .copied()
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            );
            continue;
        }
        let mut f = CtxField {
            name: key.name.clone(),
            required: false,
            default: None,
            description: None,
        };
        match &value.value {
            Value::Null => {}
            Value::Map(_) => {
                r.known_keys(value, &field, &["required", "default", "description"]);
                if let Some(n) = r.optional(value, "required") {
                    f.required = r.bool(n, &format!("{field}.required")).unwrap_or(false);
                }
                f.default = value.get("default").map(Node::to_json);
                f.description = r
                    .optional(value, "description")
                    .and_then(|n| r.string(n, &format!("{field}.description")));
            }
            other => {
                r.shape(value.pos, &field, format!("`{field}` must be a mapping like `{{required: true}}` or `{{default: main}}`, found {}", other.kind()), "");
            }
        }
        doc.ctx.push(f);
    }
}

fn read_stages(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "stages") else {
        return;
    };
    if entries.is_empty() {
        r.shape(
            node.pos,
            "stages",
            "`stages` is empty",
            "declare at least the entry stage",
        );
    }
    for (key, value) in entries {
        let field = format!("stages.{}", key.name);
        if !is_kebab(&key.name) {
            r.shape(
                key.pos,
                &field,
                format!("stage id `{}` is not kebab-case", key.name),
                "use lowercase letters, digits and single dashes, e.g. `build-a`",
            );
            continue;
        }
        doc.declared.push(key.name.clone());
        let source = match &value.value {
            Value::Str(rel) => Some(StageSource::File {
                rel: rel.clone(),
                pos: value.pos,
            }),
            Value::Map(_) => read_step(&key.name, value, r, doc).map(StageSource::Inline),
            other => {
                r.shape(
                    value.pos,
                    &field,
                    format!(
                        "`{field}` must be a stage file path or an inline step, found {}",
                        other.kind()
                    ),
                    "e.g. `plan: plan.md` or `route: {kind: switch, ...}`",
                );
                None
            }
        };
        if let Some(source) = source {
            doc.stages.push(StageEntry {
                id: key.name.clone(),
                key_pos: key.pos,
                source,
            });
        }
    }
}

/// Compiles a CEL expression field, checking the variables it reads.
pub fn read_expr(r: &mut FieldReader<'_>, node: &Node, field: &str, vars: &[&str]) -> Option<Expr> {
    let code = ValidationCode::ExpressionInvalid;
    let Some(source) = node.as_str() else {
        r.report(
            code,
            node.pos,
            field,
            format!(
                "`{field}` must be a CEL expression string, found {}",
                node.value.kind()
            ),
            "quote the expression, e.g. \"ctx.upstream[0].parsed.items\"",
        );
        return None;
    };
    match Expr::compile(source) {
        Ok(expr) => {
            let unknown: Vec<String> = expr
                .variables()
                .into_iter()
                .filter(|v| !vars.contains(&v.as_str()))
                .collect();
            if unknown.is_empty() {
                Some(expr)
            } else {
                r.report(
                    code,
                    node.pos,
                    field,
                    format!(
                        "`{source}` reads unknown variable(s): {}",
                        unknown.join(", ")
                    ),
                    format!("this expression can read: {}", vars.join(", ")),
                );
                None
            }
        }
        Err(err) => {
            r.report(
                code,
                node.pos,
                field,
                format!("`{source}` is not valid CEL: {err}"),
                "CEL syntax: ctx.upstream[0].parsed.verdict == \"approve\"",
            );
            None
        }
    }
}

fn stage_ref(
    r: &mut FieldReader<'_>,
    node: &Node,
    field: &str,
    doc: &mut PipelineDoc,
) -> Option<String> {
    let id = r.string(node, field)?;
    doc.refs.push(StageRef {
        id: id.clone(),
        pos: node.pos,
        field: field.to_owned(),
    });
    Some(id)
}

fn read_step(
    id: &str,
    node: &Node,
    r: &mut FieldReader<'_>,
    doc: &mut PipelineDoc,
) -> Option<StageKind> {
    let field = format!("stages.{id}");
    let kind_node = r.required(
        node,
        "kind",
        "one of extract_json, print, if_else, switch, tool, transform, human",
    )?;
    let kind = r.string(kind_node, &format!("{field}.kind"))?;
    let f = |name: &str| format!("{field}.{name}");
    let keys: &[&str] = match kind.as_str() {
        "extract_json" => &["kind", "from"],
        "print" => &["kind", "content"],
        "if_else" => &["kind", "condition", "then", "else"],
        "switch" => &["kind", "on", "cases", "default"],
        "tool" => &["kind", "tool", "args"],
        "transform" => &["kind", "set"],
        "human" => &["kind", "prompt", "fields", "timeout", "otherwise"],
        _ => &["kind"],
    };
    r.known_keys(node, &field, keys);
    match kind.as_str() {
        "extract_json" => {
            let from = r.required(
                node,
                "from",
                "a CEL string expression, e.g. \"ctx.upstream[0].output.text\"",
            )?;
            Some(StageKind::ExtractJson {
                from: read_expr(r, from, &f("from"), &EXPR_VARS)?,
            })
        }
        "print" => {
            let content = r.required(
                node,
                "content",
                "a template, e.g. \"# Report\\n{{ctx.upstream[0].parsed.summary}}\"",
            )?;
            let text = r.string(content, &f("content"))?;
            match Template::parse(&text) {
                Ok(t) => {
                    doc.print_templates.push((id.to_owned(), content.pos));
                    Some(StageKind::Print { content: t })
                }
                Err(e) => {
                    r.report(
                        ValidationCode::TemplateSyntax,
                        content.pos,
                        &f("content"),
                        e.message,
                        "close every `{{` with `}}`",
                    );
                    None
                }
            }
        }
        "if_else" => {
            let condition = r.required(node, "condition", "a CEL boolean expression")?;
            let condition = read_expr(r, condition, &f("condition"), &EXPR_VARS);
            let then = r
                .required(node, "then", "the stage to run when the condition is true")
                .and_then(|n| stage_ref(r, n, &f("then"), doc));
            let otherwise = r
                .required(node, "else", "the stage to run when the condition is false")
                .and_then(|n| stage_ref(r, n, &f("else"), doc));
            Some(StageKind::IfElse {
                condition: condition?,
                then: then?,
                otherwise: otherwise?,
            })
        }
        "switch" => {
            let on = r.required(
                node,
                "on",
                "a CEL expression whose string form picks a case",
            )?;
            let on = read_expr(r, on, &f("on"), &EXPR_VARS);
            let cases_node = r.required(node, "cases", "a mapping of value to stage id")?;
            let mut cases = Vec::new();
            if let Some(entries) = r.map(cases_node, &f("cases")) {
                for (k, v) in entries {
                    if let Some(target) = stage_ref(r, v, &format!("{field}.cases.{}", k.name), doc)
                    {
                        cases.push((k.name.clone(), target));
                    }
                }
            }
            let default = match r.optional(node, "default") {
                Some(n) => Some(stage_ref(r, n, &f("default"), doc)?),
                None => None,
            };
            Some(StageKind::Switch {
                on: on?,
                cases,
                default,
            })
        }
        "tool" => steps::read_tool(id, node, r, doc),
        "human" => steps::read_human(node, r, &field),
        "transform" => steps::read_transform(node, r, &field),
        other => {
            r.report(ValidationCode::UnknownStepKind, kind_node.pos, &f("kind"), format!("unknown step kind `{other}`"), "inline steps are extract_json, print, if_else, switch, tool, transform, human; LLM stages are `id: file.md`");
            None
        }
    }
}

fn read_next(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "next") else {
        return;
    };
    for (key, value) in entries {
        let field = format!("next.{}", key.name);
        doc.next_keys.push(StageRef {
            id: key.name.clone(),
            pos: key.pos,
            field: field.clone(),
        });
        let next = match &value.value {
            Value::Str(s) if s == "end" => Some(Next::End),
            Value::Null => Some(Next::End),
            Value::Str(_) => stage_ref(r, value, &field, doc).map(Next::Stage),
            Value::Map(_) => read_parallel(value, &field, r, doc).map(Next::Parallel),
            other => {
                r.shape(value.pos, &field, format!("`{field}` must be a stage id, `end`, or `{{parallel: ..., join: ...}}`, found {}", other.kind()), "");
                None
            }
        };
        if let Some(next) = next {
            doc.next.insert(key.name.clone(), next);
        }
    }
}

fn read_parallel(
    node: &Node,
    field: &str,
    r: &mut FieldReader<'_>,
    doc: &mut PipelineDoc,
) -> Option<ParallelPlan> {
    let plan = ValidationCode::InvalidParallelPlan;
    let Some(p) = node.get("parallel") else {
        r.report(plan, node.pos, field, format!("`{field}` is a mapping without `parallel`"), "write `{parallel: [a, b], join: c}` or `{parallel: {map: s, over: \"<CEL list>\"}, join: c}`");
        return None;
    };
    let pfield = format!("{field}.parallel");
    r.known_keys(node, field, &["parallel", "join", "cap"]);
    let mut cap = read_cap(node, field, r);
    let siblings = match &p.value {
        Value::Seq(items) => {
            let mut ids = Vec::new();
            for (i, item) in items.iter().enumerate() {
                if let Some(id) = stage_ref(r, item, &format!("{pfield}[{i}]"), doc) {
                    if ids.contains(&id) {
                        r.report(plan, item.pos, &pfield, format!("stage `{id}` is listed twice"), "each static sibling is a different stage; use `map` to run one stage many times");
                    }
                    ids.push(id);
                }
            }
            if items.len() < 2 {
                r.report(
                    plan,
                    p.pos,
                    &pfield,
                    format!(
                        "a static parallel list needs at least two stages, found {}",
                        items.len()
                    ),
                    "use a plain `next` entry for one stage",
                );
                return None;
            }
            Siblings::Static(ids)
        }
        Value::Map(_) => {
            r.known_keys(p, &pfield, &["map", "over", "cap"]);
            if let Some(inner) = read_cap(p, &pfield, r) {
                if cap.is_some() {
                    r.report(
                        plan,
                        p.pos,
                        &format!("{pfield}.cap"),
                        "the fan-out's cap is given twice",
                        format!("keep one: `{field}.cap` or `{pfield}.cap`"),
                    );
                }
                cap = Some(inner);
            }
            let stage = r
                .required(p, "map", "the stage to run once per element")
                .and_then(|n| stage_ref(r, n, &format!("{pfield}.map"), doc));
            let over = match p.get("over") {
                Some(n) => read_expr(r, n, &format!("{pfield}.over"), &EXPR_VARS),
                None => {
                    r.report(
                        ValidationCode::ExpressionInvalid,
                        p.pos,
                        &format!("{pfield}.over"),
                        "`map` needs `over`: a CEL expression that yields a list",
                        "e.g. `over: \"ctx.upstream[0].parsed.items\"`",
                    );
                    None
                }
            };
            // A map target by intent, whatever its `over` came to (its
            // `ctx.item` is not then refused as well).
            if let Some(stage) = &stage {
                doc.map_targets.push(stage.clone());
            }
            let (Some(stage), Some(over)) = (stage.clone(), over) else {
                // The entry's join is checked all the same: one bad part
                // of an entry must not hide another until it is fixed.
                let _ = read_join(node, field, stage.into_iter().collect(), r, doc);
                return None;
            };
            Siblings::Map { stage, over }
        }
        other => {
            r.report(
                plan,
                p.pos,
                &pfield,
                format!(
                    "`parallel` must be a list of stages or `{{map: s, over: ...}}`, found {}",
                    other.kind()
                ),
                "",
            );
            return None;
        }
    };
    let join = read_join(node, field, siblings.stages().to_vec(), r, doc)?;
    Some(ParallelPlan {
        siblings,
        join,
        cap,
    })
}

/// A parallel entry's `join:`, recorded for the check that it names a
/// stage (and not one of `siblings`): `Some(None)` without one, `None`
/// when it is not a string (said).
fn read_join(
    node: &Node,
    field: &str,
    siblings: Vec<String>,
    r: &mut FieldReader<'_>,
    doc: &mut PipelineDoc,
) -> Option<Option<String>> {
    let Some(n) = node.get("join").filter(|n| n.value != Value::Null) else {
        return Some(None);
    };
    let id = r.string(n, &format!("{field}.join"))?;
    doc.joins.push(JoinRef {
        join: id.clone(),
        pos: n.pos,
        siblings,
        field: format!("{field}.join"),
    });
    Some(Some(id))
}

/// A fan-out's own `cap:` (at least 1), if given.
fn read_cap(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<usize> {
    let n = r.optional(node, "cap")?;
    r.int(n, &format!("{field}.cap"), 1, 1_000_000)
        .and_then(|v| usize::try_from(v).ok())
}

fn read_asserts(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "assert") else {
        return;
    };
    for (key, value) in entries {
        let field = format!("assert.{}", key.name);
        doc.refs.push(StageRef {
            id: key.name.clone(),
            pos: key.pos,
            field: field.clone(),
        });
        let items: Vec<&Node> = match &value.value {
            Value::Seq(items) => items.iter().collect(),
            _ => vec![value],
        };
        let exprs: Vec<Expr> = items
            .iter()
            .enumerate()
            .filter_map(|(i, n)| read_expr(r, n, &format!("{field}[{i}]"), &ASSERT_VARS))
            .collect();
        if exprs.len() == items.len() {
            doc.asserts.insert(key.name.clone(), exprs);
        }
    }
}

fn read_gates(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "gates") else {
        return;
    };
    for (key, value) in entries {
        let field = format!("gates.{}", key.name);
        doc.refs.push(StageRef {
            id: key.name.clone(),
            pos: key.pos,
            field: field.clone(),
        });
        if r.map(value, &field).is_none() {
            continue;
        }
        r.known_keys(value, &field, &["when", "otherwise"]);
        let when = r
            .required(value, "when", "a CEL boolean: proceed when true")
            .and_then(|n| read_expr(r, n, &format!("{field}.when"), &EXPR_VARS));
        let otherwise = match r.optional(value, "otherwise") {
            None => Some(GateOutcome::Defer),
            Some(n) => match n.as_str() {
                Some("defer") => Some(GateOutcome::Defer),
                Some("block") => Some(GateOutcome::Block),
                _ => {
                    r.shape(
                        n.pos,
                        &format!("{field}.otherwise"),
                        "`otherwise` must be `defer` or `block`",
                        "",
                    );
                    None
                }
            },
        };
        if let (Some(when), Some(otherwise)) = (when, otherwise) {
            doc.gates.insert(key.name.clone(), Gate { when, otherwise });
        }
    }
}
