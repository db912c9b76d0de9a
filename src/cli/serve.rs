//! `troupe serve`: one long-lived actor system hosting many runs, each its
//! own session, sharing the run store and one provider limiter per
//! endpoint, at most `--max-runs` at once (the rest wait their turn). It
//! listens on the project's socket (`.troupe/troupe.sock`, mode 0600) and,
//! with `--listen tcp:…`, on a TCP port guarded by a token, where it also
//! shows the dashboard. SIGTERM (or Ctrl-C) stops taking runs, cancels
//! those running (or with `--drain` lets them finish), records them and
//! exits. A server killed with `kill -9` leaves its runs `interrupted`;
//! started again it lists them, and `troupe resume` continues them inside
//! it.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use clap::Parser;
use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::json;

use super::Exit;
use super::launch::{Concluded, EndpointSlots, Host, Launch, Prepared, Refusal, prepare};
use super::options::RunOptions;
use super::reach::project_socket;
use super::serve_policy::Policy;
use super::signals::{FirstSignal, Interrupts};
use crate::control::{ControlServer, Hosted, Listen, RunControl, Submission, Submitter};
use crate::definition::load_pipeline;
use crate::runtime::launch::resolve_fields;
use crate::runtime::summary::RunStatus;

/// Options of `troupe serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    /// Where to listen: `unix:PATH` or `tcp:HOST:PORT` (port 0 picks
    /// one). Repeatable. The project's socket (unix:.troupe/troupe.sock,
    /// where client commands look) is always one, unless another Unix
    /// socket is named. A TCP listener needs the token and serves the
    /// dashboard at `/`.
    #[arg(long, value_name = "ADDR")]
    pub listen: Vec<String>,
    /// The bearer token's file (made on first start, mode 0600)
    /// [default: .troupe/token].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<PathBuf>,
    /// Allow a TCP listener on an address other than loopback.
    #[arg(long)]
    pub allow_remote: bool,
    /// Most runs running at once; more wait their turn (`queued`).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub max_runs: u32,
    /// On SIGTERM or Ctrl-C, let the runs finish instead of cancelling
    /// them (a second signal still exits at once).
    #[arg(long)]
    pub drain: bool,
    /// The project root runs' tools work in.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: PathBuf,
    /// Where run folders are written.
    #[arg(long, value_name = "DIR", default_value = ".troupe/runs")]
    pub runs_dir: PathBuf,
    /// The run store [default: troupe.db beside --runs-dir].
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
    /// Run only the pipelines under DIR (repeatable), for clients not
    /// trusted as you: their runs may not turn the sandbox off, pass
    /// variables to shells, move the root, approve every call, set any
    /// provider flag or the budget, export to OTLP, use NATS, or read
    /// files outside these folders (403 Control/OptionNotAllowed,
    /// Control/PipelineNotAllowed), and their approvals are not put to
    /// them. DIR must lie outside the root and the runs folder, on a
    /// kernel with Landlock. Without it a client holding the socket or
    /// the token can do whatever you can with `troupe run`.
    #[arg(long, value_name = "DIR")]
    pub pipelines: Vec<PathBuf>,
}

/// `troupe run`'s grammar, for submissions.
#[derive(Debug, Parser)]
#[command(name = "troupe submit", no_binary_name = true)]
struct Submitted {
    #[command(flatten)]
    run: super::run::RunArgs,
}

/// `troupe resume`'s grammar, for resumes.
#[derive(Debug, Parser)]
#[command(name = "troupe resume", no_binary_name = true)]
struct Resubmitted {
    #[command(flatten)]
    resume: super::resume::ResumeArgs,
}

/// A run ready for the actor system, with what reaches it.
struct Job {
    prepared: Prepared,
    control: Arc<RunControl>,
}

/// What the server's submit and resume endpoints reach.
struct Server {
    root: PathBuf,
    runs_dir: PathBuf,
    store: Option<PathBuf>,
    hosted: std::sync::Weak<Hosted>,
    jobs: tokio::sync::mpsc::UnboundedSender<Job>,
    host: Host,
    /// What clients may ask for (`--pipelines`).
    policy: Policy,
}

fn bad_args(message: String) -> (u16, serde_json::Value) {
    (
        400,
        json!({"error": {"code": "Control/BadArgs", "message": message}}),
    )
}

