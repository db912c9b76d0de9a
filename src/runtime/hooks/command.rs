//! A hook command declared in `pipeline.yaml`: `sh -c` in the pipeline
//! folder, the payload as JSON on stdin, the answer as JSON on stdout,
//! within its timeout. A crash, a hang or garbage is a typed error, never
//! a hung run. The files of the pipeline folder its command names are
//! pinned when the run loads it: the folder is often inside the root the
//! run's tools write, and a hook whose script a tool call rewrote fails
//! closed instead of running what the model wrote.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;

use futures::FutureExt;
use futures::future::BoxFuture;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::hook::{Hook, HookError, HookReply};
use crate::definition::hooks::{HookDef, HookKind};
use crate::tools::process_group::GroupKill;

/// Output read from a hook command, at most.
const MAX_OUTPUT: usize = 1 << 20;

/// A hook command: payload on stdin, answer on stdout.
#[derive(Debug, Clone)]
pub struct CommandHook {
    pub def: HookDef,
    pub dir: PathBuf,
    /// The pipeline folder's files its command names, as loaded.
    pinned: Arc<[Pinned]>,
}

/// A file of the pipeline folder a hook's command names (`sh no-rm.sh`,
/// `./hooks/check`), and its SHA-256 when the run loaded the hook.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Pinned {
    path: PathBuf,
    /// As the command names it.
    named: String,
    digest: Vec<u8>,
}

/// Files past this size are not pinned (a hook's script is small).
const PIN_MOST: u64 = 4 << 20;

fn sha256(bytes: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(bytes).to_vec()
}

/// The files beneath `dir` that `command`'s words name, read now.
fn pin_named_files(command: &str, dir: &Path) -> Vec<Pinned> {
    let Ok(folder) = dir.canonicalize() else {
        return Vec::new();
    };
    let mut pinned: Vec<Pinned> = Vec::new();
    let words = command.split(|c: char| c.is_whitespace() || ";&|()<>`".contains(c));
    for word in words {
        let word = word.trim_matches(|c| c == '\'' || c == '"');
        if word.is_empty() || word.starts_with('-') || word.contains(['$', '=', '*', '?']) {
            continue;
        }
        let Ok(path) = dir.join(word).canonicalize() else {
            continue;
        };
        if !path.starts_with(&folder) || pinned.iter().any(|p| p.path == path) {
            continue;
        }
        let small_file = std::fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() <= PIN_MOST);
        if let Some(bytes) = small_file.then(|| std::fs::read(&path).ok()).flatten() {
            pinned.push(Pinned {
                path,
                named: word.to_owned(),
                digest: sha256(&bytes),
            });
        }
    }
    pinned
}

impl Hook for CommandHook {
    fn name(&self) -> &str {
        &self.def.name
    }

    fn kind(&self) -> HookKind {
        self.def.kind
    }

    fn wants_tool(&self, tool: &str) -> bool {
        self.def.tools.is_empty()
            || self
                .def
                .tools
                .iter()
                .any(|t| crate::definition::mcp::allows(t, tool))
    }

    fn call(
        &self,
        _slot: &str,
        payload: Arc<Value>,
    ) -> BoxFuture<'static, Result<HookReply, HookError>> {
        let hook = self.clone();
        async move { hook.run(&payload).await }.boxed()
    }
}

impl CommandHook {
    /// The hook `def`, run in `dir` (the pipeline folder); the files of
    /// `dir` its command names are pinned as they are now.
    pub fn new(def: HookDef, dir: PathBuf) -> CommandHook {
        let pinned = pin_named_files(&def.command, &dir).into();
        CommandHook { def, dir, pinned }
    }

    /// The first pinned file that is no longer as it was loaded.
    fn changed(&self) -> Option<&str> {
        self.pinned
            .iter()
            .find(|p| std::fs::read(&p.path).map_or(true, |bytes| sha256(&bytes) != p.digest))
            .map(|p| p.named.as_str())
    }

