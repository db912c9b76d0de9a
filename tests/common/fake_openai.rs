//! A fake OpenAI-compatible server on 127.0.0.1:0 for the provider tests
//! (axum, on its own thread and runtime, so blocking CLI tests and async
//! library tests can both use it).
//!
//! A responder scripts the reply to each request: text, tool calls (streamed
//! in fragments, several calls interleaved by index, each SSE event split
//! across two writes), a plain JSON body even for a streamed request, any
//! status with headers (429 + Retry-After, 500, 401…), malformed bodies, a
//! request that hangs, a stream that hangs or breaks off. The server records
//! every request (body, Authorization header, arrival time), how many are in
//! flight (and the peak), and how many the client abandoned before they were
//! answered. Gates (`Reply::WaitInFlight`) hold replies until enough
//! requests are in flight, so ordering never depends on sleeps.
//!
//! Like OpenAI, it refuses (HTTP 400) every chat request that breaks the
//! API's rules (`common/openai_rules.rs`: above all, every tool call in a
//! transcript answered by its result), and a server that refused one
//! fails its test when dropped unless the test expects refusals. With a
//! [`Quirk`] it behaves as a popular local server does.
//!
//! Its streamed replies, frame by frame: `fake_openai_frames.rs`.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::{Value, json};
use tokio::sync::watch;

pub use troupe::provider::openai::PROBE_TOOL;

use crate::common::openai_rules::{Violation, check_chat_request};

#[path = "fake_openai_frames.rs"]
mod frames;
pub use frames::stream_frames;
use frames::{Tail, ollama_frames, sse_response};

/// How a local server departs from OpenAI, modelled as users meet it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Quirk {
    /// Behaves as OpenAI does.
    #[default]
    None,
    /// llama-cpp-python's server with its function-calling chat handler:
    /// a forced `tool_choice` ("required" or a named function) is an
    /// unhandled error (HTTP 500; the handler supports only "auto"), and a
    /// streamed request that offers tools gets an event stream that ends
    /// at once: no chunk, no `finish_reason`, no `[DONE]`.
    LlamaCppPython,
    /// Ollama's OpenAI-compatible API: tool calls come whole in one delta
    /// and the finish reason is "stop", not "tool_calls".
    Ollama,
}

/// How to answer one request.
#[derive(Debug, Clone)]
pub enum Reply {
    /// An assistant text message.
    Text(String),
    /// Tool calls `(name, arguments JSON text)`; ids are `call_<i>`.
    Calls(Vec<(String, String)>),
    /// The inner reply as one plain JSON completion, even when a stream was
    /// asked for.
    PlainJson(Box<Reply>),
    /// The inner reply as one plain JSON completion, a byte every 50 ms:
    /// a server (or a proxy) that trickles its body.
    Trickle(Box<Reply>),
    /// This status, headers and body.
    Status {
        status: u16,
        headers: Vec<(String, String)>,
        body: String,
    },
    /// 200 with this content type and body.
    Raw { content_type: String, body: String },
    /// 200 with this content type and body, any bytes (a reply cut
    /// inside a UTF-8 character).
    Bytes { content_type: String, body: Vec<u8> },
    /// 200 `text/event-stream` with these exact events' data (no `[DONE]`
    /// is added).
    Events(Vec<String>),
    /// Never answers; the client has to go away.
    Hang,
    /// Streams the opening of a text reply, then nothing more.
    StreamThenHang,
    /// Streams the opening of a reply, then breaks the connection.
    BreakMidStream,
    /// 200 `text/event-stream` with these events' data, then breaks the
    /// connection where `[DONE]` would come.
    EventsThenBreak(Vec<String>),
    /// The same, with these raw bytes after the events (an event cut
    /// short by the break).
    EventsThenCut(Vec<String>, String),
    /// Waits until at least `n` requests are in flight (or until
    /// `release_after` waiting requests have arrived), then answers.
    WaitInFlight(usize, Box<Reply>),
}

