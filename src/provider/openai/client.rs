//! The openai provider: one `reqwest::Client` (connection pool, HTTP/2 when
//! the server offers it over TLS ALPN) and one semaphore per provider, one
//! HTTP request per `complete` call.
//!
//! Transient failures are returned, not retried here: the stage's request
//! loop (`runtime::stage`) is the one retry layer, with backoff, jitter,
//! `Retry-After` and an audit record per try. Dropping the future of
//! `complete` (strict cancellation) drops the response and closes its
//! connection, so the server sees the client go away.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use futures::future::BoxFuture;
use futures::{FutureExt, StreamExt};
use reqwest::Url;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde::Serialize;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

use super::config::OpenAiConfig;
use super::errors::{redact, status_error, transport_error};
use super::sse::{SseDecoder, SseEvent};
use super::wire::{Assembly, request_body};
use crate::definition::duration::format_duration;
use crate::provider::{
    ModelRequest, ModelResponse, Provider, ProviderError, ProviderInfo, ProviderNotice,
    RequestObserver,
};

/// A reply body larger than this is refused.
const MAX_REPLY_BYTES: usize = 32 * 1024 * 1024;
/// Of an error reply, this much is read for its message.
const MAX_ERROR_BODY_BYTES: usize = 64 * 1024;

/// A provider for one OpenAI-compatible endpoint. Cheap to clone; clones
/// share the client, the limit and the counters.
#[derive(Debug, Clone)]
pub struct OpenAiProvider {
    pub(super) inner: Arc<Inner>,
}

#[derive(Debug)]
pub(super) struct Inner {
    pub(super) config: OpenAiConfig,
    client: reqwest::Client,
    /// `Bearer <key>`, marked sensitive.
    auth: Option<HeaderValue>,
    pub(super) chat_url: Url,
    slots: Arc<Semaphore>,
    /// Set from the config, or by the capability check.
    pub(super) model: OnceLock<String>,
    counters: Counters,
    /// How this endpoint's streams behave; see [`Streaming`].
    streaming: Streaming,
    /// Told of every notice as it is raised (the CLI prints it once).
    on_notice: OnceLock<NoticeHook>,
}

/// A callback for notices, set by whoever owns the provider.
struct NoticeHook(Box<dyn Fn(&ProviderNotice) + Send + Sync>);

impl std::fmt::Debug for NoticeHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NoticeHook")
    }
}

/// Streams that end before `[DONE]` or a finish reason. Some local
/// servers (llama-cpp-python's function-calling handler) answer every
/// streamed request that offers tools with an empty stream: after the
/// second one from an endpoint, requests to it go without streaming for
/// the rest of the run.
#[derive(Debug, Default)]
struct Streaming {
    incomplete: AtomicU64,
    disabled: std::sync::atomic::AtomicBool,
    /// Notices not yet handed to a stage (set with `pending`).
    notices: std::sync::Mutex<Vec<ProviderNotice>>,
    pending: std::sync::atomic::AtomicBool,
    /// A reply came with no token usage (Ollama's OpenAI endpoint, some
    /// proxies): said once.
    unreported: std::sync::atomic::AtomicBool,
}

/// Incomplete streams from one endpoint before troupe stops streaming to it.
const INCOMPLETE_STREAMS_BEFORE_FALLBACK: u64 = 2;

#[derive(Debug, Default)]
struct Counters {
    requests: AtomicU64,
    waited: AtomicU64,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

/// What the provider did in a run, for the summary.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProviderStats {
    pub provider: &'static str,
    pub base_url: String,
    pub model: Option<String>,
    pub stream: bool,
    pub max_inflight: usize,
    /// Model requests sent (every try counts; the capability check does not).
    pub requests: u64,
    /// Most requests in flight at once.
    pub peak_in_flight: usize,
    /// Requests that waited for a slot of `max_inflight`.
    pub waited_for_slot: u64,
}

/// Counts a request in flight while alive.
struct InFlight<'a>(&'a Counters);

impl<'a> InFlight<'a> {
    fn enter(c: &'a Counters) -> InFlight<'a> {
        let now = c.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        c.peak.fetch_max(now, Ordering::SeqCst);
        InFlight(c)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Tells the observer the wait for a slot is over, also when the request is
/// dropped while waiting.
struct Waiting<'a>(Option<&'a dyn RequestObserver>);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(o) = self.0 {
            o.waiting_for_slot(false);
        }
    }
}

