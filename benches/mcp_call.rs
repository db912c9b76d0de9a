//! What troupe adds to an MCP tool call, against a bare `rmcp` client loop
//! calling the same server:
//!
//! - `sequential/bare` and `sequential/troupe`: one call at a time, so the
//!   difference per call is troupe's own cost (slot, connection lookup,
//!   argument check against the schema, result rendering);
//! - `concurrent/bare` and `concurrent/troupe`: 16 calls in flight
//!   (troupe's `maxInflight` 16), read as calls per second through one
//!   stdio server.
//!
//! The server is this bench binary itself, started with
//! `TROUPE_BENCH_MCP_SERVER=1`: a single-threaded stdio echo server that
//! speaks just enough of the protocol (initialize, tools/list, tools/call)
//! and answers at once, so the numbers are the client side's.

use std::io::{BufRead, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{Criterion, Throughput, criterion_group};
use rmcp::ServiceExt;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use troupe::definition::mcp::{McpServerDef, McpTransport};
use troupe::tools::mcp::{McpPool, McpStart};

const SERVER_ENV: &str = "TROUPE_BENCH_MCP_SERVER";
const IN_FLIGHT: usize = 16;

/// The echo server: one JSON-RPC message per line in, one out.
fn serve_echo() {
    let stdin = std::io::stdin();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for line in stdin.lock().lines() {
        let Ok(line) = line else { return };
        let Ok(msg) = serde_json::from_str::<Value>(&line) else {
            return;
        };
        let Some(id) = msg.get("id").cloned() else {
            continue; // a notification
        };
        let result = match msg["method"].as_str() {
            Some("initialize") => json!({
                "protocolVersion": msg["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "echo", "version": "1"}
            }),
            Some("tools/list") => json!({"tools": [{
                "name": "echo",
                "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}
            }]}),
            Some("tools/call") => {
                json!({"content": [{"type": "text", "text": msg["params"]["arguments"]["text"]}]})
            }
            _ => json!({}),
        };
        let reply = json!({"jsonrpc": "2.0", "id": id, "result": result});
        if writeln!(out, "{reply}").and_then(|()| out.flush()).is_err() {
            return;
        }
    }
}

fn server_command() -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(std::env::current_exe().expect("the bench binary"));
    cmd.env(SERVER_ENV, "1");
    cmd
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime");
    // The bare client.
    let bare = rt.block_on(async {
        ().serve(TokioChildProcess::new(server_command()).expect("the server starts"))
            .await
            .expect("the server initializes")
    });
    let bare = Arc::new(bare);
    // troupe's pool, over the same server program.
    let exe = std::env::current_exe().expect("the bench binary");
    let def = McpServerDef {
        name: "echo".to_owned(),
        transport: McpTransport::Stdio {
            command: "env".to_owned(),
            args: vec![format!("{SERVER_ENV}=1"), exe.display().to_string()],
            env: Vec::new(),
            sandbox: false,
            writes: Vec::new(),
            deny_network: false,
        },
        timeout: Duration::from_secs(60),
        max_inflight: IN_FLIGHT,
        start_timeout: None,
    };
    let start = McpStart {
        root: std::env::temp_dir(),
        sandbox: None,
        log_dir: None,
        start_timeout: Duration::from_secs(30),
        deny_network: false,
        elicitor: Default::default(),
    };
    let pool = McpPool::start(&[def], &start).expect("the pool starts");
    let cancel = CancellationToken::new();
    let args = json!({"text": "hello"});
    let params = || {
        let mut p = CallToolRequestParams::new("echo");
        p.arguments = args.as_object().cloned();
        p
    };

    let mut g = c.benchmark_group("sequential");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bare", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..n {
                    bare.peer().call_tool(params()).await.expect("a call");
                }
                t.elapsed()
            })
        })
    });
    g.bench_function("troupe", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t = Instant::now();
                for _ in 0..n {
                    pool.call("echo__echo", &args, &cancel)
                        .await
                        .expect("a call");
                }
                t.elapsed()
            })
        })
    });
    g.finish();

    let mut g = c.benchmark_group("concurrent");
    g.throughput(Throughput::Elements(1));
    g.bench_function("bare", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t = Instant::now();
                let mut left = n;
                while left > 0 {
                    let batch = left.min(IN_FLIGHT as u64);
                    let calls = (0..batch).map(|_| bare.peer().call_tool(params()));
                    for r in futures::future::join_all(calls).await {
                        r.expect("a call");
                    }
                    left -= batch;
                }
                t.elapsed()
            })
        })
    });
    g.bench_function("troupe", |b| {
        b.iter_custom(|n| {
            rt.block_on(async {
                let t = Instant::now();
                let mut left = n;
                while left > 0 {
                    let batch = left.min(IN_FLIGHT as u64);
                    let calls = (0..batch).map(|_| pool.call("echo__echo", &args, &cancel));
                    for r in futures::future::join_all(calls).await {
                        r.expect("a call");
                    }
                    left -= batch;
                }
                t.elapsed()
            })
        })
    });
    g.finish();
    drop(pool);
}

fn config() -> Criterion {
    let quick = std::env::var_os("CI").is_some();
    Criterion::default()
        .warm_up_time(Duration::from_millis(if quick { 200 } else { 1000 }))
        .measurement_time(Duration::from_secs(if quick { 1 } else { 5 }))
        .sample_size(if quick { 10 } else { 30 })
}

criterion_group! {
    name = benches;
    config = config();
    targets = bench
}

fn main() {
    if std::env::var_os(SERVER_ENV).is_some() {
        serve_echo();
        return;
    }
    benches();
    Criterion::default().configure_from_args().final_summary();
}
