//! OpenTelemetry traces of runs: `--otlp URL` (or the standard
//! `OTEL_EXPORTER_OTLP_*` variables) exports every run as one trace over
//! OTLP/HTTP with protobuf bodies. Spans are built from the run's events on
//! a sink thread of their own (`spans`) and posted in batches by the
//! exporter's thread (`export`), off the actors' path.

pub mod export;
pub mod spans;

use std::io;
use std::time::{Duration, Instant};

use troupe_actors::{Delivery, EventBus};

use crate::runtime::audit::Sink;
use crate::runtime::events::Event;

/// Where and how to export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpConfig {
    /// The traces endpoint (`…/v1/traces`).
    pub endpoint: reqwest::Url,
    /// Extra headers (`OTEL_EXPORTER_OTLP_HEADERS`), e.g. an API key.
    pub headers: Vec<(String, String)>,
    /// `service.name` (`OTEL_SERVICE_NAME`, default `troupe`).
    pub service: String,
    /// Export tool arguments and results too (`--otlp-content`).
    pub content: bool,
}

/// `text` with its `%XX` escapes decoded, as the OpenTelemetry spec
/// writes `OTEL_EXPORTER_OTLP_HEADERS` (`Authorization=Basic%20…`); a `%`
/// not followed by two hex digits stays as it is.
pub(crate) fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) if hex(h).is_some() && hex(l).is_some() => {
                let (h, l) = (hex(h).unwrap_or(0), hex(l).unwrap_or(0));
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl OtlpConfig {
    /// From `--otlp URL`, else the environment's
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (used as it is) or
    /// `OTEL_EXPORTER_OTLP_ENDPOINT` (`/v1/traces` appended); `None` when
    /// none is set. A URL that is not an http(s) one is an error.
    pub fn resolve(flag: Option<&str>, content: bool) -> Result<Option<OtlpConfig>, String> {
        let var = |n: &str| crate::environ::var(n).filter(|v| !v.trim().is_empty());
        // The standard switches turn the variables' export off; a flag
        // asks for it by name and wins.
        let off =
            |n: &str, value: &str| var(n).is_some_and(|v| v.trim().eq_ignore_ascii_case(value));
        if flag.is_none()
            && (off("OTEL_SDK_DISABLED", "true") || off("OTEL_TRACES_EXPORTER", "none"))
        {
            return Ok(None);
        }
        // Errors name where the endpoint came from.
        let (raw, whole, from) = match (flag, var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")) {
            (Some(f), _) => (
                f.to_owned(),
                f.trim_end_matches('/').ends_with("/v1/traces"),
                "--otlp",
            ),
            (None, Some(t)) => (t, true, "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            (None, None) => match var("OTEL_EXPORTER_OTLP_ENDPOINT") {
                Some(base) => (base, false, "OTEL_EXPORTER_OTLP_ENDPOINT"),
                None => return Ok(None),
            },
        };
        let mut url = reqwest::Url::parse(raw.trim()).map_err(|e| {
            format!(
                "{from}: the OTLP endpoint `{}` is not a URL: {e}",
                crate::error::url_shown(&raw)
            )
        })?;
        if !matches!(url.scheme(), "http" | "https") || url.host().is_none() {
            return Err(format!(
                "{from}: the OTLP endpoint `{}` is not an http(s) URL, e.g. http://127.0.0.1:4318",
                shown(&url)
            ));
        }
        if !whole {
            let path = format!("{}/v1/traces", url.path().trim_end_matches('/'));
            url.set_path(&path);
        }
        // A `--otlp` URL is troupe's own HTTP export whatever the
        // variables say to other programs.
        let protocol = var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .filter(|_| flag.is_none());
        if let Some(p) = protocol
            && p.trim() != "http/protobuf"
        {
            return Err(format!(
                "OTEL_EXPORTER_OTLP_PROTOCOL: it asks for `{}`; troupe exports OTLP over HTTP with protobuf only: set it to http/protobuf (and the endpoint to the collector's HTTP port, 4318), or unset it",
                p.trim()
            ));
        }
        // The traces' own headers win over the shared ones of that name.
        let mut headers: Vec<(String, String)> = Vec::new();
        for name in [
            "OTEL_EXPORTER_OTLP_HEADERS",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
        ] {
            for (k, v) in var(name)
                .iter()
                .flat_map(|h| h.split(','))
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (percent_decoded(k.trim()), percent_decoded(v.trim())))
            {
                // Checked here, not at the first post: a header that
                // cannot be sent would lose every span, said only at the
                // run's end. The value is never quoted (an API key).
                if reqwest::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(format!("{name}: `{k}` is not a header name"));
                }
                if reqwest::header::HeaderValue::from_str(&v).is_err() {
                    return Err(format!(
                        "{name}: the value of header `{k}` holds characters a header cannot carry (a control character or a line break)"
                    ));
                }
                headers.retain(|(old, _)| !old.eq_ignore_ascii_case(&k));
                headers.push((k, v));
            }
        }
        Ok(Some(OtlpConfig {
            endpoint: url,
            headers,
            service: var("OTEL_SERVICE_NAME").unwrap_or_else(|| "troupe".to_owned()),
            content,
        }))
    }
}

