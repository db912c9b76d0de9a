//! A control server: an axum router on listeners of its own (a run's Unix
//! socket; a server's socket and TCP port), on a small runtime of its own
//! so that no client can slow the actors.
//!
//! | method | path | what |
//! |---|---|---|
//! | GET | `/v1/runs` | the runs this server hosts |
//! | POST | `/v1/runs` | submit a run (`troupe serve` only) |
//! | GET | `/v1/runs/{id}` | describe the run |
//! | GET | `/v1/runs/{id}/events?from=SEQ` | its events as SSE (`id:` is `seq`), from the audit log, live until `WorkflowExit` |
//! | GET | `/v1/runs/{id}/pending` | approvals waiting for an API answer |
//! | POST | `/v1/runs/{id}/pending/{proposal}` | answer one: `{"answer": "approve", "client": "name"}` |
//! | GET | `/v1/runs/{id}/questions` | human steps' open questions |
//! | POST | `/v1/runs/{id}/questions/{execution}` | answer one (the body is the answer) |
//! | POST | `/v1/runs/{id}/cancel` | cancel the run strictly, as Ctrl-C does |
//! | POST | `/v1/runs/{id}/resume` | continue a stopped run inside the server (`troupe serve` only) |
//! | GET | `/` | the dashboard |
//! | GET | `/metrics` | Prometheus metrics of the runs hosted |

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path as UrlPath, RawQuery, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::auth::Auth;
use super::hosted::{Hosted, RunControl, Submission, Submitter};
use super::reply::{error, ok_json};
use super::stream::follow;
use crate::runtime::interaction::{Answer, AnswerRemote, ListPending};

/// The socket's file name in a run folder.
pub const SOCKET_NAME: &str = "control.sock";

/// Bodies larger than this are refused (`Control/BodyTooLarge`).
const MAX_BODY: usize = 64 * 1024;

/// How long a request's body may take to arrive once its head has
/// (`Control/RequestTimeout`): the head's own deadline is
/// `connections::HEAD_TIMEOUT`, and a body sent a byte a minute would
/// otherwise hold the connection as long as its sender liked.
const BODY_TIMEOUT: Duration = Duration::from_secs(30);

/// Where a server listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Listen {
    /// A Unix socket (mode 0600): who can open it may use it.
    Unix(PathBuf),
    /// A TCP address: every request needs the token.
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "tcp:{a}"),
        }
    }
}

/// A serving control server; dropping it lets the event streams finish
/// (they end at `WorkflowExit`), then stops serving and removes its
/// sockets.
#[derive(Debug)]
pub struct ControlServer {
    sockets: Vec<PathBuf>,
    /// Where it listens (a TCP port 0 resolved).
    pub bound: Vec<Listen>,
    stop: Option<tokio::sync::watch::Sender<bool>>,
    served: Vec<tokio::task::JoinHandle<()>>,
    rt: Option<tokio::runtime::Runtime>,
}

/// A socket that answers is another server's: refused. A stale one
/// (nothing listening) is replaced. Anything else at the path (a file a
/// mistyped `--listen unix:PATH` names) is refused, never removed.
fn claim_socket(socket: &Path) -> std::io::Result<()> {
    if let Ok(meta) = std::fs::symlink_metadata(socket) {
        if !std::os::unix::fs::FileTypeExt::is_socket(&meta.file_type()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!(
                    "{} exists and is not a socket; troupe replaces only a stale socket of its own",
                    socket.display()
                ),
            ));
        }
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AddrInUse,
                format!("{} is served by another process", socket.display()),
            ));
        }
        std::fs::remove_file(socket)?;
    }
    Ok(())
}

