//! `troupe serve` as a real process, and the CLI clients as second
//! processes: twenty runs submitted at once under `--max-runs`, ten
//! watchers on a 10 000-wide run, approvals, answers and cancels from
//! elsewhere, `kill -9` of the server and a resume inside a new one,
//! SIGTERM (cancel or drain), the TCP listener's token, and the typed
//! refusals (the metrics: `tests/serve_metrics.rs`; the helpers:
//! `tests/common/serve.rs`). Waits are for events (a line, a process's
//! exit, a row), bounded.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::{said, sibling_exits};
use common::serve::*;

use std::process::{Child, Command, Output, Stdio};

use serde_json::Value;

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
    let (status, head, _) = get(&addr, "/", "");
    let policy =
        (head.contains("script-src 'self';") && !head.contains("unsafe-inline")).then_some(status);
    assert_eq!(
        policy,
        Some(200),
        "the page, with no inline script allowed: {head}"
    );

    // The login link works once, and gives a session: a page that keeps it
    // in its origin's localStorage (no cookie, which a browser would send
    // to every port of the host).
    let link = server
        .said
        .iter()
        .find_map(|l| l.strip_prefix("dashboard: "))
        .unwrap();
    let path = &link[link.find("/login").unwrap()..];
    let (status, head, page) = get(&addr, path, "");
    assert_eq!(status, 200, "{head}");
    assert!(!head.to_ascii_lowercase().contains("set-cookie"), "{head}");
    let kept = page.split("\"troupe-session\" content=\"").nth(1).unwrap();
    let session = format!("X-Troupe-Session: {}", &kept[..kept.find('"').unwrap()]);
    let (again, _, _) = get(&addr, path, "");
    assert_eq!(again, 401, "the link works once");
    // `troupe dashboard` prints a new link (over the project's socket,
    // which a TCP listener does not replace, or over TCP with the
    // token); a newer one voids it unused, and each works once.
    let over_tcp = format!("http://{addr}");
    let fresh = |out: Output| {
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        let url = String::from_utf8(out.stdout).unwrap().trim().to_owned();
        assert!(
            url.starts_with(&format!("http://{addr}/login?once=")),
            "{url}"
        );
        url[url.find("/login").unwrap()..].to_owned()
    };
    let voided = fresh(cli(dir.path(), &["dashboard"]));
    let newest = fresh(cli(dir.path(), &["dashboard", "--server", &over_tcp]));
    assert_eq!(get(&addr, &voided, "").0, 401, "a newer link voids it");
    assert_eq!(get(&addr, &newest, "").0, 200);
    assert_eq!(get(&addr, &newest, "").0, 401, "and works once");
    // The page holds no data: served to anyone; the data wants the session.
    let (status, _, page) = get(&addr, "/", "");
    assert_eq!(status, 200);
    assert!(page.contains("<title>troupe</title>"));
    let with = format!("{session}\r\n");
    assert_eq!(get(&addr, "/v1/runs", "").0, 401);
    assert_eq!(get(&addr, "/v1/runs", &with).0, 200);
    assert_eq!(
        get(&addr, "/v1/runs", "Cookie: troupe_session=x\r\n").0,
        401
    );
    // A state-changing request on the session alone is refused; with the
    // header from the own origin it gets through.
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
    let none = cli(dir.path(), &["dashboard"]);
    assert_eq!(none.status.code(), Some(2));
    assert!(said(&none).contains("Control/NoServer"), "{}", said(&none));

    let server = Server::start(dir.path(), &[]);
    let no_dashboard = cli(dir.path(), &["dashboard"]);
    assert_eq!(
        no_dashboard.status.code(),
        Some(2),
        "{}",
        said(&no_dashboard)
    );
    assert!(
        said(&no_dashboard).contains("Control/NoDashboard"),
        "{}",
        said(&no_dashboard)
    );
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

/// A run's sandboxed `Bash` step reads the TCP listener's token (its file
/// is readable where it runs) and calls the API with it: refused with
/// `403 Control/InsideRun`, as on the sockets, while the test's own
/// client, with the same token, gets through.
#[test]
fn a_process_a_hosted_run_started_is_refused_by_the_tcp_listener() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--listen", "tcp:127.0.0.1:0"]);
    let addr = server.tcp();
    let (host, port) = addr.rsplit_once(':').unwrap();
    common::serve::probe(
        dir.path(),
        &[
            "import socket",
            "token = open('.troupe/token').read().strip()",
            &format!("s = socket.create_connection(('{host}', {port}))"),
            "s.sendall(('GET /v1/runs HTTP/1.1\\r\\nHost: t\\r\\nConnection: close\\r\\n'",
            "           'Authorization: Bearer ' + token + '\\r\\n\\r\\n').encode())",
            "print(s.recv(4096).decode())",
        ],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["submit", "probe", "--server", &format!("http://{addr}")])
        .args(["--root", dir.path().to_str().unwrap()])
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let id = String::from_utf8(out.stdout).unwrap().trim().to_owned();
    until("the probe's run to end", || {
        runs(dir.path())
            .iter()
            .any(|r| r["id"] == id.as_str() && r["state"] == "ok")
    });
    let shown = server.cli(&["runs", "show", &id, "--json"]);
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("HTTP/1.1 403 Forbidden"), "{text}");
    assert!(text.contains("Control/InsideRun"), "{text}");
}

