//! A run's lock: the process running (or resuming) a run holds an
//! exclusive lock on `<run folder>/run.lock` for as long as it runs it.
//! The kernel drops the lock when the process ends, however it ends, so a
//! run whose status is still `running` but whose lock is free was left by
//! a dead process (`interrupted`), and two processes never run the same
//! run at once.

use std::fs::{File, OpenOptions, TryLockError};
use std::path::{Path, PathBuf};

use super::error::StoreError;

/// The lock file's name in a run's folder.
pub const LOCK_FILE: &str = "run.lock";

/// Tries past the first before a held lock is `Store/RunBusy`, 10 ms
/// apart: longer than any [`is_held`] check holds it.
const PROBE_TRIES: u32 = 5;

/// A held run lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunLock {
    _file: File,
    path: PathBuf,
}

impl RunLock {
    /// Takes the lock of the run whose folder is `run_dir` (creating the
    /// folder), or `Store/RunBusy` when another process holds it.
    pub fn acquire(run_dir: &Path, run_id: &str) -> Result<RunLock, StoreError> {
        let io = |e: std::io::Error| StoreError::Io {
            path: run_dir.join(LOCK_FILE),
            detail: e.to_string(),
        };
        std::fs::create_dir_all(run_dir).map_err(io)?;
        let path = run_dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        // A few tries: `is_held` (every `troupe runs` listing) takes the
        // lock for an instant to test it, which is not a run holding it.
        let mut tries = 0;
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(RunLock { _file: file, path }),
                Err(TryLockError::WouldBlock) if tries < PROBE_TRIES => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(10));
                }
                Err(TryLockError::WouldBlock) => {
                    return Err(StoreError::RunBusy {
                        id: run_id.to_owned(),
                    });
                }
                Err(TryLockError::Error(e)) => return Err(io(e)),
            }
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Whether a live process holds the lock of the run in `run_dir`. A lock
/// that cannot be checked (a file this user may not open at all, a kernel
/// that refuses the lock, a loop of links) counts as held: `troupe runs
/// rm` and `gc` ask this before deleting a run, and must never delete one
/// that is running. Only a missing lock file is free. Opened for writing
/// where it may be (NFS emulates `flock` with locks that want a writable
/// file), else read-only (a file of another user's, a read-only
/// filesystem), and never waited on (a FIFO put there would block).
pub fn is_held(run_dir: &Path) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    let path = run_dir.join(LOCK_FILE);
    let open = |write: bool| {
        OpenOptions::new()
            .read(true)
            .write(write)
            .custom_flags(nix::fcntl::OFlag::O_NONBLOCK.bits())
            .open(&path)
    };
    let opened = open(true).or_else(|e| match e.kind() {
        std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
            open(false)
        }
        _ => Err(e),
    });
    let file = match opened {
        Ok(file) => file,
        Err(e) => return e.kind() != std::io::ErrorKind::NotFound,
    };
    match file.try_lock() {
        // Free: taken for this check only, released as `file` drops.
        Ok(()) => false,
        Err(TryLockError::WouldBlock | TryLockError::Error(_)) => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lock_that_cannot_be_checked_counts_as_held() {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = dir.path().join("run-1");
        std::fs::create_dir(&run).expect("run folder");
        assert!(!is_held(&run), "no lock file: free");
        // A loop of links: the open fails with ELOOP, not NotFound.
        std::os::unix::fs::symlink(run.join(LOCK_FILE), run.join(LOCK_FILE)).expect("link");
        assert!(is_held(&run), "unknown is not free");
        std::fs::remove_file(run.join(LOCK_FILE)).expect("unlink");
        // A FIFO there does not block the check (no one holds its lock).
        nix::unistd::mkfifo(&run.join(LOCK_FILE), nix::sys::stat::Mode::S_IRWXU).expect("fifo");
        assert!(!is_held(&run));
    }

    #[test]
    fn a_run_lock_is_exclusive_and_released_when_dropped() {
        let dir = tempfile::tempdir().expect("temp dir");
        let run = dir.path().join("run-1");
        assert!(!is_held(&run));
        let lock = RunLock::acquire(&run, "run-1").expect("free");
        assert!(is_held(&run));
        assert!(matches!(
            RunLock::acquire(&run, "run-1"),
            Err(StoreError::RunBusy { .. })
        ));
        drop(lock);
        assert!(!is_held(&run));
        RunLock::acquire(&run, "run-1").expect("free again");
    }
}