/// Binds `socket` with mode 0600 from its first instant. A socket is made
/// by `bind` with the mode the umask leaves (0775 under umask 002), and
/// another user could connect before a `chmod`; so it is bound in a
/// folder of mode 0700 beside it, made 0600 there, and renamed into place.
fn bind_private(socket: &Path) -> std::io::Result<std::os::unix::net::UnixListener> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let parent = socket
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    // Short, so the path stays within a socket address's 108 bytes
    // wherever the final one does.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let private = parent.join(format!(".s{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&private);
    std::fs::DirBuilder::new().mode(0o700).create(&private)?;
    let bound = (|| {
        let inside = private.join("s");
        let listener = std::os::unix::net::UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
        std::fs::rename(&inside, socket)?;
        listener.set_nonblocking(true)?;
        Ok(listener)
    })();
    let _ = std::fs::remove_dir_all(&private);
    bound
}

impl ControlServer {
    /// Serves one run's `hosted` on `socket` (mode 0600).
    pub fn start(socket: &Path, hosted: Arc<Hosted>) -> std::io::Result<ControlServer> {
        ControlServer::serve(&[Listen::Unix(socket.to_owned())], hosted, None)
    }

    /// Serves `hosted` on every listener; a TCP listener requires `auth`.
    pub fn serve(
        listens: &[Listen],
        hosted: Arc<Hosted>,
        auth: Option<Arc<Auth>>,
    ) -> std::io::Result<ControlServer> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("troupe-control")
            .enable_all()
            .build()?;
        let (stop, stopped) = tokio::sync::watch::channel(false);
        let app = router(Arc::clone(&hosted));
        let mut server = ControlServer {
            sockets: Vec::new(),
            bound: Vec::new(),
            stop: Some(stop),
            served: Vec::new(),
            rt: None,
        };
        for listen in listens {
            let stopped = stopped.clone();
            match listen {
                Listen::Unix(socket) => {
                    claim_socket(socket)?;
                    let listener = {
                        let _enter = rt.enter();
                        tokio::net::UnixListener::from_std(bind_private(socket)?)?
                    };
                    server.sockets.push(socket.clone());
                    server.bound.push(listen.clone());
                    let app = app.clone();
                    // No process this troupe started may use it (see
                    // `peers`): the socket's mode lets its user in, and
                    // they run as that user.
                    let listener = super::peers::Outsiders::new(listener);
                    server.served.push(rt.spawn(super::connections::serve(
                        listener,
                        app,
                        stopped,
                        super::connections::HEAD_TIMEOUT,
                    )));
                }
                Listen::Tcp(addr) => {
                    let Some(auth) = auth.clone() else {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::PermissionDenied,
                            "a TCP listener needs a token",
                        ));
                    };
                    let listener = {
                        let _enter = rt.enter();
                        // Not `AddrInUse`, which says another server of
                        // this project holds its socket: a TCP port in use
                        // is any program's (`Control/CannotListen`).
                        let std = std::net::TcpListener::bind(addr).map_err(|e| {
                            std::io::Error::other(format!("cannot listen on tcp:{addr}: {e}"))
                        })?;
                        std.set_nonblocking(true)?;
                        tokio::net::TcpListener::from_std(std)?
                    };
                    let bound = listener.local_addr()?;
                    server.bound.push(Listen::Tcp(bound));
                    hosted.set_dashboard(Arc::clone(&auth), bound);
                    let app = app.clone().layer(axum::middleware::from_fn_with_state(
                        auth,
                        super::auth::gate,
                    ));
                    // The token's file is readable by what a run starts:
                    // connections they make are refused (see `peers`).
                    let listener = super::peers::TcpOutsiders::new(listener);
                    server.served.push(rt.spawn(super::connections::serve(
                        listener,
                        app,
                        stopped,
                        super::connections::HEAD_TIMEOUT,
                    )));
                }
            }
        }
        server.rt = Some(rt);
        Ok(server)
    }

    /// Waits (at most `grace`) for the event streams to end, then stops.
    pub fn stop(mut self, grace: Duration) {
        self.shut(grace);
    }

    fn shut(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(true);
        }
        let served = std::mem::take(&mut self.served);
        if let Some(rt) = self.rt.take() {
            // Streams end at the log's `WorkflowExit`; a client that stopped
            // reading gets `grace`, not the process's life.
            std::thread::scope(|s| {
                s.spawn(|| {
                    rt.block_on(async {
                        let _ =
                            tokio::time::timeout(grace, futures::future::join_all(served)).await;
                    });
                });
            });
            rt.shutdown_background();
        }
        for socket in &self.sockets {
            let _ = std::fs::remove_file(socket);
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.shut(Duration::from_secs(2));
    }
}

