//! The terminal's approval prompt: asks on stderr, reads `y`/`n` from
//! stdin. The runtime's terminal interactor calls it on a thread of its
//! own.

use crate::runtime::interaction::{Answer, PromptView, Prompter};

/// Prompts on stderr and reads `y`/`n` from stdin.
#[derive(Debug, Default)]
pub struct StdinPrompter;

impl Prompter for StdinPrompter {
    fn ask(&self, view: &PromptView) -> Option<Answer> {
        use std::io::{BufRead, Write};
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

    fn withdrawn(&self, view: &PromptView) {
        eprintln!(
            "\n(no longer needed: the {} call of stage `{}` was decided or its stage ended; an answer will be ignored)",
            view.tool, view.stage_id
        );
    }
}
