//! The terminal's approval prompt: asks on stderr, reads `y`/`n` from
//! stdin. The runtime's terminal interactor calls it on a thread of its
//! own.

use crate::runtime::interaction::{Answer, FormView, PromptView, Prompter};

/// One question on the terminal at a time: an approval and a server's form
/// may be asked from two threads, and must not read the same lines.
static TERMINAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Prompts on stderr and reads `y`/`n` from stdin.
#[derive(Debug, Default)]
pub struct StdinPrompter;

impl Prompter for StdinPrompter {
    fn ask(&self, view: &PromptView) -> Option<Answer> {
        use std::io::{BufRead, Write};
        let _turn = TERMINAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let queued = if view.waiting > 0 {
            format!(" ({} more waiting)", view.waiting)
        } else {
            String::new()
        };
        // Write and release stderr before waiting on stdin: holding its
        // lock while a person thinks would block every other writer
        // (the withdrawal notice, the runtime's own messages).
        {
            let mut err = std::io::stderr().lock();
            let _ = write!(
                err,
                "\napproval{queued}: stage `{}` ({}) wants to run {} {}\n  allow this one call? [y/N, a = this and every call with the same arguments this run{}] ",
                view.stage_id,
                view.stage_execution_id,
                view.tool,
                view.args_summary,
                if view.tool == "Bash" {
                    ", p = every Bash command of this run that runs the same program and chains nothing"
                } else {
                    ""
                }
            );
            let _ = err.flush();
        }
        let mut line = String::new();
        match std::io::stdin().lock().read_line(&mut line) {
            Ok(0) | Err(_) => None,
            Ok(_) => match line.trim().to_ascii_lowercase().as_str() {
                "y" | "yes" => Some(Answer::Approve),
                "a" | "all" => Some(Answer::ApproveSame),
                "p" | "prefix" if view.tool == "Bash" => Some(Answer::ApprovePrefix),
                _ => Some(Answer::Deny),
            },
        }
    }

    /// Asks each field of the form on its own line; an empty line skips an
    /// optional field, `-` alone declines the whole form.
    fn fill(&self, form: &FormView) -> Option<serde_json::Value> {
        use serde_json::Value;
        use std::io::{BufRead, Write};
        let _turn = TERMINAL
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let required: Vec<&str> = form.schema["required"]
            .as_array()
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        eprintln!(
            "\nMCP server `{}` asks: {}\n  (answer each field; `-` declines)",
            form.server, form.message
        );
        let mut content = serde_json::Map::new();
        let empty = serde_json::Map::new();
        let fields = form.schema["properties"].as_object().unwrap_or(&empty);
        for (name, field) in fields {
            let kind = field["type"].as_str().unwrap_or("string");
            let about = field["description"].as_str().unwrap_or("");
            let need = if required.contains(&name.as_str()) {
                ""
            } else {
                ", optional"
            };
            loop {
                {
                    let mut err = std::io::stderr().lock();
                    let _ = write!(err, "  {name} ({kind}{need}) {about}: ");
                    let _ = err.flush();
                }
                let mut line = String::new();
                match std::io::stdin().lock().read_line(&mut line) {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
                let text = line.trim();
                if text == "-" {
                    return None;
                }
                if text.is_empty() && need.is_empty() {
                    eprintln!("  {name} is required");
                    continue;
                }
                if text.is_empty() {
                    break;
                }
                let value = match kind {
                    "integer" => text.parse::<i64>().ok().map(Value::from),
                    "number" => text.parse::<f64>().ok().map(Value::from),
                    "boolean" => match text {
                        "y" | "yes" | "true" => Some(Value::Bool(true)),
                        "n" | "no" | "false" => Some(Value::Bool(false)),
                        _ => None,
                    },
                    _ => Some(Value::String(text.to_owned())),
                };
                match value {
                    Some(v) => {
                        content.insert(name.clone(), v);
                        break;
                    }
                    None => eprintln!("  not a {kind}; try again"),
                }
            }
        }
        Some(Value::Object(content))
    }

    fn withdrawn(&self, view: &PromptView) {
        eprintln!(
            "\n(no longer needed: the {} call of stage `{}` was decided or its stage ended; an answer will be ignored)",
            view.tool, view.stage_id
        );
    }
}
