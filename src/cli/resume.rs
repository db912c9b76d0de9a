//! `troupe resume <run-id>`: continues a run that did not finish (Ctrl-C,
//! a signal, `kill -9`, a power loss, a failed stage whose cause was
//! fixed). It takes the run's lock (two processes never resume one run),
//! reloads the pipeline and refuses it when its files changed (`--force`
//! overrides), restores the ctx and the stored results, repairs the audit
//! log (a torn last line, exits the log lost, executions the dead process
//! left open), and runs on: finished executions are not run again, and the
//! run keeps its `workflowRunId` and every `stageExecutionId`.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};

use super::Exit;
use super::launch::{Launch, Refusal, Resumed, execute, store_refusal};
use super::options::RunOptions;
use crate::definition::load_pipeline;
use crate::runtime::events::rfc3339;
use crate::runtime::result::{Kept, Verdict};
use crate::runtime::scheduler::Restore;
use crate::store::repair::{LostExit, repair, scan};
use crate::store::{RunLock, Store, StoreError, pipeline_digest};

/// Options of `troupe resume`.
#[derive(Debug, Clone, clap::Args)]
pub struct ResumeArgs {
    /// The run to continue: its id, or the start of it (`troupe runs`
    /// lists them).
    pub run_id: String,
    /// Resume even though the pipeline's files changed since the run
    /// started.
    #[arg(long)]
    pub force: bool,
    /// Resume it inside this `troupe serve` (`unix:PATH`, `http://HOST:PORT`;
    /// default `$TROUPE_SERVER`, else the project's server when one runs).
    #[arg(long, value_name = "URL")]
    pub server: Option<String>,
    /// Resume it in this process even when a `troupe serve` answers for
    /// the project (one that refuses the options this resume needs, say).
    #[arg(long, conflicts_with = "server")]
    pub local: bool,
    /// Resume a distributed run here, without the NATS workers it ran on:
    /// siblings they finished and reported meanwhile run again.
    #[arg(long, conflicts_with = "nats")]
    pub without_workers: bool,
    #[command(flatten)]
    pub opts: RunOptions,
}

pub fn run(args: ResumeArgs) -> Exit {
    let json = args.opts.json;
    if args.opts.no_store {
        return super::launch::input_invalid(
            Path::new(&args.run_id),
            "--no-store: a run is resumed from the store".to_owned(),
            json,
        );
    }
    if !args.local {
        match super::reach::server_for(args.server.as_deref(), &args.opts.runs_dir) {
            Ok(Some(server)) => return super::submit::resume_remote(&server, &args.run_id),
            Ok(None) => {}
            Err(e) => return super::control::failed(&e),
        }
    }
    // A signal during the repair below cancels the resumed run as it
    // starts, rather than ending the process half-way.
    let signals = super::signals::EarlyInterrupts::install("cancelling the run");
    match prepare(&args, &args.opts.store_path()) {
        Ok(launch) => execute(launch, &args.opts, Some(signals)),
        Err(refusal) => refusal.print(json),
    }
}

/// The run `args` names, checked and repaired, ready to go on.
pub fn prepare(args: &ResumeArgs, store_path: &Path) -> Result<Launch, Refusal> {
    prepare_from(args, store_path, None)
}

/// [`prepare`], its pipeline read from `checked` (the stored folder as a
/// caller resolved and checked it) when given: what was checked is what
/// is read.
pub fn prepare_from(
    args: &ResumeArgs,
    store_path: &Path,
    checked: Option<PathBuf>,
) -> Result<Launch, Refusal> {
    prepare_stored(args, store_path, checked).map_err(|e| match e {
        Stopped::Store(e) => store_refusal(&kept_without_store(e, args)),
        Stopped::Refused(r) => r,
    })
}

/// A run the store does not know whose folder is there, with its log:
/// one kept with `--no-store`, said as such.
fn kept_without_store(e: StoreError, args: &ResumeArgs) -> StoreError {
    let dir = args.opts.runs_dir.join(&args.run_id);
    match e {
        StoreError::RunNotFound { .. } if crate::auditlog::in_dir(&dir).is_file() => {
            StoreError::KeptWithoutStore {
                id: args.run_id.clone(),
                dir,
            }
        }
        e => e,
    }
}

enum Stopped {
    Store(StoreError),
    Refused(Refusal),
}

impl From<StoreError> for Stopped {
    fn from(e: StoreError) -> Stopped {
        Stopped::Store(e)
    }
}

