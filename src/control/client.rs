//! The control API's client, for the CLI: HTTP/1.1 over the run's Unix
//! socket (reqwest's Unix-socket connector), typed errors for every way a
//! call can fail, and the SSE event stream read line by line.

use std::path::{Path, PathBuf};

use futures::StreamExt;
use serde_json::Value;

use super::server::SOCKET_NAME;
use crate::error::{Code, ErrorClass, HasCode};
use crate::provider::openai::SseDecoder;

/// Why a control call failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ControlError {
    pub code: &'static str,
    pub message: String,
}

impl ControlError {
    fn new(code: &'static str, message: impl Into<String>) -> ControlError {
        ControlError {
            code,
            message: message.into(),
        }
    }
}

impl HasCode for ControlError {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::Control,
            name: self.code,
        }
    }
}

/// The control socket of the run whose id starts with `run` under
/// `runs_dir` (ids are long: a prefix that picks one run will do).
pub fn find_socket(runs_dir: &Path, run: &str) -> Result<(String, PathBuf), ControlError> {
    let (id, dir) = find_run(runs_dir, run)?;
    let socket = dir.join(SOCKET_NAME);
    if !socket.exists() {
        return Err(ControlError::new(
            "NotServing",
            format!("run {id} is not running (no {SOCKET_NAME} in its folder)"),
        ));
    }
    // A socket left by a killed process refuses connections: the run is
    // not served there (a server that resumed it may serve it instead).
    match std::os::unix::net::UnixStream::connect(&socket) {
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => Err(ControlError::new(
            "NotServing",
            format!(
                "run {id} is not running here (its {SOCKET_NAME} is stale: the process that served it is gone)"
            ),
        )),
        _ => Ok((id, socket)),
    }
}

/// The folder of the run whose id starts with `run` under `runs_dir`.
pub fn find_run(runs_dir: &Path, run: &str) -> Result<(String, PathBuf), ControlError> {
    let entries = std::fs::read_dir(runs_dir).map_err(|e| {
        ControlError::new(
            "RunNotFound",
            format!("cannot read the runs folder {}: {e}", runs_dir.display()),
        )
    })?;
    let mut found: Vec<(String, PathBuf)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(run).then(|| (name, e.path()))
        })
        .collect();
    found.sort();
    match found.len() {
        0 => Err(ControlError::new(
            "RunNotFound",
            format!("no run {run} in {}", runs_dir.display()),
        )),
        1 => Ok(found.remove(0)),
        n => Err(ControlError::new(
            "AmbiguousRun",
            format!("{n} runs start with {run}: give more of the id"),
        )),
    }
}

/// Percent-encodes one path segment: a proposal id holds `/` and `#`.
pub fn encode_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Where a control server is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A Unix socket: a run's own, or a server's.
    Unix(PathBuf),
    /// A server's TCP listener (`http://HOST:PORT`), with its token.
    Http { base: String, token: Option<String> },
}

impl Target {
    /// `unix:PATH`, `http://HOST:PORT` or `tcp:HOST:PORT`; the token of a
    /// TCP server is `token`.
    pub fn parse(text: &str, token: Option<String>) -> Result<Target, ControlError> {
        if let Some(path) = text.strip_prefix("unix:") {
            return Ok(Target::Unix(PathBuf::from(path)));
        }
        let host = text
            .strip_prefix("tcp:")
            .or_else(|| text.strip_prefix("http://"))
            .map(|h| h.trim_end_matches('/'));
        match host {
            Some(h) if h.parse::<std::net::SocketAddr>().is_ok() || h.contains(':') => {
                Ok(Target::Http {
                    base: format!("http://{h}"),
                    token,
                })
            }
            _ => Err(ControlError::new(
                "BadServer",
                format!("--server {text}: give unix:PATH, http://HOST:PORT or tcp:HOST:PORT"),
            )),
        }
    }
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Unix(p) => write!(f, "{}", p.display()),
            Target::Http { base, .. } => write!(f, "{base}"),
        }
    }
}

