//! The OTLP/HTTP exporter: batches of spans, encoded as the protocol's
//! protobuf `ExportTraceServiceRequest`, posted on a thread of its own. A
//! batch that finds the queue full is dropped and counted, never waited
//! for: a collector that refuses, hangs or is absent costs a warning and a
//! counter, never the run.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Sender, TrySendError, bounded};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{AnyValue, InstrumentationScope, KeyValue, any_value};
use opentelemetry_proto::tonic::resource::v1::Resource;
use opentelemetry_proto::tonic::trace::v1::{ResourceSpans, ScopeSpans, Span};
use prost::Message;

use super::OtlpConfig;

/// Batches waiting to be posted; more are dropped.
const QUEUE: usize = 64;
/// The longest one post may take.
const POST_TIMEOUT: Duration = Duration::from_secs(10);

/// What the exporter did.
#[derive(Debug, Default)]
pub struct Counts {
    pub sent: AtomicU64,
    pub dropped: AtomicU64,
    /// The first failure, said once at the end.
    pub first_error: std::sync::Mutex<Option<String>>,
    /// Set when the run's grace ran out: the thread posts nothing more
    /// (it drops what is queued and ends after the post in flight, which
    /// its own timeout bounds), so no exporter outlives its run by more.
    pub abandoned: std::sync::atomic::AtomicBool,
}

/// Posts of one batch, at most: the OTLP/HTTP spec asks a client to
/// retry what a collector answers 429, 502, 503 or 504 (and a connection
/// that failed), with exponential backoff honouring `Retry-After`.
const ATTEMPTS: u32 = 4;
/// The first wait before posting a batch again; doubled each time.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);
/// The longest wait between two posts of a batch.
const MOST_BACKOFF: Duration = Duration::from_secs(8);

/// How one post of a batch went.
enum Posted {
    /// Taken; `rejected` of its spans were refused (`partial_success`),
    /// `why` says why.
    Sent { rejected: u64, why: String },
    /// Worth posting again (after `after`, when the collector said).
    Again {
        why: String,
        after: Option<Duration>,
    },
    /// Refused for good.
    Failed(String),
}

/// Posts `body` once.
async fn post(client: &reqwest::Client, config: &OtlpConfig, body: Vec<u8>) -> Posted {
    let mut request = client
        .post(config.endpoint.clone())
        .header("content-type", "application/x-protobuf")
        .body(body);
    for (k, v) in &config.headers {
        request = request.header(k.as_str(), v.as_str());
    }
    let response = match request.send().await {
        Ok(r) => r,
        // Refused, reset, timed out: the collector may be restarting.
        Err(e) => {
            return Posted::Again {
                why: e.without_url().to_string(),
                after: None,
            };
        }
    };
    let status = response.status();
    if status.is_success() {
        // A 200 may still refuse some of the spans, said in its body.
        let body = response.bytes().await.unwrap_or_default();
        let partial = ExportTraceServiceResponse::decode(body.as_ref())
            .ok()
            .and_then(|r| r.partial_success);
        return match partial {
            Some(p) if p.rejected_spans > 0 => Posted::Sent {
                rejected: u64::try_from(p.rejected_spans).unwrap_or(0),
                why: format!(
                    "the collector refused {} spans: {}",
                    p.rejected_spans,
                    p.error_message.chars().take(200).collect::<String>()
                ),
            },
            _ => Posted::Sent {
                rejected: 0,
                why: String::new(),
            },
        };
    }
    let why = format!("the collector answered {status}");
    if matches!(status.as_u16(), 429 | 502 | 503 | 504) {
        let after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        return Posted::Again { why, after };
    }
    Posted::Failed(why)
}

/// The wait before post `attempt + 1`: what the collector asked for, else
/// doubling from [`FIRST_BACKOFF`]; never past [`MOST_BACKOFF`].
fn backoff(attempt: u32, asked: Option<Duration>) -> Duration {
    asked
        .unwrap_or_else(|| FIRST_BACKOFF * 2u32.saturating_pow(attempt - 1))
        .min(MOST_BACKOFF)
}

/// Waits `how_long`, looking every 50 ms whether the run gave up on the
/// exporter; whether it may post again.
async fn wait(how_long: Duration, counts: &Counts) -> bool {
    let until = tokio::time::Instant::now() + how_long;
    while tokio::time::Instant::now() < until {
        if counts.abandoned.load(Ordering::Relaxed) {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50).min(until - tokio::time::Instant::now()))
            .await;
    }
    !counts.abandoned.load(Ordering::Relaxed)
}

