//! The audit log's clock format: RFC 3339 UTC with microseconds, written
//! without allocating (one per audit line) and read back. Kept with the
//! log, not the runtime: the log's reader writes the same text from the
//! binary record's microseconds.

use std::cell::Cell;
use std::time::{SystemTime, UNIX_EPOCH};

/// RFC 3339 UTC with microseconds, e.g. `2026-11-22T03:05:31.123456Z`.
pub fn rfc3339(ts: SystemTime) -> String {
    let mut buf = [0u8; RFC3339_LEN];
    rfc3339_into(ts, &mut buf).to_owned()
}

/// The length of every [`rfc3339`] timestamp (years 0–9999).
pub(crate) const RFC3339_LEN: usize = 27;

/// Writes the [`rfc3339`] text into `buf` without allocating or going
/// through `fmt` (the audit writer formats one per line).
pub(crate) fn rfc3339_into(ts: SystemTime, buf: &mut [u8; RFC3339_LEN]) -> &str {
    rfc3339_micros_into(micros_since_epoch(ts), buf)
}

/// Microseconds from 1970 to `ts` (0 before it), the whole of what a
/// timestamp in the log says: the binary audit record keeps this number
/// and [`rfc3339_micros_into`] writes the same text from it.
pub(crate) fn micros_since_epoch(ts: SystemTime) -> u64 {
    let d = ts.duration_since(UNIX_EPOCH).unwrap_or_default();
    d.as_secs()
        .saturating_mul(1_000_000)
        .saturating_add(u64::from(d.subsec_micros()))
}

/// [`rfc3339_into`] for a time given as microseconds since 1970.
pub(crate) fn rfc3339_micros_into(micros: u64, buf: &mut [u8; RFC3339_LEN]) -> &str {
    fn digits(out: &mut [u8], mut n: u64) {
        for b in out.iter_mut().rev() {
            *b = b'0' + (n % 10) as u8;
            n /= 10;
        }
    }
    thread_local! {
        /// The date and time of day of the last second formatted on this
        /// thread: an audit writer formats thousands of lines a second,
        /// and the calendar arithmetic was most of a timestamp's cost.
        static LAST_SECOND: Cell<Option<(u64, [u8; 19])>> = const { Cell::new(None) };
    }
    let secs = micros / 1_000_000;
    let head = LAST_SECOND.with(|last| match last.get() {
        Some((s, head)) if s == secs => head,
        _ => {
            let days = i64::try_from(secs / 86_400).unwrap_or(0);
            let rem = secs % 86_400;
            let (y, m, day) = civil_from_days(days);
            let mut head = *b"0000-00-00T00:00:00";
            digits(&mut head[0..4], y.clamp(0, 9999) as u64);
            digits(&mut head[5..7], u64::from(m));
            digits(&mut head[8..10], u64::from(day));
            digits(&mut head[11..13], rem / 3600);
            digits(&mut head[14..16], (rem % 3600) / 60);
            digits(&mut head[17..19], rem % 60);
            last.set(Some((secs, head)));
            head
        }
    });
    *buf = *b"0000-00-00T00:00:00.000000Z";
    buf[..19].copy_from_slice(&head);
    digits(&mut buf[20..26], micros % 1_000_000);
    // Only ASCII digits and separators were written.
    std::str::from_utf8(buf).unwrap_or("1970-01-01T00:00:00.000000Z")
}

/// Reads back an [`rfc3339`] timestamp (the audit log's `ts`); `None` for
/// any other shape.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let b = text.as_bytes();
    // Bytes, not `&text[..]`: a line troupe did not write may put a
    // multi-byte character where the `Z` goes (found by fuzzing).
    if b.len() != RFC3339_LEN || b[RFC3339_LEN - 1] != b'Z' {
        return None;
    }
    // Digits by hand: `str::parse` was most of a relayed line's
    // timestamp (every relayed event has one).
    let num = |range: std::ops::Range<usize>| -> Option<u64> {
        b[range].iter().try_fold(0u64, |n, &c| {
            c.is_ascii_digit().then(|| n * 10 + u64::from(c - b'0'))
        })
    };
    let separators = [
        (4, b'-'),
        (7, b'-'),
        (10, b'T'),
        (13, b':'),
        (16, b':'),
        (19, b'.'),
    ];
    if separators.iter().any(|&(i, c)| b[i] != c) {
        return None;
    }
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, min, s, micros) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..26)?);
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 || min > 59 || s > 60 {
        return None;
    }
    let days = u64::try_from(days_from_civil(y as i64, m as u32, d as u32)).ok()?;
    let secs = days * 86_400 + h * 3600 + min * 60 + s;
    Some(
        UNIX_EPOCH
            + std::time::Duration::from_secs(secs)
            + std::time::Duration::from_micros(micros),
    )
}

/// (year, month, day) to days since 1970-01-01: the inverse of
/// [`civil_from_days`] (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from(if m > 2 { m - 3 } else { m + 9 });
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Days since 1970-01-01 to (year, month, day), proleptic Gregorian
/// (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000000Z");
        let t = UNIX_EPOCH + Duration::from_micros(1_795_318_731_123_456);
        assert_eq!(rfc3339(t), "2026-11-22T03:38:51.123456Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000000Z");
    }

    #[test]
    fn rfc3339_formats_each_instant_whatever_this_thread_formatted_before() {
        // The seconds part is cached per thread: the same second, the
        // next one, a day boundary and a step back must each be right.
        let at = |micros: u64| rfc3339(UNIX_EPOCH + Duration::from_micros(micros));
        let midnight = 1_795_392_000_000_000; // 2026-11-23T00:00:00
        let cases = [
            (midnight - 1_000_001, "2026-11-22T23:59:58.999999Z"),
            (midnight - 1, "2026-11-22T23:59:59.999999Z"),
            (midnight - 999_999, "2026-11-22T23:59:59.000001Z"),
            (midnight, "2026-11-23T00:00:00.000000Z"),
            (midnight + 5, "2026-11-23T00:00:00.000005Z"),
            (midnight - 1, "2026-11-22T23:59:59.999999Z"),
            (0, "1970-01-01T00:00:00.000000Z"),
        ];
        for (micros, want) in cases {
            assert_eq!(at(micros), want, "{micros}");
        }
    }

    #[test]
    fn rfc3339_reads_back_what_it_writes() {
        for micros in [
            0,
            951_782_400_000_001,
            1_795_318_731_123_456,
            4_102_444_799_999_999,
        ] {
            let t = UNIX_EPOCH + Duration::from_micros(micros);
            assert_eq!(parse_rfc3339(&rfc3339(t)), Some(t), "{}", rfc3339(t));
        }
        for bad in [
            "",
            "2026-11-22T03:38:51Z",
            "2026-13-22T03:38:51.123456Z",
            "2026-11-22 03:38:51.123456Z",
            "2026-11-22T03:38:51.12345xZ",
            // A multi-byte character where the `Z` goes (found by fuzzing).
            "2026-11-26T10:08:01.75759\u{3e5}",
            "2026-11-26T10:08:01.7575\u{3e5}Z",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }
}
