//! Fuzzes the compact audit log's reader: arbitrary bytes, fed whole and
//! in two pieces split where the input says, as a compact log (behind the
//! header of either format) and as a plain one, and walked for its
//! segments as `runs tail` does; and the same bytes as a segment's binary
//! records, which zstd frames the fuzzer makes rarely reach. A file troupe
//! did not write must give a typed error or whole lines, never a panic;
//! both feeds must agree.
#![no_main]

use libfuzzer_sys::fuzz_target;
use troupe::auditlog::LogDecoder;

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
    let whole = {
        let mut d = LogDecoder::compact();
        let mut out = Vec::new();
        d.feed(input, &mut out).map(|()| (out, d.end()))
    };
    let at = (split as usize * input.len()) / 256;
    let pieces = {
        let mut d = LogDecoder::compact();
        let mut out = Vec::new();
        d.feed(&input[..at], &mut out)
            .and_then(|()| d.feed(&input[at..], &mut out))
            .map(|()| (out, d.end()))
    };
    if let (Ok(a), Ok(b)) = (&whole, &pieces) {
        assert_eq!(a, b, "the same bytes in two pieces decode the same");
    }
    if let Ok((lines, _)) = &whole {
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
                let _ = follower.read_more(1 << 20, &mut lines);
            }
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
    let mut plain = LogDecoder::plain();
    let mut out = Vec::new();
    plain.feed(bytes, &mut out).expect("a plain log never fails");
});
