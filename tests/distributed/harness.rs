//! The harness of the distributed tests: a real `nats-server` (or a
//! cluster of three), worker and coordinator processes owned so that a
//! failed assertion leaves nothing running, their output read line by
//! line, and checks of the coordinator's audit log.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The longest any wait for a process's output or a file may take before
/// the test fails (a bound, not a pause).
pub const WAIT: Duration = Duration::from_secs(90);

/// The nats-server to run, or `None` (the test is skipped) when there is
/// none and none is required.
pub fn nats_server() -> Option<PathBuf> {
    let found = std::env::var_os("TROUPE_NATS_SERVER")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("PATH").and_then(|paths| {
                std::env::split_paths(&paths)
                    .map(|p| p.join("nats-server"))
                    .find(|p| p.is_file())
            })
        });
    if found.is_none() {
        assert!(
            std::env::var_os("TROUPE_REQUIRE_NATS").is_none(),
            "TROUPE_REQUIRE_NATS is set but there is no nats-server \
             (set TROUPE_NATS_SERVER or put nats-server on PATH)"
        );
        eprintln!("skipped: no nats-server (set TROUPE_NATS_SERVER or put it on PATH)");
    }
    found
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// `n` distinct ports below the kernel's ephemeral range (32768 and up
/// on Linux) that nothing listens on now: a cluster's ports. Its servers
/// dial each other's route ports before all of them listen, and each
/// dial takes an ephemeral source port; a port picked from that range
/// could be taken meanwhile, and the server meant to listen on it would
/// fail ("address already in use").
pub fn quiet_ports(n: usize) -> Vec<u16> {
    use std::hash::{BuildHasher, Hasher};
    let mut ports = Vec::with_capacity(n);
    let mut tries = 0u64;
    while ports.len() < n {
        tries += 1;
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u64(tries);
        let port = 20_000 + (h.finish() % 12_000) as u16;
        if !ports.contains(&port) && TcpListener::bind(("127.0.0.1", port)).is_ok() {
            ports.push(port);
        }
    }
    ports
}

/// The lines a child writes on one of its pipes, as they come.
pub struct Lines {
    pub rx: mpsc::Receiver<String>,
    pub seen: Vec<String>,
    pub what: String,
}

impl Lines {
    pub fn of(reader: impl std::io::Read + Send + 'static, what: &str) -> Lines {
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(reader).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Lines {
            rx,
            seen: Vec::new(),
            what: what.to_owned(),
        }
    }

