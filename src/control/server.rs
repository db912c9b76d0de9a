//! The control server of one run: an axum router on a Unix socket, on a
//! small runtime of its own so that no client can slow the actors.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/runs` | the runs this server hosts |
//! | GET | `/v1/runs/{id}` | describe the run |
//! | GET | `/v1/runs/{id}/events?from=SEQ` | its events as SSE (`id:` is `seq`), from the audit log, live until `WorkflowExit` |
//! | GET | `/v1/runs/{id}/pending` | approvals waiting for an API answer |
//! | POST | `/v1/runs/{id}/pending/{proposal}` | answer one: `{"answer": "approve", "client": "name"}` |
//! | POST | `/v1/runs/{id}/cancel` | cancel the run strictly, as Ctrl-C does |

use std::io::{BufRead, Seek};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures::Stream;
use serde_json::{Value, json};

use crate::runtime::interaction::{Answer, AnswerRemote, ListPending, RemoteDesk};

/// The socket's file name in a run folder.
pub const SOCKET_NAME: &str = "control.sock";

/// Bodies larger than this are refused (`Control/BodyTooLarge`).
const MAX_BODY: usize = 64 * 1024;

/// How often a stream at the end of the log looks for more.
const FOLLOW_POLL: Duration = Duration::from_millis(20);

/// What the server reaches of its run.
pub struct RunControl {
    pub run_id: String,
    pub pipeline: String,
    pub audit_path: PathBuf,
    /// Cancels the run strictly (the first Ctrl-C's path).
    pub cancel: Arc<dyn Fn() + Send + Sync>,
    /// The run's API interactor, when it has one (`--remote`).
    pub desk: Option<Arc<RemoteDesk>>,
    /// Human steps' questions open to API clients (`--remote`).
    pub questions: Option<Arc<crate::runtime::ask::QuestionDesk>>,
}

impl std::fmt::Debug for RunControl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunControl")
            .field("run_id", &self.run_id)
            .finish()
    }
}

