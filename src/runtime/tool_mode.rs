//! `troupe chat`'s security modes, for the one place no state machine
//! decides which tools a turn may use: every offered tool is shown to the
//! model, and each call is decided by the mode. `yolo` runs it; `allowlist`
//! runs what an allow rule matches (`Bash(cargo test *)`) and asks about the
//! rest; `ask` asks about every call. Asking is the interactors' approval,
//! with its one-shot grant. Guard hooks still have the last word on every
//! call. Inside pipelines the stage's `allowedTools` and grants decide, as
//! always: a run has no mode unless `troupe chat` gives it one.

use crate::definition::mcp::allows;

/// The three modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Ask,
    Allowlist,
    Yolo,
}

impl Mode {
    pub fn parse(text: &str) -> Option<Mode> {
        match text {
            "ask" => Some(Mode::Ask),
            "allowlist" => Some(Mode::Allowlist),
            "yolo" => Some(Mode::Yolo),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ask => "ask",
            Mode::Allowlist => "allowlist",
            Mode::Yolo => "yolo",
        }
    }
}

/// One `--allow` rule: `Tool`, `Tool(*)`, `Bash(words *)` (a command that
/// starts with those words and chains, substitutes or redirects nothing),
/// or `Tool(text)` (arguments, as JSON, that contain the text). `Tool` may
/// be an MCP `server__*` wildcard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AllowRule {
    /// As written, for the audit log.
    pub text: String,
    tool: String,
    matcher: Matcher,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Matcher {
    Any,
    /// `Bash(words *)`: a plain command that starts with the words.
    Prefix(String),
    /// `Bash(words)`: that plain command and no more.
    Exact(String),
    Contains(String),
}

impl AllowRule {
    pub fn parse(text: &str) -> Result<AllowRule, String> {
        let text = text.trim();
        let (tool, inner) = match text.split_once('(') {
            None => (text, None),
            Some((tool, rest)) => match rest.strip_suffix(')') {
                Some(inner) => (tool, Some(inner.trim())),
                None => return Err(format!("`{text}`: a rule is Tool or Tool(pattern)")),
            },
        };
        let tool_ok = !tool.is_empty()
            && tool
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '*' || c == '-');
        if !tool_ok {
            return Err(format!("`{text}`: `{tool}` is not a tool name"));
        }
        let matcher = match inner {
            None | Some("*" | "") => Matcher::Any,
            Some(p) if tool == "Bash" => match p.strip_suffix('*') {
                Some(words) if !words.trim().is_empty() => Matcher::Prefix(words.trim().to_owned()),
                // No `*`: that command, with nothing after it.
                _ => Matcher::Exact(p.to_owned()),
            },
            Some(p) => Matcher::Contains(p.to_owned()),
        };
        Ok(AllowRule {
            text: text.to_owned(),
            tool: tool.to_owned(),
            matcher,
        })
    }

    /// Whether the rule allows `tool` with `args` (a JSON object).
    pub fn matches(&self, tool: &str, args: &serde_json::Value) -> bool {
        if !allows(&self.tool, tool) {
            return false;
        }
        match &self.matcher {
            Matcher::Any => true,
            Matcher::Prefix(words) => args["command"]
                .as_str()
                .is_some_and(|c| super::interaction::prefix_matches(words, c)),
            Matcher::Exact(words) => args["command"].as_str().is_some_and(|c| {
                let count = |s: &str| s.split([' ', '\t']).filter(|w| !w.is_empty()).count();
                super::interaction::prefix_matches(words, c) && count(c) == count(words)
            }),
            Matcher::Contains(text) => args.to_string().contains(text.as_str()),
        }
    }
}

/// A chat's mode, its allow rules and the tools it offers the model.
#[derive(Debug, Clone)]
pub struct ToolMode {
    pub mode: Mode,
    pub allow: Vec<AllowRule>,
    /// The tools shown to the model (built-ins and `server__*` patterns).
    pub offered: Vec<String>,
}

/// What the mode says of one call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Run it; the rule that said so (`yolo`, `--allow#0 Bash(cargo test *)`).
    Run(String),
    /// Put it to the interactors.
    Ask,
}

