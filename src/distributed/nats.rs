//! Reaching NATS: the connection options both sides share (`--nats` and
//! its credentials and TLS), and the JetStream topology a distributed run
//! needs, created when absent: the task work queue with the workers'
//! shared durable consumer, the reports stream, and the bucket of
//! cancelled groups.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, consumer, kv, stream};
use tokio_util::sync::CancellationToken;

use super::wire::{
    CANCELLED_BUCKET, GROUPS_BUCKET, REPORTS_STREAM, TASKS_STREAM, WORKERS_CONSUMER,
    coordinator_consumer, report_subject, run_tasks_subject,
};
use crate::error::{Code, ErrorClass, HasCode};

/// Why NATS could not be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct NatsError {
    /// `Unreachable`, `Unauthorized`, `JetStream`, `Credentials`.
    pub code: &'static str,
    pub message: String,
}

impl NatsError {
    /// Whether trying again soon may succeed: the servers did not answer
    /// in time, or said they cannot for now. A cluster that is forming or
    /// electing a stream's leader answers so for a few seconds.
    pub fn is_transient(&self) -> bool {
        let text = self.message.to_ascii_lowercase();
        self.code == "JetStream"
            && ["timed out", "temporarily unavailable", "no responders"]
                .iter()
                .any(|t| text.contains(t))
    }
}

/// How long setting up the streams and buckets keeps trying through
/// transient errors before it gives up.
const SETUP_PATIENCE: Duration = Duration::from_secs(30);

/// Runs `attempt` until it succeeds, fails for good, or [`SETUP_PATIENCE`]
/// is spent, trying again a transient failure (see [`retrying`]).
async fn patiently<T, Fut>(attempt: impl FnMut() -> Fut) -> Result<T, NatsError>
where
    Fut: std::future::Future<Output = Result<T, NatsError>>,
{
    retrying(SETUP_PATIENCE, NatsError::is_transient, attempt).await
}

/// Runs `attempt` until it succeeds, fails in a way `again` says will not
/// mend, or `patience` is spent, waiting 0.25 s, then twice as long each
/// time (at most 4 s) between tries. The last outcome is the answer.
pub async fn retrying<T, E, Fut>(
    patience: Duration,
    again: impl Fn(&E) -> bool,
    mut attempt: impl FnMut() -> Fut,
) -> Result<T, E>
where
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    let mut wait = Duration::from_millis(250);
    loop {
        match attempt().await {
            Err(e) if again(&e) && tokio::time::Instant::now() + wait < deadline => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(4));
            }
            done => return done,
        }
    }
}

impl HasCode for NatsError {
    fn code(&self) -> Code {
        Code {
            class: ErrorClass::Distributed,
            name: self.code,
        }
    }
}

fn js_error(what: &str, e: impl std::fmt::Display) -> NatsError {
    NatsError {
        code: "JetStream",
        message: format!("{what}: {e}"),
    }
}

