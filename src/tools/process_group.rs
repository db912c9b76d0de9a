//! The process groups of running `Bash` calls: a guard that kills a call's
//! group when the call ends or is dropped, and a process-wide list of the
//! groups still alive, so that a signal that ends troupe at once (the
//! second Ctrl-C, SIGTERM or SIGHUP) can kill them all before it exits.
//!
//! `kill -9` gives troupe no chance to do that. For it, the CLI arms a
//! **reaper**: a small process (`troupe reaper`, hidden) told each group
//! as it starts and ends, over a pipe only troupe holds. When troupe dies,
//! however it dies, the kernel closes the pipe; the reaper reads its end
//! and kills every group still listed. One reaper per troupe process, not
//! one keeper per call: a fan-out with hundreds of shells costs one small
//! process. It also removes the temp folders troupe listed with it (the
//! shells' private `TMPDIR`), which a troupe that exits at once or is
//! killed never gets to remove.

use std::collections::BTreeSet;
use std::io::{BufRead, Write};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{ChildStdin, Stdio};
use std::sync::Mutex;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// Every group a [`GroupKill`] guards right now. A group leaves the list
/// when its guard kills it, which `bash` does as soon as the leader is
/// reaped; until then the leader holds the id, so the id is never another
/// process's.
static LIVE: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

fn live() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    // A panic while the lock was held left a plain set of integers, which
    // is still consistent: keep using it.
    LIVE.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The pipe to the reaper, once armed.
static REAPER: Mutex<Option<ChildStdin>> = Mutex::new(None);

/// Tells the reaper a group started (`+`) or ended (`-`). A reaper that
/// is gone is forgotten: the groups are then killed as before, only not
/// after a `kill -9`.
fn tell_reaper(sign: char, pgid: i32) {
    tell_reaper_line(&format!("{sign}{pgid}"));
}

fn tell_reaper_line(line: &str) {
    let mut reaper = REAPER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(pipe) = reaper.as_mut()
        && writeln!(pipe, "{line}").is_err()
    {
        *reaper = None;
    }
}

/// Has the reaper remove the temp folder `dir` if troupe dies before it
/// does ([`forget_dir`] once it is removed). Only a `troupe-` folder
/// directly in the temp directory is taken.
pub fn remove_dir_with_troupe(dir: &Path) {
    tell_reaper_dir('D', dir);
}

/// The folder given to [`remove_dir_with_troupe`] is gone: the reaper
/// forgets it.
pub fn forget_dir(dir: &Path) {
    tell_reaper_dir('d', dir);
}

/// A `D`/`d` line: a path that is not one line of UTF-8 is not sent.
fn tell_reaper_dir(sign: char, dir: &Path) {
    if let Some(text) = dir.to_str().filter(|t| !t.contains('\n')) {
        tell_reaper_line(&format!("{sign}{text}"));
    }
}

/// Whether the reaper may remove `dir`: a `troupe-` folder directly in
/// the temp directory (`TMPDIR` or `/tmp`), nothing else whatever the
/// pipe says.
fn removable(dir: &Path, temp: &Path) -> bool {
    dir.parent() == Some(temp)
        && dir
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.starts_with("troupe-") && n.len() > "troupe-".len())
}

/// Starts the reaper (`launcher reaper`) for this process, once; later
/// calls do nothing. Its own process group, so a Ctrl-C at the terminal
/// does not end it before troupe is done. Returns whether one runs.
pub fn arm_reaper(launcher: &Path) -> bool {
    let mut reaper = REAPER
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if reaper.is_some() {
        return true;
    }
    let spawned = std::process::Command::new(launcher)
        .arg("reaper")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn();
    // The child is not waited for: it outlives us by design, and init
    // reaps it.
    match spawned {
        Ok(mut child) => {
            REAPER_PID.store(
                i32::try_from(child.id()).unwrap_or(0),
                std::sync::atomic::Ordering::Relaxed,
            );
            *reaper = child.stdin.take();
            reaper.is_some()
        }
        Err(_) => false,
    }
}

/// The reaper's pid, which [`kill_orphans`] spares.
static REAPER_PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// Makes this process the subreaper of everything it starts: a process
/// that escaped its group (`setsid`, a double fork) and lost its parent is
/// re-parented to troupe, not to init, so [`kill_orphans`] finds it.
pub fn adopt_orphans() -> bool {
    nix::sys::prctl::set_child_subreaper(true).is_ok()
}

