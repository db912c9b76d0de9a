//! The capability check at run start: before any stage runs, make
//! sure the endpoint answers and the model can call tools, so a wrong URL,
//! key or model fails in a second with a message that says what to do —
//! not halfway through a fan-out.
//!
//! 1. Without `--model`, `GET <base>/models`: the one model a local server
//!    lists is used; several or none ask for `--model`.
//! 2. One small, non-streamed chat completion offering a single tool,
//!    `troupe_probe`, with `tool_choice: "required"`. A server that cannot
//!    force a tool choice answers that with an error status (llama-cpp-
//!    python's function-calling handler: HTTP 500; older vLLM: 400): the
//!    probe is then sent again with `tool_choice: "auto"` and an instruction
//!    to call the tool, and the report says so. A reply with a tool call
//!    passes; plain text, or a server that refuses tools, is
//!    `ProviderCapability/ToolCallingRequired`.
//!
//! Rate limits and server errors are retried like model requests; a refused
//! connection or a timeout is reported at once.

use std::time::Duration;

use serde::Serialize;
use serde_json::{Value, json};

use super::client::OpenAiProvider;
use super::errors::{redact_str, shorten};
use super::wire::Assembly;
use crate::definition::Backoff;
use crate::error::{Code, ErrorClass, HasCode};
use crate::provider::ProviderError;

/// The one tool the probe offers.
pub const PROBE_TOOL: &str = "troupe_probe";

/// Longest `Retry-After` the check honours.
const MAX_CHECK_WAIT: Duration = Duration::from_secs(30);

/// Why the provider cannot run this pipeline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct CheckError {
    /// `EndpointUnreachable`, `EndpointUnavailable`, `AuthenticationFailed`,
    /// `EndpointNotFound`, `ModelRequired`, `ToolCallingRequired`,
    /// `ProbeRejected`.
    pub code: &'static str,
    pub message: String,
    /// What to do about it.
    pub hint: String,
}

impl HasCode for CheckError {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::ProviderCapability,
            name: self.code,
        }
    }
}

/// What the check found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckReport {
    pub model: String,
    /// The model was picked from the server's list (no `--model`).
    pub model_from_list: bool,
    /// The `tool_choice` the passing probe used: `required`, or `auto`
    /// when the server cannot force a tool call.
    pub tool_choice: &'static str,
    /// Why `required` was given up, when it was (the server's answer).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forced_choice_refused: Option<String>,
}

const SERVER_HINT: &str = "tool calling must be on: llama.cpp `llama-server --jinja`, vLLM `--enable-auto-tool-choice --tool-call-parser <parser>`, Ollama a model with tool support (e.g. qwen2.5, llama3.1); or use --provider scripted";

impl OpenAiProvider {
    /// Runs the check; on success the provider knows its model. `retries`
    /// and `backoff` bound the retries of transient failures.
    pub async fn check(&self, retries: u32, backoff: &Backoff) -> Result<CheckReport, CheckError> {
        let result = self.check_inner(retries, backoff).await;
        let key = self.inner.config.api_key.as_ref().map(|k| k.expose());
        result.map_err(|mut e| {
            e.message = redact_str(e.message, key);
            e
        })
    }

