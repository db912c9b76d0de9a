//! `troupe sandbox-exec` (hidden): confines its own writes with Landlock,
//! starts a session of its own, then execs the given command, which
//! inherits both. The new session has no controlling terminal, so the
//! command cannot open `/dev/tty` to type into the terminal of the person
//! running troupe (`TIOCSTI`) or read what they type; its process group,
//! whose id is this process's pid, is the one troupe kills. `Bash`
//! starts every sandboxed shell through it, because the workspace denies
//! the unsafe `pre_exec` that would do this between fork and exec. Fails
//! closed: when the kernel enforces nothing, the command never runs.

use std::ffi::OsString;
use std::io::Write;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;

use super::Exit;
use crate::error::HasCode;
use crate::tools::sandbox::confine;

/// Options of `troupe sandbox-exec`.
#[derive(Debug, Clone, clap::Args)]
pub struct SandboxExecArgs {
    /// A folder the command may write beneath. Repeatable.
    #[arg(long = "write", value_name = "DIR", required = true)]
    pub write: Vec<PathBuf>,
    /// No TCP connect or bind (Landlock ABI 4); refuses to run without.
    #[arg(long)]
    pub deny_network: bool,
    /// The program to exec and its arguments (after `--`).
    #[arg(last = true, required = true, value_name = "COMMAND")]
    pub command: Vec<OsString>,
}

pub fn run(args: SandboxExecArgs) -> Exit {
    let mut stderr = std::io::stderr();
    if let Err(e) = confine(&args.write, args.deny_network) {
        let _ = writeln!(stderr, "troupe sandbox-exec: {}: {e}", e.code());
        return Exit::CannotExecute;
    }
    if let Err(e) = nix::unistd::setsid() {
        let _ = writeln!(
            stderr,
            "troupe sandbox-exec: Sandbox/SessionFailed: cannot start a session of its own: {e}"
        );
        return Exit::CannotExecute;
    }
    let Some((program, rest)) = args.command.split_first() else {
        // clap requires at least one value; kept typed all the same.
        return Exit::Invalid;
    };
    // Only returns on failure; std restores SIGPIPE's default disposition
    // (Rust ignores it) before the exec, as the shell expects.
    let err = std::process::Command::new(program).args(rest).exec();
    let _ = writeln!(
        stderr,
        "troupe sandbox-exec: cannot run {}: {err}",
        program.to_string_lossy()
    );
    if err.kind() == std::io::ErrorKind::NotFound {
        Exit::CommandNotFound
    } else {
        Exit::CannotExecute
    }
}
