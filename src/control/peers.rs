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
//!
//! A TCP listener is guarded by its token, but a command may read the
//! token's file as its user can; so a TCP connection made from this
//! machine is traced too: its socket in `/proc/net/tcp{,6}`, and whether
//! one of this process's descendants holds it.

use std::path::Path;

use std::net::SocketAddr;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream, UnixListener, UnixStream};

use crate::tools::process_group::{ProcStat, children_of, proc_stat};

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
                .is_some_and(|pid| descends_from(pid, me(), Path::new("/proc")));
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

/// A TCP listener that turns away connections this process's descendants
/// made.
pub(super) struct TcpOutsiders(pub(super) TcpListener);

impl axum::serve::Listener for TcpOutsiders {
    type Io = TcpStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            let (stream, addr) = axum::serve::Listener::accept(&mut self.0).await;
            let inside = stream.local_addr().is_ok_and(|ours| {
                let proc = Path::new("/proc");
                socket_inode(addr, ours, proc)
                    .is_some_and(|inode| held_by_descendant(inode, me(), proc))
            });
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

/// The inode of this machine's TCP socket at `peer` connected to `ours`
/// (the other end of an accepted connection), from `<proc>/net/tcp` and
/// `tcp6`; `None` when it is not on this machine (or cannot be read).
fn socket_inode(peer: SocketAddr, ours: SocketAddr, proc: &Path) -> Option<u64> {
    // A dual-stack listener sees an IPv4 peer as `::ffff:a.b.c.d`; the
    // peer's own socket is IPv4.
    let canonical = |a: SocketAddr| SocketAddr::new(a.ip().to_canonical(), a.port());
    let (peer, ours) = (canonical(peer), canonical(ours));
    let (local, remote) = (proc_addr(peer), proc_addr(ours));
    ["net/tcp", "net/tcp6"].iter().find_map(|table| {
        let text = std::fs::read_to_string(proc.join(table)).ok()?;
        text.lines().skip(1).find_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let (l, r, inode) = (fields.get(1)?, fields.get(2)?, fields.get(9)?);
            (l.eq_ignore_ascii_case(&local) && r.eq_ignore_ascii_case(&remote))
                .then(|| inode.parse().ok())
                .flatten()
        })
    })
}

/// An address as `/proc/net/tcp{,6}` writes it: each 32-bit word of the
/// address in this machine's byte order, in hex, then the port.
fn proc_addr(addr: SocketAddr) -> String {
    let words: Vec<u32> = match addr.ip() {
        std::net::IpAddr::V4(ip) => vec![u32::from_ne_bytes(ip.octets())],
        std::net::IpAddr::V6(ip) => ip
            .octets()
            .chunks_exact(4)
            .map(|w| u32::from_ne_bytes([w[0], w[1], w[2], w[3]]))
            .collect(),
    };
    let mut text: String = words.iter().map(|w| format!("{w:08X}")).collect();
    text.push_str(&format!(":{:04X}", addr.port()));
    text
}

/// This process's id, as procfs writes ids.
fn me() -> i32 {
    i32::try_from(std::process::id()).unwrap_or(i32::MAX)
}

/// Whether a descendant of `ancestor` holds socket `inode` open.
fn held_by_descendant(inode: u64, ancestor: i32, proc: &Path) -> bool {
    let wanted = format!("socket:[{inode}]");
    descendants(ancestor, proc).into_iter().any(|pid| {
        std::fs::read_dir(proc.join(pid.to_string()).join("fd")).is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                std::fs::read_link(fd.path()).is_ok_and(|to| to.as_os_str() == wanted.as_str())
            })
        })
    })
}

/// Every descendant of `ancestor`, children of children included (at
/// most a few thousand).
fn descendants(ancestor: i32, proc: &Path) -> Vec<i32> {
    let mut found = Vec::new();
    let mut next = vec![ancestor];
    while let Some(pid) = next.pop() {
        for child in children_of(proc, pid) {
            if found.len() < 4096 && !found.contains(&child) {
                found.push(child);
                next.push(child);
            }
        }
    }
    found
}

/// What a refused peer reads before the connection closes: the API's
/// error shape, so that a client says why.
const REFUSED: &str = "{\"error\":{\"code\":\"Control/InsideRun\",\"message\":\"a process a troupe run started cannot use that run's control API\"}}";

/// Answers the request's head (read first, so that the peer is not cut
/// off mid-write) with the refusal, then closes; two seconds at most.
async fn refuse(mut stream: impl AsyncRead + AsyncWrite + Unpin) {
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
pub(super) fn descends_from(pid: i32, ancestor: i32, proc: &Path) -> bool {
    let mut at = pid;
    // Far past any real process tree; a loop in a damaged procfs ends.
    for _ in 0..256 {
        if at <= 1 {
            return false;
        }
        let Some(ProcStat { parent, .. }) = proc_stat(proc, at) else {
            return false;
        };
        if parent == ancestor {
            return true;
        }
        at = parent;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Starts `command` and waits for the first line it prints.
    fn first_line(command: &mut std::process::Command) -> (std::process::Child, String) {
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        (child, line)
    }

    #[test]
    fn a_child_and_a_grandchild_descend_and_the_process_itself_and_its_parent_do_not() {
        use std::os::unix::process::CommandExt;
        let me = me();
        let proc = Path::new("/proc");
        let (mut child, line) = first_line(
            std::process::Command::new("sh")
                .arg("-c")
                .arg("sleep 30 & echo $!; wait")
                .process_group(0),
        );
        let grandchild: i32 = line.trim().parse().unwrap();
        let child_pid = i32::try_from(child.id()).unwrap();
        assert!(descends_from(child_pid, me, proc));
        assert!(descends_from(grandchild, me, proc));
        assert!(!descends_from(me, me, proc));
        let parent = proc_stat(proc, me).unwrap().parent;
        assert!(!descends_from(parent, me, proc));
        assert!(!descends_from(1, me, proc));
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(child_pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let _ = child.wait();
    }

    /// A TCP connection this process makes is traced to it, and one a
    /// child makes to the child: what the listener refuses.
    #[test]
    fn a_connection_is_traced_to_the_process_that_made_it() {
        let proc = Path::new("/proc");
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let ours = listener.local_addr().unwrap();
        // Made here: this process holds it, no descendant does.
        let _mine = std::net::TcpStream::connect(ours).unwrap();
        let (_accepted, peer) = listener.accept().unwrap();
        let inode = socket_inode(peer, ours, proc).expect("found in /proc/net/tcp");
        assert!(!held_by_descendant(inode, me(), proc));
        // Made by a child, which holds it open.
        let (mut child, _) = first_line(std::process::Command::new("python3").arg("-c").arg(
            format!(
                "import socket, sys, time\ns = socket.create_connection(('127.0.0.1', {}))\nprint('on', flush=True)\ntime.sleep(30)",
                ours.port()
            ),
        ));
        let (_theirs, peer) = listener.accept().unwrap();
        let inode = socket_inode(peer, ours, proc).expect("found in /proc/net/tcp");
        assert!(held_by_descendant(inode, me(), proc));
        // A peer that is not on this machine's tables: none.
        let elsewhere: SocketAddr = "127.0.0.1:1".parse().unwrap();
        assert_eq!(socket_inode(elsewhere, ours, proc), None);
        let _ = child.kill();
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
