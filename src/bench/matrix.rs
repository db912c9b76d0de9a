//! The benchmark matrix flags: comma-separated lists of widths, caps and
//! latencies (`--width 100,1000,10000 --cap 16,256 --latency 0ms,50ms`).

use std::time::Duration;

use crate::definition::duration::{format_duration, parse_duration};

/// Largest width a cell may ask for.
pub const MAX_WIDTH: usize = 10_000_000;

/// Parses a list of positive integers up to `max`, e.g. `100,1000`.
pub fn parse_counts(text: &str, what: &str, max: usize) -> Result<Vec<usize>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim().replace('_', "");
        if part.is_empty() {
            return Err(format!("`{text}`: an empty {what} in the list"));
        }
        let n: usize = part
            .parse()
            .map_err(|_| format!("`{part}` is not a {what} (a whole number)"))?;
        if n == 0 || n > max {
            return Err(format!("{what} `{part}` is out of range (1 to {max})"));
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}

/// Parses a list of durations, e.g. `0ms,50ms`.
pub fn parse_latencies(text: &str) -> Result<Vec<Duration>, String> {
    let mut out = Vec::new();
    for part in text.split(',') {
        let part = part.trim();
        if part.is_empty() {
            return Err(format!("`{text}`: an empty latency in the list"));
        }
        let d = parse_duration(part)?;
        if d > Duration::from_secs(60) {
            return Err(format!("latency `{part}` is out of range (0 to 60s)"));
        }
        if !out.contains(&d) {
            out.push(d);
        }
    }
    Ok(out)
}

/// A latency as the table shows it (`0ms`, `50ms`, `2s`).
pub fn show_latency(d: Duration) -> String {
    if d.is_zero() {
        "0ms".to_owned()
    } else {
        format_duration(d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_parse_dedupe_and_reject_bad_values() {
        assert_eq!(
            parse_counts("100, 1000,10_000,100", "width", MAX_WIDTH).unwrap(),
            vec![100, 1000, 10_000]
        );
        assert!(parse_counts("0", "width", MAX_WIDTH).is_err());
        assert!(parse_counts("10,", "width", MAX_WIDTH).is_err());
        assert!(parse_counts("ten", "width", MAX_WIDTH).is_err());
        assert!(parse_counts("-5", "cap", 100).is_err());
        assert!(parse_counts("101", "cap", 100).is_err());
    }

    #[test]
    fn latencies_parse_with_units() {
        assert_eq!(
            parse_latencies("0ms,50ms,1s").unwrap(),
            vec![
                Duration::ZERO,
                Duration::from_millis(50),
                Duration::from_secs(1)
            ]
        );
        assert!(parse_latencies("50").is_err());
        assert!(parse_latencies("2m").is_err());
        assert!(parse_latencies("").is_err());
        assert_eq!(show_latency(Duration::ZERO), "0ms");
        assert_eq!(show_latency(Duration::from_millis(50)), "50ms");
    }
}
