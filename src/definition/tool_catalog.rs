//! The built-in tool catalog: each tool's name, description and JSON Schema
//! for its arguments, as a model sees them in the tool manifest. A
//! declaration the loader checks `allowedTools` against; `tools` holds the
//! implementations.

use serde::Serialize;
use serde_json::{Value, json};

/// A tool as offered to a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

pub const BUILTIN_NAMES: [&str; 7] = ["Read", "Grep", "Glob", "Edit", "Write", "Bash", "Echo"];

/// True when `name` is a built-in tool.
pub fn is_builtin(name: &str) -> bool {
    BUILTIN_NAMES.contains(&name)
}

/// Every built-in tool, in a stable order.
pub fn builtin_tools() -> Vec<ToolSpec> {
    BUILTIN_NAMES.iter().filter_map(|n| builtin(n)).collect()
}

/// The spec of one built-in tool.
pub fn builtin(name: &str) -> Option<ToolSpec> {
    let (description, parameters) = match name {
        "Read" => (
            "Read a text file inside the project root. Returns numbered lines (`cat -n` style), 2000 by default; long lines are cut, and a note says how to read on (`offset`) when the file goes on. Binary files are refused.",
            json!({
                "type": "object",
                "required": ["path"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File path relative to the project root"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based, default 1)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines (default 2000)"}
                },
                "additionalProperties": false
            }),
        ),
        "Grep" => (
            "Search file contents under the project root with a regular expression (Rust regex syntax), respecting .gitignore and skipping hidden and binary files. Returns `path:line: text` matches in a stable order, capped at `max_results` (default 200) with a note when more exist.",
            json!({
                "type": "object",
                "required": ["pattern"],
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "description": "Regular expression, matched per line"},
                    "path": {"type": "string", "minLength": 1, "description": "Directory or file to search, relative to the root (default: the root)"},
                    "glob": {"type": "string", "minLength": 1, "description": "Only files matching this glob: `*.rs` matches names at any depth; a glob with `/` (`src/**/*.rs`) matches paths under `path`"},
                    "case_insensitive": {"type": "boolean", "description": "Default false"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 5000, "description": "Default 200"}
                },
                "additionalProperties": false
            }),
        ),
        "Glob" => (
            "List files under the project root matching a glob, respecting .gitignore and skipping hidden files. `*` stays within a directory, `**` crosses directories; a glob without `/` matches file names at any depth. Returns sorted paths relative to the root, capped at `max_results` (default 200) with a note when more exist.",
            json!({
                "type": "object",
                "required": ["pattern"],
                "properties": {
                    "pattern": {"type": "string", "minLength": 1, "description": "Glob such as src/**/*.rs or *.md"},
                    "path": {"type": "string", "minLength": 1, "description": "Directory to search, relative to the root (default: the root)"},
                    "max_results": {"type": "integer", "minimum": 1, "maximum": 5000, "description": "Default 200"}
                },
                "additionalProperties": false
            }),
        ),
        "Edit" => (
            "Replace an exact string in a text file inside the project root. `old_string` must occur exactly once (include surrounding lines to make it unique) unless `replace_all` is true. The write is atomic and keeps the file's permissions.",
            json!({
                "type": "object",
                "required": ["path", "old_string", "new_string"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File path relative to the project root"},
                    "old_string": {"type": "string", "minLength": 1, "description": "The exact text to replace, whitespace included"},
                    "new_string": {"type": "string", "description": "The replacement text"},
                    "replace_all": {"type": "boolean", "description": "Replace every occurrence (default false)"}
                },
                "additionalProperties": false
            }),
        ),
        "Write" => (
            "Create or overwrite a file inside the project root with the given content, creating parent directories. The write is atomic and keeps an existing file's permissions.",
            json!({
                "type": "object",
                "required": ["path", "content"],
                "properties": {
                    "path": {"type": "string", "minLength": 1, "description": "File path relative to the project root"},
                    "content": {"type": "string", "description": "The whole new content of the file"}
                },
                "additionalProperties": false
            }),
        ),
        "Bash" => (
            "Run a shell command (`bash -c`, else `sh -c`) in the project root, in its own process group, with stdin closed. Returns `exit status: N` then stdout and stderr, each capped at 30000 bytes with a note. A non-zero exit is a normal result. On timeout the whole process group is killed and the call fails with ToolTransient/Timeout; background processes are killed when the command exits.",
            json!({
                "type": "object",
                "required": ["command"],
                "properties": {
                    "command": {"type": "string", "minLength": 1, "description": "The shell command line"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000, "description": "Milliseconds before the process group is killed (default 120000, at most 600000)"}
                },
                "additionalProperties": false
            }),
        ),
        "Echo" => (
            "Return the given text unchanged. Side-effect free; used by demos and benchmarks.",
            json!({
                "type": "object",
                "required": ["text"],
                "properties": {"text": {"type": "string"}},
                "additionalProperties": false
            }),
        ),
        _ => return None,
    };
    Some(ToolSpec {
        name: name.to_owned(),
        description: description.to_owned(),
        parameters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_builtin_has_an_object_schema() {
        let tools = builtin_tools();
        assert_eq!(tools.len(), BUILTIN_NAMES.len());
        for t in tools {
            assert_eq!(t.parameters["type"], "object", "{}", t.name);
            assert!(
                jsonschema::validator_for(&t.parameters).is_ok(),
                "{}",
                t.name
            );
        }
        assert!(is_builtin("Read") && !is_builtin("read"));
    }
}
