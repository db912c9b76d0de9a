//! Finds a run's audit log in the runs folder (`<runs-dir>/<run-id>/
//! audit.log.zst`, as `troupe run` writes it, or an older troupe's
//! `audit.jsonl.zst` or `audit.jsonl`) and reads it into a timeline.

use std::io::BufReader;
use std::path::{Path, PathBuf};

use super::error::ReportError;
use super::timeline::Timeline;

use crate::auditlog::{AuditError, OrderedReader};

/// Where the audit log of `run_id` would be; `None` for an id that is not
/// a plain folder name (a path, `..`), which names no run.
pub fn audit_path(runs_dir: &Path, run_id: &str) -> Option<PathBuf> {
    let plain = !run_id.is_empty()
        && run_id != "."
        && run_id != ".."
        && !run_id.contains(['/', '\\'])
        && !run_id.contains('\0');
    plain.then(|| crate::auditlog::in_dir(&runs_dir.join(run_id)))
}

/// Reads the timeline of `run_id` from `runs_dir`.
///
/// Errors: `Store/RunNotFound` when the run has no audit log there,
/// `Store/AuditCorrupt` (naming the path and line) when it cannot be read.
pub fn load_run(runs_dir: &Path, run_id: &str) -> Result<Timeline, ReportError> {
    let not_found = || ReportError::RunNotFound {
        run_id: run_id.to_owned(),
        runs_dir: runs_dir.to_owned(),
    };
    let path = audit_path(runs_dir, run_id).ok_or_else(not_found)?;
    let name = path.display().to_string();
    // Decoded ahead of the timeline on threads of its own: writing each
    // record back as its line is a third of reading a wide run's log.
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get().min(4));
    let file = match OrderedReader::open(&path, threads) {
        Ok(f) => f,
        Err(AuditError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {
            return Err(not_found());
        }
        Err(e) => {
            return Err(ReportError::AuditCorrupt {
                source_name: name,
                line: 0,
                reason: format!("cannot open: {e}"),
            });
        }
    };
    Timeline::from_audit(BufReader::with_capacity(1 << 16, file)).map_err(|e| e.in_source(&name))
}
