//! The knobs every execution of a run shares (`RunSettings`), and the
//! wait before a transient provider error is retried.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::definition::Backoff;
use crate::runtime::ledger::Ledger;
use crate::runtime::limits::Budget;
use crate::tools::sandbox::ShellSandbox;

/// Knobs shared by every execution of a run.
///
/// Transient provider errors are retried here and only here: providers make
/// one HTTP request per `complete` call, so retries never multiply across
/// layers, and every try is audited (`ProviderRequestStarted` with `try`,
/// `ProviderRequestFailed` with `retrying` and `waitMs`).
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// Retries of a transient provider error before the stage fails.
    pub provider_retries: u32,
    pub provider_backoff: Backoff,
    /// Spread each backoff wait randomly over 50–100 % of its length, so a
    /// wide fan-out that hits a rate limit does not retry in lockstep.
    pub provider_jitter: bool,
    /// The longest wait honoured between tries: a `Retry-After` beyond it
    /// is not retried (the stage fails with the server's answer).
    pub provider_max_wait: Duration,
    /// Tool calls of one response run concurrently, at most this many.
    pub tool_concurrency: usize,
    /// The project root every tool call is confined to (`--root`).
    pub root: PathBuf,
    /// The longest an LLM stage execution may take, all attempts, model
    /// requests and tool calls included (`--stage-timeout`); past it the
    /// stage fails with `Session/StageTimeout`.
    pub stage_timeout: Option<Duration>,
    /// Arbiters (threads) the run's stage executions spread over; 1 runs
    /// them on the session's (`--threads`).
    pub threads: usize,
    /// The run's token and cost meter (`--max-tokens`, `--max-cost`).
    pub budget: Option<Arc<Budget>>,
    /// Where executions' ends are made durable (the run store); `None`
    /// keeps them in memory and the audit log only.
    pub ledger: Option<Arc<dyn Ledger>>,
    /// What `Bash` calls run under (`troupe run`: a scrubbed environment
    /// and Landlock, unless `--no-sandbox`); `None` runs them with
    /// troupe's whole environment, writes unconfined.
    pub sandbox: Option<Arc<ShellSandbox>>,
    /// The run's MCP servers, started before any stage (`mcpServers:`).
    pub mcp: Option<Arc<crate::tools::mcp::McpPool>>,
    /// `--network deny`: no shell or sandboxed MCP server of the run may
    /// open a TCP connection.
    pub deny_network: bool,
    /// Who answers human steps' questions (`None`: no one; they go
    /// unanswered).
    pub asker: Option<Arc<dyn crate::runtime::ask::Asker>>,
    /// `troupe chat`'s security mode: every offered tool is shown and each
    /// call is decided by the mode (`None` in pipelines: `allowedTools`
    /// decides).
    pub tool_mode: Option<Arc<crate::runtime::tool_mode::ToolMode>>,
}

impl Default for RunSettings {
    fn default() -> Self {
        RunSettings {
            provider_retries: 3,
            provider_backoff: Backoff::Exponential {
                initial: Duration::from_millis(500),
                max: Duration::from_secs(10),
            },
            provider_jitter: true,
            provider_max_wait: Duration::from_secs(60),
            tool_concurrency: 4,
            root: PathBuf::from("."),
            stage_timeout: None,
            threads: 1,
            budget: None,
            ledger: None,
            sandbox: None,
            mcp: None,
            deny_network: false,
            asker: None,
            tool_mode: None,
        }
    }
}

impl RunSettings {
    /// The wait before retry number `retry` of a transient error: the
    /// backoff (with jitter), but never less than the server's `Retry-After`.
    /// `None` when the server asks for more than `provider_max_wait`.
    pub fn retry_wait(&self, retry: u32, retry_after: Option<Duration>) -> Option<Duration> {
        let mut wait = self.provider_backoff.delay(retry);
        if self.provider_jitter {
            wait = jitter(wait);
        }
        match retry_after {
            Some(after) if after > self.provider_max_wait => None,
            Some(after) => Some(wait.max(after)),
            None => Some(wait),
        }
    }
}

/// `d` scaled by a random factor in [0.5, 1.0] ("equal jitter"). The
/// randomness comes from std's per-process random hasher keys, which are
/// re-keyed for every `RandomState`: good enough to de-synchronize retries.
fn jitter(d: Duration) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let r = std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish();
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    d.mul_f64(0.5 + unit / 2.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_waits_jitter_the_backoff_and_honour_retry_after() {
        let settings = RunSettings {
            provider_backoff: Backoff::Exponential {
                initial: Duration::from_millis(400),
                max: Duration::from_secs(10),
            },
            ..RunSettings::default()
        };
        for _ in 0..200 {
            let w = settings.retry_wait(2, None).unwrap();
            assert!(
                (Duration::from_millis(400)..=Duration::from_millis(800)).contains(&w),
                "{w:?}"
            );
        }
        let floor = settings.retry_wait(1, Some(Duration::from_secs(3)));
        assert_eq!(floor, Some(Duration::from_secs(3)));
        assert_eq!(
            settings.retry_wait(1, Some(Duration::from_secs(61))),
            None,
            "a Retry-After beyond provider_max_wait is not waited for"
        );
        let exact = RunSettings {
            provider_jitter: false,
            ..settings
        };
        assert_eq!(exact.retry_wait(3, None), Some(Duration::from_millis(1600)));
    }
}
