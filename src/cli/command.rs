//! The command line's grammar (clap): the subcommands with their help and
//! exit codes, and dispatch to one file per command.

use std::path::PathBuf;

use clap::{Parser, Subcommand};

use super::exit::Exit;
use super::{bench, report, resume, runs, sandbox_exec, show, validate, worker};

const AFTER_HELP: &str = "\
A pipeline is a folder: pipeline.yaml (entry, stages, next table) plus one
markdown file per LLM stage (YAML frontmatter + prompt body).

Examples:
  troupe run stages/code-review --task 'rename the config loader'
  troupe run stages/fanout --ctx width=10000 --parallel-cap 256
  troupe run stages/fanout --base-url http://127.0.0.1:8080/v1   # a local model
  troupe validate stages/code-review
  troupe show stages/fanout
  troupe show stages/code-review plan --json
  troupe bench stages/fanout --width 1000,10000 --cap 256 --latency 0ms
  troupe runs                                   # every run: status, counts, duration
  troupe runs show <RUN_ID> --stage worker#17   # one sibling's verdict and result
  troupe resume <RUN_ID>                        # go on after Ctrl-C, kill -9, a fixed failure
  troupe report <RUN_ID> --svg run.svg --html run.html
  troupe worker stages/fanout --nats nats://127.0.0.1:4222     # serve siblings
  troupe run stages/fanout --nats nats://127.0.0.1:4222         # siblings on workers
  troupe serve --listen tcp:127.0.0.1:7700      # many runs in one server, with a dashboard
  troupe submit stages/fanout --watch           # a run on the project's server
  troupe chat --mode allowlist --allow Read     # a model with tools, no pipeline

Exit codes:
  0    ok
  1    the run failed (a stage failed, a sibling failed, maxVisits exceeded,
       --max-run-time or a budget reached, the store could not write)
  2    invalid input: a pipeline that fails validation, a bad flag or value,
       a model provider that fails the capability check, a store that cannot
       be used, an unknown run (nothing ran)
  129  cancelled by SIGHUP
  130  interrupted (Ctrl-C, SIGINT)
  143  cancelled by SIGTERM
       The first of these signals cancels the run strictly, flushes the
       audit log (its last line is WorkflowExit, status cancelled) and
       kills what Bash calls still run; a second one exits at once.";

