//! The shell sandbox: through the binary, a `Bash` call gets a scrubbed
//! environment (no `OPENAI_API_KEY`; `--pass-env` passes a name) and, where
//! the kernel has Landlock, may write only beneath the root and its private
//! temp folder; `--no-sandbox` lifts both. Through the library, a sandbox
//! pointed at the built binary confines writes and keeps the process-group
//! behaviour: a cancelled call's child and grandchild die.
//!
//! The Landlock tests detect support at run time and skip, with a note on
//! stderr, on a kernel without it.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;
use troupe::error::HasCode;
use troupe::tools::ToolEnv;
use troupe::tools::exec::execute;
use troupe::tools::sandbox::{Confined, ShellSandbox, WriteConfinement, probe, scrubbed_env};

/// A one-stage pipeline whose stage runs `command` with `Bash`, once.
fn pipeline(command: &str) -> common::Fixture {
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: [Bash]");
    let script = format!(
        "stages:\n  s:\n    - tool: Bash\n      args:\n        command: |\n{}    - complete: {{ summary: done }}\n",
        command
            .lines()
            .map(|l| format!("          {l}\n"))
            .collect::<String>()
    );
    common::Fixture::new(
        "id: sbx\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
        &[("s.md", &stage), ("script.yaml", &script)],
    )
}

/// A project root, with a sibling folder outside it, in a temp dir.
struct Project {
    _base: tempfile::TempDir,
    root: PathBuf,
    outside: PathBuf,
    runs: PathBuf,
}

impl Project {
    fn new() -> Project {
        let base = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(base.path()).unwrap();
        let (root, outside, runs) = (path.join("root"), path.join("outside"), path.join("runs"));
        for dir in [&root, &outside] {
            std::fs::create_dir(dir).unwrap();
        }
        Project {
            _base: base,
            root,
            outside,
            runs,
        }
    }

    /// Runs `pipeline` with `flags`, the extra environment `env`, and
    /// returns the output and the run's `WorkflowStarted.shellSandbox`.
    fn run(
        &self,
        pipeline: &common::Fixture,
        flags: &[&str],
        env: &[(&str, &str)],
    ) -> (Output, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
            .arg("run")
            .arg(pipeline.path())
            .arg("--root")
            .arg(&self.root)
            .arg("--runs-dir")
            .arg(self.runs.join("runs"))
            .args(["--json", "--headless"])
            .args(flags)
            .envs(env.iter().copied())
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        let audit = troupe::auditlog::read_text(std::path::Path::new(
            report["auditPath"].as_str().unwrap(),
        ))
        .unwrap();
        let started: Value = serde_json::from_str(audit.lines().next().unwrap()).unwrap();
        assert_eq!(started["event"], "WorkflowStarted");
        let mode = started["shellSandbox"].as_str().unwrap().to_owned();
        (out, mode)
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }
}

/// A descriptor troupe was started with (`7>>file`) does not pass to the
/// shells it starts: Landlock does not check a file already open, and a
/// sandboxed shell wrote outside its root through one. With and without
/// the sandbox, the shell finds no descriptor 7.
#[test]
fn a_descriptor_troupe_inherited_does_not_reach_a_shell() {
    let p = Project::new();
    let victim = p.outside.join("victim");
    std::fs::write(&victim, "").unwrap();
    let fixture = pipeline(
        "if echo ESCAPED >&7; then echo wrote > fd.txt; else echo none > fd.txt; fi
",
    );
    for flags in ["", "--no-sandbox"] {
        let out = Command::new("sh")
            .arg("-c")
            .arg(format!(
                "exec \"$0\" run \"$1\" --root \"$2\" --runs-dir \"$3\" --json --headless {flags} 7>>\"$4\""
            ))
            .arg(env!("CARGO_BIN_EXE_troupe"))
            .arg(fixture.path())
            .arg(&p.root)
            .arg(p.runs.join("runs"))
            .arg(&victim)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{flags}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(p.read("fd.txt").trim(), "none", "{flags}");
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "", "{flags}");
    }
}