/// Kills every child process still alive, adopted orphans included (the
/// reaper excepted), and reaps them; repeated while killing one leaves its
/// own children to us. Returns how many were killed. Called when a run is
/// over: nothing a run started outlives it.
pub fn kill_orphans() -> usize {
    let reaper = REAPER_PID.load(std::sync::atomic::Ordering::Relaxed);
    let mut killed = 0;
    for _ in 0..16 {
        let children: Vec<i32> = children_of_self()
            .into_iter()
            .filter(|&pid| pid != reaper && pid > 1)
            .collect();
        if children.is_empty() {
            break;
        }
        for &pid in &children {
            if nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
        for &pid in &children {
            let _ = nix::sys::wait::waitpid(Pid::from_raw(pid), None);
        }
    }
    killed
}

/// Reaps the adopted children that have ended: processes that escaped a
/// group (`setsid`, a double fork) or outlived their shell, re-parented to
/// troupe by [`adopt_orphans`], whose exit no one else waits for. A
/// long-lived troupe (`serve`, `chat`, `worker`) calls it now and then;
/// else each would stay a zombie until troupe ends, and enough of them
/// exhaust a container's pids.
///
/// Only what troupe did not start itself is reaped: its own children are
/// waited for by whoever started them (tokio, which a reaped pid would
/// leave with no exit status). Each of those leads a process group of its
/// own or stays in troupe's, while an adopted process is in the group of
/// the shell or hook that started it. Returns how many were reaped.
pub fn reap_adopted() -> usize {
    let ours = nix::unistd::getpgrp().as_raw();
    let mut reaped = 0;
    for pid in children_of_self() {
        let Some(ProcStat { state, group, .. }) = proc_stat(Path::new("/proc"), pid) else {
            continue;
        };
        if state == 'Z' && group != pid && group != ours {
            let flags = nix::sys::wait::WaitPidFlag::WNOHANG;
            if nix::sys::wait::waitpid(Pid::from_raw(pid), Some(flags)).is_ok() {
                reaped += 1;
            }
        }
    }
    reaped
}

/// How often a long-lived troupe reaps what it adopted.
const REAP_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

/// Reaps what this process adopted ([`reap_adopted`]) every couple of
/// seconds, on a thread that lives as long as the process: for commands
/// that outlive their runs.
pub fn keep_reaping_adopted() {
    let _ = std::thread::Builder::new()
        .name("troupe-adopted".into())
        .spawn(|| {
            loop {
                std::thread::sleep(REAP_EVERY);
                reap_adopted();
            }
        });
}

/// What `<proc>/<pid>/stat` says of a process (a zombie's included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ProcStat {
    /// `R`, `S`, `Z`, …
    pub state: char,
    pub parent: i32,
    pub group: i32,
}

/// Process `pid`'s [`ProcStat`], from the procfs at `proc`; `None` when
/// it is gone or the file does not read as one.
pub(crate) fn proc_stat(proc: &Path, pid: i32) -> Option<ProcStat> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // After the command's name, which may hold spaces and parentheses.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some(ProcStat {
        state,
        parent,
        group,
    })
}

/// The children of process `pid`, from the procfs at `proc`
/// (`<pid>/task/*/children`: every thread's).
pub(crate) fn children_of(proc: &Path, pid: i32) -> Vec<i32> {
    let Ok(tasks) = std::fs::read_dir(proc.join(pid.to_string()).join("task")) else {
        return Vec::new();
    };
    let mut out = BTreeSet::new();
    for task in tasks.flatten() {
        if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
            out.extend(
                text.split_whitespace()
                    .filter_map(|p| p.parse::<i32>().ok()),
            );
        }
    }
    out.into_iter().collect()
}

/// This process's children.
fn children_of_self() -> Vec<i32> {
    i32::try_from(std::process::id())
        .map_or_else(|_| Vec::new(), |me| children_of(Path::new("/proc"), me))
}

/// The reaper's side: reads `+PGID`/`-PGID` and `D<dir>`/`d<dir>` lines
/// until the pipe closes (troupe ended), then kills every group still
/// listed and removes every folder still listed (those [`removable`] in
/// `temp`). Returns how many groups.
pub fn reap(input: impl BufRead, temp: &Path) -> usize {
    let mut groups = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    for line in input.lines() {
        let Ok(line) = line else { break };
        let (sign, rest) = line.split_at(line.len().min(1));
        match (sign, rest.parse::<i32>()) {
            ("+", Ok(pgid)) if pgid > 1 => {
                groups.insert(pgid);
            }
            ("-", Ok(pgid)) => {
                groups.remove(&pgid);
            }
            ("D", _) => {
                dirs.insert(std::path::PathBuf::from(rest));
            }
            ("d", _) => {
                dirs.remove(Path::new(rest));
            }
            _ => {}
        }
    }
    for &pgid in &groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    for dir in dirs.iter().filter(|d| removable(d, temp)) {
        let _ = std::fs::remove_dir_all(dir);
    }
    groups.len()
}

/// Kills a process group with SIGKILL when dropped, unless already killed.
/// Declare it after the `Child`, so it drops first, while the unreaped
/// leader still holds the group id (no chance of signalling a recycled id).
#[derive(Debug)]
pub struct GroupKill(Option<Pid>);

