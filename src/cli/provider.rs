//! Which provider `troupe run` uses and how it is set up: flags first, then
//! the pipeline's `provider:` block, then defaults. `--base-url` or
//! `--model` alone select `openai`, so pointing troupe at a local server is
//! one flag.

use std::time::Duration;

use crate::definition::duration::{parse_duration, parse_positive_duration};
use crate::definition::{Pipeline, ProviderBlock, ProviderKind};
use crate::provider::openai::{
    DEFAULT_API_KEY_ENV, DEFAULT_BASE_URL, DEFAULT_MAX_INFLIGHT, DEFAULT_REQUEST_TIMEOUT,
    OpenAiConfig,
};

/// `--provider`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ProviderChoice {
    /// Offline and deterministic: script.yaml or synthesized payloads.
    Scripted,
    /// Any OpenAI-compatible /v1/chat/completions endpoint.
    Openai,
}

/// The provider flags of `troupe run`.
#[derive(Debug, Clone, Default, clap::Args)]
#[command(next_help_heading = "Model provider")]
pub struct ProviderArgs {
    /// scripted (offline, the default) or openai (any OpenAI-compatible
    /// endpoint). Beats `provider.kind` in pipeline.yaml.
    #[arg(long, value_enum)]
    pub provider: Option<ProviderChoice>,
    /// The API root of an OpenAI-compatible server, e.g.
    /// http://127.0.0.1:8080/v1 (default https://api.openai.com/v1).
    /// Implies --provider openai.
    #[arg(long, value_name = "URL")]
    pub base_url: Option<String>,
    /// The model to ask. Without it, the one model the server lists is used.
    #[arg(long, value_name = "NAME")]
    pub model: Option<String>,
    /// The environment variable holding the API key [default: OPENAI_API_KEY].
    /// Unset or empty: no key is sent (local servers need none).
    #[arg(long, value_name = "VAR")]
    pub api_key_env: Option<String>,
    /// Ask for plain JSON replies instead of SSE streams.
    #[arg(long)]
    pub no_stream: bool,
    /// Most model requests in flight at once [default: 16]; the others wait
    /// for a slot.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub max_inflight: Option<u32>,
    /// How long a request may wait for the reply to start, then for each
    /// next event of a stream (keep-alive pings do not count) or for the
    /// whole of a plain reply [default: 5m].
    #[arg(long, value_name = "DURATION", value_parser = parse_positive_duration)]
    pub request_timeout: Option<Duration>,
    /// Retries of a transient provider error (429, 5xx, connection
    /// failure, timeout) before the stage fails [default: 3].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=100))]
    pub provider_retries: Option<u32>,
    /// First backoff between retries, doubling up to 10 s (or up to this
    /// value when larger), with jitter; a server's Retry-After is honoured
    /// when longer [default: 500ms].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub provider_backoff: Option<Duration>,
    /// Skip the capability check at run start (endpoint reachable, model
    /// calls tools). Needs --model.
    #[arg(long)]
    pub skip_check: bool,
}

/// The chosen provider.
#[derive(Debug, Clone)]
pub enum ProviderSetup {
    Scripted,
    Openai {
        config: Box<OpenAiConfig>,
        skip_check: bool,
    },
}

impl ProviderArgs {
    /// Flags over the pipeline's block over defaults. Errors are messages
    /// for `Validation/InputInvalid`.
    pub fn resolve(&self, pipeline: &Pipeline) -> Result<ProviderSetup, String> {
        let file = pipeline.provider.clone().unwrap_or_default();
        let kind = match self.provider {
            Some(ProviderChoice::Scripted) => ProviderKind::Scripted,
            Some(ProviderChoice::Openai) => ProviderKind::Openai,
            None if self.base_url.is_some() || self.model.is_some() => ProviderKind::Openai,
            None => file
                .kind
                .unwrap_or(if file.base_url.is_some() || file.model.is_some() {
                    ProviderKind::Openai
                } else {
                    ProviderKind::Scripted
                }),
        };
        match kind {
            ProviderKind::Scripted => {
                if self.provider == Some(ProviderChoice::Scripted)
                    && (self.base_url.is_some() || self.model.is_some())
                {
                    return Err(
                        "--base-url and --model are for --provider openai, not scripted".to_owned(),
                    );
                }
                Ok(ProviderSetup::Scripted)
            }
            ProviderKind::Openai => self.openai(&file).map(|config| ProviderSetup::Openai {
                config: Box::new(config),
                skip_check: self.skip_check,
            }),
        }
    }

    fn openai(&self, file: &ProviderBlock) -> Result<OpenAiConfig, String> {
        let base_url = self
            .base_url
            .as_deref()
            .or(file.base_url.as_deref())
            .unwrap_or(DEFAULT_BASE_URL);
        let key_env = self
            .api_key_env
            .as_deref()
            .or(file.api_key_env.as_deref())
            .unwrap_or(DEFAULT_API_KEY_ENV);
        let source = match (&self.base_url, &file.base_url) {
            (Some(_), _) => "--base-url",
            (None, Some(_)) => "provider.baseUrl in pipeline.yaml",
            (None, None) => "the default base URL",
        };
        let mut config =
            OpenAiConfig::new(base_url, key_env).map_err(|e| format!("{source}: {e}"))?;
        config.model = self.model.clone().or_else(|| file.model.clone());
        config.stream = !self.no_stream && file.stream.unwrap_or(true);
        config.max_inflight = self
            .max_inflight
            .map(|n| n as usize)
            .or(file.max_inflight)
            .unwrap_or(DEFAULT_MAX_INFLIGHT);
        config.request_timeout = self
            .request_timeout
            .or(file.request_timeout)
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        if self.skip_check && config.model.is_none() {
            return Err("--skip-check needs --model (the check is what picks a model)".to_owned());
        }
        Ok(config)
    }
}
