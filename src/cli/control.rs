//! The control clients: `troupe watch`, `pending`, `approve`, `deny` and
//! `cancel`, each reaching a running `troupe run` through the control
//! socket in its run folder.

use std::io::Write;
use std::path::PathBuf;

use serde_json::Value;

use super::Exit;
use crate::control::{ControlClient, ControlError, find_socket, line_head};
use crate::error::HasCode;

/// Where to find the run.
#[derive(Debug, Clone, clap::Args)]
pub struct RunRef {
    /// The run's id, or enough of its start to pick one run.
    pub run: String,
    /// The runs folder the run was started with.
    #[arg(long, value_name = "DIR", default_value = ".troupe/runs")]
    pub runs_dir: PathBuf,
    /// The `troupe serve` hosting the run (`unix:PATH`, `http://HOST:PORT`)
    /// [default: $TROUPE_SERVER; else the run's own socket, else the
    /// project's server].
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// `troupe dashboard`.
#[derive(Debug, Clone, clap::Args)]
pub struct DashboardArgs {
    /// The runs folder the server was started with.
    #[arg(long, value_name = "DIR", default_value = ".troupe/runs")]
    pub runs_dir: PathBuf,
    /// The `troupe serve` to ask (`unix:PATH`, `http://HOST:PORT`)
    /// [default: $TROUPE_SERVER; else the project's server].
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
}

/// Prints a new one-time login link to the server's dashboard.
pub fn dashboard(args: &DashboardArgs) -> Exit {
    let target = match super::reach::server_for(args.server.as_deref(), &args.runs_dir) {
        Ok(Some(t)) => t,
        Ok(None) => {
            return failed(&ControlError {
                code: "NoServer",
                message: "no `troupe serve` answers for this project (start one, or name it with --server)"
                    .to_owned(),
            });
        }
        Err(e) => return failed(&e),
    };
    let link = ControlClient::to(&target).and_then(|c| block_on(c.dashboard_login()));
    match link {
        Ok(url) => {
            tell!("{url}");
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

/// `troupe watch`.
#[derive(Debug, Clone, clap::Args)]
pub struct WatchArgs {
    #[command(flatten)]
    pub at: RunRef,
    /// Print every event as a JSON line on stdout (`-`) instead of a line
    /// per stage execution that ends.
    #[arg(long, value_name = "-")]
    pub events: Option<String>,
    /// Start after this event's `seq` (default: from the start).
    #[arg(long, value_name = "SEQ", default_value_t = 0)]
    pub from: u64,
}

/// `troupe approve` / `troupe deny`.
#[derive(Debug, Clone, clap::Args)]
pub struct AnswerArgs {
    #[command(flatten)]
    pub at: RunRef,
    /// The proposal to answer (`troupe pending` lists them).
    pub proposal: String,
    /// Approve this and every later proposal of the run with the same
    /// tool and arguments (approve only).
    #[arg(long, conflicts_with = "prefix")]
    pub same: bool,
    /// Approve this and every later Bash proposal running the same program
    /// with nothing chained (approve only).
    #[arg(long)]
    pub prefix: bool,
    /// The name the audit log records for this answer (never a secret).
    #[arg(long, default_value = "cli")]
    pub client: String,
}

/// `troupe deny`: as `approve`, without what only an approval remembers.
#[derive(Debug, Clone, clap::Args)]
pub struct DenyArgs {
    #[command(flatten)]
    pub at: RunRef,
    /// The proposal to deny (`troupe pending` lists them).
    pub proposal: String,
    /// The name the audit log records for this answer (never a secret).
    #[arg(long, default_value = "cli")]
    pub client: String,
}

impl From<DenyArgs> for AnswerArgs {
    fn from(d: DenyArgs) -> AnswerArgs {
        AnswerArgs {
            at: d.at,
            proposal: d.proposal,
            same: false,
            prefix: false,
            client: d.client,
        }
    }
}

pub fn failed(e: &ControlError) -> Exit {
    let _ = writeln!(std::io::stderr(), "error: {}: {e}", e.code());
    match e.code {
        "Unreachable" | "NotServing" | "RunEnded" => Exit::RunFailed,
        // Cancelled before it started: as a run cancelled while running.
        "RunCancelled" => Exit::Interrupted,
        _ => Exit::Invalid,
    }
}

/// The run's id and a client of what serves it: the server named (or
/// `$TROUPE_SERVER`), else the run's own socket, else the project's
/// server.
fn connect(at: &RunRef) -> Result<(String, ControlClient), ControlError> {
    let named = at.server.is_some() || crate::environ::var("TROUPE_SERVER").is_some();
    if !named {
        match find_socket(&at.runs_dir, &at.run) {
            Ok((id, socket)) => return Ok((id, ControlClient::new(&socket)?)),
            Err(e) if e.code == "NotServing" || e.code == "RunNotFound" => {
                if super::reach::server_for(None, &at.runs_dir)?.is_none() {
                    return Err(e);
                }
            }
            Err(e) => return Err(e),
        }
    }
    let Some(target) = super::reach::server_for(at.server.as_deref(), &at.runs_dir)? else {
        return Err(ControlError {
            code: "NotServing",
            message: format!("run {} is not running", at.run),
        });
    };
    let client = ControlClient::to(&target)?;
    // The server knows the run by the start of its id too.
    let described = block_on(client.describe(&at.run))?;
    let id = described["runId"].as_str().unwrap_or(&at.run).to_owned();
    Ok((id, client))
}

pub fn block_on<T>(work: impl Future<Output = T>) -> T {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt.block_on(work),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: cannot start a runtime: {e}");
            std::process::exit(1)
        }
    }
}

/// Follows a run's events until it ends; exits as the run did.
pub fn watch(args: &WatchArgs) -> Exit {
    if args.events.as_deref().is_some_and(|e| e != "-") {
        let _ = writeln!(std::io::stderr(), "error: --events takes `-` (stdout)");
        return Exit::Invalid;
    }
    let (id, client) = match connect(&args.at) {
        Ok(c) => c,
        // Over already: what it did is in its audit log.
        Err(e) if e.code == "NotServing" => return watch_log(args, args.from),
        Err(e) => return failed(&e),
    };
    let exit = follow_quietly(&client, &id, args.events.is_some(), args.from);
    match exit {
        Ok(exit) => exit,
        // The stream broke off. A run whose process is gone ended (its
        // log has the rest) or was killed: the log says which, not that
        // the run is unreachable.
        Err(why) => match crate::control::find_run(&args.at.runs_dir, &id) {
            Ok((_, dir)) if let_go(&dir) => watch_log(args, why.shown().max(args.from)),
            _ => why.report(),
        },
    }
}

/// Why a stream was given up.
/// Whether the run's process has let go of it, after its stream broke
/// off: a process killed closes its socket and lets go of its lock in the
/// same exit, not at the same instant, so a moment is allowed for that.
fn let_go(dir: &std::path::Path) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        if !crate::store::lock::is_held(dir) {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Each with the `seq` of the last line shown.
enum BrokenOff {
    Failed(ControlError, u64),
    Ended(u64),
}

impl BrokenOff {
    fn shown(&self) -> u64 {
        match self {
            BrokenOff::Failed(_, seq) | BrokenOff::Ended(seq) => *seq,
        }
    }

    fn report(self) -> Exit {
        match self {
            BrokenOff::Failed(e, _) => failed(&e),
            BrokenOff::Ended(_) => {
                let _ = writeln!(
                    std::io::stderr(),
                    "error: Control/Unreachable: the run's stream ended before its WorkflowExit"
                );
                Exit::RunFailed
            }
        }
    }
}

/// Shows run `id`'s events from `from` on as they come; exits as the run
/// did.
pub fn follow(client: &ControlClient, id: &str, raw: bool, from: u64) -> Exit {
    follow_quietly(client, id, raw, from).unwrap_or_else(BrokenOff::report)
}

/// [`follow`], with a stream that broke off handed back unsaid.
fn follow_quietly(
    client: &ControlClient,
    id: &str,
    raw: bool,
    from: u64,
) -> Result<Exit, BrokenOff> {
    // Written in batches, flushed when a batch is through: a line-buffered
    // stdout would cost a write per event.
    let show = std::cell::RefCell::new(Shown::new(raw));
    let result = block_on(client.events(
        id,
        from,
        |line| show.borrow_mut().line(line),
        || show.borrow_mut().flush(),
    ));
    let show = show.into_inner();
    let shown = show.last_seq;
    if let Err(e) = result {
        return Err(BrokenOff::Failed(e, shown));
    }
    show.ended().ok_or(BrokenOff::Ended(shown))
}

/// `watch` of a run that is not running: its audit log, as the stream
/// would have given it, and the exit of its last session.
/// Lines past `from` are shown.
fn watch_log(args: &WatchArgs, from: u64) -> Exit {
    let dir = match crate::control::find_run(&args.at.runs_dir, &args.at.run) {
        Ok((_, dir)) => dir,
        Err(e) => return failed(&e),
    };
    let unreadable = |e: &dyn std::fmt::Display| {
        let _ = writeln!(
            std::io::stderr(),
            "error: Control/NotServing: the run is not running and its log cannot be read: {e}"
        );
        Exit::RunFailed
    };
    // Line by line: a million-wide run's log is gigabytes of lines.
    let log = match crate::auditlog::DecodedReader::open(&crate::auditlog::in_dir(&dir)) {
        Ok(log) => std::io::BufReader::with_capacity(1 << 16, log),
        Err(e) => return unreadable(&e),
    };
    let mut show = Shown::new(args.events.is_some());
    for line in std::io::BufRead::lines(log) {
        let line = match line {
            Ok(line) => line,
            Err(e) => return unreadable(&e),
        };
        if line_head(&line).is_some_and(|(seq, _)| seq > from) {
            show.line(&line);
            if show.unwritten.is_some() {
                break;
            }
        }
    }
    let id = dir.file_name().unwrap_or_default().to_string_lossy();
    show.exit(&format!(
        "error: Control/RunKilled: run {id} was killed before its end (`troupe resume {id}` continues it)"
    ))
}

/// The events a person watching is shown: every line (`--events -`), or a
/// line for each of these.
const SHOWN: [&str; 6] = [
    "WorkflowStarted",
    "WorkflowResumed",
    "StageExited",
    "StageCancelled",
    "InteractionRaised",
    "WorkflowExit",
];

/// What `watch` prints, and how the run it watched ended.
struct Shown {
    raw: bool,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    /// The last session's `WorkflowExit` status, if the log has one.
    status: Option<String>,
    /// The `seq` of the last line read.
    last_seq: u64,
    /// The first write to stdout that failed: nothing more is shown, and
    /// the watch ends (a reader that went away, a full disk).
    unwritten: Option<std::io::Error>,
}

impl Shown {
    fn new(raw: bool) -> Shown {
        Shown {
            raw,
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
            status: None,
            last_seq: 0,
            unwritten: None,
        }
    }

    /// Writes one line unless a write already failed.
    fn write(&mut self, line: &str) {
        if self.unwritten.is_none()
            && let Err(e) = writeln!(self.out, "{line}")
        {
            self.unwritten = Some(e);
        }
    }

    /// One audit line. Only the lines shown (or ending a session) are
    /// parsed; the rest are told apart by their head.
    fn line(&mut self, line: &str) {
        let head = line_head(line);
        if let Some((seq, _)) = head {
            self.last_seq = seq;
        }
        let event = head.map(|(_, event)| event);
        if self.raw {
            self.write(line);
        }
        match event {
            Some("WorkflowResumed") => self.status = None,
            Some(e) if !SHOWN.contains(&e) => return,
            _ => {}
        }
        let v: Value = serde_json::from_str(line).unwrap_or(Value::Null);
        if v["event"] == "WorkflowExit" {
            self.status = v["status"].as_str().map(str::to_owned);
        }
        if !self.raw
            && let Some(text) = summary_line(&v)
        {
            self.write(&super::output::terminal_safe(&text));
        }
    }

    /// Flushes what was written; whether the watch should go on (no write
    /// has failed).
    fn flush(&mut self) -> bool {
        if self.unwritten.is_none()
            && let Err(e) = self.out.flush()
        {
            self.unwritten = Some(e);
        }
        self.unwritten.is_none()
    }

    /// The exit the run had: 0 ok, 130 cancelled, 1 failed or no end (said
    /// on stderr with `no_end`); 141 when the reader went away, 1 when
    /// stdout could not be written otherwise.
    fn exit(self, no_end: &str) -> Exit {
        self.ended().unwrap_or_else(|| {
            let _ = writeln!(std::io::stderr(), "{no_end}");
            Exit::RunFailed
        })
    }

    /// The exit of what was shown, `None` when it came to no end.
    fn ended(mut self) -> Option<Exit> {
        self.flush();
        if let Some(e) = self.unwritten.take() {
            if e.kind() == std::io::ErrorKind::BrokenPipe {
                return Some(Exit::ReaderGone);
            }
            let _ = writeln!(
                std::io::stderr(),
                "error: Store/WriteFailed: cannot write what the run said to stdout: {e}"
            );
            return Some(Exit::RunFailed);
        }
        match self.status.as_deref() {
            Some("ok") => Some(Exit::Ok),
            Some("cancelled") => Some(Exit::Interrupted),
            Some(_) => Some(Exit::RunFailed),
            None => None,
        }
    }
}

/// A line for the events a person watching wants: starts, ends, failures.
fn summary_line(v: &Value) -> Option<String> {
    let exec = v["stageExecutionId"].as_str().unwrap_or("");
    match v["event"].as_str()? {
        "WorkflowStarted" | "WorkflowResumed" => Some(format!(
            "run {} of {}: {}",
            v["workflowRunId"].as_str().unwrap_or("?"),
            v["pipeline"].as_str().unwrap_or("?"),
            v["event"].as_str().unwrap_or("")
        )),
        "StageExited" => Some(format!(
            "{exec}: {}{}",
            v["verdict"].as_str().unwrap_or("?"),
            v["reason"]
                .as_str()
                .map(|r| format!(" ({r})"))
                .unwrap_or_default()
        )),
        "StageCancelled" => Some(format!("{exec}: cancelled")),
        "InteractionRaised" => Some(match v["kind"].as_str() {
            Some("question") => format!(
                "{exec}: question waiting: {}",
                v["prompt"].as_str().unwrap_or("")
            ),
            Some("elicitation") => format!(
                "{exec}: MCP server {} asks a form",
                v["mcpServer"].as_str().unwrap_or("?")
            ),
            _ => format!(
                "{exec}: approval {} for {} waiting",
                v["proposalId"].as_str().unwrap_or("?"),
                v["tool"].as_str().unwrap_or("?")
            ),
        }),
        "WorkflowExit" => Some(format!(
            "run {}{}",
            v["status"].as_str().unwrap_or("?"),
            v["reason"]
                .as_str()
                .map(|r| format!(": {r}"))
                .unwrap_or_default()
        )),
        _ => None,
    }
}

/// `troupe answer`.
#[derive(Debug, Clone, clap::Args)]
pub struct QuestionArgs {
    #[command(flatten)]
    pub at: RunRef,
    /// The human step's execution (`troupe pending` lists the questions).
    pub execution: String,
    /// A field of the answer, `name=value` (a number, `true`/`false` or
    /// JSON is taken as such, anything else as text). Repeatable.
    #[arg(long = "field", value_name = "NAME=VALUE", conflicts_with = "json")]
    pub fields: Vec<String>,
    /// The whole answer as a JSON object in FILE (`-`: stdin).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// The name the audit log records for this answer.
    #[arg(long, default_value = "cli")]
    pub client: String,
}

/// Answers a human step's question; an answer that does not match its
/// fields is refused (exit 2) and the question stays open.
pub fn answer_question(args: &QuestionArgs) -> Exit {
    let content = match &args.json {
        Some(path) => {
            let text = if path.as_os_str() == "-" {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s);
                s
            } else {
                match std::fs::read_to_string(path) {
                    Ok(s) => s,
                    Err(e) => {
                        let _ = writeln!(
                            std::io::stderr(),
                            "error: Validation/InputInvalid: {}: {e}",
                            path.display()
                        );
                        return Exit::Invalid;
                    }
                }
            };
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => v,
                Err(e) => {
                    let _ = writeln!(
                        std::io::stderr(),
                        "error: Validation/InputInvalid: --json: {e}"
                    );
                    return Exit::Invalid;
                }
            }
        }
        None => {
            let mut object = serde_json::Map::new();
            for field in &args.fields {
                let Some((name, value)) = field.split_once('=') else {
                    let _ = writeln!(
                        std::io::stderr(),
                        "error: Validation/InputInvalid: --field {field}: use NAME=VALUE"
                    );
                    return Exit::Invalid;
                };
                let value = serde_json::from_str::<Value>(value)
                    .ok()
                    .filter(|v| !v.is_string())
                    .unwrap_or_else(|| Value::String(value.to_owned()));
                object.insert(name.to_owned(), value);
            }
            Value::Object(object)
        }
    };
    let (id, client) = match connect(&args.at) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    match block_on(client.answer_question(&id, &args.execution, &content, &args.client)) {
        Ok(_) => {
            tell!("answered {}", args.execution);
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

/// Lists the approvals and the questions waiting for an API answer.
pub fn pending(at: &RunRef, json: bool) -> Exit {
    let (id, client) = match connect(at) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    let questions = match block_on(client.questions(&id)) {
        Ok(q) => q,
        Err(e) => return failed(&e),
    };
    if !json {
        for q in &questions {
            // The prompt is templated from ctx (any client's) or a
            // model's words: shown, not obeyed.
            let shown = format!(
                "question {}  {}\n  fields: {}",
                q["stageExecutionId"].as_str().unwrap_or("?"),
                q["prompt"].as_str().unwrap_or(""),
                q["fields"]
            );
            tell!("{}", super::output::terminal_safe(&shown));
        }
    }
    match block_on(client.pending(&id)) {
        Ok(list) => {
            if json {
                tell!("{}", Value::Array(list));
            } else if list.is_empty() && questions.is_empty() {
                tell!("no approval or question is waiting for an answer through the API");
            } else {
                for p in list {
                    let line = format!(
                        "{}  {}  {} {}",
                        p["proposalId"].as_str().unwrap_or("?"),
                        p["stageId"].as_str().unwrap_or("?"),
                        p["tool"].as_str().unwrap_or("?"),
                        p["argsSummary"].as_str().unwrap_or("")
                    );
                    tell!("{}", super::output::terminal_safe(&line));
                    // A shortened summary: the whole arguments, so what is
                    // approved is what was seen.
                    if p["argsSummary"].as_str().is_some_and(|s| s.ends_with('…'))
                        && let Some(args) = p["args"].as_str()
                    {
                        tell!(
                            "    whole arguments: {}",
                            super::output::terminal_safe(args)
                        );
                    }
                }
            }
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

/// Answers one pending approval.
pub fn answer(args: &AnswerArgs, approve: bool) -> Exit {
    if !approve && (args.same || args.prefix) {
        let _ = writeln!(
            std::io::stderr(),
            "error: --same and --prefix remember approvals only"
        );
        return Exit::Invalid;
    }
    let answer = match (approve, args.same, args.prefix) {
        (true, true, _) => "approve-same",
        (true, _, true) => "approve-prefix",
        (true, _, _) => "approve",
        (false, _, _) => "deny",
    };
    let (id, client) = match connect(&args.at) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    match block_on(client.answer(&id, &args.proposal, answer, &args.client)) {
        Ok(_) => {
            tell!("{answer}: {}", args.proposal);
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

/// Cancels a run strictly, as Ctrl-C in its terminal would.
pub fn cancel(at: &RunRef) -> Exit {
    let (id, client) = match connect(at) {
        Ok(c) => c,
        Err(e) => return failed(&e),
    };
    match block_on(client.cancel(&id)) {
        Ok(_) => {
            tell!("cancelling {id}");
            Exit::Ok
        }
        Err(e) => failed(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// `watch` says what waits: a question, a server's form, an approval.
    #[test]
    fn a_raised_interaction_is_named_by_its_kind() {
        let raised = |extra: Value| {
            let mut v = json!({"event": "InteractionRaised", "stageExecutionId": "r/s/1"});
            v.as_object_mut()
                .unwrap()
                .extend(extra.as_object().unwrap().clone());
            summary_line(&v).unwrap_or_default()
        };
        assert_eq!(
            raised(json!({"kind": "question", "prompt": "Ship?"})),
            "r/s/1: question waiting: Ship?"
        );
        assert_eq!(
            raised(json!({"kind": "elicitation", "mcpServer": "fs"})),
            "r/s/1: MCP server fs asks a form"
        );
        assert_eq!(
            raised(json!({"kind": "grantStageTool", "proposalId": "p1", "tool": "Bash"})),
            "r/s/1: approval p1 for Bash waiting"
        );
    }
}
