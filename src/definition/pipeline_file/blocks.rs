//! The `hooks:` and `provider:` blocks of `pipeline.yaml`: hook slots and
//! kinds, and the provider settings with budgets and per-model prices.

use super::*;

pub(super) fn read_hooks(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
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
            &["name", "at", "kind", "command", "timeout", "tools", "env"],
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
            Some(n) => match n
                .as_str()
                .map(crate::definition::duration::parse_positive_duration)
            {
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
            // Only a TOOL_CALL hook is about a tool: elsewhere the list
            // would be ignored, a filter that never filters.
            Some(n) if at.as_deref().is_some_and(|a| !a.starts_with("TOOL_CALL/")) => {
                r.report(
                    code,
                    n.pos,
                    &format!("{field}.tools"),
                    format!(
                        "`tools` chooses the calls a TOOL_CALL hook sees; a hook at {} sees no call",
                        at.as_deref().unwrap_or_default()
                    ),
                    "remove `tools`, or hook TOOL_CALL/pre or TOOL_CALL/post",
                );
                None
            }
            Some(n) => r
                .string_list(n, &format!("{field}.tools"))
                .map(|l| l.into_iter().map(|(t, _)| t).collect()),
        };
        let env = match r.optional(item, "env") {
            None => Some(Vec::new()),
            Some(n) => r.string_list(n, &format!("{field}.env")).map(|l| {
                let mut names = Vec::new();
                for (name, pos) in l {
                    match crate::environ::check_env_name(&name) {
                        Ok(name) => names.push(name),
                        Err(why) => r.report(
                            code,
                            pos,
                            &format!("{field}.env"),
                            why,
                            "name variables to pass, e.g. `env: [GITHUB_TOKEN]`; their values stay in your environment",
                        ),
                    }
                }
                names
            }),
        };
        let name = r
            .optional(item, "name")
            .and_then(|n| r.string(n, &format!("{field}.name")));
        if r.diags.len() != before {
            continue;
        }
        if let (Some(at), Some(kind), Some(command), Some(timeout), Some(tools), Some(env)) =
            (at, kind, command, timeout, tools, env)
        {
            doc.hooks.push(HookDef {
                name: name.unwrap_or_else(|| format!("{at}#{i}")),
                at,
                kind,
                command,
                timeout,
                tools,
                env,
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
pub(super) fn read_provider(node: &Node, r: &mut FieldReader<'_>) -> Option<ProviderBlock> {
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
) -> Option<BTreeMap<String, crate::definition::model::Price>> {
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
                prices.insert(
                    model.name.clone(),
                    crate::definition::model::Price { input, output },
                );
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
