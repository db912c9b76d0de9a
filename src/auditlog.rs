//! The audit log's file: `audit.log.zst` in a run's folder.
//!
//! What is in it is the run's events as binary records ([`records`]),
//! compressed with zstd; every reader here hands them out as the JSON
//! lines an uncompressed log would hold (`troupe runs export` writes them
//! byte for byte), except a resume's scan, which reads each record for
//! the few members it needs ([`scan_heads`]):
//!
//! - It begins with a zstd *skippable frame* holding the header
//!   `troupe audit log, format N`. The stock `zstd` skips it; troupe reads
//!   it to tell its own log (and its format version) from a foreign file.
//! - Then zstd frames, each a *segment* of up to [`SEGMENT`] bytes of
//!   records. The writer keeps a segment's frame open while the run goes
//!   on and ends a zstd *block* each time it flushes (every few
//!   milliseconds under load): a flushed block is on disk and decodable,
//!   while the compression window carries over from block to block.
//!   Each flushed batch of records begins with a `RESET` and reads on its
//!   own bytes.
//! - A closed segment ends with zstd's checksum of its content, which every
//!   reader verifies.
//! - A run with formatter threads (four `--threads` or more) writes each
//!   batch of up to 512 events as a closed segment of its own, compressed
//!   by the thread that encoded it ([`Frames`], [`SegmentCompressor`]):
//!   compression spreads over cores, for about 10% more bytes than one
//!   stream. Readers see no difference: a log is segments, however large.
//!
//! A process killed outright leaves its last segment open, possibly with a
//! half-written block: readers take every whole record of the complete
//! blocks and stop there, and `troupe resume` rewrites that segment as a
//! closed one ([`cut_to_whole`]) before it appends.
//!
//! Run folders written by an older troupe hold `audit.jsonl.zst`, whose
//! segments are the JSON lines themselves ([`FORMAT_LINES`]), or a plain
//! `audit.jsonl`; every reader here reads those too ([`in_dir`] finds
//! whichever is there), and a resumed run appends in its log's format.

mod blocks;
pub(crate) mod clock;
mod decode;
mod error;
mod export;
mod head;
pub(crate) mod json;
mod read;
pub mod records;
mod scan;
mod seek;
mod write;

use std::path::{Path, PathBuf};

pub use decode::{AuditFault, LINES_AT_ONCE, LogDecoder, LogEnd};
pub use error::AuditError;
pub use export::{ExportError, OrderedReader, export_lines};
pub use head::Head;
pub use read::{
    DecodedReader, Follower, cut_to_whole, format_of, open_log, saved_tail_path, scan_end,
    undo_interrupted_cut,
};
pub use scan::scan_heads;
pub use seek::segment_starts;
pub use write::{
    Compressed, FORMAT, FORMAT_LINES, Frames, LEVEL, SEGMENT, SegmentCompressor, header, header_for,
};

/// The compact log's name inside a run folder: binary records
/// ([`FORMAT`]), read back as JSON lines by troupe.
pub const FILE: &str = "audit.log.zst";
/// The compact log of run folders from before the binary records, whose
/// segments hold the JSON lines themselves ([`FORMAT_LINES`]).
pub const LINES_FILE: &str = "audit.jsonl.zst";
/// The plain JSON-lines log of run folders from before the compact one.
pub const PLAIN_FILE: &str = "audit.jsonl";

/// The audit log of the run folder `dir`: the one there (an older
/// troupe's compact or plain one, for a run it began), or a new one.
pub fn in_dir(dir: &Path) -> PathBuf {
    let compact = dir.join(FILE);
    if compact.exists() {
        return compact;
    }
    [LINES_FILE, PLAIN_FILE]
        .into_iter()
        .map(|name| dir.join(name))
        .find(|older| older.exists())
        .unwrap_or(compact)
}

/// Whether the log at `path` is a plain JSON-lines one (by its name).
pub fn is_plain(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
}

/// The whole lines of the log at `path` (compact or plain) as one text,
/// held whole: for a log known to be small (tests read a run's log so).
/// A reader of any log streams it with [`DecodedReader`] instead.
pub fn read_text(path: &Path) -> Result<String, AuditError> {
    let mut text = String::new();
    let mut log = DecodedReader::open(path)?;
    std::io::Read::read_to_string(&mut log, &mut text).map_err(|e| AuditError::Corrupt {
        path: path.to_owned(),
        offset: log.end().fed,
        reason: e.to_string(),
    })?;
    Ok(text)
}

#[cfg(test)]
mod tests;