fn refusal(r: &Refusal) -> (u16, serde_json::Value) {
    (422, r.to_json())
}

impl Server {
    /// The options a submission may not set (the server's), and its
    /// relative paths made the client's.
    fn settle(
        &self,
        opts: &mut RunOptions,
        cwd: Option<&Path>,
    ) -> Result<(), (u16, serde_json::Value)> {
        let theirs = |p: &Path| match cwd {
            Some(cwd) if p.is_relative() => cwd.join(p),
            _ => p.to_owned(),
        };
        opts.script = opts.script.as_deref().map(theirs);
        opts.answers = opts.answers.iter().map(|p| theirs(p)).collect();
        // With the client's files made the client's, before the root is
        // made the server's.
        self.policy.options(opts)?;
        if opts.store.is_some() || opts.no_store || opts.runs_dir != Path::new(".troupe/runs") {
            return Err(bad_args(
                "--store, --no-store and --runs-dir are the server's (see `troupe serve --help`)"
                    .to_owned(),
            ));
        }
        if opts.events.is_some() {
            return Err(bad_args(
                "--events: follow a hosted run with `troupe watch <run> --events -`".to_owned(),
            ));
        }
        opts.runs_dir.clone_from(&self.runs_dir);
        opts.store.clone_from(&self.store);
        opts.root = if opts.root == Path::new(".") {
            self.root.clone()
        } else {
            theirs(&opts.root)
        };
        opts.headless = true;
        opts.json = false;
        Ok(())
    }

    /// Readies `launch` (which may start MCP servers: on a blocking
    /// thread), hosts it and queues it; its id.
    async fn host(
        self: Arc<Self>,
        launch: Launch,
        opts: RunOptions,
        client: String,
        verb: &str,
    ) -> Result<String, (u16, serde_json::Value)> {
        self.policy.servers(&launch.pipeline)?;
        let host = self.host.clone();
        let prepared = tokio::task::spawn_blocking(move || prepare(launch, &opts, &host))
            .await
            .map_err(|_| bad_args("the run could not be prepared".to_owned()))?
            .map_err(|r| refusal(&r))?;
        let control = Arc::new(prepared.control());
        control.set_queued();
        let Some(hosted) = self.hosted.upgrade() else {
            return Err(shutting_down());
        };
        // Checked again after the preparing (which may take seconds): a
        // run accepted now is queued before the server's last look.
        let admission = hosted.admit().ok_or_else(shutting_down)?;
        hosted.add(Arc::clone(&control));
        let id = prepared.run_id.clone();
        say(&format!(
            "run {id} ({}) {verb} by {client}",
            prepared.pipeline.id
        ));
        self.jobs
            .send(Job { prepared, control })
            .map_err(|_| shutting_down())?;
        drop(admission);
        Ok(id)
    }
}

fn shutting_down() -> (u16, serde_json::Value) {
    (
        503,
        json!({"error": {"code": "Control/ShuttingDown", "message": "the server is going down and takes no new runs"}}),
    )
}

