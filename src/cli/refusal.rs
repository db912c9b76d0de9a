//! Why a run did not start, as a value: printed by `troupe run` (text on
//! stderr, or JSON on stdout with `--json`), sent as a typed JSON error by
//! `troupe serve` to the client that submitted it. The codes are the same
//! either way.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::Exit;
use super::validate::print_diagnostics;
use crate::error::{Diagnostic, Diagnostics, HasCode, ValidationCode};

/// A run refused before anything ran (exit 2).
#[derive(Debug, Clone)]
pub enum Refusal {
    /// The pipeline, its ctx or a flag is wrong: every problem found.
    Diagnostics { path: PathBuf, diags: Diagnostics },
    /// A part the run needs cannot be used (the store, the provider, an
    /// MCP server, NATS).
    Typed {
        code: String,
        message: String,
        hint: String,
    },
}

impl Refusal {
    /// One bad flag or value (`Validation/InputInvalid`).
    pub fn invalid(path: &Path, message: impl Into<String>) -> Refusal {
        Refusal::Diagnostics {
            path: path.to_owned(),
            diags: Diagnostics(vec![Diagnostic::new(
                ValidationCode::InputInvalid,
                message.into(),
            )]),
        }
    }

    /// A typed error with its hint.
    pub fn typed(e: &impl HasCode, message: String, hint: &str) -> Refusal {
        Refusal::Typed {
            code: e.code().to_string(),
            message,
            hint: hint.to_owned(),
        }
    }

    /// The stable code (the first diagnostic's, for diagnostics).
    pub fn code(&self) -> String {
        match self {
            Refusal::Diagnostics { diags, .. } => diags
                .0
                .first()
                .map_or_else(String::new, |d| d.code().to_string()),
            Refusal::Typed { code, .. } => code.clone(),
        }
    }

    /// Prints it as the CLI does; exit 2.
    pub fn print(&self, json: bool) -> Exit {
        match self {
            Refusal::Diagnostics { path, diags } => {
                print_diagnostics(path, diags, json);
                Exit::Invalid
            }
            Refusal::Typed {
                code,
                message,
                hint,
            } => super::output::typed_failure(code, message, hint, json),
        }
    }

    /// `code: message` on one line, the code once: a single diagnostic's
    /// message already starts with it.
    pub fn said(&self) -> String {
        let v = self.to_json();
        let code = v["error"]["code"].as_str().unwrap_or("?");
        let message = v["error"]["message"].as_str().unwrap_or("");
        crate::error::with_code(code, message)
    }

    /// The control API's error body: `{"error": {"code", "message",
    /// "hint"?, "diagnostics"?}}`.
    pub fn to_json(&self) -> Value {
        match self {
            Refusal::Diagnostics { diags, .. } => {
                let message = diags
                    .0
                    .iter()
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join("; ");
                json!({"error": {"code": self.code(), "message": message, "diagnostics": diags.0}})
            }
            Refusal::Typed {
                code,
                message,
                hint,
            } => json!({"error": {"code": code, "message": message, "hint": hint}}),
        }
    }
}