/// A serving control socket; dropping it lets the event streams finish
/// (they end at `WorkflowExit`), then stops serving and removes the
/// socket.
#[derive(Debug)]
pub struct ControlServer {
    path: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

impl ControlServer {
    /// Serves `control` on `socket` (mode 0600). A socket that answers is
    /// another server's: refused. A stale one (nothing listening) is
    /// replaced.
    pub fn start(socket: &Path, control: RunControl) -> std::io::Result<ControlServer> {
        if socket.exists() {
            if std::os::unix::net::UnixStream::connect(socket).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{} is served by another process", socket.display()),
                ));
            }
            std::fs::remove_file(socket)?;
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("troupe-control")
            .enable_all()
            .build()?;
        let listener = {
            let _enter = rt.enter();
            tokio::net::UnixListener::bind(socket)?
        };
        std::fs::set_permissions(socket, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
        let app = router(Arc::new(control));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = rt.spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async {
                    let _ = stopped.await;
                })
                .await;
        });
        Ok(ControlServer {
            path: socket.to_owned(),
            stop: Some(stop),
            served: Some(served),
            rt: Some(rt),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let (Some(rt), Some(served)) = (self.rt.take(), self.served.take()) {
            // Streams end at the log's `WorkflowExit`; a client that stopped
            // reading gets two seconds, not the process's life.
            std::thread::scope(|s| {
                s.spawn(|| {
                    rt.block_on(async {
                        let _ = tokio::time::timeout(Duration::from_secs(2), served).await;
                    });
                });
            });
            rt.shutdown_background();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

fn router(control: Arc<RunControl>) -> Router {
    Router::new()
        .route("/v1/runs", get(list_runs))
        .route("/v1/runs/{id}", get(describe))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/pending", get(pending))
        .route("/v1/runs/{id}/pending/{proposal}", post(answer))
        .route("/v1/runs/{id}/cancel", post(cancel))
        .route("/v1/runs/{id}/questions", get(questions))
        .route("/v1/runs/{id}/questions/{execution}", post(answer_question))
        .fallback(not_found)
        .layer(axum::middleware::map_response(typed_rejections))
        .with_state(control)
}

/// The router's own refusals (a path that does not decode, a method a
/// route does not take) as typed errors like every other: a client never
/// gets an error that is not `{"error": {"code", "message"}}`.
async fn typed_rejections(response: Response) -> Response {
    let status = response.status();
    let typed = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || typed {
        return response;
    }
    let body = axum::body::to_bytes(response.into_body(), 4096)
        .await
        .unwrap_or_default();
    let message = String::from_utf8_lossy(&body).into_owned();
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "Control/MethodNotAllowed",
        StatusCode::PAYLOAD_TOO_LARGE => "Control/BodyTooLarge",
        _ if status.is_server_error() => "Control/ServerError",
        _ => "Control/BadRequest",
    };
    error(status, code, message)
}

/// A typed error, as the CLI's codes are.
fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    let body = json!({"error": {"code": code, "message": message.into()}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn ok_json(body: &Value) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// Reads the body it refuses: a POST answered before its body was read
/// has its connection reset under the client, which then never sees the
/// typed error (found by the bad-requests property test).
async fn not_found(_body: Bytes) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "Control/NoSuchEndpoint",
        "no such endpoint; see docs/control-api.md",
    )
}

/// The error for a run this server does not host; `None` when it does.
fn check_run(control: &RunControl, id: &str) -> Option<Response> {
    if id == control.run_id {
        None
    } else {
        Some(error(
            StatusCode::NOT_FOUND,
            "Control/RunNotFound",
            format!("this server hosts run {}, not {id}", control.run_id),
        ))
    }
}

/// The run's status from its audit log's last `WorkflowExit`, if any.
fn status(audit_path: &Path) -> (String, u64) {
    let Ok(file) = std::fs::File::open(audit_path) else {
        return ("starting".to_owned(), 0);
    };
    let mut status = "running".to_owned();
    let mut last_seq = 0;
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(v) = serde_json::from_str::<Value>(&line) else {
            continue;
        };
        last_seq = v["seq"].as_u64().unwrap_or(last_seq);
        if v["event"] == "WorkflowExit" {
            status = v["status"].as_str().unwrap_or("ended").to_owned();
        }
    }
    (status, last_seq)
}

async fn describe_value(control: &RunControl) -> Value {
    let path = control.audit_path.clone();
    let (status, last_seq) = tokio::task::spawn_blocking(move || status(&path))
        .await
        .unwrap_or_else(|_| ("unknown".to_owned(), 0));
    let pending = match control.desk.as_ref().and_then(|d| d.get()) {
        Some(addr) => addr.send(ListPending).await.map(|p| p.len()).unwrap_or(0),
        None => 0,
    };
    json!({
        "runId": control.run_id,
        "pipeline": control.pipeline,
        "status": status,
        "lastSeq": last_seq,
        "pending": pending,
        "remoteAnswers": control.desk.is_some(),
        "auditPath": control.audit_path.display().to_string(),
    })
}

async fn list_runs(State(control): State<Arc<RunControl>>) -> Response {
    ok_json(&json!({"runs": [describe_value(&control).await]}))
}

async fn describe(
    State(control): State<Arc<RunControl>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    ok_json(&describe_value(&control).await)
}

async fn pending(State(control): State<Arc<RunControl>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    let list = match control.desk.as_ref().and_then(|d| d.get()) {
        Some(addr) => addr.send(ListPending).await.unwrap_or_default(),
        None => Vec::new(),
    };
    ok_json(&json!({"pending": list}))
}

async fn answer(
    State(control): State<Arc<RunControl>>,
    UrlPath((id, proposal)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    if body.len() > MAX_BODY {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Control/BodyTooLarge",
            format!("bodies are at most {MAX_BODY} bytes"),
        );
    }
    let Some(addr) = control.desk.as_ref().and_then(|d| d.get()) else {
        return error(
            StatusCode::CONFLICT,
            "Control/NoRemoteAnswers",
            "this run takes no answers through the API: start it with --remote",
        );
    };
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Control/BadBody",
            "the body must be JSON: {\"answer\": \"approve\"|\"deny\"|\"approve-same\"|\"approve-prefix\", \"client\": NAME}",
        );
    };
    let answer = match v["answer"].as_str() {
        Some("approve") => Answer::Approve,
        Some("deny") => Answer::Deny,
        Some("approve-same") => Answer::ApproveSame,
        Some("approve-prefix") => Answer::ApprovePrefix,
        _ => {
            return error(
                StatusCode::BAD_REQUEST,
                "Control/BadBody",
                "`answer` must be approve, deny, approve-same or approve-prefix",
            );
        }
    };
    let client = v["client"]
        .as_str()
        .filter(|c| !c.is_empty() && c.len() <= 64)
        .unwrap_or("api")
        .to_owned();
    match addr
        .send(AnswerRemote {
            proposal_id: proposal.clone(),
            answer,
            client,
        })
        .await
    {
        Ok(Ok(())) => ok_json(&json!({"ok": true, "proposalId": proposal})),
        Ok(Err(_)) => error(
            StatusCode::NOT_FOUND,
            "Control/NotPending",
            format!(
                "no approval {proposal} is waiting: it was decided, withdrawn, or never raised"
            ),
        ),
        Err(_) => error(StatusCode::GONE, "Control/RunEnded", "the run is over"),
    }
}

