//! `troupe serve` as a real process, and the CLI clients as second
//! processes: twenty runs submitted at once under `--max-runs`, ten
//! watchers on a 10 000-wide run, approvals, answers and cancels from
//! elsewhere, `kill -9` of the server and a resume inside a new one,
//! SIGTERM (cancel or drain), the TCP listener's token, and the typed
//! refusals. Waits are for events (a line, a process's exit, a row),
//! bounded.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::{said, sibling_exits};

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

fn fanout() -> PathBuf {
    common::project::bundled("fanout")
}

/// Waits (bounded) until `check` holds.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `troupe serve` in a project folder of its own.
struct Server {
    child: Child,
    dir: PathBuf,
    /// `listening on …` and `dashboard: …` lines.
    said: Vec<String>,
}

impl Server {
    fn start(dir: &Path, extra: &[&str]) -> Server {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("serve.log"))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_troupe"))
            .arg("serve")
            .args(extra)
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut said = Vec::new();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let listeners = extra.iter().filter(|a| **a == "--listen").count().max(1);
        let tcp = extra.iter().filter(|a| a.starts_with("tcp:")).count();
        while said.len() < listeners + tcp {
            let mut line = String::new();
            let n = out.read_line(&mut line).unwrap();
            assert!(n > 0, "the server ended: {}", Server::log_of(dir));
            said.push(line.trim().to_owned());
        }
        Server {
            child,
            dir: dir.to_owned(),
            said,
        }
    }

    fn log_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    }

    fn log(&self) -> String {
        Server::log_of(&self.dir)
    }

    fn cli(&self, args: &[&str]) -> Output {
        cli(&self.dir, args)
    }

    fn tcp(&self) -> String {
        self.said
            .iter()
            .find_map(|l| l.strip_prefix("listening on tcp:"))
            .unwrap()
            .to_owned()
    }

    fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    fn wait(mut self) -> Option<i32> {
        let status = self.child.wait().unwrap();
        status.code()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn cli(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(args)
        .current_dir(dir)
        .env_remove("TROUPE_SERVER")
        .env_remove("TROUPE_TOKEN")
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Submits `stages/fanout` with `flags`; the run id.
fn submit_fanout(dir: &Path, flags: &[&str]) -> String {
    let fanout = fanout();
    let mut args = vec![fanout.to_str().unwrap()];
    args.extend_from_slice(flags);
    submit(dir, &args)
}

fn submit(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let out = cli(dir, &all);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The store's runs (`troupe runs --json`), by id.
fn runs(dir: &Path) -> Vec<Value> {
    let out = cli(dir, &["runs", "--json", "--limit", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["runs"].as_array().cloned().unwrap()
}

fn state_of(dir: &Path, id: &str) -> String {
    runs(dir)
        .iter()
        .find(|r| r["id"] == id)
        .map(|r| r["state"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

fn audit(dir: &Path, id: &str) -> Vec<Value> {
    troupe::auditlog::read_text(
        &dir.join(".troupe/runs")
            .join(id)
            .join(troupe::auditlog::FILE),
    )
    .unwrap_or_default()
    .lines()
    .filter_map(|l| serde_json::from_str(l).ok())
    .collect()
}

#[test]
fn twenty_runs_submitted_at_once_all_finish_and_never_more_than_max_runs_run() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--max-runs", "4"]);
    let fanout = fanout();
    let pipeline = fanout.to_str().unwrap();
    let clients: Vec<Child> = (0..20)
        .map(|i| {
            Command::new(env!("CARGO_BIN_EXE_troupe"))
                .args(["submit", pipeline, "--ctx", "width=20", "--latency", "5ms"])
                .args(["--client", &format!("client-{i}")])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut ids = Vec::new();
    for c in clients {
        let out = c.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        ids.push(String::from_utf8(out.stdout).unwrap().trim().to_owned());
    }
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 20);
    until("every run to end", || {
        let all = runs(dir.path());
        all.len() == 20 && all.iter().all(|r| r["state"] == "ok")
    });
    // The store's start and end of each run lie inside its place under
    // --max-runs: at no instant did five overlap.
    let spans: Vec<(i64, i64)> = runs(dir.path())
        .iter()
        .map(|r| {
            (
                r["startedAt"].as_i64().unwrap(),
                r["endedAt"].as_i64().unwrap(),
            )
        })
        .collect();
    for (start, _) in &spans {
        let at_once = spans
            .iter()
            .filter(|(s, e)| s <= start && start < e)
            .count();
        assert!(at_once <= 4, "{at_once} runs at once at {start}");
    }
    let log = server.log();
    assert!(log.contains("submitted by client-7"), "{log}");
    assert_eq!(log.matches("ended ok").count(), 20, "{log}");
}

#[test]
fn ten_watchers_follow_a_wide_run_to_its_end_and_miss_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let _server = Server::start(dir.path(), &[]);
    let id = submit_fanout(
        dir.path(),
        &["--ctx", "width=10000", "--parallel-cap", "256"],
    );
    let watchers: Vec<Child> = (0..10)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_troupe"))
                .args(["watch", &id, "--events", "-"])
                .current_dir(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for w in watchers {
        let out = w.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        let seqs: Vec<u64> = String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .map(|l| {
                serde_json::from_str::<Value>(l).unwrap()["seq"]
                    .as_u64()
                    .unwrap()
            })
            .collect();
        let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
        assert_eq!(seqs, expected, "every event, in order, once");
        assert!(seqs.len() > 10_000 * 5);
    }
    let log = audit(dir.path(), &id);
    assert_eq!(log.last().unwrap()["event"], "WorkflowExit");
    assert_eq!(log.last().unwrap()["status"], "ok");
}

/// A stage whose one `Echo` call is outside its envelope, so it waits
/// for an approval; then a human step.
fn asking() -> common::Fixture {
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let script = "stages:\n  s:\n    - tool: Echo\n      args: { text: from afar }\n    - complete: { summary: done }\n";
    common::Fixture::new(
        "id: ask\nentry: s\nstages:\n  s: s.md\n  q:\n    kind: human\n    prompt: \"Ship it?\"\n    fields: { type: object, required: [ok], properties: { ok: { type: boolean } } }\nnext:\n  s: q\n  q: end\n",
        &[("s.md", &stage), ("script.yaml", script)],
    )
}

fn wait_json(
    dir: &Path,
    args: &[&str],
    what: &str,
    pick: impl Fn(&Value) -> Option<String>,
) -> String {
    let mut found = String::new();
    until(what, || {
        let out = cli(dir, args);
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        match pick(&v) {
            Some(s) => {
                found = s;
                true
            }
            None => false,
        }
    });
    found
}

#[test]
fn a_second_process_approves_answers_and_cancels_hosted_runs() {
    let dir = tempfile::tempdir().unwrap();
    let _server = Server::start(dir.path(), &[]);
    let pipeline = asking();
    let id = submit(dir.path(), &[pipeline.path().to_str().unwrap()]);
    let proposal = wait_json(
        dir.path(),
        &["pending", &id, "--json"],
        "a pending approval",
        |v| v.get(0)?["proposalId"].as_str().map(str::to_owned),
    );
    let out = cli(
        dir.path(),
        &["approve", &id, &proposal, "--client", "reviewer"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // The question, asked through the API.
    let mut execution = String::new();
    until("the question", || {
        let log = audit(dir.path(), &id);
        match log
            .iter()
            .find(|e| e["stageId"] == "q" && e["event"] == "StageEntered")
        {
            Some(e) => {
                execution = e["stageExecutionId"].as_str().unwrap().to_owned();
                true
            }
            None => false,
        }
    });
    // An answer that breaks the fields is refused once the question is
    // open (before, it is not asked yet); the question stays open.
    until("the question to be open", || {
        let wrong = cli(
            dir.path(),
            &["answer", &id, &execution, "--field", "ok=maybe"],
        );
        assert_eq!(wrong.status.code(), Some(2), "{}", said(&wrong));
        said(&wrong).contains("AnswerInvalid")
    });
    let right = cli(
        dir.path(),
        &["answer", &id, &execution, "--field", "ok=true"],
    );
    assert_eq!(right.status.code(), Some(0), "{}", said(&right));
    let watched = cli(dir.path(), &["watch", &id]);
    assert_eq!(watched.status.code(), Some(0), "{}", said(&watched));
    let log = audit(dir.path(), &id);
    let granted = log
        .iter()
        .find(|e| e["event"] == "InteractionAnswered")
        .unwrap();
    assert!(granted.to_string().contains("reviewer"), "{granted}");
    assert!(!granted.to_string().contains("Bearer"));

    // Cancel from elsewhere: strict, as Ctrl-C.
    let long = submit_fanout(dir.path(), &["--ctx", "width=100000", "--latency", "20ms"]);
    until("the run to start", || audit(dir.path(), &long).len() > 20);
    let out = cli(dir.path(), &["cancel", &long[..13]]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let watched = cli(dir.path(), &["watch", &long]);
    assert_eq!(watched.status.code(), Some(130), "{}", said(&watched));
    until("the store to record it", || {
        state_of(dir.path(), &long) == "cancelled"
    });
}

#[test]
fn a_killed_server_leaves_its_runs_interrupted_and_a_new_one_resumes_them() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &[]);
    let id = submit_fanout(
        dir.path(),
        &[
            "--ctx",
            "width=2000",
            "--parallel-cap",
            "32",
            "--latency",
            "5ms",
        ],
    );
    until("some siblings to finish", || {
        audit(dir.path(), &id)
            .iter()
            .filter(|e| e["event"] == "StageExited")
            .count()
            > 100
    });
    server.signal(nix::sys::signal::Signal::SIGKILL);
    assert_eq!(server.wait(), None, "killed by the signal");
    assert_eq!(state_of(dir.path(), &id), "interrupted");
    let before = sibling_exits(&audit(dir.path(), &id), "worker");

    let again = Server::start(dir.path(), &[]);
    assert!(
        again
            .log()
            .contains(&format!("run {id} (fanout) was interrupted")),
        "{}",
        again.log()
    );
    let out = again.cli(&["resume", &id]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), id);
    let watched = again.cli(&["watch", &id]);
    assert_eq!(watched.status.code(), Some(0), "{}", said(&watched));
    until("the store to record it", || {
        state_of(dir.path(), &id) == "ok"
    });
    let after = sibling_exits(&audit(dir.path(), &id), "worker");
    assert_eq!(after.len(), 2000);
    for (index, exits) in &before {
        if exits.iter().any(|v| v == "ok") {
            assert_eq!(
                after[index], *exits,
                "sibling {index} ran again after the resume"
            );
        }
    }
    assert!(
        after
            .values()
            .all(|v| v.iter().filter(|x| *x == "ok").count() == 1)
    );
    // A run the server is running cannot be resumed twice.
    let twice = again.cli(&["resume", &id]);
    assert_ne!(twice.status.code(), Some(0));
}

#[test]
fn sigterm_cancels_the_runs_and_drain_lets_them_finish() {
    for (drain, expected) in [(false, "cancelled"), (true, "ok")] {
        let dir = tempfile::tempdir().unwrap();
        let flags: &[&str] = if drain { &["--drain"] } else { &[] };
        let server = Server::start(dir.path(), flags);
        let id = submit_fanout(
            dir.path(),
            &[
                "--ctx",
                "width=400",
                "--parallel-cap",
                "8",
                "--latency",
                "10ms",
            ],
        );
        until("the run to start", || audit(dir.path(), &id).len() > 20);
        server.signal(nix::sys::signal::Signal::SIGTERM);
        let log_dir = dir.path().to_owned();
        assert_eq!(server.wait(), Some(143), "{}", Server::log_of(&log_dir));
        assert_eq!(state_of(dir.path(), &id), expected, "drain: {drain}");
        let log = audit(dir.path(), &id);
        assert_eq!(log.last().unwrap()["event"], "WorkflowExit");
        assert!(
            !dir.path().join(".troupe/troupe.sock").exists(),
            "the socket is removed"
        );
    }
}

/// One raw HTTP/1.1 exchange: the status and the body.
fn http(addr: &str, request: &str) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    (status, head.to_owned(), body.to_owned())
}

fn get(addr: &str, path: &str, headers: &str) -> (u16, String, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"),
    )
}

fn post(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            body.len()
        ),
    )
}

#[test]
fn the_tcp_listener_wants_the_token_and_guards_the_dashboard_session() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--listen", "tcp:127.0.0.1:0"]);
    let addr = server.tcp();
    let token_file = dir.path().join(".troupe/token");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&token_file).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600);
    let token = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_owned();

    let (status, _, body) = get(&addr, "/v1/runs", "");
    assert_eq!(status, 401);
    assert!(body.contains("Control/Unauthorized"), "{body}");
    let (status, _, _) = get(&addr, "/v1/runs", "Authorization: Bearer nottheone\r\n");
    assert_eq!(status, 401);
    let (status, _, body) = get(
        &addr,
        "/v1/runs",
        &format!("Authorization: Bearer {token}\r\n"),
    );
    assert_eq!(status, 200, "{body}");

    // The login link works once, and gives a session cookie.
    let link = server
        .said
        .iter()
        .find_map(|l| l.strip_prefix("dashboard: "))
        .unwrap();
    let path = &link[link.find("/login").unwrap()..];
    let (status, head, _) = get(&addr, path, "");
    assert_eq!(status, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| {
            l.strip_prefix("set-cookie: ")
                .or_else(|| l.strip_prefix("Set-Cookie: "))
        })
        .unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let session = cookie.split(';').next().unwrap();
    let (again, _, _) = get(&addr, path, "");
    assert_eq!(again, 401, "the link works once");
    let with = format!("Cookie: {session}\r\n");
    let (status, _, page) = get(&addr, "/", &with);
    assert_eq!(status, 200);
    assert!(page.contains("<title>troupe</title>"));
    // A state-changing request on the cookie alone (a cross-site form) is
    // refused; with the header from the own origin it gets through.
    let (status, _, body) = post(&addr, "/v1/runs/nope/cancel", &with, "null");
    assert_eq!(status, 403, "{body}");
    assert!(body.contains("Control/CrossSite"));
    let foreign = format!("{with}X-Troupe-Csrf: 1\r\nOrigin: http://evil.example\r\n");
    assert_eq!(post(&addr, "/v1/runs/nope/cancel", &foreign, "null").0, 403);
    let own = format!("{with}X-Troupe-Csrf: 1\r\nOrigin: http://{addr}\r\n");
    let (status, _, body) = post(&addr, "/v1/runs/nope/cancel", &own, "null");
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("Control/RunNotFound"), "{body}");

    // The CLI over TCP: the token from .troupe/token, or a wrong one.
    let fanout = fanout();
    let server_url = format!("http://{addr}");
    let out = cli(
        dir.path(),
        &[
            "submit",
            fanout.to_str().unwrap(),
            "--ctx",
            "width=5",
            "--server",
            &server_url,
            "--watch",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["submit", fanout.to_str().unwrap(), "--server", &server_url])
        .env("TROUPE_TOKEN", "wrong-token-of-enough-length")
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("Control/Unauthorized"),
        "{}",
        said(&out)
    );
}

