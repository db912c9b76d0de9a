//! Tool approvals and interactors, in-process on paused
//! time with scripted interactors: the authority stack, one-shot grants,
//! first answer wins, withdrawal on cancel, late answers audited.

#![allow(clippy::unwrap_used)]

mod common;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::Fixture;
use common::run::{Opts, run};
use serde_json::Value;
use troupe::runtime::interaction::{AnswerRules, InteractorSpec};
use troupe::runtime::summary::RunStatus;

/// A stage allowed only `Read`, calling `Echo` (outside its envelope).
fn stage(id: &str) -> String {
    format!(
        "---\nid: {id}\nname: Stage {id}\nallowedTools: [Read]\ncompletionTool: done\ncompletionSchema:\n  type: object\n  properties: {{ n: {{ type: integer }} }}\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 8\nresolutionPolicy: fail\n---\nWork.\n"
    )
}

fn one_stage(script: &str) -> Fixture {
    Fixture::new(
        "id: p\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
        &[("s.md", &stage("s")), ("script.yaml", script)],
    )
}

fn answers(name: &str, yaml: &str) -> InteractorSpec {
    InteractorSpec::Scripted(Arc::new(AnswerRules::parse(name, yaml).unwrap()))
}

fn opts(interactors: Vec<InteractorSpec>) -> Opts {
    Opts {
        interactors,
        ..Opts::default()
    }
}

#[test]
fn acceptance_29_allowed_tools_run_with_no_prompt_in_every_mode() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Read, args: { path: nothing-here.txt } }\n    - complete: { n: 1 }\n",
    );
    for interactors in [
        vec![],
        vec![InteractorSpec::Yolo],
        vec![answers("deny.yaml", "answers:\n  - { answer: deny }\n")],
    ] {
        let out = run(f.path(), opts(interactors));
        assert_eq!(out.report.status, RunStatus::Ok);
        assert_eq!(out.count("InteractionRaised"), 0);
        let approved = out.named("ToolCallApproved");
        assert_eq!(approved.len(), 1);
        assert_eq!(approved[0]["by"], "allowedTools");
    }
}

#[test]
fn acceptance_30_a_grant_is_one_shot_and_bound_to_its_arguments() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Echo, args: { text: alpha } }\n    - { tool: Echo, args: { text: beta } }\n    - { tool: Echo, args: { text: alpha } }\n    - complete: { n: 1 }\n",
    );
    let rules =
        "answers:\n  - { tool: Echo, args: alpha, answer: approve }\n  - { answer: deny }\n";
    let out = run(f.path(), opts(vec![answers("a.yaml", rules)]));
    assert_eq!(out.report.status, RunStatus::Ok);
    // One interaction per proposal: the same arguments again are asked
    // again, because the first token was consumed by the first call.
    let raised = out.named("InteractionRaised");
    assert_eq!(raised.len(), 3);
    assert!(raised.iter().all(|e| e["kind"] == "grantStageTool"));
    for key in [
        "stageExecutionId",
        "attempt",
        "proposalId",
        "tool",
        "argsDigest",
        "argsSummary",
    ] {
        assert!(!raised[0][key].is_null(), "InteractionRaised lacks {key}");
    }
    assert_eq!(raised[0]["argsDigest"], raised[2]["argsDigest"]);
    assert_ne!(raised[0]["argsDigest"], raised[1]["argsDigest"]);
    assert_ne!(raised[0]["proposalId"], raised[2]["proposalId"]);
    assert_eq!(out.count("StageGranted"), 2);
    let granted: Vec<&Value> = out
        .named("ToolCallApproved")
        .into_iter()
        .filter(|e| e["by"] == "grant")
        .collect();
    assert_eq!(granted.len(), 2);
    assert_eq!(out.count("ToolInvocationSucceeded"), 2);
    assert_eq!(out.count("ToolCallDenied"), 1);
    let results = out.tool_results();
    assert_eq!(results[0], "alpha");
    assert!(
        results[1].contains("ToolTerminal/GrantDenied"),
        "{}",
        results[1]
    );
    assert_eq!(results[2], "alpha");
}

#[test]
fn acceptance_31_deny_or_headless_gives_a_typed_denial_and_act_goes_on() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Echo, args: { text: hi } }\n    - complete: { n: 2 }\n",
    );
    for (interactors, outcome) in [
        (vec![], "noInteractor"),
        (
            vec![answers("d.yaml", "answers:\n  - { answer: deny }\n")],
            "answered",
        ),
        (
            vec![answers("d.yaml", "answers:\n  - { answer: defer }\n")],
            "answered",
        ),
    ] {
        let out = run(f.path(), opts(interactors));
        assert_eq!(
            out.report.status,
            RunStatus::Ok,
            "Act continues to completion"
        );
        assert_eq!(out.report.results["s"].result().parsed["n"], 2);
        assert_eq!(out.named("InteractionAnswered")[0]["outcome"], outcome);
        assert_eq!(out.count("ToolCallDenied"), 1);
        assert_eq!(out.count("ToolInvocationStarted"), 0, "nothing ran");
        let denial: Value = serde_json::from_str(&out.tool_results()[0]).unwrap();
        assert_eq!(denial["error"]["class"], "ToolTerminal");
        assert_eq!(denial["error"]["code"], "ToolTerminal/GrantDenied");
    }
}