impl Submitter for Arc<Server> {
    fn submit(
        &self,
        submission: Submission,
    ) -> BoxFuture<'static, Result<String, (u16, serde_json::Value)>> {
        let server = Arc::clone(self);
        async move {
            let parsed = Submitted::try_parse_from(&submission.args)
                .map_err(|e| bad_args(e.render().to_string()))?;
            let mut args = parsed.run;
            server.settle(&mut args.opts, submission.cwd.as_deref())?;
            let path = match &submission.cwd {
                Some(cwd) if args.pipeline.is_relative() => cwd.join(&args.pipeline),
                _ => args.pipeline.clone(),
            };
            let path = server.policy.pipeline(&path)?;
            // Read off the control server's one thread, which every route
            // shares: a slow disk holds up this submission alone.
            let read = {
                let path = path.clone();
                tokio::task::spawn_blocking(move || load_pipeline(&path)).await
            };
            let loaded = read.map_err(|e| {
                refusal(&Refusal::Diagnostics {
                    path: path.clone(),
                    diags: crate::error::Diagnostics(vec![
                        crate::error::Diagnostic::new(
                            crate::error::ValidationCode::PipelineUnreadable,
                            format!("reading the pipeline failed: {e}"),
                        )
                        .file(&path),
                    ]),
                })
            })?;
            let pipeline = loaded.map(Arc::new).map_err(|diags| {
                refusal(&Refusal::Diagnostics {
                    path: path.clone(),
                    diags,
                })
            })?;
            let fields =
                resolve_fields(&pipeline, &args.ctx, args.task.as_deref()).map_err(|errors| {
                    refusal(&Refusal::Diagnostics {
                        path: path.clone(),
                        diags: crate::error::Diagnostics(errors),
                    })
                })?;
            let launch = Launch {
                path,
                pipeline,
                fields,
                resume: None,
            };
            server
                .host(launch, args.opts, submission.client, "submitted")
                .await
        }
        .boxed()
    }

    fn resume(
        &self,
        run: String,
        submission: Submission,
    ) -> BoxFuture<'static, Result<String, (u16, serde_json::Value)>> {
        let server = Arc::clone(self);
        async move {
            if let Some(hosted) = server.hosted.upgrade()
                && let Ok(control) = hosted.get(&run)
                && !control.has_ended()
            {
                return Err((
                    409,
                    json!({"error": {"code": "Control/RunActive", "message": format!("run {} is running in this server", control.run_id)}}),
                ));
            }
            let mut argv = vec![run];
            argv.extend(submission.args.iter().cloned());
            let parsed = Resubmitted::try_parse_from(&argv)
                .map_err(|e| bad_args(e.render().to_string()))?;
            let mut args = parsed.resume;
            if args.local {
                return Err(bad_args(
                    "--local resumes a run in the client's own process, not in a server".to_owned(),
                ));
            }
            server.settle(&mut args.opts, submission.cwd.as_deref())?;
            let store = args.opts.store_path();
            let opts = args.opts.clone();
            let policy = server.policy.clone();
            let launch = tokio::task::spawn_blocking(move || {
                // The stored run's pipeline is checked before the resume
                // takes its lock or repairs its log, and a run that cannot
                // be looked up is refused as the resume would refuse it.
                let checked = if policy.is_curated() {
                    let run = crate::store::Store::open(&store)
                        .and_then(|s| s.find_run(&args.run_id))
                        .map_err(|e| refusal(&super::launch::store_refusal(&e)))?;
                    Some(policy.pipeline(Path::new(&run.pipeline_dir))?)
                } else {
                    None
                };
                super::resume::prepare_from(&args, &store, checked).map_err(|r| refusal(&r))
            })
            .await
            .map_err(|_| bad_args("the run could not be prepared".to_owned()))??;
            server
                .host(launch, opts, submission.client, "resumed")
                .await
        }
        .boxed()
    }
}

/// A line on the server's log (stderr).
fn say(line: &str) {
    let line = super::output::terminal_safe(line);
    let _ = writeln!(std::io::stderr(), "troupe serve: {line}");
}

/// Where to listen, from `--listen`: the project's socket first, where
/// the client commands look for a server, unless another Unix socket was
/// named; refused: a bad address, or a non-loopback one without
/// `--allow-remote`.
fn listeners(args: &ServeArgs) -> Result<Vec<Listen>, String> {
    let mut out = Vec::new();
    if !args.listen.iter().any(|l| l.starts_with("unix:")) {
        out.push(Listen::Unix(project_socket(&args.runs_dir)));
    }
    for text in &args.listen {
        if let Some(path) = text.strip_prefix("unix:") {
            out.push(Listen::Unix(PathBuf::from(path)));
        } else if let Some(addr) = text.strip_prefix("tcp:") {
            let addr: SocketAddr = addr.parse().map_err(|_| {
                format!("--listen {text}: give tcp:HOST:PORT with an IP address, e.g. tcp:127.0.0.1:7700")
            })?;
            if !addr.ip().is_loopback() && !args.allow_remote {
                return Err(format!(
                    "--listen {text} is not a loopback address: anyone who can reach it could try the token; add --allow-remote if you mean it"
                ));
            }
            out.push(Listen::Tcp(addr));
        } else {
            return Err(format!("--listen {text}: give unix:PATH or tcp:HOST:PORT"));
        }
    }
    Ok(out)
}

