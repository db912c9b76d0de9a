//! The `mcpServers:` block of `pipeline.yaml`: one entry per server, a
//! command (stdio) or a `url` (Streamable HTTP). Values that would put a
//! secret into the file (an `env:` mapping, a literal header, a password
//! in the URL) are refused with a hint to name a variable instead.

use super::PipelineDoc;
use crate::definition::fields::FieldReader;
use crate::definition::mcp::{
    DEFAULT_MAX_INFLIGHT, DEFAULT_TIMEOUT, McpServerDef, McpTransport, is_server_name,
};
use crate::definition::yaml::{Node, Value};

const STDIO_KEYS: [&str; 9] = [
    "network",
    "command",
    "args",
    "env",
    "timeout",
    "maxInflight",
    "sandbox",
    "writes",
    "startTimeout",
];
const HTTP_KEYS: [&str; 5] = [
    "url",
    "headersFromEnv",
    "timeout",
    "maxInflight",
    "startTimeout",
];
const ALL_KEYS: [&str; 11] = [
    "network",
    "startTimeout",
    "writes",
    "command",
    "args",
    "env",
    "sandbox",
    "url",
    "headersFromEnv",
    "timeout",
    "maxInflight",
];

/// Reads `mcpServers: {name: {...}, ...}` into `doc.mcp_servers`.
pub(super) fn read_mcp_servers(node: &Node, r: &mut FieldReader<'_>, doc: &mut PipelineDoc) {
    let Some(entries) = r.map(node, "mcpServers") else {
        return;
    };
    for (key, value) in entries {
        let field = format!("mcpServers.{}", key.name);
        if !is_server_name(&key.name) {
            r.shape(
                key.pos,
                &field,
                format!("`{}` cannot name an MCP server", key.name),
                "use letters, digits, `-` and single `_` (tools are named <server>__<tool>), at most 32",
            );
            continue;
        }
        if value.as_map().is_none() {
            r.shape(
                value.pos,
                &field,
                format!("`{field}` must be a mapping, found {}", value.value.kind()),
                "give `command:` (and `args:`) for a stdio server, or `url:` for an HTTP one",
            );
            continue;
        }
        let before = r.diags.len();
        if let Some(server) = read_server(&key.name, value, &field, r)
            && r.diags.len() == before
        {
            doc.mcp_servers.push(server);
        }
    }
}

fn read_server(
    name: &str,
    node: &Node,
    field: &str,
    r: &mut FieldReader<'_>,
) -> Option<McpServerDef> {
    let has_command = r.optional(node, "command").is_some();
    let has_url = r.optional(node, "url").is_some();
    let known: &[&str] = match (has_command, has_url) {
        (true, false) => &STDIO_KEYS,
        (false, true) => &HTTP_KEYS,
        (true, true) => {
            r.shape(
                node.pos,
                field,
                "an MCP server has either `command:` (stdio) or `url:` (HTTP), not both",
                "",
            );
            return None;
        }
        (false, false) => {
            // A typo of `command` or `url` is said as such first.
            let before = r.diags.len();
            r.known_keys(node, field, &ALL_KEYS);
            if r.diags.len() != before {
                return None;
            }
            r.shape(
                node.pos,
                field,
                "an MCP server needs `command:` (stdio) or `url:` (Streamable HTTP)",
                "e.g. `command: npx` with `args: [\"-y\", \"@modelcontextprotocol/server-filesystem\", \".\"]`",
            );
            return None;
        }
    };
    if let Some(entries) = node.as_map() {
        for (key, value) in entries {
            if !known.contains(&key.name.as_str()) {
                if ALL_KEYS.contains(&key.name.as_str()) && value.value != Value::Null {
                    r.shape(
                        key.pos,
                        &format!("{field}.{}", key.name),
                        format!(
                            "`{}` applies to {} servers only",
                            key.name,
                            if has_command { "HTTP" } else { "stdio" }
                        ),
                        "",
                    );
                } else if key.name == "headers" {
                    r.shape(
key.pos,
                        &format!("{field}.headers"),
                        "header values are not written into pipeline.yaml",
                        "name the variable that holds each value: `headersFromEnv: { Authorization: TRACKER_AUTH }`",
                    );
                } else {
                    r.unknown_key(key, field, known);
                }
            }
        }
    }
    let timeout = match r.optional(node, "timeout") {
        None => DEFAULT_TIMEOUT,
        Some(n) => match n
            .as_str()
            .map(crate::definition::duration::parse_positive_duration)
        {
            Some(Ok(d)) => d,
            _ => {
                r.shape(
                    n.pos,
                    &format!("{field}.timeout"),
                    "`timeout` must be a positive duration",
                    "e.g. `timeout: 30s`",
                );
                return None;
            }
        },
    };
    let start_timeout = match r.optional(node, "startTimeout") {
        None => None,
        Some(n) => match n
            .as_str()
            .map(crate::definition::duration::parse_positive_duration)
        {
            Some(Ok(d)) => Some(d),
            _ => {
                r.shape(
                    n.pos,
                    &format!("{field}.startTimeout"),
                    "`startTimeout` must be a positive duration",
                    "e.g. `startTimeout: 2m` (npx may fetch the package first)",
                );
                return None;
            }
        },
    };
    let max_inflight = match r.optional(node, "maxInflight") {
        None => DEFAULT_MAX_INFLIGHT,
        Some(n) => usize::try_from(r.int(n, &format!("{field}.maxInflight"), 1, 100_000)?).ok()?,
    };
    let transport = if has_command {
        read_stdio(node, field, r)?
    } else {
        read_http(node, field, r)?
    };
    Some(McpServerDef {
        name: name.to_owned(),
        transport,
        timeout,
        max_inflight,
        start_timeout,
    })
}

