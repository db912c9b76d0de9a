//! The dashboard in a real browser: headless Chromium driven over
//! WebDriver (chromedriver; the protocol is plain HTTP and JSON, spoken
//! here with reqwest). It logs in through the one-time link `troupe serve`
//! prints, watches a fan-out's counts move, approves a pending call by
//! clicking, and answers a human step through the form made from its
//! `fields`.
//!
//! Skipped with a note when chromium or chromedriver is missing, unless
//! `TROUPE_REQUIRE_BROWSER` is set (CI installs them and sets it).

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

/// The W3C WebDriver name of an element reference.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

fn find_program(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in names {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

/// Chromium and its driver, or `None` (skip) when they are not installed.
fn browser() -> Option<(PathBuf, PathBuf)> {
    let found = (
        find_program(&["chromium", "chromium-browser", "google-chrome"]),
        find_program(&["chromedriver"]),
    );
    match found {
        (Some(b), Some(d)) => Some((b, d)),
        _ if std::env::var_os("TROUPE_REQUIRE_BROWSER").is_some() => {
            panic!("TROUPE_REQUIRE_BROWSER is set but chromium or chromedriver is missing")
        }
        _ => {
            eprintln!("note: skipped: install chromium and chromium-driver to test the dashboard");
            None
        }
    }
}

/// Waits (bounded) until `check` gives a value.
fn until<T>(what: &str, check: impl FnMut() -> Option<T>) -> T {
    until_or_timeout(check).unwrap_or_else(|| panic!("timed out waiting for {what}"))
}

/// Waits up to a minute for `check` to give a value; `None` if it never
/// does, so the caller can say what it saw instead.
fn until_or_timeout<T>(mut check: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(v) = check() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A chromedriver process and one browser session.
struct Driver {
    child: Child,
    base: String,
    session: String,
    http: reqwest::Client,
    rt: tokio::runtime::Runtime,
    /// chromedriver's and the browser's `TMPDIR`: each leaves a profile
    /// folder and a singleton folder there when it is stopped, and this
    /// one goes when the driver does (after the processes, by field order).
    _tmp: tempfile::TempDir,
}

impl Driver {
    fn start(chromium: &Path, chromedriver: &Path) -> Driver {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let tmp = tempfile::tempdir().unwrap();
        let child = Command::new(chromedriver)
            .arg(format!("--port={port}"))
            .env("TMPDIR", tmp.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let mut driver = Driver {
            child,
            base: format!("http://127.0.0.1:{port}"),
            session: String::new(),
            http: reqwest::Client::new(),
            rt,
            _tmp: tmp,
        };
        until("chromedriver", || {
            driver
                .call("GET", "/status", None)
                .ok()
                .filter(|v| v["value"]["ready"] == true)
        });
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {
                "binary": chromium,
                "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"],
            },
        }}});
        let v = driver.call("POST", "/session", Some(caps)).unwrap();
        driver.session = v["value"]["sessionId"].as_str().unwrap().to_owned();
        driver
    }

    fn call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let url = format!("{}{path}", self.base);
        self.rt.block_on(async {
            let request = match method {
                "GET" => self.http.get(url),
                "DELETE" => self.http.delete(url),
                _ => self.http.post(url).json(&body.unwrap_or(json!({}))),
            };
            let r = request.send().await.map_err(|e| e.to_string())?;
            let ok = r.status().is_success();
            let v: Value = r.json().await.map_err(|e| e.to_string())?;
            if ok { Ok(v) } else { Err(v.to_string()) }
        })
    }

    fn session_call(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        self.call(method, &format!("/session/{}{path}", self.session), body)
    }

    fn go(&self, url: &str) {
        self.session_call("POST", "/url", Some(json!({"url": url})))
            .unwrap();
    }

    /// The first element `css` matches, if any.
    fn find(&self, css: &str) -> Option<String> {
        let v = self
            .session_call(
                "POST",
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .ok()?;
        v["value"][ELEMENT].as_str().map(str::to_owned)
    }

    fn wait_for(&self, css: &str) -> String {
        until(css, || self.find(css))
    }

    fn click(&self, element: &str) {
        self.session_call("POST", &format!("/element/{element}/click"), None)
            .unwrap();
    }

    fn text(&self, element: &str) -> String {
        let v = self
            .session_call("GET", &format!("/element/{element}/text"), None)
            .unwrap();
        v["value"].as_str().unwrap_or_default().to_owned()
    }

    /// What `script` returns, run in the page (WebDriver's own way in,
    /// which the page's policy does not govern).
    fn eval(&self, script: &str) -> Value {
        self.session_call(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .unwrap()["value"]
            .take()
    }

    /// The text of what `css` matches now ("" when nothing does).
    fn text_of(&self, css: &str) -> String {
        self.find(css).map(|e| self.text(&e)).unwrap_or_default()
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.session_call("DELETE", "", None);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `troupe serve` on a TCP port, with its login link.
struct Server {
    child: Child,
    dir: tempfile::TempDir,
    login: String,
}

impl Server {
    fn start() -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(["serve", "--listen", "tcp:127.0.0.1:0"])
            .current_dir(dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = std::io::BufReader::new(child.stdout.take().unwrap());
        let login = out
            .lines()
            .map_while(Result::ok)
            .find_map(|l| l.strip_prefix("dashboard: ").map(str::to_owned))
            .unwrap();
        Server { child, dir, login }
    }

    fn troupe(&self, args: &[&str]) -> std::process::Output {
        let addr = self.login.split('/').nth(2).unwrap();
        Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(args)
            .args(["--server", &format!("http://{addr}")])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// A command that needs no server, in the project.
    fn troupe_here(&self, args: &[&str]) -> std::process::Output {
        Command::new(env!("CARGO_BIN_EXE_troupe"))
            .args(args)
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    fn submit(&self, args: &[&str]) -> String {
        let mut all = vec!["submit"];
        all.extend_from_slice(args);
        let out = self.troupe(&all);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
        String::from_utf8(out.stdout).unwrap().trim().to_owned()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A call outside the stage's envelope (an approval), then a human step.
fn asking() -> common::Fixture {
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: []");
    let script = "stages:\n  s:\n    - tool: Echo\n      args: { text: from the browser }\n    - complete: { summary: done }\n";
    common::Fixture::new(
        "id: ask\nentry: s\nstages:\n  s: s.md\n  q:\n    kind: human\n    prompt: \"Ship it?\"\n    fields: { type: object, required: [ok, note], properties: { ok: { type: boolean }, note: { type: string } } }\nnext:\n  s: q\n  q: end\n",
        &[("s.md", &stage), ("script.yaml", script)],
    )
}

#[test]
fn the_dashboard_shows_counts_moving_and_takes_an_approval_and_an_answer() {
    let Some((chromium, chromedriver)) = browser() else {
        return;
    };
    let server = Server::start();
    let fanout = common::project::bundled("fanout");
    let wide = server.submit(&[
        fanout.to_str().unwrap(),
        "--ctx",
        // Long enough (40 000 / 16 × 20 ms = 50 s) that it cannot end
        // before the click on slow CI machines; the cancel ends it.
        "width=40000",
        "--parallel-cap",
        "16",
        "--latency",
        "20ms",
    ]);
    let browser = Driver::start(&chromium, &chromedriver);
    browser.go(&server.login);
    // The runs table lists the run; its page shows the counts moving.
    let link = browser.wait_for(&format!("tr[data-run='{wide}'] a"));
    browser.click(&link);
    let ok = |b: &Driver| b.text_of("#c-ok").parse::<u64>().unwrap_or(0);
    let first = until("some siblings done", || {
        Some(ok(&browser)).filter(|n| *n > 0)
    });
    let later = until("more siblings done", || {
        Some(ok(&browser)).filter(|n| *n > first)
    });
    assert!(later > first);
    until("the timeline", || browser.find("#timeline svg"));
    // The page's policy: its own style and the timeline's apply, and
    // markup that would run script inline does not run it (the session is
    // in this origin's localStorage).
    assert_eq!(
        browser.eval("return getComputedStyle(document.body).fontSize"),
        "14px",
        "dashboard.css applies"
    );
    assert_eq!(
        browser.eval(
            "const s = getComputedStyle(document.querySelector('#timeline svg text.sub')); return s.fontSize + ' ' + s.fill"
        ),
        "11px rgb(84, 110, 122)",
        "the timeline's <style> applies (allowed by its hash)"
    );
    browser.eval(
        "document.body.insertAdjacentHTML('beforeend', '<img src=\"data:,\" onerror=\"window.ran = 1\" onload=\"window.ran = 1\">'); return null",
    );
    until("the injected image to load or fail", || {
        Some(()).filter(|()| {
            browser.eval("return document.querySelector('img[onerror]').complete") == true
        })
    });
    assert_eq!(
        browser.eval("return window.ran === undefined"),
        true,
        "an inline handler ran under the dashboard's policy"
    );
    assert_eq!(browser.text_of("#run-status"), "running");
    browser.click(&browser.wait_for("#cancel"));
    let mut seen = String::new();
    let cancelled = until_or_timeout(|| {
        seen = browser.text_of("#run-status");
        Some(()).filter(|()| seen == "cancelled")
    });
    assert!(
        cancelled.is_some(),
        "the run did not end cancelled: status {seen:?}"
    );

    // An approval and a question, answered by clicking.
    let pipeline = asking();
    let asked = server.submit(&[pipeline.path().to_str().unwrap()]);
    let url = format!("{}#{asked}", server.login.split("/login").next().unwrap());
    browser.go(&url);
    browser.session_call("POST", "/refresh", None).unwrap();
    let approve = browser.wait_for("#pending button.approve");
    assert!(browser.text_of("#pending .card").contains("Echo"));
    browser.click(&approve);
    let checkbox = browser.wait_for("#questions form input[name='ok']");
    browser.click(&checkbox);
    let note = browser.wait_for("#questions form input[name='note']");
    browser
        .session_call(
            "POST",
            &format!("/element/{note}/value"),
            Some(json!({"text": "from the dashboard"})),
        )
        .unwrap();
    browser.click(&browser.wait_for("#questions form button"));
    until("the run to end ok", || {
        Some(()).filter(|()| browser.text_of("#run-status") == "ok")
    });
    let watched = server.troupe(&["watch", &asked]);
    assert_eq!(watched.status.code(), Some(0), "{}", said(&watched));
    let log = troupe::auditlog::read_text(
        &server
            .dir
            .path()
            .join(".troupe/runs")
            .join(&asked)
            .join(troupe::auditlog::FILE),
    )
    .unwrap();
    assert!(
        log.contains("dashboard"),
        "answers are audited with who gave them"
    );
    // The step's result is the form's answer.
    let shown = server.troupe_here(&["runs", "show", &asked, "--stage", "q", "--json"]);
    assert_eq!(shown.status.code(), Some(0), "{}", said(&shown));
    let text = String::from_utf8_lossy(&shown.stdout);
    assert!(text.contains("from the dashboard"), "{text}");
}