/// The NATS flags of `troupe run` and `troupe worker`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Across machines (NATS JetStream)")]
pub struct NatsArgs {
    /// The NATS server(s), e.g. nats://127.0.0.1:4222 (comma-separated
    /// for a cluster). With `troupe run`, fan-out siblings go to the
    /// workers serving the pipeline instead of running here. A run that
    /// ends ok removes what it left on the server; any other keeps it
    /// for `troupe resume` (seven days).
    #[arg(long, value_name = "URL")]
    pub nats: Option<String>,
    /// The NATS user.
    #[arg(long, value_name = "NAME", requires = "nats_password_env")]
    pub nats_user: Option<String>,
    /// The environment variable holding the NATS user's password (never
    /// the password itself on the command line).
    #[arg(long, value_name = "VAR", requires = "nats_user")]
    pub nats_password_env: Option<String>,
    /// A NATS credentials file (JWT and nkey seed).
    #[arg(long, value_name = "FILE", conflicts_with = "nats_user")]
    pub nats_creds: Option<PathBuf>,
    /// A CA certificate (PEM) to verify the server's TLS certificate.
    #[arg(long, value_name = "FILE")]
    pub nats_tls_ca: Option<PathBuf>,
    /// A client certificate (PEM) for mutual TLS, with --nats-tls-key.
    #[arg(long, value_name = "FILE", requires = "nats_tls_key")]
    pub nats_tls_cert: Option<PathBuf>,
    /// The client certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "nats_tls_cert")]
    pub nats_tls_key: Option<PathBuf>,
    /// Refuse a connection without TLS.
    #[arg(long)]
    pub nats_require_tls: bool,
    /// Replicas of troupe's streams in a JetStream cluster (1 for a single
    /// server; 3 survives the loss of one node).
    #[arg(long, value_name = "N", default_value_t = 1,
          value_parser = clap::value_parser!(u32).range(1..=5))]
    pub nats_replicas: u32,
    /// How long a worker holds a task without a sign of life before it is
    /// delivered to another worker (a lost worker's siblings run again).
    /// Workers send progress well within it.
    #[arg(long, value_name = "DURATION", default_value = "30s",
          value_parser = crate::definition::duration::parse_positive_duration)]
    pub nats_lease: Duration,
    /// Most sibling tasks delivered and not yet finished across the whole
    /// cluster (the shared consumer's max-ack-pending).
    #[arg(long, value_name = "N", default_value_t = 10_000,
          value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub nats_max_pending: u32,
}

impl NatsArgs {
    /// Connects, as `name` (shown by the server).
    pub async fn connect(&self, name: &str) -> Result<Nats, NatsError> {
        let Some(url) = &self.nats else {
            return Err(NatsError {
                code: "Unreachable",
                message: "no --nats URL".to_owned(),
            });
        };
        // The first connection is made here, not in the background
        // (`retry_on_initial_connect` would hide a wrong password or an
        // absent server behind JetStream timeouts later); once connected,
        // the client reconnects for as long as it takes.
        let mut options = async_nats::ConnectOptions::new()
            .name(name)
            .connection_timeout(Duration::from_secs(10))
            .max_reconnects(None);
        if let Some(creds) = &self.nats_creds {
            options = options
                .credentials_file(creds)
                .await
                .map_err(|e| NatsError {
                    code: "Credentials",
                    message: format!("--nats-creds {}: {e}", creds.display()),
                })?;
        }
        if let (Some(user), Some(var)) = (&self.nats_user, &self.nats_password_env) {
            let password = crate::environ::var(var).ok_or_else(|| NatsError {
                code: "Credentials",
                message: format!("--nats-password-env: ${var} is not set"),
            })?;
            options = options.user_and_password(user.clone(), password);
        }
        if let Some(ca) = &self.nats_tls_ca {
            options = options.add_root_certificates(ca.clone());
        }
        if let (Some(cert), Some(key)) = (&self.nats_tls_cert, &self.nats_tls_key) {
            options = options.add_client_certificate(cert.clone(), key.clone());
        }
        if self.nats_require_tls {
            options = options.require_tls(true);
        }
        let servers: Vec<String> = url.split(',').map(|s| s.trim().to_owned()).collect();
        // The connection's own task (socket reads and writes, parsing every
        // message) runs where the connection is made: on a thread of its
        // own, not on the caller's. On a distributed run's coordinator that
        // caller is the system's thread, which also runs the scheduler, and
        // the connection was more than half of that thread's work.
        let (io, runtime) = IoRuntime::start().map_err(|e| NatsError {
            code: "Unreachable",
            message: format!("cannot start the NATS connection's thread: {e}"),
        })?;
        let connect = runtime.spawn(async move {
            tokio::time::timeout(Duration::from_secs(15), options.connect(servers.as_slice())).await
        });
        let connected = connect.await.map_err(|e| NatsError {
            code: "Unreachable",
            message: format!("the NATS connection's thread failed: {e}"),
        })?;
        let client = match connected {
            Ok(Ok(client)) => client,
            Ok(Err(e)) => {
                let text = e.to_string();
                let code = match e.kind() {
                    async_nats::ConnectErrorKind::Authentication
                    | async_nats::ConnectErrorKind::AuthorizationViolation => "Unauthorized",
                    _ => "Unreachable",
                };
                return Err(NatsError {
                    code,
                    message: format!("cannot connect to {}: {text}", shown_url(url)),
                });
            }
            Err(_) => {
                return Err(NatsError {
                    code: "Unreachable",
                    message: format!("no NATS server answered at {} within 15s", shown_url(url)),
                });
            }
        };
        let js = jetstream::new(client.clone());
        Ok(Nats {
            client,
            js,
            _io: Arc::new(io),
            replicas: self.nats_replicas as usize,
            lease: self.nats_lease,
            max_pending: i64::from(self.nats_max_pending),
        })
    }
}