fn timed_out(after: Duration, waiting_for: &str) -> ProviderError {
    ProviderError::transient(
        "Timeout",
        format!(
            "no data from the server for {} while waiting for {waiting_for} (--request-timeout)",
            format_duration(after)
        ),
    )
}

impl OpenAiProvider {
    /// Builds the client. Fails only on a key that cannot be an HTTP header
    /// or a TLS backend that cannot start.
    pub fn new(config: OpenAiConfig) -> Result<OpenAiProvider, String> {
        let slots = Arc::new(Semaphore::new(config.max_inflight.max(1)));
        OpenAiProvider::sharing(config, slots)
    }

    /// A provider whose requests take their slots from `slots`, which other
    /// providers of the same endpoint share: runs hosted by one `troupe
    /// serve` share an endpoint's `--max-inflight`.
    pub fn sharing(config: OpenAiConfig, slots: Arc<Semaphore>) -> Result<OpenAiProvider, String> {
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout.min(config.request_timeout))
            // A followed redirect turns the POST into a body-less GET and,
            // to another host or port, drops the key: say where it points.
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("troupe/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| format!("cannot start the HTTP client: {e}"))?;
        let auth = match &config.api_key {
            Some(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {}", key.expose()))
                    .map_err(|_| {
                        format!(
                            "the API key in ${} has characters an HTTP header cannot carry",
                            config.api_key_env
                        )
                    })?;
                value.set_sensitive(true);
                Some(value)
            }
            None => None,
        };
        let model = OnceLock::new();
        if let Some(m) = &config.model {
            let _ = model.set(m.clone());
        }
        Ok(OpenAiProvider {
            inner: Arc::new(Inner {
                chat_url: config.endpoint("chat/completions"),
                slots,
                config,
                client,
                auth,
                model,
                counters: Counters::default(),
                streaming: Streaming::default(),
                on_notice: OnceLock::new(),
            }),
        })
    }

    /// Calls `hook` with every notice the provider raises (at most once
    /// each), as it is raised. Set once; later calls are ignored.
    pub fn on_notice(&self, hook: impl Fn(&ProviderNotice) + Send + Sync + 'static) {
        let _ = self.inner.on_notice.set(NoticeHook(Box::new(hook)));
    }

    /// Whether requests still ask for a stream (the config asks for one
    /// and the endpoint's streams have not been given up on).
    pub fn streaming(&self) -> bool {
        self.inner.streams()
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// The model requests go to (after the capability check, the one it chose).
    pub fn model(&self) -> Option<&str> {
        self.inner.model.get().map(String::as_str)
    }

    pub fn stats(&self) -> ProviderStats {
        let c = &self.inner.counters;
        ProviderStats {
            provider: "openai",
            base_url: self.inner.config.base_url.to_string(),
            model: self.model().map(str::to_owned),
            stream: self.inner.streams(),
            max_inflight: self.inner.config.max_inflight,
            requests: c.requests.load(Ordering::SeqCst),
            peak_in_flight: c.peak.load(Ordering::SeqCst),
            waited_for_slot: c.waited.load(Ordering::SeqCst),
        }
    }
}

impl Provider for OpenAiProvider {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn info(&self) -> ProviderInfo {
        ProviderInfo {
            name: "openai",
            model: self.model().map(str::to_owned),
            base_url: Some(self.inner.config.base_url.to_string()),
            stream: Some(self.inner.streams()),
        }
    }

    fn take_notices(&self) -> Vec<ProviderNotice> {
        let s = &self.inner.streaming;
        if !s.pending.swap(false, Ordering::SeqCst) {
            return Vec::new();
        }
        std::mem::take(&mut *s.notices.lock().unwrap_or_else(|e| e.into_inner()))
    }

    fn complete(
        &self,
        request: ModelRequest,
    ) -> BoxFuture<'static, Result<ModelResponse, ProviderError>> {
        let inner = Arc::clone(&self.inner);
        async move {
            let result = inner.complete(&request).await;
            result.map_err(|e| inner.redact(e))
        }
        .boxed()
    }
}

impl Inner {
    pub(super) fn redact(&self, err: ProviderError) -> ProviderError {
        redact(err, self.config.api_key.as_ref().map(|k| k.expose()))
    }