/// `troupe serve --pipelines DIR`: clients run the operator's pipelines
/// and nothing else (a link inside the folder that leads out is outside),
/// with none of the options that would widen what the run reaches, their
/// approvals are not asked of them, and they cannot resume a run of
/// another pipeline through the server either. The folders must lie where
/// no run can write: outside the root, with the shells' writes confined.
#[test]
fn a_server_of_curated_pipelines_refuses_other_pipelines_and_widening_options() {
    let dir = tempfile::tempdir().unwrap();
    let operators = tempfile::tempdir().unwrap();
    let curated = operators.path().join("fanout");
    std::fs::create_dir_all(&curated).unwrap();
    for entry in std::fs::read_dir(fanout()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), curated.join(entry.file_name())).unwrap();
    }
    let escape = operators.path().join("escape");
    std::os::unix::fs::symlink(fanout(), &escape).unwrap();
    let operators_dir = operators.path().to_str().unwrap();
    if troupe::tools::sandbox::probe(&[dir.path().to_owned()]).is_err() {
        // No Landlock here: a run's shell could rewrite the pipelines.
        let refused = cli(dir.path(), &["serve", "--pipelines", operators_dir]);
        assert_eq!(refused.status.code(), Some(2), "{}", said(&refused));
        assert!(
            said(&refused).contains("write confinement"),
            "{}",
            said(&refused)
        );
        eprintln!("note: no Landlock here; only the refusal to start is tested");
        return;
    }
    // A folder inside the root, where runs write, is refused.
    std::fs::create_dir(dir.path().join("inside")).unwrap();
    let inside = cli(dir.path(), &["serve", "--pipelines", "inside"]);
    assert_eq!(inside.status.code(), Some(2), "{}", said(&inside));
    assert!(
        said(&inside).contains("overlaps the root"),
        "{}",
        said(&inside)
    );
    let elsewhere = dir.path().join("elsewhere.yaml");
    std::fs::copy(fanout().join("script.yaml"), &elsewhere).unwrap();
    // A run of a pipeline outside the folders, made without the server,
    // stopped by a failed sibling so that it could be resumed.
    let outside = cli(
        dir.path(),
        &[
            "run",
            fanout().to_str().unwrap(),
            "--ctx",
            "width=4",
            "--fail-sibling",
            "worker#1",
            "--json",
        ],
    );
    assert_eq!(outside.status.code(), Some(1), "{}", said(&outside));
    let outside: Value = serde_json::from_slice(&outside.stdout).unwrap();
    let outside = outside["runId"].as_str().unwrap();

    let server = Server::start(dir.path(), &["--pipelines", operators_dir]);
    let pipeline = curated.to_str().unwrap();
    let id = submit(dir.path(), &[pipeline, "--ctx", "width=3"]);
    until("the run to end", || state_of(dir.path(), &id) == "ok");
    // Approvals are not put to these clients (questions still are).
    let shown = {
        use std::io::{Read, Write};
        let mut socket =
            std::os::unix::net::UnixStream::connect(dir.path().join(".troupe/troupe.sock"))
                .unwrap();
        write!(
            socket,
            "GET /v1/runs/{id} HTTP/1.1\r\nHost: troupe\r\nConnection: close\r\n\r\n"
        )
        .unwrap();
        let mut reply = String::new();
        socket.read_to_string(&mut reply).unwrap();
        reply
    };
    assert!(shown.contains("\"remoteAnswers\":false"), "{shown}");
    let script = curated.join("script.yaml");
    let inside_script = submit(
        dir.path(),
        &[
            pipeline,
            "--ctx",
            "width=2",
            "--script",
            script.to_str().unwrap(),
            "--watch",
        ],
    );
    assert!(inside_script.contains("run ok"), "{inside_script}");

    let refused = |args: &[&str], code: &str, naming: &str| {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        let out = cli(dir.path(), &all);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", said(&out));
        assert!(
            said(&out).contains(code) && said(&out).contains(naming),
            "{args:?}: {}",
            said(&out)
        );
    };
    let bundled = fanout();
    refused(
        &[bundled.to_str().unwrap()],
        "Control/PipelineNotAllowed",
        "--pipelines",
    );
    refused(
        &[escape.to_str().unwrap()],
        "Control/PipelineNotAllowed",
        "escape",
    );
    let widening: [&[&str]; 18] = [
        &["--no-sandbox"],
        &["--parallel-cap", "100000"],
        &["--threads", "64"],
        &["--pass-env", "HOME"],
        &["--root", "/"],
        &["--yolo"],
        &["--remote"],
        &["--provider", "openai"],
        &["--base-url", "http://127.0.0.1:9/v1"],
        &["--model", "gpt-4o"],
        &["--api-key-env", "HOME"],
        &["--provider-retries", "100"],
        &["--max-tokens", "5"],
        &["--price", "0,0"],
        &["--otlp", "http://127.0.0.1:9"],
        &["--nats", "nats://127.0.0.1:9"],
        &["--script", elsewhere.to_str().unwrap()],
        &["--answers", "/etc/passwd"],
    ];
    for flags in widening {
        let mut args = vec![pipeline];
        args.extend_from_slice(flags);
        refused(&args, "Control/OptionNotAllowed", flags[0]);
    }
    // A pipeline of the folders whose MCP server could write them.
    for (server, naming) in [
        ("    sandbox: false\n", "sandbox: false"),
        (
            &*format!("    writes: [\"{operators_dir}\"]\n"),
            "may write",
        ),
    ] {
        let with_mcp = operators.path().join("with-mcp");
        let _ = std::fs::remove_dir_all(&with_mcp);
        std::fs::create_dir(&with_mcp).unwrap();
        for entry in std::fs::read_dir(&curated).unwrap() {
            let entry = entry.unwrap();
            std::fs::copy(entry.path(), with_mcp.join(entry.file_name())).unwrap();
        }
        let yaml = with_mcp.join("pipeline.yaml");
        let text = std::fs::read_to_string(&yaml).unwrap();
        std::fs::write(
            &yaml,
            format!("{text}\nmcpServers:\n  writer:\n    command: \"true\"\n{server}"),
        )
        .unwrap();
        refused(
            &[with_mcp.to_str().unwrap()],
            "Control/PipelineNotAllowed",
            naming,
        );
    }
    let resumed = cli(dir.path(), &["resume", outside]);
    assert_eq!(resumed.status.code(), Some(2), "{}", said(&resumed));
    assert!(
        said(&resumed).contains("Control/PipelineNotAllowed"),
        "{}",
        said(&resumed)
    );
    assert_eq!(state_of(dir.path(), outside), "failed");
    // The operator resumes it in their own process beside the server.
    let local = cli(dir.path(), &["resume", outside, "--local"]);
    assert_eq!(local.status.code(), Some(0), "{}", said(&local));
    assert_eq!(state_of(dir.path(), outside), "ok");
    let log = server.log();
    assert_eq!(log.matches("ended ok").count(), 2, "{log}");
}