/// How long a connection to a control server may take.
const CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long a control server may send nothing at all: four times the
/// keep-alive an event stream sends while a run is quiet (about every
/// 15 s), and far past any other reply. A server that accepted the
/// connection and went silent is unreachable past it, not waited for.
const READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long a submission or a resume may wait for its answer: the server
/// answers once the run is prepared, after its MCP servers started and
/// listed their tools (each within its `startTimeout`, a minute by
/// default, tried twice) and, for a resume, its log was repaired.
const PREPARE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15 * 60);

/// A client of one control server.
#[derive(Debug, Clone)]
pub struct ControlClient {
    http: reqwest::Client,
    /// The same, waiting [`PREPARE_TIMEOUT`] for a reply: submissions.
    patient: reqwest::Client,
    target: Target,
    base: String,
}

impl ControlClient {
    /// A client of a run's (or a server's) Unix socket.
    pub fn new(socket: &Path) -> Result<ControlClient, ControlError> {
        ControlClient::to(&Target::Unix(socket.to_owned()))
    }

    pub fn to(target: &Target) -> Result<ControlClient, ControlError> {
        ControlClient::waiting(target, CONNECT_TIMEOUT, READ_TIMEOUT)
    }

    /// A client that gives up on a connection after `connect`, and on a
    /// server that sends nothing for `read`.
    fn waiting(
        target: &Target,
        connect: std::time::Duration,
        read: std::time::Duration,
    ) -> Result<ControlClient, ControlError> {
        let failed = |e: reqwest::Error| ControlError::new("ClientFailed", e.to_string());
        let mut headers = reqwest::header::HeaderMap::new();
        if let Target::Http {
            token: Some(token), ..
        } = target
        {
            let mut value = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))
                .map_err(|_| {
                    ControlError::new("BadToken", "the token cannot be sent as a header")
                })?;
            value.set_sensitive(true);
            headers.insert(reqwest::header::AUTHORIZATION, value);
        }
        let build = |read: std::time::Duration| {
            let builder = match target {
                Target::Unix(socket) => reqwest::Client::builder().unix_socket(socket.clone()),
                Target::Http { .. } => reqwest::Client::builder().default_headers(headers.clone()),
            };
            builder
                .connect_timeout(connect)
                .read_timeout(read)
                .build()
                .map_err(failed)
        };
        let base = match target {
            Target::Unix(_) => "http://troupe".to_owned(),
            Target::Http { base, .. } => base.clone(),
        };
        Ok(ControlClient {
            http: build(read)?,
            patient: build(read.max(PREPARE_TIMEOUT))?,
            target: target.clone(),
            base,
        })
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    fn unreachable(&self, e: &reqwest::Error) -> ControlError {
        ControlError::new(
            "Unreachable",
            format!("cannot reach {} ({e}); is it still running?", self.target),
        )
    }

    /// Turns a response into its JSON, or the server's typed error.
    async fn json(&self, response: reqwest::Response) -> Result<Value, ControlError> {
        let ok = response.status().is_success();
        let body: Value = response.json().await.map_err(|e| {
            ControlError::new("BadReply", format!("the server's reply is not JSON: {e}"))
        })?;
        if ok {
            return Ok(body);
        }
        let code = body["error"]["code"].as_str().unwrap_or("Control/Failed");
        let message = body["error"]["message"]
            .as_str()
            .unwrap_or("the server refused");
        // The server's code is one of ours; keep its name.
        let name = match code.strip_prefix("Control/") {
            Some("RunNotFound") => "RunNotFound",
            Some("NotPending") => "NotPending",
            Some("NoRemoteAnswers") => "NoRemoteAnswers",
            Some("RunEnded") => "RunEnded",
            Some("BadBody") => "BadBody",
            Some("NotAsked") => "NotAsked",
            Some("AnswerInvalid") => "AnswerInvalid",
            Some("Unauthorized") => "Unauthorized",
            Some("AmbiguousRun") => "AmbiguousRun",
            Some("ShuttingDown") => "ShuttingDown",
            Some("RunActive") => "RunActive",
            Some("BadArgs") => "BadArgs",
            Some("NoDashboard") => "NoDashboard",
            Some("PipelineNotAllowed") => "PipelineNotAllowed",
            Some("OptionNotAllowed") => "OptionNotAllowed",
            Some("InsideRun") => "InsideRun",
            Some(_) | None => {
                // A refused submission keeps the run's own code
                // (`Validation/…`, `Store/…`, `Provider/…`).
                return Err(ControlError {
                    code: "Refused",
                    message: crate::error::with_code(code, message),
                });
            }
        };
        Err(ControlError::new(name, message.to_owned()))
    }

    async fn get(&self, path: &str) -> Result<Value, ControlError> {
        let r = self
            .http
            .get(self.url(path))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.json(r).await
    }

    async fn post(&self, path: &str, body: &Value) -> Result<Value, ControlError> {
        self.post_with(&self.http, path, body).await
    }

    async fn post_with(
        &self,
        http: &reqwest::Client,
        path: &str,
        body: &Value,
    ) -> Result<Value, ControlError> {
        let r = http
            .post(self.url(path))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        self.json(r).await
    }

    /// A new one-time login link to the server's dashboard (a URL); the
    /// last one stops working.
    pub async fn dashboard_login(&self) -> Result<String, ControlError> {
        let v = self.post("/v1/dashboard/login", &Value::Null).await?;
        Ok(v["url"].as_str().unwrap_or_default().to_owned())
    }

    /// Lists the runs the server hosts.
    pub async fn runs(&self) -> Result<Vec<Value>, ControlError> {
        let v = self.get("/v1/runs").await?;
        Ok(v["runs"].as_array().cloned().unwrap_or_default())
    }

    /// Submits a run (`troupe run`'s arguments); its id.
    pub async fn submit(
        &self,
        args: &[String],
        cwd: &Path,
        client: &str,
    ) -> Result<String, ControlError> {
        let body = serde_json::json!({"args": args, "cwd": cwd, "client": client});
        let v = self.post_with(&self.patient, "/v1/runs", &body).await?;
        Ok(v["runId"].as_str().unwrap_or_default().to_owned())
    }

    /// Resumes a stopped run inside the server; its id.
    pub async fn resume(
        &self,
        run: &str,
        args: &[String],
        cwd: &Path,
        client: &str,
    ) -> Result<String, ControlError> {
        let body = serde_json::json!({"args": args, "cwd": cwd, "client": client});
        let v = self
            .post_with(
                &self.patient,
                &format!("/v1/runs/{}/resume", encode_segment(run)),
                &body,
            )
            .await?;
        Ok(v["runId"].as_str().unwrap_or_default().to_owned())
    }

    pub async fn describe(&self, run: &str) -> Result<Value, ControlError> {
        self.get(&format!("/v1/runs/{run}")).await
    }

    pub async fn pending(&self, run: &str) -> Result<Vec<Value>, ControlError> {
        let v = self.get(&format!("/v1/runs/{run}/pending")).await?;
        Ok(v["pending"].as_array().cloned().unwrap_or_default())
    }

    pub async fn answer(
        &self,
        run: &str,
        proposal: &str,
        answer: &str,
        client: &str,
    ) -> Result<Value, ControlError> {
        let body = serde_json::json!({"answer": answer, "client": client});
        self.post(
            &format!("/v1/runs/{run}/pending/{}", encode_segment(proposal)),
            &body,
        )
        .await
    }

    pub async fn questions(&self, run: &str) -> Result<Vec<Value>, ControlError> {
        let v = self.get(&format!("/v1/runs/{run}/questions")).await?;
        Ok(v["questions"].as_array().cloned().unwrap_or_default())
    }

    pub async fn answer_question(
        &self,
        run: &str,
        execution: &str,
        content: &Value,
        client: &str,
    ) -> Result<Value, ControlError> {
        self.post(
            &format!(
                "/v1/runs/{run}/questions/{}?client={}",
                encode_segment(execution),
                encode_segment(client)
            ),
            content,
        )
        .await
    }

    pub async fn cancel(&self, run: &str) -> Result<Value, ControlError> {
        self.post(&format!("/v1/runs/{run}/cancel"), &Value::Null)
            .await
    }

    /// Streams the run's events after `from` to `each` (an audit line),
    /// until the run's `WorkflowExit` or the server goes away; `settled`
    /// is called after each batch that arrived together (flush there).
    pub async fn events(
        &self,
        run: &str,
        from: u64,
        mut each: impl FnMut(&str),
        mut settled: impl FnMut() -> bool,
    ) -> Result<(), ControlError> {
        let r = self
            .http
            .get(self.url(&format!("/v1/runs/{run}/events?from={from}")))
            .send()
            .await
            .map_err(|e| self.unreachable(&e))?;
        if !r.status().is_success() {
            return self.json(r).await.map(|_| ());
        }
        let mut body = r.bytes_stream();
        let mut events = SseEvents::default();
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.unreachable(&e))?;
            events.push(&chunk, &mut each)?;
            // The caller stops following (its reader went away).
            if !settled() {
                break;
            }
        }
        Ok(())
    }
}