/// The API's routes over `hosted` (no listener: the fuzz target and the
/// property tests call it directly).
pub fn router(hosted: Arc<Hosted>) -> Router {
    Router::new()
        .route("/", get(super::dashboard::page))
        .route("/dashboard.js", get(super::dashboard::script))
        .route("/dashboard.css", get(super::dashboard::style))
        .route("/login.js", get(super::dashboard::login_script))
        .route("/metrics", get(super::metrics::metrics))
        .route("/v1/runs", get(list_runs).post(submit))
        .route("/v1/runs/{id}", get(describe))
        .route("/v1/runs/{id}/events", get(events))
        .route("/v1/runs/{id}/pending", get(pending))
        .route("/v1/runs/{id}/pending/{proposal}", post(answer))
        .route("/v1/runs/{id}/cancel", post(cancel))
        .route("/v1/dashboard/login", post(dashboard_login))
        .route("/v1/runs/{id}/resume", post(resume))
        .route(
            "/v1/runs/{id}/timeline.svg",
            get(super::dashboard::timeline),
        )
        .route("/v1/runs/{id}/questions", get(questions))
        .route("/v1/runs/{id}/questions/{execution}", post(answer_question))
        .fallback(not_found)
        .layer(axum::middleware::map_response(typed_rejections))
        .layer(axum::middleware::from_fn(whole_body))
        .with_state(hosted)
}

