//! Where a compact log's segments begin, found without decompressing: a
//! zstd frame says how long each of its blocks is, so the walk hops from
//! header to header and reads a few bytes per block. `troupe runs tail`
//! starts decoding at the last segments instead of the first: the last
//! lines of a million-wide run's log are then a few milliseconds away,
//! not the seconds it takes to decompress 3 GB of lines.
//!
//! The walk stops, without an error, where the file stops making sense
//! as frames (a torn end, or damage): the segments found before are
//! still whole, and a reader decoding from one of them meets the damage
//! itself and reports it with its offset.

use std::fs::File;
use std::io::{self, BufReader, Read, Seek, SeekFrom};
use std::path::Path;

use super::LogDecoder;
use super::blocks::{ZSTD_MAGIC, block_header, frame_header_len, has_checksum, skippable};
use super::error::AuditError;

/// The log's header bytes and the offset of each segment after it, in
/// order (the last may be open: a run still writing, or a killed one).
/// The header is checked as every reader checks it: a foreign file or a
/// newer format is an error.
pub fn segment_starts(path: &Path) -> Result<Vec<u64>, AuditError> {
    let io = AuditError::io(path);
    let mut file = BufReader::new(super::read::open_log(path, false).map_err(&io)?);
    // The header frame: its magic, its length, its text.
    let mut head = [0u8; 8];
    if read_full(&mut file, &mut head).map_err(&io)? < 8 {
        return Ok(Vec::new());
    }
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let mut header = head.to_vec();
    header.resize(8 + len.min(4096) as usize, 0);
    let got = read_full(&mut file, &mut header[8..]).map_err(&io)?;
    header.truncate(8 + got);
    LogDecoder::compact()
        .feed(&header, &mut Vec::new())
        .map_err(|f| f.at(path))?;
    let mut at = 8 + u64::from(len);
    let mut starts = Vec::new();
    // The file as it is now: a live run's later frames are not counted.
    let size = file.get_ref().metadata().map_err(&io)?.len();
    file.seek(SeekFrom::Start(at)).map_err(&io)?;
    while let Some(length) = frame_length(&mut file, size).map_err(&io)? {
        starts.push(at);
        at += length;
        file.seek(SeekFrom::Start(at)).map_err(&io)?;
    }
    // A frame begun and not ended (the open segment) starts here.
    if at < size {
        starts.push(at);
    }
    Ok(starts)
}

/// The length of the zstd frame that starts where `file` is, reading only
/// its headers; `None` where no whole frame is within the file's first
/// `size` bytes (the end of the file, a frame cut short, bytes that are
/// not a frame).
fn frame_length(file: &mut BufReader<File>, size: u64) -> io::Result<Option<u64>> {
    let mut magic = [0u8; 4];
    if read_full(file, &mut magic)? < 4 {
        return Ok(None);
    }
    let magic = u32::from_le_bytes(magic);
    if skippable(magic) {
        // A skippable frame: its length follows.
        let mut len = [0u8; 4];
        if read_full(file, &mut len)? < 4 {
            return Ok(None);
        }
        return Ok(Some(8 + u64::from(u32::from_le_bytes(len))));
    }
    if magic != ZSTD_MAGIC {
        return Ok(None);
    }
    let mut descriptor = [0u8; 1];
    if read_full(file, &mut descriptor)? < 1 {
        return Ok(None);
    }
    let checksum = has_checksum(descriptor[0]);
    let header = frame_header_len(descriptor[0]) as u64;
    let mut length = header;
    // Past the magic number and the descriptor, read.
    file.seek_relative((header - 5) as i64)?;
    loop {
        let mut block = [0u8; 3];
        if read_full(file, &mut block)? < 3 {
            return Ok(None);
        }
        // A reserved type: not a frame.
        let (last, Some(body)) = block_header(block) else {
            return Ok(None);
        };
        let body = u64::from(body);
        length += 3 + body;
        file.seek_relative(body as i64)?;
        if last {
            break;
        }
    }
    if checksum {
        length += 4;
    }
    // The frame is whole only if the file holds all of it.
    let end = file.stream_position()? + if checksum { 4 } else { 0 };
    if end > size {
        return Ok(None);
    }
    Ok(Some(length))
}

/// Reads until `buf` is full or the file ends; how much was read.
fn read_full(file: &mut impl Read, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}
