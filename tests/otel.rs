//! OpenTelemetry export through the binary: a run with `--otlp` sends its
//! trace to an OTLP/HTTP receiver built here on the protocol's own
//! messages (as strict as a collector: protobuf only, on `/v1/traces`),
//! whose spans are decoded and checked for names, parents and attributes.
//! A collector that refuses, hangs or is absent costs a warning, never the
//! run; an endpoint that is not a URL is refused before anything runs.

#![allow(clippy::unwrap_used)]

mod common;

use common::project::said;

use common::otlp::{Collector, attr, receiver};

use std::collections::HashMap;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::trace::v1::Span;

fn run(flags: &[&str]) -> (Output, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(common::project::bundled("fanout"))
        .args(["--ctx", "width=5", "--json", "--headless"])
        .args(flags)
        .current_dir(dir.path())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .output()
        .unwrap();
    (out, dir)
}

#[test]
fn a_run_exports_one_trace_with_its_spans_parented_as_its_actors() {
    let r = receiver(Collector::Accepts);
    let (out, _dir) = run(&["--otlp", &format!("http://{}", r.addr)]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let run_id = summary["runId"].as_str().unwrap().to_owned();
    let spans = r.spans.lock().unwrap().clone();
    assert_eq!(
        r.services.lock().unwrap().first().map(String::as_str),
        Some("troupe")
    );

    // One trace, the run's own id.
    let trace = uuid::Uuid::parse_str(&run_id).unwrap().as_bytes().to_vec();
    assert!(spans.iter().all(|s| s.trace_id == trace));
    let by_id: HashMap<Vec<u8>, &Span> = spans.iter().map(|s| (s.span_id.clone(), s)).collect();
    assert_eq!(by_id.len(), spans.len(), "span ids are unique");
    let parent = |s: &Span| by_id.get(&s.parent_span_id).copied();
    let named = |prefix: &str| -> Vec<&Span> {
        spans
            .iter()
            .filter(|s| s.name.starts_with(prefix))
            .collect()
    };

    let roots: Vec<&Span> = spans
        .iter()
        .filter(|s| s.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1);
    assert_eq!(roots[0].name, "run fanout");
    assert_eq!(attr(roots[0], "troupe.status").as_deref(), Some("ok"));
    for turn in named("turn ") {
        assert_eq!(parent(turn).unwrap().name, "run fanout");
    }
    let workers = named("stage worker");
    assert_eq!(workers.len(), 5);
    let mut indexes: Vec<String> = workers
        .iter()
        .map(|w| attr(w, "troupe.sibling_index").unwrap_or_else(|| panic!("{:?}", w.attributes)))
        .collect();
    indexes.sort();
    assert_eq!(indexes, ["0", "1", "2", "3", "4"]);
    for w in &workers {
        assert!(
            parent(w).unwrap().name.starts_with("turn "),
            "a sibling hangs from its turn"
        );
        assert_eq!(attr(w, "troupe.verdict").as_deref(), Some("ok"));
        assert!(w.start_time_unix_nano <= w.end_time_unix_nano);
    }
    // Two model requests and one tool call per worker, under it.
    let requests = named("chat");
    assert_eq!(
        requests.len(),
        5 * 2 + 2,
        "workers' two turns, plan's and reduce's"
    );
    for q in &requests {
        assert!(parent(q).unwrap().name.starts_with("stage "));
        assert_eq!(attr(q, "gen_ai.operation.name").as_deref(), Some("chat"));
        assert_eq!(attr(q, "gen_ai.provider.name").as_deref(), Some("scripted"));
        assert!(attr(q, "gen_ai.usage.input_tokens").is_some());
        assert_eq!(q.kind, 3, "a client span");
    }
    let tools = named("execute_tool Echo");
    assert_eq!(tools.len(), 5);
    for t in &tools {
        assert!(parent(t).unwrap().name.starts_with("stage worker"));
        assert_eq!(attr(t, "gen_ai.tool.name").as_deref(), Some("Echo"));
        assert_eq!(attr(t, "troupe.outcome").as_deref(), Some("ok"));
        assert_eq!(
            attr(t, "gen_ai.tool.call.arguments"),
            None,
            "no content unless asked"
        );
    }

    let r = receiver(Collector::Accepts);
    let (out, _dir) = run(&[
        "--otlp",
        &format!("http://{}/v1/traces", r.addr),
        "--otlp-content",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let spans = r.spans.lock().unwrap().clone();
    let tool = spans
        .iter()
        .find(|s| s.name == "execute_tool Echo")
        .unwrap();
    assert!(
        attr(tool, "gen_ai.tool.call.arguments")
            .unwrap()
            .contains("item")
    );
}

#[test]
fn a_failed_sibling_and_the_cancelled_ones_are_marked() {
    let r = receiver(Collector::Accepts);
    let (out, _dir) = run(&[
        "--otlp",
        &format!("http://{}", r.addr),
        "--fail-sibling",
        "worker#2",
        "--latency",
        "5ms",
        "--parallel-cap",
        "2",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let spans = r.spans.lock().unwrap().clone();
    let failed = spans
        .iter()
        .find(|s| {
            s.name == "stage worker" && attr(s, "troupe.sibling_index").as_deref() == Some("2")
        })
        .unwrap();
    assert_eq!(failed.status.as_ref().unwrap().code, 2, "an error status");
    let root = spans.iter().find(|s| s.parent_span_id.is_empty()).unwrap();
    assert_eq!(attr(root, "troupe.status").as_deref(), Some("failed"));
    assert_eq!(root.status.as_ref().unwrap().code, 2);
}

/// A collector that answers 503 (restarting, shedding load) gets the
/// batch again after the wait it asks for, and every span arrives; spans
/// a collector takes the post of but refuses (`partial_success`) are
/// counted as not delivered, with its reason.
#[test]
fn a_busy_collector_gets_the_batch_again_and_partial_refusals_are_counted() {
    let busy = receiver(Collector::Busy(2));
    let (out, _dir) = run(&["--otlp", &format!("http://{}", busy.addr)]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(!said(&out).contains("not delivered"), "{}", said(&out));
    let spans = busy.spans.lock().unwrap();
    assert!(spans.iter().any(|s| s.name == "run fanout"), "{spans:?}");
    drop(spans);
    let partial = receiver(Collector::RefusesOneSpanEach);
    let (out, _dir) = run(&["--otlp", &format!("http://{}", partial.addr)]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        said(&out).contains("spans not delivered") && said(&out).contains("one span too many"),
        "{}",
        said(&out)
    );
}

#[test]
fn a_collector_that_refuses_hangs_or_is_absent_costs_a_warning_not_the_run() {
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let refusing = receiver(Collector::Refuses);
    let hanging = receiver(Collector::Hangs);
    for addr in [closed, refusing.addr.clone(), hanging.addr.clone()] {
        let started = Instant::now();
        let (out, _dir) = run(&["--otlp", &format!("http://{addr}")]);
        assert_eq!(out.status.code(), Some(0), "{addr}: {}", said(&out));
        assert!(said(&out).contains("spans not delivered"), "{}", said(&out));
        // The end waits a bounded grace for the exporter, never the post.
        assert!(started.elapsed() < Duration::from_secs(30));
    }
    // A credential in the endpoint is not said in the warning.
    let (out, _dir) = run(&[
        "--otlp",
        &format!("http://user:tok-123@{}/?api_key=zzz-456", refusing.addr),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(said(&out).contains("spans not delivered"), "{}", said(&out));
    assert!(
        !said(&out).contains("tok-123") && !said(&out).contains("zzz-456"),
        "{}",
        said(&out)
    );
    let (out, _dir) = run(&["--otlp", "not a url"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("Validation/InputInvalid"),
        "{}",
        said(&out)
    );
    let (out, _dir) = run(&["--otlp", "ftp://127.0.0.1:21"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
}

#[test]
fn the_standard_variables_choose_the_endpoint() {
    let r = receiver(Collector::Accepts);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(common::project::bundled("fanout"))
        .args(["--ctx", "width=2", "--headless"])
        .current_dir(dir.path())
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{}", r.addr))
        .env("OTEL_SERVICE_NAME", "my-agents")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(
        r.spans
            .lock()
            .unwrap()
            .iter()
            .any(|s| s.name == "run fanout")
    );
    assert_eq!(r.services.lock().unwrap()[0], "my-agents");

    let with = |vars: &[(&str, &str)]| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
        cmd.arg("run")
            .arg(common::project::bundled("fanout"))
            .args(["--ctx", "width=2", "--headless"])
            .current_dir(dir.path())
            .envs(vars.iter().copied());
        cmd.output().unwrap()
    };
    // The standard switches turn the variables' export off.
    let quiet = receiver(Collector::Accepts);
    let endpoint = format!("http://{}", quiet.addr);
    for off in [
        ("OTEL_SDK_DISABLED", "true"),
        ("OTEL_TRACES_EXPORTER", "none"),
    ] {
        let out = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), off]);
        assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    }
    assert!(quiet.spans.lock().unwrap().is_empty());
    // A protocol troupe does not speak is refused before anything runs.
    let out = with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(said(&out).contains("http/protobuf"), "{}", said(&out));
    // A --otlp flag is troupe's HTTP export whatever protocol the
    // variables name for other programs.
    let flagged = receiver(Collector::Accepts);
    let out = with(&[("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
    let out = cmd
        .arg("run")
        .arg(common::project::bundled("fanout"))
        .args(["--ctx", "width=2", "--headless"])
        .args(["--otlp", &format!("http://{}", flagged.addr)])
        .current_dir(dir.path())
        .env("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    assert!(!flagged.spans.lock().unwrap().is_empty());
    // The traces' own headers win over the shared ones.
    let out = with(&[
        ("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint),
        ("OTEL_EXPORTER_OTLP_HEADERS", "x-probe=shared,x-other=1"),
        ("OTEL_EXPORTER_OTLP_TRACES_HEADERS", "x-probe=traces"),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", said(&out));
    let probes = quiet.probes.lock().unwrap().clone();
    assert!(
        !probes.is_empty() && probes.iter().all(|p| p == "traces"),
        "{probes:?}"
    );
    // A header that could not be sent is refused before anything runs,
    // naming the variable and never quoting the value; so is an endpoint
    // that is not a URL, quoted without its query or user.
    for (var, value, says) in [
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "bad name=x",
            "`bad name` is not a header name",
        ),
        (
            "OTEL_EXPORTER_OTLP_HEADERS",
            "api-key=SECRET%0Aevil",
            "cannot carry",
        ),
    ] {
        let out = with(&[("OTEL_EXPORTER_OTLP_ENDPOINT", &endpoint), (var, value)]);
        assert_eq!(out.status.code(), Some(2), "{}", said(&out));
        assert!(
            said(&out).contains(var) && said(&out).contains(says),
            "{}",
            said(&out)
        );
        assert!(!said(&out).contains("SECRET"), "{}", said(&out));
    }
    let out = with(&[(
        "OTEL_EXPORTER_OTLP_ENDPOINT",
        "http://me:PASSWORD@collector:99999/v1?api_key=SECRETQ",
    )]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    assert!(
        said(&out).contains("OTEL_EXPORTER_OTLP_ENDPOINT: the OTLP endpoint `http://collector:99999/v1` is not a URL"),
        "{}",
        said(&out)
    );
    assert!(!said(&out).contains("SECRETQ") && !said(&out).contains("PASSWORD"));
}

/// A failure's reason may quote a tool's output (here a `Bash` timeout's):
/// without `--otlp-content` the spans carry only its code; with it, the
/// whole reason.
#[test]
fn a_reason_quoting_tool_output_is_exported_only_with_content() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("p");
    std::fs::create_dir(&p).unwrap();
    std::fs::write(
        p.join("pipeline.yaml"),
        "id: leak\nentry: s\nstages:\n  s: { kind: tool, tool: Bash, args: { command: \"echo printed-secret-42; sleep 30\", timeout_ms: 300 } }\nnext:\n  s: end\n",
    )
    .unwrap();
    for (content, shown) in [(false, false), (true, true)] {
        let r = receiver(Collector::Accepts);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_troupe"));
        cmd.args([
            "run",
            "p",
            "--headless",
            "--otlp",
            &format!("http://{}", r.addr),
        ])
        .current_dir(dir.path())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT");
        if content {
            cmd.arg("--otlp-content");
        }
        let out = cmd.output().unwrap();
        assert_eq!(out.status.code(), Some(1), "{}", said(&out));
        let spans = r.spans.lock().unwrap().clone();
        let stage = spans.iter().find(|s| s.name == "stage s").unwrap();
        let status = &stage.status.as_ref().unwrap().message;
        assert!(status.starts_with("ToolTransient/Timeout"), "{status}");
        let everything = format!("{spans:?}");
        assert_eq!(
            everything.contains("printed-secret-42"),
            shown,
            "content {content}: {everything}"
        );
    }
}

/// A stderr no one reads (a pipe whose reader went away) loses the
/// export's warning, not the run: its report is whole and it exits 0.
#[test]
fn a_warning_to_a_stderr_no_one_reads_costs_nothing() {
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(common::project::bundled("fanout"))
        .args(["--ctx", "width=3", "--json", "--headless"])
        .args([
            "--otlp",
            &format!("http://127.0.0.1:{}", common::closed_port()),
        ])
        .current_dir(dir.path())
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .env_remove("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        .stderr(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["status"], "ok");
    // With --events the summary goes to stderr: lost there, not the run.
    let (reader, writer) = nix::unistd::pipe().unwrap();
    drop(reader);
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(common::project::bundled("fanout"))
        .args(["--ctx", "width=3", "--headless", "--events", "-"])
        .current_dir(dir.path())
        .stderr(std::process::Stdio::from(writer))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"WorkflowExit\""));
}
