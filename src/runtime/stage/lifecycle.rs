//! The phases of an LLM stage execution: Setup → Init → CheckGate → Act →
//! Assert, with retries re-entering Act in the same transcript after the
//! backoff, then Exit building the StageResult (deterministic steps take
//! the same path through `steps`).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use serde_json::{Value, json};

use super::asserts::AssertOutcome;
use super::conclusion::Conclusion;
use super::gate::{GatePolicy, GateResolution};
use super::model_loop::ActOutcome;
use super::run::StageRun;
use super::whereabouts::Whereabouts;
use crate::definition::{StageDefinition, StageKind};
use crate::error::{Code, HasCode, ValidationCode};
use crate::provider::{Message, Usage};
use crate::runtime::events::EventName;
use crate::runtime::result::{StageResult, Verdict};
use crate::runtime::transcript::Transcript;

impl StageRun {
    /// Records `StageEntered`. The owner calls it at the moment it commits
    /// to running the execution, before `execute` is first polled, so an
    /// execution cancelled from then on has always been entered.
    pub fn enter(&self) {
        let mut entered = self
            .event(EventName::StageEntered)
            .with_static("kind", self.stage.kind.kind_name())
            .with("visit", self.visit);
        if let Some(i) = self.index {
            entered = entered.with("index", i);
        }
        self.emit(entered);
    }

    /// Runs the execution, after `enter`, up to Exit and builds its
    /// StageResult; Exit's record and the report are its owner's. Never
    /// panics on bad input; a cancelled execution is simply dropped by its
    /// owner.
    pub async fn execute(self, whereabouts: Rc<RefCell<Whereabouts>>) -> Arc<StageResult> {
        let Conclusion {
            verdict,
            reason,
            parsed,
            output,
            cap_hit,
            attempts,
            usage,
        } = match &self.stage.kind {
            StageKind::Llm(def) => match self.kit.settings.stage_timeout {
                None => self.run_llm(def, &whereabouts).await,
                Some(limit) => {
                    match tokio::time::timeout(limit, self.run_llm(def, &whereabouts)).await {
                        Ok(ended) => ended,
                        Err(_) => {
                            // Whatever was in flight is dropped; its tools are
                            // cancelled (child processes killed), and said so,
                            // as a cancel says it: every started call ends.
                            self.cancel.stop();
                            let requesting = whereabouts.borrow_mut().requesting.take();
                            if let Some(turn) = requesting {
                                self.emit(
                                    self.event(EventName::ProviderRequestFailed)
                                        .with("turn", turn)
                                        .with_static("code", "Session/StageTimeout")
                                        .with_static(
                                            "message",
                                            "the stage's time ran out while the model was answering",
                                        )
                                        .with("retrying", false),
                                );
                            }
                            let calls = std::mem::take(&mut whereabouts.borrow_mut().tool_calls);
                            for (id, name) in calls {
                                self.emit(
                                    super::run::tool_named(
                                        self.event(EventName::ToolInvocationCancelled),
                                        &name,
                                    )
                                    .with("callId", id),
                                );
                            }
                            let mut ended = Conclusion::early(
                                Verdict::Fail,
                                format!(
                                    "Session/StageTimeout: the stage took longer than {limit:?} (--stage-timeout)"
                                ),
                            );
                            // What the attempts used was spent all the same.
                            ended.attempts = whereabouts.borrow().attempt;
                            ended.usage = whereabouts.borrow().usage;
                            ended
                        }
                    }
                }
            },
            _ => self.run_step(&whereabouts).await,
        };
        self.phase(&whereabouts, "Exit", true);
        // `output` defaults to `parsed`: share it rather than deep-copy it
        // (a fan-out keeps every sibling's result until its join).
        let parsed = Arc::new(parsed);
        let output = output.map_or_else(|| Arc::clone(&parsed), Arc::new);
        Arc::new(StageResult {
            stage_id: self.stage.id.clone(),
            stage_execution_id: self.ctx.stage_execution_id.to_string(),
            verdict,
            reason,
            parsed,
            output,
            cap_hit,
            attempt_count: attempts,
            usage,
        })
    }

    /// A failure that ends the stage before Act: audited as StageInitFailed.
    fn init_failed(&self, code: Code, message: String) -> Conclusion {
        self.emit(
            self.event(EventName::StageInitFailed)
                .with("code", code.to_string())
                .with("message", message.as_str()),
        );
        Conclusion::early(Verdict::Fail, format!("{code}: {message}"))
    }

