//! What a client of `troupe serve` may ask for.
//!
//! By default a client is trusted as the operator: it submits any
//! pipeline the server can read with any option of `troupe run`, and a
//! pipeline is code (its hooks, its MCP servers and its `provider:` block
//! run and send what they name). `troupe serve --pipelines DIR` is for
//! clients it does not trust that far: they run only the pipelines under
//! the operator's folders, and none of the options that would widen what
//! such a run reaches: the sandbox off, the server's variables passed to
//! shells, another root, every tool call approved, another model endpoint
//! or key variable, a budget or price other than the pipeline's, an OTLP
//! collector, a NATS server, files read from outside those folders. A refusal is `403 Control/PipelineNotAllowed`
//! or `403 Control/OptionNotAllowed`, naming what was refused.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::options::RunOptions;

/// A refusal: the HTTP status and the typed error body.
type Refused = (u16, serde_json::Value);

/// The server's rule for its clients.
#[derive(Debug, Clone, Default)]
pub(super) struct Policy {
    /// The folders whose pipelines clients may run, resolved; `None`:
    /// clients are trusted as the operator.
    pipelines: Option<Vec<PathBuf>>,
}

impl Policy {
    /// The rule for `--pipelines` (none given: clients trusted). Each
    /// folder must exist; it is resolved once, so a link inside one that
    /// leads out does not count as inside.
    pub(super) fn new(dirs: &[PathBuf]) -> Result<Policy, String> {
        if dirs.is_empty() {
            return Ok(Policy::default());
        }
        let mut resolved = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let real = std::fs::canonicalize(dir)
                .map_err(|e| format!("--pipelines {}: {e}", dir.display()))?;
            if !real.is_dir() {
                return Err(format!("--pipelines {}: not a folder", dir.display()));
            }
            resolved.push(real);
        }
        Ok(Policy {
            pipelines: Some(resolved),
        })
    }

    /// Whether `path`, resolved, lies under one of the folders (always,
    /// for trusted clients). A path that does not resolve is not.
    fn inside(&self, path: &Path) -> bool {
        let Some(allowed) = &self.pipelines else {
            return true;
        };
        std::fs::canonicalize(path).is_ok_and(|real| allowed.iter().any(|a| real.starts_with(a)))
    }

    /// Refuses a pipeline folder outside the operator's folders.
    pub(super) fn pipeline(&self, dir: &Path) -> Result<(), Refused> {
        if self.inside(dir) {
            return Ok(());
        }
        Err(refused(
            "Control/PipelineNotAllowed",
            format!(
                "{} is not under this server's --pipelines folders",
                dir.display()
            ),
        ))
    }

    /// Refuses the options that would widen what a run of an operator's
    /// pipeline reaches. `opts` as the client sent them; their relative
    /// paths are `cwd`'s.
    pub(super) fn options(&self, opts: &RunOptions, cwd: Option<&Path>) -> Result<(), Refused> {
        if self.pipelines.is_none() {
            return Ok(());
        }
        let theirs = |p: &Path| match cwd {
            Some(cwd) if p.is_relative() => cwd.join(p),
            _ => p.to_owned(),
        };
        let outside = |p: &Path| !self.inside(&theirs(p));
        let widening = [
            (opts.no_sandbox, "--no-sandbox"),
            (!opts.pass_env.is_empty(), "--pass-env"),
            (opts.yolo, "--yolo"),
            (opts.root != Path::new("."), "--root"),
            (opts.provider.base_url.is_some(), "--base-url"),
            (opts.provider.api_key_env.is_some(), "--api-key-env"),
            (opts.otlp.is_some() || opts.otlp_content, "--otlp"),
            (opts.nats.nats.is_some(), "--nats"),
            // The pipeline's budget and price stand: a flag beats them.
            (opts.limits.max_tokens.is_some(), "--max-tokens"),
            (opts.limits.max_cost.is_some(), "--max-cost"),
            (opts.limits.price.is_some(), "--price"),
            (
                opts.script.as_deref().is_some_and(outside),
                "--script (a file outside the --pipelines folders)",
            ),
            (
                opts.answers.iter().any(|p| outside(p)),
                "--answers (a file outside the --pipelines folders)",
            ),
        ];
        let named: Vec<&str> = widening
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, flag)| *flag)
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        Err(refused(
            "Control/OptionNotAllowed",
            format!(
                "this server runs its --pipelines for clients it does not trust as itself, and refuses {}",
                named.join(", ")
            ),
        ))
    }
}

fn refused(code: &str, message: String) -> Refused {
    (403, json!({"error": {"code": code, "message": message}}))
}