#[test]
fn bash_cannot_read_the_api_key_and_pass_env_passes_a_name() {
    let pipeline = pipeline(
        "echo \"key=${OPENAI_API_KEY:-unset} passed=${TROUPE_TEST_PASSED:-unset} other=${TROUPE_TEST_OTHER:-unset} home=${HOME:-unset}\" > env.txt",
    );
    let env = [
        ("OPENAI_API_KEY", "sk-test-must-not-leak"),
        ("TROUPE_TEST_PASSED", "yes"),
        ("TROUPE_TEST_OTHER", "no"),
    ];
    let home = std::env::var("HOME").unwrap_or_else(|_| "unset".to_owned());
    let p = Project::new();

    let (out, mode) = p.run(&pipeline, &["--pass-env", "TROUPE_TEST_PASSED"], &env);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if landlock_here(&p.root).is_some() {
        assert_eq!(mode, "landlock", "{stderr}");
        assert_eq!(stderr, "");
    } else {
        // Said once, at the start.
        assert_eq!(mode, "env-only");
        assert_eq!(
            stderr.matches("Landlock is not available").count(),
            1,
            "{stderr}"
        );
    }
    assert_eq!(
        p.read("env.txt"),
        format!("key=unset passed=yes other=unset home={home}\n")
    );

    let (out, mode) = p.run(&pipeline, &["--no-sandbox"], &env);
    assert_eq!(mode, "off");
    assert_eq!(
        p.read("env.txt"),
        format!("key=sk-test-must-not-leak passed=yes other=no home={home}\n")
    );
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("--no-sandbox: Bash calls get troupe's whole environment"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A temp folder that cannot be made for the shells (its disk full, a
/// TMPDIR that does not exist) leaves them confined to the root alone,
/// never unconfined.
#[test]
fn without_a_temp_folder_bash_is_still_confined_to_the_root() {
    let p = Project::new();
    let outside = p.outside.join("x");
    let pipeline = pipeline(&format!(
        "touch inside.txt; echo \"inside=$?\" >> report.txt\n\
         touch '{}'; echo \"outside=$?\" >> report.txt\n",
        outside.display()
    ));
    if landlock_here(&p.root).is_none() {
        return;
    }
    let missing = p.outside.join("no-such-tmp");
    let (out, mode) = p.run(&pipeline, &[], &[("TMPDIR", missing.to_str().unwrap())]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(mode, "landlock", "{stderr}");
    assert!(stderr.contains("confined to --root alone"), "{stderr}");
    assert_eq!(p.read("report.txt"), "inside=0\noutside=1\n");
    assert!(!outside.exists());
}

#[test]
fn bash_writes_only_beneath_the_root_unless_no_sandbox() {
    let p = Project::new();
    let in_tmp = std::env::temp_dir().join(format!("troupe-sandbox-test-{}", std::process::id()));
    let _ = std::fs::remove_file(&in_tmp);
    let outside = p.outside.join("x");
    let pipeline = pipeline(&format!(
        "touch inside.txt; echo \"inside=$?\" >> report.txt\n\
         touch '{}'; echo \"outside=$?\" >> report.txt\n\
         touch '{}'; echo \"tmp=$?\" >> report.txt\n\
         echo t > \"$TMPDIR/t\"; echo \"tmpdir=$?\" >> report.txt\n\
         echo t > /dev/null; echo \"devnull=$?\" >> report.txt\n\
         kill -0 $PPID 2>/dev/null; echo \"signal=$?\" >> report.txt\n",
        outside.display(),
        in_tmp.display()
    ));

    let Some(confined) = landlock_here(&p.root) else {
        return;
    };
    let (_, mode) = p.run(&pipeline, &[], &[]);
    assert_eq!(mode, "landlock");
    // Signal scoping (troupe, the shell's parent, is out of reach) needs
    // Landlock ABI 6.
    let signal = if confined.abi >= 6 { 1 } else { 0 };
    assert_eq!(
        p.read("report.txt"),
        format!("inside=0\noutside=1\ntmp=1\ntmpdir=0\ndevnull=0\nsignal={signal}\n")
    );
    assert!(p.root.join("inside.txt").is_file());
    assert!(!outside.exists());
    assert!(!in_tmp.exists());

    std::fs::remove_file(p.root.join("report.txt")).unwrap();
    let (_, mode) = p.run(&pipeline, &["--no-sandbox"], &[]);
    assert_eq!(mode, "off");
    let report = p.read("report.txt");
    let _ = std::fs::remove_file(&in_tmp);
    assert_eq!(
        report,
        "inside=0\noutside=0\ntmp=0\ntmpdir=0\ndevnull=0\nsignal=0\n"
    );
    assert!(outside.is_file());
}

/// Whether and how far this kernel enforces Landlock (checked on a
/// throwaway thread); if not at all, says the test is skipped.
fn landlock_here(root: &Path) -> Option<Confined> {
    match probe(&[root.to_owned()]) {
        Ok(confined) => Some(confined),
        Err(e) => {
            eprintln!("skipped: {}: {e}", e.code());
            None
        }
    }
}

/// A library user's sandbox, pointed at the built binary.
fn confined(root: &Path) -> Option<ToolEnv> {
    landlock_here(root)?;
    let sandbox = ShellSandbox {
        env: scrubbed_env(&[]),
        writes: Some(WriteConfinement {
            launcher: PathBuf::from(env!("CARGO_BIN_EXE_troupe")),
            tmp: None,
        }),
    };
    Some(ToolEnv::new(root).with_sandbox(Some(Arc::new(sandbox))))
}

#[tokio::test]
async fn a_library_sandbox_confines_writes_through_the_binary() {
    let p = Project::new();
    let Some(env) = confined(&p.root) else { return };
    let command = format!(
        "echo in > inside.txt && echo ok; echo out > '{}/x'",
        p.outside.display()
    );
    let out = execute(
        &env,
        "Bash",
        &json!({ "command": command }),
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(out.starts_with("exit status: 1\nstdout:\nok\n"), "{out}");
    assert!(out.contains("Permission denied"), "{out}");
    assert_eq!(p.read("inside.txt"), "in\n");
    assert!(!p.outside.join("x").exists());
}

/// Cancelling a sandboxed call kills its child and grandchild: the shell
/// is exec'd by `sandbox-exec`, so it still leads the call's own process
/// group. They hold a FIFO; end-of-file on it means they are gone. (The
/// test blocks on the FIFO's channels: the call runs on another worker.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_sandboxed_call_kills_its_child_and_grandchild() {
    let p = Project::new();
    let Some(env) = confined(&p.root) else { return };
    assert!(
        Command::new("mkfifo")
            .arg(p.root.join("up"))
            .status()
            .unwrap()
            .success()
    );
    let args = json!({
        "command": "exec 3>up; ( echo child >&3; sleep 3600 ) & ( ( echo grandchild >&3; sleep 3600 ) & wait ) & wait"
    });
    let cancel = CancellationToken::new();
    let token = cancel.clone();
    let call = tokio::spawn(async move { execute(&env, "Bash", &args, &token).await });

    let fifo = p.root.join("up");
    let (up_tx, up) = mpsc::channel();
    let (gone_tx, gone) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(std::fs::File::open(fifo).unwrap());
        for _ in 0..2 {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            up_tx.send(line.trim().to_owned()).unwrap();
        }
        let mut rest = String::new();
        let _ = reader.read_to_string(&mut rest);
        let _ = gone_tx.send(());
    });
    let mut seen: Vec<String> = (0..2)
        .map(|_| up.recv_timeout(Duration::from_secs(30)).unwrap())
        .collect();
    seen.sort();
    assert_eq!(seen, ["child", "grandchild"]);

    cancel.cancel();
    let err = call.await.unwrap().unwrap_err();
    assert_eq!(err.code().to_string(), "ToolTerminal/ToolCancelled");
    gone.recv_timeout(Duration::from_secs(30))
        .expect("the call's processes still hold the FIFO");
}

/// A sandboxed shell leads a session of its own, with no controlling
/// terminal: it cannot open the terminal of the person running troupe to
/// type into it (`TIOCSTI`) or read what they type, and its process group
/// is still the one a cancel kills (the test above).
#[tokio::test]
async fn a_sandboxed_shell_leads_its_own_session() {
    let p = Project::new();
    let Some(env) = confined(&p.root) else { return };
    let args = json!({
        "command": "read -r pid comm state ppid pgrp sid rest < /proc/$$/stat; echo \"$pid $pgrp $sid\"; (exec 3</dev/tty) 2>/dev/null && echo has-tty || echo no-tty"
    });
    let out = execute(&env, "Bash", &args, &CancellationToken::new())
        .await
        .unwrap();
    let line = out.lines().nth(2).unwrap_or_default();
    let ids: Vec<&str> = line.split_whitespace().collect();
    assert_eq!(ids.len(), 3, "{out}");
    assert!(
        ids[0] == ids[1] && ids[1] == ids[2],
        "pid, group, session: {out}"
    );
    let ours = std::fs::read_to_string("/proc/self/stat").unwrap();
    let our_session = ours
        .rsplit(')')
        .next()
        .unwrap()
        .split_whitespace()
        .nth(3)
        .unwrap()
        .to_owned();
    assert_ne!(ids[2], our_session, "{out}");
    assert!(out.contains("no-tty"), "{out}");
}
