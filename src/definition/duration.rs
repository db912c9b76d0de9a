//! Human durations in definitions and flags: `500ms`, `2s`, `1.5s`, `1m`, `1h`.

use std::time::Duration;

/// [`parse_duration`] for a timeout or a wait that cannot be zero.
pub fn parse_positive_duration(text: &str) -> Result<Duration, String> {
    match parse_duration(text)? {
        d if d.is_zero() => Err(format!("`{}` must be above zero", text.trim())),
        d => Ok(d),
    }
}

/// Parses a duration like `500ms`, `2s`, `1.5s`, `1m` or `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let value: f64 = number
        .parse()
        .map_err(|_| format!("`{text}` is not a duration (use e.g. 500ms, 2s, 1m)"))?;
    let seconds = match unit.trim() {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "" => return Err(format!("`{text}` needs a unit: ms, s, m or h")),
        other => {
            return Err(format!(
                "unknown duration unit `{other}` (use ms, s, m or h)"
            ));
        }
    };
    // A week is far beyond any sensible backoff or latency; it also keeps
    // the float finite and in range for Duration.
    if !(0.0..=604_800.0).contains(&seconds) {
        return Err(format!("`{text}` is out of range (0 to 168h)"));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// Formats a duration the way `parse_duration` reads it.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms.is_multiple_of(1000) && ms > 0 {
        format!("{}s", ms / 1000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("2s").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("0ms").unwrap(), Duration::ZERO);
    }

    #[test]
    fn rejects_nonsense() {
        for bad in ["", "ms", "5", "5 parsecs", "-1s", "1e9h", "1.2.3s"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn formats_round_trip() {
        assert_eq!(format_duration(Duration::from_secs(2)), "2s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
