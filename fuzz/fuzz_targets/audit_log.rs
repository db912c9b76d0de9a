//! Fuzzes the compact audit log's reader: arbitrary bytes, fed whole and
//! in two pieces split where the input says, as a compact log (behind the
//! header of either format) and as a plain one, and walked for its
//! segments as `runs tail` does, and repaired as `troupe resume` repairs a
//! killed run's log; and the same bytes as a segment's binary
//! records, which zstd frames the fuzzer makes rarely reach, and read
//! as the resume's scan reads records (each one's members, not its
//! line), which must agree with its line. A file troupe
//! did not write must give a typed error or whole lines, never a panic;
//! both feeds must agree, on the lines before a fault too; and no call
//! hands out more than the decoder's bound and a line, however many lines
//! a few bytes make.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::auditlog::{AuditFault, LINES_AT_ONCE, LogDecoder, LogEnd};

/// Lines read of one input before the rest is left unread: a few bytes
/// of records can make gigabytes, which the decoder hands out a bound at
/// a time, and reading them all would only take time.
const READ_AT_MOST: usize = 64 << 20;

/// What a feed came to: the lines handed out, then the end or the fault.
type Decoded = (Vec<u8>, Result<LogEnd, AuditFault>);

/// Feeds `pieces` in turn, each call's lines checked against the bound;
/// the lines and the end or the fault, or `None` once [`READ_AT_MOST`]
/// was passed.
fn decoded(pieces: &[&[u8]]) -> Option<Decoded> {
    let mut d = LogDecoder::compact();
    let mut out = Vec::new();
    for piece in pieces {
        let mut rest = *piece;
        loop {
            let before = out.len();
            let taken = match d.feed(rest, &mut out) {
                Ok(taken) => taken,
                Err(fault) => return Some((out, Err(fault))),
            };
            rest = &rest[taken..];
            // What one call added, less its last line, is under the bound.
            let added = &out[before..];
            let last = added[..added.len().saturating_sub(1)]
                .iter()
                .rposition(|b| *b == b'\n')
                .map_or(0, |at| at + 1);
            assert!(last < LINES_AT_ONCE, "{last} bytes before the last line");
            if out.len() > READ_AT_MOST {
                return None;
            }
            if rest.is_empty() && !d.more() {
                break;
            }
        }
    }
    // At the input's end, as a reader at its file's end reads it.
    let end = d.finish();
    Some((out, end))
}

/// How the log at `path` ends, read line by line, unless it is damaged
/// or makes more than [`READ_AT_MOST`] of lines.
fn scan_within(path: &std::path::Path) -> Option<LogEnd> {
    match members_of_lines(path) {
        Within::Read(_, end) => Some(end),
        Within::Damaged | Within::TooMany => None,
    }
}

/// What the scan reads of one event, owned.
type Members = Option<troupe::auditlog::Head<'static>>;

fn owned(head: Option<troupe::auditlog::Head<'_>>) -> Members {
    head.map(troupe::auditlog::Head::into_owned)
}

/// A log read as lines for what the scan reads of each.
enum Within {
    Read(Vec<Members>, LogEnd),
    Damaged,
    /// More than [`READ_AT_MOST`] of lines: left unread.
    TooMany,
}

