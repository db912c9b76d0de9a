//! What a resume's scan reads of each event of a whole log
//! ([`scan_heads`]), its segments decoded on several threads.
//!
//! A resume reads the whole log before its run goes on. With its records
//! read for six members rather than written out as lines
//! ([`super::records::Entries`]), decoding them is most of what is left,
//! and segments read on their own bytes: the jobs `runs export` decodes
//! on several threads, handed over in the log's order, so the scan sees
//! what a single reader sees, the log's end included.

use std::io::{self, Write};
use std::path::Path;

use super::decode::Hand;
use super::error::AuditError;
use super::export::{ExportError, JOB, in_jobs};
use super::head::Head;
use super::read::{format_of, heads_of, scan_in_one};
use super::seek::segment_starts;
use super::write::FORMAT_LINES;
use super::{LogEnd, is_plain};

/// Threads a scan decodes on at most: as many as `runs export` uses.
const SCAN_THREADS: usize = 4;

/// Reads the whole log at `path` for its end, passing what a resume's
/// scan reads of each event to `each`, in order: its [`Head`], or `None`
/// for a line that is not UTF-8 or not a JSON object. A log of records
/// is read without making its lines ([`super::records::Entries`]), its
/// segments decoded on up to four threads; any other, line by line. An
/// error from `each` is the log's fault there.
pub fn scan_heads(
    path: &Path,
    mut each: impl FnMut(Option<Head<'_>>) -> Result<(), String>,
) -> Result<LogEnd, AuditError> {
    let threads = std::thread::available_parallelism()
        .map_or(1, std::num::NonZero::get)
        .min(SCAN_THREADS);
    scan_heads_in(path, threads, JOB, &mut each)
}

/// [`scan_heads`] on `threads` threads, in jobs of about `job` file
/// bytes: one reader from the first byte for a plain log, a log of one
/// segment, or one thread (and for a file whose segments cannot be
/// found, which that reader then refuses as it should). A refusal by
/// `each` names the start of the job it was reading (one reader names
/// how far it had read): where to look, not the event's own byte.
pub(super) fn scan_heads_in(
    path: &Path,
    threads: usize,
    job: u64,
    each: &mut dyn FnMut(Option<Head<'_>>) -> Result<(), String>,
) -> Result<LogEnd, AuditError> {
    let starts = if threads < 2 || is_plain(path) {
        Vec::new()
    } else {
        segment_starts(path).unwrap_or_default()
    };
    if starts.len() < 2 {
        return scan_in_one(path, each);
    }
    let format = format_of(path)?;
    let mut sink = Sink {
        each,
        entries: format != FORMAT_LINES,
        failed: None,
    };
    match in_jobs(path, &starts, format, &mut sink, threads, job, Hand::Heads) {
        Ok(end) => Ok(end),
        Err((ExportError::Read(e), _)) => Err(e),
        Err((ExportError::Write(e), offset)) => Err(AuditError::Corrupt {
            path: path.to_owned(),
            offset,
            reason: sink.failed.take().unwrap_or_else(|| e.to_string()),
        }),
    }
}

/// Where the jobs' entries (or lines) go: each whole piece a job hands
/// over is read as it is written.
struct Sink<'e> {
    each: &'e mut dyn FnMut(Option<Head<'_>>) -> Result<(), String>,
    entries: bool,
    /// Why `each` stopped the scan.
    failed: Option<String>,
}

impl Write for Sink<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match heads_of(buf, self.entries, self.each) {
            Ok(()) => Ok(buf.len()),
            Err(reason) => {
                let e = io::Error::new(io::ErrorKind::InvalidData, reason.clone());
                self.failed = Some(reason);
                Err(e)
            }
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests;