#[test]
fn an_approval_that_times_out_is_denied() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Echo, args: { text: hi } }\n    - complete: { n: 2 }\n",
    );
    let mut o = opts(vec![answers("q.yaml", "answers:\n  - { answer: none }\n")]);
    o.approval_timeout = Some(Duration::from_secs(30));
    let out = run(f.path(), o);
    assert_eq!(out.report.status, RunStatus::Ok);
    assert_eq!(out.named("InteractionAnswered")[0]["outcome"], "timedOut");
    assert!(out.elapsed >= Duration::from_secs(30));
    assert_eq!(out.count("ToolCallDenied"), 1);
}

#[test]
fn acceptance_32_the_first_answer_wins_and_the_other_prompt_is_withdrawn() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Echo, args: { text: hi } }\n    - complete: { n: 3 }\n",
    );
    let slow = answers("slow.yaml", "answers:\n  - { answer: deny, delay: 50ms }\n");
    let fast = answers(
        "fast.yaml",
        "answers:\n  - { answer: approve, delay: 10ms }\n",
    );
    let out = run(f.path(), opts(vec![slow, fast]));
    assert_eq!(out.report.status, RunStatus::Ok);
    let answered = out.named("InteractionAnswered");
    assert_eq!(answered.len(), 1, "the withdrawn prompt never answers");
    assert_eq!(answered[0]["outcome"], "answered");
    assert_eq!(answered[0]["by"], "answers:fast.yaml");
    assert_eq!(answered[0]["answer"], "approve");
    assert_eq!(out.tool_results()[0], "hi");
}

#[test]
fn acceptance_33_fail_fast_withdraws_a_pending_prompt_everywhere() {
    let worker = stage("worker");
    let plan = "---\nid: plan\nname: Plan\nallowedTools: [Read]\ncompletionTool: done\ncompletionSchema:\n  type: object\n  properties: { items: { type: array } }\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 3\nresolutionPolicy: fail\n---\nPlan.\n";
    let f = Fixture::new(
        "id: p\nentry: plan\nparallelCap: 4\nstages:\n  plan: plan.md\n  worker: worker.md\n  join: join.md\nnext:\n  plan: { parallel: { map: worker, over: \"ctx.upstream[0].parsed.items\" }, join: join }\n",
        &[
            ("plan.md", plan),
            ("worker.md", &worker),
            ("join.md", &stage("join")),
            (
                "script.yaml",
                "stages:\n  plan:\n    - complete: { items: [0, 1] }\n  worker#0:\n    - { fail: terminal, latency: 100ms }\n  worker#1:\n    - { tool: Echo, args: { text: risky } }\n    - complete: { n: 1 }\n",
            ),
        ],
    );
    // Both interactors would answer only long after the failure.
    let a = answers("a.yaml", "answers:\n  - { answer: approve, delay: 10s }\n");
    let b = answers("b.yaml", "answers:\n  - { answer: none }\n");
    let out = run(f.path(), opts(vec![a, b]));
    assert!(matches!(out.report.status, RunStatus::Failed { .. }));
    let raised = out.named("InteractionRaised");
    assert_eq!(raised.len(), 1);
    assert_eq!(raised[0]["interactors"].as_array().unwrap().len(), 2);
    let answered = out.named("InteractionAnswered");
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["outcome"], "withdrawn");
    assert_eq!(out.count("ToolInvocationStarted"), 0, "the call never ran");
    let cancelled = out.named("StageCancelled");
    assert_eq!(cancelled.len(), 1);
    assert_eq!(cancelled[0]["stageId"], "worker");
    assert!(
        out.elapsed < Duration::from_secs(10),
        "no one waited for the answer"
    );
}

