//! A real `troupe serve` process in a project folder of its own, and the
//! CLI clients as second processes: the helpers `tests/serve.rs` and
//! `tests/serve_metrics.rs` share. Waits are for events (a line, a
//! process's exit, a row), bounded.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::project::said;

pub fn fanout() -> PathBuf {
    super::project::bundled("fanout")
}

/// Waits (bounded) until `check` holds.
pub fn until(what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `troupe serve` in a project folder of its own.
pub struct Server {
    pub child: Child,
    pub dir: PathBuf,
    /// `listening on …` and `dashboard: …` lines.
    pub said: Vec<String>,
}

impl Server {
    pub fn start(dir: &Path, extra: &[&str]) -> Server {
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
        // A line for each listener, the project's socket always among
        // them unless another is named, and a dashboard line for each TCP
        // one.
        let unix = extra
            .iter()
            .filter(|a| a.starts_with("unix:"))
            .count()
            .max(1);
        let tcp = extra.iter().filter(|a| a.starts_with("tcp:")).count();
        while said.len() < unix + 2 * tcp {
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

    pub fn log_of(dir: &Path) -> String {
        std::fs::read_to_string(dir.join("serve.log")).unwrap_or_default()
    }

    pub fn log(&self) -> String {
        Server::log_of(&self.dir)
    }

    pub fn cli(&self, args: &[&str]) -> Output {
        cli(&self.dir, args)
    }

    pub fn tcp(&self) -> String {
        self.said
            .iter()
            .find_map(|l| l.strip_prefix("listening on tcp:"))
            .unwrap()
            .to_owned()
    }

    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, signal).unwrap();
    }

    pub fn wait(mut self) -> Option<i32> {
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

pub fn cli(dir: &Path, args: &[&str]) -> Output {
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
pub fn submit_fanout(dir: &Path, flags: &[&str]) -> String {
    let fanout = fanout();
    let mut args = vec![fanout.to_str().unwrap()];
    args.extend_from_slice(flags);
    submit(dir, &args)
}

pub fn submit(dir: &Path, args: &[&str]) -> String {
    let mut all = vec!["submit"];
    all.extend_from_slice(args);
    let out = cli(dir, &all);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The store's runs (`troupe runs --json`), by id.
pub fn runs(dir: &Path) -> Vec<Value> {
    let out = cli(dir, &["runs", "--json", "--limit", "1000"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["runs"].as_array().cloned().unwrap()
}

pub fn state_of(dir: &Path, id: &str) -> String {
    runs(dir)
        .iter()
        .find(|r| r["id"] == id)
        .map(|r| r["state"].as_str().unwrap().to_owned())
        .unwrap_or_default()
}

pub fn audit(dir: &Path, id: &str) -> Vec<Value> {
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

/// A stage whose one `Echo` call is outside its envelope, so it waits
/// for an approval; then a human step.
pub fn asking() -> super::Fixture {
    let stage =
        super::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let script = "stages:\n  s:\n    - tool: Echo\n      args: { text: from afar }\n    - complete: { summary: done }\n";
    super::Fixture::new(
        "id: ask\nentry: s\nstages:\n  s: s.md\n  q:\n    kind: human\n    prompt: \"Ship it?\"\n    fields: { type: object, required: [ok], properties: { ok: { type: boolean } } }\nnext:\n  s: q\n  q: end\n",
        &[("s.md", &stage), ("script.yaml", script)],
    )
}

pub fn wait_json(
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

/// One raw HTTP/1.1 exchange: the status and the body.
pub fn http(addr: &str, request: &str) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream.write_all(request.as_bytes()).unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply[9..12].parse().unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    (status, head.to_owned(), body.to_owned())
}

pub fn get(addr: &str, path: &str, headers: &str) -> (u16, String, String) {
    http(
        addr,
        &format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n{headers}\r\n"),
    )
}

pub fn post(addr: &str, path: &str, headers: &str, body: &str) -> (u16, String, String) {
    http(
        addr,
        &format!(
            "POST {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}\r\n{body}",
            body.len()
        ),
    )
}

/// Writes `probe.py` (the lines of `script`) in `dir`, and a pipeline
/// `dir/probe` whose one step runs it with `Bash`: a run's own process,
/// for the tests of what such a process may reach.
pub fn probe(dir: &Path, script: &[&str]) -> PathBuf {
    std::fs::write(dir.join("probe.py"), script.join("\n")).unwrap();
    let pipeline = dir.join("probe");
    std::fs::create_dir(&pipeline).unwrap();
    std::fs::write(
        pipeline.join("pipeline.yaml"),
        "id: probe\nentry: s\nstages:\n  s: { kind: tool, tool: Bash, args: { command: \"python3 probe.py\" } }\nnext:\n  s: end\n",
    )
    .unwrap();
    pipeline
}
