//! Signals through the real binary: SIGTERM, SIGHUP and SIGINT each cancel a
//! run whose `Bash` call holds a child and a grandchild, with exit codes
//! 143, 129 and 130, an audit log that ends with `WorkflowExit`
//! (cancelled), and no process of the call left; a second signal exits at
//! once, with the first one's code, and still leaves no process behind.
//!
//! The shell's processes hold a FIFO open for writing; the test reads it
//! to know they are up (each writes a line) and to know they are gone (the
//! reader sees end-of-file once every writer has exited). No sleeps.
//!
//! SIGKILL, which troupe cannot handle, leaves nothing behind either:
//! troupe's reaper process kills the call's group once troupe is gone.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;

/// The longest the test waits for the killed processes to be gone before
/// it fails (a bound on a blocking wait, not a pause).
const GONE_WITHIN: Duration = Duration::from_secs(30);

/// A one-stage pipeline whose stage runs `command` with `Bash`, or a
/// `plan → map worker` fan-out of `width` whose sibling 0 runs it.
fn pipeline(command: &str, fan_out: Option<usize>) -> common::Fixture {
    let stage = |id: &str| {
        common::stage_md(id, "", "Work.").replace("allowedTools: [Read]", "allowedTools: [Bash]")
    };
    let bash = format!(
        "    - tool: Bash\n      args:\n        timeout_ms: 600000\n        command: |\n{}",
        command
            .lines()
            .map(|l| format!("          {l}\n"))
            .collect::<String>()
    );
    match fan_out {
        None => common::Fixture::new(
            "id: sig\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
            &[
                ("s.md", &stage("s")),
                ("script.yaml", &format!("stages:\n  s:\n{bash}")),
            ],
        ),
        Some(width) => {
            let plan = common::stage_md("plan", "", "Plan.").replace(
                "required: [summary]\n  properties:\n    summary: { type: string }",
                "required: [items]\n  properties:\n    items: { type: array }",
            );
            common::Fixture::new(
                "id: sig-fan\nentry: plan\nstages:\n  plan: plan.md\n  worker: worker.md\n  reduce: reduce.md\nnext:\n  plan: { parallel: { map: worker, over: \"ctx.upstream[0].parsed.items\" }, join: reduce }\n  reduce: end\n",
                &[
                    ("plan.md", &plan),
                    ("worker.md", &stage("worker")),
                    ("reduce.md", &stage("reduce")),
                    (
                        "script.yaml",
                        &format!(
                            "stages:\n  plan:\n    - complete: {{ items: {{ $range: {width} }} }}\n  \"worker#0\":\n{bash}"
                        ),
                    ),
                ],
            )
        }
    }
}

/// A project root holding a FIFO, and the shell command that starts a
/// child and a grandchild (both named after `marker`, both holding the
/// FIFO), reports each on the FIFO, and waits.
struct Project {
    root: tempfile::TempDir,
    marker: String,
}

impl Project {
    fn new(marker: String) -> Project {
        let root = tempfile::tempdir().unwrap();
        let made = Command::new("mkfifo")
            .arg(root.path().join("ready"))
            .status()
            .unwrap();
        assert!(made.success());
        Project { root, marker }
    }

    fn fifo(&self) -> PathBuf {
        self.root.path().join("ready")
    }

    fn command(&self) -> String {
        let m = &self.marker;
        format!(
            "echo \"$TMPDIR\" >tmpdir\n\
             exec 3>ready\n\
             ( echo child >&3; exec -a {m}-child sleep 3600 ) &\n\
             ( ( echo grandchild >&3; exec -a {m}-grandchild sleep 3600 ) & wait ) &\n\
             wait\n"
        )
    }
}

