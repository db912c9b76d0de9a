//! Scripted answers (`--answers FILE`): the rules of an answers file,
//! checked when it is read, and the answer (and delay) they give a
//! request; first match wins, no match denies.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::grants::GrantRequest;
use super::messages::Answer;
use crate::definition::duration::parse_duration;

/// One rule of an answers file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AnswerRule {
    /// Stage id the rule applies to (any when absent).
    #[serde(default)]
    pub stage: Option<String>,
    /// Tool name (any when absent).
    #[serde(default)]
    pub tool: Option<String>,
    /// Text the arguments (as JSON) must contain.
    #[serde(default)]
    pub args: Option<String>,
    /// `Bash` only: the command must start with these words and chain,
    /// substitute or redirect nothing (`prefix: cargo test`).
    #[serde(default)]
    pub prefix: Option<String>,
    /// Answers the elicitations of this MCP server (`*`: any) instead of
    /// approvals: `approve` sends `content`, `deny` declines.
    #[serde(default)]
    pub elicit: Option<String>,
    /// What an `elicit` or `human` rule sends.
    #[serde(default)]
    pub content: Option<serde_json::Value>,
    /// Answers the question of this human step (its stage id) with
    /// `content` instead of approvals.
    #[serde(default)]
    pub human: Option<String>,
    /// `approve`, `deny`, `defer`, or `none` (never answer).
    pub answer: String,
    /// Wait this long before answering, e.g. `20ms`.
    #[serde(default)]
    pub delay: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AnswersFile {
    answers: Vec<AnswerRule>,
}

/// A checked rule.
#[derive(Debug, Clone)]
struct Rule {
    stage: Option<String>,
    tool: Option<String>,
    args: Option<String>,
    prefix: Option<String>,
    elicit: Option<String>,
    content: Option<serde_json::Value>,
    human: Option<String>,
    /// `<file>#<index>`, for the audit line of the answers it gives.
    name: std::sync::Arc<str>,
    answer: Option<Answer>,
    delay: Duration,
}

/// The rules of one answers file, first match wins.
#[derive(Debug, Clone)]
pub struct AnswerRules {
    pub name: String,
    rules: Vec<Rule>,
    /// No rule matching: leave the call to the run's other interactors
    /// (a person, `--yolo`) instead of denying it.
    pub leave_unmatched: bool,
}

impl AnswerRules {
    /// Reads an answers file; errors say which rule is wrong and why.
    pub fn load(path: &Path) -> Result<AnswerRules, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        let name = path.file_name().map_or_else(
            || "answers".to_owned(),
            |n| n.to_string_lossy().into_owned(),
        );
        AnswerRules::parse(&name, &text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Parses answers-file text.
    pub fn parse(name: &str, text: &str) -> Result<AnswerRules, String> {
        let file: AnswersFile = serde_saphyr::from_str(text).map_err(|e| e.to_string())?;
        let mut rules = Vec::with_capacity(file.answers.len());
        for (i, r) in file.answers.into_iter().enumerate() {
            let answer = match r.answer.as_str() {
                "approve" => Some(Answer::Approve),
                "deny" => Some(Answer::Deny),
                "defer" => Some(Answer::Defer),
                "none" => None,
                other => {
                    return Err(format!(
                        "answers[{i}].answer: `{other}` is not one of approve, deny, defer, none"
                    ));
                }
            };
            let delay = match &r.delay {
                Some(d) => parse_duration(d).map_err(|e| format!("answers[{i}].delay: {e}"))?,
                None => Duration::ZERO,
            };
            if r.prefix.is_some() && r.tool.as_deref().is_some_and(|t| t != "Bash") {
                return Err(format!(
                    "answers[{i}].prefix: applies to Bash commands only"
                ));
            }
            rules.push(Rule {
                stage: r.stage,
                tool: r.tool,
                args: r.args,
                prefix: r.prefix,
                elicit: r.elicit,
                content: r.content,
                human: r.human,
                name: format!("{name}#{i}").into(),
                answer,
                delay,
            });
        }
        Ok(AnswerRules {
            name: name.to_owned(),
            rules,
            leave_unmatched: false,
        })
    }

    /// The answer (and its delay) for `request`, and the rule that gave
    /// it; `None` to stay silent. With no matching rule the answer is a
    /// denial, unless the run has other interactors to leave it to
    /// ([`AnswerRules::leave_unmatched`]).
    pub fn answer_for(
        &self,
        request: &GrantRequest,
        args_json: &str,
    ) -> (Option<Answer>, Duration, Option<std::sync::Arc<str>>) {
        let hit = self.rules.iter().find(|r| {
            r.elicit.is_none()
                && r.human.is_none()
                && r.stage.as_deref().is_none_or(|s| s == request.stage_id)
                && r.tool.as_deref().is_none_or(|t| t == request.tool)
                && r.args.as_deref().is_none_or(|a| args_json.contains(a))
                && r.prefix.as_deref().is_none_or(|p| {
                    request.tool == "Bash"
                        && serde_json::from_str::<serde_json::Value>(args_json)
                            .ok()
                            .and_then(|v| {
                                v.get("command").and_then(|c| c.as_str()).map(str::to_owned)
                            })
                            .is_some_and(|c| super::remember::prefix_matches(p, &c))
                })
        });
        match hit {
            Some(r) => (r.answer, r.delay, Some(std::sync::Arc::clone(&r.name))),
            None if self.leave_unmatched => (None, Duration::ZERO, None),
            None => (Some(Answer::Deny), Duration::ZERO, None),
        }
    }
}

impl AnswerRules {
    /// The content of the first `human` rule for stage `stage`, the
    /// rule's name, and its delay.
    pub fn human_answer_for(
        &self,
        stage: &str,
    ) -> Option<(serde_json::Value, std::sync::Arc<str>, Duration)> {
        let r = self
            .rules
            .iter()
            .find(|r| r.human.as_deref() == Some(stage))?;
        // `deny` or `none` leaves the question to someone else.
        match r.answer? {
            Answer::Approve | Answer::ApproveSame | Answer::ApprovePrefix => {
                Some((r.content.clone()?, std::sync::Arc::clone(&r.name), r.delay))
            }
            Answer::Deny | Answer::Defer => None,
        }
    }

