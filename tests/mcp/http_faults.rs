//! A Streamable HTTP server that dies in the middle of a call
//! (`tests/mcp/http_fault_server.py`): after the call's SSE response has
//! begun, with an event id a client may resume from. The call must fail
//! as the connection's end, soon, not wait out its timeout while the
//! client tries to resume a stream nobody serves.

use super::*;

/// The fault server on a free port, killed however the test ends.
struct HttpFaultServer {
    child: std::process::Child,
    port: u16,
}

impl HttpFaultServer {
    fn start(stats: &Path, mode: &str) -> HttpFaultServer {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/http_fault_server.py");
        let child = std::process::Command::new("python3")
            .arg(script)
            .arg(port.to_string())
            .arg(stats)
            .arg(mode)
            .spawn()
            .unwrap();
        let mut server = HttpFaultServer { child, port };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "the HTTP fault server never listened"
            );
            assert!(
                server.child.try_wait().unwrap().is_none(),
                "the HTTP fault server exited"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        server
    }

    /// A pipeline whose one tool step calls `die` on this server. The
    /// call's timeout is far longer than the resumption's tries: a call
    /// that waits it out fails with `Timeout`, which the tests refuse.
    fn project(&self) -> Project {
        let yaml = format!(
            "id: t\nentry: s\nmcpServers:\n  srv:\n    url: http://127.0.0.1:{}/mcp\n    timeout: 60s\nstages:\n  s: {{ kind: tool, tool: srv__die }}\nnext:\n  s: end\n",
            self.port
        );
        project(&yaml, &[])
    }
}

impl Drop for HttpFaultServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn a_call_whose_http_server_restarts_mid_stream_is_asked_again_of_a_new_session() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let server = HttpFaultServer::start(&stats, "restart");
    let project = server.project();
    let (out, summary, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed.len(), 1, "{audit:#?}");
    assert_eq!(
        failed[0]["code"], "ToolTransient/ServerExited",
        "{failed:#?}"
    );
    assert_eq!(failed[0]["retrying"], true);
    assert_eq!(parsed(&summary, "s")["text"], "survived", "{summary}");
    let seen = server_saw(&stats);
    // The resumption reached the new image, which knew no session.
    assert!(
        seen.iter()
            .any(|s| s["event"] == "stale" && s["method"] == "GET"),
        "{seen:?}"
    );
    assert_eq!(count(&seen, "initialize"), 2, "a new session: {seen:?}");
    assert_eq!(count(&seen, "died"), 1);
}

#[test]
fn a_call_whose_http_server_exits_mid_stream_fails_as_the_server_gone() {
    let dir = tempfile::tempdir().unwrap();
    let stats = dir.path().join("stats.jsonl");
    let server = HttpFaultServer::start(&stats, "exit");
    let project = server.project();
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    let codes: Vec<&Value> = failed.iter().map(|e| &e["code"]).collect();
    // The call ends with the connection; the step's second try finds no
    // server to start a session with.
    assert_eq!(
        codes,
        [
            "ToolTransient/ServerExited",
            "ToolTransient/ServerUnavailable"
        ],
        "{failed:#?}"
    );
    // Said with its cause, not the SDK's name for its transport type.
    let why = failed[1]["message"].as_str().unwrap();
    assert!(why.contains("refused"), "{why}");
    assert!(!why.contains("troupe::"), "{why}");
    drop(server);
}