/// The runtime (one worker thread) a connection runs on. Dropped (with
/// the last [`Nats`] handle), it stops without waiting, so it may be
/// dropped inside another runtime's task.
#[derive(Debug)]
struct IoRuntime(Option<tokio::runtime::Runtime>);

impl IoRuntime {
    /// The runtime, and a handle to spawn the connection on it.
    fn start() -> std::io::Result<(IoRuntime, tokio::runtime::Handle)> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("troupe-nats")
            .enable_all()
            .build()?;
        let handle = rt.handle().clone();
        Ok((IoRuntime(Some(rt)), handle))
    }
}

impl Drop for IoRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// How long a report delivered to the coordinator may go unacknowledged
/// before it is delivered again.
pub const REPORT_ACK_WAIT: Duration = Duration::from_secs(10);

/// How long [`Nats::forget_run`] may take in all.
pub const FORGET_PATIENCE: Duration = Duration::from_secs(10);

/// Removes the messages of `stream` on `subject`.
async fn purge(stream: &stream::Stream, subject: String, what: &str) -> Result<(), NatsError> {
    stream
        .purge()
        .filter(subject)
        .await
        .map(|_| ())
        .map_err(|e| js_error(what, e))
}

/// `url` as it may be shown (errors, the store, a worker's banner): a
/// user, password or token in it (`nats://user:pass@host`,
/// `nats://TOKEN@host`) replaced by `***`.
pub fn shown_url(url: &str) -> String {
    url.split(',')
        .map(|one| match one.rsplit_once('@') {
            Some((before, host)) => match before.split_once("://") {
                Some((scheme, _)) => format!("{scheme}://***@{host}"),
                None => format!("***@{host}"),
            },
            None => one.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// Reports a run's consumer may hand out unacknowledged (each message a
/// batch of one or more siblings' reports).
const MOST_UNACKED_REPORTS: i64 = 1 << 20;

/// How long the server keeps what a run that did not end ok left for
/// `troupe resume`: its reports, group contexts, cancelled marks and its
/// report consumer (after that long unused).
pub const KEPT_FOR: Duration = Duration::from_secs(7 * 24 * 3600);

/// A connection and the topology settings.
#[derive(Debug, Clone)]
pub struct Nats {
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    /// The thread the connection runs on, stopped with the last handle.
    _io: Arc<IoRuntime>,
    pub replicas: usize,
    pub lease: Duration,
    pub max_pending: i64,
}

impl Nats {
    /// Waits (at most five seconds) for what the connection still has
    /// queued, the last acknowledgements above all, to reach the server:
    /// the connection runs on a thread of its own, stopped when its last
    /// handle goes. For whoever stops using it.
    pub async fn flush(&self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.flush()).await;
    }

    /// What one message of troupe's may weigh: half of what the server
    /// allows (room for headers, and for a server that lowers its limit
    /// later), 512 KiB when it names none (NATS's default is 1 MiB). One
    /// atomic read: the coordinator asks for every message of tasks.
    pub fn message_budget(&self) -> usize {
        match self.client.max_payload() {
            0 => 512 * 1024,
            limit => (limit / 2).max(1024),
        }
    }

    /// The task work queue (created when absent).
    pub async fn tasks(&self) -> Result<stream::Stream, NatsError> {
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: TASKS_STREAM.to_owned(),
                subjects: vec!["troupe.task.>".to_owned()],
                retention: stream::RetentionPolicy::WorkQueue,
                num_replicas: self.replicas,
                duplicate_window: Duration::from_secs(120),
                description: Some("troupe: sibling tasks waiting for a worker".to_owned()),
                ..Default::default()
            })
            .await
            .map_err(|e| js_error("the task stream", e))?;
        self.at_least_our_replicas(stream, "the task stream").await
    }

    /// Everything a run's coordinator uses, created when absent: the
    /// task and report streams and the two buckets. Transient failures (a
    /// cluster still forming) are tried again for a while.
    pub async fn run_topology(&self) -> Result<(), NatsError> {
        patiently(|| async {
            self.tasks().await?;
            self.reports().await?;
            self.cancelled().await?;
            self.groups().await?;
            Ok(())
        })
        .await
    }

    /// What a worker uses: the workers' consumer, the cancelled and the
    /// groups buckets (the report stream is made sure of too), tried
    /// again as [`Nats::run_topology`] is.
    pub async fn worker_topology(
        &self,
    ) -> Result<(consumer::PullConsumer, kv::Store, kv::Store), NatsError> {
        patiently(|| async {
            let consumer = self.workers_consumer().await?;
            let cancelled = self.cancelled().await?;
            let groups = self.groups().await?;
            self.reports().await?;
            Ok((consumer, cancelled, groups))
        })
        .await
    }

    /// The workers' shared consumer of the task queue.
    pub async fn workers_consumer(&self) -> Result<consumer::PullConsumer, NatsError> {
        self.tasks()
            .await?
            .get_or_create_consumer(
                WORKERS_CONSUMER,
                consumer::pull::Config {
                    durable_name: Some(WORKERS_CONSUMER.to_owned()),
                    ack_policy: consumer::AckPolicy::Explicit,
                    ack_wait: self.lease,
                    max_deliver: 5,
                    max_ack_pending: self.max_pending,
                    // 0: as many as the stream has.
                    num_replicas: 0,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| js_error("the workers' consumer", e))
    }

    /// The reports stream (created when absent).
    pub async fn reports(&self) -> Result<stream::Stream, NatsError> {
        let stream = self
            .js
            .get_or_create_stream(stream::Config {
                name: REPORTS_STREAM.to_owned(),
                subjects: vec!["troupe.report.>".to_owned()],
                retention: stream::RetentionPolicy::Limits,
                max_age: KEPT_FOR,
                num_replicas: self.replicas,
                duplicate_window: Duration::from_secs(120),
                description: Some("troupe: reports from workers to run coordinators".to_owned()),
                ..Default::default()
            })
            .await
            .map_err(|e| js_error("the report stream", e))?;
        self.at_least_our_replicas(stream, "the report stream")
            .await
    }

    /// A stream made by a process that asked for fewer replicas (a worker
    /// started without `--nats-replicas`) is raised to this process's
    /// count: the most durable setting anyone asked for wins. A stream
    /// with more replicas is left as it is.
    async fn at_least_our_replicas(
        &self,
        stream: stream::Stream,
        what: &str,
    ) -> Result<stream::Stream, NatsError> {
        let config = &stream.cached_info().config;
        if config.num_replicas >= self.replicas {
            return Ok(stream);
        }
        let mut raised = config.clone();
        raised.num_replicas = self.replicas;
        let name = raised.name.clone();
        self.js
            .update_stream(raised)
            .await
            .map_err(|e| js_error(what, e))?;
        self.js
            .get_stream(name)
            .await
            .map_err(|e| js_error(what, e))
    }

    /// A run's coordinator's durable consumer of the run's reports.
    pub async fn coordinator_consumer(
        &self,
        run_id: &str,
    ) -> Result<consumer::PullConsumer, NatsError> {
        let name = coordinator_consumer(run_id);
        self.reports()
            .await?
            .get_or_create_consumer(
                &name,
                consumer::pull::Config {
                    durable_name: Some(name.clone()),
                    filter_subject: report_subject(run_id),
                    ack_policy: consumer::AckPolicy::Explicit,
                    // A report lost on its way (the coordinator's server
                    // went down) comes again after this; one that merely
                    // came twice is deduplicated.
                    ack_wait: REPORT_ACK_WAIT,
                    // A run that never ends ok (and is never resumed)
                    // does not keep its consumer on the server for good.
                    inactive_threshold: KEPT_FOR,
                    num_replicas: 0,
                    // A resume reads every report before it acknowledges
                    // one (they are acknowledged once stored): past the
                    // server's default of 1 000 unacknowledged it would
                    // read no more, and run the rest's siblings again.
                    max_ack_pending: MOST_UNACKED_REPORTS,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| js_error("the run's report consumer", e))
    }

    /// Removes what run `run_id` left on the server, once it ended ok
    /// (it cannot be resumed then, and nothing reads these again): its
    /// reports, which carry every sibling's audit events, its report
    /// consumer, its groups' contexts and cancelled marks, and any task
    /// of it still queued (a copy of a sibling that finished). A run that
    /// ends otherwise keeps them for `troupe resume`; they expire after
    /// [`KEPT_FOR`]. Streams are looked up, never made or changed here.
    /// Every step is tried, all within [`FORGET_PATIENCE`] (a server gone
    /// by then must not hold the run's end); the first failure is
    /// returned.
    pub async fn forget_run(&self, run_id: &str) -> Result<(), NatsError> {
        match tokio::time::timeout(FORGET_PATIENCE, self.forget_steps(run_id)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(NatsError {
                code: "JetStream",
                message: format!(
                    "the server did not answer within {} s",
                    FORGET_PATIENCE.as_secs()
                ),
            }),
        }
    }

    async fn forget_steps(&self, run_id: &str) -> Result<(), NatsError> {
        let mut first_error = None;
        let mut note = |outcome: Result<(), NatsError>| {
            if let Err(e) = outcome {
                first_error.get_or_insert(e);
            }
        };
        let stream = |name: String, what: &'static str| async move {
            self.js
                .get_stream(name)
                .await
                .map_err(|e| js_error(what, e))
        };
        match stream(REPORTS_STREAM.to_owned(), "the report stream").await {
            Ok(reports) => {
                let consumer = reports
                    .delete_consumer(&coordinator_consumer(run_id))
                    .await
                    .map(|_| ())
                    .or_else(|e| match e.kind() {
                        // Already gone (a consumer past its inactivity).
                        stream::ConsumerErrorKind::JetStream(j)
                            if j.error_code() == jetstream::ErrorCode::CONSUMER_NOT_FOUND =>
                        {
                            Ok(())
                        }
                        _ => Err(js_error("the run's report consumer", e)),
                    });
                note(consumer);
                note(purge(&reports, report_subject(run_id), "the run's reports").await);
            }
            Err(e) => note(Err(e)),
        }
        for (bucket, what) in [
            (GROUPS_BUCKET, "the run's group contexts"),
            (CANCELLED_BUCKET, "the run's cancelled marks"),
        ] {
            match stream(format!("KV_{bucket}"), what).await {
                Ok(kv) => note(purge(&kv, format!("$KV.{bucket}.{run_id}.>"), what).await),
                Err(e) => note(Err(e)),
            }
        }
        match stream(TASKS_STREAM.to_owned(), "the task stream").await {
            Ok(tasks) => {
                note(purge(&tasks, run_tasks_subject(run_id), "the run's queued tasks").await)
            }
            Err(e) => note(Err(e)),
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Removes run `run_id`'s cancelled marks: a resumed session's groups
    /// have the turns its earlier session's had, and must not find their
    /// marks.
    pub async fn clear_cancelled(&self, run_id: &str) -> Result<(), NatsError> {
        let what = "the run's cancelled marks";
        let kv = self
            .js
            .get_stream(format!("KV_{CANCELLED_BUCKET}"))
            .await
            .map_err(|e| js_error(what, e))?;
        purge(&kv, format!("$KV.{CANCELLED_BUCKET}.{run_id}.>"), what).await
    }

    /// The bucket of cancelled groups (created when absent).
    pub async fn cancelled(&self) -> Result<kv::Store, NatsError> {
        self.bucket(
            CANCELLED_BUCKET,
            "the cancelled-groups bucket",
            "troupe: cancelled groups, read before a task starts",
        )
        .await
    }

    /// The bucket of group contexts (created when absent): what every
    /// sibling of a group shares, put once per group instead of into each
    /// task.
    pub async fn groups(&self) -> Result<kv::Store, NatsError> {
        self.bucket(
            GROUPS_BUCKET,
            "the group-context bucket",
            "troupe: each fan-out group's ctx fields and state slot, read by workers",
        )
        .await
    }

    async fn bucket(
        &self,
        name: &str,
        what: &str,
        description: &str,
    ) -> Result<kv::Store, NatsError> {
        if let Ok(store) = self.js.get_key_value(name).await {
            // A key-value bucket is the stream KV_<bucket>.
            let stream = self
                .js
                .get_stream(format!("KV_{name}"))
                .await
                .map_err(|e| js_error(what, e))?;
            self.at_least_our_replicas(stream, what).await?;
            return Ok(store);
        }
        match self
            .js
            .create_key_value(kv::Config {
                bucket: name.to_owned(),
                description: description.to_owned(),
                max_age: KEPT_FOR,
                num_replicas: self.replicas,
                ..Default::default()
            })
            .await
        {
            Ok(store) => Ok(store),
            // Another process made it first.
            Err(e) => self
                .js
                .get_key_value(name)
                .await
                .map_err(|_| js_error(what, e)),
        }
    }
}

/// Publishes one message of the task queue on the group's subject: the
/// tasks serialized one by one as `bodies` (see
/// [`encode_tasks`](super::wire::encode_tasks)), under the `Nats-Msg-Id`
/// [`message_id`](super::wire::message_id) gives them at `at`, retried as
/// [`publish_acked`] does. `Ok` holds its stream sequence.
pub async fn publish_tasks(
    js: &jetstream::Context,
    tasks: &[super::wire::Task],
    bodies: &[Vec<u8>],
    at: &str,
    stop: Option<&CancellationToken>,
) -> Result<u64, String> {
    let Some(first) = tasks.first() else {
        return Err("no tasks to publish".to_owned());
    };
    let mut headers = HeaderMap::new();
    headers.insert("Nats-Msg-Id", super::wire::message_id(tasks, at).as_str());
    let subject = super::wire::task_subject(&first.run_id, first.turn);
    let body = super::wire::encode_tasks(bodies);
    publish_acked(js, subject, headers, body.into(), stop).await
}

/// How long a JetStream publish keeps being retried: longer than a
/// cluster takes to elect a stream leader after losing a server.
pub const PUBLISH_PATIENCE: Duration = Duration::from_secs(60);

/// Publishes `body` on `subject` and waits for JetStream to store it,
/// trying again (backing off from 100 ms to 2 s) while no stream leader
/// answers or the ack does not come, until [`PUBLISH_PATIENCE`] is spent
/// or `stop` is cancelled. A `Nats-Msg-Id` header makes the retries
/// harmless: the stream keeps one copy. Errors no retry can mend (a
/// message over the server's size limit) end it at once. `Ok` holds the
/// stream sequence.
pub async fn publish_acked(
    js: &jetstream::Context,
    subject: String,
    headers: HeaderMap,
    body: bytes::Bytes,
    stop: Option<&CancellationToken>,
) -> Result<u64, String> {
    let deadline = tokio::time::Instant::now() + PUBLISH_PATIENCE;
    let mut pause = Duration::from_millis(100);
    loop {
        let attempt = async {
            js.publish_with_headers(subject.clone(), headers.clone(), body.clone())
                .await?
                .await
        };
        let error = match attempt.await {
            Ok(ack) => return Ok(ack.sequence),
            Err(e) => e,
        };
        let lasting = matches!(
            error.kind(),
            PublishErrorKind::MaxPayloadExceeded
                | PublishErrorKind::WrongLastMessageId
                | PublishErrorKind::WrongLastSequence
        );
        if lasting || tokio::time::Instant::now() + pause > deadline {
            return Err(error.to_string());
        }
        match stop {
            Some(stop) => tokio::select! {
                () = stop.cancelled() => return Err("cancelled".to_owned()),
                () = tokio::time::sleep(pause) => {}
            },
            None => tokio::time::sleep(pause).await,
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;

    use super::*;

    fn js(message: &str) -> NatsError {
        js_error("the report stream", message)
    }

    #[test]
    fn timeouts_and_unavailable_servers_are_transient_refusals_are_not() {
        assert!(js("jetstream request timed out").is_transient());
        assert!(js("JetStream system temporarily unavailable").is_transient());
        assert!(!js("insufficient resources").is_transient());
        let unreachable = NatsError {
            code: "Unreachable",
            message: "timed out".to_owned(),
        };
        assert!(!unreachable.is_transient(), "only JetStream's answers");
    }

    #[tokio::test(start_paused = true)]
    async fn setup_tries_again_through_transient_failures_then_gives_up() {
        let tries = Cell::new(0);
        let got = patiently(|| async {
            tries.set(tries.get() + 1);
            if tries.get() < 3 {
                Err(js("jetstream request timed out"))
            } else {
                Ok(tries.get())
            }
        })
        .await;
        assert_eq!(got, Ok(3));

        let tries = Cell::new(0);
        let refused = patiently(|| async {
            tries.set(tries.get() + 1);
            Err::<(), _>(js("insufficient resources"))
        })
        .await;
        assert!(refused.is_err());
        assert_eq!(tries.get(), 1, "a lasting error is not tried again");

        let start = tokio::time::Instant::now();
        let tries = Cell::new(0);
        let gave_up = patiently(|| async {
            tries.set(tries.get() + 1);
            Err::<(), _>(js("jetstream request timed out"))
        })
        .await;
        assert!(gave_up.is_err());
        let waited = start.elapsed();
        assert!(waited <= SETUP_PATIENCE, "{waited:?}");
        // Ten waits (0.25 + 0.5 + 1 + 2 + six of 4 s = 27.75 s) between
        // eleven tries; the next wait would pass the 30 s.
        assert_eq!(tries.get(), 11);
    }
}

#[cfg(test)]
mod shown_url_tests {
    use super::shown_url;

    #[test]
    fn credentials_in_a_url_are_not_shown() {
        assert_eq!(shown_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(
            shown_url("nats://alice:s3cret@host:4222"),
            "nats://***@host:4222"
        );
        assert_eq!(shown_url("nats://TOKEN@host"), "nats://***@host");
        assert_eq!(
            shown_url("nats://a:b@h1:4222,nats://h2:4222"),
            "nats://***@h1:4222,nats://h2:4222"
        );
        assert_eq!(shown_url("u:p@host"), "***@host");
    }
}