impl Reply {
    pub fn call(name: &str, args: Value) -> Reply {
        Reply::Calls(vec![(name.to_owned(), args.to_string())])
    }

    pub fn status(status: u16, body: &str) -> Reply {
        Reply::Status {
            status,
            headers: Vec::new(),
            body: body.to_owned(),
        }
    }
}

/// One request as the server received it.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub body: Value,
    pub authorization: Option<String>,
    pub at: Instant,
}

impl Received {
    pub fn is_probe(&self) -> bool {
        self.tool_names().iter().any(|t| t == PROBE_TOOL)
    }

    pub fn is_chat(&self) -> bool {
        self.path.ends_with("/chat/completions")
    }

    pub fn streamed(&self) -> bool {
        self.body["stream"] == true
    }

    pub fn tool_names(&self) -> Vec<String> {
        self.body["tools"]
            .as_array()
            .map(|ts| {
                ts.iter()
                    .filter_map(|t| t["function"]["name"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The last tool of the manifest: the stage's completion channel.
    pub fn completion_tool(&self) -> String {
        self.tool_names().last().cloned().unwrap_or_default()
    }

    pub fn messages(&self) -> Vec<Value> {
        self.body["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default()
    }

    pub fn system_prompt(&self) -> String {
        self.body["messages"][0]["content"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Assistant turns already in the transcript.
    pub fn turns_so_far(&self) -> usize {
        self.messages()
            .iter()
            .filter(|m| m["role"] == "assistant")
            .count()
    }
}

type Responder = Box<dyn Fn(&Received) -> Reply + Send + Sync>;

/// Characters per streamed fragment.
const FRAGMENT: usize = 4;

/// Counters the tests read.
#[derive(Debug, Default, Clone)]
pub struct Counts {
    pub in_flight: usize,
    pub peak: usize,
    /// Requests the client abandoned before the whole reply was sent.
    pub dropped: usize,
    pub completed: usize,
    /// Requests that arrived with a `WaitInFlight` reply.
    pub gated: usize,
}

struct Shared {
    responder: Responder,
    received: Mutex<Vec<Received>>,
    counts: Mutex<Counts>,
    /// Bumped on every change of `counts` (see `until`).
    tick: watch::Sender<u64>,
    models: Mutex<Vec<String>>,
    /// Every `WaitInFlight` is released once this many of them arrived.
    release_after: Mutex<usize>,
    /// Requests refused for breaking the API's rules.
    violations: Mutex<Vec<Violation>>,
    /// Refusals are what the test is about (it reads `violations`).
    expect_violations: Mutex<bool>,
    quirk: Mutex<Quirk>,
}

impl Shared {
    fn bump(&self, f: impl FnOnce(&mut Counts)) {
        {
            let mut c = self.counts.lock().unwrap();
            f(&mut c);
        }
        self.tick.send_modify(|t| *t += 1);
    }
}

/// Counts a request in flight until dropped; a request dropped before
/// `done()` was abandoned by the client.
struct Flight {
    shared: Arc<Shared>,
    done: bool,
}

impl Flight {
    fn enter(shared: &Arc<Shared>) -> Flight {
        shared.bump(|c| {
            c.in_flight += 1;
            c.peak = c.peak.max(c.in_flight);
        });
        Flight {
            shared: Arc::clone(shared),
            done: false,
        }
    }
}

impl Drop for Flight {
    fn drop(&mut self) {
        let done = self.done;
        self.shared.bump(|c| {
            c.in_flight -= 1;
            if done {
                c.completed += 1;
            } else {
                c.dropped += 1;
            }
        });
    }
}

/// The running server. Dropping it stops it.
pub struct FakeOpenAi {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl FakeOpenAi {
    /// Starts a server that answers with `responder`; the capability probe
    /// is answered with a call of `troupe_probe` unless the responder is
    /// asked with `start_raw`.
    pub fn start(responder: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> FakeOpenAi {
        FakeOpenAi::start_raw(move |r| {
            if r.is_probe() {
                Reply::call(PROBE_TOOL, json!({}))
            } else {
                responder(r)
            }
        })
    }

    /// Starts a server whose responder also answers the probe.
    pub fn start_raw(responder: impl Fn(&Received) -> Reply + Send + Sync + 'static) -> FakeOpenAi {
        let (tick, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            responder: Box::new(responder),
            received: Mutex::new(Vec::new()),
            counts: Mutex::new(Counts::default()),
            tick,
            models: Mutex::new(vec!["fake-model".to_owned()]),
            release_after: Mutex::new(usize::MAX),
            violations: Mutex::new(Vec::new()),
            expect_violations: Mutex::new(false),
            quirk: Mutex::new(Quirk::None),
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = Arc::clone(&shared);
        std::thread::Builder::new()
            .name("fake-openai".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    addr_tx.send(listener.local_addr().unwrap()).unwrap();
                    let app = Router::new()
                        .route("/v1/chat/completions", post(chat))
                        .route("/v1/models", get(models))
                        .with_state(state);
                    let server = axum::serve(listener, app);
                    tokio::select! {
                        _ = server => {}
                        _ = stop_rx => {}
                    }
                });
                rt.shutdown_background();
            })
            .unwrap();
        let addr = addr_rx.recv().unwrap();
        FakeOpenAi {
            addr,
            shared,
            stop: Some(stop_tx),
        }
    }

    /// `http://127.0.0.1:PORT/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    pub fn set_models(&self, models: &[&str]) {
        *self.shared.models.lock().unwrap() = models.iter().map(|m| (*m).to_owned()).collect();
    }

    /// Releases every `WaitInFlight` once `n` of them have arrived: when
    /// no more can come, the held ones must not wait forever.
    pub fn release_after(&self, n: usize) {
        *self.shared.release_after.lock().unwrap() = n;
        self.shared.tick.send_modify(|t| *t += 1);
    }

    /// Behave as a known local server does.
    pub fn set_quirk(&self, quirk: Quirk) {
        *self.shared.quirk.lock().unwrap() = quirk;
    }

    /// The test is about refused requests: dropping the server does not
    /// fail it for them.
    pub fn expect_violations(&self) {
        *self.shared.expect_violations.lock().unwrap() = true;
    }

    /// Requests refused for breaking the API's rules.
    pub fn violations(&self) -> Vec<Violation> {
        self.shared.violations.lock().unwrap().clone()
    }

    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// Chat requests other than the capability probe.
    pub fn chats(&self) -> Vec<Received> {
        self.received()
            .into_iter()
            .filter(|r| r.is_chat() && !r.is_probe())
            .collect()
    }

    pub fn counts(&self) -> Counts {
        self.shared.counts.lock().unwrap().clone()
    }

    /// Waits (at most 20 s, then panics) until `pred` holds.
    pub async fn until(&self, what: &str, pred: impl Fn(&Counts) -> bool) -> Counts {
        let mut rx = self.shared.tick.subscribe();
        let wait = async {
            loop {
                let c = self.counts();
                if pred(&c) {
                    return c;
                }
                if rx.changed().await.is_err() {
                    return c;
                }
            }
        };
        match tokio::time::timeout(Duration::from_secs(20), wait).await {
            Ok(c) => c,
            Err(_) => panic!("timed out waiting for {what}: {:?}", self.counts()),
        }
    }
}

impl Drop for FakeOpenAi {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let violations = self.violations();
        if !violations.is_empty()
            && !*self.shared.expect_violations.lock().unwrap()
            && !std::thread::panicking()
        {
            panic!("the fake server refused requests that OpenAI would refuse: {violations:#?}");
        }
    }
}

async fn models(State(shared): State<Arc<Shared>>, headers: HeaderMap) -> Response {
    record(&shared, "/v1/models", &headers, Value::Null);
    let data: Vec<Value> = shared
        .models
        .lock()
        .unwrap()
        .iter()
        .map(|m| json!({"id": m, "object": "model"}))
        .collect();
    json_response(200, &json!({"object": "list", "data": data}))
}

fn record(shared: &Shared, path: &str, headers: &HeaderMap, body: Value) -> Received {
    let r = Received {
        path: path.to_owned(),
        body,
        authorization: headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        at: Instant::now(),
    };
    shared.received.lock().unwrap().push(r.clone());
    r
}

async fn chat(State(shared): State<Arc<Shared>>, headers: HeaderMap, body: Bytes) -> Response {
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let received = record(&shared, "/v1/chat/completions", &headers, body);
    let mut flight = Flight::enter(&shared);
    if let Err(v) = check_chat_request(&received.body) {
        flight.done = true;
        let body = v.body();
        shared.violations.lock().unwrap().push(v);
        return json_response(400, &body);
    }
    let quirk = *shared.quirk.lock().unwrap();
    let offers_tools = received.body["tools"]
        .as_array()
        .is_some_and(|t| !t.is_empty());
    if quirk == Quirk::LlamaCppPython {
        let forced = match &received.body["tool_choice"] {
            Value::String(c) => c == "required",
            Value::Object(_) => true,
            _ => false,
        };
        if forced {
            flight.done = true;
            return json_response(
                500,
                &json!({"error": {"message": "Unhandled exception: tool_choice must be 'auto' for the chatml-function-calling handler", "type": "internal_server_error", "param": null, "code": null}}),
            );
        }
        if received.streamed() && offers_tools {
            return sse_response(Vec::new(), flight, Tail::End);
        }
    }
    let mut reply = (shared.responder)(&received);
    while let Reply::WaitInFlight(n, inner) = reply {
        let mut rx = shared.tick.subscribe();
        shared.bump(|c| c.gated += 1);
        loop {
            let released = {
                let c = shared.counts.lock().unwrap();
                c.in_flight >= n || c.gated >= *shared.release_after.lock().unwrap()
            };
            if released {
                break;
            }
            // The tick sender lives as long as `shared`.
            let _ = rx.changed().await;
        }
        reply = *inner;
    }
    let model = received.body["model"].as_str().unwrap_or("").to_owned();
    let usage = usage_for(&received);
    let stream = received.streamed();
    match reply {
        Reply::Hang => {
            // Dropped with `flight` when the client goes away.
            std::future::pending::<Response>().await
        }
        Reply::Status {
            status,
            headers,
            body,
        } => {
            flight.done = true;
            let mut b = Response::builder().status(status);
            for (k, v) in headers {
                b = b.header(k, v);
            }
            b.header("content-type", "application/json")
                .body(Body::from(body))
                .unwrap()
        }
        Reply::Raw { content_type, body } => {
            flight.done = true;
            Response::builder()
                .status(200)
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap()
        }
        Reply::Bytes { content_type, body } => {
            flight.done = true;
            Response::builder()
                .status(200)
                .header("content-type", content_type)
                .body(Body::from(body))
                .unwrap()
        }
        Reply::PlainJson(inner) => {
            flight.done = true;
            json_response(200, &completion(&inner, &model, usage))
        }
        Reply::Trickle(inner) => {
            flight.done = true;
            let text = completion(&inner, &model, usage).to_string();
            let body = futures::stream::unfold(text.into_bytes().into_iter(), |mut bytes| async {
                let byte = bytes.next()?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                Some((Ok::<_, std::io::Error>(Bytes::from(vec![byte])), bytes))
            });
            Response::builder()
                .status(200)
                .header("content-type", "application/json")
                .body(Body::from_stream(body))
                .unwrap()
        }
        Reply::Events(events) => {
            let frames = events
                .into_iter()
                .map(|e| Bytes::from(format!("data: {e}\n\n")))
                .collect();
            sse_response(frames, flight, Tail::End)
        }
        Reply::StreamThenHang => {
            let frames = stream_frames(&Reply::Text("thinking".into()), &model, None, 4, false);
            sse_response(frames.into_iter().take(2).collect(), flight, Tail::Hang)
        }
        Reply::EventsThenBreak(events) => {
            let frames = events
                .into_iter()
                .map(|e| Bytes::from(format!("data: {e}\n\n")))
                .collect();
            sse_response(frames, flight, Tail::Break)
        }
        Reply::EventsThenCut(events, cut) => {
            let mut frames: Vec<Bytes> = events
                .into_iter()
                .map(|e| Bytes::from(format!("data: {e}\n\n")))
                .collect();
            frames.push(Bytes::from(cut));
            sse_response(frames, flight, Tail::Break)
        }
        Reply::BreakMidStream => {
            let frames = stream_frames(&Reply::Text("thinking".into()), &model, None, 4, false);
            sse_response(frames.into_iter().take(2).collect(), flight, Tail::Break)
        }
        Reply::Calls(calls) if stream && quirk == Quirk::Ollama => {
            sse_response(ollama_frames(&calls, &model), flight, Tail::End)
        }
        reply @ (Reply::Text(_) | Reply::Calls(_)) if stream => {
            let include_usage = received.body["stream_options"]["include_usage"] == true;
            let frames = stream_frames(
                &reply,
                &model,
                include_usage.then_some(usage),
                FRAGMENT,
                true,
            );
            sse_response(frames, flight, Tail::End)
        }
        reply @ (Reply::Text(_) | Reply::Calls(_)) => {
            flight.done = true;
            json_response(200, &completion(&reply, &model, usage))
        }
        Reply::WaitInFlight(..) => unreachable!("unwrapped above"),
    }
}

/// Deterministic usage: 10 prompt tokens a message, 5 completion tokens.
fn usage_for(r: &Received) -> (u64, u64) {
    (r.messages().len() as u64 * 10, 5)
}

fn json_response(status: u16, body: &Value) -> Response {
    Response::builder()
        .status(StatusCode::from_u16(status).unwrap())
        .header("content-type", "application/json")
        .body(Body::from(body.to_string()))
        .unwrap()
}

fn message_of(reply: &Reply) -> (Value, &'static str) {
    match reply {
        Reply::Text(t) => (json!({"role": "assistant", "content": t}), "stop"),
        Reply::Calls(calls) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| {
                    json!({"id": format!("call_{i}"), "type": "function",
                           "function": {"name": name, "arguments": args}})
                })
                .collect();
            (
                json!({"role": "assistant", "content": null, "tool_calls": calls}),
                "tool_calls",
            )
        }
        other => panic!("not a model reply: {other:?}"),
    }
}

/// A plain completion body.
pub fn completion(reply: &Reply, model: &str, usage: (u64, u64)) -> Value {
    let (message, finish) = message_of(reply);
    json!({
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": 0,
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": usage.0, "completion_tokens": usage.1,
                  "total_tokens": usage.0 + usage.1}
    })
}

/// A responder that completes any stage: the fanout plan lists `width`
/// items (read from its prompt), a worker first echoes its item, then
/// submits it; every other completion tool gets a payload synthesized from
/// its parameters schema.
pub fn pipeline_responder(r: &Received) -> Reply {
    let tool = r.completion_tool();
    let prompt = r.system_prompt();
    let number_after = |marker: &str| -> Option<i64> {
        let rest = &prompt[prompt.find(marker)? + marker.len()..];
        let digits: String = rest
            .trim_start()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    match tool.as_str() {
        "submit_items" => {
            let width = number_after("Produce").unwrap_or(0);
            Reply::call(
                "submit_items",
                json!({"items": (0..width).collect::<Vec<_>>()}),
            )
        }
        "submit_item" => {
            let item = number_after("work item").unwrap_or(-1);
            if r.turns_so_far() == 0 {
                Reply::call("Echo", json!({"text": format!("item {item}")}))
            } else {
                Reply::call(
                    "submit_item",
                    json!({"item": item, "summary": format!("done {item}")}),
                )
            }
        }
        _ => {
            let params = r.body["tools"]
                .as_array()
                .and_then(|ts| ts.last())
                .map(|t| t["function"]["parameters"].clone())
                .unwrap_or(Value::Null);
            Reply::call(&tool, troupe::provider::synth::synthesize(&params))
        }
    }
}
