//! `pipeline.yaml`: the state machine's header, stage table,
//! Next() table, asserts and gates, read into located parts that the loader
//! cross-checks once every stage file is known.

use super::duration::parse_positive_duration;
use super::expr::Expr;
use super::fields::{FieldReader, is_kebab};
use super::hooks::{HookDef, HookKind, TURN_STAGES, is_slot};
use super::model::{
    CtxField, FORBIDDEN_CTX, Gate, GateOutcome, Next, ParallelPlan, ProviderBlock, ProviderKind,
    RESERVED_CTX, Siblings, StageKind,
};
use super::template::Template;
use super::yaml::{Node, Value};
use crate::error::{Pos, ValidationCode};
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
}

/// The keys pipeline.yaml takes at its top level.
const ROOT_KEYS: [&str; 12] = [
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
    doc
}

/// Default time a hook command may take.
const HOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

fn text_or_kind(n: &Node) -> String {
    n.as_str()
        .map_or_else(|| n.value.kind().to_owned(), str::to_owned)
}

fn read_hooks(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let code = ValidationCode::HookInvalid;
    // Missing fields and wrong types inside `hooks` carry the hook code.
    let shape_code = std::mem::replace(&mut r.code, code);
    read_hook_list(node, r, doc, code);
    r.code = shape_code;
}

fn read_hook_list(
    node: &Node,
    r: &mut FieldReader<'_>,
    doc: &mut PipelineDoc,
    code: ValidationCode,
) {
    let Some(items) = node.as_seq() else {
        r.report(
            code,
            node.pos,
            "hooks",
            format!("`hooks` must be a list, found {}", node.value.kind()),
            "e.g. `hooks: [{ at: TOOL_CALL/pre, kind: guard, command: ./no-rm.sh }]`",
        );
        return;
    };
    for (i, item) in items.iter().enumerate() {
        let field = format!("hooks[{i}]");
        if item.as_map().is_none() {
            r.report(
                code,
                item.pos,
                &field,
                format!("`{field}` must be a mapping, found {}", item.value.kind()),
                "give `at`, `kind` and `command`",
            );
            continue;
        }
        let before = r.diags.len();
        r.known_keys(
            item,
            &field,
            &["name", "at", "kind", "command", "timeout", "tools"],
        );
        let at = match r.required_at(
            item,
            "at",
            &format!("{field}.at"),
            "a slot such as TOOL_CALL/pre",
        ) {
            Some(n) => match n.as_str() {
                Some(s) if is_slot(s) => Some(s.to_owned()),
                _ => {
                    r.report(
                        code,
                        n.pos,
                        &format!("{field}.at"),
                        format!("`{}` is not a hook slot", text_or_kind(n)),
                        format!(
                            "use <stage>/pre or <stage>/post with <stage> one of {}",
                            TURN_STAGES.join(", ")
                        ),
                    );
                    None
                }
            },
            None => None,
        };
        let kind = match r.required_at(
            item,
            "kind",
            &format!("{field}.kind"),
            "guard, transform or observer",
        ) {
            Some(n) => match n.as_str().and_then(HookKind::parse) {
                Some(k) => Some(k),
                None => {
                    r.report(
                        code,
                        n.pos,
                        &format!("{field}.kind"),
                        format!("`{}` is not a hook kind", text_or_kind(n)),
                        "use guard, transform or observer",
                    );
                    None
                }
            },
            None => None,
        };
        let command = match r.required(
            item,
            "command",
            "a shell command run in the pipeline folder",
        ) {
            Some(n) => match n.as_str() {
                Some(s) if !s.trim().is_empty() => Some(s.to_owned()),
                _ => {
                    r.report(
                        code,
                        n.pos,
                        &format!("{field}.command"),
                        "`command` must be a non-empty string",
                        "e.g. `command: ./hooks/no-rm.sh`",
                    );
                    None
                }
            },
            None => None,
        };
        let timeout = match r.optional(item, "timeout") {
            None => Some(HOOK_TIMEOUT),
            Some(n) => match n.as_str().map(super::duration::parse_positive_duration) {
                Some(Ok(d)) => Some(d),
                _ => {
                    r.report(
                        code,
                        n.pos,
                        &format!("{field}.timeout"),
                        "`timeout` must be a positive duration",
                        "e.g. `timeout: 5s` or `timeout: 500ms`",
                    );
                    None
                }
            },
        };
        let tools = match r.optional(item, "tools") {
            None => Some(Vec::new()),
            Some(n) => r
                .string_list(n, &format!("{field}.tools"))
                .map(|l| l.into_iter().map(|(t, _)| t).collect()),
        };
        let name = r
            .optional(item, "name")
            .and_then(|n| r.string(n, &format!("{field}.name")));
        if r.diags.len() != before {
            continue;
        }
        if let (Some(at), Some(kind), Some(command), Some(timeout), Some(tools)) =
            (at, kind, command, timeout, tools)
        {
            doc.hooks.push(HookDef {
                name: name.unwrap_or_else(|| format!("{at}#{i}")),
                at,
                kind,
                command,
                timeout,
                tools,
            });
        }
    }
}

