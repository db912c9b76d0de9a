//! MCP servers as `pipeline.yaml` declares them (`mcpServers:`): how to
//! start or reach each one, what it may see of troupe's environment, and
//! how its tools are named to a model (`<server>__<tool>`). `tools::mcp`
//! starts them and calls their tools.

use std::time::Duration;

use serde::Serialize;

/// Separates a server's name from its tool's in a tool name.
pub const SEPARATOR: &str = "__";

/// One call may take this long unless the block says `timeout:`.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Calls in flight to one server unless the block says `maxInflight:`.
pub const DEFAULT_MAX_INFLIGHT: usize = 16;

/// An MCP server of the pipeline.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct McpServerDef {
    pub name: String,
    pub transport: McpTransport,
    #[serde(serialize_with = "ser_duration")]
    pub timeout: Duration,
    pub max_inflight: usize,
    /// How long the server may take to start, answer `initialize` and list
    /// its tools (`startTimeout:`); the CLI's default when absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub start_timeout: Option<Duration>,
}

/// How troupe reaches a server.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum McpTransport {
    /// A child process speaking JSON-RPC on stdin/stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        /// Variables passed on from troupe's environment besides the
        /// harmless ones (names only; values never in the file).
        env: Vec<String>,
        /// Run under the shell sandbox (`sandbox: false` lifts it).
        sandbox: bool,
        /// Folders the sandboxed server may write besides the root and its
        /// temp folder (`~/` is the home folder), e.g. npx's cache.
        writes: Vec<String>,
        /// `network: deny`: the server may open no TCP connection.
        deny_network: bool,
    },
    /// A Streamable HTTP endpoint.
    Http {
        url: String,
        /// `(header, variable)`: the header's value is read from the
        /// variable at start.
        headers_from_env: Vec<(String, String)>,
    },
}

fn ser_duration<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&super::duration::format_duration(*d))
}

/// Whether `name` can name a server: letters, digits, `-` and single `_`
/// (a `__` would make tool names ambiguous), at most 32.
pub fn is_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 32
        && !name.contains(SEPARATOR)
        && !name.ends_with('_')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Splits `server__tool` into its server and tool; `None` for a name with
/// no separator (a built-in).
pub fn split_tool_name(name: &str) -> Option<(&str, &str)> {
    // A search for the first `__` by hand: `split_once` with a string
    // builds a substring searcher each call, and every tool event of
    // every execution asks this (2% of a fan-out sibling's instructions).
    let bytes = name.as_bytes();
    let at = bytes
        .windows(SEPARATOR.len())
        .position(|pair| pair == SEPARATOR.as_bytes())?;
    let (server, tool) = (&name[..at], &name[at + SEPARATOR.len()..]);
    (!server.is_empty() && !tool.is_empty()).then_some((server, tool))
}

/// The name a model sees for `tool` of `server`.
pub fn tool_name(server: &str, tool: &str) -> String {
    format!("{server}{SEPARATOR}{tool}")
}

/// Whether an `allowedTools` entry (`fs__read_file`, or the wildcard
/// `fs__*`) allows the tool `name`.
pub fn allows(entry: &str, name: &str) -> bool {
    match entry.strip_suffix('*') {
        Some(prefix) if prefix.ends_with(SEPARATOR) => name.starts_with(prefix),
        _ => entry == name,
    }
}

/// Whether `entry` names a tool (or all tools) of one of `servers`: what
/// the loader can check before any server runs.
pub fn declares(entry: &str, servers: &[McpServerDef]) -> bool {
    split_tool_name(entry).is_some_and(|(server, _)| servers.iter().any(|s| s.name == server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_names_split_at_the_first_separator_and_wildcards_match_a_server() {
        assert_eq!(split_tool_name("fs__read_file"), Some(("fs", "read_file")));
        assert_eq!(split_tool_name("fs__a__b"), Some(("fs", "a__b")));
        assert_eq!(split_tool_name("Read"), None);
        assert_eq!(split_tool_name("__x"), None);
        assert_eq!(split_tool_name("x__"), None);
        assert_eq!(split_tool_name("é__ü"), Some(("é", "ü")));
        // The same split as `split_once` wherever that one's halves are
        // both non-empty.
        for name in ["a___b", "a____b", "_a__b_", "a_b__c_d", "fs__"] {
            let expected = name
                .split_once(SEPARATOR)
                .filter(|(s, t)| !s.is_empty() && !t.is_empty());
            assert_eq!(split_tool_name(name), expected, "{name}");
        }
        assert!(allows("fs__*", "fs__read_file"));
        assert!(!allows("fs__*", "fsx__read_file"));
        assert!(allows("fs__read_file", "fs__read_file"));
        assert!(!allows("fs__read", "fs__read_file"));
        assert!(is_server_name("my-fs_1"));
        for bad in ["", "a__b", "a_", "a b", "a.b"] {
            assert!(!is_server_name(bad), "{bad}");
        }
    }
}