/// troupe runs LLM agent workflows as state-machine stage pipelines.
#[derive(Debug, Parser)]
#[command(name = "troupe", version, about, long_about = None, after_help = AFTER_HELP)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Check a pipeline folder and report every problem at once.
    ///
    /// Prints `ok: <id> (<n> stages)` and exits 0, or prints each error with
    /// its stable code (e.g. Validation/StageJoinDangling), file, line,
    /// column, field and a hint, and exits 2.
    ///
    /// With --connect it also starts (or reaches) every MCP server the
    /// pipeline declares, lists their tools, checks each stage's
    /// `server__tool` entries against the listings and prints the tools.
    Validate {
        /// The pipeline folder (or its pipeline.yaml).
        pipeline: PathBuf,
        /// Print the result as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Start the pipeline's MCP servers and check their tools too.
        #[arg(long)]
        connect: bool,
        /// The project root MCP servers start in (with --connect).
        #[arg(long, default_value = ".", value_name = "DIR")]
        root: PathBuf,
    },
    /// Run a pipeline on the actor runtime: offline (scripted provider) or
    /// against any OpenAI-compatible endpoint (--base-url).
    ///
    /// Validates first (exit 2 when invalid; for the openai provider, also
    /// when the endpoint is unreachable or the model cannot call tools),
    /// runs every stage execution as its own actor, writes the audit log to
    /// .troupe/runs/<workflowRunId>/audit.log.zst, keeps every execution and
    /// StageResult in the run store (.troupe/troupe.db) and prints a
    /// summary.
    Run(Box<super::run::RunArgs>),
    /// Continue a run that did not finish, without re-running finished work.
    ///
    /// For a run stopped by Ctrl-C, a signal, kill -9 or a power loss, or
    /// one that failed and whose cause was fixed: reloads its pipeline
    /// (refused, exit 2, when its files changed, unless --force), restores
    /// its ctx and every stored StageResult, repairs its audit log and goes
    /// on in the same log with the same run and execution ids. Siblings
    /// whose results were stored are not run again; failed and unfinished
    /// executions are. Takes the options of `troupe run` but --task and
    /// --ctx (the ctx is the run's). When a `troupe serve` answers for the
    /// project (or --server names one), the run goes on inside it: the
    /// command prints the run's id and exits 0; follow it with `troupe
    /// watch`.
    Resume(Box<resume::ResumeArgs>),
    /// List runs, or show, export, delete them (the run store).
    ///
    /// Without a command: the newest runs with their pipeline, status
    /// (a run whose process died reads `interrupted`), start, duration and
    /// executions ok / failed / cancelled.
    Runs(Box<runs::RunsArgs>),
    /// Serve fan-out siblings of distributed runs from a NATS JetStream
    /// work queue.
    ///
    /// Takes sibling tasks of the given pipelines from the queue that
    /// `troupe run --nats URL` fills, runs each on the same stage actors as
    /// a local run with this worker's own provider and tools, and reports
    /// them back. A task of a pipeline whose files differ from this
    /// worker's copy is refused. The first Ctrl-C or SIGTERM stops taking
    /// tasks and lets those in flight finish.
    Worker(Box<worker::WorkerArgs>),
    /// Benchmark a pipeline offline against the plain-tokio floor.
    ///
    /// Runs the pipeline with the scripted provider and the audit log on
    /// over a matrix of widths (ctx.width), caps and per-turn latencies,
    /// each run in a child process of its own (so peak RSS is that run's),
    /// alternating with the floor: the same work written directly on tokio.
    /// Prints wall time (median), per-sibling µs, the ratios to the floor
    /// and to the ideal ceil(N/cap) x turns x latency, peak RSS and, with
    /// --fail-sibling, the time to cancel the siblings in flight.
    Bench(Box<bench::BenchArgs>),
    /// Print a pipeline's graph, or one stage in full.
    ///
    /// Without a stage: stages, the next table, fan-outs, joins and caps.
    /// With a stage: every frontmatter field, the tool manifest the model
    /// sees (allowed tools plus the completion channel) and the prompt body.
    Show {
        /// The pipeline folder (or its pipeline.yaml).
        pipeline: PathBuf,
        /// A stage id to show in full.
        stage: Option<String>,
        /// Print as JSON on stdout.
        #[arg(long)]
        json: bool,
        /// Start the pipeline's MCP servers, so that a stage's manifest
        /// shows their tools with the servers' own schemas.
        #[arg(long)]
        connect: bool,
        /// Print the graph as a Mermaid flowchart (for a README).
        #[arg(long, conflicts_with_all = ["dot", "json", "stage"])]
        mermaid: bool,
        /// Print the graph as Graphviz DOT (`| dot -Tsvg > graph.svg`).
        #[arg(long, conflicts_with_all = ["json", "stage"])]
        dot: bool,
        /// The project root MCP servers start in (with --connect).
        #[arg(long, default_value = ".", value_name = "DIR")]
        root: PathBuf,
    },
    /// Start a pipeline of your own: write a template into a new or empty
    /// folder (its name, in kebab-case, becomes the pipeline's id).
    #[command(after_help = super::new::templates_help())]
    New {
        /// The folder to write (made if missing; must be empty).
        dir: PathBuf,
        /// The template.
        #[arg(long, default_value = "empty", value_name = "TEMPLATE")]
        from: String,
    },
    /// Talk to a model with tools: the default chat turn, where no
    /// pipeline decides.
    ///
    /// Each line you type is a message; the model answers with the
    /// built-in tools (and the MCP servers of --mcp), each call decided by
    /// --mode: ask (every call is put to you), allowlist (--allow rules
    /// run, the rest are put to you) or yolo. Offline (scripted) unless a
    /// provider is given. Every turn is a run in the store with its audit
    /// log; --continue picks the conversation up again.
    // A chat has no pipeline of the user's: the run options that speak of
    // one say what they do here.
    #[command(
        mut_arg("script", |a| a.help("Canned model turns for the scripted provider (default: the chat's own)")),
        mut_arg("parallel_cap", |a| a.hide(true)),
        mut_arg("fail_sibling", |a| a.hide(true)),
        mut_arg("headless", |a| a.help("Ask no one: a call --mode would put to you is denied. The default when stdin is not a terminal")),
    )]
    Chat(Box<super::chat::ChatArgs>),
    /// Host many runs in one long-lived actor system, reachable through
    /// the control API (and, on a TCP listener, a dashboard).
    ///
    /// Listens on .troupe/troupe.sock (mode 0600) unless --listen says
    /// otherwise; a TCP listener requires the bearer token in .troupe/token
    /// (made on first start) and prints a one-time dashboard login link.
    /// Runs share the run store and one request limiter per model
    /// endpoint; at most --max-runs run at once. SIGTERM or Ctrl-C cancels
    /// the runs (--drain: lets them finish), records them and exits; after
    /// kill -9 a restarted server lists the interrupted runs, and `troupe
    /// resume` continues them inside it.
    #[command(after_help = "\
