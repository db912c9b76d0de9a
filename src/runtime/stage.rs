//! One stage execution (SPEC §3): Setup → Init → CheckGate → Act → Assert →
//! Exit → Next, with pre/post events for every phase. Act is the message
//! loop with the completion-channel batch rules; Assert decides ok / retry /
//! fail; retries re-enter Act in the same transcript after the backoff.
//!
//! This is plain async code driven by the stage-execution actor
//! (`stage_actor`), which owns it and drops it on strict cancellation.

use std::cell::RefCell;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, Addr};
use futures::StreamExt;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use troupe_actors::EventBus;

use super::context::StageContext;
use super::events::{Event, EventName};
use super::extract::extract_json;
use super::hooks::{HookError, HookSet, SlotOutcome};
use super::interaction::{
    Decision as Grant, GrantLedger, GrantRequest, InteractionHub, Raise, args_digest, args_summary,
};
use super::limits::Budget;
use super::observer::BusObserver;
use super::result::{StageResult, Verdict};
use super::tool_call::{RunTool, ToolCallActor, ToolOutcome};
use super::transcript::Transcript;
use crate::definition::{
    Backoff, GateOutcome, Pipeline, ResolutionPolicy, Stage, StageDefinition, StageKind,
};
use crate::error::{Code, ErrorClass, HasCode, ValidationCode};
use crate::provider::{Message, ModelRequest, Provider, ProviderError, ToolCall, Usage};
use crate::tools::ModelError;

/// Knobs shared by every execution of a run.
///
/// Transient provider errors are retried here and only here: providers make
/// one HTTP request per `complete` call, so retries never multiply across
/// layers, and every try is audited (`ProviderRequestStarted` with `try`,
/// `ProviderRequestFailed` with `retrying` and `waitMs`).
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Retries of a transient provider error before the stage fails.
    pub provider_retries: u32,
    pub provider_backoff: Backoff,
    /// Spread each backoff wait randomly over 50–100 % of its length, so a
    /// wide fan-out that hits a rate limit does not retry in lockstep.
    pub provider_jitter: bool,
    /// The longest wait honoured between tries: a `Retry-After` beyond it
    /// is not retried (the stage fails with the server's answer).
    pub provider_max_wait: Duration,
    /// Tool calls of one response run concurrently, at most this many.
    pub tool_concurrency: usize,
    /// The project root every tool call is confined to (`--root`).
    pub root: PathBuf,
    /// The longest an LLM stage execution may take, all attempts, model
    /// requests and tool calls included (`--stage-timeout`); past it the
    /// stage fails with `Session/StageTimeout`.
    pub stage_timeout: Option<Duration>,
    /// Arbiters (threads) the run's stage executions spread over; 1 runs
    /// them on the session's (`--threads`).
    pub threads: usize,
    /// The run's token and cost meter (`--max-tokens`, `--max-cost`).
    pub budget: Option<Arc<Budget>>,
    /// Where executions' ends are made durable (the run store); `None`
    /// keeps them in memory and the audit log only.
    pub ledger: Option<Arc<dyn super::ledger::Ledger>>,
    /// What `Bash` calls run under (`troupe run`: a scrubbed environment
    /// and Landlock, unless `--no-sandbox`); `None` runs them with
    /// troupe's whole environment, writes unconfined.
    pub sandbox: Option<Arc<crate::tools::sandbox::ShellSandbox>>,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            provider_retries: 3,
            provider_backoff: Backoff::Exponential {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
            },
            provider_jitter: true,
            provider_max_wait: Duration::from_secs(60),
            tool_concurrency: 4,
            root: PathBuf::from("."),
            stage_timeout: None,
            threads: 1,
            budget: None,
            ledger: None,
            sandbox: None,
        }
    }
}

impl RunSettings {
    /// The wait before retry number `retry` of a transient error: the
    /// backoff (with jitter), but never less than the server's `Retry-After`.
    /// `None` when the server asks for more than `provider_max_wait`.
    pub fn retry_wait(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        let mut wait = self.provider_backoff.delay(retry);
        if self.provider_jitter {
            wait = jitter(wait);
        }
        match retry_after {
            Some(after) if after > self.provider_max_wait => None,
            Some(after) => Some(wait.max(after)),
            None => Some(wait),
        }
    }
}

/// `d` scaled by a random factor in [0.5, 1.0] ("equal jitter"). The
/// randomness comes from std's per-process random hasher keys, which are
/// re-keyed for every `RandomState`: good enough to de-synchronize retries.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.5 + unit / 2.0)
}

/// Everything one execution needs; cheap to clone.
#[derive(Debug, Clone)]
pub struct StageRun {
    pub pipeline: Arc<Pipeline>,
    pub stage: Arc<Stage>,
    pub ctx: Arc<StageContext>,
    pub provider: Arc<dyn Provider>,
    pub bus: EventBus<Event>,
    pub settings: Arc<RunSettings>,
    pub index: Option<usize>,
    pub visit: u32,
    /// Cancelled when the execution is strictly cancelled; tool calls watch it.
    pub cancel: CancellationToken,
    /// Where out-of-envelope calls are put to the interactors; `None`
    /// denies them (headless).
    pub hub: Option<Arc<Addr<InteractionHub>>>,
    /// Hooks at the message-loop slots.
    pub hooks: Arc<HookSet>,
    /// The stage's tool manifest (`allowedTools` plus the completion
    /// channel), built once per stage and shared by its executions; empty
    /// for deterministic steps.
    pub tools: Arc<Vec<crate::definition::ToolSpec>>,
}

