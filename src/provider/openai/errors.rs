//! Turning what went wrong on the wire into typed `ProviderError`s:
//!
//! | cause | error |
//! |---|---|
//! | 429 | `ProviderTransient/RateLimited` (with `Retry-After`) |
//! | 429 with `insufficient_quota` | `ExtensionHost/QuotaExceeded` (terminal) |
//! | 408, 5xx | `ProviderTransient/Timeout`, `ProviderTransient/ServerError` |
//! | refused / reset / closed connection | `ProviderTransient/ConnectionFailed` |
//! | no answer within `--request-timeout` | `ProviderTransient/Timeout` |
//! | 401, 403 | `ExtensionHost/Unauthorized` with a hint about the key's variable |
//! | 404 | `ExtensionHost/NotFound` with a hint about `--base-url` / `--model` |
//! | 400 with `context_length_exceeded` | `ExtensionHost/ContextLengthExceeded` |
//! | other 4xx | `ExtensionHost/BadRequest` with the server's message |
//! | 3xx (never followed) | `ExtensionHost/Redirected`, naming the target |
//! | an `error` inside a 200 | as its `code`'s status, else `ServerError` |
//!
//! Messages carry the server's own words (`{"error":{"message":…}}`), cut
//! to a readable length, and never the API key (see `redact`).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use reqwest::StatusCode;
use reqwest::header::HeaderMap;
use serde_json::Value;

use crate::provider::ProviderError;

/// The server's message is cut to this many characters.
const MAX_MESSAGE_CHARS: usize = 500;

/// What a non-2xx reply said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerError {
    pub message: String,
    /// `error.code` or `error.type`, e.g. `insufficient_quota`.
    pub kind: Option<String>,
}

/// Reads the server's error message from an error body: OpenAI's
/// `{"error":{"message","code","type"}}`, `{"error":"…"}`, `{"message":…}`,
/// `{"detail":…}`, or the text itself.
pub fn server_error(body: &[u8]) -> ServerError {
    let parsed: Option<Value> = serde_json::from_slice(body).ok();
    let pick = |v: &Value| -> Option<String> {
        match v {
            Value::String(s) => Some(s.clone()),
            Value::Null => None,
            other => Some(other.to_string()),
        }
    };
    let (message, kind) = match &parsed {
        Some(Value::Object(obj)) => {
            let err = obj.get("error");
            let message = match err {
                Some(Value::Object(e)) => e.get("message").and_then(pick),
                Some(other) => pick(other),
                None => None,
            }
            .or_else(|| obj.get("message").and_then(pick))
            .or_else(|| obj.get("detail").and_then(pick));
            let kind = match err {
                Some(Value::Object(e)) => e
                    .get("code")
                    .and_then(Value::as_str)
                    .or_else(|| e.get("type").and_then(Value::as_str))
                    .map(str::to_owned),
                _ => None,
            };
            (message, kind)
        }
        _ => (None, None),
    };
    let message = message.unwrap_or_else(|| String::from_utf8_lossy(body).trim().to_owned());
    ServerError {
        message: shorten(&message),
        kind,
    }
}

/// One line, at most `MAX_MESSAGE_CHARS` characters.
pub fn shorten(text: &str) -> String {
    let one_line = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if one_line.chars().count() <= MAX_MESSAGE_CHARS {
        return one_line;
    }
    let mut cut: String = one_line.chars().take(MAX_MESSAGE_CHARS).collect();
    cut.push('…');
    cut
}

/// The error for a non-2xx status. `key_env` names the key's variable for
/// the 401/403 hint; `has_key` says whether a key was sent.
pub fn status_error(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
    key_env: &str,
    has_key: bool,
) -> ProviderError {
    let server = server_error(body);
    let said = if server.message.is_empty() {
        String::new()
    } else {
        format!(": {}", server.message)
    };
    let retry_after = retry_after(headers, SystemTime::now());
    let transient = |code, what: &str| ProviderError::Transient {
        code,
        message: format!("HTTP {status} {what}{said}"),
        retry_after,
        usage: None,
    };
    let terminal = |code, message: String| ProviderError::Terminal { code, message };
    match status.as_u16() {
        429 if server.kind.as_deref() == Some("insufficient_quota") => terminal(
            "QuotaExceeded",
            format!("HTTP {status}: the account's quota is used up{said}"),
        ),
        429 => transient("RateLimited", "(rate limited)"),
        408 => transient("Timeout", "(the server timed out)"),
        500..=599 => transient("ServerError", "(server error)"),
        401 | 403 => {
            let hint = if has_key {
                format!("check the API key in ${key_env}")
            } else {
                format!(
                    "no API key was sent: set ${key_env} (or name another variable with --api-key-env)"
                )
            };
            terminal("Unauthorized", format!("HTTP {status}{said} — {hint}"))
        }
        404 => terminal(
            "NotFound",
            format!("HTTP {status}{said} — check --base-url (it usually ends in /v1) and --model"),
        ),
        300..=399 => {
            let to = headers
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(shorten)
                .unwrap_or_else(|| "somewhere it did not say".to_owned());
            terminal(
                "Redirected",
                format!(
                    "HTTP {status}: the server redirects to {to} — use that address as --base-url (a redirected request would lose its body and its key)"
                ),
            )
        }
        400 | 413 | 422
            if is_context_overflow(server.kind.as_deref())
                || status == StatusCode::PAYLOAD_TOO_LARGE =>
        {
            terminal(
                "ContextLengthExceeded",
                format!("HTTP {status}: the transcript is too long for the model{said}"),
            )
        }
        _ => terminal("BadRequest", format!("HTTP {status}{said}")),
    }
}