Examples:
  troupe serve                                   # unix:.troupe/troupe.sock
  troupe serve --listen tcp:127.0.0.1:7700 --max-runs 4
  troupe submit stages/fanout --ctx width=1000 --watch
  troupe runs                                    # hosted runs read `running`")]
    Serve(Box<super::serve::ServeArgs>),
    /// Start a run on a `troupe serve` and print its id.
    ///
    /// Takes the pipeline and the options of `troupe run`; the server's
    /// run store, runs folder and root are used. --watch follows it.
    Submit(Box<super::submit::SubmitArgs>),
    /// Follow a running run's events from another terminal or program.
    ///
    /// Prints a line per stage execution that ends (or every event with
    /// --events -) until the run ends, and exits as the run does (0 ok,
    /// 1 failed, 130 cancelled). Ctrl-C leaves the run running.
    Watch(super::control::WatchArgs),
    /// List the approvals and questions of a running run that wait for an
    /// answer through the control API (a run started with --remote, or
    /// hosted by `troupe serve`).
    Pending {
        #[command(flatten)]
        at: super::control::RunRef,
        /// Print as JSON on stdout.
        #[arg(long)]
        json: bool,
    },
    /// Approve a pending call of a running run (see `troupe pending`); the
    /// first answer from anyone wins.
    Approve(super::control::AnswerArgs),
    /// Deny a pending call of a running run.
    Deny(super::control::DenyArgs),
    /// Answer a human step's question of a running run (see `troupe
    /// pending`); an answer that does not match the step's fields is
    /// refused and the question stays open.
    Answer(super::control::QuestionArgs),
    /// Cancel a running run strictly, as Ctrl-C in its terminal would.
    Cancel(super::control::RunRef),
    /// Print a new one-time login link to `troupe serve`'s dashboard (its
    /// TCP listener); the last link stops working. A session lasts 12
    /// hours unused.
    Dashboard(super::control::DashboardArgs),
    /// Internal: confine writes to the given folders with Landlock, then
    /// exec the command. `Bash` runs every sandboxed shell through it.
    #[command(hide = true)]
    SandboxExec(sandbox_exec::SandboxExecArgs),
    /// Internal: kills the process groups of `Bash` calls a troupe that
    /// died left behind (told of them on stdin; acts when stdin closes).
    #[command(hide = true)]
    Reaper,
    /// Draw a finished (or killed) run as a timeline: SVG and/or HTML.
    ///
    /// Reads <runs-dir>/<RUN_ID>/audit.log.zst and draws one row per stage
    /// execution (siblings under their group, wide groups binned), its wait
    /// for a cap slot, retries and approval waits, and below, the running
    /// executions over time against each group's cap. --html adds the
    /// run's figures and a per-stage table, in one file with nothing to
    /// fetch.
    #[command(after_help = report::AFTER_HELP)]
    Report(Box<report::ReportArgs>),
}

