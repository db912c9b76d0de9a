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
    answer: Option<Answer>,
    delay: Duration,
}

/// The rules of one answers file, first match wins.
#[derive(Debug, Clone)]
pub struct AnswerRules {
    pub name: String,
    rules: Vec<Rule>,
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
            rules.push(Rule {
                stage: r.stage,
                tool: r.tool,
                args: r.args,
                answer,
                delay,
            });
        }
        Ok(AnswerRules {
            name: name.to_owned(),
            rules,
        })
    }

    /// The answer (and its delay) for `request`; `None` to stay silent.
    /// With no matching rule the answer is a denial.
    pub fn answer_for(
        &self,
        request: &GrantRequest,
        args_json: &str,
    ) -> (Option<Answer>, Duration) {
        let hit = self.rules.iter().find(|r| {
            r.stage.as_deref().is_none_or(|s| s == request.stage_id)
                && r.tool.as_deref().is_none_or(|t| t == request.tool)
                && r.args.as_deref().is_none_or(|a| args_json.contains(a))
        });
        match hit {
            Some(r) => (r.answer, r.delay),
            None => (Some(Answer::Deny), Duration::ZERO),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::interaction::grants::{args_digest, args_summary};
    use serde_json::{Value, json};

    fn request(proposal: &str, tool: &str, args: &Value) -> GrantRequest {
        GrantRequest {
            workflow_run_id: "r".into(),
            stage_execution_id: "r/s/1".into(),
            stage_id: "s".into(),
            attempt: 1,
            proposal_id: proposal.into(),
            tool: tool.into(),
            args_digest: args_digest(args),
            args_summary: args_summary(args),
        }
    }

    #[test]
    fn rules_match_in_order_and_default_to_deny() {
        let rules = AnswerRules::parse(
            "a.yaml",
            "answers:\n  - { tool: Bash, args: \"git status\", answer: approve, delay: 5ms }\n  - { stage: quiet, answer: none }\n",
        )
        .unwrap();
        let ok = request("p", "Bash", &json!({"command": "git status"}));
        assert_eq!(
            rules.answer_for(&ok, r#"{"command":"git status"}"#),
            (Some(Answer::Approve), Duration::from_millis(5))
        );
        let other = request("p", "Bash", &json!({"command": "rm"}));
        assert_eq!(
            rules.answer_for(&other, r#"{"command":"rm"}"#),
            (Some(Answer::Deny), Duration::ZERO)
        );
        let mut quiet = other.clone();
        quiet.stage_id = "quiet".into();
        assert_eq!(rules.answer_for(&quiet, "{}").0, None);
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
