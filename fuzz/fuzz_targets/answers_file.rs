//! Fuzzes the answers file (`--answers`): parse, then match a request.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::runtime::interaction::{AnswerRules, GrantRequest};

fuzz_target!(|text: &str| {
    let Ok(rules) = AnswerRules::parse("answers.yaml", text) else {
        return;
    };
    let request = GrantRequest {
        workflow_run_id: "run".into(),
        stage_execution_id: "exec".into(),
        stage_id: "plan".into(),
        attempt: 1,
        proposal_id: "p".into(),
        tool: "Bash".into(),
        args_digest: String::new(),
        args_summary: "rm -rf".into(),
    };
    let _ = rules.answer_for(&request, "{\"command\":\"rm -rf /\"}");
});