impl GroupKill {
    /// Guards the group led by `pid` (a child started with
    /// `process_group(0)`). Only a real child's group: never 0 (our own
    /// group) or 1.
    pub fn new(pid: Option<u32>) -> GroupKill {
        let pgid = pid.and_then(|p| i32::try_from(p).ok()).filter(|&p| p > 1);
        if let Some(p) = pgid {
            live().insert(p);
            tell_reaper('+', p);
        }
        GroupKill(pgid.map(Pid::from_raw))
    }

    /// Guards the group of a process that may outlive a run: an MCP
    /// server, which lives as long as its pool (a chat's pool serves all
    /// its turns). The reaper knows it, so it dies with troupe, but the
    /// end of a run ([`kill_all_groups`], for its `Bash` calls) spares it;
    /// dropping the guard kills it.
    pub fn lasting(pid: Option<u32>) -> GroupKill {
        let pgid = pid.and_then(|p| i32::try_from(p).ok()).filter(|&p| p > 1);
        if let Some(p) = pgid {
            tell_reaper('+', p);
        }
        GroupKill(pgid.map(Pid::from_raw))
    }

    /// Kills the group now and disarms the guard.
    pub fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (the group is already gone) is the expected outcome.
            let _ = killpg(pgid, Signal::SIGKILL);
            live().remove(&pgid.as_raw());
            tell_reaper('-', pgid.as_raw());
        }
    }
}

impl Drop for GroupKill {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Kills every group of a `Bash` call still running, children and
/// grandchildren included; returns how many groups were signalled. For a
/// process about to exit without unwinding its tool calls.
pub fn kill_all_groups() -> usize {
    let groups = std::mem::take(&mut *live());
    for &pgid in &groups {
        let _ = killpg(Pid::from_raw(pgid), Signal::SIGKILL);
    }
    groups.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (a guard, not a measure: it comes at once) until `pid` is a
    /// zombie.
    fn until_ended(pid: i32) {
        for _ in 0..500 {
            if proc_stat(Path::new("/proc"), pid).is_some_and(|s| s.state == 'Z') {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("process {pid} did not end");
    }

    #[test]
    fn what_was_adopted_is_reaped_and_what_was_started_is_left_to_its_waiter() {
        use std::os::unix::process::CommandExt;
        assert!(adopt_orphans());
        // A child of ours, leading its group, ended and not waited for yet.
        let mut own = std::process::Command::new("true")
            .process_group(0)
            .spawn()
            .unwrap();
        // A shell that leaves a job behind: the job comes to us.
        let dir = tempfile::tempdir().unwrap();
        let pid_file = dir.path().join("pid");
        let shell = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("sleep 0.1 & echo $! > {}", pid_file.display()))
            .process_group(0)
            .status()
            .unwrap();
        assert!(shell.success());
        let orphan: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        until_ended(orphan);
        until_ended(i32::try_from(own.id()).unwrap());
        assert!(reap_adopted() >= 1);
        assert_eq!(
            proc_stat(Path::new("/proc"), orphan),
            None,
            "the adopted job was reaped"
        );
        // Its starter still gets its exit.
        assert!(own.wait().unwrap().success());
    }

    #[test]
    fn the_reaper_kills_what_is_still_listed_when_the_pipe_closes() {
        // Groups that ended are not killed; ids that cannot be a child's
        // group (0, 1, our own by `0`) and garbage are ignored.
        let lines = "+4000000\n+4000001\n-4000000\n+1\n+0\nnoise\n-\n+x\n";
        assert_eq!(reap(lines.as_bytes(), Path::new("/nonexistent")), 1);
    }

    #[test]
    fn the_reaper_removes_the_troupe_temp_folders_still_listed_and_nothing_else() {
        let temp = tempfile::tempdir().unwrap();
        let temp = temp.path();
        let make = |name: &str| {
            let dir = temp.join(name);
            std::fs::create_dir_all(dir.join("inside")).unwrap();
            std::fs::write(dir.join("inside/file"), "x").unwrap();
            dir
        };
        let listed = make("troupe-bash-a1");
        let forgotten = make("troupe-bash-b2");
        let foreign = make("someone-else");
        let nested = make("troupe-bash-c3").join("inside");
        let lines = format!(
            "D{}\nD{}\nd{}\nD{}\nD{}\nD/etc\nD{}/troupe-\n",
            listed.display(),
            forgotten.display(),
            forgotten.display(),
            foreign.display(),
            nested.display(),
            temp.display(),
        );
        reap(lines.as_bytes(), temp);
        assert!(!listed.exists(), "removed when troupe is gone");
        assert!(forgotten.exists(), "forgotten: troupe removed it itself");
        assert!(
            foreign.exists() && nested.exists(),
            "not troupe's temp folders"
        );
        assert!(Path::new("/etc").exists());
    }
}
