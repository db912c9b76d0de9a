//! The network switch, tried from the attacker's side: a scripted model
//! has a shell (or a sandboxed MCP server) connect to a TCP listener on
//! loopback. With `network: deny` — run-wide (`--network deny`), in a
//! stage's frontmatter, or in an MCP server's block — the connection must
//! fail (Landlock's network rules); the same command without it is the
//! control that must get through. A run that asks for `deny` where it
//! cannot be enforced refuses to start.
//!
//! These tests need Landlock with network rules (ABI 4); on a kernel
//! without them they check only that such a run refuses to start.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::net::TcpListener;
use std::path::Path;

use common::project::Project;
use serde_json::Value;

fn network_rules() -> bool {
    troupe::tools::sandbox::probe_with(&[std::env::temp_dir()], true).is_ok()
}

/// The command a shell runs to try `port`: writes `CONNECTED` or the
/// error into `file` in the root.
fn knock(port: u16, file: &str) -> String {
    format!(
        "python3 -c \\\"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=5); print('CONNECTED')\\\" > {file} 2>&1"
    )
}

/// Stage `id` allowing Bash, with `extra` frontmatter.
fn stage(id: &str, extra: &str) -> String {
    common::stage_md(id, extra, "Work.").replace("allowedTools: [Read]", "allowedTools: [Bash]")
}

fn project(yaml: &str, files: &[(&str, &str)]) -> Project {
    let project = Project::new();
    let dir = project.path().join("p");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("pipeline.yaml"), yaml).unwrap();
    for (name, text) in files {
        std::fs::write(dir.join(name), text).unwrap();
    }
    project
}

