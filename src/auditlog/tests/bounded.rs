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
    let (log, longest) = segments(SEGMENTS, PER, |_| {});
    (log.finish().expect("finish"), longest)
}

/// `n` segments of `per` events each; `last` adds to the last one's
/// records before it is compressed.
fn segments(n: u64, per: u64, last: impl FnOnce(&mut Vec<u8>)) -> (Frames<Vec<u8>>, usize) {
    segments_of(RUN_ID, n, per, last)
}

/// [`segments`] with a run id of `run_id` bytes.
fn segments_of(
    run_id: usize,
    n: u64,
    per: u64,
    last: impl FnOnce(&mut Vec<u8>),
) -> (Frames<Vec<u8>>, usize) {
    let run: Arc<str> = Arc::from("r".repeat(run_id));
    let mut log = Frames::create(Vec::new());
    let mut compressor = SegmentCompressor::new().expect("zstd");
    let mut last = Some(last);
    for segment in 0..n {
        let mut writer = RecordWriter::new();
        let mut records = Vec::new();
        writer.begin(&mut records);
        for i in 1..=per {
            let seq = segment * per + i;
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
        if segment + 1 == n
            && let Some(last) = last.take()
        {
            last(&mut records);
        }
        let mut frame = Vec::new();
        compressor.compress(&records, &mut frame).expect("frame");
        log.write_frame(&frame).expect("frame");
    }
    (log, run_id + 200)
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
        self.count(SEGMENTS * PER)
    }

    /// `lines` lines were handed out; the digest of them all.
    fn count(self, lines: u64) -> (u64, u64) {
        assert_eq!(self.lines, lines);
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

/// How a log's last segment is damaged, after two whole ones.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// Its events, then a record with an unknown tag.
    BadRecord,
    /// Its events, then a record cut short where the segment ends.
    CutRecord,
    /// No third segment: bytes that are no zstd frame.
    NotZstd,
}

/// The damaged log and the lines before the damage.
fn damaged(how: Damage) -> (Vec<u8>, u64) {
    let bytes = match how {
        Damage::BadRecord => segments(3, PER, |r| r.push(0x7f)).0,
        Damage::CutRecord => segments(3, PER, |r| r.extend_from_slice(&[2, 40, 1])).0,
        Damage::NotZstd => {
            let (mut log, _) = segments(2, PER, |_| {});
            log.write_frame(b"\x28\xb5\x2f\xfd not a frame")
                .expect("bytes");
            log
        }
    }
    .finish()
    .expect("finish");
    let good = match how {
        Damage::BadRecord | Damage::CutRecord => 3 * PER,
        Damage::NotZstd => 2 * PER,
    };
    (bytes, good)
}

/// At damage, every reader hands out every line before it, a bound at a
/// time, and then the fault (the follower once dropped the lines that came
/// out in the call that found it), however the bytes are fed.
#[test]
fn every_reader_hands_out_the_lines_before_damage_then_the_fault() {
    for how in [Damage::BadRecord, Damage::CutRecord, Damage::NotZstd] {
        let (bytes, good) = damaged(how);
        let longest = RUN_ID + 200;
        let most = LINES_AT_ONCE + longest;
        let mut seen = Vec::new();
        for piece in [bytes.len(), 7] {
            let mut decoder = LogDecoder::compact();
            let mut tally = Tally::new(most);
            let mut lines = Vec::new();
            let fault = 'fed: {
                for mut rest in bytes.chunks(piece) {
                    loop {
                        match decoder.feed(rest, &mut lines) {
                            Ok(taken) => rest = &rest[taken..],
                            Err(fault) => {
                                assert!(lines.is_empty(), "{how:?}: lines with the fault");
                                break 'fed Some(fault);
                            }
                        }
                        tally.take(&lines);
                        lines.clear();
                        if rest.is_empty() && !decoder.more() {
                            break;
                        }
                    }
                }
                None
            };
            let fault = fault.unwrap_or_else(|| panic!("{how:?}: no fault"));
            // Told again, and nothing more handed out.
            assert_eq!(decoder.feed(&[], &mut lines), Err(fault), "{how:?}");
            assert!(lines.is_empty());
            seen.push(tally.count(good));
        }
        let (_dir, path) = in_file(&bytes);
        let mut tally = Tally::new(most);
        let mut reader = DecodedReader::open(&path).expect("opens");
        let ended = loop {
            match reader.next_lines() {
                Ok(Some(lines)) => tally.take(lines),
                Ok(None) => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        assert!(ended.is_err(), "{how:?}");
        seen.push(tally.count(good));
        let mut tally = Tally::new(most);
        let mut follower = Follower::new(&path);
        let mut lines = Vec::new();
        let ended = loop {
            match follower.read_more(1 << 20, &mut lines) {
                Ok(read) => {
                    tally.take(&lines);
                    lines.clear();
                    assert!(read > 0, "{how:?}: the follower stopped before the fault");
                }
                Err(e) => break e,
            }
        };
        assert_eq!(ended.code(), "Store/AuditCorrupt");
        seen.push(tally.count(good));
        let mut tally = Tally::new(super::super::export::PIECE + most);
        let exported = export_in_jobs(&path, &mut TallyOut(&mut tally), 2, 1);
        assert!(exported.is_err(), "{how:?}");
        seen.push(tally.count(good));
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{how:?}");
    }
}

/// Lines longer than the export's large piece (5 MiB each): each piece
/// waits until it is written, and the export is the single reader's,
/// byte for byte; a writer that fails at the first piece stops every
/// waiting job. A job that kept waiting would hang this test, in the runs
/// where the other job queued its piece before the writer failed (the
/// race is the hang itself; nothing gates the export's threads).
#[test]
fn an_export_of_long_lines_waits_for_each_and_stops_with_its_writer() {
    let long = 5 << 20;
    let bytes = segments_of(long, 4, 2, |_| {}).0.finish().expect("finish");
    let (_dir, path) = in_file(&bytes);
    let mut single = Tally::new(usize::MAX);
    let mut reader = DecodedReader::open(&path).expect("opens");
    while let Some(lines) = reader.next_lines().expect("reads") {
        single.take(lines);
    }
    let mut out = Tally::new(super::super::export::PIECE + LINES_AT_ONCE + long + 200);
    export_in_jobs(&path, &mut TallyOut(&mut out), 2, 1).expect("exports");
    assert_eq!(out.count(8), single.count(8));
    struct Refusing;
    impl std::io::Write for Refusing {
        fn write(&mut self, _: &[u8]) -> std::io::Result<usize> {
            Err(std::io::Error::other("refused"))
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let stopped = export_in_jobs(&path, &mut Refusing, 2, 1);
    assert!(matches!(stopped, Err(super::super::ExportError::Write(_))));
}