/// Whether an error's `code`/`type` says the transcript is too long:
/// OpenAI's `context_length_exceeded`, llama.cpp's
/// `exceed_context_size_error`.
fn is_context_overflow(kind: Option<&str>) -> bool {
    matches!(
        kind,
        Some("context_length_exceeded" | "exceed_context_size_error")
    )
}

/// An error a server reported inside a successful reply: a top-level
/// `error` in a completion or in a streamed chunk, or the data of a
/// stream's `event: error` (llama.cpp's server). A `code` that is an HTTP
/// status decides as that status would (a 4xx is the request's fault and
/// is not retried); else it is a transient server error.
pub fn reported_error(error: &Value) -> ProviderError {
    let body = serde_json::json!({ "error": error }).to_string();
    let server = server_error(body.as_bytes());
    let message = format!(
        "the server reported an error in its reply: {}",
        server.message
    );
    let status = error
        .get("code")
        .and_then(Value::as_u64)
        .and_then(|c| u16::try_from(c).ok())
        .filter(|c| (400..=599).contains(c));
    let terminal = |code| ProviderError::Terminal {
        code,
        message: message.clone(),
    };
    let transient = |code| ProviderError::transient(code, message.clone());
    match (status, server.kind.as_deref()) {
        (_, kind) if is_context_overflow(kind) => terminal("ContextLengthExceeded"),
        (_, Some("insufficient_quota")) => terminal("QuotaExceeded"),
        (Some(429), _) => transient("RateLimited"),
        (Some(408), _) => transient("Timeout"),
        (Some(401 | 403), _) => terminal("Unauthorized"),
        (Some(404), _) => terminal("NotFound"),
        (Some(400..=499), _) => terminal("BadRequest"),
        _ => transient("ServerError"),
    }
}

/// A transport failure (no complete HTTP reply).
pub fn transport_error(err: &reqwest::Error) -> ProviderError {
    // The chain of causes says what happened ("connection refused"); the
    // URL is left out: it is in the provider's config, not in each error.
    let message = shorten(&crate::error::with_causes(err));
    if err.is_builder() {
        return ProviderError::Terminal {
            code: "InvalidRequest",
            message,
        };
    }
    let code = if err.is_timeout() {
        "Timeout"
    } else {
        "ConnectionFailed"
    };
    ProviderError::transient(code, message)
}

/// `retry-after-ms` (milliseconds, sent by some gateways) or `Retry-After`
/// (seconds or an HTTP date).
pub fn retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    if let Some(ms) = headers
        .get("retry-after-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<f64>().ok())
        .filter(|ms| ms.is_finite() && *ms >= 0.0 && *ms < 1e12)
    {
        return Some(Duration::from_secs_f64(ms / 1000.0));
    }
    headers
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, now))
}

/// A `Retry-After` value: delay-seconds (`120`, also `1.5`), or an HTTP date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`; a past date means now).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs.min(u64::from(u32::MAX))));
    }
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && (0.0..1e9).contains(&secs))
            .then(|| Duration::from_secs_f64(secs));
    }
    let at = parse_http_date(value)?;
    Some(at.duration_since(now).unwrap_or(Duration::ZERO))
}

