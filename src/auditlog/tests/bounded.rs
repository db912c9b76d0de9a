//! A log whose few bytes make far more lines (records refer to their
//! segment's strings: a 64 KiB run id defined once, used by every line)
//! is read a bounded amount at a time by every reader: the decoder, the
//! whole-log reader, the follower and the export.

use std::hash::Hasher;
use std::sync::Arc;

use super::super::export::export_in_jobs;
use super::super::records::{EventHead, RecordWriter};
use super::*;

/// Events a segment holds, segments, and the run id's length.
const PER: u64 = 500;
const SEGMENTS: u64 = 4;
const RUN_ID: usize = 64 << 10;

/// The log: closed segments of events that each repeat the long run id.
/// Also the length of its longest line.
fn expanding() -> (Vec<u8>, usize) {
    let run: Arc<str> = Arc::from("r".repeat(RUN_ID));
    let mut log = Frames::create(Vec::new());
    let mut compressor = SegmentCompressor::new().expect("zstd");
    for segment in 0..SEGMENTS {
        let mut writer = RecordWriter::new();
        let mut records = Vec::new();
        writer.begin(&mut records);
        for i in 1..=PER {
            let seq = segment * PER + i;
            let head = EventHead {
                seq,
                micros: 1_795_000_000_000_000 + seq,
                name: "StageExited",
                run: &run,
                exec: None,
                stage: None,
                tool: None,
                fields: 0,
            };
            writer.event(&mut records, &head);
        }
        let mut frame = Vec::new();
        compressor.compress(&records, &mut frame).expect("frame");
        log.write_frame(&frame).expect("frame");
    }
    let bytes = log.finish().expect("finish");
    (bytes, RUN_ID + 200)
}

/// What a reader hands out, checked as it goes: every line whole and in
/// `seq` order, and never more at once than `most`.
struct Tally {
    most: usize,
    lines: u64,
    bytes: u64,
    digest: std::collections::hash_map::DefaultHasher,
}

impl Tally {
    fn new(most: usize) -> Tally {
        Tally {
            most,
            lines: 0,
            bytes: 0,
            digest: Default::default(),
        }
    }

    fn take(&mut self, given: &[u8]) {
        assert!(
            given.len() <= self.most,
            "{} bytes handed out at once, more than {}",
            given.len(),
            self.most
        );
        assert!(given.is_empty() || given.ends_with(b"\n"));
        for line in given.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            self.lines += 1;
            let head = format!("{{\"seq\":{},\"ts\":", self.lines);
            assert!(line.starts_with(head.as_bytes()), "line {}", self.lines);
        }
        self.bytes += given.len() as u64;
        self.digest.write(given);
    }

    /// Every line was handed out; the digest of them all.
    fn whole(self) -> (u64, u64) {
        assert_eq!(self.lines, SEGMENTS * PER);
        (self.bytes, self.digest.finish())
    }
}

/// The file is a few KiB; its lines are a hundred MiB and more.
#[test]
fn the_log_is_small_and_its_lines_are_not() {
    let (bytes, longest) = expanding();
    assert!(bytes.len() < 64 << 10, "{} bytes", bytes.len());
    let mut tally = Tally::new(usize::MAX);
    let mut lines = Vec::new();
    LogDecoder::compact()
        .feed_all(&bytes, &mut lines)
        .expect("a log");
    tally.take(&lines);
    let (total, _) = tally.whole();
    assert!(total > (SEGMENTS * PER) * RUN_ID as u64);
    assert!(lines.split(|b| *b == b'\n').all(|l| l.len() < longest));
}

/// Fed the whole file, or a few bytes at a time, the decoder hands out
/// at most its bound and a line each call, the same lines either way,
/// and ends where the log does.
#[test]
fn the_decoder_hands_out_a_bound_at_a_time_however_it_is_fed() {
    let (bytes, longest) = expanding();
    let mut digests = Vec::new();
    for piece in [bytes.len(), 7] {
        let mut decoder = LogDecoder::compact();
        let mut tally = Tally::new(LINES_AT_ONCE + longest);
        let mut lines = Vec::new();
        let mut calls = 0;
        for mut rest in bytes.chunks(piece) {
            loop {
                let taken = decoder.feed(rest, &mut lines).expect("a log");
                rest = &rest[taken..];
                tally.take(&lines);
                lines.clear();
                calls += 1;
                if rest.is_empty() && !decoder.more() {
                    break;
                }
            }
        }
        let len = bytes.len() as u64;
        assert_eq!(
            decoder.end(),
            LogEnd {
                keep: len,
                fed: len
            }
        );
        assert!(calls > 100, "{calls} calls");
        digests.push(tally.whole());
    }
    assert_eq!(digests[0], digests[1]);
}

fn in_file(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(FILE);
    std::fs::write(&path, bytes).expect("write");
    (dir, path)
}

/// The whole-log reader, the follower and the export hold no more than
/// a bound of lines at once, and agree.
#[test]
fn every_reader_of_the_file_holds_a_bound_at_a_time() {
    let (bytes, longest) = expanding();
    let (_dir, path) = in_file(&bytes);
    let whole = {
        let mut tally = Tally::new(LINES_AT_ONCE + longest);
        let mut reader = DecodedReader::open(&path).expect("opens");
        while let Some(lines) = reader.next_lines().expect("reads") {
            tally.take(lines);
        }
        tally.whole()
    };
    let followed = {
        let mut tally = Tally::new(LINES_AT_ONCE + longest);
        let mut follower = Follower::new(&path);
        let max = 1 << 20;
        let mut lines = Vec::new();
        loop {
            let read = follower.read_more(max, &mut lines).expect("reads");
            tally.take(&lines);
            lines.clear();
            if read < max {
                break;
            }
        }
        tally.whole()
    };
    assert_eq!(followed, whole);
    // One job a segment, on two threads.
    let mut out = Tally::new(super::super::export::PIECE + LINES_AT_ONCE + longest);
    export_in_jobs(&path, &mut TallyOut(&mut out), 2, 1).expect("exports");
    assert_eq!(out.whole(), whole);
}

/// The export's output, tallied write by write.
struct TallyOut<'a>(&'a mut Tally);

impl std::io::Write for TallyOut<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.take(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}
