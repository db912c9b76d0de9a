//! MCP servers as tool sources, through the binary, against real servers:
//! the reference `server-filesystem` and `server-everything` from npm
//! (`.ci/run` installs them; `TROUPE_MCP_NODE_MODULES` names the folder)
//! and `tests/mcp/fault_server.py`, a strict stdio server that produces
//! one fault at a time and logs what it saw (starts, calls in flight,
//! cancel notifications) for the test to check; `http_fault_server.py` is
//! its Streamable HTTP counterpart for a server that dies mid-call.
//!
//! The npm tests skip with a note when the servers are not installed,
//! unless `TROUPE_REQUIRE_MCP` is set (CI), where they fail.

// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::project::Project;
use serde_json::Value;

/// Where the fault server logs what it saw: in the project root, the one
/// place a sandboxed server may write.
const STATS: &str = "stats.jsonl";

fn fault_server() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/mcp/fault_server.py")
}

/// The npm servers' `node_modules`, or `None` (with a note) when absent.
fn node_modules() -> Option<PathBuf> {
    let dir = std::env::var_os("TROUPE_MCP_NODE_MODULES").map(PathBuf::from);
    match dir {
        Some(d) if d.join("@modelcontextprotocol/server-filesystem").is_dir() => Some(d),
        _ if std::env::var_os("TROUPE_REQUIRE_MCP").is_some() => {
            panic!("TROUPE_REQUIRE_MCP is set but TROUPE_MCP_NODE_MODULES has no MCP servers")
        }
        _ => {
            eprintln!(
                "note: skipped: set TROUPE_MCP_NODE_MODULES to a node_modules with the MCP servers"
            );
            None
        }
    }
}

/// A stage file allowing `tools`, finishing with `{summary}`.
fn stage(id: &str, tools: &str, extra: &str) -> String {
    common::stage_md(id, extra, "Work.")
        .replace("allowedTools: [Read]", &format!("allowedTools: [{tools}]"))
}

/// The `mcpServers:` entry of the fault server as `name`.
fn fault_block(name: &str, stats: &Path, modes: &[&str], extra: &str) -> String {
    let mut args = vec![
        format!("\"{}\"", fault_server().display()),
        format!("\"{}\"", stats.display()),
    ];
    args.extend(modes.iter().map(|m| format!("\"{m}\"")));
    format!(
        "  {name}:\n    command: python3\n    args: [{}]\n{extra}",
        args.join(", ")
    )
}

/// A project with pipeline `p`: `yaml` plus `files`.
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

/// `troupe run p --json --headless` plus `flags`; the summary and the
/// audit log's events.
fn run(project: &Project, flags: &[&str]) -> (Output, Value, Vec<Value>) {
    let mut args = vec!["run", "p", "--json", "--headless"];
    args.extend_from_slice(flags);
    let out = project.output(&args);
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    let audit = summary["auditPath"]
        .as_str()
        .map(|p| {
            troupe::auditlog::read_text(&project.path().join(p))
                .unwrap()
                .lines()
                .map(|l| serde_json::from_str(l).unwrap())
                .collect()
        })
        .unwrap_or_default();
    (out, summary, audit)
}

fn server_saw(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn count(stats: &[Value], event: &str) -> usize {
    stats.iter().filter(|s| s["event"] == event).count()
}

fn events<'a>(audit: &'a [Value], name: &str) -> Vec<&'a Value> {
    audit.iter().filter(|e| e["event"] == name).collect()
}

fn parsed<'a>(summary: &'a Value, stage: &str) -> &'a Value {
    &summary["results"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["stageId"] == stage)
        .unwrap_or_else(|| panic!("no result of {stage}: {summary}"))["parsed"]
}

