//! `troupe validate`: load a pipeline and report every problem at once.

use std::path::Path;

use super::Exit;
use crate::definition::load_pipeline;
use crate::error::{Diagnostic, Diagnostics, ValidationCode};

/// Validates `path`; with `connect` (the root), also starts its MCP
/// servers and checks their tools.
pub fn run(path: &Path, json: bool, connect: Option<&Path>) -> Exit {
    match load_pipeline(path) {
        Ok(p) => {
            let mut tools = Vec::new();
            if let Some(root) = connect {
                let root = std::fs::canonicalize(root).unwrap_or_else(|_| root.to_owned());
                let shell = super::sandbox::shell_sandbox(false, &[], &root);
                // The servers' stderr, for the tail a start error quotes.
                let logs = tempfile::tempdir().ok();
                let log_dir = logs.as_ref().map(tempfile::TempDir::path);
                match super::mcp::start_servers(&p, &root, shell.sandbox.clone(), log_dir, false) {
                    Ok(Some(pool)) => {
                        for server in pool.servers() {
                            for tool in server.listing().tools() {
                                let name =
                                    crate::definition::mcp::tool_name(&server.def.name, &tool.name);
                                tools.push((name, tool.description.clone()));
                            }
                        }
                    }
                    Ok(None) => {}
                    Err(e) => return super::mcp::mcp_failed(&e, json),
                }
            }
            if json {
                let tools: Vec<_> = tools
                    .iter()
                    .map(|(n, d)| serde_json::json!({"name": n, "description": d}))
                    .collect();
                let mut out = serde_json::json!({"ok": true, "id": p.id, "stages": p.stages.len()});
                if connect.is_some() {
                    out["mcpTools"] = serde_json::Value::Array(tools);
                }
                tell!("{out}");
            } else {
                tell!("ok: {} ({} stages)", p.id, p.stages.len());
                for (name, description) in &tools {
                    let first = description.lines().next().unwrap_or_default();
                    tell!("  {name}  {first}");
                }
            }
            Exit::Ok
        }
        Err(diags) => {
            print_diagnostics(path, &diags, json);
            Exit::Invalid
        }
    }
}

/// Prints diagnostics: human form on stderr, or JSON on stdout.
pub fn print_diagnostics(path: &Path, diags: &Diagnostics, json: bool) {
    if json {
        // The shape of every other `--json` error, the first problem's
        // code and message at the top, and every problem under `errors`.
        let first = diags
            .0
            .first()
            .and_then(|d| serde_json::to_value(d).ok())
            .unwrap_or_default();
        let out = serde_json::json!({
            "ok": false,
            "status": "error",
            "code": first["code"],
            "message": first["message"],
            "errors": diags.0,
        });
        tell!("{out}");
        return;
    }
    for d in &diags.0 {
        say!("error: {d}");
    }
    let n = diags.0.len();
    say!(
        "{}: {n} problem{} found",
        path.display(),
        if n == 1 { "" } else { "s" }
    );
}

/// One problem with the command's input (a flag, a value, a stage name):
/// reported as `print_diagnostics` does, exit 2.
pub fn reject(path: &Path, code: ValidationCode, message: String, json: bool) -> Exit {
    print_diagnostics(
        path,
        &Diagnostics(vec![Diagnostic::new(code, message)]),
        json,
    );
    Exit::Invalid
}