/// Keys of the `provider:` block.
const PROVIDER_KEYS: [&str; 10] = [
    "kind",
    "baseUrl",
    "model",
    "apiKeyEnv",
    "stream",
    "maxInflight",
    "requestTimeout",
    "maxTokens",
    "maxCost",
    "prices",
];

/// `provider: {kind, baseUrl, model, apiKeyEnv, stream, maxInflight,
/// requestTimeout}`. Unknown keys are reported (a typo must not silently
/// fall back to a default); a literal key is refused with a hint.
fn read_provider(node: &Node, r: &mut FieldReader<'_>) -> Option<ProviderBlock> {
    let entries = r.map(node, "provider")?;
    let mut block = ProviderBlock::default();
    let mut ok = true;
    for (key, value) in entries {
        let field = format!("provider.{}", key.name);
        if value.value == Value::Null {
            continue;
        }
        match key.name.as_str() {
            "kind" => match r.string(value, &field).as_deref() {
                Some("scripted") => block.kind = Some(ProviderKind::Scripted),
                Some("openai") => block.kind = Some(ProviderKind::Openai),
                Some(other) => {
                    ok = false;
                    r.shape(
                        value.pos,
                        &field,
                        format!("unknown provider kind `{other}`"),
                        "use `scripted` (offline) or `openai` (any OpenAI-compatible endpoint)",
                    );
                }
                None => ok = false,
            },
            "baseUrl" => match r.string(value, &field) {
                Some(url) if url.starts_with("http://") || url.starts_with("https://") => {
                    block.base_url = Some(url);
                }
                Some(url) => {
                    ok = false;
                    r.shape(
                        value.pos,
                        &field,
                        format!("`{url}` is not an http(s) URL"),
                        "e.g. `baseUrl: http://127.0.0.1:8080/v1`",
                    );
                }
                None => ok = false,
            },
            "model" => match r.string(value, &field) {
                Some(m) if !m.trim().is_empty() => block.model = Some(m),
                Some(_) => {
                    ok = false;
                    r.shape(value.pos, &field, "`provider.model` is empty", "");
                }
                None => ok = false,
            },
            "apiKeyEnv" => match r.string(value, &field) {
                Some(var) if is_env_name(&var) => block.api_key_env = Some(var),
                Some(var) => {
                    ok = false;
                    r.shape(
                        value.pos,
                        &field,
                        format!("`{var}` is not an environment variable name"),
                        "name the variable that holds the key, e.g. `apiKeyEnv: OPENAI_API_KEY`",
                    );
                }
                None => ok = false,
            },
            "stream" => match r.bool(value, &field) {
                Some(b) => block.stream = Some(b),
                None => ok = false,
            },
            "maxInflight" => match r.int(value, &field, 1, 100_000) {
                Some(n) => block.max_inflight = usize::try_from(n).ok(),
                None => ok = false,
            },
            "requestTimeout" => {
                match r.string(value, &field).map(|t| parse_positive_duration(&t)) {
                    Some(Ok(d)) => block.request_timeout = Some(d),
                    Some(Err(e)) => {
                        ok = false;
                        r.shape(value.pos, &field, e, "e.g. `requestTimeout: 2m`");
                    }
                    None => ok = false,
                }
            }
            "maxTokens" => match r.int(value, &field, 1, i64::MAX) {
                Some(n) => block.max_tokens = u64::try_from(n).ok(),
                None => ok = false,
            },
            "maxCost" => match read_dollars(value, &field, r) {
                Some(c) => block.max_cost = Some(c),
                None => ok = false,
            },
            "prices" => match read_prices(value, &field, r) {
                Some(p) => block.prices = p,
                None => ok = false,
            },
            "apiKey" | "api_key" | "key" => {
                ok = false;
                r.shape(
                    key.pos,
                    &field,
                    "an API key does not belong in pipeline.yaml",
                    "keep the key in an environment variable and name it: `apiKeyEnv: OPENAI_API_KEY`",
                );
            }
            _ => {
                ok = false;
                r.unknown_key(key, "provider", &PROVIDER_KEYS);
            }
        }
    }
    ok.then_some(block)
}