    async fn check_inner(
        &self,
        retries: u32,
        backoff: &Backoff,
    ) -> Result<CheckReport, CheckError> {
        let (model, model_from_list) = match self.model() {
            Some(m) => (m.to_owned(), false),
            None => (self.pick_model(retries, backoff).await?, true),
        };
        let mut forced = true;
        let mut refused = None;
        let response = loop {
            let probe = probe_body(&model, forced);
            // A forced probe that a server refuses with an error status is
            // not retried as a blip: the same request fails the same way.
            // Read inside the retried attempt: an error a server reports
            // inside a 200 (an overload, a refused tool choice) is retried
            // and falls back to `auto` as one in the status does.
            let attempt = with_retries(retries, backoff, !forced, || async {
                let response = self.inner.post(&self.inner.chat_url, &probe).await?;
                let body = self.inner.read_all(response, 1024 * 1024, false).await?;
                Assembly::from_completion(&body).and_then(Assembly::into_response)
            })
            .await;
            match attempt {
                Ok(response) => break response,
                Err(e) if forced && refuses_forced_choice(&e) => {
                    refused = Some(self.inner.redact(e).to_string());
                    forced = false;
                }
                Err(e) => return Err(self.capability(e, &model)),
            }
        };
        if response.tool_calls.is_empty() {
            let said = response
                .text
                .as_deref()
                .map(|t| {
                    format!(
                        " (it said: {})",
                        shorten(&t.chars().take(200).collect::<String>())
                    )
                })
                .unwrap_or_default();
            return Err(CheckError {
                code: "ToolCallingRequired",
                message: format!(
                    "model `{model}` at {} answered the probe without calling the tool `{PROBE_TOOL}`{said}",
                    self.config().base_url
                ),
                hint: format!("troupe needs a model that calls tools; {SERVER_HINT}"),
            });
        }
        let _ = self.inner.model.set(model.clone());
        Ok(CheckReport {
            model,
            model_from_list,
            tool_choice: if forced { "required" } else { "auto" },
            forced_choice_refused: refused,
        })
    }

    /// The one model the server lists.
    async fn pick_model(&self, retries: u32, backoff: &Backoff) -> Result<String, CheckError> {
        let url = self.config().endpoint("models");
        let listed = with_retries(retries, backoff, true, || async {
            let response = self.inner.get(&url).await?;
            self.inner.read_all(response, 4 * 1024 * 1024, false).await
        })
        .await;
        let body = match listed {
            Ok(body) => body,
            // No model list at all reads as an empty one.
            Err(ProviderError::Terminal {
                code: "NotFound", ..
            }) => Vec::new(),
            Err(e) => return Err(self.capability(e, "(none given)")),
        };
        let ids: Vec<String> = serde_json::from_slice::<Value>(&body)
            .ok()
            .and_then(|v| v.get("data").and_then(Value::as_array).cloned())
            .unwrap_or_default()
            .iter()
            .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_owned))
            .collect();
        match ids.as_slice() {
            [one] => Ok(one.clone()),
            [] => Err(CheckError {
                code: "ModelRequired",
                message: format!("{url} lists no models, and no model was named"),
                hint: "pass --model NAME (or `model:` in the pipeline's provider block)".to_owned(),
            }),
            many => {
                let shown: Vec<&str> = many.iter().take(10).map(String::as_str).collect();
                let more = if many.len() > 10 {
                    format!(", … ({} in all)", many.len())
                } else {
                    String::new()
                };
                Err(CheckError {
                    code: "ModelRequired",
                    message: format!(
                        "the server offers several models and none was named: {}{more}",
                        shown.join(", ")
                    ),
                    hint: "pass --model NAME".to_owned(),
                })
            }
        }
    }

    /// A failed probe request as a capability error.
    fn capability(&self, err: ProviderError, model: &str) -> CheckError {
        let base = &self.config().base_url;
        let mentions_tools = |m: &str| {
            let m = m.to_ascii_lowercase();
            m.contains("tool") || m.contains("function")
        };
        match err {
            ProviderError::Transient {
                code: "ConnectionFailed" | "Timeout",
                message,
                ..
            } => CheckError {
                code: "EndpointUnreachable",
                message: format!("cannot reach {base}: {message}"),
                hint: "is the server running? check --base-url; e.g. `llama-server -m model.gguf --jinja --port 8080` then --base-url http://127.0.0.1:8080/v1".to_owned(),
            },
            ProviderError::Transient { message, .. }
            | ProviderError::Terminal { message, .. }
            | ProviderError::Capability { message, .. }
                if mentions_tools(&message) =>
            {
                CheckError {
                    code: "ToolCallingRequired",
                    message: format!(
                        "model `{model}` at {base} cannot call tools: {message}"
                    ),
                    hint: SERVER_HINT.to_owned(),
                }
            }
            ProviderError::Transient {
                code: "MalformedResponse" | "EmptyChoices",
                message,
                ..
            } => CheckError {
                code: "ProbeRejected",
                message: format!("{base} did not answer like an OpenAI-compatible server: {message}"),
                hint: "--base-url must be the API root that has /chat/completions (usually ending in /v1)".to_owned(),
            },
            ProviderError::Transient { message, .. } => CheckError {
                code: "EndpointUnavailable",
                message: format!("{base} keeps failing: {message}"),
                hint: "try again later, or lower --max-inflight if the server is rate limiting"
                    .to_owned(),
            },
            ProviderError::Terminal {
                code: "Unauthorized",
                message,
            } => CheckError {
                code: "AuthenticationFailed",
                message: format!("{base} refused the request: {message}"),
                hint: format!(
                    "put the key in ${} (or name another variable with --api-key-env)",
                    self.config().api_key_env
                ),
            },
            ProviderError::Terminal {
                code: "NotFound",
                message,
            } => CheckError {
                code: "EndpointNotFound",
                message: format!("model `{model}` at {base}: {message}"),
                hint: "--base-url must be the API root that has /chat/completions (usually ending in /v1), and --model a model the server has".to_owned(),
            },
            ProviderError::Terminal { message, .. } | ProviderError::Capability { message, .. } => {
                CheckError {
                    code: "ProbeRejected",
                    message: format!("model `{model}` at {base} rejected the probe: {message}"),
                    hint: "check --model and the server's logs; --skip-check skips this check"
                        .to_owned(),
                }
            }
        }
    }
}