/// The events of a stream as its chunks come, decoded by the provider's
/// SSE decoder (which keeps bytes until a line is whole, so that a
/// character the network split between two chunks is whole once both are
/// here), with a limit an audit line fits in.
#[derive(Debug)]
struct SseEvents(SseDecoder);

impl Default for SseEvents {
    fn default() -> Self {
        SseEvents(SseDecoder::with_limit(MOST_EVENT_BYTES))
    }
}

impl SseEvents {
    /// Takes `chunk`, and hands each audit line of the events it ends to
    /// `each`; an `end` event is the run refused.
    fn push(&mut self, chunk: &[u8], each: &mut impl FnMut(&str)) -> Result<(), ControlError> {
        let events = self.0.push_events(chunk).map_err(|e| {
            ControlError::new("BadReply", format!("the server's event stream: {}", e.0))
        })?;
        for event in events {
            if event.kind.as_deref() == Some("end") {
                return Err(ended(&event.data));
            }
            event.data.split('\n').for_each(&mut *each);
        }
        Ok(())
    }
}

/// The most bytes one event of the stream may take: an audit line's most
/// ([`crate::auditlog::records::MAX_RECORD`]). Past it the server is not
/// troupe's.
const MOST_EVENT_BYTES: usize = crate::auditlog::records::MAX_RECORD;

