//! The control API through real processes: a `troupe run` serving its run
//! on `control.sock`, and the CLI clients (`watch`, `pending`, `approve`,
//! `deny`, `cancel`) as second processes. The run waits on an approval
//! that only the API can answer (`--remote --headless`), so every step
//! happens while it runs; waits are for events (the socket appearing, a
//! process exiting), bounded.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

/// A stage that proposes one `Echo` call outside its envelope, so the
/// call waits for an approval.
fn pipeline() -> common::Fixture {
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let script = "stages:\n  s:\n    - tool: Echo\n      args: { text: from afar }\n    - complete: { summary: done }\n";
    common::Fixture::new(
        "id: ctl\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
        &[("s.md", &stage), ("script.yaml", script)],
    )
}

struct Run {
    child: Child,
    runs: PathBuf,
    id: String,
    _dir: tempfile::TempDir,
    _pipeline: common::Fixture,
}

fn troupe(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

/// Waits (bounded) until `check` holds.
fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl Run {
    /// Starts the run and waits for its socket.
    fn start(flags: &[&str]) -> Run {
        let dir = tempfile::tempdir().unwrap();
        let runs = dir.path().join("runs");
        let pipeline = pipeline();
        let child = Command::new(env!("CARGO_BIN_EXE_troupe"))
            .arg("run")
            .arg(pipeline.path())
            .arg("--root")
            .arg(dir.path())
            .arg("--runs-dir")
            .arg(&runs)
            .args(["--headless", "--no-store", "--json"])
            .args(flags)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut id = String::new();
        until("the control socket", || {
            let found = std::fs::read_dir(&runs)
                .ok()
                .and_then(|mut d| d.next())
                .and_then(Result::ok)
                .filter(|e| e.path().join("control.sock").exists());
            if let Some(e) = found {
                id = e.file_name().to_string_lossy().into_owned();
                true
            } else {
                false
            }
        });
        Run {
            child,
            runs,
            id,
            _dir: dir,
            _pipeline: pipeline,
        }
    }

    fn runs(&self) -> &str {
        self.runs.to_str().unwrap()
    }

    fn cli(&self, command: &str, extra: &[&str]) -> Output {
        let mut args = vec![command, &self.id, "--runs-dir", self.runs()];
        args.extend_from_slice(extra);
        troupe(&args)
    }

    fn pending(&self) -> Vec<Value> {
        let out = self.cli("pending", &["--json"]);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        serde_json::from_slice::<Value>(&out.stdout)
            .unwrap()
            .as_array()
            .cloned()
            .unwrap()
    }

    fn wait_pending(&self) -> String {
        let mut proposal = String::new();
        until("a pending approval", || {
            let list = self.pending();
            if let Some(p) = list.first() {
                proposal = p["proposalId"].as_str().unwrap().to_owned();
                true
            } else {
                false
            }
        });
        proposal
    }

    /// Waits for the run's end: its output, its audit log, its folder
    /// (kept until `Kept` is dropped).
    fn finish(self) -> (Output, Vec<Value>, PathBuf, Kept) {
        let runs = self.runs.clone();
        let id = self.id.clone();
        let kept = Kept(self._dir, self._pipeline);
        let out = self.child.wait_with_output().unwrap();
        let audit = troupe::auditlog::read_text(&runs.join(&id).join(troupe::auditlog::FILE))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        (out, audit, runs.join(id), kept)
    }
}

/// Keeps a finished run's folders.
struct Kept(
    #[allow(dead_code)] tempfile::TempDir,
    #[allow(dead_code)] common::Fixture,
);

/// A watcher, once it printed its first line (so it is connected).
fn watching(run: &Run, extra: &[&str]) -> (Child, String) {
    let mut child = spawn_watch(run, extra);
    let mut first = String::new();
    let stdout = child.stdout.as_mut().unwrap();
    // One byte at a time: the rest stays in the pipe for wait_with_output.
    let mut byte = [0u8; 1];
    while !first.ends_with('\n') {
        let n = std::io::Read::read(stdout, &mut byte).unwrap();
        assert!(n > 0, "the watcher ended before its first line");
        first.push(char::from(byte[0]));
    }
    (child, first)
}

fn spawn_watch(run: &Run, extra: &[&str]) -> Child {
    Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["watch", &run.id, "--runs-dir", run.runs()])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn a_second_process_watches_the_run_and_approves_its_pending_call() {
    let run = Run::start(&["--remote"]);
    let proposal = run.wait_pending();
    // What is approved is what can be seen: the whole arguments too.
    let listed = run.pending();
    let args: Value = serde_json::from_str(listed[0]["args"].as_str().unwrap()).unwrap();
    assert_eq!(args, serde_json::json!({"text": "from afar"}));
    let (watch, watch_first) = watching(&run, &[]);
    let (raw, raw_first) = watching(&run, &["--events", "-"]);
    let out = run.cli("approve", &[&proposal, "--client", "alice"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (out, audit, dir, _kept) = run.finish();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    // The answer is audited with the client's name.
    let answered: Vec<&Value> = audit
        .iter()
        .filter(|e| e["event"] == "InteractionAnswered")
        .collect();
    assert_eq!(answered.len(), 1);
    assert_eq!(answered[0]["by"], "api");
    assert_eq!(answered[0]["rule"], "client: alice");
    assert!(
        audit
            .iter()
            .any(|e| e["event"] == "ToolInvocationSucceeded")
    );
    // Both watchers saw the run to its end and exit as it did.
    let watched = watch.wait_with_output().unwrap();
    assert_eq!(watched.status.code(), Some(0), "{}", said(&watched));
    let text = format!("{watch_first}{}", String::from_utf8_lossy(&watched.stdout));
    assert!(
        text.contains("/s/1: ok") && text.ends_with("run ok\n"),
        "{text}"
    );
    let raw = raw.wait_with_output().unwrap();
    let lines: Vec<Value> = format!("{raw_first}{}", String::from_utf8_lossy(&raw.stdout))
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), audit.len(), "every audit line, once, in order");
    assert_eq!(lines, audit);
    // The socket goes with the run.
    assert!(!dir.join("control.sock").exists());
}

#[test]
fn a_watcher_reconnecting_from_a_seq_gets_only_what_came_after() {
    let run = Run::start(&["--remote"]);
    let proposal = run.wait_pending();
    let (late, late_first) = watching(&run, &["--events", "-", "--from", "5"]);
    let out = run.cli("deny", &[&proposal]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (out, audit, _, _kept) = run.finish();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the model reads the denial: {}",
        said(&out)
    );
    let late = late.wait_with_output().unwrap();
    let seqs: Vec<u64> = format!("{late_first}{}", String::from_utf8_lossy(&late.stdout))
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    let expected: Vec<u64> = audit
        .iter()
        .map(|e| e["seq"].as_u64().unwrap())
        .filter(|&s| s > 5)
        .collect();
    assert_eq!(seqs, expected);
}

#[test]
fn cancel_from_another_process_ends_the_run_as_ctrl_c_does() {
    let run = Run::start(&["--remote"]);
    run.wait_pending();
    let (watch, _) = watching(&run, &[]);
    let out = run.cli("cancel", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (out, audit, _, _kept) = run.finish();
    assert_eq!(out.status.code(), Some(130), "{}", said(&out));
    let exit = audit.last().unwrap();
    assert_eq!(exit["event"], "WorkflowExit");
    assert_eq!(exit["status"], "cancelled");
    // The pending prompt was withdrawn with its stage.
    assert!(
        audit
            .iter()
            .any(|e| e["event"] == "InteractionAnswered" && e["outcome"] == "withdrawn")
    );
    let watched = watch.wait_with_output().unwrap();
    assert_eq!(watched.status.code(), Some(130), "{}", said(&watched));
}

#[test]
fn bad_calls_are_typed_errors() {
    // A run without --remote (held by a slow model turn): watched and
    // cancelled, but not answered.
    let run = Run::start(&["--latency", "60s"]);
    let out = run.cli("approve", &["nope"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("Control/NoRemoteAnswers"),
        "{}",
        said(&out)
    );
    let out = troupe(&["pending", "no-such-run", "--runs-dir", run.runs()]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("Control/RunNotFound"), "{}", said(&out));
    let out = run.cli("cancel", &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (out, _, _, _kept) = run.finish();
    assert_eq!(out.status.code(), Some(130), "{}", said(&out));

    // --remote: an unknown proposal, then a run that is over.
    let run = Run::start(&["--remote"]);
    let proposal = run.wait_pending();
    let out = run.cli("approve", &["no-such-proposal"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("Control/NotPending"), "{}", said(&out));
    let out = run.cli("approve", &[&proposal]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let (id, runs) = (run.id.clone(), run.runs.clone());
    let (out, _, _, _kept) = run.finish();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let out = troupe(&["pending", &id, "--runs-dir", runs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("Control/NotServing"), "{}", said(&out));
    // Watching a run that is over replays its log and exits as it did.
    let out = troupe(&["watch", &id, "--runs-dir", runs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        String::from_utf8_lossy(&out.stdout).ends_with("run ok\n"),
        "{}",
        said(&out)
    );
    // A socket a killed process left behind refuses connections: the run
    // is not served, and watching it still replays its log.
    let stale = runs.join(&id).join("control.sock");
    drop(std::os::unix::net::UnixListener::bind(&stale).unwrap());
    let out = troupe(&["pending", &id, "--runs-dir", runs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(said(&out).contains("stale"), "{}", said(&out));
    let out = troupe(&["watch", &id, "--runs-dir", runs.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

#[test]
fn a_socket_already_served_is_not_taken_over() {
    use troupe::control::{ControlServer, Hosted, RunControl};
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("control.sock");
    let audit = dir.path().join("audit.jsonl");
    let control = || {
        Hosted::one(std::sync::Arc::new(RunControl::new(
            "r", "p", &audit, None, None,
        )))
    };
    let first = ControlServer::start(&socket, control()).unwrap();
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&socket).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600, "only its owner may connect");
    let second = ControlServer::start(&socket, control()).unwrap_err();
    assert_eq!(second.kind(), std::io::ErrorKind::AddrInUse, "{second}");
    drop(first);
    assert!(!Path::new(&socket).exists());
    // A stale socket (nothing listening) is replaced.
    let stale = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    drop(stale);
    let again = ControlServer::start(&socket, control());
    assert!(again.is_ok(), "{:?}", again.err());
    drop(again);
    // A file that is not a socket (a mistyped `--listen unix:README.md`)
    // is refused and left as it was.
    let file = dir.path().join("README.md");
    std::fs::write(&file, "keep me").unwrap();
    let refused = ControlServer::start(&file, control()).unwrap_err();
    assert_eq!(
        refused.kind(),
        std::io::ErrorKind::AlreadyExists,
        "{refused}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "keep me");
}

/// A control server on a socket in `dir` for one run, `r`, that takes
/// remote approvals and questions, with a runtime and a client of it.
fn serving_r(
    dir: &std::path::Path,
) -> (
    troupe::control::ControlServer,
    tokio::runtime::Runtime,
    reqwest::Client,
) {
    use std::sync::Arc;
    use troupe::control::{ControlServer, Hosted, RunControl};
    let socket = dir.join("control.sock");
    std::fs::write(
        dir.join("audit.jsonl"),
        "{\"seq\":1,\"ts\":\"t\",\"event\":\"WorkflowStarted\"}\n",
    )
    .unwrap();
    let server = ControlServer::start(
        &socket,
        Hosted::one(Arc::new(RunControl::new(
            "r",
            "p",
            &dir.join("audit.jsonl"),
            Some(Arc::new(troupe::runtime::interaction::RemoteDesk::default())),
            Some(Arc::new(troupe::runtime::ask::QuestionDesk::default())),
        ))),
    )
    .unwrap();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let http = reqwest::Client::builder()
        .unix_socket(socket)
        .build()
        .unwrap();
    (server, rt, http)
}

/// A route that answers without reading the body it was sent (a path
/// that is not there, a method a route does not take, a path that does
/// not decode) still leaves the connection fit for the next request: on
/// one connection, each such request is answered and so is a second one
/// after it. (The server used to close the connection under the body's
/// unread bytes, which reset a client's next request on it.) A body over
/// the bound is refused and the connection closed, said in the answer.
#[test]
fn an_unread_body_never_costs_the_next_request_its_connection() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let (_server, _rt, _) = serving_r(dir.path());
    /// Sends a POST of `size` bytes to `path`; its status and headers.
    fn post(stream: &mut std::os::unix::net::UnixStream, path: &str, size: usize) -> String {
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: troupe\r\ncontent-type: application/json\r\ncontent-length: {size}\r\n\r\n"
        );
        stream.write_all(head.as_bytes()).unwrap();
        stream.write_all(&vec![b'{'; size]).unwrap();
        let mut got = Vec::new();
        let mut byte = [0u8; 1];
        while !got.ends_with(b"\r\n\r\n") {
            match stream.read(&mut byte) {
                Ok(1) => got.push(byte[0]),
                other => panic!("{path}: no answer ({other:?}) after {got:?}"),
            }
        }
        let head = String::from_utf8(got).unwrap().to_ascii_lowercase();
        let len: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length: "))
            .expect("a content length")
            .trim()
            .parse()
            .unwrap();
        let mut body = vec![0u8; len];
        stream.read_exact(&mut body).unwrap();
        let v: serde_json::Value = serde_json::from_slice(&body).expect("a JSON body");
        let code = v["error"]["code"].as_str().unwrap_or_default();
        assert!(code.starts_with("Control/"), "{path}: {v}");
        head
    }
    let socket = dir.path().join("control.sock");
    for path in ["/v1/nope/x", "/v1/runs/r/questions/%zz", "/v1/runs/r"] {
        let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let first = post(&mut stream, path, 60 * 1024);
        assert!(!first.contains("connection: close"), "{path}: {first}");
        post(&mut stream, "/v1/runs/r/questions/x", 8);
    }
    let mut stream = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let refused = post(&mut stream, "/v1/runs/r/questions/x", 70 * 1024);
    assert!(refused.starts_with("http/1.1 413"), "{refused}");
    assert!(refused.contains("connection: close"), "{refused}");
}

/// Whatever a client sends — bodies that are not JSON, JSON of the wrong
/// shape, huge ones, odd paths and queries — the server answers with a
/// typed error (or a success), never a crash or a hang, and keeps serving.
#[test]
fn bad_requests_get_typed_errors_and_the_server_keeps_serving() {
    use proptest::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let (_server, rt, http) = serving_r(dir.path());
    let send = |path: String, body: Vec<u8>| {
        rt.block_on(async {
            let r = http
                .post(format!("http://troupe{path}"))
                .body(body)
                .timeout(Duration::from_secs(10))
                .send()
                .await
                .expect("the server answers");
            (r.status().as_u16(), r.text().await.unwrap_or_default())
        })
    };
    let mut runner = proptest::test_runner::TestRunner::new(proptest::test_runner::Config {
        cases: 64,
        failure_persistence: None,
        ..Default::default()
    });
    let paths = prop_oneof![
        Just("/v1/runs/r/pending/".to_owned()),
        Just("/v1/runs/r/questions/".to_owned()),
        Just("/v1/runs/other/questions/".to_owned()),
        Just("/v1/nope/".to_owned()),
        Just("/v1/runs".to_owned()),
        Just("/v1/runs/r/resume".to_owned()),
    ];
    let bodies = prop_oneof![
        proptest::collection::vec(any::<u8>(), 0..512),
        "[a-z{}\\[\\]\":, 0-9]{0,64}".prop_map(String::into_bytes),
        Just(br#"{"answer":"approve"}"#.to_vec()),
        Just(vec![b'x'; 70 * 1024]),
    ];
    runner
        .run(
            &(paths, "[a-zA-Z0-9%#/._-]{0,24}", bodies),
            |(path, tail, body)| {
                let (status, text) = send(format!("{path}{tail}"), body);
                if status >= 400 {
                    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                        TestCaseError::fail(format!("{status} not JSON ({e}): {text}"))
                    })?;
                    let code = v["error"]["code"].as_str().unwrap_or_default();
                    prop_assert!(code.starts_with("Control/"), "{status}: {text}");
                }
                Ok(())
            },
        )
        .unwrap();
    // Still serving after all that.
    let (status, _) = rt.block_on(async {
        let r = http.get("http://troupe/v1/runs/r").send().await.unwrap();
        (r.status().as_u16(), ())
    });
    assert_eq!(status, 200);
}

/// A `Bash` call of the run (sandboxed, as by default) connects to the
/// run's control socket as any process of the user could: it is turned
/// away with `403 Control/InsideRun`, so it cannot approve its own calls
/// (nor, on `troupe serve`'s socket, submit a run).
#[test]
fn a_process_the_run_started_is_refused_by_its_control_socket() {
    let dir = tempfile::tempdir().unwrap();
    let runs = dir.path().join("runs");
    std::fs::write(
        dir.path().join("probe.py"),
        [
            "import glob, socket",
            "s = socket.socket(socket.AF_UNIX)",
            "s.connect(glob.glob('runs/*/control.sock')[0])",
            "s.sendall(b'GET /v1/runs HTTP/1.1\\r\\nHost: t\\r\\nConnection: close\\r\\n\\r\\n')",
            "print(s.recv(4096).decode())",
        ]
        .join("\n"),
    )
    .unwrap();
    let fixture = common::Fixture::new(
        "id: probe\nentry: s\nstages:\n  s: { kind: tool, tool: Bash, args: { command: \"python3 probe.py\" } }\nnext:\n  s: end\n",
        &[],
    );
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(fixture.path())
        .arg("--root")
        .arg(dir.path())
        .arg("--runs-dir")
        .arg(&runs)
        .args(["--headless", "--no-store", "--remote", "--json"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let told = summary["results"][0]["parsed"]["text"].as_str().unwrap();
    assert!(told.contains("stdout:\nHTTP/1.1 403 Forbidden"), "{told}");
    assert!(told.contains("Control/InsideRun"), "{told}");
}

/// `--store`, `--no-store` and `--runs-dir` are the server's: a submission
/// that names one is refused before anything looks for a server (a
/// `--runs-dir` used to send that search to another folder, and the
/// refusal said no server ran).
#[test]
fn a_submission_naming_the_servers_own_flags_is_refused_here() {
    let dir = tempfile::tempdir().unwrap();
    for flag in [
        vec!["--runs-dir", "x"],
        vec!["--runs-dir=x"],
        vec!["--store", "s.db"],
        vec!["--no-store"],
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(["submit", "p"])
            .args(&flag)
            .current_dir(dir.path())
            .output()
            .unwrap();
        let said = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag:?}: {said}");
        assert!(said.contains("Control/BadArgs"), "{flag:?}: {said}");
    }
}

/// A shell another troupe started (a plain `troupe run`, not one the
/// server hosts) is refused by `troupe serve` too, on its socket and its
/// TCP listener: it would start a run of its choosing, unsandboxed and
/// with the server's key. Its shell connects to both and says what it got.
#[test]
fn a_process_another_troupe_started_is_refused_by_serve() {
    use common::serve::Server;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--listen", "tcp:127.0.0.1:0"]);
    let addr = server.tcp();
    let (host, port) = addr.rsplit_once(':').unwrap();
    let socket = dir.path().join(".troupe/troupe.sock");
    common::serve::probe(
        dir.path(),
        &[
            "import socket",
            "token = open('.troupe/token').read().strip()",
            "for how in ('unix', 'tcp'):",
            "    if how == 'unix':",
            "        s = socket.socket(socket.AF_UNIX)",
            &format!("        s.connect({:?})", socket.to_str().unwrap()),
            "    else:",
            &format!("        s = socket.create_connection(('{host}', {port}))"),
            "    s.sendall(('GET /v1/runs HTTP/1.1\\r\\nHost: t\\r\\nConnection: close\\r\\n'",
            "               'Authorization: Bearer ' + token + '\\r\\n\\r\\n').encode())",
            "    got = s.recv(4096).decode()",
            "    print(how, 'refused' if 'Control/InsideRun' in got else 'LET IN: ' + got[:40])",
        ],
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["run", "probe", "--json", "--headless", "--no-store"])
        .args(["--root", dir.path().to_str().unwrap()])
        .args([
            "--runs-dir",
            dir.path().join("other-runs").to_str().unwrap(),
        ])
        .current_dir(dir.path())
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("unix refused") && text.contains("tcp refused"),
        "{text}{}",
        said(&out)
    );
    drop(server);
}

/// A TCP port another program holds is `Control/CannotListen`, not
/// `AlreadyServing`, which says this project's server holds its socket.
#[test]
fn serve_on_a_tcp_port_in_use_cannot_listen() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let busy = common::serve::cli(
        dir.path(),
        &[
            "serve",
            "--listen",
            &format!("tcp:{}", taken.local_addr().unwrap()),
        ],
    );
    assert_eq!(busy.status.code(), Some(2), "{}", said(&busy));
    assert!(
        said(&busy).contains("Control/CannotListen"),
        "{}",
        said(&busy)
    );
}

/// A run still queued when `troupe serve` is stopped (SIGTERM) is
/// recorded cancelled and can be resumed, as the runs that were running
/// are: the server accepted it, and must not just drop it.
#[test]
fn a_run_queued_at_shutdown_is_recorded_and_resumable() {
    use common::serve::{Server, runs, submit, until};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--max-runs", "1"]);
    let fanout = common::serve::fanout();
    let fanout = fanout.to_str().unwrap();
    let running = submit(
        dir.path(),
        &[fanout, "--ctx", "width=4", "--latency", "10m"],
    );
    let queued = submit(dir.path(), &[fanout, "--ctx", "width=4"]);
    until("the first run to be running", || {
        runs(dir.path())
            .iter()
            .any(|r| r["id"] == running.trim() && r["state"] == "running")
    });
    server.signal(nix::sys::signal::Signal::SIGTERM);
    assert_eq!(server.wait(), Some(143));
    let listed = runs(dir.path());
    for id in [running.trim(), queued.trim()] {
        let run = listed.iter().find(|r| r["id"] == id);
        assert!(
            run.is_some_and(|r| r["state"] == "cancelled"),
            "{id}: {listed:?}"
        );
    }
    let out = common::serve::cli(dir.path(), &["resume", queued.trim(), "--local"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
}

/// A watcher whose run is killed under it (`kill -9`) says so, and how
/// to go on, not that the run cannot be reached.
#[test]
fn a_watcher_of_a_run_killed_under_it_says_it_was_killed() {
    let mut run = Run::start(&["--remote"]);
    run.wait_pending();
    let (watcher, _) = watching(&run, &[]);
    run.child.kill().unwrap();
    let _ = run.child.wait();
    let out = watcher.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let text = said(&out);
    assert!(
        text.contains("Control/RunKilled") && text.contains("troupe resume"),
        "{text}"
    );
}
