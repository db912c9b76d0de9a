//! RFC 3339 timestamps of the audit log read as microseconds since the Unix
//! epoch, without a date library.

/// Microseconds since the Unix epoch of an RFC 3339 timestamp such as
/// `2026-11-22T03:05:31.123456Z` or `2026-11-22T04:05:31.5+01:00`: any
/// number of fraction digits (those past the sixth are cut), `Z` or a
/// numeric offset, `T`, `t` or a space between date and time. `None` for
/// anything else, including out-of-range fields.
pub fn parse_micros(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20 {
        return None;
    }
    let year = digits(b, 0, 4)?;
    let month = digits(b, 5, 2)?;
    let day = digits(b, 8, 2)?;
    let hour = digits(b, 11, 2)?;
    let minute = digits(b, 14, 2)?;
    let second = digits(b, 17, 2)?;
    let seps_ok = b[4] == b'-'
        && b[7] == b'-'
        && matches!(b[10], b'T' | b't' | b' ')
        && b[13] == b':'
        && b[16] == b':';
    if !seps_ok
        || !(1..=12).contains(&month)
        || !(1..=days_in_month(year, month)).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut i = 19;
    let mut micros = 0i64;
    if b[i] == b'.' {
        i += 1;
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            if i - start < 6 {
                micros = micros * 10 + i64::from(b[i] - b'0');
            }
            i += 1;
        }
        let n = i - start;
        if n == 0 {
            return None;
        }
        for _ in n..6 {
            micros *= 10;
        }
    }
    let offset_secs = match b.get(i..)? {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), h1, h2, b':', m1, m2] => {
            let h = digits(&[*h1, *h2], 0, 2)?;
            let m = digits(&[*m1, *m2], 0, 2)?;
            if h > 23 || m > 59 {
                return None;
            }
            let off = h * 3600 + m * 60;
            if *sign == b'+' { off } else { -off }
        }
        _ => return None,
    };
    let days = days_from_civil(year, month, day);
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset_secs;
    Some(secs * 1_000_000 + micros)
}

/// `n` ASCII digits of `b` from `at`, as a number.
fn digits(b: &[u8], at: usize, n: usize) -> Option<i64> {
    let mut v = 0i64;
    for &c in b.get(at..at + n)? {
        if !c.is_ascii_digit() {
            return None;
        }
        v = v * 10 + i64::from(c - b'0');
    }
    Some(v)
}

fn days_in_month(year: i64, month: i64) -> i64 {
    match month {
        2 if year % 4 == 0 && (year % 100 != 0 || year % 400 == 0) => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's
/// `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::parse_micros;

    #[test]
    fn reads_the_audit_log_format_and_its_variants() {
        assert_eq!(parse_micros("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(parse_micros("1970-01-01T00:00:01.5Z"), Some(1_500_000));
        assert_eq!(
            parse_micros("2026-11-22T03:05:31.123456Z"),
            Some(1_795_316_731_123_456)
        );
        // Offsets and extra fraction digits.
        assert_eq!(
            parse_micros("2026-11-22T04:05:31.1234569+01:00"),
            parse_micros("2026-11-22T03:05:31.123456Z")
        );
        assert_eq!(
            parse_micros("2000-02-29 12:00:00z"),
            Some(951_825_600_000_000)
        );
    }

    #[test]
    fn refuses_what_is_not_a_timestamp() {
        for bad in [
            "",
            "yesterday",
            "2026-11-22",
            "2026-13-01T00:00:00Z",
            "2026-02-30T00:00:00Z",
            "2026-11-22T03:05:31",
            "2026-11-22T03:05:31.Z",
            "2026-11-22T03:05:31Zjunk",
            "2026-11-22T03:05:31+0100",
            "2026-11-22T3:05:31.000Z",
        ] {
            assert_eq!(parse_micros(bad), None, "{bad}");
        }
    }
}