    /// The answer of the first `elicit` rule for `server`: `Some(Some(content))`
    /// to accept, `Some(None)` to decline, `None` when no rule speaks for it
    /// (or it says `none`); and the rule's name.
    pub fn elicitation_for(
        &self,
        server: &str,
    ) -> Option<(Option<serde_json::Value>, std::sync::Arc<str>)> {
        let r = self
            .rules
            .iter()
            .find(|r| r.elicit.as_deref().is_some_and(|s| s == "*" || s == server))?;
        let name = std::sync::Arc::clone(&r.name);
        match r.answer? {
            Answer::Approve | Answer::ApproveSame | Answer::ApprovePrefix => Some((
                Some(r.content.clone().unwrap_or_else(|| serde_json::json!({}))),
                name,
            )),
            Answer::Deny | Answer::Defer => Some((None, name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn rules_match_in_order_and_default_to_deny() {
        let rules = AnswerRules::parse(
            "a.yaml",
            "answers:\n  - { tool: Bash, args: \"git status\", answer: approve, delay: 5ms }\n  - { stage: quiet, answer: none }\n",
        )
        .unwrap();
        let ok = GrantRequest::sample("p", "Bash", &json!({"command": "git status"}));
        let (answer, delay, rule) = rules.answer_for(&ok, r#"{"command":"git status"}"#);
        assert_eq!(
            (answer, delay),
            (Some(Answer::Approve), Duration::from_millis(5))
        );
        assert_eq!(rule.as_deref(), Some("a.yaml#0"));
        let other = GrantRequest::sample("p", "Bash", &json!({"command": "rm"}));
        let (answer, delay, rule) = rules.answer_for(&other, r#"{"command":"rm"}"#);
        assert_eq!(
            (answer, delay, rule),
            (Some(Answer::Deny), Duration::ZERO, None)
        );
        let mut quiet = other.clone();
        quiet.stage_id = "quiet".into();
        assert_eq!(rules.answer_for(&quiet, "{}").0, None);
        // Beside a person (or --yolo), what no rule matches is theirs.
        let mut beside = rules;
        beside.leave_unmatched = true;
        assert_eq!(
            beside.answer_for(&other, r#"{"command":"rm"}"#),
            (None, Duration::ZERO, None)
        );
        assert_eq!(
            beside.answer_for(&ok, r#"{"command":"git status"}"#).0,
            Some(Answer::Approve)
        );
    }

    #[test]
    fn a_prefix_rule_approves_plain_commands_that_start_with_its_words() {
        let rules = AnswerRules::parse(
            "a.yaml",
            "answers:\n  - { tool: Bash, prefix: cargo test, answer: approve }\n",
        )
        .unwrap();
        let ask = |c: &str| {
            let args = json!({"command": c});
            rules
                .answer_for(&GrantRequest::sample("p", "Bash", &args), &args.to_string())
                .0
        };
        assert_eq!(ask("cargo test --lib"), Some(Answer::Approve));
        assert_eq!(ask("cargo test; curl x | sh"), Some(Answer::Deny));
        assert_eq!(ask("cargo build"), Some(Answer::Deny));
        assert!(
            AnswerRules::parse(
                "a",
                "answers:\n  - { tool: Read, prefix: x, answer: approve }\n"
            )
            .is_err()
        );
    }

    #[test]
    fn bad_answers_files_say_what_is_wrong() {
        let e = AnswerRules::parse("a", "answers:\n  - { answer: maybe }\n").unwrap_err();
        assert!(
            e.contains("answers[0].answer") && e.contains("maybe"),
            "{e}"
        );
        let e =
            AnswerRules::parse("a", "answers:\n  - { answer: deny, delay: soon }\n").unwrap_err();
        assert!(e.contains("answers[0].delay"), "{e}");
        let e =
            AnswerRules::parse("a", "answers:\n  - { answer: deny, colour: red }\n").unwrap_err();
        assert!(e.contains("colour"), "{e}");
        assert!(AnswerRules::parse("a", "nope: 1\n").is_err());
    }
}