    async fn complete(&self, request: &ModelRequest) -> Result<ModelResponse, ProviderError> {
        let model = self.model.get().ok_or_else(|| ProviderError::Terminal {
            code: "ModelUnset",
            message: "no model to ask: pass --model NAME".to_owned(),
        })?;
        let stream = self.streams();
        let body = request_body(model, request, stream);
        let observer = request.observer.as_deref();
        let _slot = self.slot(observer).await?;
        let _flight = InFlight::enter(&self.counters);
        self.counters.requests.fetch_add(1, Ordering::SeqCst);
        let response = self.post(&self.chat_url, &body).await?;
        let reply = self.read_reply(response, stream, observer).await;
        if stream
            && let Err(ProviderError::Transient {
                code: "StreamIncomplete",
                ..
            }) = &reply
        {
            self.stream_ended_early();
        }
        reply
    }

    /// A whole reply (not one taken early) that said nothing of its
    /// tokens: [`Inner::usage_unreported`].
    fn counted(
        &self,
        reply: Result<ModelResponse, ProviderError>,
    ) -> Result<ModelResponse, ProviderError> {
        if let Ok(response) = &reply
            && response.usage.prompt_tokens == 0
            && response.usage.completion_tokens == 0
        {
            self.usage_unreported();
        }
        reply
    }

    /// Whether this request asks for a stream.
    fn streams(&self) -> bool {
        self.config.stream && !self.streaming.disabled.load(Ordering::SeqCst)
    }

    /// Counts an incomplete stream; the one that reaches the limit turns
    /// streaming off for the rest of the run and raises one notice.
    fn stream_ended_early(&self) {
        let n = self.streaming.incomplete.fetch_add(1, Ordering::SeqCst) + 1;
        if n < INCOMPLETE_STREAMS_BEFORE_FALLBACK
            || self.streaming.disabled.swap(true, Ordering::SeqCst)
        {
            return;
        }
        self.raise(ProviderNotice {
            code: "StreamingDisabled",
            message: format!(
                "{} ended {n} streamed replies before `[DONE]` or a finish reason; troupe asks it for plain (non-streamed) replies for the rest of this run (--no-stream does so from the start)",
                self.config.base_url
            ),
        });
    }

    /// A reply said nothing of the tokens it used: once a run, a notice
    /// that its counts (and a token or cost budget) cannot see them.
    fn usage_unreported(&self) {
        if self.streaming.unreported.swap(true, Ordering::SeqCst) {
            return;
        }
        self.raise(ProviderNotice {
            code: "UsageUnreported",
            message: format!(
                "{} reports no token usage in its replies: the run's token counts and cost stay at 0 for them, and --max-tokens / --max-cost cannot limit them",
                self.config.base_url
            ),
        });
    }

    /// Hands a notice to the hook now and to the next stage that asks.
    fn raise(&self, notice: ProviderNotice) {
        if let Some(hook) = self.on_notice.get() {
            (hook.0)(&notice);
        }
        self.streaming
            .notices
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(notice);
        self.streaming.pending.store(true, Ordering::SeqCst);
    }

    /// A slot of the concurrency limit; waits (and says so) when none is free.
    async fn slot(
        &self,
        observer: Option<&dyn RequestObserver>,
    ) -> Result<OwnedSemaphorePermit, ProviderError> {
        let closed = |_| ProviderError::Terminal {
            code: "ProviderClosed",
            message: "the provider was shut down".to_owned(),
        };
        match Arc::clone(&self.slots).try_acquire_owned() {
            Ok(permit) => Ok(permit),
            Err(TryAcquireError::Closed) => Err(closed(())),
            Err(TryAcquireError::NoPermits) => {
                self.counters.waited.fetch_add(1, Ordering::SeqCst);
                if let Some(o) = observer {
                    o.waiting_for_slot(true);
                }
                let _waiting = Waiting(observer);
                Arc::clone(&self.slots)
                    .acquire_owned()
                    .await
                    .map_err(|_| closed(()))
            }
        }
    }

    /// POSTs a JSON body; a non-2xx status becomes its typed error.
    pub(super) async fn post(
        &self,
        url: &Url,
        body: &serde_json::Value,
    ) -> Result<reqwest::Response, ProviderError> {
        let mut builder = self
            .client
            .post(url.clone())
            .header(CONTENT_TYPE, "application/json")
            .json(body);
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        self.send(builder).await
    }