/// Where the execution is, for the `StageCancelled` record.
#[derive(Debug, Clone, Default)]
pub struct Progress {
    pub phase: &'static str,
    pub attempt: u32,
    pub turn: u32,
    pub tool_calls: Vec<(Arc<str>, Arc<str>)>,
    /// One-shot grant tokens of this execution; they die with it. Made on
    /// the first call outside `allowedTools`: most executions never have one.
    pub grants: Option<Rc<RefCell<GrantLedger>>>,
    /// Whether this execution ever put a call to the interactors, so a
    /// cancelled one that never did has no prompts to withdraw.
    pub raised: bool,
    /// What its model requests used so far (a cancelled execution reports
    /// it, so the run's totals include it).
    pub usage: Usage,
}

/// The fields of a StageResult, assembled before Exit.
struct Ended {
    verdict: Verdict,
    reason: Option<String>,
    parsed: Value,
    output: Option<Value>,
    cap_hit: bool,
    attempts: u32,
    usage: Usage,
}

impl Ended {
    /// An execution that ended before Act produced anything.
    fn early(verdict: Verdict, reason: String) -> Ended {
        Ended {
            verdict,
            reason: Some(reason),
            parsed: Value::Null,
            output: None,
            cap_hit: false,
            attempts: 0,
            usage: Usage::default(),
        }
    }
}

/// How Act ended.
enum ActEnd {
    Completed(Value),
    CapHit,
    Failed(Code, String),
}

/// How Assert decided.
enum Decision {
    Ok,
    Retry(String),
    Fail(String),
}

impl StageRun {
    fn event(&self, name: EventName) -> Event {
        Event::new(name, Arc::clone(&self.ctx.workflow_run_id)).stage(
            Arc::clone(&self.ctx.stage_id),
            Arc::clone(&self.ctx.stage_execution_id),
        )
    }

    fn emit(&self, event: Event) {
        self.bus.publish(event);
    }

    /// Marks a phase boundary: the phase is remembered for `StageCancelled`,
    /// and a `StagePreFired`/`StagePostFired` observer event is published
    /// when anyone observes (they are not audit events; see `EventName::class`).
    fn phase(&self, progress: &Rc<RefCell<Progress>>, phase: &'static str, pre: bool) {
        if pre {
            progress.borrow_mut().phase = phase;
        }
        if !self.bus.has_observers() {
            return;
        }
        let name = if pre {
            EventName::StagePreFired
        } else {
            EventName::StagePostFired
        };
        self.emit(self.event(name).with_static("phase", phase));
    }

    /// Runs the hooks of `slot` on `payload` (the common fields are added
    /// here) and audits every hook run. Without hooks at the slot it costs
    /// nothing and returns the payload as it was.
    async fn hook(&self, slot: &str, tool: Option<&str>, fields: Value) -> SlotOutcome {
        if !self.hooks.has(slot, tool) {
            return SlotOutcome::Proceed(fields);
        }
        let mut payload = serde_json::Map::new();
        payload.insert("slot".into(), Value::from(slot));
        payload.insert(
            "workflowRunId".into(),
            Value::from(&*self.ctx.workflow_run_id),
        );
        payload.insert("stageId".into(), Value::from(self.stage.id.as_str()));
        payload.insert(
            "stageExecutionId".into(),
            Value::from(&*self.ctx.stage_execution_id),
        );
        if let Value::Object(extra) = fields {
            payload.extend(extra);
        }
        let mut log = Vec::new();
        let outcome = self
            .hooks
            .run(slot, tool, Value::Object(payload), &mut log)
            .await;
        for run in log {
            let mut ev = self
                .event(EventName::HookInvoked)
                .with("slot", slot)
                .with("hook", run.hook.as_str())
                .with("kind", run.kind.as_str())
                .with("outcome", run.outcome);
            if let Some(t) = tool {
                ev = ev.tool(t);
            }
            if let Some(e) = run.error {
                ev = ev.with("code", HookError::CODE).with("error", e);
            }
            self.emit(ev);
        }
        outcome
    }

