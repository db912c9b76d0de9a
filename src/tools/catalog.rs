//! The built-in tool catalog: each tool's name, description and JSON Schema
//! for its arguments, as a model sees them in the tool manifest.

use serde::Serialize;
use serde_json::{Value, json};

/// A tool as offered to a model.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub parameters: Value,
}

const BUILTIN_NAMES: [&str; 7] = ["Read", "Grep", "Glob", "Edit", "Write", "Bash", "Echo"];

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
            "Read a text file inside the project root. Returns numbered lines; long files are cut at `limit` lines with a note saying how to read on.",
            json!({
                "type": "object",
                "required": ["path"],
                "properties": {
                    "path": {"type": "string", "description": "File path relative to the project root"},
                    "offset": {"type": "integer", "minimum": 1, "description": "First line to read (1-based)"},
                    "limit": {"type": "integer", "minimum": 1, "description": "Maximum number of lines (default 2000)"}
                },
                "additionalProperties": false
            }),
        ),
        "Grep" => (
            "Search file contents under the project root with a regular expression, respecting .gitignore. Returns `path:line: text` matches, capped.",
            json!({
                "type": "object",
                "required": ["pattern"],
                "properties": {
                    "pattern": {"type": "string", "description": "Regular expression"},
                    "path": {"type": "string", "description": "Directory or file to search (default: the root)"},
                    "glob": {"type": "string", "description": "Only files matching this glob, e.g. *.rs"},
                    "case_insensitive": {"type": "boolean"},
                    "max_results": {"type": "integer", "minimum": 1}
                },
                "additionalProperties": false
            }),
        ),
        "Glob" => (
            "List files under the project root matching a glob pattern, respecting .gitignore. Returns paths, capped.",
            json!({
                "type": "object",
                "required": ["pattern"],
                "properties": {
                    "pattern": {"type": "string", "description": "Glob such as src/**/*.rs"},
                    "path": {"type": "string", "description": "Directory to search (default: the root)"}
                },
                "additionalProperties": false
            }),
        ),
        "Edit" => (
            "Replace an exact string in a file inside the project root. `old_string` must occur exactly once unless `replace_all` is true. The write is atomic.",
            json!({
                "type": "object",
                "required": ["path", "old_string", "new_string"],
                "properties": {
                    "path": {"type": "string"},
                    "old_string": {"type": "string"},
                    "new_string": {"type": "string"},
                    "replace_all": {"type": "boolean"}
                },
                "additionalProperties": false
            }),
        ),
        "Write" => (
            "Create or overwrite a file inside the project root with the given content. The write is atomic.",
            json!({
                "type": "object",
                "required": ["path", "content"],
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"}
                },
                "additionalProperties": false
            }),
        ),
        "Bash" => (
            "Run a shell command in the project root, in its own process group, with a timeout. Returns the exit status and the (capped) output.",
            json!({
                "type": "object",
                "required": ["command"],
                "properties": {
                    "command": {"type": "string"},
                    "timeout_ms": {"type": "integer", "minimum": 1, "maximum": 600000, "description": "Default 120000"}
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