/// A run queued for a place under `--max-runs` holds no MCP server while
/// it waits: its server, started at submission to check the run, stops,
/// and starts again when the run gets its place.
#[test]
fn a_queued_run_holds_no_mcp_server_while_it_waits() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/fault_server.py");
    let p = dir.path().join("p");
    std::fs::create_dir(&p).unwrap();
    std::fs::write(
        p.join("pipeline.yaml"),
        format!(
            "id: t\nentry: s\nmcpServers:\n  srv:\n    command: python3\n    args: [\"{}\", \"{}\"]\nstages:\n  s: {{ kind: tool, tool: srv__slow, args: {{ ms: 3000 }} }}\nnext:\n  s: end\n",
            script.display(),
            stats.display()
        ),
    )
    .unwrap();
    let _server = Server::start(dir.path(), &["--max-runs", "1"]);
    let first = submit(dir.path(), &["p"]);
    let second = submit(dir.path(), &["p"]);
    let started = || -> Vec<i32> {
        std::fs::read_to_string(&stats)
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|e| e["event"] == "start")
            .map(|e| i32::try_from(e["pid"].as_i64().unwrap()).unwrap())
            .collect()
    };
    let gone = |pid: i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| {
            s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
    };
    until(
        "the queued run's server to stop while the first runs",
        || {
            let pids = started();
            pids.len() == 2 && gone(pids[1]) && state_of(dir.path(), &first) == "running"
        },
    );
    until("both runs to end", || {
        state_of(dir.path(), &first) == "ok" && state_of(dir.path(), &second) == "ok"
    });
    assert_eq!(started().len(), 3, "the queued run's server started again");
}

/// A run cancelled while it waits for a `--max-runs` place never starts:
/// it stops waiting, writes no log and no store row, and ends `cancelled`.
#[test]
fn a_run_cancelled_while_queued_never_starts() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--max-runs", "1"]);
    let first = submit_fanout(dir.path(), &["--ctx", "width=100000", "--latency", "20ms"]);
    let second = submit_fanout(dir.path(), &["--ctx", "width=4"]);
    until("the first run to start", || {
        audit(dir.path(), &first).len() > 20
    });
    let out = cli(dir.path(), &["cancel", &second]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    until("the queued run to end", || {
        server
            .log()
            .contains(&format!("run {second} ended cancelled (before it started)"))
    });
    let watched = cli(dir.path(), &["watch", &second]);
    assert_eq!(watched.status.code(), Some(130), "{}", said(&watched));
    let folder = dir.path().join(".troupe/runs").join(&second);
    assert!(!troupe::auditlog::in_dir(&folder).exists(), "no log");
    assert_eq!(state_of(dir.path(), &second), "", "no store row");
    assert_eq!(state_of(dir.path(), &first), "running", "the first runs on");
    let out = cli(dir.path(), &["cancel", &first]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}