fn members_of_lines(path: &std::path::Path) -> Within {
    let (mut read, mut members) = (0, Vec::new());
    let end = troupe::auditlog::scan_end(path, |lines| {
        read += lines.len();
        if read > READ_AT_MOST {
            return Err("more lines than the target reads".into());
        }
        for line in lines.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            members.push(owned(troupe::auditlog::Head::of_line(line)));
        }
        Ok(())
    });
    match end {
        Ok(end) => Within::Read(members, end),
        Err(_) if read > READ_AT_MOST => Within::TooMany,
        Err(_) => Within::Damaged,
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&split, bytes)) = data.split_first() else {
        return;
    };
    // Most inputs lack the header: put it in front of half of them so the
    // fuzzer reaches the frames.
    let format = if split & 2 == 0 {
        troupe::auditlog::FORMAT
    } else {
        troupe::auditlog::FORMAT_LINES
    };
    let mut with_header = troupe::auditlog::header_for(format);
    with_header.extend_from_slice(bytes);
    let input = if split & 1 == 0 { &with_header[..] } else { bytes };
    let whole = decoded(&[input]);
    let at = (split as usize * input.len()) / 256;
    let pieces = decoded(&[&input[..at], &input[at..]]);
    // The same bytes in two pieces decode the same: the same lines and
    // end, or a fault alike. Before a fault, the lines of one are those of
    // the other or a prefix of them: zstd is given a block at a time, so
    // where a piece ends cannot move them, but a raw block is streamed out
    // as it arrives, and in a frame that says its content size zstd
    // checks it only at the frame's end (troupe's frames say none: the
    // proptest `damage_reads_alike_in_any_pieces` holds its logs to the
    // same lines).
    if let (Some((a, a_end)), Some((b, b_end))) = (&whole, &pieces) {
        match (a_end, b_end) {
            (Ok(a_end), Ok(b_end)) => {
                assert_eq!(a, b, "the same lines however the bytes arrive");
                assert_eq!(a_end, b_end);
            }
            (Err(_), Err(_)) => assert!(
                a.starts_with(b) || b.starts_with(a),
                "the lines before a fault differ, not only in how many"
            ),
            _ => panic!("one feed ends, the other fails: {a_end:?}, {b_end:?}"),
        }
    }
    if let Some((lines, Ok(_))) = &whole {
        assert!(lines.is_empty() || lines.ends_with(b"\n"));
    }
    // The segment walk (`runs tail`) reads the same bytes as a file: an
    // error or some starts, each past the header and before the end.
    let file = std::env::temp_dir().join(format!("troupe-fuzz-audit-{}", std::process::id()));
    if std::fs::write(&file, input).is_ok() {
        if let Ok(starts) = troupe::auditlog::segment_starts(&file) {
            assert!(starts.windows(2).all(|w| w[0] < w[1]), "{starts:?}");
            assert!(starts.iter().all(|s| *s <= input.len() as u64), "{starts:?}");
            if let Some(last) = starts.last() {
                let mut follower = troupe::auditlog::Follower::at_segment(&file, *last)
                    .expect("a follower at a start");
                let mut lines = Vec::new();
                // Up to READ_AT_MOST of lines, a bound at a time.
                while let Ok(read) = follower.read_more(1 << 20, &mut lines) {
                    if read < 1 << 20 || lines.len() > READ_AT_MOST {
                        break;
                    }
                }
            }
        }
        // `resume` reads a log of records for its members without its
        // lines: the same members, ending where the lines end, or failing
        // where they fail.
        match members_of_lines(&file) {
            Within::Read(members, end) => {
                let mut heads = Vec::new();
                let end_heads = troupe::auditlog::scan_heads(&file, |h| {
                    heads.push(owned(h));
                    Ok(())
                });
                assert_eq!(end_heads.ok(), Some(end), "the scan ends where the lines do");
                assert_eq!(heads, members, "the members its lines hold");
            }
            Within::Damaged => assert!(
                troupe::auditlog::scan_heads(&file, |_| Ok(())).is_err(),
                "the scan fails where the lines do"
            ),
            Within::TooMany => {}
        }
        // `resume`'s repair of the same file: a typed error, or a log
        // that then reads to a whole end. Logs past READ_AT_MOST of lines
        // are left: reading them only takes time.
        if let Some(end) = scan_within(&file)
            && troupe::auditlog::cut_to_whole(&file, end).is_ok()
            && let Some(after) = scan_within(&file)
        {
            assert!(!after.unfinished(), "a cut log ends whole: {after:?}");
        }
        // Removed each time: a fuzz process is killed, never told it ends.
        let _ = std::fs::remove_file(&file);
    }
    // The bytes as records, read as the decoder reads a segment: whole
    // records become lines, a cut one waits for more.
    let mut reader = troupe::auditlog::records::RecordReader::default();
    let mut lines = Vec::new();
    let mut at = 0;
    while let Ok(Some(n)) = reader.read(&bytes[at..], &mut lines) {
        assert!(n > 0 && at + n <= bytes.len());
        at += n;
    }
    assert!(lines.is_empty() || lines.ends_with(b"\n"));
    // The same bytes read as a resume's scan reads records: every read
    // alike, and each record's members those its line holds.
    let mut as_lines = troupe::auditlog::records::RecordReader::default();
    let mut as_heads = troupe::auditlog::records::RecordReader::heads();
    let (mut lines, mut entries, mut at) = (Vec::new(), Vec::new(), 0);
    loop {
        let read = as_lines.read(&bytes[at..], &mut lines);
        assert_eq!(read, as_heads.read(&bytes[at..], &mut entries));
        match read {
            Ok(Some(n)) => at += n,
            _ => break,
        }
    }
    let of_lines: Vec<_> = lines
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(troupe::auditlog::Head::of_line)
        .collect();
    let of_entries: Vec<_> = troupe::auditlog::records::Entries::new(&entries)
        .map(|e| e.expect("an entry the reader wrote"))
        .filter(|e| *e != troupe::auditlog::records::HeadEntry::Line(b""))
        .map(troupe::auditlog::records::HeadEntry::head)
        .collect();
    assert_eq!(of_entries, of_lines);
    let mut plain = LogDecoder::plain();
    let mut out = Vec::new();
    plain.feed_all(bytes, &mut out).expect("a plain log never fails");
});
