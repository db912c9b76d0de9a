//! `troupe chat`: the default chat turn, for when no state machine is
//! attached. Each line read is a user message; the model answers it with
//! the built-in tools (and the MCP servers of `--mcp`), each call decided
//! by the security mode (`ask`, `allowlist`, `yolo`: `runtime::tool_mode`)
//! and audited as `ToolCallModeInvoked`. A turn is a run of a one-stage
//! pipeline troupe keeps in `.troupe/chat/`, so every turn has its audit
//! log, its approvals and its place in the run store; the conversation so
//! far travels in the run's ctx, which is how `--continue` finds it again,
//! even after the process was killed mid-turn.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::Exit;
use super::launch::{Concluded, Host, Launch, Refusal, prepare};
use super::options::RunOptions;
use super::signals::{CancelSignal, FirstSignal, Interrupts};
use crate::definition::load_pipeline;
use crate::definition::tool_catalog::BUILTIN_NAMES;
use crate::provider::Usage;
use crate::runtime::summary::RunStatus;
use crate::runtime::tool_mode::{AllowRule, Mode, ToolMode};
use crate::store::Store;

/// The chat pipeline's id (its runs are told apart by it in the store).
const CHAT: &str = "chat";

/// Options of `troupe chat`.
#[derive(Debug, Clone, clap::Args)]
#[command(after_help = "\
Modes:
  ask        every tool call is put to you (denied when no one can answer:
             piped input without --answers)
  allowlist  calls an --allow rule matches run; the rest are put to you
  yolo       every call runs (guard hooks still have the last word)

Allow rules:
  Read                      any call of the tool
  Bash(cargo test *)        a command starting with `cargo test`, nothing
                            chained, substituted or redirected
  Grep(src/)                arguments (as JSON) containing `src/`
  fs__*                     any tool of the MCP server `fs`

Examples:
  troupe chat                                     # offline (scripted)
  troupe chat --base-url http://127.0.0.1:8080/v1 --mode allowlist --allow 'Bash(cargo test *)' --allow Read
  echo 'list the files' | troupe chat --mode yolo
  troupe chat --continue                          # the latest conversation")]
pub struct ChatArgs {
    /// The security mode for tool calls.
    #[arg(long, default_value = "ask", value_parser = ["ask", "allowlist", "yolo"])]
    pub mode: String,
    /// An allow rule (with --mode allowlist). Repeatable.
    #[arg(long = "allow", value_name = "RULE")]
    pub allow: Vec<String>,
    /// A tool offered to the model [default: every built-in]. Repeatable.
    #[arg(long = "tool", value_name = "NAME")]
    pub tools: Vec<String>,
    /// A YAML file with an `mcpServers:` block, as pipeline.yaml takes it:
    /// their tools are offered too.
    #[arg(long, value_name = "FILE")]
    pub mcp: Option<PathBuf>,
    /// A YAML file with a `hooks:` block, as pipeline.yaml takes it (its
    /// commands run in .troupe/chat/): guard hooks have the last word on
    /// every call, in every mode.
    #[arg(long, value_name = "FILE")]
    pub hooks: Option<PathBuf>,
    /// Go on with the latest conversation, or the one of RUN (a turn's
    /// run id, or the start of it).
    #[arg(long = "continue", value_name = "RUN", num_args = 0..=1, default_missing_value = "")]
    pub continue_from: Option<String>,
    #[command(flatten)]
    pub opts: RunOptions,
}

/// One message of the conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Said {
    role: String,
    content: String,
}

fn history_json(history: &[Said]) -> Value {
    Value::Array(
        history
            .iter()
            .map(|s| json!({"role": s.role, "content": s.content}))
            .collect(),
    )
}

/// The conversation as the prompt shows it.
fn transcript(history: &[Said]) -> String {
    history
        .iter()
        .map(|s| format!("[{}]\n{}", s.role, s.content))
        .collect::<Vec<_>>()
        .join("\n\n")
}

fn fail(code: &str, message: &str) -> Exit {
    let _ = writeln!(std::io::stderr(), "error: {code}: {message}");
    Exit::Invalid
}

