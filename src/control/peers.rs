//! Who may connect to a control socket: anyone the socket's mode lets in
//! (its owner), but no process this troupe started.
//!
//! A run's processes run as the same user as troupe: a `Bash` call, a hook,
//! an MCP server. The socket's mode 0600 keeps other users out, not them,
//! and the `Bash` sandbox confines writes and the network, not a connect
//! to a Unix socket. Through the control API such a process could approve
//! its own pending calls, or submit a run with `--no-sandbox` or a base URL
//! of its choosing to `troupe serve`, which would send the API key there.
//! So a connection whose peer (`SO_PEERCRED`) descends from this process
//! is answered `403 Control/InsideRun` and closed. troupe is the subreaper
//! of what it starts (`process_group::adopt_orphans`), so a double fork or
//! `setsid` does not take a process out of its descent.

use std::path::Path;

use tokio::io::AsyncWriteExt;
use tokio::net::{UnixListener, UnixStream};

/// A Unix listener that turns away this process's descendants.
pub(super) struct Outsiders(pub(super) UnixListener);

impl axum::serve::Listener for Outsiders {
    type Io = UnixStream;
    type Addr = tokio::net::unix::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
            let inside = stream
                .peer_cred()
                .ok()
                .and_then(|cred| cred.pid())
                .is_some_and(|pid| descends_from(pid, std::process::id(), Path::new("/proc")));
            if !inside {
                return (stream, addr);
            }
            tokio::spawn(refuse(stream));
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.0.local_addr()
    }
}

/// What a refused peer reads before the connection closes: the API's
/// error shape, so that a client says why.
const REFUSED: &str = "{\"error\":{\"code\":\"Control/InsideRun\",\"message\":\"a process a troupe run started cannot use that run's control API\"}}";

/// Answers the request's head (read first, so that the peer is not cut
/// off mid-write) with the refusal, then closes; two seconds at most.
async fn refuse(mut stream: UnixStream) {
    use tokio::io::AsyncReadExt;
    let reply = format!(
        "HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{REFUSED}",
        REFUSED.len()
    );
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), async {
        let mut head = Vec::new();
        let mut buf = [0u8; 4096];
        while head.len() < 64 * 1024 && !head.windows(4).any(|w| w == b"\r\n\r\n") {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => head.extend_from_slice(&buf[..n]),
            }
        }
        let _ = stream.write_all(reply.as_bytes()).await;
        let _ = stream.shutdown().await;
    })
    .await;
}

/// Whether process `pid` is a descendant of `ancestor` (not `ancestor`
/// itself), by the parents `proc` (a procfs) records. A process that
/// cannot be read (gone) is taken as not one.
pub(super) fn descends_from(pid: i32, ancestor: u32, proc: &Path) -> bool {
    let Ok(ancestor) = i32::try_from(ancestor) else {
        return false;
    };
    let mut at = pid;
    // Far past any real process tree; a loop in a damaged procfs ends.
    for _ in 0..256 {
        if at <= 1 {
            return false;
        }
        let Some(parent) = parent_of(at, proc) else {
            return false;
        };
        if parent == ancestor {
            return true;
        }
        at = parent;
    }
    false
}

/// A process's parent, from `<proc>/<pid>/stat`.
fn parent_of(pid: i32, proc: &Path) -> Option<i32> {
    let stat = std::fs::read_to_string(proc.join(pid.to_string()).join("stat")).ok()?;
    // After the command's name, which may hold spaces and parentheses:
    // the state, then the parent.
    let mut fields = stat.get(stat.rfind(')')? + 1..)?.split_whitespace();
    let _state = fields.next()?;
    fields.next()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_and_a_grandchild_descend_and_the_process_itself_and_its_parent_do_not() {
        use std::os::unix::process::CommandExt;
        let me = std::process::id();
        let proc = Path::new("/proc");
        let mut child = std::process::Command::new("sh")
            .arg("-c")
            .arg("sleep 30 & echo $!; wait")
            .stdout(std::process::Stdio::piped())
            .process_group(0)
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let child_pid = i32::try_from(child.id()).unwrap();
        assert!(descends_from(child_pid, me, proc));
        assert!(descends_from(grandchild, me, proc));
        assert!(!descends_from(i32::try_from(me).unwrap(), me, proc));
        let parent = parent_of(i32::try_from(me).unwrap(), proc).unwrap();
        assert!(!descends_from(parent, me, proc));
        assert!(!descends_from(1, me, proc));
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child_pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
    }

    #[test]
    fn a_damaged_or_missing_procfs_is_no_descent() {
        let dir = tempfile::tempdir().unwrap();
        // 10 -> 11 -> 10: a loop, and 12 with garbage.
        for (pid, stat) in [
            (10, "10 (a) S 11 1 1"),
            (11, "11 (b) S 10 1 1"),
            (12, "12 (c) S x"),
        ] {
            let d = dir.path().join(pid.to_string());
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("stat"), stat).unwrap();
        }
        assert!(!descends_from(10, 99, dir.path()));
        assert!(!descends_from(12, 99, dir.path()));
        assert!(!descends_from(13, 99, dir.path()));
        assert!(descends_from(10, 11, dir.path()));
    }
}
