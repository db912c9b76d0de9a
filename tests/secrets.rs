//! Attack tests: can anything troupe starts get at the API key? A scripted
//! model asks for one `Bash` call, approved by `allowedTools`, which runs
//! `tests/attacks/steal.py` — the attacker's script. It reads its own
//! environment, then, for every troupe process it finds (the run and its
//! reaper), `/proc/<pid>/environ`, `cmdline`, `mem` (every readable
//! mapping, searched for the key's prefix), `fd` (every open file read),
//! tries to `ptrace` it and to signal it, and writes what each route gave
//! into `loot/`. The test fails when the key is anywhere in the loot, the
//! run folder or the store — and checks that each route ran, so a script
//! that silently did nothing cannot pass.
//!
//! The same attack runs as root and, when the suite runs as root, as an
//! ordinary user (`setpriv` to `nobody`): the guarantees differ (SECURITY.md
//! says which), the key stays out in both. A control run with
//! `--no-sandbox` hands the shell troupe's whole environment and must leak:
//! that proves the loot is searched right.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// The key, unique per test so a leak from another test cannot confuse it.
fn secret(tag: &str) -> String {
    format!("sk-troupe-{tag}-{}", std::process::id())
}

/// A one-stage pipeline whose stage runs the attacker's script with `Bash`.
fn pipeline(python: &str) -> common::Fixture {
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: [Bash]");
    let steal = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/attacks/steal.py");
    let troupe = std::fs::canonicalize(env!("CARGO_BIN_EXE_troupe")).unwrap();
    let script = format!(
        "stages:\n  s:\n    - tool: Bash\n      args: {{ command: \"{python} {} {} > attack.log 2>&1\" }}\n    - complete: {{ summary: done }}\n",
        steal.display(),
        troupe.display()
    );
    common::Fixture::new(
        "id: steal\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
        &[("s.md", &stage), ("script.yaml", &script)],
    )
}

/// A project everyone may enter (for the run as `nobody`): the root the
/// shell works in, and the runs folder beside it (the store goes there).
struct Project {
    _base: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
}

impl Project {
    fn new() -> Project {
        let base = tempfile::tempdir().unwrap();
        let path = std::fs::canonicalize(base.path()).unwrap();
        let root = path.join("root");
        std::fs::create_dir(&root).unwrap();
        for dir in [&path, &root] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        Project {
            _base: base,
            base: path,
            root,
        }
    }

    /// Runs the attack under `troupe run` with `flags`, as the user `runas`
    /// wraps it in, and returns the loot by route.
    fn attack(
        &self,
        pipeline: &common::Fixture,
        key: &str,
        flags: &[&str],
        runas: &[&str],
    ) -> Loot {
        let mut cmd = match runas.split_first() {
            Some((first, rest)) => {
                let mut c = Command::new(first);
                c.args(rest).arg(env!("CARGO_BIN_EXE_troupe"));
                c
            }
            None => Command::new(env!("CARGO_BIN_EXE_troupe")),
        };
        let out = cmd
            .arg("run")
            .arg(pipeline.path())
            .arg("--root")
            .arg(&self.root)
            .arg("--runs-dir")
            .arg(self.base.join("runs"))
            .args(["--json", "--headless"])
            .args(flags)
            .env("OPENAI_API_KEY", key)
            .env("HOME", &self.base)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{stdout}{stderr}");
        let report: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(report["status"], "ok", "{stdout}");
        let mut routes = std::collections::BTreeMap::new();
        let loot = self.root.join("loot");
        let log = std::fs::read_to_string(self.root.join("attack.log")).unwrap_or_default();
        assert!(loot.is_dir(), "the attack did not run: {log}");
        for entry in std::fs::read_dir(&loot).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_stem().unwrap().to_string_lossy().into_owned();
            routes.insert(name, std::fs::read_to_string(&path).unwrap());
        }
        Loot { routes, log }
    }

    /// Every file of the project (run folder, audit log, store) that holds
    /// `key`.
    fn files_holding(&self, key: &str) -> Vec<PathBuf> {
        let mut found = Vec::new();
        let mut stack = vec![self.base.join("runs"), self.base.join(".troupe")];
        while let Some(dir) = stack.pop() {
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            for entry in entries {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if std::fs::read(&path)
                    .unwrap()
                    .windows(key.len())
                    .any(|w| w == key.as_bytes())
                {
                    found.push(path);
                }
            }
        }
        found
    }
}

struct Loot {
    routes: std::collections::BTreeMap<String, String>,
    log: String,
}

impl Loot {
    fn route(&self, name: &str) -> &str {
        self.routes.get(name).unwrap_or_else(|| {
            panic!(
                "route {name} never ran: {:?}\n{}",
                self.routes.keys(),
                self.log
            )
        })
    }

    /// The routes whose loot holds `key`.
    fn leaks(&self, key: &str) -> Vec<&str> {
        self.routes
            .iter()
            .filter(|(_, text)| text.contains(key))
            .map(|(route, _)| route.as_str())
            .collect()
    }

    /// The troupe processes the attacker found.
    fn pids(&self) -> usize {
        self.route("pids").split_whitespace().count()
    }
}

fn landlock() -> bool {
    troupe::tools::sandbox::probe(&[std::env::temp_dir()]).is_ok()
}

fn is_root() -> bool {
    // The owner of /proc/self is the effective user.
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0
}

