//! What a `Bash` call runs under: the sandbox settings a run gives its
//! tools, and the command line that applies them. Confining writes needs
//! a fresh process that restricts itself before it execs the shell; the
//! workspace denies the unsafe `pre_exec`, so the troupe binary re-execs
//! itself as `troupe sandbox-exec --write ROOT [--write TMP] -- SHELL -c
//! COMMAND`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The shell sandbox of a run. `None` where one is expected (in
/// `RunSettings` or `ToolEnv`) means no sandbox: the shell inherits
/// troupe's whole environment and may write wherever troupe may.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShellSandbox {
    /// The whole environment the shell gets, in place of troupe's (see
    /// [`super::scrubbed_env`]).
    pub env: Vec<(OsString, OsString)>,
    /// Confine writes with Landlock; `None` leaves them unconfined (the
    /// kernel lacks Landlock, or no troupe binary to re-exec).
    pub writes: Option<WriteConfinement>,
}

/// How a shell's writes are confined to the project root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteConfinement {
    /// The troupe binary whose hidden `sandbox-exec` command confines
    /// itself and execs the shell: `std::env::current_exe()` in the CLI,
    /// `env!("CARGO_BIN_EXE_troupe")` in tests.
    pub launcher: PathBuf,
    /// A private folder for temporary files, writable besides the root;
    /// `TMPDIR` points at it. `None`: no place outside the root.
    pub tmp: Option<PathBuf>,
}

impl ShellSandbox {
    /// Whether its commands start a session of their own (`troupe
    /// sandbox-exec` calls `setsid`): the caller must not put them in a
    /// process group first, since a group leader cannot start a session,
    /// and the session's id is its process group's, the child's pid.
    pub fn starts_session(&self) -> bool {
        self.writes.is_some()
    }

    /// The command that runs `shell -c script` in `root` under this
    /// sandbox (the caller adds stdio, the process group — unless
    /// [`ShellSandbox::starts_session`] — and the rest).
    pub fn command(
        &self,
        shell: &str,
        script: &str,
        root: &Path,
        deny_network: bool,
    ) -> tokio::process::Command {
        let mut cmd = match &self.writes {
            Some(w) => {
                let mut cmd = tokio::process::Command::new(&w.launcher);
                cmd.arg("sandbox-exec").arg("--write").arg(root);
                if deny_network {
                    cmd.arg("--deny-network");
                }
                if let Some(tmp) = &w.tmp {
                    cmd.arg("--write").arg(tmp);
                }
                cmd.arg("--").arg(shell);
                cmd
            }
            None => tokio::process::Command::new(shell),
        };
        cmd.arg("-c")
            .arg(script)
            .env_clear()
            .envs(self.env.iter().cloned());
        if let Some(tmp) = self.writes.as_ref().and_then(|w| w.tmp.as_ref()) {
            cmd.env("TMPDIR", tmp);
        }
        cmd
    }
}

impl ShellSandbox {
    /// The command that runs `program args…` in this sandbox's write
    /// confinement, with the harmless variables plus those named in `env`
    /// (an MCP server: not the shells' `--pass-env` list).
    pub fn program_command(
        &self,
        program: &str,
        args: &[String],
        env: &[String],
        root: &Path,
        extra_writes: &[std::path::PathBuf],
        deny_network: bool,
    ) -> tokio::process::Command {
        let mut cmd = match &self.writes {
            Some(w) => {
                let mut cmd = tokio::process::Command::new(&w.launcher);
                cmd.arg("sandbox-exec");
                if deny_network {
                    cmd.arg("--deny-network");
                }
                cmd.arg("--write").arg(root);
                for extra in extra_writes {
                    cmd.arg("--write").arg(extra);
                }
                if let Some(tmp) = &w.tmp {
                    cmd.arg("--write").arg(tmp);
                }
                cmd.arg("--").arg(program);
                cmd
            }
            None => tokio::process::Command::new(program),
        };
        cmd.args(args)
            .env_clear()
            .envs(crate::environ::scrubbed(env));
        if let Some(tmp) = self.writes.as_ref().and_then(|w| w.tmp.as_ref()) {
            cmd.env("TMPDIR", tmp);
        }
        cmd
    }
}

/// The run's sandbox in one word, for the audit log (`WorkflowStarted`'s
/// `shellSandbox`): `landlock` (environment scrubbed, writes confined),
/// `env-only` (environment scrubbed, writes not confined) or `off`.
pub fn mode(sandbox: Option<&ShellSandbox>) -> &'static str {
    match sandbox {
        Some(ShellSandbox {
            writes: Some(_), ..
        }) => "landlock",
        Some(_) => "env-only",
        None => "off",
    }
}