#[test]
fn the_bundled_survey_lists_reads_and_summarises_through_the_filesystem_server() {
    let Some(modules) = node_modules() else {
        return;
    };
    // The bundled pipeline, with the server started from the installed
    // package instead of npx (no download in a test).
    let project = Project::new();
    let dir = project.path().join("p");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(common::project::bundled("mcp-survey")).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let yaml = std::fs::read_to_string(dir.join("pipeline.yaml")).unwrap();
    let server = modules.join("@modelcontextprotocol/server-filesystem/dist/index.js");
    let yaml = yaml.replace("command: npx", "command: node").replace(
        "[\"-y\", \"@modelcontextprotocol/server-filesystem@2026.8.31\", \".\"]",
        &format!("[\"{}\", \".\"]", server.display()),
    );
    assert!(yaml.contains("command: node"), "{yaml}");
    std::fs::write(dir.join("pipeline.yaml"), yaml).unwrap();
    let docs = project.path().join("docs");
    std::fs::create_dir(&docs).unwrap();
    for name in ["a.md", "b.md", "c.txt"] {
        std::fs::write(docs.join(name), format!("# {name}\nline two\n")).unwrap();
    }
    let (out, summary, audit) = run(&project, &["--ctx", "dir=docs"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(
        parsed(&summary, "files")["files"],
        serde_json::json!(["a.md", "b.md", "c.txt"])
    );
    // Every sibling read its file through the server, audited as MCP calls.
    let reads: Vec<&Value> = events(&audit, "ToolInvocationSucceeded")
        .into_iter()
        .filter(|e| e["mcpTool"] == "read_text_file")
        .collect();
    assert_eq!(reads.len(), 3, "{audit:#?}");
    assert!(
        reads
            .iter()
            .all(|e| e["mcpServer"] == "fs" && e["tool"] == "fs__read_text_file")
    );
    let run_dir = project.path().join(summary["auditPath"].as_str().unwrap());
    assert!(run_dir.parent().unwrap().join("mcp-fs.log").is_file());
}

#[test]
fn everything_server_images_structured_content_and_no_secret_in_its_environment() {
    let Some(modules) = node_modules() else {
        return;
    };
    let server = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let yaml = format!(
        "id: ev\nentry: image\nmcpServers:\n  ev:\n    command: node\n    args: [\"{}\", \"stdio\"]\n    env: [TROUPE_MCP_PASSED]\nstages:\n  image: {{ kind: tool, tool: ev__get-tiny-image }}\n  weather: {{ kind: tool, tool: ev__get-structured-content, args: {{ location: Chicago }} }}\n  env: {{ kind: tool, tool: ev__get-env }}\nnext:\n  image: weather\n  weather: env\n  env: end\n",
        server.display()
    );
    let project = project(&yaml, &[]);
    let key = "sk-troupe-mcp-env-must-not-leak";
    let mut args = vec!["run", "p", "--json", "--headless"];
    args.truncate(4);
    let out = project
        .troupe()
        .args(&args)
        .env("OPENAI_API_KEY", key)
        .env("TROUPE_MCP_PASSED", "named-so-passed")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let image = parsed(&summary, "image")["text"].as_str().unwrap();
    assert!(
        image.contains("[image: image/png,") && image.contains("bytes, not shown]"),
        "{image}"
    );
    let weather = parsed(&summary, "weather");
    assert!(weather["temperature"].is_number(), "{weather}");
    let env = parsed(&summary, "env")["text"].as_str().unwrap();
    // The variable its `env:` names reached it; what it says of its value
    // is redacted (docs/mcp.md).
    assert!(
        env.contains("\"TROUPE_MCP_PASSED\": \"[redacted]\""),
        "{env}"
    );
    assert!(!env.contains("named-so-passed"), "{env}");
    assert!(
        !env.contains(key),
        "the server's environment holds the key: {env}"
    );
}

#[test]
fn an_allowed_tool_the_server_does_not_list_stops_the_run_before_any_stage() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: s.md\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    let project = project(&yaml, &[("s.md", &stage("s", "srv__ecko", ""))]);
    let (out, summary, _) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert_eq!(summary["code"], "Mcp/UnknownTool", "{summary}");
    let message = summary["message"].as_str().unwrap();
    assert!(message.contains("did you mean `srv__echo`"), "{message}");
    assert!(
        message.contains("wait_for"),
        "the listing is named: {message}"
    );
    // No stage ran: nothing was recorded.
    assert!(
        !project.path().join(".troupe/runs").exists() || {
            let runs: Vec<_> = std::fs::read_dir(project.path().join(".troupe/runs"))
                .unwrap()
                .collect();
            runs.iter().all(|r| {
                !r.as_ref()
                    .unwrap()
                    .path()
                    .join(troupe::auditlog::FILE)
                    .exists()
            })
        }
    );
}

#[test]
fn servers_that_cannot_start_answer_or_list_are_typed_errors_with_exit_2() {
    let cases: [(&[&str], &str, &str); 5] = [
        (
            &["exit-at-start"],
            "Mcp/InitializeFailed",
            "exiting at start on purpose",
        ),
        // rmcp skips a line that is not JSON-RPC and waits on.
        (&["garbage-init"], "Mcp/StartTimeout", "initialize"),
        (&["wrong-version"], "Mcp/ProtocolVersion", "1999-01-01"),
        // A listing whose paging never ends is refused, not read until
        // memory runs out.
        (&["same-cursor"], "Mcp/ListFailed", "a page it gave before"),
        (&["endless-pages"], "Mcp/ListFailed", "past 100 pages"),
    ];
    for (modes, code, said_text) in cases {
        let yaml = format!(
            "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: s.md\nnext:\n  s: end\n",
            fault_block("srv", Path::new(STATS), modes, "    startTimeout: 3s\n")
        );
        let project = project(&yaml, &[("s.md", &stage("s", "srv__echo", ""))]);
        let (out, summary, _) = run(&project, &[]);
        assert_eq!(out.status.code(), Some(2), "{modes:?}: {}", said(&out));
        assert_eq!(summary["code"], code, "{modes:?}: {summary}");
        assert!(
            summary["message"].as_str().unwrap().contains(said_text),
            "{modes:?}: {summary}"
        );
    }
    // Not installed at all.
    let yaml = "id: t\nentry: s\nmcpServers:\n  srv:\n    command: troupe-no-such-server\nstages:\n  s: s.md\nnext:\n  s: end\n";
    let project = project(yaml, &[("s.md", &stage("s", "srv__echo", ""))]);
    for flags in [&["--no-sandbox"][..], &[][..]] {
        // Sandboxed too: not the sandbox's own start failing.
        let (out, summary, _) = run(&project, flags);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {}", said(&out));
        assert_eq!(
            summary["code"], "Mcp/ServerNotFound",
            "{flags:?}: {summary}"
        );
    }
    // Never answers `initialize`.
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: s.md\nnext:\n  s: end\n",
        fault_block(
            "srv",
            Path::new(STATS),
            &["slow-start"],
            "    startTimeout: 1s\n"
        )
    );
    let project = self::project(&yaml, &[("s.md", &stage("s", "srv__echo", ""))]);
    let (out, summary, _) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert_eq!(summary["code"], "Mcp/StartTimeout", "{summary}");
}