    async fn run(&self, payload: &Value) -> Result<HookReply, HookError> {
        let name = self.def.name.clone();
        if let Some(file) = self.changed() {
            return Err(HookError::Failed {
                hook: name,
                message: format!(
                    "its file {file} changed since the run started (a tool call may have written it), so it was not run; start the run again to use the new one"
                ),
            });
        }
        let work = async {
            let mut child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&self.def.command)
                // The same scrubbed environment as a shell, plus the
                // variables the hook entry names: a hook sees no key it
                // was not given.
                .env_clear()
                .envs(crate::environ::scrubbed(&self.def.env))
                .current_dir(&self.dir)
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // A group of its own, so that what it starts ends with it.
                .process_group(0)
                .kill_on_drop(true)
                .spawn()
                .map_err(|e| HookError::Spawn {
                    hook: name.clone(),
                    message: e.to_string(),
                })?;
            // Declared after `child`: dropped before it (see `GroupKill`),
            // so a hook past its timeout, or whose run is cancelled, takes
            // its children (a pipeline's other commands, a script's
            // subprocesses) with it, not only its shell.
            let mut group = GroupKill::new(child.id());
            let input = serde_json::to_vec(payload).unwrap_or_default();
            let stdin = child.stdin.take();
            let stdout = child.stdout.take();
            let stderr = child.stderr.take();
            let (mut out, mut err) = (Vec::new(), Vec::new());
            // Write, read and wait together: a hook that does not read its
            // input, or writes a lot, cannot deadlock us.
            let write = async {
                if let Some(mut s) = stdin {
                    // A hook may ignore its input and exit: a broken pipe is fine.
                    let _ = s.write_all(&input).await;
                }
                Ok(())
            };
            let status = {
                // Ends early, `true`, once either pipe passes the bound.
                let mut io = std::pin::pin!(async {
                    tokio::try_join!(write, fill(stdout, &mut out), fill(stderr, &mut err)).is_err()
                });
                let mut wait = std::pin::pin!(child.wait());
                let mut io_done = false;
                let mut too_much = false;
                let status = loop {
                    tokio::select! {
                        status = &mut wait => break Some(status),
                        more = &mut io, if !io_done => {
                            io_done = true;
                            too_much = more;
                            // Its answer is refused whatever else it
                            // writes: it is stopped now, not drained to
                            // its end or its timeout.
                            if too_much {
                                break None;
                            }
                        }
                    }
                };
                // What it left in the background (`notify &`) dies with
                // it: its pipes close, and the answer is read now rather
                // than when the background job ends (or the timeout).
                group.kill();
                if !io_done {
                    too_much = tokio::time::timeout(PIPE_GRACE, io).await.unwrap_or(false);
                }
                // `None` when it wrote too much.
                status.filter(|_| !too_much)
            };
            let Some(status) = status else {
                return Err(HookError::Failed {
                    hook: name.clone(),
                    message: format!(
                        "it wrote more than {} MiB, the most troupe reads of a hook's output",
                        MAX_OUTPUT >> 20
                    ),
                });
            };
            let status = status.map_err(|e| HookError::Failed {
                hook: name.clone(),
                message: e.to_string(),
            })?;
            Ok::<_, HookError>((status, out, err))
        };
        let (status, out, err) = match tokio::time::timeout(self.def.timeout, work).await {
            Ok(r) => r?,
            Err(_) => {
                return Err(HookError::Timeout {
                    hook: name,
                    timeout: self.def.timeout,
                });
            }
        };
        if !status.success() {
            let stderr = String::from_utf8_lossy(&err);
            return Err(HookError::Exit {
                hook: name,
                status: status.to_string(),
                stderr: stderr.trim().chars().take(300).collect(),
            });
        }
        let text = String::from_utf8_lossy(&out);
        let text = text.trim();
        let garbage = |expected: &'static str| HookError::Garbage {
            hook: self.def.name.clone(),
            expected,
            found: text.chars().take(120).collect(),
        };
        match self.def.kind {
            HookKind::Observer => Ok(HookReply::Allow),
            HookKind::Guard => {
                if text.is_empty() {
                    return Ok(HookReply::Allow);
                }
                let v: Value = serde_json::from_str(text)
                    .map_err(|_| garbage(r#"{"decision":"allow"|"deny","reason":…}"#))?;
                match v.get("decision").and_then(Value::as_str) {
                    Some("allow") => Ok(HookReply::Allow),
                    Some("deny") => Ok(HookReply::Deny {
                        reason: v
                            .get("reason")
                            .and_then(Value::as_str)
                            .unwrap_or("denied by a guard hook")
                            .to_owned(),
                    }),
                    _ => Err(garbage(r#"{"decision":"allow"|"deny","reason":…}"#)),
                }
            }
            HookKind::Transform => {
                if text.is_empty() {
                    return Ok(HookReply::Allow);
                }
                match serde_json::from_str::<Value>(text) {
                    Ok(v @ Value::Object(_)) => Ok(HookReply::Replace(v)),
                    _ => Err(garbage("the rewritten payload as a JSON object")),
                }
            }
        }
    }
}

/// A hook wrote more than [`MAX_OUTPUT`] to one of its pipes.
struct TooMuch;

/// Reads a pipe to its end into `buf`, at most [`MAX_OUTPUT`] bytes; what
/// was read stays in `buf` if it is stopped first. `TooMuch` as soon as
/// there is more: the hook is then stopped and said to have written too
/// much (before the pipe closes under it, so that it is not said to have
/// crashed of a signal, and rather than drained until its timeout).
async fn fill<R: tokio::io::AsyncRead + Unpin>(
    pipe: Option<R>,
    buf: &mut Vec<u8>,
) -> Result<(), TooMuch> {
    let Some(p) = pipe else {
        return Ok(());
    };
    let _ = p.take(MAX_OUTPUT as u64 + 1).read_to_end(buf).await;
    if buf.len() > MAX_OUTPUT {
        buf.truncate(MAX_OUTPUT);
        return Err(TooMuch);
    }
    Ok(())
}

/// How long a hook's pipes may stay open once its shell exited and its
/// group was killed: a process that left the group (`setsid`) may hold
/// them; the answer is taken as read by then.
const PIPE_GRACE: std::time::Duration = std::time::Duration::from_secs(1);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::time::Duration;

    fn hook(kind: HookKind, command: &str) -> CommandHook {
        CommandHook::new(
            HookDef {
                name: command.chars().take(20).collect(),
                at: "TOOL_CALL/pre".into(),
                kind,
                command: command.into(),
                timeout: Duration::from_secs(5),
                tools: vec![],
                env: vec![],
            },
            std::env::temp_dir(),
        )
    }

    fn run(h: &CommandHook, payload: Value) -> Result<HookReply, HookError> {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
            .block_on(h.run(&payload))
    }

    #[test]
    fn a_guard_reads_stdin_and_answers_on_stdout() {
        let g = hook(
            HookKind::Guard,
            r#"if grep -q '"rm '; then echo '{"decision":"deny","reason":"no rm"}'; else echo '{"decision":"allow"}'; fi"#,
        );
        assert_eq!(
            run(&g, json!({"arguments": {"command": "rm -rf x"}})).unwrap(),
            HookReply::Deny {
                reason: "no rm".into()
            }
        );
        assert_eq!(
            run(&g, json!({"arguments": {"command": "ls"}})).unwrap(),
            HookReply::Allow
        );
    }

    /// A hook that writes more than troupe reads is said to have, not
    /// killed by its closed pipe and said to have crashed of a signal.
    #[test]
    fn output_past_the_limit_is_said_as_such() {
        let big = hook(
            HookKind::Transform,
            "head -c 2000000 /dev/zero | tr '\\0' a",
        );
        match run(&big, json!({})) {
            Err(HookError::Failed { message, .. }) => {
                assert!(message.contains("more than 1 MiB"), "{message}");
            }
            other => panic!("{other:?}"),
        }
    }

    /// A hook that writes without end is stopped once past the bound, on
    /// either pipe, not read until its timeout (an hour here: the test
    /// would hang, not pass, if it were).
    #[test]
    fn endless_output_is_stopped_at_the_bound() {
        for command in ["yes", "yes >&2"] {
            let mut endless = hook(HookKind::Guard, command);
            endless.def.timeout = Duration::from_secs(3600);
            match run(&endless, json!({})) {
                Err(HookError::Failed { message, .. }) => {
                    assert!(message.contains("more than 1 MiB"), "{command}: {message}");
                }
                other => panic!("{command}: {other:?}"),
            }
        }
    }

    #[test]
    fn crashes_garbage_and_hangs_are_typed_errors() {
        let crash = hook(HookKind::Guard, "echo boom >&2; exit 3");
        match run(&crash, json!({})) {
            Err(HookError::Exit { stderr, .. }) => assert_eq!(stderr, "boom"),
            other => panic!("{other:?}"),
        }
        let garbage = hook(HookKind::Transform, "echo not json");
        assert!(matches!(
            run(&garbage, json!({})),
            Err(HookError::Garbage { .. })
        ));
        let mut hang = hook(HookKind::Guard, "sleep 30");
        hang.def.timeout = Duration::from_millis(100);
        assert!(matches!(
            run(&hang, json!({})),
            Err(HookError::Timeout { .. })
        ));
    }

    #[test]
    fn what_a_hook_leaves_in_the_background_neither_holds_its_answer_nor_outlives_it() {
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        // Answers at once, with a job in the background that holds the
        // hook's stdout and would run for a minute.
        let mut g = hook(
            HookKind::Guard,
            &format!(
                r#"sleep 60 & echo $! > {}; echo '{{"decision":"allow"}}'"#,
                pid_file.display()
            ),
        );
        g.def.timeout = Duration::from_secs(30);
        assert_eq!(run(&g, json!({})).unwrap(), HookReply::Allow);
        assert_ended(&pid_file);
        // Past its timeout: its subprocess ends with it, not only its shell.
        let pid_file = dir.path().join("pid2");
        let mut hang = hook(
            HookKind::Guard,
            &format!("sleep 60 & echo $! > {}; wait", pid_file.display()),
        );
        hang.def.timeout = Duration::from_millis(300);
        assert!(matches!(
            run(&hang, json!({})),
            Err(HookError::Timeout { .. })
        ));
        assert_ended(&pid_file);
    }

    /// The process whose id `pid_file` holds has ended (gone, or a zombie
    /// waiting for whoever adopted it). A guard, not a measure: a killed
    /// process ends at once.
    fn assert_ended(pid_file: &std::path::Path) {
        use crate::tools::process_group::proc_stat;
        let pid: i32 = std::fs::read_to_string(pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        for _ in 0..500 {
            match proc_stat(std::path::Path::new("/proc"), pid) {
                None => return,
                Some(stat) if stat.state == 'Z' => return,
                Some(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
        panic!("process {pid} outlived its hook");
    }

    #[test]
    fn a_hook_that_ignores_a_large_input_does_not_deadlock() {
        let h = hook(HookKind::Observer, "exit 0");
        let big = json!({"x": "y".repeat(4 << 20)});
        assert_eq!(run(&h, big).unwrap(), HookReply::Allow);
    }
}