fn prepare_stored(
    args: &ResumeArgs,
    store_path: &Path,
    checked: Option<PathBuf>,
) -> Result<Launch, Stopped> {
    // Nothing to resume where no store is: none is made.
    if crate::store::schema::open_if_made(store_path)?.is_none() {
        return Err(StoreError::RunNotFound {
            id: args.run_id.clone(),
            path: store_path.to_owned(),
        }
        .into());
    }
    let store = Store::open(store_path)?;
    let run = store.find_run(&args.run_id)?;
    if run.status == "ok" {
        return Err(StoreError::NothingToResume { id: run.id }.into());
    }
    let run_dir = PathBuf::from(&run.run_dir);
    // A row that names another folder (damaged, or edited by hand) is not
    // followed: the resume would write its events into another run's log,
    // or its log and lock into any folder at all.
    if run_dir.file_name() != Some(std::ffi::OsStr::new(&run.id)) {
        return Err(StoreError::NotARunFolder {
            id: run.id.clone(),
            path: run_dir,
            why: "a run's folder is named by its id, and the store names another (a damaged or edited row)".to_owned(),
        }
        .into());
    }
    // Its siblings went to workers over NATS: not run here by mistake.
    if args.opts.nats.nats.is_none()
        && !args.without_workers
        && let Ok(server) = std::fs::read_to_string(run_dir.join(crate::distributed::RUN_MARK))
    {
        return Err(StoreError::DistributedRun {
            id: run.id.clone(),
            server: crate::cli::output::terminal_safe(server.trim()).into_owned(),
        }
        .into());
    }
    // A folder moved or deleted would be made again with an empty log,
    // whose repair would number events from one again.
    if !run_dir.is_dir() {
        return Err(StoreError::Io {
            path: run_dir,
            detail: "the run's folder is gone (moved or deleted?); a resume needs its audit log, so nothing was resumed".to_owned(),
        }
        .into());
    }
    let lock = RunLock::acquire(&run_dir, &run.id)?;
    // Read again under the lock: the run's last process may have ended it
    // ok meanwhile, or `runs rm` removed it.
    let run = store.find_run(&run.id)?;
    if run.status == "ok" {
        return Err(StoreError::NothingToResume { id: run.id }.into());
    }
    let dir = checked.unwrap_or_else(|| PathBuf::from(&run.pipeline_dir));
    let pipeline = match load_pipeline(&dir) {
        Ok(p) => Arc::new(p),
        Err(diags) => {
            return Err(Stopped::Refused(Refusal::Diagnostics {
                path: dir.clone(),
                diags,
            }));
        }
    };
    let digest = pipeline_digest(&pipeline).map_err(|detail| StoreError::Io {
        path: dir.clone(),
        detail,
    })?;
    if digest != run.digest && !args.force {
        return Err(StoreError::PipelineChanged {
            id: run.id.clone(),
            dir: run.pipeline_dir.clone(),
            was: short(&run.digest),
            now: short(&digest),
        }
        .into());
    }
    let fields: Map<String, Value> = match &run.ctx {
        Value::Object(m) => m.clone(),
        _ => {
            return Err(StoreError::Corrupt {
                path: store_path.to_owned(),
                detail: format!(
                    "run `{}` has no readable ctx (its fields), so it cannot be resumed as it ran",
                    run.id
                ),
            }
            .into());
        }
    };
    let arrived = if args.opts.nats.nats.is_some() {
        store_arrived(&args.opts.nats, &run.id, &store)?
    } else {
        Vec::new()
    };
    let (results, spent) = store.resumable(&run.id)?;
    let audit = crate::auditlog::in_dir(&run_dir);
    if !audit.exists() {
        std::fs::write(&audit, b"").map_err(|e| StoreError::Io {
            path: audit.clone(),
            detail: e.to_string(),
        })?;
    }
    let scanned = scan(&audit).map_err(StoreError::from)?;
    // A result a worker reported while no coordinator read it goes into
    // the log with the events the worker recorded, not a bare recovery.
    // Both read the run's exited rows: a log that has every one (a run
    // stopped cleanly, the usual case) needs no second pass.
    let logged = results
        .keys()
        .filter(|id| scanned.exited.contains(&***id))
        .count();
    // Exits the log has and the store lost (a damaged `-wal` file, a disk
    // that dropped a commit): those executions run again, and their side
    // effects with them. Said, not silently repeated.
    let lost = scanned.exited.len().saturating_sub(logged);
    if lost > 0 {
        say!(
            "warning: Store/LostCommits: {lost} execution(s) whose StageExited (ok) is in the audit log of run {} are not in the store (their commits were lost): they run again",
            run.id
        );
    }
    let mut exits = if logged == results.len() {
        Vec::new()
    } else {
        store.exit_events(&run.id, |id| scanned.exited.contains(id))?
    };
    for exit in &mut exits {
        if let Some(found) = arrived.iter().find(|a| a.id == exit.id) {
            exit.lines.clone_from(&found.lines);
        }
    }
    let ts = rfc3339(std::time::SystemTime::now());
    let (repaired, scanned) =
        repair(&audit, scanned, &exits, &run.id, &ts).map_err(StoreError::from)?;
    if repaired.torn_cut || repaired.exits_restored > 0 || repaired.cancels_added > 0 {
        say!(
            "note: repaired the audit log of run {}: {}{} StageExited restored from the store, {} execution(s) the stopped process left open recorded as cancelled",
            run.id,
            if repaired.torn_cut {
                "its torn end made whole, "
            } else {
                ""
            },
            repaired.exits_restored,
            repaired.cancels_added
        );
    }
    let restore = Restore {
        resumed: true,
        results: Arc::new(results),
        turns_started: scanned.turns_started,
        turns_ended: scanned.turns_ended,
    };
    Ok(Launch {
        path: dir,
        pipeline,
        fields,
        resume: Some(Resumed {
            run,
            restore,
            last_seq: repaired.last_seq,
            spent,
            store,
            lock,
            digest,
        }),
    })
}