/// Runs the parsed command and returns the process exit code.
pub fn run(cli: Cli) -> Exit {
    // Commands that run `Bash` calls get a reaper, so that even `kill -9`
    // leaves none of their processes behind.
    let starts_processes = matches!(
        cli.command,
        Command::Run(_)
            | Command::Resume(_)
            | Command::Worker(_)
            | Command::Serve(_)
            | Command::Chat(_)
    );
    if starts_processes && let Ok(launcher) = std::env::current_exe() {
        crate::tools::process_group::arm_reaper(&launcher);
    }
    if starts_processes {
        // What a run's processes leave behind comes to troupe; commands
        // that outlive their runs reap what ended as they go.
        if crate::tools::process_group::adopt_orphans()
            && matches!(
                cli.command,
                Command::Worker(_) | Command::Serve(_) | Command::Chat(_)
            )
        {
            crate::tools::process_group::keep_reaping_adopted();
        }
    } else {
        quiet_broken_pipe();
    }
    let exit = dispatch(cli.command);
    if starts_processes {
        // Nothing the run started outlives it: not a shell's `setsid`
        // child, not a double-forked daemon, not a hook's grandchild.
        crate::tools::process_group::kill_orphans();
    }
    exit
}

/// A reader that went away (`troupe runs | head`) ends a listing as it
/// ends any Unix tool (status 141, as if by SIGPIPE), not with a panic
/// message from `println!`. Runs are left alone: they never print their
/// events with `println!`, and must flush their log whatever a reader does.
fn quiet_broken_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied())
            .unwrap_or("");
        if message.starts_with("failed printing to stdout") && message.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn dispatch(command: Command) -> Exit {
    match command {
        Command::Validate {
            pipeline,
            json,
            connect,
            root,
        } => validate::run(&pipeline, json, connect.then_some(root.as_path())),
        Command::Run(args) => super::run::run(*args),
        Command::Resume(args) => resume::run(*args),
        Command::Runs(args) => runs::run(*args),
        Command::Worker(args) => worker::run(*args),
        Command::Bench(args) => bench::run(*args),
        Command::Show {
            pipeline,
            stage,
            json,
            connect,
            root,
            mermaid,
            dot,
        } => {
            if mermaid || dot {
                show::graph(&pipeline, mermaid)
            } else {
                show::run(
                    &pipeline,
                    stage.as_deref(),
                    json,
                    connect.then_some(root.as_path()),
                )
            }
        }
        Command::New { dir, from } => super::new::run(&dir, &from),
        Command::SandboxExec(args) => sandbox_exec::run(args),
        Command::Reaper => {
            crate::tools::process_group::reap(std::io::stdin().lock(), &std::env::temp_dir());
            Exit::Ok
        }
        Command::Report(args) => report::run(*args),
        Command::Serve(args) => super::serve::run(&args),
        Command::Chat(args) => super::chat::run(&args),
        Command::Submit(args) => super::submit::run(*args),
        Command::Watch(args) => super::control::watch(&args),
        Command::Pending { at, json } => super::control::pending(&at, json),
        Command::Approve(args) => super::control::answer(&args, true),
        Command::Deny(args) => super::control::answer(&args.into(), false),
        Command::Cancel(at) => super::control::cancel(&at),
        Command::Dashboard(args) => super::control::dashboard(&args),
        Command::Answer(args) => super::control::answer_question(&args),
    }
}
