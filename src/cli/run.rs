//! `troupe run`: validate, pick the provider (and check an `openai` one can
//! do the job), run a pipeline on the actor runtime, print a summary. The
//! first Ctrl-C, SIGTERM or SIGHUP cancels the run (exit 130, 143, 129)
//! after flushing the audit log; a second one exits at once (`signals`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::Exit;
use super::limits::LimitArgs;
use super::provider::{ProviderArgs, ProviderSetup};
use super::sandbox::shell_sandbox;
use super::signals::{FirstSignal, Interrupts};
use super::validate::{print_diagnostics, reject};
use crate::definition::{Backoff, duration::parse_duration, load_pipeline};
use crate::error::{Diagnostics, HasCode, ValidationCode};
use crate::provider::Provider;
use crate::provider::openai::{CheckError, OpenAiProvider};
use crate::provider::script::{SCRIPT_FILE, Script};
use crate::provider::scripted::{ScriptedProvider, Selector};
use crate::runtime::audit::{start_audit_log, start_event_stream};
use crate::runtime::interaction::{AnswerRules, InteractorSpec};
use crate::runtime::launch::{parse_ctx_pair, resolve_fields, start_run};
use crate::runtime::session::ToSession;
use crate::runtime::spec::RunSpec;
use crate::runtime::stage::RunSettings;
use crate::runtime::summary::{RunReport, RunStatus};
use crate::tools::sandbox::check_env_name;

/// Options of `troupe run`.
#[derive(Debug, Clone, clap::Args)]
pub struct RunArgs {
    /// The pipeline folder (or its pipeline.yaml).
    pub pipeline: PathBuf,
    /// Sets ctx.task (the pipeline must declare `task`).
    #[arg(long)]
    pub task: Option<String>,
    /// Sets a ctx field: key=value. JSON values (numbers, booleans, lists)
    /// are kept typed. Repeatable.
    #[arg(long = "ctx", value_name = "KEY=VALUE", value_parser = parse_ctx_pair)]
    pub ctx: Vec<(String, serde_json::Value)>,
    /// Most siblings of a fan-out running at once (beats pipeline.yaml's
    /// parallelCap; default 8).
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..=1_000_000))]
    pub parallel_cap: Option<u32>,
    /// Canned model turns for the scripted provider (default: script.yaml in
    /// the pipeline folder, if present).
    #[arg(long, value_name = "FILE")]
    pub script: Option<PathBuf>,
    /// Latency added to every scripted model turn, e.g. 20ms.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub latency: Option<Duration>,
    /// Make an execution fail (scripted provider), e.g. worker#17. Repeatable.
    #[arg(long, value_name = "STAGE[#INDEX]", value_parser = Selector::parse)]
    pub fail_sibling: Vec<Selector>,
    /// Stream every event as JSON lines to stdout (`-`); the summary then
    /// goes to stderr.
    #[arg(long, value_name = "-")]
    pub events: Option<String>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// The project root the tools work in: every path a tool touches must
    /// resolve inside it, and Bash runs there.
    #[arg(long, value_name = "DIR", default_value = ".")]
    pub root: PathBuf,
    /// Where run folders (with audit.jsonl) are written.
    #[arg(long, value_name = "DIR", default_value = ".troupe/runs")]
    pub runs_dir: PathBuf,
    /// Ask no one: a tool call outside a stage's allowedTools is denied
    /// (unless --yolo or --answers answer it). The default when stdin is
    /// not a terminal.
    #[arg(long)]
    pub headless: bool,
    /// Approve every tool call outside allowedTools (each approval is
    /// still a one-shot grant, audited).
    #[arg(long)]
    pub yolo: bool,
    /// Answer approvals by the rules in FILE (YAML: `answers: [{stage,
    /// tool, args, answer: approve|deny|defer|none, delay}]`, first match
    /// wins, no match denies). Repeatable: every interactor is asked, the
    /// first answer wins.
    #[arg(long, value_name = "FILE")]
    pub answers: Vec<PathBuf>,
    /// How long an approval waits for an answer before it counts as
    /// denied, e.g. 30s (default: no limit).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub approval_timeout: Option<Duration>,
    /// The longest one LLM stage execution may take, all its attempts,
    /// model requests and tool calls included, e.g. 10m; past it the stage
    /// fails with Session/StageTimeout (default: no limit).
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub stage_timeout: Option<Duration>,
    /// Threads (actix arbiters) stage executions and their tool calls run
    /// on [default: one per core]; the scheduler, the audit writer and
    /// the store have their own.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub threads: Option<u32>,
    /// Pass this variable of troupe's environment on to Bash calls, whose
    /// environment is otherwise only PATH, HOME, USER, LOGNAME, SHELL,
    /// LANG, LANGUAGE, LC_*, TERM, TZ and TMPDIR. Repeatable.
    #[arg(long = "pass-env", value_name = "NAME", value_parser = check_env_name, conflicts_with = "no_sandbox")]
    pub pass_env: Vec<String>,
    /// Run Bash calls unsandboxed: with troupe's whole environment (API
    /// keys included) and free to write wherever troupe may. By default
    /// their environment is scrubbed and, where the kernel has Landlock,
    /// their writes are confined to --root and a private temp folder.
    #[arg(long)]
    pub no_sandbox: bool,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