pub fn run(args: &ChatArgs) -> Exit {
    let mode = Mode::parse(&args.mode).unwrap_or(Mode::Ask);
    let mut allow = Vec::new();
    for text in &args.allow {
        match AllowRule::parse(text) {
            Ok(rule) => allow.push(rule),
            Err(e) => return fail("Validation/InputInvalid", &format!("--allow {e}")),
        }
    }
    if !allow.is_empty() && mode != Mode::Allowlist {
        return fail(
            "Validation/InputInvalid",
            "--allow rules are for --mode allowlist",
        );
    }
    let mcp_block = match &args.mcp {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) => {
                return fail(
                    "Validation/InputInvalid",
                    &format!("--mcp {}: {e}", path.display()),
                );
            }
        },
        None => None,
    };
    let hooks_block = match &args.hooks {
        Some(path) => match std::fs::read_to_string(path) {
            Ok(text) => Some(text),
            Err(e) => {
                return fail(
                    "Validation/InputInvalid",
                    &format!("--hooks {}: {e}", path.display()),
                );
            }
        },
        None => None,
    };
    // A tool the chat cannot offer is refused now, not every call to it
    // later (`NotOffered`): a built-in by its exact name, or one of an
    // `--mcp` server's (`server__tool`, `server__*`).
    let servers = mcp_block.as_deref().map(mcp_servers).unwrap_or_default();
    for tool in &args.tools {
        let of_a_server = tool
            .split_once("__")
            .is_some_and(|(server, name)| !name.is_empty() && servers.iter().any(|s| s == server));
        if !crate::definition::tool_catalog::is_builtin(tool) && !of_a_server {
            return fail(
                "Validation/UnknownTool",
                &format!(
                    "--tool {tool}: no such tool; the built-ins are {}{}",
                    BUILTIN_NAMES.join(", "),
                    if servers.is_empty() {
                        String::new()
                    } else {
                        format!(
                            ", and --mcp's servers' tools as SERVER__TOOL or SERVER__* ({})",
                            servers.join(", ")
                        )
                    }
                ),
            );
        }
    }
    let mut offered: Vec<String> = if args.tools.is_empty() {
        BUILTIN_NAMES.iter().map(|s| (*s).to_owned()).collect()
    } else {
        args.tools.clone()
    };
    if let Some(block) = &mcp_block {
        offered.extend(mcp_servers(block).into_iter().map(|s| format!("{s}__*")));
    }
    // The conversation to go on with first: a --continue with nothing to
    // continue writes nothing.
    let mut history = match &args.continue_from {
        Some(run) => match continued(&args.opts.store_path(), run) {
            Ok(h) => h,
            Err((code, message)) => return fail(&code, &message),
        },
        None => Vec::new(),
    };
    let dir = chat_dir(&args.opts.runs_dir);
    let blocks: Vec<&str> = [mcp_block.as_deref(), hooks_block.as_deref()]
        .into_iter()
        .flatten()
        .collect();
    if let Err(e) = write_pipeline(&dir, &blocks, args.opts.script.is_none()) {
        return fail("Store/WriteFailed", &format!("{}: {e}", dir.display()));
    }
    // Loaded once: another chat in the project rewrites the folder with
    // its own hooks and servers, which must not become this one's.
    let pipeline = match load_pipeline(&dir) {
        Ok(p) => Arc::new(p),
        Err(diags) => {
            return Refusal::Diagnostics {
                path: dir.clone(),
                diags,
            }
            .print(false);
        }
    };
    let tool_mode = Arc::new(ToolMode {
        mode,
        allow,
        offered,
    });
    // tokio keeps a signal's handler once one was installed: without a
    // watcher of its own, a signal at the prompt would do nothing.
    let mut idle = Some(idle_watch());
    // The MCP servers start once, for every turn: each turn is a run of
    // its own, but starting `npx` servers for each would cost seconds a
    // line. They stop when the chat ends; their logs go to .troupe/chat/.
    // The sandbox they run in (and its temp folder) outlives them: `host`,
    // which holds them, is dropped first.
    let (mcp, _shell) = if pipeline.mcp_servers.is_empty() {
        (None, None)
    } else {
        let root = match super::options::project_root(&args.opts.root) {
            Ok(r) => r,
            Err(why) => return fail("Validation/InputInvalid", &why),
        };
        let setup =
            crate::cli::sandbox::shell_sandbox(args.opts.no_sandbox, &args.opts.pass_env, &root);
        let started = crate::cli::mcp::start_servers(
            &pipeline,
            &root,
            setup.sandbox.clone(),
            Some(&dir),
            args.opts.network == "deny",
        );
        match started {
            Ok(pool) => (pool, Some(setup)),
            Err(e) => return crate::cli::mcp::mcp_refusal(&e).print(false),
        }
    };
    let mut host = Host {
        tool_mode: Some(Arc::clone(&tool_mode)),
        mcp,
        ..Host::default()
    };
    // The turns' options: after the first turn's capability check, the
    // model it settled is asked again without checking again.
    let mut opts = args.opts.clone();
    let interactive = std::io::stdin().is_terminal();
    let _ = writeln!(
        std::io::stderr(),
        "troupe chat: mode {}, tools {}{}",
        mode.as_str(),
        tool_mode.offered.join(", "),
        if interactive {
            "; Ctrl-D or /exit ends, /clear starts the conversation again, Ctrl-C cancels a turn"
        } else {
            ""
        }
    );
    let system = actix::System::new();
    let mut last = Exit::Ok;
    // Lines come from the terminal's one reader, which the approval
    // prompts and forms take theirs from too (`prompter::read_line`): a
    // prompt withdrawn as a turn is cancelled leaves the next line here.
    loop {
        if interactive {
            let _ = write!(std::io::stderr(), "you> ");
            let _ = std::io::stderr().flush();
        }
        let read = match super::prompter::read_line(|| true) {
            None => break,
            Some(Ok(read)) => read,
            Some(Err(e)) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "error: Validation/InputInvalid: stdin: {e}"
                );
                last = Exit::Invalid;
                break;
            }
        };
        let line = read.as_str();
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        if line == "/exit" {
            break;
        }
        // The conversation starts again (the budget goes on counting): a
        // long one is sent whole every turn, and past the model's context
        // every turn would fail.
        if line == "/clear" {
            history.clear();
            let _ = writeln!(std::io::stderr(), "(the conversation starts again)");
            continue;
        }
        // The budget is the conversation's: a turn over what the turns
        // before it used is refused, and the chat ends (exit 2).
        if let Some(over) = opts.limits.already_over_from(
            &pipeline,
            opts.provider.model.as_deref(),
            host.spent_before,
            " in this chat's earlier turns",
        ) {
            let _ = writeln!(
                std::io::stderr(),
                "error: {}: {}\n  hint: the budget counts every turn of this chat; `troupe chat --continue` goes on with the conversation and counts anew",
                crate::error::HasCode::code(&over),
                over.message
            );
            last = Exit::Invalid;
            break;
        }
        history.push(Said {
            role: "user".to_owned(),
            content: line.to_owned(),
        });
        let Turned {
            reply: turned,
            signal: signalled,
            usage,
            model,
            refused,
        } = turn(&system, &dir, &pipeline, &opts, &host, &history, &mut idle);
        idle.get_or_insert_with(idle_watch);
        host.spent_before.add(usage);
        if let Some(model) = model
            && opts.provider.model.is_none()
        {
            opts.provider.model = Some(model);
        }
        // Checked once: the next turns ask the model it settled.
        if !refused {
            opts.provider.skip_check = true;
        }
        match turned {
            Ok(reply) => {
                tell!("{}", super::output::terminal_safe(&reply));
                let _ = std::io::stdout().flush();
                history.push(Said {
                    role: "assistant".to_owned(),
                    content: reply,
                });
                last = Exit::Ok;
            }
            Err((exit, message)) => {
                // The question stays in the conversation; the next line
                // goes on from it.
                let _ = writeln!(
                    std::io::stderr(),
                    "error: {}",
                    super::output::terminal_safe(&message)
                );
                last = exit;
                // A turn refused before it ran (its options, its provider's
                // check) would be refused again for every line: the chat
                // ends there.
                if refused {
                    break;
                }
            }
        }
        // SIGTERM and SIGHUP ask the chat to end (a `timeout`, a closed
        // terminal): the turn is cancelled, and no later line is taken,
        // also when the signal came as the turn ended anyway. Ctrl-C
        // cancels the turn alone.
        if let Some(signal @ (CancelSignal::Terminate | CancelSignal::HangUp)) = signalled {
            last = signal.exit();
            break;
        }
    }
    last
}