    async fn run_llm(
        &self,
        def: &Arc<StageDefinition>,
        whereabouts: &Rc<RefCell<Whereabouts>>,
    ) -> Conclusion {
        // Setup: tools were resolved at load; check each upstream element.
        self.phase(whereabouts, "Setup", true);
        if let Some(schema) = &def.inputs_schema {
            // One result at a time: a join's packed upstream is parsed
            // back as it is checked, never all at once.
            for (i, up) in self.ctx.upstream.iter().enumerate() {
                if let Err(errors) = schema.check(&up.to_json()) {
                    self.phase(whereabouts, "Setup", false);
                    let code = ValidationCode::StageInputsInvalid.code();
                    return self.init_failed(
                        code,
                        format!(
                            "ctx.upstream[{i}] fails inputsSchema: {}",
                            errors.join("; ")
                        ),
                    );
                }
            }
        }
        self.phase(whereabouts, "Setup", false);

        // Init: render once; fresh transcript; manifest with the completion channel.
        self.phase(whereabouts, "Init", true);
        let ctx = Arc::clone(&self.ctx);
        let prompt = match def.body.render_with(|p| ctx.resolve(p)) {
            Ok(p) => p,
            Err(e) => {
                self.phase(whereabouts, "Init", false);
                return self.init_failed(ValidationCode::TemplateUnresolved.code(), e.to_string());
            }
        };
        let mut prompt = prompt;
        for slot in ["RECEIVE_INPUT/pre", "RECEIVE_INPUT/post"] {
            match self
                .loop_hook(slot, || json!({"input": prompt}), Some("input"))
                .await
            {
                Ok(Some(Value::String(input))) => prompt = input,
                Ok(_) => {}
                Err((code, message)) => {
                    self.phase(whereabouts, "Init", false);
                    return self.init_failed(code, message);
                }
            }
        }
        let mut transcript = Transcript::new(prompt);
        // By hand, not `format!`: 600 instructions an execution less.
        let mut kickoff = String::with_capacity(48 + def.name.len() + def.completion_tool.len());
        kickoff.push_str("Begin the stage `");
        kickoff.push_str(&def.name);
        kickoff.push_str("`. Call `");
        kickoff.push_str(&def.completion_tool);
        kickoff.push_str("` when you are done.");
        transcript.push(Message::User { content: kickoff });
        let tools = Arc::clone(&self.tools);
        self.phase(whereabouts, "Init", false);

        // CheckGate.
        let policy = GatePolicy {
            resolution: def.resolution_policy,
            max_checks: def.retry_policy.max_attempts,
            backoff: def.retry_policy.backoff,
        };
        match self.check_gate(policy, whereabouts).await {
            GateResolution::Proceed => {}
            GateResolution::Skip(reason) => {
                return Conclusion::early(Verdict::Skipped, reason);
            }
            GateResolution::Fail(reason) => {
                return Conclusion::early(Verdict::Fail, reason);
            }
        }

        // Act / Assert, with retries in the same transcript.
        let mut usage = Usage::default();
        let mut attempt = 1u32;
        loop {
            whereabouts.borrow_mut().attempt = attempt;
            self.phase(whereabouts, "Act", true);
            let end = self
                .act(def, &tools, &mut transcript, &mut usage, whereabouts)
                .await;
            self.phase(whereabouts, "Act", false);

            self.phase(whereabouts, "Assert", true);
            let (decision, parsed, cap_hit) = match end {
                ActOutcome::Completed(parsed) => {
                    (self.assert_payload(&parsed, attempt), parsed, false)
                }
                ActOutcome::CapHit => (
                    AssertOutcome::Retry(format!(
                        "turnCap {} reached without a valid `{}` call",
                        def.turn_cap, def.completion_tool
                    )),
                    Value::Null,
                    true,
                ),
                ActOutcome::Failed(code, message) => (
                    AssertOutcome::Fail(format!("{code}: {message}")),
                    Value::Null,
                    false,
                ),
            };
            let decision = match decision {
                AssertOutcome::Retry(reason) if attempt >= def.retry_policy.max_attempts => {
                    AssertOutcome::Fail(format!("RetryExhausted: {reason}"))
                }
                other => other,
            };
            let (verdict, reason) = match &decision {
                AssertOutcome::Ok => ("ok", None),
                AssertOutcome::Retry(r) => ("retry", Some(r.clone())),
                AssertOutcome::Fail(r) => ("fail", Some(r.clone())),
            };
            let mut outcome = self
                .event(EventName::StageAssertOutcome)
                .with_static("verdict", verdict)
                .with("attempt", attempt)
                .with("capHit", cap_hit);
            if let Some(r) = &reason {
                outcome = outcome.with("reason", r.as_str());
            }
            self.emit(outcome);
            self.phase(whereabouts, "Assert", false);
            match decision {
                AssertOutcome::Ok => {
                    return Conclusion {
                        verdict: Verdict::Ok,
                        reason: None,
                        parsed,
                        output: None,
                        cap_hit,
                        attempts: attempt,
                        usage,
                    };
                }
                AssertOutcome::Fail(reason) => {
                    return Conclusion {
                        verdict: Verdict::Fail,
                        reason: Some(reason),
                        parsed,
                        output: None,
                        cap_hit,
                        attempts: attempt,
                        usage,
                    };
                }
                AssertOutcome::Retry(reason) => {
                    let wait = def.retry_policy.backoff.delay(attempt);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    attempt += 1;
                    transcript.push(Message::User {
                        content: format!(
                            "Retry (attempt {attempt} of {}): {reason}. Call `{}` again with a corrected result.",
                            def.retry_policy.max_attempts, def.completion_tool
                        ),
                    });
                }
            }
        }
    }
}