/// How the actor system's part of a run ended.
enum Ended {
    /// The report, and the last `seq` the run's events used.
    Report(Box<RunReport>, u64),
    /// The run could not start or lost its report.
    Aborted(String),
    /// The provider failed its capability check; nothing ran.
    Check(CheckError),
    /// A flag turned out wrong once the provider was known (a budget
    /// without a price for the model); nothing ran.
    Invalid(String),
}

pub fn run(args: RunArgs) -> Exit {
    let path = args.pipeline.clone();
    let pipeline = match load_pipeline(&path) {
        Ok(p) => Arc::new(p),
        Err(diags) => {
            print_diagnostics(&path, &diags, args.json);
            return Exit::Invalid;
        }
    };
    let fields = match resolve_fields(&pipeline, &args.ctx, args.task.as_deref()) {
        Ok(f) => f,
        Err(errors) => {
            print_diagnostics(&path, &Diagnostics(errors), args.json);
            return Exit::Invalid;
        }
    };
    if let Some(events) = &args.events
        && events != "-"
    {
        return input_invalid(&path, "--events takes `-` (stdout)".to_owned(), args.json);
    }
    let root = match std::fs::canonicalize(&args.root) {
        Ok(r) if r.is_dir() => r,
        Ok(_) | Err(_) => {
            return input_invalid(
                &path,
                format!("--root {} is not a directory", args.root.display()),
                args.json,
            );
        }
    };
    let mut bad_selectors = Vec::new();
    for s in &args.fail_sibling {
        if pipeline.stage(&s.stage).is_none() {
            bad_selectors.push(s.stage.clone());
        }
    }
    if !bad_selectors.is_empty() {
        return input_invalid(
            &path,
            format!(
                "--fail-sibling names unknown stage(s): {}",
                bad_selectors.join(", ")
            ),
            args.json,
        );
    }
    let setup = match args.provider.resolve(&pipeline) {
        Ok(s) => s,
        Err(e) => return input_invalid(&path, e, args.json),
    };
    let mut settings = RunSettings::default();
    if let Some(n) = args.provider.provider_retries {
        settings.provider_retries = n;
    }
    if let Some(d) = args.provider.provider_backoff {
        settings.provider_backoff = Backoff::Exponential {
            initial: d,
            max: d.max(std::time::Duration::from_secs(10)),
        };
    }
    let (provider, openai): (Arc<dyn Provider>, Option<(OpenAiProvider, bool)>) = match setup {
        ProviderSetup::Scripted => match scripted_provider(&args, &pipeline) {
            Ok(p) => (Arc::new(p), None),
            Err(exit) => return exit,
        },
        ProviderSetup::Openai { config, skip_check } => {
            let scripted_only = [
                (args.script.is_some(), "--script"),
                (args.latency.is_some(), "--latency"),
                (!args.fail_sibling.is_empty(), "--fail-sibling"),
            ];
            if let Some((_, flag)) = scripted_only.iter().find(|(set, _)| *set) {
                return input_invalid(
                    &path,
                    format!("{flag} is for the scripted provider, not openai"),
                    args.json,
                );
            }
            match OpenAiProvider::new(*config) {
                Ok(p) => {
                    // Said once, when it happens; the audit log gets a
                    // `ProviderNotice` too.
                    p.on_notice(|n| eprintln!("note: {}", n.message));
                    (Arc::new(p.clone()), Some((p, skip_check)))
                }
                Err(e) => return input_invalid(&path, e.to_string(), args.json),
            }
        }
    };
    let mut interactors = Vec::new();
    for path in &args.answers {
        match AnswerRules::load(path) {
            Ok(rules) => interactors.push(InteractorSpec::Scripted(Arc::new(rules))),
            Err(e) => return input_invalid(path, format!("--answers {e}"), args.json),
        }
    }
    if args.yolo {
        interactors.push(InteractorSpec::Yolo);
    }
    if !args.headless && std::io::IsTerminal::is_terminal(&std::io::stdin()) {
        interactors.push(InteractorSpec::Terminal);
    }
    let cap = args.parallel_cap.map(|c| c as usize);
    let mut spec = RunSpec::new(Arc::clone(&pipeline), fields, provider, cap);
    spec.interactors = interactors;
    spec.approval_timeout = args.approval_timeout;
    let check_retries = settings.provider_retries;
    let check_backoff = settings.provider_backoff;
    let shell = shell_sandbox(args.no_sandbox, &args.pass_env, &root);
    settings.sandbox = shell.sandbox.clone();
    settings.root = root;
    settings.stage_timeout = args.stage_timeout;
    settings.threads = args.threads.map_or_else(default_threads, |n| n as usize);
    spec.max_run_time = args.limits.max_run_time;
    let audit_path = args.runs_dir.join(spec.run_id.as_str()).join("audit.jsonl");

    let stream_events = args.events.is_some();
    let json = args.json;
    let check = openai.clone();
    let limits = args.limits.clone();
    let run_pipeline = Arc::clone(&pipeline);
    let first_signal = FirstSignal::default();
    let watched = first_signal.clone();
    let system = actix::System::new();
    let ended = system.block_on(async move {
        if let Some((provider, false)) = &check {
            match provider.check(check_retries, &check_backoff).await {
                Ok(report) => note_check(provider, &report),
                Err(e) => return Ended::Check(e),
            }
        }
        // The budget prices the model the run actually asks, which the
        // check may have just picked.
        let model = match &check {
            Some((provider, _)) => provider.model().unwrap_or_default().to_owned(),
            None => "scripted".to_owned(),
        };
        match limits.budget(&run_pipeline, &model) {
            Ok(budget) => settings.budget = budget,
            Err(e) => return Ended::Invalid(e),
        }
        spec.settings = Arc::new(settings);
        let mut sinks = Vec::new();
        match start_audit_log(&spec.bus, &audit_path) {
            Ok(s) => sinks.push(s),
            Err(e) => {
                return Ended::Aborted(format!(
                    "cannot write the audit log {}: {e}",
                    audit_path.display()
                ));
            }
        }
        if stream_events {
            match start_event_stream(&spec.bus, spec.run_id.as_str(), std::io::stdout()) {
                Ok(s) => sinks.push(s),
                Err(e) => return Ended::Aborted(format!("cannot stream events: {e}")),
            }
        }
        if !stream_events && !json && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            match super::progress::start_progress(&spec.bus) {
                Ok(s) => sinks.push(s),
                Err(e) => eprintln!("warning: no progress display: {e}"),
            }
        }
        let bus = spec.bus.clone();
        let (session, done) = start_run(spec, sinks);
        let _interrupts = Interrupts::watch(watched, move || session.do_send(ToSession::Cancel));
        match done.await {
            Ok(report) => Ended::Report(Box::new(report), bus.last_seq()),
            Err(_) => Ended::Aborted("the run ended without a report".to_owned()),
        }
    });
    let (report, last_seq) = match ended {
        Ended::Report(r, seq) => (*r, seq),
        Ended::Aborted(e) => {
            eprintln!("error: Session/RunAborted: {e}");
            return Exit::RunFailed;
        }
        Ended::Check(e) => {
            print_check_error(&e, args.json);
            return Exit::Invalid;
        }
        Ended::Invalid(message) => return input_invalid(&path, message, args.json),
    };
    let stats = openai.as_ref().map(|(p, _)| p.stats());
    if args.json {
        let mut value = serde_json::to_value(&report).unwrap_or(serde_json::Value::Null);
        if let (Some(obj), Some(stats)) = (value.as_object_mut(), &stats) {
            obj.insert(
                "provider".to_owned(),
                serde_json::to_value(stats).unwrap_or(serde_json::Value::Null),
            );
        }
        let printed = if stream_events {
            // The event stream is JSON lines: the summary is its last line,
            // with the head keys every line has.
            serde_json::to_string(&summary_line(value, &report, last_seq))
        } else {
            serde_json::to_string_pretty(&value)
        };
        match printed {
            Ok(s) => println!("{s}"),
            Err(e) => eprintln!("error: cannot serialize the report: {e}"),
        }
    } else {
        let mut text = report.to_text();
        if let Some(s) = &stats {
            text.push_str(&provider_line(s));
        }
        if stream_events {
            eprint!("{text}");
        } else {
            print!("{text}");
            if let RunStatus::Ok = report.status {
                print_outputs(&report);
            }
        }
    }
    match report.status {
        RunStatus::Ok => Exit::Ok,
        RunStatus::Failed { .. } => Exit::RunFailed,
        RunStatus::Cancelled => first_signal.exit(),
    }
}

