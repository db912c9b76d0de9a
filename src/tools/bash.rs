//! `Bash`: a shell command run in the root, in its own process group, with a
//! timeout, under the run's shell sandbox if it has one. The result carries the exit status and the capped stdout and
//! stderr; a non-zero exit is still a result (the model reads the status).
//!
//! Nothing outlives the call: when the shell exits, whatever it left running
//! in its group is killed; on timeout the group is killed and the call is
//! `ToolTransient/Timeout`; when the call's future is dropped (strict
//! cancel) a guard kills the group.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::pin::pin;
use std::process::{ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use serde::Deserialize;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::time::Instant;

use super::env::ToolLimits;
use super::error::ToolError;
use super::process_group::GroupKill;
use super::sandbox::ShellSandbox;

/// After the shell exits and its group is killed, how long the pipes may
/// stay open (held by a process that left the group) before we stop reading.
const PIPE_GRACE: Duration = Duration::from_secs(1);
/// Bytes of each stream quoted in a timeout error.
const TIMEOUT_QUOTE_BYTES: usize = 4096;

#[derive(Debug, Clone, Deserialize)]
pub struct BashArgs {
    pub command: String,
    pub timeout_ms: Option<u64>,
}

/// `bash` when the system has it, else `sh`.
fn shell() -> &'static str {
    static SHELL: OnceLock<&'static str> = OnceLock::new();
    SHELL.get_or_init(|| {
        if Path::new("/bin/bash").is_file() {
            "/bin/bash"
        } else {
            "/bin/sh"
        }
    })
}

/// One output stream: the first `cap` bytes and the total length.
#[derive(Debug, Default)]
struct Captured {
    kept: Vec<u8>,
    total: u64,
}

impl Captured {
    /// Reads `from` to its end, keeping at most `cap` bytes.
    async fn fill<R: AsyncRead + Unpin>(&mut self, from: Option<R>, cap: usize) {
        let Some(mut from) = from else { return };
        let mut chunk = vec![0u8; 8192];
        loop {
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let room = cap.saturating_sub(self.kept.len());
                    self.kept.extend_from_slice(&chunk[..n.min(room)]);
                    self.total += n as u64;
                }
            }
        }
    }

    /// The kept text (at most `max` bytes of it), with a note if cut.
    fn render(&self, name: &str, max: usize) -> Option<String> {
        if self.total == 0 {
            return None;
        }
        let shown = &self.kept[..self.kept.len().min(max)];
        let cut = (shown.len() as u64) < self.total;
        let (mut text, _) = super::lines::text_capped(shown, usize::MAX, cut);
        if !text.ends_with('\n') {
            text.push('\n');
        }
        if cut {
            text.push_str(&format!(
                "[{name} cut: {} of {} bytes shown]\n",
                shown.len(),
                self.total
            ));
        }
        Some(format!("{name}:\n{text}"))
    }
}

fn describe(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status: {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "exit status: unknown".to_owned(),
    }
}

/// How the wait ended.
enum WaitOutcome {
    Exited { status: ExitStatus, drained: bool },
    TimedOut,
    WaitFailed(std::io::Error),
}

/// Runs `args.command` in `root`, under `sandbox` when there is one (a
/// scrubbed environment, writes confined by `troupe sandbox-exec`).
pub async fn bash(
    root: &Path,
    limits: &ToolLimits,
    args: &BashArgs,
    sandbox: Option<&ShellSandbox>,
    deny_network: bool,
) -> Result<String, ToolError> {
    // `network: deny` holds only where Landlock enforces it: never run a
    // shell open that was meant to be closed.
    if deny_network && sandbox.is_none_or(|s| s.writes.is_none()) {
        return Err(ToolError::terminal(
            "NetworkDenyUnavailable",
            "`network: deny` needs the shell sandbox with Landlock, which this run does not have",
        ));
    }
    let timeout = args
        .timeout_ms
        .map_or(limits.bash_default_timeout, Duration::from_millis);
    let own_session = sandbox.is_some_and(|s| s.starts_session());
    let mut command = match sandbox {
        Some(sandbox) => sandbox.command(shell(), &args.command, root, deny_network),
        None => {
            // No sandbox: the whole environment troupe was started with,
            // which a sealed troupe no longer has in its own.
            let mut command = tokio::process::Command::new(shell());
            command
                .arg("-c")
                .arg(&args.command)
                .env_clear()
                .envs(crate::environ::vars_os());
            command
        }
    };
    if !own_session {
        command.process_group(0);
    }
    let mut child = command
        .current_dir(root)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| {
            ToolError::terminal("SpawnFailed", format!("cannot start {}: {e}", shell()))
        })?;
    // Declared after `child`: dropped before it (see `GroupKill`).
    let mut group = GroupKill::new(child.id());
    let stdout = child.stdout.take();
    let stderr = child.stderr.take();
    let cap = limits.bash_output_bytes;
    let mut out = Captured::default();
    let mut err = Captured::default();
    let deadline = Instant::now() + timeout;

    let ended = {
        let mut io = pin!(async {
            tokio::join!(out.fill(stdout, cap), err.fill(stderr, cap));
        });
        let mut wait = pin!(child.wait());
        let mut timer = pin!(tokio::time::sleep_until(deadline));
        let mut status: Option<ExitStatus> = None;
        let mut io_done = false;
        // Armed (reset) when the shell exits; polled only after that.
        let mut grace = pin!(tokio::time::sleep_until(deadline));
        loop {
            tokio::select! {
                res = &mut wait, if status.is_none() => match res {
                    Ok(s) => {
                        status = Some(s);
                        // Background jobs die with the call; the pipes close.
                        // The leader is reaped, but its id stays the group's
                        // while any member lives, so no other group is hit.
                        group.kill();
                        grace.as_mut().reset(Instant::now() + PIPE_GRACE);
                    }
                    Err(e) => break WaitOutcome::WaitFailed(e),
                },
                () = &mut io, if !io_done => io_done = true,
                () = &mut timer, if status.is_none() => break WaitOutcome::TimedOut,
                () = &mut grace, if status.is_some() && !io_done => {
                    if let Some(status) = status {
                        break WaitOutcome::Exited { status, drained: false };
                    }
                }
            }
            if let (Some(status), true) = (status, io_done) {
                break WaitOutcome::Exited {
                    status,
                    drained: true,
                };
            }
        }
    };

    match ended {
        WaitOutcome::Exited { status, drained } => {
            let mut text = describe(status);
            text.push('\n');
            let sections: Vec<String> = [out.render("stdout", cap), err.render("stderr", cap)]
                .into_iter()
                .flatten()
                .collect();
            if sections.is_empty() {
                text.push_str("(no output)\n");
            }
            for s in sections {
                text.push_str(&s);
            }
            if !drained {
                text.push_str("[output may be incomplete: a process that left the group still holds the pipes]\n");
            }
            Ok(text)
        }
        WaitOutcome::TimedOut => {
            group.kill();
            let mut message = format!(
                "command timed out after {} ms; its process group was killed",
                timeout.as_millis()
            );
            for s in [
                out.render("stdout", TIMEOUT_QUOTE_BYTES),
                err.render("stderr", TIMEOUT_QUOTE_BYTES),
            ]
            .into_iter()
            .flatten()
            {
                message.push('\n');
                message.push_str(s.trim_end());
            }
            Err(ToolError::transient("Timeout", message))
        }
        WaitOutcome::WaitFailed(e) => {
            group.kill();
            Err(ToolError::terminal(
                "IoError",
                format!("waiting for the command failed: {e}"),
            ))
        }
    }
}