/// Spans are posted in batches of this many, or sooner (`LINGER`).
const BATCH: usize = 512;
/// Or of about this many bytes (looked at every 32 spans): under the
/// 4 MiB a collector takes in one post by default.
const BATCH_BYTES: usize = 2 << 20;
const LINGER: Duration = Duration::from_millis(500);
/// How long the end of a run waits for the last batches.
const GRACE: Duration = Duration::from_secs(2);

/// Starts exporting run `run_id`'s events as spans.
pub fn start_otlp(bus: &EventBus<Event>, run_id: &str, config: OtlpConfig) -> io::Result<Sink> {
    let sub = bus.subscribe_audit("otlp", 65_536);
    let mut book = spans::SpanBook::new(run_id, config.content);
    let endpoint = config.endpoint.clone();
    let exporter = export::Exporter::start(config)?;
    let handle = std::thread::Builder::new()
        .name("troupe-otlp-spans".into())
        .spawn(move || {
            let mut batch = Vec::new();
            let mut weighed = 0usize;
            let mut since = Instant::now();
            let mut total = 0u64;
            loop {
                // A burst is drained without a clock read per event.
                let next = match sub.try_recv() {
                    Some(d) => Ok(d),
                    None => sub.recv_timeout(LINGER),
                };
                match next {
                    Ok(Delivery::Event(envelope)) => {
                        book.take(envelope.seq, &envelope.event, &mut batch)
                    }
                    Ok(_) | Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                    Err(crossbeam_channel::RecvTimeoutError::Disconnected) => break,
                }
                // A batch also goes out once its spans hold about
                // `BATCH_BYTES` (each attribute value is capped): a
                // collector refuses a post past its body limit whole.
                // Weighed every 32 spans.
                let heavy = batch.len() >= weighed + 32 && {
                    weighed = batch.len();
                    batch.iter().map(prost::Message::encoded_len).sum::<usize>() >= BATCH_BYTES
                };
                if batch.len() >= BATCH || heavy || (!batch.is_empty() && since.elapsed() >= LINGER)
                {
                    weighed = 0;
                    total += batch.len() as u64;
                    exporter.send(std::mem::take(&mut batch));
                    since = Instant::now();
                }
            }
            book.finish(&mut batch);
            total += batch.len() as u64;
            exporter.send(batch);
            let counts = std::sync::Arc::clone(&exporter.counts);
            exporter.finish(GRACE);
            let sent = counts.sent.load(std::sync::atomic::Ordering::Relaxed);
            if sent < total {
                let why = counts
                    .first_error
                    .lock()
                    .ok()
                    .and_then(|e| e.clone())
                    .unwrap_or_else(|| "the collector did not answer in time".to_owned());
                say!(
                    "warning: OTLP export to {}: {} of {total} spans not delivered ({why})",
                    shown(&endpoint),
                    total - sent
                );
            }
            Ok(sent)
        })?;
    Ok(Sink::from_thread(handle))
}

/// An endpoint as said on stderr: no user, password or query, which may
/// hold a credential (`https://user:token@host/…`, `?api_key=…`).
fn shown(endpoint: &reqwest::Url) -> String {
    let mut url = endpoint.clone();
    let _ = url.set_username("");
    let _ = url.set_password(None);
    url.set_query(None);
    url.to_string()
}

#[cfg(test)]
mod tests {
    use super::percent_decoded;

    #[test]
    fn header_values_are_percent_decoded_as_the_spec_writes_them() {
        assert_eq!(
            percent_decoded("Basic%20dXNlcjpwdw%3D%3D"),
            "Basic dXNlcjpwdw=="
        );
        assert_eq!(percent_decoded("x-team"), "x-team");
        // A `%` that starts no escape stays.
        assert_eq!(percent_decoded("100%"), "100%");
        assert_eq!(percent_decoded("%zz%4"), "%zz%4");
    }
}