/// One thread per core (at least one).
pub fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

/// The `--json` summary as the last line of the `--events -` stream: kind
/// `Summary`, with the head keys (`seq` one past the run's last event).
fn summary_line(report: serde_json::Value, run: &RunReport, last_seq: u64) -> serde_json::Value {
    let mut line = serde_json::Map::new();
    line.insert("seq".into(), (last_seq + 1).into());
    line.insert(
        "ts".into(),
        crate::runtime::events::rfc3339(std::time::SystemTime::now()).into(),
    );
    line.insert("event".into(), "Summary".into());
    line.insert("workflowRunId".into(), run.run_id.clone().into());
    if let serde_json::Value::Object(fields) = report {
        for (k, v) in fields {
            if k != "runId" {
                line.insert(k, v);
            }
        }
    }
    serde_json::Value::Object(line)
}

/// Says on stderr what the capability check found when it matters: a
/// server that cannot force a tool call is asked with `auto`.
fn note_check(provider: &OpenAiProvider, report: &crate::provider::openai::CheckReport) {
    if let Some(refused) = &report.forced_choice_refused {
        eprintln!(
            "note: {} cannot force a tool call (tool_choice \"required\" was refused: {refused}); troupe asks with tool_choice \"auto\" and an instruction to call the completion tool",
            provider.config().base_url
        );
    }
}