#[test]
fn a_paged_listing_is_read_to_its_end() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__wait_for, args: {{ n: 1 }} }}\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &["paged"], "")
    );
    // `wait_for` is on the second page; n: 1 would wait forever, so the
    // listing check is all this run needs: validate it through `show`.
    let project = project(&yaml, &[]);
    let out = project.output(&["validate", "p", "--connect"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("srv__wait_for") && text.contains("srv__echo"),
        "{text}"
    );
}

/// The fault server as `srv`, one LLM stage `s` allowing `tools` with the
/// given script turns.
fn one_stage(stats: &Path, tools: &str, block_extra: &str, script: &str) -> Project {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: s.md\nnext:\n  s: end\n",
        fault_block("srv", stats, &[], block_extra)
    );
    project(
        &yaml,
        &[("s.md", &stage("s", tools, "")), ("script.yaml", script)],
    )
}

#[test]
fn a_server_that_dies_mid_call_fails_the_call_as_transient_and_starts_again() {
    let script = "stages:\n  s:\n    - tool: srv__crash\n      args: {}\n    - tool: srv__echo\n      args: { text: back }\n    - complete: { summary: done }\n";
    let project = one_stage(Path::new(STATS), "srv__crash, srv__echo", "", script);
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed.len(), 1, "{audit:#?}");
    assert_eq!(failed[0]["code"], "ToolTransient/ServerExited");
    let ok = events(&audit, "ToolInvocationSucceeded");
    assert_eq!(ok.len(), 1);
    assert_eq!(ok[0]["mcpTool"], "echo");
    let seen = server_saw(&project.path().join(STATS));
    assert_eq!(count(&seen, "start"), 2, "one restart: {seen:?}");
    assert_eq!(count(&seen, "crash"), 1);
}

