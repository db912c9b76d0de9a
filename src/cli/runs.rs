//! `troupe runs`: browse the run store — list runs, show one (per-stage
//! verdicts, retries, cap hits, usage, StageResults, cancelled
//! executions and where they were, the failure that stopped it), export
//! its audit log, delete runs, and collect old ones.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use serde::Serialize;
use serde_json::{Value, json};

mod show;

use super::Exit;
use super::launch::store_failed;
use super::options::{find_run_folder, store_path};
use crate::auditlog;
use crate::definition::duration::parse_positive_duration;
use crate::error::HasCode;
use crate::runtime::events::rfc3339;
use crate::store::lock::is_held;
use crate::store::{Counts, RunLock, RunRow, Store, StoreError, unix_ms};

/// Where the store is, for every `runs` command.
#[derive(Debug, Clone, clap::Args)]
pub struct StoreArgs {
    /// The run store [default: troupe.db beside --runs-dir].
    #[arg(long, value_name = "FILE", global = true)]
    pub store: Option<PathBuf>,
    /// The runs folder (locates the default store; `export` and `tail` also
    /// find a run kept with `--no-store` there by its id).
    #[arg(
        long,
        value_name = "DIR",
        default_value = ".troupe/runs",
        global = true
    )]
    pub runs_dir: PathBuf,
    /// Print JSON on stdout.
    #[arg(long, global = true)]
    pub json: bool,
}

/// `troupe runs` and its commands.
#[derive(Debug, Clone, clap::Args)]
pub struct RunsArgs {
    #[command(subcommand)]
    pub command: Option<RunsCommand>,
    /// Most runs listed, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..))]
    pub limit: u32,
    #[command(flatten)]
    pub store: StoreArgs,
}

