//! Why `troupe report` could not draw a run: typed errors with stable codes.

use std::path::PathBuf;

use crate::error::{Code, ErrorClass, HasCode, ValidationCode};

/// Everything that stops a report. Bad input (an unknown run, a corrupt
/// log, a file that cannot be written, no output asked for) is always one
/// of these, never a panic.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// No `<runs-dir>/<run-id>/audit.jsonl`.
    #[error("no run `{run_id}` in {}", runs_dir.display())]
    RunNotFound { run_id: String, runs_dir: PathBuf },
    /// The audit log cannot be read, or a line before its last is not an
    /// audit event. `line` is 1-based; 0 for the file as a whole.
    #[error("{}", located(source_name, *line, reason))]
    AuditCorrupt {
        /// The log's path, or a name for an in-memory log.
        source_name: String,
        line: u64,
        reason: String,
    },
    /// A report file cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    WriteFailed {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Neither `--svg` nor `--html` was given.
    #[error("nothing to write: give --svg FILE, --html FILE or both")]
    NothingToWrite,
    /// The run store could not say which run is meant (a prefix of more
    /// than one run's id).
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

fn located(source: &str, line: u64, reason: &str) -> String {
    match line {
        0 => format!("{source}: {reason}"),
        n => format!("{source}:{n}: {reason}"),
    }
}

impl ReportError {
    /// What to do about it, for the CLI's `hint:` line.
    pub fn hint(&self) -> Option<String> {
        match self {
            ReportError::RunNotFound { .. } => Some(
                "a run is a folder named by its workflowRunId (the id `troupe run` prints), \
                 see .troupe/runs; for runs written with --runs-dir DIR, pass the same --runs-dir"
                    .to_owned(),
            ),
            ReportError::AuditCorrupt { .. } => Some(
                "the log is read line by line; only a torn last line (a run killed mid-write) is skipped"
                    .to_owned(),
            ),
            ReportError::WriteFailed { .. } => None,
            ReportError::NothingToWrite => {
                Some("troupe report <RUN_ID> --svg run.svg --html run.html".to_owned())
            }
            ReportError::Store(e) => Some(e.hint()),
        }
    }

    /// Sets the name the log is reported under (its path).
    pub fn in_source(self, name: &str) -> ReportError {
        match self {
            ReportError::AuditCorrupt { line, reason, .. } => ReportError::AuditCorrupt {
                source_name: name.to_owned(),
                line,
                reason,
            },
            other => other,
        }
    }
}

impl HasCode for ReportError {
    fn code(&self) -> Code {
        let store = |name| Code {
            class: ErrorClass::Store,
            name,
        };
        match self {
            ReportError::RunNotFound { .. } => store("RunNotFound"),
            ReportError::AuditCorrupt { .. } => store("AuditCorrupt"),
            ReportError::WriteFailed { .. } => store("WriteFailed"),
            ReportError::NothingToWrite => ValidationCode::InputInvalid.code(),
            ReportError::Store(e) => e.code(),
        }
    }
}
