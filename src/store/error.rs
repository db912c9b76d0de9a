//! The run store's errors, each a stable `Store/<Code>` with a message
//! that names the file and says what to do.

use std::path::{Path, PathBuf};

use crate::error::{Code, ErrorClass, HasCode};

/// Why the run store cannot do what was asked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The file is not a SQLite database, or SQLite finds it damaged.
    #[error("{path} is not a readable troupe store: {detail}")]
    Corrupt { path: PathBuf, detail: String },
    /// A SQLite database, but not troupe's.
    #[error("{path} is a SQLite database of another program (it has no troupe tables)")]
    Foreign { path: PathBuf },
    /// Written by a newer troupe.
    #[error("{path} has store schema {found}; this troupe reads schema {supported} and older")]
    NewerSchema {
        path: PathBuf,
        found: i64,
        supported: i64,
    },
    /// Another process holds the database (or the run) longer than troupe
    /// waits.
    #[error("{what} is locked by another troupe process")]
    Locked { what: String },
    /// The disk is full.
    #[error("the disk holding {path} is full: {detail}")]
    DiskFull { path: PathBuf, detail: String },
    /// No run with this id.
    #[error("no run `{id}` in {path}")]
    RunNotFound { id: String, path: PathBuf },
    /// Several runs start with this id prefix.
    #[error("`{prefix}` matches several runs: {matches}")]
    AmbiguousRun { prefix: String, matches: String },
    /// The run is being run or resumed by a live process.
    #[error("run `{id}` is being run by another troupe process")]
    RunBusy { id: String },
    /// The pipeline's files changed since the run started.
    #[error("the pipeline in {dir} changed since run `{id}` started ({was} then, {now} now)")]
    PipelineChanged {
        id: String,
        dir: String,
        was: String,
        now: String,
    },
    /// The run's siblings went to NATS workers, and a resume without
    /// `--nats` would run them here.
    #[error(
        "run `{id}` was distributed over NATS ({server}): resumed without --nats, it would run here what its workers may have finished, and leave the results they reported meanwhile on the server"
    )]
    DistributedRun { id: String, server: String },
    /// The run was kept without a store (`--no-store`): its folder has
    /// its log, and a run is resumed from the store.
    #[error(
        "run `{id}` was kept without a store (--no-store): its folder {dir} has its log, but a run is resumed from the store"
    )]
    KeptWithoutStore { id: String, dir: PathBuf },
    /// The run has nothing left to do.
    #[error("run `{id}` already ended ok; there is nothing to resume")]
    NothingToResume { id: String },
    /// A run's audit log cannot be read: not troupe's, from a newer
    /// troupe, or damaged (`detail` names the file and the byte).
    #[error("{detail}")]
    AuditCorrupt { detail: String },
    /// The run's row names a folder troupe will not delete or resume into:
    /// not one named by the run's id, or one it cannot tell is not live.
    #[error("will not use {path} as run `{id}`'s folder: {why}")]
    NotARunFolder {
        id: String,
        path: PathBuf,
        why: String,
    },
    /// An output (`runs export --output`, a report's file) would be
    /// written inside the run's own folder, over its log or beside it.
    #[error("will not write {path}: it is inside the folder of the run being read ({dir})")]
    OutputInRunFolder { path: PathBuf, dir: PathBuf },
    /// The run's folder is where the store says, its audit log is not
    /// (moved or deleted).
    #[error("the audit log {path} is gone (moved or deleted?)")]
    LogMissing { path: PathBuf },
    /// There is no store at the path (nothing has run here yet).
    #[error("no store at {path} yet (a `troupe run` creates it)")]
    NoStore { path: PathBuf },
    /// Any other failure to read or write one of the files troupe keeps
    /// (the store, a run's log, a report's output).
    #[error("cannot use {path}: {detail}")]
    Io { path: PathBuf, detail: String },
}

