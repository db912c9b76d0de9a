//! What the openai provider needs to know: where the endpoint is, which
//! model, the API key (read from the environment and never printed), and
//! its limits. Built by the CLI from flags and the pipeline's `provider:`
//! block.

use std::fmt;
use std::time::Duration;

use reqwest::Url;

/// The hosted OpenAI API.
pub const DEFAULT_BASE_URL: &str = "https://api.openai.com/v1";
/// The environment variable the API key is read from by default.
pub const DEFAULT_API_KEY_ENV: &str = "OPENAI_API_KEY";
/// Requests in flight at once per provider, by default.
pub const DEFAULT_MAX_INFLIGHT: usize = 16;
/// How long a request may wait for its reply to start, and then for each
/// next event of a stream or for the whole of a plain reply, by default.
/// Local models can think for minutes.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(300);
/// Longest wait for a TCP (and TLS) connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// An API key. Its `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The key itself: only for the `Authorization` header and redaction.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret([redacted])")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[redacted]")
    }
}

/// Settings of one openai provider.
#[derive(Debug, Clone)]
pub struct OpenAiConfig {
    /// E.g. `http://127.0.0.1:8080/v1`; requests go to `<base>/chat/completions`.
    pub base_url: Url,
    /// `None`: the capability check picks the only model the server lists.
    pub model: Option<String>,
    /// The variable the key came from, for hints ("set OPENAI_API_KEY").
    pub api_key_env: String,
    /// `None`: no `Authorization` header (local servers need none).
    pub api_key: Option<Secret>,
    /// Ask for SSE streaming (`--no-stream` turns it off).
    pub stream: bool,
    /// At most this many requests in flight at once (`--max-inflight`).
    pub max_inflight: usize,
    /// How long to wait for the reply to start, then for each next event of
    /// a stream or for the whole of a plain reply.
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
}

impl OpenAiConfig {
    /// A config for `base_url` with defaults; the key is read from
    /// `api_key_env` (unset or empty: no key).
    pub fn new(base_url: &str, api_key_env: &str) -> Result<OpenAiConfig, String> {
        let base_url = parse_base_url(base_url)?;
        let api_key = crate::environ::var(api_key_env)
            .filter(|k| !k.trim().is_empty())
            .map(|k| Secret::new(k.trim()));
        Ok(OpenAiConfig {
            base_url,
            model: None,
            api_key_env: api_key_env.to_owned(),
            api_key,
            stream: true,
            max_inflight: DEFAULT_MAX_INFLIGHT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            connect_timeout: CONNECT_TIMEOUT,
        })
    }

    /// `<base>/<path>`.
    pub fn endpoint(&self, path: &str) -> Url {
        let mut url = self.base_url.clone();
        let joined = format!("{}/{path}", self.base_url.path().trim_end_matches('/'));
        url.set_path(&joined);
        url
    }
}

/// An `http(s)://` URL with no credentials, query or fragment; a trailing
/// slash is dropped.
pub fn parse_base_url(text: &str) -> Result<Url, String> {
    // Quoted without what may be a secret in it (a key in the query).
    let shown = crate::error::url_shown(text);
    let url = Url::parse(text.trim())
        .map_err(|e| format!("`{shown}` is not a URL ({e}); e.g. http://127.0.0.1:8080/v1"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "`{shown}`: the base URL must start with http:// or https://"
        ));
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(
            "the base URL must not carry credentials; put the key in an environment variable (--api-key-env)"
                .to_owned(),
        );
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(format!(
            "`{shown}`: the base URL must not have a query or fragment (put a key in an environment variable: --api-key-env)"
        ));
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_join_with_or_without_trailing_slash() {
        for base in ["http://127.0.0.1:8080/v1", "http://127.0.0.1:8080/v1/"] {
            let c = OpenAiConfig::new(base, "TROUPE_TEST_NO_SUCH_VAR").unwrap();
            assert_eq!(
                c.endpoint("chat/completions").as_str(),
                "http://127.0.0.1:8080/v1/chat/completions"
            );
            assert!(c.api_key.is_none());
        }
        let c = OpenAiConfig::new("http://localhost:11434", "TROUPE_TEST_NO_SUCH_VAR").unwrap();
        assert_eq!(
            c.endpoint("models").as_str(),
            "http://localhost:11434/models"
        );
    }

    #[test]
    fn bad_base_urls_are_rejected() {
        for bad in [
            "localhost:8080",
            "ftp://x/v1",
            "http://user:pw@x/v1",
            "http://x/v1?key=1",
            "",
        ] {
            assert!(parse_base_url(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("sk-very-secret");
        assert!(!format!("{s:?} {s}").contains("very-secret"));
    }
}
