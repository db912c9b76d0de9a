//! `troupe validate`: load a pipeline and report every problem at once.

use std::path::Path;

use super::Exit;
use crate::definition::load_pipeline;
use crate::error::{Diagnostic, Diagnostics, ValidationCode};

pub fn run(path: &Path, json: bool) -> Exit {
    match load_pipeline(path) {
        Ok(p) => {
            if json {
                let out = serde_json::json!({"ok": true, "id": p.id, "stages": p.stages.len()});
                println!("{out}");
            } else {
                println!("ok: {} ({} stages)", p.id, p.stages.len());
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
        let out = serde_json::json!({"ok": false, "errors": diags.0});
        println!("{out}");
        return;
    }
    for d in &diags.0 {
        eprintln!("error: {d}");
    }
    let n = diags.0.len();
    eprintln!(
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