#[test]
fn bad_listeners_second_servers_and_bad_submissions_are_typed_refusals() {
    let dir = tempfile::tempdir().unwrap();
    let refused = cli(dir.path(), &["serve", "--listen", "tcp:0.0.0.0:0"]);
    assert_eq!(refused.status.code(), Some(2));
    assert!(
        said(&refused).contains("Control/BadListen"),
        "{}",
        said(&refused)
    );
    let none = cli(dir.path(), &["submit", fanout().to_str().unwrap()]);
    assert_eq!(none.status.code(), Some(2));
    assert!(said(&none).contains("Control/NoServer"), "{}", said(&none));

    let server = Server::start(dir.path(), &[]);
    let twice = cli(dir.path(), &["serve"]);
    assert_eq!(twice.status.code(), Some(2));
    assert!(
        said(&twice).contains("Control/AlreadyServing"),
        "{}",
        said(&twice)
    );

    let missing = cli(dir.path(), &["submit", "no/such/pipeline"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(said(&missing).contains("Validation/"), "{}", said(&missing));
    let theirs = cli(
        dir.path(),
        &["submit", fanout().to_str().unwrap(), "--store", "x.db"],
    );
    assert_eq!(theirs.status.code(), Some(2));
    assert!(
        said(&theirs).contains("Control/BadArgs"),
        "{}",
        said(&theirs)
    );
    let flag = cli(
        dir.path(),
        &["submit", fanout().to_str().unwrap(), "--no-such-flag"],
    );
    assert_eq!(flag.status.code(), Some(2));
    // The server is unharmed: a good run still goes through.
    let id = submit(
        dir.path(),
        &[fanout().to_str().unwrap(), "--ctx", "width=3", "--watch"],
    );
    assert!(id.contains("run ok"), "{id}");
    // Accepted, then refused before it ran (no model server answers):
    // the watcher is told why and exits 2, instead of waiting forever.
    let unreachable = cli(
        dir.path(),
        &[
            "submit",
            fanout().to_str().unwrap(),
            "--base-url",
            "http://127.0.0.1:9/v1",
            "--model",
            "m",
            "--watch",
        ],
    );
    assert_eq!(unreachable.status.code(), Some(2), "{}", said(&unreachable));
    assert!(
        said(&unreachable).contains("Control/RunRefused"),
        "{}",
        said(&unreachable)
    );
    drop(server);
}

/// A Prometheus text-format exposition, checked against the format's
/// grammar: `# HELP`/`# TYPE` before a family's samples, valid names and
/// labels, numeric values. The samples, by `name{labels}`.
fn parse_exposition(text: &str) -> std::collections::BTreeMap<String, f64> {
    use std::collections::{BTreeMap, BTreeSet};
    let name_ok = |n: &str| {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut typed = BTreeSet::new();
    let mut samples = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let name = rest.split(' ').next().unwrap();
            assert!(name_ok(name), "{line}");
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name_ok(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(kind != "counter" || name.ends_with("_total"), "{line}");
            typed.insert(name.to_owned());
        } else {
            let (series, value) = line.rsplit_once(' ').unwrap();
            let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
            let name = series.split('{').next().unwrap();
            assert!(
                name_ok(name) && typed.contains(name),
                "{line}: not declared"
            );
            if let Some(labels) = series.strip_prefix(name).filter(|l| !l.is_empty()) {
                let inner = labels
                    .strip_prefix('{')
                    .and_then(|l| l.strip_suffix('}'))
                    .unwrap();
                for pair in inner.split("\",") {
                    let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("{line}"));
                    assert!(name_ok(k), "{line}");
                    assert!(!v.trim_end_matches('"').contains('\n'), "{line}");
                }
            }
            assert!(
                samples.insert(series.to_owned(), value).is_none(),
                "{line} twice"
            );
        }
    }
    samples
}

#[test]
fn metrics_count_the_runs_executions_requests_and_tool_calls() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--listen", "tcp:127.0.0.1:0"]);
    let addr = server.tcp();
    let token = std::fs::read_to_string(dir.path().join(".troupe/token")).unwrap();
    let bearer = format!("Authorization: Bearer {}\r\n", token.trim());
    assert_eq!(
        get(&addr, "/metrics", "").0,
        401,
        "the token guards the metrics too"
    );
    let fanout = fanout();
    let url = format!("http://{addr}");
    // The first run knows its model's price, the second does not.
    for (width, price) in [("20", "1,2"), ("5", "")] {
        let width = format!("width={width}");
        let mut args = vec![
            "submit",
            fanout.to_str().unwrap(),
            "--ctx",
            &width,
            "--server",
            &url,
            "--watch",
        ];
        if !price.is_empty() {
            args.extend(["--price", price]);
        }
        let out = cli(dir.path(), &args);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    }
    let pipeline = asking();
    let waiting = submit(
        dir.path(),
        &[pipeline.path().to_str().unwrap(), "--server", &url],
    );
    let _ = wait_json(
        dir.path(),
        &["pending", &waiting, "--json", "--server", &url],
        "an approval",
        |v| v.get(0)?["proposalId"].as_str().map(str::to_owned),
    );
    let (status, head, body) = get(&addr, "/metrics", &bearer);
    assert_eq!(status, 200);
    assert!(
        head.to_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let m = parse_exposition(&body);
    assert_eq!(m["troupe_runs{status=\"ok\"}"], 2.0, "{body}");
    assert_eq!(m["troupe_runs{status=\"running\"}"], 1.0, "{body}");
    assert_eq!(
        m["troupe_executions{stage=\"worker\",state=\"ok\"}"], 25.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_executions{stage=\"reduce\",state=\"ok\"}"], 2.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_executions{stage=\"s\",state=\"running\"}"], 1.0,
        "{body}"
    );
    assert_eq!(
        m["troupe_waiting_answers{kind=\"approval\"}"], 1.0,
        "{body}"
    );
    // Every fanout sibling is two model turns; plus the plan's and reduce's.
    assert!(
        m["troupe_model_requests_total{model=\"scripted\"}"] >= 2.0 * 25.0,
        "{body}"
    );
    assert!(
        m["troupe_tokens_total{model=\"scripted\",kind=\"input\"}"] > 0.0,
        "{body}"
    );
    let cost = m["troupe_model_cost_usd_total{model=\"scripted\"}"];
    let at_most = (m["troupe_tokens_total{model=\"scripted\",kind=\"input\"}"]
        + 2.0 * m["troupe_tokens_total{model=\"scripted\",kind=\"output\"}"])
        / 1e6;
    assert!(
        cost > 0.0 && cost < at_most,
        "{cost} of at most {at_most}: {body}"
    );
    assert!(m["troupe_audit_events_total"] > 100.0, "{body}");
    assert!(m.contains_key("troupe_audit_idle_seconds"), "{body}");
    let out = cli(dir.path(), &["cancel", &waiting, "--server", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));

    // A fan-out of three under cap 1 whose first sibling waits for an
    // approval: two siblings wait for a slot.
    let worker =
        common::stage_md("worker", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let plan = common::stage_md("plan", "", "Plan.").replace(
        "required: [summary]\n  properties:\n    summary: { type: string }",
        "required: [items]\n  properties:\n    items: { type: array }",
    );
    let fan = common::Fixture::new(
        "id: fan\nentry: plan\nstages:\n  plan: plan.md\n  worker: worker.md\nnext:\n  plan: { parallel: { map: worker, over: \"ctx.upstream[0].parsed.items\", cap: 1 } }\n  worker: end\n",
        &[
            ("plan.md", &plan),
            ("worker.md", &worker),
            (
                "script.yaml",
                "stages:\n  plan:\n    - complete: { items: [1, 2, 3] }\n  worker:\n    - tool: Echo\n      args: { text: hi }\n    - complete: { summary: done }\n",
            ),
        ],
    );
    let fanning = submit(
        dir.path(),
        &[fan.path().to_str().unwrap(), "--server", &url],
    );
    let _ = wait_json(
        dir.path(),
        &["pending", &fanning, "--json", "--server", &url],
        "an approval",
        |v| v.get(0)?["proposalId"].as_str().map(str::to_owned),
    );
    let (_, _, body) = get(&addr, "/metrics", &bearer);
    let m = parse_exposition(&body);
    assert_eq!(
        m["troupe_executions_waiting{stage=\"worker\"}"], 2.0,
        "{body}"
    );
    let out = cli(dir.path(), &["cancel", &fanning, "--server", &url]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    until("the cancel to be counted", || {
        let (_, _, body) = get(&addr, "/metrics", &bearer);
        parse_exposition(&body)["troupe_runs{status=\"cancelled\"}"] == 2.0
    });
}