#[derive(Debug, Clone, clap::Subcommand)]
pub enum RunsCommand {
    /// One run: status, per-stage verdicts, retries, cap hits, usage, the
    /// fan-outs, the cancelled executions and where they were, the failure
    /// that stopped it, and every StageResult.
    Show {
        /// The run's id (or the start of it).
        run_id: String,
        /// Only this stage's executions and results: ID, or ID#INDEX for
        /// one sibling.
        #[arg(long, value_name = "ID[#INDEX]")]
        stage: Option<String>,
    },
    /// Write the run's audit log as JSON lines (stdout, or --output):
    /// the log on disk is compressed binary records, this is its text,
    /// byte for byte what an uncompressed log would hold.
    Export {
        /// The run's id (or the start of it).
        run_id: String,
        /// Write the lines into FILE instead (not inside the run's folder).
        #[arg(long, short, value_name = "FILE")]
        output: Option<PathBuf>,
    },
    /// Print the last events of a run's audit log as JSON lines; with
    /// --follow, keep printing them as the run writes them, until it ends.
    /// Works on the log itself: no `troupe serve` and no socket needed.
    Tail {
        /// The run's id (or the start of it).
        run_id: String,
        /// How many of the last events to print first.
        #[arg(long, short = 'n', default_value_t = 10, value_name = "N")]
        lines: usize,
        /// Follow the run until it ends (or its process is gone).
        #[arg(long, short)]
        follow: bool,
    },
    /// Delete runs: their rows in the store and their folders.
    Rm {
        /// The runs' ids (or the start of each).
        #[arg(required = true)]
        run_ids: Vec<String>,
    },
    /// Delete every run that started longer ago than --older-than (not
    /// one still running).
    Gc {
        /// e.g. 7d, 12h, 30m.
        #[arg(long, value_name = "DURATION", value_parser = parse_age)]
        older_than: Duration,
        /// List what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

fn parse_age(s: &str) -> Result<Duration, String> {
    if let Some(days) = s.strip_suffix('d') {
        let n: u64 = days
            .trim()
            .parse()
            .map_err(|_| format!("`{s}` is not a duration such as 7d, 12h or 30m"))?;
        if n == 0 {
            return Err(
                "`0d` would delete every run that is not running; give an age above 0".into(),
            );
        }
        return Ok(Duration::from_secs(n.saturating_mul(86_400)));
    }
    // An age may be in days too, which the durations elsewhere are not.
    parse_positive_duration(s).map_err(|e| {
        if e.contains("needs a unit") {
            format!("`{s}` needs a unit: d, h, m, s or ms (e.g. 7d)")
        } else {
            e
        }
    })
}

pub fn run(args: RunsArgs) -> Exit {
    let json = args.store.json;
    let path = store_path(args.store.store.as_deref(), &args.store.runs_dir);
    let done = match args.command {
        None => list(&path, args.limit as usize, json),
        Some(RunsCommand::Show { run_id, stage }) => {
            show::show(&path, &run_id, stage.as_deref(), json)
        }
        Some(RunsCommand::Export { run_id, output }) => {
            find_run_folder(&path, &args.store.runs_dir, &run_id)
                .and_then(|run| export(&run.dir, output.as_deref()))
        }
        Some(RunsCommand::Tail {
            run_id,
            lines,
            follow,
        }) => find_run_folder(&path, &args.store.runs_dir, &run_id)
            .and_then(|run| tail(&run.dir, lines, follow)),
        Some(RunsCommand::Rm { run_ids }) => remove(&path, &run_ids, json),
        Some(RunsCommand::Gc {
            older_than,
            dry_run,
        }) => gc(&path, older_than, dry_run, json),
    };
    match done {
        Ok(exit) => exit,
        Err(e) => store_failed(&e, json),
    }
}

/// A run's status as people read it: a `running` run whose process is
/// gone was `interrupted`.
pub fn status_of(run: &RunRow) -> &str {
    if run.status == "running" && !is_held(Path::new(&run.run_dir)) {
        "interrupted"
    } else {
        &run.status
    }
}

fn when(ms: i64) -> String {
    let t = SystemTime::UNIX_EPOCH + Duration::from_millis(u64::try_from(ms).unwrap_or(0));
    let s = rfc3339(t);
    // 2026-11-23T18:52:01.123456Z → 2026-11-23 18:52:01
    s.get(..19).map_or(s.clone(), |d| d.replacen('T', " ", 1))
}

/// How long the run ran: until its end, or for one still running until
/// now. An interrupted run (its process gone without an end) ran until
/// its log was last written, not until now.
fn duration(run: &RunRow) -> String {
    let end = run.ended_at.unwrap_or_else(|| {
        let now = unix_ms(SystemTime::now());
        if status_of(run) != "interrupted" {
            return now;
        }
        let log = Path::new(&run.run_dir).join(crate::auditlog::FILE);
        std::fs::metadata(&log)
            .or_else(|_| std::fs::metadata(&run.run_dir))
            .and_then(|m| m.modified())
            .map_or(run.started_at, unix_ms)
            .min(now)
    });
    crate::runtime::summary::human_duration(Duration::from_millis(
        u64::try_from((end - run.started_at).max(0)).unwrap_or(0),
    ))
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Listed<'a> {
    #[serde(flatten)]
    run: &'a RunRow,
    state: &'a str,
    /// `null` when the run's records cannot be read (`error` says why).
    counts: Option<Counts>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

fn list(path: &Path, limit: usize, json: bool) -> Result<Exit, StoreError> {
    let Some(store) = Store::open_if_made(path)? else {
        if json {
            tell!(
                "{}",
                serde_json::to_string_pretty(&json!({ "runs": [] })).unwrap_or_default()
            );
        } else {
            tell!("no runs yet ({} holds no store)", path.display());
        }
        return Ok(Exit::Ok);
    };
    let runs = store.list_runs(limit)?;
    if json {
        let listed: Vec<Listed<'_>> = runs
            .iter()
            .map(|(run, counts)| Listed {
                run,
                state: status_of(run),
                counts: counts.as_ref().ok().copied(),
                error: counts
                    .as_ref()
                    .err()
                    .map(|e| json!({ "code": e.code().to_string(), "message": e.to_string() })),
            })
            .collect();
        tell!(
            "{}",
            serde_json::to_string_pretty(&json!({ "runs": listed })).unwrap_or_default()
        );
        return Ok(Exit::Ok);
    }
    tell!(
        "{:<36}  {:<16} {:<11} {:<19} {:>9}  {:>7} {:>6} {:>9}",
        "run",
        "pipeline",
        "status",
        "started (UTC)",
        "duration",
        "ok",
        "failed",
        "cancelled"
    );
    for (run, counts) in &runs {
        let [ok, failed, cancelled] = match counts {
            Ok(c) => [c.ok + c.skipped, c.failed, c.cancelled].map(|n| n.to_string()),
            Err(_) => ["?", "?", "?"].map(str::to_owned),
        };
        tell!(
            "{:<36}  {:<16} {:<11} {:<19} {:>9}  {:>7} {:>6} {:>9}",
            run.id,
            run.pipeline_id,
            status_of(run),
            when(run.started_at),
            duration(run),
            ok,
            failed,
            cancelled
        );
    }
    for (run, counts) in &runs {
        if let Err(e) = counts {
            say!("warning: run {}: {}: {e}", run.id, e.code());
        }
    }
    if runs.is_empty() {
        tell!("(no runs in {})", path.display());
    }
    Ok(Exit::Ok)
}

/// Says so when a repair that did not finish (killed, or the disk full)
/// set the log's last segment aside: its events are not in the log until
/// a resume puts them back.
fn warn_set_aside(log: &Path) {
    let saved = auditlog::saved_tail_path(log);
    if saved.exists() {
        say!(
            "warning: the log's last segment is set aside in {} by a repair that did not finish; its events are not in this output until `troupe resume` puts them back",
            saved.display()
        );
    }
}

fn export(dir: &Path, output: Option<&Path>) -> Result<Exit, StoreError> {
    let log = auditlog::in_dir(dir);
    warn_set_aside(&log);
    if let Some(output) = output {
        super::options::refuse_output_in_run_folder(output, dir)?;
    }
    // The log first: a run without one leaves no empty --output behind.
    auditlog::open_log(&log, false).map_err(|source| {
        if source.kind() == std::io::ErrorKind::NotFound {
            StoreError::LogMissing { path: log.clone() }
        } else {
            auditlog::AuditError::Io {
                path: log.clone(),
                source,
            }
            .into()
        }
    })?;
    let mut sink: Box<dyn Write> = match output {
        Some(p) => Box::new(std::io::BufWriter::new(std::fs::File::create(p).map_err(
            |e| StoreError::Io {
                path: p.to_owned(),
                detail: e.to_string(),
            },
        )?)),
        None => Box::new(std::io::BufWriter::new(std::io::stdout().lock())),
    };
    // Whole lines only: a torn end (a killed process) is not an event.
    // Segments are decoded on up to four threads, written in order (each
    // holds a segment's lines, about 8 MiB, while it waits its turn).
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let written = auditlog::export_lines(&log, &mut sink, threads)
        .and_then(|()| sink.flush().map_err(auditlog::ExportError::Write));
    match written {
        Ok(()) => Ok(Exit::Ok),
        Err(auditlog::ExportError::Read(e)) => Err(e.into()),
        // A reader that went away (`runs export … | head`) ends the
        // export as it ends any Unix tool's output.
        Err(auditlog::ExportError::Write(e)) if e.kind() == std::io::ErrorKind::BrokenPipe => {
            Ok(Exit::ReaderGone)
        }
        Err(auditlog::ExportError::Write(e)) => Err(StoreError::Io {
            path: output.map_or_else(|| PathBuf::from("stdout"), Path::to_owned),
            detail: e.to_string(),
        }),
    }
}

/// File bytes `runs tail` reads at once.
const TAIL_READ: usize = 1 << 20;

/// How often `runs tail --follow` looks for more.
const TAIL_POLL: Duration = Duration::from_millis(50);

/// Reads `follower` to the log's end: its last `lines` lines, how many it
/// read, and whether the last was the run's end.
fn last_lines(
    follower: &mut auditlog::Follower,
    lines: usize,
) -> Result<(std::collections::VecDeque<Vec<u8>>, usize, bool), StoreError> {
    let mut last = std::collections::VecDeque::new();
    let mut batch = Vec::new();
    let (mut seen, mut exited) = (0, false);
    loop {
        let n = follower.read_more(TAIL_READ, &mut batch)?;
        for line in batch.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            seen += 1;
            exited = is_exit(line);
            if lines > 0 {
                if last.len() == lines {
                    last.pop_front();
                }
                last.push_back(line.to_vec());
            }
        }
        batch.clear();
        if n < TAIL_READ {
            return Ok((last, seen, exited));
        }
    }
}

/// `runs tail`: the last `lines` events of the run's log; with `follow`,
/// then every event it gets until the run ends (its `WorkflowExit` with no
/// process left running it) or its process is gone.
fn tail(dir: &Path, lines: usize, follow: bool) -> Result<Exit, StoreError> {
    let gone = std::cell::Cell::new(false);
    let tailed = tail_into(dir, lines, follow, &gone);
    // A reader that went away (`runs tail … | head`) ends the tail as it
    // ends any Unix tool's output.
    if gone.get() {
        return Ok(Exit::ReaderGone);
    }
    tailed
}

/// [`tail`]; `gone` is set when stdout's reader went away.
fn tail_into(
    dir: &Path,
    lines: usize,
    follow: bool,
    gone: &std::cell::Cell<bool>,
) -> Result<Exit, StoreError> {
    let log = auditlog::in_dir(dir);
    warn_set_aside(&log);
    // No log, and no process that could yet write one (a run starting,
    // which `--follow` waits for): it is gone, not empty.
    let may_come = follow && is_held(dir);
    if !log.exists() && !may_come {
        return Err(StoreError::LogMissing { path: log });
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let io = |e: std::io::Error| {
        gone.set(e.kind() == std::io::ErrorKind::BrokenPipe);
        StoreError::Io {
            path: PathBuf::from("stdout"),
            detail: e.to_string(),
        }
    };
    // What is there now: the last `lines` of it, decoded from the last
    // segments that hold them rather than from the log's first byte. Too
    // few lines: start twice as many segments back, so a log of small
    // segments (formatter threads write 512 lines each) is decoded about
    // twice at most, not once per step.
    let starts = if log.exists() && !auditlog::is_plain(&log) {
        auditlog::segment_starts(&log)?
    } else {
        Vec::new()
    };
    let mut from = starts.len().saturating_sub(1);
    let mut step = 1;
    let (mut follower, last, mut exited) = loop {
        let mut follower = match starts.get(from) {
            Some(at) => auditlog::Follower::at_segment(&log, *at)?,
            None => auditlog::Follower::new(&log),
        };
        let (last, seen, exited) = last_lines(&mut follower, lines)?;
        if seen >= lines || from == 0 {
            break (follower, last, exited);
        }
        from = from.saturating_sub(step);
        step *= 2;
    };
    let mut batch = Vec::new();
    for line in &last {
        out.write_all(line)
            .and_then(|()| out.write_all(b"\n"))
            .map_err(io)?;
    }
    out.flush().map_err(io)?;
    if !follow {
        return Ok(Exit::Ok);
    }
    loop {
        let running = is_held(dir);
        let n = follower.read_more(TAIL_READ, &mut batch)?;
        for line in batch.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            exited = is_exit(line);
            out.write_all(line)
                .and_then(|()| out.write_all(b"\n"))
                .map_err(io)?;
        }
        batch.clear();
        if n > 0 {
            out.flush().map_err(io)?;
            continue;
        }
        // Nothing new, and no process was running it before this look:
        // everything it wrote has been read.
        if !running {
            if !exited {
                say!(
                    "note: the run is not running and its log has no end: it was killed (`troupe resume {}` continues it)",
                    dir.file_name().unwrap_or_default().to_string_lossy()
                );
            }
            return Ok(Exit::Ok);
        }
        std::thread::sleep(TAIL_POLL);
    }
}

/// Whether an audit line is a `WorkflowExit` (from the head every line
/// the writer makes begins with).
fn is_exit(line: &[u8]) -> bool {
    std::str::from_utf8(line)
        .ok()
        .and_then(crate::control::line_head)
        .is_some_and(|(_, event)| event == "WorkflowExit")
}

fn remove(path: &Path, ids: &[String], json: bool) -> Result<Exit, StoreError> {
    // Cleaning up makes no store where there is none.
    if crate::store::schema::open_if_made(path)?.is_none() {
        return Err(StoreError::RunNotFound {
            id: ids.first().cloned().unwrap_or_default(),
            path: path.to_owned(),
        });
    }
    let store = Store::open(path)?;
    let mut removed = Vec::new();
    for id in ids {
        // What was removed before a failure is still said.
        let gone = store
            .find_run(id)
            .and_then(|run| delete(&store, &run).map(|()| run.id));
        match gone {
            Ok(id) => removed.push(id),
            Err(e) => {
                // Said only when some went: --json prints one document.
                if !removed.is_empty() {
                    report_removed(&removed, json);
                }
                return Err(e);
            }
        }
    }
    report_removed(&removed, json);
    Ok(Exit::Ok)
}

/// Whether a run's folder may be deleted: no process holds it, and it is
/// a run folder, named by the run's id. A damaged or hand-edited row
/// naming `.` or a home folder is refused rather than followed.
fn deletable(run: &RunRow) -> Result<&Path, StoreError> {
    let dir = Path::new(&run.run_dir);
    if dir.file_name() != Some(std::ffi::OsStr::new(&run.id)) {
        return Err(StoreError::NotARunFolder {
            id: run.id.clone(),
            path: dir.to_owned(),
            why: "a run's folder is named by its id, and the store names another (a damaged or edited row)".to_owned(),
        });
    }
    if is_held(dir) {
        return Err(StoreError::RunBusy { id: run.id.clone() });
    }
    // Rows of older troupes hold the folder relative to where the run
    // started: not found from here, a run still marked running may be
    // live.
    if dir.is_relative() && run.status == "running" && !dir.exists() {
        return Err(StoreError::NotARunFolder {
            id: run.id.clone(),
            path: dir.to_owned(),
            why: "it is marked running and its folder, relative to where it started, is not found from here (a row of an older troupe); run this from that folder".to_owned(),
        });
    }
    Ok(dir)
}

/// Deletes a run that no process is running: its rows, then its folder,
/// holding the run's lock throughout, so that a `resume` cannot take the
/// run between the check and the delete.
fn delete(store: &Store, run: &RunRow) -> Result<(), StoreError> {
    let dir = deletable(run)?;
    let _held = if dir.is_dir() {
        Some(RunLock::acquire(dir, &run.id)?)
    } else {
        None
    };
    store.delete_run(&run.id)?;
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(StoreError::Io {
            path: dir.to_owned(),
            detail: e.to_string(),
        }),
    }
}

fn report_removed(removed: &[String], json: bool) {
    if json {
        tell!("{}", json!({ "removed": removed }));
    } else {
        for id in removed {
            tell!("removed {id}");
        }
    }
}

fn gc(path: &Path, older_than: Duration, dry_run: bool, json: bool) -> Result<Exit, StoreError> {
    let cutoff =
        unix_ms(SystemTime::now()) - i64::try_from(older_than.as_millis()).unwrap_or(i64::MAX);
    let mut removed = Vec::new();
    // Cleaning up makes no store where there is none: nothing to delete.
    if crate::store::schema::open_if_made(path)?.is_some() {
        let store = Store::open(path)?;
        for run in store.runs_started_before(cutoff)? {
            // Running, or not a folder troupe may delete: left alone.
            if deletable(&run).is_err() {
                continue;
            }
            if !dry_run && let Err(e) = delete(&store, &run) {
                if !removed.is_empty() {
                    report_removed(&removed, json);
                }
                return Err(e);
            }
            removed.push(run.id);
        }
    }
    if dry_run {
        if json {
            tell!("{}", json!({ "wouldRemove": removed }));
        } else {
            for id in &removed {
                tell!("would remove {id}");
            }
        }
    } else {
        report_removed(&removed, json);
    }
    Ok(Exit::Ok)
}