pub fn run(args: &ServeArgs) -> Exit {
    let typed = |code: &str, message: String, hint: &str| {
        super::output::typed_failure(code, &message, hint, false)
    };
    raise_open_files();
    let listens = match listeners(args) {
        Ok(l) => l,
        Err(why) => return typed("Control/BadListen", why, "see `troupe serve --help`"),
    };
    let root = match super::options::project_root(&args.root) {
        Ok(r) => r,
        Err(why) => return typed("Validation/InputInvalid", why, "give the project's folder"),
    };
    if let Err(e) = std::fs::create_dir_all(&args.runs_dir) {
        return typed(
            "Store/WriteFailed",
            format!("cannot create {}: {e}", args.runs_dir.display()),
            "check the folder's permissions",
        );
    }
    let policy = match Policy::new(&args.pipelines, &root, &args.runs_dir) {
        Ok(p) => p,
        Err(why) => {
            return typed(
                "Validation/InputInvalid",
                why,
                "give folders that hold the pipelines clients may run",
            );
        }
    };
    let store_path = super::options::store_path(args.store.as_deref(), &args.runs_dir);
    // Runs a killed server left: said now, resumed on request.
    match crate::store::Store::open(&store_path) {
        Ok(store) => {
            for run in store.runs(usize::MAX).unwrap_or_default() {
                if super::runs::status_of(&run) == "interrupted" {
                    say(&format!(
                        "run {} ({}) was interrupted: `troupe resume {}` continues it here",
                        run.id, run.pipeline_id, run.id
                    ));
                }
            }
        }
        Err(e) => return super::launch::store_failed(&e, false),
    }
    let auth = if listens.iter().any(|l| matches!(l, Listen::Tcp(_))) {
        let file = args
            .token_file
            .clone()
            .unwrap_or_else(|| project_socket(&args.runs_dir).with_file_name("token"));
        let token = match crate::control::auth::load_or_make_token(&file) {
            Ok(t) => t,
            Err(why) => return typed("Control/BadToken", why, "see `troupe serve --help`"),
        };
        match crate::control::auth::Auth::new(token) {
            Ok(a) => Some(a),
            Err(e) => {
                return typed(
                    "Control/BadToken",
                    e.to_string(),
                    "is /dev/urandom readable?",
                );
            }
        }
    } else {
        None
    };
    let (jobs, mut queue) = tokio::sync::mpsc::unbounded_channel::<Job>();
    let hosted = Arc::new_cyclic(|weak: &std::sync::Weak<Hosted>| {
        let server = Arc::new(Server {
            root,
            runs_dir: args.runs_dir.clone(),
            store: args.store.clone(),
            hosted: weak.clone(),
            jobs,
            host: Host {
                server: true,
                slots: Some(Arc::new(EndpointSlots::default())),
                tool_mode: None,
                mcp: None,
                untrusted_clients: policy.is_curated(),
                spent_before: crate::provider::Usage::default(),
            },
            policy,
        });
        Hosted::new(Some(Arc::new(server)))
    });
    let control = match ControlServer::serve(&listens, Arc::clone(&hosted), auth.clone()) {
        Ok(c) => c,
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            return typed(
                "Control/AlreadyServing",
                e.to_string(),
                "a server already runs for this project: use it (`troupe submit`), or stop it first",
            );
        }
        Err(e) => {
            return typed(
                "Control/CannotListen",
                e.to_string(),
                "check the address and the folder",
            );
        }
    };
    for bound in &control.bound {
        tell!("listening on {bound}");
        if let (Listen::Tcp(addr), Some(auth)) = (bound, &auth)
            && let Some(login) = auth.login_path()
        {
            tell!("dashboard: http://{addr}{login}");
        }
    }
    let _ = std::io::stdout().flush();
    let limit = Arc::new(tokio::sync::Semaphore::new(args.max_runs as usize));
    let drain = args.drain;
    let first = FirstSignal::default();
    let (stop_tx, mut stop_rx) = tokio::sync::mpsc::unbounded_channel::<()>();
    let doing = if drain {
        "finishing the runs, taking no new ones"
    } else {
        "cancelling the runs"
    };
    let interrupts = Interrupts::watch(first.clone(), doing, move || {
        let _ = stop_tx.send(());
    });
    let system = actix::System::new();
    let watched = Arc::clone(&hosted);
    // Set before the runs are cancelled at shutdown: a queued run the
    // server cancels is recorded (started and cancelled at once, so that
    // `troupe resume` finds it), where one a client cancels never starts.
    let shutting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    system.block_on(async move {
        let mut running = tokio::task::JoinSet::new();
        loop {
            tokio::select! {
                job = queue.recv() => match job {
                    Some(job) => {
                        let limit = Arc::clone(&limit);
                        running.spawn_local(host_run(job, limit, Arc::clone(&shutting)));
                    }
                    None => break,
                },
                _ = stop_rx.recv() => break,
                Some(_) = running.join_next(), if !running.is_empty() => {}
            }
        }
        watched.close();
        // Submissions admitted before the close are queued before the
        // queue is read for the last time (bounded: a stuck one is left).
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
        while watched.admitting() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        if !drain {
            shutting.store(true, std::sync::atomic::Ordering::SeqCst);
            for run in watched.all() {
                run.cancel();
            }
        }
        // Jobs queued but not yet taken are hosted too.
        while let Ok(job) = queue.try_recv() {
            if !drain {
                job.control.cancel();
            }
            running.spawn_local(host_run(job, Arc::clone(&limit), Arc::clone(&shutting)));
        }
        while running.join_next().await.is_some() {}
    });
    control.stop(std::time::Duration::from_secs(2));
    drop(interrupts);
    say("stopped");
    match first.get() {
        Some(signal) => signal.exit(),
        None => Exit::Ok,
    }
}