/// Between turns (at the prompt, and while a turn starts): a signal ends
/// the chat with the signal's exit code (130, 143, 129).
fn idle_watch() -> Interrupts {
    let first = FirstSignal::default();
    let seen = first.clone();
    Interrupts::watch(first, "ending the chat", move || {
        std::process::exit(i32::from(seen.exit().code()))
    })
}

/// How a turn went.
struct Turned {
    /// The reply, or the exit and the typed error.
    reply: Result<String, (Exit, String)>,
    /// The signal that cancelled it, if one did.
    signal: Option<CancelSignal>,
    /// What its model requests used (counted against the chat's budget).
    usage: Usage,
    /// The model its provider asked, when the provider is one that asks.
    model: Option<String>,
    /// Refused before anything ran.
    refused: bool,
}

/// One turn: a run of the chat pipeline with the conversation in its
/// ctx.
fn turn(
    system: &actix::SystemRunner,
    dir: &Path,
    pipeline: &Arc<crate::definition::Pipeline>,
    opts: &RunOptions,
    host: &Host,
    history: &[Said],
    idle: &mut Option<Interrupts>,
) -> Turned {
    let refusal = |r: &Refusal| Turned {
        reply: Err((Exit::Invalid, r.said())),
        signal: None,
        usage: Usage::default(),
        model: None,
        refused: true,
    };
    let mut fields = Map::new();
    fields.insert("history".to_owned(), history_json(history));
    fields.insert(
        "conversation".to_owned(),
        Value::String(transcript(history)),
    );
    let last = history
        .last()
        .map(|s| s.content.clone())
        .unwrap_or_default();
    fields.insert("last".to_owned(), Value::String(last));
    let launch = Launch {
        path: dir.to_owned(),
        pipeline: Arc::clone(pipeline),
        fields,
        resume: None,
    };
    let prepared = match prepare(launch, opts, host) {
        Ok(prepared) => prepared,
        Err(r) => return refusal(&r),
    };
    let first = FirstSignal::default();
    let watched = first.clone();
    let driven = system.block_on(async {
        let mut interrupts = None;
        let driven = prepared
            .drive(
                |_, _| Vec::new(),
                |session| {
                    // From here a signal cancels the turn, not the chat.
                    drop(idle.take());
                    interrupts = Some(Interrupts::watch(
                        watched,
                        "cancelling the turn",
                        move || {
                            super::launch::cancel(&session);
                        },
                    ));
                },
            )
            .await;
        drop(interrupts);
        driven
    });
    let model = driven.model();
    let (reply, usage) = match driven.conclude() {
        Concluded::Report { report, .. } => {
            let reply = match &report.status {
                RunStatus::Ok => Ok(report
                    .results
                    .values()
                    .find(|r| r.stage_id() == CHAT)
                    .and_then(|r| r.parsed()["message"].as_str().map(str::to_owned))
                    .unwrap_or_default()),
                RunStatus::Failed { reason } => Err((Exit::RunFailed, reason.clone())),
                RunStatus::Cancelled => Err((first.exit(), "the turn was cancelled".to_owned())),
            };
            (reply, report.usage)
        }
        Concluded::Aborted(why) => (
            Err((Exit::RunFailed, format!("Session/RunAborted: {why}"))),
            Usage::default(),
        ),
        Concluded::Refused(r) => return refusal(&r),
    };
    Turned {
        reply,
        signal: first.get(),
        usage,
        model,
        refused: false,
    }
}

