//! The options `troupe run` and `troupe resume` share: caps, the scripted
//! provider's knobs, output, the project root and where runs are kept,
//! interactors, limits, threads, the shell sandbox and the provider.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::limits::LimitArgs;
use super::provider::ProviderArgs;
use crate::definition::duration::parse_duration;
use crate::provider::selector::Selector;
use crate::tools::sandbox::check_env_name;

/// The options of a run (new or resumed).
#[derive(Debug, Clone, clap::Args)]
pub struct RunOptions {
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
    /// Where run folders (with their audit logs) are written.
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
    /// on [default: one per core up to 4 cores; on more, the cores less
    /// those the run's own threads use: 9 on 16]; the scheduler, the audit
    /// writer and the store have their own.
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
    /// Also put approvals to the control API's clients (`troupe pending`,
    /// `troupe approve` / `deny` from another terminal or program); the
    /// first answer from anyone wins. Without it the run is still watched
    /// and cancelled through its socket.
    #[arg(long)]
    pub remote: bool,
    /// `deny`: no Bash call and no sandboxed MCP server of the run may
    /// open a TCP connection (Landlock's network rules, kernel ABI 4; the
    /// run refuses to start where the kernel lacks them). A stage can say
    /// the same for its own shells with `network: deny` in its frontmatter.
    #[arg(long, value_name = "allow|deny", default_value = "allow", value_parser = ["allow", "deny"], conflicts_with = "no_sandbox")]
    pub network: String,
    /// The run store (SQLite) [default: troupe.db beside --runs-dir, i.e.
    /// .troupe/troupe.db]: every run, stage execution and StageResult,
    /// for `troupe runs`, `troupe resume` and `troupe report`.
    #[arg(long, value_name = "FILE")]
    pub store: Option<PathBuf>,
    /// Keep no run store: results live in memory and the audit log only,
    /// and the run cannot be resumed.
    #[arg(long, conflicts_with = "store")]
    pub no_store: bool,
    /// Export the run as an OpenTelemetry trace over OTLP/HTTP to this
    /// collector (e.g. http://127.0.0.1:4318; `/v1/traces` is added)
    /// [default: $OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else
    /// $OTEL_EXPORTER_OTLP_ENDPOINT, else none].
    #[arg(long, value_name = "URL")]
    pub otlp: Option<String>,
    /// Also export tool calls' arguments (they may hold secrets).
    #[arg(long)]
    pub otlp_content: bool,
    #[command(flatten)]
    pub nats: crate::distributed::NatsArgs,
    #[command(flatten)]
    pub limits: LimitArgs,
    #[command(flatten)]
    pub provider: ProviderArgs,
}

impl RunOptions {
    /// Where the run store is: `--store`, else `troupe.db` beside the runs
    /// folder.
    pub fn store_path(&self) -> PathBuf {
        store_path(self.store.as_deref(), &self.runs_dir)
    }
}

/// A run's folder, and the pipeline folder it ran where the store says.
#[derive(Debug)]
pub struct RunFolder {
    pub dir: PathBuf,
    pub pipeline: Option<PathBuf>,
}

/// Refuses an output path inside the run folder `dir`: a report or an
/// export written there would replace the log being read (truncated
/// before it was read, or renamed over it), or sit among troupe's files.
/// A link is judged by where it leads; a path that does not exist yet by
/// its folder.
pub fn refuse_output_in_run_folder(
    output: &Path,
    dir: &Path,
) -> Result<(), crate::store::StoreError> {
    let Ok(dir) = std::fs::canonicalize(dir) else {
        return Ok(());
    };
    let resolved = std::fs::canonicalize(output).ok().or_else(|| {
        let parent = match output.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        Some(
            std::fs::canonicalize(parent)
                .ok()?
                .join(output.file_name()?),
        )
    });
    match resolved {
        Some(at) if at.starts_with(&dir) => Err(crate::store::StoreError::OutputInRunFolder {
            path: output.to_owned(),
            dir,
        }),
        _ => Ok(()),
    }
}

/// Where run `id` is: where the run store at `store` says (it takes an id
/// prefix), or, for a run kept with `--no-store` or a store that lacks
/// it, the folder of that exact name in `runs_dir` when it holds an audit
/// log. Else the store's refusal.
pub fn find_run_folder(
    store: &Path,
    runs_dir: &Path,
    id: &str,
) -> Result<RunFolder, crate::store::StoreError> {
    match crate::store::Store::open_read_only(store).and_then(|s| s.find_run(id)) {
        Ok(run) => Ok(RunFolder {
            dir: PathBuf::from(run.run_dir),
            pipeline: Some(PathBuf::from(run.pipeline_dir)),
        }),
        Err(e) => {
            let dir = runs_dir.join(id);
            let plain_name = Path::new(id).file_name() == Some(std::ffi::OsStr::new(id));
            if plain_name && crate::auditlog::in_dir(&dir).exists() {
                Ok(RunFolder {
                    dir,
                    pipeline: None,
                })
            } else {
                Err(e)
            }
        }
    }
}

/// `store`, else `troupe.db` in the folder that holds `runs_dir`.
pub fn store_path(store: Option<&Path>, runs_dir: &Path) -> PathBuf {
    match store {
        Some(p) => p.to_owned(),
        None => runs_dir
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."))
            .join("troupe.db"),
    }
}

/// `--root`, made canonical; the message when it names no directory.
pub fn project_root(root: &Path) -> Result<PathBuf, String> {
    match std::fs::canonicalize(root) {
        Ok(r) if r.is_dir() => Ok(r),
        Ok(_) | Err(_) => Err(format!("--root {} is not a directory", root.display())),
    }
}