/// The scripted provider with its script, latency and injected failures.
/// A bad flag or flag value: reported like a pipeline's diagnostics (as
/// JSON with `--json`), exit 2.
fn input_invalid(path: &std::path::Path, message: String, json: bool) -> Exit {
    reject(path, ValidationCode::InputInvalid, message, json)
}

fn scripted_provider(
    args: &RunArgs,
    pipeline: &crate::definition::Pipeline,
) -> Result<ScriptedProvider, Exit> {
    let script_path = args.script.clone().or_else(|| {
        let p = pipeline.dir.join(SCRIPT_FILE);
        p.is_file().then_some(p)
    });
    let script = match &script_path {
        Some(p) => match Script::load(p, pipeline) {
            Ok(s) => s,
            Err(diags) => {
                print_diagnostics(p, &diags, args.json);
                return Err(Exit::Invalid);
            }
        },
        None => Script::default(),
    };
    Ok(ScriptedProvider::new(script)
        .with_latency(args.latency)
        .with_failures(args.fail_sibling.clone()))
}

/// One summary line: where the model requests went and how the limit held.
fn provider_line(s: &crate::provider::openai::ProviderStats) -> String {
    format!(
        "provider openai: model {} at {} ({}), {} requests, peak {} in flight of {} allowed, {} waited for a slot\n",
        s.model.as_deref().unwrap_or("?"),
        s.base_url,
        if s.stream { "streaming" } else { "no stream" },
        s.requests,
        s.peak_in_flight,
        s.max_inflight,
        s.waited_for_slot
    )
}

/// A failed capability check, as text on stderr or JSON on stdout.
fn print_check_error(e: &CheckError, json: bool) {
    if json {
        let v = serde_json::json!({
            "status": "error",
            "code": e.code().to_string(),
            "message": e.message,
            "hint": e.hint,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        eprintln!("error: {}: {}\n  hint: {}", e.code(), e.message, e.hint);
    }
}

/// Prints the text of `print` steps that ran, so a run shows its report.
fn print_outputs(report: &crate::runtime::summary::RunReport) {
    for result in report.results.values() {
        if let Some(text) = result
            .output
            .get("text")
            .and_then(serde_json::Value::as_str)
        {
            println!("\n{text}");
        }
    }
}