/// Where troupe keeps the chat pipeline: `chat/` beside the runs folder.
fn chat_dir(runs_dir: &Path) -> PathBuf {
    runs_dir
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .join(CHAT)
}

/// The names of the servers an `mcpServers:` block declares.
fn mcp_servers(block: &str) -> Vec<String> {
    let parsed: Result<Value, _> = serde_saphyr::from_str(block);
    parsed
        .ok()
        .and_then(|v| v.get("mcpServers").and_then(Value::as_object).cloned())
        .map(|m| m.keys().cloned().collect())
        .unwrap_or_default()
}

const STAGE: &str = "---
id: chat
name: Chat
# The chat's security mode shows the offered tools and decides each call;
# nothing is in the stage's own envelope.
allowedTools: []
completionTool: reply
completionSchema:
  type: object
  required: [message]
  properties:
    message: { type: string, description: \"Your answer to the last user message\" }
retryPolicy: { maxAttempts: 1, backoff: none }
turnCap: 25
resolutionPolicy: fail
---
You are troupe's chat assistant, working in the user's project folder.
Use the tools when they help. Each call is checked by the chat's security
mode and may be refused: then say what you would have done instead.
When you have your answer, call `reply` with it.

The conversation so far, oldest first:

{{ctx.conversation}}
";

const SCRIPT: &str = "# Offline turns of `troupe chat` (the scripted provider): an echo.
stages:
  chat:
    - complete: { message: \"(offline) you said: {{ctx.last}}\" }
";

/// Writes the chat pipeline (again: the tools, servers and hooks may
/// differ from last time), and its offline script unless one is given.
fn write_pipeline(dir: &Path, blocks: &[&str], script: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut yaml = "# Written by `troupe chat` on every start: edits are lost.
id: chat
name: troupe chat
entry: chat
maxVisits: 1
ctx:
  conversation: { required: true, description: \"The conversation so far, as the prompt shows it\" }
  history: { default: [], description: \"The conversation so far, message by message\" }
  last: { default: \"\", description: \"The last user message\" }
stages:
  chat: chat.md
next:
  chat: end
"
    .to_owned();
    for block in blocks {
        yaml.push_str(block);
        yaml.push('\n');
    }
    std::fs::write(dir.join("pipeline.yaml"), yaml)?;
    std::fs::write(dir.join("chat.md"), STAGE)?;
    let script_path = dir.join("script.yaml");
    if script {
        std::fs::write(script_path, SCRIPT)?;
    } else if script_path.exists() {
        std::fs::remove_file(script_path)?;
    }
    Ok(())
}

/// The conversation of the latest chat turn (or of run `run`): its
/// history, and its reply when it finished.
fn continued(store_path: &Path, run: &str) -> Result<Vec<Said>, (String, String)> {
    let store_failed =
        |e: crate::store::StoreError| (crate::error::HasCode::code(&e).to_string(), e.to_string());
    // Read only: a chat that has nothing to continue makes no store.
    let store = match crate::store::schema::open_if_made(store_path).map_err(store_failed)? {
        Some(_) => Store::open_read_only(store_path).map_err(store_failed)?,
        None => {
            return Err((
                "Store/RunNotFound".to_owned(),
                format!("no chat in {} to continue", store_path.display()),
            ));
        }
    };
    let row = if run.is_empty() {
        store
            .runs(usize::MAX)
            .map_err(store_failed)?
            .into_iter()
            .filter(|r| r.pipeline_id == CHAT)
            .max_by_key(|r| (r.started_at, r.id.clone()))
            .ok_or_else(|| {
                (
                    "Store/RunNotFound".to_owned(),
                    format!("no chat in {} to continue", store_path.display()),
                )
            })?
    } else {
        let row = store.find_run(run).map_err(store_failed)?;
        if row.pipeline_id != CHAT {
            return Err((
                "Store/RunNotFound".to_owned(),
                format!(
                    "run `{}` is a run of `{}`, not a chat turn: `troupe runs` lists the chat's turns (pipeline `{CHAT}`)",
                    row.id, row.pipeline_id
                ),
            ));
        }
        row
    };
    let mut history: Vec<Said> = row.ctx["history"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|m| Said {
                    role: m["role"].as_str().unwrap_or("user").to_owned(),
                    content: m["content"].as_str().unwrap_or_default().to_owned(),
                })
                .collect()
        })
        .unwrap_or_default();
    let reply = store
        .kept_results(&row.id)
        .map_err(store_failed)?
        .values()
        .find(|r| r.stage_id() == CHAT)
        .and_then(|r| r.parsed()["message"].as_str().map(str::to_owned));
    match reply {
        Some(reply) => history.push(Said {
            role: "assistant".to_owned(),
            content: reply,
        }),
        None => {
            let _ = writeln!(
                std::io::stderr(),
                "note: the last turn ({}) has no reply: it did not finish; its message stays in the conversation",
                row.id
            );
        }
    }
    let _ = writeln!(
        std::io::stderr(),
        "troupe chat: continuing {} ({} messages)",
        row.id,
        history.len()
    );
    Ok(history)
}