/// The terminal interactor shows one prompt at a time; a prompt withdrawn
/// while showing is marked so, and its late answer is audited and ignored.
#[test]
fn acceptance_33_a_late_answer_from_the_terminal_is_ignored_and_audited() {
    use troupe::runtime::events::Event;
    use troupe::runtime::interaction::{
        Answer, GrantDecision, GrantRequest, InteractionHub, InteractorHandle, PromptView,
        Prompter, Raise, TerminalInteractor, WithdrawOwner,
    };
    use troupe_actors::{Delivery, EventBus};

    /// Answers what the test sends through the gate, when it does.
    struct Gated {
        gate: Mutex<std::sync::mpsc::Receiver<Answer>>,
        shown: Arc<Mutex<Vec<String>>>,
        asked: tokio::sync::mpsc::UnboundedSender<()>,
    }
    impl Prompter for Gated {
        fn ask(&self, view: &PromptView) -> Option<Answer> {
            self.shown
                .lock()
                .unwrap()
                .push(format!("ask {} waiting={}", view.stage_id, view.waiting));
            let _ = self.asked.send(());
            self.gate.lock().unwrap().recv().ok()
        }
        fn withdrawn(&self, view: &PromptView) {
            self.shown
                .lock()
                .unwrap()
                .push(format!("withdrawn {}", view.stage_id));
            let _ = self.asked.send(());
        }
    }

    let request = |exec: &str| GrantRequest {
        workflow_run_id: "r".into(),
        stage_execution_id: exec.into(),
        stage_id: exec.into(),
        attempt: 1,
        proposal_id: format!("{exec}#p"),
        tool: "Bash".into(),
        args_digest: "d".into(),
        args_summary: "{}".into(),
    };
    let bus: EventBus<Event> = EventBus::new();
    let audit = bus.subscribe_audit("t", 1024);
    let shown = Arc::new(Mutex::new(Vec::new()));
    let (open, gate) = std::sync::mpsc::channel();
    let (asked, mut asked_rx) = tokio::sync::mpsc::unbounded_channel();
    let system = actix::System::new();
    let decisions = system.block_on({
        let shown = Arc::clone(&shown);
        let bus = bus.clone();
        async move {
            use actix::Actor;
            let terminal = TerminalInteractor::new(Arc::new(Gated {
                gate: Mutex::new(gate),
                shown,
                asked,
            }))
            .start();
            let hub = InteractionHub::new(
                vec![InteractorHandle {
                    name: "terminal".into(),
                    prompt: terminal.clone().recipient(),
                    unprompt: terminal.recipient(),
                }],
                None,
                bus,
            )
            .start();
            let (tx1, rx1) = tokio::sync::oneshot::channel();
            let (tx2, rx2) = tokio::sync::oneshot::channel();
            hub.do_send(Raise {
                request: request("first"),
                args_json: "{}".into(),
                reply: tx1,
            });
            hub.do_send(Raise {
                request: request("second"),
                args_json: "{}".into(),
                reply: tx2,
            });
            // The first prompt is on screen when its stage goes away.
            asked_rx.recv().await.unwrap();
            hub.do_send(WithdrawOwner {
                stage_execution_id: "first".into(),
            });
            let first = rx1.await.unwrap();
            // ...and the person has been told so.
            asked_rx.recv().await.unwrap();
            // The person answers the withdrawn prompt (`a`: and every
            // proposal like it — which it was not, so no rule is left and
            // the next, alike, is asked), then the next one.
            open.send(Answer::ApproveSame).unwrap();
            open.send(Answer::Approve).unwrap();
            let second = rx2.await.unwrap();
            (first, second)
        }
    });
    assert!(matches!(decisions.0, GrantDecision::Denied { .. }));
    assert_eq!(
        decisions.1,
        GrantDecision::Approved {
            by: "terminal".into()
        }
    );
    let shown = shown.lock().unwrap().clone();
    assert_eq!(
        shown,
        [
            "ask first waiting=0",
            "withdrawn first",
            "ask second waiting=0"
        ]
    );
    bus.close();
    let outcomes: Vec<(String, String)> = audit
        .iter()
        .filter_map(|d| match d {
            Delivery::Event(env) => {
                let e = env.event.to_json(env.seq);
                (e["event"] == "InteractionAnswered").then(|| {
                    (
                        e["stageId"].as_str().unwrap().to_owned(),
                        e["outcome"].as_str().unwrap().to_owned(),
                    )
                })
            }
            Delivery::Lagged { .. } => None,
        })
        .collect();
    assert_eq!(
        outcomes,
        [
            ("first".to_owned(), "withdrawn".to_owned()),
            ("first".to_owned(), "late".to_owned()),
            ("second".to_owned(), "answered".to_owned()),
        ]
    );
}

