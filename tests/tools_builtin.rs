//! The built-in tools through their one entry point (`execute`), against
//! real temp directories and real processes: happy paths, root confinement,
//! .gitignore, caps and truncation notes, atomic writes, Bash timeouts and
//! cancellation killing the whole process group; and one run through the
//! `troupe` binary where a scripted stage reads and edits a file.

#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use assert_cmd::cargo::CommandCargoExt;
use serde_json::{Value, json};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;
use troupe::error::HasCode;
use troupe::tools::ToolError;
use troupe::tools::exec::execute;
use troupe::tools::{ToolEnv, ToolLimits};

/// A project root in a temp dir, inside a parent that tests may use as
/// "outside the root".
struct Project {
    _base: TempDir,
    root: PathBuf,
    outside: PathBuf,
    env: ToolEnv,
}

impl Project {
    fn new() -> Project {
        Project::with_limits(ToolLimits::default())
    }

    fn with_limits(limits: ToolLimits) -> Project {
        let base = tempfile::tempdir().unwrap();
        let base_path = std::fs::canonicalize(base.path()).unwrap();
        let root = base_path.join("root");
        let outside = base_path.join("outside");
        std::fs::create_dir(&root).unwrap();
        std::fs::create_dir(&outside).unwrap();
        let env = ToolEnv::new(&root).with_limits(limits);
        Project {
            _base: base,
            root,
            outside,
            env,
        }
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    fn read(&self, rel: &str) -> String {
        std::fs::read_to_string(self.root.join(rel)).unwrap()
    }

    async fn call(&self, tool: &str, args: Value) -> Result<String, ToolError> {
        execute(&self.env, tool, &args, &CancellationToken::new()).await
    }

    async fn ok(&self, tool: &str, args: Value) -> String {
        match self.call(tool, args.clone()).await {
            Ok(out) => out,
            Err(e) => panic!("{tool} {args}: {} {e}", e.code()),
        }
    }

    /// The error's `Class/Code`, and its message.
    async fn err(&self, tool: &str, args: Value) -> (String, String) {
        match self.call(tool, args.clone()).await {
            Ok(out) => panic!("{tool} {args}: expected an error, got {out}"),
            Err(e) => (e.code().to_string(), e.to_string()),
        }
    }

    /// Every file name under the root and its subfolders.
    fn all_files(&self) -> Vec<String> {
        fn walk(dir: &Path, out: &mut Vec<String>) {
            for e in std::fs::read_dir(dir).unwrap() {
                let e = e.unwrap();
                if e.file_type().unwrap().is_dir() {
                    walk(&e.path(), out);
                } else {
                    out.push(e.file_name().to_string_lossy().into_owned());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.root, &mut out);
        out.sort();
        out
    }
}

// ---- Read ----

#[tokio::test]
async fn read_numbers_lines_and_windows() {
    let p = Project::new();
    p.write("a.txt", "one\ntwo\r\nthree\nfour\nfive\n");
    assert_eq!(
        p.ok("Read", json!({"path": "a.txt"})).await,
        "     1\tone\n     2\ttwo\n     3\tthree\n     4\tfour\n     5\tfive\n"
    );
    assert_eq!(
        p.ok("Read", json!({"path": "./a.txt", "offset": 2, "limit": 2}))
            .await,
        "     2\ttwo\n     3\tthree\n[showing lines 2-3 of 5; call Read with offset=4 to read on]"
    );
    assert_eq!(
        p.ok("Read", json!({"path": "a.txt", "offset": 9})).await,
        "[a.txt has 5 lines; offset 9 is past the end]"
    );
    p.write("empty.txt", "");
    assert_eq!(
        p.ok("Read", json!({"path": "empty.txt"})).await,
        "[empty.txt is empty]"
    );
}

#[tokio::test]
async fn read_caps_lines_and_output() {
    let p = Project::with_limits(ToolLimits {
        read_default_lines: 3,
        read_line_chars: 5,
        read_output_bytes: 40,
        ..ToolLimits::default()
    });
    let body: String = (1..=10).map(|i| format!("line {i} is long\n")).collect();
    p.write("long.txt", &body);
    // Default limit 3, lines cut at 5 chars, each entry 25 bytes: the output
    // cap (40 bytes) stops after the first line.
    assert_eq!(
        p.ok("Read", json!({"path": "long.txt"})).await,
        "     1\tline  … [line cut]\n[lines longer than 5 characters were cut; output cap of 40 bytes reached: showing lines 1-1 of 10; call Read with offset=2 to read on]"
    );
    let p = Project::with_limits(ToolLimits {
        read_default_lines: 3,
        ..ToolLimits::default()
    });
    p.write("long.txt", &body);
    let out = p.ok("Read", json!({"path": "long.txt"})).await;
    assert!(
        out.ends_with("[showing lines 1-3 of 10; call Read with offset=4 to read on]"),
        "{out}"
    );
    assert_eq!(out.lines().count(), 4);
}

#[tokio::test]
async fn read_errors_are_typed() {
    let p = Project::new();
    std::fs::write(p.root.join("blob.bin"), b"\x7fELF\0\0\x01binary").unwrap();
    std::fs::create_dir(p.root.join("dir")).unwrap();
    assert_eq!(
        p.err("Read", json!({"path": "missing.txt"})).await.0,
        "ToolTerminal/NotFound"
    );
    assert_eq!(
        p.err("Read", json!({"path": "blob.bin"})).await.0,
        "ToolTerminal/BinaryFile"
    );
    assert_eq!(
        p.err("Read", json!({"path": "dir"})).await.0,
        "ToolTerminal/NotAFile"
    );
    // A FIFO would block a reader forever.
    let fifo = Command::new("mkfifo")
        .arg(p.root.join("pipe"))
        .status()
        .unwrap();
    assert!(fifo.success());
    assert_eq!(
        p.err("Read", json!({"path": "pipe"})).await.0,
        "ToolTerminal/NotAFile"
    );
    assert_eq!(
        p.err(
            "Edit",
            json!({"path": "pipe", "old_string": "a", "new_string": "b"})
        )
        .await
        .0,
        "ToolTerminal/NotAFile"
    );
}

// ---- confinement ----

#[tokio::test]
async fn paths_outside_the_root_are_refused_and_nothing_is_touched() {
    let p = Project::new();
    std::fs::write(p.outside.join("secret.txt"), "secret\n").unwrap();
    std::os::unix::fs::symlink(&p.outside, p.root.join("out")).unwrap();
    std::os::unix::fs::symlink("../outside/new.txt", p.root.join("dangling")).unwrap();
    let secret = p.outside.join("secret.txt").to_string_lossy().into_owned();
    let escapes = [
        ("Read", json!({"path": "../outside/secret.txt"})),
        ("Read", json!({"path": secret})),
        ("Read", json!({"path": "out/secret.txt"})),
        (
            "Write",
            json!({"path": "../outside/new.txt", "content": "x"}),
        ),
        ("Write", json!({"path": "out/new.txt", "content": "x"})),
        ("Write", json!({"path": "out/deep/new.txt", "content": "x"})),
        ("Write", json!({"path": "dangling", "content": "x"})),
        ("Write", json!({"path": secret, "content": "x"})),
        (
            "Edit",
            json!({"path": "out/secret.txt", "old_string": "secret", "new_string": "x"}),
        ),
        ("Grep", json!({"pattern": "secret", "path": ".."})),
        ("Grep", json!({"pattern": "secret", "path": "out"})),
        ("Glob", json!({"pattern": "*", "path": "../outside"})),
    ];
    for (tool, args) in escapes {
        let (code, message) = p.err(tool, args.clone()).await;
        assert_eq!(
            code, "ToolTerminal/PathOutsideRoot",
            "{tool} {args}: {message}"
        );
    }
    let mut outside: Vec<String> = std::fs::read_dir(&p.outside)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    outside.sort();
    assert_eq!(outside, ["secret.txt"]);
    assert_eq!(
        std::fs::read_to_string(p.outside.join("secret.txt")).unwrap(),
        "secret\n"
    );
    // A symlink that stays inside is followed.
    p.write("real/file.txt", "inside\n");
    std::os::unix::fs::symlink("real", p.root.join("alias")).unwrap();
    assert_eq!(
        p.ok("Read", json!({"path": "alias/file.txt"})).await,
        "     1\tinside\n"
    );
}

// ---- Grep / Glob ----

fn search_project(limits: ToolLimits) -> Project {
    let p = Project::with_limits(limits);
    p.write(".gitignore", "target/\n*.log\n");
    p.write("src/main.rs", "fn main() {\n    helper();\n}\n");
    p.write("src/lib/helper.rs", "pub fn helper() {}\n// FN in caps\n");
    p.write("README.md", "call helper() first\n");
    p.write("target/debug/gen.rs", "fn main() {}\n");
    p.write("run.log", "fn main log\n");
    p.write(".hidden/secret.rs", "fn main() {}\n");
    std::fs::write(p.root.join("src/blob.bin"), b"fn main\0binary").unwrap();
    p
}

#[tokio::test]
async fn grep_respects_gitignore_and_orders_results() {
    let p = search_project(ToolLimits::default());
    assert_eq!(
        p.ok("Grep", json!({"pattern": r"fn \w+\("})).await,
        "src/lib/helper.rs:1: pub fn helper() {}\nsrc/main.rs:1: fn main() {"
    );
    assert_eq!(
        p.ok("Grep", json!({"pattern": "helper", "glob": "*.rs"}))
            .await,
        "src/lib/helper.rs:1: pub fn helper() {}\nsrc/main.rs:2:     helper();"
    );
    assert_eq!(
        p.ok(
            "Grep",
            json!({"pattern": "^fn", "case_insensitive": true, "path": "src/lib"})
        )
        .await,
        "no matches for /^fn/"
    );
    assert_eq!(
        p.ok(
            "Grep",
            json!({"pattern": "fn", "case_insensitive": true, "path": "src/lib/helper.rs"})
        )
        .await,
        "src/lib/helper.rs:1: pub fn helper() {}\nsrc/lib/helper.rs:2: // FN in caps"
    );
    let (code, message) = p.err("Grep", json!({"pattern": "fn ("})).await;
    assert_eq!(code, "ToolTerminal/InvalidArguments");
    assert!(message.contains("regex"), "{message}");
    let (code, _) = p.err("Grep", json!({"pattern": "x", "glob": "a[b"})).await;
    assert_eq!(code, "ToolTerminal/InvalidArguments");
}

#[tokio::test]
async fn grep_output_is_capped_with_a_note() {
    let p = Project::with_limits(ToolLimits {
        grep_line_chars: 8,
        ..ToolLimits::default()
    });
    let body: String = (1..=10).map(|i| format!("match number {i}\n")).collect();
    p.write("many.txt", &body);
    assert_eq!(
        p.ok("Grep", json!({"pattern": "match", "max_results": 2}))
            .await,
        "many.txt:1: match nu … [line cut]\nmany.txt:2: match nu … [line cut]\n[results capped at 2; narrow the pattern, `path` or `glob`, or raise `max_results`]"
    );
}

#[tokio::test]
async fn glob_respects_gitignore_and_caps() {
    let p = search_project(ToolLimits {
        search_default_results: 2,
        ..ToolLimits::default()
    });
    assert_eq!(
        p.ok("Glob", json!({"pattern": "*.rs", "max_results": 10}))
            .await,
        "src/lib/helper.rs\nsrc/main.rs"
    );
    assert_eq!(
        p.ok("Glob", json!({"pattern": "src/*.rs"})).await,
        "src/main.rs"
    );
    assert_eq!(
        p.ok("Glob", json!({"pattern": "**/*.rs", "path": "src"}))
            .await,
        "src/lib/helper.rs\nsrc/main.rs"
    );
    assert_eq!(
        p.ok("Glob", json!({"pattern": "*"})).await,
        "README.md\nsrc/blob.bin\n[showing 2 of 4 files; narrow the pattern or `path`, or raise `max_results`]"
    );
    assert_eq!(
        p.ok("Glob", json!({"pattern": "*.rs", "path": "src/main.rs"}))
            .await,
        "src/main.rs"
    );
    assert_eq!(
        p.ok("Glob", json!({"pattern": "*.py"})).await,
        "no files match `*.py`"
    );
    assert_eq!(
        p.err("Glob", json!({"pattern": "src/{a"})).await.0,
        "ToolTerminal/InvalidArguments"
    );
}

// ---- Edit / Write ----

#[tokio::test]
async fn edit_replaces_exactly_once_atomically() {
    let p = Project::new();
    p.write("f.rs", "let a = 1;\nlet b = 1;\nlet c = 2;\n");
    std::fs::set_permissions(p.root.join("f.rs"), std::fs::Permissions::from_mode(0o751)).unwrap();
    assert_eq!(
        p.ok(
            "Edit",
            json!({"path": "f.rs", "old_string": "let c = 2;", "new_string": "let c = 3;"})
        )
        .await,
        "edited f.rs: replaced 1 occurrence"
    );
    assert_eq!(p.read("f.rs"), "let a = 1;\nlet b = 1;\nlet c = 3;\n");
    let mode = std::fs::metadata(p.root.join("f.rs"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o751);

    let (code, message) = p
        .err(
            "Edit",
            json!({"path": "f.rs", "old_string": "= 1;", "new_string": "= 9;"}),
        )
        .await;
    assert_eq!(code, "ToolTerminal/AmbiguousMatch");
    assert!(
        message.contains("occurs 2 times") && message.contains("replace_all"),
        "{message}"
    );
    let (code, message) = p
        .err(
            "Edit",
            json!({"path": "f.rs", "old_string": "let d", "new_string": "x"}),
        )
        .await;
    assert_eq!(code, "ToolTerminal/NoMatch");
    assert!(message.contains("Read the file"), "{message}");
    assert_eq!(p.read("f.rs"), "let a = 1;\nlet b = 1;\nlet c = 3;\n");

    assert_eq!(
        p.ok(
            "Edit",
            json!({"path": "f.rs", "old_string": "= 1;", "new_string": "= 9;", "replace_all": true})
        )
        .await,
        "edited f.rs: replaced 2 occurrences"
    );
    assert_eq!(p.read("f.rs"), "let a = 9;\nlet b = 9;\nlet c = 3;\n");
    assert_eq!(
        p.err(
            "Edit",
            json!({"path": "nope.rs", "old_string": "a", "new_string": "b"})
        )
        .await
        .0,
        "ToolTerminal/NotFound"
    );
    assert_eq!(
        p.err(
            "Edit",
            json!({"path": "f.rs", "old_string": "a", "new_string": "a"})
        )
        .await
        .0,
        "ToolTerminal/InvalidArguments"
    );
    assert_eq!(p.all_files(), ["f.rs"], "no temp file left behind");
}

#[tokio::test]
async fn write_creates_and_overwrites_atomically() {
    let p = Project::new();
    assert_eq!(
        p.ok(
            "Write",
            json!({"path": "deep/er/new.txt", "content": "hello\n"})
        )
        .await,
        "created deep/er/new.txt (6 bytes)"
    );
    assert_eq!(p.read("deep/er/new.txt"), "hello\n");
    std::fs::set_permissions(
        p.root.join("deep/er/new.txt"),
        std::fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    assert_eq!(
        p.ok(
            "Write",
            json!({"path": "deep/er/new.txt", "content": "bye"})
        )
        .await,
        "overwrote deep/er/new.txt (3 bytes)"
    );
    assert_eq!(p.read("deep/er/new.txt"), "bye");
    let mode = std::fs::metadata(p.root.join("deep/er/new.txt"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o700);
    assert_eq!(
        p.err("Write", json!({"path": "deep", "content": "x"}))
            .await
            .0,
        "ToolTerminal/NotAFile"
    );
    // A parent that is a file: a typed error, nothing written.
    assert_eq!(
        p.err(
            "Write",
            json!({"path": "deep/er/new.txt/x", "content": "x"})
        )
        .await
        .0,
        "ToolTerminal/IoError"
    );
    assert_eq!(p.all_files(), ["new.txt"], "no temp file left behind");
}

// ---- Bash ----

/// True once `pid` is no longer running (gone, or a zombie nobody reaped).
fn dead(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // `pid (comm) S ...`: the state follows the last `)`.
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits (bounded) until `pid` is dead: a kill is delivered at once, but the
/// kernel tears a process down asynchronously.
fn assert_dies(pid: u32) {
    let until = Instant::now() + Duration::from_secs(10);
    while !dead(pid) {
        assert!(Instant::now() < until, "process {pid} is still alive");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Waits (bounded) for the command under test to write its pid file.
async fn pid_from(file: &Path) -> u32 {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(text) = std::fs::read_to_string(file)
            && let Ok(pid) = text.trim().parse()
        {
            return pid;
        }
        assert!(Instant::now() < until, "no pid file {}", file.display());
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn bash_reports_status_and_output_in_the_root() {
    let p = Project::new();
    assert_eq!(
        p.ok("Bash", json!({"command": "pwd; echo oops >&2; exit 3"}))
            .await,
        format!(
            "exit status: 3\nstdout:\n{}\nstderr:\noops\n",
            p.root.display()
        )
    );
    assert_eq!(
        p.ok("Bash", json!({"command": "true"})).await,
        "exit status: 0\n(no output)\n"
    );
    assert_eq!(
        p.ok("Bash", json!({"command": "kill -9 $$"})).await,
        "killed by signal 9\n(no output)\n"
    );
}

#[tokio::test]
async fn bash_output_is_capped_with_a_note() {
    let p = Project::with_limits(ToolLimits {
        bash_output_bytes: 100,
        ..ToolLimits::default()
    });
    let out = p
        .ok("Bash", json!({"command": "yes abcd | head -c 5000"}))
        .await;
    let expected = format!(
        "exit status: 0\nstdout:\n{}\n[stdout cut: 100 of 5000 bytes shown]\n",
        "abcd\n".repeat(20).trim_end()
    );
    assert_eq!(out, expected);
}

#[tokio::test]
async fn bash_timeout_kills_the_process_group() {
    let p = Project::new();
    let started = Instant::now();
    let (code, message) = p
        .err(
            "Bash",
            json!({"command": "sleep 30 & echo $! > pid; echo started; wait", "timeout_ms": 200}),
        )
        .await;
    assert_eq!(code, "ToolTransient/Timeout");
    assert!(message.contains("timed out after 200 ms"), "{message}");
    assert!(message.contains("stdout:\nstarted"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(20));
    assert_dies(pid_from(&p.root.join("pid")).await);
}

#[tokio::test]
async fn bash_background_jobs_die_when_the_command_exits() {
    let p = Project::new();
    assert_eq!(
        p.ok("Bash", json!({"command": "sleep 30 & echo $! > pid"}))
            .await,
        "exit status: 0\n(no output)\n"
    );
    assert_dies(pid_from(&p.root.join("pid")).await);
}

#[tokio::test]
async fn cancelling_bash_kills_children_and_grandchildren() {
    let p = Project::new();
    let cancel = CancellationToken::new();
    // bash → sh → sleep: the sleep is a grandchild of the shell.
    let args = json!({"command": "sh -c 'sleep 30 & echo $! > pid; wait' & wait"});
    let env = p.env.clone();
    let token = cancel.clone();
    let call = tokio::spawn(async move { execute(&env, "Bash", &args, &token).await });
    let pid = pid_from(&p.root.join("pid")).await;
    cancel.cancel();
    let result = call.await.unwrap();
    assert_eq!(
        result.unwrap_err().code().to_string(),
        "ToolTerminal/ToolCancelled"
    );
    assert_dies(pid);
}

#[tokio::test]
async fn dropping_a_bash_call_kills_its_group() {
    let p = Project::new();
    let env = p.env.clone();
    let args = json!({"command": "sleep 30 & echo $! > pid; wait"});
    let call =
        tokio::spawn(async move { execute(&env, "Bash", &args, &CancellationToken::new()).await });
    let pid = pid_from(&p.root.join("pid")).await;
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert_dies(pid);
}

// ---- arguments ----

#[tokio::test]
async fn invalid_arguments_are_typed_and_name_the_field() {
    let p = Project::new();
    let cases = [
        ("Read", json!({"path": 7}), "/path"),
        ("Read", json!({"path": "a", "limit": 0}), "/limit"),
        ("Read", json!({"file": "a"}), "path"),
        ("Grep", json!({"pattern": ""}), "/pattern"),
        (
            "Edit",
            json!({"path": "a", "old_string": "x"}),
            "new_string",
        ),
        ("Write", json!({"path": "a"}), "content"),
        (
            "Bash",
            json!({"command": "ls", "timeout_ms": 0}),
            "/timeout_ms",
        ),
        (
            "Bash",
            json!({"command": "ls", "timeout_ms": 999_999_999}),
            "/timeout_ms",
        ),
        (
            "Glob",
            json!({"pattern": "*", "max_results": "ten"}),
            "/max_results",
        ),
    ];
    for (tool, args, field) in cases {
        let (code, message) = p.err(tool, args.clone()).await;
        assert_eq!(code, "ToolTerminal/InvalidArguments", "{tool} {args}");
        assert!(message.contains(field), "{tool} {args}: {message}");
    }
    assert_eq!(
        p.err("Teleport", json!({})).await.0,
        "ToolTerminal/ToolUnavailable"
    );
    assert_eq!(p.ok("Echo", json!({"text": "hi"})).await, "hi");
}

#[tokio::test]
async fn a_missing_root_is_a_typed_error() {
    let env = ToolEnv::new("/definitely/not/a/dir");
    let err = execute(
        &env,
        "Read",
        &json!({"path": "a"}),
        &CancellationToken::new(),
    )
    .await
    .unwrap_err();
    assert_eq!(err.code().to_string(), "ToolTerminal/RootUnavailable");
}

// ---- through the binary ----

#[test]
fn a_scripted_stage_reads_edits_and_runs_bash_under_root() {
    let stage = common::stage_md("fix", "", "Rename the thing.")
        .replace("allowedTools: [Read]", "allowedTools: [Read, Edit, Bash]");
    let script = r#"stages:
  fix:
    - tool: Read
      args: { path: src/lib.txt }
    - calls:
        - { tool: Edit, args: { path: src/lib.txt, old_string: "old name", new_string: "new name" } }
        - { tool: Read, args: { path: ../outside.txt } }
    - tool: Bash
      args: { command: "grep -c 'new name' src/lib.txt" }
    - complete: { summary: "renamed" }
"#;
    let pipeline = common::Fixture::new(
        "id: edit-demo\nentry: fix\nstages:\n  fix: fix.md\nnext:\n  fix: end\n",
        &[("fix.md", &stage), ("script.yaml", script)],
    );
    let project = tempfile::tempdir().unwrap();
    let root = project.path().join("root");
    std::fs::create_dir_all(root.join("src")).unwrap();
    std::fs::write(root.join("src/lib.txt"), "the old name stays\n").unwrap();
    std::fs::write(project.path().join("outside.txt"), "secret\n").unwrap();
    let runs = tempfile::tempdir().unwrap();

    let out = Command::cargo_bin("troupe")
        .unwrap()
        .arg("run")
        .arg(pipeline.path())
        .arg("--root")
        .arg(&root)
        .arg("--runs-dir")
        .arg(runs.path().join("runs"))
        .arg("--json")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(root.join("src/lib.txt")).unwrap(),
        "the new name stays\n"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let audit: Vec<Value> =
        troupe::auditlog::read_text(std::path::Path::new(report["auditPath"].as_str().unwrap()))
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let tools = |event: &str| -> Vec<String> {
        audit
            .iter()
            .filter(|e| e["event"] == event)
            .map(|e| e["tool"].as_str().unwrap().to_owned())
            .collect()
    };
    assert_eq!(tools("ToolInvocationSucceeded"), ["Read", "Edit", "Bash"]);
    assert_eq!(tools("ToolInvocationFailed"), ["Read"]);
    let failed = audit
        .iter()
        .find(|e| e["event"] == "ToolInvocationFailed")
        .unwrap();
    assert_eq!(failed["code"], "ToolTerminal/PathOutsideRoot");
}

#[test]
fn root_must_be_a_directory() {
    let pipeline = common::Fixture::linear(&[]);
    let file = pipeline.file("pipeline.yaml");
    for bad in [file.as_path(), Path::new("/definitely/not/here")] {
        let out = Command::cargo_bin("troupe")
            .unwrap()
            .arg("run")
            .arg(pipeline.path())
            .args(["--task", "t", "--root"])
            .arg(bad)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("Validation/InputInvalid") && stderr.contains("--root"),
            "{stderr}"
        );
    }
}
