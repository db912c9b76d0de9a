//! A scan on several threads reads what one reader reads: the same
//! members in the same order, the same end, the same faults.

use super::super::tests::{frames_log, written_in};
use super::super::{FILE, FORMAT, FORMAT_LINES, segment_starts};
use super::*;

/// What the scan read of each event (owned), before an end or a fault
/// alike, and how the log ended.
type Scanned = (Vec<Option<Head<'static>>>, Result<LogEnd, AuditError>);

fn scanned(path: &Path, threads: usize, job: u64) -> Scanned {
    let mut read = Vec::new();
    let end = scan_heads_in(path, threads, job, &mut |head| {
        read.push(head.map(Head::into_owned));
        Ok(())
    });
    (read, end)
}

/// Logs of many segments, closed, killed inside a block or inside a
/// segment's frame, damaged inside a segment or in a frame's header (the
/// walk for segments stops there), in either format: every split into
/// jobs reads as one reader from the first byte, what comes before a
/// fault included.
#[test]
fn a_scan_in_jobs_reads_what_one_reader_reads() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(FILE);
    let (frames, _, ends) = frames_log(9, 30);
    let torn = frames[..ends[6] + (ends[7] - ends[6]) / 2].to_vec();
    let mut damaged = frames.clone();
    damaged[ends[3] + 20] ^= 0x55;
    let mut unwalked = frames.clone();
    unwalked[ends[5]] ^= 0xff;
    let (open, _, flushed) = written_in(FORMAT, 30_000, 1000, false);
    let killed = open[..flushed[20].0 + 5].to_vec();
    let (lines, _, _) = written_in(FORMAT_LINES, 120_000, 1000, true);
    for (name, bytes) in [
        ("frames", frames),
        ("torn", torn),
        ("damaged", damaged),
        ("unwalked", unwalked),
        ("open", open),
        ("killed", killed),
        ("lines", lines),
    ] {
        std::fs::write(&path, &bytes).expect("write");
        let starts = segment_starts(&path).expect("segments");
        assert!(starts.len() >= 2, "{name}: {} segments", starts.len());
        let one = scanned(&path, 1, JOB);
        assert!(one.0.len() > 100, "{name}: {} events", one.0.len());
        assert_eq!(
            one.1.is_err(),
            name == "damaged" || name == "unwalked",
            "{name}: {one:?}"
        );
        for (threads, job) in [(2, 1), (3, 100), (4, 1 << 20)] {
            let jobs = scanned(&path, threads, job);
            assert_eq!(
                format!("{jobs:?}"),
                format!("{one:?}"),
                "{name}: {threads} threads, jobs of {job} bytes"
            );
        }
    }
}

/// A member the scan refuses stops it with the scan's reason, at the
/// segment being read: the jobs' threads did read it.
#[test]
fn a_refusal_in_a_later_segment_names_that_segments_start() {
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join(FILE);
    let (frames, _, _) = frames_log(9, 30);
    std::fs::write(&path, &frames).expect("write");
    let starts = segment_starts(&path).expect("segments");
    assert_eq!(starts.len(), 9);
    // The first event of the fifth segment.
    let refuse = |threads| {
        let mut n = 0;
        scan_heads_in(&path, threads, 1, &mut |_| {
            n += 1;
            if n == 4 * 30 + 1 {
                return Err("not this one".to_owned());
            }
            Ok(())
        })
    };
    for threads in [1, 2, 4] {
        match refuse(threads) {
            Err(AuditError::Corrupt { offset, reason, .. }) => {
                assert_eq!(reason, "not this one");
                if threads > 1 {
                    assert_eq!(offset, starts[4], "{threads} threads");
                }
            }
            other => panic!("{other:?}"),
        }
    }
}
