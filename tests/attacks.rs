//! Attack tests on the shell sandbox's write boundary and on process
//! lifetime, written as the attacker would: a scripted model asks for
//! `Bash` calls (approved by `allowedTools`) that try to write outside the
//! root through a symlink, a hard link, `/proc/self/cwd`, a cross-folder
//! rename and a race that swaps a folder for a symlink mid-write; and to
//! leave a process running after the run (`setsid`, a double fork). Each
//! names what it tried and fails if it got through.
//!
//! The write routes need Landlock and skip, with a note, without it; the
//! lifetime routes hold everywhere.

#![cfg(target_os = "linux")]
// Test code: a failed unwrap is a failed test with its location.
#![allow(clippy::unwrap_used)]

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Whether the suite runs as root (then each attack also runs as `nobody`).
fn is_root() -> bool {
    std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap()) == 0
}

/// A project root with a folder outside it, in a temp dir.
struct Project {
    _base: tempfile::TempDir,
    base: PathBuf,
    root: PathBuf,
    outside: PathBuf,
    runs: PathBuf,
    /// Run troupe as `nobody` (the suite runs as root).
    nobody: bool,
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
            base: path,
            root,
            outside,
            runs,
            nobody: false,
        }
    }

    /// The same project, run as `nobody`: every folder open to it.
    fn as_nobody() -> Project {
        let mut p = Project::new();
        for dir in [&p.base, &p.root, &p.outside] {
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        }
        p.nobody = true;
        p
    }

    /// Runs one stage whose `Bash` calls are `commands`, in order.
    fn attack(&self, commands: &[String]) -> std::process::Output {
        self.attack_with(commands, &[])
    }

    fn attack_with(&self, commands: &[String], flags: &[&str]) -> std::process::Output {
        let stage = common::stage_md("s", "", "Work.")
            .replace("allowedTools: [Read]", "allowedTools: [Bash]")
            .replace("turnCap: 5", "turnCap: 20");
        let mut script = String::from("stages:\n  s:\n");
        for c in commands {
            let c = serde_json::to_string(c).unwrap();
            script.push_str(&format!(
                "    - tool: Bash\n      args: {{ command: {c} }}\n"
            ));
        }
        script.push_str("    - complete: { summary: done }\n");
        let pipeline = common::Fixture::new(
            "id: attack\nentry: s\nstages:\n  s: s.md\nnext:\n  s: end\n",
            &[("s.md", &stage), ("script.yaml", &script)],
        );
        let mut cmd = if self.nobody {
            std::fs::set_permissions(pipeline.path(), std::fs::Permissions::from_mode(0o755))
                .unwrap();
            let mut c = Command::new("setpriv");
            c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(env!("CARGO_BIN_EXE_troupe"))
                .env("HOME", &self.base)
                .env("PATH", "/usr/bin:/bin");
            c
        } else {
            Command::new(env!("CARGO_BIN_EXE_troupe"))
        };
        let out = cmd
            .arg("run")
            .arg(pipeline.path())
            .arg("--root")
            .arg(&self.root)
            .arg("--runs-dir")
            .arg(&self.runs)
            .args(["--headless", "--no-store"])
            .args(flags)
            .output()
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn outside(&self, name: &str) -> PathBuf {
        self.outside.join(name)
    }
}

fn landlock(root: &Path) -> bool {
    let ok = troupe::tools::sandbox::probe(&[root.to_owned()]).is_ok();
    if !ok {
        eprintln!("note: skipped: this kernel has no Landlock");
    }
    ok
}

#[test]
fn writes_outside_the_root_through_links_proc_and_renames_are_refused() {
    write_attacks(Project::new());
}

#[test]
fn the_write_attacks_fail_for_an_ordinary_user_too() {
    if is_root() {
        write_attacks(Project::as_nobody());
    }
}

