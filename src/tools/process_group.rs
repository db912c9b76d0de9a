//! The process groups of running `Bash` calls: a guard that kills a call's
//! group when the call ends or is dropped, and a process-wide list of the
//! groups still alive, so that a signal that ends troupe at once (the
//! second Ctrl-C, SIGTERM or SIGHUP) can kill them all before it exits.

use std::collections::BTreeSet;
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
        }
        GroupKill(pgid.map(Pid::from_raw))
    }

    /// Kills the group now and disarms the guard.
    pub fn kill(&mut self) {
        if let Some(pgid) = self.0.take() {
            // ESRCH (the group is already gone) is the expected outcome.
            let _ = killpg(pgid, Signal::SIGKILL);
            live().remove(&pgid.as_raw());
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
