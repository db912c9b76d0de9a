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
//! or `403 Control/OptionNotAllowed`, naming what was refused. Their
//! approvals are not put to them (a call outside a stage's allowedTools is
//! denied); the folders must lie outside what a run can write.

use std::path::{Path, PathBuf};

use serde_json::json;

use super::options::RunOptions;
use crate::definition::Pipeline;
use crate::definition::mcp::McpTransport;

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
    /// leads out does not count as inside. A folder a run could write
    /// is refused: one that holds or lies inside the root (where Write,
    /// Edit and the sandboxed shells write) or the runs folder, one that
    /// holds the temp folder the shells' private ones are made in, and
    /// any folder where the kernel cannot confine the shells' writes
    /// (Landlock): a run could otherwise write itself a pipeline with a
    /// hook, and have it run as the operator.
    pub(super) fn new(dirs: &[PathBuf], root: &Path, runs_dir: &Path) -> Result<Policy, String> {
        if dirs.is_empty() {
            return Ok(Policy::default());
        }
        if let Err(e) = crate::tools::sandbox::probe(&[root.to_owned()]) {
            return Err(format!(
                "--pipelines needs the shell sandbox's write confinement, which this kernel cannot give ({e}): a run's shell could rewrite the pipelines"
            ));
        }
        let real = |p: &Path| std::fs::canonicalize(p).unwrap_or_else(|_| p.to_owned());
        let writable = [
            ("the root", real(root)),
            ("the runs folder", real(runs_dir)),
        ];
        // Each run's shells get a private folder made inside it.
        let temp = (
            "the temp folder the shells' own are made in",
            real(&std::env::temp_dir()),
        );
        let mut resolved = Vec::with_capacity(dirs.len());
        for dir in dirs {
            let folder = std::fs::canonicalize(dir)
                .map_err(|e| format!("--pipelines {}: {e}", dir.display()))?;
            if !folder.is_dir() {
                return Err(format!("--pipelines {}: not a folder", dir.display()));
            }
            let overlap = writable
                .iter()
                .find(|(_, place)| folder.starts_with(place) || place.starts_with(&folder))
                .or_else(|| temp.1.starts_with(&folder).then_some(&temp));
            if let Some((what, place)) = overlap {
                return Err(format!(
                    "--pipelines {}: overlaps {what} ({}), where runs write: keep the pipelines clients may run outside it",
                    dir.display(),
                    place.display()
                ));
            }
            resolved.push(folder);
        }
        Ok(Policy {
            pipelines: Some(resolved),
        })
    }

    /// Whether clients are held to the folders (`--pipelines`).
    pub(super) fn is_curated(&self) -> bool {
        self.pipelines.is_some()
    }

    /// `path` resolved, when it lies under one of the folders; for
    /// trusted clients, `path` as it is. A path that does not resolve is
    /// not inside.
    fn inside(&self, path: &Path) -> Option<PathBuf> {
        let Some(allowed) = &self.pipelines else {
            return Some(path.to_owned());
        };
        std::fs::canonicalize(path)
            .ok()
            .filter(|real| allowed.iter().any(|a| real.starts_with(a)))
    }

    /// The pipeline folder to load: `dir` resolved (what was checked is
    /// what is read), or a refusal when it lies outside the folders.
    pub(super) fn pipeline(&self, dir: &Path) -> Result<PathBuf, Refused> {
        self.inside(dir).ok_or_else(|| {
            refused(
                "Control/PipelineNotAllowed",
                format!(
                    "{} is not under this server's --pipelines folders",
                    dir.display()
                ),
            )
        })
    }

    /// Refuses a pipeline whose MCP servers could write the folders: one
    /// without the sandbox, or one whose `writes:` holds or lies inside
    /// one of them. (The operator wrote it; the model, which clients
    /// steer, calls its tools.)
    pub(super) fn servers(&self, pipeline: &Pipeline) -> Result<(), Refused> {
        let Some(allowed) = &self.pipelines else {
            return Ok(());
        };
        for server in &pipeline.mcp_servers {
            let McpTransport::Stdio {
                sandbox, writes, ..
            } = &server.transport
            else {
                continue;
            };
            let why = if *sandbox {
                writes.iter().find_map(|w| {
                    let path = match crate::tools::mcp::writes_path(w) {
                        Ok(path) => path,
                        Err(why) => return Some(why),
                    };
                    let path = std::fs::canonicalize(&path)
                        .or_else(|_| std::path::absolute(&path))
                        .unwrap_or(path);
                    allowed
                        .iter()
                        .any(|a| path.starts_with(a) || a.starts_with(&path))
                        .then(|| {
                            format!(
                                "may write `{w}`, which overlaps this server's --pipelines folders"
                            )
                        })
                })
            } else {
                Some("runs without the sandbox (`sandbox: false`)".to_owned())
            };
            if let Some(why) = why {
                return Err(refused(
                    "Control/PipelineNotAllowed",
                    format!(
                        "pipeline `{}`: MCP server `{}` {why}: a run could rewrite the pipelines",
                        pipeline.id, server.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Refuses the options that would widen what a run of an operator's
    /// pipeline reaches. `opts` as the client sent them, its files' paths
    /// made the client's; a `--script` or `--answers` file inside the
    /// folders is replaced by its resolved path, which is what is read.
    pub(super) fn options(&self, opts: &mut RunOptions) -> Result<(), Refused> {
        if self.pipelines.is_none() {
            return Ok(());
        }
        let script = opts.script.as_deref().map(|p| self.inside(p));
        let answers: Vec<Option<PathBuf>> = opts.answers.iter().map(|p| self.inside(p)).collect();
        let provider = &opts.provider;
        let widening = [
            (opts.no_sandbox, "--no-sandbox"),
            (!opts.pass_env.is_empty(), "--pass-env"),
            (opts.yolo, "--yolo"),
            (opts.remote, "--remote"),
            // The pipeline's cap stands, and a run's threads are the
            // server's to give.
            (opts.parallel_cap.is_some(), "--parallel-cap"),
            (opts.threads.is_some(), "--threads"),
            (opts.root != Path::new("."), "--root"),
            // The provider is the pipeline's: its endpoint, model, key
            // variable and how hard it is asked.
            (provider.provider.is_some(), "--provider"),
            (provider.base_url.is_some(), "--base-url"),
            (provider.model.is_some(), "--model"),
            (provider.api_key_env.is_some(), "--api-key-env"),
            (provider.no_stream, "--no-stream"),
            (provider.max_inflight.is_some(), "--max-inflight"),
            (provider.request_timeout.is_some(), "--request-timeout"),
            (provider.provider_retries.is_some(), "--provider-retries"),
            (provider.provider_backoff.is_some(), "--provider-backoff"),
            (provider.skip_check, "--skip-check"),
            // So are its budget and price: a flag beats them.
            (opts.limits.max_tokens.is_some(), "--max-tokens"),
            (opts.limits.max_cost.is_some(), "--max-cost"),
            (opts.limits.price.is_some(), "--price"),
            (opts.otlp.is_some() || opts.otlp_content, "--otlp"),
            (opts.nats.nats.is_some(), "--nats"),
            (
                matches!(script, Some(None)),
                "--script (a file outside the --pipelines folders)",
            ),
            (
                answers.iter().any(Option::is_none),
                "--answers (a file outside the --pipelines folders)",
            ),
        ];
        let named: Vec<&str> = widening
            .iter()
            .filter(|(set, _)| *set)
            .map(|(_, flag)| *flag)
            .collect();
        if !named.is_empty() {
            return Err(refused(
                "Control/OptionNotAllowed",
                format!(
                    "this server runs its --pipelines for clients it does not trust as itself, and refuses {}",
                    named.join(", ")
                ),
            ));
        }
        opts.script = script.flatten();
        opts.answers = answers.into_iter().flatten().collect();
        Ok(())
    }
}

fn refused(code: &str, message: String) -> Refused {
    (403, json!({"error": {"code": code, "message": message}}))
}