async fn questions(
    State(control): State<Arc<RunControl>>,
    UrlPath(id): UrlPath<String>,
) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    let list = control
        .questions
        .as_ref()
        .map(|q| q.list())
        .unwrap_or_default();
    ok_json(&json!({"questions": list}))
}

async fn answer_question(
    State(control): State<Arc<RunControl>>,
    UrlPath((id, execution)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    use crate::runtime::ask::Refused;
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    if body.len() > MAX_BODY {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Control/BodyTooLarge",
            format!("bodies are at most {MAX_BODY} bytes"),
        );
    }
    let Some(desk) = &control.questions else {
        return error(
            StatusCode::CONFLICT,
            "Control/NoRemoteAnswers",
            "this run takes no answers through the API: start it with --remote",
        );
    };
    let Ok(content) = serde_json::from_slice::<Value>(&body) else {
        return error(
            StatusCode::BAD_REQUEST,
            "Control/BadBody",
            "the body must be the answer, a JSON object",
        );
    };
    let client = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("client=")))
        .filter(|c| !c.is_empty() && c.len() <= 64)
        .unwrap_or("api")
        .to_owned();
    match desk.answer(&execution, content, &client) {
        Ok(()) => ok_json(&json!({"ok": true, "stageExecutionId": execution})),
        Err(Refused::NotAsked) => error(
            StatusCode::NOT_FOUND,
            "Control/NotAsked",
            format!(
                "no question of {execution} is open: it was answered, its step ended, or it never asked"
            ),
        ),
        Err(Refused::Invalid(errors)) => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Control/AnswerInvalid",
            format!(
                "the answer does not match the step's fields: {}",
                errors.join("; ")
            ),
        ),
    }
}

async fn cancel(State(control): State<Arc<RunControl>>, UrlPath(id): UrlPath<String>) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    (control.cancel)();
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"ok": true, "cancelling": control.run_id}).to_string(),
    )
        .into_response()
}

async fn events(
    State(control): State<Arc<RunControl>>,
    UrlPath(id): UrlPath<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    if let Some(e) = check_run(&control, &id) {
        return e;
    }
    // `Last-Event-ID` (a reconnecting client) wins over `?from=`.
    let from_header = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let from_query = query.as_deref().and_then(|q| {
        q.split('&')
            .find_map(|kv| kv.strip_prefix("from="))
            .map(|v| v.parse::<u64>())
    });
    let after = match (from_header, from_query) {
        (Some(seq), _) => seq,
        (None, Some(Ok(seq))) => seq,
        (None, Some(Err(_))) => {
            return error(
                StatusCode::BAD_REQUEST,
                "Control/BadQuery",
                "`from` must be a sequence number",
            );
        }
        (None, None) => 0,
    };
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        axum::body::Body::from_stream(follow(control.audit_path.clone(), after)),
    )
        .into_response()
}

/// An audit line's `seq` and event name, read from the fixed head the
/// audit writer gives every line (`{"seq":N,"ts":…,"event":"…"`): ten
/// watchers cost ten scans of a line, not ten parses. `None` for a line
/// without that head.
pub fn line_head(line: &str) -> Option<(u64, &str)> {
    let rest = line.strip_prefix("{\"seq\":")?;
    let digits = rest.find(|c: char| !c.is_ascii_digit())?;
    let seq = rest[..digits].parse::<u64>().ok()?;
    let event_at = rest.find("\"event\":\"")? + "\"event\":\"".len();
    let name = &rest[event_at..];
    Some((seq, &name[..name.find('"')?]))
}