#[test]
fn a_call_past_its_timeout_is_transient_and_the_server_is_told_to_cancel() {
    let script =
        "stages:\n  s:\n    - tool: srv__hang\n      args: {}\n    - complete: { summary: done }\n";
    let project = one_stage(Path::new(STATS), "srv__hang", "    timeout: 1s\n", script);
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(failed.len(), 1, "{audit:#?}");
    assert_eq!(failed[0]["code"], "ToolTransient/Timeout");
    let seen = server_saw(&project.path().join(STATS));
    assert_eq!(count(&seen, "cancelled"), 1, "{seen:?}");
}

#[test]
fn is_error_fails_a_tool_step_and_a_huge_result_is_cut() {
    let yaml = format!(
        "id: t\nentry: big\nmcpServers:\n{}stages:\n  big: {{ kind: tool, tool: srv__big, args: {{ bytes: 10485760 }} }}\n  fail: {{ kind: tool, tool: srv__fail }}\nnext:\n  big: fail\n  fail: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    let project = project(&yaml, &[]);
    let (out, summary, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let big = parsed(&summary, "big")["text"].as_str().unwrap();
    assert!(big.len() < 300 * 1024, "{}", big.len());
    assert!(big.ends_with("bytes]"), "{}", &big[big.len() - 100..]);
    let exited: Vec<&Value> = events(&audit, "StageExited")
        .into_iter()
        .filter(|e| e["stageId"] == "fail")
        .collect();
    assert_eq!(exited[0]["verdict"], "fail");
    let reason = exited[0]["reason"].as_str().unwrap();
    assert!(
        reason.starts_with("ToolTerminal/ToolReportedError"),
        "{reason}"
    );
    assert!(reason.contains("the tool failed on purpose"), "{reason}");
}

#[test]
fn arguments_that_break_the_server_s_schema_never_reach_it() {
    let script = "stages:\n  s:\n    - tool: srv__echo\n      args: { text: 7 }\n    - complete: { summary: done }\n";
    let project = one_stage(Path::new(STATS), "srv__echo", "", script);
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let failed = events(&audit, "ToolInvocationFailed");
    assert_eq!(
        failed[0]["code"], "ToolTerminal/InvalidArguments",
        "{failed:?}"
    );
    assert_eq!(count(&server_saw(&project.path().join(STATS)), "call"), 0);
}

#[test]
fn a_changed_tool_list_reaches_later_executions() {
    let yaml = format!(
        "id: t\nentry: a\nmcpServers:\n{}stages:\n  a: a.md\n  b: b.md\nnext:\n  a: b\n  b: end\n",
        fault_block("srv", Path::new(STATS), &[], "")
    );
    let script = "stages:\n  a:\n    - tool: srv__changed\n      args: {}\n    - complete: { summary: done }\n  b:\n    - tool: srv__extra\n      args: {}\n    - complete: { summary: done }\n";
    let project = project(
        &yaml,
        &[
            ("a.md", &stage("a", "srv__changed", "")),
            ("b.md", &stage("b", "srv__*", "")),
            ("script.yaml", script),
        ],
    );
    let (out, _, audit) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let ok: Vec<_> = events(&audit, "ToolInvocationSucceeded")
        .iter()
        .map(|e| e["mcpTool"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(ok, ["changed", "extra"], "{audit:#?}");
}

/// A `map` fan-out of `width` siblings over the fault server: a plan
/// stage lists the items, `w` runs `script`'s turns.
fn fan_out(stats: &Path, width: usize, block_extra: &str, script: &str) -> Project {
    let yaml = format!(
        "id: t\nentry: plan\nmcpServers:\n{}stages:\n  plan: plan.md\n  w: w.md\nnext:\n  plan: {{ parallel: {{ map: w, over: \"ctx.upstream[0].parsed.items\" }} }}\n  w: end\n",
        fault_block("srv", stats, &[], block_extra),
    );
    let plan = common::stage_md("plan", "", "Plan.").replace(
        "required: [summary]\n  properties:\n    summary: { type: string }",
        "required: [items]\n  properties:\n    items: { type: array }",
    );
    let script =
        format!("stages:\n  plan:\n    - complete: {{ items: {{ $range: {width} }} }}\n{script}");
    project(
        &yaml,
        &[
            ("plan.md", &plan),
            ("w.md", &stage("w", "srv__*", "")),
            ("script.yaml", &script),
        ],
    )
}

#[test]
fn a_thousand_siblings_share_one_server_process_within_max_inflight() {
    let script =
        "  w:\n    - tool: srv__slow\n      args: { ms: 1 }\n    - complete: { summary: done }\n";
    let project = fan_out(Path::new(STATS), 1000, "    maxInflight: 4\n", script);
    let (out, summary, audit) = run(&project, &["--parallel-cap", "64"]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(summary["stages"]["w"]["ok"], 1000);
    assert_eq!(events(&audit, "ToolInvocationSucceeded").len(), 1000);
    let seen = server_saw(&project.path().join(STATS));
    assert_eq!(count(&seen, "start"), 1, "one process for the run");
    assert_eq!(count(&seen, "call"), 1000);
    let peak = seen
        .iter()
        .filter_map(|s| s["inflight"].as_u64())
        .max()
        .unwrap();
    assert!(peak <= 4, "maxInflight 4, the server saw {peak} at once");
    assert!(peak >= 2, "calls were multiplexed: peak {peak}");
}

#[test]
fn fail_fast_cancels_the_calls_in_flight_on_the_server() {
    // Sibling 0 waits until the nine others hang inside the server, then
    // fails; fail-fast must cancel the nine calls there.
    let script = "  w:\n    - tool: srv__hang\n      args: {}\n  \"w#0\":\n    - tool: srv__wait_for\n      args: { n: 9 }\n    - fail: terminal\n";
    let project = fan_out(Path::new(STATS), 10, "    maxInflight: 16\n", script);
    let (out, summary, audit) = run(&project, &["--parallel-cap", "10"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert_eq!(summary["status"], "failed");
    let cancelled = events(&audit, "ToolInvocationCancelled");
    assert_eq!(cancelled.len(), 9, "{audit:#?}");
    // Named as every event of an MCP call is (recorded by the roll here).
    assert!(
        cancelled
            .iter()
            .all(|e| e["mcpServer"] == "srv" && e["mcpTool"] == "hang"),
        "{cancelled:#?}"
    );
    // The cancel notifications reach the server before troupe stops it;
    // the stats file is written as they arrive.
    let seen = server_saw(&project.path().join(STATS));
    assert_eq!(count(&seen, "cancelled"), 9, "{seen:?}");
}

#[test]
fn a_streamable_http_server_is_reached_with_a_header_from_the_environment() {
    let Some(modules) = node_modules() else {
        return;
    };
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = modules.join("@modelcontextprotocol/server-everything/dist/index.js");
    let mut child = std::process::Command::new("node")
        .arg(&server)
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Ends the server however the test ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the HTTP server never listened"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the HTTP server exited"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _child = Kill(child);
    let yaml = format!(
        "id: h\nentry: say\nmcpServers:\n  ev:\n    url: http://127.0.0.1:{port}/mcp\n    headersFromEnv: {{ X-Troupe-Test: TROUPE_TEST_HEADER }}\nstages:\n  say: {{ kind: tool, tool: ev__echo, args: {{ message: over http }} }}\nnext:\n  say: end\n"
    );
    let project = project(&yaml, &[]);
    let secret = "header-value-must-not-be-logged";
    let out = project
        .troupe()
        .args(["run", "p", "--json", "--headless"])
        .env("TROUPE_TEST_HEADER", secret)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    let text = parsed(&summary, "say")["text"].as_str().unwrap();
    assert!(text.contains("over http"), "{text}");
    assert!(!said(&out).contains(secret));
    let audit =
        troupe::auditlog::read_text(&project.path().join(summary["auditPath"].as_str().unwrap()))
            .unwrap();
    assert!(!audit.contains(secret));
    assert!(
        audit.contains("\"transport\":\"http\""),
        "WorkflowStarted records the server"
    );
    // A header whose variable is not set stops the run before any stage.
    let out = project.output(&["run", "p", "--json", "--headless"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["code"], "Mcp/MissingSecret", "{summary}");
}

#[test]
fn the_mcp_servers_block_refuses_secrets_typos_and_undeclared_servers() {
    let cases: [(&str, &str, &str); 8] = [
        ("  fs:\n    comand: node\n", "Validation/UnknownKey", ""),
        (
            "  fs:\n    command: node\n    writes: [\"~/.npm\", cache]\n",
            "Validation/PipelineInvalid",
            "`cache` is relative",
        ),
        (
            "  fs:\n    command: node\n    env: { GITHUB_TOKEN: ghp_secret }\n",
            "Validation/PipelineInvalid",
            "environment values are not written",
        ),
        (
            "  fs:\n    url: http://127.0.0.1:1/mcp\n    headers: { Authorization: Bearer x }\n",
            "Validation/PipelineInvalid",
            "header values are not written",
        ),
        (
            "  fs:\n    url: http://user:pw@127.0.0.1:1/mcp\n",
            "Validation/PipelineInvalid",
            "credentials are not written",
        ),
        (
            "  fs:\n    url: http://127.0.0.1:1/mcp\n    headersFromEnv: { Authorization: \"Bearer abc\" }\n",
            "Validation/PipelineInvalid",
            "is not a variable name",
        ),
        (
            "  a__b:\n    command: node\n",
            "Validation/PipelineInvalid",
            "cannot name an MCP server",
        ),
        (
            "  fs:\n    command: node\n    url: http://127.0.0.1:1/mcp\n",
            "Validation/PipelineInvalid",
            "not both",
        ),
    ];
    for (block, code, text) in cases {
        let yaml = format!(
            "id: t\nentry: s\nmcpServers:\n{block}stages:\n  s: {{ kind: tool, tool: Echo, args: {{ text: hi }} }}\nnext:\n  s: end\n"
        );
        let project = project(&yaml, &[]);
        let out = project.output(&["validate", "p", "--json"]);
        assert_eq!(out.status.code(), Some(2), "{block}: {}", said(&out));
        let v: Value = serde_json::from_slice(&out.stdout).unwrap();
        let first = &v["errors"][0];
        assert_eq!(first["code"], code, "{block}: {v}");
        assert!(
            first["message"].as_str().unwrap().contains(text),
            "{block}: {v}"
        );
        assert!(
            !v.to_string().contains("ghp_secret"),
            "a secret is echoed: {v}"
        );
    }
    // `srv__x` of a server the pipeline does not declare, in a stage and in
    // a tool step.
    let yaml = "id: t\nentry: s\nstages:\n  s: s.md\n  t: { kind: tool, tool: other__x }\nnext:\n  s: t\n  t: end\n";
    let project = project(yaml, &[("s.md", &stage("s", "srv__echo", ""))]);
    let out = project.output(&["validate", "p", "--json"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let codes: Vec<&str> = v["errors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["code"].as_str().unwrap())
        .collect();
    assert_eq!(
        codes,
        ["Validation/UnknownTool", "Validation/UnknownTool"],
        "{v}"
    );
}

#[test]
fn no_server_process_outlives_troupe_killed_with_sigkill() {
    // A stage hangs inside the server; troupe is killed with SIGKILL; the
    // reaper must end the server (and its process group) all the same.
    let script =
        "stages:\n  s:\n    - tool: srv__hang\n      args: {}\n    - complete: { summary: done }\n";
    // `linger`: the server ignores its input closing, so only a kill ends it.
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: s.md\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &["linger"], "")
    );
    let project = project(
        &yaml,
        &[
            ("s.md", &stage("s", "srv__hang", "")),
            ("script.yaml", script),
        ],
    );
    let mut child = project
        .troupe()
        .args(["run", "p", "--headless", "--no-store"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let stats_path = project.path().join(STATS);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let server_pid = loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the call never reached the server"
        );
        let seen = server_saw(&stats_path);
        if count(&seen, "call") == 1 {
            break seen.iter().find(|s| s["event"] == "start").unwrap()["pid"]
                .as_i64()
                .unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let gone = |pid: i64| {
        std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|s| {
                s.rsplit(')')
                    .next()
                    .unwrap_or("")
                    .trim_start()
                    .starts_with('Z')
            })
            .unwrap_or(true)
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !gone(server_pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "MCP server {server_pid} outlived troupe's SIGKILL"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// A listed tool troupe cannot offer (a schema that is not an object
/// schema, a name no model's function names allow) costs only itself: the
/// server's other tools serve, with a warning; a stage that allows it is
/// refused at start. A tool step's MCP tool is checked at start too, so a
/// typo fails before the stages ahead of it run.
#[test]
fn a_tool_troupe_cannot_offer_costs_only_itself() {
    let servers = format!(
        "mcpServers:\n{}",
        fault_block("srv", Path::new(STATS), &["bad-schema"], "")
    );
    let yaml = format!(
        "id: t\nentry: s\n{servers}stages:\n  s: {{ kind: tool, tool: srv__echo, args: {{ text: hi }} }}\nnext:\n  s: end\n"
    );
    let project = project(&yaml, &[]);
    let (out, summary, _) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert_eq!(summary["status"], "ok", "{summary}");
    let err = String::from_utf8_lossy(&out.stderr);
    for tool in ["broken", "has.dot", "noschema", "strschema"] {
        assert!(
            err.contains(&format!("tool `{tool}` is not offered")),
            "{err}"
        );
    }
    assert!(!err.contains("tool `badhint` is not offered"), "{err}");
    // A stage that allows one of them is refused, naming why.
    for (tool, code) in [
        ("broken", "Mcp/InvalidSchema"),
        ("has.dot", "Mcp/InvalidListing"),
    ] {
        let yaml = format!("id: t\nentry: s\n{servers}stages:\n  s: s.md\nnext:\n  s: end\n");
        let project = self::project(&yaml, &[("s.md", &stage("s", &format!("srv__{tool}"), ""))]);
        let (out, summary, _) = run(&project, &[]);
        assert_eq!(out.status.code(), Some(2), "{}", said(&out));
        assert_eq!(summary["code"], code, "{summary}");
    }
    // A tool step of a tool the server does not list fails at start: the
    // step before it never ran.
    let yaml = format!(
        "id: t\nentry: first\n{servers}stages:\n  first: {{ kind: tool, tool: srv__echo, args: {{ text: hi }} }}\n  typo: {{ kind: tool, tool: srv__ecko, args: {{ text: hi }} }}\nnext:\n  first: typo\n  typo: end\n"
    );
    let project = self::project(&yaml, &[]);
    let (out, summary, _) = run(&project, &[]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert_eq!(summary["code"], "Mcp/UnknownTool", "{summary}");
    assert!(
        summary["message"].as_str().unwrap().contains("srv__echo"),
        "{summary}"
    );
    let stats = std::fs::read_to_string(project.path().join(STATS)).unwrap_or_default();
    assert!(!stats.contains("\"call\""), "{stats}");
}

/// `validate --connect` keeps a server's stderr too: a server that dies at
/// start is refused with the last lines it wrote.
#[test]
fn validate_connect_quotes_what_a_failing_server_wrote() {
    let yaml = format!(
        "id: t\nentry: s\nmcpServers:\n{}stages:\n  s: {{ kind: tool, tool: srv__echo, args: {{ text: hi }} }}\nnext:\n  s: end\n",
        fault_block("srv", Path::new(STATS), &["exit-at-start"], "")
    );
    let project = project(&yaml, &[]);
    let out = project.output(&["validate", "p", "--connect", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("exiting at start on purpose"),
        "{}",
        said(&out)
    );
}

#[path = "mcp/faults.rs"]
mod faults;
#[path = "mcp/http_faults.rs"]
mod http_faults;
#[path = "mcp/secrets_and_forms.rs"]
mod secrets_and_forms;