/// Whether a failed forced probe means "this server cannot force a tool
/// choice" rather than "this server is broken": any error status other
/// than a key, quota, rate-limit, missing-model or context problem.
fn refuses_forced_choice(e: &ProviderError) -> bool {
    match e {
        ProviderError::Transient { code, .. } => *code == "ServerError",
        ProviderError::Terminal { code, .. } => !matches!(
            *code,
            "Unauthorized" | "NotFound" | "QuotaExceeded" | "ContextLengthExceeded"
        ),
        ProviderError::Capability { .. } => true,
    }
}

/// The probe request: `tool_choice: "required"` when `forced`, else
/// `"auto"` with a firmer instruction.
fn probe_body(model: &str, forced: bool) -> Value {
    let system = if forced {
        "You are checking that tool calls work."
    } else {
        "You are checking that tool calls work. You must answer by calling the function you are given; never answer with text."
    };
    let mut body = json!({
        "model": model,
        "messages": [
            {"role": "system", "content": system},
            {"role": "user", "content": format!("Call the function `{PROBE_TOOL}` now, with no arguments. Do not answer with text.")}
        ],
        "tools": [{
            "type": "function",
            "function": {
                "name": PROBE_TOOL,
                "description": "Confirms that tool calling works. Call it with no arguments.",
                "parameters": {"type": "object", "properties": {}}
            }
        }],
        "stream": false
    });
    body["tool_choice"] = json!(if forced { "required" } else { "auto" });
    body
}

/// Runs `attempt`, retrying transient errors with `backoff` (at least the
/// server's `Retry-After`, at most `MAX_CHECK_WAIT`); server errors (5xx)
/// only when `server_errors`.
async fn with_retries<T, F, Fut>(
    retries: u32,
    backoff: &Backoff,
    server_errors: bool,
    mut attempt: F,
) -> Result<T, ProviderError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ProviderError>>,
{
    let mut retry = 0;
    loop {
        match attempt().await {
            // A refused connection or a timeout at start is far more often a
            // wrong URL or a stopped server than a blip: report it at once.
            Err(ProviderError::Transient {
                code, retry_after, ..
            }) if retry < retries
                && !matches!(code, "ConnectionFailed" | "Timeout")
                && (server_errors || code != "ServerError")
                && retry_after.is_none_or(|a| a <= MAX_CHECK_WAIT) =>
            {
                retry += 1;
                let wait = backoff.delay(retry).max(retry_after.unwrap_or_default());
                if !wait.is_zero() {
                    tokio::time::sleep(wait).await;
                }
            }
            other => return other,
        }
    }
}
