//! `troupe worker <pipeline>… --nats URL`: serve the given pipelines'
//! fan-out siblings from the shared work queue (see
//! `distributed::worker`). The first Ctrl-C or SIGTERM stops taking tasks
//! and lets those in flight finish; a second exits at once (its tasks go
//! to other workers when their lease runs out).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Exit;
use super::launch::{
    ScriptedKnobs, default_threads, input_invalid, make_provider, provider_settings,
};
use super::provider::ProviderArgs;
use super::sandbox::shell_sandbox;
use super::signals::{FirstSignal, Interrupts};
use super::validate::print_diagnostics;
use crate::definition::duration::parse_duration;
use crate::definition::load_pipeline;
use crate::distributed::NatsArgs;
use crate::distributed::worker::{Served, WorkerConfig, serve};
use crate::error::HasCode;
use crate::provider::selector::Selector;
use crate::store::pipeline_digest;
use crate::tools::sandbox::check_env_name;

/// Options of `troupe worker`.
#[derive(Debug, Clone, clap::Args)]
pub struct WorkerArgs {
    /// The pipeline folders this worker serves (each as the runs that use
    /// it have it: a task of a pipeline whose files differ is refused).
    #[arg(required = true)]
    pub pipelines: Vec<PathBuf>,
    /// Most siblings this worker runs at once.
    #[arg(long, value_name = "K", default_value_t = 16,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_siblings: u32,
    /// Threads the siblings' stage executions spread over [default: as
    /// `troupe run`'s: one per core up to 4 cores; on more, the cores less
    /// those the worker's own threads use].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// The project root the tools work in (as `troupe run --root`).
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: PathBuf,
    /// The name this worker reports under [default: host and process id].
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Latency added to every scripted model turn, e.g. 20ms.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub latency: Option<Duration>,
    /// Make an execution fail (scripted provider), e.g. worker#17.
    #[arg(long, value_name = "STAGE[#INDEX]", value_parser = Selector::parse)]
    pub fail_sibling: Vec<Selector>,
    /// Pass this variable on to Bash calls (see `troupe run --help`).
    #[arg(long = "pass-env", value_name = "NAME", value_parser = check_env_name)]
    pub pass_env: Vec<String>,
    /// Run Bash calls unsandboxed.
    #[arg(long)]
    pub no_sandbox: bool,
    /// Print errors as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Print one JSON line on stdout for every task this worker settles:
    /// `{"worker","run","stageExecutionId","report","reported",…}` with
    /// report `exited` (and its verdict), `cancelled`, `notStarted` or
    /// `refused`, printed once the report is in JetStream (`reported`).
    #[arg(long)]
    pub task_log: bool,
    /// How long the NATS server may stay unreachable while the worker
    /// serves (it reconnects meanwhile) before it gives up: it then exits
    /// 2 (`Distributed/Unreachable`), and its siblings in flight are
    /// handed on by their leases.
    #[arg(long, value_name = "DURATION", default_value = "1m", value_parser = parse_duration)]
    pub nats_lost_after: Duration,
    #[command(flatten)]
    pub nats: NatsArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

pub fn run(args: WorkerArgs) -> Exit {
    let json = args.json;
    let Some(url) = args.nats.nats.clone() else {
        return input_invalid(
            &args.pipelines[0],
            "--nats URL: a worker takes its tasks from a NATS server".to_owned(),
            json,
        );
    };
    let root = match super::options::project_root(&args.root) {
        Ok(r) => r,
        Err(why) => return input_invalid(&args.root, why, json),
    };
    let mut settings = provider_settings(&args.provider);
    let shell = shell_sandbox(args.no_sandbox, &args.pass_env, &root);
    settings.sandbox = shell.sandbox.clone();
    settings.root = root;
    settings.threads = args.threads.map_or_else(default_threads, |n| n as usize);
    let mut loaded = Vec::new();
    for path in &args.pipelines {
        match load_pipeline(path) {
            Ok(p) => loaded.push((path, Arc::new(p))),
            Err(diags) => {
                print_diagnostics(path, &diags, json);
                return Exit::Invalid;
            }
        }
    }
    // One set of MCP servers per worker process, shared by its siblings.
    let with_servers: Vec<_> = loaded
        .iter()
        .filter(|(_, p)| !p.mcp_servers.is_empty())
        .collect();
    if with_servers.len() > 1 {
        return input_invalid(
            with_servers[1].0,
            "a worker serves the MCP servers of one pipeline: run one worker per pipeline that has `mcpServers:`".to_owned(),
            json,
        );
    }
    // The servers' stderr: quoted in a start error, kept while the worker
    // serves.
    let server_logs = tempfile::tempdir().ok();
    if let Some((_, pipeline)) = with_servers.first() {
        match super::mcp::start_servers(
            pipeline,
            &settings.root,
            shell.sandbox.clone(),
            server_logs.as_ref().map(tempfile::TempDir::path),
            false,
        ) {
            Ok(pool) => settings.mcp = pool,
            Err(e) => return super::mcp::mcp_failed(&e, json),
        }
    }
    let settings = Arc::new(settings);
    let mut pipelines = HashMap::new();
    let mut checks = Vec::new();
    for (path, pipeline) in loaded {
        let digest = match pipeline_digest(&pipeline) {
            Ok(d) => d,
            Err(e) => return input_invalid(path, e, json),
        };
        let knobs = ScriptedKnobs {
            script: None,
            latency: args.latency,
            fail: &args.fail_sibling,
        };
        let (provider, openai) = match make_provider(&args.provider, &knobs, &pipeline, path, None)
        {
            Ok(p) => p,
            Err(refusal) => return refusal.print(json),
        };
        if let Some(check) = openai {
            checks.push(check);
        }
        pipelines.insert(
            pipeline.id.clone(),
            Served {
                pipeline,
                digest,
                provider,
            },
        );
    }
    let name = args.name.clone().unwrap_or_else(|| {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_else(|_| "worker".to_owned());
        format!("{host}-{}", std::process::id())
    });
    let config = WorkerConfig {
        name: name.clone(),
        pipelines,
        settings: Arc::clone(&settings),
        max_siblings: args.max_siblings as usize,
        task_log: args.task_log,
        lost_after: args.nats_lost_after,
    };
    let first = FirstSignal::default();
    let (drain_tx, drain) = tokio::sync::watch::channel(false);
    let nats_args = args.nats.clone();
    let retries = settings.provider_retries;
    let backoff = settings.provider_backoff;
    let system = actix::System::new();
    let served = system.block_on(async move {
        for (provider, skip) in &checks {
            if !*skip && let Err(e) = provider.check(retries, &backoff).await {
                return Err(format!("{}: {}", e.code(), e.message));
            }
        }
        let nats = nats_args
            .connect(&format!("troupe worker {name}"))
            .await
            .map_err(|e| format!("{}: {e}", e.code()))?;
        say!(
            "worker {name}: serving at {}; Ctrl-C stops taking tasks",
            crate::distributed::nats::shown_url(&url)
        );
        let _interrupts = Interrupts::watch(
            first.clone(),
            "draining: no new task, the siblings in flight finish",
            move || {
                let _ = drain_tx.send(true);
            },
        );
        serve(nats, config, drain)
            .await
            .map_err(|e| format!("{}: {e}", e.code()))
    });
    match served {
        Ok(summary) => {
            say!(
                "worker: {} siblings finished, {} cancelled, {} not started, {} refused",
                summary.finished,
                summary.cancelled,
                summary.not_started,
                summary.refused
            );
            Exit::Ok
        }
        // With --json, on stdout as every other start-up error is.
        Err(e) => {
            let (code, message) = e.split_once(": ").unwrap_or(("Distributed/Worker", &e));
            super::output::typed_failure(
                code,
                message,
                "see docs/distributed.md; `troupe worker --help` lists the NATS options",
                json,
            )
        }
    }
}