/// What both users' attacks must show: every route ran against the run and
/// its reaper, and none of them found the key.
fn assert_nothing_leaked(project: &Project, loot: &Loot, key: &str) {
    assert!(
        loot.pids() >= 2,
        "found only {} troupe processes",
        loot.pids()
    );
    for route in [
        "own-environ",
        "environ",
        "cmdline",
        "mem",
        "fd",
        "ptrace",
        "signal",
    ] {
        loot.route(route);
    }
    assert_eq!(loot.leaks(key), Vec::<&str>::new(), "{:#?}", loot.routes);
    assert_eq!(project.files_holding(key), Vec::<PathBuf>::new());
    // Routes the kernel closes for every user: memory and tracing. A
    // sandboxed shell may not signal troupe (Landlock ABI 6 scoping).
    assert!(!loot.route("mem").contains("got:"), "{}", loot.route("mem"));
    assert!(!loot.route("ptrace").contains("ATTACHED"));
    if landlock() {
        assert!(!loot.route("signal").contains("SIGNAL ALLOWED"));
    }
}

#[test]
fn a_sandboxed_shell_run_as_root_finds_no_key_in_any_troupe_process() {
    let key = secret("root");
    let project = Project::new();
    let loot = project.attack(&pipeline("python3"), &key, &[], &[]);
    assert_nothing_leaked(&project, &loot, &key);
    // troupe's own environment is readable to root; it holds no secret.
    assert!(
        loot.route("environ").contains("got:"),
        "{}",
        loot.route("environ")
    );
}

#[test]
fn a_sandboxed_shell_run_as_an_ordinary_user_cannot_open_troupe_s_proc_files() {
    if !is_root() {
        // Already an ordinary user: this is the test above.
        let key = secret("user");
        let project = Project::new();
        let loot = project.attack(&pipeline("python3"), &key, &[], &[]);
        assert_nothing_leaked(&project, &loot, &key);
        return;
    }
    let key = secret("nobody");
    let project = Project::new();
    let runas = [
        "setpriv",
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        "--",
    ];
    let loot = project.attack(&pipeline("/usr/bin/python3"), &key, &[], &runas);
    assert_nothing_leaked(&project, &loot, &key);
    // Non-dumpable: the same user may not open them at all.
    for route in ["environ", "fd"] {
        assert!(
            !loot.route(route).contains("got:"),
            "{route}: {}",
            loot.route(route)
        );
    }
}

#[test]
fn the_attack_finds_the_key_when_the_shell_is_handed_it() {
    // The control: --no-sandbox gives the shell troupe's whole environment,
    // and no Landlock domain keeps it out of troupe's memory: the first
    // route and the memory scan must find the key. A loot search that
    // could not find it would pass every test above.
    let key = secret("control");
    let project = Project::new();
    let loot = project.attack(&pipeline("python3"), &key, &["--no-sandbox"], &[]);
    // As an ordinary user troupe is non-dumpable even unsandboxed.
    let expected = if is_root() {
        vec!["mem", "own-environ"]
    } else {
        vec!["own-environ"]
    };
    assert_eq!(loot.leaks(&key), expected, "{:#?}", loot.routes);
}

#[test]
fn a_hook_gets_the_scrubbed_environment_and_the_names_it_lists() {
    let key = secret("hook");
    let project = Project::new();
    let seen = project.base.join("hook-env.txt");
    let stage =
        common::stage_md("s", "", "Work.").replace("allowedTools: [Read]", "allowedTools: [Echo]");
    let yaml = format!(
        "id: hooked\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\nhooks:\n  - at: TOOL_CALL/pre\n    kind: guard\n    env: [TROUPE_HOOK_PASSED]\n    command: \"env > {} && echo '{{\\\"decision\\\":\\\"allow\\\"}}'\"\n",
        seen.display()
    );
    let script = "stages:\n  s:\n    - tool: Echo\n      args: { text: hi }\n    - complete: { summary: done }\n";
    let pipeline = common::Fixture::new(&yaml, &[("s.md", &stage), ("script.yaml", script)]);
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .arg("run")
        .arg(pipeline.path())
        .arg("--root")
        .arg(&project.root)
        .arg("--runs-dir")
        .arg(project.base.join("runs"))
        .args(["--json", "--headless"])
        .env("OPENAI_API_KEY", &key)
        .env("TROUPE_HOOK_PASSED", "passed-on")
        .env("TROUPE_HOOK_OTHER", "kept-back")
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let env = std::fs::read_to_string(&seen).unwrap();
    assert!(env.contains("TROUPE_HOOK_PASSED=passed-on"), "{env}");
    assert!(env.contains("PATH="), "{env}");
    assert!(!env.contains(&key), "{env}");
    assert!(!env.contains("kept-back"), "{env}");
}

/// Under valgrind troupe cannot re-execute itself (`/proc/self/exe` is
/// valgrind's tool): it runs unsealed and says so, rather than dying in
/// the re-exec. Valgrind is told by its preload library; a path that does
/// not exist is only warned about by the loader.
#[test]
fn under_valgrind_troupe_runs_unsealed_and_says_so() {
    let fanout = Path::new(env!("CARGO_MANIFEST_DIR")).join("stages/fanout");
    let out = Command::new(env!("CARGO_BIN_EXE_troupe"))
        .args(["validate"])
        .arg(&fanout)
        .env("LD_PRELOAD", "/nonexistent/vgpreload_core-amd64-linux.so")
        .env("OPENAI_API_KEY", secret("valgrind"))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("could not seal its environment (it runs under valgrind)"),
        "{stderr}"
    );
}
