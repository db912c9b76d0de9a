//! `troupe run`'s shell sandbox, from `--no-sandbox` and `--pass-env`: a
//! scrubbed environment for every `Bash` call and, where the kernel has
//! Landlock, writes confined to the root and a private temp folder. Says
//! once on stderr when a part of it is off.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;

use crate::error::HasCode;
use crate::tools::sandbox::{ShellSandbox, WriteConfinement, probe, scrubbed_env};

/// The run's sandbox, and the temp folder it owns.
#[derive(Debug)]
pub struct ShellSetup {
    /// For `RunSettings::sandbox`; `None` with `--no-sandbox`.
    pub sandbox: Option<Arc<ShellSandbox>>,
    /// The shells' private temp folder (their `TMPDIR`), removed when the
    /// run is over, or by the reaper when troupe exits at once (a second
    /// signal) or is killed.
    _tmp: Option<ShellTemp>,
}

/// The shells' temp folder, listed with the reaper while it exists.
#[derive(Debug)]
struct ShellTemp(Option<tempfile::TempDir>);

impl ShellTemp {
    fn new(dir: tempfile::TempDir) -> ShellTemp {
        crate::tools::process_group::remove_dir_with_troupe(dir.path());
        ShellTemp(Some(dir))
    }
}

impl Drop for ShellTemp {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let path = dir.path().to_owned();
            // Removed first, then forgotten: a troupe killed in between
            // leaves the reaper a folder that is already gone.
            let _ = dir.close();
            crate::tools::process_group::forget_dir(&path);
        }
    }
}

fn notice(text: &str) {
    let _ = writeln!(std::io::stderr(), "{text}");
}

/// Builds the sandbox for a run in `root` (canonical).
pub fn shell_sandbox(no_sandbox: bool, pass_env: &[String], root: &Path) -> ShellSetup {
    if no_sandbox {
        notice(
            "note: --no-sandbox: Bash calls get troupe's whole environment and may write anywhere troupe may",
        );
        return ShellSetup {
            sandbox: None,
            _tmp: None,
        };
    }
    let env = scrubbed_env(pass_env);
    let (writes, tmp) = match confinement(root) {
        Ok((writes, tmp)) => (Some(writes), tmp.map(ShellTemp::new)),
        Err(why) => {
            notice(&format!(
                "warning: {why}: Bash calls are NOT confined to --root and may write anywhere troupe may (their environment is still scrubbed)"
            ));
            (None, None)
        }
    };
    ShellSetup {
        sandbox: Some(Arc::new(ShellSandbox { env, writes })),
        _tmp: tmp,
    }
}

/// Write confinement for `root`, once a probe showed the kernel enforces
/// it, with the shells' private temp folder when one can be made. Without
/// one (the temp folder's disk full, not writable) the shells are still
/// confined, to the root alone, and said so: a temp folder that cannot be
/// made is no reason to let them write anywhere.
fn confinement(root: &Path) -> Result<(WriteConfinement, Option<tempfile::TempDir>), String> {
    let launcher = std::env::current_exe()
        .map_err(|e| format!("cannot find the troupe binary to confine Bash with: {e}"))?;
    let tmp = tempfile::Builder::new()
        .prefix("troupe-bash-")
        .tempdir()
        .map_err(|e| format!("cannot make a temp folder for Bash: {e}"))
        .and_then(|tmp| {
            let path = std::fs::canonicalize(tmp.path())
                .map_err(|e| format!("cannot resolve {}: {e}", tmp.path().display()))?;
            Ok((tmp, path))
        });
    let (tmp, tmp_path) = match tmp {
        Ok((tmp, path)) => (Some(tmp), Some(path)),
        Err(why) => {
            notice(&format!(
                "warning: {why}: Bash calls are confined to --root alone, with no temp folder of their own"
            ));
            (None, None)
        }
    };
    let mut folders = vec![root.to_owned()];
    folders.extend(tmp_path.clone());
    probe(&folders).map_err(|e| format!("{}: {e}", e.code()))?;
    Ok((
        WriteConfinement {
            launcher,
            tmp: tmp_path,
        },
        tmp,
    ))
}

/// Checks that every `network: deny` of a run (`--network deny`, a stage's
/// frontmatter, an MCP server's block) can be enforced here: the shell
/// sandbox with Landlock, and a kernel with its network rules (ABI 4).
/// Says why not: such a run must refuse to start, not run open.
pub fn check_network_deny(
    pipeline: &crate::definition::Pipeline,
    run_wide: bool,
    sandbox: Option<&ShellSandbox>,
    root: &Path,
) -> Result<(), String> {
    use crate::definition::StageKind;
    use crate::definition::mcp::McpTransport;
    let mut asked: Vec<String> = Vec::new();
    if run_wide {
        asked.push("--network deny".to_owned());
    }
    for stage in &pipeline.stages {
        if let StageKind::Llm(def) = &stage.kind
            && def.network_deny
        {
            asked.push(format!("stage `{}`", stage.id));
        }
    }
    for server in &pipeline.mcp_servers {
        if let McpTransport::Stdio {
            deny_network: true, ..
        } = server.transport
        {
            asked.push(format!("MCP server `{}`", server.name));
        }
    }
    if asked.is_empty() {
        return Ok(());
    }
    let who = asked.join(", ");
    if sandbox.is_none_or(|s| s.writes.is_none()) {
        return Err(format!(
            "{who} asks for `network: deny`, which needs the shell sandbox with Landlock; this run has none"
        ));
    }
    crate::tools::sandbox::probe_with(&[root.to_owned()], true)
        .map(|_| ())
        .map_err(|e| {
            format!("{who} asks for `network: deny`, which this kernel cannot enforce: {e}")
        })
}