/// An HTTP date, in any of the three forms HTTP has had.
pub fn parse_http_date(text: &str) -> Option<SystemTime> {
    // IMF-fixdate `Sun, 06 Nov 1994 08:49:37 GMT`, RFC 850 `Sunday,
    // 06-Nov-94 08:49:37 GMT`, asctime `Sun Nov  6 08:49:37 1994`: a
    // recipient must read all three (RFC 9110, 5.6.7).
    let parts: Vec<&str> = text.split_whitespace().collect();
    let (day, month, year, time) = match parts.as_slice() {
        [weekday, day, month, year, time, "GMT"] if weekday.ends_with(',') => {
            (*day, *month, year.parse::<i64>().ok()?, *time)
        }
        [weekday, date, time, "GMT"] if weekday.ends_with(',') => {
            let mut dmy = date.split('-');
            let (day, month, yy) = (dmy.next()?, dmy.next()?, dmy.next()?);
            if dmy.next().is_some() || yy.len() != 2 {
                return None;
            }
            // Two digits: the century that puts it nearest now (RFC 9110
            // says within fifty years of now; no date this far out is).
            let yy: i64 = yy.parse().ok()?;
            let year = if yy < 70 { 2000 + yy } else { 1900 + yy };
            (day, month, year, *time)
        }
        [_weekday, month, day, time, year] => (*day, *month, year.parse::<i64>().ok()?, *time),
        _ => return None,
    };
    let day: u32 = day.parse().ok()?;
    let month = match month {
        "Jan" => 1,
        "Feb" => 2,
        "Mar" => 3,
        "Apr" => 4,
        "May" => 5,
        "Jun" => 6,
        "Jul" => 7,
        "Aug" => 8,
        "Sep" => 9,
        "Oct" => 10,
        "Nov" => 11,
        "Dec" => 12,
        _ => return None,
    };
    let mut hms = time.split(':');
    let h: u64 = hms.next()?.parse().ok()?;
    let m: u64 = hms.next()?.parse().ok()?;
    let s: u64 = hms.next()?.parse().ok()?;
    if hms.next().is_some() {
        return None;
    }
    if !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 || !(1970..=9999).contains(&year) {
        return None;
    }
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    let secs = days * 86_400 + h * 3600 + m * 60 + s;
    UNIX_EPOCH.checked_add(Duration::from_secs(secs))
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's
/// algorithm; the inverse of the one in `runtime::events`).
fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let m = i64::from(m);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `message` with every occurrence of `secret` replaced by `[redacted]`,
/// and the start of one that [`shorten`] cut off at its end (`…`): a
/// server that echoes the key can place it across the cut.
pub fn redact_str(message: String, secret: Option<&str>) -> String {
    let Some(secret) = secret.filter(|s| !s.is_empty()) else {
        return message;
    };
    let mut message = if message.contains(secret) {
        message.replace(secret, "[redacted]")
    } else {
        message
    };
    if let Some(kept) = message.strip_suffix('…') {
        // The longest start of the secret the cut text ends with; a few
        // characters at least, so that a word is not taken for one.
        let cut = (4..secret.len())
            .rev()
            .filter(|n| secret.is_char_boundary(*n))
            .find(|n| kept.ends_with(&secret[..*n]));
        if let Some(n) = cut {
            message = format!("{}[redacted]…", &kept[..kept.len() - n]);
        }
    }
    message
}

/// Replaces every occurrence of `secret` in the error's message.
pub fn redact(err: ProviderError, secret: Option<&str>) -> ProviderError {
    if secret.is_none_or(str::is_empty) {
        return err;
    }
    let clean = |m: String| redact_str(m, secret);
    match err {
        ProviderError::Transient {
            code,
            message,
            retry_after,
            usage,
        } => ProviderError::Transient {
            code,
            message: clean(message),
            retry_after,
            usage,
        },
        ProviderError::Terminal { code, message } => ProviderError::Terminal {
            code,
            message: clean(message),
        },
        ProviderError::Capability { code, message } => ProviderError::Capability {
            code,
            message: clean(message),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A key the server echoed where its message is cut is redacted as
    /// far as it goes; a word that merely starts like the key is not.
    #[test]
    fn a_key_cut_at_the_end_of_a_shortened_message_is_redacted() {
        let key = "sk-live-0123456789abcdefghij";
        let body = format!("{} {key} more", "x".repeat(MAX_MESSAGE_CHARS - 20));
        let short = shorten(&body);
        assert!(short.ends_with('…') && !short.contains(key), "{short}");
        let red = redact_str(short, Some(key));
        assert!(red.ends_with(" [redacted]…"), "{red}");
        assert!(!red.contains("sk-live-0"), "{red}");
        assert_eq!(redact_str("a word sk…".to_owned(), Some(key)), "a word sk…");
        assert_eq!(
            redact_str(format!("all of it: {key}"), Some(key)),
            "all of it: [redacted]"
        );
    }
    use reqwest::header::HeaderValue;

    #[test]
    fn retry_after_seconds_and_dates() {
        let now = UNIX_EPOCH + Duration::from_secs(1_445_412_480); // 2015-10-21T07:28:00Z
        assert_eq!(
            parse_retry_after("120", now),
            Some(Duration::from_secs(120))
        );
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("1.5", now),
            Some(Duration::from_millis(1500))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:28:30 GMT", now),
            Some(Duration::from_secs(30))
        );
        assert_eq!(
            parse_retry_after("Wed, 21 Oct 2015 07:00:00 GMT", now),
            Some(Duration::ZERO),
            "a date in the past means now"
        );
        for bad in ["", "soon", "-3", "Wed, 21 Oct 2015 07:28:30 PST", "NaN"] {
            assert_eq!(parse_retry_after(bad, now), None, "{bad}");
        }
    }

    #[test]
    fn http_dates_match_the_epoch_arithmetic() {
        let t = parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 784_111_777);
        let leap = parse_http_date("Tue, 29 Feb 2000 00:00:00 GMT").unwrap();
        assert_eq!(
            leap.duration_since(UNIX_EPOCH).unwrap().as_secs(),
            951_782_400
        );
        // The obsolete forms a recipient must read too (RFC 9110, 5.6.7).
        assert_eq!(parse_http_date("Sunday, 06-Nov-94 08:49:37 GMT"), Some(t));
        assert_eq!(parse_http_date("Sun Nov  6 08:49:37 1994"), Some(t));
        assert_eq!(
            parse_http_date("Tuesday, 29-Feb-00 00:00:00 GMT"),
            Some(leap)
        );
        for bad in [
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sunday, 06-Nov-1994 08:49:37 GMT",
            "Sun Nov 6 08:49 1994",
            "06 Nov 1994",
        ] {
            assert_eq!(parse_http_date(bad), None, "{bad}");
        }
    }

    #[test]
    fn retry_after_ms_wins() {
        let mut h = HeaderMap::new();
        h.insert("retry-after", HeaderValue::from_static("7"));
        h.insert("retry-after-ms", HeaderValue::from_static("250"));
        assert_eq!(
            retry_after(&h, SystemTime::now()),
            Some(Duration::from_millis(250))
        );
    }

    #[test]
    fn statuses_map_to_codes() {
        let h = HeaderMap::new();
        let code = |status: u16, body: &str| {
            let e = status_error(
                StatusCode::from_u16(status).unwrap(),
                &h,
                body.as_bytes(),
                "OPENAI_API_KEY",
                false,
            );
            use crate::error::HasCode;
            e.code().to_string()
        };
        assert_eq!(code(429, "{}"), "ProviderTransient/RateLimited");
        assert_eq!(
            code(
                429,
                r#"{"error":{"message":"quota","code":"insufficient_quota"}}"#
            ),
            "ExtensionHost/QuotaExceeded"
        );
        assert_eq!(code(500, ""), "ProviderTransient/ServerError");
        assert_eq!(code(503, ""), "ProviderTransient/ServerError");
        assert_eq!(code(408, ""), "ProviderTransient/Timeout");
        assert_eq!(code(401, ""), "ExtensionHost/Unauthorized");
        assert_eq!(code(404, ""), "ExtensionHost/NotFound");
        assert_eq!(code(400, "bad"), "ExtensionHost/BadRequest");
        assert_eq!(
            code(
                400,
                r#"{"error":{"message":"too long","code":"context_length_exceeded"}}"#
            ),
            "ExtensionHost/ContextLengthExceeded"
        );
    }

    #[test]
    fn the_servers_message_is_kept_and_the_hint_names_the_variable() {
        let e = status_error(
            StatusCode::UNAUTHORIZED,
            &HeaderMap::new(),
            br#"{"error":{"message":"Incorrect API key provided"}}"#,
            "MY_KEY",
            false,
        );
        let m = e.to_string();
        assert!(m.contains("Incorrect API key provided"), "{m}");
        assert!(m.contains("$MY_KEY"), "{m}");
        assert_eq!(server_error(b"  plain text  ").message, "plain text");
        assert_eq!(server_error(br#"{"error":"nope"}"#).message, "nope");
        assert_eq!(server_error(br#"{"detail":"nah"}"#).message, "nah");
        assert!(server_error(&[b'x'; 2000]).message.chars().count() <= MAX_MESSAGE_CHARS + 1);
    }

    #[test]
    fn redaction_removes_the_key_everywhere() {
        let e = ProviderError::Terminal {
            code: "BadRequest",
            message: "you sent sk-abc and sk-abc".into(),
        };
        assert_eq!(
            redact(e, Some("sk-abc")).to_string(),
            "you sent [redacted] and [redacted]"
        );
    }
}
