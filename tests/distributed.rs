//! Distributed runs through the real binary on a real `nats-server`
//! (JetStream): a coordinator (`troupe run --nats`) and workers
//! (`troupe worker`), each its own process.
//!
//! - Three workers give the same results as one process, under the cap.
//! - Fail-fast reaches every worker: the siblings in flight on both are
//!   cancelled (their shell processes gone), nothing past the cap starts,
//!   the join never runs.
//! - A worker killed with SIGKILL: its siblings run again elsewhere once
//!   their lease runs out, and each still exits once in the log.
//! - The coordinator killed with SIGKILL, then `troupe resume --nats`:
//!   no finished sibling runs again, the log's `seq` goes on unbroken.
//! - A three-server cluster losing a server mid-fan-out still finishes.
//! - A worker whose copy of the pipeline differs refuses the task.
//!
//! The server comes from `TROUPE_NATS_SERVER` or `nats-server` on PATH;
//! without one the tests say so and pass, unless `TROUPE_REQUIRE_NATS` is
//! set (CI installs one, see `.ci/run`), when they fail.
//!
//! Nothing here sleeps to let something happen: the tests wait on what
//! the processes print (the server's "ready", a worker's task log, the
//! coordinator's event stream) and on files the stages' shell commands
//! write, each wait bounded by [`WAIT`] so a bug fails instead of hanging.
//! The pipelines' shell commands poll for a release file; that is the
//! stage's work, not the test's timing.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The longest any wait for a process's output or a file may take before
/// the test fails (a bound, not a pause).
const WAIT: Duration = Duration::from_secs(90);