impl StoreError {
    /// What to do about it.
    pub fn hint(&self) -> String {
        match self {
            StoreError::Corrupt { path, .. } | StoreError::Foreign { path } => format!(
                "move {} aside (troupe starts a new store) or point --store at another file",
                path.display()
            ),
            StoreError::NewerSchema { .. } => {
                "upgrade troupe, or point --store at another file".to_owned()
            }
            StoreError::Locked { .. } => {
                "wait for the other troupe to finish its write, then try again".to_owned()
            }
            StoreError::DiskFull { .. } => "free disk space, then resume the run".to_owned(),
            StoreError::RunNotFound { .. } | StoreError::AmbiguousRun { .. } => {
                "`troupe runs` lists the runs".to_owned()
            }
            StoreError::RunBusy { .. } => {
                "wait for it to end (`troupe runs` shows it running)".to_owned()
            }
            StoreError::PipelineChanged { .. } => "restore the pipeline's files, or pass --force to resume with them as they are now (finished executions are still not run again)".to_owned(),
            StoreError::NothingToResume { .. } => {
                "`troupe runs show` shows its results; start a new run with `troupe run`".to_owned()
            }
            StoreError::KeptWithoutStore { .. } => "`troupe runs export <run>` and `troupe report <run>` still read its log; `troupe run` starts it again".to_owned(),
            StoreError::DistributedRun { server, .. } => format!(
                "resume it with --nats {server}, or pass --without-workers to run what is left here"
            ),
            StoreError::Io { .. } => "check the path and its permissions".to_owned(),
            StoreError::OutputInRunFolder { .. } => "write it outside the run's folder: that folder is troupe's, and its log is what is being read".to_owned(),
            StoreError::NoStore { .. } => "run from the project's folder, or point --store (or --runs-dir) at its store".to_owned(),
            StoreError::LogMissing { .. } => "the run's results are still in the store: `troupe runs show <run>` prints them".to_owned(),
            StoreError::NotARunFolder { .. } => "nothing was deleted or written; delete the folder by hand if it is the run's".to_owned(),
            StoreError::AuditCorrupt { .. } => "the log's lines before the damage are intact: `troupe runs export <run>` prints them (a torn end, from a killed process, is not damage: resume repairs it); to resume anyway, keep that export and move the log aside: the resumed run's log begins again from what the store holds".to_owned(),
        }
    }

    /// Maps a SQLite error on `path` to its typed error.
    pub fn sqlite(path: &Path, e: &rusqlite::Error) -> StoreError {
        use rusqlite::ErrorCode;
        let path = path.to_owned();
        let detail = e.to_string();
        match e.sqlite_error_code() {
            Some(ErrorCode::NotADatabase | ErrorCode::DatabaseCorrupt) => {
                StoreError::Corrupt { path, detail }
            }
            Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked) => StoreError::Locked {
                what: path.display().to_string(),
            },
            Some(ErrorCode::DiskFull) => StoreError::DiskFull { path, detail },
            _ => StoreError::Io { path, detail },
        }
    }
}

impl HasCode for StoreError {
    fn code(&self) -> Code {
        let name = match self {
            StoreError::Corrupt { .. } => "Corrupt",
            StoreError::Foreign { .. } => "ForeignFile",
            StoreError::NewerSchema { .. } => "NewerSchema",
            StoreError::Locked { .. } => "Locked",
            StoreError::DiskFull { .. } => "DiskFull",
            StoreError::RunNotFound { .. } => "RunNotFound",
            StoreError::AmbiguousRun { .. } => "AmbiguousRun",
            StoreError::RunBusy { .. } => "RunBusy",
            StoreError::PipelineChanged { .. } => "PipelineChanged",
            StoreError::NothingToResume { .. } => "NothingToResume",
            StoreError::DistributedRun { .. } => "DistributedRun",
            StoreError::KeptWithoutStore { .. } => "KeptWithoutStore",
            StoreError::Io { .. } => "WriteFailed",
            StoreError::OutputInRunFolder { .. } => "OutputInRunFolder",
            StoreError::NoStore { .. } => "NoStore",
            StoreError::LogMissing { .. } => "LogMissing",
            StoreError::NotARunFolder { .. } => "NotARunFolder",
            StoreError::AuditCorrupt { .. } => "AuditCorrupt",
        };
        Code {
            class: ErrorClass::Store,
            name,
        }
    }
}

impl From<crate::auditlog::AuditError> for StoreError {
    fn from(e: crate::auditlog::AuditError) -> StoreError {
        match e {
            crate::auditlog::AuditError::Io { path, source } => StoreError::Io {
                path,
                detail: source.to_string(),
            },
            other => StoreError::AuditCorrupt {
                detail: other.to_string(),
            },
        }
    }
}