    /// Waits for the first line (from now on) that `pred` accepts.
    pub fn wait_for(&mut self, pred: impl Fn(&str) -> bool, waiting_for: &str) -> String {
        let deadline = Instant::now() + WAIT;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.rx.recv_timeout(left) {
                Ok(line) => {
                    self.seen.push(line.clone());
                    if pred(&line) {
                        return line;
                    }
                }
                Err(e) => panic!(
                    "{}: no line {waiting_for} ({e:?}); it printed:\n{}",
                    self.what,
                    self.seen.join("\n")
                ),
            }
        }
    }

    /// The first line printed so far or from now on that `pred` accepts.
    pub fn find(&mut self, pred: impl Fn(&str) -> bool, waiting_for: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| pred(l)) {
            return line.clone();
        }
        self.wait_for(pred, waiting_for)
    }

    /// Everything printed so far, without waiting: for a failure's message.
    pub fn so_far(&mut self) -> String {
        while let Ok(line) = self.rx.try_recv() {
            self.seen.push(line);
        }
        format!("--- {}:\n{}", self.what, self.seen.join("\n"))
    }

    /// Everything printed so far and until the pipe closes.
    pub fn rest(&mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(WAIT) {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

/// A child process that is killed (and reaped) when dropped, so a failed
/// assertion leaves nothing running.
pub struct Owned {
    pub child: Child,
}

impl Owned {
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits for the process to exit on its own, at most [`WAIT`].
    pub fn wait(&mut self) -> std::process::ExitStatus {
        let deadline = Instant::now() + WAIT;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < deadline, "the process did not exit");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A `troupe run … --json` started in the background and owned, for a
/// test that acts on the run while it runs.
pub struct Background {
    pub process: Owned,
    stdout: std::process::ChildStdout,
}

impl Background {
    pub fn start(command: &mut Command) -> Background {
        let mut child = command
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        Background {
            process: Owned { child },
            stdout,
        }
    }

    /// Waits for the run to exit (at most [`WAIT`]): its exit status and
    /// what it printed (the summary).
    pub fn finish(mut self) -> (std::process::ExitStatus, String) {
        let status = self.process.wait();
        let mut out = String::new();
        std::io::Read::read_to_string(&mut BufReader::new(&mut self.stdout), &mut out).unwrap();
        (status, out)
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One nats-server with JetStream, its store in a temp dir.
pub struct Server {
    pub process: Owned,
    pub port: u16,
    pub log: Lines,
    pub _store: tempfile::TempDir,
}

impl Server {
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    pub fn start(bin: &Path) -> Server {
        Server::spawn(bin, &[], "Server is ready")
    }

    pub fn spawn(bin: &Path, extra: &[String], ready: &str) -> Server {
        Server::spawn_on(bin, free_port(), extra, ready)
    }

    /// As `spawn`, serving clients on `port`.
    pub fn spawn_on(bin: &Path, port: u16, extra: &[String], ready: &str) -> Server {
        let store = tempfile::tempdir().unwrap();
        let mut child = Command::new(bin)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(store.path())
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut log = Lines::of(child.stderr.take().unwrap(), "nats-server");
        let process = Owned { child };
        log.wait_for(|l| l.contains(ready), ready);
        Server {
            process,
            port,
            log,
            _store: store,
        }
    }

    /// A cluster of three; returns once it has elected its JetStream
    /// metadata leader.
    pub fn cluster(bin: &Path) -> Vec<Server> {
        let ports = quiet_ports(6);
        let (routes, clients) = ports.split_at(3);
        let all = routes
            .iter()
            .map(|p| format!("nats://127.0.0.1:{p}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut servers: Vec<Server> = routes
            .iter()
            .enumerate()
            .map(|(i, port)| {
                let extra = [
                    "-n".to_owned(),
                    format!("s{i}"),
                    "--cluster_name".to_owned(),
                    "troupe-test".to_owned(),
                    "--cluster".to_owned(),
                    format!("nats://127.0.0.1:{port}"),
                    "--routes".to_owned(),
                    all.clone(),
                ];
                Server::spawn_on(bin, clients[i], &extra, "Server is ready")
            })
            .collect();
        // Every server hears who leads (itself or another).
        for s in &mut servers {
            s.log.wait_for(
                |l| l.contains("metadata leader"),
                "naming the metadata leader",
            );
        }
        servers
    }
}

/// A task of run `run-1`'s first sibling in group `turn`, from a
/// coordinator of this troupe (it reads compressed, framed report
/// batches).
pub fn sample_task(turn: u64) -> troupe::distributed::wire::Task {
    troupe::distributed::wire::Task {
        run_id: "run-1".into(),
        turn,
        unit: 0,
        stage_execution_id: "run-1/worker#0/1".into(),
        stage_id: "worker".into(),
        index: Some(0),
        visit: 1,
        item: None,
        pipeline_id: "p".into(),
        digest: "d".into(),
        zstd_reports: true,
        relay_records: true,
    }
}

/// The payloads of run `run`'s report messages on the server, in the
/// order they were stored (up to ten, as one fetch gets them).
pub async fn report_payloads(
    stream: &async_nats::jetstream::stream::Stream,
    run: &str,
) -> Vec<Vec<u8>> {
    use futures::StreamExt;
    let consumer = stream
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            filter_subject: troupe::distributed::wire::report_subject(run),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut batch = consumer
        .fetch()
        .max_messages(10)
        .expires(Duration::from_millis(500))
        .messages()
        .await
        .unwrap();
    let mut payloads = Vec::new();
    while let Some(Ok(msg)) = batch.next().await {
        payloads.push(msg.payload.to_vec());
    }
    payloads
}

/// The connection flags a `troupe` command would take for `url`, for a
/// test that talks to the server itself.
pub fn nats_args(url: &str) -> troupe::distributed::NatsArgs {
    use clap::Parser;

    #[derive(Parser)]
    struct Flags {
        #[command(flatten)]
        nats: troupe::distributed::NatsArgs,
    }
    Flags::parse_from(["test", "--nats", url]).nats
}

pub fn troupe() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
    cmd.stdin(Stdio::null());
    cmd
}

/// A running `troupe worker`, ready (it printed "serving at"), with its
/// task log on stdout.
pub struct Worker {
    pub name: String,
    pub process: Owned,
    pub tasks: Lines,
    pub stderr: Lines,
}

impl Worker {
    pub fn start(pipeline: &Path, url: &str, name: &str, root: &Path, extra: &[&str]) -> Worker {
        Worker::start_with_env(pipeline, url, name, root, extra, &[])
    }

    /// `n` workers, `w1` to `wn`, each started as by `start`.
    pub fn several(
        n: usize,
        pipeline: &Path,
        url: &str,
        root: &Path,
        extra: &[&str],
    ) -> Vec<Worker> {
        (1..=n)
            .map(|i| Worker::start(pipeline, url, &format!("w{i}"), root, extra))
            .collect()
    }

    /// As `start`, with `env` added to the worker's environment.
    pub fn start_with_env(
        pipeline: &Path,
        url: &str,
        name: &str,
        root: &Path,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Worker {
        let mut child = troupe()
            .envs(env.iter().copied())
            .arg("worker")
            .arg(pipeline)
            .args(["--nats", url, "--name", name, "--task-log", "--root"])
            .arg(root)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let tasks = Lines::of(child.stdout.take().unwrap(), name);
        let mut stderr = Lines::of(child.stderr.take().unwrap(), name);
        let process = Owned { child };
        stderr.wait_for(|l| l.contains("serving at"), "saying it serves");
        Worker {
            name: name.to_owned(),
            process,
            tasks,
            stderr,
        }
    }

    /// This worker's report of the end of the execution whose id ends
    /// with `suffix`, printed before or waited for.
    pub fn reported(&mut self, suffix: &str) -> Value {
        let line = self.tasks.find(
            |l| {
                serde_json::from_str::<Value>(l).is_ok_and(|v| {
                    v["stageExecutionId"]
                        .as_str()
                        .is_some_and(|id| id.ends_with(suffix))
                        && v["reported"] == true
                })
            },
            &format!("reporting {suffix}"),
        );
        serde_json::from_str(&line).unwrap()
    }
}

/// A `plan → map worker → reduce` pipeline whose siblings run `command`
/// in Bash (after `echo <item> >> started`), and whose sibling
/// `fail_index`, if any, runs `fail_command` then fails.
pub fn pipeline(command: &str, fail: Option<(usize, &str)>) -> crate::common::Fixture {
    let plan = crate::common::stage_md("plan", "", "Plan.").replace(
        "required: [summary]\n  properties:\n    summary: { type: string }",
        "required: [items]\n  properties:\n    items: { type: array }",
    );
    let worker = crate::common::stage_md("worker", "", "Work on {{ctx.item}}.")
        .replace("allowedTools: [Read]", "allowedTools: [Bash]");
    let reduce = crate::common::stage_md("reduce", "", "Reduce.");
    let bash = |command: &str| {
        format!(
            "    - tool: Bash\n      args:\n        timeout_ms: 600000\n        command: |\n{}",
            command
                .lines()
                .map(|l| format!("          {l}\n"))
                .collect::<String>()
        )
    };
    let mut script = format!(
        "stages:\n  plan:\n    - complete: {{ items: {{ $range: \"{{{{ctx.width}}}}\" }} }}\n  worker:\n{}    - complete: {{ summary: \"done {{{{ctx.item}}}}\" }}\n",
        bash(&format!("echo {{{{ctx.item}}}} >> started\n{command}"))
    );
    if let Some((index, command)) = fail {
        script.push_str(&format!(
            "  \"worker#{index}\":\n{}    - fail: terminal\n",
            bash(&format!("echo {{{{ctx.item}}}} >> started\n{command}"))
        ));
    }
    crate::common::Fixture::new(
        "id: dist\nentry: plan\nparallelCap: 4\nctx:\n  width: { default: 12 }\nstages:\n  plan: plan.md\n  worker: worker.md\n  reduce: reduce.md\nnext:\n  plan: { parallel: { map: worker, over: \"ctx.upstream[0].parsed.items\" }, join: reduce }\n  reduce: end\n",
        &[
            ("plan.md", &plan),
            ("worker.md", &worker),
            ("reduce.md", &reduce),
            ("script.yaml", &script),
        ],
    )
}

/// The working folder of a test: the tools' root (where `started` and
/// `go` live) and the runs folder.
pub struct Project {
    pub dir: tempfile::TempDir,
}

impl Project {
    pub fn new() -> Project {
        Project {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    pub fn root(&self) -> &Path {
        self.dir.path()
    }
    pub fn runs(&self) -> PathBuf {
        self.dir.path().join("runs")
    }
    /// The items whose siblings have started, in order (one per start).
    pub fn started(&self) -> Vec<u64> {
        std::fs::read_to_string(self.root().join("started"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }
    /// Waits until `n` sibling starts were written.
    pub fn wait_started(&self, n: usize) {
        self.wait_started_or(n, String::new);
    }

    /// As `wait_started`, with `diagnose`'s text in the failure message.
    pub fn wait_started_or(&self, n: usize, diagnose: impl FnOnce() -> String) {
        let deadline = Instant::now() + WAIT;
        while self.started().len() < n {
            if Instant::now() >= deadline {
                panic!(
                    "only {:?} started, waiting for {n}\n{}",
                    self.started(),
                    diagnose()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    /// Lets the siblings waiting for `go` finish.
    pub fn release(&self) {
        std::fs::write(self.root().join("go"), "").unwrap();
    }
    /// A run command for `pipeline` against `url`, its runs here.
    pub fn run(&self, pipeline: &Path, url: &str) -> Command {
        let mut cmd = troupe();
        cmd.arg("run")
            .arg(pipeline)
            .args(["--nats", url, "--runs-dir"])
            .arg(self.runs())
            .arg("--root")
            .arg(self.root());
        cmd
    }
}

/// What `troupe run … --json` printed, with its exit code.
pub fn summary(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a JSON summary ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

pub fn audit(summary: &Value) -> Vec<Value> {
    let path = summary["auditPath"].as_str().unwrap();
    troupe::auditlog::read_text(std::path::Path::new(path))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

pub fn label(event: &Value) -> String {
    // `<run>/<stage>[#i]/<visit>` → `<stage>[#i]/<visit>`
    let id = event["stageExecutionId"].as_str().unwrap_or("");
    id.split_once('/').map_or(id, |(_, rest)| rest).to_owned()
}

pub fn is_sibling(event: &Value) -> bool {
    label(event).contains('#')
}

/// How many sibling executions each worker entered, by the worker's name
/// on their `StageEntered`.
pub fn siblings_per_worker(events: &[Value]) -> std::collections::BTreeMap<String, usize> {
    let mut per_worker = std::collections::BTreeMap::new();
    for e in named(events, "StageEntered").filter(|e| is_sibling(e)) {
        *per_worker
            .entry(e["worker"].as_str().unwrap().to_owned())
            .or_default() += 1;
    }
    per_worker
}

/// Messages the task stream has stored so far.
pub fn task_messages(url: &str) -> u64 {
    let args = nats_args(url);
    actix::System::new().block_on(async move {
        let nats = args.connect("task count").await.unwrap();
        let mut tasks = nats.tasks().await.unwrap();
        tasks.info().await.unwrap().state.last_sequence
    })
}

pub fn named<'a>(events: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events.iter().filter(move |e| e["event"] == name)
}

/// `seq` only goes up (events that never reach the log, such as
/// progress, take numbers too, so it may skip).
pub fn increasing_seq(events: &[Value]) {
    for pair in events.windows(2) {
        assert!(
            pair[0]["seq"].as_u64().unwrap() < pair[1]["seq"].as_u64().unwrap(),
            "seq does not go up at {}",
            pair[1]
        );
    }
}

/// The invariants every distributed run's log keeps: `seq` goes up; every entered execution ends exactly once (`StageExited` or
/// `StageCancelled`) and nothing ends that did not enter; every sibling
/// was entered on a worker (and says which); and, by the workers' clocks
/// (one machine here), no more than `cap` siblings ran at once.
pub fn check_log(events: &[Value], cap: usize) {
    increasing_seq(events);
    let mut open = BTreeSet::new();
    let mut ended = BTreeSet::new();
    for e in events {
        let id = label(e);
        match e["event"].as_str().unwrap() {
            "StageEntered" => {
                assert!(open.insert(id.clone()), "{id} entered twice");
                assert!(!ended.contains(&id), "{id} entered after it ended");
                if is_sibling(e) {
                    assert!(e["worker"].is_string(), "sibling {id} without its worker");
                }
            }
            "StageExited" | "StageCancelled" => {
                assert!(open.remove(&id), "{id} ended without entering, or twice");
                ended.insert(id);
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "entered and never ended: {open:?}");
    // Running siblings by the timestamps their workers wrote: at equal
    // times an end counts before a start (the next start waits for it).
    let mut marks: Vec<(String, i32)> = events
        .iter()
        .filter(|e| is_sibling(e))
        .filter_map(|e| match e["event"].as_str().unwrap() {
            "StageEntered" => Some((e["ts"].as_str().unwrap().to_owned(), 1)),
            "StageExited" | "StageCancelled" => Some((e["ts"].as_str().unwrap().to_owned(), -1)),
            _ => None,
        })
        .collect();
    marks.sort();
    let (mut running, mut peak) = (0, 0);
    for (_, d) in marks {
        running += d;
        peak = peak.max(running);
    }
    assert!(
        peak <= cap as i32,
        "{peak} siblings ran at once under a cap of {cap}"
    );
}

/// Every execution's verdict and `parsed` by `stage[#i]/visit`, from
/// `troupe runs show --json`.
pub fn results(project: &Project, run_id: &str) -> BTreeMap<String, (String, Value)> {
    let out = troupe()
        .args(["runs", "show", run_id, "--json", "--runs-dir"])
        .arg(project.runs())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let shown: Value = serde_json::from_slice(&out.stdout).unwrap();
    shown["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| {
            (
                label(x),
                (
                    x["verdict"].as_str().unwrap_or("").to_owned(),
                    x["parsed"].clone(),
                ),
            )
        })
        .collect()
}

/// Whether any process's command line holds `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline"))
            && String::from_utf8_lossy(&cmdline).contains(marker)
        {
            found.push(pid);
        }
    }
    found
}

/// [`check_log`] for a log a killed coordinator left and a resume went on
/// with: `seq` goes up with no gap at the resume, nothing ends twice; an execution the kill left
/// open was closed by the repair (`StageCancelled`, ProcessLost) before
/// the resumed session entered it again.
pub fn check_log_allowing_lost(events: &[Value]) {
    increasing_seq(events);
    // The resumed session's numbers go on from the last line's.
    let resumed = events
        .iter()
        .position(|e| e["event"] == "WorkflowResumed")
        .unwrap();
    assert_eq!(
        events[resumed]["seq"].as_u64().unwrap(),
        events[resumed - 1]["seq"].as_u64().unwrap() + 1,
        "a gap in seq where the resumed session starts"
    );
    let mut open = BTreeSet::new();
    for e in events {
        let id = label(e);
        match e["event"].as_str().unwrap() {
            "StageEntered" => assert!(open.insert(id.clone()), "{id} entered twice"),
            "StageExited" | "StageCancelled" => {
                assert!(open.remove(&id), "{id} ended without entering, or twice");
            }
            _ => {}
        }
    }
    assert!(open.is_empty(), "entered and never ended: {open:?}");
    assert_eq!(named(events, "WorkflowResumed").count(), 1);
}

/// What run `run_id` has on the server.
#[derive(Debug, Default, PartialEq)]
pub struct OnTheServer {
    /// Its report consumer's delivered stream sequence, if it has one.
    pub consumer: Option<u64>,
    pub reports: usize,
    pub tasks: usize,
    pub contexts: usize,
}

pub fn on_the_server(url: &str, run_id: &str) -> OnTheServer {
    use troupe::distributed::wire::{
        GROUPS_BUCKET, coordinator_consumer, report_subject, run_tasks_subject,
    };
    let args = nats_args(url);
    let run_id = run_id.to_owned();
    actix::System::new().block_on(async move {
        let nats = args.connect("what is left").await.unwrap();
        // Messages of `stream` on `subject` (a wildcard sums its subjects).
        let count = |stream: async_nats::jetstream::stream::Stream, subject: String| async move {
            let mut subjects = stream.info_with_subjects(subject).await.unwrap();
            let mut n = 0;
            while let Some(entry) = futures::StreamExt::next(&mut subjects).await {
                n += entry.unwrap().1;
            }
            n
        };
        let reports = nats.reports().await.unwrap();
        let consumer = reports
            .consumer_info(&coordinator_consumer(&run_id))
            .await
            .ok()
            .map(|info| info.delivered.stream_sequence);
        let groups = nats
            .js
            .get_stream(format!("KV_{GROUPS_BUCKET}"))
            .await
            .unwrap();
        OnTheServer {
            consumer,
            reports: count(reports, report_subject(&run_id)).await,
            tasks: count(nats.tasks().await.unwrap(), run_tasks_subject(&run_id)).await,
            contexts: count(groups, format!("$KV.{GROUPS_BUCKET}.{run_id}.>")).await,
        }
    })
}

/// A run that ended ok took away what it left on the server: its report
/// consumer, its reports (every sibling's events), its groups' contexts,
/// its queued tasks.
pub fn nothing_left_on_the_server(url: &str, run_id: &str) {
    assert_eq!(on_the_server(url, run_id), OnTheServer::default());
}

/// A run that did not end ok kept its report consumer and its reports
/// for a resume. (Not every report need be acknowledged: a cancelled
/// sibling's may come in after the run ended.)
pub fn kept_on_the_server(url: &str, run_id: &str) {
    let left = on_the_server(url, run_id);
    assert!(
        left.consumer.is_some_and(|delivered| delivered > 0),
        "{left:?}"
    );
    assert!(left.reports > 0, "{left:?}");
}