/// Reads every request's body whole, at most `MAX_BODY`, before any route
/// sees it, so that every answer leaves the connection fit for the next
/// request. A route that answered without reading its body (a path that
/// is not there, a method it does not take, a path that does not decode)
/// left the body's bytes on the connection, which the server then closed
/// under a client about to reuse it: the client's next request, whatever
/// it was, was reset. A body over the bound is `Control/BodyTooLarge` on
/// every route, and the connection is closed after it, since the rest of
/// the body was not read; so is a body not whole within [`BODY_TIMEOUT`]
/// (`Control/RequestTimeout`).
async fn whole_body(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let (parts, body) = request.into_parts();
    let mut refused = match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, MAX_BODY))
        .await
    {
        Ok(Ok(bytes)) => {
            let request = axum::extract::Request::from_parts(parts, axum::body::Body::from(bytes));
            return next.run(request).await;
        }
        Ok(Err(_)) => error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "Control/BodyTooLarge",
            format!("bodies are at most {MAX_BODY} bytes"),
        ),
        Err(_) => error(
            StatusCode::REQUEST_TIMEOUT,
            "Control/RequestTimeout",
            format!(
                "the request's body did not arrive within {} s",
                BODY_TIMEOUT.as_secs()
            ),
        ),
    };
    refused.headers_mut().insert(
        header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    refused
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
    let mut message = String::from_utf8_lossy(&body).into_owned();
    if message.trim().is_empty() {
        message = match status {
            StatusCode::METHOD_NOT_ALLOWED => {
                "this endpoint does not take that method (see docs/control-api.md)".to_owned()
            }
            _ => status.canonical_reason().unwrap_or("refused").to_owned(),
        };
    }
    let code = match status {
        StatusCode::METHOD_NOT_ALLOWED => "Control/MethodNotAllowed",
        StatusCode::PAYLOAD_TOO_LARGE => "Control/BodyTooLarge",
        _ if status.is_server_error() => "Control/ServerError",
        _ => "Control/BadRequest",
    };
    error(status, code, message)
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

/// The hosted run `id` names, or the typed error.
fn find(hosted: &Hosted, id: &str) -> Result<Arc<RunControl>, Box<Response>> {
    hosted.get(id).map_err(|(status, code, message)| {
        Box::new(error(
            StatusCode::from_u16(status).unwrap_or(StatusCode::NOT_FOUND),
            code,
            message,
        ))
    })
}

async fn list_runs(State(hosted): State<Arc<Hosted>>) -> Response {
    let mut runs = Vec::new();
    for run in hosted.all() {
        runs.push(run.describe().await);
    }
    ok_json(&json!({"runs": runs}))
}

async fn describe(State(hosted): State<Arc<Hosted>>, UrlPath(id): UrlPath<String>) -> Response {
    match find(&hosted, &id) {
        Ok(control) => ok_json(&control.describe().await),
        Err(e) => *e,
    }
}

/// A submission's body: `{"args": [...], "cwd": "/abs", "client": "name"}`.
fn submission(body: &Bytes) -> Result<Submission, Box<Response>> {
    let bad = || {
        Box::new(error(
            StatusCode::BAD_REQUEST,
            "Control/BadBody",
            "the body must be JSON: {\"args\": [\"<pipeline>\", \"--ctx\", \"k=v\", ...], \"cwd\": \"/abs/dir\", \"client\": NAME}",
        ))
    };
    let v: Value = serde_json::from_slice(body).map_err(|_| bad())?;
    let args = v["args"]
        .as_array()
        .and_then(|a| {
            a.iter()
                .map(|x| x.as_str().map(str::to_owned))
                .collect::<Option<Vec<_>>>()
        })
        .ok_or_else(bad)?;
    let cwd = match &v["cwd"] {
        Value::Null => None,
        Value::String(p) if Path::new(p).is_absolute() => Some(PathBuf::from(p)),
        _ => return Err(bad()),
    };
    Ok(Submission {
        args,
        cwd,
        client: client_name(v["client"].as_str()),
    })
}

/// A client's name as the audit log records it.
/// The name a client gave itself: at most 64 characters and none a
/// control character (it is audited and shown), else `api`; the same rule
/// as a question's answerer.
fn client_name(given: Option<&str>) -> String {
    given
        .filter(|c| {
            !c.trim().is_empty() && c.chars().count() <= 64 && !c.chars().any(char::is_control)
        })
        .unwrap_or("api")
        .to_owned()
}

fn refused((status, body): (u16, Value)) -> Response {
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::UNPROCESSABLE_ENTITY),
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

fn no_submitter() -> Response {
    error(
        StatusCode::CONFLICT,
        "Control/NotAServer",
        "this socket serves one run; submit and resume through `troupe serve`",
    )
}

fn closed() -> Response {
    error(
        StatusCode::SERVICE_UNAVAILABLE,
        "Control/ShuttingDown",
        "the server is going down and takes no new runs",
    )
}

/// The server's submitter and the submission `body` holds, or why not.
fn accept(
    hosted: &Hosted,
    body: &Bytes,
) -> Result<(Arc<dyn Submitter>, Submission), Box<Response>> {
    let Some(submitter) = hosted.submitter.clone() else {
        return Err(Box::new(no_submitter()));
    };
    if hosted.is_closed() {
        return Err(Box::new(closed()));
    }
    Ok((submitter, submission(body)?))
}

async fn submit(State(hosted): State<Arc<Hosted>>, body: Bytes) -> Response {
    let (submitter, submission) = match accept(&hosted, &body) {
        Ok(s) => s,
        Err(e) => return *e,
    };
    match submitter.submit(submission).await {
        Ok(id) => (
            StatusCode::CREATED,
            [(header::CONTENT_TYPE, "application/json")],
            json!({"runId": id}).to_string(),
        )
            .into_response(),
        Err(e) => refused(e),
    }
}

async fn resume(
    State(hosted): State<Arc<Hosted>>,
    UrlPath(id): UrlPath<String>,
    body: Bytes,
) -> Response {
    let (submitter, submission) = match accept(&hosted, &body) {
        Ok(s) => s,
        Err(e) => return *e,
    };
    match submitter.resume(id, submission).await {
        Ok(id) => ok_json(&json!({"runId": id})),
        Err(e) => refused(e),
    }
}

async fn pending(State(hosted): State<Arc<Hosted>>, UrlPath(id): UrlPath<String>) -> Response {
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    let list = match control.desk.as_ref().and_then(|d| d.get()) {
        Some(addr) => addr.send(ListPending).await.unwrap_or_default(),
        None => Vec::new(),
    };
    ok_json(&json!({"pending": list}))
}

async fn answer(
    State(hosted): State<Arc<Hosted>>,
    UrlPath((id, proposal)): UrlPath<(String, String)>,
    body: Bytes,
) -> Response {
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    let Some(addr) = control.desk.as_ref().and_then(|d| d.get()) else {
        return error(
            StatusCode::CONFLICT,
            "Control/NoRemoteAnswers",
            "this run takes no answers through the API: a run started without --remote, or one a `troupe serve --pipelines` hosts, whose approvals are not its clients' to give",
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

async fn questions(State(hosted): State<Arc<Hosted>>, UrlPath(id): UrlPath<String>) -> Response {
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    let list = control
        .questions
        .as_ref()
        .map(|q| q.list())
        .unwrap_or_default();
    ok_json(&json!({"questions": list}))
}

async fn answer_question(
    State(hosted): State<Arc<Hosted>>,
    UrlPath((id, execution)): UrlPath<(String, String)>,
    RawQuery(query): RawQuery,
    body: Bytes,
) -> Response {
    use crate::runtime::ask::Refused;
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
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
    // The name as the client wrote it (`troupe answer --client "Jane Doe"`
    // sends `Jane%20Doe`): decoded, then at most 64 characters and none a
    // control character, else `api`.
    let client = query
        .as_deref()
        .and_then(|q| q.split('&').find_map(|kv| kv.strip_prefix("client=")))
        .map(|c| crate::telemetry::percent_decoded(&c.replace('+', " ")))
        .filter(|c| {
            !c.trim().is_empty() && c.chars().count() <= 64 && !c.chars().any(char::is_control)
        })
        .unwrap_or_else(|| "api".to_owned());
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

/// A new one-time login link to the dashboard, voiding the last one.
async fn dashboard_login(State(hosted): State<Arc<Hosted>>) -> Response {
    match hosted.fresh_login() {
        Some(Ok(url)) => ok_json(&json!({ "url": url })),
        Some(Err(e)) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "Control/ServerError",
            format!("cannot make a login link: {e}"),
        ),
        None => error(
            StatusCode::NOT_FOUND,
            "Control/NoDashboard",
            "this server serves no dashboard: start `troupe serve` with `--listen tcp:127.0.0.1:PORT`",
        ),
    }
}

async fn cancel(State(hosted): State<Arc<Hosted>>, UrlPath(id): UrlPath<String>) -> Response {
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
    control.cancel();
    (
        StatusCode::ACCEPTED,
        [(header::CONTENT_TYPE, "application/json")],
        json!({"ok": true, "cancelling": control.run_id}).to_string(),
    )
        .into_response()
}

async fn events(
    State(hosted): State<Arc<Hosted>>,
    UrlPath(id): UrlPath<String>,
    RawQuery(query): RawQuery,
    headers: HeaderMap,
) -> Response {
    let control = match find(&hosted, &id) {
        Ok(c) => c,
        Err(e) => return *e,
    };
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
        axum::body::Body::from_stream(follow(Arc::clone(&control), after)),
    )
        .into_response()
}
