//! A Streamable HTTP server's transport: its headers read from the
//! environment, no redirects followed, and a bounded resumption of the
//! streams it answers on.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::transport::streamable_http_client::{
    StreamableHttpClientTransport, StreamableHttpClientTransportConfig,
};

use super::McpError;

/// The transport of server `server` at `url`, with the headers
/// `headers_from_env` names (`(header, variable)`). `gave_up` is set when
/// one of its streams could not be resumed ([`ResumeBriefly`]).
pub(super) fn transport(
    server: &str,
    url: &str,
    headers_from_env: &[(String, String)],
    gave_up: Arc<AtomicBool>,
) -> Result<StreamableHttpClientTransport<reqwest::Client>, McpError> {
    let mut headers = HashMap::new();
    for (header, var) in headers_from_env {
        let value = crate::environ::var(var).ok_or_else(|| {
            McpError::new(
                "MissingSecret",
                format!(
                    "MCP server `{server}`: header `{header}` is read from ${var}, which is not set"
                ),
            )
        })?;
        let name = reqwest::header::HeaderName::from_bytes(header.as_bytes()).map_err(|_| {
            McpError::new("InvalidHeader", format!("`{header}` is not a header name"))
        })?;
        let mut value = reqwest::header::HeaderValue::from_str(&value).map_err(|_| {
            McpError::new(
                "InvalidHeader",
                format!("${var} holds characters a header cannot carry"),
            )
        })?;
        value.set_sensitive(true);
        headers.insert(name, value);
    }
    let mut config = StreamableHttpClientTransportConfig::with_uri(url).custom_headers(headers);
    config.retry_config = Arc::new(ResumeBriefly { gave_up });
    // Not following redirects: reqwest drops only its own credential
    // headers on a redirect to another host, and `headersFromEnv` values
    // would go there.
    let client = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| {
            McpError::new(
                "InitializeFailed",
                format!("cannot start the HTTP client for `{server}`: {e}"),
            )
        })?;
    Ok(StreamableHttpClientTransport::with_client(client, config))
}

/// Why `initialize` failed. A transport's error is said with its causes
/// and without the SDK's wrapping, which names the transport's Rust type
/// (`Send message error Transport [troupe::tools::mcp::watched::…]`) and
/// leaves out the cause that matters (`Connection refused`).
pub(super) fn initialize_failure(e: &rmcp::service::ClientInitializeError) -> String {
    match e {
        rmcp::service::ClientInitializeError::TransportError { error, context } => {
            use rmcp::transport::streamable_http_client::StreamableHttpError;
            // The HTTP client's error is not given as its wrapper's source.
            let causes = match error
                .error
                .downcast_ref::<StreamableHttpError<reqwest::Error>>()
            {
                Some(StreamableHttpError::Client(e)) => crate::error::with_causes(e),
                _ => crate::error::with_causes(&*error.error),
            };
            format!("{causes} ({context})")
        }
        other => other.to_string(),
    }
}

/// How a Streamable HTTP stream that ended early is resumed (a `GET`
/// with `Last-Event-ID`, as the protocol asks): three tries within about
/// two seconds (further apart if the server's `retry:` field says so),
/// then a call waiting on the stream is told its connection closed
/// (`ServerExited`). The SDK's own policy tries forever, doubling its
/// wait: a call whose server died or restarted (a restarted server knows
/// no session, and answers the resumption 400) waited out its whole
/// timeout. The same policy serves the session's own stream (the server's
/// notifications outside any call, `tools/list_changed` among them):
/// once a stream gives up, the connection counts as gone, and the next
/// call starts a new session with a stream of its own.
#[derive(Debug)]
struct ResumeBriefly {
    gave_up: Arc<AtomicBool>,
}

impl rmcp::transport::common::client_side_sse::SseRetryPolicy for ResumeBriefly {
    fn retry(&self, failed: usize) -> Option<std::time::Duration> {
        if failed >= 3 {
            self.gave_up.store(true, Ordering::Relaxed);
            return None;
        }
        Some(std::time::Duration::from_millis(250 << failed))
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_stream_is_resumed_three_times_then_its_connection_counts_as_gone() {
        use rmcp::transport::common::client_side_sse::SseRetryPolicy;
        let gave_up = Arc::new(AtomicBool::new(false));
        let policy = ResumeBriefly {
            gave_up: Arc::clone(&gave_up),
        };
        let waits: Vec<_> = (0..3).map(|n| policy.retry(n)).collect();
        assert_eq!(
            waits,
            [250, 500, 1000].map(|ms| Some(Duration::from_millis(ms)))
        );
        assert!(!gave_up.load(Ordering::Relaxed), "still trying");
        assert_eq!(policy.retry(3), None);
        assert!(gave_up.load(Ordering::Relaxed));
    }
}