/// Runs one hosted run once `--max-runs` lets it, records it, says how it
/// ended. Once `shutting` is set, a run still queued starts at once,
/// cancelled, so that it is recorded and resumable.
async fn host_run(
    job: Job,
    limit: Arc<tokio::sync::Semaphore>,
    shutting: Arc<std::sync::atomic::AtomicBool>,
) {
    let Job {
        mut prepared,
        control,
    } = job;
    let id = prepared.run_id.clone();
    let shut = || shutting.load(std::sync::atomic::Ordering::SeqCst);
    let _place = match Arc::clone(&limit).try_acquire_owned() {
        Ok(place) => Some(place),
        Err(_) if shut() => None,
        Err(_) => {
            // Queued: its MCP servers, started to check it, wait stopped.
            prepared.park_servers();
            tokio::select! {
                place = Arc::clone(&limit).acquire_owned() => place.ok(),
                () = control.cancel_requested() => None,
            }
        }
    };
    // Cancelled by its client while it waited (or before): it never
    // starts. Cancelled by the server's shutdown: it starts cancelled,
    // without asking its provider anything.
    if shut() && control.cancel_asked() {
        prepared.skip_check();
    }
    if control.cancel_asked() && !shut() {
        drop(prepared);
        control.withdraw();
        say(&format!("run {id} ended cancelled (before it started)"));
        return;
    }
    let armed = Arc::clone(&control);
    let driven = prepared
        .drive(
            |_, _| Vec::new(),
            move |session| armed.arm(move || super::launch::cancel(&session)),
        )
        .await;
    let concluded = tokio::task::spawn_blocking(move || driven.conclude()).await;
    let said = match concluded {
        Ok(Concluded::Report { report, .. }) => match &report.status {
            RunStatus::Ok => "ok".to_owned(),
            RunStatus::Failed { reason } => format!("failed: {reason}"),
            RunStatus::Cancelled => "cancelled".to_owned(),
        },
        Ok(Concluded::Aborted(why)) => {
            control.refuse(format!("Session/RunAborted: {why}"));
            format!("aborted: Session/RunAborted: {why}")
        }
        Ok(Concluded::Refused(r)) => {
            let error = &r.to_json()["error"];
            let why = format!(
                "{}: {}",
                error["code"].as_str().unwrap_or("?"),
                error["message"].as_str().unwrap_or("")
            );
            control.refuse(why.clone());
            format!("refused: {why}")
        }
        Err(_) => "lost (its recording panicked)".to_owned(),
    };
    control.end();
    say(&format!("run {id} ended {said}"));
}

/// A server's runs, their tools and MCP servers, and the API's clients all
/// take file descriptors: the soft limit goes up to the hard one (at most
/// 2^20), which a user may do, as many servers do at start.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let wanted = hard.min(1 << 20);
        if wanted > soft {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, wanted, hard);
        }
    }
}