/// A failed test must not leave its sleepers behind for an hour.
impl Drop for Project {
    fn drop(&mut self) {
        for (pid, _) in with_marker(&self.marker) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Starts `troupe run` on `pipeline` with `--events -`.
fn start(pipeline: &Path, project: &Project, runs: &Path) -> Child {
    start_with(pipeline, project, runs, &[])
}

/// As `start`, with `extra` flags.
fn start_with(pipeline: &Path, project: &Project, runs: &Path, extra: &[&str]) -> Child {
    std::process::Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(pipeline)
        .args(extra)
        .arg("--root")
        .arg(project.root.path())
        .arg("--runs-dir")
        .arg(runs.join("runs"))
        .args(["--events", "-", "--headless"])
        // The shells' private temp folder is made here: an exit at once
        // leaves it behind, and the test removes `runs`.
        .env("TMPDIR", runs)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Reads the event stream on a thread of its own until told to stop, then
/// keeps the pipe open without reading (so the run's publishers block)
/// until the child has exited. Sends every event it reads.
struct Stream {
    stop: Arc<AtomicBool>,
    events: mpsc::Receiver<Value>,
    thread: std::thread::JoinHandle<BufReader<ChildStdout>>,
}

impl Stream {
    fn read(stdout: ChildStdout) -> Stream {
        let stop = Arc::new(AtomicBool::new(false));
        let (tx, events) = mpsc::channel();
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let mut reader = BufReader::new(stdout);
            let mut line = String::new();
            while !flag.load(Ordering::SeqCst) {
                line.clear();
                if reader.read_line(&mut line).unwrap() == 0 {
                    break;
                }
                let _ = tx.send(serde_json::from_str(&line).unwrap());
            }
            reader
        });
        Stream {
            stop,
            events,
            thread,
        }
    }

    /// Events until the first that `is` accepts (panics if the stream ends).
    fn until(&self, is: impl Fn(&Value) -> bool) -> Value {
        loop {
            let v = self.events.recv().expect("the stream ended early");
            if is(&v) {
                return v;
            }
        }
    }
}

/// Opens the FIFO (blocks until the shell opens it) and reads until both
/// the child and the grandchild reported; returns the reader.
fn wait_until_up(project: &Project) -> BufReader<std::fs::File> {
    let mut reader = BufReader::new(std::fs::File::open(project.fifo()).unwrap());
    let mut seen = Vec::new();
    while seen.len() < 2 {
        let mut line = String::new();
        assert!(reader.read_line(&mut line).unwrap() > 0, "{seen:?}");
        seen.push(line.trim().to_owned());
    }
    seen.sort();
    assert_eq!(seen, ["child", "grandchild"]);
    reader
}

/// Waits until every process holding the FIFO has exited (end-of-file),
/// then checks that none named after the marker is left in /proc.
fn assert_all_gone(mut fifo: BufReader<std::fs::File>, marker: &str) {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = fifo.read_to_string(&mut rest);
        let _ = tx.send(rest);
    });
    rx.recv_timeout(GONE_WITHIN).unwrap_or_else(|_| {
        panic!(
            "processes of the Bash call still hold the FIFO: {:?}",
            with_marker(marker)
        )
    });
    assert_eq!(with_marker(marker), []);
}

/// Processes whose command line contains `marker` (a zombie has none),
/// with that command line.
fn with_marker(marker: &str) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse().ok()) else {
            continue;
        };
        if let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) {
            let text = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            if text.contains(marker) {
                found.push((pid, text));
            }
        }
    }
    found
}