    /// GETs `url`; a non-2xx status becomes its typed error.
    pub(super) async fn get(&self, url: &Url) -> Result<reqwest::Response, ProviderError> {
        let mut builder = self.client.get(url.clone());
        if let Some(auth) = &self.auth {
            builder = builder.header(AUTHORIZATION, auth.clone());
        }
        self.send(builder).await
    }

    async fn send(
        &self,
        builder: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, ProviderError> {
        let wait = self.config.request_timeout;
        let response = match tokio::time::timeout(wait, builder.send()).await {
            Err(_) => return Err(timed_out(wait, "the reply to start")),
            Ok(Err(e)) => return Err(transport_error(&e)),
            Ok(Ok(r)) => r,
        };
        let status = response.status();
        if status.is_success() {
            return Ok(response);
        }
        let headers = response.headers().clone();
        // The status decides the error; the body only adds the server's
        // words, so a body that cannot be read is no worse than an empty one.
        let body = self
            .read_all(response, MAX_ERROR_BODY_BYTES, true)
            .await
            .unwrap_or_default();
        Err(status_error(
            status,
            &headers,
            &body,
            &self.config.api_key_env,
            self.auth.is_some(),
        ))
    }

    /// The whole body, within the request timeout from when it began: a
    /// server (or a proxy) that trickles its reply a byte at a time would
    /// keep a timeout per chunk waiting without end. Past `limit` it is
    /// cut (`truncate`) or refused.
    pub(super) async fn read_all(
        &self,
        response: reqwest::Response,
        limit: usize,
        truncate: bool,
    ) -> Result<Vec<u8>, ProviderError> {
        let wait = self.config.request_timeout;
        let deadline = tokio::time::Instant::now() + wait;
        let mut stream = response.bytes_stream();
        let mut body = Vec::new();
        loop {
            let next = tokio::time::timeout_at(deadline, stream.next())
                .await
                .map_err(|_| {
                    ProviderError::transient(
                        "Timeout",
                        format!(
                            "the reply did not arrive whole within {} (--request-timeout)",
                            format_duration(wait)
                        ),
                    )
                })?;
            let Some(chunk) = next else {
                return Ok(body);
            };
            let chunk = chunk.map_err(|e| transport_error(&e))?;
            if body.len() + chunk.len() > limit {
                if truncate {
                    body.extend_from_slice(&chunk[..limit - body.len()]);
                    return Ok(body);
                }
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
    }

    /// Reads a 2xx reply: SSE when the server streams, else one JSON
    /// completion — also when a stream was asked for and the server answered
    /// with plain JSON. Both give the same turn.
    async fn read_reply(
        &self,
        response: reqwest::Response,
        stream: bool,
        observer: Option<&dyn RequestObserver>,
    ) -> Result<ModelResponse, ProviderError> {
        let content_type = response
            .headers()
            .get(CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_ascii_lowercase();
        if content_type.starts_with("text/event-stream") {
            return self.read_stream(response, observer).await;
        }
        let body = self.read_all(response, MAX_REPLY_BYTES, false).await?;
        let looks_like_sse = {
            let start = body.trim_ascii_start();
            start.starts_with(b"data:") || start.starts_with(b":")
        };
        if stream && looks_like_sse && !content_type.contains("json") {
            // An event stream under another content type: the same rules
            // as a streamed reply, the end-of-stream check included.
            let mut sse = SseDecoder::new();
            let mut assembly = Assembly::new();
            let events = sse.push_events(&body).map_err(|e| sse_error(&e.0))?;
            let done = feed(&mut assembly, events, observer)?;
            return self.counted(end_of_stream(sse, assembly, done, observer));
        }
        self.counted(Assembly::from_completion(&body)?.into_response())
    }

    /// Assembles an SSE stream chunk by chunk until `[DONE]`. The request
    /// timeout runs between events: keep-alive comments alone do not count
    /// as progress, so a server that only pings still times out.
    async fn read_stream(
        &self,
        response: reqwest::Response,
        observer: Option<&dyn RequestObserver>,
    ) -> Result<ModelResponse, ProviderError> {
        let wait = self.config.request_timeout;
        let mut bytes = response.bytes_stream();
        let mut sse = SseDecoder::new();
        let mut assembly = Assembly::new();
        let mut total = 0usize;
        let mut done = false;
        let mut deadline = tokio::time::Instant::now() + wait;
        // A try that fails part-way is billed for the usage the server
        // already reported in it.
        loop {
            let next = tokio::time::timeout_at(deadline, bytes.next())
                .await
                .map_err(|_| {
                    timed_out(wait, "the next event of the stream").billed(assembly.usage())
                })?;
            let Some(chunk) = next else {
                break;
            };
            let chunk = match chunk {
                Ok(chunk) => chunk,
                // The model said it was done (and the usage that follows
                // its finish reason may have come too): the connection
                // dropped where `[DONE]` would have come. The turn is
                // taken as it stands, an event cut short by the drop left
                // out: asking again would be billed again for it.
                Err(_) if assembly.finished() => return assembly.into_response(),
                Err(e) => return Err(transport_error(&e).billed(assembly.usage())),
            };
            total += chunk.len();
            if total > MAX_REPLY_BYTES {
                return Err(too_large());
            }
            let events = sse
                .push_events(&chunk)
                .map_err(|e| sse_error(&e.0).billed(assembly.usage()))?;
            if !events.is_empty() {
                deadline = tokio::time::Instant::now() + wait;
            }
            match feed(&mut assembly, events, observer) {
                Ok(true) => {
                    done = true;
                    break;
                }
                Ok(false) => {}
                Err(e) => return Err(e.billed(assembly.usage())),
            }
        }
        self.counted(end_of_stream(sse, assembly, done, observer))
    }
}

/// Applies decoded SSE events to the assembly; `true` once `[DONE]` came
/// (events after it are ignored). An `event: error` is the server's
/// failure (llama.cpp's server sends one, then `[DONE]`); an event with
/// empty data (a proxy's heartbeat) carries nothing.
fn feed(
    assembly: &mut Assembly,
    events: impl IntoIterator<Item = SseEvent>,
    observer: Option<&dyn RequestObserver>,
) -> Result<bool, ProviderError> {
    for SseEvent { kind, data } in events {
        let data = data.trim();
        if kind.as_deref() == Some("error") {
            let reported = serde_json::from_str::<serde_json::Value>(data)
                .unwrap_or_else(|_| serde_json::Value::String(data.to_owned()));
            let reported = match reported.get("error") {
                Some(inner) if !inner.is_null() => inner.clone(),
                _ => reported,
            };
            return Err(super::errors::reported_error(&reported));
        }
        if data == "[DONE]" {
            return Ok(true);
        }
        if data.is_empty() {
            continue;
        }
        assembly.apply_chunk(data, observer)?;
    }
    Ok(false)
}

/// Ends a stream: a last event without its blank line still counts, and a
/// stream that stopped before `[DONE]` or a `finish_reason` is incomplete.
fn end_of_stream(
    mut sse: SseDecoder,
    mut assembly: Assembly,
    mut done: bool,
    observer: Option<&dyn RequestObserver>,
) -> Result<ModelResponse, ProviderError> {
    if !done {
        let last = sse
            .finish()
            .map_err(|e| sse_error(&e.0).billed(assembly.usage()))?;
        done = match feed(&mut assembly, last, observer) {
            Ok(done) => done,
            Err(e) => return Err(e.billed(assembly.usage())),
        };
    }
    if !done && !assembly.finished() {
        return Err(ProviderError::transient(
            "StreamIncomplete",
            "the stream ended before `[DONE]` or a finish_reason",
        )
        .billed(assembly.usage()));
    }
    assembly.into_response()
}

fn too_large() -> ProviderError {
    ProviderError::Terminal {
        code: "ResponseTooLarge",
        message: format!(
            "the server's reply exceeds {} MiB",
            MAX_REPLY_BYTES / (1024 * 1024)
        ),
    }
}

/// The one way an event stream is refused: an event past the bound troupe
/// reads. The same request would get the same reply, so it is not asked
/// again (as a plain reply past its bound is not).
fn sse_error(message: &str) -> ProviderError {
    ProviderError::Terminal {
        code: "ResponseTooLarge",
        message: format!("the server's event stream is refused: {message}"),
    }
}