fn read_stdio(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<McpTransport> {
    let n = r.optional(node, "command")?;
    let command = r.string(n, &format!("{field}.command"))?;
    if command.trim().is_empty() {
        r.shape(
            node.pos,
            &format!("{field}.command"),
            "`command` is empty",
            "",
        );
        return None;
    }
    let args = match r.optional(node, "args") {
        None => Vec::new(),
        Some(n) => r
            .string_list(n, &format!("{field}.args"))?
            .into_iter()
            .map(|(a, _)| a)
            .collect(),
    };
    let env = match r.optional(node, "env") {
        None => Vec::new(),
        Some(n) if n.as_map().is_some() => {
            r.shape(
n.pos,
                &format!("{field}.env"),
                "environment values are not written into pipeline.yaml",
                "list the names of variables to pass on from troupe's environment: `env: [GITHUB_TOKEN]`",
            );
            return None;
        }
        Some(n) => env_names(r, n, &format!("{field}.env"))?,
    };
    let sandbox = match r.optional(node, "sandbox") {
        None => true,
        Some(n) => r.bool(n, &format!("{field}.sandbox"))?,
    };
    let writes = match r.optional(node, "writes") {
        None => Vec::new(),
        Some(n) => {
            let listed = r.string_list(n, &format!("{field}.writes"))?;
            // A relative folder would be made relative to troupe's working
            // folder but granted relative to the server's (the root).
            if let Some((w, pos)) = listed
                .iter()
                .find(|(w, _)| !(w.starts_with('/') || w.starts_with("~/")))
            {
                r.shape(
                    *pos,
                    &format!("{field}.writes"),
                    format!(
                        "`{w}` is relative: `writes` entries are absolute paths or start with `~/`"
                    ),
                    "the root is writable already; name folders outside it in full",
                );
                return None;
            }
            listed.into_iter().map(|(w, _)| w).collect()
        }
    };
    let deny_network = match r.optional(node, "network") {
        None => false,
        Some(n) => match n.as_str() {
            Some("deny") => true,
            Some("allow") => false,
            _ => {
                r.shape(
                    n.pos,
                    &format!("{field}.network"),
                    "`network` is `allow` or `deny`",
                    "",
                );
                return None;
            }
        },
    };
    Some(McpTransport::Stdio {
        command,
        args,
        env,
        sandbox,
        writes,
        deny_network,
    })
}

fn read_http(node: &Node, field: &str, r: &mut FieldReader<'_>) -> Option<McpTransport> {
    let n = r.optional(node, "url")?;
    let url = r.string(n, &format!("{field}.url"))?;
    let Some(rest) = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
    else {
        r.shape(
            n.pos,
            &format!("{field}.url"),
            format!("`{url}` is not an http(s) URL"),
            "e.g. `url: http://127.0.0.1:8931/mcp`",
        );
        return None;
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        r.shape(
n.pos,
            &format!("{field}.url"),
            "credentials are not written into pipeline.yaml",
            "drop `user:password@` and pass a header from a variable: `headersFromEnv: { Authorization: TRACKER_AUTH }`",
        );
        return None;
    }
    let headers_from_env = match r.optional(node, "headersFromEnv") {
        None => Vec::new(),
        Some(h) => {
            let entries = r.map(h, &format!("{field}.headersFromEnv"))?;
            let mut out = Vec::new();
            for (key, value) in entries {
                let hfield = format!("{field}.headersFromEnv.{}", key.name);
                let valid_header = !key.name.is_empty()
                    && key
                        .name
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
                if !valid_header {
                    r.shape(
                        key.pos,
                        &hfield,
                        format!("`{}` is not a header name", key.name),
                        "",
                    );
                    return None;
                }
                let var = r.string(value, &hfield)?;
                if let Err(why) = crate::environ::check_env_name(&var) {
                    r.shape(
value.pos,
                        &hfield,
                        why,
                        "give the name of the variable that holds the header's value, never the value",
                    );
                    return None;
                }
                out.push((key.name.clone(), var));
            }
            out
        }
    };
    Some(McpTransport::Http {
        url,
        headers_from_env,
    })
}

fn env_names(r: &mut FieldReader<'_>, n: &Node, field: &str) -> Option<Vec<String>> {
    let mut names = Vec::new();
    for (name, pos) in r.string_list(n, field)? {
        match crate::environ::check_env_name(&name) {
            Ok(name) => names.push(name),
            Err(why) => {
                r.shape(
                    pos,
                    field,
                    why,
                    "list variable names only: `env: [GITHUB_TOKEN]`",
                );
                return None;
            }
        }
    }
    Some(names)
}