/// The exporter's thread and its queue.
#[derive(Debug)]
pub struct Exporter {
    queue: Option<Sender<Vec<Span>>>,
    thread: Option<JoinHandle<()>>,
    pub counts: Arc<Counts>,
}

fn text(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.to_owned(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(value.to_owned())),
        }),
        ..KeyValue::default()
    }
}

/// The request body for `spans`.
pub fn encode(spans: Vec<Span>, service: &str) -> Vec<u8> {
    ExportTraceServiceRequest {
        resource_spans: vec![ResourceSpans {
            resource: Some(Resource {
                attributes: vec![
                    text("service.name", service),
                    text("service.version", env!("CARGO_PKG_VERSION")),
                    text("telemetry.sdk.name", "troupe"),
                    text("telemetry.sdk.language", "rust"),
                ],
                ..Resource::default()
            }),
            scope_spans: vec![ScopeSpans {
                scope: Some(InstrumentationScope {
                    name: "troupe".to_owned(),
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    ..InstrumentationScope::default()
                }),
                spans,
                ..ScopeSpans::default()
            }],
            ..ResourceSpans::default()
        }],
    }
    .encode_to_vec()
}

impl Exporter {
    pub fn start(config: OtlpConfig) -> std::io::Result<Exporter> {
        let (queue, batches) = bounded::<Vec<Span>>(QUEUE);
        let counts = Arc::new(Counts::default());
        let seen = Arc::clone(&counts);
        let thread = std::thread::Builder::new()
            .name("troupe-otlp".into())
            .spawn(move || {
                let failed = |n: usize, why: String| {
                    seen.dropped.fetch_add(n as u64, Ordering::Relaxed);
                    let mut first = seen
                        .first_error
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    first.get_or_insert(why);
                };
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build();
                let client = reqwest::Client::builder()
                    .timeout(POST_TIMEOUT)
                    .connect_timeout(Duration::from_secs(2))
                    .user_agent(concat!("troupe/", env!("CARGO_PKG_VERSION")))
                    .build();
                let (Ok(rt), Ok(client)) = (rt, client) else {
                    for batch in batches {
                        failed(batch.len(), "cannot start the HTTP client".to_owned());
                    }
                    return;
                };
                for batch in batches {
                    let n = batch.len();
                    if seen.abandoned.load(Ordering::Relaxed) {
                        failed(n, "the run ended before it could be sent".to_owned());
                        continue;
                    }
                    let body = encode(batch, &config.service);
                    let mut attempt = 1;
                    loop {
                        match rt.block_on(post(&client, &config, body.clone())) {
                            Posted::Sent { rejected, why } => {
                                let rejected = rejected.min(n as u64);
                                seen.sent.fetch_add(n as u64 - rejected, Ordering::Relaxed);
                                if rejected > 0 {
                                    failed(usize::try_from(rejected).unwrap_or(n), why);
                                }
                            }
                            Posted::Again { why, after } => {
                                if attempt < ATTEMPTS
                                    && rt.block_on(wait(backoff(attempt, after), &seen))
                                {
                                    attempt += 1;
                                    continue;
                                }
                                failed(n, why);
                            }
                            Posted::Failed(why) => failed(n, why),
                        }
                        break;
                    }
                }
            })?;
        Ok(Exporter {
            queue: Some(queue),
            thread: Some(thread),
            counts,
        })
    }

    /// Queues a batch, or drops and counts it when the queue is full.
    pub fn send(&self, batch: Vec<Span>) {
        if batch.is_empty() {
            return;
        }
        let Some(queue) = &self.queue else { return };
        let n = batch.len() as u64;
        if let Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) = queue.try_send(batch) {
            self.counts.dropped.fetch_add(n, Ordering::Relaxed);
            let mut first = self
                .counts
                .first_error
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            first.get_or_insert_with(|| "the export queue was full (a slow collector)".to_owned());
        }
    }

    /// Closes the queue and waits at most `grace` for what is queued to go
    /// out; then the thread is told to drop the rest, and a post still
    /// hanging ends on its own timeout.
    pub fn finish(mut self, grace: Duration) {
        drop(self.queue.take());
        let deadline = Instant::now() + grace;
        if let Some(thread) = self.thread.take() {
            while !thread.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if thread.is_finished() {
                let _ = thread.join();
            } else {
                self.counts.abandoned.store(true, Ordering::Relaxed);
            }
        }
    }
}