/// A log line's `seq` and whether it is the `WorkflowExit`; a line
/// without the writer's head is parsed.
fn seq_and_exit(line: &str) -> Option<(u64, bool)> {
    line_head(line)
        .map(|(seq, event)| (seq, event == "WorkflowExit"))
        .or_else(|| {
            let v: Value = serde_json::from_str(line).ok()?;
            Some((v["seq"].as_u64()?, v["event"] == "WorkflowExit"))
        })
}

/// Events of one batch are written as one piece: a write per event per
/// watcher would cost more than the run (measured: ten watchers of a
/// 100 000-wide run).
const BATCH_BYTES: usize = 256 * 1024;

/// Idle polls between keep-alive comments (about 15 s).
const KEEP_ALIVE_POLLS: u32 = 750;

/// The audit log's lines with `seq` > `after`, as Server-Sent Events
/// (`id: <seq>`, `data: <line>`), in batches of what was appended at once,
/// following the file until its `WorkflowExit`.
fn follow(
    path: PathBuf,
    after: u64,
) -> impl Stream<Item = Result<Bytes, std::convert::Infallible>> {
    struct Tail {
        path: PathBuf,
        offset: u64,
        partial: String,
        after: u64,
        done: bool,
        /// The last whole line read was a `WorkflowExit`.
        last_was_exit: bool,
        idle: u32,
    }
    let tail = Tail {
        path,
        offset: 0,
        partial: String::new(),
        after,
        done: false,
        last_was_exit: false,
        idle: 0,
    };
    futures::stream::unfold(tail, |mut t| async move {
        loop {
            if t.done {
                return None;
            }
            // Read what was appended since last time.
            let (path, offset) = (t.path.clone(), t.offset);
            let read = tokio::task::spawn_blocking(move || -> std::io::Result<Vec<u8>> {
                let mut f = std::fs::File::open(&path)?;
                f.seek(std::io::SeekFrom::Start(offset))?;
                let mut buf = Vec::new();
                std::io::Read::read_to_end(
                    &mut std::io::Read::take(&mut f, BATCH_BYTES as u64),
                    &mut buf,
                )?;
                Ok(buf)
            })
            .await;
            let (grew, at_end) = match read {
                Ok(Ok(buf)) if !buf.is_empty() => {
                    t.offset += buf.len() as u64;
                    let at_end = buf.len() < BATCH_BYTES;
                    t.partial.push_str(&String::from_utf8_lossy(&buf));
                    (true, at_end)
                }
                _ => (false, true),
            };
            let mut batch = String::new();
            if grew {
                // Whole lines only: a line still being written waits. One
                // pass with a cursor, then one drain.
                let mut start = 0;
                while let Some(len) = t.partial[start..].find('\n') {
                    let line = t.partial[start..start + len].trim_end();
                    start += len + 1;
                    let Some((seq, exit)) = seq_and_exit(line) else {
                        continue;
                    };
                    t.last_was_exit = exit;
                    if seq > t.after {
                        t.after = seq;
                        batch.push_str("id: ");
                        batch.push_str(&seq.to_string());
                        batch.push_str("\ndata: ");
                        batch.push_str(line);
                        batch.push_str("\n\n");
                    }
                }
                t.partial.drain(..start);
            }
            // The run is over when the log ends with its exit (a resumed
            // run's earlier exit is followed by more).
            if at_end && t.last_was_exit && t.partial.is_empty() {
                t.done = true;
            }
            if !batch.is_empty() {
                t.idle = 0;
                return Some((Ok(Bytes::from(batch)), t));
            }
            if t.done {
                return None;
            }
            if !grew {
                t.idle += 1;
                if t.idle >= KEEP_ALIVE_POLLS {
                    t.idle = 0;
                    return Some((Ok(Bytes::from_static(b": keep-alive\n\n")), t));
                }
                tokio::time::sleep(FOLLOW_POLL).await;
            }
        }
    })
}