/// `sha256:0123456789ab…` for messages.
fn short(digest: &str) -> String {
    let cut = digest
        .char_indices()
        .nth(19)
        .map_or(digest.len(), |(i, _)| i);
    format!("{}…", &digest[..cut])
}

/// A distributed run: the results workers reported while no coordinator
/// read them are stored first, so the resumed run does not run them again.
/// Returns each with the events its worker recorded, for the log.
fn store_arrived(
    nats: &crate::distributed::NatsArgs,
    run_id: &str,
    store: &Store,
) -> Result<Vec<LostExit>, StoreError> {
    let io = |detail: String| StoreError::Io {
        path: store.path().to_owned(),
        detail,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| io(e.to_string()))?;
    // The connection lives until the acknowledgements are sent.
    let (connection, mut arrived) = runtime
        .block_on(async {
            let nats = nats.connect(&format!("troupe resume {run_id}")).await?;
            let arrived = crate::distributed::arrived::take_arrived(&nats, run_id).await?;
            Ok::<_, crate::distributed::NatsError>((nats, arrived))
        })
        .map_err(|e| io(format!("{}: {e}", crate::error::HasCode::code(&e))))?;
    if arrived.unreadable > 0 {
        say!(
            "warning: {} report(s) workers sent while the run had no coordinator could not be read; their siblings run again",
            arrived.unreadable
        );
    }
    // A report message delivered again (its coordinator was killed
    // between committing some of its results and acknowledging it) holds
    // results the store already has ok: those are not stored twice, so
    // what the run used is not counted twice either.
    let stored = if arrived.results.is_empty() {
        std::collections::HashMap::new()
    } else {
        store.kept_results(run_id)?
    };
    let fresh = not_stored_ok(&stored, arrived.results.iter().map(|(result, _)| result));
    if !fresh.is_empty() {
        let writer = crate::store::StoreWriter::start(store.path())?;
        let ledger = writer.ledger();
        for result in &fresh {
            crate::runtime::ledger::Ledger::persist(
                &ledger,
                crate::distributed::arrived::exit_record(run_id, result),
                None,
            );
        }
        writer.finish()?;
        say!(
            "note: {} result(s) workers reported while the run had no coordinator were stored",
            fresh.len()
        );
    }
    // Only now: a resume that failed to store them finds them again.
    let results = std::mem::take(&mut arrived.results);
    runtime.block_on(arrived.acknowledge());
    drop(connection);
    Ok(results
        .into_iter()
        .map(|(result, events)| LostExit {
            id: result.stage_execution_id().to_string(),
            lines: events,
        })
        .collect())
}

/// The results of `arrived` the store does not already have standing (ok
/// or skipped: what a resume does not run again).
fn not_stored_ok<'a>(
    stored: &std::collections::HashMap<Arc<str>, Kept>,
    arrived: impl Iterator<Item = &'a Kept>,
) -> Vec<&'a Kept> {
    arrived
        .filter(|result| {
            stored
                .get(result.stage_execution_id())
                .is_none_or(|kept| kept.verdict() == Verdict::Fail)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::result::StageResult;

    fn kept(id: &str, verdict: Verdict) -> Kept {
        let mut r = StageResult::ok("worker", id, serde_json::json!(null));
        r.verdict = verdict;
        Kept::Whole(Arc::new(r))
    }

    #[test]
    fn a_report_delivered_again_stores_only_what_the_store_lacks_ok() {
        let stored: std::collections::HashMap<Arc<str>, Kept> = [
            ("r/worker#0/1", Verdict::Ok),
            ("r/worker#1/1", Verdict::Fail),
            ("r/worker#3/1", Verdict::Skipped),
        ]
        .into_iter()
        .map(|(id, v)| (Arc::from(id), kept(id, v)))
        .collect();
        let arrived = [
            kept("r/worker#0/1", Verdict::Ok),
            kept("r/worker#1/1", Verdict::Ok),
            kept("r/worker#2/1", Verdict::Ok),
            kept("r/worker#3/1", Verdict::Skipped),
        ];
        let fresh: Vec<&str> = not_stored_ok(&stored, arrived.iter())
            .into_iter()
            .map(Kept::stage_execution_id)
            .collect();
        assert_eq!(fresh, ["r/worker#1/1", "r/worker#2/1"]);
    }
}