/// An `end` event's refusal: the run's session ended with no
/// `WorkflowExit` to come (refused after it was accepted, or lost).
fn ended(data: &str) -> ControlError {
    let v: Value = serde_json::from_str(data.trim()).unwrap_or(Value::Null);
    if let Some(message) = v["cancelled"]["message"].as_str() {
        return ControlError::new("RunCancelled", message);
    }
    let message = v["error"]["message"]
        .as_str()
        .unwrap_or("the run's session ended before its WorkflowExit");
    ControlError::new("RunRefused", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `chunks` make of a stream: its audit lines, or the error.
    fn read(chunks: &[&[u8]]) -> Result<Vec<String>, String> {
        let mut events = SseEvents::default();
        let mut lines = Vec::new();
        for chunk in chunks {
            events
                .push(chunk, &mut |line: &str| lines.push(line.to_owned()))
                .map_err(|e| e.to_string())?;
        }
        Ok(lines)
    }

    /// A client of `socket` that gives up on silence after 200 ms, and a
    /// runtime to drive it.
    fn impatient(socket: PathBuf) -> (ControlClient, tokio::runtime::Runtime) {
        let client = ControlClient::waiting(
            &Target::Unix(socket),
            std::time::Duration::from_secs(5),
            std::time::Duration::from_millis(200),
        )
        .expect("client");
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        (client, rt)
    }

    /// A server that accepted the connection and then sent nothing is
    /// unreachable once the read timeout has passed, not waited on for
    /// ever (without it the call would still be waiting when the test's
    /// own bound runs out).
    #[test]
    fn a_silent_server_is_unreachable_after_the_read_timeout() {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("silent.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let holder = std::thread::spawn(move || {
            // Accepts one connection and holds it, answering nothing,
            // until the test is done.
            let (conn, _) = listener.accept().expect("accept");
            let _ = held_rx.recv();
            drop(conn);
        });
        let (client, rt) = impatient(socket);
        let e = rt
            .block_on(async {
                tokio::time::timeout(
                    std::time::Duration::from_secs(20),
                    client.describe("some-run"),
                )
                .await
            })
            .expect("the client gives up by itself")
            .expect_err("a silent server answers nothing");
        assert_eq!(e.code, "Unreachable", "{e}");
        let _ = held_tx.send(());
        holder.join().expect("holder");
    }

    /// A submission waits for a server still preparing the run past the
    /// read timeout other calls give up at.
    #[test]
    fn a_submission_waits_past_the_read_timeout() {
        use std::io::{Read, Write};
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("slow.sock");
        let listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().expect("accept");
            let mut request = Vec::new();
            let mut buf = [0u8; 4096];
            while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = conn.read(&mut buf).expect("read");
                request.extend_from_slice(&buf[..n]);
            }
            // Preparing: four read timeouts of silence, then the answer.
            std::thread::sleep(std::time::Duration::from_millis(800));
            let body = "{\"runId\":\"r1\"}";
            let _ = write!(
                conn,
                "HTTP/1.1 201 Created\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
        });
        let (client, rt) = impatient(socket);
        let id = rt
            .block_on(client.submit(&[], Path::new("/"), "t"))
            .expect("the submission waited for its answer");
        assert_eq!(id, "r1");
        server.join().expect("server");
    }

    #[test]
    fn an_event_split_anywhere_reads_whole() {
        let stream = "id: 1\ndata: {\"text\":\"caf\u{e9} \u{2026} \u{1f600}\"}\n\n: keep-alive\n\ndata: {\"seq\":2}\n\n";
        let whole = read(&[stream.as_bytes()]).expect("read");
        assert_eq!(
            whole,
            ["{\"text\":\"caf\u{e9} \u{2026} \u{1f600}\"}", "{\"seq\":2}"]
        );
        let bytes = stream.as_bytes();
        // Cut in two at every byte (inside each multi-byte character and
        // between the two newlines), and a byte at a time.
        for at in 0..=bytes.len() {
            assert_eq!(
                read(&[&bytes[..at], &bytes[at..]]),
                Ok(whole.clone()),
                "{at}"
            );
        }
        let one_by_one: Vec<&[u8]> = bytes.chunks(1).collect();
        assert_eq!(read(&one_by_one), Ok(whole));
    }

    #[test]
    fn an_end_event_is_the_run_refused() {
        let stream = b"event: end\ndata: {\"error\":{\"message\":\"no room\"}}\n\n";
        let got = read(&[&stream[..7], &stream[7..]]).expect_err("refused");
        assert!(got.contains("no room"), "{got}");
    }

    #[test]
    fn an_event_without_end_past_the_most_is_an_error() {
        let mut events = SseEvents::default();
        let chunk = vec![b'x'; 1 << 20];
        let mut pushed = 0;
        let err = loop {
            match events.push(&chunk, &mut |_: &str| {}) {
                Ok(()) => pushed += chunk.len(),
                Err(e) => break e,
            }
            assert!(pushed <= MOST_EVENT_BYTES, "never refused");
        };
        assert_eq!(err.code, "BadReply");
    }
}