fn write_attacks(p: Project) {
    if !landlock(&p.root) {
        return;
    }
    std::fs::write(p.outside("victim.txt"), "original\n").unwrap();
    std::fs::write(p.root.join("inside.txt"), "inside\n").unwrap();
    let out = p.outside.display().to_string();
    let routes = [
        // A symlink inside the root that points out.
        format!(
            "ln -s {out}/by-symlink.txt link && echo pwned > link; echo \"symlink: $?\" >> tried.txt"
        ),
        // A hard link to a file outside, then a write through it.
        format!(
            "ln {out}/victim.txt hard && echo pwned >> hard; echo \"hardlink: $?\" >> tried.txt"
        ),
        // The root's parent through /proc/self/cwd.
        "echo pwned > /proc/self/cwd/../outside/by-proc.txt; echo \"proc-cwd: $?\" >> tried.txt"
            .to_owned(),
        // Moving a file of the root out.
        format!("mv inside.txt {out}/moved.txt; echo \"rename: $?\" >> tried.txt"),
        // A race: one loop swaps `d` between a folder and a symlink out,
        // the other writes through `d` meanwhile.
        format!(
            "mkdir -p real; (for i in $(seq 400); do rm -rf d; ln -s {out} d; rm -f d; mkdir -p d; done) & \
             for i in $(seq 400); do echo pwned > d/race.txt 2>/dev/null; done; wait; echo \"race: done\" >> tried.txt"
        ),
    ];
    p.attack(&routes);
    let tried = std::fs::read_to_string(p.root.join("tried.txt")).unwrap();
    let owner =
        std::os::unix::fs::MetadataExt::uid(&std::fs::metadata(p.root.join("tried.txt")).unwrap());
    assert_eq!(owner == 65534, p.nobody, "the attack ran as uid {owner}");
    for route in ["symlink", "hardlink", "proc-cwd", "rename", "race"] {
        assert!(
            tried.contains(&format!("{route}:")),
            "route {route} never ran: {tried}"
        );
    }
    for (route, file) in [
        ("symlink", "by-symlink.txt"),
        ("proc-cwd", "by-proc.txt"),
        ("rename", "moved.txt"),
        ("race", "race.txt"),
    ] {
        assert!(!p.outside(file).exists(), "{route} wrote outside the root");
    }
    assert_eq!(
        std::fs::read_to_string(p.outside("victim.txt")).unwrap(),
        "original\n",
        "the hard link wrote outside the root"
    );
    assert!(
        p.root.join("inside.txt").exists(),
        "the rename moved a file out"
    );
    // The control: without the sandbox the same routes get through, so
    // the checks above can see a write that escaped.
    let control = Project::new();
    std::fs::write(control.outside("victim.txt"), "original\n").unwrap();
    let out = control.outside.display().to_string();
    control.attack_with(
        &[
            format!("ln -s {out}/by-symlink.txt link && echo pwned > link"),
            format!("ln {out}/victim.txt hard && echo pwned >> hard"),
        ],
        &["--no-sandbox"],
    );
    assert!(control.outside("by-symlink.txt").exists());
    assert_ne!(
        std::fs::read_to_string(control.outside("victim.txt")).unwrap(),
        "original\n"
    );
}

/// Whether process `pid` is still running (a zombie is not).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            let state = s.rsplit(')').next().unwrap_or("").split_whitespace().next();
            state != Some("Z")
        })
        .unwrap_or(false)
}

#[test]
fn nothing_a_shell_starts_outlives_the_run() {
    lifetime_attacks(Project::new());
}

#[test]
fn nothing_an_ordinary_user_s_shell_starts_outlives_the_run() {
    if is_root() {
        lifetime_attacks(Project::as_nobody());
    }
}

fn lifetime_attacks(p: Project) {
    // Each route waits (bounded) until its process leads a session of its
    // own — the escape is done — before the shell exits and its group is
    // killed, and says so: a route that never escaped would prove nothing.
    let escaped = |name: &str| {
        format!(
            "for i in $(seq 1000); do [ \"$(cut -d' ' -f6 /proc/$(cat {name}.pid)/stat 2>/dev/null)\" = \"$(cat {name}.pid)\" ] && echo yes > {name}.escaped && break; sleep 0.01; done"
        )
    };
    let routes = [
        // A new session: out of the call's process group.
        format!(
            "setsid sleep 300 > /dev/null 2>&1 < /dev/null & echo $! > setsid.pid; {}",
            escaped("setsid")
        ),
        // A double fork: the middle process exits, the sleeper is orphaned.
        format!(
            "sh -c 'setsid sleep 301 > /dev/null 2>&1 < /dev/null & echo $! > double.pid'; {}",
            escaped("double")
        ),
        // nohup, with SIGHUP ignored.
        format!(
            "nohup setsid sleep 302 > /dev/null 2>&1 < /dev/null & echo $! > nohup.pid; {}",
            escaped("nohup")
        ),
    ];
    p.attack(&routes);
    for name in ["setsid", "double", "nohup"] {
        assert!(
            p.root.join(format!("{name}.escaped")).exists(),
            "{name}: the process never left its group, so the route proves nothing"
        );
    }
    for file in ["setsid.pid", "double.pid", "nohup.pid"] {
        let pid: i32 = std::fs::read_to_string(p.root.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .trim()
            .parse()
            .unwrap();
        assert!(!alive(pid), "{file}: process {pid} outlived the run");
    }
}