    /// A slot of the model loop where a guard deny or a failed transform
    /// ends Act; transforms may only rewrite `field` (if any).
    /// The payload is built only when a hook is configured at the slot;
    /// `Ok(None)` means nothing was rewritten.
    async fn loop_hook(
        &self,
        slot: &str,
        fields: impl FnOnce() -> Value,
        field: Option<&str>,
    ) -> Result<Option<Value>, (Code, String)> {
        if !self.hooks.has(slot, None) {
            return Ok(None);
        }
        // Boxed: only a slot with hooks gets here, and the hook machinery
        // inline made every slot's future (7+ awaits a turn) 664 bytes
        // to build and move; boxed, 88.
        match Box::pin(self.hook(slot, None, fields())).await {
            SlotOutcome::Proceed(v) => Ok(field.and_then(|f| v.get(f).cloned())),
            SlotOutcome::Denied { hook, reason } => Err((
                Code {
                    class: ErrorClass::ExtensionHost,
                    name: "HookDenied",
                },
                format!("guard hook `{hook}` at {slot} denied: {reason}"),
            )),
            SlotOutcome::Failed { error, .. } => Err((
                Code {
                    class: ErrorClass::ExtensionHost,
                    name: "HookFailed",
                },
                error.to_string(),
            )),
        }
    }

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
    pub async fn execute(self, progress: Rc<RefCell<Progress>>) -> Arc<StageResult> {
        let Ended {
            verdict,
            reason,
            parsed,
            output,
            cap_hit,
            attempts,
            usage,
        } = match &self.stage.kind {
            StageKind::Llm(def) => match self.settings.stage_timeout {
                None => self.run_llm(def, &progress).await,
                Some(limit) => {
                    match tokio::time::timeout(limit, self.run_llm(def, &progress)).await {
                        Ok(ended) => ended,
                        Err(_) => {
                            // Whatever was in flight is dropped; its tools are
                            // cancelled (child processes killed).
                            self.cancel.cancel();
                            let mut ended = Ended::early(
                                Verdict::Fail,
                                format!(
                                    "Session/StageTimeout: the stage took longer than {limit:?} (--stage-timeout)"
                                ),
                            );
                            ended.attempts = progress.borrow().attempt;
                            ended
                        }
                    }
                }
            },
            _ => self.run_step(&progress).await,
        };
        self.phase(&progress, "Exit", true);
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
    fn init_failed(&self, code: Code, message: String) -> Ended {
        self.emit(
            self.event(EventName::StageInitFailed)
                .with("code", code.to_string())
                .with("message", message.as_str()),
        );
        Ended::early(Verdict::Fail, format!("{code}: {message}"))
    }
    async fn run_llm(&self, def: &Arc<StageDefinition>, progress: &Rc<RefCell<Progress>>) -> Ended {
        // Setup: tools were resolved at load; check each upstream element.
        self.phase(progress, "Setup", true);
        if let Some(schema) = &def.inputs_schema {
            for (i, up) in self.ctx.upstream.iter().enumerate() {
                if let Err(errors) = schema.check(&up.to_json()) {
                    self.phase(progress, "Setup", false);
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
        self.phase(progress, "Setup", false);

        // Init: render once; fresh transcript; manifest with the completion channel.
        self.phase(progress, "Init", true);
        let ctx = Arc::clone(&self.ctx);
        let prompt = match def.body.render_with(|p| ctx.resolve(p)) {
            Ok(p) => p,
            Err(e) => {
                self.phase(progress, "Init", false);
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
                    self.phase(progress, "Init", false);
                    return self.init_failed(code, message);
                }
            }
        }
        let mut transcript = Transcript::new(prompt);
        transcript.push(Message::User {
            content: format!(
                "Begin the stage `{}`. Call `{}` when you are done.",
                def.name, def.completion_tool
            ),
        });
        let tools = Arc::clone(&self.tools);
        self.phase(progress, "Init", false);

        // CheckGate.
        let policy = GatePolicy {
            resolution: def.resolution_policy,
            max_checks: def.retry_policy.max_attempts,
            backoff: def.retry_policy.backoff,
        };
        match self.check_gate(policy, progress).await {
            GateEnd::Proceed => {}
            GateEnd::Skip(reason) => {
                return Ended::early(Verdict::Skipped, reason);
            }
            GateEnd::Fail(reason) => {
                return Ended::early(Verdict::Fail, reason);
            }
        }

        // Act / Assert, with retries in the same transcript.
        let mut usage = Usage::default();
        let mut attempt = 1u32;
        loop {
            progress.borrow_mut().attempt = attempt;
            self.phase(progress, "Act", true);
            let end = self
                .act(def, &tools, &mut transcript, &mut usage, progress)
                .await;
            self.phase(progress, "Act", false);

            self.phase(progress, "Assert", true);
            let (decision, parsed, cap_hit) = match end {
                ActEnd::Completed(parsed) => (self.assert_payload(&parsed, attempt), parsed, false),
                ActEnd::CapHit => (
                    Decision::Retry(format!(
                        "turnCap {} reached without a valid `{}` call",
                        def.turn_cap, def.completion_tool
                    )),
                    Value::Null,
                    true,
                ),
                ActEnd::Failed(code, message) => (
                    Decision::Fail(format!("{code}: {message}")),
                    Value::Null,
                    false,
                ),
            };
            let decision = match decision {
                Decision::Retry(reason) if attempt >= def.retry_policy.max_attempts => {
                    Decision::Fail(format!("RetryExhausted: {reason}"))
                }
                other => other,
            };
            let (verdict, reason) = match &decision {
                Decision::Ok => ("ok", None),
                Decision::Retry(r) => ("retry", Some(r.clone())),
                Decision::Fail(r) => ("fail", Some(r.clone())),
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
            self.phase(progress, "Assert", false);
            match decision {
                Decision::Ok => {
                    return Ended {
                        verdict: Verdict::Ok,
                        reason: None,
                        parsed,
                        output: None,
                        cap_hit,
                        attempts: attempt,
                        usage,
                    };
                }
                Decision::Fail(reason) => {
                    return Ended {
                        verdict: Verdict::Fail,
                        reason: Some(reason),
                        parsed,
                        output: None,
                        cap_hit,
                        attempts: attempt,
                        usage,
                    };
                }
                Decision::Retry(reason) => {
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

    fn assert_payload(&self, parsed: &Value, attempt: u32) -> Decision {
        let Some(exprs) = self.pipeline.asserts.get(&self.stage.id) else {
            return Decision::Ok;
        };
        for expr in exprs {
            let ctx = self.ctx.to_expr_value(expr.source());
            let vars = [
                ("ctx", &ctx),
                ("parsed", parsed),
                ("capHit", &Value::Bool(false)),
                ("attempt", &Value::from(attempt)),
            ];
            match expr.eval_bool(&vars) {
                Ok(true) => {}
                Ok(false) => {
                    return Decision::Retry(format!("assert `{}` is false", expr.source()));
                }
                Err(e) => {
                    return Decision::Fail(format!(
                        "{}: {e}",
                        ValidationCode::ExpressionFailed.code()
                    ));
                }
            }
        }
        Decision::Ok
    }

    /// CheckGate: evaluates `gates.<stage>` (if any) and answers a gate
    /// that does not say proceed by `policy`: re-check later, fail, skip.
    async fn check_gate(&self, policy: GatePolicy, progress: &Rc<RefCell<Progress>>) -> GateEnd {
        let Some(gate) = self.pipeline.gates.get(&self.stage.id) else {
            self.phase(progress, "CheckGate", true);
            self.emit(
                self.event(EventName::StageCheckGateResult)
                    .with_static("outcome", "proceed")
                    .with("check", 1),
            );
            self.phase(progress, "CheckGate", false);
            return GateEnd::Proceed;
        };
        let mut check = 1u32;
        loop {
            self.phase(progress, "CheckGate", true);
            let ctx = self.ctx.to_expr_value(gate.when.source());
            let outcome = match gate.when.eval_bool(&[("ctx", &ctx)]) {
                Ok(true) => Ok("proceed"),
                Ok(false) => Ok(match gate.otherwise {
                    GateOutcome::Defer => "defer",
                    GateOutcome::Block => "block",
                }),
                Err(e) => Err(format!("{}: {e}", ValidationCode::ExpressionFailed.code())),
            };
            let mut ev = self
                .event(EventName::StageCheckGateResult)
                .with("check", check)
                .with(
                    "resolutionPolicy",
                    serde_json::to_value(policy.resolution).unwrap_or(Value::Null),
                );
            ev = match &outcome {
                Ok(o) => ev.with("outcome", *o),
                Err(e) => ev.with("outcome", "error").with("reason", e.as_str()),
            };
            self.emit(ev);
            self.phase(progress, "CheckGate", false);
            let outcome = match outcome {
                Ok(o) => o,
                Err(e) => return GateEnd::Fail(e),
            };
            match (outcome, policy.resolution) {
                ("proceed", _) => return GateEnd::Proceed,
                (o, ResolutionPolicy::Skip) => return GateEnd::Skip(format!("CheckGate: {o}")),
                (o, ResolutionPolicy::Fail) => return GateEnd::Fail(format!("CheckGate: {o}")),
                ("block", ResolutionPolicy::RetryLater) => {
                    return GateEnd::Fail("CheckGate: block".to_owned());
                }
                (_, ResolutionPolicy::RetryLater) => {
                    if check >= policy.max_checks {
                        return GateEnd::Fail(format!(
                            "CheckGate: still deferred after {check} checks"
                        ));
                    }
                    let wait = policy.backoff.delay(check);
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                    check += 1;
                }
            }
        }
    }

    /// The message loop (SPEC §3.4).
    async fn act(
        &self,
        def: &StageDefinition,
        tools: &Arc<Vec<crate::definition::ToolSpec>>,
        transcript: &mut Transcript,
        usage: &mut Usage,
        progress: &Rc<RefCell<Progress>>,
    ) -> ActEnd {
        let mut turns = 0u32;
        loop {
            if turns >= def.turn_cap {
                return ActEnd::CapHit;
            }
            turns += 1;
            progress.borrow_mut().turn = turns;
            let composed = || {
                json!({
                    "turn": turns,
                    "messages": transcript.messages().len(),
                    "tools": tools.iter().map(|t| t.name.as_str()).collect::<Vec<_>>(),
                })
            };
            for slot in [
                "COMPOSE_REQUEST/pre",
                "COMPOSE_REQUEST/post",
                "SEND_REQUEST/pre",
            ] {
                if let Err((code, message)) = self.loop_hook(slot, composed, None).await {
                    return ActEnd::Failed(code, message);
                }
            }
            let request = ModelRequest {
                stage_id: Arc::clone(&self.ctx.stage_id),
                stage_execution_id: Arc::clone(&self.ctx.stage_execution_id),
                index: self.index,
                messages: transcript.shared(),
                tools: Arc::clone(tools),
                completion_tool: Arc::clone(&def.completion_tool),
                completion_schema: def.completion_schema.shared_document(),
                ctx: Arc::clone(&self.ctx) as Arc<dyn crate::provider::TemplateScope>,
                // Tokens and slot waits are observer events: skip them
                // when no one observes.
                observer: self.bus.has_observers().then(|| {
                    Arc::new(BusObserver {
                        bus: self.bus.clone(),
                        workflow_run_id: Arc::clone(&self.ctx.workflow_run_id),
                        stage_id: Arc::clone(&self.ctx.stage_id),
                        stage_execution_id: Arc::clone(&self.ctx.stage_execution_id),
                        turn: turns,
                    }) as Arc<dyn crate::provider::RequestObserver>
                }),
            };
            let mut response = match self.request(request, turns, usage, progress).await {
                Ok(r) => r,
                Err(e) => return ActEnd::Failed(e.code(), e.to_string()),
            };
            for slot in ["SEND_REQUEST/post", "STREAM_RESPONSE/pre"] {
                if let Err((code, message)) =
                    self.loop_hook(slot, || json!({"turn": turns}), None).await
                {
                    return ActEnd::Failed(code, message);
                }
            }
            let streamed = || {
                json!({
                    "turn": turns,
                    "text": response.text,
                    "toolCalls": response.tool_calls.iter().map(|c| json!({"id": c.id, "name": c.name, "arguments": c.arguments})).collect::<Vec<_>>(),
                })
            };
            match self
                .loop_hook("STREAM_RESPONSE/post", streamed, Some("text"))
                .await
            {
                Ok(Some(Value::String(text))) => response.text = Some(text),
                Ok(_) => {}
                Err((code, message)) => return ActEnd::Failed(code, message),
            }
            // The response is used up here: its calls go to the transcript,
            // and one copy stays to run them.
            let calls = std::mem::take(&mut response.tool_calls);
            transcript.push(Message::Assistant {
                content: response.text.take(),
                tool_calls: calls.clone(),
            });
            if calls.is_empty() {
                transcript.push(Message::User {
                    content: format!("Call `{}` when you are done.", def.completion_tool),
                });
                continue;
            }
            let completions = calls
                .iter()
                .filter(|c| *c.name == *def.completion_tool)
                .count();
            if completions > 0 && calls.len() > 1 {
                let err = ModelError::new(
                    Code {
                        class: ErrorClass::Validation,
                        name: "CompletionNotSole",
                    },
                    format!(
                        "`{}` must be the only tool call in its response; no call of this response was run",
                        def.completion_tool
                    ),
                );
                for c in &calls {
                    transcript.push(Message::Tool {
                        tool_call_id: c.id.clone(),
                        content: err.to_content(),
                    });
                }
                continue;
            }
            if completions == 1 {
                let call = &calls[0];
                match parse_completion(def, &call.arguments) {
                    Ok(parsed) => {
                        // Every call in a transcript is answered, this one
                        // too: a retry (Assert, a failed RENDER guard)
                        // sends the transcript again, and a strict server
                        // refuses an assistant message whose `tool_calls`
                        // are not each followed by their result.
                        transcript.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content: COMPLETION_ACCEPTED.to_owned(),
                        });
                        // RENDER: guards may refuse the result; transforms
                        // cannot change it (it passed the schema).
                        for slot in ["RENDER/pre", "RENDER/post"] {
                            if let Err((code, message)) = self
                                .loop_hook(slot, || json!({"parsed": parsed}), None)
                                .await
                            {
                                return ActEnd::Failed(code, message);
                            }
                        }
                        return ActEnd::Completed(parsed);
                    }
                    Err(err) => {
                        transcript.push(Message::Tool {
                            tool_call_id: call.id.clone(),
                            content: err.to_content(),
                        });
                        continue;
                    }
                }
            }
            let results = self.run_tools(def, &calls, progress).await;
            for (call, content) in calls.iter().zip(results) {
                transcript.push(Message::Tool {
                    tool_call_id: call.id.clone(),
                    content,
                });
            }
        }
    }

    /// One provider request with transient retries, audited. Every try
    /// counts as a request in `usage`, a failed one too; no try starts
    /// once the run's budget is spent.
    async fn request(
        &self,
        request: ModelRequest,
        turn: u32,
        usage: &mut Usage,
        progress: &Rc<RefCell<Progress>>,
    ) -> Result<crate::provider::ModelResponse, ProviderError> {
        let mut retry = 0u32;
        loop {
            if let Some(budget) = &self.settings.budget
                && !budget.allows_request()
            {
                // The scheduler is cancelling the run: no new request
                // starts, and this execution waits to be dropped.
                self.cancel.cancelled().await;
                std::future::pending::<()>().await;
            }
            self.emit(
                self.event(EventName::ProviderRequestStarted)
                    .with_static("provider", self.provider.name())
                    .with("turn", turn)
                    .with("try", retry + 1),
            );
            let outcome = self.provider.complete(request.clone()).await;
            for notice in self.provider.take_notices() {
                self.emit(
                    self.event(EventName::ProviderNotice)
                        .with_static("provider", self.provider.name())
                        .with_static("code", notice.code)
                        .with("message", notice.message),
                );
            }
            let spent = match &outcome {
                Ok(response) => response.usage,
                Err(_) => Usage {
                    requests: 1,
                    ..Usage::default()
                },
            };
            usage.add(spent);
            progress.borrow_mut().usage.add(spent);
            if let Some(budget) = &self.settings.budget {
                budget.record(spent);
            }
            match outcome {
                Ok(response) => {
                    self.emit(
                        self.event(EventName::ProviderRequestCompleted)
                            .with("turn", turn)
                            .with("toolCalls", response.tool_calls.len())
                            .with("usage", response.usage),
                    );
                    return Ok(response);
                }
                Err(err) => {
                    let wait = match &err {
                        ProviderError::Transient { retry_after, .. }
                            if retry < self.settings.provider_retries =>
                        {
                            self.settings.retry_wait(retry + 1, *retry_after)
                        }
                        _ => None,
                    };
                    let mut failed = self
                        .event(EventName::ProviderRequestFailed)
                        .with("turn", turn)
                        .with("code", err.code().to_string())
                        .with("message", err.to_string())
                        .with("retrying", wait.is_some());
                    if let ProviderError::Transient {
                        retry_after: Some(after),
                        ..
                    } = &err
                    {
                        failed = failed.with("retryAfterMs", after.as_millis() as u64);
                    }
                    if let Some(wait) = wait {
                        failed = failed.with("waitMs", wait.as_millis() as u64);
                    }
                    self.emit(failed);
                    let Some(wait) = wait else {
                        return Err(err);
                    };
                    retry += 1;
                    if !wait.is_zero() {
                        tokio::time::sleep(wait).await;
                    }
                }
            }
        }
    }

    /// Runs one response's tool calls: approvals first, one at a time in
    /// call order (so prompts reach people in order), then the approved
    /// calls concurrently (bounded); results come back in call order.
    async fn run_tools(
        &self,
        def: &StageDefinition,
        calls: &[ToolCall],
        progress: &Rc<RefCell<Progress>>,
    ) -> Vec<String> {
        progress.borrow_mut().tool_calls = calls
            .iter()
            .map(|c| (c.id.clone(), c.name.clone()))
            .collect();
        let mut approved = Vec::with_capacity(calls.len());
        for (i, call) in calls.iter().enumerate() {
            approved.push(self.approve(def, call, i, progress).await);
        }
        // One call (the common case) needs no concurrency: a bounded
        // stream builds a FuturesUnordered, boxes the call into a task of
        // its own and wakes through it, ~3% of a fan-out sibling's time.
        let results = if let [call] = calls
            && let Some(approval) = approved.pop()
        {
            vec![self.run_approved(call, approval).await]
        } else {
            futures::stream::iter(
                calls
                    .iter()
                    .zip(approved)
                    .map(|(call, approval)| self.run_approved(call, approval)),
            )
            .buffered(self.settings.tool_concurrency.max(1))
            .collect::<Vec<String>>()
            .await
        };
        progress.borrow_mut().tool_calls.clear();
        results
    }

    /// Runs an approved call; a refused one's result is already made.
    async fn run_approved(&self, call: &ToolCall, approval: Result<Value, String>) -> String {
        match approval {
            Ok(args) => self.execute_tool(call, args).await,
            Err(content) => content,
        }
    }

    fn tool_event(&self, name: EventName, call: &ToolCall) -> Event {
        self.event(name)
            .tool(Arc::clone(&call.name))
            .with("callId", Arc::clone(&call.id))
    }

    /// The authority stack for one proposed call (SPEC §5): the arguments
    /// must be a JSON object and the tool must exist; a call in
    /// `allowedTools` is approved; any other raises a `grantStageTool`
    /// interaction whose approval mints a one-shot token that this call
    /// consumes. `Err` holds the typed result the model gets instead.
    async fn approve(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        index: usize,
        progress: &Rc<RefCell<Progress>>,
    ) -> Result<Value, String> {
        let args = self.authorize(def, call, index, progress).await?;
        if !self.hooks.has("TOOL_CALL/pre", Some(&call.name)) {
            return Ok(args);
        }
        // Guard hooks run on every approved call and win in any mode;
        // transforms then may rewrite the arguments.
        let fields = json!({"tool": call.name, "callId": call.id, "arguments": args});
        let hook_failed = |message: String| {
            self.emit(
                self.tool_event(EventName::ToolInvocationFailed, call)
                    .with("code", HookError::CODE)
                    .with("message", message.as_str()),
            );
            tool_terminal("HookFailed", message)
        };
        match Box::pin(self.hook("TOOL_CALL/pre", Some(&call.name), fields)).await {
            SlotOutcome::Proceed(payload) => match payload.get("arguments") {
                Some(v @ Value::Object(_)) => Ok(v.clone()),
                _ => Err(hook_failed(
                    "a transform hook at TOOL_CALL/pre left no `arguments` object, so the call was not run".to_owned(),
                )),
            },
            SlotOutcome::Denied { hook, reason } => {
                self.emit(
                    self.tool_event(EventName::ToolCallDenied, call)
                        .with("by", format!("hook:{hook}"))
                        .with("reason", reason.as_str()),
                );
                Err(tool_terminal(
                    "HookDenied",
                    format!("guard hook `{hook}` denied this call: {reason}"),
                ))
            }
            SlotOutcome::Failed { hook, error } => Err(hook_failed(format!(
                "transform hook `{hook}` failed, so the call was not run: {error}"
            ))),
        }
    }

    /// The SM decision for one call: allowedTools, or a one-shot grant.
    async fn authorize(
        &self,
        def: &StageDefinition,
        call: &ToolCall,
        index: usize,
        progress: &Rc<RefCell<Progress>>,
    ) -> Result<Value, String> {
        self.emit(
            self.tool_event(EventName::ToolInvocationProposed, call)
                .with("arguments", call.arguments.as_str()),
        );
        let failed = |name: &'static str, message: String| {
            self.emit(
                self.tool_event(EventName::ToolInvocationFailed, call)
                    .with("code", format!("ToolTerminal/{name}")),
            );
            tool_terminal(name, message)
        };
        let args: Value = match serde_json::from_str(&call.arguments) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                return Err(failed(
                    "InvalidArguments",
                    "tool arguments must be a JSON object".to_owned(),
                ));
            }
        };
        if !crate::definition::is_builtin(&call.name) {
            return Err(failed(
                "UnknownTool",
                format!("there is no tool `{}`", call.name),
            ));
        }
        if def.allowed_tools.iter().any(|t| **t == *call.name) {
            self.emit(
                self.tool_event(EventName::ToolCallApproved, call)
                    .with_static("by", "allowedTools"),
            );
            return Ok(args);
        }
        let (attempt, turn, ledger) = {
            let mut p = progress.borrow_mut();
            (
                p.attempt,
                p.turn,
                Rc::clone(p.grants.get_or_insert_default()),
            )
        };
        let request = GrantRequest {
            workflow_run_id: self.ctx.workflow_run_id.to_string(),
            stage_execution_id: self.ctx.stage_execution_id.to_string(),
            stage_id: self.stage.id.clone(),
            attempt,
            proposal_id: format!("{}#a{attempt}t{turn}c{index}", self.ctx.stage_execution_id),
            tool: call.name.to_string(),
            args_digest: args_digest(&args),
            args_summary: args_summary(&args),
        };
        let decision = match &self.hub {
            Some(hub) => {
                let (reply, answer) = tokio::sync::oneshot::channel();
                progress.borrow_mut().raised = true;
                hub.do_send(Raise {
                    request: request.clone(),
                    args_json: args.to_string(),
                    reply,
                });
                answer.await.unwrap_or(Grant::Denied {
                    reason: "the interaction hub is gone".to_owned(),
                })
            }
            None => Grant::Denied {
                reason: "no interactor can approve it (headless)".to_owned(),
            },
        };
        let deny = |reason: String| {
            self.emit(
                self.tool_event(EventName::ToolCallDenied, call)
                    .with("proposalId", request.proposal_id.as_str())
                    .with("reason", reason.as_str()),
            );
            tool_terminal(
                "GrantDenied",
                format!(
                    "`{}` is outside this stage's allowedTools and was not granted ({reason}); continue with the allowed tools: {}",
                    call.name,
                    def.allowed_tools.join(", ")
                ),
            )
        };
        match decision {
            Grant::Denied { reason } => Err(deny(reason)),
            Grant::Approved { by } => {
                let mut ledger = ledger.borrow_mut();
                ledger.mint(&request);
                self.emit(
                    self.event(EventName::StageGranted)
                        .tool(Arc::clone(&call.name))
                        .with("proposalId", request.proposal_id.as_str())
                        .with("argsDigest", request.args_digest.as_str())
                        .with("by", by.as_str()),
                );
                match ledger.consume(&request.proposal_id, &call.name, &request.args_digest) {
                    Ok(()) => {
                        self.emit(
                            self.tool_event(EventName::ToolCallApproved, call)
                                .with("by", "grant")
                                .with("proposalId", request.proposal_id.as_str()),
                        );
                        Ok(args)
                    }
                    Err(e) => Err(deny(e.to_string())),
                }
            }
        }
    }

    /// Executes one approved call, then lets TOOL_CALL/post hooks see (and
    /// transforms rewrite) its result.
    async fn execute_tool(&self, call: &ToolCall, args: Value) -> String {
        if !self.hooks.has("TOOL_CALL/post", Some(&call.name)) {
            return self.run_tool_actor(call, args).await;
        }
        let result = self.run_tool_actor(call, args.clone()).await;
        let fields =
            json!({"tool": call.name, "callId": call.id, "arguments": args, "result": result});
        match Box::pin(self.hook("TOOL_CALL/post", Some(&call.name), fields)).await {
            SlotOutcome::Proceed(payload) => match payload.get("result") {
                Some(Value::String(r)) => r.clone(),
                _ => result,
            },
            // The call already ran: a post guard or failed transform
            // withholds its result from the model.
            SlotOutcome::Denied { hook, reason } => tool_terminal(
                "HookDenied",
                format!("guard hook `{hook}` withheld this result: {reason}"),
            ),
            SlotOutcome::Failed { hook, error } => tool_terminal(
                "HookFailed",
                format!("transform hook `{hook}` failed on this result: {error}"),
            ),
        }
    }

    /// Runs one approved call on its own tool-call actor.
    async fn run_tool_actor(&self, call: &ToolCall, args: Value) -> String {
        let ev = |name: EventName| self.tool_event(name, call);
        self.emit(ev(EventName::ToolInvocationStarted));
        let actor = ToolCallActor.start();
        let outcome = actor
            .send(RunTool {
                name: Arc::clone(&call.name),
                args,
                env: crate::tools::ToolEnv::new(self.settings.root.clone())
                    .with_sandbox(self.settings.sandbox.clone()),
                cancel: self.cancel.child_token(),
            })
            .await
            .unwrap_or(ToolOutcome::Failed(crate::tools::ToolError::Terminal {
                code: "ToolActorLost",
                message: "the tool-call actor stopped without answering".to_owned(),
            }));
        match outcome {
            ToolOutcome::Succeeded(out) => {
                self.emit(ev(EventName::ToolInvocationSucceeded).with("bytes", out.len()));
                out
            }
            ToolOutcome::Failed(err) => {
                self.emit(
                    ev(EventName::ToolInvocationFailed)
                        .with("code", err.code().to_string())
                        .with("message", err.to_string()),
                );
                ModelError::new(err.code(), err.to_string()).to_content()
            }
            ToolOutcome::Cancelled => {
                self.emit(ev(EventName::ToolInvocationCancelled));
                ModelError::new(
                    Code {
                        class: ErrorClass::Cancellation,
                        name: "ToolCancelled",
                    },
                    "the tool call was cancelled",
                )
                .to_content()
            }
        }
    }

    /// Deterministic steps: the same phases and events, no model. Their
    /// gate and asserts are evaluated as an LLM stage's are, with one
    /// attempt: a gate that does not say proceed, or a false assert,
    /// fails the step.
    async fn run_step(&self, progress: &Rc<RefCell<Progress>>) -> Ended {
        for phase in ["Setup", "Init"] {
            self.phase(progress, phase, true);
            self.phase(progress, phase, false);
        }
        progress.borrow_mut().attempt = 1;
        match self.check_gate(STEP_GATE, progress).await {
            GateEnd::Proceed => {}
            GateEnd::Skip(reason) => return Ended::early(Verdict::Skipped, reason),
            GateEnd::Fail(reason) => return Ended::early(Verdict::Fail, reason),
        }
        self.phase(progress, "Act", true);
        let ctx = &self.ctx;
        let eval = |expr: &crate::definition::expr::Expr| -> Result<Value, String> {
            let c = ctx.to_expr_value(expr.source());
            expr.eval(&[("ctx", &c)])
                .map_err(|e| format!("{}: {e}", ValidationCode::ExpressionFailed.code()))
        };
        let outcome: Result<(Value, Option<Value>), String> = match &self.stage.kind {
            StageKind::ExtractJson { from } => eval(from).and_then(|v| match v {
                Value::String(text) => extract_json(&text)
                    .map(|j| (j, None))
                    .ok_or_else(|| "extract_json: no JSON found in the text".to_owned()),
                other => Err(format!(
                    "extract_json: `from` must yield a string, got {}",
                    crate::definition::expr::json_kind(&other)
                )),
            }),
            StageKind::Print { content } => content
                .render_with(|p| ctx.resolve(p))
                .map(|text| (Value::Null, Some(json!({"text": text}))))
                .map_err(|e| format!("{}: {e}", ValidationCode::TemplateUnresolved.code())),
            StageKind::IfElse {
                condition,
                then,
                otherwise,
            } => eval(condition).and_then(|v| match v {
                Value::Bool(b) => {
                    let route = if b { then } else { otherwise };
                    Ok((json!({"condition": b}), Some(json!({"route": route}))))
                }
                other => Err(format!(
                    "if_else: condition must be a boolean, got {}",
                    crate::definition::expr::json_kind(&other)
                )),
            }),
            StageKind::Switch { on, cases, default } => eval(on).and_then(|v| {
                let key = match &v {
                    Value::String(s) => s.clone(),
                    other => other.to_string(),
                };
                let route = cases
                    .iter()
                    .find(|(value, _)| *value == key)
                    .map(|(_, t)| t)
                    .or(default.as_ref());
                match route {
                    Some(route) => Ok((json!({"value": key}), Some(json!({"route": route})))),
                    None => Err(format!("switch: no case for `{key}` and no default")),
                }
            }),
            StageKind::Llm(_) => Err("internal: an LLM stage reached the step runner".to_owned()),
        };
        self.phase(progress, "Act", false);
        self.phase(progress, "Assert", true);
        let (verdict, reason, parsed, output) = match outcome {
            Ok((parsed, output)) => match self.assert_payload(&parsed, 1) {
                Decision::Ok => (Verdict::Ok, None, parsed, output),
                // One attempt: a false assert fails the step.
                Decision::Retry(reason) | Decision::Fail(reason) => {
                    (Verdict::Fail, Some(reason), parsed, output)
                }
            },
            Err(reason) => (Verdict::Fail, Some(reason), Value::Null, None),
        };
        let mut ev = self
            .event(EventName::StageAssertOutcome)
            .with_static("verdict", verdict.as_str())
            .with("attempt", 1);
        if let Some(r) = &reason {
            ev = ev.with("reason", r.as_str());
        }
        self.emit(ev);
        self.phase(progress, "Assert", false);
        Ended {
            verdict,
            reason,
            parsed,
            output,
            cap_hit: false,
            attempts: 1,
            usage: Usage::default(),
        }
    }
}

enum GateEnd {
    Proceed,
    Skip(String),
    Fail(String),
}

/// How a stage answers a gate that does not say proceed.
#[derive(Debug, Clone, Copy)]
struct GatePolicy {
    resolution: ResolutionPolicy,
    /// Checks in all, for `retry-later`.
    max_checks: u32,
    backoff: Backoff,
}

/// Deterministic steps have no resolution or retry policy: a gate that
/// does not say proceed fails the step at once.
const STEP_GATE: GatePolicy = GatePolicy {
    resolution: ResolutionPolicy::Fail,
    max_checks: 1,
    backoff: Backoff::None,
};

/// The result of an accepted completion call, as the model reads it when
/// the attempt is retried.
pub const COMPLETION_ACCEPTED: &str =
    "accepted: the result matches the schema; the stage checks it next";

/// Parses a completion call's arguments against the completion schema.
fn parse_completion(def: &StageDefinition, arguments: &str) -> Result<Value, ModelError> {
    let code = |name| Code {
        class: ErrorClass::Validation,
        name,
    };
    let value: Value = serde_json::from_str(arguments).map_err(|e| {
        ModelError::new(
            code("CompletionNotJson"),
            format!(
                "the arguments of `{}` are not valid JSON: {e}",
                def.completion_tool
            ),
        )
    })?;
    def.completion_schema.check(&value).map_err(|errors| {
        ModelError::new(
            code("CompletionSchemaMismatch"),
            format!(
                "the arguments of `{}` do not match its schema: {}",
                def.completion_tool,
                errors.join("; ")
            ),
        )
    })?;
    Ok(value)
}

/// The `{class, code, message}` result of a `ToolTerminal/<name>` error, as
/// the model reads it.
fn tool_terminal(name: &'static str, message: impl Into<String>) -> String {
    ModelError::new(
        Code {
            class: ErrorClass::ToolTerminal,
            name,
        },
        message,
    )
    .to_content()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_waits_jitter_the_backoff_and_honour_retry_after() {
        let settings = RunSettings {
            provider_backoff: Backoff::Exponential {
                initial: Duration::from_millis(400),
                max: Duration::from_secs(10),
            },
            ..RunSettings::default()
        };
        for _ in 0..200 {
            let w = settings.retry_wait(2, None).unwrap();
            assert!(
                (Duration::from_millis(400)..=Duration::from_millis(800)).contains(&w),
                "{w:?}"
            );
        }
        let floor = settings.retry_wait(1, Some(Duration::from_secs(3)));
        assert_eq!(floor, Some(Duration::from_secs(3)));
        assert_eq!(
            settings.retry_wait(1, Some(Duration::from_secs(61))),
            None,
            "a Retry-After beyond provider_max_wait is not waited for"
        );
        let exact = RunSettings {
            provider_jitter: false,
            ..settings
        };
        assert_eq!(exact.retry_wait(3, None), Some(Duration::from_millis(1600)));
    }
}