fn read(project: &Project, file: &str) -> String {
    std::fs::read_to_string(project.path().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// Two stages, `a` then `b`, each knocking once; `a_extra` is a's
/// frontmatter.
fn two_knocks(port: u16, a_extra: &str) -> Project {
    let yaml = "id: n\nentry: a\nstages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\n  b: end\n";
    let script = format!(
        "stages:\n  a:\n    - tool: Bash\n      args: {{ command: \"{}\" }}\n    - complete: {{ summary: a }}\n  b:\n    - tool: Bash\n      args: {{ command: \"{}\" }}\n    - complete: {{ summary: b }}\n",
        knock(port, "a.txt"),
        knock(port, "b.txt")
    );
    project(
        yaml,
        &[
            ("a.md", &stage("a", a_extra)),
            ("b.md", &stage("b", "")),
            ("script.yaml", &script),
        ],
    )
}

#[test]
fn network_deny_blocks_every_shell_of_the_run_and_allow_is_the_control() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let project = two_knocks(port, "");
    // The control: by default a shell reaches the listener.
    let out = project.output(&["run", "p", "--headless"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(read(&project, "a.txt").contains("CONNECTED"));
    if !network_rules() {
        let out = project.output(&["run", "p", "--headless", "--network", "deny"]);
        assert_eq!(out.status.code(), Some(2), "{}", said(&out));
        eprintln!("note: no Landlock network rules here: only the refusal was checked");
        return;
    }
    let out = project.output(&["run", "p", "--headless", "--network", "deny", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    for file in ["a.txt", "b.txt"] {
        let got = read(&project, file);
        assert!(
            !got.contains("CONNECTED") && got.contains("Permission denied"),
            "{file}: {got}"
        );
    }
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let audit =
        troupe::auditlog::read_text(&project.path().join(summary["auditPath"].as_str().unwrap()))
            .unwrap();
    let started: Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
    assert_eq!(started["network"], "deny", "recorded in WorkflowStarted");
}

#[test]
fn a_stage_that_says_network_deny_closes_only_its_own_shells() {
    if !network_rules() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let project = two_knocks(port, "network: deny\n");
    let out = project.output(&["run", "p", "--headless"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        read(&project, "a.txt").contains("Permission denied"),
        "{}",
        read(&project, "a.txt")
    );
    assert!(
        read(&project, "b.txt").contains("CONNECTED"),
        "{}",
        read(&project, "b.txt")
    );
}

#[test]
fn a_sandboxed_mcp_server_with_network_deny_cannot_connect() {
    if !network_rules() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/fault_server.py");
    for (network, expect) in [("deny", "refused"), ("allow", "CONNECTED")] {
        let yaml = format!(
            "id: n\nentry: k\nmcpServers:\n  srv:\n    command: python3\n    args: [\"{}\", \"stats.jsonl\"]\n    network: {network}\nstages:\n  k: {{ kind: tool, tool: srv__connect, args: {{ port: {port} }} }}\nnext:\n  k: end\n",
            server.display()
        );
        let project = project(&yaml, &[]);
        let out = project.output(&["run", "p", "--headless", "--json"]);
        assert_eq!(out.status.code(), Some(0), "{network}: {}", said(&out));
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        let text = summary["results"][0]["parsed"]["text"]
            .as_str()
            .unwrap()
            .to_owned();
        assert!(text.starts_with(expect), "{network}: {text}");
    }
}

#[test]
fn network_deny_that_cannot_be_enforced_refuses_to_start() {
    let project = two_knocks(9, "network: deny\n");
    // A stage asks for it, the run has no sandbox: nothing runs.
    let out = project.output(&["run", "p", "--headless", "--no-sandbox", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("network: deny"), "{}", said(&out));
    assert!(!project.path().join("a.txt").exists(), "a shell ran");
    // And the flag with --no-sandbox is refused by the parser.
    let out = project.output(&[
        "run",
        "p",
        "--headless",
        "--no-sandbox",
        "--network",
        "deny",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
}

#[test]
fn network_deny_holds_for_an_ordinary_user_too() {
    use std::os::unix::fs::PermissionsExt;
    let root_user =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0;
    if !root_user || !network_rules() {
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let project = two_knocks(port, "");
    for dir in [project.path().to_owned(), project.path().join("p")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let run = |flags: &[&str]| {
        std::process::Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_troupe"))
            .args(["run", "p", "--headless"])
            .args(flags)
            .current_dir(project.path())
            .env("HOME", project.path())
            .env("PATH", "/usr/bin:/bin")
            .output()
            .unwrap()
    };
    // The control, as nobody: the knock gets through.
    let out = run(&[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        read(&project, "a.txt").contains("CONNECTED"),
        "{}",
        read(&project, "a.txt")
    );
    let owner = std::os::unix::fs::MetadataExt::uid(
        &std::fs::metadata(project.path().join("a.txt")).unwrap(),
    );
    assert_eq!(owner, 65534, "the shell ran as nobody");
    let out = run(&["--network", "deny"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    for file in ["a.txt", "b.txt"] {
        let got = read(&project, file);
        assert!(
            !got.contains("CONNECTED") && got.contains("Permission denied"),
            "{file}: {got}"
        );
    }
}

/// What Landlock's network rules do not see is refused under `network:
/// deny` too: multipath TCP (which falls back to plain TCP on the wire,
/// and reached a listener through the rules), SCTP, raw and packet
/// sockets fail with EACCES; TCP sockets are still made (their connects
/// are what Landlock refuses), and UDP and Unix sockets as documented.
#[test]
fn sockets_the_rules_do_not_see_are_refused_under_network_deny() {
    if !network_rules() {
        eprintln!("skipped: no Landlock network rules here");
        return;
    }
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let probe = format!(
        r#"
import errno, socket
def make(*args):
    try:
        socket.socket(*args).close()
        return "made"
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
print(make(socket.AF_INET, socket.SOCK_STREAM, 262))
print(make(socket.AF_INET6, socket.SOCK_STREAM, 262))
print(make(socket.AF_INET, socket.SOCK_SEQPACKET, 0))
print(make(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
print(make(17, socket.SOCK_RAW, 0))
print(make(socket.AF_INET, socket.SOCK_STREAM, 0))
print(make(socket.AF_INET, socket.SOCK_DGRAM, 0))
print(make(socket.AF_UNIX, socket.SOCK_STREAM, 0))
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=5)
    print("connected")
except OSError as e:
    print(errno.errorcode.get(e.errno, str(e.errno)))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
made = libc.syscall(425, 4, ctypes.create_string_buffer(120))
print("made" if made >= 0 else errno.errorcode.get(ctypes.get_errno(), "?"))
"#
    );
    let tmp = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["sandbox-exec", "--write"])
        .arg(tmp.path())
        .args(["--deny-network", "--", "python3", "-c", &probe])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let got: Vec<&str> = text.lines().collect();
    assert_eq!(
        got,
        [
            "EACCES", "EACCES", "EACCES", "EACCES", "EACCES", "made", "made", "made", "EACCES",
            "ENOSYS"
        ],
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