impl ToolMode {
    /// Whether `tool` is among the offered ones (a name, or a
    /// `server__*` pattern).
    pub fn offers(&self, tool: &str) -> bool {
        self.offered
            .iter()
            .any(|pattern| crate::definition::mcp::allows(pattern, tool))
    }

    pub fn decide(&self, tool: &str, args: &serde_json::Value) -> Verdict {
        match self.mode {
            Mode::Yolo => Verdict::Run("yolo".to_owned()),
            Mode::Ask => Verdict::Ask,
            Mode::Allowlist => self
                .allow
                .iter()
                .enumerate()
                .find(|(_, r)| r.matches(tool, args))
                .map_or(Verdict::Ask, |(i, r)| {
                    Verdict::Run(format!("--allow#{i} {}", r.text))
                }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn mode(rules: &[&str]) -> ToolMode {
        ToolMode {
            mode: Mode::Allowlist,
            allow: rules.iter().map(|r| AllowRule::parse(r).unwrap()).collect(),
            offered: Vec::new(),
        }
    }

    #[test]
    fn only_offered_tools_are_offered() {
        let m = ToolMode {
            mode: Mode::Yolo,
            allow: Vec::new(),
            offered: vec!["Read".to_owned(), "fs__*".to_owned()],
        };
        assert!(m.offers("Read"));
        assert!(m.offers("fs__read_text_file"));
        assert!(!m.offers("Bash"));
        assert!(!m.offers("git__status"));
    }

    #[test]
    fn allow_rules_match_as_written() {
        let m = mode(&["Bash(cargo test *)", "Read", "Grep(src/)", "fs__*"]);
        let run = |tool: &str, args: serde_json::Value| m.decide(tool, &args);
        assert_eq!(
            run("Bash", json!({"command": "cargo test -p x"})),
            Verdict::Run("--allow#0 Bash(cargo test *)".to_owned())
        );
        assert_eq!(
            run("Bash", json!({"command": "cargo test; curl x | sh"})),
            Verdict::Ask
        );
        assert_eq!(run("Bash", json!({"command": "cargo build"})), Verdict::Ask);
        assert_eq!(
            run("Read", json!({"path": "/etc/passwd"})),
            Verdict::Run("--allow#1 Read".to_owned())
        );
        assert_eq!(
            run("Grep", json!({"pattern": "x", "path": "src/"})),
            Verdict::Run("--allow#2 Grep(src/)".to_owned())
        );
        assert_eq!(
            run("Grep", json!({"pattern": "x", "path": "tests/"})),
            Verdict::Ask
        );
        assert_eq!(
            run("fs__read_file", json!({})),
            Verdict::Run("--allow#3 fs__*".to_owned())
        );
        assert_eq!(run("Write", json!({})), Verdict::Ask);
        // Without `*`, the command as written and nothing after it.
        let m = mode(&["Bash(git status)"]);
        let run = |c: &str| m.decide("Bash", &json!({ "command": c }));
        assert_eq!(
            run("git status"),
            Verdict::Run("--allow#0 Bash(git status)".to_owned())
        );
        assert_eq!(
            run("git  status"),
            Verdict::Run("--allow#0 Bash(git status)".to_owned())
        );
        assert_eq!(run("git status --output=/tmp/x"), Verdict::Ask);
        assert_eq!(run("git"), Verdict::Ask);
    }

    #[test]
    fn yolo_runs_and_ask_asks_everything() {
        let mut m = mode(&["Read"]);
        m.mode = Mode::Yolo;
        assert_eq!(
            m.decide("Bash", &json!({})),
            Verdict::Run("yolo".to_owned())
        );
        m.mode = Mode::Ask;
        assert_eq!(m.decide("Read", &json!({})), Verdict::Ask);
    }

    #[test]
    fn bad_rules_are_refused() {
        assert!(AllowRule::parse("Bash(cargo test").is_err());
        assert!(AllowRule::parse("(x)").is_err());
        assert!(AllowRule::parse("rm -rf /").is_err());
    }
}