/// A non-negative amount of US dollars (a number; `$` and quotes refused).
fn read_dollars(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<f64> {
    let amount = match &node.value {
        Value::Int(i) => Some(*i as f64),
        Value::Float(f) => Some(*f),
        _ => None,
    };
    match amount {
        Some(a) if a.is_finite() && a >= 0.0 => Some(a),
        _ => {
            r.shape(
                node.pos,
                field,
                format!("`{field}` must be a non-negative number of US dollars"),
                "e.g. `maxCost: 2.50`",
            );
            None
        }
    }
}

/// `prices: { <model>: { input: <USD per 1M>, output: <USD per 1M> } }`.
fn read_prices(
    node: &Node,
    field: &str,
    r: &mut FieldReader<'_>,
) -> Option<BTreeMap<String, super::model::Price>> {
    let entries = r.map(node, field)?;
    let mut prices = BTreeMap::new();
    let mut ok = true;
    for (model, price) in entries {
        let pfield = format!("{field}.{}", model.name);
        if r.map(price, &pfield).is_none() {
            ok = false;
            continue;
        }
        r.known_keys(price, &pfield, &["input", "output"]);
        let hint = "US dollars per million tokens, e.g. `{ input: 0.15, output: 0.60 }`";
        let input = r
            .required(price, "input", hint)
            .and_then(|n| read_dollars(n, &format!("{pfield}.input"), r));
        let output = r
            .required(price, "output", hint)
            .and_then(|n| read_dollars(n, &format!("{pfield}.output"), r));
        match (input, output) {
            (Some(input), Some(output)) => {
                prices.insert(model.name.clone(), super::model::Price { input, output });
            }
            _ => ok = false,
        }
    }
    ok.then_some(prices)
}

/// `[A-Za-z_][A-Za-z0-9_]*`.
fn is_env_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
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
    let kind_node = r.required(node, "kind", "one of extract_json, print, if_else, switch")?;
    let kind = r.string(kind_node, &format!("{field}.kind"))?;
    let f = |name: &str| format!("{field}.{name}");
    let keys: &[&str] = match kind.as_str() {
        "extract_json" => &["kind", "from"],
        "print" => &["kind", "content"],
        "if_else" => &["kind", "condition", "then", "else"],
        "switch" => &["kind", "on", "cases", "default"],
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
        other => {
            r.report(ValidationCode::UnknownStepKind, kind_node.pos, &f("kind"), format!("unknown step kind `{other}`"), "inline steps are extract_json, print, if_else, switch; LLM stages are `id: file.md`");
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
            let stage = stage?;
            doc.map_targets.push(stage.clone());
            Siblings::Map { stage, over: over? }
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
    let join = match node.get("join").filter(|n| n.value != Value::Null) {
        Some(n) => {
            let id = r.string(n, &format!("{field}.join"))?;
            let sibling_ids = siblings.stages().to_vec();
            doc.joins.push(JoinRef {
                join: id.clone(),
                pos: n.pos,
                siblings: sibling_ids,
                field: format!("{field}.join"),
            });
            Some(id)
        }
        None => None,
    };
    Some(ParallelPlan {
        siblings,
        join,
        cap,
    })
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