/// A person answers once with `approve-same` (or `approve-prefix`): the
/// terminal interactor then answers every matching proposal of the run
/// itself. Forty siblings propose the same out-of-envelope call; the person
/// is asked once, every call still gets its own one-shot grant, and the
/// thirty-nine answered by the rule are audited with it.
#[test]
fn one_remembered_answer_approves_every_matching_proposal_of_the_run() {
    use troupe::runtime::interaction::{Answer, PromptView, Prompter};

    struct Once {
        answer: Answer,
        asked: Mutex<Vec<String>>,
    }
    impl Prompter for Once {
        fn ask(&self, view: &PromptView) -> Option<Answer> {
            let mut asked = self.asked.lock().unwrap();
            // The first plain prompt remembers; any other is denied, so a
            // rule that failed to match would show up as a denial.
            let first = !asked.iter().any(|a: &String| !a.contains(';'));
            asked.push(view.args_summary.clone());
            Some(if first && !view.args_summary.contains(';') {
                self.answer
            } else {
                Answer::Deny
            })
        }
        fn withdrawn(&self, _view: &PromptView) {}
    }

    let width = 40;
    let worker = stage("w").replace("allowedTools: [Read]", "allowedTools: []");
    let plan = "---\nid: plan\nname: Plan\nallowedTools: []\ncompletionTool: items\ncompletionSchema:\n  type: object\n  properties: { items: { type: array } }\nretryPolicy:\n  maxAttempts: 1\n  backoff: none\nturnCap: 2\nresolutionPolicy: fail\n---\nPlan.\n";
    let cases = [
        (
            Answer::ApproveSame,
            "    - { tool: Echo, args: { text: same } }\n",
            "",
            "approve-same: Echo with arguments",
            (1, width),
        ),
        (
            // Siblings run `ls <n>`: one prefix rule approves them all, but
            // not sibling 7, which chains a second command: it is asked
            // (and denied).
            Answer::ApprovePrefix,
            "    - { tool: Bash, args: { command: \"ls {{ctx.item}}\" } }\n",
            "  \"w#7\":\n    - { tool: Bash, args: { command: \"ls 7; echo chained\" } }\n    - complete: { n: 1 }\n",
            "approve-prefix: Bash `ls`",
            (2, width - 1),
        ),
    ];
    for (answer, call, extra, rule, (asked, approved)) in cases {
        let script = format!(
            "stages:\n  plan:\n    - complete: {{ items: {{ $range: {width} }} }}\n  w:\n{call}    - complete: {{ n: 1 }}\n{extra}"
        );
        let f = Fixture::new(
            "id: p\nentry: plan\nstages:\n  plan: plan.md\n  w: w.md\nnext:\n  plan: { parallel: { map: w, over: \"ctx.upstream[0].parsed.items\" } }\n  w: end\n",
            &[
                ("plan.md", plan),
                ("w.md", &worker),
                ("script.yaml", &script),
            ],
        );
        let prompter = Arc::new(Once {
            answer,
            asked: Mutex::new(Vec::new()),
        });
        let root = tempfile::tempdir().unwrap();
        let out = run(
            f.path(),
            Opts {
                interactors: vec![InteractorSpec::Terminal(prompter.clone())],
                cap: Some(8),
                real_time: true,
                root: Some(root.path().to_owned()),
                ..Opts::default()
            },
        );
        assert_eq!(out.report.status, RunStatus::Ok, "{answer:?}");
        assert_eq!(prompter.asked.lock().unwrap().len(), asked, "{answer:?}");
        let approved_calls: Vec<&Value> = out
            .named("ToolCallApproved")
            .into_iter()
            .filter(|e| e["stageId"] == "w")
            .collect();
        assert_eq!(approved_calls.len(), approved, "{answer:?}");
        // Each call consumed a grant of its own.
        assert_eq!(out.named("StageGranted").len(), approved, "{answer:?}");
        let by_rule: Vec<&Value> = out
            .named("InteractionAnswered")
            .into_iter()
            .filter(|e| e["rule"].as_str().is_some_and(|r| r.starts_with(rule)))
            .collect();
        assert_eq!(by_rule.len(), approved - 1, "{answer:?}");
    }
}

/// An answers file beside `--yolo` (or a person) answers what its rules
/// match and leaves the rest to them: before, its "no rule matches,
/// deny" came at once, raced `--yolo`, and shadowed every person.
#[test]
fn an_answers_file_leaves_what_no_rule_matches_to_the_others() {
    let f = one_stage(
        "stages:\n  s:\n    - { tool: Echo, args: { text: alpha } }\n    - complete: { n: 1 }\n",
    );
    let file = f.path().join("answers.yaml");
    std::fs::write(&file, "answers:\n  - { tool: Bash, answer: deny }\n").unwrap();
    let runs = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(f.path())
        .arg("--answers")
        .arg(&file)
        .args(["--yolo", "--headless", "--runs-dir"])
        .arg(runs.path().join("runs"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let answered: Vec<Value> = common::audit(runs.path())
        .into_iter()
        .filter(|e| e["event"] == "InteractionAnswered")
        .collect();
    assert_eq!(answered.len(), 1, "{answered:?}");
    assert_eq!(answered[0]["answer"], "approve", "{answered:?}");
}