/// The nats-server to run, or `None` (the test is skipped) when there is
/// none and none is required.
fn nats_server() -> Option<PathBuf> {
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

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The lines a child writes on one of its pipes, as they come.
struct Lines {
    rx: mpsc::Receiver<String>,
    seen: Vec<String>,
    what: String,
}

impl Lines {
    fn of(reader: impl std::io::Read + Send + 'static, what: &str) -> Lines {
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
    fn wait_for(&mut self, pred: impl Fn(&str) -> bool, waiting_for: &str) -> String {
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
    fn find(&mut self, pred: impl Fn(&str) -> bool, waiting_for: &str) -> String {
        if let Some(line) = self.seen.iter().find(|l| pred(l)) {
            return line.clone();
        }
        self.wait_for(pred, waiting_for)
    }

    /// Everything printed so far, without waiting: for a failure's message.
    fn so_far(&mut self) -> String {
        while let Ok(line) = self.rx.try_recv() {
            self.seen.push(line);
        }
        format!("--- {}:\n{}", self.what, self.seen.join("\n"))
    }

    /// Everything printed so far and until the pipe closes.
    fn rest(&mut self) -> Vec<String> {
        while let Ok(line) = self.rx.recv_timeout(WAIT) {
            self.seen.push(line);
        }
        self.seen.clone()
    }
}

/// A child process that is killed (and reaped) when dropped, so a failed
/// assertion leaves nothing running.
struct Owned {
    child: Child,
}

impl Owned {
    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    /// Waits for the process to exit on its own, at most [`WAIT`].
    fn wait(&mut self) -> std::process::ExitStatus {
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

impl Drop for Owned {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One nats-server with JetStream, its store in a temp dir.
struct Server {
    process: Owned,
    port: u16,
    log: Lines,
    _store: tempfile::TempDir,
}

impl Server {
    fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    fn start(bin: &Path) -> Server {
        Server::spawn(bin, &[], "Server is ready")
    }

    fn spawn(bin: &Path, extra: &[String], ready: &str) -> Server {
        let store = tempfile::tempdir().unwrap();
        let port = free_port();
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
    fn cluster(bin: &Path) -> Vec<Server> {
        let routes: Vec<u16> = (0..3).map(|_| free_port()).collect();
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
                Server::spawn(bin, &extra, "Server is ready")
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

fn troupe() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
    cmd.stdin(Stdio::null());
    cmd
}

/// A running `troupe worker`, ready (it printed "serving at"), with its
/// task log on stdout.
struct Worker {
    name: String,
    process: Owned,
    tasks: Lines,
    stderr: Lines,
}

impl Worker {
    fn start(pipeline: &Path, url: &str, name: &str, root: &Path, extra: &[&str]) -> Worker {
        let mut child = troupe()
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
    fn reported(&mut self, suffix: &str) -> Value {
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
fn pipeline(command: &str, fail: Option<(usize, &str)>) -> common::Fixture {
    let plan = common::stage_md("plan", "", "Plan.").replace(
        "required: [summary]\n  properties:\n    summary: { type: string }",
        "required: [items]\n  properties:\n    items: { type: array }",
    );
    let worker = common::stage_md("worker", "", "Work on {{ctx.item}}.")
        .replace("allowedTools: [Read]", "allowedTools: [Bash]");
    let reduce = common::stage_md("reduce", "", "Reduce.");
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
    common::Fixture::new(
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
struct Project {
    dir: tempfile::TempDir,
}

impl Project {
    fn new() -> Project {
        Project {
            dir: tempfile::tempdir().unwrap(),
        }
    }
    fn root(&self) -> &Path {
        self.dir.path()
    }
    fn runs(&self) -> PathBuf {
        self.dir.path().join("runs")
    }
    /// The items whose siblings have started, in order (one per start).
    fn started(&self) -> Vec<u64> {
        std::fs::read_to_string(self.root().join("started"))
            .unwrap_or_default()
            .lines()
            .map(|l| l.trim().parse().unwrap())
            .collect()
    }
    /// Waits until `n` sibling starts were written.
    fn wait_started(&self, n: usize) {
        self.wait_started_or(n, String::new);
    }

    /// As `wait_started`, with `diagnose`'s text in the failure message.
    fn wait_started_or(&self, n: usize, diagnose: impl FnOnce() -> String) {
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
    fn release(&self) {
        std::fs::write(self.root().join("go"), "").unwrap();
    }
    /// A run command for `pipeline` against `url`, its runs here.
    fn run(&self, pipeline: &Path, url: &str) -> Command {
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
fn summary(out: &std::process::Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not a JSON summary ({e}); stdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn audit(summary: &Value) -> Vec<Value> {
    let path = summary["auditPath"].as_str().unwrap();
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn label(event: &Value) -> String {
    // `<run>/<stage>[#i]/<visit>` → `<stage>[#i]/<visit>`
    let id = event["stageExecutionId"].as_str().unwrap_or("");
    id.split_once('/').map_or(id, |(_, rest)| rest).to_owned()
}

fn is_sibling(event: &Value) -> bool {
    label(event).contains('#')
}

fn named<'a>(events: &'a [Value], name: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    events.iter().filter(move |e| e["event"] == name)
}

/// `seq` only goes up (events that never reach the log, such as
/// progress, take numbers too, so it may skip).
fn increasing_seq(events: &[Value]) {
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
fn check_log(events: &[Value], cap: usize) {
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
fn results(project: &Project, run_id: &str) -> BTreeMap<String, (String, Value)> {
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
fn processes_with(marker: &str) -> Vec<u32> {
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

#[test]
fn three_workers_give_the_results_one_process_gives_under_the_cap() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    let workers: Vec<Worker> = (1..=3)
        .map(|i| {
            Worker::start(
                fixture.path(),
                &server.url(),
                &format!("w{i}"),
                project.root(),
                &["--max-siblings", "2"],
            )
        })
        .collect();
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=24", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let remote = summary(&out);
    let events = audit(&remote);
    check_log(&events, 4);
    let ran_on: BTreeSet<&str> = named(&events, "StageEntered")
        .filter_map(|e| e["worker"].as_str())
        .collect();
    assert!(!ran_on.is_empty());
    assert!(
        ran_on
            .iter()
            .all(|w| workers.iter().any(|worker| worker.name == *w))
    );
    assert_eq!(
        named(&events, "StageEntered")
            .filter(|e| is_sibling(e))
            .count(),
        24
    );

    // The same pipeline in one process.
    let local_project = Project::new();
    let out = troupe()
        .arg("run")
        .arg(fixture.path())
        .args(["--ctx", "width=24", "--json", "--runs-dir"])
        .arg(local_project.runs())
        .arg("--root")
        .arg(local_project.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let local = summary(&out);
    assert_eq!(remote["stages"], local["stages"]);
    assert_eq!(
        results(&project, remote["runId"].as_str().unwrap()),
        results(&local_project, local["runId"].as_str().unwrap())
    );
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(
        started,
        (0..24).collect::<Vec<_>>(),
        "each sibling ran once"
    );

    // SIGTERM drains a worker: with nothing in flight it exits at once,
    // saying what it ran; together they ran every sibling.
    let mut finished = 0;
    for mut worker in workers {
        worker.process.signal(nix::sys::signal::Signal::SIGTERM);
        assert!(worker.process.wait().success(), "{}", worker.name);
        let line = worker
            .stderr
            .find(|l| l.contains("siblings finished"), "its summary");
        finished += line
            .split_whitespace()
            .nth(1)
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or_else(|| panic!("{line}"));
    }
    assert_eq!(finished, 24);
}

#[test]
fn a_failed_sibling_cancels_the_siblings_in_flight_on_every_worker() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let project = Project::new();
    // In the command line of every shell the siblings start.
    let marker = format!("troupe-test-{}", project.root().display());
    let fixture = pipeline(
        &format!("while true; do sleep 0.05; done # {marker}"),
        Some((
            3,
            "until [ \"$(wc -l < started)\" -ge 4 ]; do sleep 0.02; done",
        )),
    );
    // Two workers of two: the cap's four siblings are two on each.
    let mut workers: Vec<Worker> = (1..=2)
        .map(|i| {
            Worker::start(
                fixture.path(),
                &server.url(),
                &format!("w{i}"),
                project.root(),
                &["--max-siblings", "2"],
            )
        })
        .collect();
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=40", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["status"], "failed");
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("ParallelSiblingFailure") && reason.contains("worker#3"),
        "{reason}"
    );
    let events = audit(&s);
    check_log(&events, 4);
    // Exactly the cap's four started; the other three were cancelled.
    let entered: BTreeMap<String, String> = named(&events, "StageEntered")
        .filter(|e| is_sibling(e))
        .map(|e| (label(e), e["worker"].as_str().unwrap().to_owned()))
        .collect();
    let expected: BTreeSet<String> = (0..4).map(|i| format!("worker#{i}/1")).collect();
    assert_eq!(entered.keys().cloned().collect::<BTreeSet<_>>(), expected);
    let cancelled: BTreeSet<String> = named(&events, "StageCancelled").map(label).collect();
    assert_eq!(cancelled, (0..3).map(|i| format!("worker#{i}/1")).collect());
    let on: BTreeSet<&String> = entered.values().collect();
    assert_eq!(on.len(), 2, "the siblings ran on both workers: {entered:?}");
    assert!(
        named(&events, "StageEntered").all(|e| label(e) != "reduce/1"),
        "the join ran after a failure"
    );
    let mut started = project.started();
    started.sort_unstable();
    assert_eq!(started, vec![0, 1, 2, 3], "a sibling past the cap started");
    // Each worker reported its cancelled siblings, and their shell
    // processes are gone.
    for w in &mut workers {
        for (id, on) in &entered {
            if on == &w.name && id != "worker#3/1" {
                let line = w.reported(&format!("/{id}"));
                assert_eq!(line["report"], "cancelled", "{line}");
            }
        }
    }
    let deadline = Instant::now() + WAIT;
    while !processes_with(&marker).is_empty() {
        assert!(
            Instant::now() < deadline,
            "shell processes of cancelled siblings outlived them: {:?}",
            processes_with(&marker)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_killed_workers_siblings_run_again_on_another_and_exit_once() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("while [ ! -e go ]; do sleep 0.02; done", None);
    let project = Project::new();
    let lease = ["--max-siblings", "2", "--nats-lease", "2s"];
    let mut doomed = Worker::start(
        fixture.path(),
        &server.url(),
        "doomed",
        project.root(),
        &lease,
    );
    let _survivor = Worker::start(
        fixture.path(),
        &server.url(),
        "survivor",
        project.root(),
        &lease,
    );
    let mut coordinator = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=10", "--json", "--nats-lease", "2s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = coordinator.stdout.take().unwrap();
    let mut coordinator = Owned { child: coordinator };
    // Four in flight, two on each worker; one dies holding two.
    project.wait_started(4);
    doomed.process.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = doomed.process.wait();
    project.release();
    let status = coordinator.wait();
    let mut out = String::new();
    std::io::Read::read_to_string(&mut BufReader::new(stdout), &mut out).unwrap();
    assert!(status.success(), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    let events = audit(&s);
    check_log(&events, 4);
    let exited: Vec<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exited.len(), 10);
    assert_eq!(exited.iter().collect::<BTreeSet<_>>().len(), 10);
    let redelivered: BTreeSet<String> = named(&events, "SiblingRedelivered").map(label).collect();
    assert_eq!(redelivered.len(), 2, "{redelivered:?}");
    // The two the dead worker held started twice, the rest once.
    let mut runs: HashMap<u64, usize> = HashMap::new();
    for item in project.started() {
        *runs.entry(item).or_default() += 1;
    }
    let twice: BTreeSet<String> = runs
        .iter()
        .filter(|(_, n)| **n == 2)
        .map(|(i, _)| format!("worker#{i}/1"))
        .collect();
    assert_eq!(twice, redelivered);
    assert!(
        runs.values().all(|n| *n <= 2) && runs.len() == 10,
        "{runs:?}"
    );
}

#[test]
fn a_killed_coordinator_resumes_without_running_a_finished_sibling_again() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    // Items below 6 finish at once; the rest wait for `go`.
    let fixture = pipeline(
        "if [ {{ctx.item}} -ge 6 ]; then while [ ! -e go ]; do sleep 0.02; done; fi",
        None,
    );
    let project = Project::new();
    let mut workers: Vec<Worker> = (1..=2)
        .map(|i| {
            Worker::start(
                fixture.path(),
                &server.url(),
                &format!("w{i}"),
                project.root(),
                &["--max-siblings", "2"],
            )
        })
        .collect();
    let mut child = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=16", "--events", "-"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut stream = Lines::of(child.stdout.take().unwrap(), "coordinator");
    let mut coordinator = Owned { child };
    // Six siblings exited (stored: an exit is published after its
    // commit) and four wait on the workers.
    let mut run_id = String::new();
    for _ in 0..6 {
        let line = stream.wait_for(
            |l| {
                let e: Value = serde_json::from_str(l).unwrap_or_default();
                e["event"] == "StageExited" && is_sibling(&e)
            },
            "of a sibling's exit",
        );
        let e: Value = serde_json::from_str(&line).unwrap();
        run_id = e["workflowRunId"].as_str().unwrap().to_owned();
    }
    project.wait_started(10);
    coordinator.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = coordinator.wait();
    // The four finish with no coordinator; their reports wait in
    // JetStream for the resumed one.
    project.release();
    for w in &mut workers {
        // Each worker held two of the four: wait for both reports.
        let held = |l: &str| {
            let v: Value = serde_json::from_str(l).unwrap_or_default();
            v["report"] == "exited"
                && v["reported"] == true
                && v["stageExecutionId"]
                    .as_str()
                    .and_then(|id| id.split_once("worker#"))
                    .and_then(|(_, rest)| rest.split('/').next()?.parse::<u64>().ok())
                    .is_some_and(|item| item >= 6)
        };
        w.tasks.wait_for(held, "reporting a held sibling");
        w.tasks.wait_for(held, "reporting the other held sibling");
    }
    let out = troupe()
        .args([
            "resume",
            &run_id,
            "--nats",
            &server.url(),
            "--json",
            "--runs-dir",
        ])
        .arg(project.runs())
        .arg("--root")
        .arg(project.root())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let s = summary(&out);
    assert_eq!(s["status"], "ok");
    let events = audit(&s);
    // The resumed log repaired the killed session's tail and went on.
    check_log_allowing_lost(&events);
    let mut per_item: HashMap<u64, usize> = HashMap::new();
    for item in project.started() {
        *per_item.entry(item).or_default() += 1;
    }
    assert_eq!(per_item.len(), 16, "{per_item:?}");
    assert!(
        per_item.values().all(|n| *n == 1),
        "a finished sibling ran again after the resume: {per_item:?}"
    );
    let exits: Vec<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exits.len(), 16, "{exits:?}");
    assert_eq!(exits.iter().collect::<BTreeSet<_>>().len(), 16);
}

/// [`check_log`] for a log a killed coordinator left and a resume went on
/// with: `seq` goes up with no gap at the resume, nothing ends twice; an execution the kill left
/// open was closed by the repair (`StageCancelled`, ProcessLost) before
/// the resumed session entered it again.
fn check_log_allowing_lost(events: &[Value]) {
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

#[test]
fn a_cluster_that_loses_a_server_mid_fan_out_finishes_the_run() {
    let Some(bin) = nats_server() else { return };
    let mut servers = Server::cluster(&bin);
    let urls = servers
        .iter()
        .map(Server::url)
        .collect::<Vec<_>>()
        .join(",");
    let fixture = pipeline("while [ ! -e go ]; do sleep 0.02; done", None);
    let project = Project::new();
    let mut workers: Vec<Worker> = (1..=2)
        .map(|i| {
            Worker::start(
                fixture.path(),
                &urls,
                &format!("w{i}"),
                project.root(),
                &["--max-siblings", "2", "--nats-replicas", "3"],
            )
        })
        .collect();
    let mut child = project
        .run(fixture.path(), &urls)
        .args(["--ctx", "width=12", "--json", "--nats-replicas", "3"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = Lines::of(child.stdout.take().unwrap(), "coordinator");
    let mut stderr = Lines::of(child.stderr.take().unwrap(), "coordinator's stderr");
    let mut coordinator = Owned { child };
    project.wait_started_or(4, || {
        let mut text = stderr.so_far();
        for w in &mut workers {
            text += &format!("\n{}\n{}", w.tasks.so_far(), w.stderr.so_far());
        }
        for s in &mut servers {
            text += &format!("\n{}", s.log.so_far());
        }
        text
    });
    // One of three gone: the streams keep a quorum of two.
    servers[0].process.signal(nix::sys::signal::Signal::SIGKILL);
    let _ = servers[0].process.wait();
    project.release();
    let status = coordinator.wait();
    let mut stdout = stdout;
    let out = stdout.rest().join("\n");
    assert!(status.success(), "{out}");
    let s: Value = serde_json::from_str(&out).unwrap();
    let events = audit(&s);
    check_log(&events, 4);
    let exits: BTreeSet<String> = named(&events, "StageExited")
        .filter(|e| is_sibling(e))
        .map(label)
        .collect();
    assert_eq!(exits.len(), 12);
}

#[test]
fn a_worker_with_another_copy_of_the_pipeline_refuses_its_tasks() {
    let Some(bin) = nats_server() else { return };
    let server = Server::start(&bin);
    let fixture = pipeline("true", None);
    let project = Project::new();
    // The worker's copy: same id, one prompt changed.
    let theirs = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(fixture.path()).unwrap().flatten() {
        std::fs::copy(entry.path(), theirs.path().join(entry.file_name())).unwrap();
    }
    let worker_md = theirs.path().join("worker.md");
    let changed = std::fs::read_to_string(&worker_md)
        .unwrap()
        .replace("Work on", "Toil on");
    std::fs::write(&worker_md, changed).unwrap();
    let mut worker = Worker::start(theirs.path(), &server.url(), "stale", project.root(), &[]);
    let out = project
        .run(fixture.path(), &server.url())
        .args(["--ctx", "width=3", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let s = summary(&out);
    let reason = s["reason"].as_str().unwrap();
    assert!(
        reason.contains("Distributed/PipelineMismatch") && reason.contains("stale"),
        "{reason}"
    );
    let line = worker.reported("");
    assert_eq!(line["report"], "refused");
    assert_eq!(line["code"], "Distributed/PipelineMismatch");
    assert!(project.started().is_empty(), "a refused task ran");
}