/// Waits until a thread of `child` sits in a `write` or `writev` to its
/// standard output (what `/proc/<pid>/task/<tid>/syscall` shows of a
/// thread blocked in a system call): the pipe is full. Where that cannot
/// be read (troupe makes itself non-dumpable, so only a user who may
/// trace it can; or another architecture), it returns at once and the
/// test relies on the run filling the pipe before the signal, as it did.
fn wait_until_blocked_on_stdout(child: &Child) {
    let writes: &[&str] = if cfg!(target_arch = "x86_64") {
        &["1", "20"]
    } else if cfg!(target_arch = "aarch64") {
        &["64", "66"]
    } else {
        return;
    };
    let tasks = PathBuf::from(format!("/proc/{}/task", child.id()));
    let deadline = std::time::Instant::now() + GONE_WITHIN;
    loop {
        let mut blocked = false;
        for task in std::fs::read_dir(&tasks).unwrap().flatten() {
            let call = match std::fs::read_to_string(task.path().join("syscall")) {
                Ok(call) => call,
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => return,
                // A thread that ended meanwhile.
                Err(_) => continue,
            };
            let mut fields = call.split_whitespace();
            blocked |=
                fields.next().is_some_and(|n| writes.contains(&n)) && fields.next() == Some("0x1");
        }
        if blocked {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "troupe never blocked on its full stdout"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn send(child: &Child, signal: Signal) {
    kill(Pid::from_raw(i32::try_from(child.id()).unwrap()), signal).unwrap();
}

fn audit_lines(runs: &Path, run_id: &str) -> Vec<Value> {
    troupe::auditlog::read_text(&runs.join("runs").join(run_id).join(troupe::auditlog::FILE))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

#[test]
fn sigterm_sighup_and_sigint_cancel_the_run_and_kill_the_shells_processes() {
    for (signal, code) in [
        (Signal::SIGTERM, 143),
        (Signal::SIGHUP, 129),
        (Signal::SIGINT, 130),
    ] {
        let project = Project::new(format!("troupe-sig-{}-{signal}", std::process::id()));
        let pipeline = pipeline(&project.command(), None);
        let runs = tempfile::tempdir().unwrap();
        let mut child = start(pipeline.path(), &project, runs.path());
        let stream = Stream::read(child.stdout.take().unwrap());
        let started =
            stream.until(|v| v["event"] == "ToolInvocationStarted" && v["tool"] == "Bash");
        let run_id = started["workflowRunId"].as_str().unwrap().to_owned();
        let fifo = wait_until_up(&project);

        send(&child, signal);
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(code), "{signal}: {stderr}");
        assert!(stderr.contains("cancelling the run"), "{signal}: {stderr}");
        assert!(!stderr.contains("exiting at once"), "{signal}: {stderr}");
        // The stream too ends with the run's end.
        let _ = stream.thread.join().unwrap();
        let rest: Vec<Value> = stream.events.try_iter().collect();
        assert_eq!(rest.last().unwrap()["event"], "WorkflowExit", "{signal}");

        let audit = audit_lines(runs.path(), &run_id);
        let last = audit.last().unwrap();
        assert_eq!(last["event"], "WorkflowExit", "{signal}");
        assert_eq!(last["status"], "cancelled", "{signal}");
        assert!(
            audit.iter().any(|e| e["event"] == "StageCancelled"),
            "{signal}"
        );
        assert_all_gone(fifo, &project.marker);
    }
}

/// A second signal exits at once, even when the first cannot end the run:
/// here the `--events` reader stops reading while thousands of siblings
/// publish, so the run blocks on the full stream. The exit code is the
/// first signal's; the `Bash` call's processes are killed all the same.
#[test]
fn a_second_signal_exits_at_once_with_the_first_ones_code_and_kills_the_shells() {
    for (first, second, code) in [
        (Signal::SIGTERM, Signal::SIGTERM, 143),
        (Signal::SIGHUP, Signal::SIGINT, 129),
    ] {
        let project = Project::new(format!("troupe-sig2-{}-{first}", std::process::id()));
        let pipeline = pipeline(&project.command(), Some(20_000));
        let runs = tempfile::tempdir().unwrap();
        let mut child = start(pipeline.path(), &project, runs.path());
        let stream = Stream::read(child.stdout.take().unwrap());
        // The run cannot end while sibling 0's call runs; once it is up,
        // stop reading: the stream fills and every publisher blocks.
        let fifo = wait_until_up(&project);
        stream.stop.store(true, Ordering::SeqCst);
        // Signalled before the pipe is full, the run can still write its
        // end and exit on the first signal (seen in CI with 24 siblings
        // done): wait until a thread of troupe is blocked writing stdout.
        wait_until_blocked_on_stdout(&child);

        send(&child, first);
        let mut stderr = BufReader::new(child.stderr.take().unwrap());
        let mut line = String::new();
        while !line.contains("cancelling the run") {
            line.clear();
            assert!(stderr.read_line(&mut line).unwrap() > 0, "no first notice");
        }
        send(&child, second);
        let status = child.wait().unwrap();
        let mut rest = String::new();
        stderr.read_to_string(&mut rest).unwrap();
        assert_eq!(status.code(), Some(code), "{first} then {second}: {rest}");
        assert!(rest.contains("exiting at once"), "{rest}");
        assert_all_gone(fifo, &project.marker);
        drop(stream.thread.join().unwrap());
    }
}

/// `kill -9` gives troupe no chance to act; its reaper sees the pipe from
/// troupe close and kills the `Bash` call's whole process group.
#[test]
fn sigkill_leaves_no_shell_process_behind() {
    for sandbox in [true, false] {
        let project = Project::new(format!("troupe-sig9-{}-{sandbox}", std::process::id()));
        let pipeline = pipeline(&project.command(), None);
        let runs = tempfile::tempdir().unwrap();
        let mut child = if sandbox {
            start(pipeline.path(), &project, runs.path())
        } else {
            start_with(pipeline.path(), &project, runs.path(), &["--no-sandbox"])
        };
        let stream = Stream::read(child.stdout.take().unwrap());
        let fifo = wait_until_up(&project);
        send(&child, Signal::SIGKILL);
        let status = child.wait().unwrap();
        assert_eq!(
            std::os::unix::process::ExitStatusExt::signal(&status),
            Some(9)
        );
        assert_all_gone(fifo, &project.marker);
        drop(stream.thread.join().unwrap());
        // The shells' private temp folder goes with them: the reaper
        // removes it, as troupe could not.
        let tmpdir = std::fs::read_to_string(project.root.path().join("tmpdir")).unwrap();
        let tmpdir = PathBuf::from(tmpdir.trim());
        if sandbox {
            assert!(
                tmpdir.to_string_lossy().contains("troupe-bash-"),
                "the sandbox's own TMPDIR: {tmpdir:?}"
            );
            let deadline = std::time::Instant::now() + GONE_WITHIN;
            while tmpdir.exists() {
                assert!(
                    std::time::Instant::now() < deadline,
                    "{tmpdir:?} outlived troupe"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}
