//! The audit log's file: `audit.jsonl.zst` in a run's folder.
//!
//! What is in it is the run's events as JSON lines, exactly the lines an
//! uncompressed log would hold (`troupe runs export` writes them back byte
//! for byte), compressed with zstd:
//!
//! - It begins with a zstd *skippable frame* holding the header
//!   `troupe audit log, format N`. The stock `zstd -dc` skips it, so
//!   `zstd -dc audit.jsonl.zst` prints the JSON lines; troupe reads it to
//!   tell its own log (and its format version) from a foreign file.
//! - Then zstd frames, each a *segment* of up to [`SEGMENT`] bytes of
//!   lines. The writer keeps a segment's frame open while the run goes on
//!   and ends a zstd *block* each time it flushes (every few milliseconds
//!   under load): a flushed block is on disk and decodable, while the
//!   compression window carries over from block to block, so the keys,
//!   stage names and execution ids every event repeats cost almost nothing
//!   (a 64 KiB batch compressed on its own would pay for them again).
//! - A closed segment ends with zstd's checksum of its content, which every
//!   reader verifies.
//! - A run with formatter threads (four `--threads` or more) writes each
//!   batch of up to 512 lines as a closed segment of its own, compressed
//!   by the thread that formatted it ([`Frames`], [`SegmentCompressor`]):
//!   compression spreads over cores, for about 10% more bytes on a
//!   `fanout` log than one stream. Readers see no difference: a log is
//!   segments, however large.
//!
//! A process killed outright leaves its last segment open, possibly with a
//! half-written block: readers take every whole line of the complete blocks
//! and stop there, and `troupe resume` rewrites that segment as a closed
//! one ([`cut_to_whole`]) before it appends.
//!
//! Run folders written by an older troupe hold a plain `audit.jsonl`; every
//! reader here reads that too ([`in_dir`] finds whichever is there).

mod read;
mod seek;
mod write;

use std::path::{Path, PathBuf};

pub use read::{
    AuditError, AuditFault, DecodedReader, Follower, LogDecoder, LogEnd, cut_to_whole, scan_end,
};
pub use seek::segment_starts;
pub use write::{Compressed, FORMAT, Frames, LEVEL, SEGMENT, SegmentCompressor, header};

/// The compact log's name inside a run folder.
pub const FILE: &str = "audit.jsonl.zst";
/// The plain JSON-lines log of run folders from before the compact one.
pub const PLAIN_FILE: &str = "audit.jsonl";

/// The audit log of the run folder `dir`: the compact one, unless only a
/// plain one (an older troupe's) is there.
pub fn in_dir(dir: &Path) -> PathBuf {
    let compact = dir.join(FILE);
    if compact.exists() {
        return compact;
    }
    let plain = dir.join(PLAIN_FILE);
    if plain.exists() { plain } else { compact }
}

/// Whether the log at `path` is a plain JSON-lines one (by its name).
pub fn is_plain(path: &Path) -> bool {
    path.extension().is_some_and(|e| e == "jsonl")
}

/// The whole lines of the log at `path` (compact or plain) as text.
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
